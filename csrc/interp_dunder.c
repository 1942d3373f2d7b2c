/* interp_dunder.c: special methods written in Python, inlined (see
 * interp.h).
 *
 * CPython runs `b[k]`, `a in b`, `len(b)`, `iter(b)`, `str(b)`, `repr(b)`
 * and the truth of `b` through slots of type(b); for a class written in
 * Python those slots call the class's __getitem__, __contains__, __len__,
 * __iter__, __str__, __repr__, __bool__.  The
 * interpreter does the same: an object whose type has such a method as a
 * Python function gets that function inlined, the object as self, through
 * ags_inline, so whatever it calls (a mixin's Mapping.get, a dict read)
 * is captured as any method body is.
 *
 * Which function, if any, is the builder's answer (builder op DUNDER,
 * agspeed/_dunders.py): it is policy (torch's containers, the objects
 * agspeed/_objects.py models and C types keep the path they take today)
 * and it appends the guards (the object's exact type, the function on the
 * class that defines it).  This file only asks, and only of constants
 * whose type is a heap type: builtin values, tensors and the capture's own
 * containers (TUPLE, LIST, DICT, SET values) never reach the builder here.
 *
 * Every entry point answers AGS_DUNDER_NOT_MINE when the value has no such
 * method, and the caller goes on with its usual path; otherwise AGS_GO
 * with the result, or the inlined code's break or error.  The fallbacks
 * (__len__ for truth, __iter__ for `in`) are taken only when the type has
 * no __bool__ / __contains__ at all, which the builder answers apart
 * (False) from one that is not a Python function (None).
 *
 * `in` follows CPython's order: __contains__; else iterating __iter__'s
 * result and comparing each element; the old __getitem__ sequence
 * protocol (indices until IndexError) is not modelled: the usual path
 * breaks there.
 */
#include "interp.h"

/* 1 when v may have a Python special method: a constant of a heap type
 * that is neither a class nor a tensor. */
static int
candidate(ags_interp *it, const ags_value *v)
{
    PyTypeObject *tp;

    if (v->kind != AGS_VK_CONST) {
        return 0;
    }
    tp = Py_TYPE(v->obj);
    return PyType_HasFeature(tp, Py_TPFLAGS_HEAPTYPE) && !PyType_Check(v->obj)
           && !PyObject_TypeCheck(v->obj, (PyTypeObject *)it->tensor_type);
}

/* lookup's answer when type(self) has no method `name` at all (the
 * builder's False), where CPython falls back to another slot. */
#define ABSENT 5

/* The builder's function for type(self).name: AGS_GO with *func and
 * *fsource (new references, *fsource NULL for none), AGS_DUNDER_NOT_MINE
 * (the usual path), ABSENT, or a break / error. */
static int
lookup(ags_interp *it, const ags_value *self, const char *name,
       PyObject **func, PyObject **fsource)
{
    PyObject *source, *answer;

    *func = *fsource = NULL;
    if (!candidate(it, self)) {
        return AGS_DUNDER_NOT_MINE;
    }
    source = ags_source_of(it, self);
    answer = ags_call_builder(it, AGS_BOP_DUNDER, "(OOs)", self->obj,
                              source ? source : Py_None, name);
    Py_XDECREF(source);
    if (answer == NULL) {
        return ags_take_break(it);
    }
    if (answer == Py_None || answer == Py_False) {
        Py_DECREF(answer);
        return answer == Py_None ? AGS_DUNDER_NOT_MINE : ABSENT;
    }
    if (!PyTuple_Check(answer) || PyTuple_GET_SIZE(answer) != 2
        || !PyFunction_Check(PyTuple_GET_ITEM(answer, 0))) {
        Py_DECREF(answer);
        PyErr_SetString(PyExc_SystemError,
                        "builder.dunder: bad answer (want None or "
                        "(function, source or None))");
        return AGS_ERROR;
    }
    *func = Py_NewRef(PyTuple_GET_ITEM(answer, 0));
    if (PyTuple_GET_ITEM(answer, 1) != Py_None) {
        *fsource = Py_NewRef(PyTuple_GET_ITEM(answer, 1));
    }
    Py_DECREF(answer);
    return AGS_GO;
}

/* func(self, *args) inlined; all borrowed, nargs at most 1. */
static int
inline_method(ags_interp *it, ags_frame *f, PyObject *func, PyObject *fsource,
              const ags_value *self, const ags_value *args, int nargs,
              ags_value *result)
{
    /* borrowed copies: ags_inline binds its own references */
    ags_value argv[2];

    argv[0] = *self;
    if (nargs == 1) {
        argv[1] = args[0];
    }
    return ags_inline(it, f, func, fsource, argv, nargs + 1, NULL, result);
}

/* type(self).name(self, *args) inlined, when it is a Python function;
 * ABSENT when the type has no such method.  self, args: borrowed; nargs
 * at most 1. */
static int
call_slot(ags_interp *it, ags_frame *f, const char *name,
          const ags_value *self, const ags_value *args, int nargs,
          ags_value *result)
{
    PyObject *func, *fsource;
    int rc;

    assert(nargs >= 0 && nargs <= 1);
    rc = lookup(it, self, name, &func, &fsource);
    if (rc != AGS_GO) {
        return rc;
    }
    rc = inline_method(it, f, func, fsource, self, args, nargs, result);
    Py_DECREF(func);
    Py_XDECREF(fsource);
    return rc;
}

int
ags_dunder_call(ags_interp *it, ags_frame *f, const char *name,
                const ags_value *self, const ags_value *args, int nargs,
                ags_value *result)
{
    int rc = call_slot(it, f, name, self, args, nargs, result);

    return rc == ABSENT ? AGS_DUNDER_NOT_MINE : rc;
}

/* The truth of a constant whose type has a Python __bool__, else a
 * Python __len__ (nonzero is true), as CPython's PyObject_IsTrue. */
int
ags_dunder_truth(ags_interp *it, const ags_value *v, int *truth)
{
    ags_value out;
    int rc, is_bool = 1;

    if (!candidate(it, v)) {
        return AGS_DUNDER_NOT_MINE;
    }
    rc = call_slot(it, it->top, "__bool__", v, NULL, 0, &out);
    if (rc == ABSENT) {
        /* no __bool__ at all (a C one keeps the usual path): __len__ */
        is_bool = 0;
        rc = ags_dunder_call(it, it->top, "__len__", v, NULL, 0, &out);
    }
    if (rc != AGS_GO) {
        return rc == ABSENT ? AGS_DUNDER_NOT_MINE : rc;
    }
    if (out.kind == AGS_VK_CONST && is_bool && !PyBool_Check(out.obj)) {
        /* eager raises TypeError */
        rc = ags_stopf(it, AGS_REASON_BAD_CALL,
                       "__bool__ of a %s returned a %s",
                       Py_TYPE(v->obj)->tp_name, Py_TYPE(out.obj)->tp_name);
    }
    else {
        rc = ags_truth(it, &out, truth);
    }
    ags_value_clear(&out);
    return rc;
}

/* What iter(v) gives when type(v) has a Python __iter__: its result,
 * which must be an iterator (a generator the capture made, or an owned
 * iterator), as CPython checks. */
static int
dunder_iter(ags_interp *it, ags_frame *f, const ags_value *v,
            ags_value *result)
{
    int rc = ags_dunder_call(it, f, "__iter__", v, NULL, 0, result);
    int ok;

    if (rc != AGS_GO) {
        return rc;
    }
    ok = result->kind == AGS_VK_GENERATOR;
    if (!ok && result->kind == AGS_VK_CONST) {
        ok = ags_owned_iterator(it, result);
        if (ok < 0) {
            ags_value_clear(result);
            return AGS_ERROR;
        }
    }
    if (!ok) {
        rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                       "__iter__ of a %s returned a %s",
                       Py_TYPE(v->obj)->tp_name, AGS_DESCRIBE(result));
        ags_value_clear(result);
    }
    return rc;
}

/* GET_ITER: an object on top of the stack whose type has a Python
 * __iter__ is replaced by what __iter__ returns; AGS_GO either way (the
 * handler goes on with the new top), or a break / error. */
int
ags_dunder_get_iter(ags_interp *it, ags_frame *f)
{
    ags_value out;
    int rc = dunder_iter(it, f, ags_peek(f, 1), &out);

    if (rc == AGS_DUNDER_NOT_MINE) {
        return AGS_GO;
    }
    if (rc != AGS_GO) {
        return rc;
    }
    ags_drop(f, 1);
    return ags_push(f, out);
}

/* `lhs in rhs` when type(rhs) has no __contains__ but a Python __iter__:
 * the elements it gives, compared in turn (the builder's `in` on their
 * tuple).  AGS_GO with *truth, AGS_DUNDER_NOT_MINE, or a break / error. */
static int
contains_by_iter(ags_interp *it, ags_frame *f, const ags_value *lhs,
                 const ags_value *rhs, int *truth)
{
    PyObject *elems = NULL, *a = NULL, *found = NULL;
    ags_value out;
    int rc = dunder_iter(it, f, rhs, &out);

    if (rc != AGS_GO) {
        return rc;
    }
    rc = ags_elements(it, &out, &elems);
    ags_value_clear(&out);
    if (rc == AGS_GO) {
        a = ags_graph_arg(it, lhs);
        rc = a == NULL ? AGS_BREAK : AGS_GO;
    }
    if (rc == AGS_GO) {
        found = ags_call_builder(it, AGS_BOP_COMPARE, "(iOO)", AGS_COMPARE_IN,
                                 a, elems);
        rc = found == NULL ? ags_take_break(it) : AGS_GO;
    }
    if (rc == AGS_GO) {
        out = ags_value_make(AGS_VK_CONST, Py_NewRef(found), NULL);
        rc = ags_truth(it, &out, truth);
        ags_value_clear(&out);
    }
    Py_XDECREF(found);
    Py_XDECREF(a);
    Py_XDECREF(elems);
    return rc;
}

/* CONTAINS_OP on an object: pushes `lhs in rhs` (negated for `not in`)
 * when type(rhs) has a Python __contains__ or __iter__. */
int
ags_dunder_contains(ags_interp *it, ags_frame *f, int negate)
{
    ags_value *lhs = ags_peek(f, 2), *rhs = ags_peek(f, 1), out;
    PyObject *func, *fsource;
    int rc, truth = 0;

    rc = lookup(it, rhs, "__contains__", &func, &fsource);
    if (rc == AGS_GO) {
        rc = inline_method(it, f, func, fsource, rhs, lhs, 1, &out);
        if (rc == AGS_GO) {
            rc = ags_truth(it, &out, &truth);  /* as CPython's `in` */
            ags_value_clear(&out);
        }
    }
    else if (rc == ABSENT) {
        /* no __contains__ at all (a C one keeps the usual path) */
        rc = contains_by_iter(it, f, lhs, rhs, &truth);
    }
    if (func != NULL) {
        Py_DECREF(func);
        Py_XDECREF(fsource);
    }
    if (rc != AGS_GO) {
        return rc;
    }
    ags_drop(f, 2);
    truth = negate ? !truth : truth;
    return ags_push(f, ags_value_make(AGS_VK_CONST,
                                      Py_NewRef(truth ? Py_True : Py_False),
                                      NULL));
}

/* ------------------------------------------------------------------ */
/* Rich comparisons */

/* The method of each comparison and its reflection, in AGS_COMPARE_LT..GE
 * order (protocol.h): X(name, reflected). */
#define AGS_DUNDER_COMPARES(X) \
    X("__lt__", "__gt__") \
    X("__le__", "__ge__") \
    X("__eq__", "__eq__") \
    X("__ne__", "__ne__") \
    X("__gt__", "__lt__") \
    X("__ge__", "__le__")

static const struct {
    const char *name, *reflected;
} compares[] = {
#define AGS_X(name, reflected) {name, reflected},
    AGS_DUNDER_COMPARES(AGS_X)
#undef AGS_X
};

/* One side of a comparison: self.name(other) inlined when it is Python.
 * AGS_GO with *out (NotImplemented when self declined), ABSENT or
 * AGS_DUNDER_NOT_MINE when there is no Python method, or a break / error.
 * For `!=` (ne), an __ne__ that is object's (the builder's False) is
 * `not __eq__`, as object.__ne__ does. */
static int
compare_side(ags_interp *it, ags_frame *f, const char *name, int ne,
             const ags_value *self, const ags_value *other, ags_value *out)
{
    ags_value eq;
    int rc, truth = 0;

    rc = call_slot(it, f, name, self, other, 1, out);
    if (rc != ABSENT || !ne) {
        return rc;
    }
    rc = call_slot(it, f, "__eq__", self, other, 1, &eq);
    if (rc != AGS_GO) {
        return rc;
    }
    if (eq.kind == AGS_VK_CONST && eq.obj == Py_NotImplemented) {
        *out = eq;
        return AGS_GO;
    }
    rc = ags_truth(it, &eq, &truth);
    ags_value_clear(&eq);
    if (rc == AGS_GO) {
        *out = ags_value_make(AGS_VK_CONST,
                              Py_NewRef(truth ? Py_False : Py_True), NULL);
    }
    return rc;
}

/* 1 when v is a constant whose builtin comparison declines any object of
 * another type (NotImplemented), so CPython's fallback decides. */
static int
declines(const ags_value *v)
{
    PyObject *o = v->obj;

    return v->kind == AGS_VK_CONST
           && (o == Py_None || PyBool_Check(o) || PyLong_CheckExact(o)
               || PyFloat_CheckExact(o) || PyUnicode_CheckExact(o)
               || PyBytes_CheckExact(o));
}

int
ags_dunder_compare(ags_interp *it, ags_frame *f, int op)
{
    ags_value *v = ags_peek(f, 2), *w = ags_peek(f, 1);
    ags_value out = ags_value_make(AGS_VK_UNBOUND, NULL, NULL);
    int rc = AGS_DUNDER_NOT_MINE, tried_w = 0, answered = 0;
    int v_ran = 0, w_ran = 0;   /* a Python method of that side ran */
    int v_own = candidate(it, v), w_own = candidate(it, w);
    int ne = op == AGS_COMPARE_NE;

    if (op < AGS_COMPARE_LT || op > AGS_COMPARE_GE || !(v_own || w_own)) {
        return AGS_DUNDER_NOT_MINE;
    }
    /* a subclass's reflected method goes first, as in CPython */
    if (w_own && v->kind == AGS_VK_CONST && Py_TYPE(w->obj) != Py_TYPE(v->obj)
        && PyType_IsSubtype(Py_TYPE(w->obj), Py_TYPE(v->obj))) {
        tried_w = 1;
        rc = compare_side(it, f, compares[op].reflected, ne, w, v, &out);
        w_ran = rc == AGS_GO;
        answered = rc == AGS_GO && out.obj != Py_NotImplemented;
    }
    if (!answered && (rc == AGS_GO || rc >= AGS_DUNDER_NOT_MINE) && v_own) {
        ags_value_clear(&out);
        rc = compare_side(it, f, compares[op].name, ne, v, w, &out);
        v_ran = rc == AGS_GO;
        answered = rc == AGS_GO && out.obj != Py_NotImplemented;
    }
    if (!answered && (rc == AGS_GO || rc >= AGS_DUNDER_NOT_MINE) && w_own
        && !tried_w) {
        ags_value_clear(&out);
        rc = compare_side(it, f, compares[op].reflected, ne, w, v, &out);
        w_ran = rc == AGS_GO;
        answered = rc == AGS_GO && out.obj != Py_NotImplemented;
    }
    if (rc != AGS_GO && rc < AGS_DUNDER_NOT_MINE) {
        ags_value_clear(&out);
        return rc;  /* a break or error of an inlined method */
    }
    if (!answered && !v_ran && !w_ran) {
        /* no Python method on either side took part */
        ags_value_clear(&out);
        return AGS_DUNDER_NOT_MINE;
    }
    if (!answered) {
        /* every Python method declined: a side without one must be a
         * builtin value that declines too, and then only == and != have
         * an answer */
        ags_value_clear(&out);
        if (!((v_ran || declines(v)) && (w_ran || declines(w)))
            || (op != AGS_COMPARE_EQ && op != AGS_COMPARE_NE)) {
            return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                             "comparing a %s and a %s",
                             AGS_DESCRIBE(v), AGS_DESCRIBE(w));
        }
        out = ags_value_make(AGS_VK_CONST,
                             Py_NewRef((v->obj == w->obj)
                                       == (op == AGS_COMPARE_EQ)
                                           ? Py_True : Py_False), NULL);
    }
    ags_drop(f, 2);
    return ags_push(f, out);
}

/* ------------------------------------------------------------------ */
/* Builtins that call a special method */

typedef int (*builtin_fn)(ags_interp *, ags_frame *, const ags_value *,
                          ags_value *);

static int
builtin_len(ags_interp *it, ags_frame *f, const ags_value *v,
            ags_value *result)
{
    int rc = ags_dunder_call(it, f, "__len__", v, NULL, 0, result);

    if (rc == AGS_GO && result->kind == AGS_VK_CONST
        && !PyLong_Check(result->obj)) {
        /* eager raises TypeError */
        rc = ags_stopf(it, AGS_REASON_BAD_CALL,
                       "__len__ of a %s returned a %s",
                       Py_TYPE(v->obj)->tp_name,
                       Py_TYPE(result->obj)->tp_name);
        ags_value_clear(result);
    }
    return rc;
}

static int
builtin_iter(ags_interp *it, ags_frame *f, const ags_value *v,
             ags_value *result)
{
    return dunder_iter(it, f, v, result);
}

static int
builtin_bool(ags_interp *it, ags_frame *f, const ags_value *v,
             ags_value *result)
{
    int truth = 0, rc = ags_dunder_truth(it, v, &truth);

    (void)f;
    if (rc == AGS_GO) {
        *result = ags_value_make(AGS_VK_CONST,
                                 Py_NewRef(truth ? Py_True : Py_False), NULL);
    }
    return rc;
}

/* A text special method's answer: eager raises TypeError for anything
 * but a str (a subclass of str is left to eager too). */
static int
text_result(ags_interp *it, const ags_value *v, const char *name, int rc,
            ags_value *result)
{
    if (rc == AGS_GO
        && !(result->kind == AGS_VK_CONST && PyUnicode_CheckExact(result->obj))) {
        rc = ags_stopf(it, AGS_REASON_BAD_CALL, "%s of a %s returned a %s", name,
                       Py_TYPE(v->obj)->tp_name,
                       result->kind == AGS_VK_CONST
                           ? Py_TYPE(result->obj)->tp_name
                           : ags_kind_names[result->kind]);
        ags_value_clear(result);
    }
    return rc;
}

static int
builtin_repr(ags_interp *it, ags_frame *f, const ags_value *v,
             ags_value *result)
{
    int rc = ags_dunder_call(it, f, "__repr__", v, NULL, 0, result);

    return text_result(it, v, "__repr__", rc, result);
}

/* str(obj): a Python __str__; object's __str__ (the builder answers it
 * as absent) is repr(obj), so a Python __repr__ then. */
static int
builtin_str(ags_interp *it, ags_frame *f, const ags_value *v,
            ags_value *result)
{
    int rc = call_slot(it, f, "__str__", v, NULL, 0, result);

    if (rc == ABSENT) {
        return builtin_repr(it, f, v, result);
    }
    return text_result(it, v, "__str__", rc, result);
}

/* The builtins of one argument that run a special method of it:
 * X(name in the builtins module, handler, "meaning"). */
#define AGS_DUNDER_BUILTINS(X) \
    X("len", builtin_len, "len(obj): __len__") \
    X("iter", builtin_iter, "iter(obj): __iter__, which must give an " \
      "iterator") \
    X("bool", builtin_bool, "bool(obj): __bool__, else __len__ != 0") \
    X("str", builtin_str, "str(obj): __str__, else __repr__ (object's " \
      "__str__)") \
    X("repr", builtin_repr, "repr(obj): __repr__")

static const struct {
    const char *name;
    builtin_fn fn;
} builtins_table[] = {
#define AGS_X(name, fn, doc) {name, fn},
    AGS_DUNDER_BUILTINS(AGS_X)
#undef AGS_X
};

/* A call fn(arg) of one of the builtins above on an object with the
 * Python special method: AGS_GO with *result, or AGS_DUNDER_NOT_MINE for
 * every other call. */
int
ags_dunder_builtin(ags_interp *it, ags_frame *f, PyObject *fn,
                   const ags_value *self, const ags_value *args, int nargs,
                   PyObject *kwnames, ags_value *result)
{
    PyObject *builtins = f->builtins;

    if (self != NULL || nargs != 1 || kwnames != NULL || builtins == NULL
        || !PyDict_Check(builtins)
        || !(PyCFunction_Check(fn) || fn == (PyObject *)&PyBool_Type
             || fn == (PyObject *)&PyUnicode_Type)
        || !candidate(it, &args[0])) {
        return AGS_DUNDER_NOT_MINE;
    }
    for (size_t i = 0; i < sizeof(builtins_table) / sizeof(*builtins_table);
         i++) {
        /* borrowed; the frame's builtins are alive while it runs */
        PyObject *known = PyDict_GetItemString(builtins,
                                               builtins_table[i].name);
        if (known != NULL && known == fn) {
            return builtins_table[i].fn(it, f, &args[0], result);
        }
    }
    return AGS_DUNDER_NOT_MINE;
}
