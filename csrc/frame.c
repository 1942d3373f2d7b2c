/* frame.c: reading CPython's interpreter frames.
 *
 * This is the only file that includes CPython's internal headers
 * (Include/internal/pycore_frame.h, under Py_BUILD_CORE).  Everything it
 * reads is named in compat.h, per version; the rest of the core sees a
 * struct _PyInterpreterFrame only as an opaque pointer.
 *
 * What a frame looks like when the PEP 523 hook receives it (3.11-3.13):
 * the arguments are in localsplus[0..argcount); every other local, cell and
 * free slot is NULL, and the value stack is empty.  An argument that is
 * also a cell variable still holds the raw value: MAKE_CELL and
 * COPY_FREE_VARS have not run yet, so the frame is "incomplete" and must
 * not be turned into a frame object.  Reading the bound slots by index is
 * therefore safe and never runs code of the frame.
 */
#include "agspeed.h"

#define Py_BUILD_CORE 1
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE

PyCodeObject *
ags_frame_code(struct _PyInterpreterFrame *frame)
{
    return AGS_FRAME_CODE(frame);
}

PyObject *
ags_frame_locals(struct _PyInterpreterFrame *frame)
{
    PyCodeObject *code = AGS_FRAME_CODE(frame);
    PyObject *names;
    PyObject *dict = PyDict_New();

    if (dict == NULL || code == NULL) {
        return dict;
    }
    names = code->co_localsplusnames;
    for (int i = 0; i < code->co_nlocalsplus; i++) {
        PyObject *value = frame->localsplus[i];
        if (value == NULL) {
            continue;
        }
        if (PyDict_SetItem(dict, PyTuple_GET_ITEM(names, i), value) < 0) {
            Py_DECREF(dict);
            return NULL;
        }
    }
    return dict;
}
