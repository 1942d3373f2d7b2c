/* interp.c: the symbolic interpreter, first slice.
 *
 * Walks a function's bytecode with abstract values instead of real ones and
 * records the tensor work into a graph through a builder object
 * (agspeed._graph.GraphBuilder, or anything with the same methods).  This
 * slice handles straight-line code: locals, constants, globals, module
 * attributes, calls of torch-style functions and tensor methods (with
 * keyword arguments), binary operators, tuples and return.  Every other
 * instruction ends the capture with a structured graph break: the offset,
 * the opcode, a stable reason id and a detail.
 *
 * Abstract values.  The kinds are one table (AGS_VALUE_KINDS).  A value
 * owns a reference to `obj` (the constant, the graph node, the method
 * name, the packed tuple) and to `source` (how the value is reached from
 * the frame, for guards; NULL for computed values).  Stack and locals are
 * arrays of values; the stack is sized from co_stacksize.
 *
 * What the capture assumed is returned as a list of (kind, source, value)
 * tuples: "local" for a non-tensor argument, "global" for a global or
 * builtin, "attr" for a module attribute.  The guard system turns them
 * into checks; tensors are described by the builder's inputs.
 *
 * Version differences (the call protocol's layout, how LOAD_ATTR asks for
 * a method, which opcodes exist) come from opcodes_3XX.h through compat.h;
 * handlers test the compile-time constants, never PY_VERSION_HEX.
 *
 * Nothing here runs user code: values are looked up in dicts, attributes
 * are read only on module objects, and constants are combined only when
 * both are exact ints or floats.  Python calls go to the builder only.
 */
#include "agspeed.h"
#include <stdarg.h>
#include <string.h>

#define AGS_VALUE_KINDS(X) \
    X(UNBOUND, "a local with no value yet") \
    X(NULL_MARK, "the NULL of the call protocol") \
    X(CONST, "a Python object known while capturing") \
    X(TENSOR, "a tensor the graph computes: a graph node") \
    X(METHOD, "a tensor method looked up for a call: obj is its name") \
    X(TUPLE, "a tuple of graph nodes and constants: obj is that tuple")

typedef enum {
#define AGS_X(name, doc) AGS_VK_##name,
    AGS_VALUE_KINDS(AGS_X)
#undef AGS_X
} ags_vkind;

static const char *const kind_names[] = {
#define AGS_X(name, doc) #name,
    AGS_VALUE_KINDS(AGS_X)
#undef AGS_X
};

/* For messages: the kind, and the type of a constant. */
#define AGS_DESCRIBE(v) \
    ((v)->kind == AGS_VK_CONST ? Py_TYPE((v)->obj)->tp_name \
                               : kind_names[(v)->kind])

typedef struct {
    int kind;
    PyObject *obj;      /* strong or NULL */
    PyObject *source;   /* strong or NULL */
} ags_value;

/* Handler results. */
#define AGS_GO 0        /* next instruction */
#define AGS_DONE 1      /* the function returned */
#define AGS_ERROR (-1)  /* a Python exception is set: a bug or MemoryError */
#define AGS_BREAK (-2)  /* capture stops here; it->brk_* say why */

typedef struct {
    PyCodeObject *code;
    PyObject *globals, *builtins, *builder, *tensor_type;
    PyObject *assumptions;      /* list */
    PyObject *kwnames;          /* borrowed: pending KW_NAMES */
    PyObject *result;           /* strong: the returned structure */
    ags_value *locals;
    int nlocals;
    ags_value *stack;
    int sp, stack_cap;
    const char *brk_reason;
    PyObject *brk_detail;       /* strong str */
} ags_interp;

typedef int (*ags_handler)(ags_interp *, const ags_instr *);

/* Each version's table (AGS_INTERP_OPS) uses some of the handlers: the
 * others are compiled and checked everywhere but unused on that version. */
#define AGS_HANDLER static int __attribute__((unused))

static PyObject *binary_ops;    /* tuple: operator functions by NB_* index */

/* ------------------------------------------------------------------ */
/* Values */

static void
value_clear(ags_value *v)
{
    Py_CLEAR(v->obj);
    Py_CLEAR(v->source);
    v->kind = AGS_VK_UNBOUND;
}

/* Steals obj and source. */
static ags_value
value_make(int kind, PyObject *obj, PyObject *source)
{
    ags_value v = {kind, obj, source};
    return v;
}

static ags_value
value_copy(const ags_value *v)
{
    ags_value c = {v->kind, Py_XNewRef(v->obj), Py_XNewRef(v->source)};
    return c;
}

static int
stop_capture(ags_interp *it, const char *reason, PyObject *detail)
{
    it->brk_reason = reason;
    Py_XSETREF(it->brk_detail, detail);
    return AGS_BREAK;
}

static int
stop_capturef(ags_interp *it, const char *reason, const char *fmt, ...)
{
    va_list va;
    PyObject *detail;

    va_start(va, fmt);
    detail = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (detail == NULL) {
        return AGS_ERROR;
    }
    return stop_capture(it, reason, detail);
}

/* Steals v. */
static int
push(ags_interp *it, ags_value v)
{
    if (it->sp >= it->stack_cap) {
        value_clear(&v);
        PyErr_SetString(PyExc_SystemError,
                        "agspeed interpreter: stack overflow (a bug)");
        return AGS_ERROR;
    }
    it->stack[it->sp++] = v;
    return AGS_GO;
}

static ags_value
pop(ags_interp *it)
{
    assert(it->sp > 0);
    return it->stack[--it->sp];
}

static ags_value *
peek(ags_interp *it, int depth)
{
    return &it->stack[it->sp - depth];
}

/* New reference: what a value stands for in the graph (node, constant,
 * tuple), or NULL with a graph break set for values that cannot. */
static PyObject *
graph_arg(ags_interp *it, const ags_value *v)
{
    switch (v->kind) {
    case AGS_VK_CONST:
    case AGS_VK_TENSOR:
    case AGS_VK_TUPLE:
        return Py_NewRef(v->obj);
    default:
        stop_capturef(it, "unsupported_value",
                      "a %s cannot be a graph argument", kind_names[v->kind]);
        return NULL;
    }
}

/* Turns a builder result into a value; builder exceptions that carry a
 * `reason` (GraphBreak) become graph breaks, others stay errors. */
static int
push_builder_result(ags_interp *it, PyObject *node)
{
    PyObject *is_tensor;
    int ok;

    if (node == NULL) {
        PyObject *exc = ags_compat_take_exc();
        if (exc == NULL || !PyObject_HasAttrString(exc, "reason")) {
            ags_compat_put_exc(exc);  /* not a GraphBreak: a real error */
            return AGS_ERROR;
        }
        it->brk_reason = "builder";
        Py_XSETREF(it->brk_detail, PyObject_Str(exc));
        Py_DECREF(exc);
        return it->brk_detail ? AGS_BREAK : AGS_ERROR;
    }
    is_tensor = PyObject_CallMethod(it->builder, "is_tensor", "O", node);
    if (is_tensor == NULL) {
        Py_DECREF(node);
        return AGS_ERROR;
    }
    ok = PyObject_IsTrue(is_tensor);
    Py_DECREF(is_tensor);
    if (ok <= 0) {
        Py_DECREF(node);
        return ok < 0 ? AGS_ERROR
                      : stop_capturef(it, "non_tensor_result",
                             "an operation returned something other than a "
                             "tensor");
    }
    return push(it, value_make(AGS_VK_TENSOR, node, NULL));
}

static int
assume(ags_interp *it, const char *kind, PyObject *source, PyObject *value)
{
    PyObject *t = Py_BuildValue("(sOO)", kind, source, value);
    int rc;

    if (t == NULL) {
        return AGS_ERROR;
    }
    rc = PyList_Append(it->assumptions, t);
    Py_DECREF(t);
    return rc < 0 ? AGS_ERROR : AGS_GO;
}

/* Pushes what a load for a call produces: [method, self] when `self` is
 * given, else the callable and its NULL in this version's order.  Steals
 * both. */
static int
push_callable(ags_interp *it, ags_value callable, ags_value *self)
{
    ags_value null = value_make(AGS_VK_NULL_MARK, NULL, NULL);

    if (self != NULL) {
        if (push(it, callable) < 0) {
            value_clear(self);
            return AGS_ERROR;
        }
        return push(it, *self);
    }
    if (AGS_NULL_BEFORE_CALLABLE) {
        if (push(it, null) < 0) {
            value_clear(&callable);
            return AGS_ERROR;
        }
        return push(it, callable);
    }
    if (push(it, callable) < 0) {
        return AGS_ERROR;
    }
    return push(it, null);
}

/* ------------------------------------------------------------------ */
/* Handlers */

AGS_HANDLER
op_nop(ags_interp *it, const ags_instr *ins)
{
    (void)it;
    (void)ins;
    return AGS_GO;
}

static int
load_local(ags_interp *it, uint32_t i)
{
    if (it->locals[i].kind == AGS_VK_UNBOUND) {
        return stop_capturef(it, "unbound_local", "local %R is not bound",
                    PyTuple_GET_ITEM(it->code->co_localsplusnames, i));
    }
    return push(it, value_copy(&it->locals[i]));
}

static void
store_local(ags_interp *it, uint32_t i)
{
    value_clear(&it->locals[i]);
    it->locals[i] = pop(it);
}

AGS_HANDLER
op_load_fast(ags_interp *it, const ags_instr *ins)
{
    return load_local(it, ins->arg);
}

AGS_HANDLER
op_store_fast(ags_interp *it, const ags_instr *ins)
{
    store_local(it, ins->arg);
    return AGS_GO;
}

AGS_HANDLER
op_load_fast_load_fast(ags_interp *it, const ags_instr *ins)
{
    int rc = load_local(it, ins->arg >> 4);
    return rc < 0 ? rc : load_local(it, ins->arg & 15);
}

AGS_HANDLER
op_store_fast_load_fast(ags_interp *it, const ags_instr *ins)
{
    store_local(it, ins->arg >> 4);
    return load_local(it, ins->arg & 15);
}

AGS_HANDLER
op_store_fast_store_fast(ags_interp *it, const ags_instr *ins)
{
    store_local(it, ins->arg >> 4);
    store_local(it, ins->arg & 15);
    return AGS_GO;
}

AGS_HANDLER
op_load_const(ags_interp *it, const ags_instr *ins)
{
    PyObject *c = PyTuple_GET_ITEM(it->code->co_consts, ins->arg);
    return push(it, value_make(AGS_VK_CONST, Py_NewRef(c), NULL));
}

AGS_HANDLER
op_pop_top(ags_interp *it, const ags_instr *ins)
{
    ags_value v = pop(it);
    (void)ins;
    value_clear(&v);
    return AGS_GO;
}

AGS_HANDLER
op_push_null(ags_interp *it, const ags_instr *ins)
{
    (void)ins;
    return push(it, value_make(AGS_VK_NULL_MARK, NULL, NULL));
}

AGS_HANDLER
op_load_global(ags_interp *it, const ags_instr *ins)
{
    PyObject *name = PyTuple_GET_ITEM(it->code->co_names, ins->arg >> 1);
    PyObject *value = PyDict_GetItemWithError(it->globals, name);
    ags_value v;

    if (value == NULL && !PyErr_Occurred() && PyDict_Check(it->builtins)) {
        value = PyDict_GetItemWithError(it->builtins, name);
    }
    if (value == NULL) {
        return PyErr_Occurred()
                   ? AGS_ERROR
                   : stop_capturef(it, "unknown_global", "global %R is not defined",
                          name);
    }
    if (assume(it, "global", name, value) < 0) {
        return AGS_ERROR;
    }
    v = value_make(AGS_VK_CONST, Py_NewRef(value), Py_NewRef(name));
    if (ins->arg & 1) {
        return push_callable(it, v, NULL);
    }
    return push(it, v);
}

/* The attribute `name` of the top of the stack, for a call when `method`. */
static int
load_attr(ags_interp *it, PyObject *name, int method)
{
    ags_value owner = pop(it);
    int rc;

    if (owner.kind == AGS_VK_TENSOR && method) {
        ags_value m = value_make(AGS_VK_METHOD, Py_NewRef(name), NULL);
        return push_callable(it, m, &owner);
    }
    if (owner.kind == AGS_VK_CONST && PyModule_Check(owner.obj)
        && owner.source != NULL) {
        PyObject *value = PyObject_GetAttr(owner.obj, name);
        PyObject *source;
        ags_value v;

        if (value == NULL) {
            value_clear(&owner);
            return AGS_ERROR;  /* eager raises the same AttributeError */
        }
        source = PyUnicode_FromFormat("%U.%U", owner.source, name);
        value_clear(&owner);
        if (source == NULL || assume(it, "attr", source, value) < 0) {
            Py_XDECREF(source);
            Py_DECREF(value);
            return AGS_ERROR;
        }
        v = value_make(AGS_VK_CONST, value, source);
        return method ? push_callable(it, v, NULL) : push(it, v);
    }
    rc = stop_capturef(it, "unsupported_attribute",
                       "attribute %R of a %s (only attributes of Python modules "
                       "are captured so far)", name, AGS_DESCRIBE(&owner));
    value_clear(&owner);
    return rc;
}

AGS_HANDLER
op_load_attr(ags_interp *it, const ags_instr *ins)
{
    uint32_t index = AGS_LOAD_ATTR_HAS_METHOD_BIT ? ins->arg >> 1 : ins->arg;
    int method = AGS_LOAD_ATTR_HAS_METHOD_BIT ? (int)(ins->arg & 1) : 0;
    return load_attr(it, PyTuple_GET_ITEM(it->code->co_names, index), method);
}

AGS_HANDLER
op_load_method(ags_interp *it, const ags_instr *ins)
{
    return load_attr(it, PyTuple_GET_ITEM(it->code->co_names, ins->arg), 1);
}

AGS_HANDLER
op_kw_names(ags_interp *it, const ags_instr *ins)
{
    it->kwnames = PyTuple_GET_ITEM(it->code->co_consts, ins->arg);
    return AGS_GO;
}

/* 1 if the builder records calls of `fn` (torch's functions), 0 if not,
 * -1 on error. */
static int
can_record(ags_interp *it, PyObject *fn)
{
    PyObject *verdict = PyObject_CallMethod(it->builder, "can_record", "O",
                                            fn);
    int ok;

    if (verdict == NULL) {
        return -1;
    }
    ok = PyObject_IsTrue(verdict);
    Py_DECREF(verdict);
    return ok;
}

/* Calls with the top `nargs` values as arguments, the last
 * len(kwnames) of them by keyword, and the two slots below as callable and
 * self in this version's order.  kwnames: borrowed or NULL. */
static int
do_call(ags_interp *it, int nargs, PyObject *kwnames)
{
    int nkw = kwnames ? (int)PyTuple_GET_SIZE(kwnames) : 0;
    int npos = nargs - nkw, base = it->sp - nargs - 2, rc = AGS_ERROR;
    ags_value *lo = &it->stack[base], *hi = &it->stack[base + 1];
    ags_value *callable, *self;
    PyObject *args = NULL, *kwargs = NULL, *node;
    int has_self, k = 0;

    if (AGS_NULL_BEFORE_CALLABLE) {
        callable = lo->kind == AGS_VK_NULL_MARK ? hi : lo;
        self = lo->kind == AGS_VK_NULL_MARK ? NULL : hi;
    }
    else {
        callable = lo;
        self = hi->kind == AGS_VK_NULL_MARK ? NULL : hi;
    }
    has_self = self != NULL;
    args = PyTuple_New(has_self + npos);
    kwargs = PyDict_New();
    if (args == NULL || kwargs == NULL) {
        goto done;
    }
    if (has_self) {
        PyObject *a = graph_arg(it, self);
        if (a == NULL) {
            rc = AGS_BREAK;
            goto done;
        }
        PyTuple_SET_ITEM(args, k++, a);
    }
    for (int i = 0; i < nargs; i++) {
        PyObject *a = graph_arg(it, &it->stack[base + 2 + i]);
        if (a == NULL) {
            rc = AGS_BREAK;
            goto done;
        }
        if (i < npos) {
            PyTuple_SET_ITEM(args, k++, a);
        }
        else {
            int bad = PyDict_SetItem(
                kwargs, PyTuple_GET_ITEM(kwnames, i - npos), a);
            Py_DECREF(a);
            if (bad < 0) {
                goto done;
            }
        }
    }
    if (callable->kind == AGS_VK_METHOD) {
        node = PyObject_CallMethod(it->builder, "call_method", "OOO",
                                   callable->obj, args, kwargs);
    }
    else if (callable->kind == AGS_VK_CONST) {
        int ok = can_record(it, callable->obj);
        if (ok <= 0) {
            rc = ok < 0 ? AGS_ERROR
                        : stop_capturef(it, "unsupported_call",
                                        "call of %R is not captured yet",
                                        callable->obj);
            goto done;
        }
        node = PyObject_CallMethod(it->builder, "call_function", "OOO",
                                   callable->obj, args, kwargs);
    }
    else {
        rc = stop_capturef(it, "unsupported_call", "calling a %s",
                           AGS_DESCRIBE(callable));
        goto done;
    }
    /* The operands are consumed whatever the builder said. */
    while (it->sp > base) {
        ags_value v = pop(it);
        value_clear(&v);
    }
    rc = push_builder_result(it, node);
done:
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    return rc;
}

AGS_HANDLER
op_call(ags_interp *it, const ags_instr *ins)
{
    PyObject *kwnames = it->kwnames;

    it->kwnames = NULL;
    return do_call(it, (int)ins->arg, kwnames);
}

AGS_HANDLER
op_call_kw(ags_interp *it, const ags_instr *ins)
{
    ags_value names = pop(it);
    int rc;

    if (names.kind != AGS_VK_CONST || !PyTuple_Check(names.obj)) {
        value_clear(&names);
        return stop_capturef(it, "unsupported_call", "keyword names not constant");
    }
    rc = do_call(it, (int)ins->arg, names.obj);
    value_clear(&names);
    return rc;
}

static int
is_plain_number(PyObject *o)
{
    return PyLong_CheckExact(o) || PyFloat_CheckExact(o);
}

AGS_HANDLER
op_binary_op(ags_interp *it, const ags_instr *ins)
{
    ags_value rhs = pop(it), lhs = pop(it);
    PyObject *fn, *a = NULL, *b = NULL, *out;
    int rc;

    if (ins->arg >= (uint32_t)PyTuple_GET_SIZE(binary_ops)) {
        rc = stop_capturef(it, "unsupported_instruction", "BINARY_OP %u",
                  (unsigned)ins->arg);
        goto done;
    }
    fn = PyTuple_GET_ITEM(binary_ops, ins->arg);
    if (lhs.kind == AGS_VK_CONST && rhs.kind == AGS_VK_CONST) {
        if (!is_plain_number(lhs.obj) || !is_plain_number(rhs.obj)) {
            rc = stop_capturef(it, "unsupported_operator",
                      "operator on %s and %s", Py_TYPE(lhs.obj)->tp_name,
                      Py_TYPE(rhs.obj)->tp_name);
            goto done;
        }
        out = PyObject_CallFunctionObjArgs(fn, lhs.obj, rhs.obj, NULL);
        if (out == NULL && PyErr_ExceptionMatches(PyExc_ArithmeticError)) {
            /* 1 / 0: the frame runs eager and raises it there. */
            PyObject *exc = ags_compat_take_exc();
            rc = stop_capture(it, "op_failed", PyObject_Str(exc));
            Py_XDECREF(exc);
            if (it->brk_detail == NULL) {
                rc = AGS_ERROR;
            }
            goto done;
        }
        rc = out == NULL ? AGS_ERROR
                         : push(it, value_make(AGS_VK_CONST, out, NULL));
        goto done;
    }
    if (lhs.kind != AGS_VK_TENSOR && rhs.kind != AGS_VK_TENSOR) {
        rc = stop_capturef(it, "unsupported_operator", "operator on %s and %s",
                           AGS_DESCRIBE(&lhs), AGS_DESCRIBE(&rhs));
        goto done;
    }
    a = graph_arg(it, &lhs);
    b = a ? graph_arg(it, &rhs) : NULL;
    if (b == NULL) {
        rc = AGS_BREAK;
        goto done;
    }
    rc = push_builder_result(
        it, PyObject_CallMethod(it->builder, "call_function", "O(OO){}", fn,
                                a, b));
done:
    Py_XDECREF(a);
    Py_XDECREF(b);
    value_clear(&lhs);
    value_clear(&rhs);
    return rc;
}

AGS_HANDLER
op_build_tuple(ags_interp *it, const ags_instr *ins)
{
    int n = (int)ins->arg, rc = AGS_GO;
    PyObject *tuple = PyTuple_New(n);

    if (tuple == NULL) {
        return AGS_ERROR;
    }
    for (int i = 0; i < n && rc == AGS_GO; i++) {
        PyObject *a = graph_arg(it, peek(it, n - i));
        if (a == NULL) {
            rc = AGS_BREAK;
            break;
        }
        PyTuple_SET_ITEM(tuple, i, a);
    }
    for (int i = 0; i < n; i++) {
        ags_value v = pop(it);
        value_clear(&v);
    }
    if (rc != AGS_GO) {
        Py_DECREF(tuple);
        return rc;
    }
    return push(it, value_make(AGS_VK_TUPLE, tuple, NULL));
}

AGS_HANDLER
op_return_value(ags_interp *it, const ags_instr *ins)
{
    ags_value v = pop(it);
    (void)ins;
    it->result = graph_arg(it, &v);
    value_clear(&v);
    return it->result ? AGS_DONE : AGS_BREAK;
}

AGS_HANDLER
op_return_const(ags_interp *it, const ags_instr *ins)
{
    it->result = Py_NewRef(PyTuple_GET_ITEM(it->code->co_consts, ins->arg));
    return AGS_DONE;
}

static ags_handler handlers[256];

int
ags_interp_init(void)
{
    static const char *const names[] = {
        "add", "and_", "floordiv", "lshift", "matmul", "mul", "mod", "or_",
        "pow", "rshift", "sub", "truediv", "xor", "iadd", "iand",
        "ifloordiv", "ilshift", "imatmul", "imul", "imod", "ior", "ipow",
        "irshift", "isub", "itruediv", "ixor"};
    const Py_ssize_t n = (Py_ssize_t)(sizeof(names) / sizeof(names[0]));
    PyObject *operator_module;

#define AGS_X(op, handler, doc) handlers[op] = handler;
    AGS_INTERP_OPS(AGS_X)
#undef AGS_X
    if (binary_ops != NULL) {
        return 0;
    }
    operator_module = PyImport_ImportModule("operator");
    if (operator_module == NULL) {
        return -1;
    }
    binary_ops = PyTuple_New(n);
    for (Py_ssize_t i = 0; binary_ops != NULL && i < n; i++) {
        PyObject *fn = PyObject_GetAttrString(operator_module, names[i]);
        if (fn == NULL) {
            Py_CLEAR(binary_ops);
            break;
        }
        PyTuple_SET_ITEM(binary_ops, i, fn);
    }
    Py_DECREF(operator_module);
    return binary_ops ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* Entry point */

static int
bind_locals(ags_interp *it, PyObject *f_locals)
{
    PyObject *names = it->code->co_localsplusnames;

    for (int i = 0; i < it->nlocals; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        PyObject *value = PyDict_GetItemWithError(f_locals, name);

        if (value == NULL) {
            if (PyErr_Occurred()) {
                return AGS_ERROR;
            }
            continue;
        }
        if (PyObject_TypeCheck(value, (PyTypeObject *)it->tensor_type)) {
            PyObject *node = PyObject_CallMethod(it->builder, "input", "OO",
                                                 name, value);
            if (node == NULL) {
                return AGS_ERROR;
            }
            it->locals[i] = value_make(AGS_VK_TENSOR, node, Py_NewRef(name));
        }
        else {
            if (assume(it, "local", name, value) < 0) {
                return AGS_ERROR;
            }
            it->locals[i] = value_make(AGS_VK_CONST, Py_NewRef(value),
                                       Py_NewRef(name));
        }
    }
    return AGS_GO;
}

PyObject *
ags_interp_capture(PyCodeObject *code, PyObject *f_locals, PyObject *globals,
                   PyObject *builtins, PyObject *builder,
                   PyObject *tensor_type)
{
    ags_interp it;
    ags_bytecode bc;
    PyObject *out = NULL;
    int rc = AGS_GO, where = 0, opcode = -1;

    memset(&it, 0, sizeof(it));
    if (!PyType_Check(tensor_type) || !PyDict_Check(f_locals)
        || !PyDict_Check(globals)) {
        PyErr_SetString(PyExc_TypeError,
                        "capture(code, f_locals: dict, globals: dict, "
                        "builtins, builder, tensor_type: type)");
        return NULL;
    }
    if (ags_bc_decode(code, &bc) < 0) {
        return NULL;
    }
    it.code = code;
    it.globals = globals;
    it.builtins = builtins;
    it.builder = builder;
    it.tensor_type = tensor_type;
    it.nlocals = code->co_nlocalsplus;
    it.stack_cap = code->co_stacksize + 2;
    it.locals = PyMem_Calloc((size_t)it.nlocals + 1, sizeof(ags_value));
    it.stack = PyMem_Calloc((size_t)it.stack_cap, sizeof(ags_value));
    it.assumptions = PyList_New(0);
    if (it.locals == NULL || it.stack == NULL || it.assumptions == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)) {
        rc = stop_capturef(&it, "generator", "generators and coroutines are not "
                                    "captured");
    }
    else if (code->co_ncellvars || code->co_nfreevars) {
        rc = stop_capturef(&it, "closure", "functions with cells or free variables "
                                  "are not captured yet");
    }
    else {
        rc = bind_locals(&it, f_locals);
    }
    for (Py_ssize_t pc = 0; rc == AGS_GO && pc < bc.n; pc++) {
        const ags_instr *ins = &bc.instrs[pc];
        ags_handler h = handlers[ins->opcode];

        where = ins->offset;
        opcode = ins->opcode;
        rc = h ? h(&it, ins)
               : stop_capturef(&it, "unsupported_instruction",
                      "no handler for this instruction yet");
    }
    if (rc == AGS_ERROR) {
        goto done;
    }
    if (rc == AGS_DONE) {
        out = Py_BuildValue("{s:s,s:O,s:O}", "status", "graph", "result",
                            it.result, "assumptions", it.assumptions);
    }
    else if (rc == AGS_BREAK) {
        out = Py_BuildValue("{s:s,s:i,s:i,s:s,s:O,s:O}", "status", "break",
                            "offset", where, "opcode", opcode, "reason",
                            it.brk_reason, "detail", it.brk_detail,
                            "assumptions", it.assumptions);
    }
    else {
        PyErr_SetString(PyExc_SystemError,
                        "agspeed interpreter fell off the end of the code");
    }
done:
    for (int i = 0; it.locals != NULL && i < it.nlocals; i++) {
        value_clear(&it.locals[i]);
    }
    while (it.stack != NULL && it.sp > 0) {
        ags_value v = pop(&it);
        value_clear(&v);
    }
    PyMem_Free(it.locals);
    PyMem_Free(it.stack);
    Py_XDECREF(it.assumptions);
    Py_XDECREF(it.result);
    Py_XDECREF(it.brk_detail);
    ags_bc_release(&bc);
    return out;
}
