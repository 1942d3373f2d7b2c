/* agspeed.h: what the C files of agspeed._C share.
 *
 * Subsystems and the file that owns each:
 *
 *   hook.c        the PEP 523 evaluation function, its installation, the
 *                 thread-local stack of capture contexts and the counters.
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
#include <stdint.h>

struct _PyInterpreterFrame;

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
    X(callback_errors, "decisions that raised: the error propagated out of " \
                       "the frame, which did not run") \
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

/* What ags_hook_enter pushed, to be handed to ags_hook_exit or
 * ags_hook_leave: the token of its slot on the thread's context stack,
 * unique over all threads and never reused; 0 when nothing is pushed.
 * hook.c ("The context stack") gives the rules. */
typedef struct {
    uint64_t token;
} ags_ctx_saved;

/* Enters a capture context on this thread: pushes a slot holding `ctx`,
 * which is current until a newer slot is pushed above it or it is
 * removed.  `ctx` is the context (a callable deciding what to do with
 * frames), or Py_None for a region where the runtime is disabled.
 * Returns 0, or -1 with MemoryError set and nothing pushed (saved->token
 * is then 0).  ctx: borrowed; the slot takes its own reference. */
int ags_hook_enter(PyObject *ctx, ags_ctx_saved *saved);

/* Leaves, for a caller whose enter and exit are strictly nested on the C
 * stack (a Region's call): removes the slot `saved` pushed and every slot
 * pushed above it since, so the thread's stack is as the enter found it.
 * Must run on the thread that entered. */
void ags_hook_exit(ags_ctx_saved *saved);

/* Leaves, for a caller that may leave out of order (a Scope: a `with`
 * block in a generator can be left after the call it was entered in has
 * returned): removes the slot `saved` pushed if it is still on this
 * thread's stack, wherever it is, and changes nothing else. */
void ags_hook_leave(ags_ctx_saved *saved);

/* Borrowed: this thread's current context, NULL outside any. */
PyObject *ags_hook_current(void);

/* 1 when agspeed's evaluation function is the interpreter's now. */
int ags_hook_is_installed(void);

/* ------------------------------------------------------------------ */
/* Cache entries and per-code caches (codecache.c). */

/* What the hook does with a frame, decided by the capture context.  The
 * table generates the enum, the names exposed to Python and the checks. */
#define AGS_ACTION_LIST(X) \
    X(SKIP, "never look at this code object again, in any context: every " \
            "later frame of it runs untouched (its callees are still seen)") \
    X(RUN_EAGER, "run the frame's own bytecode; its callees still pass " \
                 "through the hook") \
    X(CALL, "call compiled(f_locals, f_globals, f_builtins) and return its result from the frame " \
            "without running the frame's bytecode; an exception it raises " \
            "propagates from the frame")

typedef enum {
#define AGS_X(name, doc) AGS_ACTION_##name,
    AGS_ACTION_LIST(AGS_X)
#undef AGS_X
    AGS_ACTION_COUNT
} ags_action;

/* A CacheEntry: one decision for a code object, valid while its guard
 * holds.  The fields past `action` are the shape the capture of a graph
 * fills in: `guard` is checked against the frame's locals (None: always
 * holds), `compiled` is the callable that replaces the frame and `rebuild`
 * says how its outputs become the frame's return value. */
typedef struct {
    PyObject_HEAD
    int action;            /* an ags_action */
    PyObject *guard;       /* None or callable(f_locals, f_globals,
                              f_builtins) -> bool */
    PyObject *compiled;    /* None or the compiled callable */
    PyObject *rebuild;     /* None or the recipe for the return value */
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

extern PyTypeObject *ags_entry_type;     /* strong, set by module init */
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

/* Empties every code cache (entries and flags).  Returns how many code
 * objects had a cache. */
Py_ssize_t ags_cache_clear(PyObject *ctx);
/* Drops `entry` from `code`'s cache: 1 if it was there, else 0. */
int ags_cache_evict(PyCodeObject *code, PyObject *entry);

/* New reference: a dict describing the cache of `code` for tests and
 * explain(): {"flags": int, "skip": bool, "entries": [CacheEntry...]}. */
PyObject *ags_cache_describe(PyCodeObject *code);

/* ------------------------------------------------------------------ */
/* Frames (frame.c). */

/* Borrowed: the frame's code object, or NULL if it runs something else. */
PyCodeObject *ags_frame_code(struct _PyInterpreterFrame *frame);

/* Borrowed: the frame's globals and builtins dicts. */
PyObject *ags_frame_globals(struct _PyInterpreterFrame *frame);
PyObject *ags_frame_builtins(struct _PyInterpreterFrame *frame);

/* New reference: a dict {name: value} of the frame's bound local slots
 * (arguments, at entry).  NULL with an exception set on failure. */
PyObject *ags_frame_locals(struct _PyInterpreterFrame *frame);

/* Borrowed: the frame's argument slots, localsplus[0..ags_code_nargs),
 * all bound when the hook sees the frame. */
PyObject *const *ags_frame_args(struct _PyInterpreterFrame *frame);
/* How many argument slots a frame of `code` has (positional, keyword-only,
 * *args, **kwargs): the first names of co_localsplusnames. */
int ags_code_nargs(PyCodeObject *code);

/* New reference: the "return code" of `code` (same locals layout, bytecode
 * RESUME; RETURN_VALUE), or NULL with an exception set. */
PyObject *ags_frame_make_return_code(PyCodeObject *code);

/* 1 if an unstarted frame can be made to return a value: its code has a
 * stack slot and its stack is empty. */
int ags_frame_can_return(struct _PyInterpreterFrame *frame);

/* Makes the unstarted `frame` return `value` (stolen) when it is evaluated,
 * without running its bytecode.  Requires ags_frame_can_return() and
 * `retcode` made from the frame's code. */
void ags_frame_return(struct _PyInterpreterFrame *frame,
                      PyCodeObject *retcode, PyObject *value);

/* ------------------------------------------------------------------ */
/* Opcodes (opcodes.c) and bytecode (bytecode.c). */

typedef struct {
    uint8_t caches;     /* inline CACHE units after the instruction */
    int8_t jump;        /* 0, or +1/-1: relative jump forward/backward */
} ags_opinfo;

extern ags_opinfo ags_opcodes[256];
void ags_opcodes_init(void);

typedef struct {
    int start;          /* offset of the first EXTENDED_ARG prefix */
    int offset;         /* offset of the opcode */
    int next;           /* offset after the inline caches */
    int target;         /* jump target offset, or -1 */
    uint32_t arg;       /* the full argument, prefixes folded in */
    uint8_t opcode;
} ags_instr;

typedef struct {
    Py_ssize_t n;
    ags_instr *instrs;  /* n instructions in bytecode order */
    int *index;         /* start offset / 2 -> instruction index, or -1 */
} ags_bytecode;

/* Decodes `code` into `bc` (which the caller releases with
 * ags_bc_release).  Returns 0, or -1 with ValueError for malformed
 * bytecode (or MemoryError). */
int ags_bc_decode(PyCodeObject *code, ags_bytecode *bc);
void ags_bc_release(ags_bytecode *bc);

/* New reference: [(start, offset, opcode, arg, target, next), ...]. */
PyObject *ags_bc_to_list(PyCodeObject *code);

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

/* ------------------------------------------------------------------ */
/* Types and functions registered by module.c from each file. */

extern PyType_Spec ags_region_spec;
extern PyType_Spec ags_scope_spec;
PyObject *ags_probe_install(PyObject *module, PyObject *unused);
PyObject *ags_probe_remove(PyObject *module, PyObject *unused);
PyObject *ags_probe_count(PyObject *module, PyObject *unused);
PyObject *ags_probe_owner(PyObject *module, PyObject *unused);

/* guards/signature.c */
uint64_t ags_signature_hash(const void *data, size_t len, uint64_t seed);
/* The signature of a frame about to run `code` with argument slots `args`
 * (ags_code_nargs of them, NULL where unbound):
 * a hash of each argument's type and, for tensors, dtype, device, sizes,
 * strides and requires_grad.  0 on success, -1 with an exception. */
int ags_frame_signature(PyCodeObject *code, PyObject *const *args, uint64_t *out);
/* The words a signature hashes, kept to compare exactly: a hash match
 * between different frames then never reaches an entry's guard. */
typedef struct {
    int64_t small[128];
    int64_t *words;
    Py_ssize_t n, cap;
} ags_sig;
int ags_sig_compute(PyCodeObject *code, PyObject *const *args, ags_sig *sig,
                    uint64_t *hash);    /* release with ags_sig_release */
void ags_sig_release(ags_sig *sig);
/* Interned names of the tensor attributes signatures and guards read. */
typedef struct {
    PyObject *dtype, *device, *shape, *stride, *requires_grad;
} ags_tensor_names;
extern ags_tensor_names ags_tnames;
int ags_tensor_names_init(void);   /* 0, or -1 with an exception */
int ags_entry_set_signature(ags_entry *entry, const ags_sig *sig, uint64_t hash);
int ags_entry_sig_equal(const ags_entry *entry, const ags_sig *sig);
/* Test knob: keep only the low `bits` bits of signatures (64: all). */
extern int ags_signature_bits;

/* What a guard program reads a frame through.  From Python: the three
 * dicts, args NULL.  From the hook: the argument slots by index, and the
 * locals dict only if a load names something else (a free variable): then
 * made from `iframe` and left in f_locals for the caller, who owns it. */
typedef struct {
    PyObject *f_locals;          /* borrowed, or NULL until needed */
    PyObject *globals, *builtins;
    PyObject *const *args;       /* NULL, or the argument slots */
    Py_ssize_t nargs;
    struct _PyInterpreterFrame *iframe;   /* NULL from Python */
} ags_gframe;

/* guards/program.c: guard programs (agspeed._C.GuardProgram). */
extern PyType_Spec ags_guard_spec;
extern PyTypeObject *ags_guard_type;   /* set when the module is made */
int ags_guard_init(void);
/* 1 if obj is a compiled guard program. */
int ags_is_guard_program(PyObject *obj);
/* Evaluates `program` on frame = (f_locals, f_globals, f_builtins): 1 with
 * *inputs a new tuple of the graph's inputs, 0 if a check failed, -1 on
 * error.  signed_frame: the frame's signature matched the entry's exactly
 * (its arguments' tensor checks are settled). */
int ags_guard_run(PyObject *program, ags_gframe *frame, int signed_frame,
                  PyObject **inputs);

/* guards/symbolic.c: symbolic sizes in guard programs (dynamic shapes). */
#define AGS_SYM_MAX 64          /* symbols one program may bind */
typedef struct {
    int active;                 /* set: the program has symbolic parts */
    Py_ssize_t n_syms, n_exprs, n_guards;
    int64_t **exprs;            /* postfix programs (PyMem) */
    Py_ssize_t *expr_len;
    Py_ssize_t *guards;         /* indices of exprs that must be non-zero */
    PyObject *fallback;         /* NULL, or callable(values) -> bool */
} ags_symtab;
/* The symbols' values during one evaluation (on the C stack). */
typedef struct {
    int64_t v[AGS_SYM_MAX];
    char bound[AGS_SYM_MAX];
} ags_symvals;
/* spec: None, or (n_syms, exprs, guard indices, fallback).  0 or -1. */
int ags_symtab_set(ags_symtab *t, PyObject *spec);
void ags_symtab_release(ags_symtab *t);
void ags_symvals_init(ags_symvals *s, const ags_symtab *t);
/* 0 with *out the value of the postfix program, -1 if it has none. */
int ags_sym_eval(const int64_t *code, Py_ssize_t n, const ags_symvals *s,
                 int64_t *out);
/* A tensor against (dtype, device, sizes, strides, requires_grad) whose
 * sizes may name symbols (< 0) and strides expressions (< 0): 1, 0, -1. */
int ags_sym_check_tensor(const ags_symtab *t, ags_symvals *s, PyObject *v,
                         PyObject *type, PyObject *spec);
/* 1 if such a spec refers only to existing symbols and expressions. */
int ags_sym_spec_ok(PyObject *spec, Py_ssize_t n_syms, Py_ssize_t n_exprs);
/* 1 if every guard expression holds (then the fallback), 0 with *failed
 * the failing guard's index (n_guards: the fallback), or -1. */
int ags_sym_check_guards(const ags_symtab *t, ags_symvals *s, Py_ssize_t *failed);
PyObject *ags_sym_eval_py(PyObject *module, PyObject *const *args,
                          Py_ssize_t nargs);
PyObject *ags_sym_ops(void);

#endif /* AGS_AGSPEED_H */
