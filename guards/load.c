/* load.c: how a guard program reaches a value from the frame.
 *
 * A program's loads are a table, parents first; each is one op of
 * protocol.h's AGS_LOAD_LIST with a parent load and a key:
 *
 *   LOCAL   a local of the frame: an argument slot by index when the hook
 *           gives the slots, else by name from the locals dict
 *   GLOBAL  a global of the frame, else a builtin
 *   GMOD    a global of a loaded module (sys.modules[module].name)
 *   ATTR    an attribute of the parent's value, found as
 *           agspeed._sources.static_attr finds it (attr.c)
 *   ITEM    an item of a tuple, list or dict
 *   CELL    the contents of a closure cell of a function
 *   TYPE    the exact type of the parent's value
 *   FGET    the getter of a property
 *   CVAR    the value of a ContextVar (the Python step)
 *   NUMPY   the tensor sharing a NumPy array's memory (the Python step)
 *   KEYS    a dict's keys as a tuple, in order (a dict's, a defaultdict's
 *           and an OrderedDict's in C; others the Python step)
 *   VALUES  a dict's values as a tuple, in order (a dict's and a
 *           defaultdict's in C; others the Python step)
 *   STORAGE the size in bytes of a tensor's storage (the Python step)
 *   STATE   a snapshot of the plain data an object holds (the Python step)
 *   INFERENCE whether a tensor is an inference tensor (the Python step)
 *
 * Every op is one row: its load (answers in C, or the Python step), its
 * parse rule (what _set_program accepts) and its memo rule (what the
 * answer depends on, for the structure memo).  The rows are generated from
 * AGS_LOAD_LIST, so a new op without its three functions does not build.
 *
 * Values are found on demand and kept in the evaluation's g_values for the
 * rest of it (children share the parent's lookup).  A load that reaches
 * nothing is G_MISSING, and so are all loads below it.
 *
 * Attributes (ATTR) are found by attr.c, as static_attr finds them.
 */
#include "program.h"

PyObject ags_gp_missing;

PyObject *
ags_load_step(g_program *p, int op, PyObject *base, PyObject *key)
{
    PyObject *args[3] = {ags_gp_names.loads[op], base, key};
    PyObject *out = PyObject_Vectorcall(p->step, args, 3, NULL);

    if (out == p->missing) {
        Py_DECREF(out);
        return G_MISSING;
    }
    return out;
}

/* collections.defaultdict, found once (collections is always loaded); NULL
 * before or where it cannot be had. */
static PyTypeObject *
defaultdict_type(void)
{
    static PyObject *found;

    if (found == NULL) {
        PyObject *mod = PyImport_ImportModule("collections");
        found = mod != NULL ? PyObject_GetAttrString(mod, "defaultdict") : NULL;
        Py_XDECREF(mod);
        if (found == NULL || !PyType_Check(found)) {
            PyErr_Clear();
            Py_CLEAR(found);
        }
    }
    return (PyTypeObject *)found;
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
        return PyImport_GetModule(name);   /* sys.modules replaced: slowly */
    }
    mod = PyDict_GetItemWithError(modules, name);
    return Py_XNewRef(mod);
}

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

PyObject *
ags_load_local(ags_gframe *fr, const g_load *ld)
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

/* ------------------------------------------------------------------ */
/* The rows.  Each op has:
 *
 *   load_<OP>(p, t, i, ld, base, frame)  a new reference, G_MISSING, or
 *       NULL with an exception; base is the parent's value (never
 *       G_MISSING), NULL for a load without a parent.
 *   parse_<OP>(ld)  NULL if _set_program accepts the load, else what the
 *       op needs.
 *   depends_<OP>(t, i, base)  what the answer depends on, for the memo
 *       (ags_load_depends).
 */

#define G_LOAD_ARGS g_program *p, g_values *t, Py_ssize_t i, \
                    const g_load *ld, PyObject *base, ags_gframe *frame
#define G_UNUSED_LOAD_ARGS (void)p; (void)t; (void)i; (void)ld; (void)base; \
                           (void)frame

static const char *
rooted(const g_load *ld)
{
    return ld->parent >= 0 ? "no parent load (it is read from the frame)"
                           : NULL;
}

static const char *
child(const g_load *ld)
{
    return ld->parent < 0 ? "a parent load" : NULL;
}

static int
depends_nothing(const g_values *t, Py_ssize_t i, PyObject *base)
{
    (void)t;
    (void)i;
    (void)base;
    return DEP_NONE;
}

/* LOCAL ------------------------------------------------------------- */

static inline PyObject *
load_LOCAL(G_LOAD_ARGS)
{
    PyObject *out = ags_load_local(frame, ld);

    G_UNUSED_LOAD_ARGS;
    if (out != NULL && out != G_MISSING) {
        Py_INCREF(out);
    }
    return out;
}

static const char *
parse_LOCAL(const g_load *ld)
{
    return rooted(ld);
}

#define depends_LOCAL depends_nothing   /* the root is chosen apart */

/* GLOBAL ------------------------------------------------------------ */

static inline PyObject *
load_GLOBAL(G_LOAD_ARGS)
{
    PyObject *value = PyDict_GetItemWithError(frame->globals, ld->key);

    G_UNUSED_LOAD_ARGS;
    if (value == NULL && !PyErr_Occurred() && frame->builtins != NULL) {
        value = PyDict_GetItemWithError(frame->builtins, ld->key);
    }
    if (value == NULL) {
        return PyErr_Occurred() ? NULL : G_MISSING;
    }
    return Py_NewRef(value);
}

static const char *
parse_GLOBAL(const g_load *ld)
{
    return rooted(ld);
}

#define depends_GLOBAL depends_nothing

/* GMOD -------------------------------------------------------------- */

static inline PyObject *
load_GMOD(G_LOAD_ARGS)
{
    PyObject *mod = sys_module(PyTuple_GET_ITEM(ld->key, 0));
    PyObject *name = PyTuple_GET_ITEM(ld->key, 1), *hit = NULL, *out;

    G_UNUSED_LOAD_ARGS;
    if (mod == NULL) {
        return PyErr_Occurred() ? NULL : G_MISSING;
    }
    if (PyModule_Check(mod)) {  /* the module's own global, in C */
        PyObject *globals = PyModule_GetDict(mod), *b;

        hit = PyDict_GetItemWithError(globals, name);
        if (hit == NULL && !PyErr_Occurred()) {
            /* else its builtins, as _sources._lookup_global reads them */
            b = PyDict_GetItemWithError(globals, ags_gp_names.builtins);
            b = b != NULL && PyModule_Check(b) ? PyModule_GetDict(b) : b;
            if (b != NULL && PyDict_CheckExact(b)) {
                hit = PyDict_GetItemWithError(b, name);
                if (hit == NULL && !PyErr_Occurred()) {
                    Py_DECREF(mod);
                    return G_MISSING;
                }
            }
        }
    }
    out = hit ? Py_NewRef(hit) : PyErr_Occurred() ? NULL
                               : ags_load_step(p, AGS_LOAD_GMOD, mod, name);
    Py_DECREF(mod);
    return out;
}

static const char *
parse_GMOD(const g_load *ld)
{
    if (!PyTuple_Check(ld->key) || PyTuple_GET_SIZE(ld->key) != 2) {
        return "a key (module name, name)";
    }
    return rooted(ld);
}

#define depends_GMOD depends_nothing

/* ATTR -------------------------------------------------------------- */

static inline PyObject *
load_ATTR(G_LOAD_ARGS)
{
    int via;
    PyObject *out = ags_load_attr_value(p, base, ld->key, &via);

    (void)frame;
    t->via[i] = (char)via;
    return out;
}

static const char *
parse_ATTR(const g_load *ld)
{
    return child(ld);
}

/* An attribute answered in C from a place the memo can watch depends on
 * the base's type, instance dict and stores up to the one that answered. */
static int
depends_ATTR(const g_values *t, Py_ssize_t i, PyObject *base)
{
    (void)base;
    return t->via[i] != VIA_PYTHON ? t->via[i] : DEP_NONE;
}

/* ITEM -------------------------------------------------------------- */

static inline PyObject *
load_ITEM(G_LOAD_ARGS)
{
    PyObject *key = ld->key, *value;

    G_UNUSED_LOAD_ARGS;
    if ((PyTuple_CheckExact(base) || PyList_CheckExact(base))
        && PyLong_CheckExact(key)) {
        Py_ssize_t n = Py_SIZE(base), k = PyLong_AsSsize_t(key);
        if (k == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (k < 0) {
            k += n;
        }
        if (k < 0 || k >= n) {
            return G_MISSING;
        }
        return Py_NewRef(PyTuple_CheckExact(base) ? PyTuple_GET_ITEM(base, k)
                                                  : PyList_GET_ITEM(base, k));
    }
    if (PyDict_CheckExact(base)) {
        value = PyDict_GetItemWithError(base, key);
        if (value == NULL) {
            return PyErr_Occurred() ? NULL : G_MISSING;
        }
        return Py_NewRef(value);
    }
    return ags_load_step(p, AGS_LOAD_ITEM, base, key);
}

static const char *
parse_ITEM(const g_load *ld)
{
    return child(ld);
}

/* An item of a tuple is fixed; of a dict, it holds while the dict keeps
 * its version; of anything else, it is not remembered. */
static int
depends_ITEM(const g_values *t, Py_ssize_t i, PyObject *base)
{
    (void)t;
    (void)i;
    return PyTuple_CheckExact(base) ? DEP_FIXED
           : PyDict_CheckExact(base) ? VIA_PYTHON : DEP_NONE;
}

/* CELL -------------------------------------------------------------- */

static inline PyObject *
load_CELL(G_LOAD_ARGS)
{
    PyObject *closure;
    Py_ssize_t k = PyLong_AsSsize_t(ld->key);   /* fits: parse_CELL */

    G_UNUSED_LOAD_ARGS;
    if (PyMethod_Check(base)) {
        base = PyMethod_GET_FUNCTION(base);   /* a method's cells: its function's */
    }
    closure = PyFunction_Check(base) ? PyFunction_GetClosure(base) : NULL;
    if (closure != NULL && k >= 0 && k < PyTuple_GET_SIZE(closure)) {
        PyObject *c = PyCell_GET(PyTuple_GET_ITEM(closure, k));
        return c ? Py_NewRef(c) : G_MISSING;
    }
    return ags_load_step(p, AGS_LOAD_CELL, base, ld->key);
}

static const char *
parse_CELL(const g_load *ld)
{
    if (!PyLong_Check(ld->key)) {
        return "a key that is an int (the cell's index)";
    }
    if (PyLong_AsSsize_t(ld->key) == -1 && PyErr_Occurred()) {
        PyErr_Clear();   /* reported as the refusal below */
        return "an index that fits a Py_ssize_t";
    }
    return child(ld);
}

#define depends_CELL depends_nothing

/* TYPE -------------------------------------------------------------- */

static inline PyObject *
load_TYPE(G_LOAD_ARGS)
{
    G_UNUSED_LOAD_ARGS;
    return Py_NewRef((PyObject *)Py_TYPE(base));
}

static const char *
parse_TYPE(const g_load *ld)
{
    return child(ld);
}

/* The type's identity is witnessed by the base's own TYPEOF witness. */
static int
depends_TYPE(const g_values *t, Py_ssize_t i, PyObject *base)
{
    (void)t;
    (void)i;
    (void)base;
    return VIA_CLASS_OR_DICT;
}

/* FGET, CVAR, NUMPY, KEYS, VALUES, STORAGE, STATE, INFERENCE: the Python step
 * answers, from the parent's value. */

#define PYTHON_STEP_LOAD(NAME)                          \
    static inline PyObject *                            \
    load_##NAME(G_LOAD_ARGS)                            \
    {                                                   \
        G_UNUSED_LOAD_ARGS;                             \
        return ags_load_step(p, AGS_LOAD_##NAME, base, ld->key); \
    }                                                   \
                                                        \
    static const char *                                 \
    parse_##NAME(const g_load *ld)                      \
    {                                                   \
        return child(ld);                               \
    }

PYTHON_STEP_LOAD(FGET)
#define depends_FGET depends_nothing

PYTHON_STEP_LOAD(CVAR)
/* A context variable's value changes with no object the memo watches. */
#define depends_CVAR depends_nothing

PYTHON_STEP_LOAD(NUMPY)
/* A new tensor on every read: nothing to remember. */
#define depends_NUMPY depends_nothing

/* KEYS, VALUES: an exact dict's or defaultdict's in C, an OrderedDict's
 * keys in its own order (iterating it is C); the rest the Python step. */

static inline int
plain_dict(PyObject *base)
{
    return PyDict_CheckExact(base) || Py_TYPE(base) == defaultdict_type();
}

static inline PyObject *
as_tuple(PyObject *list)
{
    PyObject *out = list != NULL ? PyList_AsTuple(list) : NULL;

    Py_XDECREF(list);
    return out;
}

static inline PyObject *
load_KEYS(G_LOAD_ARGS)
{
    G_UNUSED_LOAD_ARGS;
    if (plain_dict(base)) {
        return as_tuple(PyDict_Keys(base));
    }
    if (PyODict_CheckExact(base)) {
        return PySequence_Tuple(base);
    }
    return ags_load_step(p, AGS_LOAD_KEYS, base, ld->key);
}

static const char *
parse_KEYS(const g_load *ld)
{
    return child(ld);
}

/* A new tuple on every read, of a dict the memo does not watch. */
#define depends_KEYS depends_nothing

static inline PyObject *
load_VALUES(G_LOAD_ARGS)
{
    G_UNUSED_LOAD_ARGS;
    if (plain_dict(base)) {
        return as_tuple(PyDict_Values(base));
    }
    return ags_load_step(p, AGS_LOAD_VALUES, base, ld->key);
}

static const char *
parse_VALUES(const g_load *ld)
{
    return child(ld);
}

#define depends_VALUES depends_nothing

PYTHON_STEP_LOAD(STORAGE)
/* A tensor's storage can be resized in place: read on every call. */
#define depends_STORAGE depends_nothing

PYTHON_STEP_LOAD(STATE)
/* Made afresh from everything the object holds: read on every call. */
#define depends_STATE depends_nothing

PYTHON_STEP_LOAD(INFERENCE)
/* A property of the tensor object, read with it on every call. */
#define depends_INFERENCE depends_nothing

/* The table ---------------------------------------------------------- */

typedef struct {
    const char *(*parse)(const g_load *ld);
    int (*depends)(const g_values *t, Py_ssize_t i, PyObject *base);
} g_load_row;

#define AGS_X(NAME, doc) {parse_##NAME, depends_##NAME},
static const g_load_row load_rows[AGS_LOAD_COUNT] = {
    AGS_LOAD_LIST(AGS_X)
};
#undef AGS_X

PyObject *
ags_load_find(g_program *p, g_values *t, Py_ssize_t i, ags_gframe *frame)
{
    const g_load *ld = &p->loads[i];
    PyObject *base = NULL, *out;

    if (ld->parent >= 0) {
        base = ags_load_value(p, t, ld->parent, frame);
        if (base == NULL) {
            return NULL;
        }
        if (base == G_MISSING) {
            return t->vals[i] = G_MISSING;
        }
    }
    switch ((ags_LOAD_kind)ld->op) {
#define AGS_X(NAME, doc) \
    case AGS_LOAD_##NAME: \
        out = load_##NAME(p, t, i, ld, base, frame); \
        break;
    AGS_LOAD_LIST(AGS_X)
#undef AGS_X
    default:
        Py_UNREACHABLE();   /* refused by ags_load_parse */
    }
    if (out != NULL && t->touched != NULL) {
        t->touched[t->n_touched++] = i;
    }
    return t->vals[i] = out;
}

int
ags_load_parse(g_load *ld, PyObject *item, Py_ssize_t i)
{
    PyObject *op, *key;
    const char *needs;
    int parent, arg = -1;

    /* into locals first: a failed parse may have set some of them */
    if (!PyArg_ParseTuple(item, "OiO|i", &op, &parent, &key, &arg)) {
        return ags_gp_refuse("load", i);
    }
    ld->parent = parent;
    ld->arg = arg;
    ld->key = Py_NewRef(key);
    if (ags_protocol_kind(op, AGS_LOAD_COUNT, "load", &ld->op) < 0) {
        return ags_gp_refuse("load", i);
    }
    needs = load_rows[ld->op].parse(ld);
    if (needs == NULL && ld->parent >= i) {
        needs = "a parent load before it";
    }
    if (needs == NULL && (ld->arg < -1
                          || (ld->arg >= 0 && ld->op != AGS_LOAD_LOCAL))) {
        needs = "no argument slot (only a local has one)";
    }
    if (needs != NULL) {
        PyErr_Format(PyExc_ValueError, "bad guard load %zd (%s): needs %s",
                     i, ags_load_names[ld->op], needs);
        return -1;
    }
    return 0;
}

int
ags_load_depends(const g_program *p, const g_values *t, Py_ssize_t i,
                 PyObject *base)
{
    return load_rows[p->loads[i].op].depends(t, i, base);
}

/* ------------------------------------------------------------------ */
/* Value tables */

int
ags_values_init_large(g_values *v, g_program *p)
{
    Py_ssize_t n = p->n_loads;

    if (p->tvals != NULL && !p->tbusy) {
        p->tbusy = 1;
        v->owner = p;
        v->vals = p->tvals;
        v->via = p->tvia;
        v->touched = p->ttouched;
        return 0;
    }
    v->vals = PyMem_Calloc((size_t)n, sizeof(PyObject *) + 1);
    if (v->vals == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    v->via = (char *)(v->vals + n);
    return 0;
}

static void
release_value(PyObject *value)
{
    if (value != NULL && value != G_MISSING) {
        Py_DECREF(value);
    }
}

void
ags_values_release_large(g_values *v)
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
    PyMem_Free(v->vals);
}
