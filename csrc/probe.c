/* probe.c: a minimal foreign PEP 523 user, for tests.
 *
 * Tools other than agspeed install evaluation functions too (debuggers,
 * profilers, torch._dynamo).  agspeed must pass the frames it does not take
 * to such a function and restore it when it removes its own.  The probe is
 * the smallest such tool: it counts the frames it evaluates and forwards
 * them to whatever was installed before it.  Tests install it, run
 * optimized code, and check that the probe still saw every frame and is
 * the evaluation function again afterwards.
 */
#include "agspeed.h"

static _PyFrameEvalFunction probe_prev;
static int probe_installed;
static unsigned long long probe_frames;

static PyObject *
probe_eval(PyThreadState *ts, struct _PyInterpreterFrame *frame,
           int throwflag)
{
    probe_frames++;
    if (probe_prev != NULL) {
        return probe_prev(ts, frame, throwflag);
    }
    return _PyEval_EvalFrameDefault(ts, frame, throwflag);
}

PyObject *
ags_probe_install(PyObject *module, PyObject *unused)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    _PyFrameEvalFunction current;

    (void)module;
    (void)unused;
    if (probe_installed) {
        PyErr_SetString(PyExc_RuntimeError, "the probe is already installed");
        return NULL;
    }
    current = _PyInterpreterState_GetEvalFrameFunc(interp);
    probe_prev = (current == _PyEval_EvalFrameDefault) ? NULL : current;
    probe_frames = 0;
    probe_installed = 1;
    _PyInterpreterState_SetEvalFrameFunc(interp, probe_eval);
    Py_RETURN_NONE;
}

PyObject *
ags_probe_remove(PyObject *module, PyObject *unused)
{
    PyInterpreterState *interp = PyInterpreterState_Get();

    (void)module;
    (void)unused;
    if (!probe_installed) {
        PyErr_SetString(PyExc_RuntimeError, "the probe is not installed");
        return NULL;
    }
    if (_PyInterpreterState_GetEvalFrameFunc(interp) != probe_eval) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the probe is installed but another evaluation "
                        "function replaced it");
        return NULL;
    }
    _PyInterpreterState_SetEvalFrameFunc(
        interp, probe_prev != NULL ? probe_prev : _PyEval_EvalFrameDefault);
    probe_installed = 0;
    probe_prev = NULL;
    Py_RETURN_NONE;
}

PyObject *
ags_probe_count(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromUnsignedLongLong(probe_frames);
}

PyObject *
ags_probe_owner(PyObject *module, PyObject *unused)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interp);
    const char *owner = "other";

    (void)module;
    (void)unused;
    if (current == _PyEval_EvalFrameDefault) {
        owner = "default";
    }
    else if (ags_hook_is_installed()) {
        owner = "agspeed";
    }
    else if (current == probe_eval) {
        owner = "probe";
    }
    return PyUnicode_FromString(owner);
}
