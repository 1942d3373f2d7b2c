/* agspeed.h: what the C files of agspeed._C share.
 *
 * Subsystems and the file that owns each:
 *
 *   hook.c        the PEP 523 evaluation function, its installation and the
 *                 counters.
 *   ctxstack.c    the thread-local stack of capture contexts.
 *   region.c      Region (a callable that runs its target inside a capture
 *                 context) and Scope (the same as a `with` block).
 *   codecache.c   the per-code-object cache kept in co_extra, and the
 *                 CacheEntry type stored in it.
 *   frame.c       reading CPython's interpreter frames.
 *   opcodes.c     per-opcode facts: inline caches, jump direction.
 *   bytecode.c    decoding bytecode into instructions with jump targets.
 *   interp.c      the symbolic interpreter: bytecode to graph + assumptions.
 *   (frame.c and opcodes.c are the only files that include CPython's
 *   internal headers.)
 *   probe.c       a stand-in for a foreign PEP 523 user, for tests.
 *   module.c      module definition and the functions exposed to Python.
 *   ../guards/signature.c   the 64-bit signature hash (system xxHash).
 *
 * Names: exported symbols are ags_<subsystem>_<verb>, macros AGS_.
 * Ownership is stated above each function whose contract is not obvious.
 */
#ifndef AGS_AGSPEED_H
#define AGS_AGSPEED_H

#include "compat.h"
#include "frame.h"
#include "protocol.h"
#include "bytecode.h"
#include "guards.h"
#include <stdint.h>

/* ------------------------------------------------------------------ */
/* Counters (hook.c).  One table generates the struct, the names shown by
 * agspeed.counters() and the reset. */

#define AGS_COUNTER_LIST(X) \
    X(frames_seen, "frames that started on a thread inside an optimized " \
                   "call") \
    X(frames_skipped, "of those, frames run untouched: skip-marked code, " \
                      "generators and coroutines, frames started while the " \
                      "runtime itself was busy") \
    X(cache_hits, "frames whose code cache held a matching entry") \
    X(arg_check_hits, "of those, hits on the last signed entry found by its " \
                      "argument check, without computing a signature") \
    X(cache_misses, "frames that asked the capture context for a decision") \
    X(graph_calls, "frames answered by running a compiled entry") \
    X(callback_errors, "decisions that raised: the error propagated out of " \
                       "the frame, which did not run") \
    X(assumption_fallbacks, "frames whose graph found a branch it assumed " \
                            "did not go its way: run by their own bytecode") \
    X(hook_installs, "times the evaluation hook was installed") \
    X(hook_displaced, "times the hook was found replaced by another " \
                      "evaluation function when agspeed went to remove it")

typedef struct {
#define AGS_X(name, doc) uint64_t name;
    AGS_COUNTER_LIST(AGS_X)
#undef AGS_X
} ags_counters;

extern ags_counters ags_stats;

/* ------------------------------------------------------------------ */
/* The hook (hook.c). */

/* Turns the whole runtime on or off: off, a Region calls its target with no
 * capture context at all. */
extern int ags_hook_enabled;

/* Install agspeed's evaluation function, or count one more user of it
 * (ctxstack.c: one per pushed context that is not Py_None); release gives
 * that count back and removes the function with the last one. */
void ags_hook_acquire(void);
void ags_hook_release(void);

/* 1 when agspeed's evaluation function is the interpreter's now. */
int ags_hook_is_installed(void);

/* fn(*args) with the hook looking at the frames it starts, as it does at
 * user level, though the runtime is busy on this thread (a CALL entry's
 * compiled code calling back into user code: a graph break's resume
 * function).  args: a tuple.  New reference, or NULL. */
PyObject *ags_hook_call_user(PyObject *fn, PyObject *args);

/* ------------------------------------------------------------------ */
/* The context stack (ctxstack.c). */

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

/* This thread's state: ctxstack.c keeps it, ags_eval reads `ctx` and
 * `busy` once per frame.  Hidden, so that reaching it from either file
 * costs what a static thread-local would. */
extern _Thread_local ags_thread_state ags_tls
    __attribute__((visibility("hidden")));

/* What ags_ctx_enter pushed, to be handed to ags_ctx_exit or
 * ags_ctx_leave: the token of its slot on the thread's context stack,
 * unique over all threads and never reused; 0 when nothing is pushed.
 * ctxstack.c gives the rules. */
typedef struct {
    uint64_t token;
} ags_ctx_saved;

/* Enters a capture context on this thread: pushes a slot holding `ctx`,
 * which is current until a newer slot is pushed above it or it is
 * removed.  `ctx` is the context (a callable deciding what to do with
 * frames), or Py_None for a region where the runtime is disabled.
 * Returns 0, or -1 with MemoryError set and nothing pushed (saved->token
 * is then 0).  ctx: borrowed; the slot takes its own reference. */
int ags_ctx_enter(PyObject *ctx, ags_ctx_saved *saved);

/* Leaves, for a caller whose enter and exit are strictly nested on the C
 * stack (a Region's call): removes the slot `saved` pushed and every slot
 * pushed above it since, so the thread's stack is as the enter found it.
 * Must run on the thread that entered. */
void ags_ctx_exit(ags_ctx_saved *saved);

/* Leaves, for a caller that may leave out of order (a Scope: a `with`
 * block in a generator can be left after the call it was entered in has
 * returned): removes the slot `saved` pushed if it is still on this
 * thread's stack, wherever it is, and changes nothing else. */
void ags_ctx_leave(ags_ctx_saved *saved);

/* Borrowed: this thread's current context, NULL outside any. */
PyObject *ags_ctx_current(void);

/* ------------------------------------------------------------------ */
/* Cache entries and per-code caches (codecache.c). */

/* What the hook does with a frame: AGS_ACTION_LIST (protocol.h). */

/* A CacheEntry: one decision for a code object, valid while its guard
 * holds.  The fields past `action` are the shape the capture of a graph
 * fills in: `guard` is checked against the frame (None: always holds),
 * `compiled` is the callable that replaces the frame on the first call and
 * `graph` the one a hit calls with the inputs the guard gathered. */
typedef struct {
    PyObject_HEAD
    int action;            /* an ags_action */
    PyObject *guard;       /* None or callable(f_locals, f_globals,
                              f_builtins) -> bool */
    PyObject *compiled;    /* None or the compiled callable */
    PyObject *context;     /* None: valid in every context; else the only
                              context (by identity) it is valid in */
    uint64_t hits;
    uint64_t last_used;    /* use clock at its last hit or insert */
    uint64_t signature;    /* the frame signature it was made for ... */
    int has_signature;     /* ... if set: lookups skip it for others */
    int unsigned_only;     /* never signed: tried by its guard before the
                              signature table (a dynamic-shape entry,
                              made for many signatures) */
    int64_t *sig_words;    /* what the signature hashed (PyMem), compared
                              exactly on a hash match */
    Py_ssize_t sig_n;
    PyObject *graph;       /* None, or the graph callable: the hook calls
                              graph(*inputs) with the inputs the guard
                              program gathered */
    PyObject *arg_check;   /* None, or (type ids, tensor positions,
                              checker): the frame's arguments have exactly
                              the types at those addresses
                              and checker(*tensors) is True only if every
                              tensor argument has the metadata the entry's
                              signature was made from (codecache.c) */
    PyObject *weakrefs;
} ags_entry;

/* Per code object, in its co_extra slot.  Created on the first decision,
 * freed by CPython with the code object (or emptied by agspeed.reset()).
 * All live states are linked so that reset can reach them. */
typedef struct ags_code_state {
    struct ags_code_state *prev, *next;
    uint32_t flags;                  /* AGS_CODE_* */
    Py_ssize_t n_entries;
    Py_ssize_t cap_entries;
    ags_entry **entries;             /* strong references, newest first
                                        (unsigned ones: most recently used) */
    PyObject *retcode;               /* strong, made on first CALL: see
                                        ags_frame_return */
    /* Entries with a signature by signature: open addressing, linear
     * probing, borrowed pointers into `entries`; rebuilt on the first
     * lookup after `stamp` (bumped on every insert or removal) moved. */
    ags_entry **table;
    Py_ssize_t table_cap;            /* a power of two, or 0 */
    uint64_t stamp, table_stamp;
    Py_ssize_t n_unsigned;           /* entries without a signature */
    /* The last signed entry hit or inserted, if it has an arg_check:
     * borrowed, valid while `stamp` equals fast_stamp. */
    ags_entry *fast_entry;
    uint64_t fast_stamp;
    int fast_fails;                  /* failed argument checks in a row */
    int fast_rest;                   /* lookups left that skip the check */
} ags_code_state;

#define AGS_CODE_SKIP 0x1u           /* never hook this code again */
#define AGS_CODE_DISABLE 0x2u        /* run it, and its callees, unhooked */

extern PyTypeObject *ags_entry_type;     /* strong, set by module init */
/* agspeed._C.AssumptionFailed: what a compiled callable raises when a
 * branch its capture assumed (agspeed/_assume.py) went the other way; the
 * hook then runs the frame's own bytecode.  Strong, set by module init. */
extern PyObject *ags_assumption_failed;
extern PyType_Spec ags_entry_spec;

int ags_cache_init(void);

/* Borrowed: the code's state, or NULL if it has none.  Never raises. */
ags_code_state *ags_cache_get(PyCodeObject *code);

/* Borrowed: the code's state, created if missing.  NULL with an exception
 * set on failure. */
ags_code_state *ags_cache_ensure(PyCodeObject *code);

/* Finds the first entry of `state` valid for `ctx` whose guard holds.
 * `*f_locals` is a lazily built dict of the frame's locals (NULL on entry;
 * the caller releases it).  Returns 1 and a new reference in `*found` on a
 * hit, 0 on a miss, -1 with an exception set if a guard raised.  On a
 * hit of an entry with a graph, `*inputs` is a new tuple of its inputs
 * (else NULL). */
int ags_cache_lookup(ags_code_state *state, PyObject *ctx,
                     struct _PyInterpreterFrame *frame, PyObject **f_locals,
                     ags_entry **found, PyObject **inputs);

/* Adds `entry` (borrowed; the state takes its own reference) in front.
 * Returns 0, or -1 with an exception set. */
int ags_cache_insert(ags_code_state *state, ags_entry *entry);

/* Borrowed: the return code of the state's code (made on first use), or
 * NULL with an exception set. */
PyCodeObject *ags_cache_return_code(ags_code_state *state,
                                    PyCodeObject *code);

/* Gives `entry` the signature `hash` of the words `sig` (copied), which
 * lookups compare exactly.  0, or -1 with MemoryError. */
int ags_entry_set_signature(ags_entry *entry, const ags_sig *sig, uint64_t hash);
/* 1 if `entry` was made for exactly the words of `sig`. */
int ags_entry_sig_equal(const ags_entry *entry, const ags_sig *sig);

/* Empties every code cache (entries and flags).  Returns how many code
 * objects had a cache. */
Py_ssize_t ags_cache_clear(PyObject *ctx);
/* Drops `entry` from `code`'s cache: 1 if it was there, else 0. */
int ags_cache_evict(PyCodeObject *code, PyObject *entry);

/* New reference: a dict describing the cache of `code` for tests and
 * explain(): {"flags": int, "skip": bool, "entries": [CacheEntry...]}. */
PyObject *ags_cache_describe(PyCodeObject *code);

/* ------------------------------------------------------------------ */
/* The symbolic interpreter (interp.c). */

int ags_interp_init(void);

/* New reference: the capture of `code` called with `f_locals`, recorded
 * through `builder`: {"status": "graph", "result": ..., "assumptions": [...]}
 * or {"status": "break", "offset", "opcode", "reason", "detail",
 * "assumptions"}.  NULL with an exception set on a real error. */
PyObject *ags_interp_capture(PyCodeObject *code, PyObject *f_locals,
                             PyObject *globals, PyObject *builtins,
                             PyObject *builder, PyObject *tensor_type);
PyObject *ags_interp_site(void);

/* ------------------------------------------------------------------ */
/* Types and functions registered by module.c from each file. */

extern PyType_Spec ags_region_spec;
extern PyType_Spec ags_scope_spec;
PyObject *ags_set_tracers(PyObject *module, PyObject *const *args,
                          Py_ssize_t nargs);
PyObject *ags_probe_install(PyObject *module, PyObject *unused);
PyObject *ags_probe_remove(PyObject *module, PyObject *unused);
PyObject *ags_probe_count(PyObject *module, PyObject *unused);
PyObject *ags_probe_owner(PyObject *module, PyObject *unused);

#endif /* AGS_AGSPEED_H */
