/* interp_args.c: what abstract values stand for (see interp.h).
 *
 * A value goes into the graph, or into a container the capture built, as
 * a *graph argument*: a node for a tensor, the object itself for anything
 * else, a copy for a list or dict that the capture may go on changing
 * (ags_graph_arg).  The way back, from a graph argument taken out of a
 * container or returned by the builder to an abstract value, is
 * ags_value_of.  Objects reached from the frame have sources: each load
 * records its assumption (source, value), which the guard checks, and
 * remembers the object's first source in the capture's `known` map, so a
 * module taken back out of a tuple keeps its source.  Containers the
 * capture built are *owned* (the `owned` set of ids): they may change in
 * place, unlike the program's.
 */
#include "interp.h"

/* A copy of a container graph argument, so that a list the capture goes
 * on mutating never changes a node's recorded arguments. */
static PyObject *
frozen_copy(PyObject *obj)
{
    if (PyList_CheckExact(obj)) {
        return PyList_GetSlice(obj, 0, PyList_GET_SIZE(obj));
    }
    if (PyDict_CheckExact(obj)) {
        return PyDict_Copy(obj);
    }
    if (PyDict_Check(obj)) {
        /* an OrderedDict or defaultdict the capture owns: its C copy() */
        return PyObject_CallMethod(obj, "copy", NULL);
    }
    if (PySet_CheckExact(obj)) {
        return PySet_New(obj);
    }
    return Py_NewRef(obj);
}

/* New reference: what a value stands for in the graph (node, constant,
 * container), or NULL with a graph break set for values that cannot. */
PyObject *
ags_graph_arg(ags_interp *it, const ags_value *v)
{
    if (v->obj != NULL && ags_is_gen_box(it, v->obj)) {
        ags_stopf(it, AGS_REASON_GENERATOR, "a generator passed on in *args "
                  "or **kwargs that goes further than a call");
        return NULL;
    }
    switch (v->kind) {
    case AGS_VK_CONST:
    case AGS_VK_TENSOR:
    case AGS_VK_TUPLE:
        return Py_NewRef(v->obj);
    case AGS_VK_LIST:
    case AGS_VK_DICT:
    case AGS_VK_SET:
        return frozen_copy(v->obj);
    case AGS_VK_GENERATOR:
        ags_stopf(it, AGS_REASON_GENERATOR, "a generator that leaves the "
                  "captured code unconsumed (returned, stored or passed on)");
        return NULL;
    default:
        ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                  "a %s cannot be a graph argument",
                  ags_kind_names[v->kind]);
        return NULL;
    }
}

/* 1 if the exact tuple or list `obj` holds a tensor, at most `depth`
 * containers down. */
static int
holds_tensor(ags_interp *it, PyObject *obj, int depth)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);

    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(obj, i);

        if (PyObject_TypeCheck(item, (PyTypeObject *)it->tensor_type)) {
            return 1;
        }
        if (depth > 0 && (PyTuple_CheckExact(item) || PyList_CheckExact(item))
            && holds_tensor(it, item, depth - 1)) {
            return 1;
        }
    }
    return 0;
}

/* New reference: v as an argument of a recorded torch operation.  A tuple
 * or list of the program that holds tensors (torch.cat(xs) of an argument
 * xs) is given as a copy whose items are loaded by their sources
 * ("item", source, i): its tensors graph inputs, the rest guarded
 * constants; anything else as ags_graph_arg.  NULL: a break or an error. */
PyObject *
ags_op_arg(ags_interp *it, const ags_value *v)
{
    PyObject *obj = v->obj, *out;
    Py_ssize_t n;

    if (v->kind != AGS_VK_CONST || v->source == NULL
        || !(PyTuple_CheckExact(obj) || PyList_CheckExact(obj))
        || !holds_tensor(it, obj, 3)) {
        return ags_graph_arg(it, v);
    }
    n = PySequence_Fast_GET_SIZE(obj);
    out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *src = Py_BuildValue("(sOn)", ags_load_names[AGS_LOAD_ITEM],
                                      v->source, i);
        PyObject *arg = NULL, *value = PySequence_Fast_GET_ITEM(obj, i);
        ags_value item;

        if (src != NULL && ags_load_object(it, src, value, &item) == AGS_GO) {
            arg = ags_op_arg(it, &item);
            ags_value_clear(&item);
        }
        Py_XDECREF(src);
        if (arg == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, arg);
    }
    if (out != NULL && PyTuple_CheckExact(obj)) {
        Py_SETREF(out, PyList_AsTuple(out));
    }
    return out;
}

/* What a container the capture built, or a cell shared with a function it
 * made, holds for v: a graph argument, but a list, dict or set the capture
 * built is the object itself (not a frozen copy), so that changes through
 * either reference reach the same object, as in Python.  New reference,
 * or NULL (a break or an error). */
PyObject *
ags_held_arg(ags_interp *it, const ags_value *v)
{
    if (AGS_BUILT_CONTAINER(v) && !ags_is_gen_box(it, v->obj)) {
        return Py_NewRef(v->obj);
    }
    return ags_graph_arg(it, v);
}

/* Whether obj holds a graph node, looking at most `depth` containers down
 * and at most *budget objects in all: a container of the program that holds
 * itself, or shares its parts many times over, ends the search (a node the
 * capture put in a tuple sits near its top). */
static int
holds_node_within(ags_interp *it, PyObject *obj, int depth, int *budget)
{
    if (PyObject_TypeCheck(obj, (PyTypeObject *)it->node_type)) {
        return 1;
    }
    if (depth == 0 || --*budget < 0) {
        return 0;
    }
    if (PyTuple_Check(obj) || PyList_Check(obj)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
        for (Py_ssize_t i = 0; i < n && *budget >= 0; i++) {
            if (holds_node_within(it, PySequence_Fast_GET_ITEM(obj, i),
                                  depth - 1, budget)) {
                return 1;
            }
        }
    }
    if (PyDict_CheckExact(obj)) {
        Py_ssize_t pos = 0;
        PyObject *k, *val;
        while (*budget >= 0 && PyDict_Next(obj, &pos, &k, &val)) {
            if (holds_node_within(it, val, depth - 1, budget)) {
                return 1;
            }
        }
    }
    return 0;
}

static int
contains_node(ags_interp *it, PyObject *obj)
{
    int budget = 4096;

    return holds_node_within(it, obj, 32, &budget);
}

static PyObject *
id_of(PyObject *obj)
{
    return PyLong_FromVoidPtr(obj);
}

int
ags_own(ags_interp *it, PyObject *container)
{
    PyObject *id = id_of(container);
    int rc = id ? PySet_Add(it->owned, id) : -1;

    Py_XDECREF(id);
    return rc;
}

/* 1 if `container` was built by this capture, 0 if not, -1 on error. */
int
ags_is_owned(ags_interp *it, PyObject *container)
{
    PyObject *id = id_of(container);
    int rc = id ? PySet_Contains(it->owned, id) : -1;

    Py_XDECREF(id);
    return rc;
}

int
ags_is_gen_box(ags_interp *it, PyObject *obj)
{
    PyObject *id, *box;

    if (PyDict_GET_SIZE(it->gen_boxes) == 0) {
        return 0;
    }
    id = id_of(obj);
    if (id == NULL) {
        PyErr_Clear();
        return 0;
    }
    box = PyDict_GetItem(it->gen_boxes, id);   /* borrowed */
    Py_DECREF(id);
    return box == obj;
}

/* New reference or NULL (no error): the source an object was loaded
 * from during this capture. */
static PyObject *
known_source(ags_interp *it, PyObject *obj)
{
    PyObject *id = id_of(obj), *entry;

    if (id == NULL) {
        PyErr_Clear();
        return NULL;
    }
    entry = PyDict_GetItem(it->known, id);
    Py_DECREF(id);
    if (entry == NULL || PyTuple_GET_ITEM(entry, 0) != obj) {
        return NULL;
    }
    return Py_NewRef(PyTuple_GET_ITEM(entry, 1));
}

/* New reference or NULL (no error): how a value is reached. */
PyObject *
ags_source_of(ags_interp *it, const ags_value *v)
{
    if (v->source != NULL) {
        return Py_NewRef(v->source);
    }
    if (v->kind == AGS_VK_CONST) {
        return known_source(it, v->obj);
    }
    return NULL;
}

/* The abstract value of a graph argument taken out of a container or
 * returned by the builder.  0, or -1 with an exception. */
int
ags_value_of(ags_interp *it, PyObject *obj, ags_value *out)
{
    int owned;

    if (PyObject_TypeCheck(obj, (PyTypeObject *)it->node_type)) {
        *out = ags_value_make(AGS_VK_TENSOR, Py_NewRef(obj), NULL);
        return 0;
    }
    if (ags_gen_is_capsule(obj)) {   /* out of a call's *args or **kwargs */
        *out = ags_value_make(AGS_VK_GENERATOR, Py_NewRef(obj), NULL);
        return 0;
    }
    if (PyTuple_CheckExact(obj) && ags_is_gen_box(it, obj)) {
        *out = ags_value_make(AGS_VK_TUPLE, Py_NewRef(obj), NULL);
        return 0;
    }
    owned = (PyList_CheckExact(obj) || PyDict_Check(obj)
             || PySet_CheckExact(obj))
                ? ags_is_owned(it, obj) : 0;
    if (owned < 0) {
        return -1;
    }
    if (owned) {
        *out = ags_value_make(ags_container_kind(obj), Py_NewRef(obj), NULL);
        return 0;
    }
    if (PyTuple_Check(obj) && contains_node(it, obj)) {
        *out = ags_value_make(AGS_VK_TUPLE, Py_NewRef(obj), NULL);
        return 0;
    }
    owned = ags_shadowed(it, obj, out);
    if (owned != 0) {
        return owned < 0 ? -1 : 0;
    }
    *out = ags_value_make(AGS_VK_CONST, Py_NewRef(obj), known_source(it, obj));
    return 0;
}

/* How a class's own special method `func`, run for v, is reached and
 * guarded: *out the source ("attr", ("type", v's source), name), assumed
 * to reach func, or NULL when v has no source.  AGS_GO or AGS_ERROR. */
int
ags_type_attr_source(ags_interp *it, const ags_value *v, const char *name,
                     PyObject *func, PyObject **out)
{
    PyObject *src = ags_source_of(it, v);

    *out = NULL;
    if (src == NULL) {
        return AGS_GO;
    }
    *out = Py_BuildValue("(s(sO)s)", ags_load_names[AGS_LOAD_ATTR],
                         ags_load_names[AGS_LOAD_TYPE], src, name);
    Py_DECREF(src);
    if (*out == NULL || ags_assume(it, *out, func) < 0) {
        Py_CLEAR(*out);
        return AGS_ERROR;
    }
    return AGS_GO;
}

int
ags_assume(ags_interp *it, PyObject *source, PyObject *value)
{
    PyObject *t = PyTuple_Pack(2, source, value);
    int rc;

    if (t == NULL) {
        return AGS_ERROR;
    }
    rc = PyList_Append(it->assumptions, t);
    Py_DECREF(t);
    it->assumed_in = it->top;
    it->assumed_at = it->top != NULL ? it->top->pc : -1;
    return rc < 0 ? AGS_ERROR : AGS_GO;
}

static int
remember(ags_interp *it, PyObject *obj, PyObject *source)
{
    PyObject *id = id_of(obj), *pair;
    int rc;

    if (id == NULL) {
        return -1;
    }
    if (PyDict_Contains(it->known, id)) {
        Py_DECREF(id);
        return 0;  /* the first source is the one guarded by identity */
    }
    pair = PyTuple_Pack(2, obj, source);
    rc = pair ? PyDict_SetItem(it->known, id, pair) : -1;
    Py_XDECREF(pair);
    Py_DECREF(id);
    return rc;
}

/* A tuple of plain ints and floats whose items a capture made symbols (the
 * betas an LR scheduler moves every step: `beta1, beta2 = group["betas"]`):
 * a tuple value of its items, each loaded from its own source, a symbol or
 * a constant guarded by itself; the guard checks the tuple's length only
 * (guards/guard.py).  1 with *out set, 0 where `value` is not one, -1 on
 * error. */
#define AGS_SCALAR_TUPLE_MAX 8

static int
load_scalar_tuple(ags_interp *it, PyObject *source, PyObject *value,
                  ags_value *out)
{
    Py_ssize_t n = PyTuple_GET_SIZE(value);
    PyObject *sources[AGS_SCALAR_TUPLE_MAX], *elems = NULL;
    int any = 0, rc = -1;
    Py_ssize_t made = 0;

    if (n == 0 || n > AGS_SCALAR_TUPLE_MAX) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(value, i);
        if (!PyLong_CheckExact(item) && !PyFloat_CheckExact(item)) {
            return 0;
        }
    }
    for (; made < n; made++) {
        int in;
        sources[made] = Py_BuildValue("(sOn)", ags_load_names[AGS_LOAD_ITEM],
                                      source, made);
        if (sources[made] == NULL) {
            goto done;
        }
        in = PySet_Contains(it->symbolic_scalars, sources[made]);
        if (in < 0) {
            made++;
            goto done;
        }
        any |= in;
    }
    if (!any) {
        rc = 0;
        goto done;
    }
    elems = PyTuple_New(n);
    for (Py_ssize_t i = 0; elems != NULL && i < n; i++) {
        ags_value loaded;
        PyObject *arg;
        if (ags_load_object(it, sources[i], PyTuple_GET_ITEM(value, i),
                            &loaded) < 0) {
            goto done;
        }
        arg = ags_graph_arg(it, &loaded);
        ags_value_clear(&loaded);
        if (arg == NULL) {
            goto done;
        }
        PyTuple_SET_ITEM(elems, i, arg);
    }
    if (elems == NULL || ags_assume(it, source, value) < 0) {
        goto done;
    }
    *out = ags_value_make(AGS_VK_TUPLE, elems, NULL);
    elems = NULL;
    rc = 1;
done:
    Py_XDECREF(elems);
    for (Py_ssize_t i = 0; i < made; i++) {
        Py_DECREF(sources[i]);
    }
    return rc;
}

/* The abstract value of `value`, reached from the frame by `source`:
 * tensors become graph inputs, anything else a constant guarded on its
 * source.  Borrows both.  AGS_GO or AGS_ERROR. */
int
ags_load_object(ags_interp *it, PyObject *source, PyObject *value,
                ags_value *out)
{
    int array = it->array_type != NULL
                && Py_IS_TYPE(value, (PyTypeObject *)it->array_type);
    int symbol = 0;

    if (it->symbolic_scalars != NULL
        && (PyLong_CheckExact(value) || PyFloat_CheckExact(value))) {
        /* a plain int or float whose value kept changing: a symbol, not a
         * constant */
        symbol = PySet_Contains(it->symbolic_scalars, source);
        if (symbol < 0) {
            return AGS_ERROR;
        }
    }
    if (array || symbol
        || PyObject_TypeCheck(value, (PyTypeObject *)it->tensor_type)) {
        /* a NumPy array is the tensor sharing its memory, when it can be */
        PyObject *node = ags_call_builder(it, AGS_BOP_INPUT, "(OO)", source,
                                          value);
        if (node == NULL) {
            return AGS_ERROR;
        }
        if (node != Py_None) {
            *out = ags_value_make(AGS_VK_TENSOR, node, Py_NewRef(source));
            return AGS_GO;
        }
        Py_DECREF(node);
    }
    if (it->symbolic_scalars != NULL && PyTuple_CheckExact(value)) {
        switch (load_scalar_tuple(it, source, value, out)) {
        case 1:
            return AGS_GO;
        case -1:
            return AGS_ERROR;
        }
    }
    switch (ags_shadowed(it, value, out)) {
    case 1:
        return AGS_GO;  /* changed during this capture: its shadow */
    case -1:
        return AGS_ERROR;
    }
    if (ags_assume(it, source, value) < 0 || remember(it, value, source) < 0) {
        return AGS_ERROR;
    }
    *out = ags_value_make(AGS_VK_CONST, Py_NewRef(value), Py_NewRef(source));
    return AGS_GO;
}

