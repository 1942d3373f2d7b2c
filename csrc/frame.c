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
 * therefore safe and never runs code of the frame; free variables are read
 * from the function's closure cells.
 *
 * Returning a value without running the frame (ags_frame_return).  The
 * frame is given a "return code": a code object with the same locals
 * layout whose bytecode is RESUME; RETURN_VALUE.  The value is pushed on
 * the frame's (empty) value stack and the next instruction set to
 * RETURN_VALUE; CPython's evaluator then returns it and clears and pops the
 * frame itself, exactly as for any return, on every version.  The frame
 * was sized for the original code, so the return code may use no more
 * stack than it (one slot) and must have the same number of local slots.
 */
#include "frame.h"

#define Py_BUILD_CORE 1
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE

PyCodeObject *
ags_frame_code(struct _PyInterpreterFrame *frame)
{
    return AGS_FRAME_CODE(frame);
}

PyObject *
ags_frame_globals(struct _PyInterpreterFrame *frame)
{
    return frame->f_globals;
}

PyObject *
ags_frame_builtins(struct _PyInterpreterFrame *frame)
{
    return frame->f_builtins;
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
        int free = i - (code->co_nlocalsplus - code->co_nfreevars);
        if (value == NULL && free >= 0) {
            /* COPY_FREE_VARS has not run: read the closure's cell. */
            PyObject *func = AGS_FRAME_FUNC(frame);
            PyObject *closure = func && PyFunction_Check(func)
                                    ? PyFunction_GetClosure(func) : NULL;
            if (closure != NULL && free < PyTuple_GET_SIZE(closure)) {
                value = PyCell_GET(PyTuple_GET_ITEM(closure, free));
            }
        }
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

PyObject *const *
ags_frame_args(struct _PyInterpreterFrame *frame)
{
    return frame->localsplus;
}

int
ags_code_nargs(PyCodeObject *code)
{
    return code->co_argcount + code->co_kwonlyargcount
           + !!(code->co_flags & CO_VARARGS) + !!(code->co_flags & CO_VARKEYWORDS);
}

int
ags_frame_can_return(struct _PyInterpreterFrame *frame)
{
    PyCodeObject *code = AGS_FRAME_CODE(frame);

    return code != NULL && code->co_stacksize >= 1
           && frame->stacktop == code->co_nlocalsplus;
}

void
ags_frame_return(struct _PyInterpreterFrame *frame, PyCodeObject *retcode,
                 PyObject *value)
{
    PyCodeObject *code = AGS_FRAME_CODE(frame);

    assert(ags_frame_can_return(frame));
    assert(retcode->co_nlocalsplus == code->co_nlocalsplus);
    /* The function object still holds `code`: dropping the frame's
     * reference cannot free it. */
    AGS_FRAME_SET_CODE(frame, (PyCodeObject *)Py_NewRef(retcode));
    Py_DECREF(code);
    frame->localsplus[frame->stacktop++] = value;
    AGS_FRAME_JUMP(frame, retcode, AGS_RETURN_UNIT);
}
