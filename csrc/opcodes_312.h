/* opcodes_312.h: CPython 3.12's relative jumps, selected by compat.h.
 *
 * Jumps count from the end of the instruction's inline caches (FOR_ITER
 * and SEND have one).  Conditional jumps are forward only; loops close
 * with JUMP_BACKWARD.  Checked against dis.hasjrel by tests.
 */
#define AGS_JUMPS_FORWARD(X) \
    X(FOR_ITER) X(JUMP_FORWARD) X(POP_JUMP_IF_FALSE) X(POP_JUMP_IF_TRUE) \
    X(POP_JUMP_IF_NONE) X(POP_JUMP_IF_NOT_NONE) X(SEND)

#define AGS_JUMPS_BACKWARD(X) \
    X(JUMP_BACKWARD) X(JUMP_BACKWARD_NO_INTERRUPT)

/* Call protocol: [NULL | method, callable | self, args...]. */
#define AGS_NULL_BEFORE_CALLABLE 1
/* LOAD_ATTR: name index = arg >> 1; bit 0 asks for a method load. */
#define AGS_LOAD_ATTR_HAS_METHOD_BIT 1

/* The opcodes the symbolic interpreter handles (interp.c). */
#define AGS_INTERP_OPS(X) \
    X(RESUME, op_nop, "start of the function: nothing") \
    X(NOP, op_nop, "nothing") \
    X(LOAD_FAST, op_load_fast, "push local arg") \
    X(LOAD_FAST_CHECK, op_load_fast, "push local arg, which may be unbound") \
    X(STORE_FAST, op_store_fast, "pop into local arg") \
    X(LOAD_CONST, op_load_const, "push co_consts[arg]") \
    X(POP_TOP, op_pop_top, "drop the top of the stack") \
    X(PUSH_NULL, op_push_null, "push the call protocol's NULL") \
    X(LOAD_GLOBAL, op_load_global, "push a global or builtin (and a NULL)") \
    X(LOAD_ATTR, op_load_attr, "attribute of the top, or [method, self]") \
    X(KW_NAMES, op_kw_names, "name the keyword arguments of the next CALL") \
    X(CALL, op_call, "call with arg positional+keyword arguments") \
    X(BINARY_OP, op_binary_op, "apply operator arg to the top two") \
    X(BUILD_TUPLE, op_build_tuple, "pack the top arg values into a tuple") \
    X(RETURN_VALUE, op_return_value, "return the top of the stack") \
    X(RETURN_CONST, op_return_const, "return co_consts[arg]")
