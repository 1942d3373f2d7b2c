/* check.c: what a guard program checks of a value, one row per check kind.
 *
 * A check is (slot, kind, a, b): the value of load `slot` against an
 * expectation (a, b) whose meaning the kind gives.  The kinds are
 * protocol.h's AGS_CHECK_LIST, and each is one row here, generated from
 * that list, of four things:
 *
 *   fast    1 if the value passes, 0 if not, -1 on error: no allocation
 *           but a tensor's shape, device and strides, no user code;
 *   memo    what the structure memo may do with the check when it
 *           remembers the load (skip it, skip it while a dict keeps its
 *           version, or still run it);
 *   parse   what _set_program accepts for (a, b): NULL, or what the kind
 *           needs (the program refuses it with ValueError);
 *   signed  whether a frame signature that matched settles the check, on
 *           an argument slot.
 *
 * Adding a kind is a row in protocol.h and these four here, named
 * check_<NAME>_fast and so on: a row left out does not build.  The fast
 * check is dispatched by a switch generated from the same list, so each
 * stays inlined in the loop of ags_check_run; the other columns are a
 * table.  How a kind explains a failure (expected vs got) is Python's,
 * guards/checks.py (agspeed.guards.checks), one class per kind: it runs
 * only on a miss.
 *
 * Expectations, per kind:
 *   TENSOR     a: the exact type; b: (dtype, device, shape, stride,
 *              requires_grad), dtype and requires_grad compared by
 *              identity, device by ==, shape and stride as ints
 *   EQ         a: the exact type; b: the value (plain immutable types
 *              only: their == runs no user code)
 *   LEN        a: the exact type; b: the length, an int >= 0
 *   ID         a: the object, or a weak reference to it; b: True if a is
 *              a weak reference (a dead one fails), else False
 *   ABSENT     a, b: None; the load reaches nothing
 *   DYNTENSOR  a: the exact type; b: as TENSOR's, sizes < 0 naming
 *              symbols and strides < 0 expressions (guards/symbolic.c)
 *   DYNINT     a: the exact type (int); b: the symbol, as a size word
 *              (< 0: -1 - its index)
 */
#include "program.h"

#define G_FAST_ARGS g_program *p, ags_symvals *sv, const g_check *c, \
                    PyObject *v

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
is_type(PyObject *a)
{
    return PyType_Check(a);
}

/* TENSOR ------------------------------------------------------------ */

static int
check_TENSOR_fast(G_FAST_ARGS)
{
    PyObject *spec = c->b, *device;
    int ok;

    (void)p;
    (void)sv;
    if (v == G_MISSING || (PyObject *)Py_TYPE(v) != c->a) {
        return 0;
    }
    ok = attr_is(v, ags_tnames.dtype, PyTuple_GET_ITEM(spec, 0));
    if (ok == 1) {
        ok = attr_is(v, ags_tnames.requires_grad, PyTuple_GET_ITEM(spec, 4));
    }
    if (ok == 1) {
        ok = ints_are(PyObject_GetAttr(v, ags_tnames.shape),
                      PyTuple_GET_ITEM(spec, 2));
    }
    if (ok == 1) {
        ok = ints_are(PyObject_CallMethodNoArgs(v, ags_tnames.stride),
                      PyTuple_GET_ITEM(spec, 3));
    }
    if (ok == 1) {
        device = PyObject_GetAttr(v, ags_tnames.device);
        ok = device == NULL ? -1
             : PyObject_RichCompareBool(device, PyTuple_GET_ITEM(spec, 1),
                                        Py_EQ);
        Py_XDECREF(device);
    }
    return ok;
}

/* A remembered tensor is a parameter or buffer: its metadata changed in
 * place (p.data = other) is not seen unless the program asks. */
static g_memo_rule
check_TENSOR_memo(const g_program *p, PyObject *v)
{
    (void)v;
    return p->flags & AGS_GFLAG_CHECK_KNOWN_TENSORS ? G_MEMO_RUN
                                                    : G_MEMO_SKIP;
}

static const char *
check_TENSOR_parse(g_check *c, const g_program *p)
{
    (void)p;
    if (!is_type(c->a) || !PyTuple_Check(c->b) || PyTuple_GET_SIZE(c->b) != 5
        || !PyTuple_Check(PyTuple_GET_ITEM(c->b, 2))
        || !PyTuple_Check(PyTuple_GET_ITEM(c->b, 3))) {
        return "(type, (dtype, device, shape tuple, stride tuple, "
               "requires_grad))";
    }
    return NULL;
}

enum { check_TENSOR_signed = 1 };

/* EQ ---------------------------------------------------------------- */

/* Whether v has the types of the plain value b all the way down through
 * tuples and lists: only then are they compared, so that an element of
 * another type (a tensor that became a dict key, a user object) is never
 * asked to compare itself. */
static int
same_types(PyObject *v, PyObject *b)
{
    Py_ssize_t n;
    PyObject **vs, **bs;

    if (Py_TYPE(v) != Py_TYPE(b)) {
        return 0;
    }
    if (!PyTuple_CheckExact(v) && !PyList_CheckExact(v)) {
        return 1;
    }
    n = PySequence_Fast_GET_SIZE(v);
    if (n != PySequence_Fast_GET_SIZE(b)) {
        return 0;
    }
    vs = PySequence_Fast_ITEMS(v);
    bs = PySequence_Fast_ITEMS(b);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!same_types(vs[i], bs[i])) {
            return 0;
        }
    }
    return 1;
}

static inline int
check_EQ_fast(G_FAST_ARGS)
{
    int eq;

    (void)p;
    (void)sv;
    /* plain types only (ints, strings, dtypes, tuples of them): their
     * equality runs no user code */
    if (v == G_MISSING || (PyObject *)Py_TYPE(v) != c->a
        || !same_types(v, c->b)) {
        return 0;
    }
    eq = PyObject_RichCompareBool(v, c->b, Py_EQ);
    if (eq < 0) {   /* not the plain value it was: the check fails */
        PyErr_Clear();
        return 0;
    }
    return eq;
}

/* 1 if v is or holds a list, a set or a bytearray: a value that changes
 * in place (`self.skip.add(2)`), without any dict the memo watches
 * changing. */
static int
holds_mutable(PyObject *v)
{
    if (PyList_Check(v) || PyByteArray_Check(v)
        || (PyAnySet_Check(v) && !PyFrozenSet_Check(v))) {
        return 1;
    }
    if (PyTuple_Check(v)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); i++) {
            if (holds_mutable(PyTuple_GET_ITEM(v, i))) {
                return 1;
            }
        }
    }
    return 0;
}

static g_memo_rule
check_EQ_memo(const g_program *p, PyObject *v)
{
    (void)p;
    /* an immutable value found in the same place is the same value */
    return holds_mutable(v) ? G_MEMO_RUN : G_MEMO_SKIP;
}

static const char *
check_EQ_parse(g_check *c, const g_program *p)
{
    (void)p;
    return is_type(c->a) ? NULL : "(type, value)";
}

enum { check_EQ_signed = 0 };

/* LEN --------------------------------------------------------------- */

static inline int
check_LEN_fast(G_FAST_ARGS)
{
    Py_ssize_t n;

    (void)p;
    (void)sv;
    if (v == G_MISSING || (PyObject *)Py_TYPE(v) != c->a) {
        return 0;
    }
    n = PyObject_Size(v);
    return n < 0 ? -1 : n == c->n;
}

/* A tuple's length cannot change; a dict's holds while its version does;
 * a list's may change with nothing the memo watches. */
static g_memo_rule
check_LEN_memo(const g_program *p, PyObject *v)
{
    (void)p;
    if (v != G_MISSING && PyTuple_CheckExact(v)) {
        return G_MEMO_SKIP;
    }
    if (v != G_MISSING && PyDict_Check(v)) {
        return G_MEMO_SKIP_DICT;
    }
    return G_MEMO_RUN;
}

static const char *
check_LEN_parse(g_check *c, const g_program *p)
{
    (void)p;
    if (!is_type(c->a) || !PyLong_Check(c->b)) {
        return "(type, length)";
    }
    c->n = PyLong_AsSsize_t(c->b);
    if (c->n < 0) {
        PyErr_Clear();   /* reported as the refusal below */
        return "(type, length), a length >= 0";
    }
    return NULL;
}

enum { check_LEN_signed = 0 };

/* ID ---------------------------------------------------------------- */

static inline int
check_ID_fast(G_FAST_ARGS)
{
    (void)p;
    (void)sv;
    if (c->b == Py_True) {
        /* only the address is compared: no reference needs keeping */
        PyObject *held = ags_compat_weak_target(c->a);
        return held != NULL && held == v;
    }
    return v == c->a;
}

static g_memo_rule
check_ID_memo(const g_program *p, PyObject *v)
{
    (void)p;
    (void)v;
    return G_MEMO_SKIP;   /* the memo remembers this very object */
}

static const char *
check_ID_parse(g_check *c, const g_program *p)
{
    (void)p;
    if (!PyBool_Check(c->b)
        || (c->b == Py_True && !PyWeakref_CheckRef(c->a))) {
        return "(object, False) or (weak reference, True)";
    }
    return NULL;
}

enum { check_ID_signed = 0 };

/* ABSENT ------------------------------------------------------------ */

static inline int
check_ABSENT_fast(G_FAST_ARGS)
{
    (void)p;
    (void)sv;
    (void)c;
    return v == G_MISSING;
}

static g_memo_rule
check_ABSENT_memo(const g_program *p, PyObject *v)
{
    (void)p;
    (void)v;
    return G_MEMO_SKIP;   /* every place searched is witnessed */
}

static const char *
check_ABSENT_parse(g_check *c, const g_program *p)
{
    (void)p;
    return c->a == Py_None && c->b == Py_None ? NULL : "(None, None)";
}

enum { check_ABSENT_signed = 0 };

/* DYNTENSOR --------------------------------------------------------- */

static inline int
check_DYNTENSOR_fast(G_FAST_ARGS)
{
    if (v == G_MISSING) {
        return 0;
    }
    return ags_sym_check_tensor(&p->sym, sv, v, c->a, c->b);
}

/* It binds the symbols the size guards read: it always runs. */
static g_memo_rule
check_DYNTENSOR_memo(const g_program *p, PyObject *v)
{
    (void)p;
    (void)v;
    return G_MEMO_RUN;
}

static const char *
check_DYNTENSOR_parse(g_check *c, const g_program *p)
{
    if (!is_type(c->a)
        || !ags_sym_spec_ok(c->b, p->sym.n_syms, p->sym.n_exprs)) {
        return "(type, (dtype, device, sizes, strides, requires_grad)) "
               "naming only the program's symbols and expressions";
    }
    return NULL;
}

/* A signature hashes the sizes, which a dynamic check leaves open. */
enum { check_DYNTENSOR_signed = 0 };

/* DYNINT ------------------------------------------------------------ */

static inline int
check_DYNINT_fast(G_FAST_ARGS)
{
    (void)p;
    if (v == G_MISSING) {
        return 0;
    }
    return ags_sym_check_int(sv, v, c->a, c->b);
}

/* It binds a symbol the size guards read: it always runs. */
static g_memo_rule
check_DYNINT_memo(const g_program *p, PyObject *v)
{
    (void)p;
    (void)v;
    return G_MEMO_RUN;
}

static const char *
check_DYNINT_parse(g_check *c, const g_program *p)
{
    long long k = PyLong_Check(c->b) ? PyLong_AsLongLong(c->b) : 0;

    if (PyErr_Occurred()) {
        PyErr_Clear();
        k = 0;
    }
    if (c->a != (PyObject *)&PyLong_Type || k >= 0 || -k - 1 >= p->sym.n_syms) {
        return "(int, -1 - symbol index) naming one of the program's symbols";
    }
    return NULL;
}

/* A signature hashes an int argument's type only. */
enum { check_DYNINT_signed = 0 };

/* The table --------------------------------------------------------- */

typedef struct {
    const char *name;
    g_memo_rule (*memo)(const g_program *p, PyObject *v);
    const char *(*parse)(g_check *c, const g_program *p);
    int settled_by_signature;
} g_check_row;

#define AGS_X(NAME, doc) \
    {#NAME, check_##NAME##_memo, check_##NAME##_parse, check_##NAME##_signed},
static const g_check_row check_rows[AGS_CHECK_COUNT] = {
    AGS_CHECK_LIST(AGS_X)
};
#undef AGS_X

static inline int
check_one(g_program *p, ags_symvals *sv, const g_check *c, PyObject *v)
{
    switch ((ags_CHECK_kind)c->kind) {
#define AGS_X(NAME, doc) \
    case AGS_CHECK_##NAME: \
        return check_##NAME##_fast(p, sv, c, v);
    AGS_CHECK_LIST(AGS_X)
#undef AGS_X
    default:
        Py_UNREACHABLE();   /* refused by ags_check_parse */
    }
}

/* The deferred TENSOR checks (batch.c): their tensors, all of exactly the
 * expected type, confirmed by one checker, else one by one in order. */
static int
run_deferred(g_program *p, ags_symvals *sv, const int *index,
             PyObject *const *tensors, Py_ssize_t n, Py_ssize_t *failed)
{
    int refused;

    if (ags_batch_run(p, index, tensors, n, &refused)) {
        return 1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        int ok = check_TENSOR_fast(p, sv, &p->checks[index[k]], tensors[k]);
        if (ok != 1) {
            if (ok == 0) {
                *failed = index[k];
            }
            return ok;
        }
    }
    ags_batch_learn(p, index, tensors, n, refused);
    return 1;
}

int
ags_check_run(g_program *p, g_values *t, ags_symvals *sv, ags_gframe *frame,
              int fast, int signed_frame, Py_ssize_t *failed)
{
    const g_memo *m = &p->memo;
    Py_ssize_t n = fast ? m->n_live : p->n_checks, n_deferred = 0;
    int deferred[G_BATCH_MAX];
    PyObject *tensors[G_BATCH_MAX];   /* borrowed from the table */
    int batch = p->batch_make != NULL && !p->batch_off;

    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t index = fast ? m->live[k] : k;
        const g_check *c = &p->checks[index];
        PyObject *v;
        int ok;

        if (signed_frame && c->signed_arg) {
            continue;
        }
        v = ags_load_value(p, t, c->slot, frame);
        if (v == NULL) {
            return -1;
        }
        if (batch && c->kind == AGS_CHECK_TENSOR && n_deferred < G_BATCH_MAX
            && (PyObject *)Py_TYPE(v) == c->a) {
            /* its type here, the rest after the loop (batch.c) */
            deferred[n_deferred] = (int)index;
            tensors[n_deferred++] = v;
            continue;
        }
        ok = check_one(p, sv, c, v);
        if (ok != 1) {
            if (ok == 0) {
                *failed = index;
            }
            return ok;
        }
    }
    return n_deferred == 0 ? 1 : run_deferred(p, sv, deferred, tensors,
                                              n_deferred, failed);
}

g_memo_rule
ags_check_memo_rule(const g_program *p, const g_check *c, PyObject *v)
{
    return check_rows[c->kind].memo(p, v);
}

int
ags_check_parse(g_check *c, PyObject *item, Py_ssize_t i, const g_program *p)
{
    PyObject *kind, *a, *b;
    const char *needs;
    int slot;

    /* into locals first: a failed parse may have set some of them */
    if (!PyArg_ParseTuple(item, "iOOO", &slot, &kind, &a, &b)) {
        return ags_gp_refuse("check", i);
    }
    c->slot = slot;
    c->a = Py_NewRef(a);
    c->b = Py_NewRef(b);
    if (ags_protocol_kind(kind, AGS_CHECK_COUNT, "check", &c->kind) < 0) {
        return ags_gp_refuse("check", i);
    }
    if (c->slot < 0 || c->slot >= p->n_loads) {
        PyErr_Format(PyExc_ValueError, "bad guard check %zd (%s): slot %d "
                     "names no load (there are %zd)", i,
                     check_rows[c->kind].name, c->slot, p->n_loads);
        return -1;
    }
    needs = check_rows[c->kind].parse(c, p);
    if (needs != NULL) {
        PyErr_Format(PyExc_ValueError, "bad guard check %zd (%s): expects "
                     "(a, b) = %s", i, check_rows[c->kind].name, needs);
        return -1;
    }
    c->signed_arg = check_rows[c->kind].settled_by_signature
                    && p->loads[c->slot].arg >= 0;
    return 0;
}
