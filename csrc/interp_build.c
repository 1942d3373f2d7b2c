/* interp_build.c: containers assembled at run time for the symbolic
 * interpreter (see interp.h): set displays and comprehensions (BUILD_SET,
 * SET_ADD, SET_UPDATE) and the dict merges of `{**a, **b}` and
 * `f(**a, **b)` (DICT_UPDATE, DICT_MERGE).
 *
 * A set built here is a real set the capture owns (a SET value) whose
 * members are graph arguments.  Members must hash without running user
 * code: constants of the builtin immutable types, graph nodes of tensors,
 * which hash by identity exactly as the tensors they stand for do in eager
 * (a size's node does not: its number hashes by value), and objects hashed
 * and compared by identity.
 *
 * The right operand of a merge is either a dict the capture built (its
 * items are graph arguments already) or a dict of the program reached by a
 * source, whose items are loaded one by one from ("item", source, key): a
 * tensor becomes a graph input, anything else is guarded.
 */
#include "interp.h"

/* Whether the graph node `node` stands for a tensor (hashed by identity, as
 * its node is), not a size or a test on sizes (hashed by value in eager). */
static int
tensor_node(ags_interp *it, PyObject *node)
{
    PyObject *meta = PyObject_GetAttrString(node, "meta");
    PyObject *ev = meta != NULL && PyDict_Check(meta)
                       ? PyDict_GetItemString(meta, "example_value") : NULL;
    int yes = ev != NULL
              && PyObject_TypeCheck(ev, (PyTypeObject *)it->tensor_type);

    if (meta == NULL) {
        PyErr_Clear();
    }
    Py_XDECREF(meta);
    return yes;
}

/* Whether `obj` (a graph argument) hashes without running user code, as
 * it would in eager. */
static int
hashable_member(ags_interp *it, PyObject *obj)
{
    PyTypeObject *t = Py_TYPE(obj);

    if (PyObject_TypeCheck(obj, (PyTypeObject *)it->node_type)) {
        return tensor_node(it, obj);
    }
    /* hashed and compared by identity, as object is (a module, a plain
     * instance, a function): no user code runs, and eager's set holds the
     * same object */
    if (t->tp_hash == PyBaseObject_Type.tp_hash
        && t->tp_richcompare == PyBaseObject_Type.tp_richcompare) {
        return 1;
    }
    if (obj == Py_None || t == &PyLong_Type || t == &PyBool_Type
        || t == &PyUnicode_Type || t == &PyFloat_Type || t == &PyBytes_Type
        || t == &PyComplex_Type || t == &PyType_Type
        || t == &PyFrozenSet_Type) {
        return 1;
    }
    if (t == &PyTuple_Type) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(obj); i++) {
            if (!hashable_member(it, PyTuple_GET_ITEM(obj, i))) {
                return 0;
            }
        }
        return 1;
    }
    return 0;
}

/* Adds the graph argument of `v` (borrowed) to `set`. */
static int
set_add_value(ags_interp *it, PyObject *set, const ags_value *v)
{
    PyObject *a = ags_graph_arg(it, v);
    int rc;

    if (a == NULL) {
        return AGS_BREAK;
    }
    if (!hashable_member(it, a)) {
        rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                       "a set member of type %s",
                       Py_TYPE(a)->tp_name);
    }
    else {
        rc = PySet_Add(set, a) < 0 ? AGS_ERROR : AGS_GO;
    }
    Py_DECREF(a);
    return rc;
}

/* Adds every element of `seq` (borrowed) to `set`. */
static int
set_add_all(ags_interp *it, PyObject *set, const ags_value *seq)
{
    PyObject *elems = NULL;
    int rc = ags_elements(it, seq, &elems);

    for (Py_ssize_t i = 0; rc == AGS_GO && i < PyTuple_GET_SIZE(elems); i++) {
        PyObject *e = PyTuple_GET_ITEM(elems, i);
        if (!hashable_member(it, e)) {
            rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                           "a set member of type %s", Py_TYPE(e)->tp_name);
        }
        else if (PySet_Add(set, e) < 0) {
            rc = AGS_ERROR;
        }
    }
    Py_XDECREF(elems);
    return rc;
}

AGS_HANDLER
op_build_set(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    int n = (int)ins->arg, rc = AGS_GO;
    PyObject *set = PySet_New(NULL);
    ags_value v;

    if (set == NULL) {
        return AGS_ERROR;
    }
    for (int i = 0; rc == AGS_GO && i < n; i++) {
        rc = set_add_value(it, set, ags_peek(f, n - i));
    }
    if (rc == AGS_GO && (ags_own(it, set) < 0
                         || ags_value_of(it, set, &v) < 0)) {
        rc = AGS_ERROR;
    }
    Py_DECREF(set);
    if (rc != AGS_GO) {
        return rc;
    }
    ags_drop(f, n);
    return ags_push(f, v);
}

/* The set `ins->arg` deep under the top, after the top was popped. */
static ags_value *
target_set(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value *set = ags_peek(f, (int)ins->arg);

    if (set->kind != AGS_VK_SET) {
        ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE, "adding to a %s",
                  AGS_DESCRIBE(set));
        return NULL;
    }
    return set;
}

AGS_HANDLER
op_set_add(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value item = ags_pop(f);
    ags_value *set = target_set(it, f, ins);
    int rc = set ? set_add_value(it, set->obj, &item) : AGS_BREAK;

    ags_value_clear(&item);
    return rc;
}

AGS_HANDLER
op_set_update(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value seq = ags_pop(f);
    ags_value *set = target_set(it, f, ins);
    int rc = set ? set_add_all(it, set->obj, &seq) : AGS_BREAK;

    ags_value_clear(&seq);
    return rc;
}

/* A list, dict or set made during this capture (by a defaultdict's
 * factory) becomes owned, and v (a CONST until now) the matching kind. */
int
ags_own_created(ags_interp *it, ags_value *v)
{
    PyObject *obj = v->obj;

    if (v->kind != AGS_VK_CONST
        || !(PyList_CheckExact(obj) || PyDict_CheckExact(obj)
             || PySet_CheckExact(obj))) {
        return AGS_GO;
    }
    Py_INCREF(obj);
    ags_value_clear(v);
    if (ags_own(it, obj) < 0 || ags_value_of(it, obj, v) < 0) {
        Py_DECREF(obj);
        return AGS_ERROR;
    }
    Py_DECREF(obj);
    return AGS_GO;
}

/* The root frame's **kwargs is a dict CPython made for this call alone:
 * once read (guarded on its length, each item loaded from its source,
 * which together pin its keys), the capture owns a copy, so that
 * kwargs.pop(k) or kwargs[k] = v is no side effect on the program. */
int
ags_own_varkw(ags_interp *it, ags_frame *f, int i)
{
    PyCodeObject *co = f->code;
    ags_value *v = &f->locals[i];
    PyObject *items = NULL;
    int slot, rc;

    if (f->parent != NULL || !(co->co_flags & CO_VARKEYWORDS)
        || (f->cells != NULL && f->cells[i] != NULL)) {
        return AGS_GO;
    }
    slot = co->co_argcount + co->co_kwonlyargcount
           + !!(co->co_flags & CO_VARARGS);
    if (i != slot || v->kind != AGS_VK_CONST || !PyDict_CheckExact(v->obj)
        || v->source == NULL) {
        return AGS_GO;
    }
    rc = ags_mapping_items(it, v, &items);
    if (rc != AGS_GO) {
        return rc;
    }
    if (ags_own(it, items) < 0) {
        Py_DECREF(items);
        return AGS_ERROR;
    }
    ags_value_clear(v);
    *v = ags_value_make(AGS_VK_DICT, items, NULL);  /* steals items */
    return AGS_GO;
}

/* ------------------------------------------------------------------ */
/* Dict merges */

/* v (borrowed): a mapping value.  Sets *items to a new dict of its items
 * as graph arguments (see the top of the file).  AGS_GO, or a break or an
 * error. */
int
ags_mapping_items(ags_interp *it, const ags_value *v, PyObject **items)
{
    PyObject *source = NULL, *keys = NULL;
    int rc = AGS_GO;

    *items = NULL;
    if (v->kind == AGS_VK_DICT) {
        *items = PyDict_Copy(v->obj);
        return *items ? AGS_GO : AGS_ERROR;
    }
    if (v->kind != AGS_VK_CONST || !PyDict_CheckExact(v->obj)) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                         "** of a %s", AGS_DESCRIBE(v));
    }
    source = ags_source_of(it, v);
    if (source == NULL) {
        /* made while capturing (a fold's answer): graph arguments; a real
         * tensor here was reached by no source, so nothing could guard it */
        Py_ssize_t pos = 0;
        PyObject *key, *value;

        while (PyDict_Next(v->obj, &pos, &key, &value)) {
            if (PyObject_TypeCheck(value, (PyTypeObject *)it->tensor_type)) {
                return ags_stopf(it, AGS_REASON_UNGUARDABLE_ATTRIBUTE,
                                 "** of a dict holding a tensor reached by "
                                 "no source");
            }
        }
        *items = PyDict_Copy(v->obj);
        return *items ? AGS_GO : AGS_ERROR;
    }
    keys = PyDict_Keys(v->obj);
    *items = PyDict_New();
    if (keys == NULL || *items == NULL) {
        rc = AGS_ERROR;
    }
    for (Py_ssize_t i = 0; rc == AGS_GO && i < PyList_GET_SIZE(keys); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        PyObject *value = PyDict_GetItemWithError(v->obj, key);
        PyObject *src = NULL, *arg = NULL;
        ags_value loaded;

        if (value == NULL) {
            rc = PyErr_Occurred()
                     ? AGS_ERROR
                     : ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                                 "a dict that changed while read");
            break;
        }
        if (!PyUnicode_CheckExact(key) && !PyLong_CheckExact(key)) {
            rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                           "a dict key of type %s", Py_TYPE(key)->tp_name);
            break;
        }
        Py_INCREF(value);
        src = Py_BuildValue("(sOO)", ags_load_names[AGS_LOAD_ITEM], source,
                            key);
        if (src == NULL || ags_load_object(it, src, value, &loaded) < 0) {
            rc = AGS_ERROR;
        }
        else {
            arg = ags_graph_arg(it, &loaded);
            ags_value_clear(&loaded);
            if (arg == NULL) {
                rc = AGS_BREAK;
            }
            else if (PyDict_SetItem(*items, key, arg) < 0) {
                rc = AGS_ERROR;
            }
        }
        Py_XDECREF(arg);
        Py_XDECREF(src);
        Py_DECREF(value);
    }
    Py_XDECREF(keys);
    Py_DECREF(source);
    if (rc != AGS_GO) {
        Py_CLEAR(*items);
    }
    return rc;
}

/* Merges the popped mapping into the dict `ins->arg` under the top; a
 * repeated key is an error for f(**a, **b) (`merge`), a replacement for
 * {**a, **b}. */
static int
merge(ags_interp *it, ags_frame *f, const ags_instr *ins, int strict)
{
    ags_value other = ags_pop(f);
    ags_value *dict = ags_peek(f, (int)ins->arg);
    PyObject *items = NULL, *key, *value;
    Py_ssize_t pos = 0;
    int rc;

    if (dict->kind != AGS_VK_DICT) {
        rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE, "merging into a %s",
                       AGS_DESCRIBE(dict));
        goto done;
    }
    rc = ags_mapping_items(it, &other, &items);
    while (rc == AGS_GO && PyDict_Next(items, &pos, &key, &value)) {
        int has = strict ? PyDict_Contains(dict->obj, key) : 0;
        if (has < 0) {
            rc = AGS_ERROR;
        }
        else if (has) {
            /* eager raises TypeError: got multiple values for keyword */
            rc = ags_stopf(it, AGS_REASON_BAD_CALL,
                           "keyword argument %R given twice", key);
        }
        else if (strict && !PyUnicode_Check(key)) {
            rc = ags_stopf(it, AGS_REASON_BAD_CALL,
                           "keywords must be strings");
        }
        else if (PyDict_SetItem(dict->obj, key, value) < 0) {
            rc = AGS_ERROR;
        }
    }
done:
    Py_XDECREF(items);
    ags_value_clear(&other);
    return rc;
}

AGS_HANDLER
op_dict_merge(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return merge(it, f, ins, 1);
}

AGS_HANDLER
op_dict_update(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return merge(it, f, ins, 0);
}

/* {k: v for ...}: value on top, key below it, the dict arg below them
 * (once both are popped). */
AGS_HANDLER
op_map_add(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value value = ags_pop(f), key = ags_pop(f);
    ags_value *dict = ags_peek(f, (int)ins->arg);
    PyObject *k = NULL, *v = NULL;
    int rc;

    if (dict->kind != AGS_VK_DICT || key.kind == AGS_VK_TENSOR) {
        rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                       "MAP_ADD of a %s key to a %s", AGS_DESCRIBE(&key),
                       AGS_DESCRIBE(dict));
        goto done;
    }
    k = ags_graph_arg(it, &key);
    v = k ? ags_held_arg(it, &value) : NULL;
    if (v == NULL) {
        rc = PyErr_Occurred() ? AGS_ERROR : AGS_BREAK;
        goto done;
    }
    rc = PyDict_SetItem(dict->obj, k, v) < 0 ? AGS_ERROR : AGS_GO;
done:
    Py_XDECREF(k);
    Py_XDECREF(v);
    ags_value_clear(&key);
    ags_value_clear(&value);
    return rc;
}
