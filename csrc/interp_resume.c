/* interp_resume.c: the root frame's state where capture stops, for the
 * code that resumes it (agspeed/_resume.py).
 *
 * A capture asked to stop at a root instruction (builder.stop_at, a byte
 * offset) halts before running it and hands back the abstract stack and
 * locals there.  Each value crosses as (kind, payload, source): kind one of
 * ags_kind_names, payload what the value holds (a graph node for TENSOR,
 * the object for CONST, LAZY and the containers, the name for METHOD,
 * (tuple, position, followed, program's) for ITER, with followed the
 * list, dict or set it iterates as the capture sees it now (or None) and
 * program's whether that began as an object of the program, None for
 * NULL_MARK and UNBOUND), source the value's source or None.  Python
 * decides how the generated code gets each one back.
 */
#include "interp.h"

/* New reference: (kind, payload, source). */
static PyObject *
export_value(ags_interp *it, const ags_value *v)
{
    PyObject *payload;

    if (v->kind == AGS_VK_ITER) {
        /* what the loop follows, as the capture sees it now */
        PyObject *view = v->of != NULL ? ags_live_view(it, v->of) : Py_None;

        if (view == NULL) {
            return NULL;
        }
        payload = Py_BuildValue("(OnOO)", v->obj ? v->obj : Py_None, v->pos,
                                view, v->of_program ? Py_True : Py_False);
    }
    else {
        payload = Py_NewRef(v->obj ? v->obj : Py_None);
    }
    if (payload == NULL) {
        return NULL;
    }
    /* a box holding a generator's capsule goes no further (interp_gen.c) */
    return Py_BuildValue("(sNO)",
                         ags_kind_names[v->obj != NULL
                                                && ags_is_gen_box(it, v->obj)
                                            ? AGS_VK_GENERATOR
                                            : v->kind],
                         payload, v->source ? v->source : Py_None);
}

static PyObject *
export_values(ags_interp *it, const ags_value *values, int n)
{
    PyObject *list = PyList_New(n);

    for (int i = 0; list != NULL && i < n; i++) {
        PyObject *item = export_value(it, &values[i]);

        if (item == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

PyObject *
ags_frame_state(ags_interp *it, const ags_frame *f)
{
    int cells = 0;

    for (int i = 0; f->cells != NULL && i < f->nlocals; i++) {
        cells |= f->cells[i] != NULL;
    }
    /* the objects the capture made, which the stopped capture leaves to
     * the caller (a loop's iterator: what it has left is handed on) */
    return Py_BuildValue("{s:N,s:N,s:O,s:N}", "stack",
                         export_values(it, f->stack, f->sp), "locals",
                         export_values(it, f->locals, f->nlocals), "cells",
                         cells ? Py_True : Py_False, "owned",
                         PyFrozenSet_New(it->owned));
}

/* builder.stop_at, when it has one: the root offset to stop before. */
int
ags_stop_at(PyObject *builder, int *out)
{
    PyObject *v;
    long at;

    v = PyObject_GetAttrString(builder, "stop_at");
    if (v == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    if (v == Py_None) {
        Py_XDECREF(v);
        return 0;
    }
    at = PyLong_AsLong(v);
    Py_DECREF(v);
    if (at == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int)at;
    return 0;
}
