/* alias.c: the identity relations among a program's tensors.
 *
 * A capture sees each tensor of the frame as one object.  What it computed
 * can depend on which of them were one object:
 *
 *   aliases   pairs of loads that reached the same tensor (tied weights,
 *             f(x, x)): the graph has one input for both, so a later frame
 *             must bring one object again;
 *   distinct  loads that reached different tensors: the graph has one input
 *             each, and the capture may have relied on their being apart
 *             (`a is b`, a set of tensors, one written in place while the
 *             other is read), so a later frame bringing one tensor through
 *             two of them must not reuse it.
 *
 * Through the structure memo, a pair of remembered loads (a module's
 * parameters) cannot have changed, so only the loads read afresh (the
 * data tensors) are checked: each is looked up among the remembered
 * values, kept sorted by address when the memo is made, and compared with
 * the other fresh ones.  Without the memo a few values are compared
 * pairwise, more go through a small open-addressing set of addresses.
 */
#include "program.h"

/* Parses aliases [(slot, slot)] and distinct [slot] into `p`. 0 or -1. */
int
ags_alias_parse(g_program *p, PyObject *aliases, PyObject *distinct)
{
    Py_ssize_t n_distinct = distinct != NULL ? PyList_GET_SIZE(distinct) : 0;

    p->n_aliases = PyList_GET_SIZE(aliases);
    p->aliases = PyMem_Calloc(2 * (size_t)p->n_aliases + 1, sizeof(int));
    p->distinct = PyMem_Calloc((size_t)n_distinct + 1, sizeof(int));
    if (p->aliases == NULL || p->distinct == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < p->n_aliases; i++) {
        int *pair = &p->aliases[2 * i];
        if (!PyArg_ParseTuple(PyList_GET_ITEM(aliases, i), "ii", &pair[0],
                              &pair[1])) {
            return ags_gp_refuse("alias", i);
        }
        if (pair[0] < 0 || pair[0] >= p->n_loads || pair[1] < 0
            || pair[1] >= p->n_loads) {
            PyErr_Format(PyExc_ValueError, "bad guard alias %zd", i);
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < n_distinct; i++) {
        long k = PyLong_AsLong(PyList_GET_ITEM(distinct, i));
        if (k < 0 || k >= p->n_loads) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError, "bad guard distinct load %zd",
                             i);
            }
            return -1;
        }
        p->distinct[i] = (int)k;
    }
    p->n_distinct = n_distinct;
    return 0;
}

void
ags_alias_release(g_program *p)
{
    PyMem_Free(p->aliases);
    PyMem_Free(p->distinct);
    p->aliases = NULL;
    p->distinct = NULL;
    p->n_aliases = p->n_distinct = 0;
}

static int
check_aliases(g_program *p, g_values *t, ags_gframe *frame, int fast,
              Py_ssize_t *index)
{
    for (Py_ssize_t i = 0; i < p->n_aliases; i++) {
        PyObject *a, *b;
        if (fast && p->memo.skip_alias[i]) {
            continue;
        }
        a = ags_load_value(p, t, p->aliases[2 * i], frame);
        b = a ? ags_load_value(p, t, p->aliases[2 * i + 1], frame) : NULL;
        if (b == NULL) {
            return -1;
        }
        if (a != b || a == G_MISSING) {
            *index = i;
            return 0;
        }
    }
    return 1;
}

/* The index of the first value in v[0..n) that repeats an earlier one, or
 * -1; through an address set of `cap` slots (a power of two, more than n). */
static Py_ssize_t
first_repeat(PyObject **v, Py_ssize_t n, PyObject **set, size_t cap)
{
    memset(set, 0, cap * sizeof(PyObject *));
    for (Py_ssize_t i = 0; i < n; i++) {
        /* objects are 16-byte aligned: drop those bits, then mix */
        size_t h = (size_t)(((uintptr_t)v[i] >> 4) * 0x9E3779B97F4A7C15ull);
        for (size_t k = h & (cap - 1);; k = (k + 1) & (cap - 1)) {
            if (set[k] == NULL) {
                set[k] = v[i];
                break;
            }
            if (set[k] == v[i]) {
                return i;
            }
        }
    }
    return -1;
}

static int
by_address(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)*(PyObject *const *)a;
    uintptr_t y = (uintptr_t)*(PyObject *const *)b;
    return (x > y) - (x < y);
}

int
ags_alias_memo(g_program *p)
{
    g_memo *m = &p->memo;
    Py_ssize_t n = p->n_distinct;

    PyMem_Free(m->apart);
    PyMem_Free(m->fresh);
    m->apart = PyMem_Malloc(((size_t)n + 1) * sizeof(PyObject *));
    m->fresh = PyMem_Malloc(((size_t)n + 1) * sizeof(int));
    m->n_apart = m->n_fresh = 0;
    if (m->apart == NULL || m->fresh == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int k = p->distinct[i];
        if (m->frozen[k]) {
            m->apart[m->n_apart++] = m->values[k];
        }
        else {
            m->fresh[m->n_fresh++] = (int)i;
        }
    }
    qsort(m->apart, (size_t)m->n_apart, sizeof(PyObject *), by_address);
    return 0;
}

/* Whether `v` is among the memo's remembered distinct values. */
static int
remembered(const g_memo *m, PyObject *v)
{
    Py_ssize_t lo = 0, hi = m->n_apart;

    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)m->apart[mid] < (uintptr_t)v) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo < m->n_apart && m->apart[lo] == v;
}

/* Through the memo: the remembered values were different when it was
 * made and cannot have changed since, so each load read afresh is looked
 * up among them and compared with the other fresh ones.  1, 0 (*index) or
 * -1. */
static int
check_fresh(g_program *p, g_values *t, ags_gframe *frame, Py_ssize_t *index)
{
    const g_memo *m = &p->memo;
    PyObject *small[8];

    for (Py_ssize_t f = 0; f < m->n_fresh; f++) {
        Py_ssize_t i = m->fresh[f];
        PyObject *v = ags_load_value(p, t, p->distinct[i], frame);
        if (v == NULL) {
            return -1;
        }
        int seen = v != G_MISSING && remembered(m, v);
        for (Py_ssize_t g = 0; !seen && g < f; g++) {
            /* the earlier fresh values: kept when few, loaded again (from
             * the evaluation's table) past that */
            PyObject *w = g < 8 ? small[g]
                                : ags_load_value(p, t, p->distinct[m->fresh[g]],
                                                 frame);
            seen = w == v && v != G_MISSING;
        }
        if (seen) {
            *index = i;
            return 0;
        }
        if (f < 8) {
            small[f] = v;
        }
    }
    return 1;
}

/* 1 when the distinct loads reach different objects, 0 (with *index, the
 * position in the list of a load that repeats another) or -1. */
static int
check_distinct(g_program *p, g_values *t, ags_gframe *frame, int fast,
               Py_ssize_t *index)
{
    enum { SMALL = 32 };
    PyObject *small[SMALL], *small_set[2 * SMALL];
    PyObject **v = small, **set = small_set;
    Py_ssize_t n = p->n_distinct, repeat = -1;
    size_t cap = 2 * SMALL;
    int ok = -1;

    if (n < 2) {
        return 1;
    }
    if (fast && p->memo.fresh != NULL) {
        return check_fresh(p, t, frame, index);
    }
    if (n > SMALL) {
        for (cap = 2 * SMALL; cap < 2 * (size_t)n; cap *= 2) {
        }
        v = PyMem_Malloc((size_t)n * sizeof(PyObject *));
        set = PyMem_Malloc(cap * sizeof(PyObject *));
        if (v == NULL || set == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        v[i] = ags_load_value(p, t, p->distinct[i], frame);
        if (v[i] == NULL) {
            goto done;
        }
    }
    if (n <= 8) {
        for (Py_ssize_t i = 1; repeat < 0 && i < n; i++) {
            for (Py_ssize_t j = 0; j < i; j++) {
                if (v[j] == v[i]) {
                    repeat = i;
                    break;
                }
            }
        }
    }
    else {
        repeat = first_repeat(v, n, set, cap);
    }
    if (repeat >= 0 && v[repeat] == G_MISSING) {
        repeat = -1;   /* nothing there: the checks on those loads fail */
    }
    ok = repeat < 0;
    *index = repeat;
done:
    if (v != small) {
        PyMem_Free(v);
    }
    if (set != small_set) {
        PyMem_Free(set);
    }
    return ok;
}

int
ags_alias_run(g_program *p, g_values *t, ags_gframe *frame, int fast,
              int *part, Py_ssize_t *index)
{
    int ok = check_aliases(p, t, frame, fast, index);

    if (ok == 0) {
        *part = AGS_PART_ALIAS;
        return 0;
    }
    if (ok == 1) {
        ok = check_distinct(p, t, frame, fast, index);
        if (ok == 0) {
            *part = AGS_PART_DISTINCT;
        }
    }
    return ok;
}
