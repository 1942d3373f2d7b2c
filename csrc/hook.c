/* hook.c: the PEP 523 evaluation function and the capture context.
 *
 * Layout.  Each thread has a stack of capture contexts in thread-local
 * storage, and the top one is current: none (NULL) outside every optimized
 * call, Py_None inside agspeed.disable(), or the callable that decides
 * what to do with each new frame.  Regions and Scopes (region.c) push a
 * slot on entry and remove it on exit; exits need not come in LIFO order
 * ("The context stack", below, gives the rules).
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

/* Slots a thread's context stack holds without a heap allocation: enough
 * for an optimized call inside another, a few disable() blocks and some
 * recursion through a Region. */
#define AGS_CTX_INLINE 8

/* One push on a thread's context stack. */
typedef struct {
    uint64_t token;     /* names the push: see "The context stack" */
    PyObject *ctx;      /* strong: Py_None or a callable */
} ags_ctx_slot;

typedef struct {
    PyObject *ctx;      /* borrowed from the top slot; NULL: outside,
                           Py_None: disabled */
    int busy;           /* >0 while the runtime decides for a frame */
    Py_ssize_t depth;   /* slots in use */
    Py_ssize_t capacity;    /* of `heap`; meaningless while it is NULL */
    ags_ctx_slot *heap;     /* NULL: the slots are `inline_slots` */
    ags_ctx_slot inline_slots[AGS_CTX_INLINE];
} ags_thread_state;

static _Thread_local ags_thread_state tls;

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

static void
hook_acquire(void)
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

static void
hook_release(void)
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

/* ------------------------------------------------------------------ */
/* The context stack.
 *
 * Each push makes a slot {token, ctx}.  Tokens come from one counter for
 * all threads (bumped under the GIL) and are never reused, so a token
 * names one push, on one thread, forever.  Pushes go on top and removals
 * keep the order, so each thread's stack is strictly increasing in token
 * from bottom to top.  Slots own their context; `tls.ctx` is a borrowed
 * copy of the top one's (NULL when the stack is empty): the one word
 * ags_eval reads per frame.
 *
 * Exits do not always come in LIFO order.  A generator can enter a Scope
 * (`with agspeed.disable():`) inside an optimized call, be suspended, and
 * leave the block after that call has returned, inside another call, or
 * on another thread.  Restoring "what was current when I entered", as an
 * earlier version did, then reinstalls a context whose call has finished.
 * The rules instead:
 *
 *   1. The current context is that of the most recent push whose slot is
 *      still on the stack.  Only rules 2 and 3 remove a slot and nothing
 *      puts one back, so a context whose slot is gone is never current
 *      again.
 *   2. A Region's call is strictly nested on the C stack, so its exit
 *      (ags_hook_exit) pops its own slot and every slot above it: those
 *      were pushed during the call by Scopes still open (suspended
 *      generators).  A call leaves the stack exactly as it found it.
 *   3. A Scope's exit (ags_hook_leave, also run when an entered Scope is
 *      destroyed) removes its own slot wherever it is, and nothing else.
 *      If the slot is not on this thread's stack -- a Region it was
 *      entered in has returned, or it was entered on another thread -- it
 *      changes no context at all (a slot on another thread's stack stays
 *      there until a Region below it returns: no thread can reach
 *      another's thread-local stack).
 *
 * So no exit restores a saved context: it takes its own slot away and
 * whatever is below shows through.  Rejected: "restore the saved context
 * only if my push is still on top, else do nothing".  A Scope left while
 * a newer Scope is still open would leave its own context saved in the
 * newer one, to reappear when that one leaves.
 *
 * The hook is counted per slot: a slot whose context is not Py_None holds
 * one count of `n_hooked` from its push to its removal, whoever removes it.
 *
 * Storage: AGS_CTX_INLINE slots live in the thread-local block; a deeper
 * stack moves to the heap, freed when the stack is empty again.  A thread
 * that ends with slots still pushed (a Scope entered and never left on
 * it) leaks them and their hook counts, as C11 thread-locals have no
 * destructor; the interpreter is not harmed, only kept hooked.
 */

static uint64_t last_token;     /* 0 is never a token: "nothing pushed" */

/* This thread's state.  Out of line on purpose: in a shared object each
 * thread-local address is a call into the dynamic linker's TLS helper,
 * and the compiler, which takes `&tls` for a constant, asks again at
 * nearly every use of it instead of keeping it in a register; a pointer
 * returned by a call it keeps.  One call per enter or exit. */
static Py_NO_INLINE ags_thread_state *
this_thread(void)
{
    return &tls;
}

static inline ags_ctx_slot *
stack_slots(ags_thread_state *me)
{
    return me->heap != NULL ? me->heap : me->inline_slots;
}

/* Moves the slots to a heap block twice as large.  Returns 0, or -1 with
 * MemoryError set and the stack unchanged. */
static int
stack_grow(ags_thread_state *me)
{
    Py_ssize_t capacity = me->heap != NULL ? me->capacity : AGS_CTX_INLINE;
    size_t size;
    ags_ctx_slot *bigger;

    if (capacity > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(ags_ctx_slot)) {
        PyErr_NoMemory();
        return -1;
    }
    capacity *= 2;
    size = (size_t)capacity * sizeof(ags_ctx_slot);
    if (me->heap != NULL) {
        bigger = PyMem_Realloc(me->heap, size);
    }
    else {
        bigger = PyMem_Malloc(size);
        if (bigger != NULL) {
            memcpy(bigger, me->inline_slots, sizeof(me->inline_slots));
        }
    }
    if (bigger == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    me->heap = bigger;
    me->capacity = capacity;
    return 0;
}

/* The index of the slot that `token` pushed on this thread's stack, or -1
 * if it is not there (0, the token of nothing, is never there).  Scans
 * from the top and stops below the first smaller token, so finding the
 * top slot, or learning that a just-popped one is gone, costs one step. */
static Py_ssize_t
stack_find(ags_thread_state *me, uint64_t token)
{
    ags_ctx_slot *slots = stack_slots(me);
    Py_ssize_t i;

    for (i = me->depth - 1; i >= 0 && slots[i].token >= token; i--) {
        if (slots[i].token == token) {
            return i;
        }
    }
    return -1;
}

/* Removes slot `i`, makes the new top current and gives back the slot's
 * hook count.  Returns the slot's context, a reference for the caller to
 * release only after this returns: releasing it may run any Python code,
 * even code that pushes and pops, and the stack is consistent by then. */
static inline PyObject *
stack_remove(ags_thread_state *me, Py_ssize_t i)
{
    ags_ctx_slot *slots = stack_slots(me);
    PyObject *ctx = slots[i].ctx;
    Py_ssize_t depth = me->depth - 1;

    assert(i >= 0 && i <= depth);
    if (i < depth) {
        memmove(&slots[i], &slots[i + 1],
                (size_t)(depth - i) * sizeof(ags_ctx_slot));
    }
    me->depth = depth;
    me->ctx = depth > 0 ? slots[depth - 1].ctx : NULL;
    if (depth == 0 && me->heap != NULL) {
        me->heap = NULL;
        me->capacity = 0;
        PyMem_Free(slots);
    }
    if (ctx != Py_None) {
        hook_release();
    }
    return ctx;
}

int
ags_hook_enter(PyObject *ctx, ags_ctx_saved *saved)
{
    ags_thread_state *me = this_thread();
    Py_ssize_t depth = me->depth;
    ags_ctx_slot *slot;

    if (depth == (me->heap != NULL ? me->capacity : AGS_CTX_INLINE)
        && stack_grow(me) < 0) {
        saved->token = 0;
        return -1;
    }
    slot = &stack_slots(me)[depth];
    slot->token = ++last_token;
    slot->ctx = Py_NewRef(ctx);
    me->depth = depth + 1;
    me->ctx = ctx;
    saved->token = slot->token;
    if (ctx != Py_None) {
        hook_acquire();
    }
    return 0;
}

/* Rule 2 when slots are above ours (suspended generators' Scopes): pops
 * from the top until our own slot is gone.  Only our caller holds our
 * token and the Regions below ours are waiting for our return, so nothing
 * else can take our slot away, even while a popped context is released. */
static void
stack_unwind(ags_thread_state *me, uint64_t token)
{
    assert(stack_find(me, token) >= 0);
    while (stack_find(me, token) >= 0) {
        Py_DECREF(stack_remove(me, me->depth - 1));
    }
}

void
ags_hook_exit(ags_ctx_saved *saved)
{
    ags_thread_state *me = this_thread();
    uint64_t token = saved->token;
    Py_ssize_t top = me->depth - 1;

    saved->token = 0;
    if (top >= 0 && stack_slots(me)[top].token == token) {
        Py_DECREF(stack_remove(me, top));   /* the usual case */
        return;
    }
    stack_unwind(me, token);
}

void
ags_hook_leave(ags_ctx_saved *saved)
{
    ags_thread_state *me = this_thread();
    Py_ssize_t i = stack_find(me, saved->token);

    /* Rule 3: our own slot, wherever it is, or nothing. */
    saved->token = 0;
    if (i >= 0) {
        Py_DECREF(stack_remove(me, i));
    }
}

PyObject *
ags_hook_current(void)
{
    return tls.ctx;
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
 * up to return the value, 1 if the frame cannot be made to return (it then
 * runs its own bytecode), or -1 with an exception set.  Steals `inputs`. */
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
        return -1;
    }
    ags_frame_return(frame, retcode, result);
    return 0;
}

static PyObject *
ags_eval(PyThreadState *ts, struct _PyInterpreterFrame *frame, int throwflag)
{
    /* One thread-local address computation per frame: in a shared object
     * each access may cost a call into the dynamic linker's TLS helper. */
    ags_thread_state *me = &tls;
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
    if (state != NULL && (state->flags & AGS_CODE_SKIP)) {
        ags_stats.frames_skipped++;
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
    /* SKIP and RUN_EAGER run the frame's own bytecode; so does a CALL
     * whose frame could not be made to return (rc 1).  A CALL that set up
     * the frame (rc 0) runs only its RETURN_VALUE. */
    Py_DECREF(entry);
    return eval_untouched(ts, frame, 0);
}
