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

/* COMPARE_OP: the operator is arg >> AGS_COMPARE_SHIFT. */
#define AGS_COMPARE_SHIFT 0
/* An exhausted FOR_ITER pops the iterator and lands this many instructions
 * after its target; 3.11 has no END_FOR. */
#define AGS_FOR_ITER_SKIP 0
#define AGS_END_FOR_POPS 0

/* The opcodes the symbolic interpreter handles (interp*.c), with what each
 * does to the abstract stack.  Anything else ends the capture. */
#define AGS_INTERP_OPS(X) \
    X(RESUME, op_nop, "start of the function: nothing") \
    X(NOP, op_nop, "nothing") \
    X(MAKE_CELL, op_nop, "cells hold values already (interp_data.c)") \
    X(COPY_FREE_VARS, op_nop, "free variables are bound at frame start") \
    X(LOAD_FAST, op_load_fast, "push local arg") \
    X(LOAD_DEREF, op_load_fast, "push the contents of cell/free slot arg") \
    X(STORE_FAST, op_store_fast, "pop into local arg") \
    X(STORE_DEREF, op_store_fast, "pop into cell slot arg") \
    X(DELETE_FAST, op_delete_fast, "unbind local arg") \
    X(LOAD_CONST, op_load_const, "push co_consts[arg]") \
    X(POP_TOP, op_pop_top, "drop the top of the stack") \
    X(PUSH_NULL, op_push_null, "push the call protocol's NULL") \
    X(COPY, op_copy, "push a copy of the arg-th value") \
    X(SWAP, op_swap, "swap the top with the arg-th value") \
    X(LOAD_GLOBAL, op_load_global, "push a global or builtin (and a NULL)") \
    X(LOAD_ATTR, op_load_attr, "replace the top with one of its attributes") \
    X(CALL, op_call, "call with arg positional+keyword arguments") \
    X(CALL_FUNCTION_EX, op_call_function_ex, "f(*args, **kwargs)") \
    X(BINARY_OP, op_binary_op, "apply operator arg to the top two") \
    X(UNARY_NEGATIVE, op_unary_negative, "-top") \
    X(UNARY_INVERT, op_unary_invert, "~top") \
    X(UNARY_NOT, op_unary_not, "not top (a known truth)") \
    X(COMPARE_OP, op_compare_op, "compare the top two") \
    X(IS_OP, op_is_op, "identity of the top two (arg: negated)") \
    X(CONTAINS_OP, op_contains_op, "membership (arg: negated)") \
    X(BUILD_TUPLE, op_build_tuple, "pack the top arg values into a tuple") \
    X(BUILD_LIST, op_build_list, "pack the top arg values into a list") \
    X(BUILD_MAP, op_build_map, "a dict from arg key/value pairs") \
    X(BUILD_CONST_KEY_MAP, op_build_const_key_map, "a dict, keys on top") \
    X(BUILD_SLICE, op_build_slice, "a slice of 2 or 3 known bounds") \
    X(LIST_APPEND, op_list_append, "append the top to a built list") \
    X(LIST_EXTEND, op_list_extend, "extend a built list by the top") \
    X(UNPACK_SEQUENCE, op_unpack_sequence, "push arg elements, last first") \
    X(UNPACK_EX, op_unpack_ex, "unpack with one starred target") \
    X(BINARY_SUBSCR, op_binary_subscr, "container[index]") \
    X(STORE_SUBSCR, op_store_subscr, "container[index] = value") \
    X(BUILD_STRING, op_build_string, "join arg known strings") \
    X(GET_ITER, op_get_iter, "an iterator over a known sequence") \
    X(FOR_ITER, op_for_iter, "next element, or leave the loop") \
    X(JUMP_FORWARD, op_jump, "jump") \
    X(JUMP_BACKWARD, op_jump, "jump (a loop)") \
    X(JUMP_BACKWARD_NO_INTERRUPT, op_jump, "jump") \
    X(RETURN_VALUE, op_return_value, "return the top of the stack") \
    X(RAISE_VARARGS, op_raise, "the code raises: eager raises it") \
    X(LOAD_ASSERTION_ERROR, op_raise, "a failed assert: eager raises it") \
    X(MAKE_FUNCTION, op_make_function, "a function from a code constant") \
    X(PRECALL, op_nop, "3.11 call preamble: nothing symbolic") \
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
