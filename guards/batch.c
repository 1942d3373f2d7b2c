/* batch.c: a guard program's tensor checks confirmed by one call.
 *
 * A TENSOR check reads a tensor's dtype, requires_grad, shape, strides
 * and device through torch's Python attributes (check.c): five calls,
 * each through torch's argument parsing and error handling, about half a
 * microsecond a tensor.  A frame whose guard reaches many tensors that
 * are not its arguments (an optimizer step: every parameter, its
 * gradient and its state) pays that on every call, while the arguments
 * have the signature and torch's C++ checker (agspeed/_tensor_check.py).
 *
 * So ags_check_run checks each such tensor's exact type in the loop and
 * defers the rest: after the loop, the tensors of the deferred checks,
 * in order, go to one checker built by torch's C++ code for exactly those
 * places (the program's `batch_make`, agspeed._tensor_check.batch_checker,
 * called with a tuple of the tensors of a run whose one-by-one checks all
 * passed).  Its True settles them all; anything else (no checker yet, or
 * it refuses: a different tensor, or torch's thread-local dispatch state
 * differs from where it was built) runs the one-by-one checks, which
 * decide, as before.  A program keeps checkers for a few lists of places
 * (a full evaluation and one through the structure memo defer different
 * checks) and gives batching up after checkers that kept refusing tensors
 * the one-by-one checks then passed (a frame called in alternating
 * contexts).  Fewer than G_BATCH_MIN tensors are checked one by one.
 */
#include "program.h"
#include <string.h>

/* A checker's refusal followed by one-by-one checks that pass: this many,
 * and the program stops batching. */
#define G_BATCH_STALE 8

int
ags_batch_run(g_program *p, const int *index, PyObject *const *tensors,
              Py_ssize_t n, int *refused)
{
    *refused = 0;
    if (p->batch_make == NULL || p->batch_off || n < G_BATCH_MIN) {
        return 0;
    }
    for (int s = 0; s < G_BATCH_SLOTS; s++) {
        g_batch *b = &p->batches[s];
        PyObject *got;
        int ok;

        if (b->check == NULL || b->n != n
            || memcmp(b->index, index, (size_t)n * sizeof(int)) != 0) {
            continue;
        }
        if (b->check == Py_None) {
            return 0;   /* these tensors have no checker (not exact types) */
        }
        got = PyObject_Vectorcall(b->check, tensors, (size_t)n, NULL);
        if (got == NULL) {
            PyErr_Clear();   /* decided one by one */
            *refused = 1;
            continue;
        }
        ok = got == Py_True;
        Py_DECREF(got);
        if (ok) {
            return 1;
        }
        *refused = 1;
    }
    return 0;
}

void
ags_batch_learn(g_program *p, const int *index, PyObject *const *tensors,
                Py_ssize_t n, int refused)
{
    g_batch *b = NULL;
    PyObject *args, *made;
    int *copy;

    if (p->batch_make == NULL || p->batch_off || n < G_BATCH_MIN) {
        return;
    }
    if (refused && ++p->batch_stale >= G_BATCH_STALE) {
        p->batch_off = 1;
        return;
    }
    for (int s = 0; s < G_BATCH_SLOTS; s++) {
        g_batch *o = &p->batches[s];
        if (o->check == Py_None && o->n == n
            && memcmp(o->index, index, (size_t)n * sizeof(int)) == 0) {
            return;   /* refused for these places once: not asked again */
        }
        if (b == NULL && o->check == NULL) {
            b = o;
        }
    }
    if (b == NULL) {   /* all taken: the oldest goes */
        b = &p->batches[p->batch_next];
        p->batch_next = (p->batch_next + 1) % G_BATCH_SLOTS;
    }
    args = PyTuple_New(n);
    copy = PyMem_Malloc((size_t)n * sizeof(int));
    if (args == NULL || copy == NULL) {
        Py_XDECREF(args);
        PyMem_Free(copy);
        PyErr_Clear();
        return;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyTuple_SET_ITEM(args, i, Py_NewRef(tensors[i]));
    }
    made = PyObject_CallOneArg(p->batch_make, args);
    Py_DECREF(args);
    if (made == NULL) {
        PyErr_Clear();
        made = Py_NewRef(Py_None);
    }
    memcpy(copy, index, (size_t)n * sizeof(int));
    PyMem_Free(b->index);
    b->index = copy;
    b->n = n;
    Py_XSETREF(b->check, made);
}

void
ags_batch_release(g_program *p)
{
    for (int s = 0; s < G_BATCH_SLOTS; s++) {
        Py_CLEAR(p->batches[s].check);
        PyMem_Free(p->batches[s].index);
        p->batches[s].index = NULL;
        p->batches[s].n = 0;
    }
    Py_CLEAR(p->batch_make);
    p->batch_off = 0;
    p->batch_stale = 0;
    p->batch_next = 0;
}

int
ags_batch_traverse(g_program *p, visitproc visit, void *arg)
{
    for (int s = 0; s < G_BATCH_SLOTS; s++) {
        Py_VISIT(p->batches[s].check);
    }
    Py_VISIT(p->batch_make);
    return 0;
}

PyObject *
ags_batch_report(g_program *p)
{
    PyObject *slots = PyList_New(0), *out;

    if (slots == NULL) {
        return NULL;
    }
    for (int s = 0; s < G_BATCH_SLOTS; s++) {
        const g_batch *b = &p->batches[s];
        PyObject *row;

        if (b->check == NULL) {
            continue;
        }
        row = Py_BuildValue("(nO)", b->n, b->check != Py_None ? Py_True
                                                                : Py_False);
        if (row == NULL || PyList_Append(slots, row) < 0) {
            Py_XDECREF(row);
            Py_DECREF(slots);
            return NULL;
        }
        Py_DECREF(row);
    }
    out = Py_BuildValue("{s:N,s:i,s:O}", "checkers", slots, "stale",
                        p->batch_stale, "off", p->batch_off ? Py_True
                                                             : Py_False);
    return out;
}
