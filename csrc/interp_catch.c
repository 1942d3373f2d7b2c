/* interp_catch.c: a lookup error the program's own subscript raises, caught
 * by a handler of an inlined function (see interp.h).
 *
 * The interpreter does not raise (interp_exc.c): an operation that fails
 * ends the capture.  One failure is common enough in library code to
 * model: `d[k]` raising KeyError (or `s[i]` IndexError) under
 * `try: ... except KeyError:`, which is how collections.abc's Mapping
 * answers get() and `in` (Mapping.get, Mapping.__contains__), and so how
 * os.environ.get() and every user mapping built on MutableMapping
 * answer a missing key.
 *
 * What is caught.  The builder evaluates a subscript of known values for
 * real (guarded on what it read); when that raises, its GraphBreak has
 * the exception as __cause__, which ags_take_break keeps in brk_raised.
 * A break whose first instruction was BINARY_SUBSCR, with reason
 * op_failed and a LookupError raised, is the program raising there, the
 * same exception for every call the guards admit.  A tensor's subscript
 * is the exception (interp_data.c drops what it raised): its IndexError
 * depends on sizes, which a dynamic capture does not always guard where
 * a fake kernel raised.  As the break unwinds
 * frame by frame, each frame's loop asks ags_catch: an exception-table
 * entry of that frame covering the instruction turns the break back into
 * execution at the handler, the stack cut to the entry's depth and the
 * exception pushed, as CPython unwinds.  The handler's own opcodes are
 * modelled here (PUSH_EXC_INFO, CHECK_EXC_MATCH, POP_EXCEPT, RERAISE),
 * and so is `raise KeyError(key)` in an inlined function (os.environ's
 * __getitem__ turns its KeyError into one about the caller's key): an
 * exception of a builtin class made from known values is a constant, and
 * raising a LookupError breaks in a way the handlers above may catch.
 * Anything else a handler does that the interpreter cannot ends the
 * capture as before.
 *
 * Only inlined frames catch.  The root frame's handlers stay breaks: a
 * break there resumes (interp_resume.c) at its instruction, and code
 * inside a handler has an exception state (sys.exc_info) a resume function
 * cannot rebuild.  A break inside an inlined frame resumes at the root
 * frame's call, which runs the callee eager whatever state it was in.
 *
 * What the failed attempt left stays: graph nodes nothing reads, and
 * assumptions and effects that held in eager up to the raise as well.
 */
#include "interp.h"

/* 1 when the break being taken is an exception the program raised that a
 * handler may catch (see above). */
static int
catchable(ags_interp *it)
{
    if (it->brk_raised == NULL
        || !PyErr_GivenExceptionMatches(it->brk_raised, PyExc_LookupError)) {
        return 0;
    }
    /* the builder's subscript, or a raise modelled below */
    return (it->brk_reason == AGS_REASON_OP_FAILED
            && it->brk_opcode == BINARY_SUBSCR)
           || it->brk_reason == AGS_REASON_RAISE;
}

/* Breaks with `exc` (stolen) as the exception the program raises. */
static int
raise_known(ags_interp *it, PyObject *exc)
{
    int rc = ags_stopf(it, AGS_REASON_RAISE, "the code raises %R here",
                       exc);

    if (rc == AGS_BREAK) {
        it->brk_raised = exc;
    }
    else {
        Py_DECREF(exc);
    }
    return rc;
}

/* The LookupError `v` is or makes (an instance, or a builtin class called
 * with no arguments), as a new reference; NULL (no error) for anything
 * else. */
static PyObject *
lookup_error(const ags_value *v)
{
    if (v->kind != AGS_VK_CONST) {
        return NULL;
    }
    if (PyExceptionInstance_Check(v->obj)
        && PyErr_GivenExceptionMatches(v->obj, PyExc_LookupError)) {
        return Py_NewRef(v->obj);
    }
    if (PyExceptionClass_Check(v->obj)
        && !PyType_HasFeature((PyTypeObject *)v->obj, Py_TPFLAGS_HEAPTYPE)
        && PyErr_GivenExceptionMatches(v->obj, PyExc_LookupError)) {
        PyObject *exc = PyObject_CallNoArgs(v->obj);
        if (exc == NULL) {
            PyErr_Clear();
        }
        return exc;
    }
    return NULL;
}

int
ags_raise(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    PyObject *exc;

    /* RAISE_VARARGS 1 (raise e) or 2 (raise e from cause): e is below */
    if (f->depth == 0 || ins->opcode != RAISE_VARARGS || ins->arg < 1
        || ins->arg > 2) {
        return AGS_DUNDER_NOT_MINE;
    }
    exc = lookup_error(ags_peek(f, (int)ins->arg));
    return exc ? raise_known(it, exc) : AGS_DUNDER_NOT_MINE;
}

/* RERAISE: the caught exception on top raised again (a handler that did
 * not match, or the end of a cleanup); one the interpreter cannot carry
 * ends the capture. */
AGS_HANDLER
op_reraise(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    PyObject *exc = f->depth > 0 ? lookup_error(ags_peek(f, 1)) : NULL;

    (void)ins;
    if (exc == NULL) {
        return ags_stopf(it, AGS_REASON_EXCEPTION_HANDLER,
                         "an exception handler's code was reached");
    }
    return raise_known(it, exc);
}

int
ags_exception_new(ags_interp *it, PyObject *fn, const ags_value *self,
                  const ags_value *args, int nargs, PyObject *kwnames,
                  ags_value *result)
{
    PyObject *pos, *exc;

    if (self != NULL || kwnames != NULL || !PyExceptionClass_Check(fn)
        || PyType_HasFeature((PyTypeObject *)fn, Py_TPFLAGS_HEAPTYPE)) {
        return AGS_DUNDER_NOT_MINE;
    }
    for (int i = 0; i < nargs; i++) {
        if (args[i].kind != AGS_VK_CONST) {
            return AGS_DUNDER_NOT_MINE;
        }
    }
    pos = PyTuple_New(nargs);
    for (int i = 0; pos != NULL && i < nargs; i++) {
        PyTuple_SET_ITEM(pos, i, Py_NewRef(args[i].obj));
    }
    exc = pos ? PyObject_Call(fn, pos, NULL) : NULL;
    Py_XDECREF(pos);
    if (exc == NULL) {
        return AGS_ERROR;
    }
    if (ags_value_of(it, exc, result) < 0) {
        Py_DECREF(exc);
        return AGS_ERROR;
    }
    Py_DECREF(exc);
    return AGS_GO;
}

int
ags_catch(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_except *table = NULL, *entry = NULL;
    Py_ssize_t n = 0;
    PyObject *exc, *lasti = NULL;
    int rc = AGS_BREAK;

    if (f->depth == 0 || !catchable(it)) {
        return AGS_BREAK;
    }
    if (ags_bc_exceptions(f->code, &table, &n) < 0) {
        return AGS_ERROR;
    }
    for (Py_ssize_t i = 0; i < n && entry == NULL; i++) {
        if (table[i].start <= ins->offset && ins->offset < table[i].end) {
            entry = &table[i];
        }
    }
    if (entry == NULL || entry->depth > f->sp
        || f->bc.index[entry->handler / 2] < 0) {
        goto done;
    }
    if (entry->lasti) {
        /* the raising instruction, in code units, as CPython pushes it */
        lasti = PyLong_FromLong(ins->offset / 2);
        if (lasti == NULL) {
            rc = AGS_ERROR;
            goto done;
        }
    }
    exc = Py_NewRef(it->brk_raised);
    ags_unbreak(it);
    ags_drop(f, f->sp - entry->depth);
    rc = AGS_GO;
    if (lasti != NULL) {
        rc = ags_push(f, ags_value_make(AGS_VK_CONST, lasti, NULL));
        lasti = NULL;
    }
    if (rc == AGS_GO) {
        rc = ags_push(f, ags_value_make(AGS_VK_CONST, exc, NULL));
    }
    else {
        Py_DECREF(exc);
    }
    f->jump = f->bc.index[entry->handler / 2];
done:
    Py_XDECREF(lasti);
    PyMem_Free(table);
    return rc;
}

/* PUSH_EXC_INFO: [exc] -> [the exception handled before (None), exc]. */
AGS_HANDLER
op_push_exc_info(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value exc = ags_pop(f);

    (void)it;
    (void)ins;
    if (ags_push(f, ags_value_make(AGS_VK_CONST, Py_NewRef(Py_None), NULL))
        < 0) {
        ags_value_clear(&exc);
        return AGS_ERROR;
    }
    return ags_push(f, exc);
}

/* CHECK_EXC_MATCH: [exc, type] -> [exc, exc matches type]. */
AGS_HANDLER
op_check_exc_match(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value type = ags_pop(f);
    ags_value *exc = ags_peek(f, 1);
    int match, ok;

    (void)ins;
    ok = type.kind == AGS_VK_CONST && exc->kind == AGS_VK_CONST
         && PyExceptionInstance_Check(exc->obj)
         && (PyExceptionClass_Check(type.obj) || PyTuple_Check(type.obj));
    if (!ok) {
        int rc = ags_stopf(it, AGS_REASON_EXCEPTION_HANDLER,
                           "except with a %s", AGS_DESCRIBE(&type));
        ags_value_clear(&type);
        return rc;
    }
    match = PyErr_GivenExceptionMatches(exc->obj, type.obj);
    ags_value_clear(&type);
    return ags_push(f, ags_value_make(AGS_VK_CONST,
                                      Py_NewRef(match ? Py_True : Py_False),
                                      NULL));
}

/* POP_EXCEPT: drops the exception handled before, which PUSH_EXC_INFO
 * pushed. */
AGS_HANDLER
op_pop_except(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    (void)ins;
    ags_drop(f, 1);
    return AGS_GO;
}
