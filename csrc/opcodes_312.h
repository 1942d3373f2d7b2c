/* opcodes_312.h: CPython 3.12's relative jumps, selected by bytecode.h.
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

/* COMPARE_OP: the operator is arg >> AGS_COMPARE_SHIFT. */
#define AGS_COMPARE_SHIFT 4
/* An exhausted FOR_ITER pops the iterator and lands this many instructions
 * after its target; END_FOR pops the iterator and the last value. */
#define AGS_FOR_ITER_SKIP 1
#define AGS_END_FOR_POPS 2
/* SEND, when the iterator is done, replaces the sent value with the
 * return value (END_SEND drops the iterator). */
#define AGS_SEND_DONE_POPS 1

/* The opcodes the symbolic interpreter handles (interp*.c): the shared
 * lists of opcodes_common.h and this version's own rows. */
#define AGS_INTERP_OPS(X) \
    AGS_INTERP_OPS_COMMON(X) \
    AGS_INTERP_OPS_SINCE_312(X) \
    X(KW_NAMES, op_kw_names, "name the keyword arguments of the next CALL") \
    X(LOAD_CLOSURE, op_load_closure, \
      "a cell for a closure tuple: MAKE_FUNCTION uses the frame's own") \
    X(FORMAT_VALUE, op_format_value, "format a known value (f-strings)")

/* Code generation (emit.c).  Relative jumps that have a twin in the other
 * direction (conditional jumps are forward only here). */
#define AGS_JUMP_TWINS(X) X(JUMP_FORWARD, JUMP_BACKWARD)
/* Instructions after which control never reaches the next one. */
#define AGS_EMIT_STOPS(X) \
    X(RETURN_VALUE) X(RETURN_CONST) X(RAISE_VARARGS) X(RERAISE) \
    X(JUMP_FORWARD) X(JUMP_BACKWARD) X(JUMP_BACKWARD_NO_INTERRUPT)
