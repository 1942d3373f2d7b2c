/* interp_call.c: calls for the symbolic interpreter (see interp.h).
 *
 * A call goes by the builder's plan for the callable, a Plan kind of
 * protocol.h:
 *   GRAPH   a torch function or operator: recorded as a graph node;
 *   MODULE  an nn.Module without hooks: its forward is inlined;
 *   INLINE  a Python function: its bytecode is inlined;
 *   FOLD    a builtin on known values (len, isinstance, range, min...):
 *           evaluated now, the result is a constant;
 *   CONST   a call whose answer is known (torch.compiler.is_compiling());
 *   SUPER   super(...): a super object (interp_attr.c);
 *   NEW     a plain class: an owned instance, __init__ inlined
 *           (interp_object.c);
 *   GETATTR, HASATTR  with a constant name: as LOAD_ATTR (interp_attr.c).
 * Anything else breaks with the builder's reason.  Tensor methods and the
 * methods of containers the capture built go to the builder directly.
 */
#include "interp.h"
#include <string.h>

/* ------------------------------------------------------------------ */
/* Calls */

/* Whether fn makes an iterator that reads what it iterates as it steps:
 * iter(), enumerate(), zip(), reversed().  Handed a list, dict or set the
 * capture built, it gets that object, not a frozen copy, so that a loop
 * sees what its body changes, as CPython's iterators do (and a dict's
 * raises when it changes size). */
static int
steps_live(PyObject *fn)
{
    static PyCFunction iter_impl;   /* builtins.iter's C function */

    if (fn == (PyObject *)&PyEnum_Type || fn == (PyObject *)&PyZip_Type
        || fn == (PyObject *)&PyReversed_Type) {
        return 1;
    }
    if (fn == NULL || !PyCFunction_Check(fn)) {
        return 0;
    }
    if (iter_impl == NULL) {
        PyObject *builtins = PyImport_ImportModule("builtins");
        PyObject *iter = builtins ? PyObject_GetAttrString(builtins, "iter")
                                  : NULL;

        if (iter != NULL && PyCFunction_Check(iter)) {
            iter_impl = PyCFunction_GET_FUNCTION(iter);
        }
        Py_XDECREF(iter);
        Py_XDECREF(builtins);
        PyErr_Clear();  /* none found: iter() keeps its copy */
    }
    return iter_impl != NULL && PyCFunction_GET_FUNCTION(fn) == iter_impl;
}

/* Whether fn is object.__setattr__, called unbound (an object's own store,
 * reached through super() or by name): the object then holds a list, dict
 * or set the capture built as itself, as STORE_ATTR stores it, so that a
 * later write through the object or through the code reaches both. */
static int
stores_live(PyObject *fn)
{
    static PyObject *object_setattr;   /* object's slot wrapper, kept */

    if (object_setattr == NULL) {
        object_setattr = PyObject_GetAttrString((PyObject *)&PyBaseObject_Type,
                                                "__setattr__");
        if (object_setattr == NULL) {
            PyErr_Clear();
            return 0;
        }
    }
    return fn == object_setattr;
}

/* A graph argument for the functions of steps_live and stores_live: a
 * container the capture built as itself. */
static PyObject *
live_arg(ags_interp *it, const ags_value *v)
{
    if (AGS_BUILT_CONTAINER(v)) {
        return Py_NewRef(v->obj);
    }
    return ags_op_arg(it, v);
}

/* args (borrowed) as graph arguments: a tuple of the positional ones
 * (after `first`, if given) and a dict of the keyword ones; as the
 * arguments of an operation (ags_op_arg) when `op` records or folds one;
 * a container's method (b.append(a), a deque's) gets the lists, dicts and
 * sets the capture built as themselves, which it may store, as
 * STORE_SUBSCR does. */
static int
pack_args(ags_interp *it, int op, PyObject *fn, const ags_value *first,
          ags_value *args, int nargs, PyObject *kwnames, PyObject **pos,
          PyObject **kw)
{
    PyObject *(*as_arg)(ags_interp *, const ags_value *) =
        op == AGS_BOP_FOLD && (steps_live(fn) || stores_live(fn)) ? live_arg
        : op == AGS_BOP_CONTAINER_METHOD
          || (op == AGS_BOP_FOLD && ags_is_deque_method(fn)) ? ags_held_arg
        : op == AGS_BOP_CALL_FUNCTION || op == AGS_BOP_CALL_METHOD
        || op == AGS_BOP_FOLD ? ags_op_arg : ags_graph_arg;
    int nkw = kwnames ? (int)PyTuple_GET_SIZE(kwnames) : 0;
    int npos = nargs - nkw, k = 0, extra = first != NULL;

    *pos = PyTuple_New(npos + extra);
    *kw = PyDict_New();
    if (*pos == NULL || *kw == NULL) {
        return AGS_ERROR;
    }
    if (first != NULL) {
        PyObject *a = as_arg(it, first);
        if (a == NULL) {
            return PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
        }
        PyTuple_SET_ITEM(*pos, k++, a);
    }
    for (int i = 0; i < nargs; i++) {
        PyObject *a = as_arg(it, &args[i]);
        if (a == NULL) {
            return PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
        }
        if (i < npos) {
            PyTuple_SET_ITEM(*pos, k++, a);
        }
        else {
            int bad = PyDict_SetItem(*kw, PyTuple_GET_ITEM(kwnames, i - npos), a);
            Py_DECREF(a);
            if (bad < 0) {
                return AGS_ERROR;
            }
        }
    }
    return AGS_GO;
}

/* A list, dict, set or iterator that a fold or a container method just
 * made, which nothing else refers to, cannot be an object of the program:
 * the capture owns it (it may mutate or step it); so does a function a
 * modelled manager just decorated.  out: borrowed. */
static int
fresh_container(ags_interp *it, int op, PyObject *out)
{
    if (op == AGS_BOP_CTX && PyFunction_Check(out) && Py_REFCNT(out) == 1) {
        /* a function a modelled manager decorated here: its closure holds
         * what the capture gave it, shared as a made function's is */
        return ags_own(it, out);
    }
    if (op == AGS_BOP_FOLD && it->fresh != NULL
        && PyList_GET_SIZE(it->fresh) > 0) {
        /* the containers inside a fold's answer (a deep copy's) */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(it->fresh); i++) {
            if (ags_own(it, PyList_GET_ITEM(it->fresh, i)) < 0) {
                return -1;
            }
        }
        if (PyList_SetSlice(it->fresh, 0, PyList_GET_SIZE(it->fresh),
                            NULL) < 0) {
            return -1;
        }
    }
    if ((op == AGS_BOP_CALL_FUNCTION || op == AGS_BOP_CALL_METHOD)
        && PyList_CheckExact(out) && Py_REFCNT(out) == 1) {
        /* an operator's Tensor[] result (aten.split_with_sizes): a new list */
        return ags_own(it, out);
    }
    if ((op != AGS_BOP_FOLD && op != AGS_BOP_CONTAINER_METHOD)
        || Py_REFCNT(out) != 1) {
        return 0;
    }
    if (PyList_CheckExact(out) || PyDict_CheckExact(out)
        || PySet_CheckExact(out) || PyIter_Check(out)) {
        return ags_own(it, out);
    }
    if ((PyDict_Check(out)
         || ags_is_deque(out))
        && (!(Py_TYPE(out)->tp_flags & Py_TPFLAGS_HEAPTYPE)
            || ags_plain_dict_store(out))) {
        /* OrderedDict, defaultdict, deque: C types whose methods call no
         * user code (a defaultdict's factory is checked by the builder); a
         * subclass of a dict the builder made, storing items as its base */
        return ags_own(it, out);
    }
    return 0;
}

/* Calls the builder's operation `op` (an AGS_BOP_*) as op(extra, args,
 * kwargs) and sets *result. */
int
ags_builder_call(ags_interp *it, int op, PyObject *extra,
             const ags_value *first, ags_value *args, int nargs,
             PyObject *kwnames, ags_value *result)
{
    PyObject *pos = NULL, *kw = NULL, *out = NULL;
    int rc = pack_args(it, op, extra, first, args, nargs, kwnames, &pos,
                       &kw);

    if (rc == AGS_GO) {
        out = ags_call_builder(it, op, "(OOO)", extra, pos, kw);
        if (out == NULL) {
            rc = ags_take_break(it);
        }
        else if (fresh_container(it, op, out) < 0
                 || ags_value_of(it, out, result) < 0) {
            rc = AGS_ERROR;
        }
    }
    Py_XDECREF(out);
    Py_XDECREF(pos);
    Py_XDECREF(kw);
    return rc;
}

/* A PyMem array of `self` then args, all borrowed (the caller frees the
 * array, not the values), or NULL with MemoryError. */
static ags_value *
self_first(const ags_value *self, ags_value *args, int nargs)
{
    ags_value *all = PyMem_Calloc((size_t)nargs + 1, sizeof(ags_value));

    if (all == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    all[0] = *self;
    memcpy(&all[1], args, (size_t)nargs * sizeof(ags_value));
    return all;
}

/* Inlines func with `self` (a value, or NULL) before args. */
static int
inline_with_self(ags_interp *it, ags_frame *f, PyObject *func,
                 PyObject *fsource, const ags_value *self, ags_value *args,
                 int nargs, PyObject *kwnames, ags_value *result)
{
    ags_value *all;
    int rc;

    if (!PyFunction_Check(func)) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL, "calling %R", func);
    }
    if (self == NULL) {
        return ags_inline(it, f, func, fsource, args, nargs, kwnames, result);
    }
    if ((all = self_first(self, args, nargs)) == NULL) {
        return AGS_ERROR;
    }
    rc = ags_inline(it, f, func, fsource, all, nargs + 1, kwnames, result);
    PyMem_Free(all);
    return rc;
}

/* Runs a plan (INLINE or MODULE, func, bound self or None, func's source
 * or None): the function's bytecode, with the bound self first. */
static int
call_inline(ags_interp *it, ags_frame *f, PyObject *plan,
            const ags_value *self, ags_value *args, int nargs,
            PyObject *kwnames, ags_value *result)
{
    PyObject *func = PyTuple_GET_ITEM(plan, 1);
    PyObject *bound = PyTuple_GET_ITEM(plan, 2);
    PyObject *fsrc = PyTuple_GET_ITEM(plan, 3);
    ags_value bound_value;
    int rc;

    if (bound != Py_None && self != NULL) {
        /* A bound callable in the method slot with a value in the self
         * slot (a with block's exit(None, None, None)): CPython passes
         * that value as the first argument, after the bound self. */
        ags_value *all = self_first(self, args, nargs);

        if (all == NULL) {
            return AGS_ERROR;
        }
        rc = call_inline(it, f, plan, NULL, all, nargs + 1, kwnames, result);
        PyMem_Free(all);  /* the values are borrowed from the caller */
        return rc;
    }
    if (bound != Py_None) {
        if (ags_value_of(it, bound, &bound_value) < 0) {
            return AGS_ERROR;
        }
        rc = inline_with_self(it, f, func, fsrc == Py_None ? NULL : fsrc,
                              &bound_value, args, nargs, kwnames, result);
        ags_value_clear(&bound_value);
        return rc;
    }
    return inline_with_self(it, f, func, fsrc == Py_None ? NULL : fsrc, self,
                            args, nargs, kwnames, result);
}

/* object.__getattribute__(obj, name), reached unbound or as
 * super().__getattribute__ (`self` the object): the attribute as
 * getattr() finds it, without the class's own __getattribute__. */
static int
raw_getattr(ags_interp *it, ags_frame *f, const ags_value *self,
            ags_value *args, int nargs, PyObject *kwnames, ags_value *result)
{
    ags_value all[2];

    if (nargs + (self != NULL) != 2) {
        return ags_stopf(it, AGS_REASON_BAD_CALL,
                         "object.__getattribute__() takes an object and "
                         "a name");
    }
    if (self == NULL) {
        return ags_call_getattr(it, f, AGS_GETATTR_RAW, args, nargs, kwnames,
                                result);
    }
    all[0] = *self;     /* borrowed, as args are */
    all[1] = args[0];
    return ags_call_getattr(it, f, AGS_GETATTR_RAW, all, 2, kwnames, result);
}

/* setattr(obj, name, value) with a constant name: stored as STORE_ATTR
 * stores (on an object the capture made, or replayed on one of the
 * program), answering None. */
static int
call_setattr(ags_interp *it, ags_frame *f, const ags_value *self,
             ags_value *args, int nargs, PyObject *kwnames, ags_value *result)
{
    int rc;

    if (self != NULL || nargs != 3 || kwnames != NULL
        || args[1].kind != AGS_VK_CONST || !PyUnicode_CheckExact(args[1].obj)) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL,
                         "setattr() without an object, a constant name and a "
                         "value");
    }
    rc = ags_store_attr(it, f, &args[0], args[1].obj, &args[2]);
    if (rc == AGS_GO) {
        *result = ags_value_make(AGS_VK_CONST, Py_NewRef(Py_None), NULL);
    }
    return rc;
}

/* A per-element plan's call with a first argument the call protocol gave
 * apart (3.11's decorator call, `@functools.wraps(f)` applied to a def):
 * that argument first, then the rest (which the plans only read). */
static int
iter_plan_with_self(ags_interp *it, ags_frame *f, int kind, PyObject *plan,
                    const ags_value *self, ags_value *args, int nargs,
                    PyObject *kwnames, ags_value *result)
{
    ags_value *all = self_first(self, args, nargs);
    int rc;

    if (all == NULL) {
        return AGS_ERROR;
    }
    rc = ags_call_iter_plan(it, f, kind, plan, all, nargs + 1, kwnames, result);
    PyMem_Free(all);
    return rc;
}

/* A @contextmanager function called (a method's with its self first). */
static int
gen_ctx_call(ags_interp *it, ags_frame *f, PyObject *plan,
             const ags_value *self, ags_value *args, int nargs,
             PyObject *kwnames, ags_value *result)
{
    ags_value *all;
    int rc;

    if (self == NULL) {
        return ags_gen_ctx_new(it, f, plan, args, nargs, kwnames, result);
    }
    if ((all = self_first(self, args, nargs)) == NULL) {
        return AGS_ERROR;
    }
    rc = ags_gen_ctx_new(it, f, plan, all, nargs + 1, kwnames, result);
    PyMem_Free(all);
    return rc;
}

/* Calls `callable` (with `self` first, when not NULL) on args (all
 * borrowed), setting *result.  AGS_GO, or a break or an error. */
int
ags_call_value(ags_interp *it, ags_frame *f, ags_value *callable,
               ags_value *self, ags_value *args, int nargs, PyObject *kwnames,
               ags_value *result)
{
    PyObject *plan, *source;
    int kind;
    int rc;

    if (ags_gen_is_ctx(callable)) {
        /* a GEN_CTX generator in a with block's exit slot, called as the
         * block ends: exit(None, None, None), the first None in the self
         * slot */
        int is_exit = self != NULL && nargs == 2 && kwnames == NULL;

        for (int i = -1; is_exit && i < nargs; i++) {
            const ags_value *v = i < 0 ? self : &args[i];
            is_exit = v->kind == AGS_VK_CONST && v->obj == Py_None;
        }
        return is_exit ? ags_gen_ctx_step(it, f, callable, 0, result)
                       : ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL,
                                   "calling a contextmanager's generator "
                                   "(as a decorator)");
    }
    if (callable->kind == AGS_VK_METHOD && self->kind == AGS_VK_TENSOR
        && nargs == 0 && kwnames == NULL && PyUnicode_Check(callable->obj)
        && PyUnicode_CompareWithASCIIString(callable->obj, "item") == 0
        && ags_feeds_raising_branch(f)) {
        /* `assert t.all().item()`: the number's truth is the 0-d tensor's,
         * which the jump may assume (interp_flow.c) */
        PyObject *ndim = ags_call_builder(it, AGS_BOP_TENSOR_ATTR, "(Os)",
                                          self->obj, "ndim");
        int zero_d;

        if (ndim == NULL) {
            return ags_take_break(it);
        }
        zero_d = PyLong_CheckExact(ndim) && PyLong_AsLong(ndim) == 0;
        Py_DECREF(ndim);
        if (zero_d) {
            *result = ags_value_copy(self);
            return AGS_GO;
        }
    }
    if (callable->kind == AGS_VK_METHOD && self->kind == AGS_VK_TENSOR) {
        return ags_builder_call(it, AGS_BOP_CALL_METHOD, callable->obj, self,
                                args,
                            nargs, kwnames, result);
    }
    if (callable->kind == AGS_VK_METHOD) {
        /* A method of a list, dict or tuple the capture built: the builder
         * gets the container itself, not a copy, so it can mutate it. */
        PyObject *spec;

        /* (append, update or a read: told apart by the builder) */
        if (ags_note_write(it, self->obj) < 0) {
            return AGS_ERROR;
        }
        rc = ags_extends_by_ahead(it, callable->obj, args, nargs);
        if (rc != AGS_GO) {
            return rc;
        }
        spec = PyTuple_Pack(2, callable->obj, self->obj);
        if (spec == NULL) {
            return AGS_ERROR;
        }
        rc = ags_builder_call(it, AGS_BOP_CONTAINER_METHOD, spec, NULL, args,
                              nargs,
                          kwnames, result);
        Py_DECREF(spec);
        return rc;
    }
    if (callable->kind != AGS_VK_CONST) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL, "calling a %s",
                         AGS_DESCRIBE(callable));
    }
    if (callable->obj == (PyObject *)&PySuper_Type && nargs == 0
        && self == NULL) {
        rc = ags_zero_arg_super(it, f);
        if (rc == AGS_GO) {
            *result = ags_pop(f);
        }
        return rc;
    }
    if (self == NULL && nargs > 0 && args[0].kind == AGS_VK_GENERATOR
        && (rc = ags_gen_call(it, f, callable->obj, args, nargs, kwnames,
                              result)) != AGS_GEN_NOT_MINE) {
        return rc;  /* next() of a generator (interp_gen.c) */
    }
    /* len(), iter(), bool() of a Python class (interp_dunder.c), and
     * KeyError(key) and the like, made now (interp_catch.c) */
    rc = ags_dunder_builtin(it, f, callable->obj, self, args, nargs, kwnames,
                            result);
    if (rc == AGS_DUNDER_NOT_MINE) {
        rc = ags_exception_new(it, callable->obj, self, args, nargs, kwnames,
                               result);
    }
    if (rc != AGS_DUNDER_NOT_MINE) {
        return rc;
    }
    source = ags_source_of(it, callable);
    plan = ags_call_builder(it, AGS_BOP_PLAN_CALL, "(OO)", callable->obj,
                            source ? source : Py_None);
    Py_XDECREF(source);
    if (plan == NULL) {
        return ags_take_break(it);
    }
    if (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) < 1) {
        Py_DECREF(plan);
        PyErr_SetString(PyExc_TypeError, "plan_call must answer a tuple "
                        "(Plan, ...)");
        return AGS_ERROR;
    }
    if (ags_protocol_kind(PyTuple_GET_ITEM(plan, 0), AGS_PLAN_COUNT,
                          "call plan",
                          &kind) < 0) {
        Py_DECREF(plan);
        return AGS_ERROR;
    }
    switch (kind) {
    case AGS_PLAN_GRAPH:
    case AGS_PLAN_FOLD:
        /* builtins consume generators (interp_gen.c) */
        rc = kind == AGS_PLAN_FOLD
                 ? ags_gen_fold(it, f, PyTuple_GET_ITEM(plan, 1), args, nargs,
                                result)
                 : AGS_GO;
        if (rc != AGS_GO) {
            rc = rc == AGS_DONE ? AGS_GO : rc;
            break;
        }
        if (kind == AGS_PLAN_FOLD && PySet_GET_SIZE(it->ahead) > 0) {
            /* deque.extendleft(map(f, xs)) and the like */
            PyObject *name = PyObject_GetAttrString(PyTuple_GET_ITEM(plan, 1),
                                                    "__name__");
            if (name == NULL) {
                PyErr_Clear();
            }
            else {
                rc = ags_extends_by_ahead(it, name, args, nargs);
                Py_DECREF(name);
                if (rc != AGS_GO) {
                    break;
                }
            }
        }
        rc = ags_builder_call(it,
                              kind == AGS_PLAN_GRAPH ? AGS_BOP_CALL_FUNCTION
                                                     : AGS_BOP_FOLD,
                          PyTuple_GET_ITEM(plan, 1), self, args, nargs,
                          kwnames, result);
        break;
    case AGS_PLAN_CTX:
        /* a context manager the builder models (interp_exc.c) */
        rc = ags_builder_call(it, AGS_BOP_CTX, PyTuple_GET_ITEM(plan, 1),
                              self, args, nargs, kwnames, result);
        break;
    case AGS_PLAN_INLINE:
    case AGS_PLAN_MODULE:
        rc = call_inline(it, f, plan, self, args, nargs, kwnames, result);
        break;
    case AGS_PLAN_GETATTR:
    case AGS_PLAN_HASATTR:
        rc = self != NULL
                 ? ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL, "calling %R",
                             callable->obj)
                 : ags_call_getattr(it, f, kind == AGS_PLAN_HASATTR
                                               ? AGS_GETATTR_HAS
                                               : AGS_GETATTR_GET,
                                    args, nargs, kwnames, result);
        break;
    case AGS_PLAN_RAW_GETATTR:
        rc = raw_getattr(it, f, self, args, nargs, kwnames, result);
        break;
    case AGS_PLAN_SETATTR:
        rc = call_setattr(it, f, self, args, nargs, kwnames, result);
        break;
    case AGS_PLAN_GEN_CTX:
        rc = gen_ctx_call(it, f, plan, self, args, nargs, kwnames, result);
        break;
    case AGS_PLAN_NEW:
        rc = self != NULL
                 ? ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL, "calling %R",
                             callable->obj)
                 : ags_call_new(it, f, plan, args, nargs, kwnames, result);
        break;
    case AGS_PLAN_CONST:
        rc = ags_value_of(it, PyTuple_GET_ITEM(plan, 1), result) < 0
                 ? AGS_ERROR : AGS_GO;
        break;
    case AGS_PLAN_SUPER:
        if (nargs == 2 && self == NULL && args[0].kind == AGS_VK_CONST
            && args[1].kind == AGS_VK_CONST) {
            rc = ags_push_super(it, f, args[0].obj, args[1].obj);
            if (rc == AGS_GO) {
                *result = ags_pop(f);
            }
            break;
        }
        rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL, "calling %R",
                       callable->obj);
        break;
    case AGS_PLAN_MAP:
    case AGS_PLAN_FILTER:
    case AGS_PLAN_REDUCE:
    case AGS_PLAN_PARTIAL:
        rc = self == NULL ? ags_call_iter_plan(it, f, kind, plan, args, nargs,
                                               kwnames, result)
                          : iter_plan_with_self(it, f, kind, plan, self, args,
                                                nargs, kwnames, result);
        break;
    default:
        Py_UNREACHABLE();
    }
    Py_DECREF(plan);
    return rc;
}

/* Calls with the top `nargs` values as arguments, the last len(kwnames)
 * of them by keyword, and the two slots below as callable and self in
 * this version's order.  kwnames: borrowed or NULL. */
int
ags_do_call(ags_interp *it, ags_frame *f, int nargs, PyObject *kwnames)
{
    int base = f->sp - nargs - 2, rc;
    ags_value *lo = &f->stack[base], *hi = &f->stack[base + 1];
    ags_value *callable, *self, result;

    if (AGS_NULL_BEFORE_CALLABLE) {
        callable = lo->kind == AGS_VK_NULL_MARK ? hi : lo;
        self = lo->kind == AGS_VK_NULL_MARK ? NULL : hi;
    }
    else {
        callable = lo;
        self = hi->kind == AGS_VK_NULL_MARK ? NULL : hi;
    }
    rc = ags_call_value(it, f, callable, self, &f->stack[base + 2], nargs,
                        kwnames, &result);
    if (rc != AGS_GO) {
        return rc;
    }
    ags_drop(f, f->sp - base);
    return ags_push(f, result);
}

AGS_HANDLER
op_kw_names(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    f->kwnames = PyTuple_GET_ITEM(f->code->co_consts, ins->arg);
    return AGS_GO;
}

AGS_HANDLER
op_call(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    PyObject *kwnames = f->kwnames;

    f->kwnames = NULL;
    return ags_do_call(it, f, (int)ins->arg, kwnames);
}

AGS_HANDLER
op_call_kw(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value names = ags_pop(f);
    int rc;

    if (names.kind != AGS_VK_CONST || !PyTuple_Check(names.obj)) {
        ags_value_clear(&names);
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL,
                         "keyword names not constant");
    }
    rc = ags_do_call(it, f, (int)ins->arg, names.obj);
    ags_value_clear(&names);
    return rc;
}

/* CALL_FUNCTION_EX: f(*args) or f(*args, **kwargs), spread into a plain
 * call when the sequences are known. */
AGS_HANDLER
op_call_function_ex(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value kwargs = (ins->arg & 1) ? ags_pop(f)
                                      : ags_value_make(AGS_VK_UNBOUND, NULL, NULL);
    ags_value posargs = ags_pop(f);
    PyObject *elems = NULL, *kwnames = NULL, *items = NULL;
    int rc, n = 0, nkw = 0;

    rc = ags_elements(it, &posargs, &elems);
    if (rc == AGS_GO && kwargs.kind != AGS_VK_UNBOUND) {
        /* a dict the capture built, or a program's dict read item by item */
        rc = ags_mapping_items(it, &kwargs, &items);
        if (rc == AGS_GO) {
            kwnames = PySequence_Tuple(items);
            rc = kwnames ? AGS_GO : AGS_ERROR;
            nkw = kwnames ? (int)PyTuple_GET_SIZE(kwnames) : 0;
        }
        for (int i = 0; rc == AGS_GO && i < nkw; i++) {
            if (!PyUnicode_Check(PyTuple_GET_ITEM(kwnames, i))) {
                rc = ags_stopf(it, AGS_REASON_BAD_CALL,
                               "keywords must be strings");
            }
        }
    }
    if (rc == AGS_GO) {
        n = (int)PyTuple_GET_SIZE(elems);
        if (f->sp + n + nkw > f->stack_cap) {
            /* The spread may need more slots than the code reserved. */
            ags_value *grown = PyMem_Realloc(
                f->stack, (size_t)(f->sp + n + nkw + 2) * sizeof(ags_value));
            if (grown == NULL) {
                PyErr_NoMemory();
                rc = AGS_ERROR;
            }
            else {
                f->stack = grown;
                f->stack_cap = f->sp + n + nkw + 2;
            }
        }
    }
    for (int i = 0; rc == AGS_GO && i < n + nkw; i++) {
        PyObject *item = i < n ? PyTuple_GET_ITEM(elems, i)
                               : PyDict_GetItem(items,
                                                PyTuple_GET_ITEM(kwnames, i - n));
        ags_value v;
        rc = ags_value_of(it, item, &v) < 0 ? AGS_ERROR : ags_push(f, v);
    }
    if (rc == AGS_GO) {
        rc = ags_do_call(it, f, n + nkw, nkw ? kwnames : NULL);
    }
    Py_XDECREF(elems);
    Py_XDECREF(kwnames);
    Py_XDECREF(items);
    ags_value_clear(&posargs);
    ags_value_clear(&kwargs);
    return rc;
}

