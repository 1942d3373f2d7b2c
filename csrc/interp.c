/* interp.c: the symbolic interpreter's core (see interp.h for the layout).
 *
 * Walks a function's bytecode with abstract values instead of real ones
 * and records the tensor work into a graph through a builder object
 * (agspeed._graph.GraphBuilder, or anything with the same methods).  Calls
 * of nn.Modules and Python functions are inlined: a new frame runs the
 * callee's bytecode with the caller's abstract arguments, and its return
 * value goes back on the caller's stack.  Branches whose condition is
 * known while capturing are taken, loops over known sequences unrolled.
 * Anything else ends the capture with a structured graph break: the
 * innermost code object, the offset and opcode, a stable reason id and a
 * detail.
 *
 * What the capture assumed is returned as a list of (source, value)
 * pairs; the guard system turns each into a check (identity, equality,
 * tensor metadata).  Sources are tuples: ("local", name), ("global",
 * name), ("gmod", module name, name), ("attr", base, name),
 * ("item", base, index), ("cell", function source, index).
 *
 * Version differences (the call protocol, how LOAD_ATTR asks for a
 * method, which opcodes exist) come from opcodes_3XX.h through compat.h.
 *
 * Nothing here runs user code: attributes are found by the builder
 * without calling descriptors or __getattr__, constants are combined only
 * for plain types, and Python calls go to the builder only.
 */
#include "interp.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The builder's method names, by AGS_BOP_* (interned, immortal). */
static PyObject *bop_names[AGS_BOP_COUNT];

const char *const ags_kind_names[] = {
#define AGS_X(name, doc) #name,
    AGS_VALUE_KINDS(AGS_X)
#undef AGS_X
};

#define AGS_X(op, handler, doc) AGS_DECLARE_HANDLER(op, handler, doc)
AGS_INTERP_OPS(AGS_X)
#undef AGS_X

static ags_handler handlers[256];
/* The instructions that change state beyond their frame's variables
 * (a global, a cell shared with another function). */
static unsigned char writes_state[256];

/* ------------------------------------------------------------------ */
/* Values and stacks */

void
ags_value_clear(ags_value *v)
{
    Py_CLEAR(v->obj);
    Py_CLEAR(v->source);
    Py_CLEAR(v->of);
    v->kind = AGS_VK_UNBOUND;
    v->of_program = 0;
    v->pos = 0;
}

/* Steals obj and source. */
ags_value
ags_value_make(int kind, PyObject *obj, PyObject *source)
{
    ags_value v = {.kind = kind, .obj = obj, .source = source};
    return v;
}

ags_value
ags_value_copy(const ags_value *v)
{
    ags_value c = *v;

    Py_XINCREF(c.obj);
    Py_XINCREF(c.source);
    Py_XINCREF(c.of);
    return c;
}

int
ags_stop(ags_interp *it, int reason, PyObject *detail)
{
    if (detail == NULL) {
        return AGS_ERROR;
    }
    it->brk_reason = reason;
    Py_XSETREF(it->brk_detail, detail);
    Py_CLEAR(it->brk_raised);
    return AGS_BREAK;
}

void
ags_unbreak(ags_interp *it)
{
    it->brk_reason = -1;
    Py_CLEAR(it->brk_detail);
    Py_CLEAR(it->brk_raised);
    it->brk_code = NULL;
    it->brk_offset = it->brk_opcode = 0;
}

int
ags_stopf(ags_interp *it, int reason, const char *fmt, ...)
{
    va_list va;
    PyObject *detail;

    va_start(va, fmt);
    detail = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    return ags_stop(it, reason, detail);
}

/* Turns a pending builder exception that carries an int `reason` (the
 * builder's GraphBreak, with a Reason of protocol.h) into a graph break;
 * others stay errors. */
int
ags_take_break(ags_interp *it)
{
    PyObject *exc = ags_compat_take_exc();
    PyObject *reason;

    if (exc == NULL) {
        return AGS_ERROR;
    }
    reason = PyObject_GetAttrString(exc, "reason");
    if (reason == NULL || !PyLong_Check(reason)) {
        Py_XDECREF(reason);
        PyErr_Clear();
        ags_compat_put_exc(exc);  /* not a graph break: a real error */
        return AGS_ERROR;
    }
    /* A reason C does not know is a bug of the builder: it fails loudly */
    if (ags_protocol_kind(reason, AGS_REASON_COUNT, "break reason",
                          &it->brk_reason) < 0) {
        Py_DECREF(reason);
        Py_DECREF(exc);
        return AGS_ERROR;
    }
    Py_DECREF(reason);
    {
        /* what the program's operation raised, when that caused it */
        PyObject *cause = PyException_GetCause(exc);

        Py_XSETREF(it->brk_raised, cause);  /* steals */
    }
    /* The builder's GraphBreak carries its detail apart from the reason. */
    {
        PyObject *detail = PyObject_GetAttrString(exc, "detail");

        if (detail == NULL) {
            PyErr_Clear();
        }
        Py_XSETREF(it->brk_detail, detail && PyUnicode_Check(detail)
                                       ? Py_NewRef(detail) : PyObject_Str(exc));
        Py_XDECREF(detail);
    }
    Py_DECREF(exc);
    return it->brk_detail ? AGS_BREAK : AGS_ERROR;
}

/* Steals v. */
int
ags_push(ags_frame *f, ags_value v)
{
    if (f->sp >= f->stack_cap) {
        ags_value_clear(&v);
        PyErr_SetString(PyExc_SystemError,
                        "agspeed interpreter: stack overflow (a bug)");
        return AGS_ERROR;
    }
    f->stack[f->sp++] = v;
    return AGS_GO;
}

ags_value
ags_pop(ags_frame *f)
{
    assert(f->sp > 0);
    return f->stack[--f->sp];
}

ags_value *
ags_peek(ags_frame *f, int depth)
{
    return &f->stack[f->sp - depth];
}

void
ags_drop(ags_frame *f, int n)
{
    while (n-- > 0 && f->sp > 0) {
        ags_value v = ags_pop(f);
        ags_value_clear(&v);
    }
}

/* Pushes what a load for a call produces: [callable, self] when `self` is
 * given, else the callable and its NULL in this version's order.  Steals
 * both. */
int
ags_push_callable(ags_frame *f, ags_value callable, ags_value *self)
{
    ags_value null = ags_value_make(AGS_VK_NULL_MARK, NULL, NULL);

    if (self != NULL) {
        if (ags_push(f, callable) < 0) {
            ags_value_clear(self);
            return AGS_ERROR;
        }
        return ags_push(f, *self);
    }
    if (AGS_NULL_BEFORE_CALLABLE) {
        if (ags_push(f, null) < 0) {
            ags_value_clear(&callable);
            return AGS_ERROR;
        }
        return ags_push(f, callable);
    }
    if (ags_push(f, callable) < 0) {
        return AGS_ERROR;
    }
    return ags_push(f, null);
}

/* The capture running on this thread, for ags_interp_site; NULL between
 * captures.  Per thread: a capture lets the GIL go whenever the builder
 * runs Python, and another thread's capture may start and end meanwhile. */
static _Thread_local ags_interp *running;

/* New reference: where the running capture is, innermost first, as
 * ((code, offset, globals), ...): each interpreted frame's code, the
 * offset of its current instruction and its globals; () between
 * captures.  For what the builder replays at the program's place
 * (warnings, agspeed/_effects.py). */
PyObject *
ags_interp_site(void)
{
    PyObject *out = PyList_New(0);

    if (out == NULL) {
        return NULL;
    }
    /* (a generator frame not being stepped has a codeless stand-in for
     * its parent: the walk ends there) */
    for (ags_frame *f = running ? running->top : NULL; f && f->code;
         f = f->parent) {
        PyObject *row = Py_BuildValue(
            "(Oi O)", (PyObject *)f->code,
            f->pc < f->bc.n ? f->bc.instrs[f->pc].offset : -1, f->globals);

        if (row == NULL || PyList_Append(out, row) < 0) {
            Py_XDECREF(row);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(row);
    }
    Py_SETREF(out, PyList_AsTuple(out));
    return out;
}

/* ------------------------------------------------------------------ */
/* The builder */

/* builder.method(*args) with args built by Py_BuildValue(fmt): a new
 * reference, or NULL with the exception set (ags_take_break sorts graph
 * breaks from errors). */
PyObject *
ags_call_builder(ags_interp *it, int op, const char *fmt, ...)
{
    va_list va;
    PyObject *fn, *args, *out;

    assert(op >= 0 && op < AGS_BOP_COUNT);
    fn = PyObject_GetAttr(it->builder, bop_names[op]);
    if (fn == NULL) {
        return NULL;
    }
    va_start(va, fmt);
    args = Py_VaBuildValue(fmt, va);
    va_end(va);
    if (args == NULL) {
        Py_DECREF(fn);
        return NULL;
    }
    if (!PyTuple_Check(args)) {
        Py_SETREF(args, PyTuple_Pack(1, args));
    }
    out = args ? PyObject_Call(fn, args, NULL) : NULL;
    Py_DECREF(fn);
    Py_XDECREF(args);
    return out;
}

/* ------------------------------------------------------------------ */
/* Frames */

void
ags_frame_release(ags_frame *f)
{
    for (int i = 0; f->locals != NULL && i < f->nlocals; i++) {
        ags_value_clear(&f->locals[i]);
    }
    ags_drop(f, f->sp);
    ags_value_clear(&f->retval);
    for (int i = 0; f->cells != NULL && i < f->nlocals; i++) {
        Py_XDECREF(f->cells[i]);
    }
    PyMem_Free(f->cells);
    PyMem_Free(f->locals);
    PyMem_Free(f->stack);
    ags_bc_release(&f->bc);
}

/* The cell of local slot i (made on first use, holding the slot's value
 * as a graph argument): *cell is borrowed from the frame. */
int
ags_frame_cell(ags_interp *it, ags_frame *f, int i, PyObject **cell)
{
    PyObject *contents = NULL;

    if (f->cells == NULL) {
        f->cells = PyMem_Calloc((size_t)f->nlocals, sizeof(PyObject *));
        if (f->cells == NULL) {
            PyErr_NoMemory();
            return AGS_ERROR;
        }
    }
    if (f->cells[i] == NULL) {
        if (ags_materialize(it, &f->locals[i]) < 0) {
            return AGS_ERROR;
        }
        if (f->locals[i].kind != AGS_VK_UNBOUND) {
            contents = ags_held_arg(it, &f->locals[i]);
            if (contents == NULL) {
                return PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
            }
        }
        f->cells[i] = PyCell_New(contents);
        Py_XDECREF(contents);
        if (f->cells[i] == NULL) {
            return AGS_ERROR;
        }
    }
    *cell = f->cells[i];
    return AGS_GO;
}

/* Is slot i one of the code's free variables (the last co_nfreevars)? */
int
ags_is_free_slot(const ags_frame *f, int i)
{
    return i >= f->nlocals - f->code->co_nfreevars;
}

static int
frame_init(ags_frame *f, ags_frame *parent, PyCodeObject *code,
           PyObject *globals, PyObject *builtins)
{
    memset(f, 0, sizeof(*f));
    f->parent = parent;
    f->depth = parent ? parent->depth + 1 : 0;
    f->code = code;
    f->globals = globals;
    f->builtins = builtins;
    f->jump = -1;
    if (ags_bc_decode(code, &f->bc) < 0) {
        return -1;
    }
    f->nlocals = code->co_nlocalsplus;
    f->stack_cap = code->co_stacksize + 2;
    f->locals = PyMem_Calloc((size_t)f->nlocals + 1, sizeof(ags_value));
    f->stack = PyMem_Calloc((size_t)f->stack_cap, sizeof(ags_value));
    if (f->locals == NULL || f->stack == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Runs a frame from instruction `pc` until it returns (AGS_DONE, retval
 * set), yields (AGS_YIELD, retval set to the value; f->pc stays on the
 * YIELD_VALUE), breaks or fails.  A generator's frame (interp_gen.c) is
 * run again from past its YIELD_VALUE. */
static int frame_loop(ags_interp *it, ags_frame *f, Py_ssize_t pc);

int
ags_frame_run_from(ags_interp *it, ags_frame *f, Py_ssize_t pc)
{
    ags_frame *outer = it->top;
    int rc;

    it->top = f;
    rc = frame_loop(it, f, pc);
    it->top = outer;
    return rc;
}

static int
frame_loop(ags_interp *it, ags_frame *f, Py_ssize_t pc)
{
    int rc = AGS_GO;

    for (f->pc = pc; rc == AGS_GO && f->pc < f->bc.n;) {
        const ags_instr *ins = &f->bc.instrs[f->pc];
        ags_handler h = handlers[ins->opcode];

        it->writes += writes_state[ins->opcode];

        if (f->depth == 0 && ins->offset == it->stop_at) {
            return AGS_STOPPED;
        }
        /* Code under a try runs as any other (interp_exc.c says why). */
        if (++it->steps > AGS_MAX_STEPS) {
            rc = ags_stopf(it, AGS_REASON_TOO_LONG,
                           "more than %d instructions "
                           "(a long or endless loop)", AGS_MAX_STEPS);
        }
        else {
            f->jump = -1;
            rc = h ? h(it, f, ins)
                   : ags_stopf(it, AGS_REASON_UNSUPPORTED_INSTRUCTION,
                               "no handler for this instruction yet");
        }
        if (rc == AGS_BREAK && it->brk_code == NULL) {
            it->brk_code = f->code;
            it->brk_offset = ins->offset;
            it->brk_opcode = ins->opcode;
        }
        if (rc == AGS_BREAK) {
            /* a handler of this frame may catch it (interp_catch.c) */
            rc = ags_catch(it, f, ins);
        }
        if (rc == AGS_BREAK && f->depth == 0) {
            it->root_offset = ins->offset;
        }
        if (rc != AGS_GO) {
            break;
        }
        if (f->jump >= 0) {
            f->pc = f->jump;
        }
        else {
            f->pc++;
        }
    }
    if (rc == AGS_GO) {
        PyErr_SetString(PyExc_SystemError,
                        "agspeed interpreter fell off the end of the code");
        return AGS_ERROR;
    }
    return rc;
}

/* Runs a frame from its start.  Generator code is run by a GENERATOR
 * value (interp_gen.c), never here: only a root frame of generator or
 * coroutine code reaches this check. */
static int
frame_run(ags_interp *it, ags_frame *f)
{
    if (f->code->co_flags & (CO_GENERATOR | CO_COROUTINE
                             | CO_ASYNC_GENERATOR)) {
        it->brk_code = f->code;
        it->brk_offset = -1;    /* at its start: reported as its first line */
        it->brk_opcode = -1;
        return ags_stopf(it, AGS_REASON_GENERATOR,
                         "generators and coroutines are not captured");
    }
    return ags_frame_run_from(it, f, 0);
}

/* Inlines `func(*args)` (args borrowed; the last len(kwnames) by
 * keyword): runs its bytecode in a new frame and sets *result. */
int
ags_inline(ags_interp *it, ags_frame *caller, PyObject *func,
           PyObject *fsource, ags_value *args, int nargs, PyObject *kwnames,
           ags_value *result)
{
    ags_frame f;
    PyObject *plan, *builtins;
    int rc;

    if (caller->depth + 1 >= AGS_MAX_DEPTH) {
        return ags_stopf(it, AGS_REASON_TOO_DEEP,
                         "calls nested deeper than %d",
                         AGS_MAX_DEPTH);
    }
    plan = ags_call_builder(it, AGS_BOP_BIND, "(OiO)", func, nargs,
                            kwnames ? kwnames : Py_None);
    if (plan == NULL) {
        return ags_take_break(it);
    }
    builtins = PyFunction_GetGlobals(func);
    builtins = PyDict_GetItemString(builtins, "__builtins__");
    if (builtins != NULL && PyModule_Check(builtins)) {
        builtins = PyModule_GetDict(builtins);
    }
    if (builtins == NULL) {
        builtins = caller->builtins;
    }
    if (frame_init(&f, caller, (PyCodeObject *)PyFunction_GetCode(func),
                   PyFunction_GetGlobals(func), builtins) < 0) {
        Py_DECREF(plan);
        ags_frame_release(&f);
        return AGS_ERROR;
    }
    f.func = func;
    f.fsource = fsource;
    rc = ags_bind_params(it, &f, plan, args);
    Py_DECREF(plan);
    if (rc == AGS_GO) {
        rc = ags_bind_closure(it, &f, func, fsource);
    }
    /* Calling generator code makes a GENERATOR value that owns the frame
     * from now on (interp_gen.c); nothing runs yet. */
    if (rc == AGS_GO && ags_gen_code(f.code)) {
        return ags_gen_new(it, &f, func, fsource, result);
    }
    if (rc == AGS_GO) {
        rc = frame_run(it, &f);
    }
    if (rc == AGS_DONE) {
        *result = f.retval;
        f.retval = ags_value_make(AGS_VK_UNBOUND, NULL, NULL);
        rc = AGS_GO;
    }
    ags_frame_release(&f);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Entry point */

static int
bind_locals(ags_interp *it, ags_frame *f, PyObject *f_locals)
{
    PyObject *names = f->code->co_localsplusnames;

    for (int i = 0; i < f->nlocals; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        PyObject *value = PyDict_GetItemWithError(f_locals, name);
        PyObject *source;

        if (value == NULL) {
            if (PyErr_Occurred()) {
                return AGS_ERROR;
            }
            continue;
        }
        source = Py_BuildValue("(sO)", ags_load_names[AGS_LOAD_LOCAL], name);
        if (source == NULL) {
            return AGS_ERROR;
        }
        f->locals[i] = ags_value_make(AGS_VK_LAZY, Py_NewRef(value), source);
    }
    (void)it;
    return AGS_GO;
}

int
ags_interp_init(void)
{
#define AGS_X(op, handler, doc) handlers[op] = handler;
    AGS_INTERP_OPS(AGS_X)
#undef AGS_X
    /* (stores to attributes and items count in their handlers: those to
     * an object the call itself made do not, ags_note_write) */
    writes_state[STORE_GLOBAL] = writes_state[DELETE_GLOBAL] = 1;
    writes_state[STORE_DEREF] = writes_state[DELETE_DEREF] = 1;
    for (int i = 0; i < AGS_BOP_COUNT; i++) {
        if (bop_names[i] == NULL
            && (bop_names[i] = PyUnicode_InternFromString(ags_bop_names[i]))
                   == NULL) {
            return -1;
        }
    }
    return ags_ops_init();
}

PyObject *
ags_interp_capture(PyCodeObject *code, PyObject *f_locals, PyObject *globals,
                   PyObject *builtins, PyObject *builder,
                   PyObject *tensor_type)
{
    ags_interp it, *outer;
    ags_frame f;
    PyObject *out = NULL;
    int rc;

    memset(&it, 0, sizeof(it));
    it.brk_reason = -1;
    it.root_offset = it.stop_at = -1;
    memset(&f, 0, sizeof(f));
    if (!PyType_Check(tensor_type) || !PyDict_Check(f_locals)
        || !PyDict_Check(globals)) {
        PyErr_SetString(PyExc_TypeError,
                        "capture(code, f_locals: dict, globals: dict, "
                        "builtins, builder, tensor_type: type)");
        return NULL;
    }
    it.builder = builder;
    outer = running;
    running = &it;
    it.tensor_type = tensor_type;
    it.node_type = PyObject_GetAttrString(builder, "node_type");
    it.assumptions = PyObject_GetAttrString(builder, "assumptions");
    it.known = PyObject_GetAttrString(builder, "known");
    /* optional: the builder's own set, so that it can tell what the capture
     * made (a function a decorator inside the frame updates) */
    it.owned = PyObject_GetAttrString(builder, "owned_ids");
    if (it.owned == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        it.owned = PySet_New(NULL);
    }
    else if (it.owned != NULL && !PySet_CheckExact(it.owned)) {
        Py_CLEAR(it.owned);
        PyErr_SetString(PyExc_TypeError,
                        "capture: builder.owned_ids must be a set");
    }
    it.gen_boxes = PyDict_New();
    it.ahead = PySet_New(NULL);
    /* optional: the builder's own map, where it shadows stores itself (an
     * object's __dict__ read after its attributes were set) */
    it.shadows = PyObject_GetAttrString(builder, "shadow_map");
    if (it.shadows == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        it.shadows = PyDict_New();
    }
    else if (it.shadows != NULL && !PyDict_CheckExact(it.shadows)) {
        Py_CLEAR(it.shadows);
        PyErr_SetString(PyExc_TypeError,
                        "capture: builder.shadow_map must be a dict");
    }
    /* optional: a builder without it makes no containers inside folds */
    it.fresh = PyObject_GetAttrString(builder, "fresh_containers");
    if (it.fresh == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
    }
    else if (it.fresh != NULL && !PyList_CheckExact(it.fresh)) {
        Py_CLEAR(it.fresh);
        PyErr_SetString(PyExc_TypeError,
                        "capture: builder.fresh_containers must be a list");
    }
    if (PyErr_Occurred()) {
        goto done;
    }
    if (it.node_type == NULL || it.assumptions == NULL || it.known == NULL
        || it.owned == NULL || it.gen_boxes == NULL || it.shadows == NULL
        || it.ahead == NULL) {
        goto done;
    }
    if (!PyType_Check(it.node_type) || !PyList_Check(it.assumptions)
        || !PyDict_Check(it.known)) {
        PyErr_SetString(PyExc_TypeError, "capture: builder.node_type must be "
                        "a type, builder.assumptions a list and builder.known "
                        "a dict");
        goto done;
    }
    /* optional: a builder that never meets NumPy may leave it out */
    it.array_type = PyObject_GetAttrString(builder, "ndarray_type");
    if (it.array_type == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            goto done;
        }
        PyErr_Clear();
    }
    else if (it.array_type == Py_None) {
        Py_CLEAR(it.array_type);
    }
    else if (!PyType_Check(it.array_type)) {
        PyErr_SetString(PyExc_TypeError,
                        "capture: builder.ndarray_type must be a type or None");
        goto done;
    }
    /* optional: the sources of ints and floats to load as graph inputs */
    it.symbolic_scalars = PyObject_GetAttrString(builder, "symbolic_scalars");
    if (it.symbolic_scalars == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            goto done;
        }
        PyErr_Clear();
    }
    else if (it.symbolic_scalars == Py_None) {
        Py_CLEAR(it.symbolic_scalars);
    }
    else if (!PyFrozenSet_Check(it.symbolic_scalars)) {
        PyErr_SetString(PyExc_TypeError,
                        "capture: builder.symbolic_scalars must be a "
                        "frozenset or None");
        goto done;
    }
    if (ags_stop_at(builder, &it.stop_at) < 0
        || frame_init(&f, NULL, code, globals, builtins) < 0) {
        goto done;
    }
    rc = bind_locals(&it, &f, f_locals);
    if (rc == AGS_GO) {
        rc = frame_run(&it, &f);
    }
    if (rc == AGS_DONE) {
        /* the capture's own list or dict, not a copy: the builder tells a list of
         * the program returned (its shadow) by identity */
        PyObject *result = ags_held_arg(&it, &f.retval);
        if (result == NULL) {
            rc = it.brk_reason >= 0 ? AGS_BREAK : AGS_ERROR;
            it.brk_code = code;
            /* at the return: the loop stopped on it */
            it.brk_offset = f.bc.instrs[f.pc].offset;
            it.brk_opcode = f.bc.instrs[f.pc].opcode;
        }
        else {
            out = Py_BuildValue("{s:s,s:N,s:O}", "status", "graph", "result",
                                result, "assumptions", it.assumptions);
        }
    }
    if (rc == AGS_BREAK) {
        PyCodeObject *where = it.brk_code ? it.brk_code : code;
        out = Py_BuildValue("{s:s,s:O,s:i,s:i,s:i,s:O,s:O,s:i}", "status",
                            "break", "code", (PyObject *)where, "offset",
                            it.brk_offset, "opcode", it.brk_opcode, "reason",
                            it.brk_reason, "detail", it.brk_detail,
                            "assumptions", it.assumptions, "root_offset",
                            it.root_offset);
    }
    if (rc == AGS_STOPPED) {
        out = Py_BuildValue("{s:s,s:N,s:O}", "status", "stopped", "state",
                            ags_frame_state(&it, &f), "assumptions",
                            it.assumptions);
    }
done:
    running = outer;
    ags_frame_release(&f);
    Py_XDECREF(it.node_type);
    Py_XDECREF(it.assumptions);
    Py_XDECREF(it.known);
    Py_XDECREF(it.array_type);
    Py_XDECREF(it.symbolic_scalars);
    Py_XDECREF(it.owned);
    Py_XDECREF(it.gen_boxes);
    Py_XDECREF(it.shadows);
    Py_XDECREF(it.fresh);
    Py_XDECREF(it.ahead);
    Py_XDECREF(it.ahead_before);
    Py_XDECREF(it.brk_detail);
    Py_XDECREF(it.brk_raised);
    return out;
}
