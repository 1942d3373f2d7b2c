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
