/* region.c: Region and Scope, the two ways into a capture context.
 *
 * Region(fn, ctx) is a callable: calling it enters `ctx` on this thread,
 * calls `fn` with the same arguments and leaves `ctx`, whether `fn`
 * returned or raised.  It is what agspeed.optimize() returns for a
 * function and what an optimized module's __call__ is.  It is a method
 * descriptor (it binds like a function when stored on a class), has a
 * __dict__ so functools.update_wrapper() can dress it as `fn`, supports
 * weak references, and is called through vectorcall so that the only cost
 * it adds to a call is the enter and exit.
 *
 * Scope(ctx) is the same context as a `with` block: agspeed.disable()
 * uses it with ctx None.  A Scope may be entered once at a time; a
 * reentrant `with` needs a new Scope.
 *
 * The two leave differently (hook.c, "The context stack").  A Region's
 * call is nested on the C stack: its exit pops everything pushed on the
 * thread since its enter.  A Scope's block may be left out of order, by
 * a generator suspended inside it: its exit removes only its own push,
 * and only if that is still on this thread's stack, so it never brings
 * back the context of a call that has returned.  A Scope destroyed while
 * entered leaves the same way.
 *
 * `ctx` is Py_None for a region where the runtime is disabled: frames in
 * it run untouched even when an outer region is optimized.
 */
#include "agspeed.h"
#include <stddef.h>
#include <structmember.h>

/* Tracers.  Under one of torch's tracers (a TorchDispatchMode: make_fx's,
 * FlopCounterMode, FakeTensorMode; torch.jit.trace) a Region calls its
 * target as plain Python, every frame below untouched: the tracer must see
 * the program's own operations, which a graph run by a compiled backend
 * would hide from it, and a capture there would run on the tracer's
 * tensors.  The runtime says where torch keeps those facts (set_tracers):
 * flags read as items of a module's dict, on while neither missing, None nor
 * False, and functions whose answer is true while one runs (slower: a
 * call).  Both NULL: no tracer is looked for. */
static PyObject *tracer_flags = NULL;   /* tuple of (dict, key) pairs */
static PyObject *tracer_probes = NULL;  /* tuple of callables */

/* 1 under a tracer, 0 not, -1 with an exception. */
static int
under_tracer(void)
{
    if (tracer_flags != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tracer_flags); i++) {
            PyObject *pair = PyTuple_GET_ITEM(tracer_flags, i);
            PyObject *v = PyDict_GetItemWithError(PyTuple_GET_ITEM(pair, 0),
                                                  PyTuple_GET_ITEM(pair, 1));
            if (v == NULL && PyErr_Occurred()) {
                return -1;
            }
            if (v != NULL && v != Py_None && v != Py_False) {
                return 1;
            }
        }
    }
    if (tracer_probes != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tracer_probes); i++) {
            PyObject *r = PyObject_CallNoArgs(PyTuple_GET_ITEM(tracer_probes,
                                                               i));
            int on;
            if (r == NULL) {
                return -1;
            }
            on = PyObject_IsTrue(r);
            Py_DECREF(r);
            if (on != 0) {
                return on;
            }
        }
    }
    return 0;
}

static PyObject *
tuple_or_empty(PyObject *t)
{
    return t != NULL ? Py_NewRef(t) : PyTuple_New(0);
}

/* set_tracers(flags, probes): the tracers looked for from now on; returns
 * the ones looked for before, as (flags, probes). */
PyObject *
ags_set_tracers(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *before;

    (void)module;
    if (nargs != 2 || !PyTuple_CheckExact(args[0])
        || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "set_tracers(flags, probes) takes "
                        "two tuples");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[0]); i++) {
        PyObject *pair = PyTuple_GET_ITEM(args[0], i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2
            || !PyDict_Check(PyTuple_GET_ITEM(pair, 0))) {
            PyErr_SetString(PyExc_TypeError, "set_tracers: each flag is a "
                            "(dict, key) pair");
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[1]); i++) {
        if (!PyCallable_Check(PyTuple_GET_ITEM(args[1], i))) {
            PyErr_SetString(PyExc_TypeError, "set_tracers: each probe is "
                            "callable");
            return NULL;
        }
    }
    /* (N consumes both, also where the other is NULL) */
    before = Py_BuildValue("(NN)", tuple_or_empty(tracer_flags),
                           tuple_or_empty(tracer_probes));
    if (before == NULL) {
        return NULL;
    }
    Py_XSETREF(tracer_flags, PyTuple_GET_SIZE(args[0]) ? Py_NewRef(args[0])
                                                       : NULL);
    Py_XSETREF(tracer_probes, PyTuple_GET_SIZE(args[1]) ? Py_NewRef(args[1])
                                                        : NULL);
    return before;
}

typedef struct {
    PyObject_HEAD
    PyObject *fn;
    PyObject *ctx;
    PyObject *dict;
    PyObject *weakrefs;
    vectorcallfunc vectorcall;
} ags_region;

static PyObject *
region_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf,
                  PyObject *kwnames)
{
    ags_region *self = (ags_region *)op;
    ags_ctx_saved saved;
    PyObject *result;
    int tracing = 0;

    if (!ags_hook_enabled) {
        return PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    }
    if ((tracer_flags != NULL || tracer_probes != NULL)
        && self->ctx != Py_None && (tracing = under_tracer()) < 0) {
        return NULL;
    }
    if (ags_ctx_enter(tracing ? Py_None : self->ctx, &saved) < 0) {
        return NULL;
    }
    result = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    ags_ctx_exit(&saved);
    return result;
}

static PyObject *
region_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fn", "ctx", NULL};
    PyObject *fn, *ctx;
    ags_region *self;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:Region", kwlist, &fn,
                                     &ctx)) {
        return NULL;
    }
    if (!PyCallable_Check(fn)) {
        PyErr_Format(PyExc_TypeError, "Region: fn must be callable, not %s",
                     Py_TYPE(fn)->tp_name);
        return NULL;
    }
    if (ctx != Py_None && !PyCallable_Check(ctx)) {
        PyErr_Format(PyExc_TypeError,
                     "Region: ctx must be None or callable, not %s",
                     Py_TYPE(ctx)->tp_name);
        return NULL;
    }
    self = (ags_region *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->fn = Py_NewRef(fn);
    self->ctx = Py_NewRef(ctx);
    self->vectorcall = region_vectorcall;
    return (PyObject *)self;
}

static int
region_traverse(ags_region *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->fn);
    Py_VISIT(self->ctx);
    Py_VISIT(self->dict);
    return 0;
}

static int
region_clear(ags_region *self)
{
    Py_CLEAR(self->fn);
    Py_CLEAR(self->ctx);
    Py_CLEAR(self->dict);
    return 0;
}

static void
region_dealloc(ags_region *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    region_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* Binds like a function: Region stored on a class becomes a method. */
static PyObject *
region_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    (void)type;
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *
region_repr(ags_region *self)
{
    return PyUnicode_FromFormat("<agspeed optimized %R>", self->fn);
}

/* Pickles by qualified name, as functions do, when update_wrapper gave the
 * Region a __qualname__ (a decorated module-level function). */
static PyObject *
region_reduce(ags_region *self, PyObject *unused)
{
    PyObject *name = NULL;

    (void)unused;
    if (self->dict != NULL) {
        name = PyDict_GetItemString(self->dict, "__qualname__");
    }
    if (name == NULL || !PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError,
                     "cannot pickle %R: only optimized functions reachable "
                     "by their qualified name can be pickled", self);
        return NULL;
    }
    return Py_NewRef(name);
}

static PyMethodDef region_methods[] = {
    {"__reduce__", (PyCFunction)region_reduce, METH_NOARGS, NULL},
    {NULL}
};

static PyMemberDef region_members[] = {
    {"__agspeed_ctx__", T_OBJECT, offsetof(ags_region, ctx), READONLY,
     "the capture context (None: runtime disabled inside)"},
    {"__dictoffset__", T_PYSSIZET, offsetof(ags_region, dict), READONLY,
     NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ags_region, weakrefs),
     READONLY, NULL},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(ags_region, vectorcall),
     READONLY, NULL},
    {NULL}
};

static PyObject *
region_get_fn(PyObject *op, void *closure)
{
    (void)closure;
    return Py_NewRef(((ags_region *)op)->fn);
}

/* agspeed.optimize() runs a function's first call through a watcher that
 * then puts the function itself in its place. */
static int
region_set_fn(PyObject *op, PyObject *value, void *closure)
{
    (void)closure;
    if (value == NULL || !PyCallable_Check(value)) {
        PyErr_SetString(PyExc_TypeError,
                        "a Region's __agspeed_fn__ must be a callable");
        return -1;
    }
    Py_SETREF(((ags_region *)op)->fn, Py_NewRef(value));
    return 0;
}

static PyGetSetDef region_getset[] = {
    {"__agspeed_fn__", region_get_fn, region_set_fn,
     "the callable run inside the context", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL,
     NULL},
    {NULL}
};

static PyType_Slot region_slots[] = {
    {Py_tp_new, region_new},
    {Py_tp_dealloc, region_dealloc},
    {Py_tp_traverse, region_traverse},
    {Py_tp_clear, region_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, region_descr_get},
    {Py_tp_repr, region_repr},
    {Py_tp_methods, region_methods},
    {Py_tp_members, region_members},
    {Py_tp_getset, region_getset},
    {Py_tp_doc,
     "Region(fn, ctx)\n\n"
     "A callable that calls fn inside the capture context ctx (None: "
     "inside a region where agspeed is disabled)."},
    {0, NULL}
};

PyType_Spec ags_region_spec = {
    .name = "agspeed._C.Region",
    .basicsize = sizeof(ags_region),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR
             | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = region_slots,
};

/* ------------------------------------------------------------------ */
/* Scope */

typedef struct {
    PyObject_HEAD
    PyObject *ctx;
    ags_ctx_saved saved;    /* token 0: not entered */
} ags_scope;

static PyObject *
scope_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"ctx", NULL};
    PyObject *ctx;
    ags_scope *self;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:Scope", kwlist, &ctx)) {
        return NULL;
    }
    if (ctx != Py_None && !PyCallable_Check(ctx)) {
        PyErr_Format(PyExc_TypeError,
                     "Scope: ctx must be None or callable, not %s",
                     Py_TYPE(ctx)->tp_name);
        return NULL;
    }
    self = (ags_scope *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->ctx = Py_NewRef(ctx);
    return (PyObject *)self;
}

static PyObject *
scope_enter(ags_scope *self, PyObject *unused)
{
    (void)unused;
    if (self->saved.token != 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this agspeed scope is already entered; nest a new "
                        "one instead of re-entering it");
        return NULL;
    }
    if (ags_ctx_enter(self->ctx, &self->saved) < 0) {
        return NULL;
    }
    return Py_NewRef(self);
}

static PyObject *
scope_exit(ags_scope *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    if (self->saved.token == 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this agspeed scope was not entered");
        return NULL;
    }
    ags_ctx_leave(&self->saved);
    Py_RETURN_FALSE;
}

static int
scope_traverse(ags_scope *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->ctx);
    return 0;
}

static int
scope_clear(ags_scope *self)
{
    Py_CLEAR(self->ctx);
    return 0;
}

static void
scope_dealloc(ags_scope *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    /* A scope destroyed while entered (its `with` never left) leaves as
     * its exit would: its push goes if it is still on this thread's
     * stack; on another thread's, it stays until a Region below it there
     * returns.  Either way no other context is touched. */
    PyObject_GC_UnTrack(self);
    if (self->saved.token != 0) {
        ags_ctx_leave(&self->saved);
    }
    scope_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef scope_methods[] = {
    {"__enter__", (PyCFunction)scope_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))scope_exit, METH_FASTCALL,
     NULL},
    {NULL}
};

static PyType_Slot scope_slots[] = {
    {Py_tp_new, scope_new},
    {Py_tp_dealloc, scope_dealloc},
    {Py_tp_traverse, scope_traverse},
    {Py_tp_clear, scope_clear},
    {Py_tp_methods, scope_methods},
    {Py_tp_doc,
     "Scope(ctx)\n\n"
     "A context manager that enters the capture context ctx on this thread "
     "(None: disables agspeed inside)."},
    {0, NULL}
};

PyType_Spec ags_scope_spec = {
    .name = "agspeed._C.Scope",
    .basicsize = sizeof(ags_scope),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = scope_slots,
};
