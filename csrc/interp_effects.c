/* interp_effects.c: lists and dicts of the program, changed during capture.
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
