/* ctxstack.c: each thread's stack of capture contexts.
 *
 * Each push makes a slot {token, ctx}.  Tokens come from one counter for
 * all threads (bumped under the GIL) and are never reused, so a token
 * names one push, on one thread, forever.  Pushes go on top and removals
 * keep the order, so each thread's stack is strictly increasing in token
 * from bottom to top.  Slots own their context; `ags_tls.ctx` is a borrowed
 * copy of the top one's (NULL when the stack is empty): the one word
 * ags_eval (hook.c) reads per frame.
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
 *      (ags_ctx_exit) pops its own slot and every slot above it: those
 *      were pushed during the call by Scopes still open (suspended
 *      generators).  A call leaves the stack exactly as it found it.
 *   3. A Scope's exit (ags_ctx_leave, also run when an entered Scope is
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
#include "agspeed.h"
#include <string.h>

/* The state of this thread (agspeed.h: ags_thread_state). */
_Thread_local ags_thread_state ags_tls;

static uint64_t last_token;     /* 0 is never a token: "nothing pushed" */

/* This thread's state.  Out of line on purpose: in a shared object each
 * thread-local address is a call into the dynamic linker's TLS helper,
 * and the compiler, which takes `&tls` for a constant, asks again at
 * nearly every use of it instead of keeping it in a register; a pointer
 * returned by a call it keeps.  One call per enter or exit. */
static Py_NO_INLINE ags_thread_state *
this_thread(void)
{
    return &ags_tls;
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
        ags_hook_release();
    }
    return ctx;
}

int
ags_ctx_enter(PyObject *ctx, ags_ctx_saved *saved)
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
        ags_hook_acquire();
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
ags_ctx_exit(ags_ctx_saved *saved)
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
ags_ctx_leave(ags_ctx_saved *saved)
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
ags_ctx_current(void)
{
    return ags_tls.ctx;
}

