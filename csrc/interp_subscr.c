/* interp_subscr.c: slices and subscripts for the symbolic interpreter
 * (see interp.h).
 *
 * Subscripts of a tensor become graph nodes (operator.getitem / setitem);
 * subscripts of known constants and of built containers are evaluated
 * now by the builder; an object whose class defines __getitem__ or
 * __setitem__ in Python has it inlined (interp_dunder.c).  Item
 * assignment is allowed on what the capture built (lists, dicts, deques)
 * and on the program's lists and dicts through their shadows
 * (interp_effects.c).
 */
#include "interp.h"
#include <string.h>

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

static int store_subscript(ags_interp *it, ags_value *container,
                           ags_value *index, ags_value *value);

/* d[key] of a defaultdict without the key whose factory is a Python
 * function (a lambda, a closure), as defaultdict.__missing__ does it:
 * the factory inlined with no arguments, its result stored under the key
 * and pushed.  A dict of the program is changed through its shadow, the
 * factory reached by its default_factory (which the shadow guards).
 * AGS_DUNDER_NOT_MINE when the key is there or the factory is no Python
 * function (a builtin type: the builder's read adds its value). */
static int
missing_by_factory(ags_interp *it, ags_frame *f, ags_value *container,
                   ags_value *index)
{
    PyObject *factory, *fsource = NULL;
    ags_value made;
    int rc, has = PyDict_Contains(container->obj, index->obj);

    if (has != 0) {
        PyErr_Clear();   /* unhashable: the builder's lookup decides */
        return AGS_DUNDER_NOT_MINE;
    }
    factory = PyObject_GetAttrString(container->obj, "default_factory");
    if (factory == NULL) {
        return AGS_ERROR;
    }
    if (!PyFunction_Check(factory)) {
        Py_DECREF(factory);
        return AGS_DUNDER_NOT_MINE;
    }
    if (container->kind == AGS_VK_CONST) {
        fsource = Py_BuildValue("(sOs)", ags_load_names[AGS_LOAD_ATTR],
                                container->source, "default_factory");
        rc = fsource == NULL ? AGS_ERROR : ags_shadow(it, container);
        if (rc != AGS_GO) {
            Py_DECREF(factory);
            Py_XDECREF(fsource);
            return rc;
        }
    }
    rc = ags_inline(it, f, factory, fsource, NULL, 0, NULL, &made);
    Py_DECREF(factory);
    Py_XDECREF(fsource);
    if (rc != AGS_GO) {
        return rc;
    }
    rc = store_subscript(it, container, index, &made);
    if (rc != AGS_GO) {
        ags_value_clear(&made);
        return rc;
    }
    return ags_push(f, made);
}

/* container[index] for values: a graph node when the container is a
 * tensor, else evaluated by the builder on known values. */
static int
subscript(ags_interp *it, ags_frame *f, ags_value *container, ags_value *index)
{
    PyObject *c, *i = NULL, *out;
    PyObject *source = NULL;
    ags_value v;
    int had = 1;
    /* a Python __getitem__ (interp_dunder.c) */
    int rc = ags_dunder_call(it, f, "__getitem__", container, index, 1, &v);

    if (rc != AGS_DUNDER_NOT_MINE) {
        return rc == AGS_GO ? ags_push(f, v) : rc;
    }
    if ((container->kind == AGS_VK_DICT || ags_can_shadow(container))
        && ags_is_defaultdict(container->obj) && index->kind == AGS_VK_CONST
        && (rc = missing_by_factory(it, f, container, index))
               != AGS_DUNDER_NOT_MINE) {
        return rc;
    }
    if (ags_can_shadow(container) && ags_is_defaultdict(container->obj)
        && index->kind == AGS_VK_CONST) {
        /* a missing key of a defaultdict of the program is added by the
         * read: to its shadow, never to the original while capturing */
        int has = PyDict_Contains(container->obj, index->obj);

        if (has < 0) {
            PyErr_Clear();   /* unhashable: the builder's lookup decides */
        }
        else if (!has && (rc = ags_shadow(it, container)) != AGS_GO) {
            return rc;
        }
    }

    /* a built dict is read in place: a defaultdict's missing key is added
     * to it, not to a copy */
    c = container->kind == AGS_VK_DICT ? Py_NewRef(container->obj)
                                       : ags_graph_arg(it, container);
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
        rc = ags_take_break(it);
        if (container->kind == AGS_VK_TENSOR) {
            /* what a tensor's subscript raised depends on sizes a dynamic
             * capture need not have guarded: no handler catches it
             * (interp_catch.c) */
            Py_CLEAR(it->brk_raised);
        }
        return rc;
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
        if (rc == AGS_GO
            && (!had
                || (PySlice_Check(index->obj) && index->kind == AGS_VK_CONST
                    && (container->kind == AGS_VK_LIST
                        || PyList_CheckExact(container->obj))))) {
            /* a defaultdict's factory made it here, or a list's slice is a
             * new list the program may change */
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

int
ags_plain_dict_store(PyObject *obj)
{
    PyMappingMethods *mine = Py_TYPE(obj)->tp_as_mapping;

    if (!PyDict_Check(obj) || mine == NULL) {
        return 0;
    }
    return mine->mp_ass_subscript == PyDict_Type.tp_as_mapping->mp_ass_subscript
           || mine->mp_ass_subscript
                  == PyODict_Type.tp_as_mapping->mp_ass_subscript;
}

/* 1 for a collections.deque, or a dict subclass with its base's item
 * store, the capture made (changed in place); 2 for another object of a
 * class written in Python (the builder's setitem stores into one the
 * capture made, a ModelOutput, or breaks); else 0. */
static int
owned_store(ags_interp *it, const ags_value *v)
{
    int rc;

    if (v->kind != AGS_VK_CONST) {
        return 0;
    }
    if (ags_is_deque(v->obj) || ags_plain_dict_store(v->obj)) {
        rc = ags_is_owned(it, v->obj);
        if (rc < 0) {
            PyErr_Clear();
        }
        return rc == 1;
    }
    return PyType_HasFeature(Py_TYPE(v->obj), Py_TPFLAGS_HEAPTYPE)
           && !PyType_Check(v->obj) ? 2 : 0;
}

/* container[index] = value: a recorded operator.setitem on a tensor,
 * a store into a list or dict the capture built; anything else is a side
 * effect on the program's objects, which breaks. */
static int
store_subscript(ags_interp *it, ags_value *container, ags_value *index,
                ags_value *value)
{
    PyObject *i, *v;
    int rc, owned = 0;

    if (ags_can_shadow(container)) {
        rc = ags_shadow(it, container);  /* a list or dict of the program */
        if (rc != AGS_GO) {
            return rc;
        }
    }
    if (container->kind == AGS_VK_DICT && index->kind == AGS_VK_TENSOR) {
        /* keyed by a node: only where the entry writes the tensor itself
         * back (a dict of the program keyed by one of its tensors) */
        PyObject *ok = ags_call_builder(it, AGS_BOP_DICT_KEY, "(OO)",
                                        container->obj, index->obj);
        if (ok == NULL) {
            return ags_take_break(it);
        }
        Py_DECREF(ok);
    }
    else if (container->kind == AGS_VK_DICT && index->kind == AGS_VK_TUPLE) {
        /* keyed by nodes, the dict would hold no tensor once it leaves the
         * capture (as BUILD_MAP, interp_data.c) */
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                         "a dict key that is a %s", AGS_DESCRIBE(index));
    }
    if (container->kind != AGS_VK_TENSOR && container->kind != AGS_VK_LIST
        && container->kind != AGS_VK_DICT
        && (owned = owned_store(it, container)) == 0) {
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
    if (container->kind == AGS_VK_TENSOR || owned == 2) {
        /* recorded on a tensor; on an object the capture made (a
         * ModelOutput), stored by the builder or refused */
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
    int rc = ags_note_write(it, container.obj) < 0
                 ? AGS_ERROR : store_subscript(it, &container, &index, &value);

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
    int rc = ags_note_write(it, owner.obj) < 0
                 ? AGS_ERROR : ags_store_attr(it, f, &owner, name, &value);

    ags_value_clear(&owner);
    ags_value_clear(&value);
    return rc;
}

/* del obj.name: as delattr(obj, name) is folded (agspeed/_objects.py): done
 * on an object the capture made whose class deletes as object does, else a
 * break (a side effect on the program's object). */
AGS_HANDLER
op_delete_attr(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    static PyObject *delattr_fn;   /* builtins.delattr, kept */
    ags_value args[2], result = ags_value_make(AGS_VK_CONST, NULL, NULL);
    PyObject *name = PyTuple_GET_ITEM(f->code->co_names, ins->arg);
    int rc;

    if (delattr_fn == NULL) {
        delattr_fn = Py_XNewRef(PyDict_GetItemString(PyEval_GetBuiltins(),
                                                     "delattr"));
        if (delattr_fn == NULL) {
            return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL, "no delattr()");
        }
    }
    args[0] = ags_pop(f);
    args[1] = ags_value_make(AGS_VK_CONST, Py_NewRef(name), NULL);
    rc = ags_note_write(it, args[0].obj) < 0
             ? AGS_ERROR
             : ags_builder_call(it, AGS_BOP_FOLD, delattr_fn, NULL, args, 2,
                                NULL, &result);
    ags_value_clear(&args[0]);
    ags_value_clear(&args[1]);
    ags_value_clear(&result);
    return rc;
}

AGS_HANDLER
op_store_slice(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    int rc = make_slice(it, f, 2);
    (void)ins;
    return rc < 0 ? rc : op_store_subscr(it, f, ins);
}

