/* describe.c: reading a fused kernel's description (codegen.c's essay says
 * what it holds) into a checked C form, and each value's variance.
 *
 * Everything Python hands in is checked here, once: kinds against the
 * protocol's tables, operands against the values defined before them,
 * reductions only in ROWS kernels and only of floating values (or an
 * integer sum), no output that is a constant.  A bad description is a
 * ValueError or TypeError saying what is wrong, never a kernel that
 * would compute something else.
 */
#include <Python.h>
#include <string.h>

#include "kernel.h"

/* What a type computes in, and its C name there. */
static const char *const storage_names[] = {
#define AGS_X(name, ctype, bytes, doc) ctype,
    AGS_KTYPE_LIST(AGS_X)
#undef AGS_X
};

static const int storage_bytes[] = {
#define AGS_X(name, ctype, bytes, doc) bytes,
    AGS_KTYPE_LIST(AGS_X)
#undef AGS_X
};

ags_kernel_family_t
ags_kernel_family(int t)
{
    switch (t) {
    case AGS_KTYPE_F32: case AGS_KTYPE_F16: case AGS_KTYPE_BF16:
        return FLOAT_LIKE;
    case AGS_KTYPE_F64:
        return DOUBLE_LIKE;
    case AGS_KTYPE_BOOL:
        return BOOL_LIKE;
    default:
        return INT_LIKE;
    }
}

const char *
ags_kernel_compute_name(int t)
{
    switch (ags_kernel_family(t)) {
    case FLOAT_LIKE: return "float";
    case DOUBLE_LIKE: return "double";
    case BOOL_LIKE: return "bool";
    default: return t >= 0 && t < AGS_KTYPE_COUNT ? storage_names[t] : "?";
    }
}

static const int operand_counts[] = {
#define AGS_X(name, operands, doc) operands,
    AGS_KOP_LIST(AGS_X)
#undef AGS_X
};

static const char *const kop_names[] = {
#define AGS_X(name, operands, doc) #name,
    AGS_KOP_LIST(AGS_X)
#undef AGS_X
};

static int
int_item(PyObject *seq, Py_ssize_t i, int lo, int hi, const char *what, int *out)
{
    PyObject *item = PyTuple_GET_ITEM(seq, i);
    long v;

    if (!PyLong_Check(item)) {
        PyErr_Format(PyExc_TypeError, "kernel description: %s must be an int",
                     what);
        return -1;
    }
    v = PyLong_AsLong(item);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v < lo || v >= hi) {
        PyErr_Format(PyExc_ValueError, "kernel description: %s %ld is out of "
                     "range [%d, %d)", what, v, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int
tuple_of(PyObject *obj, Py_ssize_t n, const char *what)
{
    if (!PyTuple_Check(obj) || (n >= 0 && PyTuple_GET_SIZE(obj) != n)) {
        PyErr_Format(PyExc_TypeError, "kernel description: %s must be a tuple"
                     "%s", what, n >= 0 ? " of the documented length" : "");
        return -1;
    }
    if (PyTuple_GET_SIZE(obj) > AGS_KERNEL_MAX_ITEMS) {
        PyErr_Format(PyExc_ValueError, "kernel description: too many %s", what);
        return -1;
    }
    return 0;
}

static int
read_instr(kernel *k, int i, PyObject *row)
{
    instr *op = &k->ops[i];
    PyObject *args, *imm;

    if (tuple_of(row, 4, "an instruction") < 0
        || int_item(row, 0, 0, AGS_KOP_COUNT, "an instruction's kop", &op->kop) < 0
        || int_item(row, 1, 0, AGS_KTYPE_COUNT, "an instruction's type",
                    &op->type) < 0) {
        return -1;
    }
    args = PyTuple_GET_ITEM(row, 2);
    imm = PyTuple_GET_ITEM(row, 3);
    if (tuple_of(args, -1, "an instruction's operands") < 0) {
        return -1;
    }
    op->n = (int)PyTuple_GET_SIZE(args);
    if (op->n != operand_counts[op->kop] + (op->kop == AGS_KOP_LOAD)) {
        PyErr_Format(PyExc_ValueError, "kernel description: %s takes %d "
                     "operand(s), not %d", kop_names[op->kop],
                     operand_counts[op->kop] + (op->kop == AGS_KOP_LOAD), op->n);
        return -1;
    }
    for (int a = 0; a < op->n; a++) {
        int hi = op->kop == AGS_KOP_LOAD ? k->n_in : i;

        if (int_item(args, a, 0, hi, op->kop == AGS_KOP_LOAD
                     ? "a LOAD's input" : "an operand (an earlier value)",
                     &op->args[a]) < 0) {
            return -1;
        }
    }
    op->imm = 0.0;
    if (imm != Py_None) {
        op->imm = PyFloat_AsDouble(imm);
        if (op->imm == -1.0 && PyErr_Occurred()) {
            return -1;
        }
    }
    return 0;
}

/* The description's 8th item, the static length (0: not known): a row's,
 * or a pointwise kernel's element count; and the warp path's longest row
 * from a row's. */
static int
read_cols(PyObject *desc, kernel *k)
{
    PyObject *item;

    k->warp_cols = AGS_NVRTC_WARP_COLS;
    if (PyTuple_GET_SIZE(desc) < 8) {
        return 0;
    }
    item = PyTuple_GET_ITEM(desc, 7);
    if (!PyLong_Check(item)) {
        PyErr_SetString(PyExc_TypeError, "kernel description: the static length "
                        "(a row's, or the element count) must be an int");
        return -1;
    }
    k->cols = PyLong_AsLongLong(item);
    if (k->cols == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (k->cols < 0) {
        PyErr_SetString(PyExc_ValueError, "kernel description: the static length "
                        "(a row's, or the element count) must be 0 or positive");
        return -1;
    }
    if (k->kind == AGS_KKIND_ROWS && k->cols > 0 && k->cols < AGS_NVRTC_WARP_COLS) {
        k->warp_cols = (int)((k->cols + 127) / 128 * 128);
    }
    return 0;
}

static int
read_kernel(PyObject *desc, kernel *k)
{
    PyObject *ins, *ops, *outs, *name;

    memset(k, 0, sizeof(*k));
    if (tuple_of(desc, -1, "the description") < 0) {
        return -1;
    }
    if (PyTuple_GET_SIZE(desc) != 7 && PyTuple_GET_SIZE(desc) != 8) {
        PyErr_SetString(PyExc_TypeError, "kernel description: 7 items, or 8 with "
                        "the row's length");
        return -1;
    }
    name = PyTuple_GET_ITEM(desc, 0);
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "kernel description: the name must be "
                        "a str");
        return -1;
    }
    k->name = PyUnicode_AsUTF8(name);
    if (k->name == NULL) {
        return -1;
    }
    for (const char *c = k->name; *c; c++) {
        if (!(Py_ISALNUM(*c) || *c == '_')) {
            PyErr_SetString(PyExc_ValueError, "kernel description: the name "
                            "must be an identifier");
            return -1;
        }
    }
    if (int_item(desc, 1, 0, AGS_KKIND_COUNT, "the kind", &k->kind) < 0
        || int_item(desc, 2, 0, AGS_KERNEL_MAX_DIMS + 1, "ndim", &k->ndim) < 0
        || int_item(desc, 3, 0, k->ndim + 1, "nred", &k->nred) < 0) {
        return -1;
    }
    if ((k->kind == AGS_KKIND_ROWS) != (k->nred > 0)) {
        PyErr_SetString(PyExc_ValueError, "kernel description: a ROWS kernel "
                        "reduces one dimension or more, a POINTWISE one none");
        return -1;
    }
    if (read_cols(desc, k) < 0) {
        return -1;
    }
    ins = PyTuple_GET_ITEM(desc, 4);
    ops = PyTuple_GET_ITEM(desc, 5);
    outs = PyTuple_GET_ITEM(desc, 6);
    if (tuple_of(ins, -1, "inputs") < 0 || tuple_of(ops, -1, "ops") < 0
        || tuple_of(outs, -1, "outputs") < 0) {
        return -1;
    }
    k->n_in = (int)PyTuple_GET_SIZE(ins);
    k->n_ops = (int)PyTuple_GET_SIZE(ops);
    k->n_out = (int)PyTuple_GET_SIZE(outs);
    if (k->n_out == 0) {
        PyErr_SetString(PyExc_ValueError, "kernel description: no outputs");
        return -1;
    }
    k->in = PyMem_Calloc((size_t)k->n_in + 1, sizeof(operand));
    k->ops = PyMem_Calloc((size_t)k->n_ops + 1, sizeof(instr));
    k->out = PyMem_Calloc((size_t)k->n_out, sizeof(output));
    if (k->in == NULL || k->ops == NULL || k->out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < k->n_in; i++) {
        PyObject *row = PyTuple_GET_ITEM(ins, i);

        if (tuple_of(row, 2, "an input") < 0
            || int_item(row, 0, 0, AGS_KTYPE_COUNT, "an input's type",
                        &k->in[i].type) < 0
            || int_item(row, 1, 0, IN_FLAGS, "an input's strided flag",
                        &k->in[i].strided) < 0) {
            return -1;
        }
        if (k->in[i].strided >= IN_ROW && k->kind != AGS_KKIND_ROWS) {
            PyErr_SetString(PyExc_ValueError, "kernel description: an input read as "
                            "a row or per row (strided flag 2, 3 or 4) in a kernel "
                            "without rows");
            return -1;
        }
    }
    for (int i = 0; i < k->n_ops; i++) {
        if (read_instr(k, i, PyTuple_GET_ITEM(ops, i)) < 0) {
            return -1;
        }
    }
    for (int i = 0; i < k->n_out; i++) {
        PyObject *row = PyTuple_GET_ITEM(outs, i);

        if (tuple_of(row, 3, "an output") < 0
            || int_item(row, 0, 0, k->n_ops, "an output's value",
                        &k->out[i].value) < 0
            || int_item(row, 1, 0, AGS_KTYPE_COUNT, "an output's type",
                        &k->out[i].type) < 0
            || int_item(row, 2, 0, 4, "an output's place",
                        &k->out[i].strided) < 0) {
            return -1;
        }
        if (k->out[i].strided == OUT_COLUMNS && (k->kind != AGS_KKIND_ROWS
                || (k->out[i].type != AGS_KTYPE_F32 && k->out[i].type != AGS_KTYPE_F64))) {
            PyErr_SetString(PyExc_ValueError, "kernel description: column sums "
                            "(an output's place 2) need a ROWS kernel and a "
                            "float32 or float64 output");
            return -1;
        }
        if (k->out[i].strided == OUT_ROW && k->kind != AGS_KKIND_ROWS) {
            PyErr_SetString(PyExc_ValueError, "kernel description: an output "
                            "written once a row (place 3) in a kernel without rows");
            return -1;
        }
    }
    return 0;
}

void
ags_kernel_free(kernel *k)
{
    PyMem_Free(k->in);
    PyMem_Free(k->ops);
    PyMem_Free(k->out);
}

int
ags_kernel_column_outputs(const kernel *k)
{
    int n = 0;

    for (int i = 0; i < k->n_out; i++) {
        n += k->out[i].strided == OUT_COLUMNS;
    }
    return n;
}

int
ags_kernel_element_output(const kernel *k, int o)
{
    return k->out[o].strided == OUT_CONTIGUOUS || k->out[o].strided == OUT_STRIDED;
}

int
ags_kernel_is_reduction(int kop)
{
    return kop == AGS_KOP_SUM || kop == AGS_KOP_AMAX || kop == AGS_KOP_AMIN;
}

/* Each value's variance, and the checks that need it. */
static int
classify(kernel *k)
{
    for (int i = 0; i < k->n_ops; i++) {
        instr *op = &k->ops[i];
        int v = UNIFORM;

        if (op->kop == AGS_KOP_LOAD) {
            int flag = k->in[op->args[0]].strided;

            v = flag == IN_PER_ROW || flag == IN_ROW_STRIDED ? PER_ROW : PER_ELEMENT;
        }
        else if (op->kop != AGS_KOP_CONST) {
            for (int a = 0; a < op->n; a++) {
                int va = k->ops[op->args[a]].variance;
                v = va > v ? va : v;
            }
        }
        if (ags_kernel_is_reduction(op->kop)) {
            if (k->kind != AGS_KKIND_ROWS) {
                PyErr_Format(PyExc_ValueError, "kernel description: %s in a "
                             "POINTWISE kernel", kop_names[op->kop]);
                return -1;
            }
            if (ags_kernel_family(op->type) == BOOL_LIKE
                || (ags_kernel_family(op->type) == INT_LIKE && op->kop != AGS_KOP_SUM)) {
                PyErr_Format(PyExc_ValueError, "kernel description: %s of %s "
                             "values", kop_names[op->kop],
                             storage_names[op->type]);
                return -1;
            }
            v = PER_ROW;
        }
        op->variance = v;
    }
    for (int i = 0; i < k->n_out; i++) {
        if (k->ops[k->out[i].value].variance == UNIFORM) {
            PyErr_SetString(PyExc_ValueError, "kernel description: an output "
                            "that is a constant");
            return -1;
        }
        if (k->out[i].strided == OUT_COLUMNS
            && k->ops[k->out[i].value].variance != PER_ELEMENT) {
            PyErr_SetString(PyExc_ValueError, "kernel description: column sums "
                            "of a value that is not an element value");
            return -1;
        }
        if (k->out[i].strided == OUT_ROW
            && k->ops[k->out[i].value].variance != PER_ROW) {
            PyErr_SetString(PyExc_ValueError, "kernel description: an output "
                            "written once a row whose value varies along the row");
            return -1;
        }
    }
    return 0;
}


const char *
ags_kernel_storage_name(int t)
{
    return t >= 0 && t < AGS_KTYPE_COUNT ? storage_names[t] : "?";
}

int
ags_kernel_storage_bytes(int t)
{
    return t >= 0 && t < AGS_KTYPE_COUNT ? storage_bytes[t] : 0;
}

const char *
ags_kernel_kop_name(int kop)
{
    return kop >= 0 && kop < AGS_KOP_COUNT ? kop_names[kop] : "?";
}

int
ags_kernel_read(PyObject *desc, kernel *k)
{
    return read_kernel(desc, k) < 0 || classify(k) < 0 ? -1 : 0;
}
