/* interp_object.c: objects the capture makes (see interp.h).
 *
 * Calling a plain class (the builder plans it NEW: no metaclass __call__,
 * a builtin __new__) makes a real instance through the builder's
 * new_object, records it as owned, and inlines the class's __init__ on
 * it.  The instance is a constant value with no source: its attributes are
 * graph arguments, read back through the builder's attr like any known
 * object's, and no guard is taken on them since nothing outside the frame
 * can change them.
 *
 * obj.name = value goes to the builder's store_attr, which stores the
 * graph argument on an owned object, answers a __setattr__ written in
 * Python to inline as f(obj, name, value) or a property's setter to
 * inline as fset(obj, value), or breaks (a write to an object of the
 * program is a side effect).
 */
#include "interp.h"

/* Runs the plan (NEW, cls, __init__ or None, its source or None) on args
 * (borrowed), setting *result to the new object. */
int
ags_call_new(ags_interp *it, ags_frame *f, PyObject *plan, ags_value *args,
             int nargs, PyObject *kwnames, ags_value *result)
{
    PyObject *cls = PyTuple_GET_ITEM(plan, 1);
    PyObject *init = PyTuple_GET_ITEM(plan, 2);
    PyObject *isrc = PyTuple_GET_ITEM(plan, 3);
    PyObject *obj;
    ags_value self, ret, *all = NULL;
    int rc;

    obj = ags_call_builder(it, AGS_BOP_NEW_OBJECT, "(O)", cls);
    if (obj == NULL) {
        return ags_take_break(it);
    }
    if (ags_own(it, obj) < 0) {
        Py_DECREF(obj);
        return AGS_ERROR;
    }
    self = ags_value_make(AGS_VK_CONST, obj, NULL);  /* steals obj */
    if (init == Py_None) {
        /* object.__init__ / dict.__init__: arguments are refused there */
        rc = nargs == 0 ? AGS_GO
                        : ags_stopf(it, AGS_REASON_BAD_CALL,
                                    "%s() takes no arguments",
                                    ((PyTypeObject *)cls)->tp_name);
        goto done;
    }
    all = PyMem_Calloc((size_t)nargs + 1, sizeof(ags_value));
    if (all == NULL) {
        PyErr_NoMemory();
        rc = AGS_ERROR;
        goto done;
    }
    all[0] = self;
    for (int i = 0; i < nargs; i++) {
        all[i + 1] = args[i];  /* borrowed from the caller */
    }
    rc = ags_inline(it, f, init, isrc == Py_None ? NULL : isrc, all,
                    nargs + 1, kwnames, &ret);
    if (rc == AGS_GO) {
        if (ret.kind != AGS_VK_CONST || ret.obj != Py_None) {
            rc = ags_stopf(it, AGS_REASON_BAD_CALL,
                           "%s.__init__ returned a value",
                           ((PyTypeObject *)cls)->tp_name);
        }
        ags_value_clear(&ret);
    }
done:
    PyMem_Free(all);
    if (rc == AGS_GO) {
        *result = self;
    }
    else {
        ags_value_clear(&self);
    }
    return rc;
}

/* t.requires_grad = flag on a tensor the graph computes (a bias or mask made
 * in the layer, as T5's under checkpointing): one that does not require
 * grad is a leaf, and the graph sets it in place with requires_grad_(flag)
 * as eager's setter would; one that does may not be a leaf, where eager's
 * setter raises, so that one ends the capture and eager decides. */
static int
set_requires_grad(ags_interp *it, ags_value *t, ags_value *flag)
{
    PyObject *method, *grad = ags_call_builder(it, AGS_BOP_TENSOR_ATTR, "(Os)",
                                               t->obj, "requires_grad");
    ags_value ret;
    int rc;

    if (grad == NULL) {
        return ags_take_break(it);
    }
    rc = grad == Py_False ? AGS_GO : AGS_BREAK;
    Py_DECREF(grad);
    if (rc != AGS_GO) {
        return ags_stopf(it, AGS_REASON_SIDE_EFFECT,
                         "setting requires_grad of a computed tensor that "
                         "requires grad");
    }
    method = PyUnicode_FromString("requires_grad_");
    if (method == NULL) {
        return AGS_ERROR;
    }
    rc = ags_builder_call(it, AGS_BOP_CALL_METHOD, method, t, flag, 1, NULL,
                          &ret);
    Py_DECREF(method);
    if (rc == AGS_GO) {
        ags_value_clear(&ret);
    }
    return rc;
}

/* owner.name = value (owner, value borrowed). */
int
ags_store_attr(ags_interp *it, ags_frame *f, ags_value *owner,
               PyObject *name, ags_value *value)
{
    PyObject *arg, *out, *fsrc = NULL;
    ags_value args[3], ret;
    int rc, setter;

    if (owner->kind == AGS_VK_TENSOR
        && PyUnicode_CompareWithASCIIString(name, "requires_grad") == 0) {
        return set_requires_grad(it, owner, value);
    }
    if (owner->kind != AGS_VK_CONST) {
        return ags_stopf(it, AGS_REASON_SIDE_EFFECT,
                         "setting attribute %R of a %s", name,
                         AGS_DESCRIBE(owner));
    }
    /* A list or dict built here is stored itself, not a frozen copy: the
     * object and the code share it, as in Python; so is a set, on an object
     * the capture made (one of the program's gets its members' copy). */
    arg = value->kind == AGS_VK_LIST || value->kind == AGS_VK_DICT
              || (value->kind == AGS_VK_SET && owner->source == NULL)
              ? Py_NewRef(value->obj) : ags_graph_arg(it, value);
    if (arg == NULL) {
        return PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
    }
    if (owner->source != NULL) {
        /* reached from the frame: an object of the program, whose class's
         * own __setattr__ is reached and guarded through its type */
        rc = ags_effect_setattr(it, owner, name, arg, &out);
        Py_DECREF(arg);
        if (rc != AGS_GO || out == NULL) {
            return rc;
        }
        if (ags_type_attr_source(it, owner, "__setattr__", out,
                                 &fsrc) < 0) {
            Py_DECREF(out);
            return AGS_ERROR;
        }
    }
    else {
        out = ags_call_builder(it, AGS_BOP_STORE_ATTR, "(OOO)", owner->obj,
                               name, arg);
        Py_DECREF(arg);
        if (out == NULL) {
            return ags_take_break(it);
        }
        if (out == Py_None) {
            Py_DECREF(out);
            return AGS_GO;
        }
        if (PyFunction_Check(out)
            && ((PyCodeObject *)PyFunction_GET_CODE(out))->co_argcount == 3) {
            /* the class's own __setattr__, reached through the class where
             * the capture knows a source for it (its closure, super()'s
             * cell, needs one) */
            ags_value cls = ags_value_make(
                AGS_VK_CONST, Py_NewRef((PyObject *)Py_TYPE(owner->obj)), NULL);
            PyObject *csrc = ags_source_of(it, &cls);

            ags_value_clear(&cls);
            if (csrc != NULL) {
                fsrc = Py_BuildValue("(sOs)", ags_load_names[AGS_LOAD_ATTR],
                                     csrc, "__setattr__");
                Py_DECREF(csrc);
                if (fsrc == NULL || ags_assume(it, fsrc, out) < 0) {
                    Py_XDECREF(fsrc);
                    Py_DECREF(out);
                    return AGS_ERROR;
                }
            }
        }
    }
    /* A __setattr__ written in Python, inlined as out(owner, name, value),
     * or a property's setter, as out(owner, value). */
    if (!PyFunction_Check(out)) {
        rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL, "calling %R", out);
        Py_DECREF(out);
        Py_XDECREF(fsrc);
        return rc;
    }
    setter = ((PyCodeObject *)PyFunction_GET_CODE(out))->co_argcount == 2;
    args[0] = *owner;
    args[1] = setter ? *value
                     : ags_value_make(AGS_VK_CONST, Py_NewRef(name), NULL);
    args[2] = *value;
    rc = ags_inline(it, f, out, fsrc, args, setter ? 2 : 3, NULL, &ret);
    if (rc == AGS_GO) {
        ags_value_clear(&ret);
    }
    if (!setter) {
        ags_value_clear(&args[1]);
    }
    Py_DECREF(out);
    Py_XDECREF(fsrc);
    return rc;
}
