/* opcodes_313.h: CPython 3.13's relative jumps, selected by bytecode.h.
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

/* COMPARE_OP: the operator is arg >> AGS_COMPARE_SHIFT. */
#define AGS_COMPARE_SHIFT 5
/* An exhausted FOR_ITER pops the iterator and lands this many instructions
 * after its target; END_FOR pops one; a POP_TOP follows it. */
#define AGS_FOR_ITER_SKIP 2
#define AGS_END_FOR_POPS 1
/* SEND, when the iterator is done, replaces the sent value with the
 * return value (END_SEND drops the iterator). */
#define AGS_SEND_DONE_POPS 1

/* The opcodes the symbolic interpreter handles (interp*.c): the shared
 * lists of opcodes_common.h and this version's own rows. */
#define AGS_INTERP_OPS(X) \
    AGS_INTERP_OPS_COMMON(X) \
    AGS_INTERP_OPS_SINCE_312(X) \
    X(CALL_KW, op_call_kw, "call; the keyword names tuple is on top") \
    X(SET_FUNCTION_ATTRIBUTE, op_set_function_attribute, \
      "defaults or closure of the function just made") \
    X(LOAD_FAST_LOAD_FAST, op_load_fast_load_fast, \
      "push locals arg >> 4 and arg & 15") \
    X(STORE_FAST_LOAD_FAST, op_store_fast_load_fast, \
      "pop into local arg >> 4, push local arg & 15") \
    X(STORE_FAST_STORE_FAST, op_store_fast_store_fast, \
      "pop into local arg >> 4, then into local arg & 15") \
    X(TO_BOOL, op_to_bool, "the known truth of the top") \
    X(FORMAT_SIMPLE, op_format_simple, "format a known value") \
    X(FORMAT_WITH_SPEC, op_format_with_spec, "format with a known spec") \
    X(CONVERT_VALUE, op_convert_value, "str/repr/ascii of a known value")

/* Code generation (emit.c).  Relative jumps that have a twin in the other
 * direction (conditional jumps are forward only here). */
#define AGS_JUMP_TWINS(X) X(JUMP_FORWARD, JUMP_BACKWARD)
/* Instructions after which control never reaches the next one. */
#define AGS_EMIT_STOPS(X) \
    X(RETURN_VALUE) X(RETURN_CONST) X(RAISE_VARARGS) X(RERAISE) \
    X(JUMP_FORWARD) X(JUMP_BACKWARD) X(JUMP_BACKWARD_NO_INTERRUPT)
