/* guards.h: the API of the guard system (guards/), what csrc/ may call.
 *
 * guards/ stands on the floor (compat.h, frame.h, protocol.h in csrc/) and
 * on nothing else of csrc/: the cache (csrc/codecache.c) and the hook call
 * the functions below, and no guards/ file calls back up.
 *
 *   signature.c  the 64-bit signature of a frame's arguments (xxHash) and
 *                the words it hashes
 *   program.c    the GuardProgram type, its evaluation and its parser
 *   load.c       how a program reaches a value from the frame
 *   attr.c       its attribute loads, as static_attr finds attributes
 *   check.c      what a program checks of a value: one row per check kind
 *   batch.c      the tensor checks of a program confirmed by one call of
 *                torch's C++ checker
 *   memo.c       the structure memo and the dict and type watchers
 *   symbolic.c   symbolic sizes (dynamic shapes): expressions and guards
 *   program.h    what the files above share (private to guards/)
 *
 * The Python side (installed as agspeed.guards): guard.py compiles a
 * capture's assumptions into a program, checks.py has one class per check
 * kind, state.py reads torch's global state.
 */
#ifndef AGS_GUARDS_H
#define AGS_GUARDS_H

#include "compat.h"
#include "frame.h"
#include "protocol.h"
#include <stdint.h>

/* ------------------------------------------------------------------ */
/* Signatures (signature.c). */

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

/* ------------------------------------------------------------------ */
/* Guard programs (agspeed._C.GuardProgram). */
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

/* ------------------------------------------------------------------ */
/* Symbolic sizes in guard programs (symbolic.c: dynamic shapes). */
#define AGS_SYM_MAX 64          /* symbols one program may bind */
typedef struct {
    int active;                 /* set: the program has symbolic parts */
    Py_ssize_t n_syms, n_exprs, n_guards;
    int64_t **exprs;            /* postfix programs (PyMem) */
    Py_ssize_t *expr_len;
    Py_ssize_t *guards;         /* indices of exprs that must be non-zero */
    PyObject *fallback;         /* NULL, or callable(values) -> bool */
    Py_ssize_t n_floats;        /* load slots of plain floats the capture */
    Py_ssize_t *float_slots;    /* made symbols: their values follow the
                                   symbols' in the fallback's tuple */
} ags_symtab;
/* The symbols' values during one evaluation (on the C stack). */
typedef struct {
    int64_t v[AGS_SYM_MAX];
    char bound[AGS_SYM_MAX];
} ags_symvals;
/* spec: None, or (n_syms, exprs, guard indices, fallback[, float load
 * slots]).  0 or -1. */
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
/* An exact int of `type` binding (or matching) the symbol `word` names
 * (< 0, as a size word): 1, 0 (another type, beyond int64, another
 * value than the symbol's), never -1. */
int ags_sym_check_int(ags_symvals *s, PyObject *v, PyObject *type, PyObject *word);
/* 1 if such a spec refers only to existing symbols and expressions. */
int ags_sym_spec_ok(PyObject *spec, Py_ssize_t n_syms, Py_ssize_t n_exprs);
/* 1 if every guard expression holds (then the fallback, given the
 * symbols' values and then `floats`, the values of t's float slots), 0
 * with *failed the failing guard's index (n_guards: the fallback), or -1. */
int ags_sym_check_guards(const ags_symtab *t, ags_symvals *s,
                         PyObject *const *floats, Py_ssize_t *failed);
PyObject *ags_sym_eval_py(PyObject *module, PyObject *const *args,
                          Py_ssize_t nargs);

#endif /* AGS_GUARDS_H */
