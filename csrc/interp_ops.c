/* interp_ops.c: operators and f-strings for the symbolic interpreter (see
 * interp.h).
 *
 * BINARY_OP and the unary operators apply the operator module's function
 * of the same meaning: a graph node when a tensor is involved, else folded
 * by the builder, which allows only plain types and built containers.
 * f-string parts of known values are formatted by the builder.
 */
#include "interp.h"
#include <string.h>

static PyObject *binary_ops;    /* tuple: operator functions by NB_* index */
static PyObject *unary_ops;     /* operator.neg, operator.invert, operator.pos */
static PyObject *deque_type;    /* collections.deque */
static PyObject *defaultdict_type;  /* collections.defaultdict */

/* BINARY_OP's first in-place operator (NB_INPLACE_ADD): the in-place
 * forms follow the plain ones in the same order. */
#define AGS_INPLACE_FIRST 13u

/* The operator module's functions by NB_* index; an in-place one's name,
 * in dunders, is also the container method it calls (`__iadd__`). */
static const char *const binary_names[] = {
    "add", "and_", "floordiv", "lshift", "matmul", "mul", "mod", "or_",
    "pow", "rshift", "sub", "truediv", "xor", "iadd", "iand",
    "ifloordiv", "ilshift", "imatmul", "imul", "imod", "ior", "ipow",
    "irshift", "isub", "itruediv", "ixor"};
#define AGS_N_BINARY ((uint32_t)(sizeof(binary_names) / sizeof(binary_names[0])))

PyObject *
ags_binary_fn(uint32_t op)
{
    return op < (uint32_t)PyTuple_GET_SIZE(binary_ops)
               ? PyTuple_GET_ITEM(binary_ops, op) : NULL;
}

static PyObject *
operator_tuple(PyObject *operator_module, const char *const *names, int n)
{
    PyObject *t = PyTuple_New(n);

    for (int i = 0; t != NULL && i < n; i++) {
        PyObject *fn = PyObject_GetAttrString(operator_module, names[i]);
        if (fn == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, fn);
    }
    return t;
}

int
ags_ops_init(void)
{
    static const char *const unary[] = {"neg", "invert", "pos"};
    PyObject *operator_module, *collections;

    if (binary_ops != NULL) {
        return 0;
    }
    operator_module = PyImport_ImportModule("operator");
    if (operator_module == NULL) {
        return -1;
    }
    binary_ops = operator_tuple(operator_module, binary_names, (int)AGS_N_BINARY);
    unary_ops = operator_tuple(operator_module, unary, 3);
    Py_DECREF(operator_module);
    collections = PyImport_ImportModule("collections");
    deque_type = collections ? PyObject_GetAttrString(collections, "deque")
                             : NULL;
    defaultdict_type = collections
                           ? PyObject_GetAttrString(collections, "defaultdict")
                           : NULL;
    Py_XDECREF(collections);
    return binary_ops && unary_ops && deque_type && defaultdict_type ? 0 : -1;
}

/* collections.deque: a container the capture may make and change in place
 * (interp_call.c owns it, interp_data.c assigns its items). */
int
ags_is_deque(PyObject *obj)
{
    return deque_type != NULL && Py_IS_TYPE(obj, (PyTypeObject *)deque_type);
}

/* Whether fn is a method of deque's own (deque.append): one that may
 * store its arguments. */
int
ags_is_deque_method(PyObject *fn)
{
    return deque_type != NULL && Py_IS_TYPE(fn, &PyMethodDescr_Type)
           && (PyObject *)PyDescr_TYPE(fn) == deque_type;
}

int
ags_is_defaultdict(PyObject *obj)
{
    return defaultdict_type != NULL
           && Py_IS_TYPE(obj, (PyTypeObject *)defaultdict_type);
}

/* ------------------------------------------------------------------ */
/* Operators */

/* fn(operands) as a graph node when a tensor is involved, else folded by
 * the builder (which allows only plain types and built containers). */
static int
apply_operator(ags_interp *it, ags_frame *f, PyObject *fn, ags_value *ops,
               int n)
{
    int tensor = 0;
    ags_value result;
    int rc;

    for (int i = 0; i < n; i++) {
        tensor |= ops[i].kind == AGS_VK_TENSOR;
    }
    rc = ags_builder_call(it, tensor ? AGS_BOP_CALL_FUNCTION : AGS_BOP_FOLD,
                          fn, NULL, ops, n,
                      NULL, &result);
    for (int i = 0; i < n; i++) {
        ags_value_clear(&ops[i]);
    }
    return rc == AGS_GO ? ags_push(f, result) : rc;
}

/* A value of a builtin immutable type: a tuple, a number, a string. */
static int
immutable(const ags_value *v)
{
    PyObject *o = v->obj;

    return v->kind == AGS_VK_TUPLE
           || (v->kind == AGS_VK_CONST
               && (PyTuple_CheckExact(o) || PyLong_CheckExact(o)
                   || PyFloat_CheckExact(o) || PyBool_Check(o)
                   || PyComplex_CheckExact(o) || PyUnicode_CheckExact(o)
                   || PyBytes_CheckExact(o)));
}

/* `acc += [x]`, `seen |= {k}`, `d |= other`: an in-place operator on a
 * list, dict or set changes that very object, which every other name for
 * it sees.  It runs as the container's own in-place method on the
 * container the capture built, or on the shadow of the program's
 * (interp_effects.c), never on a copy; the result is the container.
 * AGS_GO, a break, AGS_ERROR, or 1 where ops[0] is no such container (the
 * caller clears ops either way). */
static int
inplace_container(ags_interp *it, ags_frame *f, ags_value *ops, uint32_t arg)
{
    PyObject *name, *spec;
    ags_value result;
    int rc;

    if (arg < AGS_INPLACE_FIRST || arg >= AGS_N_BINARY) {
        return 1;
    }
    name = PyUnicode_FromFormat("__%s__", binary_names[arg]);
    if (name == NULL) {
        return AGS_ERROR;
    }
    rc = ags_can_shadow(&ops[0]) ? ags_is_mutator(ops[0].obj, name) : 0;
    if (rc == 1) {
        rc = ags_shadow(it, &ops[0]);   /* the program's: changed in its copy */
    }
    else if (rc == 0) {
        rc = AGS_BUILT_CONTAINER(&ops[0]) ? AGS_GO : 1;
    }
    else {
        rc = AGS_ERROR;
    }
    if (rc == AGS_GO) {
        rc = ags_note_write(it, ops[0].obj) < 0
                 ? AGS_ERROR : ags_extends_by_ahead(it, name, &ops[1], 1);
    }
    spec = rc == AGS_GO ? PyTuple_Pack(2, name, ops[0].obj) : NULL;
    Py_DECREF(name);
    if (rc != AGS_GO) {
        return rc;
    }
    if (spec == NULL) {
        return AGS_ERROR;
    }
    rc = ags_builder_call(it, AGS_BOP_CONTAINER_METHOD, spec, NULL, &ops[1], 1,
                          NULL, &result);
    Py_DECREF(spec);
    return rc == AGS_GO ? ags_push(f, result) : rc;
}

AGS_HANDLER
op_binary_op(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value ops[2];
    PyObject *fn = ags_binary_fn(ins->arg);
    int rc;

    if (fn == NULL) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_INSTRUCTION,
                         "BINARY_OP %u",
                         (unsigned)ins->arg);
    }
    ops[1] = ags_pop(f);
    ops[0] = ags_pop(f);
    rc = inplace_container(it, f, ops, ins->arg);
    if (rc != 1) {
        ags_value_clear(&ops[0]);
        ags_value_clear(&ops[1]);
        return rc;
    }
    if (ins->arg >= AGS_INPLACE_FIRST && immutable(&ops[0])) {
        /* `n += t`, `tup += (t,)`: an immutable value has no in-place slot,
         * so Python computes the plain operator (and the graph must not
         * name a constant as the target of an augmented assignment) */
        fn = ags_binary_fn(ins->arg - AGS_INPLACE_FIRST);
    }
    return apply_operator(it, f, fn, ops, 2);
}

static int
unary(ags_interp *it, ags_frame *f, int which)
{
    ags_value op = ags_pop(f);
    return apply_operator(it, f, PyTuple_GET_ITEM(unary_ops, which), &op, 1);
}

AGS_HANDLER
op_unary_negative(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return unary(it, f, 0);
}

AGS_HANDLER
op_unary_invert(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return unary(it, f, 1);
}

/* UNARY_POSITIVE (3.11) and CALL_INTRINSIC_1's unary positive (3.12+). */
int
ags_unary_positive(ags_interp *it, ags_frame *f)
{
    return unary(it, f, 2);
}

AGS_HANDLER
op_unary_positive(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return ags_unary_positive(it, f);
}

/* ------------------------------------------------------------------ */
/* f-strings of constants */

static int
format_top(ags_interp *it, ags_frame *f, int conversion, int with_spec)
{
    ags_value spec = with_spec ? ags_pop(f)
                               : ags_value_make(AGS_VK_UNBOUND, NULL, NULL);
    ags_value v = ags_pop(f);
    PyObject *out = NULL;
    int rc;

    if (v.kind != AGS_VK_CONST || (with_spec && spec.kind != AGS_VK_CONST)) {
        rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE, "formatting a %s",
                       AGS_DESCRIBE(&v));
        goto done;
    }
    out = ags_call_builder(it, AGS_BOP_FORMAT, "(OiO)", v.obj, conversion,
                           with_spec ? spec.obj : Py_None);
    if (out == NULL) {
        rc = ags_take_break(it);
        goto done;
    }
    rc = ags_push(f, ags_value_make(AGS_VK_CONST, out, NULL));
done:
    ags_value_clear(&v);
    ags_value_clear(&spec);
    return rc;
}

/* FORMAT_VALUE (3.11, 3.12): flags & 3 is the conversion, & 4 a spec. */
AGS_HANDLER
op_format_value(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return format_top(it, f, (int)(ins->arg & 3), (ins->arg & 4) != 0);
}

AGS_HANDLER
op_format_simple(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return format_top(it, f, 0, 0);
}

AGS_HANDLER
op_format_with_spec(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return format_top(it, f, 0, 1);
}

/* CONVERT_VALUE (3.13): 1 str, 2 repr, 3 ascii; the same numbers as
 * FORMAT_VALUE's conversion bits.  Converting with no spec is formatting
 * the converted string, so it shares format_top. */
AGS_HANDLER
op_convert_value(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return format_top(it, f, (int)ins->arg, 0);
}

AGS_HANDLER
op_build_string(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    int n = (int)ins->arg;
    PyObject *parts = PyTuple_New(n), *sep, *out;

    if (parts == NULL) {
        return AGS_ERROR;
    }
    for (int i = 0; i < n; i++) {
        ags_value *v = ags_peek(f, n - i);
        if (v->kind != AGS_VK_CONST || !PyUnicode_Check(v->obj)) {
            Py_DECREF(parts);
            return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                             "f-string part %s",
                             AGS_DESCRIBE(v));
        }
        PyTuple_SET_ITEM(parts, i, Py_NewRef(v->obj));
    }
    sep = PyUnicode_FromString("");
    out = sep ? PyUnicode_Join(sep, parts) : NULL;
    Py_XDECREF(sep);
    Py_DECREF(parts);
    if (out == NULL) {
        return AGS_ERROR;
    }
    ags_drop(f, n);
    return ags_push(f, ags_value_make(AGS_VK_CONST, out, NULL));
}
