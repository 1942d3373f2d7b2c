/* program.c: guard programs, the checks of a cache entry evaluated in C.
 *
 * A GuardProgram is what agspeed._capture.Guard compiles its checks into:
 *
 *   loads   one per source, parents first: how to reach a value from the
 *           frame (a local, a global, a global of a module, an attribute,
 *           an item, a closure cell, a type).  Values are found on demand
 *           and kept for the rest of the evaluation (children share the
 *           parent's lookup).
 *   checks  (load, kind, expected): a tensor's type, dtype, device, shape,
 *           strides and requires_grad; a plain value's type and equality;
 *           a container's type and length; an object's identity (held
 *           weakly where it can be); an attribute's absence.
 *   aliases pairs of loads that must reach one object (tied weights).
 *   probes  (function, args, expected): torch's global state (grad mode,
 *           autocast, default dtype) read by torch's own C functions.
 *   symbols for a graph with dynamic dimensions: a DYNTENSOR check is a
 *           tensor check whose sizes may be symbols and whose strides may
 *           be expressions of them, and guard expressions over the
 *           symbols must hold (guards/symbolic.c).
 *
 * Calling the program with (f_locals, f_globals, f_builtins) answers True
 * or False.  It runs no user code: attributes are found the way
 * agspeed._sources.static_attr finds them, in C for the common cases (a
 * Python module's dict; an object's class attribute, instance dict, or
 * nn.Module store), and by calling that Python function for the rest
 * (descriptors, classes, super objects, custom __getattr__), so both
 * always agree.  The evaluation makes no Python object on the common path
 * but a tensor's shape, device and strides.
 *
 * Which check failed, with old and new values, is the Python Guard's job
 * (failures()): it runs only on a miss.
 */
#include "guards.h"
#include <structmember.h>

enum { L_LOCAL, L_GLOBAL, L_GMOD, L_ATTR, L_ITEM, L_CELL, L_TYPE, L_FGET };
#define L_LAST L_FGET
enum { C_TENSOR, C_EQ, C_LEN, C_ID, C_ABSENT, C_DYNTENSOR };
#define C_LAST C_DYNTENSOR

typedef struct {
    int op;
    int parent;          /* index of the parent load, or -1 */
    int arg;             /* LOCAL: its argument slot, or -1 (read by name) */
    PyObject *key;       /* name, index, (module, name) or the source */
} g_load;

typedef struct {
    int slot;
    int kind;
    PyObject *a;         /* TENSOR/EQ/LEN: the type; ID: object or weakref */
    PyObject *b;         /* TENSOR: (dtype, device, shape, stride, grad);
                            DYNTENSOR: the same, sizes < 0 naming symbols
                            and strides < 0 expressions (symbolic.c);
                            EQ: the value; ID: True if a is a weakref */
    Py_ssize_t n;        /* LEN: the length */
} g_check;

/* A fact the structure memo relies on (see "The structure memo" below). */
enum { W_TYPEOF, W_DICTPTR, W_DICT };

typedef struct {
    int kind;
    PyObject *obj;       /* borrowed: TYPEOF/DICTPTR: the object; DICT: the dict */
    PyObject *dict;      /* borrowed: DICTPTR: the object's __dict__ */
    PyObject **where;    /* DICTPTR: where the object keeps its __dict__ (fixed
                            by its type's layout, which TYPEOF before it keeps) */
    PyTypeObject *type;  /* borrowed: TYPEOF: the object's type */
    uint64_t version;    /* TYPEOF: the type's version tag; DICTPTR/DICT: the
                            dict's version tag */
    int repeat;          /* TYPEOF: an earlier witness has the same type, so
                            its version is read once */
} g_witness;

typedef struct {
    int valid;
    int slot;            /* the root: a local holding an nn.Module */
    PyObject *root_ref;  /* a weak reference to it (owned) */
    char *frozen;        /* per load: its value is remembered */
    PyObject **values;   /* per load: the remembered value (borrowed) */
    char *skip;          /* per check: implied while the memo holds */
    int *live;           /* the other checks' indices, in order */
    Py_ssize_t n_live;
    int *typeof_w;       /* indices of the TYPEOF witnesses */
    Py_ssize_t n_typeof;
    char *skip_alias;    /* per alias */
    g_witness *w;
    Py_ssize_t n_w, cap_w;
    uint64_t epoch;      /* watchers: ags_watch_epoch when last confirmed */
    int watched;         /* every dict and type of `w` is watched */
    uint64_t fast, full; /* evaluations through the memo, and without */
    uint64_t builds;
} g_memo;

/* Program flags (_set_program's last argument). */
#define P_CHECK_KNOWN_TENSORS 1   /* tensor checks run even on remembered
                                     parameters and buffers */
#define P_NO_MEMO 2               /* never remember structure */

typedef struct g_program_ {
    PyObject_HEAD
    g_load *loads;
    Py_ssize_t n_loads;
    g_check *checks;
    Py_ssize_t n_checks;
    int *aliases;        /* pairs */
    Py_ssize_t n_aliases;
    PyObject *probes;    /* tuple of (fn, args, expected) */
    PyObject *step;      /* Python fallback: step(kind, base, key) */
    PyObject *missing;   /* agspeed._sources.MISSING */
    PyObject *module_type;   /* torch.nn.Module */
    PyObject *module_getattr;    /* torch.nn.Module.__getattr__ */
    int *outputs;        /* loads read() returns, in order */
    Py_ssize_t n_outputs;
    int flags;           /* P_* */
    ags_symtab sym;      /* symbols, expressions, guards (dynamic shapes) */
    PyObject **tvals;    /* the program's own value table (> 64 loads): */
    char *tvia;          /* all NULL / 0 between evaluations */
    Py_ssize_t *ttouched;
    int tbusy;           /* an evaluation is using it */
    g_memo memo;
    PyObject *weakreflist;
    vectorcallfunc vectorcall;
} g_program;

/* The marker of a load that reached nothing (distinct from any object). */
static PyObject missing_marker;
#define G_MISSING (&missing_marker)

static PyObject *s_getattr, *s_stores[3];
static PyObject *s_kinds[L_LAST + 1];

static void memo_release(g_memo *m);

static void
program_release(g_program *p)
{
    memo_release(&p->memo);
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
    PyMem_Free(p->aliases);
    PyMem_Free(p->outputs);
    p->outputs = NULL;
    p->n_outputs = 0;
    p->loads = NULL;
    p->checks = NULL;
    p->aliases = NULL;
    p->n_loads = p->n_checks = p->n_aliases = 0;
    Py_CLEAR(p->probes);
    Py_CLEAR(p->step);
    Py_CLEAR(p->missing);
    Py_CLEAR(p->module_type);
    Py_CLEAR(p->module_getattr);
    ags_symtab_release(&p->sym);
}

/* ------------------------------------------------------------------ */
/* Loads */

/* step(kind, base, key) in Python: a new reference, G_MISSING, or NULL. */
static PyObject *
fallback(g_program *p, int op, PyObject *base, PyObject *key)
{
    PyObject *args[3] = {s_kinds[op], base, key};
    PyObject *out = PyObject_Vectorcall(p->step, args, 3, NULL);

    if (out == p->missing) {
        Py_DECREF(out);
        return G_MISSING;
    }
    return out;
}

/* Where load_attr found an attribute, when the structure memo can watch
 * that place: the class (a function, a constant or a property) or the
 * instance dict; an nn.Module store (VIA_STORE + 0, 1, 2: _parameters,
 * _buffers, _modules, searched in that order); or nowhere, having searched
 * all three.  The memo witnesses what the answer depended on: the type and
 * the instance dict, and the stores up to the one that answered. */
enum { VIA_PYTHON, VIA_CLASS_OR_DICT, VIA_STORE, VIA_NOWHERE = VIA_STORE + 3 };

/* New reference to base.<name> as static_attr finds it, or G_MISSING.
 * *via says where the answer came from (VIA_PYTHON when Python found it). */
static PyObject *
load_attr(g_program *p, PyObject *base, PyObject *name, int *via)
{
    PyTypeObject *cls = Py_TYPE(base);
    PyObject *found, *dict = NULL, *value = NULL;
    int is_module;

    *via = VIA_PYTHON;

    if (PyModule_Check(base)) {
        value = PyDict_GetItemWithError(PyModule_GetDict(base), name);
        if (value == NULL) {
            return PyErr_Occurred() ? NULL : G_MISSING;
        }
        return Py_NewRef(value);
    }
    if (PyType_Check(base) || PyObject_TypeCheck(base, &PySuper_Type)
        || !(cls->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        return fallback(p, L_ATTR, base, name);
    }
    found = _PyType_Lookup(cls, name);     /* borrowed */
    if (found != NULL) {
        if (Py_IS_TYPE(found, &PyProperty_Type)) {
            *via = VIA_CLASS_OR_DICT;
            return Py_NewRef(found);
        }
        if (Py_TYPE(found)->tp_descr_set != NULL) {
            return fallback(p, L_ATTR, base, name);
        }
        Py_INCREF(found);  /* the dict lookup below may run no code, but */
    }                      /* hold it across the calls anyway */
    dict = PyObject_GenericGetDict(base, NULL);
    if (dict == NULL) {
        PyErr_Clear();
    }
    else if (PyDict_CheckExact(dict)) {
        value = PyDict_GetItemWithError(dict, name);
        if (value != NULL) {
            Py_XDECREF(found);
            Py_INCREF(value);
            Py_DECREF(dict);
            *via = VIA_CLASS_OR_DICT;
            return value;
        }
        if (PyErr_Occurred()) {
            goto error;
        }
    }
    if (found != NULL) {
        PyTypeObject *kind = Py_TYPE(found);
        Py_XDECREF(dict);
        if (kind == &PyFunction_Type || kind->tp_descr_get == NULL
            || kind == &PyCFunction_Type || kind == &PyType_Type) {
            *via = VIA_CLASS_OR_DICT;
            return found;   /* a method's function, or a class constant */
        }
        Py_DECREF(found);
        return fallback(p, L_ATTR, base, name);
    }
    is_module = p->module_type != NULL
                && PyObject_TypeCheck(base, (PyTypeObject *)p->module_type);
    if (is_module && dict != NULL && PyDict_CheckExact(dict)) {
        for (int s = 0; s < 3; s++) {
            PyObject *store = PyDict_GetItemWithError(dict, s_stores[s]);
            if (store != NULL && PyDict_CheckExact(store)) {
                value = PyDict_GetItemWithError(store, name);
                if (value != NULL) {
                    Py_INCREF(value);
                    Py_DECREF(dict);
                    *via = VIA_STORE + s;
                    return value;
                }
            }
            if (PyErr_Occurred()) {
                goto error;
            }
        }
        if (_PyType_Lookup(cls, s_getattr) == p->module_getattr) {
            Py_DECREF(dict);
            *via = VIA_NOWHERE;
            return G_MISSING;
        }
    }
    Py_XDECREF(dict);
    return fallback(p, L_ATTR, base, name);
error:
    Py_XDECREF(found);
    Py_XDECREF(dict);
    return NULL;
}

/* New reference to sys.modules[name], or NULL (an error set or not), as
 * sys.modules.get(name) reads it.  Not PyImport_GetModule: that also asks
 * the module's spec whether it is still being imported, an attribute
 * lookup that fails (and makes an exception) for every initialized module,
 * about a thousand instructions per load on 3.11. */
static PyObject *
sys_module(PyObject *name)
{
    PyObject *modules = PyImport_GetModuleDict();   /* borrowed */
    PyObject *mod;

    if (modules == NULL || !PyDict_CheckExact(modules)) {
        return PyImport_GetModule(name);   /* sys.modules replaced: the slow way */
    }
    mod = PyDict_GetItemWithError(modules, name);
    return Py_XNewRef(mod);
}

static PyObject *
load_item(g_program *p, PyObject *base, PyObject *key)
{
    PyObject *value;

    if ((PyTuple_CheckExact(base) || PyList_CheckExact(base))
        && PyLong_CheckExact(key)) {
        Py_ssize_t n = Py_SIZE(base), i = PyLong_AsSsize_t(key);
        if (i == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (i < 0) {
            i += n;
        }
        if (i < 0 || i >= n) {
            return G_MISSING;
        }
        return Py_NewRef(PyTuple_CheckExact(base) ? PyTuple_GET_ITEM(base, i)
                                                  : PyList_GET_ITEM(base, i));
    }
    if (PyDict_CheckExact(base)) {
        value = PyDict_GetItemWithError(base, key);
        if (value == NULL) {
            return PyErr_Occurred() ? NULL : G_MISSING;
        }
        return Py_NewRef(value);
    }
    return fallback(p, L_ITEM, base, key);
}

static PyObject *
load_global(PyObject *globals, PyObject *builtins, PyObject *name)
{
    PyObject *value = PyDict_GetItemWithError(globals, name);

    if (value == NULL && !PyErr_Occurred() && builtins != NULL) {
        value = PyDict_GetItemWithError(builtins, name);
    }
    if (value == NULL) {
        return PyErr_Occurred() ? NULL : G_MISSING;
    }
    return Py_NewRef(value);
}

/* The per-call table of load values: on the stack for small programs;
 * for large ones the program's own table (kept all NULL between
 * evaluations, so that an evaluation through the memo, which fills a few
 * loads of a thousand, costs nothing per load it does not touch), or a
 * fresh one while that is in use (a probe's Python call let another
 * evaluation of the program start).
 * via[i]: load i was answered in C from a place the memo can watch. */
typedef struct {
    PyObject *small[64];
    char small_via[64];
    PyObject **vals;
    char *via;
    Py_ssize_t n;
    Py_ssize_t *touched;     /* the program's table: loads filled, in order */
    Py_ssize_t n_touched;
    struct g_program_ *owner;    /* the program whose table this is */
    const char *frozen;      /* while the memo holds: its remembered loads, */
    PyObject *const *known;  /* answered from it without a reference */
} g_values;

/* Borrowed: the frame's locals by name, made from the interpreter frame
 * on first need (the caller of the program then owns it).  NULL with an
 * exception on error. */
static PyObject *
frame_locals(ags_gframe *fr)
{
    if (fr->f_locals == NULL && fr->iframe != NULL) {
        fr->f_locals = ags_frame_locals(fr->iframe);
    }
    if (fr->f_locals == NULL && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_SystemError, "guard program: no locals to read");
    }
    return fr->f_locals;
}

/* Borrowed: the local of load `ld` (an argument slot when the frame gives
 * them and the load names an argument; else by name), G_MISSING if
 * unbound, or NULL with an exception. */
static PyObject *
load_local(ags_gframe *fr, const g_load *ld)
{
    PyObject *locals, *out;

    if (fr->args != NULL && ld->arg >= 0 && ld->arg < fr->nargs) {
        out = fr->args[ld->arg];
        return out != NULL ? out : G_MISSING;
    }
    locals = frame_locals(fr);
    if (locals == NULL) {
        return NULL;
    }
    out = PyDict_GetItemWithError(locals, ld->key);
    return out != NULL ? out : PyErr_Occurred() ? NULL : G_MISSING;
}

/* vals[i]: the value of load i (new reference or G_MISSING), found on
 * first use.  NULL with an exception on error. */
static PyObject *
value_of(g_program *p, g_values *t, Py_ssize_t i, ags_gframe *frame)
{
    PyObject **vals = t->vals;
    g_load *ld = &p->loads[i];
    PyObject *base = NULL, *out;

    if (vals[i] != NULL) {
        return vals[i];
    }
    if (t->frozen != NULL && t->frozen[i]) {
        return t->known[i];
    }
    if (ld->parent >= 0) {
        base = value_of(p, t, ld->parent, frame);
        if (base == NULL) {
            return NULL;
        }
        if (base == G_MISSING) {
            return vals[i] = G_MISSING;
        }
    }
    switch (ld->op) {
    case L_LOCAL:
        out = load_local(frame, ld);
        if (out != NULL && out != G_MISSING) {
            Py_INCREF(out);
        }
        break;
    case L_GLOBAL:
        out = load_global(frame->globals, frame->builtins, ld->key);
        break;
    case L_GMOD: {
        PyObject *mod = sys_module(PyTuple_GET_ITEM(ld->key, 0));
        PyObject *name = PyTuple_GET_ITEM(ld->key, 1), *hit = NULL;

        if (mod == NULL) {
            out = PyErr_Occurred() ? NULL : G_MISSING;
            break;
        }
        if (PyModule_Check(mod)) {  /* the module's own global, in C */
            hit = PyDict_GetItemWithError(PyModule_GetDict(mod), name);
        }
        out = hit ? Py_NewRef(hit) : PyErr_Occurred() ? NULL
                                   : fallback(p, L_GMOD, mod, name);
        Py_DECREF(mod);
        break;
    }
    case L_ATTR: {
        int via;
        out = load_attr(p, base, ld->key, &via);
        t->via[i] = (char)via;
        break;
    }
    case L_ITEM:
        out = load_item(p, base, ld->key);
        break;
    case L_CELL: {
        PyObject *closure = PyFunction_Check(base) ? PyFunction_GetClosure(base)
                                                   : NULL;
        Py_ssize_t k = PyLong_AsSsize_t(ld->key);
        if (closure != NULL && k >= 0 && k < PyTuple_GET_SIZE(closure)) {
            PyObject *c = PyCell_GET(PyTuple_GET_ITEM(closure, k));
            out = c ? Py_NewRef(c) : G_MISSING;
        }
        else {
            out = fallback(p, L_CELL, base, ld->key);
        }
        break;
    }
    case L_TYPE:
        out = Py_NewRef((PyObject *)Py_TYPE(base));
        break;
    default:  /* L_FGET */
        out = fallback(p, L_FGET, base, ld->key);
        break;
    }
    if (out != NULL && t->touched != NULL) {
        t->touched[t->n_touched++] = i;
    }
    return vals[i] = out;
}

/* ------------------------------------------------------------------ */
/* Checks */

/* 1 if the int sequence seq (a tuple or torch.Size) equals the tuple of
 * ints want, 0 if not, -1 on error. */
static int
same_ints(PyObject *seq, PyObject *want)
{
    Py_ssize_t n = PyTuple_GET_SIZE(want);

    if (!PyTuple_Check(seq) || PyTuple_GET_SIZE(seq) != n) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(seq, i), *b = PyTuple_GET_ITEM(want, i);
        if (a != b) {
            long long x = PyLong_AsLongLong(a), y = PyLong_AsLongLong(b);
            if ((x == -1 || y == -1) && PyErr_Occurred()) {
                return -1;
            }
            if (x != y) {
                return 0;
            }
        }
    }
    return 1;
}

/* 1 if v.<name> is `want` (dtypes and bools are singletons), 0 if not,
 * -1 on error. */
static int
attr_is(PyObject *v, PyObject *name, PyObject *want)
{
    PyObject *got = PyObject_GetAttr(v, name);

    if (got == NULL) {
        return -1;
    }
    Py_DECREF(got);   /* only its address is compared */
    return got == want;
}

/* same_ints on `seq`, a new reference (NULL: making it failed). */
static int
ints_are(PyObject *seq, PyObject *want)
{
    int ok;

    if (seq == NULL) {
        return -1;
    }
    ok = same_ints(seq, want);
    Py_DECREF(seq);
    return ok;
}

static int
check_tensor(PyObject *v, const g_check *c)
{
    PyObject *spec = c->b, *device;
    int ok;

    if ((PyObject *)Py_TYPE(v) != c->a) {
        return 0;
    }
    ok = attr_is(v, ags_tnames.dtype, PyTuple_GET_ITEM(spec, 0));
    if (ok == 1) {
        ok = attr_is(v, ags_tnames.requires_grad, PyTuple_GET_ITEM(spec, 4));
    }
    if (ok == 1) {
        ok = ints_are(PyObject_GetAttr(v, ags_tnames.shape), PyTuple_GET_ITEM(spec, 2));
    }
    if (ok == 1) {
        ok = ints_are(PyObject_CallMethodNoArgs(v, ags_tnames.stride),
                      PyTuple_GET_ITEM(spec, 3));
    }
    if (ok == 1) {
        device = PyObject_GetAttr(v, ags_tnames.device);
        ok = device == NULL ? -1 : PyObject_RichCompareBool(device, PyTuple_GET_ITEM(spec, 1),
                                                           Py_EQ);
        Py_XDECREF(device);
    }
    return ok;
}

static int
check_one(g_program *p, ags_symvals *sv, const g_check *c, PyObject *v)
{
    if (c->kind == C_ABSENT) {
        return v == G_MISSING;
    }
    if (v == G_MISSING) {
        return 0;
    }
    switch (c->kind) {
    case C_TENSOR:
        return check_tensor(v, c);
    case C_DYNTENSOR:
        return ags_sym_check_tensor(&p->sym, sv, v, c->a, c->b);
    case C_EQ:
        /* plain types only (ints, strings, dtypes, tuples of them): their
         * equality runs no user code */
        return (PyObject *)Py_TYPE(v) == c->a
               && PyObject_RichCompareBool(v, c->b, Py_EQ);
    case C_LEN: {
        Py_ssize_t n;
        if ((PyObject *)Py_TYPE(v) != c->a) {
            return 0;
        }
        n = PyObject_Size(v);
        return n < 0 ? -1 : n == c->n;
    }
    case C_ID: {
        if (c->b == Py_True) {
            /* only the address is compared: no reference needs keeping */
            PyObject *held = ags_compat_weak_target(c->a);
            return held != NULL && held == v;
        }
        return v == c->a;
    }
    }
    return 0;
}

static int
values_init(g_values *v, g_program *p)
{
    Py_ssize_t n = p->n_loads;

    v->n = n;
    v->touched = NULL;
    v->n_touched = 0;
    v->owner = NULL;
    v->frozen = NULL;
    v->known = NULL;
    if (n <= 64) {
        memset(v->small, 0, sizeof(v->small));
        memset(v->small_via, 0, sizeof(v->small_via));
        v->vals = v->small;
        v->via = v->small_via;
    }
    else if (p->tvals != NULL && !p->tbusy) {
        p->tbusy = 1;
        v->owner = p;
        v->vals = p->tvals;
        v->via = p->tvia;
        v->touched = p->ttouched;
    }
    else {
        v->vals = PyMem_Calloc((size_t)n, sizeof(PyObject *) + 1);
        if (v->vals == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        v->via = (char *)(v->vals + n);
    }
    return 0;
}

static void
release_value(PyObject *value)
{
    if (value != NULL && value != G_MISSING) {
        Py_DECREF(value);
    }
}

static void
values_release(g_values *v)
{
    if (v->owner != NULL) {
        /* Clear the table first, moving each value into `touched`, then
         * release them while the table is still marked busy: a finalizer
         * that evaluates the program again takes a fresh table. */
        for (Py_ssize_t k = 0; k < v->n_touched; k++) {
            Py_ssize_t i = v->touched[k];
            v->touched[k] = (Py_ssize_t)(intptr_t)v->vals[i];
            v->vals[i] = NULL;
            v->via[i] = 0;
        }
        for (Py_ssize_t k = 0; k < v->n_touched; k++) {
            release_value((PyObject *)(intptr_t)v->touched[k]);
        }
        v->owner->tbusy = 0;
        return;
    }
    for (Py_ssize_t i = 0; i < v->n; i++) {
        release_value(v->vals[i]);
    }
    if (v->vals != v->small) {
        PyMem_Free(v->vals);
    }
}

/* ------------------------------------------------------------------ */
/* The structure memo
 *
 * Most of a model's guard is about its structure: each submodule is the
 * same object, has no hooks, is in the same training mode, and each
 * parameter is the same tensor.  Checking all of it costs time in
 * proportion to the model.  After an evaluation that passed, the memo
 * remembers the values of the loads below the frame's nn.Module argument
 * (the root, `self`) that were answered in C from places it can watch, and
 * the facts that keep those answers valid (witnesses):
 *
 *   TYPEOF   an object still has its type, and the type's version tag is
 *            unchanged (no attribute of it or of its bases was set since);
 *   DICTPTR  an object's __dict__ is the same dict, with the same version;
 *   DICT     a dict reached from there (an nn.Module store, a hook dict, a
 *            dict indexed by the program) has the same version.
 *
 * CPython gives a dict a new version tag on every change, so while the
 * root is the same object and the witnesses hold, every remembered load
 * would find the same object again and the checks on them (identity,
 * equality of immutable values, absence, lengths of remembered dicts and
 * tuples) would answer as before: they are skipped.  So are tensor checks
 * on remembered tensors (parameters and buffers): a tensor's metadata
 * changed in place (`p.data = other`) without any dict changing is not
 * seen, unless the program has P_CHECK_KNOWN_TENSORS.
 *
 * Witnesses are kept in load order, parents first, and checked in that
 * order: an object is looked at only after the facts that keep it alive
 * held, so no pointer is followed to a freed object.
 *
 * With watchers (3.12+) every witnessed dict and type is watched, and any
 * change to any of them bumps ags_watch_epoch.  While the epoch has not
 * moved since the memo was last confirmed no version needs reading: a
 * confirmed memo costs the root's identity and one type comparison per
 * object, whatever the model's size.
 */

static uint64_t ags_watch_epoch;
#ifdef AGS_HAVE_WATCHERS
static int dict_watcher = -1, type_watcher = -1;

static int
on_dict_event(PyDict_WatchEvent event, PyObject *dict, PyObject *key,
              PyObject *new_value)
{
    (void)event;
    (void)dict;
    (void)key;
    (void)new_value;
    ags_watch_epoch++;
    return 0;
}

static int
on_type_event(PyTypeObject *type)
{
    (void)type;
    ags_watch_epoch++;
    return 0;
}
#endif

static void
memo_release(g_memo *m)
{
    Py_CLEAR(m->root_ref);
    PyMem_Free(m->frozen);
    PyMem_Free(m->values);
    PyMem_Free(m->skip);
    PyMem_Free(m->live);
    PyMem_Free(m->typeof_w);
    PyMem_Free(m->skip_alias);
    PyMem_Free(m->w);
    memset(m, 0, sizeof(*m));
}

static int
add_witness(g_memo *m, int kind, PyObject *obj, PyObject *dict)
{
    g_witness *w;

    if (m->n_w == m->cap_w) {
        Py_ssize_t cap = m->cap_w ? 2 * m->cap_w : 16;
        g_witness *grown = PyMem_Realloc(m->w, (size_t)cap * sizeof(g_witness));
        if (grown == NULL) {
            return -1;
        }
        m->w = grown;
        m->cap_w = cap;
    }
    w = &m->w[m->n_w++];
    w->kind = kind;
    w->obj = obj;
    w->dict = dict;
    w->where = NULL;
    w->type = Py_TYPE(obj);
    w->version = 0;
    w->repeat = 0;
    return 0;
}

/* The witnesses of the loads answered in C on `obj`: its type, its
 * __dict__ and, for an nn.Module, its first `stores` stores. */
static int
witness_object(g_program *p, PyObject *obj, int stores)
{
    g_memo *m = &p->memo;
    PyObject **dp, *dict;

    if (add_witness(m, W_TYPEOF, obj, NULL) < 0) {
        return -1;
    }
    dp = _PyObject_GetDictPtr(obj);
    if (dp == NULL || *dp == NULL) {
        PyErr_Clear();
        return 0;        /* no instance dict: attributes come from the type */
    }
    dict = *dp;
    if (!PyDict_Check(dict) || add_witness(m, W_DICTPTR, obj, dict) < 0) {
        return -1;
    }
    m->w[m->n_w - 1].where = dp;
    if (PyObject_TypeCheck(obj, (PyTypeObject *)p->module_type)) {
        for (int s = 0; s < stores; s++) {
            PyObject *store = PyDict_GetItemWithError(dict, s_stores[s]);
            if (store == NULL && PyErr_Occurred()) {
                return -1;
            }
            if (store != NULL && PyDict_Check(store)
                && add_witness(m, W_DICT, store, store) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* The witnesses of load `slot`'s value, once per evaluation (seen[slot]):
 * an object's, for attribute answers that went as deep as `via`, or with
 * via 0 a dict's version alone. */
static int
witness_once(g_program *p, char *seen, Py_ssize_t slot, PyObject *obj, int via)
{
    if (seen[slot]) {
        return 0;
    }
    seen[slot] = 1;
    if (via == VIA_PYTHON) {
        return add_witness(&p->memo, W_DICT, obj, obj);
    }
    return witness_object(p, obj, via >= VIA_NOWHERE ? 3 : via - VIA_CLASS_OR_DICT);
}

/* Builds the memo from a passing evaluation's values (t).  Failures leave
 * no memo: it is an optimization only. */
static void
memo_build(g_program *p, g_values *t)
{
    g_memo *m = &p->memo;
    Py_ssize_t n = p->n_loads;
    char *seen, *depth;
    int root = -1;

    m->valid = 0;
    Py_CLEAR(m->root_ref);
    m->n_w = 0;
    if ((p->flags & P_NO_MEMO) || p->module_type == NULL) {
        return;
    }
    for (Py_ssize_t i = 0; i < n && root < 0; i++) {
        PyObject *v = t->vals[i];
        if (p->loads[i].op == L_LOCAL && v != NULL && v != G_MISSING
            && PyObject_TypeCheck(v, (PyTypeObject *)p->module_type)
            && Py_TYPE(v)->tp_weaklistoffset != 0) {
            root = (int)i;
        }
    }
    if (root < 0) {
        return;
    }
    if (m->frozen == NULL) {
        m->frozen = PyMem_Calloc((size_t)n + 1, 3);  /* frozen, seen, depth */
        m->values = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
        m->skip = PyMem_Calloc((size_t)p->n_checks + 1, 1);
        m->live = PyMem_Calloc((size_t)p->n_checks + 1, sizeof(int));
        m->skip_alias = PyMem_Calloc((size_t)p->n_aliases + 1, 1);
        if (!m->frozen || !m->values || !m->skip || !m->live || !m->skip_alias) {
            memo_release(m);
            PyErr_Clear();
            return;
        }
    }
    seen = m->frozen + n;     /* objects already witnessed, by load */
    depth = seen + n;         /* how deep attribute answers on it went */
    memset(m->frozen, 0, 3 * (size_t)n);
    m->slot = root;
    m->frozen[root] = 1;
    /* Which loads are remembered, and what each object's answers depended
     * on; then the witnesses, parents first. */
    for (int pass = 0; pass < 2; pass++) {
        for (Py_ssize_t i = root + 1; i < n; i++) {
            g_load *ld = &p->loads[i];
            PyObject *v = t->vals[i], *base;
            int via = -1;      /* not remembered */

            if (v == NULL || ld->parent < 0 || !m->frozen[ld->parent]) {
                continue;
            }
            base = t->vals[ld->parent];
            if (base == G_MISSING) {
                continue;
            }
            if (ld->op == L_ATTR && t->via[i] != VIA_PYTHON) {
                via = t->via[i];
            }
            else if (ld->op == L_TYPE) {
                via = VIA_CLASS_OR_DICT;
            }
            else if (ld->op == L_ITEM && PyTuple_CheckExact(base)) {
                via = -2;      /* remembered, nothing to witness */
            }
            else if (ld->op == L_ITEM && PyDict_CheckExact(base)) {
                via = VIA_PYTHON;
            }
            if (pass == 0) {
                m->frozen[i] = via != -1;
                if (via > depth[ld->parent]) {
                    depth[ld->parent] = (char)via;
                }
            }
            else if (via >= 0
                     && witness_once(p, seen, ld->parent, base,
                                     via == VIA_PYTHON ? via : depth[ld->parent]) < 0) {
                goto fail;
            }
        }
    }
    for (Py_ssize_t c = 0; c < p->n_checks; c++) {
        g_check *ck = &p->checks[c];
        PyObject *v = t->vals[ck->slot];
        int skip = 0;

        if (m->frozen[ck->slot] && v != NULL) {
            switch (ck->kind) {
            case C_ID:
            case C_EQ:
            case C_ABSENT:
                skip = 1;
                break;
            case C_TENSOR:
                skip = !(p->flags & P_CHECK_KNOWN_TENSORS);
                break;
            case C_LEN:
                if (v != G_MISSING && PyTuple_CheckExact(v)) {
                    skip = 1;
                }
                else if (v != G_MISSING && PyDict_Check(v)) {
                    skip = 1;
                    if (witness_once(p, seen, ck->slot, v, VIA_PYTHON) < 0) {
                        goto fail;
                    }
                }
                break;
            }
        }
        m->skip[c] = (char)skip;
    }
    m->n_live = 0;
    for (Py_ssize_t c = 0; c < p->n_checks; c++) {
        if (!m->skip[c]) {
            m->live[m->n_live++] = (int)c;
        }
    }
    for (Py_ssize_t a = 0; a < p->n_aliases; a++) {
        m->skip_alias[a] = m->frozen[p->aliases[2 * a]]
                           && m->frozen[p->aliases[2 * a + 1]];
    }
    PyMem_Free(m->typeof_w);
    m->typeof_w = PyMem_Calloc((size_t)m->n_w + 1, sizeof(int));
    if (m->typeof_w == NULL) {
        goto fail;
    }
    m->n_typeof = 0;
    for (Py_ssize_t k = 0; k < m->n_w; k++) {
        if (m->w[k].kind == W_TYPEOF) {
            for (Py_ssize_t j = 0; j < m->n_typeof; j++) {   /* a model has */
                if (m->w[m->typeof_w[j]].type == m->w[k].type) {   /* few types */
                    m->w[k].repeat = 1;
                    break;
                }
            }
            m->typeof_w[m->n_typeof++] = (int)k;
        }
    }
    /* Watch first: watching a dict changes its version tag's low bits. */
    m->watched = 0;
#ifdef AGS_HAVE_WATCHERS
    m->watched = dict_watcher >= 0 && type_watcher >= 0;
    for (Py_ssize_t k = 0; m->watched && k < m->n_w; k++) {
        g_witness *w = &m->w[k];
        int rc = w->kind == W_TYPEOF ? PyType_Watch(type_watcher, (PyObject *)w->type)
                                     : PyDict_Watch(dict_watcher, w->dict);
        if (rc < 0) {
            PyErr_Clear();
            m->watched = 0;
        }
    }
#endif
    for (Py_ssize_t k = 0; k < m->n_w; k++) {
        g_witness *w = &m->w[k];
        if (w->kind == W_TYPEOF) {
            w->version = w->type->tp_version_tag;
            if (w->version == 0) {
                goto fail;     /* no valid tag: a change would go unseen */
            }
        }
        else {
            w->version = ags_compat_dict_version(w->dict);
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        m->values[i] = m->frozen[i] ? t->vals[i] : NULL;
    }
    m->root_ref = PyWeakref_NewRef(t->vals[root], NULL);
    if (m->root_ref == NULL) {
        goto fail;
    }
    m->epoch = ags_watch_epoch;
    m->valid = 1;
    return;
fail:
    PyErr_Clear();
    m->valid = 0;
    m->n_w = 0;
}

/* 1 if the memo holds for this frame: same root object, witnesses true. */
static int
memo_holds(g_program *p, ags_gframe *frame)
{
    g_memo *m = &p->memo;
    PyObject *cur, *root;

    if (!m->valid) {
        return 0;
    }
    cur = load_local(frame, &p->loads[m->slot]);
    root = ags_compat_weak_target(m->root_ref);
    if (cur == NULL || cur != root) {
        PyErr_Clear();
        return 0;
    }
    if (m->watched && m->epoch == ags_watch_epoch) {
        for (Py_ssize_t k = 0; k < m->n_typeof; k++) {
            g_witness *w = &m->w[m->typeof_w[k]];
            if (Py_TYPE(w->obj) != w->type) {
                return 0;
            }
        }
        return 1;
    }
    for (Py_ssize_t k = 0; k < m->n_w; k++) {
        g_witness *w = &m->w[k];
        switch (w->kind) {
        case W_TYPEOF:
            if (Py_TYPE(w->obj) != w->type
                || (!w->repeat && w->type->tp_version_tag != w->version)) {
                return 0;
            }
            break;
        case W_DICTPTR:
            if (*w->where != w->dict
                || ags_compat_dict_version(w->dict) != w->version) {
                return 0;
            }
            break;
        default:
            if (ags_compat_dict_version(w->dict) != w->version) {
                return 0;
            }
        }
    }
    m->epoch = ags_watch_epoch;   /* confirmed: the moves were elsewhere */
    return 1;
}

/* Evaluates the program on frame (f_locals, f_globals, f_builtins).
 * E_SIGNED: the frame's signature matched the entry's exactly, which
 * already settles the tensor checks of its arguments.  With `outputs`, a
 * passing evaluation also returns the output loads' values (MISSING for
 * those that reach nothing), the graph's inputs.  Returns 1, 0 or -1. */
#define E_SIGNED 1

/* What failed in an evaluation that answered 0: a check, an alias, a size
 * guard (index n_guards: the Python fallback) or a probe, by index. */
enum { F_NONE, F_CHECK, F_ALIAS, F_SIZE, F_PROBE };

typedef struct {
    int kind;
    Py_ssize_t index;
} g_why;

static int
run_program(g_program *p, ags_gframe *frame, int eflags, PyObject **outputs,
            g_why *why)
{
    g_values table;
    g_memo *m = &p->memo;
    ags_symvals sv;
    g_why failed = {F_NONE, -1};
    int ok = 1, fast;

    if (values_init(&table, p) < 0) {
        return -1;
    }
    ags_symvals_init(&sv, &p->sym);
    fast = memo_holds(p, frame);
    if (fast) {
        m->fast++;
        table.frozen = m->frozen;
        table.known = m->values;
    }
    else {
        m->full++;
    }
    Py_ssize_t n_run = fast ? m->n_live : p->n_checks;
    for (Py_ssize_t k = 0; ok == 1 && k < n_run; k++) {
        g_check *c = &p->checks[fast ? m->live[k] : k];
        PyObject *v;

        /* a signature covers the argument slots only, not a closure
         * variable read as a local */
        if (((eflags & E_SIGNED) && c->kind == C_TENSOR
                && p->loads[c->slot].arg >= 0)) {
            continue;
        }
        v = value_of(p, &table, c->slot, frame);
        ok = v == NULL ? -1 : check_one(p, &sv, c, v);
        if (ok == 0) {
            failed = (g_why){F_CHECK, fast ? m->live[k] : k};
        }
    }
    for (Py_ssize_t i = 0; ok == 1 && i < p->n_aliases; i++) {
        PyObject *a, *b;
        if (fast && m->skip_alias[i]) {
            continue;
        }
        a = value_of(p, &table, p->aliases[2 * i], frame);
        b = a ? value_of(p, &table, p->aliases[2 * i + 1], frame) : NULL;
        ok = b == NULL ? -1 : (a == b && a != G_MISSING);
        if (ok == 0) {
            failed = (g_why){F_ALIAS, i};
        }
    }
    if (ok == 1 && p->sym.active) {
        ok = ags_sym_check_guards(&p->sym, &sv, &failed.index);
        failed.kind = ok == 0 ? F_SIZE : F_NONE;
    }
    for (Py_ssize_t i = 0; ok == 1 && i < PyTuple_GET_SIZE(p->probes); i++) {
        PyObject *probe = PyTuple_GET_ITEM(p->probes, i);
        PyObject *got = PyObject_Call(PyTuple_GET_ITEM(probe, 0),
                                      PyTuple_GET_ITEM(probe, 1), NULL);
        if (got == NULL) {
            ok = -1;
        }
        else {
            ok = PyObject_RichCompareBool(got, PyTuple_GET_ITEM(probe, 2), Py_EQ);
            Py_DECREF(got);
            if (ok == 0) {
                failed = (g_why){F_PROBE, i};
            }
        }
    }
    /* The outputs' loads, also on a full evaluation without `outputs`, so
     * that the memo remembers the graph's parameters. */
    for (Py_ssize_t i = 0; ok == 1 && !fast && i < p->n_outputs; i++) {
        if (value_of(p, &table, p->outputs[i], frame) == NULL) {
            ok = -1;
        }
    }
    if (ok == 1 && !fast && m->builds < 16 + m->fast) {
        /* (a memo rebuilt over and over without paying off is given up) */
        m->builds++;
        memo_build(p, &table);
    }
    if (ok == 1 && outputs != NULL) {
        PyObject *out = PyTuple_New(p->n_outputs);
        for (Py_ssize_t i = 0; out != NULL && i < p->n_outputs; i++) {
            PyObject *v = value_of(p, &table, p->outputs[i], frame);
            PyTuple_SET_ITEM(out, i, Py_NewRef(v == G_MISSING ? p->missing : v));
        }
        if (out == NULL) {
            ok = -1;
        }
        *outputs = out;
    }
    values_release(&table);
    if (why != NULL) {
        *why = ok == 0 ? failed : (g_why){F_NONE, -1};
    }
    return ok;
}

/* The frame of a call from Python: (f_locals, f_globals, f_builtins),
 * three dicts.  0, or -1 with TypeError. */
static int
frame_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
           ags_gframe *fr)
{
    if (nargs != 3 || (kwnames && PyTuple_GET_SIZE(kwnames))
        || !PyDict_Check(args[0]) || !PyDict_Check(args[1])
        || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "a guard program takes (f_locals, "
                        "f_globals, f_builtins), three dicts");
        return -1;
    }
    memset(fr, 0, sizeof(*fr));
    fr->f_locals = args[0];
    fr->globals = args[1];
    fr->builtins = args[2];
    return 0;
}

/* read(f_locals, f_globals, f_builtins) -> tuple: the output loads' values
 * (the graph's inputs), MISSING for any that reach nothing. */
static PyObject *
program_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    g_program *p = (g_program *)self;
    g_values table;
    ags_gframe fr;
    PyObject *out;

    if (frame_args(args, nargs, NULL, &fr) < 0 || values_init(&table, p) < 0) {
        return NULL;
    }
    out = PyTuple_New(p->n_outputs);
    for (Py_ssize_t i = 0; out != NULL && i < p->n_outputs; i++) {
        PyObject *v = value_of(p, &table, p->outputs[i], &fr);
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, Py_NewRef(v == G_MISSING ? p->missing : v));
    }
    values_release(&table);
    return out;
}

/* ------------------------------------------------------------------ */
/* For the frame hook */

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
    return run_program((g_program *)program, frame, signed_frame ? E_SIGNED : 0,
                       inputs, NULL);
}

/* ------------------------------------------------------------------ */
/* The type */

static PyObject *
program_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                   PyObject *kwnames)
{
    g_program *p = (g_program *)self;
    ags_gframe fr;
    int ok;

    if (frame_args(args, PyVectorcall_NARGS(nargsf), kwnames, &fr) < 0) {
        return NULL;
    }
    if (p->probes == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "guard program not compiled");
        return NULL;
    }
    ok = run_program(p, &fr, 0, NULL, NULL);
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

/* Subclasses (agspeed._capture.Guard) are called through tp_call on 3.11,
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

/* _set_program(loads, checks, aliases, probes, step, missing, module_type,
 *              outputs, flags=0, symbolic=None)
 *   loads:  [(op, parent, key[, arg])]   checks: [(slot, kind, a, b)]
 *           (arg: a LOCAL's argument slot, read by index from the hook)
 *   aliases: [(slot, slot)]        probes: ((fn, args, expected), ...)
 *   outputs: [slot]                flags: P_CHECK_KNOWN_TENSORS | P_NO_MEMO
 *   symbolic: None or (n_syms, exprs, guard indices, fallback), see
 *             guards/symbolic.c */
static PyObject *
program_set(PyObject *self, PyObject *args)
{
    g_program *p = (g_program *)self;
    PyObject *loads, *checks, *aliases, *probes, *step, *missing, *mtype, *outputs;
    PyObject *symbolic = Py_None;
    int flags = 0;

    if (!PyArg_ParseTuple(args, "O!O!O!O!OOOO!|iO:_set_program", &PyList_Type, &loads,
                          &PyList_Type, &checks, &PyList_Type, &aliases,
                          &PyTuple_Type, &probes, &step, &missing, &mtype,
                          &PyList_Type, &outputs, &flags, &symbolic)) {
        return NULL;
    }
    if (p->tbusy) {
        PyErr_SetString(PyExc_RuntimeError, "a guard program cannot be compiled "
                        "again while it is evaluated");
        return NULL;
    }
    program_release(p);
    p->flags = flags;
    if (ags_symtab_set(&p->sym, symbolic) < 0) {
        return NULL;
    }
    p->n_outputs = PyList_GET_SIZE(outputs);
    p->outputs = PyMem_Calloc((size_t)p->n_outputs + 1, sizeof(int));
    if (p->outputs == NULL) {
        return PyErr_NoMemory();
    }
    p->n_loads = PyList_GET_SIZE(loads);
    p->n_checks = PyList_GET_SIZE(checks);
    p->n_aliases = PyList_GET_SIZE(aliases);
    if (p->n_loads > 64) {   /* the program's own value table (g_values) */
        p->tvals = PyMem_Calloc((size_t)p->n_loads, sizeof(PyObject *));
        p->tvia = PyMem_Calloc((size_t)p->n_loads, 1);
        p->ttouched = PyMem_Calloc((size_t)p->n_loads, sizeof(Py_ssize_t));
        if (!p->tvals || !p->tvia || !p->ttouched) {
            program_release(p);
            return PyErr_NoMemory();
        }
    }
    p->loads = PyMem_Calloc((size_t)p->n_loads + 1, sizeof(g_load));
    p->checks = PyMem_Calloc((size_t)p->n_checks + 1, sizeof(g_check));
    p->aliases = PyMem_Calloc(2 * (size_t)p->n_aliases + 1, sizeof(int));
    if (!p->loads || !p->checks || !p->aliases) {
        program_release(p);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < p->n_loads; i++) {
        g_load *ld = &p->loads[i];
        ld->arg = -1;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(loads, i), "iiO|i", &ld->op,
                              &ld->parent, &ld->key, &ld->arg)) {
            goto bad;
        }
        Py_INCREF(ld->key);
        if (ld->op < 0 || ld->op > L_LAST || ld->parent >= i
            || (ld->parent < 0) != (ld->op <= L_GMOD)
            || (ld->op == L_GMOD && !(PyTuple_Check(ld->key)
                                      && PyTuple_GET_SIZE(ld->key) == 2))
            || (ld->op == L_CELL && !PyLong_Check(ld->key))
            || (ld->arg >= 0 && ld->op != L_LOCAL) || ld->arg < -1) {
            PyErr_Format(PyExc_ValueError, "bad guard load %zd", i);
            goto bad;
        }
    }
    for (Py_ssize_t i = 0; i < p->n_checks; i++) {
        g_check *c = &p->checks[i];
        if (!PyArg_ParseTuple(PyList_GET_ITEM(checks, i), "iiOO", &c->slot,
                              &c->kind, &c->a, &c->b)) {
            goto bad;
        }
        Py_INCREF(c->a);
        Py_INCREF(c->b);
        if (c->slot < 0 || c->slot >= p->n_loads || c->kind < C_TENSOR
            || c->kind > C_LAST
            || (c->kind == C_TENSOR && !(PyTuple_Check(c->b)
                && PyTuple_GET_SIZE(c->b) == 5
                && PyTuple_Check(PyTuple_GET_ITEM(c->b, 2))
                && PyTuple_Check(PyTuple_GET_ITEM(c->b, 3))))
            || (c->kind == C_DYNTENSOR
                && !ags_sym_spec_ok(c->b, p->sym.n_syms, p->sym.n_exprs))
            || (c->kind == C_ID && c->b == Py_True && !PyWeakref_CheckRef(c->a))) {
            PyErr_Format(PyExc_ValueError, "bad guard check %zd", i);
            goto bad;
        }
        if (c->kind == C_LEN) {
            c->n = PyLong_AsSsize_t(c->b);
            if (c->n < 0 && PyErr_Occurred()) {
                goto bad;
            }
        }
    }
    for (Py_ssize_t i = 0; i < p->n_aliases; i++) {
        int *pair = &p->aliases[2 * i];
        if (!PyArg_ParseTuple(PyList_GET_ITEM(aliases, i), "ii", &pair[0], &pair[1])) {
            goto bad;
        }
        if (pair[0] < 0 || pair[0] >= p->n_loads || pair[1] < 0
            || pair[1] >= p->n_loads) {
            PyErr_SetString(PyExc_ValueError, "bad guard alias");
            goto bad;
        }
    }
    for (Py_ssize_t i = 0; i < p->n_outputs; i++) {
        int k = (int)PyLong_AsLong(PyList_GET_ITEM(outputs, i));
        if (k < 0 || k >= p->n_loads) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "bad guard output");
            }
            goto bad;
        }
        p->outputs[i] = k;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(probes); i++) {
        PyObject *probe = PyTuple_GET_ITEM(probes, i);
        if (!PyTuple_Check(probe) || PyTuple_GET_SIZE(probe) != 3
            || !PyTuple_Check(PyTuple_GET_ITEM(probe, 1))) {
            PyErr_SetString(PyExc_ValueError, "bad guard probe");
            goto bad;
        }
    }
    p->probes = Py_NewRef(probes);
    p->step = Py_NewRef(step);
    p->missing = Py_NewRef(missing);
    if (mtype != Py_None) {
        p->module_type = Py_NewRef(mtype);
        p->module_getattr = _PyType_Lookup((PyTypeObject *)mtype, s_getattr);
        Py_XINCREF(p->module_getattr);
        if (!PyType_Check(mtype)) {
            PyErr_SetString(PyExc_TypeError, "module_type must be a type");
            goto bad;
        }
    }
    Py_RETURN_NONE;
bad:
    program_release(p);
    return NULL;
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
    if (frame_args(args, nargs, NULL, &fr) < 0) {
        return NULL;
    }
    if (p->probes == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "guard program not compiled");
        return NULL;
    }
    ok = run_program(p, &fr, signed_frame ? E_SIGNED : 0, &inputs, NULL);
    if (ok < 0) {
        return NULL;
    }
    if (ok == 0) {
        Py_RETURN_NONE;
    }
    return inputs;
}

/* why(f_locals, f_globals, f_builtins) -> None or (kind, index): what
 * failed first in an evaluation on that frame ("check", "alias", "size",
 * "probe"; the index into the program's own lists), for recompile logs.
 * The passing path records nothing more than a failing one does. */
static PyObject *
program_why(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const char *const kinds[] = {"", "check", "alias", "size", "probe"};
    g_program *p = (g_program *)self;
    ags_gframe fr;
    g_why why;
    int ok;

    if (frame_args(args, nargs, NULL, &fr) < 0) {
        return NULL;
    }
    if (p->probes == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "guard program not compiled");
        return NULL;
    }
    ok = run_program(p, &fr, 0, NULL, &why);
    if (ok < 0) {
        return NULL;
    }
    if (ok == 1) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(sn)", kinds[why.kind], why.index);
}

/* _memo() -> dict: the structure memo's state, for tests and reports. */
static PyObject *
program_memo(PyObject *self, PyObject *unused)
{
    g_memo *m = &((g_program *)self)->memo;
    Py_ssize_t frozen = 0, skipped = 0;

    (void)unused;
    for (Py_ssize_t i = 0; m->valid && i < ((g_program *)self)->n_loads; i++) {
        frozen += m->frozen[i] != 0;
    }
    for (Py_ssize_t i = 0; m->valid && i < ((g_program *)self)->n_checks; i++) {
        skipped += m->skip[i] != 0;
    }
    return Py_BuildValue("{s:O,s:n,s:n,s:n,s:O,s:K,s:K,s:K}", "valid",
                         m->valid ? Py_True : Py_False, "remembered_loads", frozen,
                         "skipped_checks", skipped, "witnesses", m->valid ? m->n_w : 0,
                         "watched", m->valid && m->watched ? Py_True : Py_False,
                         "fast", (unsigned long long)m->fast,
                         "full", (unsigned long long)m->full,
                         "builds", (unsigned long long)m->builds);
}

static PyObject *
program_size(PyObject *self, PyObject *unused)
{
    g_program *p = (g_program *)self;

    (void)unused;
    return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:n,s:n}", "loads", p->n_loads,
                         "checks", p->n_checks, "aliases", p->n_aliases, "probes",
                         p->probes ? PyTuple_GET_SIZE(p->probes) : 0,
                         "outputs", p->n_outputs, "symbols", p->sym.n_syms,
                         "symbolic_guards", p->sym.n_guards);
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
    return 0;
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
     "_set_program(loads, checks, aliases, probes, step, missing, module_type, "
     "outputs, flags=0, symbolic=None): compile the program (see "
     "guards/program.c)."},
    {"read", (PyCFunction)(void (*)(void))program_read, METH_FASTCALL,
     "read(f_locals, f_globals, f_builtins) -> tuple: the values of the "
     "output loads (the graph's inputs), MISSING where none."},
    {"run", (PyCFunction)(void (*)(void))program_run, METH_FASTCALL,
     "run(f_locals, f_globals, f_builtins, signed=False) -> tuple or None: the "
     "graph's inputs if every check passes (signed: the frame's signature "
     "matched, so its arguments' tensor checks are settled)."},
    {"why", (PyCFunction)(void (*)(void))program_why, METH_FASTCALL,
     "why(f_locals, f_globals, f_builtins) -> None or (kind, index): what "
     "failed first on that frame: a 'check', 'alias', 'size' guard (index "
     "len(guards): the Python fallback) or 'probe', by index."},
    {"_memo", program_memo, METH_NOARGS,
     "_memo() -> dict: the structure memo (valid, remembered loads, skipped "
     "checks, witnesses, watched, and evaluations with and without it)."},
    {"_program_size", program_size, METH_NOARGS,
     "_program_size() -> dict: how many loads, checks, aliases and probes."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef program_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(g_program, weakreflist), READONLY, NULL},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(g_program, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot program_slots[] = {
    {Py_tp_doc, "A cache entry's guard, compiled to C (guards/program.c).\n\n"
                "Call it with (f_locals, f_globals, f_builtins): True if every "
                "check passes."},
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

int
ags_guard_init(void)
{
    static const char *const kinds[] = {"local", "global", "gmod", "attr",
                                        "item", "cell", "type", "fget"};
    static const char *const stores[] = {"_parameters", "_buffers", "_modules"};

    if (s_getattr != NULL) {
        return 0;
    }
    if (ags_tensor_names_init() < 0) {
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        s_stores[i] = PyUnicode_InternFromString(stores[i]);
        if (s_stores[i] == NULL) {
            return -1;
        }
    }
    for (int i = 0; i <= L_LAST; i++) {
        s_kinds[i] = PyUnicode_InternFromString(kinds[i]);
        if (s_kinds[i] == NULL) {
            return -1;
        }
    }
#ifdef AGS_HAVE_WATCHERS
    /* None free (another extension holds them all): versions alone. */
    if (dict_watcher < 0) {
        dict_watcher = PyDict_AddWatcher(on_dict_event);
    }
    if (type_watcher < 0) {
        type_watcher = PyType_AddWatcher(on_type_event);
    }
    PyErr_Clear();
#endif
    /* last: it marks the names complete */
    s_getattr = PyUnicode_InternFromString("__getattr__");
    return s_getattr != NULL ? 0 : -1;
}
