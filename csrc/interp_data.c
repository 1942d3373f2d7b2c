/* interp_data.c: loads, stores, stack shuffles, containers and subscripts
 * for the symbolic interpreter (see interp.h).
 *
 * Locals hold values, not cells: cell and free variables are bound to
 * their contents when a frame starts (a free variable of the root frame
 * comes in f_locals, one of an inlined function from its closure), so
 * LOAD_DEREF and STORE_DEREF are local loads and stores and MAKE_CELL and
 * COPY_FREE_VARS do nothing.  A closure created inside the captured code
 * would need real cells: MAKE_FUNCTION is not handled, it breaks.
 *
 * Containers built here (BUILD_TUPLE/LIST/MAP) are real Python objects
 * whose items are graph arguments.  Subscripts of a tensor become graph
 * nodes (operator.getitem / setitem); subscripts of known constants and
 * of built containers are evaluated now.
 */
#include "interp.h"
#include <string.h>

AGS_HANDLER
op_nop(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    (void)f;
    (void)ins;
    return AGS_GO;
}

/* An argument becomes a graph input or a guarded constant when it is
 * first read: arguments the code never reads cost no guard. */
int
ags_materialize(ags_interp *it, ags_value *v)
{
    ags_value loaded;

    if (v->kind != AGS_VK_LAZY) {
        return AGS_GO;
    }
    if (ags_load_object(it, v->source, v->obj, &loaded) < 0) {
        return AGS_ERROR;
    }
    ags_value_clear(v);
    *v = loaded;
    return AGS_GO;
}

static int
load_local(ags_interp *it, ags_frame *f, uint32_t i)
{
    if (f->cells != NULL && f->cells[i] != NULL) {
        /* shared with a function this capture made, which may have set it */
        PyObject *contents = PyCell_GET(f->cells[i]);

        ags_value_clear(&f->locals[i]);
        if (contents != NULL
            && ags_value_of(it, contents, &f->locals[i]) < 0) {
            return AGS_ERROR;
        }
    }
    if (ags_materialize(it, &f->locals[i]) < 0) {
        return AGS_ERROR;
    }
    if (f->locals[i].kind == AGS_VK_CONST) {
        /* a list or dict of the program changed since: its shadow */
        ags_value shadow;
        int rc = ags_shadowed(it, f->locals[i].obj, &shadow);

        if (rc < 0) {
            return AGS_ERROR;
        }
        if (rc == 1) {
            ags_value_clear(&f->locals[i]);
            f->locals[i] = shadow;
        }
    }
    if (f->locals[i].kind == AGS_VK_CONST) {
        int rc = ags_own_varkw(it, f, (int)i);
        if (rc != AGS_GO) {
            return rc;
        }
    }
    if (f->locals[i].kind == AGS_VK_UNBOUND) {
        return ags_stopf(it, AGS_REASON_UNBOUND_LOCAL, "local %R is not bound",
                         PyTuple_GET_ITEM(f->code->co_localsplusnames, i));
    }
    return ags_push(f, ags_value_copy(&f->locals[i]));
}

static int
store_local(ags_interp *it, ags_frame *f, uint32_t i)
{
    int rc;

    ags_value_clear(&f->locals[i]);
    f->locals[i] = ags_pop(f);
    if (f->cells != NULL && f->cells[i] != NULL) {
        PyObject *contents = ags_held_arg(it, &f->locals[i]);

        if (contents == NULL) {
            return PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
        }
        rc = PyCell_Set(f->cells[i], contents);
        Py_DECREF(contents);
        return rc < 0 ? AGS_ERROR : AGS_GO;
    }
    if (ags_is_free_slot(f, (int)i)) {
        /* `nonlocal x; x = ...` into a real closure: the program's cell */
        return ags_stopf(it, AGS_REASON_SIDE_EFFECT,
                         "assigning the nonlocal %R",
                         PyTuple_GET_ITEM(f->code->co_localsplusnames, i));
    }
    return AGS_GO;
}

AGS_HANDLER
op_load_fast(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return load_local(it, f, ins->arg);
}

AGS_HANDLER
op_load_fast_and_clear(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value v;

    if (ags_materialize(it, &f->locals[ins->arg]) < 0) {
        return AGS_ERROR;
    }
    v = f->locals[ins->arg];
    f->locals[ins->arg] = ags_value_make(AGS_VK_UNBOUND, NULL, NULL);
    return ags_push(f, v);
}

AGS_HANDLER
op_store_fast(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return store_local(it, f, ins->arg);
}

AGS_HANDLER
op_delete_fast(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    ags_value_clear(&f->locals[ins->arg]);
    return AGS_GO;
}

AGS_HANDLER
op_load_fast_load_fast(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    int rc = load_local(it, f, ins->arg >> 4);
    return rc < 0 ? rc : load_local(it, f, ins->arg & 15);
}

AGS_HANDLER
op_store_fast_load_fast(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    int rc = store_local(it, f, ins->arg >> 4);
    return rc < 0 ? rc : load_local(it, f, ins->arg & 15);
}

AGS_HANDLER
op_store_fast_store_fast(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    int rc = store_local(it, f, ins->arg >> 4);
    return rc < 0 ? rc : store_local(it, f, ins->arg & 15);
}

AGS_HANDLER
op_load_const(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    PyObject *c = PyTuple_GET_ITEM(f->code->co_consts, ins->arg);
    (void)it;
    return ags_push(f, ags_value_make(AGS_VK_CONST, Py_NewRef(c), NULL));
}

AGS_HANDLER
op_pop_top(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    (void)ins;
    ags_drop(f, 1);
    return AGS_GO;
}

AGS_HANDLER
op_push_null(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    (void)ins;
    return ags_push(f, ags_value_make(AGS_VK_NULL_MARK, NULL, NULL));
}

AGS_HANDLER
op_copy(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    return ags_push(f, ags_value_copy(ags_peek(f, (int)ins->arg)));
}

AGS_HANDLER
op_swap(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value tmp = *ags_peek(f, 1);
    (void)it;
    *ags_peek(f, 1) = *ags_peek(f, (int)ins->arg);
    *ags_peek(f, (int)ins->arg) = tmp;
    return AGS_GO;
}

/* The source of a global read in frame f: ("global", name) in the root
 * frame, ("gmod", module, name) in an inlined function whose globals are
 * its module's; other globals cannot be guarded. */
static PyObject *
global_source(ags_interp *it, ags_frame *f, PyObject *name)
{
    PyObject *modname;

    if (f->parent == NULL) {
        return Py_BuildValue("(sO)", ags_load_names[AGS_LOAD_GLOBAL], name);
    }
    modname = PyDict_GetItemString(f->globals, "__name__");
    if (modname == NULL || !PyUnicode_Check(modname)) {
        ags_stopf(it, AGS_REASON_UNGUARDABLE_GLOBAL,
                  "global %R of a function with no "
                  "module", name);
        return NULL;
    }
    {
        PyObject *modules = PyImport_GetModuleDict();
        PyObject *mod = PyDict_GetItemWithError(modules, modname);
        if (mod == NULL || !PyModule_Check(mod)
            || PyModule_GetDict(mod) != f->globals) {
            if (!PyErr_Occurred()) {
                ags_stopf(it, AGS_REASON_UNGUARDABLE_GLOBAL,
                          "global %R of a function "
                          "whose globals are not module %R's", name, modname);
            }
            return NULL;
        }
    }
    return Py_BuildValue("(sOO)", ags_load_names[AGS_LOAD_GMOD], modname,
                         name);
}

AGS_HANDLER
op_load_global(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    PyObject *name = PyTuple_GET_ITEM(f->code->co_names, ins->arg >> 1);
    PyObject *value = PyDict_GetItemWithError(f->globals, name);
    PyObject *source;
    ags_value v;
    int rc;

    if (value == NULL && !PyErr_Occurred() && PyDict_Check(f->builtins)) {
        value = PyDict_GetItemWithError(f->builtins, name);
    }
    if (value == NULL) {
        return PyErr_Occurred()
                   ? AGS_ERROR
                   : ags_stopf(it, AGS_REASON_UNKNOWN_GLOBAL,
                               "global %R is not defined",
                               name);
    }
    source = global_source(it, f, name);
    if (source == NULL) {
        return PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
    }
    Py_INCREF(value);  /* the load may run the builder */
    rc = ags_load_object(it, source, value, &v);
    Py_DECREF(value);
    Py_DECREF(source);
    if (rc < 0) {
        return rc;
    }
    if (ins->arg & 1) {
        return ags_push_callable(f, v, NULL);
    }
    return ags_push(f, v);
}

/* ------------------------------------------------------------------ */
/* Containers */

static int
build(ags_interp *it, ags_frame *f, int n, int kind)
{
    PyObject *items = kind == AGS_VK_TUPLE ? PyTuple_New(n) : PyList_New(n);
    ags_value v;

    if (items == NULL) {
        return AGS_ERROR;
    }
    for (int i = 0; i < n; i++) {
        PyObject *a = ags_held_arg(it, ags_peek(f, n - i));
        if (a == NULL) {
            Py_DECREF(items);
            return AGS_BREAK;
        }
        if (kind == AGS_VK_TUPLE) {
            PyTuple_SET_ITEM(items, i, a);
        }
        else {
            PyList_SET_ITEM(items, i, a);
        }
    }
    ags_drop(f, n);
    if (kind == AGS_VK_LIST && ags_own(it, items) < 0) {
        Py_DECREF(items);
        return AGS_ERROR;
    }
    if (ags_value_of(it, items, &v) < 0) {
        Py_DECREF(items);
        return AGS_ERROR;
    }
    Py_DECREF(items);
    return ags_push(f, v);
}

AGS_HANDLER
op_build_tuple(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return build(it, f, (int)ins->arg, AGS_VK_TUPLE);
}

AGS_HANDLER
op_build_list(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return build(it, f, (int)ins->arg, AGS_VK_LIST);
}

/* Pushes a built dict from keys (constants) and values. */
static int
push_dict(ags_interp *it, ags_frame *f, PyObject *dict)
{
    ags_value v;

    if (ags_own(it, dict) < 0 || ags_value_of(it, dict, &v) < 0) {
        Py_DECREF(dict);
        return AGS_ERROR;
    }
    Py_DECREF(dict);
    return ags_push(f, v);
}

AGS_HANDLER
op_build_map(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    int n = (int)ins->arg;
    PyObject *dict = PyDict_New();

    if (dict == NULL) {
        return AGS_ERROR;
    }
    for (int i = 0; i < n; i++) {
        ags_value *k = ags_peek(f, 2 * (n - i)), *val = ags_peek(f, 2 * (n - i) - 1);
        PyObject *a;
        if (k->kind != AGS_VK_CONST) {
            Py_DECREF(dict);
            return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                             "a dict key that is a %s",
                             AGS_DESCRIBE(k));
        }
        a = ags_held_arg(it, val);
        if (a == NULL || PyDict_SetItem(dict, k->obj, a) < 0) {
            Py_XDECREF(a);
            Py_DECREF(dict);
            return a == NULL ? AGS_BREAK : AGS_ERROR;
        }
        Py_DECREF(a);
    }
    ags_drop(f, 2 * n);
    return push_dict(it, f, dict);
}

AGS_HANDLER
op_build_const_key_map(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    int n = (int)ins->arg;
    ags_value keys = ags_pop(f);
    PyObject *dict;

    if (keys.kind != AGS_VK_CONST || !PyTuple_Check(keys.obj)
        || PyTuple_GET_SIZE(keys.obj) != n) {
        ags_value_clear(&keys);
        PyErr_SetString(PyExc_SystemError, "BUILD_CONST_KEY_MAP: bad keys");
        return AGS_ERROR;
    }
    dict = PyDict_New();
    for (int i = 0; dict != NULL && i < n; i++) {
        PyObject *a = ags_held_arg(it, ags_peek(f, n - i));
        if (a == NULL || PyDict_SetItem(dict, PyTuple_GET_ITEM(keys.obj, i), a) < 0) {
            Py_XDECREF(a);
            Py_CLEAR(dict);
            ags_value_clear(&keys);
            return a == NULL ? AGS_BREAK : AGS_ERROR;
        }
        Py_DECREF(a);
    }
    ags_value_clear(&keys);
    if (dict == NULL) {
        return AGS_ERROR;
    }
    ags_drop(f, n);
    return push_dict(it, f, dict);
}

AGS_HANDLER
op_list_append(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value item = ags_pop(f);
    ags_value *list = ags_peek(f, (int)ins->arg);
    PyObject *a;
    int rc;

    if (list->kind != AGS_VK_LIST) {
        ags_value_clear(&item);
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                         "LIST_APPEND to a %s",
                         AGS_DESCRIBE(list));
    }
    a = ags_held_arg(it, &item);
    ags_value_clear(&item);
    if (a == NULL) {
        return AGS_BREAK;
    }
    rc = PyList_Append(list->obj, a);
    Py_DECREF(a);
    return rc < 0 ? AGS_ERROR : AGS_GO;
}

AGS_HANDLER
op_list_extend(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value seq = ags_pop(f);
    ags_value *list = ags_peek(f, (int)ins->arg);
    PyObject *elems = NULL;
    int rc;

    if (list->kind != AGS_VK_LIST) {
        ags_value_clear(&seq);
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                         "LIST_EXTEND of a %s",
                         AGS_DESCRIBE(list));
    }
    rc = ags_elements(it, &seq, &elems);
    ags_value_clear(&seq);
    if (rc != AGS_GO) {
        return rc;
    }
    for (Py_ssize_t i = 0; rc == AGS_GO && i < PyTuple_GET_SIZE(elems); i++) {
        if (PyList_Append(list->obj, PyTuple_GET_ITEM(elems, i)) < 0) {
            rc = AGS_ERROR;
        }
    }
    Py_DECREF(elems);
    return rc;
}

/* LIST_TO_TUPLE (3.11) and CALL_INTRINSIC_1's list-to-tuple (3.12+). */
static int
list_to_tuple(ags_interp *it, ags_frame *f)
{
    ags_value list = ags_pop(f);
    PyObject *tuple;
    ags_value v;

    if (list.kind != AGS_VK_LIST) {
        int rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE, "tuple() of a %s",
                           AGS_DESCRIBE(&list));
        ags_value_clear(&list);
        return rc;
    }
    tuple = PyList_AsTuple(list.obj);
    ags_value_clear(&list);
    if (tuple == NULL || ags_value_of(it, tuple, &v) < 0) {
        Py_XDECREF(tuple);
        return AGS_ERROR;
    }
    Py_DECREF(tuple);
    return ags_push(f, v);
}

AGS_HANDLER
op_list_to_tuple(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return list_to_tuple(it, f);
}

/* INTRINSIC_LIST_TO_TUPLE is 6 and INTRINSIC_UNARY_POSITIVE 5 on 3.12
 * and 3.13 (Include/internal/pycore_intrinsics.h). */
AGS_HANDLER
op_call_intrinsic_1(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    if (ins->arg == 6) {
        return list_to_tuple(it, f);
    }
    return ags_stopf(it, AGS_REASON_UNSUPPORTED_INSTRUCTION, "intrinsic %u",
                     (unsigned)ins->arg);
}

AGS_HANDLER
op_unpack_sequence(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value seq = ags_pop(f);
    PyObject *elems = NULL;
    int rc = ags_elements(it, &seq, &elems);

    ags_value_clear(&seq);
    if (rc != AGS_GO) {
        return rc;
    }
    if (PyTuple_GET_SIZE(elems) != (Py_ssize_t)ins->arg) {
        Py_DECREF(elems);
        return ags_stopf(it, AGS_REASON_OP_FAILED,
                         "unpacking %zd values into %u names",
                         PyTuple_GET_SIZE(elems), (unsigned)ins->arg);
    }
    for (Py_ssize_t i = PyTuple_GET_SIZE(elems) - 1; i >= 0; i--) {
        ags_value v;
        if (ags_value_of(it, PyTuple_GET_ITEM(elems, i), &v) < 0
            || ags_push(f, v) < 0) {
            Py_DECREF(elems);
            return AGS_ERROR;
        }
    }
    Py_DECREF(elems);
    return AGS_GO;
}

/* UNPACK_EX: a, *b, c = seq.  arg & 0xFF names before the starred one,
 * arg >> 8 after it; the starred one gets a list the capture owns. */
AGS_HANDLER
op_unpack_ex(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    Py_ssize_t before = ins->arg & 0xFF, after = ins->arg >> 8, n;
    ags_value seq = ags_pop(f), v;
    PyObject *elems = NULL, *middle;
    int rc = ags_elements(it, &seq, &elems);

    ags_value_clear(&seq);
    if (rc != AGS_GO) {
        return rc;
    }
    n = PyTuple_GET_SIZE(elems);
    if (n < before + after) {
        Py_DECREF(elems);
        return ags_stopf(it, AGS_REASON_OP_FAILED,
                         "not enough values to unpack");
    }
    for (Py_ssize_t i = n - 1; i >= n - after; i--) {
        if (ags_value_of(it, PyTuple_GET_ITEM(elems, i), &v) < 0
            || ags_push(f, v) < 0) {
            Py_DECREF(elems);
            return AGS_ERROR;
        }
    }
    middle = PyList_New(0);
    for (Py_ssize_t i = before; middle != NULL && i < n - after; i++) {
        if (PyList_Append(middle, PyTuple_GET_ITEM(elems, i)) < 0) {
            Py_CLEAR(middle);
        }
    }
    if (middle == NULL || ags_own(it, middle) < 0
        || ags_value_of(it, middle, &v) < 0 || ags_push(f, v) < 0) {
        Py_XDECREF(middle);
        Py_DECREF(elems);
        return AGS_ERROR;
    }
    Py_DECREF(middle);
    for (Py_ssize_t i = before - 1; i >= 0; i--) {
        if (ags_value_of(it, PyTuple_GET_ITEM(elems, i), &v) < 0
            || ags_push(f, v) < 0) {
            Py_DECREF(elems);
            return AGS_ERROR;
        }
    }
    Py_DECREF(elems);
    return AGS_GO;
}

/* ------------------------------------------------------------------ */
/* Slices and subscripts */

AGS_HANDLER
op_build_slice(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    int n = (int)ins->arg;
    PyObject *parts[3] = {Py_None, Py_None, Py_None}, *slice;

    for (int i = 0; i < n; i++) {
        ags_value *v = ags_peek(f, n - i);
        /* A graph value is a bound the graph computes (a size of a dynamic
         * dimension): the slice holds its node, and what it indexes decides
         * (a tensor: a graph node; a known sequence: the builder). */
        if (v->kind != AGS_VK_CONST && v->kind != AGS_VK_TENSOR) {
            return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                             "a slice bound that is "
                             "a %s", AGS_DESCRIBE(v));
        }
        parts[i] = v->obj;
    }
    slice = PySlice_New(parts[0], parts[1], n == 3 ? parts[2] : Py_None);
    if (slice == NULL) {
        return AGS_ERROR;
    }
    ags_drop(f, n);
    return ags_push(f, ags_value_make(AGS_VK_CONST, slice, NULL));
}

/* container[index] for values: a graph node when the container is a
 * tensor, else evaluated by the builder on known values. */
static int
subscript(ags_interp *it, ags_frame *f, ags_value *container, ags_value *index)
{
    /* a built dict is read in place: a defaultdict's missing key is added
     * to it, not to a copy */
    PyObject *c = container->kind == AGS_VK_DICT
                      ? Py_NewRef(container->obj)
                      : ags_graph_arg(it, container);
    PyObject *i = NULL, *out;
    PyObject *source = NULL;
    ags_value v;
    int rc;

    int had = 1;

    if (c == NULL || (i = ags_graph_arg(it, index)) == NULL) {
        Py_XDECREF(c);
        return AGS_BREAK;
    }
    if (container->kind == AGS_VK_DICT
        && (had = PyDict_Contains(c, i)) < 0) {
        PyErr_Clear();  /* unhashable: the builder's lookup breaks */
        had = 1;
    }
    if (container->kind == AGS_VK_CONST) {
        source = ags_source_of(it, container);
    }
    out = ags_call_builder(it, AGS_BOP_GETITEM, "(OOO)", c, i,
                           source ? source : Py_None);
    Py_DECREF(c);
    Py_DECREF(i);
    Py_XDECREF(source);
    if (out == NULL) {
        return ags_take_break(it);
    }
    /* The builder answers (value, source or None): a known object that is
     * guarded on its own source, or a graph argument. */
    if (PyTuple_Check(out) && PyTuple_GET_SIZE(out) == 2
        && PyTuple_GET_ITEM(out, 1) != Py_None) {
        rc = ags_load_object(it, PyTuple_GET_ITEM(out, 1),
                             PyTuple_GET_ITEM(out, 0), &v);
    }
    else if (PyTuple_Check(out) && PyTuple_GET_SIZE(out) == 2) {
        rc = ags_value_of(it, PyTuple_GET_ITEM(out, 0), &v) < 0 ? AGS_ERROR
                                                                : AGS_GO;
        if (rc == AGS_GO && !had) {
            /* a defaultdict's factory made it here */
            rc = ags_own_created(it, &v);
        }
    }
    else {
        PyErr_SetString(PyExc_SystemError, "builder.getitem: bad answer");
        rc = AGS_ERROR;
    }
    Py_DECREF(out);
    return rc < 0 ? rc : ags_push(f, v);
}

AGS_HANDLER
op_binary_subscr(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value index = ags_pop(f), container = ags_pop(f);
    int rc = subscript(it, f, &container, &index);

    (void)ins;
    ags_value_clear(&index);
    ags_value_clear(&container);
    return rc;
}

static int
make_slice(ags_interp *it, ags_frame *f, int n)
{
    int rc = op_build_slice(it, f, &(ags_instr){.arg = (uint32_t)n});
    return rc;
}

AGS_HANDLER
op_binary_slice(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    int rc = make_slice(it, f, 2);
    (void)ins;
    return rc < 0 ? rc : op_binary_subscr(it, f, ins);
}

/* container[index] = value: a recorded operator.setitem on a tensor,
 * a store into a list or dict the capture built; anything else is a side
 * effect on the program's objects, which breaks. */
static int
store_subscript(ags_interp *it, ags_value *container, ags_value *index,
                ags_value *value)
{
    PyObject *i, *v;
    int rc;

    if (ags_can_shadow(container)) {
        rc = ags_shadow(it, container);  /* a list or dict of the program */
        if (rc != AGS_GO) {
            return rc;
        }
    }
    if (container->kind != AGS_VK_TENSOR && container->kind != AGS_VK_LIST
        && container->kind != AGS_VK_DICT) {
        return ags_stopf(it, AGS_REASON_SIDE_EFFECT, "item assignment on a %s",
                         AGS_DESCRIBE(container));
    }
    i = ags_graph_arg(it, index);
    /* a tensor's setitem records a node: its argument is frozen */
    v = i == NULL ? NULL
        : container->kind == AGS_VK_TENSOR ? ags_graph_arg(it, value)
                                           : ags_held_arg(it, value);
    if (v == NULL) {
        Py_XDECREF(i);
        return AGS_BREAK;
    }
    if (container->kind == AGS_VK_TENSOR) {
        PyObject *out = ags_call_builder(it, AGS_BOP_SETITEM, "(OOO)",
                                         container->obj,
                                         i, v);
        rc = out ? AGS_GO : ags_take_break(it);
        Py_XDECREF(out);
    }
    else {
        rc = PyObject_SetItem(container->obj, i, v) < 0
                 ? ags_stopf(it, AGS_REASON_OP_FAILED,
                             "item assignment failed")
                 : AGS_GO;
        if (rc == AGS_BREAK) {
            PyErr_Clear();
        }
    }
    Py_DECREF(i);
    Py_DECREF(v);
    return rc;
}

AGS_HANDLER
op_store_subscr(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value index = ags_pop(f), container = ags_pop(f), value = ags_pop(f);
    int rc = store_subscript(it, &container, &index, &value);

    (void)ins;
    ags_value_clear(&index);
    ags_value_clear(&container);
    ags_value_clear(&value);
    return rc;
}

/* obj.name = value: stored on an object the capture made
 * (interp_object.c), or recorded as a side effect on an object of the
 * program, replayed after the graph (interp_effects.c). */
AGS_HANDLER
op_store_attr(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value owner = ags_pop(f), value = ags_pop(f);
    PyObject *name = PyTuple_GET_ITEM(f->code->co_names, ins->arg);
    int rc = ags_store_attr(it, f, &owner, name, &value);

    ags_value_clear(&owner);
    ags_value_clear(&value);
    return rc;
}

AGS_HANDLER
op_store_slice(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    int rc = make_slice(it, f, 2);
    (void)ins;
    return rc < 0 ? rc : op_store_subscr(it, f, ins);
}

