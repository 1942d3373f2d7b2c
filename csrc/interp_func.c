/* interp_func.c: functions for the symbolic interpreter (see interp.h).
 *
 * Binding: an inlined call's arguments go to the callee's parameter slots
 * by the builder's plan (an argument index, or a Bind kind of protocol.h
 * with its payload), and its free variables are read from its closure,
 * each guarded on ("cell", function source, index).
 *
 * Making: MAKE_FUNCTION builds a real function object (making one runs no
 * code) so that comprehensions (3.11), lambdas and nested functions can be
 * inlined; a closure shares the making frame's cells rather than copying
 * them, so writes on either side are seen on the other.
 */
#include "interp.h"
#include <string.h>

/* A tensor default argument of the inlined function (f->func, reached by
 * f->fsource): a graph input read through the function, from its
 * __defaults__ or __kwdefaults__, as the call reads it each time.  A
 * function with no source breaks. */
static int
default_tensor(ags_interp *it, ags_frame *f, PyObject *value, ags_value *dst)
{
    PyObject *defaults, *src = NULL, *key, *item;
    Py_ssize_t pos = 0;
    int rc;

    if (f->func == NULL || f->fsource == NULL) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                         "a tensor default argument of a function reached by "
                         "no source");
    }
    defaults = PyFunction_GetDefaults(f->func);
    for (Py_ssize_t i = 0; defaults != NULL && i < PyTuple_GET_SIZE(defaults);
         i++) {
        if (PyTuple_GET_ITEM(defaults, i) == value) {
            src = Py_BuildValue("(s(sOs)n)", ags_load_names[AGS_LOAD_ITEM],
                                ags_load_names[AGS_LOAD_ATTR], f->fsource,
                                "__defaults__", i);
            break;
        }
    }
    defaults = PyFunction_GetKwDefaults(f->func);
    while (src == NULL && defaults != NULL && PyDict_Check(defaults)
           && PyDict_Next(defaults, &pos, &key, &item)) {
        if (item == value) {
            src = Py_BuildValue("(s(sOs)O)", ags_load_names[AGS_LOAD_ITEM],
                                ags_load_names[AGS_LOAD_ATTR], f->fsource,
                                "__kwdefaults__", key);
        }
    }
    if (src == NULL) {
        return PyErr_Occurred()
                   ? AGS_ERROR
                   : ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                               "a tensor default argument not found among "
                               "the function's defaults");
    }
    rc = ags_load_object(it, src, value, dst);
    Py_DECREF(src);
    return rc;
}

/* An argument packed into a callee's *args tuple or **kwargs dict: its
 * graph argument, or a generator's capsule (*boxed set: the box must be
 * marked, see interp_gen.c).  New reference, or NULL with a break. */
static PyObject *
packed_arg(ags_interp *it, const ags_value *v, int *boxed)
{
    if (v->kind == AGS_VK_GENERATOR) {
        *boxed = 1;
        return Py_NewRef(v->obj);
    }
    return ags_graph_arg(it, v);
}

/* Marks a box holding a generator's capsule: 0, or -1 with an error. */
static int
mark_gen_box(ags_interp *it, PyObject *box)
{
    PyObject *id = PyLong_FromVoidPtr(box);
    int rc = id != NULL ? PyDict_SetItem(it->gen_boxes, id, box) : -1;

    Py_XDECREF(id);
    return rc;
}

/* Binds the callee's parameters from the caller's abstract arguments
 * (borrowed) by the builder's plan: one item per parameter slot, an int
 * (take that argument) or a pair (AGS_BIND_*, payload) (protocol.h). */
int
ags_bind_params(ags_interp *it, ags_frame *f, PyObject *plan, ags_value *args)
{
    Py_ssize_t n = PyTuple_GET_SIZE(plan);

    for (Py_ssize_t slot = 0; slot < n && slot < f->nlocals; slot++) {
        PyObject *how = PyTuple_GET_ITEM(plan, slot);
        ags_value *dst = &f->locals[slot];

        if (PyLong_Check(how)) {
            *dst = ags_value_copy(&args[PyLong_AsLong(how)]);
            continue;
        }
        int tag;
        PyObject *what = PyTuple_GET_ITEM(how, 1);
        if (ags_protocol_kind(PyTuple_GET_ITEM(how, 0), AGS_BIND_COUNT,
                              "parameter binding", &tag) < 0) {
            return AGS_ERROR;
        }
        if (tag == AGS_BIND_DEFAULT) {
            if (PyObject_TypeCheck(what, (PyTypeObject *)it->tensor_type)) {
                int rc = default_tensor(it, f, what, dst);
                if (rc != AGS_GO) {
                    return rc;
                }
                continue;
            }
            if (ags_value_of(it, what, dst) < 0) {
                return AGS_ERROR;
            }
            continue;
        }
        PyObject *box = tag == AGS_BIND_STAR
                            ? PyTuple_New(PyTuple_GET_SIZE(what))
                            : PyDict_New();
        int boxed = 0;
        if (box == NULL) {
            return AGS_ERROR;
        }
        if (PyTuple_Check(box)) {
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(what); i++) {
                long k = PyLong_AsLong(PyTuple_GET_ITEM(what, i));
                PyObject *a = packed_arg(it, &args[k], &boxed);
                if (a == NULL) {
                    Py_DECREF(box);
                    return AGS_BREAK;
                }
                PyTuple_SET_ITEM(box, i, a);
            }
        }
        else {
            Py_ssize_t pos = 0;
            PyObject *name, *index;
            while (PyDict_Next(what, &pos, &name, &index)) {
                PyObject *a = packed_arg(it, &args[PyLong_AsLong(index)],
                                         &boxed);
                int bad = a == NULL || PyDict_SetItem(box, name, a) < 0;
                Py_XDECREF(a);
                if (bad) {
                    Py_DECREF(box);
                    return a == NULL ? AGS_BREAK : AGS_ERROR;
                }
            }
            if (ags_own(it, box) < 0) {
                Py_DECREF(box);
                return AGS_ERROR;
            }
        }
        if ((boxed && mark_gen_box(it, box) < 0)
            || ags_value_of(it, box, dst) < 0) {
            Py_DECREF(box);
            return AGS_ERROR;
        }
        Py_DECREF(box);
    }
    return AGS_GO;
}

/* Binds the free variables of an inlined function from its closure:
 * each cell's contents, guarded on ("cell", function source, index). */
int
ags_bind_closure(ags_interp *it, ags_frame *f, PyObject *func,
             PyObject *fsource)
{
    PyObject *closure = PyFunction_GetClosure(func);
    int nfree = f->code->co_nfreevars;

    if (nfree == 0) {
        return AGS_GO;
    }
    if (closure != NULL && ags_is_owned(it, func) == 1) {
        /* A function this capture made: its cells are the maker's, shared. */
        f->cells = PyMem_Calloc((size_t)f->nlocals, sizeof(PyObject *));
        if (f->cells == NULL) {
            PyErr_NoMemory();
            return AGS_ERROR;
        }
        for (int i = 0; i < nfree; i++) {
            int slot = f->nlocals - nfree + i;
            PyObject *cell = PyTuple_GET_ITEM(closure, i);
            PyObject *contents = PyCell_GET(cell);

            f->cells[slot] = Py_NewRef(cell);
            if (contents != NULL
                && ags_value_of(it, contents, &f->locals[slot]) < 0) {
                return AGS_ERROR;
            }
        }
        return AGS_GO;
    }
    if (closure != NULL && fsource == NULL && nfree == 1
        && PyUnicode_CompareWithASCIIString(
               PyTuple_GET_ITEM(f->code->co_localsplusnames, f->nlocals - 1),
               "__class__") == 0
        && PyType_Check(PyCell_GET(PyTuple_GET_ITEM(closure, 0)))) {
        /* A method's zero-argument super() cell: the class the method was
         * defined in, set when the class was made, needs no guard. */
        return ags_value_of(it, PyCell_GET(PyTuple_GET_ITEM(closure, 0)),
                            &f->locals[f->nlocals - 1]) < 0 ? AGS_ERROR
                                                           : AGS_GO;
    }
    if (closure == NULL || fsource == NULL) {
        return ags_stopf(it, AGS_REASON_CLOSURE,
                         "a closure reached by no source");
    }
    for (int i = 0; i < nfree; i++) {
        PyObject *contents = PyCell_GET(PyTuple_GET_ITEM(closure, i));
        PyObject *src;
        int rc;

        if (contents == NULL) {
            continue;  /* an empty cell: loading it is a NameError */
        }
        src = Py_BuildValue("(sOi)", ags_load_names[AGS_LOAD_CELL], fsource,
                            i);
        if (src == NULL) {
            return AGS_ERROR;
        }
        rc = ags_load_object(it, src, contents,
                             &f->locals[f->nlocals - nfree + i]);
        Py_DECREF(src);
        if (rc < 0) {
            return rc;
        }
    }
    return AGS_GO;
}

/* MAKE_FUNCTION with no defaults, annotations or closure: a real function
 * object (making one runs no code), so comprehensions (3.11) and lambdas
 * can be inlined.  Anything with cells or defaults to set breaks. */
/* Slot k of code is a cell or a free variable (CPython's CO_FAST_CELL,
 * CO_FAST_FREE kinds in co_localspluskinds, 3.11-3.13). */
static int
is_cell_slot(PyCodeObject *code, int k)
{
    const unsigned char kind =
        (unsigned char)PyBytes_AS_STRING(code->co_localspluskinds)[k];
    return (kind & (0x40 | 0x80)) != 0;
}

/* The closure of a function made from `code` in frame f: the frame's own
 * cells of the variables the code names as free (shared, not copied). */
static int
closure_of(ags_interp *it, ags_frame *f, PyCodeObject *code, PyObject **out)
{
    PyObject *names = f->code->co_localsplusnames;
    int nfree = code->co_nfreevars, first = code->co_nlocalsplus - nfree;
    PyObject *closure = PyTuple_New(nfree);

    if (closure == NULL) {
        return AGS_ERROR;
    }
    for (int j = 0; j < nfree; j++) {
        PyObject *name = PyTuple_GET_ITEM(code->co_localsplusnames, first + j);
        PyObject *cell;
        int slot = -1, rc;

        for (int k = 0; k < f->nlocals && slot < 0; k++) {
            int eq = PyUnicode_Compare(PyTuple_GET_ITEM(names, k), name) == 0;
            if (eq && is_cell_slot(f->code, k)) {
                slot = k;
            }
        }
        if (slot < 0) {
            Py_DECREF(closure);
            return ags_stopf(it, AGS_REASON_CLOSURE,
                             "free variable %R of a nested "
                             "function not found in its maker", name);
        }
        rc = ags_frame_cell(it, f, slot, &cell);
        if (rc != AGS_GO) {
            Py_DECREF(closure);
            return rc;
        }
        PyTuple_SET_ITEM(closure, j, Py_NewRef(cell));
    }
    *out = closure;
    return AGS_GO;
}

/* fn.__annotations__ from what MAKE_FUNCTION finds: a tuple of names and
 * values in turn (3.11-3.13), or a dict. */
static int
set_annotations(ags_interp *it, PyObject *fn, ags_value *value)
{
    PyObject *arg = ags_graph_arg(it, value), *dict;
    int rc = 0;

    if (arg == NULL) {
        return PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
    }
    if (PyDict_Check(arg)) {
        dict = Py_NewRef(arg);
    }
    else if (PyTuple_Check(arg) && PyTuple_GET_SIZE(arg) % 2 == 0) {
        dict = PyDict_New();
        for (Py_ssize_t k = 0; dict != NULL && rc == 0
                               && k < PyTuple_GET_SIZE(arg); k += 2) {
            rc = PyDict_SetItem(dict, PyTuple_GET_ITEM(arg, k),
                                PyTuple_GET_ITEM(arg, k + 1));
        }
    }
    else {
        Py_DECREF(arg);
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                         "annotations given as a %s", Py_TYPE(arg)->tp_name);
    }
    Py_DECREF(arg);
    if (dict == NULL || rc < 0 || PyFunction_SetAnnotations(fn, dict) < 0) {
        Py_XDECREF(dict);
        return AGS_ERROR;
    }
    Py_DECREF(dict);
    return AGS_GO;
}

/* A function from a code constant: `def` and lambdas inside captured code,
 * comprehensions on 3.11.  Its closure shares the maker's cells; defaults
 * may hold graph values.  It is owned by the capture (interp.c binds its
 * free variables from those cells when it is inlined). */
AGS_HANDLER
op_make_function(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    uint32_t flags = ins->arg;
    ags_value code = ags_pop(f), extra[4];
    PyObject *fn = NULL, *closure = NULL, *arg;
    int rc = AGS_GO, n = 0;

    /* under the code: closure (8), annotations (4), kwdefaults (2),
     * defaults (1), popped in that order (3.11, 3.12; 3.13 uses
     * SET_FUNCTION_ATTRIBUTE instead) */
    for (uint32_t bit = 8; bit; bit >>= 1) {
        extra[n] = (flags & bit) ? ags_pop(f)
                                 : ags_value_make(AGS_VK_UNBOUND, NULL, NULL);
        n++;
    }
    if (code.kind != AGS_VK_CONST || !PyCode_Check(code.obj)) {
        rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                       "MAKE_FUNCTION of a non-code");
        goto done;
    }
    fn = PyFunction_New(code.obj, f->globals);
    if (fn == NULL || ags_own(it, fn) < 0) {
        rc = AGS_ERROR;
        goto done;
    }
    if (((PyCodeObject *)code.obj)->co_nfreevars > 0) {
        rc = closure_of(it, f, (PyCodeObject *)code.obj, &closure);
        if (rc == AGS_GO && PyFunction_SetClosure(fn, closure) < 0) {
            rc = AGS_ERROR;
        }
    }
    if (rc == AGS_GO && extra[1].kind != AGS_VK_UNBOUND) {
        rc = set_annotations(it, fn, &extra[1]);
    }
    for (int k = 2; rc == AGS_GO && k < 4; k++) {  /* kwdefaults, defaults */
        if (extra[k].kind == AGS_VK_UNBOUND) {
            continue;
        }
        arg = ags_graph_arg(it, &extra[k]);
        if (arg == NULL) {
            rc = PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
            break;
        }
        if ((k == 2 ? PyFunction_SetKwDefaults(fn, arg)
                    : PyFunction_SetDefaults(fn, arg)) < 0) {
            rc = AGS_ERROR;
        }
        Py_DECREF(arg);
    }
done:
    for (int k = 0; k < n; k++) {
        ags_value_clear(&extra[k]);
    }
    ags_value_clear(&code);
    Py_XDECREF(closure);
    if (rc != AGS_GO) {
        Py_XDECREF(fn);
        return rc;
    }
    return ags_push(f, ags_value_make(AGS_VK_CONST, fn, NULL));
}

/* 3.11: the closure tuple's items are not read (closure_of finds the
 * frame's cells by name), so a placeholder does. */
AGS_HANDLER
op_load_closure(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    (void)ins;
    return ags_push(f, ags_value_make(AGS_VK_CONST, Py_NewRef(Py_None), NULL));
}

/* 3.13: set one attribute of the function MAKE_FUNCTION made (on top,
 * the value under it): the closure is already the maker's cells. */
AGS_HANDLER
op_set_function_attribute(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value fn = ags_pop(f), value = ags_pop(f);
    PyObject *arg = NULL;
    int rc = AGS_GO;

    if (ins->arg == 1 || ins->arg == 2) {
        arg = ags_graph_arg(it, &value);
        if (arg == NULL) {
            rc = PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
        }
        else if ((ins->arg == 2 ? PyFunction_SetKwDefaults(fn.obj, arg)
                                : PyFunction_SetDefaults(fn.obj, arg)) < 0) {
            rc = AGS_ERROR;
        }
        Py_XDECREF(arg);
    }
    else if (ins->arg == 4) {
        rc = set_annotations(it, fn.obj, &value);
    }
    ags_value_clear(&value);
    if (rc != AGS_GO) {
        ags_value_clear(&fn);
        return rc;
    }
    return ags_push(f, fn);
}
