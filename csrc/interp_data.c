/* interp_data.c: loads, stores, stack shuffles and containers for the
 * symbolic interpreter (see interp.h; subscripts are interp_subscr.c).
 *
 * Locals hold values, not cells: cell and free variables are bound to
 * their contents when a frame starts (a free variable of the root frame
 * comes in f_locals, one of an inlined function from its closure), so
 * LOAD_DEREF and STORE_DEREF are local loads and stores and MAKE_CELL and
 * COPY_FREE_VARS do nothing.  A closure created inside the captured code
 * would need real cells: MAKE_FUNCTION is not handled, it breaks.
 *
 * Containers built here (BUILD_TUPLE/LIST/MAP) are real Python objects
 * whose items are graph arguments.
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

/* 1 when sys.modules[modname] is the module whose dict is `globals`, 0
 * when not, -1 on error. */
static int
module_has_globals(PyObject *modname, PyObject *globals)
{
    PyObject *mod;

    if (modname == NULL || !PyUnicode_Check(modname)) {
        return 0;
    }
    mod = PyDict_GetItemWithError(PyImport_GetModuleDict(), modname);
    if (mod == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    return PyModule_Check(mod) && PyModule_GetDict(mod) == globals;
}

/* The name under which sys.modules holds the module whose dict is f's
 * globals: the module's __name__ or, for a module that renames itself
 * (_collections_abc calls itself collections.abc), the name it was
 * imported as (__spec__.name).  A new reference, or NULL with a stop
 * (globals of no module: `name` is the global asked for) or an error. */
static PyObject *
globals_module_name(ags_interp *it, ags_frame *f, PyObject *name)
{
    PyObject *modname, *spec, *spec_name = NULL;
    int found;

    modname = PyDict_GetItemString(f->globals, "__name__");
    if (modname == NULL || !PyUnicode_Check(modname)) {
        ags_stopf(it, AGS_REASON_UNGUARDABLE_GLOBAL,
                  "global %R of a function with no "
                  "module", name);
        return NULL;
    }
    found = module_has_globals(modname, f->globals);
    spec = found == 0 ? PyDict_GetItemString(f->globals, "__spec__") : NULL;
    if (spec != NULL && spec != Py_None) {
        spec_name = PyObject_GetAttrString(spec, "name");  /* new or NULL */
        if (spec_name == NULL) {
            PyErr_Clear();
        }
        else if ((found = module_has_globals(spec_name, f->globals)) == 1) {
            return spec_name;
        }
    }
    Py_XDECREF(spec_name);
    if (found == 1) {
        return Py_NewRef(modname);
    }
    if (found == 0) {
        ags_stopf(it, AGS_REASON_UNGUARDABLE_GLOBAL,
                  "global %R of a function "
                  "whose globals are not module %R's", name, modname);
    }
    return NULL;
}

/* The source of a global read in frame f: ("global", name) in the root
 * frame, ("gmod", module, name) in an inlined function whose globals are
 * its module's (globals_module_name); other globals cannot be guarded. */
static PyObject *
global_source(ags_interp *it, ags_frame *f, PyObject *name)
{
    PyObject *modname, *source;

    if (f->parent == NULL) {
        return Py_BuildValue("(sO)", ags_load_names[AGS_LOAD_GLOBAL], name);
    }
    modname = globals_module_name(it, f, name);
    if (modname == NULL) {
        return NULL;
    }
    source = Py_BuildValue("(sOO)", ags_load_names[AGS_LOAD_GMOD], modname,
                           name);
    Py_DECREF(modname);
    return source;
}

/* The module whose dict is f's globals (*mod, new) and, when source is not
 * NULL, the source that reaches it, sys.modules[its name] (*source, new).
 * AGS_GO, a stop, or AGS_ERROR. */
static int
globals_module(ags_interp *it, ags_frame *f, PyObject *name, PyObject **mod,
               PyObject **source)
{
    PyObject *modname = globals_module_name(it, f, name);

    *mod = NULL;
    if (source != NULL) {
        *source = NULL;
    }
    if (modname == NULL) {
        return PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
    }
    *mod = Py_XNewRef(PyDict_GetItemWithError(PyImport_GetModuleDict(),
                                              modname));
    if (*mod == NULL) {
        Py_DECREF(modname);
        return PyErr_Occurred()
                   ? AGS_ERROR
                   : ags_stopf(it, AGS_REASON_UNGUARDABLE_GLOBAL,
                               "global %R of a module no longer loaded", name);
    }
    if (source != NULL) {
        *source = Py_BuildValue("(s(sss)O)", ags_load_names[AGS_LOAD_ITEM],
                                ags_load_names[AGS_LOAD_GMOD], "sys", "modules",
                                modname);
    }
    Py_DECREF(modname);
    if (source != NULL && *source == NULL) {
        Py_CLEAR(*mod);
        return AGS_ERROR;
    }
    return AGS_GO;
}

/* `global name; name = value`: the write is a side effect on the module,
 * recorded by the builder as setattr(module, name, value) and replayed
 * after the graph; later reads in this capture see what was stored. */
AGS_HANDLER
op_store_global(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    PyObject *name = PyTuple_GET_ITEM(f->code->co_names, ins->arg);
    PyObject *mod, *source;
    ags_value owner, stored;
    int rc;

    rc = globals_module(it, f, name, &mod, &source);
    if (rc != AGS_GO) {
        return rc;
    }
    owner = ags_value_make(AGS_VK_CONST, mod, source);
    rc = ags_store_attr(it, f, &owner, name, ags_peek(f, 1));
    ags_value_clear(&owner);
    if (rc == AGS_GO) {
        it->wrote_globals = 1;
        stored = ags_pop(f);
        ags_value_clear(&stored);
    }
    return rc;
}

/* What this capture stored in global `name` of frame f, when it stored
 * one: 1 (*out set), 0, or -1 on error (a stop is also 0 with it->brk
 * set: the caller checks PyErr_Occurred first). */
static int
stored_global(ags_interp *it, ags_frame *f, PyObject *name, ags_value *out)
{
    PyObject *mod, *answer;
    int rc;

    if (!it->wrote_globals) {
        return 0;
    }
    rc = globals_module(it, f, name, &mod, NULL);
    if (rc != AGS_GO) {
        return rc == AGS_ERROR ? -1 : 0;
    }
    answer = ags_call_builder(it, AGS_BOP_WRITTEN, "(OO)", mod, name);
    Py_DECREF(mod);
    if (answer == NULL) {
        return ags_take_break(it) == AGS_ERROR ? -1 : 0;
    }
    rc = 0;
    if (answer != Py_None) {
        rc = ags_value_of(it, PyTuple_GET_ITEM(answer, 0), out) < 0 ? -1 : 1;
    }
    Py_DECREF(answer);
    return rc;
}

AGS_HANDLER
op_load_global(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    PyObject *name = PyTuple_GET_ITEM(f->code->co_names, ins->arg >> 1);
    PyObject *value = PyDict_GetItemWithError(f->globals, name);
    PyObject *source;
    ags_value v;
    int rc;

    rc = value == NULL && PyErr_Occurred() ? -1 : stored_global(it, f, name, &v);
    if (rc < 0 || it->brk_reason >= 0) {
        return rc < 0 ? AGS_ERROR : AGS_BREAK;
    }
    if (rc == 1) {
        return (ins->arg & 1) ? ags_push_callable(f, v, NULL) : ags_push(f, v);
    }

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
    if (ins->arg == 5) {
        return ags_unary_positive(it, f);
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
