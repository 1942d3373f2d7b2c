/* protocol.c: the tables of protocol.h, named for C and exported to Python.
 *
 * Rows are named in C by their upper-case X-macro name; C messages and
 * sources use the lower-case form, made once at module init (the
 * preprocessor cannot lower a name).  PROTOCOL, the export, maps each
 * table's name to its rows, each (name, value, columns...): the shape
 * agspeed/protocol.py turns into IntEnums.
 */
#include "protocol.h"
#include <ctype.h>
#include <string.h>

#define AGS_NAME_ROW(name, ...) #name,

static const char *const reason_upper[] = {
    AGS_REASON_LIST(AGS_NAME_ROW)
};
static const char *const load_upper[] = {
    AGS_LOAD_LIST(AGS_NAME_ROW)
};
static const char *const bop_upper[] = {
    AGS_BUILDER_OP_LIST(AGS_NAME_ROW)
};

const char *ags_reason_names[AGS_REASON_COUNT];
const char *ags_load_names[AGS_LOAD_COUNT];
const char *ags_bop_names[AGS_BOP_COUNT];

const char *const ags_compare_ops[] = {
#define AGS_X(name, op, doc) op,
    AGS_COMPARE_LIST(AGS_X)
#undef AGS_X
};

const int ags_sop_immediates[] = {
#define AGS_X(name, imm, doc) imm,
    AGS_SOP_LIST(AGS_X)
#undef AGS_X
};

/* Every lower-case name, back to back; sized by the longest tables. */
static char lower_store[4096];

static void
lower_all(const char *const *upper, const char **out, int n, size_t *used)
{
    for (int i = 0; i < n; i++) {
        size_t len = strlen(upper[i]);
        char *dst = lower_store + *used;

        assert(*used + len + 1 <= sizeof(lower_store));
        for (size_t k = 0; k < len; k++) {
            dst[k] = (char)tolower((unsigned char)upper[i][k]);
        }
        dst[len] = '\0';
        out[i] = dst;
        *used += len + 1;
    }
}

void
ags_protocol_init(void)
{
    size_t used = 0;

    if (ags_reason_names[0] != NULL) {
        return;
    }
    lower_all(reason_upper, ags_reason_names, AGS_REASON_COUNT, &used);
    lower_all(load_upper, ags_load_names, AGS_LOAD_COUNT, &used);
    lower_all(bop_upper, ags_bop_names, AGS_BOP_COUNT, &used);
}

/* Appends one row (name, value, columns...) built by Py_BuildValue. */
static int
add_row(PyObject *rows, PyObject *row)
{
    int rc;

    if (row == NULL) {
        return -1;
    }
    rc = PyList_Append(rows, row);
    Py_DECREF(row);
    return rc;
}

/* Adds `rows` (a list, stolen) to `tables` as a tuple under `name`. */
static int
add_table(PyObject *tables, const char *name, PyObject *rows)
{
    PyObject *tuple;
    int rc;

    if (rows == NULL) {
        return -1;
    }
    tuple = PyList_AsTuple(rows);
    Py_DECREF(rows);
    if (tuple == NULL) {
        return -1;
    }
    rc = PyDict_SetItemString(tables, name, tuple);
    Py_DECREF(tuple);
    return rc;
}

/* The rows of the plain tables, X(NAME, "meaning"). */
#define AGS_PLAIN_TABLE(key, P, LIST) \
    do { \
        PyObject *rows = PyList_New(0); \
        int v = 0; \
        if (rows == NULL) goto error; \
        LIST(AGS_PLAIN_ROW) \
        (void)v; \
        if (add_table(tables, key, rows) < 0) goto error; \
    } while (0)
#define AGS_PLAIN_ROW(name, doc) \
    if (add_row(rows, Py_BuildValue("(sis)", #name, v++, doc)) < 0) { \
        Py_DECREF(rows); \
        goto error; \
    }

int
ags_protocol_export(PyObject *module)
{
    PyObject *tables = PyDict_New();
    PyObject *rows;
    int v;

    if (tables == NULL) {
        return -1;
    }
    AGS_PLAIN_TABLE("action", ACTION, AGS_ACTION_LIST);
    AGS_PLAIN_TABLE("builder_op", BOP, AGS_BUILDER_OP_LIST);
    AGS_PLAIN_TABLE("plan", PLAN, AGS_PLAN_LIST);
    AGS_PLAIN_TABLE("attr", ATTR, AGS_ATTR_LIST);
    AGS_PLAIN_TABLE("bind", BIND, AGS_BIND_LIST);
    AGS_PLAIN_TABLE("load", LOAD, AGS_LOAD_LIST);
    AGS_PLAIN_TABLE("check", CHECK, AGS_CHECK_LIST);
    AGS_PLAIN_TABLE("part", PART, AGS_PART_LIST);

    rows = PyList_New(0);
    v = 0;
    if (rows == NULL) {
        goto error;
    }
#define AGS_X(name, what, hint) \
    if (add_row(rows, Py_BuildValue("(siss)", #name, v++, what, hint)) < 0) { \
        Py_DECREF(rows); \
        goto error; \
    }
    AGS_REASON_LIST(AGS_X)
#undef AGS_X
    if (add_table(tables, "reason", rows) < 0) {
        goto error;
    }

    rows = PyList_New(0);
    v = 0;
    if (rows == NULL) {
        goto error;
    }
#define AGS_X(name, op, doc) \
    if (add_row(rows, Py_BuildValue("(siss)", #name, v++, op, doc)) < 0) { \
        Py_DECREF(rows); \
        goto error; \
    }
    AGS_COMPARE_LIST(AGS_X)
#undef AGS_X
    if (add_table(tables, "compare", rows) < 0) {
        goto error;
    }

    rows = PyList_New(0);
    if (rows == NULL) {
        goto error;
    }
#define AGS_X(name, bit, doc) \
    if (add_row(rows, Py_BuildValue("(sis)", #name, bit, doc)) < 0) { \
        Py_DECREF(rows); \
        goto error; \
    }
    AGS_GFLAG_LIST(AGS_X)
#undef AGS_X
    if (add_table(tables, "guard_flag", rows) < 0) {
        goto error;
    }

    rows = PyList_New(0);
    v = 0;
    if (rows == NULL) {
        goto error;
    }
#define AGS_X(name, imm, doc) \
    if (add_row(rows, Py_BuildValue("(siis)", #name, v++, imm, doc)) < 0) { \
        Py_DECREF(rows); \
        goto error; \
    }
    AGS_SOP_LIST(AGS_X)
#undef AGS_X
    if (add_table(tables, "size_op", rows) < 0) {
        goto error;
    }

    if (PyModule_AddObjectRef(module, "PROTOCOL", tables) < 0) {
        goto error;
    }
    Py_DECREF(tables);
    return 0;
error:
    Py_DECREF(tables);
    return -1;
}

int
ags_protocol_kind(PyObject *obj, int count, const char *table, int *out)
{
    long v;

    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "agspeed protocol: a %s kind must be an "
                     "int (agspeed.protocol), not %.100s", table,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v < 0 || v >= count) {
        PyErr_Format(PyExc_ValueError, "agspeed protocol: unknown %s kind %ld "
                     "(there are %d)", table, v, count);
        return -1;
    }
    *out = (int)v;
    return 0;
}
