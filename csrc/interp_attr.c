/* interp_attr.c: attributes for the symbolic interpreter (see interp.h).
 *
 * An attribute of a known object is found by the builder without running
 * user code (no descriptors but plain functions and properties, no
 * __getattr__ but nn.Module's own stores): the builder answers with an
 * Attr kind (protocol.h), and the value is guarded on its source
 * ("attr", owner's source, name).  An attribute of a tensor is metadata
 * (a constant: shape, dtype, device...) or a tensor view (.T); a method
 * load gives a METHOD value.  getattr()/hasattr() with a constant name
 * load as LOAD_ATTR does, a missing attribute guarded absent (hasattr of a
 * tensor is asked of its type); fields of structseqs and namedtuples
 * the capture built are read as attributes of known objects; super()
 * objects find attributes in the classes after the given one.  A class
 * whose own __getattribute__ is a Python function has it run for every
 * read, as CPython does: the function is inlined with the object and the
 * name (its `super().__getattribute__` is the RAW_GETATTR plan: the read
 * past it).
 */
#include "interp.h"
#include <string.h>

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
    *src = Py_BuildValue("(sOO)", ags_load_names[AGS_LOAD_ATTR], owner_src,
                         name);
    Py_DECREF(owner_src);
    return *src == NULL ? -1 : 0;
}

/* New reference or NULL (no error): for an object the capture made (it has
 * no source), ("attr", its class's source, name) when `value` is what its
 * class holds under name (no instance attribute hides it) and the class
 * was loaded from a source, so a class-level table read through the object
 * is guarded, item by item, like one read through the class. */
static PyObject *
class_attr_source(ags_interp *it, const ags_value *owner, PyObject *name,
                  PyObject *value)
{
    PyObject *cls = (PyObject *)Py_TYPE(owner->obj), *dict, *src;
    ags_value type_value;
    int hidden;

    if (owner->kind != AGS_VK_CONST
        || _PyType_Lookup(Py_TYPE(owner->obj), name) != value
        || ags_is_owned(it, owner->obj) != 1) {
        PyErr_Clear();
        return NULL;
    }
    dict = PyObject_GenericGetDict(owner->obj, NULL);
    hidden = dict != NULL && PyDict_Check(dict)
             && PyDict_Contains(dict, name) != 0;
    Py_XDECREF(dict);
    PyErr_Clear();
    if (hidden) {
        return NULL;
    }
    type_value = ags_value_make(AGS_VK_CONST, Py_NewRef(cls), NULL);
    src = ags_source_of(it, &type_value);
    ags_value_clear(&type_value);
    if (src == NULL) {
        return NULL;
    }
    Py_SETREF(src, Py_BuildValue("(sOO)", ags_load_names[AGS_LOAD_ATTR], src,
                                 name));
    PyErr_Clear();
    return src;
}

/* Asks the builder for obj.name: *answer a new (Attr, value, self) tuple
 * and *how its Attr kind.  AGS_GO, or the builder's break, or AGS_ERROR
 * for an answer of a kind protocol.h does not list. */
static int
ask_attr(ags_interp *it, PyObject *obj, PyObject *name, PyObject **answer,
         int *how)
{
    *answer = ags_call_builder(it, AGS_BOP_ATTR, "(OO)", obj, name);
    if (*answer == NULL) {
        return ags_take_break(it);
    }
    if (ags_protocol_kind(PyTuple_GET_ITEM(*answer, 0), AGS_ATTR_COUNT,
                          "attribute answer", how) < 0) {
        Py_CLEAR(*answer);
        return AGS_ERROR;
    }
    return AGS_GO;
}

/* A known object's attribute, by the builder's answer (how, value, self),
 * how an AGS_ATTR_*: VALUE a plain attribute, METHOD a function to call
 * with `self`, PROPERTY a property whose getter is inlined, MISSING. */
static int
known_attr(ags_interp *it, ags_frame *f, ags_value *owner, PyObject *name,
           int method)
{
    PyObject *answer, *value, *self_obj, *src = NULL;
    int how;
    ags_value v;
    int rc;

    rc = ask_attr(it, owner->obj, name, &answer, &how);
    if (rc != AGS_GO) {
        return rc;
    }
    value = PyTuple_GET_ITEM(answer, 1);
    self_obj = PyTuple_GET_ITEM(answer, 2);
    if (attr_source(it, owner, name, &src) < 0) {
        Py_DECREF(answer);
        return AGS_ERROR;
    }
    if (how == AGS_ATTR_METHOD
        && (Py_IS_TYPE(value, &PyMethodDescr_Type)
            || Py_IS_TYPE(value, &PyClassMethodDescr_Type))) {
        /* a builtin type's method: the owner's guard checks its exact
         * type, which implies the method; an instance has no attribute
         * the guard could load for it */
        Py_CLEAR(src);
    }
    if (how == AGS_ATTR_VALUE && src == NULL) {
        src = class_attr_source(it, owner, name, value);
    }
    if (how == AGS_ATTR_VALUE || how == AGS_ATTR_METHOD) {
        if (src != NULL) {
            rc = ags_load_object(it, src, value, &v);
        }
        else if (PyObject_TypeCheck(value, (PyTypeObject *)it->tensor_type)) {
            rc = ags_stopf(it, AGS_REASON_UNGUARDABLE_ATTRIBUTE,
                           "tensor attribute %R of "
                           "an object reached by no source", name);
        }
        else {
            rc = ags_value_of(it, value, &v) < 0 ? AGS_ERROR : AGS_GO;
        }
        if (rc == AGS_GO && how == AGS_ATTR_METHOD && !method) {
            /* A method used as a value (`f = self.step`, getattr): a bound
             * method, whose self keeps its source through the known map
             * when it is called. */
            descrgetfunc get = Py_TYPE(value)->tp_descr_get;
            /* bound as CPython binds it (a builtin type's method descriptor
             * gives a builtin method) */
            PyObject *bound = Py_IS_TYPE(value, &PyMethodDescr_Type) && get != NULL
                ? get(value, self_obj, (PyObject *)Py_TYPE(self_obj))
                : PyMethod_New(value, self_obj);

            ags_value_clear(&v);
            if (bound == NULL || ags_value_of(it, bound, &v) < 0) {
                rc = AGS_ERROR;
            }
            else {
                rc = ags_push(f, v);
            }
            Py_XDECREF(bound);
        }
        else if (rc == AGS_GO && how == AGS_ATTR_METHOD) {
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
    else if (how == AGS_ATTR_WRITTEN) {
        /* this capture stored it (a side effect replayed after the graph):
         * what it stored, not what the object holds now */
        if (ags_value_of(it, value, &v) < 0) {
            rc = AGS_ERROR;
        }
        else {
            rc = method ? ags_push_callable(f, v, NULL) : ags_push(f, v);
        }
    }
    else if (how == AGS_ATTR_PROPERTY) {
        /* value is the property object; its getter runs inlined. */
        PyObject *fget = PyObject_GetAttrString(value, "fget");
        PyObject *fsrc = src ? Py_BuildValue("(sO)",
                                             ags_load_names[AGS_LOAD_FGET], src) : NULL;
        ags_value self = ags_value_copy(owner), result;

        rc = fget == NULL ? AGS_ERROR
             : src ? ags_assume(it, src, value) : AGS_GO;
        if (rc == AGS_GO && !PyFunction_Check(fget)) {
            rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_ATTRIBUTE,
                           "property %R whose "
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
        rc = ags_stopf(it, AGS_REASON_MISSING_ATTRIBUTE,
                       "%s has no attribute %R",
                       Py_TYPE(owner->obj)->tp_name, name);
    }
    Py_XDECREF(src);
    Py_DECREF(answer);
    return rc;
}

/* The Python function a class runs for every attribute read of its
 * instances (its own __getattribute__), borrowed, or NULL when reads take
 * CPython's generic path or a C getter. */
static PyObject *
getattribute_hook(PyObject *obj)
{
    static PyObject *dunder;
    PyTypeObject *tp = Py_TYPE(obj);
    PyObject *found;

    if (tp->tp_getattro == PyObject_GenericGetAttr) {
        return NULL;
    }
    if (dunder == NULL
        && (dunder = PyUnicode_InternFromString("__getattribute__")) == NULL) {
        PyErr_Clear();
        return NULL;
    }
    found = _PyType_Lookup(tp, dunder);
    return found != NULL && PyFunction_Check(found) ? found : NULL;
}

/* Is `name` a Python function, staticmethod or classmethod on obj's class
 * (a method of a namedtuple subclass, say)? */
static int
python_method(PyObject *obj, PyObject *name)
{
    PyObject *found = _PyType_Lookup(Py_TYPE(obj), name);

    return found != NULL
           && (PyFunction_Check(found)
               || Py_IS_TYPE(found, &PyStaticMethod_Type)
               || Py_IS_TYPE(found, &PyClassMethod_Type));
}

/* Pushes hook(owner, name), the hook inlined and guarded through the
 * owner's type: ("attr", ("type", owner's source), "__getattribute__"). */
static int
inline_getattribute(ags_interp *it, ags_frame *f, ags_value *owner,
                    PyObject *hook, PyObject *name, int method)
{
    PyObject *hsrc;
    ags_value args[2], result;
    int rc = ags_type_attr_source(it, owner, "__getattribute__", hook, &hsrc);

    if (rc == AGS_GO) {
        args[0] = *owner;   /* borrowed, as the call's arguments are */
        args[1] = ags_value_make(AGS_VK_CONST, Py_NewRef(name), NULL);
        rc = ags_inline(it, f, hook, hsrc, args, 2, NULL, &result);
        ags_value_clear(&args[1]);
    }
    if (rc == AGS_GO) {
        rc = method ? ags_push_callable(f, result, NULL) : ags_push(f, result);
    }
    Py_XDECREF(hsrc);
    return rc;
}

int
ags_load_attr(ags_interp *it, ags_frame *f, PyObject *name, int method)
{
    ags_value owner = ags_pop(f);
    int rc = method ? ags_tail(it, f, &owner, name) : AGS_GO;

    if (rc != AGS_GO) {
        ags_value_clear(&owner);
        return rc;
    }
    rc = method && ags_can_shadow(&owner) ? ags_is_mutator(owner.obj, name)
                                          : 0;
    if (rc < 0) {
        ags_value_clear(&owner);
        return AGS_ERROR;
    }
    if (rc == 1) {
        /* a method that changes a list or dict of the program: called on
         * its shadow */
        rc = ags_shadow(it, &owner);
        if (rc != AGS_GO) {
            ags_value_clear(&owner);
            return rc;
        }
    }
    if (owner.kind == AGS_VK_TENSOR && !method) {
        rc = push_result(it, f, ags_call_builder(it, AGS_BOP_TENSOR_ATTR,
                                                 "(OO)",
                                                 owner.obj, name));
    }
    else if (owner.kind == AGS_VK_TUPLE && !PyTuple_CheckExact(owner.obj)
             && (!method || python_method(owner.obj, name))) {
        /* a field of a structseq (x.max(1).values) or namedtuple, or a
         * method its class defines in Python (inlined with the tuple) */
        rc = known_attr(it, f, &owner, name, method);
    }
    else if (owner.kind == AGS_VK_TENSOR || owner.kind == AGS_VK_LIST
             || owner.kind == AGS_VK_DICT || owner.kind == AGS_VK_TUPLE
             || owner.kind == AGS_VK_SET) {
        if (!method) {
            rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_ATTRIBUTE,
                           "attribute %R of a %s",
                           name, ags_kind_names[owner.kind]);
        }
        else {
            ags_value m = ags_value_make(AGS_VK_METHOD, Py_NewRef(name), NULL);
            ags_value self = ags_value_copy(&owner);
            rc = ags_push_callable(f, m, &self);
        }
    }
    else if (owner.kind == AGS_VK_CONST) {
        PyObject *hook = getattribute_hook(owner.obj);

        rc = hook ? inline_getattribute(it, f, &owner, hook, name, method)
                  : known_attr(it, f, &owner, name, method);
    }
    else {
        rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_ATTRIBUTE,
                       "attribute %R of a %s",
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

/* Whether no frame between f (the read past a class's __getattribute__)
 * and the getattr() that inlined it has a handler around where it runs:
 * the AttributeError would reach that getattr() and nothing else. */
static int
absent_unwinds(ags_interp *it, ags_frame *f)
{
    for (ags_frame *g = f; g != NULL && g != it->absent_to; g = g->parent) {
        ags_except *table = NULL;
        Py_ssize_t n = 0;
        int offset = g->bc.instrs[g->pc].offset, covered = 0;

        if (ags_bc_exceptions(g->code, &table, &n) < 0) {
            PyErr_Clear();
            return 0;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            covered |= table[i].start <= offset && offset < table[i].end;
        }
        PyMem_Free(table);
        if (covered || g->parent == NULL) {
            return 0;
        }
    }
    return it->absent_to != NULL;
}

/* getattr(obj, name[, default]) or hasattr(obj, name) where obj's class has
 * its own __getattribute__ (hook): the hook inlined; when the read past it
 * finds nothing, the AttributeError it raises is getattr()'s default or
 * hasattr()'s False (with the absence guarded). */
static int
hooked_getattr(ags_interp *it, ags_frame *f, int has, PyObject *hook,
               ags_value *args, int nargs, ags_value *result)
{
    ags_frame *saved_to = it->absent_to;
    int saved = it->absent, rc;
    int catches = has || nargs == 3;

    it->absent_to = catches ? f : NULL;
    it->absent = 0;
    rc = inline_getattribute(it, f, &args[0], hook, args[1].obj, 0);
    if (rc == AGS_BREAK && catches && it->absent) {
        /* the capture goes on past the raise the hook let through */
        it->brk_reason = -1;
        it->brk_code = NULL;
        Py_CLEAR(it->brk_detail);
        rc = has ? (ags_value_of(it, Py_False, result) < 0 ? AGS_ERROR
                                                          : AGS_GO)
                 : (*result = ags_value_copy(&args[2]), AGS_GO);
    }
    else if (rc == AGS_GO) {
        *result = ags_pop(f);
        if (has) {
            ags_value_clear(result);
            rc = ags_value_of(it, Py_True, result) < 0 ? AGS_ERROR : AGS_GO;
        }
    }
    it->absent_to = saved_to;
    it->absent = saved;
    return rc;
}

/* hasattr(obj, name) where the builder would not load the attribute
 * because it is a method of a builtin type (a partial's __call__): a C
 * method descriptor runs nothing on the way, so it is there, whatever the
 * object holds; its class's entry is guarded.  Any other refusal keeps its
 * break. */
static int
has_builtin_method(ags_interp *it, const ags_value *obj, PyObject *name,
                   ags_value *result)
{
    PyObject *found = _PyType_Lookup(Py_TYPE(obj->obj), name), *src = NULL;
    const char *text = PyUnicode_AsUTF8(name);
    int rc;

    if (found == NULL || text == NULL
        || !(Py_IS_TYPE(found, &PyMethodDescr_Type)
             || Py_IS_TYPE(found, &PyWrapperDescr_Type)
             || Py_IS_TYPE(found, &PyClassMethodDescr_Type))) {
        PyErr_Clear();
        return AGS_BREAK;
    }
    ags_unbreak(it);
    Py_INCREF(found);
    rc = ags_type_attr_source(it, obj, text, found, &src);
    Py_DECREF(found);
    Py_XDECREF(src);
    if (rc == AGS_GO) {
        rc = ags_value_of(it, Py_True, result) < 0 ? AGS_ERROR : AGS_GO;
    }
    return rc;
}

/* getattr(obj, name[, default]) and hasattr(obj, name) with a constant
 * name: the attribute is loaded as LOAD_ATTR would, under the same guard
 * on its source; a missing one (with a default, or for hasattr) is guarded
 * absent.  *result is set on AGS_GO. */
int
ags_call_getattr(ags_interp *it, ags_frame *f, int mode, ags_value *args,
             int nargs, PyObject *kwnames, ags_value *result)
{
    int has = mode == AGS_GETATTR_HAS;
    const char *fn = has ? "hasattr" : "getattr";
    PyObject *name, *answer, *src = NULL, *hook;
    int rc, how, missing;

    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        return ags_stopf(it, AGS_REASON_BAD_CALL,
                         "%s() takes no keyword arguments", fn);
    }
    if (nargs < 2 || nargs > (has ? 2 : 3)) {
        return ags_stopf(it, AGS_REASON_BAD_CALL, "%s() with %d arguments", fn,
                         nargs);
    }
    name = args[1].obj;
    if (args[1].kind != AGS_VK_CONST || !PyUnicode_CheckExact(name)) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL,
                         "%s() with a name that is not "
                         "a constant string", fn);
    }
    if (has && (args[0].kind == AGS_VK_TENSOR
                || args[0].kind == AGS_VK_TUPLE
                || args[0].kind == AGS_VK_LIST
                || args[0].kind == AGS_VK_DICT)) {
        /* decided by the value's type (a tensor's is guarded) */
        PyObject *fn = PyDict_GetItemString(f->builtins, "hasattr");
        if (fn == NULL) {
            return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL,
                             "hasattr() is not a builtin here");
        }
        return ags_builder_call(it, AGS_BOP_FOLD, fn, NULL, args, nargs, NULL,
                                result);
    }
    if (args[0].kind != AGS_VK_CONST) {
        if (has) {
            return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL,
                             "hasattr() of a %s",
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
    hook = mode == AGS_GETATTR_RAW ? NULL : getattribute_hook(args[0].obj);
    if (hook != NULL) {
        return hooked_getattr(it, f, has, hook, args, nargs, result);
    }
    rc = ask_attr(it, args[0].obj, name, &answer, &how);
    if (rc == AGS_BREAK && has
        && it->brk_reason == AGS_REASON_UNSUPPORTED_ATTRIBUTE) {
        return has_builtin_method(it, &args[0], name, result);
    }
    if (rc != AGS_GO) {
        return rc;
    }
    missing = how == AGS_ATTR_MISSING;
    if (missing && mode == AGS_GETATTR_RAW && nargs == 2
        && absent_unwinds(it, f)) {
        it->absent = 1;   /* the break below returns to the getattr() */
    }
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
                rc = ags_stopf(it, AGS_REASON_MISSING_ATTRIBUTE,
                               "%s has no attribute "
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
int
ags_push_super(ags_interp *it, ags_frame *f, PyObject *cls, PyObject *self)
{
    PyObject *sup = PyObject_CallFunctionObjArgs((PyObject *)&PySuper_Type,
                                                 cls, self, NULL);
    if (sup == NULL) {
        PyErr_Clear();
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL,
                         "super(%R, ...) failed", cls);
    }
    return ags_push(f, ags_value_make(AGS_VK_CONST, sup, NULL));
}

/* Zero-argument super(): the frame's __class__ cell and first argument. */
int
ags_zero_arg_super(ags_interp *it, ags_frame *f)
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
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL, "super() here");
    }
    return ags_push_super(it, f, cls->obj, f->locals[0].obj);
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
        rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_CALL, "super() of a %s",
                       AGS_DESCRIBE(&self));
    }
    else {
        rc = ags_push_super(it, f, cls.obj, self.obj);
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

