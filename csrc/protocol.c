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

static const char *const load_upper[] = {
    AGS_LOAD_LIST(AGS_NAME_ROW)
};
static const char *const bop_upper[] = {
    AGS_BUILDER_OP_LIST(AGS_NAME_ROW)
};

const char *ags_load_names[AGS_LOAD_COUNT];
const char *ags_bop_names[AGS_BOP_COUNT];

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

    if (ags_load_names[0] != NULL) {
        return;
    }
    lower_all(load_upper, ags_load_names, AGS_LOAD_COUNT, &used);
    lower_all(bop_upper, ags_bop_names, AGS_BOP_COUNT, &used);
}

/* Appends `row` (stolen; NULL: an error is set) to `rows`.  0 or -1. */
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

/* Sets tables[name] to the tuple of `rows` (stolen; NULL: an error is
 * set).  0 or -1. */
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

/* How each table's X-macro row becomes (name, value, columns...): ROW_FMT
 * is its Py_BuildValue format and ROW its arguments; `v` counts the rows
 * (a row's value is its index, but for flags, which are bits). */
#define ROW_PLAIN(name, doc) #name, v++, doc
#define ROW_TWO_TEXTS(name, a, b) #name, v++, a, b
#define ROW_FLAG(name, bit, doc) #name, bit, doc
#define ROW_SIZE_OP(name, imm, doc) #name, v++, imm, doc
#define ROW_KTYPE(name, ctype, bytes, doc) #name, v++, ctype, bytes, doc

#define ROW_EXPORT(...) \
    if (ok && add_row(rows, Py_BuildValue(ROW_FMT, ROW(__VA_ARGS__))) < 0) { \
        ok = 0; \
    }
#define TABLE_EXPORT(key, LIST) \
    do { \
        PyObject *rows = PyList_New(0); \
        int v = 0, ok = rows != NULL; \
        LIST(ROW_EXPORT) \
        (void)v; \
        if (!ok) { \
            Py_XDECREF(rows); \
            goto error; \
        } \
        if (add_table(tables, key, rows) < 0) { \
            goto error; \
        } \
    } while (0)

int
ags_protocol_export(PyObject *module)
{
    PyObject *tables = PyDict_New();

    if (tables == NULL) {
        return -1;
    }
#define ROW_FMT "(sis)"
#define ROW ROW_PLAIN
    TABLE_EXPORT("action", AGS_ACTION_LIST);
    TABLE_EXPORT("builder_op", AGS_BUILDER_OP_LIST);
    TABLE_EXPORT("plan", AGS_PLAN_LIST);
    TABLE_EXPORT("attr", AGS_ATTR_LIST);
    TABLE_EXPORT("bind", AGS_BIND_LIST);
    TABLE_EXPORT("load", AGS_LOAD_LIST);
    TABLE_EXPORT("check", AGS_CHECK_LIST);
    TABLE_EXPORT("part", AGS_PART_LIST);
    TABLE_EXPORT("kernel_kind", AGS_KKIND_LIST);
#undef ROW
#define ROW ROW_FLAG
    TABLE_EXPORT("guard_flag", AGS_GFLAG_LIST);
#undef ROW
#undef ROW_FMT
#define ROW_FMT "(siss)"
#define ROW ROW_TWO_TEXTS
    TABLE_EXPORT("reason", AGS_REASON_LIST);
    TABLE_EXPORT("compare", AGS_COMPARE_LIST);
#undef ROW
#undef ROW_FMT
#define ROW_FMT "(siis)"
#define ROW ROW_SIZE_OP
    TABLE_EXPORT("size_op", AGS_SOP_LIST);
    TABLE_EXPORT("kernel_op", AGS_KOP_LIST);  /* (operands, meaning) */
#undef ROW
#undef ROW_FMT
#define ROW_FMT "(sisis)"
#define ROW ROW_KTYPE
    TABLE_EXPORT("kernel_type", AGS_KTYPE_LIST);
#undef ROW
#undef ROW_FMT
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
