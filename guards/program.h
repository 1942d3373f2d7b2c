/* program.h: what the files of a guard program share (guards/ only).
 *
 * csrc/ sees guards.h; this header is for program.c, load.c, attr.c,
 * check.c, batch.c and memo.c, which together make agspeed._C.GuardProgram:
 *
 *   g_program  the compiled program: loads, checks, aliases, probes, the
 *              symbolic table, the structure memo (program.c owns it)
 *   g_load     how one value is reached: an AGS_LOAD_* op, its parent load
 *              and key (load.c)
 *   g_check    what is checked of one load's value: an AGS_CHECK_* kind
 *              and the expected value (check.c)
 *   g_values   one evaluation's table of load values (load.c)
 *   g_memo     the structure memo (memo.c)
 *
 * alias.c checks which loads must reach one object, and which different
 * ones.
 *
 * Kinds are protocol.h's enums (AGS_LOAD_*, AGS_CHECK_*, AGS_GFLAG_*,
 * AGS_PART_*); each file dispatches on them with a table or a switch
 * generated from the X-macro list, never with a chain of comparisons.
 *
 * Ownership: a program owns its loads' keys and its checks' expected
 * values (strong references, visited by tp_traverse).  A g_values table
 * owns the values it holds (new references) until ags_values_release.  The
 * memo owns nothing but a weak reference to its root.
 */
#ifndef AGS_GUARDS_PROGRAM_H
#define AGS_GUARDS_PROGRAM_H

#include "guards.h"

/* Everything declared here is private to guards/: hidden from the shared
 * object's dynamic symbols, so that calls between these files are direct
 * (no PLT jump) and the hit path costs what it did as one file. */
#if defined(__GNUC__)
#  pragma GCC visibility push(hidden)
#endif

/* The marker of a load that reached nothing (distinct from any object;
 * never reference counted). */
extern PyObject ags_gp_missing;
#define G_MISSING (&ags_gp_missing)

typedef struct {
    int op;              /* AGS_LOAD_* */
    int parent;          /* index of the parent load, or -1 */
    int arg;             /* LOCAL: its argument slot, or -1 (read by name) */
    PyObject *key;       /* owned: name, index, (module, name) or None */
} g_load;

typedef struct {
    int slot;            /* the load whose value is checked */
    int kind;            /* AGS_CHECK_* */
    int signed_arg;      /* a signature settles it: a TENSOR check of an
                            argument slot (the hook's signature covers
                            those; not a closure variable read as a local) */
    PyObject *a;         /* owned: see check.c, per kind */
    PyObject *b;         /* owned */
    Py_ssize_t n;        /* LEN: the length */
} g_check;

/* The structure memo's state (memo.c explains it). */
struct g_witness_;

typedef struct {
    int valid;
    int slot;            /* the root: a local holding an nn.Module */
    PyObject *root_ref;  /* owned: a weak reference to it */
    char *frozen;        /* per load: its value is remembered */
    PyObject **values;   /* per load: the remembered value (borrowed) */
    char *skip;          /* per check: implied while the memo holds */
    int *live;           /* the other checks' indices, in order */
    Py_ssize_t n_live;
    int *typeof_w;       /* indices of the TYPEOF witnesses */
    Py_ssize_t n_typeof;
    char *skip_alias;    /* per alias */
    PyObject **apart;    /* the distinct loads' remembered values, sorted
                            by address (alias.c) */
    Py_ssize_t n_apart;
    int *fresh;          /* the distinct list's other loads (by position) */
    Py_ssize_t n_fresh;
    struct g_witness_ *w;
    Py_ssize_t n_w, cap_w;
    uint64_t epoch;      /* watchers: the epoch when last confirmed */
    int watched;         /* every dict and type of `w` is watched */
    uint64_t fast, full; /* evaluations through the memo, and without */
    uint64_t builds;
} g_memo;

/* A checker of the tensors of a list of TENSOR checks (batch.c). */
typedef struct {
    int *index;          /* the checks, in order */
    Py_ssize_t n;
    PyObject *check;     /* owned: check(*tensors) -> bool; None: these
                            places have none; NULL: an empty slot */
} g_batch;

#define G_BATCH_SLOTS 4
#define G_BATCH_MIN 4    /* fewer deferred tensors: checked one by one */
#define G_BATCH_MAX 256  /* more: the rest checked one by one in the loop */

typedef struct g_program_ {
    PyObject_HEAD
    g_load *loads;
    Py_ssize_t n_loads;
    g_check *checks;
    Py_ssize_t n_checks;
    int *aliases;        /* pairs of load indices (alias.c) */
    Py_ssize_t n_aliases;
    int *distinct;       /* loads that must reach different objects */
    Py_ssize_t n_distinct;
    PyObject *probes;    /* owned: tuple of (fn, args, expected) */
    PyObject *step;      /* owned: Python fallback step(kind, base, key) */
    PyObject *missing;   /* owned: agspeed._sources.MISSING */
    PyObject *module_type;     /* owned: torch.nn.Module, or NULL */
    PyObject *module_getattr;  /* owned: torch.nn.Module.__getattr__ */
    int *outputs;        /* loads read() returns, in order */
    Py_ssize_t n_outputs;
    int flags;           /* AGS_GFLAG_* bits */
    ags_symtab sym;      /* symbols, expressions, guards (dynamic shapes) */
    PyObject **tvals;    /* the program's own value table (> 64 loads): */
    char *tvia;          /* all NULL / 0 between evaluations */
    Py_ssize_t *ttouched;
    int tbusy;           /* an evaluation is using it */
    g_memo memo;
    PyObject *batch_make;      /* owned: tensors -> checker or None; or NULL */
    g_batch batches[G_BATCH_SLOTS];
    int batch_next, batch_stale, batch_off;
    PyObject *weakreflist;
    vectorcallfunc vectorcall;
} g_program;

/* Interned names, made by ags_guard_init (program.c). */
typedef struct {
    PyObject *getattr;                  /* "__getattr__" */
    PyObject *class_;                   /* "__class__" */
    PyObject *builtins;                 /* "__builtins__" */
    PyObject *grad;                     /* "grad" */
    PyObject *torch_parameter;          /* "torch.nn.parameter" */
    PyObject *stores[3];                /* nn.Module's stores, in order */
    PyObject *loads[AGS_LOAD_COUNT];    /* the load names step() receives */
    PyObject *parts[AGS_PART_COUNT];    /* the part names why() returns */
} g_names;
extern g_names ags_gp_names;

/* Turns the pending exception into one of the same type saying
 * "bad guard <what> <index>: <message>", the original as its cause.
 * Returns -1. */
int ags_gp_refuse(const char *what, Py_ssize_t index);

/* ------------------------------------------------------------------ */
/* Loads (load.c) */

/* The Python step, resolve_step(kind, base, key), for what C does not
 * answer: a new reference, G_MISSING, or NULL (load.c). */
PyObject *ags_load_step(g_program *p, int op, PyObject *base, PyObject *key);
/* New reference to base.<name> as static_attr finds it, or G_MISSING;
 * *via says where the answer came from, for the memo (attr.c). */
PyObject *ags_load_attr_value(g_program *p, PyObject *base, PyObject *name,
                              int *via);

/* Where ags_load_attr_value found an attribute, when the structure memo can watch
 * that place: the class (a function, a constant or a property) or the
 * instance dict; an nn.Module store (VIA_STORE + 0, 1, 2: _parameters,
 * _buffers, _modules, searched in that order); or nowhere, having searched
 * all three.  VIA_PYTHON: Python answered, or the load is not an
 * attribute.  Also what a load's answer depends on (ags_load_depends). */
enum { VIA_PYTHON, VIA_CLASS_OR_DICT, VIA_STORE, VIA_NOWHERE = VIA_STORE + 3 };
/* ags_load_depends's other answers: not remembered; remembered with
 * nothing to witness (an item of a tuple, which cannot change). */
enum { DEP_NONE = -1, DEP_FIXED = -2 };

/* The per-evaluation table of load values: on the stack for small
 * programs; for large ones the program's own table (kept all NULL between
 * evaluations, so that an evaluation through the memo, which fills a few
 * loads of a thousand, costs nothing per load it does not touch), or a
 * fresh one while that is in use (a probe's Python call let another
 * evaluation of the program start).
 * via[i]: where load i was answered (VIA_*). */
typedef struct {
    PyObject *small[64];
    char small_via[64];
    PyObject **vals;         /* owned: new references or G_MISSING */
    char *via;
    Py_ssize_t n;
    Py_ssize_t *touched;     /* the program's table: loads filled, in order */
    Py_ssize_t n_touched;
    g_program *owner;        /* the program whose table this is */
    const char *frozen;      /* while the memo holds: its remembered loads, */
    PyObject *const *known;  /* answered from it without a reference */
} g_values;

/* A table for an evaluation of p: 0, or -1 with an exception.  Small
 * tables are made here, on the caller's stack (the hit path of most
 * functions); ags_values_init_large makes the others. */
int ags_values_init_large(g_values *t, g_program *p);

static inline int
ags_values_init(g_values *t, g_program *p)
{
    t->n = p->n_loads;
    t->touched = NULL;
    t->n_touched = 0;
    t->owner = NULL;
    t->frozen = NULL;
    t->known = NULL;
    if (t->n > 64) {
        return ags_values_init_large(t, p);
    }
    memset(t->small, 0, sizeof(t->small));
    memset(t->small_via, 0, sizeof(t->small_via));
    t->vals = t->small;
    t->via = t->small_via;
    return 0;
}

/* Releases the values a table holds, and the table. */
void ags_values_release_large(g_values *t);

static inline void
ags_values_release(g_values *t)
{
    if (t->vals != t->small) {
        ags_values_release_large(t);
        return;
    }
    for (Py_ssize_t i = 0; i < t->n; i++) {
        PyObject *value = t->vals[i];
        if (value != NULL && value != G_MISSING) {
            Py_DECREF(value);
        }
    }
}

/* The value of load i, found and kept in t on first use: borrowed from t
 * (a reference t owns, a remembered value, or G_MISSING), or NULL with an
 * exception.  The common cases (found already, remembered by the memo) are
 * answered here; ags_load_find does the loading. */
PyObject *ags_load_find(g_program *p, g_values *t, Py_ssize_t i,
                        ags_gframe *frame);

static inline PyObject *
ags_load_value(g_program *p, g_values *t, Py_ssize_t i, ags_gframe *frame)
{
    if (t->vals[i] != NULL) {
        return t->vals[i];
    }
    if (t->frozen != NULL && t->frozen[i]) {
        return t->known[i];
    }
    return ags_load_find(p, t, i, frame);
}

/* Borrowed: the local `ld` names (an argument slot when the frame gives
 * them, else by name), G_MISSING if unbound, or NULL with an exception. */
PyObject *ags_load_local(ags_gframe *frame, const g_load *ld);

/* Parses loads[i] = (op, parent, key[, arg]) into `ld`: 0, or -1 with
 * ValueError ("bad guard load i: ...") for an unknown op or a load its
 * op's row refuses.  Takes a reference to the key. */
int ags_load_parse(g_load *ld, PyObject *item, Py_ssize_t i);

/* What the value of load i depends on, for the memo: a VIA_* (its base's
 * witnesses), DEP_FIXED or DEP_NONE.  `base` is its parent's value. */
int ags_load_depends(const g_program *p, const g_values *t, Py_ssize_t i,
                     PyObject *base);

/* ------------------------------------------------------------------ */
/* Aliases and distinct loads (alias.c) */

/* Parses aliases [(slot, slot)] and distinct [slot] (or NULL) into `p`,
 * whose loads are counted.  0, or -1 with an exception. */
int ags_alias_parse(g_program *p, PyObject *aliases, PyObject *distinct);
void ags_alias_release(g_program *p);

/* Splits the distinct loads into the memo's remembered values and the
 * loads read afresh (ags_memo_build, once the memo's values are set).
 * 0, or -1 without memory. */
int ags_alias_memo(g_program *p);

/* After the checks passed: 1 when the aliases reach one object each and
 * the distinct loads different ones; 0 with *part (AGS_PART_ALIAS or
 * AGS_PART_DISTINCT) and *index; -1 with an exception.  fast: the
 * evaluation goes through the structure memo. */
int ags_alias_run(g_program *p, g_values *t, ags_gframe *frame,
                  int fast, int *part, Py_ssize_t *index);

/* ------------------------------------------------------------------ */
/* Checks (check.c) */

/* What the structure memo may do with a check of a load it remembers: the
 * check's row says. */
typedef enum {
    G_MEMO_RUN,          /* the check still runs */
    G_MEMO_SKIP,         /* implied by the remembered value */
    G_MEMO_SKIP_DICT,    /* implied while the value, a dict, keeps its
                            version: witness it */
} g_memo_rule;

/* Parses checks[i] = (slot, kind, a, b) into `c` for program p (its loads
 * parsed): 0, or -1 with ValueError ("bad guard check i: ...") for an
 * unknown kind or an expectation the kind's row refuses.  Takes references
 * to a and b. */
int ags_check_parse(g_check *c, PyObject *item, Py_ssize_t i,
                    const g_program *p);

/* Runs the program's checks in order (with `fast`, only the memo's live
 * ones; with `signed_frame`, not those a signature settles): 1 if all
 * pass, 0 with *failed the first failing check's index, -1 on error. */
int ags_check_run(g_program *p, g_values *t, ags_symvals *sv,
                  ags_gframe *frame, int fast, int signed_frame,
                  Py_ssize_t *failed);

g_memo_rule ags_check_memo_rule(const g_program *p, const g_check *c,
                                 PyObject *v);

/* ------------------------------------------------------------------ */
/* Tensor checks confirmed by one call (batch.c) */

/* 1 if a checker for the TENSOR checks `index` (n of them) accepts their
 * tensors, else 0 (*refused: one was asked and said no); never an error. */
int ags_batch_run(g_program *p, const int *index, PyObject *const *tensors,
                  Py_ssize_t n, int *refused);
/* After those checks passed one by one: makes their checker (refused: a
 * checker had said no).  Never an error. */
void ags_batch_learn(g_program *p, const int *index,
                     PyObject *const *tensors, Py_ssize_t n, int refused);
void ags_batch_release(g_program *p);
/* New reference: {"checkers": [(tensors, made)], "stale": n, "off": bool}. */
PyObject *ags_batch_report(g_program *p);
int ags_batch_traverse(g_program *p, visitproc visit, void *arg);

/* ------------------------------------------------------------------ */
/* The structure memo (memo.c) */

int ags_memo_init(void);            /* the watchers; 0 */
void ags_memo_release(g_memo *m);
/* Rebuilds the memo from a passing evaluation's values.  Failing leaves
 * no memo and no exception: it is an optimization only. */
void ags_memo_build(g_program *p, g_values *t);
/* 1 if the memo holds for this frame, else 0 (never an error).  Without a
 * memo that is all; ags_memo_confirm checks one. */
int ags_memo_confirm(g_program *p, ags_gframe *frame);

static inline int
ags_memo_holds(g_program *p, ags_gframe *frame)
{
    return p->memo.valid ? ags_memo_confirm(p, frame) : 0;
}
/* New reference: the memo's state as a dict (GuardProgram._memo()). */
PyObject *ags_memo_report(g_program *p);

#if defined(__GNUC__)
#  pragma GCC visibility pop
#endif

#endif /* AGS_GUARDS_PROGRAM_H */
