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
