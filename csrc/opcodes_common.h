/* opcodes_common.h: the symbolic interpreter's opcodes that several
 * CPython versions share, with the handler of each and what it does to the
 * abstract stack (interp*.c).  Each csrc/opcodes_3XX.h builds its
 * AGS_INTERP_OPS from these lists and its own rows; anything not listed
 * ends the capture.  Included by compat.h before the version's file.
 */
#ifndef AGS_OPCODES_COMMON_H
#define AGS_OPCODES_COMMON_H

/* Every supported version. */
#define AGS_INTERP_OPS_COMMON(X) \
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
    X(STORE_GLOBAL, op_store_global, "global name = top: a write to the " \
      "module, replayed after the graph") \
    X(LOAD_ATTR, op_load_attr, \
      "attribute of the top; from 3.12, arg bit 0 asks for [method, self]") \
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
    X(GET_LEN, op_get_len, "push len(top), the top staying (match)") \
    X(MATCH_MAPPING, op_match_mapping, "push whether the top is a mapping") \
    X(MATCH_SEQUENCE, op_match_sequence, "push whether the top is a " \
      "sequence") \
    X(MATCH_KEYS, op_match_keys, "push the values of the keys on top in the " \
      "mapping under them, or None") \
    X(MATCH_CLASS, op_match_class, "the attributes a class pattern matches, " \
      "or None (interp_match.c)") \
    X(UNPACK_EX, op_unpack_ex, "unpack with one starred target") \
    X(BINARY_SUBSCR, op_binary_subscr, "container[index]") \
    X(STORE_SUBSCR, op_store_subscr, "container[index] = value") \
    X(STORE_ATTR, op_store_attr, "obj.name = value: on an object made here, " \
                                 "else breaks (a side effect)") \
    X(DELETE_ATTR, op_delete_attr, "del obj.name: on an object made here, " \
                                   "else breaks (a side effect)") \
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
    X(RETURN_GENERATOR, op_return_generator, \
      "a generator's start: push the None its first step sends") \
    X(YIELD_VALUE, op_yield_value, "suspend the generator (AGS_YIELD)") \
    X(GET_YIELD_FROM_ITER, op_get_yield_from_iter, \
      "yield from: a generator stays, anything else as GET_ITER") \
    X(SEND, op_send, "step the yield-from iterator, or jump when done") \
    X(BEFORE_WITH, op_before_with, "[cm] -> [exit, what enter returned]") \
    X(PUSH_EXC_INFO, op_push_exc_info, "a handler starts: reached only " \
      "through ags_catch (interp_catch.c)") \
    X(CHECK_EXC_MATCH, op_check_exc_match, "except T: does the caught " \
      "exception match") \
    X(CHECK_EG_MATCH, op_exception_path, "except* T: ends the capture") \
    X(WITH_EXCEPT_START, op_exception_path, "a with's exit on a raise") \
    X(POP_EXCEPT, op_pop_except, "a handler ends") \
    X(RERAISE, op_reraise, "re-raise the caught exception on top") \
    X(BUILD_SET, op_build_set, "pack the top arg values into a set") \
    X(SET_ADD, op_set_add, "add the top to a built set") \
    X(SET_UPDATE, op_set_update, "add the elements of the top to a set") \
    X(DICT_MERGE, op_dict_merge, "f(**m): merge, a repeated key fails") \
    X(DICT_UPDATE, op_dict_update, "{**m}: update a built dict") \
    X(MAP_ADD, op_map_add, "{k: v for ...}: set an item of a built dict") \
    X(IMPORT_NAME, op_import_name, "a module already in sys.modules") \
    X(IMPORT_FROM, op_import_from, "an attribute of the imported module")

/* 3.12 and later. */
#define AGS_INTERP_OPS_SINCE_312(X) \
    X(LOAD_FAST_CHECK, op_load_fast, "push local arg, which may be unbound") \
    X(LOAD_FAST_AND_CLEAR, op_load_fast_and_clear, "push and unbind local arg") \
    X(LOAD_SUPER_ATTR, op_load_super_attr, "super().name") \
    X(CALL_INTRINSIC_1, op_call_intrinsic_1, "list-to-tuple for f(*args)") \
    X(BINARY_SLICE, op_binary_slice, "container[start:stop]") \
    X(STORE_SLICE, op_store_slice, "container[start:stop] = value") \
    X(END_FOR, op_end_for, "loop end (skipped by an exhausted FOR_ITER)") \
    X(RETURN_CONST, op_return_const, "return co_consts[arg]") \
    X(POP_JUMP_IF_FALSE, op_pop_jump_if_false, "branch") \
    X(POP_JUMP_IF_TRUE, op_pop_jump_if_true, "branch") \
    X(POP_JUMP_IF_NONE, op_pop_jump_if_none, "branch") \
    X(POP_JUMP_IF_NOT_NONE, op_pop_jump_if_not_none, "branch") \
    X(END_SEND, op_end_send, "drop the finished yield-from iterator")

#endif
