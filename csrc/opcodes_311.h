/* opcodes_311.h: CPython 3.11's relative jumps, selected by compat.h.
 *
 * Every jump of 3.11 is relative to the end of the instruction (3.11's
 * jumps carry no inline caches); the ones below jump backward.  Opcode
 * numbers come from CPython's opcode.h.  Checked against dis.hasjrel of
 * 3.11.7 by tests/test_bytecode.py.
 */
#define AGS_JUMPS_FORWARD(X) \
    X(FOR_ITER) X(JUMP_FORWARD) X(JUMP_IF_FALSE_OR_POP) \
    X(JUMP_IF_TRUE_OR_POP) X(POP_JUMP_FORWARD_IF_FALSE) \
    X(POP_JUMP_FORWARD_IF_TRUE) X(POP_JUMP_FORWARD_IF_NONE) \
    X(POP_JUMP_FORWARD_IF_NOT_NONE) X(SEND)

#define AGS_JUMPS_BACKWARD(X) \
    X(JUMP_BACKWARD) X(JUMP_BACKWARD_NO_INTERRUPT) \
    X(POP_JUMP_BACKWARD_IF_FALSE) X(POP_JUMP_BACKWARD_IF_TRUE) \
    X(POP_JUMP_BACKWARD_IF_NONE) X(POP_JUMP_BACKWARD_IF_NOT_NONE)

/* Call protocol: [NULL | method, callable | self, args...]; a global or
 * attribute loaded for a call pushes its NULL first. */
#define AGS_NULL_BEFORE_CALLABLE 1
/* LOAD_ATTR's argument is the name index; method loads are LOAD_METHOD. */
#define AGS_LOAD_ATTR_HAS_METHOD_BIT 0

/* The opcodes the symbolic interpreter handles (interp.c), with what each
 * does to the abstract stack.  Anything else ends the capture. */
#define AGS_INTERP_OPS(X) \
    X(RESUME, op_nop, "start of the function: nothing") \
    X(NOP, op_nop, "nothing") \
    X(PRECALL, op_nop, "3.11 call preamble: nothing symbolic") \
    X(LOAD_FAST, op_load_fast, "push local arg") \
    X(STORE_FAST, op_store_fast, "pop into local arg") \
    X(LOAD_CONST, op_load_const, "push co_consts[arg]") \
    X(POP_TOP, op_pop_top, "drop the top of the stack") \
    X(PUSH_NULL, op_push_null, "push the call protocol's NULL") \
    X(LOAD_GLOBAL, op_load_global, "push a global or builtin (and a NULL)") \
    X(LOAD_ATTR, op_load_attr, "replace the top with one of its attributes") \
    X(LOAD_METHOD, op_load_method, "replace the top with [method, self]") \
    X(KW_NAMES, op_kw_names, "name the keyword arguments of the next CALL") \
    X(CALL, op_call, "call with arg positional+keyword arguments") \
    X(BINARY_OP, op_binary_op, "apply operator arg to the top two") \
    X(BUILD_TUPLE, op_build_tuple, "pack the top arg values into a tuple") \
    X(RETURN_VALUE, op_return_value, "return the top of the stack")
