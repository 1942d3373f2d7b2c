/* interp_match.c: the match statement's instructions for the symbolic
 * interpreter (see interp.h).
 *
 * MATCH_MAPPING and MATCH_SEQUENCE ask only the subject's class, which
 * every abstract value knows: a container the capture built is a dict, a
 * list or a tuple; a tensor is neither; a known object answers by its
 * type's flags (its type is guarded where it came from).  MATCH_CLASS,
 * MATCH_KEYS and GET_LEN read the subject itself (isinstance, attributes,
 * membership and items, its length): each is the call of a function of
 * agspeed/_match.py that does what the instruction does, inlined as the
 * program's own code is, so that its reads are guarded where they happen.
 */
#include "interp.h"

/* MATCH_MAPPING / MATCH_SEQUENCE: push whether the top's class has
 * `flag`. */
static int
match_kind(ags_interp *it, ags_frame *f, unsigned long flag)
{
    const ags_value *subject = ags_peek(f, 1);
    int yes;
    ags_value v;

    switch (subject->kind) {
    case AGS_VK_TUPLE:
    case AGS_VK_LIST:
        yes = flag == Py_TPFLAGS_SEQUENCE;
        break;
    case AGS_VK_DICT:
        yes = flag == Py_TPFLAGS_MAPPING;
        break;
    case AGS_VK_CONST:
        yes = PyType_HasFeature(Py_TYPE(subject->obj), flag);
        break;
    case AGS_VK_TENSOR:
    case AGS_VK_SET:
    case AGS_VK_ITER:
    case AGS_VK_GENERATOR:
        yes = 0;
        break;
    default:
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                         "matching a pattern against a %s",
                         ags_kind_names[subject->kind]);
    }
    v = ags_value_make(AGS_VK_CONST, Py_NewRef(yes ? Py_True : Py_False),
                       NULL);
    return ags_push(f, v);
}

AGS_HANDLER
op_match_mapping(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return match_kind(it, f, Py_TPFLAGS_MAPPING);
}

AGS_HANDLER
op_match_sequence(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return match_kind(it, f, Py_TPFLAGS_SEQUENCE);
}

/* Inlines builder.<helper>(*args) (args borrowed) and pushes its result. */
static int
call_helper(ags_interp *it, ags_frame *f, const char *helper,
            ags_value *args, int nargs)
{
    PyObject *func = PyObject_GetAttrString(it->builder, helper);
    ags_value result;
    int rc;

    if (func == NULL || !PyFunction_Check(func)) {
        /* a builder that does not follow match statements */
        if (func == NULL && !PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return AGS_ERROR;
        }
        PyErr_Clear();
        Py_XDECREF(func);
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_INSTRUCTION,
                         "a match statement (the builder has no %s)", helper);
    }
    rc = ags_inline(it, f, func, NULL, args, nargs, NULL, &result);
    Py_DECREF(func);
    return rc == AGS_GO ? ags_push(f, result) : rc;
}

/* GET_LEN: push len(top), the top staying. */
AGS_HANDLER
op_get_len(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return call_helper(it, f, "match_len", ags_peek(f, 1), 1);
}

/* MATCH_KEYS: [subject, keys] -> [subject, keys, values or None]. */
AGS_HANDLER
op_match_keys(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value args[2];

    (void)ins;
    args[0] = *ags_peek(f, 2);   /* borrowed: ags_inline binds its own */
    args[1] = *ags_peek(f, 1);
    return call_helper(it, f, "match_keys", args, 2);
}

/* MATCH_CLASS count: [subject, class, names] -> [attributes or None]. */
AGS_HANDLER
op_match_class(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value names = ags_pop(f), cls = ags_pop(f), subject = ags_pop(f);
    ags_value args[4];
    PyObject *count = PyLong_FromUnsignedLong(ins->arg);
    int rc = AGS_ERROR;

    if (count != NULL) {
        args[0] = subject;
        args[1] = cls;
        args[2] = ags_value_make(AGS_VK_CONST, count, NULL);
        args[3] = names;
        rc = call_helper(it, f, "match_class", args, 4);
        ags_value_clear(&args[2]);
    }
    ags_value_clear(&names);
    ags_value_clear(&cls);
    ags_value_clear(&subject);
    return rc;
}
