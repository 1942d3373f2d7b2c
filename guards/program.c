/* program.c: the GuardProgram type: a cache entry's guard, compiled to C.
 *
 * A GuardProgram is what agspeed.guards.Guard compiles its checks into:
 *
 *   loads   one per source, parents first: how to reach a value from the
 *           frame (load.c, one row per AGS_LOAD_* op).  Values are found
 *           on demand and kept for the rest of the evaluation.
 *   checks  (load, kind, a, b): what the value must be (check.c, one row
 *           per AGS_CHECK_* kind).
 *   aliases pairs of loads that must reach one object (tied weights), and
 *           the loads that must reach different ones (alias.c).
 *   probes  (function, args, expected): torch's global state (grad mode,
 *           autocast, default dtype) read by torch's own C functions.
 *   symbols for a graph with dynamic dimensions: guard expressions over
 *           the symbols the DYNTENSOR checks bind (symbolic.c).
 *   memo    the structure memo, which lets an evaluation skip the checks a
 *           module's unchanged structure implies (memo.c).
 *
 * This file owns the type, its parser (_set_program) and evaluation:
 * calling the program with (f_locals, f_globals, f_builtins) answers True
 * or False; run() also returns the graph's inputs, as the hook gets them
 * (ags_guard_run); read() only the inputs; why() what failed first, as
 * an AGS_PART_* name and an index.  An evaluation runs no user code and
 * makes no Python object on the common path but a tensor's shape, device
 * and strides.
 *
 * Which check failed, with old and new values, is the Python Guard's job
 * (guards/guard.py, failures()): it runs only on a miss.
 */
#include "program.h"
#include <ctype.h>
#include <structmember.h>

g_names ags_gp_names;

int
ags_gp_refuse(const char *what, Py_ssize_t index)
{
    PyObject *cause = ags_compat_take_exc(), *exc;

    PyErr_Format(cause != NULL ? (PyObject *)Py_TYPE(cause)
                               : PyExc_ValueError,
                 "bad guard %s %zd: %S", what, index,
                 cause != NULL ? cause : Py_None);
    exc = ags_compat_take_exc();
    if (exc != NULL && cause != NULL) {
        PyException_SetCause(exc, cause);    /* steals cause */
    }
    else {
        Py_XDECREF(cause);
    }
    if (exc != NULL) {
        ags_compat_put_exc(exc);
    }
    return -1;
}

static void
program_release(g_program *p)
{
    ags_memo_release(&p->memo);
    /* never called while an evaluation uses the table: the evaluation
     * holds a reference to the program */
    PyMem_Free(p->tvals);
    PyMem_Free(p->tvia);
    PyMem_Free(p->ttouched);
    p->tvals = NULL;
    p->tvia = NULL;
    p->ttouched = NULL;
    p->tbusy = 0;
    for (Py_ssize_t i = 0; i < p->n_loads; i++) {
        Py_CLEAR(p->loads[i].key);
    }
    for (Py_ssize_t i = 0; i < p->n_checks; i++) {
        Py_CLEAR(p->checks[i].a);
        Py_CLEAR(p->checks[i].b);
    }
    PyMem_Free(p->loads);
    PyMem_Free(p->checks);
    ags_alias_release(p);
    PyMem_Free(p->outputs);
    p->outputs = NULL;
    p->n_outputs = 0;
    p->loads = NULL;
    p->checks = NULL;
    p->n_loads = p->n_checks = 0;
    Py_CLEAR(p->probes);
    Py_CLEAR(p->step);
    Py_CLEAR(p->missing);
    Py_CLEAR(p->module_type);
    Py_CLEAR(p->module_getattr);
    ags_batch_release(p);
    ags_symtab_release(&p->sym);
}

/* ------------------------------------------------------------------ */
/* Evaluation */

/* What failed in an evaluation that answered 0: an AGS_PART_* (-1: none)
 * and its index. */
typedef struct {
    int part;
    Py_ssize_t index;
} g_why;

/* The symbolic guards of p, with the values of its float symbols read
 * from their loads: 1, 0 (*failed: which guard) or -1. */
static int
check_symbols(g_program *p, g_values *table, ags_symvals *sv,
              ags_gframe *frame, Py_ssize_t *failed)
{
    PyObject *floats[AGS_SYM_MAX + 1];

    for (Py_ssize_t i = 0; i < p->sym.n_floats; i++) {
        floats[i] = ags_load_value(p, table, p->sym.float_slots[i], frame);
        if (floats[i] == NULL) {
            return -1;
        }
    }
    return ags_sym_check_guards(&p->sym, sv, floats, failed);
}

/* Evaluates the program on `frame`.  signed_frame: the frame's signature
 * matched the entry's exactly, which already settles the tensor checks of
 * its arguments.  With `outputs`, a passing evaluation also returns the
 * output loads' values (MISSING for those that reach nothing), the
 * graph's inputs, as a new tuple.  Returns 1, 0 (*why says what failed)
 * or -1. */
static int
run_program(g_program *p, ags_gframe *frame, int signed_frame,
            PyObject **outputs, g_why *why)
{
    g_values table;
    g_memo *m = &p->memo;
    ags_symvals sv;
    g_why failed = {-1, -1};
    int ok, fast;

    if (ags_values_init(&table, p) < 0) {
        return -1;
    }
    ags_symvals_init(&sv, &p->sym);
    fast = ags_memo_holds(p, frame);
    if (fast) {
        m->fast++;
        table.frozen = m->frozen;
        table.known = m->values;
    }
    else {
        m->full++;
    }
    ok = ags_check_run(p, &table, &sv, frame, fast, signed_frame,
                       &failed.index);
    if (ok == 0) {
        failed.part = AGS_PART_CHECK;
    }
    if (ok == 1) {
        ok = ags_alias_run(p, &table, frame, fast, &failed.part,
                           &failed.index);
    }
    if (ok == 1 && p->sym.active) {
        ok = check_symbols(p, &table, &sv, frame, &failed.index);
        failed.part = ok == 0 ? AGS_PART_SIZE : -1;
    }
    for (Py_ssize_t i = 0; ok == 1 && i < PyTuple_GET_SIZE(p->probes); i++) {
        PyObject *probe = PyTuple_GET_ITEM(p->probes, i);
        PyObject *got = PyObject_Call(PyTuple_GET_ITEM(probe, 0),
                                      PyTuple_GET_ITEM(probe, 1), NULL);
        if (got == NULL) {
            ok = -1;
        }
        else {
            ok = PyObject_RichCompareBool(got, PyTuple_GET_ITEM(probe, 2),
                                          Py_EQ);
            Py_DECREF(got);
            if (ok == 0) {
                failed = (g_why){AGS_PART_PROBE, i};
            }
        }
    }
    /* The outputs' loads, also on a full evaluation without `outputs`, so
     * that the memo remembers the graph's parameters. */
    for (Py_ssize_t i = 0; ok == 1 && !fast && i < p->n_outputs; i++) {
        if (ags_load_value(p, &table, p->outputs[i], frame) == NULL) {
            ok = -1;
        }
    }
    if (ok == 1 && !fast && m->builds < 16 + m->fast) {
        /* (a memo rebuilt over and over without paying off is given up) */
        m->builds++;
        ags_memo_build(p, &table);
    }
    if (ok == 1 && outputs != NULL) {
        PyObject *out = PyTuple_New(p->n_outputs);
        for (Py_ssize_t i = 0; out != NULL && i < p->n_outputs; i++) {
            PyObject *v = ags_load_value(p, &table, p->outputs[i], frame);
            PyTuple_SET_ITEM(out, i,
                             Py_NewRef(v == G_MISSING ? p->missing : v));
        }
        if (out == NULL) {
            ok = -1;
        }
        *outputs = out;
    }
    ags_values_release(&table);
    if (why != NULL) {
        *why = ok == 0 ? failed : (g_why){-1, -1};
    }
    return ok;
}

PyTypeObject *ags_guard_type;

int
ags_is_guard_program(PyObject *obj)
{
    return ags_guard_type != NULL && PyObject_TypeCheck(obj, ags_guard_type)
           && ((g_program *)obj)->probes != NULL;
}

int
ags_guard_run(PyObject *program, ags_gframe *frame, int signed_frame,
              PyObject **inputs)
{
    if (inputs != NULL) {
        *inputs = NULL;
    }
    return run_program((g_program *)program, frame, signed_frame, inputs,
                       NULL);
}

/* The frame of a call from Python: (f_locals, f_globals, f_builtins),
 * three dicts, and the program must be compiled.  0, or -1 with
 * TypeError or RuntimeError. */
static int
frame_args(g_program *p, PyObject *const *args, Py_ssize_t nargs,
           PyObject *kwnames, ags_gframe *fr)
{
    if (nargs != 3 || (kwnames && PyTuple_GET_SIZE(kwnames))
        || !PyDict_Check(args[0]) || !PyDict_Check(args[1])
        || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "a guard program takes (f_locals, "
                        "f_globals, f_builtins), three dicts");
        return -1;
    }
    if (p != NULL && p->probes == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "guard program not compiled");
        return -1;
    }
    memset(fr, 0, sizeof(*fr));
    fr->f_locals = args[0];
    fr->globals = args[1];
    fr->builtins = args[2];
    return 0;
}

static PyObject *
program_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                   PyObject *kwnames)
{
    g_program *p = (g_program *)self;
    ags_gframe fr;
    int ok;

    if (frame_args(p, args, PyVectorcall_NARGS(nargsf), kwnames, &fr) < 0) {
        return NULL;
    }
    ok = run_program(p, &fr, 0, NULL, NULL);
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

/* Subclasses (agspeed.guards.Guard) are called through tp_call on 3.11,
 * which does not inherit vectorcall. */
static PyObject *
program_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "a guard program takes no keywords");
        return NULL;
    }
    return program_vectorcall(self, &PyTuple_GET_ITEM(args, 0),
                              (size_t)PyTuple_GET_SIZE(args), NULL);
}

/* read(f_locals, f_globals, f_builtins) -> tuple: the output loads' values
 * (the graph's inputs), MISSING for any that reach nothing.  Runs no
 * check: a compiled program is not required to have probes. */
static PyObject *
program_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    g_program *p = (g_program *)self;
    g_values table;
    ags_gframe fr;
    PyObject *out;

    if (frame_args(NULL, args, nargs, NULL, &fr) < 0
        || ags_values_init(&table, p) < 0) {
        return NULL;
    }
    out = PyTuple_New(p->n_outputs);
    for (Py_ssize_t i = 0; out != NULL && i < p->n_outputs; i++) {
        PyObject *v = ags_load_value(p, &table, p->outputs[i], &fr);
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, Py_NewRef(v == G_MISSING ? p->missing : v));
    }
    ags_values_release(&table);
    return out;
}

/* run(f_locals, f_globals, f_builtins, signed=False) -> tuple or None:
 * the graph's inputs if every check passes, as the hook gets them. */
static PyObject *
program_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    g_program *p = (g_program *)self;
    PyObject *inputs = NULL;
    ags_gframe fr;
    int signed_frame = 0, ok;

    if (nargs == 4) {
        signed_frame = PyObject_IsTrue(args[3]);
        if (signed_frame < 0) {
            return NULL;
        }
        nargs = 3;
    }
    if (frame_args(p, args, nargs, NULL, &fr) < 0) {
        return NULL;
    }
    ok = run_program(p, &fr, signed_frame, &inputs, NULL);
    if (ok < 0) {
        return NULL;
    }
    if (ok == 0) {
        Py_RETURN_NONE;
    }
    return inputs;
}

/* why(f_locals, f_globals, f_builtins) -> None or (part, index): what
 * failed first in an evaluation on that frame (an AGS_PART_LIST name:
 * "check", "alias", "size", "probe"; the index into the program's own
 * lists), for recompile logs.  The passing path records nothing more than
 * a failing one does. */
static PyObject *
program_why(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    g_program *p = (g_program *)self;
    ags_gframe fr;
    g_why why;
    int ok;

    if (frame_args(p, args, nargs, NULL, &fr) < 0) {
        return NULL;
    }
    ok = run_program(p, &fr, 0, NULL, &why);
    if (ok < 0) {
        return NULL;
    }
    if (ok == 1) {
        Py_RETURN_NONE;
    }
    assert(why.part >= 0 && why.part < AGS_PART_COUNT);
    return Py_BuildValue("(On)", ags_gp_names.parts[why.part], why.index);
}

/* ------------------------------------------------------------------ */
/* The parser */

/* 0, or -1 with ValueError if `flags` has a bit AGS_GFLAG_LIST lacks. */
static int
parse_flags(int flags)
{
    int known = 0;

#define AGS_X(name, bit, doc) known |= (bit);
    AGS_GFLAG_LIST(AGS_X)
#undef AGS_X
    if (flags & ~known) {
        PyErr_Format(PyExc_ValueError, "bad guard flags %d: unknown "
                     "guard_flag bits %d (agspeed.protocol.GuardFlag)",
                     flags, flags & ~known);
        return -1;
    }
    return 0;
}

/* The program's own value table, for programs of more than 64 loads
 * (g_values), and the arrays of loads and checks. */
static int
allocate(g_program *p)
{
    if (p->n_loads > 64) {
        p->tvals = PyMem_Calloc((size_t)p->n_loads, sizeof(PyObject *));
        p->tvia = PyMem_Calloc((size_t)p->n_loads, 1);
        p->ttouched = PyMem_Calloc((size_t)p->n_loads, sizeof(Py_ssize_t));
        if (!p->tvals || !p->tvia || !p->ttouched) {
            return -1;
        }
    }
    p->outputs = PyMem_Calloc((size_t)p->n_outputs + 1, sizeof(int));
    p->loads = PyMem_Calloc((size_t)p->n_loads + 1, sizeof(g_load));
    p->checks = PyMem_Calloc((size_t)p->n_checks + 1, sizeof(g_check));
    return p->outputs && p->loads && p->checks ? 0 : -1;
}

/* _set_program(loads, checks, aliases, probes, step, missing, module_type,
 *              outputs, flags=0, symbolic=None, distinct=None)
 *   loads:  [(Load, parent, key[, arg])]   (arg: a LOCAL's argument slot,
 *           read by index from the hook; load.c says what each op takes)
 *   checks: [(slot, Check, a, b)]         (check.c says what (a, b) is)
 *   aliases: [(slot, slot)]        probes: ((fn, args, expected), ...)
 *   distinct: None or [slot], loads that must reach different objects
 *   outputs: [slot]                flags: GuardFlag bits
 *   symbolic: None or (n_syms, exprs, guard indices, fallback[, float
 *             load slots]), see guards/symbolic.c
 * An unknown Load, Check or flag is refused with ValueError. */
static PyObject *
program_set(PyObject *self, PyObject *args)
{
    g_program *p = (g_program *)self;
    PyObject *loads, *checks, *aliases, *probes, *step, *missing, *mtype;
    PyObject *outputs, *symbolic = Py_None, *distinct = Py_None;
    PyObject *batch_make = Py_None;
    int flags = 0;

    if (!PyArg_ParseTuple(args, "O!O!O!O!OOOO!|iOOO:_set_program",
                          &PyList_Type, &loads, &PyList_Type, &checks,
                          &PyList_Type, &aliases, &PyTuple_Type, &probes,
                          &step, &missing, &mtype, &PyList_Type, &outputs,
                          &flags, &symbolic, &distinct, &batch_make)) {
        return NULL;
    }
    if (batch_make != Py_None && !PyCallable_Check(batch_make)) {
        PyErr_SetString(PyExc_TypeError, "_set_program: tensor_batch must be "
                        "callable or None");
        return NULL;
    }
    if (distinct != Py_None && !PyList_Check(distinct)) {
        PyErr_SetString(PyExc_TypeError, "_set_program: distinct must be a "
                        "list or None");
        return NULL;
    }
    if (p->tbusy) {
        PyErr_SetString(PyExc_RuntimeError, "a guard program cannot be "
                        "compiled again while it is evaluated");
        return NULL;
    }
    program_release(p);
    if (parse_flags(flags) < 0) {
        return NULL;
    }
    p->flags = flags;
    if (ags_symtab_set(&p->sym, symbolic) < 0) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < p->sym.n_floats; i++) {
        if (p->sym.float_slots[i] >= PyList_GET_SIZE(loads)) {
            PyErr_SetString(PyExc_ValueError, "a float symbol names no load");
            ags_symtab_release(&p->sym);
            return NULL;
        }
    }
    p->n_outputs = PyList_GET_SIZE(outputs);
    p->n_loads = PyList_GET_SIZE(loads);
    p->n_checks = PyList_GET_SIZE(checks);
    if (allocate(p) < 0) {
        program_release(p);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < p->n_loads; i++) {
        if (ags_load_parse(&p->loads[i], PyList_GET_ITEM(loads, i), i) < 0) {
            goto bad;
        }
    }
    for (Py_ssize_t i = 0; i < p->n_checks; i++) {
        if (ags_check_parse(&p->checks[i], PyList_GET_ITEM(checks, i), i,
                            p) < 0) {
            goto bad;
        }
    }
    if (ags_alias_parse(p, aliases, distinct == Py_None ? NULL : distinct)
        < 0) {
        goto bad;
    }
    for (Py_ssize_t i = 0; i < p->n_outputs; i++) {
        int k = (int)PyLong_AsLong(PyList_GET_ITEM(outputs, i));
        if (k < 0 || k >= p->n_loads) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError, "bad guard output %zd", i);
            }
            goto bad;
        }
        p->outputs[i] = k;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(probes); i++) {
        PyObject *probe = PyTuple_GET_ITEM(probes, i);
        if (!PyTuple_Check(probe) || PyTuple_GET_SIZE(probe) != 3
            || !PyTuple_Check(PyTuple_GET_ITEM(probe, 1))) {
            PyErr_Format(PyExc_ValueError, "bad guard probe %zd", i);
            goto bad;
        }
    }
    if (mtype != Py_None) {
        if (!PyType_Check(mtype)) {
            PyErr_SetString(PyExc_TypeError, "module_type must be a type");
            goto bad;
        }
        p->module_type = Py_NewRef(mtype);
        p->module_getattr = Py_XNewRef(
            _PyType_Lookup((PyTypeObject *)mtype, ags_gp_names.getattr));
    }
    p->probes = Py_NewRef(probes);   /* last: it marks the program compiled */
    p->step = Py_NewRef(step);
    p->missing = Py_NewRef(missing);
    p->batch_make = batch_make == Py_None ? NULL : Py_NewRef(batch_make);
    Py_RETURN_NONE;
bad:
    program_release(p);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* The type */

static PyObject *
program_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    g_program *p = (g_program *)type->tp_alloc(type, 0);

    (void)args;
    (void)kwargs;
    if (p != NULL) {
        p->vectorcall = program_vectorcall;
    }
    return (PyObject *)p;
}

/* _memo() -> dict: the structure memo's state, for tests and reports. */
static PyObject *
program_memo(PyObject *self, PyObject *unused)
{
    (void)unused;
    return ags_memo_report((g_program *)self);
}

static PyObject *
program_size(PyObject *self, PyObject *unused)
{
    g_program *p = (g_program *)self;

    (void)unused;
    return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n}", "loads",
                         p->n_loads, "checks", p->n_checks, "aliases",
                         p->n_aliases, "distinct", p->n_distinct,
                         "probes", p->probes ? PyTuple_GET_SIZE(p->probes) : 0,
                         "outputs", p->n_outputs, "symbols", p->sym.n_syms,
                         "symbolic_guards", p->sym.n_guards);
}

static PyObject *
program_batches(PyObject *self, PyObject *unused)
{
    (void)unused;
    return ags_batch_report((g_program *)self);
}

static int
program_traverse(PyObject *self, visitproc visit, void *arg)
{
    g_program *p = (g_program *)self;

    Py_VISIT(Py_TYPE(self));
    for (Py_ssize_t i = 0; i < p->n_loads; i++) {
        Py_VISIT(p->loads[i].key);
    }
    for (Py_ssize_t i = 0; i < p->n_checks; i++) {
        Py_VISIT(p->checks[i].a);
        Py_VISIT(p->checks[i].b);
    }
    Py_VISIT(p->memo.root_ref);
    Py_VISIT(p->probes);
    Py_VISIT(p->step);
    Py_VISIT(p->missing);
    Py_VISIT(p->module_type);
    Py_VISIT(p->module_getattr);
    Py_VISIT(p->sym.fallback);
    return ags_batch_traverse(p, visit, arg);
}

static int
program_clear(PyObject *self)
{
    program_release((g_program *)self);
    return 0;
}

static void
program_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    if (((g_program *)self)->weakreflist != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    program_release((g_program *)self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef program_methods[] = {
    {"_set_program", program_set, METH_VARARGS,
     "_set_program(loads, checks, aliases, probes, step, missing, "
     "module_type, outputs, flags=0, symbolic=None, distinct=None, "
     "tensor_batch=None): compile the program (see guards/program.c; "
     "tensor_batch: guards/batch.c)."},
    {"read", (PyCFunction)(void (*)(void))program_read, METH_FASTCALL,
     "read(f_locals, f_globals, f_builtins) -> tuple: the values of the "
     "output loads (the graph's inputs), MISSING where none."},
    {"run", (PyCFunction)(void (*)(void))program_run, METH_FASTCALL,
     "run(f_locals, f_globals, f_builtins, signed=False) -> tuple or None: "
     "the graph's inputs if every check passes (signed: the frame's "
     "signature matched, so its arguments' tensor checks are settled)."},
    {"why", (PyCFunction)(void (*)(void))program_why, METH_FASTCALL,
     "why(f_locals, f_globals, f_builtins) -> None or (part, index): what "
     "failed first on that frame, by agspeed.protocol.Part id: a 'check', "
     "'alias', 'size' guard (index len(guards): the Python fallback) or "
     "'probe', by index."},
    {"_memo", program_memo, METH_NOARGS,
     "_memo() -> dict: the structure memo (valid, remembered loads, skipped "
     "checks, witnesses, watched, and evaluations with and without it)."},
    {"_batches", program_batches, METH_NOARGS,
     "_batches() -> dict: the checkers of deferred tensor checks (tensors "
     "each, and whether one was made), refusals, and whether batching was "
     "given up (guards/batch.c)."},
    {"_program_size", program_size, METH_NOARGS,
     "_program_size() -> dict: how many loads, checks, aliases and probes."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef program_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(g_program, weakreflist),
     READONLY, NULL},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(g_program, vectorcall),
     READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot program_slots[] = {
    {Py_tp_doc, "A cache entry's guard, compiled to C (guards/program.c)."
                "\n\nCall it with (f_locals, f_globals, f_builtins): True if "
                "every check passes."},
    {Py_tp_new, program_new},
    {Py_tp_call, program_call},
    {Py_tp_dealloc, program_dealloc},
    {Py_tp_traverse, program_traverse},
    {Py_tp_clear, program_clear},
    {Py_tp_methods, program_methods},
    {Py_tp_members, program_members},
    {0, NULL},
};

PyType_Spec ags_guard_spec = {
    .name = "agspeed._C.GuardProgram",
    .basicsize = sizeof(g_program),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = program_slots,
};

/* New reference: the interned lower-case form of a table's row name. */
static PyObject *
intern_lower(const char *upper)
{
    char buf[64];
    size_t n = strlen(upper);

    if (n >= sizeof(buf)) {
        PyErr_SetString(PyExc_SystemError, "guard program: a long row name");
        return NULL;
    }
    for (size_t k = 0; k <= n; k++) {
        buf[k] = (char)tolower((unsigned char)upper[k]);
    }
    return PyUnicode_InternFromString(buf);
}

int
ags_guard_init(void)
{
    static const char *const stores[] = {"_parameters", "_buffers",
                                         "_modules"};
    static const char *const parts[] = {
#define AGS_X(NAME, doc) #NAME,
        AGS_PART_LIST(AGS_X)
#undef AGS_X
    };
    g_names *s = &ags_gp_names;

    if (s->getattr != NULL) {
        return 0;
    }
    if (ags_tensor_names_init() < 0) {
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        s->stores[i] = PyUnicode_InternFromString(stores[i]);
        if (s->stores[i] == NULL) {
            return -1;
        }
    }
    for (int i = 0; i < AGS_LOAD_COUNT; i++) {
        /* ags_protocol_init ran first (module.c) */
        s->loads[i] = PyUnicode_InternFromString(ags_load_names[i]);
        if (s->loads[i] == NULL) {
            return -1;
        }
    }
    for (int i = 0; i < AGS_PART_COUNT; i++) {
        s->parts[i] = intern_lower(parts[i]);
        if (s->parts[i] == NULL) {
            return -1;
        }
    }
    if (ags_memo_init() < 0) {
        return -1;
    }
    s->grad = PyUnicode_InternFromString("grad");
    s->torch_parameter = PyUnicode_InternFromString("torch.nn.parameter");
    s->class_ = PyUnicode_InternFromString("__class__");
    s->builtins = PyUnicode_InternFromString("__builtins__");
    if (s->grad == NULL || s->torch_parameter == NULL || s->class_ == NULL
        || s->builtins == NULL) {
        return -1;
    }
    /* last: it marks the names complete */
    s->getattr = PyUnicode_InternFromString("__getattr__");
    return s->getattr != NULL ? 0 : -1;
}
