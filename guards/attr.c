/* attr.c: a guard program's attribute loads (ATTR, see load.c).
 *
 * One home for attribute rules: agspeed._sources.static_attr says how an
 * attribute is found without running user code.  ags_load_attr_value
 * answers the common cases in C the same way (a Python module's dict; an
 * object's class attribute, instance dict, or nn.Module store; an object's
 * own __class__, a class's name, qualified name and MRO; nothing found on
 * a class without __getattr__; a Parameter's gradient through torch's
 * getter) and hands every other case to the Python step, resolve_step,
 * which calls static_attr: descriptors, classes, super objects, builtin
 * types, custom __getattr__, threading.local's per-thread dicts.
 * tests/guards/test_load.py pins that both readings agree on each rule.
 */
#include "program.h"

/* torch.nn.Parameter and torch's own `grad` getter (TensorBase's), found
 * once torch is loaded (never importing it); NULL before. */
static PyObject *param_type, *grad_getter;

static int
find_parameter(void)
{
    PyObject *mod, *base;

    if (param_type != NULL) {
        return 1;
    }
    mod = PyImport_GetModule(ags_gp_names.torch_parameter);
    if (mod == NULL) {
        PyErr_Clear();
        return 0;
    }
    param_type = PyObject_GetAttrString(mod, "Parameter");
    Py_DECREF(mod);
    base = param_type != NULL && PyType_Check(param_type)
               ? PyObject_GetAttrString(param_type, "__base__") : NULL;
    /* Parameter(Tensor(TensorBase)): TensorBase's own getter, as static_attr
     * reads it (Parameter's __torch_function__ is disabled) */
    grad_getter = base != NULL
                      ? _PyType_Lookup((PyTypeObject *)base, ags_gp_names.grad)
                      : NULL;
    Py_XDECREF(base);
    if (grad_getter == NULL || !Py_IS_TYPE(grad_getter, &PyGetSetDescr_Type)) {
        PyErr_Clear();
        Py_CLEAR(param_type);
        grad_getter = NULL;
        return 0;
    }
    Py_INCREF(grad_getter);
    return 1;
}

/* Whether objects of cls find their attributes as a threading.local does
 * (a per-thread dict, which static_attr reads for the calling thread). */
static int
is_thread_local(PyTypeObject *cls)
{
    static getattrofunc local_getattro;

    if (local_getattro == NULL) {
        PyObject *mod = PyImport_ImportModule("_thread");
        PyObject *local = mod ? PyObject_GetAttrString(mod, "_local") : NULL;

        if (local != NULL && PyType_Check(local)) {
            local_getattro = ((PyTypeObject *)local)->tp_getattro;
        }
        Py_XDECREF(local);
        Py_XDECREF(mod);
        if (local_getattro == NULL) {
            PyErr_Clear();
            return 0;
        }
    }
    return cls->tp_getattro == local_getattro;
}

/* A class's own name, qualified name or MRO, as type's descriptors give
 * them (static_attr's _TYPE_NAMES), when its metaclass finds type's own
 * descriptor for `name`: a new reference, or NULL without an exception
 * (not one of those: the Python step). */
static PyObject *
type_name(PyObject *cls, PyObject *name)
{
    PyObject *found;

    if (!PyUnicode_Check(name)
        || (PyUnicode_CompareWithASCIIString(name, "__name__") != 0
            && PyUnicode_CompareWithASCIIString(name, "__qualname__") != 0
            && PyUnicode_CompareWithASCIIString(name, "__mro__") != 0)) {
        return NULL;
    }
    found = _PyType_Lookup(Py_TYPE(cls), name);   /* borrowed */
    if (found == NULL || found != _PyType_Lookup(&PyType_Type, name)
        || Py_TYPE(found)->tp_descr_get == NULL) {
        return NULL;
    }
    return Py_TYPE(found)->tp_descr_get(found, cls, (PyObject *)Py_TYPE(cls));
}

/* New reference to base.<name> as static_attr finds it, or G_MISSING.
 * *via says where the answer came from (VIA_PYTHON when Python found it,
 * or C found it where the memo does not watch). */
PyObject *
ags_load_attr_value(g_program *p, PyObject *base, PyObject *name, int *via)
{
    PyTypeObject *cls = Py_TYPE(base);
    PyObject *found, *dict = NULL, *value = NULL;
    int is_module;

    *via = VIA_PYTHON;

    if (PyModule_Check(base)) {
        value = PyDict_GetItemWithError(PyModule_GetDict(base), name);
        if (value == NULL && !PyErr_Occurred()
            && !PyModule_CheckExact(base)) {
            /* a module subclass may answer past its dict (torch._VF) */
            return ags_load_step(p, AGS_LOAD_ATTR, base, name);
        }
        if (value == NULL) {
            return PyErr_Occurred() ? NULL : G_MISSING;
        }
        return Py_NewRef(value);
    }
    if (PyType_Check(base) && (value = type_name(base, name)) != NULL) {
        return value;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (PyType_Check(base) || PyObject_TypeCheck(base, &PySuper_Type)
        || !(cls->tp_flags & Py_TPFLAGS_HEAPTYPE) || is_thread_local(cls)) {
        return ags_load_step(p, AGS_LOAD_ATTR, base, name);
    }
    found = _PyType_Lookup(cls, name);     /* borrowed */
    if (found != NULL
        && found == _PyType_Lookup(&PyBaseObject_Type, ags_gp_names.class_)) {
        return Py_NewRef((PyObject *)cls);   /* object's own __class__ */
    }
    if (found != NULL && Py_IS_TYPE(found, &PyGetSetDescr_Type)
        && name == ags_gp_names.grad && find_parameter()
        && (PyObject *)cls == param_type && found == grad_getter) {
        /* a parameter's gradient (an optimizer's guard reads one per
         * parameter): torch's getter, which runs no Python; not memoized */
        value = Py_TYPE(found)->tp_descr_get(found, base, (PyObject *)cls);
        if (value != NULL) {
            return value;
        }
        PyErr_Clear();
        return ags_load_step(p, AGS_LOAD_ATTR, base, name);
    }
    if (found != NULL) {
        if (Py_IS_TYPE(found, &PyProperty_Type)) {
            *via = VIA_CLASS_OR_DICT;
            return Py_NewRef(found);
        }
        if (Py_TYPE(found)->tp_descr_set != NULL) {
            return ags_load_step(p, AGS_LOAD_ATTR, base, name);
        }
        Py_INCREF(found);  /* the dict lookup below may run no code, but */
    }                      /* hold it across the calls anyway */
    dict = PyObject_GenericGetDict(base, NULL);
    if (dict == NULL) {
        /* no instance dict: the class answers, or Python does */
        PyErr_Clear();
    }
    else if (PyDict_CheckExact(dict)) {
        value = PyDict_GetItemWithError(dict, name);
        if (value != NULL) {
            Py_XDECREF(found);
            Py_INCREF(value);
            Py_DECREF(dict);
            *via = VIA_CLASS_OR_DICT;
            return value;
        }
        if (PyErr_Occurred()) {
            goto error;
        }
    }
    if (found != NULL) {
        PyTypeObject *kind = Py_TYPE(found);
        Py_XDECREF(dict);
        if (kind == &PyFunction_Type || kind->tp_descr_get == NULL
            || kind == &PyCFunction_Type || kind == &PyType_Type) {
            *via = VIA_CLASS_OR_DICT;
            return found;   /* a method's function, or a class constant */
        }
        Py_DECREF(found);
        return ags_load_step(p, AGS_LOAD_ATTR, base, name);
    }
    is_module = p->module_type != NULL
                && PyObject_TypeCheck(base, (PyTypeObject *)p->module_type);
    if (is_module && dict != NULL && PyDict_CheckExact(dict)) {
        for (int s = 0; s < 3; s++) {
            PyObject *store = PyDict_GetItemWithError(dict,
                                                      ags_gp_names.stores[s]);
            if (store != NULL && !PyDict_CheckExact(store)) {
                /* a store replaced by a mapping of its own (DeepSpeed's
                 * ZeROOrderedDict): Module.__getattr__ reads it, in Python */
                Py_DECREF(dict);
                return ags_load_step(p, AGS_LOAD_ATTR, base, name);
            }
            if (store != NULL) {
                value = PyDict_GetItemWithError(store, name);
                if (value != NULL) {
                    Py_INCREF(value);
                    Py_DECREF(dict);
                    *via = VIA_STORE + s;
                    return value;
                }
            }
            if (PyErr_Occurred()) {
                goto error;
            }
        }
        if (_PyType_Lookup(cls, ags_gp_names.getattr) == p->module_getattr) {
            Py_DECREF(dict);
            *via = VIA_NOWHERE;
            return G_MISSING;
        }
    }
    if ((dict == NULL || PyDict_CheckExact(dict))
        && _PyType_Lookup(cls, ags_gp_names.getattr) == NULL) {
        /* on no class and in no store, with no __getattr__: nowhere */
        Py_XDECREF(dict);
        return G_MISSING;
    }
    Py_XDECREF(dict);
    return ags_load_step(p, AGS_LOAD_ATTR, base, name);
error:
    Py_XDECREF(found);
    Py_XDECREF(dict);
    return NULL;
}
