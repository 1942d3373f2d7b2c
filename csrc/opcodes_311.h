/* opcodes_311.h: CPython 3.11's relative jumps, selected by bytecode.h.
 *
 * Every jump of 3.11 is relative to the end of the instruction (3.11's
 * jumps carry no inline caches); the ones below jump backward.  Opcode
 * numbers come from CPython's opcode.h.  Checked against dis.hasjrel of
 * 3.11.7 by tests/csrc/test_bytecode.py.
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

/* COMPARE_OP: the operator is arg >> AGS_COMPARE_SHIFT. */
#define AGS_COMPARE_SHIFT 0
/* An exhausted FOR_ITER pops the iterator and lands this many instructions
 * after its target; 3.11 has no END_FOR. */
#define AGS_FOR_ITER_SKIP 0
#define AGS_END_FOR_POPS 0
/* 3.11's SEND, when the iterator is done, replaces it and the sent value
 * with the return value. */
#define AGS_SEND_DONE_POPS 2

/* The opcodes the symbolic interpreter handles (interp*.c): the shared
 * lists of opcodes_common.h and this version's own rows. */
#define AGS_INTERP_OPS(X) \
    AGS_INTERP_OPS_COMMON(X) \
    X(PRECALL, op_nop, "3.11 call preamble: nothing symbolic") \
    X(UNARY_POSITIVE, op_unary_positive, "+top (an intrinsic from 3.12)") \
    X(LOAD_CLOSURE, op_load_closure, \
      "a cell for a closure tuple: MAKE_FUNCTION uses the frame's own") \
    X(LOAD_METHOD, op_load_method, "replace the top with [method, self]") \
    X(KW_NAMES, op_kw_names, "name the keyword arguments of the next CALL") \
    X(LIST_TO_TUPLE, op_list_to_tuple, "tuple(list) for f(*args)") \
    X(FORMAT_VALUE, op_format_value, "format a known value (f-strings)") \
    X(POP_JUMP_FORWARD_IF_FALSE, op_pop_jump_if_false, "branch") \
    X(POP_JUMP_FORWARD_IF_TRUE, op_pop_jump_if_true, "branch") \
    X(POP_JUMP_FORWARD_IF_NONE, op_pop_jump_if_none, "branch") \
    X(POP_JUMP_FORWARD_IF_NOT_NONE, op_pop_jump_if_not_none, "branch") \
    X(POP_JUMP_BACKWARD_IF_FALSE, op_pop_jump_if_false, "branch") \
    X(POP_JUMP_BACKWARD_IF_TRUE, op_pop_jump_if_true, "branch") \
    X(POP_JUMP_BACKWARD_IF_NONE, op_pop_jump_if_none, "branch") \
    X(POP_JUMP_BACKWARD_IF_NOT_NONE, op_pop_jump_if_not_none, "branch") \
    X(JUMP_IF_FALSE_OR_POP, op_jump_if_false_or_pop, "and: keep or pop") \
    X(JUMP_IF_TRUE_OR_POP, op_jump_if_true_or_pop, "or: keep or pop")

/* Code generation (emit.c).  Relative jumps that have a twin in the other
 * direction: the assembler picks the one its target's side needs. */
#define AGS_JUMP_TWINS(X) \
    X(JUMP_FORWARD, JUMP_BACKWARD) \
    X(POP_JUMP_FORWARD_IF_FALSE, POP_JUMP_BACKWARD_IF_FALSE) \
    X(POP_JUMP_FORWARD_IF_TRUE, POP_JUMP_BACKWARD_IF_TRUE) \
    X(POP_JUMP_FORWARD_IF_NONE, POP_JUMP_BACKWARD_IF_NONE) \
    X(POP_JUMP_FORWARD_IF_NOT_NONE, POP_JUMP_BACKWARD_IF_NOT_NONE)
/* Instructions after which control never reaches the next one. */
#define AGS_EMIT_STOPS(X) \
    X(RETURN_VALUE) X(RAISE_VARARGS) X(RERAISE) X(JUMP_FORWARD) \
    X(JUMP_BACKWARD) X(JUMP_BACKWARD_NO_INTERRUPT)
