/* hook.c: the PEP 523 evaluation function, its installation and removal.
 *
 * Layout.  Each thread has a stack of capture contexts in thread-local
 * storage (ctxstack.c), and the top one is current: none (NULL) outside
 * every optimized call, Py_None inside agspeed.disable(), or the callable
 * that decides what to do with each new frame.  This file reads the
 * current context once per frame and owns what happens to the frame.
 *
 * The evaluation function is per interpreter, not per thread, so it is
 * installed only while at least one thread is inside an optimized call
 * (`n_hooked` counts such entries over all threads) and removed when the
 * last one leaves: outside optimized calls the program runs CPython's own
 * evaluation loop with nothing of ours in the way.  While installed, frames
 * of threads that are outside any context cost one thread-local read.
 *
 * Installing remembers the evaluation function that was there (another
 * PEP 523 user: a debugger, torch._dynamo) and every frame we do not take
 * is passed to it, so it keeps working under us; removing restores it.
 * If someone replaced our function in between, we leave theirs alone.
 *
 * Per frame on a thread inside a context, in order:
 *   1. pass through untouched if the runtime is busy on this thread (its
 *      own decision code is running: no recursion into it), if the code
 *      is a generator or coroutine, a module or class body, or if the code
 *      is marked SKIP;
 *   2. look up the code's cache (codecache.c); on a hit run the entry;
 *   3. on a miss, ask the context: `ctx(code, f_locals, f_globals,
 *      f_builtins)` returns a
 *      CacheEntry, which is stored (or marks the code SKIP) and run.
 *   4. running an entry: SKIP and RUN_EAGER evaluate the frame as it is;
 *      CALL calls the entry's compiled callable and makes the frame return
 *      its result without running the frame's bytecode (frame.c says how).
 *
 * Errors.  A frame handed to the evaluation function has not started.  If
 * the decision raises, the frame must still be cleared and popped, and who
 * does that changed between versions (the caller in 3.11, the evaluator in
 * 3.12+).  Instead of copying CPython's private clearing code we ask
 * CPython's own evaluator to "throw" the pending exception into the
 * unstarted frame, as generator.throw() does into an unstarted generator:
 * no handler covers the frame's first instruction, so CPython unwinds and
 * clears the frame itself, on every version, and the exception propagates
 * to the caller exactly as if the function had raised it on entry.
 *
 * Rejected designs: a thread-local eval function (CPython has none);
 * installing once and forever (it would slow every thread of the program,
 * and 3.12+ stop inlining Python-to-Python calls while any eval function
 * is set); returning NULL on error (leaks or double-frees the frame
 * depending on the version).
 */
#include "agspeed.h"

ags_counters ags_stats;
int ags_hook_enabled = 1;

/* The evaluation function found when we installed ours (NULL: CPython's
 * default) and how many context entries, over all threads, need ours. */
static _PyFrameEvalFunction prev_eval;
static Py_ssize_t n_hooked;

static PyObject *ags_eval(PyThreadState *, struct _PyInterpreterFrame *,
                          int);

/* Flags of code never hooked: generators and coroutines (their frames are
 * resumed, not started, and a capture cannot suspend).  Code without
 * CO_OPTIMIZED (module and class bodies, exec'd source) is not hooked
 * either, by a separate test in ags_eval: it runs once, nothing to cache. */
#define AGS_UNHOOKED_FLAGS \
    (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE)

static inline PyObject *
eval_untouched(PyThreadState *ts, struct _PyInterpreterFrame *frame,
               int throwflag)
{
    if (prev_eval != NULL) {
        return prev_eval(ts, frame, throwflag);
    }
    return _PyEval_EvalFrameDefault(ts, frame, throwflag);
}

void
ags_hook_acquire(void)
{
    PyInterpreterState *interp;
    _PyFrameEvalFunction current;

    if (n_hooked++ > 0) {
        return;
    }
    interp = PyInterpreterState_Get();
    current = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (current == ags_eval) {
        /* Left installed by someone who restored us after we had gone. */
        return;
    }
    prev_eval = (current == _PyEval_EvalFrameDefault) ? NULL : current;
    _PyInterpreterState_SetEvalFrameFunc(interp, ags_eval);
    ags_stats.hook_installs++;
}

void
ags_hook_release(void)
{
    PyInterpreterState *interp;

    assert(n_hooked > 0);
    if (--n_hooked > 0) {
        return;
    }
    interp = PyInterpreterState_Get();
    if (_PyInterpreterState_GetEvalFrameFunc(interp) == ags_eval) {
        _PyInterpreterState_SetEvalFrameFunc(
            interp, prev_eval != NULL ? prev_eval : _PyEval_EvalFrameDefault);
        prev_eval = NULL;
    }
    else {
        /* Someone installed theirs over ours; it may chain to ours and
         * restore it later, so `prev_eval` stays for that case. */
        ags_stats.hook_displaced++;
    }
}

int
ags_hook_is_installed(void)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    return _PyInterpreterState_GetEvalFrameFunc(interp) == ags_eval;
}

/* Asks the context what to do with a frame of `code`.  Returns a new
 * reference to a CacheEntry, or NULL with an exception set. */
static ags_entry *
ask_context(PyObject *ctx, PyCodeObject *code,
            struct _PyInterpreterFrame *frame, PyObject **f_locals)
{
    PyObject *args[4];
    PyObject *decision;

    if (*f_locals == NULL) {
        *f_locals = ags_frame_locals(frame);
        if (*f_locals == NULL) {
            return NULL;
        }
    }
    args[0] = (PyObject *)code;
    args[1] = *f_locals;
    args[2] = ags_frame_globals(frame);
    args[3] = ags_frame_builtins(frame);
    decision = PyObject_Vectorcall(ctx, args, 4, NULL);
    if (decision == NULL) {
        return NULL;
    }
    if (!Py_IS_TYPE(decision, ags_entry_type)) {
        PyErr_Format(PyExc_TypeError,
                     "agspeed capture context %R returned %s for %R; "
                     "expected an agspeed._C.CacheEntry",
                     ctx, Py_TYPE(decision)->tp_name, code);
        Py_DECREF(decision);
        return NULL;
    }
    return (ags_entry *)decision;
}

/* Gives a guarded entry the signature of the frame it was made for, so
 * that lookups find it by that signature.  0, or -1 with an exception. */
static int
sign_entry(ags_entry *entry, PyCodeObject *code,
           struct _PyInterpreterFrame *frame)
{
    ags_sig sig;
    uint64_t hash;
    int rc = ags_sig_compute(code, ags_frame_args(frame), &sig, &hash);

    if (rc == 0) {
        rc = ags_entry_set_signature(entry, &sig, hash);
        ags_sig_release(&sig);
    }
    return rc;
}

/* Finds or makes the decision for a frame.  `state` is the code's cache as
 * the caller found it (NULL: none yet).  Returns a new reference to the
 * entry to run, or NULL with an exception set. */
static ags_entry *
decide(PyObject *ctx, PyCodeObject *code, struct _PyInterpreterFrame *frame,
       ags_code_state *state, PyObject **inputs)
{
    PyObject *f_locals = NULL;
    ags_entry *entry = NULL;
    int found = 0;

    *inputs = NULL;
    if (state != NULL) {
        found = ags_cache_lookup(state, ctx, frame, &f_locals, &entry, inputs);
        if (found < 0) {
            goto error;
        }
    }
    if (found) {
        ags_stats.cache_hits++;
        goto done;
    }
    ags_stats.cache_misses++;
    entry = ask_context(ctx, code, frame, &f_locals);
    if (entry == NULL) {
        goto error;
    }
    /* The context ran Python code: look the state up again rather than
     * trust a pointer taken before it. */
    state = ags_cache_ensure(code);
    if (state == NULL) {
        goto error;
    }
    if (entry->action == AGS_ACTION_SKIP) {
        state->flags |= AGS_CODE_SKIP;
    }
    else if (entry->action == AGS_ACTION_DISABLE) {
        state->flags |= AGS_CODE_DISABLE;
    }
    else if (entry->action == AGS_ACTION_PASS) {
        ;   /* decided for this frame alone */
    }
    else if ((entry->guard != Py_None && !entry->has_signature
              && !entry->unsigned_only && sign_entry(entry, code, frame) < 0)
             || ags_cache_insert(state, entry) < 0) {
        goto error;
    }
done:
    Py_XDECREF(f_locals);
    return entry;
error:
    Py_CLEAR(*inputs);
    Py_XDECREF(entry);
    Py_XDECREF(f_locals);
    return NULL;
}

/* Runs a CALL entry: the frame returns graph(*inputs) when the guard
 * program gathered the inputs, else compiled(f_locals, f_globals,
 * f_builtins), without running its bytecode.  Returns 0 with the frame set
 * up to return the value, 1 if the frame cannot be made to return or the
 * callable raised AssumptionFailed (it then runs its own bytecode), or -1
 * with an exception set.  Steals `inputs`. */
static int
call_compiled(ags_entry *entry, PyCodeObject *code,
              struct _PyInterpreterFrame *frame, PyObject *inputs)
{
    ags_code_state *state = ags_cache_get(code);
    PyCodeObject *retcode;
    PyObject *f_locals, *result;

    if (!ags_frame_can_return(frame)) {
        Py_XDECREF(inputs);
        return 1;
    }
    retcode = ags_cache_return_code(state, code);
    if (retcode == NULL) {
        Py_XDECREF(inputs);
        return -1;
    }
    ags_stats.graph_calls++;
    if (inputs != NULL) {
        result = PyObject_Vectorcall(entry->graph, &PyTuple_GET_ITEM(inputs, 0),
                                     (size_t)PyTuple_GET_SIZE(inputs), NULL);
        Py_DECREF(inputs);
    }
    else {
        f_locals = ags_frame_locals(frame);
        if (f_locals == NULL) {
            return -1;
        }
        PyObject *args[3] = {f_locals, ags_frame_globals(frame),
                             ags_frame_builtins(frame)};
        result = PyObject_Vectorcall(entry->compiled, args, 3, NULL);
        Py_DECREF(f_locals);
    }
    if (result == NULL) {
        if (ags_assumption_failed != NULL
            && PyErr_ExceptionMatches(ags_assumption_failed)) {
            /* nothing of the graph's work was kept: eager runs the frame */
            PyErr_Clear();
            ags_stats.assumption_fallbacks++;
            return 1;
        }
        return -1;
    }
    ags_frame_return(frame, retcode, result);
    return 0;
}

/* Runs a frame of DISABLE code with the runtime off on this thread until it
 * returns, as agspeed.disable() would around the call. */
static PyObject *
eval_disabled(PyThreadState *ts, struct _PyInterpreterFrame *frame)
{
    ags_ctx_saved saved;
    PyObject *result;

    if (ags_ctx_enter(Py_None, &saved) < 0) {
        return eval_untouched(ts, frame, 1);
    }
    result = eval_untouched(ts, frame, 0);
    ags_ctx_exit(&saved);
    return result;
}

PyObject *
ags_hook_call_user(PyObject *fn, PyObject *args)
{
    ags_thread_state *me = &ags_tls;
    int busy = me->busy;
    PyObject *out;

    if (!PyTuple_Check(args)) {
        PyErr_SetString(PyExc_TypeError, "call_user(fn, args: tuple)");
        return NULL;
    }
    me->busy = 0;
    out = PyObject_Call(fn, args, NULL);
    me->busy = busy;
    return out;
}

static PyObject *
ags_eval(PyThreadState *ts, struct _PyInterpreterFrame *frame, int throwflag)
{
    /* One thread-local address computation per frame: in a shared object
     * each access may cost a call into the dynamic linker's TLS helper. */
    ags_thread_state *me = &ags_tls;
    PyObject *ctx = me->ctx;
    PyCodeObject *code;
    ags_code_state *state;
    ags_entry *entry;
    int rc = 1;

    if (ctx == NULL || ctx == Py_None || throwflag) {
        return eval_untouched(ts, frame, throwflag);
    }
    ags_stats.frames_seen++;
    if (me->busy) {
        /* The runtime's own work (guards, capture, compiled graphs): another
         * PEP 523 user (torch._dynamo) must not trace it either. */
        ags_stats.frames_skipped++;
        return _PyEval_EvalFrameDefault(ts, frame, 0);
    }
    code = ags_frame_code(frame);
    if (code == NULL
        || (code->co_flags & AGS_UNHOOKED_FLAGS)
        || !(code->co_flags & CO_OPTIMIZED)) {
        ags_stats.frames_skipped++;
        return eval_untouched(ts, frame, 0);
    }
    state = ags_cache_get(code);
    if (state != NULL && (state->flags & (AGS_CODE_SKIP | AGS_CODE_DISABLE))) {
        ags_stats.frames_skipped++;
        if (state->flags & AGS_CODE_DISABLE) {
            return eval_disabled(ts, frame);
        }
        return eval_untouched(ts, frame, 0);
    }

    Py_INCREF(ctx);
    me->busy++;
    {
        PyObject *inputs = NULL;
        entry = decide(ctx, code, frame, state, &inputs);
        if (entry != NULL && entry->action == AGS_ACTION_CALL) {
            /* The compiled callable is the runtime's own code: frames it
             * starts run untouched. */
            rc = call_compiled(entry, code, frame, inputs);
        }
        else {
            Py_XDECREF(inputs);
        }
    }
    me->busy--;
    Py_DECREF(ctx);

    if (entry == NULL || rc < 0) {
        Py_XDECREF(entry);
        assert(PyErr_Occurred());
        ags_stats.callback_errors++;
        /* Propagate without running: see "Errors" at the top. */
        return eval_untouched(ts, frame, 1);
    }
    if (entry->action == AGS_ACTION_DISABLE) {
        Py_DECREF(entry);
        return eval_disabled(ts, frame);
    }
    /* SKIP and RUN_EAGER run the frame's own bytecode; so does a CALL
     * whose frame could not be made to return (rc 1).  A CALL that set up
     * the frame (rc 0) runs only its RETURN_VALUE. */
    Py_DECREF(entry);
    return eval_untouched(ts, frame, 0);
}
