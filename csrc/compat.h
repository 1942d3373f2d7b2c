/* compat.h: every difference between the CPython versions agspeed supports.
 *
 * This is the only header that reads PY_VERSION_HEX.  The rest of the C core
 * is written against the names defined here, so a new CPython version is
 * reviewed in one place: add its branch below after checking the frame
 * layout (Include/internal/pycore_frame.h), the code-extra API and the
 * eval-frame API of that version.  An unreviewed version fails the build.
 *
 * What differs, and the name the rest of the core uses for it:
 *
 *   AGS_FRAME_CODE(f)         the code object of an interpreter frame, or
 *                             NULL when the frame runs something else
 *                             (3.13 frames hold `f_executable`, which may be
 *                             None for shim frames).
 *   AGS_FRAME_SET_CODE(f, co) make a frame run `co` from its code unit `i`
 *   AGS_FRAME_FUNC(f)         the function object a frame runs (3.11 names
 *                             the field f_func, later versions f_funcobj).
 *   AGS_FRAME_JUMP(f, co, i)  (3.11/3.12 keep the unit *before* the next
 *                             one in prev_instr, 3.13 the next one in
 *                             instr_ptr).  Internal fields: frame.c only.
 *   ags_compat_extra_index()  reserve a co_extra slot (renamed to
 *                             PyUnstable_* in 3.12).
 *   ags_compat_get_extra()    read / write a co_extra slot.
 *   ags_compat_set_extra()
 *   AGS_MOD_SLOTS_EXTRA       module-def slots that only newer versions know.
 *   ags_compat_take_exc()     take / put back the raised exception as one
 *   ags_compat_put_exc()      object (PyErr_Fetch is deprecated in 3.12).
 *
 * The opcodes of each version (numbers, jump lists, the interpreter's
 * handler rows) are in csrc/opcodes_3XX.h, selected by csrc/bytecode.h on
 * the AGS_PY3XX names defined here.
 *
 * Only csrc/frame.c and csrc/opcodes.c may include CPython's internal
 * headers (the frame layout; the inline-cache table).
 */
#ifndef AGS_COMPAT_H
#define AGS_COMPAT_H

#include <Python.h>

#if PY_VERSION_HEX < 0x030B0000
#  error "agspeed needs CPython 3.11 or newer (the frame-evaluation API \
it hooks changed in 3.11)."
#elif PY_VERSION_HEX < 0x030C0000
#  define AGS_PY311 1
#elif PY_VERSION_HEX < 0x030D0000
#  define AGS_PY312 1
#elif PY_VERSION_HEX < 0x030E0000
#  define AGS_PY313 1
#else
#  error "agspeed has not been reviewed for this CPython version: check \
csrc/compat.h and csrc/frame.c against its Include/internal/pycore_frame.h \
before adding it."
#endif

#ifdef Py_GIL_DISABLED
#  error "agspeed does not support free-threaded CPython builds yet: its \
per-code caches rely on the GIL."
#endif

/* Frame access. `f` is a struct _PyInterpreterFrame *. */
#if defined(AGS_PY311)
#  define AGS_FRAME_FUNC(f) ((PyObject *)(f)->f_func)
#else
#  define AGS_FRAME_FUNC(f) ((f)->f_funcobj)
#endif
#if defined(AGS_PY311) || defined(AGS_PY312)
#  define AGS_FRAME_CODE(f) ((f)->f_code)
#  define AGS_FRAME_SET_CODE(f, co) ((f)->f_code = (co))
#  define AGS_FRAME_JUMP(f, co, i) \
    ((f)->prev_instr = _PyCode_CODE(co) + (i) - 1)
#else
#  define AGS_FRAME_CODE(f) \
    (PyCode_Check((f)->f_executable) ? (PyCodeObject *)(f)->f_executable \
                                     : (PyCodeObject *)NULL)
#  define AGS_FRAME_SET_CODE(f, co) ((f)->f_executable = (PyObject *)(co))
#  define AGS_FRAME_JUMP(f, co, i) ((f)->instr_ptr = _PyCode_CODE(co) + (i))
#endif

/* Code-extra slots. */
static inline Py_ssize_t
ags_compat_extra_index(freefunc free_fn)
{
#ifdef AGS_PY311
    return _PyEval_RequestCodeExtraIndex(free_fn);
#else
    return PyUnstable_Eval_RequestCodeExtraIndex(free_fn);
#endif
}

static inline int
ags_compat_get_extra(PyObject *code, Py_ssize_t index, void **extra)
{
#ifdef AGS_PY311
    return _PyCode_GetExtra(code, index, extra);
#else
    return PyUnstable_Code_GetExtra(code, index, extra);
#endif
}

static inline int
ags_compat_set_extra(PyObject *code, Py_ssize_t index, void *extra)
{
#ifdef AGS_PY311
    return _PyCode_SetExtra(code, index, extra);
#else
    return PyUnstable_Code_SetExtra(code, index, extra);
#endif
}

/* New reference: the raised exception, normalized; clears it. */
static inline PyObject *
ags_compat_take_exc(void)
{
#ifdef AGS_PY311
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) {
        PyException_SetTraceback(value, tb);
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#else
    return PyErr_GetRaisedException();
#endif
}

/* Raises `exc` again (stolen). */
static inline void
ags_compat_put_exc(PyObject *exc)
{
#ifdef AGS_PY311
    PyErr_Restore(Py_NewRef(Py_TYPE(exc)), exc,
                  PyException_GetTraceback(exc));
#else
    PyErr_SetRaisedException(exc);
#endif
}

/* A dict's version tag: CPython gives every dict a new one on each change
 * (insert, update, delete, clear) on 3.11 to 3.13.  3.12 deprecated the
 * field for extensions (it keeps watcher bits in its low byte) but still
 * maintains it, so comparing two readings of one live dict says whether it
 * changed in between. */
static inline uint64_t
ags_compat_dict_version(PyObject *dict)
{
#if defined(__GNUC__)
#  pragma GCC diagnostic push
#  pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    return ((PyDictObject *)dict)->ma_version_tag;
#if defined(__GNUC__)
#  pragma GCC diagnostic pop
#endif
}

/* Borrowed: the object `ref` (a weak reference) refers to, or NULL if it
 * is dead.  The caller must not run code that could drop the last other
 * reference while it uses the result. */
static inline PyObject *
ags_compat_weak_target(PyObject *ref)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *held = NULL;
    if (PyWeakref_GetRef(ref, &held) != 1) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(held);   /* still referenced by whoever owned it before */
    return held;
#else
    PyObject *held = PyWeakref_GetObject(ref);
    return held == Py_None ? NULL : held;
#endif
}

/* Dict and type watchers (3.12+): a callback on every change of a watched
 * dict or type.  3.11 has none; callers fall back on version tags. */
#ifndef AGS_PY311
#  define AGS_HAVE_WATCHERS 1
#endif

/* The frame hook and the code caches live in process-wide state (the
 * eval-frame function has no module argument), so the module refuses to be
 * loaded into more than one interpreter.  3.11 has no slot to say so and
 * relies on the check in module.c. */
#ifdef AGS_PY311
#  define AGS_MOD_SLOTS_EXTRA
#else
#  define AGS_MOD_SLOTS_EXTRA \
    {Py_mod_multiple_interpreters, \
     Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif

#endif /* AGS_COMPAT_H */
