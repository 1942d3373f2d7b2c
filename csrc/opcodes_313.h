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
