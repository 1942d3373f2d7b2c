/* interp_iter.c: iterators the capture made, and the builtins that call a
 * function per element (map, filter, functools.reduce, calls through a
 * functools.partial), for the symbolic interpreter (see interp.h).
 *
 * Iterators.  iter(), zip(), enumerate(), reversed(), dict views and the
 * itertools constructors are folded by the builder on graph arguments: the
 * answer is a real iterator object over real containers of graph
 * arguments.  A fresh one (nothing but the capture refers to it) is owned
 * (ags_builder_call), and stepping an owned iterator runs CPython's C code
 * only, so next(it), FOR_ITER and list(it) step the real object and share
 * its position wherever the value was copied to, as Python does.  An
 * iterator of the program (one reached by a source) is never stepped:
 * that would be a side effect.
 *
 * Per-element calls.  map(f, xs), filter(f, xs), functools.reduce(f, xs)
 * and partial(f, a)(b) call f through the interpreter (ags_call_value), so
 * a Python f is inlined and a torch f becomes a graph node.  map and
 * filter are expanded now, in order, over their known elements, and answer
 * an owned iterator over the results.  Eager calls f only as the iterator
 * is stepped, so the calls made ahead must not be told apart from those:
 * a call that changes state beyond its own variables (a store to an
 * attribute, an item, a global or a cell, a container's method: counted
 * in it->writes) breaks, since the consumer may stop early (zip) or see
 * the changes come at other times; and a container extended by such an
 * iterator of a Python f (`y.extend(map(f, xs))`, where f may read y as it
 * grows) breaks too (ags_extends_by_ahead).
 */
#include "interp.h"

/* 1 if v is an iterator this capture made, 0 if not, -1 on error. */
int
ags_owned_iterator(ags_interp *it, const ags_value *v)
{
    if (v->kind != AGS_VK_CONST || !PyIter_Check(v->obj)) {
        return 0;
    }
    return ags_is_owned(it, v->obj);
}

/* FOR_ITER over an owned iterator: pushes its next element, or sets
 * *exhausted.  iter: borrowed. */
int
ags_iter_step(ags_interp *it, ags_frame *f, ags_value *iter, int *exhausted)
{
    PyObject *next = PyIter_Next(iter->obj);
    ags_value v;

    *exhausted = 0;
    if (next == NULL) {
        PyObject *exc = ags_compat_take_exc();
        int rc;

        if (exc == NULL) {
            *exhausted = 1;
            return AGS_GO;
        }
        /* e.g. a dict resized while iterated: eager raises the same */
        rc = ags_stopf(it, AGS_REASON_OP_FAILED, "next() raised %s: %S",
                       Py_TYPE(exc)->tp_name, exc);
        Py_DECREF(exc);
        return rc;
    }
    if (ags_value_of(it, next, &v) < 0) {
        Py_DECREF(next);
        return AGS_ERROR;
    }
    Py_DECREF(next);
    return ags_push(f, v);
}

/* An owned iterator over the tuple `items` (stolen) as *result. */
static int
result_iterator(ags_interp *it, PyObject *items, ags_value *result)
{
    PyObject *iter;
    int rc = AGS_ERROR;

    if (items == NULL) {
        return AGS_ERROR;
    }
    iter = PyObject_GetIter(items);
    Py_DECREF(items);
    if (iter != NULL && ags_own(it, iter) == 0
        && ags_value_of(it, iter, result) == 0) {
        rc = AGS_GO;
    }
    Py_XDECREF(iter);
    return rc;
}

/* Calls fn with the graph arguments `items` (borrowed) and sets *out to
 * the result's graph argument (a new reference). */
static int
call_on(ags_interp *it, ags_frame *f, ags_value *fn, PyObject *const *items,
        int n, PyObject **out)
{
    ags_value args[3], result;
    int made = 0, rc = AGS_GO;

    assert(n <= 3);
    *out = NULL;
    for (; made < n; made++) {
        if (ags_value_of(it, items[made], &args[made]) < 0) {
            rc = AGS_ERROR;
            break;
        }
    }
    if (rc == AGS_GO) {
        rc = ags_call_value(it, f, fn, NULL, args, n, NULL, &result);
    }
    for (int i = 0; i < made; i++) {
        ags_value_clear(&args[i]);
    }
    if (rc != AGS_GO) {
        return rc;
    }
    *out = ags_graph_arg(it, &result);
    ags_value_clear(&result);
    return *out ? AGS_GO : AGS_BREAK;
}

/* Counts a store into `target` (a container or object) made while a
 * function is called ahead, unless the call made target itself.  0, or -1
 * with an exception. */
int
ags_note_write(ags_interp *it, PyObject *target)
{
    PyObject *id;
    int mine = 0;

    if (it->ahead_before == NULL) {
        return 0;
    }
    id = PyLong_FromVoidPtr(target);
    if (id == NULL) {
        return -1;
    }
    mine = PySet_Contains(it->owned, id);
    if (mine == 1) {
        mine = !PySet_Contains(it->ahead_before, id);
    }
    Py_DECREF(id);
    if (mine < 0) {
        return -1;
    }
    it->writes += !mine;
    return 0;
}

/* Before map() or filter() calls its function ahead: what the capture
 * owns now, so that what the calls make is theirs to change (one call can
 * reach another's objects only through a store that counts).  *outer gets
 * the snapshot of an enclosing map(), given back by ahead_end.  AGS_GO or
 * AGS_ERROR. */
static int
ahead_begin(ags_interp *it, PyObject **outer)
{
    *outer = it->ahead_before;
    it->ahead_before = PySet_New(it->owned);
    if (it->ahead_before == NULL) {
        it->ahead_before = *outer;
        return AGS_ERROR;
    }
    return AGS_GO;
}

static void
ahead_end(ags_interp *it, PyObject *outer)
{
    Py_SETREF(it->ahead_before, outer);
}

/* call_on for a call eager makes only when the iterator is stepped (between
 * ahead_begin and ahead_end): a break where the call changed state beyond
 * its own variables. */
static int
call_ahead(ags_interp *it, ags_frame *f, ags_value *fn, PyObject *const *items,
           int n, PyObject **out, const char *what)
{
    long before = it->writes;
    int rc = call_on(it, f, fn, items, n, out);

    if (rc == AGS_GO && it->writes != before) {
        Py_CLEAR(*out);
        return ags_stopf(it, AGS_REASON_SIDE_EFFECT,
                         "%s() of a function that changes state (eager "
                         "calls it only as the result is stepped)", what);
    }
    return rc;
}

/* Whether fn may run Python code (not a builtin function, class or a
 * builtin type's method). */
static int
runs_python(const ags_value *fn)
{
    PyObject *o = fn->obj;

    return fn->kind != AGS_VK_CONST
           || !(PyCFunction_Check(o) || PyType_Check(o)
                || Py_IS_TYPE(o, &PyMethodDescr_Type)
                || Py_IS_TYPE(o, &PyWrapperDescr_Type));
}

/* Notes the answer of map() or filter() of a Python function. */
static int
mark_ahead(ags_interp *it, const ags_value *fn, int rc,
           const ags_value *result)
{
    if (rc == AGS_GO && runs_python(fn) && PySet_Add(it->ahead, result->obj) < 0) {
        return AGS_ERROR;
    }
    return rc;
}

/* AGS_GO, or a break where the container method `name` (extend, update,
 * __iadd__...) would take an iterator of ahead calls: eager's calls would
 * see the container grow between them. */
int
ags_extends_by_ahead(ags_interp *it, PyObject *name, const ags_value *args,
                     int nargs)
{
    static const char *const takers[] = {
        "extend", "extendleft", "update", "__iadd__", "__ior__", "insert",
        "append", "appendleft", "add", "setdefault", NULL};
    int taker = 0;

    if (PySet_GET_SIZE(it->ahead) == 0 || !PyUnicode_Check(name)) {
        return AGS_GO;
    }
    for (int i = 0; takers[i] != NULL && !taker; i++) {
        taker = PyUnicode_CompareWithASCIIString(name, takers[i]) == 0;
    }
    for (int i = 0; taker && i < nargs; i++) {
        int in = args[i].kind == AGS_VK_CONST
                     ? PySet_Contains(it->ahead, args[i].obj) : 0;
        if (in < 0) {
            return AGS_ERROR;
        }
        if (in) {
            return ags_stopf(it, AGS_REASON_SIDE_EFFECT,
                             "%U() of map() or filter() of a Python "
                             "function (eager calls it as the container "
                             "grows)", name);
        }
    }
    return AGS_GO;
}

/* map(fn, *iterables): fn over the known elements, shortest first. */
static int
call_map(ags_interp *it, ags_frame *f, ags_value *args, int nargs,
         ags_value *result)
{
    PyObject *cols[2] = {NULL, NULL}, *out = NULL, *outer = NULL;
    Py_ssize_t n = PY_SSIZE_T_MAX;
    int ncols = nargs - 1, rc = AGS_GO, begun = 0;

    if (ncols < 1 || ncols > 2) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL,
                         "map() over %d iterables", ncols);
    }
    for (int j = 0; rc == AGS_GO && j < ncols; j++) {
        rc = ags_elements(it, &args[1 + j], &cols[j]);
        if (rc == AGS_GO && PyTuple_GET_SIZE(cols[j]) < n) {
            n = PyTuple_GET_SIZE(cols[j]);
        }
    }
    if (rc == AGS_GO) {
        out = PyTuple_New(n);
        rc = out ? ahead_begin(it, &outer) : AGS_ERROR;
        begun = rc == AGS_GO;
    }
    for (Py_ssize_t i = 0; rc == AGS_GO && i < n; i++) {
        PyObject *items[2], *r;
        for (int j = 0; j < ncols; j++) {
            items[j] = PyTuple_GET_ITEM(cols[j], i);
        }
        rc = call_ahead(it, f, &args[0], items, ncols, &r, "map");
        if (rc == AGS_GO) {
            PyTuple_SET_ITEM(out, i, r);
        }
    }
    if (begun) {
        ahead_end(it, outer);
    }
    Py_XDECREF(cols[0]);
    Py_XDECREF(cols[1]);
    if (rc != AGS_GO) {
        Py_XDECREF(out);
        return rc;
    }
    return mark_ahead(it, &args[0], result_iterator(it, out, result), result);
}

/* filter(fn or None, iterable): the elements whose (fn's) truth is known
 * and true. */
static int
call_filter(ags_interp *it, ags_frame *f, ags_value *args, int nargs,
            ags_value *result)
{
    PyObject *elems = NULL, *kept = NULL, *outer = NULL;
    int rc, none, begun = 0;

    if (nargs != 2) {
        return ags_stopf(it, AGS_REASON_BAD_CALL,
                         "filter() takes 2 arguments");
    }
    none = args[0].kind == AGS_VK_CONST && args[0].obj == Py_None;
    rc = ags_elements(it, &args[1], &elems);
    if (rc == AGS_GO) {
        kept = PyList_New(0);
        rc = kept ? ahead_begin(it, &outer) : AGS_ERROR;
        begun = rc == AGS_GO;
    }
    for (Py_ssize_t i = 0; rc == AGS_GO && i < PyTuple_GET_SIZE(elems); i++) {
        PyObject *e = PyTuple_GET_ITEM(elems, i), *r = NULL;
        ags_value test;
        int truth = 0;

        if (none) {
            r = Py_NewRef(e);
        }
        else {
            rc = call_ahead(it, f, &args[0], &e, 1, &r, "filter");
        }
        if (rc != AGS_GO) {
            break;
        }
        if (ags_value_of(it, r, &test) < 0) {
            rc = AGS_ERROR;
        }
        else {
            rc = ags_truth(it, &test, &truth);
            ags_value_clear(&test);
        }
        Py_DECREF(r);
        if (rc == AGS_GO && truth && PyList_Append(kept, e) < 0) {
            rc = AGS_ERROR;
        }
    }
    if (begun) {
        ahead_end(it, outer);
    }
    Py_XDECREF(elems);
    if (rc != AGS_GO) {
        Py_XDECREF(kept);
        return rc;
    }
    {
        PyObject *items = PyList_AsTuple(kept);
        Py_DECREF(kept);
        rc = result_iterator(it, items, result);
        return none ? rc : mark_ahead(it, &args[0], rc, result);
    }
}

/* functools.reduce(fn, iterable[, initial]): a left fold through fn. */
static int
call_reduce(ags_interp *it, ags_frame *f, ags_value *args, int nargs,
            ags_value *result)
{
    PyObject *elems = NULL, *acc = NULL;
    Py_ssize_t start = 0;
    int rc;

    if (nargs != 2 && nargs != 3) {
        return ags_stopf(it, AGS_REASON_BAD_CALL,
                         "reduce() takes 2 or 3 arguments");
    }
    rc = ags_elements(it, &args[1], &elems);
    if (rc != AGS_GO) {
        return rc;
    }
    if (nargs == 3) {
        acc = ags_graph_arg(it, &args[2]);
        rc = acc ? AGS_GO : AGS_BREAK;
    }
    else if (PyTuple_GET_SIZE(elems) == 0) {
        rc = ags_stopf(it, AGS_REASON_BAD_CALL,
                       "reduce() of an empty iterable with no initial "
                       "value");
    }
    else {
        acc = Py_NewRef(PyTuple_GET_ITEM(elems, 0));
        start = 1;
    }
    for (Py_ssize_t i = start; rc == AGS_GO && i < PyTuple_GET_SIZE(elems);
         i++) {
        PyObject *pair[2] = {acc, PyTuple_GET_ITEM(elems, i)}, *r;
        rc = call_on(it, f, &args[0], pair, 2, &r);
        if (rc == AGS_GO) {
            Py_SETREF(acc, r);
        }
    }
    Py_DECREF(elems);
    if (rc == AGS_GO && ags_value_of(it, acc, result) < 0) {
        rc = AGS_ERROR;
    }
    Py_XDECREF(acc);
    return rc;
}

/* A call through functools.partial: plan (PARTIAL, func, args, keywords,
 * func's source or None) with graph arguments; the call's own keywords win
 * over the partial's. */
static int
call_partial(ags_interp *it, ags_frame *f, PyObject *plan, ags_value *args,
             int nargs, PyObject *kwnames, ags_value *result)
{
    PyObject *pargs = PyTuple_GET_ITEM(plan, 2);
    PyObject *pkw = PyTuple_GET_ITEM(plan, 3);
    PyObject *names = NULL, *key, *value;
    Py_ssize_t np = PyTuple_GET_SIZE(pargs), pos = 0;
    int nkw = kwnames ? (int)PyTuple_GET_SIZE(kwnames) : 0;
    int npos = nargs - nkw, total = 0, rc = AGS_GO;
    ags_value fn, *all;

    all = PyMem_Calloc((size_t)(np + nargs + PyDict_GET_SIZE(pkw)) + 1,
                       sizeof(ags_value));
    names = PyList_New(0);
    if (all == NULL || names == NULL) {
        PyMem_Free(all);
        Py_XDECREF(names);
        PyErr_NoMemory();
        return AGS_ERROR;
    }
    for (Py_ssize_t i = 0; rc == AGS_GO && i < np; i++) {
        if (ags_value_of(it, PyTuple_GET_ITEM(pargs, i), &all[total]) < 0) {
            rc = AGS_ERROR;
            break;
        }
        total++;
    }
    for (int i = 0; rc == AGS_GO && i < npos; i++) {
        all[total++] = ags_value_copy(&args[i]);
    }
    while (rc == AGS_GO && PyDict_Next(pkw, &pos, &key, &value)) {
        int given = kwnames ? PySequence_Contains(kwnames, key) : 0;
        if (given < 0 || (!given && PyList_Append(names, key) < 0)) {
            rc = AGS_ERROR;
        }
        else if (!given) {
            if (ags_value_of(it, value, &all[total]) < 0) {
                rc = AGS_ERROR;
                break;
            }
            total++;
        }
    }
    for (int i = 0; rc == AGS_GO && i < nkw; i++) {
        if (PyList_Append(names, PyTuple_GET_ITEM(kwnames, i)) < 0) {
            rc = AGS_ERROR;
            break;
        }
        all[total++] = ags_value_copy(&args[npos + i]);
    }
    if (rc == AGS_GO) {
        PyObject *kwtuple = PyList_AsTuple(names);
        if (kwtuple == NULL || ags_value_of(it, PyTuple_GET_ITEM(plan, 1),
                                            &fn) < 0) {
            rc = AGS_ERROR;
        }
        else {
            PyObject *src = PyTuple_GET_ITEM(plan, 4);
            if (fn.source == NULL && src != Py_None) {
                fn.source = Py_NewRef(src);   /* read through the partial */
            }
            rc = ags_call_value(it, f, &fn, NULL, all, total,
                                PyTuple_GET_SIZE(kwtuple) ? kwtuple : NULL,
                                result);
            ags_value_clear(&fn);
        }
        Py_XDECREF(kwtuple);
    }
    for (int i = 0; i < total; i++) {
        ags_value_clear(&all[i]);
    }
    PyMem_Free(all);
    Py_DECREF(names);
    return rc;
}

/* Runs a per-element plan (MAP, FILTER, REDUCE, PARTIAL) of
 * ags_call_value.  The call carries no bound self. */
int
ags_call_iter_plan(ags_interp *it, ags_frame *f, int kind, PyObject *plan,
                   ags_value *args, int nargs, PyObject *kwnames,
                   ags_value *result)
{
    if (kind == AGS_PLAN_PARTIAL) {
        if (PyTuple_GET_SIZE(plan) != 5 || !PyTuple_Check(PyTuple_GET_ITEM(
                                               plan, 2))
            || !PyDict_Check(PyTuple_GET_ITEM(plan, 3))) {
            PyErr_SetString(PyExc_TypeError, "plan_call: bad PARTIAL plan");
            return AGS_ERROR;
        }
        return call_partial(it, f, plan, args, nargs, kwnames, result);
    }
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL,
                         "keyword arguments to map, filter or reduce");
    }
    switch (kind) {
    case AGS_PLAN_MAP:
        return call_map(it, f, args, nargs, result);
    case AGS_PLAN_FILTER:
        return call_filter(it, f, args, nargs, result);
    case AGS_PLAN_REDUCE:
        return call_reduce(it, f, args, nargs, result);
    default:
        Py_UNREACHABLE();
    }
}
