/* interp_import.c: `import` statements inside captured code (IMPORT_NAME,
 * IMPORT_FROM) for the symbolic interpreter (see interp.h).
 *
 * An import of a module that is already loaded runs no code: it reads
 * sys.modules.  The capture does the same read, through the source
 * ("item", ("gmod", "sys", "modules"), name), so the guard checks that the
 * same module object is still the one registered (a reload or a
 * replacement in sys.modules makes the entry miss).  A module that is not
 * loaded yet would execute its body: the capture breaks there and the
 * import happens in eager.  A relative import (level > 0) names its module
 * from the importing module's __package__, as importlib resolves it: that
 * global is fixed for the code's module, so the resolved name is taken at
 * capture time and the module it names is guarded as above.
 *
 * `import a.b` binds the top package `a`; `import a.b as c` and
 * `from a import b` take the attribute with IMPORT_FROM, which is an
 * attribute load of a known module (interp_attr.c).
 */
#include "interp.h"

/* Loads sys.modules[name] guarded on its source, or breaks when it is not
 * loaded.  name: borrowed. */
static int
load_module(ags_interp *it, PyObject *name, ags_value *out)
{
    PyObject *modules = PyImport_GetModuleDict();  /* borrowed */
    PyObject *mod, *source;
    int rc;

    mod = PyDict_GetItemWithError(modules, name);
    if (mod == NULL) {
        return PyErr_Occurred()
                   ? AGS_ERROR
                   : ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL,
                               "importing %R, which is not loaded yet", name);
    }
    if (!PyModule_Check(mod)) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                         "sys.modules[%R] is a %s", name,
                         Py_TYPE(mod)->tp_name);
    }
    source = Py_BuildValue("(s(sss)O)", ags_load_names[AGS_LOAD_ITEM],
                           ags_load_names[AGS_LOAD_GMOD], "sys", "modules",
                           name);
    if (source == NULL) {
        return AGS_ERROR;
    }
    Py_INCREF(mod);
    rc = ags_load_object(it, source, mod, out);
    Py_DECREF(mod);
    Py_DECREF(source);
    return rc;
}

/* The absolute name of `from <level dots><name> import ...` in frame f,
 * as a new reference in *out: AGS_GO, a break (no usable __package__, or
 * more dots than the package has parents) or AGS_ERROR. */
static int
absolute_name(ags_interp *it, ags_frame *f, PyObject *name, long level,
              PyObject **out)
{
    PyObject *package = PyDict_GetItemString(f->globals, "__package__");
    PyObject *base;

    *out = NULL;
    if (package == NULL || !PyUnicode_Check(package)
        || PyUnicode_GET_LENGTH(package) == 0) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_INSTRUCTION,
                         "a relative import of %R outside a package", name);
    }
    base = Py_NewRef(package);
    for (long i = 1; i < level; i++) {
        Py_ssize_t dot = PyUnicode_FindChar(base, '.', 0,
                                            PyUnicode_GET_LENGTH(base), -1);

        if (dot < 0) {
            Py_DECREF(base);
            return dot == -2
                       ? AGS_ERROR
                       : ags_stopf(it, AGS_REASON_UNSUPPORTED_INSTRUCTION,
                                   "a relative import of %R beyond the top "
                                   "package", name);
        }
        Py_SETREF(base, PyUnicode_Substring(base, 0, dot));
        if (base == NULL) {
            return AGS_ERROR;
        }
    }
    if (PyUnicode_GET_LENGTH(name) == 0) {
        *out = base;
    }
    else {
        *out = PyUnicode_FromFormat("%U.%U", base, name);
        Py_DECREF(base);
    }
    return *out != NULL ? AGS_GO : AGS_ERROR;
}

/* IMPORT_NAME: pops fromlist and level, pushes the module. */
AGS_HANDLER
op_import_name(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    PyObject *name = PyTuple_GET_ITEM(f->code->co_names, ins->arg);
    ags_value fromlist = ags_pop(f), level = ags_pop(f), mod, top;
    Py_ssize_t dot;
    int rc, plain;

    long depth = level.kind == AGS_VK_CONST && PyLong_CheckExact(level.obj)
                     ? PyLong_AsLong(level.obj)
                     : -1;

    if (depth < 0) {
        rc = PyErr_Occurred()
                 ? AGS_ERROR
                 : ags_stopf(it, AGS_REASON_UNSUPPORTED_INSTRUCTION,
                             "an import of %R at a computed level", name);
        goto done;
    }
    if (depth > 0) {
        /* `from .a import b`: the module .a names, whatever the fromlist */
        PyObject *full;

        rc = absolute_name(it, f, name, depth, &full);
        if (rc != AGS_GO) {
            goto done;
        }
        rc = load_module(it, full, &mod);
        Py_DECREF(full);
        if (rc == AGS_GO) {
            rc = ags_push(f, mod);
        }
        goto done;
    }
    plain = fromlist.kind == AGS_VK_CONST
            && (fromlist.obj == Py_None
                || (PyTuple_Check(fromlist.obj)
                    && PyTuple_GET_SIZE(fromlist.obj) == 0));
    rc = load_module(it, name, &mod);
    if (rc != AGS_GO) {
        goto done;
    }
    dot = PyUnicode_FindChar(name, '.', 0, PyUnicode_GET_LENGTH(name), 1);
    if (!plain || dot < 0) {
        rc = dot == -2 ? AGS_ERROR : ags_push(f, mod);
        if (dot == -2) {
            ags_value_clear(&mod);
        }
        goto done;
    }
    /* `import a.b`: a.b is loaded (guarded above), the name binds `a` */
    ags_value_clear(&mod);
    {
        PyObject *front = PyUnicode_Substring(name, 0, dot);
        if (front == NULL) {
            rc = AGS_ERROR;
            goto done;
        }
        rc = load_module(it, front, &top);
        Py_DECREF(front);
    }
    if (rc == AGS_GO) {
        rc = ags_push(f, top);
    }
done:
    ags_value_clear(&fromlist);
    ags_value_clear(&level);
    return rc;
}

/* IMPORT_FROM: the module stays; its attribute is pushed above it. */
AGS_HANDLER
op_import_from(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    PyObject *name = PyTuple_GET_ITEM(f->code->co_names, ins->arg);

    if (ags_push(f, ags_value_copy(ags_peek(f, 1))) < 0) {
        return AGS_ERROR;
    }
    return ags_load_attr(it, f, name, 0);
}
