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
 * The original is never changed during capture.  Only exact lists and
 * dicts are shadowed (a subclass may override what a method does).
 */
#include "interp.h"

/* 1 if `obj` has a shadow (*out set to its value), 0 if not, -1 on
 * error. */
int
ags_shadowed(ags_interp *it, PyObject *obj, ags_value *out)
{
    PyObject *id, *shadow;

    if (it->shadows == NULL || PyDict_GET_SIZE(it->shadows) == 0
        || !(PyList_CheckExact(obj) || PyDict_CheckExact(obj))) {
        return 0;
    }
    id = PyLong_FromVoidPtr(obj);
    if (id == NULL) {
        return -1;
    }
    shadow = PyDict_GetItemWithError(it->shadows, id);
    Py_DECREF(id);
    if (shadow == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    *out = ags_value_make(PyList_CheckExact(shadow) ? AGS_VK_LIST
                                                    : AGS_VK_DICT,
                          Py_NewRef(shadow), NULL);
    return 1;
}

/* Does calling method `name` of a list or dict change it?  Only those
 * make a shadow: a method that only reads is answered from the original,
 * guarded on what it read (interp_call.c, agspeed/_stdlib.py).  The names
 * are kept as two frozensets, made on first use. */
int
ags_is_mutator(PyObject *container, PyObject *name)
{
    static PyObject *list_mutators, *dict_mutators;
    PyObject *names;

    if (list_mutators == NULL) {
        PyObject *l = Py_BuildValue(
            "(sssssssssss)", "append", "extend", "insert", "pop", "remove",
            "clear", "sort", "reverse", "__setitem__", "__delitem__",
            "__iadd__");
        PyObject *d = Py_BuildValue(
            "(ssssssss)", "pop", "popitem", "setdefault", "update", "clear",
            "__setitem__", "__delitem__", "__ior__");

        list_mutators = l ? PyFrozenSet_New(l) : NULL;
        dict_mutators = d ? PyFrozenSet_New(d) : NULL;
        Py_XDECREF(l);
        Py_XDECREF(d);
        if (list_mutators == NULL || dict_mutators == NULL) {
            Py_CLEAR(list_mutators);
            Py_CLEAR(dict_mutators);
            return -1;
        }
    }
    names = PyList_CheckExact(container) ? list_mutators : dict_mutators;
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

/* Is v a list or dict of the program that a shadow can stand for? */
int
ags_can_shadow(const ags_value *v)
{
    return v->kind == AGS_VK_CONST && v->source != NULL
           && (PyList_CheckExact(v->obj) || PyDict_CheckExact(v->obj));
}

/* Replaces *v (ags_can_shadow) by its shadow, made by the builder on
 * first use.  AGS_GO, a break, or AGS_ERROR. */
int
ags_shadow(ags_interp *it, ags_value *v)
{
    PyObject *shadow, *id;
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
        id = PyLong_FromVoidPtr(v->obj);
        if (id == NULL || PyDict_SetItem(it->shadows, id, shadow) < 0
            || ags_own(it, shadow) < 0) {
            Py_XDECREF(id);
            Py_DECREF(shadow);
            return AGS_ERROR;
        }
        Py_DECREF(id);
        made = ags_value_make(PyList_CheckExact(shadow) ? AGS_VK_LIST
                                                        : AGS_VK_DICT,
                              shadow, NULL);
    }
    ags_value_clear(v);
    *v = made;
    return AGS_GO;
}
