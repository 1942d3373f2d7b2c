/* interp_gen.c: generators for the symbolic interpreter (see interp.h).
 *
 * Calling a generator function (or a generator expression's code, which
 * MAKE_FUNCTION made and the caller calls with GET_ITER's iterator) binds
 * its arguments into a frame as any inlined call does, but runs nothing:
 * the frame moves into a GENERATOR value.  Its obj is a capsule that owns
 * the frame and strong references to the function and its source (the
 * frame borrows its code, globals and builtins from the function).
 *
 * Whoever consumes the generator steps it: the frame runs from where it
 * stopped until its next YIELD_VALUE (the loop returns AGS_YIELD, the
 * value in retval, pc left on the YIELD_VALUE) or until it returns.
 * Resuming pushes the value `next()` sends (None) and goes on after the
 * YIELD_VALUE, as CPython does.  The consumers:
 *   FOR_ITER (interp_flow.c)      one step per iteration;
 *   SEND (yield from, here)       one step per value passed through;
 *   ags_elements (interp_flow.c)  to the end: tuple(), list(), f(*gen),
 *                                 unpacking, and the folds of builtins
 *                                 (sum, min, max, sorted, dict, ...);
 *   any() and all()               only to the first decisive value.
 *
 * A generator never becomes a graph argument (interp_args.c breaks with
 * reason GENERATOR): one returned from the captured code, stored in a
 * container or on an object, or passed to a torch function, ends the
 * capture.  One passed to an inlined function's *args or **kwargs (a
 * decorator's wrapper passing its arguments on) rides in the tuple or
 * dict the call packs, as its capsule; that box is marked, spreads again
 * into a call (f(*args, **kwargs)) and breaks wherever else it would go as
 * a graph argument, so the capsule never leaves the capture.  One
 * left suspended (any() stopped early, a loop left by `break`) is dropped
 * with its frame: the capture runs no handler (code under try breaks), so
 * closing it does nothing CPython would do differently.
 *
 * A generator's frame borrows no frame of the capture: its parent is the
 * frame stepping it while it runs and a detached placeholder otherwise,
 * so that a generator outliving the function that made it is safe.
 *
 * A function decorated with @contextlib.contextmanager is called through
 * the GEN_CTX plan: its generator, marked as a context manager.  A with
 * block on it enters by stepping it to its yield (the value is what `as`
 * binds) and its exit, called with (None, None, None) at the block's
 * normal end, steps it again, which must return (the code after the
 * yield, a finally's normal path included, runs there).  No other
 * generator can be entered.
 *
 * Rejected: running a generator to its end when it is made (a tuple from
 * the start).  any() and `for ... break` would run values eager never
 * computes, and a value that breaks (data-dependent truth) would end
 * captures that eager finishes.
 */
#include "interp.h"
#include <string.h>

AGS_HANDLER op_get_iter(ags_interp *, ags_frame *, const ags_instr *);

static const char gen_capsule_name[] = "agspeed.generator";

typedef enum {
    GEN_CREATED,        /* bound, not started */
    GEN_SUSPENDED,      /* stopped on a YIELD_VALUE */
    GEN_RUNNING,        /* being stepped: stepping it again is refused */
    GEN_DONE,           /* returned, or broke: its frame is released */
} gen_state;

typedef struct {
    ags_frame frame;    /* owned */
    PyObject *func;     /* strong: owns the code, globals and builtins */
    PyObject *fsource;  /* strong or NULL */
    gen_state state;
    int ctx;            /* made by GEN_CTX: a with block may enter it */
} ags_gen;

/* The parent of a generator frame no frame is stepping. */
static ags_frame detached;

static void
gen_destroy(PyObject *capsule)
{
    ags_gen *g = PyCapsule_GetPointer(capsule, gen_capsule_name);

    if (g == NULL) {
        PyErr_Clear();
        return;
    }
    ags_frame_release(&g->frame);
    Py_XDECREF(g->func);
    Py_XDECREF(g->fsource);
    PyMem_Free(g);
}

int
ags_gen_code(PyCodeObject *code)
{
    return (code->co_flags & CO_GENERATOR) != 0;
}

int
ags_gen_new(ags_interp *it, ags_frame *f, PyObject *func, PyObject *fsource,
            ags_value *result)
{
    ags_gen *g = PyMem_Calloc(1, sizeof(ags_gen));
    PyObject *capsule;

    (void)it;
    if (g == NULL) {
        ags_frame_release(f);
        PyErr_NoMemory();
        return AGS_ERROR;
    }
    g->frame = *f;      /* the frame's buffers move into g */
    memset(f, 0, sizeof(*f));
    g->frame.parent = &detached;
    g->frame.func = func;
    g->frame.fsource = fsource;
    g->func = Py_NewRef(func);
    g->fsource = Py_XNewRef(fsource);
    g->state = GEN_CREATED;
    capsule = PyCapsule_New(g, gen_capsule_name, gen_destroy);
    if (capsule == NULL) {
        ags_frame_release(&g->frame);
        Py_DECREF(g->func);
        Py_XDECREF(g->fsource);
        PyMem_Free(g);
        return AGS_ERROR;
    }
    *result = ags_value_make(AGS_VK_GENERATOR, capsule, NULL);
    return AGS_GO;
}

int
ags_gen_is_capsule(PyObject *obj)
{
    return PyCapsule_CheckExact(obj)
           && PyCapsule_IsValid(obj, gen_capsule_name);
}

static ags_gen *
gen_of(const ags_value *v)
{
    assert(v->kind == AGS_VK_GENERATOR);
    return PyCapsule_GetPointer(v->obj, gen_capsule_name);
}

static void
gen_finish(ags_gen *g)
{
    ags_frame_release(&g->frame);
    memset(&g->frame, 0, sizeof(g->frame));
    g->state = GEN_DONE;
}

int
ags_gen_next(ags_interp *it, ags_frame *caller, const ags_value *gen,
             ags_value *out)
{
    ags_gen *g = gen_of(gen);
    ags_frame *f;
    Py_ssize_t pc = 0;
    int rc;

    if (g == NULL) {
        return AGS_ERROR;
    }
    f = &g->frame;
    switch (g->state) {
    case GEN_DONE:
        *out = ags_value_make(AGS_VK_CONST, Py_NewRef(Py_None), NULL);
        return AGS_DONE;
    case GEN_RUNNING:
        return ags_stopf(it, AGS_REASON_GENERATOR,
                         "a generator stepped while it runs");
    case GEN_SUSPENDED:
        /* next() sends None: it is the value of the yield expression */
        rc = ags_push(f, ags_value_make(AGS_VK_CONST, Py_NewRef(Py_None),
                                        NULL));
        if (rc < 0) {
            return rc;
        }
        pc = f->pc + 1;
        break;
    case GEN_CREATED:
        break;
    }
    if (caller != NULL) {
        f->depth = caller->depth + 1;
    }
    if (f->depth >= AGS_MAX_DEPTH) {
        return ags_stopf(it, AGS_REASON_TOO_DEEP,
                         "generators nested deeper than %d", AGS_MAX_DEPTH);
    }
    f->parent = caller != NULL ? caller : &detached;
    g->state = GEN_RUNNING;
    rc = ags_frame_run_from(it, f, pc);
    f->parent = &detached;
    if (rc == AGS_YIELD) {
        g->state = GEN_SUSPENDED;
        *out = f->retval;
        f->retval = ags_value_make(AGS_VK_UNBOUND, NULL, NULL);
        return AGS_GO;
    }
    if (rc == AGS_DONE) {
        *out = f->retval;
        f->retval = ags_value_make(AGS_VK_UNBOUND, NULL, NULL);
    }
    gen_finish(g);
    return rc;
}

int
ags_gen_drain(ags_interp *it, const ags_value *gen, PyObject **elems)
{
    PyObject *items = PyList_New(0);
    int rc = items ? AGS_GO : AGS_ERROR;

    *elems = NULL;
    while (rc == AGS_GO) {
        ags_value v;
        PyObject *arg;

        rc = ags_gen_next(it, NULL, gen, &v);
        if (rc != AGS_GO) {
            if (rc == AGS_DONE) {
                ags_value_clear(&v);
            }
            break;
        }
        arg = ags_graph_arg(it, &v);
        ags_value_clear(&v);
        if (arg == NULL) {
            rc = PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
            break;
        }
        rc = PyList_Append(items, arg) < 0 ? AGS_ERROR : AGS_GO;
        Py_DECREF(arg);
    }
    if (rc == AGS_DONE) {
        *elems = PyList_AsTuple(items);
        rc = *elems ? AGS_GO : AGS_ERROR;
    }
    Py_XDECREF(items);
    return rc;
}

int
ags_gen_any_all(ags_interp *it, ags_frame *f, int want, const ags_value *gen,
                ags_value *result)
{
    int found = 0, rc;

    for (;;) {
        ags_value v = ags_value_make(AGS_VK_UNBOUND, NULL, NULL);
        int truth = 0;

        rc = ags_gen_next(it, f, gen, &v);
        if (rc == AGS_GO) {
            rc = ags_truth(it, &v, &truth);
        }
        ags_value_clear(&v);
        if (rc == AGS_DONE) {
            break;
        }
        if (rc != AGS_GO) {
            return rc;
        }
        if (truth == want) {
            found = 1;
            break;      /* the rest stays unrun, as in eager */
        }
    }
    /* any: True when one was true; all: False when one was false */
    *result = ags_value_make(AGS_VK_CONST,
                             Py_NewRef(found == want ? Py_True : Py_False),
                             NULL);
    return AGS_GO;
}

/* The builtins that consume an iterable they are given, and which of
 * their arguments: 1 the first only, -1 every one.  Any other builtin
 * given a generator (len, type, isinstance, reversed...) sees the
 * generator itself, which the capture cannot give it: it breaks. */
#define AGS_GEN_CONSUMERS(X) \
    X("tuple", 1, "tuple(gen)") \
    X("list", 1, "list(gen)") \
    X("dict", 1, "dict(gen) of pairs") \
    X("sum", 1, "sum(gen) and sum(gen, start)") \
    X("min", 1, "min(gen), with key= or default=") \
    X("max", 1, "max(gen), with key= or default=") \
    X("sorted", 1, "sorted(gen), with key= or reverse=") \
    X("enumerate", 1, "enumerate(gen) and enumerate(gen, start)") \
    X("zip", -1, "zip(gen, ...) of any number of generators")

static const struct {
    const char *name;
    int which;
} gen_consumers[] = {
#define AGS_X(name, which, doc) {name, which},
    AGS_GEN_CONSUMERS(AGS_X)
#undef AGS_X
};

/* 1 (first argument only), -1 (all), or 0: what fn consumes. */
static int
consumed_args(ags_frame *f, PyObject *fn)
{
    size_t n = sizeof(gen_consumers) / sizeof(gen_consumers[0]);

    for (size_t i = 0; i < n; i++) {
        if (fn == PyDict_GetItemString(f->builtins, gen_consumers[i].name)) {
            return gen_consumers[i].which;
        }
    }
    return 0;
}

/* 1 if asking cls about subclasses runs no code of the program: a class
 * whose metaclass checks as type does (torch.Tensor's included). */
static int
plain_class_check(PyObject *cls)
{
    static PyObject *name;
    PyObject *own, *types;

    if (!PyType_Check(cls)) {
        return 0;
    }
    if (Py_IS_TYPE(cls, &PyType_Type)) {
        return 1;
    }
    if (name == NULL && (name = PyUnicode_InternFromString(
                             "__subclasscheck__")) == NULL) {
        PyErr_Clear();
        return 0;
    }
    own = _PyType_Lookup(Py_TYPE(cls), name);
    types = _PyType_Lookup(&PyType_Type, name);
    return own != NULL && own == types;
}

/* isinstance(gen, cls): a generator's type is types.GeneratorType, asked
 * of classes (or a tuple of them) that check subclasses as type does,
 * which runs no code of the program.  AGS_DONE with *result, or a break. */
static int
gen_isinstance(ags_interp *it, const ags_value *cls, ags_value *result)
{
    PyObject *c = cls->obj;
    Py_ssize_t n = PyTuple_CheckExact(c) ? PyTuple_GET_SIZE(c) : 1;
    int yes;

    for (Py_ssize_t i = 0; cls->kind == AGS_VK_CONST && i < n; i++) {
        PyObject *one = PyTuple_CheckExact(c) ? PyTuple_GET_ITEM(c, i) : c;
        if (!plain_class_check(one)) {
            n = -1;
            break;
        }
    }
    if (cls->kind != AGS_VK_CONST || n < 0) {
        return ags_stopf(it, AGS_REASON_GENERATOR,
                         "isinstance() of a generator against a class with a "
                         "metaclass of its own");
    }
    yes = PyObject_IsSubclass((PyObject *)&PyGen_Type, c);
    if (yes < 0) {
        return AGS_ERROR;
    }
    *result = ags_value_make(AGS_VK_CONST, Py_NewRef(yes ? Py_True : Py_False),
                             NULL);
    return AGS_DONE;
}

int
ags_gen_fold(ags_interp *it, ags_frame *f, PyObject *fn, ags_value *args,
             int nargs, ags_value *result)
{
    PyObject *builtins_any = PyDict_GetItemString(f->builtins, "any");
    PyObject *builtins_all = PyDict_GetItemString(f->builtins, "all");
    int which;

    if (nargs == 1 && args[0].kind == AGS_VK_GENERATOR && fn != NULL
        && (fn == builtins_any || fn == builtins_all)) {
        int rc = ags_gen_any_all(it, f, fn == builtins_any, &args[0],
                                 result);
        return rc == AGS_GO ? AGS_DONE : rc;
    }
    if (nargs == 1 && args[0].kind == AGS_VK_GENERATOR
        && fn == PyDict_GetItemString(f->builtins, "iter")) {
        *result = ags_value_copy(&args[0]);     /* iter(gen) is gen */
        return AGS_DONE;
    }
    if (nargs == 2 && args[0].kind == AGS_VK_GENERATOR
        && fn == PyDict_GetItemString(f->builtins, "isinstance")) {
        return gen_isinstance(it, &args[1], result);
    }
    which = consumed_args(f, fn);
    for (int i = 0; i < nargs; i++) {
        PyObject *elems = NULL;
        ags_value v;
        int rc;

        if (args[i].kind != AGS_VK_GENERATOR) {
            continue;
        }
        if (which == 0 || (which == 1 && i > 0)) {
            return ags_stopf(it, AGS_REASON_GENERATOR,
                             "a generator passed to %R", fn);
        }
        rc = ags_gen_drain(it, &args[i], &elems);
        if (rc != AGS_GO) {
            return rc;
        }
        rc = ags_value_of(it, elems, &v);
        Py_DECREF(elems);
        if (rc < 0) {
            return AGS_ERROR;
        }
        ags_value_clear(&args[i]);  /* the caller's stack slot */
        args[i] = v;
    }
    return AGS_GO;
}

int
ags_gen_call(ags_interp *it, ags_frame *f, PyObject *fn, ags_value *args,
             int nargs, PyObject *kwnames, ags_value *result)
{
    int rc;

    if (fn != PyDict_GetItemString(f->builtins, "next") || kwnames != NULL
        || nargs < 1 || nargs > 2 || args[0].kind != AGS_VK_GENERATOR) {
        return AGS_GEN_NOT_MINE;
    }
    rc = ags_gen_next(it, f, &args[0], result);
    if (rc != AGS_DONE) {
        return rc;
    }
    ags_value_clear(result);
    if (nargs == 2) {
        *result = ags_value_copy(&args[1]);
        return AGS_GO;
    }
    return ags_stopf(it, AGS_REASON_RAISE,
                     "next() of an exhausted generator raises "
                     "StopIteration: eager raises it");
}

/* ------------------------------------------------------------------ */
/* Handlers */

/* The generator starts here when first stepped: the value CPython's
 * first send() gives it (None) is on the stack for the POP_TOP after. */
AGS_HANDLER
op_return_generator(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    (void)ins;
    return ags_push(f, ags_value_make(AGS_VK_CONST, Py_NewRef(Py_None),
                                      NULL));
}

AGS_HANDLER
op_yield_value(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    (void)ins;
    ags_value_clear(&f->retval);
    f->retval = ags_pop(f);
    return AGS_YIELD;
}

/* `yield from`: a generator stays itself, anything else is iterated as
 * GET_ITER does. */
AGS_HANDLER
op_get_yield_from_iter(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    if (ags_peek(f, 1)->kind == AGS_VK_GENERATOR) {
        return AGS_GO;
    }
    return op_get_iter(it, f, ins);
}

/* SEND: [iter, sent] -> [iter, value] to yield, or, once the iterator is
 * done, its return value in place of both (3.11) or of `sent` (END_SEND
 * then drops the iterator), jumping to the target. */
AGS_HANDLER
op_send(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value *iter = ags_peek(f, 2), v;
    int rc;

    if (ags_peek(f, 1)->kind != AGS_VK_CONST
        || ags_peek(f, 1)->obj != Py_None) {
        return ags_stopf(it, AGS_REASON_GENERATOR,
                         "send() of a value other than None");
    }
    if (iter->kind == AGS_VK_GENERATOR) {
        rc = ags_gen_next(it, f, iter, &v);
    }
    else if (iter->kind == AGS_VK_ITER) {
        rc = ags_iter_follow(it, iter);
        if (rc != AGS_GO) {
            return rc;
        }
        if (iter->pos < PyTuple_GET_SIZE(iter->obj)) {
            rc = ags_value_of(it, PyTuple_GET_ITEM(iter->obj, iter->pos), &v)
                     < 0 ? AGS_ERROR : AGS_GO;
            iter->pos++;
        }
        else {
            v = ags_value_make(AGS_VK_CONST, Py_NewRef(Py_None), NULL);
            rc = AGS_DONE;
        }
    }
    else {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                         "yield from a %s", AGS_DESCRIBE(iter));
    }
    if (rc == AGS_GO) {
        ags_drop(f, 1);
        return ags_push(f, v);
    }
    if (rc != AGS_DONE) {
        return rc;
    }
    ags_drop(f, AGS_SEND_DONE_POPS);
    f->jump = f->bc.index[ins->target / 2];
    return ags_push(f, v);
}

/* END_SEND: [iter, value] -> [value]. */
AGS_HANDLER
op_end_send(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value v = ags_pop(f);

    (void)it;
    (void)ins;
    ags_drop(f, 1);
    return ags_push(f, v);
}

/* ------------------------------------------------------------------ */
/* Context managers made by @contextlib.contextmanager */

/* Calls plan (GEN_CTX, func, func's source or None) on args: *result is
 * func's generator, marked as a context manager. */
int
ags_gen_ctx_new(ags_interp *it, ags_frame *f, PyObject *plan,
                ags_value *args, int nargs, PyObject *kwnames,
                ags_value *result)
{
    PyObject *func = PyTuple_GET_ITEM(plan, 1);
    PyObject *fsrc = PyTuple_GET_ITEM(plan, 2);
    int rc;

    if (!PyFunction_Check(func)
        || !ags_gen_code((PyCodeObject *)PyFunction_GET_CODE(func))) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL,
                         "a contextmanager of %R, not a generator function",
                         func);
    }
    rc = ags_inline(it, f, func, fsrc == Py_None ? NULL : fsrc, args, nargs,
                    kwnames, result);
    if (rc == AGS_GO) {
        ags_gen *g = gen_of(result);
        if (g == NULL) {
            ags_value_clear(result);
            return AGS_ERROR;
        }
        g->ctx = 1;
    }
    return rc;
}

/* Is v a generator a with block may enter (GEN_CTX)? */
int
ags_gen_is_ctx(const ags_value *v)
{
    ags_gen *g;

    if (v->kind != AGS_VK_GENERATOR) {
        return 0;
    }
    g = gen_of(v);
    if (g == NULL) {
        PyErr_Clear();
        return 0;
    }
    return g->ctx;
}

/* Entering (enter: 1) or leaving the with block of a GEN_CTX generator:
 * the generator stepped, to a yield (*result its value) or, leaving, to
 * its return (*result False: no exception to swallow). */
int
ags_gen_ctx_step(ags_interp *it, ags_frame *f, const ags_value *gen,
                 int enter, ags_value *result)
{
    int rc = ags_gen_next(it, f, gen, result);

    if (enter && rc == AGS_DONE) {
        ags_value_clear(result);
        return ags_stopf(it, AGS_REASON_RAISE,
                         "the contextmanager's generator did not yield: "
                         "eager raises RuntimeError");
    }
    if (!enter && rc == AGS_GO) {
        ags_value_clear(result);
        return ags_stopf(it, AGS_REASON_RAISE,
                         "the contextmanager's generator did not stop: "
                         "eager raises RuntimeError");
    }
    if (!enter && rc == AGS_DONE) {
        ags_value_clear(result);
        *result = ags_value_make(AGS_VK_CONST, Py_NewRef(Py_False), NULL);
        return AGS_GO;
    }
    return rc;
}
