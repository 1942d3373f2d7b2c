/* interp_effects.c: objects of the program changed during capture.
 *
 * An attribute written on an object reached from the frame (one with a
 * source) is handed to the builder (effect_setattr), which records it for
 * the entry to replay after the graph (agspeed/_effects.py); objects the
 * capture made take their writes in interp_object.c.
 *
 * A list or dict that existed before the call (a global registry, a list
 * attribute of a module, a dict argument) is a constant to the
 * interpreter: read through its source, each item read guarded.  A method
 * call on it (append, get, update, pop...) or an item assignment turns it
 * into a *shadow*: the builder makes an owned copy whose items are graph
 * arguments (tensors as graph inputs reached by ("item", source, key),
 * the rest guarded), and from then on the capture works on the copy, as
 * on any list or dict it built.  Every later load of the same object,
 * through any source, gives the shadow (the `shadows` map, id of the
 * original -> shadow), so writes through one name are seen through
 * another.  After the graph runs, the entry writes the shadow's final
 * contents back into the original (agspeed/_effects.py), in program order
 * with the other side effects; a shadow that ends equal to what it copied
 * writes nothing.
 *
 * The original is never changed during capture.  Only exact lists, dicts,
 * OrderedDicts and defaultdicts are shadowed (a subclass may override what
 * a method does).  A missing key read from a defaultdict of the program
 * adds it, so that read shadows it first (interp_subscr.c).
 *
 * A list the frame only appends to (`self.features.append(h)`, a global
 * history) needs none of its items: copying them would guard every one,
 * and a list that grows on each call would capture again on each call.
 * When the list was loaded by the instruction right before its append or
 * extend, that load's assumption is taken back (only the list's type is
 * guarded) and the builder makes a *tail* (builder.tail): an owned empty
 * list that takes the appends, extended onto the original after the
 * graph.  The shadows map holds (tail, source) for it; a later load of
 * the same list followed by another append or extend gives the tail
 * again, any other use turns the tail into a full shadow in place (the
 * builder puts the original's items, guarded, in front of what was
 * appended), so every reference to the tail sees the whole list.
 */
#include "interp.h"

/* Is obj a container whose methods call none of the program's code: an
 * exact list, dict, OrderedDict, defaultdict (whose factory the builder
 * checks) or set (whose members the builder checks are plain values)? */
static int
shadowable(PyObject *obj)
{
    return PyList_CheckExact(obj) || PyDict_CheckExact(obj)
           || PyODict_CheckExact(obj) || ags_is_defaultdict(obj)
           || PySet_CheckExact(obj);
}

/* The value kind of a list, dict or set the capture owns: its own or a
 * shadow (interp.h). */
int
ags_container_kind(PyObject *obj)
{
    return PyList_CheckExact(obj)  ? AGS_VK_LIST
           : PySet_CheckExact(obj) ? AGS_VK_SET
                                   : AGS_VK_DICT;
}

/* Is `name` a method that only adds at a list's end? */
static int
appends(PyObject *name)
{
    return PyUnicode_Check(name)
           && (PyUnicode_CompareWithASCIIString(name, "append") == 0
               || PyUnicode_CompareWithASCIIString(name, "extend") == 0);
}

/* Does `ins` push exactly one value, loaded from a name or an item? */
static int
single_load(const ags_instr *ins)
{
    switch (ins->opcode) {
    case BINARY_SUBSCR:             /* registry[key].append(x) */
    case LOAD_FAST:
#ifdef LOAD_FAST_CHECK
    case LOAD_FAST_CHECK:
#endif
    case LOAD_DEREF:
    case LOAD_NAME:
        return 1;
    case LOAD_GLOBAL:
        return !(ins->arg & 1);     /* no NULL pushed with it */
    case LOAD_ATTR:
        return !AGS_LOAD_ATTR_HAS_METHOD_BIT || !(ins->arg & 1);
    }
    return 0;
}

/* Is instruction `pc` of f a single load whose value the next instruction
 * loads `append` or `extend` of, for a call? */
static int
loaded_to_append(ags_frame *f, Py_ssize_t pc)
{
    const ags_instr *next;
    uint32_t index;

    if (f == NULL || pc < 0 || pc + 1 >= f->bc.n
        || !single_load(&f->bc.instrs[pc])) {
        return 0;
    }
    next = &f->bc.instrs[pc + 1];
#if AGS_LOAD_ATTR_HAS_METHOD_BIT
    if (next->opcode != LOAD_ATTR || !(next->arg & 1)) {
        return 0;
    }
    index = next->arg >> 1;
#else
    if (next->opcode != LOAD_METHOD) {
        return 0;
    }
    index = next->arg;
#endif
    return index < (uint32_t)PyTuple_GET_SIZE(f->code->co_names)
           && appends(PyTuple_GET_ITEM(f->code->co_names, index));
}

/* The entry of the shadows map for obj (borrowed), or NULL (an exception
 * set on error). */
static PyObject *
shadow_entry(ags_interp *it, PyObject *obj)
{
    PyObject *id, *entry;

    if (it->shadows == NULL || PyDict_GET_SIZE(it->shadows) == 0
        || !shadowable(obj)) {
        return NULL;
    }
    id = PyLong_FromVoidPtr(obj);
    if (id == NULL) {
        return NULL;
    }
    entry = PyDict_GetItemWithError(it->shadows, id);
    Py_DECREF(id);
    return entry;
}

/* Sets the shadows map's entry for obj: its shadow, or (tail, source).
 * 0, or -1 with an exception.  (Made only to change the program's obj: a
 * write, for map()'s calls made ahead, interp_iter.c.) */
static int
set_entry(ags_interp *it, PyObject *obj, PyObject *entry)
{
    PyObject *id = PyLong_FromVoidPtr(obj);
    int rc = id != NULL ? PyDict_SetItem(it->shadows, id, entry) : -1;

    it->writes += it->ahead_before != NULL;
    Py_XDECREF(id);
    return rc;
}

/* Makes the tail of obj its full shadow, in place: builder.shadow(obj,
 * source) puts obj's items in front of the tail's. */
static int
widen_tail(ags_interp *it, PyObject *obj, PyObject *tail)
{
    PyObject *entry = shadow_entry(it, obj), *made;
    int rc;

    assert(entry != NULL && PyTuple_GET_ITEM(entry, 0) == tail);
    Py_INCREF(tail);
    made = ags_call_builder(it, AGS_BOP_SHADOW, "(OO)", obj,
                            PyTuple_GET_ITEM(entry, 1));
    if (made != NULL && made != tail) {
        Py_CLEAR(made);
        PyErr_SetString(PyExc_TypeError,
                        "builder.shadow must fill in the tail of a list "
                        "only appended to so far");
    }
    rc = made != NULL ? set_entry(it, obj, tail) : -1;
    Py_XDECREF(made);
    Py_DECREF(tail);
    return rc;
}

/* 1 if `obj` has a shadow (*out set to its value), 0 if not, -1 on
 * error.  A list with a tail answers 0 (the original, as loaded) where
 * the instruction loading it is followed by another append or extend on
 * it (ags_tail then gives the tail), and its full shadow elsewhere. */
int
ags_shadowed(ags_interp *it, PyObject *obj, ags_value *out)
{
    PyObject *shadow = shadow_entry(it, obj);

    if (shadow == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    if (PyTuple_CheckExact(shadow) && it->top != NULL
        && loaded_to_append(it->top, it->top->pc)) {
        return 0;   /* a tail appended to again: left a tail */
    }
    shadow = ags_live_view(it, obj);
    if (shadow == NULL) {
        return -1;
    }
    *out = ags_value_make(ags_container_kind(shadow), Py_NewRef(shadow), NULL);
    return 1;
}

/* What the capture sees of obj now (borrowed): its full shadow where it
 * has one (a tail widened), else obj itself, which the capture then has
 * not changed or (a container the capture built) changed in place.  NULL
 * with an exception on error.  For a loop over obj (FOR_ITER), which
 * follows changes the body made. */
PyObject *
ags_live_view(ags_interp *it, PyObject *obj)
{
    PyObject *entry = shadow_entry(it, obj);

    if (entry == NULL) {
        return PyErr_Occurred() ? NULL : obj;
    }
    if (PyTuple_CheckExact(entry)) {
        PyObject *tail = PyTuple_GET_ITEM(entry, 0);

        if (widen_tail(it, obj, tail) < 0) {
            return NULL;
        }
        return tail;    /* now the full shadow, which the map holds */
    }
    return entry;
}

/* Before LOAD_ATTR `name` for a call on *v: when v is an exact list of the
 * program, name is append or extend, and v was loaded by the previous
 * instruction (a single load), *v becomes the list's tail, made on first
 * use, and the assumption that load made is taken back: only the list's
 * type is guarded, ("type", source) is list.  Otherwise *v is left as it
 * is.  AGS_GO, a break, or AGS_ERROR. */
int
ags_tail(ags_interp *it, ags_frame *f, ags_value *v, PyObject *name)
{
    PyObject *entry, *tail, *last = NULL, *tsrc;
    Py_ssize_t n = PyList_GET_SIZE(it->assumptions);
    int fresh;

    if (v->kind != AGS_VK_CONST || v->source == NULL
        || !PyList_CheckExact(v->obj) || !appends(name)
        || !loaded_to_append(f, f->pc - 1)) {
        return AGS_GO;
    }
    entry = shadow_entry(it, v->obj);
    if (entry == NULL && PyErr_Occurred()) {
        return AGS_ERROR;
    }
    if (entry != NULL) {
        /* the tail again, if it was made through this same source; a full
         * shadow or another source takes the usual path (ags_shadow) */
        int same = PyTuple_CheckExact(entry)
                   ? PyObject_RichCompareBool(PyTuple_GET_ITEM(entry, 1),
                                              v->source, Py_EQ)
                   : 0;
        if (same <= 0) {
            return same < 0 ? AGS_ERROR : AGS_GO;
        }
    }
    if (n > 0 && it->assumed_in == f && it->assumed_at == f->pc - 1) {
        last = PyList_GET_ITEM(it->assumptions, n - 1);
        if (PyTuple_GET_ITEM(last, 0) != v->source
            || PyTuple_GET_ITEM(last, 1) != v->obj) {
            last = NULL;
        }
    }
    fresh = last != NULL;
    if (entry == NULL && !fresh) {
        return AGS_GO;  /* read before: its items may matter */
    }
    if (fresh && PyList_SetSlice(it->assumptions, n - 1, n, NULL) < 0) {
        return AGS_ERROR;
    }
    if (entry == NULL) {
        tsrc = Py_BuildValue("(sO)", ags_load_names[AGS_LOAD_TYPE],
                             v->source);
        if (tsrc == NULL
            || ags_assume(it, tsrc, (PyObject *)&PyList_Type) < 0) {
            Py_XDECREF(tsrc);
            return AGS_ERROR;
        }
        Py_DECREF(tsrc);
        tail = ags_call_builder(it, AGS_BOP_TAIL, "(OO)", v->obj, v->source);
        if (tail == NULL) {
            return ags_take_break(it);
        }
        if (!PyList_CheckExact(tail) || PyList_GET_SIZE(tail) != 0) {
            Py_DECREF(tail);
            PyErr_SetString(PyExc_TypeError,
                            "builder.tail must return a new empty list");
            return AGS_ERROR;
        }
        entry = PyTuple_Pack(2, tail, v->source);
        if (entry == NULL || set_entry(it, v->obj, entry) < 0
            || ags_own(it, tail) < 0) {
            Py_XDECREF(entry);
            Py_DECREF(tail);
            return AGS_ERROR;
        }
        Py_DECREF(entry);
    }
    else {
        tail = Py_NewRef(PyTuple_GET_ITEM(entry, 0));
    }
    ags_value_clear(v);
    *v = ags_value_make(AGS_VK_LIST, tail, NULL);
    return AGS_GO;
}

/* Does calling method `name` of a list, dict or set change it?  Only those
 * make a shadow: a method that only reads is answered from the original,
 * guarded on what it read (interp_call.c, agspeed/_stdlib.py).  The names
 * are kept as frozensets, made on first use.  The in-place operators are
 * among them: `registry += [x]` calls __iadd__ (interp_ops.c). */
int
ags_is_mutator(PyObject *container, PyObject *name)
{
    static PyObject *list_mutators, *dict_mutators, *set_mutators;
    PyObject *names;

    if (list_mutators == NULL) {
        PyObject *l = Py_BuildValue(
            "(ssssssssssss)", "append", "extend", "insert", "pop", "remove",
            "clear", "sort", "reverse", "__setitem__", "__delitem__",
            "__iadd__", "__imul__");
        PyObject *d = Py_BuildValue(
            "(ssssssss)", "pop", "popitem", "setdefault", "update", "clear",
            "__setitem__", "__delitem__", "__ior__");
        PyObject *s = Py_BuildValue(
            "(sssssssssssss)", "add", "discard", "remove", "pop", "clear",
            "update", "difference_update", "intersection_update",
            "symmetric_difference_update", "__ior__", "__iand__", "__isub__",
            "__ixor__");

        list_mutators = l ? PyFrozenSet_New(l) : NULL;
        dict_mutators = d ? PyFrozenSet_New(d) : NULL;
        set_mutators = s ? PyFrozenSet_New(s) : NULL;
        Py_XDECREF(l);
        Py_XDECREF(d);
        Py_XDECREF(s);
        if (list_mutators == NULL || dict_mutators == NULL
            || set_mutators == NULL) {
            Py_CLEAR(list_mutators);
            Py_CLEAR(dict_mutators);
            Py_CLEAR(set_mutators);
            return -1;
        }
    }
    names = PyList_CheckExact(container)  ? list_mutators
            : PySet_CheckExact(container) ? set_mutators
                                          : dict_mutators;
    return PySet_Contains(names, name);
}

/* owner.name = arg on an object of the program (owner has a source; arg
 * the graph argument stored): the builder records the write and the entry
 * replays it after the graph (*hook NULL), or answers the class's own
 * __setattr__ for the caller to inline (*hook, new), whose write past
 * itself comes back as a recorded object.__setattr__.  owner, arg
 * borrowed. */
int
ags_effect_setattr(ags_interp *it, ags_value *owner, PyObject *name,
                   PyObject *arg, PyObject **hook)
{
    PyObject *out = ags_call_builder(it, AGS_BOP_EFFECT_SETATTR, "(OOOO)",
                                     owner->obj, owner->source, name, arg);

    *hook = NULL;
    if (out == NULL) {
        return ags_take_break(it);
    }
    if (out == Py_None) {
        Py_DECREF(out);
        return AGS_GO;
    }
    if (!PyFunction_Check(out)) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_SystemError,
                        "builder.effect_setattr: bad answer");
        return AGS_ERROR;
    }
    *hook = out;
    return AGS_GO;
}

/* Is v a list, dict or set of the program that a shadow can stand for? */
int
ags_can_shadow(const ags_value *v)
{
    return v->kind == AGS_VK_CONST && v->source != NULL && shadowable(v->obj);
}

/* Replaces *v (ags_can_shadow) by its shadow, made by the builder on
 * first use.  AGS_GO, a break, or AGS_ERROR. */
int
ags_shadow(ags_interp *it, ags_value *v)
{
    PyObject *shadow;
    ags_value made;
    int rc;

    assert(ags_can_shadow(v));
    rc = ags_shadowed(it, v->obj, &made);
    if (rc < 0) {
        return AGS_ERROR;
    }
    if (rc == 0) {
        shadow = ags_call_builder(it, AGS_BOP_SHADOW, "(OO)", v->obj,
                                  v->source);
        if (shadow == NULL) {
            return ags_take_break(it);
        }
        if (Py_TYPE(shadow) != Py_TYPE(v->obj)) {
            Py_DECREF(shadow);
            PyErr_SetString(PyExc_TypeError,
                            "builder.shadow must return a container of "
                            "the original's type");
            return AGS_ERROR;
        }
        if (set_entry(it, v->obj, shadow) < 0 || ags_own(it, shadow) < 0) {
            Py_DECREF(shadow);
            return AGS_ERROR;
        }
        made = ags_value_make(ags_container_kind(shadow), shadow, NULL);
    }
    ags_value_clear(v);
    *v = made;
    return AGS_GO;
}
