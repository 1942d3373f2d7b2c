/* opcodes_313.h: CPython 3.13's relative jumps, selected by compat.h.
 *
 * The same jumps as 3.12 (opcodes were renumbered; the numbers come from
 * CPython's opcode_ids.h).  Conditional jumps now carry one inline cache,
 * which the decoder takes from CPython's own cache table.
 */
#define AGS_JUMPS_FORWARD(X) \
    X(FOR_ITER) X(JUMP_FORWARD) X(POP_JUMP_IF_FALSE) X(POP_JUMP_IF_TRUE) \
    X(POP_JUMP_IF_NONE) X(POP_JUMP_IF_NOT_NONE) X(SEND)

#define AGS_JUMPS_BACKWARD(X) \
    X(JUMP_BACKWARD) X(JUMP_BACKWARD_NO_INTERRUPT)

/* Call protocol: [callable, self | NULL, args...]; a global or attribute
 * loaded for a call pushes its NULL after it. */
#define AGS_NULL_BEFORE_CALLABLE 0
/* LOAD_ATTR: name index = arg >> 1; bit 0 asks for a method load. */
#define AGS_LOAD_ATTR_HAS_METHOD_BIT 1

/* The opcodes the symbolic interpreter handles (interp.c). */
#define AGS_INTERP_OPS(X) \
    X(RESUME, op_nop, "start of the function: nothing") \
    X(NOP, op_nop, "nothing") \
    X(LOAD_FAST, op_load_fast, "push local arg") \
    X(LOAD_FAST_CHECK, op_load_fast, "push local arg, which may be unbound") \
    X(LOAD_FAST_LOAD_FAST, op_load_fast_load_fast, \
      "push locals arg >> 4 and arg & 15") \
    X(STORE_FAST, op_store_fast, "pop into local arg") \
    X(STORE_FAST_LOAD_FAST, op_store_fast_load_fast, \
      "pop into local arg >> 4, push local arg & 15") \
    X(STORE_FAST_STORE_FAST, op_store_fast_store_fast, \
      "pop into local arg >> 4, then into local arg & 15") \
    X(LOAD_CONST, op_load_const, "push co_consts[arg]") \
    X(POP_TOP, op_pop_top, "drop the top of the stack") \
    X(PUSH_NULL, op_push_null, "push the call protocol's NULL") \
    X(LOAD_GLOBAL, op_load_global, "push a global or builtin (and a NULL)") \
    X(LOAD_ATTR, op_load_attr, "attribute of the top, or [method, self]") \
    X(CALL, op_call, "call with arg positional arguments") \
    X(CALL_KW, op_call_kw, "call; the keyword names tuple is on top") \
    X(BINARY_OP, op_binary_op, "apply operator arg to the top two") \
    X(BUILD_TUPLE, op_build_tuple, "pack the top arg values into a tuple") \
    X(RETURN_VALUE, op_return_value, "return the top of the stack") \
    X(RETURN_CONST, op_return_const, "return co_consts[arg]")
