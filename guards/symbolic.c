/* symbolic.c: symbolic sizes in guard programs (dynamic shapes).
 *
 * A graph captured with a dynamic dimension serves every size of it for
 * which the assumptions the capture made about that size still hold.  The
 * guard program that decides this keeps, besides its ordinary checks:
 *
 *   symbols   n_syms integer slots, one per dynamic dimension of an input
 *             (s0 = x.size(0), ...).  A DYNTENSOR check binds a slot to the
 *             size it reads the first time, and compares it after that (two
 *             dimensions the capture found equal share a slot).  A non-dense
 *             input's stride may be a symbol of its own, bound the same way,
 *             and so is a Python int the capture made dynamic (DYNINT).
 *   exprs     integer expressions over the symbols, each a little postfix
 *             program of int64 words (AGS_SOP_LIST, protocol.h).  A dynamic
 *             tensor's symbolic strides refer to them (a contiguous
 *             x[s0, 16, s1] has strides 16*s1, s1, 1), and so do the guards.
 *   guards    the expressions that must be non-zero: the facts the capture
 *             relied on (s0 >= 2, Eq(s0, s1), s1 <= 64), harvested from
 *             torch's ShapeEnv by agspeed/_shapes.py.
 *   fallback  None, or a Python callable given the tuple of symbol values
 *             for guards the postfix language cannot say (rare: division
 *             to a fraction, say), followed by the values of the plain
 *             floats the capture made symbols (float slots: loads of the
 *             program), which the int64 words cannot hold: an optimizer's
 *             `momentum != 0`.  It runs only after everything else
 *             passed.
 *
 * Evaluation never raises for a value: an unbound symbol, a division by
 * zero or an int64 overflow makes the guard fail, so the call is captured
 * again, which is always correct.
 *
 * Rejected: evaluating the guards as sympy expressions (a Python call and
 * several allocations per hit), or as Python code compiled from them (one
 * Python frame per hit, and the hook runs guards with frames off).
 */
#include "guards.h"

/* The postfix operations are AGS_SOP_LIST (protocol.h): a program is a
 * sequence of words, an op, then its immediates. */

/* Operands each op pops (CONST and SYM pop none, NEG and NOT one). */
static int
op_pops(int64_t op)
{
    return op == AGS_SOP_CONST || op == AGS_SOP_SYM ? 0
           : op == AGS_SOP_NEG || op == AGS_SOP_NOT ? 1 : 2;
}

/* The deepest stack a program may need: more is refused when it is set. */
#define SYM_STACK 64

/* ------------------------------------------------------------------ */
/* Evaluation */

static int
floordiv(int64_t a, int64_t b, int64_t *out)
{
    int64_t q;

    if (b == 0 || (a == INT64_MIN && b == -1)) {
        return -1;
    }
    q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) {
        q--;
    }
    *out = q;
    return 0;
}

static int
pymod(int64_t a, int64_t b, int64_t *out)
{
    int64_t r;

    if (b == 0) {
        return -1;
    }
    if (b == -1) {
        *out = 0;
        return 0;
    }
    r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) {
        r += b;
    }
    *out = r;
    return 0;
}

static int
ipow(int64_t a, int64_t b, int64_t *out)
{
    int64_t r = 1;

    if (b < 0) {
        return -1;
    }
    while (b-- > 0) {
        if (__builtin_mul_overflow(r, a, &r)) {
            return -1;
        }
    }
    *out = r;
    return 0;
}

/* The value of one operation on a and b (b unused for one-operand ops).
 * 0, or -1 if it has none (overflow, division by zero). */
static int
apply(int64_t op, int64_t a, int64_t b, int64_t *out)
{
    switch (op) {
    case AGS_SOP_ADD:
        return __builtin_add_overflow(a, b, out) ? -1 : 0;
    case AGS_SOP_MUL:
        return __builtin_mul_overflow(a, b, out) ? -1 : 0;
    case AGS_SOP_NEG:
        return __builtin_sub_overflow((int64_t)0, a, out) ? -1 : 0;
    case AGS_SOP_FLOORDIV:
        return floordiv(a, b, out);
    case AGS_SOP_MOD:
        return pymod(a, b, out);
    case AGS_SOP_POW:
        return ipow(a, b, out);
    case AGS_SOP_MIN:
        *out = a < b ? a : b;
        return 0;
    case AGS_SOP_MAX:
        *out = a > b ? a : b;
        return 0;
    case AGS_SOP_EQ:
        *out = a == b;
        return 0;
    case AGS_SOP_NE:
        *out = a != b;
        return 0;
    case AGS_SOP_LT:
        *out = a < b;
        return 0;
    case AGS_SOP_LE:
        *out = a <= b;
        return 0;
    case AGS_SOP_GT:
        *out = a > b;
        return 0;
    case AGS_SOP_GE:
        *out = a >= b;
        return 0;
    case AGS_SOP_AND:
        *out = a != 0 && b != 0;
        return 0;
    case AGS_SOP_OR:
        *out = a != 0 || b != 0;
        return 0;
    case AGS_SOP_NOT:
        *out = a == 0;
        return 0;
    }
    return -1;
}

int
ags_sym_eval(const int64_t *code, Py_ssize_t n, const ags_symvals *s,
             int64_t *out)
{
    int64_t stack[SYM_STACK];
    int sp = 0;

    for (Py_ssize_t pc = 0; pc < n; pc++) {
        int64_t op = code[pc];

        if (op == AGS_SOP_CONST) {
            stack[sp++] = code[++pc];
        }
        else if (op == AGS_SOP_SYM) {
            int64_t k = code[++pc];
            if (!s->bound[k]) {
                return -1;
            }
            stack[sp++] = s->v[k];
        }
        else if (op_pops(op) == 1) {
            if (apply(op, stack[sp - 1], 0, &stack[sp - 1]) < 0) {
                return -1;
            }
        }
        else {
            sp--;
            if (apply(op, stack[sp - 1], stack[sp], &stack[sp - 1]) < 0) {
                return -1;
            }
        }
    }
    *out = stack[0];
    return 0;
}

/* ------------------------------------------------------------------ */
/* Tables */

/* 0 if `code` (n words) is a well-formed program over n_syms symbols that
 * leaves exactly one value; -1 with ValueError if not.  Evaluation relies
 * on this and checks nothing of the shape again. */
static int
validate(const int64_t *code, Py_ssize_t n, Py_ssize_t n_syms)
{
    int depth = 0;

    for (Py_ssize_t pc = 0; pc < n; pc++) {
        int64_t op = code[pc];

        if (op < 0 || op >= AGS_SOP_COUNT) {
            goto bad;
        }
        if (ags_sop_immediates[op] && ++pc >= n) {
            goto bad;
        }
        if (op == AGS_SOP_SYM && (code[pc] < 0 || code[pc] >= n_syms)) {
            goto bad;
        }
        if (depth < op_pops(op)) {
            goto bad;
        }
        depth += 1 - op_pops(op);   /* every op pushes one value */
        if (depth > SYM_STACK) {
            goto bad;
        }
    }
    if (depth == 1) {
        return 0;
    }
bad:
    PyErr_SetString(PyExc_ValueError, "bad symbolic size expression");
    return -1;
}

/* A new PyMem array of the ints of the tuple `words`, validated. */
static int64_t *
read_program(PyObject *words, Py_ssize_t n_syms, Py_ssize_t *n)
{
    int64_t *code;

    if (!PyTuple_Check(words)) {
        PyErr_SetString(PyExc_TypeError, "a symbolic expression is a tuple of ints");
        return NULL;
    }
    *n = PyTuple_GET_SIZE(words);
    code = PyMem_Calloc((size_t)*n + 1, sizeof(int64_t));
    if (code == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        code[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(words, i));
        if (code[i] == -1 && PyErr_Occurred()) {
            PyMem_Free(code);
            return NULL;
        }
    }
    if (validate(code, *n, n_syms) < 0) {
        PyMem_Free(code);
        return NULL;
    }
    return code;
}

void
ags_symtab_release(ags_symtab *t)
{
    for (Py_ssize_t i = 0; i < t->n_exprs; i++) {
        PyMem_Free(t->exprs[i]);
    }
    PyMem_Free(t->exprs);
    PyMem_Free(t->expr_len);
    PyMem_Free(t->guards);
    PyMem_Free(t->float_slots);
    Py_CLEAR(t->fallback);
    memset(t, 0, sizeof(*t));
}

int
ags_symtab_set(ags_symtab *t, PyObject *spec)
{
    PyObject *exprs, *guards, *fallback, *floats = NULL;
    Py_ssize_t n_syms;

    ags_symtab_release(t);
    if (spec == Py_None) {
        return 0;
    }
    if (!PyArg_ParseTuple(spec, "nO!O!O|O!:symbolic", &n_syms, &PyTuple_Type,
                          &exprs, &PyTuple_Type, &guards, &fallback,
                          &PyTuple_Type, &floats)) {
        return -1;
    }
    if (n_syms < 0 || n_syms > AGS_SYM_MAX) {
        PyErr_Format(PyExc_ValueError, "a guard program has 0 to %d symbols",
                     AGS_SYM_MAX);
        return -1;
    }
    t->n_syms = n_syms;
    t->n_exprs = PyTuple_GET_SIZE(exprs);
    t->n_guards = PyTuple_GET_SIZE(guards);
    t->exprs = PyMem_Calloc((size_t)t->n_exprs + 1, sizeof(int64_t *));
    t->expr_len = PyMem_Calloc((size_t)t->n_exprs + 1, sizeof(Py_ssize_t));
    t->guards = PyMem_Calloc((size_t)t->n_guards + 1, sizeof(Py_ssize_t));
    if (!t->exprs || !t->expr_len || !t->guards) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < t->n_exprs; i++) {
        t->exprs[i] = read_program(PyTuple_GET_ITEM(exprs, i), n_syms,
                                   &t->expr_len[i]);
        if (t->exprs[i] == NULL) {
            t->n_exprs = i;   /* release only what was made */
            goto error;
        }
    }
    for (Py_ssize_t i = 0; i < t->n_guards; i++) {
        Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(guards, i));
        if (k < 0 || k >= t->n_exprs) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "a symbolic guard names no expression");
            }
            goto error;
        }
        t->guards[i] = k;
    }
    if (fallback != Py_None && !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "the symbolic fallback must be None or callable");
        goto error;
    }
    t->fallback = fallback == Py_None ? NULL : Py_NewRef(fallback);
    t->n_floats = floats != NULL ? PyTuple_GET_SIZE(floats) : 0;
    if (t->n_floats > AGS_SYM_MAX) {
        PyErr_Format(PyExc_ValueError, "a guard program has 0 to %d float "
                     "symbols", AGS_SYM_MAX);
        goto error;
    }
    t->float_slots = PyMem_Calloc((size_t)t->n_floats + 1, sizeof(Py_ssize_t));
    if (t->float_slots == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < t->n_floats; i++) {
        t->float_slots[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(floats, i));
        if (t->float_slots[i] < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError,
                                "a float symbol names no load");
            }
            goto error;
        }
    }
    t->active = 1;
    return 0;
error:
    ags_symtab_release(t);
    return -1;
}

void
ags_symvals_init(ags_symvals *s, const ags_symtab *t)
{
    memset(s->bound, 0, (size_t)t->n_syms);
}

/* ------------------------------------------------------------------ */
/* Checks */

/* Compares one size or stride `got` with its spec word: >= 0 a constant,
 * < 0 a symbol (sizes) or an expression (strides). */
static int
match_size(ags_symvals *s, int64_t want, int64_t got)
{
    int64_t k;

    if (want >= 0) {
        return got == want;
    }
    k = -want - 1;
    if (!s->bound[k]) {
        s->bound[k] = 1;
        s->v[k] = got;
        return 1;
    }
    return s->v[k] == got;
}

/* Strides are matched in two passes: a stride that is a symbol of its own
 * (a non-dense input) is bound in the first, so that the others, which
 * may be expressions of it (x[:, ::2] of a contiguous x: size(1)*stride(1),
 * stride(1)), can be computed in the second. */
static int
match_stride(const ags_symtab *t, ags_symvals *s, int64_t want, int64_t got,
             int pass)
{
    int64_t k, value;

    if (want >= 0) {
        return pass == 1 || got == want;
    }
    k = -want - 1;
    if (k >= t->n_exprs) {
        return 0;
    }
    if (pass == 0) {
        if (t->expr_len[k] == 2 && t->exprs[k][0] == AGS_SOP_SYM) {
            return match_size(s, -t->exprs[k][1] - 1, got);
        }
        return 1;
    }
    if (ags_sym_eval(t->exprs[k], t->expr_len[k], s, &value) < 0) {
        return 0;
    }
    return value == got;
}

/* 1 if the int sequence `seq` (a new reference, or NULL after an error)
 * matches `spec` word by word, as sizes or as strides; 0 if not, -1 on
 * error. */
static int
match_ints(const ags_symtab *t, ags_symvals *s, PyObject *seq, PyObject *spec,
           int strides)
{
    Py_ssize_t n;
    int ok = 1;

    if (seq == NULL) {
        return -1;
    }
    n = PyTuple_GET_SIZE(spec);
    if (!PyTuple_Check(seq) || PyTuple_GET_SIZE(seq) != n) {
        Py_DECREF(seq);
        return 0;
    }
    for (int pass = 0; ok == 1 && pass < 1 + strides; pass++) {
        for (Py_ssize_t i = 0; ok == 1 && i < n; i++) {
            long long got = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
            long long want = PyLong_AsLongLong(PyTuple_GET_ITEM(spec, i));
            if ((got == -1 || want == -1) && PyErr_Occurred()) {
                ok = -1;
            }
            else {
                ok = strides ? match_stride(t, s, want, got, pass)
                             : match_size(s, want, got);
            }
        }
    }
    Py_DECREF(seq);
    return ok;
}

/* 1 if v.<name> is `want` (dtypes and bools are singletons). */
static int
attr_is(PyObject *v, PyObject *name, PyObject *want)
{
    PyObject *got = PyObject_GetAttr(v, name);

    if (got == NULL) {
        return -1;
    }
    Py_DECREF(got);
    return got == want;
}

int
ags_sym_check_tensor(const ags_symtab *t, ags_symvals *s, PyObject *v,
                     PyObject *type, PyObject *spec)
{
    PyObject *device;
    int ok;

    if ((PyObject *)Py_TYPE(v) != type) {
        return 0;
    }
    ok = attr_is(v, ags_tnames.dtype, PyTuple_GET_ITEM(spec, 0));
    if (ok == 1) {
        ok = attr_is(v, ags_tnames.requires_grad, PyTuple_GET_ITEM(spec, 4));
    }
    if (ok == 1) {
        ok = match_ints(t, s, PyObject_GetAttr(v, ags_tnames.shape),
                        PyTuple_GET_ITEM(spec, 2), 0);
    }
    if (ok == 1) {
        ok = match_ints(t, s, PyObject_CallMethodNoArgs(v, ags_tnames.stride),
                        PyTuple_GET_ITEM(spec, 3), 1);
    }
    if (ok == 1) {
        device = PyObject_GetAttr(v, ags_tnames.device);
        ok = device == NULL ? -1
             : PyObject_RichCompareBool(device, PyTuple_GET_ITEM(spec, 1), Py_EQ);
        Py_XDECREF(device);
    }
    return ok;
}

int
ags_sym_check_int(ags_symvals *s, PyObject *v, PyObject *type, PyObject *word)
{
    int overflow = 0;
    long long got;

    if ((PyObject *)Py_TYPE(v) != type) {
        return 0;
    }
    got = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (got == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;   /* beyond int64: captured again, for that value */
    }
    return match_size(s, (int64_t)PyLong_AsLongLong(word), (int64_t)got);
}

int
ags_sym_spec_ok(PyObject *spec, Py_ssize_t n_syms, Py_ssize_t n_exprs)
{
    PyObject *sizes, *strides;

    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) {
        return 0;
    }
    sizes = PyTuple_GET_ITEM(spec, 2);
    strides = PyTuple_GET_ITEM(spec, 3);
    if (!PyTuple_Check(sizes) || !PyTuple_Check(strides)
        || PyTuple_GET_SIZE(sizes) != PyTuple_GET_SIZE(strides)) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sizes); i++) {
        long long a = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, i));
        long long b = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if ((a < 0 && -a - 1 >= n_syms) || (b < 0 && -b - 1 >= n_exprs)) {
            return 0;
        }
    }
    return 1;
}

int
ags_sym_check_guards(const ags_symtab *t, ags_symvals *s,
                     PyObject *const *floats, Py_ssize_t *failed)
{
    PyObject *values, *verdict;
    Py_ssize_t n;
    int ok;

    for (Py_ssize_t i = 0; i < t->n_guards; i++) {
        Py_ssize_t k = t->guards[i];
        int64_t value;
        if (ags_sym_eval(t->exprs[k], t->expr_len[k], s, &value) < 0 || value == 0) {
            *failed = i;
            return 0;
        }
    }
    if (t->fallback == NULL) {
        return 1;
    }
    *failed = t->n_guards;
    n = t->n_syms + t->n_floats;
    values = PyTuple_New(n);
    for (Py_ssize_t k = 0; values != NULL && k < n; k++) {
        PyObject *item = k >= t->n_syms ? Py_NewRef(floats[k - t->n_syms])
                         : s->bound[k] ? PyLong_FromLongLong(s->v[k])
                                       : Py_NewRef(Py_None);
        if (item == NULL) {
            Py_CLEAR(values);
            break;
        }
        PyTuple_SET_ITEM(values, k, item);
    }
    if (values == NULL) {
        return -1;
    }
    verdict = PyObject_CallOneArg(t->fallback, values);
    Py_DECREF(values);
    if (verdict == NULL) {
        return -1;
    }
    ok = PyObject_IsTrue(verdict);
    Py_DECREF(verdict);
    return ok;
}

/* ------------------------------------------------------------------ */
/* For Python: the op table and an evaluator, for agspeed/_shapes.py and
 * tests. */

/* sym_eval(code, values) -> int or None: `code` (a tuple of ints) over the
 * symbols `values` (a tuple of ints, None for unbound); None where the
 * expression has no value. */
PyObject *
ags_sym_eval_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ags_symvals s;
    int64_t *code, out = 0;
    Py_ssize_t n, n_syms;
    int rc;

    (void)module;
    if (nargs != 2 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "sym_eval(code, values): two tuples");
        return NULL;
    }
    n_syms = PyTuple_GET_SIZE(args[1]);
    if (n_syms > AGS_SYM_MAX) {
        PyErr_Format(PyExc_ValueError, "at most %d symbols", AGS_SYM_MAX);
        return NULL;
    }
    memset(s.bound, 0, sizeof(s.bound));
    for (Py_ssize_t k = 0; k < n_syms; k++) {
        PyObject *item = PyTuple_GET_ITEM(args[1], k);
        if (item == Py_None) {
            continue;
        }
        s.v[k] = PyLong_AsLongLong(item);
        if (s.v[k] == -1 && PyErr_Occurred()) {
            return NULL;
        }
        s.bound[k] = 1;
    }
    code = read_program(args[0], n_syms, &n);
    if (code == NULL) {
        return NULL;
    }
    rc = ags_sym_eval(code, n, &s, &out);
    PyMem_Free(code);
    if (rc < 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong(out);
}
