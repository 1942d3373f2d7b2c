/* interp_call.c: attributes, calls and operators for the symbolic
 * interpreter (see interp.h).
 *
 * An attribute of a known object is found by the builder without running
 * user code (no descriptors but plain functions and properties, no
 * __getattr__ but nn.Module's own stores) and guarded on its source
 * ("attr", owner's source, name).  An attribute of a tensor is metadata
 * (a constant: shape, dtype, device...) or a tensor view (.T), a method
 * load gives a METHOD value.
 *
 * A call goes by the builder's plan for the callable:
 *   graph   a torch function or operator: recorded as a graph node;
 *   module  an nn.Module without hooks: its forward is inlined;
 *   inline  a Python function: its bytecode is inlined;
 *   fold    a builtin on known values (len, isinstance, range, min...):
 *           evaluated now, the result is a constant;
 *   const   a call whose answer is known (torch.compiler.is_compiling());
 *   super   super(...): a super object, whose attributes come from the
 *           classes after the given one;
 *   getattr, hasattr  with a constant name: as LOAD_ATTR, a missing
 *           attribute guarded absent.
 * Anything else breaks with the builder's reason.
 */
#include "interp.h"
#include <string.h>

static PyObject *binary_ops;    /* tuple: operator functions by NB_* index */
static PyObject *unary_ops;     /* operator.neg, operator.invert, operator.pos */

PyObject *
ags_binary_fn(uint32_t op)
{
    return op < (uint32_t)PyTuple_GET_SIZE(binary_ops)
               ? PyTuple_GET_ITEM(binary_ops, op) : NULL;
}

static PyObject *
operator_tuple(PyObject *operator_module, const char *const *names, int n)
{
    PyObject *t = PyTuple_New(n);

    for (int i = 0; t != NULL && i < n; i++) {
        PyObject *fn = PyObject_GetAttrString(operator_module, names[i]);
        if (fn == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, fn);
    }
    return t;
}

int
ags_call_init(void)
{
    static const char *const binary[] = {
        "add", "and_", "floordiv", "lshift", "matmul", "mul", "mod", "or_",
        "pow", "rshift", "sub", "truediv", "xor", "iadd", "iand",
        "ifloordiv", "ilshift", "imatmul", "imul", "imod", "ior", "ipow",
        "irshift", "isub", "itruediv", "ixor"};
    static const char *const unary[] = {"neg", "invert", "pos"};
    PyObject *operator_module;

    if (binary_ops != NULL) {
        return 0;
    }
    operator_module = PyImport_ImportModule("operator");
    if (operator_module == NULL) {
        return -1;
    }
    binary_ops = operator_tuple(operator_module, binary,
                                (int)(sizeof(binary) / sizeof(binary[0])));
    unary_ops = operator_tuple(operator_module, unary, 3);
    Py_DECREF(operator_module);
    return binary_ops && unary_ops ? 0 : -1;
}

/* Pushes a graph argument the builder returned (steals it). */
static int
push_result(ags_interp *it, ags_frame *f, PyObject *out)
{
    ags_value v;

    if (out == NULL) {
        return ags_take_break(it);
    }
    if (ags_value_of(it, out, &v) < 0) {
        Py_DECREF(out);
        return AGS_ERROR;
    }
    Py_DECREF(out);
    return ags_push(f, v);
}

/* ------------------------------------------------------------------ */
/* Attributes */

/* *src: the source ("attr", owner's source, name), or NULL when the owner
 * has no source.  0, or -1 with an exception. */
static int
attr_source(ags_interp *it, ags_value *owner, PyObject *name, PyObject **src)
{
    PyObject *owner_src = ags_source_of(it, owner);

    *src = NULL;
    if (owner_src == NULL) {
        return 0;
    }
    *src = Py_BuildValue("(sOO)", "attr", owner_src, name);
    Py_DECREF(owner_src);
    return *src == NULL ? -1 : 0;
}

/* A known object's attribute, by the builder's answer (how, value, self):
 * "value" a plain attribute, "method" a function to call with `self`,
 * "property" a property whose getter is inlined. */
static int
known_attr(ags_interp *it, ags_frame *f, ags_value *owner, PyObject *name,
           int method)
{
    PyObject *answer, *how_obj, *value, *self_obj, *src = NULL;
    const char *how;
    ags_value v;
    int rc;

    answer = ags_call_builder(it, "attr", "(OO)", owner->obj, name);
    if (answer == NULL) {
        return ags_take_break(it);
    }
    how_obj = PyTuple_GET_ITEM(answer, 0);
    value = PyTuple_GET_ITEM(answer, 1);
    self_obj = PyTuple_GET_ITEM(answer, 2);
    how = PyUnicode_AsUTF8(how_obj);
    if (attr_source(it, owner, name, &src) < 0) {
        Py_DECREF(answer);
        return AGS_ERROR;
    }
    if (strcmp(how, "value") == 0 || strcmp(how, "method") == 0) {
        if (src != NULL) {
            rc = ags_load_object(it, src, value, &v);
        }
        else if (PyObject_TypeCheck(value, (PyTypeObject *)it->tensor_type)) {
            rc = ags_stopf(it, "unguardable_attribute", "tensor attribute %R of "
                           "an object reached by no source", name);
        }
        else {
            rc = ags_value_of(it, value, &v) < 0 ? AGS_ERROR : AGS_GO;
        }
        if (rc == AGS_GO && strcmp(how, "method") == 0 && !method) {
            /* A method used as a value (`f = self.step`, getattr): a bound
             * method, whose self keeps its source through the known map
             * when it is called. */
            PyObject *bound = PyMethod_New(value, self_obj);

            ags_value_clear(&v);
            if (bound == NULL || ags_value_of(it, bound, &v) < 0) {
                rc = AGS_ERROR;
            }
            else {
                rc = ags_push(f, v);
            }
            Py_XDECREF(bound);
        }
        else if (rc == AGS_GO && strcmp(how, "method") == 0) {
            ags_value self;
            if (ags_value_of(it, self_obj, &self) < 0) {
                ags_value_clear(&v);
                rc = AGS_ERROR;
            }
            else {
                rc = ags_push_callable(f, v, &self);
            }
        }
        else if (rc == AGS_GO) {
            rc = method ? ags_push_callable(f, v, NULL) : ags_push(f, v);
        }
    }
    else if (strcmp(how, "property") == 0) {
        /* value is the property object; its getter runs inlined. */
        PyObject *fget = PyObject_GetAttrString(value, "fget");
        PyObject *fsrc = src ? Py_BuildValue("(sO)", "fget", src) : NULL;
        ags_value self = ags_value_copy(owner), result;

        rc = fget == NULL ? AGS_ERROR
             : src ? ags_assume(it, src, value) : AGS_GO;
        if (rc == AGS_GO && !PyFunction_Check(fget)) {
            rc = ags_stopf(it, "unsupported_attribute", "property %R whose "
                           "getter is not a Python function", name);
        }
        if (rc == AGS_GO) {
            rc = ags_inline(it, f, fget, fsrc, &self, 1, NULL, &result);
        }
        if (rc == AGS_GO) {
            rc = method ? ags_push_callable(f, result, NULL)
                        : ags_push(f, result);
        }
        ags_value_clear(&self);
        Py_XDECREF(fget);
        Py_XDECREF(fsrc);
    }
    else {
        rc = ags_stopf(it, "missing_attribute", "%s has no attribute %R",
                       Py_TYPE(owner->obj)->tp_name, name);
    }
    Py_XDECREF(src);
    Py_DECREF(answer);
    return rc;
}

int
ags_load_attr(ags_interp *it, ags_frame *f, PyObject *name, int method)
{
    ags_value owner = ags_pop(f);
    int rc;

    if (owner.kind == AGS_VK_TENSOR && !method) {
        rc = push_result(it, f, ags_call_builder(it, "tensor_attr", "(OO)",
                                                 owner.obj, name));
    }
    else if (owner.kind == AGS_VK_TENSOR || owner.kind == AGS_VK_LIST
             || owner.kind == AGS_VK_DICT || owner.kind == AGS_VK_TUPLE) {
        if (!method) {
            rc = ags_stopf(it, "unsupported_attribute", "attribute %R of a %s",
                           name, ags_kind_names[owner.kind]);
        }
        else {
            ags_value m = ags_value_make(AGS_VK_METHOD, Py_NewRef(name), NULL);
            ags_value self = ags_value_copy(&owner);
            rc = ags_push_callable(f, m, &self);
        }
    }
    else if (owner.kind == AGS_VK_CONST) {
        rc = known_attr(it, f, &owner, name, method);
    }
    else {
        rc = ags_stopf(it, "unsupported_attribute", "attribute %R of a %s",
                       name, ags_kind_names[owner.kind]);
    }
    ags_value_clear(&owner);
    return rc;
}

AGS_HANDLER
op_load_attr(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    uint32_t index = AGS_LOAD_ATTR_HAS_METHOD_BIT ? ins->arg >> 1 : ins->arg;
    int method = AGS_LOAD_ATTR_HAS_METHOD_BIT ? (int)(ins->arg & 1) : 0;
    return ags_load_attr(it, f, PyTuple_GET_ITEM(f->code->co_names, index),
                         method);
}

AGS_HANDLER
op_load_method(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return ags_load_attr(it, f, PyTuple_GET_ITEM(f->code->co_names, ins->arg),
                         1);
}

/* getattr(obj, name[, default]) and hasattr(obj, name) with a constant
 * name: the attribute is loaded as LOAD_ATTR would, under the same guard
 * on its source; a missing one (with a default, or for hasattr) is guarded
 * absent.  *result is set on AGS_GO. */
static int
call_getattr(ags_interp *it, ags_frame *f, int has, ags_value *args,
             int nargs, PyObject *kwnames, ags_value *result)
{
    const char *fn = has ? "hasattr" : "getattr";
    PyObject *name, *answer, *src = NULL;
    int rc, missing;

    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        return ags_stopf(it, "bad_call", "%s() takes no keyword arguments", fn);
    }
    if (nargs < 2 || nargs > (has ? 2 : 3)) {
        return ags_stopf(it, "bad_call", "%s() with %d arguments", fn, nargs);
    }
    name = args[1].obj;
    if (args[1].kind != AGS_VK_CONST || !PyUnicode_CheckExact(name)) {
        return ags_stopf(it, "unsupported_call", "%s() with a name that is not "
                         "a constant string", fn);
    }
    if (args[0].kind != AGS_VK_CONST) {
        if (has) {
            return ags_stopf(it, "unsupported_call", "hasattr() of a %s",
                             AGS_DESCRIBE(&args[0]));
        }
        /* a tensor's metadata, or the load's own break */
        rc = ags_push(f, ags_value_copy(&args[0]));
        if (rc == AGS_GO) {
            rc = ags_load_attr(it, f, name, 0);
        }
        if (rc == AGS_GO) {
            *result = ags_pop(f);
        }
        return rc;
    }
    answer = ags_call_builder(it, "attr", "(OO)", args[0].obj, name);
    if (answer == NULL) {
        return ags_take_break(it);
    }
    missing = strcmp(PyUnicode_AsUTF8(PyTuple_GET_ITEM(answer, 0)),
                     "missing") == 0;
    if (attr_source(it, &args[0], name, &src) < 0) {
        Py_DECREF(answer);
        return AGS_ERROR;
    }
    if (missing || has) {
        /* The answer's value is the builder's MISSING marker when absent:
         * the guard checks the attribute stays absent (or present). */
        rc = src ? ags_assume(it, src, PyTuple_GET_ITEM(answer, 1)) : AGS_GO;
        if (rc == AGS_GO) {
            if (has) {
                rc = ags_value_of(it, missing ? Py_False : Py_True, result) < 0
                         ? AGS_ERROR : AGS_GO;
            }
            else if (nargs == 3) {
                *result = ags_value_copy(&args[2]);
            }
            else {
                rc = ags_stopf(it, "missing_attribute", "%s has no attribute "
                               "%R", Py_TYPE(args[0].obj)->tp_name, name);
            }
        }
    }
    else {
        rc = known_attr(it, f, &args[0], name, 0);
        if (rc == AGS_GO) {
            *result = ags_pop(f);
        }
    }
    Py_XDECREF(src);
    Py_DECREF(answer);
    return rc;
}

/* A real super object for (cls, self), pushed as a constant. */
static int
push_super(ags_interp *it, ags_frame *f, PyObject *cls, PyObject *self)
{
    PyObject *sup = PyObject_CallFunctionObjArgs((PyObject *)&PySuper_Type,
                                                 cls, self, NULL);
    if (sup == NULL) {
        PyErr_Clear();
        return ags_stopf(it, "unsupported_call", "super(%R, ...) failed", cls);
    }
    return ags_push(f, ags_value_make(AGS_VK_CONST, sup, NULL));
}

/* Zero-argument super(): the frame's __class__ cell and first argument. */
static int
zero_arg_super(ags_interp *it, ags_frame *f)
{
    PyObject *names = f->code->co_localsplusnames;
    ags_value *cls = NULL;

    for (int i = 0; i < f->nlocals; i++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(names, i),
                                             "__class__") == 0) {
            cls = &f->locals[i];
        }
    }
    if (f->nlocals > 0 && (ags_materialize(it, &f->locals[0]) < 0
                           || (cls && ags_materialize(it, cls) < 0))) {
        return AGS_ERROR;
    }
    if (cls == NULL || cls->kind != AGS_VK_CONST || f->code->co_argcount < 1
        || f->locals[0].kind != AGS_VK_CONST) {
        return ags_stopf(it, "unsupported_call", "super() here");
    }
    return push_super(it, f, cls->obj, f->locals[0].obj);
}

/* LOAD_SUPER_ATTR (3.12+): [super, class, self] -> the attribute;
 * arg >> 2 names it, bit 0 asks for a method. */
AGS_HANDLER
op_load_super_attr(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value self = ags_pop(f), cls = ags_pop(f), sup = ags_pop(f);
    int rc;

    if (cls.kind != AGS_VK_CONST || self.kind != AGS_VK_CONST
        || sup.kind != AGS_VK_CONST || sup.obj != (PyObject *)&PySuper_Type) {
        rc = ags_stopf(it, "unsupported_call", "super() of a %s",
                       AGS_DESCRIBE(&self));
    }
    else {
        rc = push_super(it, f, cls.obj, self.obj);
    }
    ags_value_clear(&self);
    ags_value_clear(&cls);
    ags_value_clear(&sup);
    if (rc != AGS_GO) {
        return rc;
    }
    return ags_load_attr(it, f,
                         PyTuple_GET_ITEM(f->code->co_names, ins->arg >> 2),
                         (int)(ins->arg & 1));
}

/* ------------------------------------------------------------------ */
/* Calls */

/* args (borrowed) as graph arguments: a tuple of the positional ones
 * (after `first`, if given) and a dict of the keyword ones. */
static int
pack_args(ags_interp *it, const ags_value *first, ags_value *args, int nargs,
          PyObject *kwnames, PyObject **pos, PyObject **kw)
{
    int nkw = kwnames ? (int)PyTuple_GET_SIZE(kwnames) : 0;
    int npos = nargs - nkw, k = 0, extra = first != NULL;

    *pos = PyTuple_New(npos + extra);
    *kw = PyDict_New();
    if (*pos == NULL || *kw == NULL) {
        return AGS_ERROR;
    }
    if (first != NULL) {
        PyObject *a = ags_graph_arg(it, first);
        if (a == NULL) {
            return AGS_BREAK;
        }
        PyTuple_SET_ITEM(*pos, k++, a);
    }
    for (int i = 0; i < nargs; i++) {
        PyObject *a = ags_graph_arg(it, &args[i]);
        if (a == NULL) {
            return AGS_BREAK;
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

/* Calls a builder method `name(extra, args, kwargs)` and sets *result. */
static int
builder_call(ags_interp *it, const char *name, PyObject *extra,
             const ags_value *first, ags_value *args, int nargs,
             PyObject *kwnames, ags_value *result)
{
    PyObject *pos = NULL, *kw = NULL, *out = NULL;
    int rc = pack_args(it, first, args, nargs, kwnames, &pos, &kw);

    if (rc == AGS_GO) {
        out = ags_call_builder(it, name, "(OOO)", extra, pos, kw);
        if (out == NULL) {
            rc = ags_take_break(it);
        }
        else if (ags_value_of(it, out, result) < 0) {
            rc = AGS_ERROR;
        }
    }
    Py_XDECREF(out);
    Py_XDECREF(pos);
    Py_XDECREF(kw);
    return rc;
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
        return ags_stopf(it, "unsupported_call", "calling %R", func);
    }
    if (self == NULL) {
        return ags_inline(it, f, func, fsource, args, nargs, kwnames, result);
    }
    all = PyMem_Calloc((size_t)nargs + 1, sizeof(ags_value));
    if (all == NULL) {
        PyErr_NoMemory();
        return AGS_ERROR;
    }
    all[0] = *self;
    memcpy(&all[1], args, (size_t)nargs * sizeof(ags_value));
    rc = ags_inline(it, f, func, fsource, all, nargs + 1, kwnames, result);
    PyMem_Free(all);  /* the values are borrowed from the caller */
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
    const char *kind;
    int rc;

    if (callable->kind == AGS_VK_METHOD && self->kind == AGS_VK_TENSOR) {
        return builder_call(it, "call_method", callable->obj, self, args,
                            nargs, kwnames, result);
    }
    if (callable->kind == AGS_VK_METHOD) {
        /* A method of a list, dict or tuple the capture built: the builder
         * gets the container itself, not a copy, so it can mutate it. */
        PyObject *spec = PyTuple_Pack(2, callable->obj, self->obj);
        if (spec == NULL) {
            return AGS_ERROR;
        }
        rc = builder_call(it, "container_method", spec, NULL, args, nargs,
                          kwnames, result);
        Py_DECREF(spec);
        return rc;
    }
    if (callable->kind != AGS_VK_CONST) {
        return ags_stopf(it, "unsupported_call", "calling a %s",
                         AGS_DESCRIBE(callable));
    }
    if (callable->obj == (PyObject *)&PySuper_Type && nargs == 0
        && self == NULL) {
        rc = zero_arg_super(it, f);
        if (rc == AGS_GO) {
            *result = ags_pop(f);
        }
        return rc;
    }
    source = ags_source_of(it, callable);
    plan = ags_call_builder(it, "plan_call", "(OO)", callable->obj,
                            source ? source : Py_None);
    Py_XDECREF(source);
    if (plan == NULL) {
        return ags_take_break(it);
    }
    kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(plan, 0));
    if (strcmp(kind, "graph") == 0 || strcmp(kind, "fold") == 0) {
        rc = builder_call(it, strcmp(kind, "graph") == 0 ? "call_function"
                                                         : "fold",
                          PyTuple_GET_ITEM(plan, 1), self, args, nargs,
                          kwnames, result);
    }
    else if (strcmp(kind, "inline") == 0 || strcmp(kind, "module") == 0) {
        /* ("inline", func, bound self or None, func's source or None) */
        PyObject *func = PyTuple_GET_ITEM(plan, 1);
        PyObject *bound = PyTuple_GET_ITEM(plan, 2);
        PyObject *fsrc = PyTuple_GET_ITEM(plan, 3);
        ags_value bound_value;

        if (bound != Py_None && self == NULL) {
            if (ags_value_of(it, bound, &bound_value) < 0) {
                Py_DECREF(plan);
                return AGS_ERROR;
            }
            rc = inline_with_self(it, f, func, fsrc == Py_None ? NULL : fsrc,
                                  &bound_value, args, nargs, kwnames, result);
            ags_value_clear(&bound_value);
        }
        else {
            rc = inline_with_self(it, f, func, fsrc == Py_None ? NULL : fsrc,
                                  self, args, nargs, kwnames, result);
        }
    }
    else if ((strcmp(kind, "getattr") == 0 || strcmp(kind, "hasattr") == 0)
             && self == NULL) {
        rc = call_getattr(it, f, kind[0] == 'h', args, nargs, kwnames, result);
    }
    else if (strcmp(kind, "const") == 0) {
        rc = ags_value_of(it, PyTuple_GET_ITEM(plan, 1), result) < 0
                 ? AGS_ERROR : AGS_GO;
    }
    else if (strcmp(kind, "super") == 0 && nargs == 2 && self == NULL
             && args[0].kind == AGS_VK_CONST && args[1].kind == AGS_VK_CONST) {
        rc = push_super(it, f, args[0].obj, args[1].obj);
        if (rc == AGS_GO) {
            *result = ags_pop(f);
        }
    }
    else {
        rc = ags_stopf(it, "unsupported_call", "calling %R", callable->obj);
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
        return ags_stopf(it, "unsupported_call", "keyword names not constant");
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
    PyObject *elems = NULL, *kwnames = NULL;
    int rc, n = 0, nkw = 0;

    rc = ags_elements(it, &posargs, &elems);
    if (rc == AGS_GO && kwargs.kind != AGS_VK_UNBOUND) {
        if (kwargs.kind != AGS_VK_DICT && !(kwargs.kind == AGS_VK_CONST
                                            && PyDict_CheckExact(kwargs.obj))) {
            rc = ags_stopf(it, "unsupported_call", "**kwargs from a %s",
                           AGS_DESCRIBE(&kwargs));
        }
        else {
            kwnames = PySequence_Tuple(kwargs.obj);
            rc = kwnames ? AGS_GO : AGS_ERROR;
            nkw = kwnames ? (int)PyTuple_GET_SIZE(kwnames) : 0;
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
                               : PyDict_GetItem(kwargs.obj,
                                                PyTuple_GET_ITEM(kwnames, i - n));
        ags_value v;
        rc = ags_value_of(it, item, &v) < 0 ? AGS_ERROR : ags_push(f, v);
    }
    if (rc == AGS_GO) {
        rc = ags_do_call(it, f, n + nkw, nkw ? kwnames : NULL);
    }
    Py_XDECREF(elems);
    Py_XDECREF(kwnames);
    ags_value_clear(&posargs);
    ags_value_clear(&kwargs);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Operators */

/* fn(operands) as a graph node when a tensor is involved, else folded by
 * the builder (which allows only plain types and built containers). */
static int
apply_operator(ags_interp *it, ags_frame *f, PyObject *fn, ags_value *ops,
               int n)
{
    int tensor = 0;
    ags_value result;
    int rc;

    for (int i = 0; i < n; i++) {
        tensor |= ops[i].kind == AGS_VK_TENSOR;
    }
    rc = builder_call(it, tensor ? "call_function" : "fold", fn, NULL, ops, n,
                      NULL, &result);
    for (int i = 0; i < n; i++) {
        ags_value_clear(&ops[i]);
    }
    return rc == AGS_GO ? ags_push(f, result) : rc;
}

AGS_HANDLER
op_binary_op(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value ops[2];
    PyObject *fn = ags_binary_fn(ins->arg);

    if (fn == NULL) {
        return ags_stopf(it, "unsupported_instruction", "BINARY_OP %u",
                         (unsigned)ins->arg);
    }
    ops[1] = ags_pop(f);
    ops[0] = ags_pop(f);
    return apply_operator(it, f, fn, ops, 2);
}

static int
unary(ags_interp *it, ags_frame *f, int which)
{
    ags_value op = ags_pop(f);
    return apply_operator(it, f, PyTuple_GET_ITEM(unary_ops, which), &op, 1);
}

AGS_HANDLER
op_unary_negative(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return unary(it, f, 0);
}

AGS_HANDLER
op_unary_invert(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return unary(it, f, 1);
}

/* MAKE_FUNCTION with no defaults, annotations or closure: a real function
 * object (making one runs no code), so comprehensions (3.11) and lambdas
 * can be inlined.  Anything with cells or defaults to set breaks. */
/* Slot k of code is a cell or a free variable (CPython's CO_FAST_CELL,
 * CO_FAST_FREE kinds in co_localspluskinds, 3.11-3.13). */
static int
is_cell_slot(PyCodeObject *code, int k)
{
    const unsigned char kind =
        (unsigned char)PyBytes_AS_STRING(code->co_localspluskinds)[k];
    return (kind & (0x40 | 0x80)) != 0;
}

/* The closure of a function made from `code` in frame f: the frame's own
 * cells of the variables the code names as free (shared, not copied). */
static int
closure_of(ags_interp *it, ags_frame *f, PyCodeObject *code, PyObject **out)
{
    PyObject *names = f->code->co_localsplusnames;
    int nfree = code->co_nfreevars, first = code->co_nlocalsplus - nfree;
    PyObject *closure = PyTuple_New(nfree);

    if (closure == NULL) {
        return AGS_ERROR;
    }
    for (int j = 0; j < nfree; j++) {
        PyObject *name = PyTuple_GET_ITEM(code->co_localsplusnames, first + j);
        PyObject *cell;
        int slot = -1, rc;

        for (int k = 0; k < f->nlocals && slot < 0; k++) {
            int eq = PyUnicode_Compare(PyTuple_GET_ITEM(names, k), name) == 0;
            if (eq && is_cell_slot(f->code, k)) {
                slot = k;
            }
        }
        if (slot < 0) {
            Py_DECREF(closure);
            return ags_stopf(it, "closure", "free variable %R of a nested "
                             "function not found in its maker", name);
        }
        rc = ags_frame_cell(it, f, slot, &cell);
        if (rc != AGS_GO) {
            Py_DECREF(closure);
            return rc;
        }
        PyTuple_SET_ITEM(closure, j, Py_NewRef(cell));
    }
    *out = closure;
    return AGS_GO;
}

/* A function from a code constant: `def` and lambdas inside captured code,
 * comprehensions on 3.11.  Its closure shares the maker's cells; defaults
 * may hold graph values.  It is owned by the capture (interp.c binds its
 * free variables from those cells when it is inlined). */
AGS_HANDLER
op_make_function(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    uint32_t flags = ins->arg;
    ags_value code = ags_pop(f), extra[4];
    PyObject *fn = NULL, *closure = NULL, *arg;
    int rc = AGS_GO, n = 0;

    /* under the code: closure (8), annotations (4), kwdefaults (2),
     * defaults (1), popped in that order (3.11, 3.12; 3.13 uses
     * SET_FUNCTION_ATTRIBUTE instead) */
    for (uint32_t bit = 8; bit; bit >>= 1) {
        extra[n] = (flags & bit) ? ags_pop(f)
                                 : ags_value_make(AGS_VK_UNBOUND, NULL, NULL);
        n++;
    }
    if (code.kind != AGS_VK_CONST || !PyCode_Check(code.obj)) {
        rc = ags_stopf(it, "unsupported_value", "MAKE_FUNCTION of a non-code");
        goto done;
    }
    fn = PyFunction_New(code.obj, f->globals);
    if (fn == NULL || ags_own(it, fn) < 0) {
        rc = AGS_ERROR;
        goto done;
    }
    if (((PyCodeObject *)code.obj)->co_nfreevars > 0) {
        rc = closure_of(it, f, (PyCodeObject *)code.obj, &closure);
        if (rc == AGS_GO && PyFunction_SetClosure(fn, closure) < 0) {
            rc = AGS_ERROR;
        }
    }
    for (int k = 2; rc == AGS_GO && k < 4; k++) {  /* kwdefaults, defaults */
        if (extra[k].kind == AGS_VK_UNBOUND) {
            continue;
        }
        arg = ags_graph_arg(it, &extra[k]);
        if (arg == NULL) {
            rc = PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
            break;
        }
        if ((k == 2 ? PyFunction_SetKwDefaults(fn, arg)
                    : PyFunction_SetDefaults(fn, arg)) < 0) {
            rc = AGS_ERROR;
        }
        Py_DECREF(arg);
    }
done:
    for (int k = 0; k < n; k++) {
        ags_value_clear(&extra[k]);
    }
    ags_value_clear(&code);
    Py_XDECREF(closure);
    if (rc != AGS_GO) {
        Py_XDECREF(fn);
        return rc;
    }
    return ags_push(f, ags_value_make(AGS_VK_CONST, fn, NULL));
}

/* 3.11: the closure tuple's items are not read (closure_of finds the
 * frame's cells by name), so a placeholder does. */
AGS_HANDLER
op_load_closure(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    (void)ins;
    return ags_push(f, ags_value_make(AGS_VK_CONST, Py_NewRef(Py_None), NULL));
}

/* 3.13: set one attribute of the function MAKE_FUNCTION made (on top,
 * the value under it): the closure is already the maker's cells. */
AGS_HANDLER
op_set_function_attribute(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value fn = ags_pop(f), value = ags_pop(f);
    PyObject *arg = NULL;
    int rc = AGS_GO;

    if (ins->arg == 1 || ins->arg == 2) {
        arg = ags_graph_arg(it, &value);
        if (arg == NULL) {
            rc = PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
        }
        else if ((ins->arg == 2 ? PyFunction_SetKwDefaults(fn.obj, arg)
                                : PyFunction_SetDefaults(fn.obj, arg)) < 0) {
            rc = AGS_ERROR;
        }
        Py_XDECREF(arg);
    }
    ags_value_clear(&value);
    if (rc != AGS_GO) {
        ags_value_clear(&fn);
        return rc;
    }
    return ags_push(f, fn);
}
