/* interp_exc.c: try blocks and with blocks (see interp.h for the layout).
 *
 * Exception tables.  From 3.11 a try block costs nothing on the normal
 * path: its body, the normal-path copy of a finally block and the jump
 * over the handler are ordinary instructions, and the handler is reached
 * only through the code's exception table when something raises.  The
 * interpreter never raises: an instruction that would (RAISE_VARARGS, a
 * fold or an operation that fails on the values it was given, a missing
 * attribute) ends the capture with its own reason, and the frame runs
 * eager, where the handler runs.  So the capture walks a try body like
 * any other code and never enters a handler; the handlers' opcodes
 * (WITH_EXCEPT_START, RERAISE...) have rows that end the capture.  The
 * one exception: a KeyError or IndexError of a subscript inside an
 * inlined function, which that function's handler catches (interp_catch.c
 * models PUSH_EXC_INFO, CHECK_EXC_MATCH and POP_EXCEPT for it).
 *
 * Why that is sound.  A handler could still run after capture if the
 * graph raised at run time where the trace did not.  The trace ran every
 * tensor operation on fake tensors whose dtype, device, shape, strides
 * and requires_grad the guard pins, and every Python fact it relied on is
 * guarded; an operation that fails for such metadata (a shape mismatch,
 * a bad dtype) failed while capturing and broke there.  What is left are
 * failures that depend on the data inside tensors (an index out of range
 * in a gather, an assert on values), which no meta kernel sees: those
 * propagate from the graph without running the handler, as they do under
 * torch.compile, which makes the same assumption.  Out of memory is the
 * other one, and no handler in model code is written to recover from it.
 * A with block's exit is the one handler whose effect matters then: a
 * graph that raises midway through a grad-mode or autocast block would
 * leave the mode switched, so such graphs run wrapped to put the modes
 * back (agspeed/_ctx.py restoring_modes).  A Python manager's inlined
 * __exit__ wrote nothing (a write would have ended the capture), so
 * skipping it loses only its answer, which could have swallowed the
 * exception: that case raises where eager would not.
 * Rejected: refusing every instruction under a handler (what this
 * interpreter did first) sends every function with a try or a with to
 * eager, including the library helpers models call on every step.
 *
 * With blocks.  BEFORE_WITH pops the context manager and pushes its exit
 * and what its enter returned; the block's normal end calls the exit with
 * (None, None, None) through an ordinary CALL (the exit sits in the slot
 * of a method whose self is the first None).  The builder decides what
 * enter and exit are (enter_with, agspeed/_ctx.py): for torch's grad-mode
 * and autocast managers, callables it models itself (Plan CTX), which
 * record the state change as graph nodes and switch the mode the fake
 * operations run under; for a manager written in Python, its __enter__
 * and __exit__ bound to it, inlined like any method.  The exceptional
 * path (WITH_EXCEPT_START) is a handler, so it is never reached.
 */
#include "interp.h"

/* cm: borrowed.  Sets *exit and *enter (new values) to the builder's
 * answer for entering cm. */
static int
with_callables(ags_interp *it, const ags_value *cm, ags_value *exit,
               ags_value *enter)
{
    PyObject *arg = ags_graph_arg(it, cm), *source = NULL, *pair = NULL;
    int rc = AGS_GO;

    if (arg == NULL) {
        return PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
    }
    source = ags_source_of(it, cm);
    pair = ags_call_builder(it, AGS_BOP_ENTER_WITH, "(OO)", arg,
                            source ? source : Py_None);
    if (pair == NULL) {
        rc = ags_take_break(it);
        goto done;
    }
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_TypeError,
                        "enter_with must answer a tuple (exit, enter)");
        rc = AGS_ERROR;
        goto done;
    }
    if (ags_value_of(it, PyTuple_GET_ITEM(pair, 0), exit) < 0) {
        rc = AGS_ERROR;
        goto done;
    }
    if (ags_value_of(it, PyTuple_GET_ITEM(pair, 1), enter) < 0) {
        ags_value_clear(exit);
        rc = AGS_ERROR;
    }
done:
    Py_DECREF(arg);
    Py_XDECREF(source);
    Py_XDECREF(pair);
    return rc;
}

/* BEFORE_WITH: [cm] -> [exit, enter()]. */
AGS_HANDLER
op_before_with(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value cm = ags_pop(f);
    ags_value exit = {.kind = AGS_VK_UNBOUND};
    ags_value enter = {.kind = AGS_VK_UNBOUND};
    ags_value entered = {.kind = AGS_VK_UNBOUND};
    ags_value noargs[1] = {{.kind = AGS_VK_UNBOUND}};
    int rc;

    (void)ins;
    rc = ags_materialize(it, &cm);
    if (rc == AGS_GO && ags_gen_is_ctx(&cm)) {
        /* @contextmanager: the generator is its own exit (interp_gen.c) */
        exit = ags_value_copy(&cm);
        rc = ags_gen_ctx_step(it, f, &cm, 1, &entered);
    }
    else if (rc == AGS_GO) {
        rc = with_callables(it, &cm, &exit, &enter);
        if (rc == AGS_GO) {
            rc = ags_call_value(it, f, &enter, NULL, noargs, 0, NULL,
                                &entered);
        }
    }
    if (rc == AGS_GO) {
        rc = ags_push(f, exit);
        exit = ags_value_make(AGS_VK_UNBOUND, NULL, NULL);
        if (rc == AGS_GO) {
            rc = ags_push(f, entered);
        }
        else {
            ags_value_clear(&entered);
        }
    }
    ags_value_clear(&cm);
    ags_value_clear(&exit);
    ags_value_clear(&enter);
    return rc;
}

/* The opcodes of exception handlers the capture does not follow (see
 * above). */
AGS_HANDLER
op_exception_path(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)f;
    (void)ins;
    return ags_stopf(it, AGS_REASON_EXCEPTION_HANDLER,
                     "an exception handler's code was reached");
}
