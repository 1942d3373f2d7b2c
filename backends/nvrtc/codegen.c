/* codegen.c: CUDA C for one fused kernel, from its description.
 *
 * The partitioner (backends/nvrtc/partition.py) finds the fusible groups of
 * an aten graph and writes each as a description: a tuple that names the
 * kernel, its iteration space and its instructions (protocol.h's KOP
 * table), nothing of torch.  describe.c reads and checks a description;
 * this file turns it into the source of one `extern "C" __global__`
 * function (its body in codegen_pointwise.c or codegen_rows.c, sharing
 * codegen.h; a row kernel whose row length is not told comes with a second
 * one, <name>_block, for long rows: put_row_functions); NVRTC compiles it
 * (driver.c).
 *
 *   (name, kind, ndim, nred, inputs, ops, outputs[, cols])
 *     kind     KKIND: POINTWISE (one thread per element of an ndim-sized
 *              space, in a grid-stride loop) or ROWS (the last nred
 *              dimensions are reduced, a row being the elements that share
 *              the leading ndim - nred indices: one warp per row up to
 *              AGS_NVRTC_WARP_COLS elements, one block per row beyond)
 *     inputs   ((ktype, strided), ...): storage type of each input; a
 *              strided one (1) is read at sum(index[d] * stride[d]) with
 *              the strides passed in (0 for a broadcast dimension), a row
 *              (2, ROWS kernels) at the element's index within its row
 *              (the same values for every row, contiguous along it: a
 *              norm's weight), a per-row one (3, ROWS kernels) once a row
 *              at the row's index (a saved row statistic: a row value), a
 *              row-strided one (4, ROWS kernels; the same along every
 *              reduced dimension) once a row at sum(index[d] * stride[d])
 *              over the rows' dimensions, their strides alone passed in (a
 *              row value too), another (0) at the element's linear index
 *              (contiguous in the space)
 *     ops      ((kop, ktype, (operand, ...), immediate), ...): instruction
 *              i defines value v<i> of the type ktype computes in
 *     outputs  ((value, ktype, place), ...): stored in that storage
 *              type, where the place says: at each element (0, at its
 *              linear index; 1, through strides passed in), whatever the
 *              value's variance (a row value is written at every element
 *              of its row); in a ROWS kernel, once a row at the row's
 *              index (3: a row value, that is a reduction and what follows
 *              from it alone), or summed over the rows (2, column sums of
 *              an element value: each of nslot row slots adds its rows
 *              into its own row of an (nslot, cols) array of float or
 *              double, the caller sums the slots)
 *     cols     optional, where the sizes are static (else 0): in a
 *              POINTWISE kernel the element count, which says whether its
 *              indices fit 32-bit divisions; in a ROWS kernel the row's
 *              length.  The warp path is then made for rows of up
 *              to that length rounded up to 128 (each lane's register
 *              arrays and unrolled loops that long, no longer), or left out
 *              where it is past AGS_NVRTC_WARP_COLS, and the kernel is one
 *              function (put_row_functions).  Only the code's size and
 *              speed depend on it: rows of any length still take a path
 *              that handles them (the block path past the warp path's).
 *
 * The kernel's parameters, in order: the inputs' pointers, the outputs'
 * pointers, the space's sizes (n0.., long long), then ndim strides for
 * each strided input (flag 1), then for each strided output, then, where
 * there are column sums, nslot.  Sizes are run-time values, so one kernel
 * serves every size of its space.
 *
 * Values and their variance.  A CONST, or an instruction of constants
 * only, is computed once per thread before any loop; a LOAD and whatever
 * depends on one varies per element; a reduction, and what depends only on
 * reductions and constants, is a row value.  A ROWS kernel makes one pass
 * over a row per reduction, computing in it the element values that
 * reduction needs, combines the partials of the row's threads (a warp's
 * shuffles for a short row, with the values later passes read kept in
 * registers; shuffles and shared memory across a block for a long one,
 * recomputing: codegen_rows.c), then computes the row values that have
 * become known; a last pass computes and stores the element outputs.
 * Reductions accumulate in their type: float for every floating storage
 * type but double.
 *
 * The same source compiles as host C++ when AGS_HOST is defined (the test
 * harness's shim supplies threadIdx and friends and the conversions), so
 * the kernels' arithmetic and index math are checked against torch on a
 * machine without a GPU, one thread per block.
 */
#include <Python.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "codegen.h"
#include "kernel.h"
#include "nvrtc.h"

/* Each instruction's expression per family: $0.. are its operands, $T the
 * type it computes in.  NULL: not defined for that family (a ValueError). */
typedef struct {
    const char *f;      /* float */
    const char *d;      /* double */
    const char *i;      /* integers and bool */
} op_template;

static const op_template templates[AGS_KOP_COUNT] = {
    [AGS_KOP_NEG] = {"(-$0)", "(-$0)", "(-$0)"},
    [AGS_KOP_ABS] = {"fabsf($0)", "fabs($0)", "($0 < 0 ? -$0 : $0)"},
    [AGS_KOP_EXP] = {"expf($0)", "exp($0)", NULL},
    [AGS_KOP_LOG] = {"logf($0)", "log($0)", NULL},
    [AGS_KOP_LOG1P] = {"log1pf($0)", "log1p($0)", NULL},
    [AGS_KOP_EXPM1] = {"expm1f($0)", "expm1($0)", NULL},
    [AGS_KOP_SQRT] = {"sqrtf($0)", "sqrt($0)", NULL},
    [AGS_KOP_RSQRT] = {"rsqrtf($0)", "rsqrt($0)", NULL},
    [AGS_KOP_RECIPROCAL] = {"(1.0f / $0)", "(1.0 / $0)", NULL},
    [AGS_KOP_TANH] = {"tanhf($0)", "tanh($0)", NULL},
    [AGS_KOP_SIGMOID] = {"(1.0f / (1.0f + expf(-$0)))",
                         "(1.0 / (1.0 + exp(-$0)))", NULL},
    [AGS_KOP_ERF] = {"erff($0)", "erf($0)", NULL},
    [AGS_KOP_SIN] = {"sinf($0)", "sin($0)", NULL},
    [AGS_KOP_COS] = {"cosf($0)", "cos($0)", NULL},
    [AGS_KOP_FLOOR] = {"floorf($0)", "floor($0)", "$0"},
    [AGS_KOP_CEIL] = {"ceilf($0)", "ceil($0)", "$0"},
    [AGS_KOP_TRUNC] = {"truncf($0)", "trunc($0)", "$0"},
    [AGS_KOP_SIGN] = {"($0 > ($T)0 ? ($T)1 : ($0 < ($T)0 ? ($T)-1 : $0))",
                      "($0 > ($T)0 ? ($T)1 : ($0 < ($T)0 ? ($T)-1 : $0))",
                      "(($T)(($0 > 0) - ($0 < 0)))"},
    [AGS_KOP_RELU] = {"($0 <= ($T)0 ? ($T)0 : $0)", "($0 <= ($T)0 ? ($T)0 : $0)",
                      "($0 <= ($T)0 ? ($T)0 : $0)"},
    [AGS_KOP_NOT] = {"(!$0)", "(!$0)", "(!$0)"},
    [AGS_KOP_ISNAN] = {"($0 != $0)", "($0 != $0)", "($0 != $0)"},
    [AGS_KOP_ADD] = {"($0 + $1)", "($0 + $1)", "($0 + $1)"},
    [AGS_KOP_SUB] = {"($0 - $1)", "($0 - $1)", "($0 - $1)"},
    [AGS_KOP_MUL] = {"($0 * $1)", "($0 * $1)", "($0 * $1)"},
    [AGS_KOP_DIV] = {"($0 / $1)", "($0 / $1)", NULL},
    [AGS_KOP_POW] = {"powf($0, $1)", "pow($0, $1)", NULL},
    [AGS_KOP_MAX] = {"(($0 != $0 || $0 > $1) ? $0 : $1)",
                     "(($0 != $0 || $0 > $1) ? $0 : $1)", "($0 > $1 ? $0 : $1)"},
    [AGS_KOP_MIN] = {"(($0 != $0 || $0 < $1) ? $0 : $1)",
                     "(($0 != $0 || $0 < $1) ? $0 : $1)", "($0 < $1 ? $0 : $1)"},
    [AGS_KOP_EQ] = {"($0 == $1)", "($0 == $1)", "($0 == $1)"},
    [AGS_KOP_NE] = {"($0 != $1)", "($0 != $1)", "($0 != $1)"},
    [AGS_KOP_LT] = {"($0 < $1)", "($0 < $1)", "($0 < $1)"},
    [AGS_KOP_LE] = {"($0 <= $1)", "($0 <= $1)", "($0 <= $1)"},
    [AGS_KOP_GT] = {"($0 > $1)", "($0 > $1)", "($0 > $1)"},
    [AGS_KOP_GE] = {"($0 >= $1)", "($0 >= $1)", "($0 >= $1)"},
    [AGS_KOP_AND] = {"($0 && $1)", "($0 && $1)", "($0 && $1)"},
    [AGS_KOP_OR] = {"($0 || $1)", "($0 || $1)", "($0 || $1)"},
    [AGS_KOP_WHERE] = {"($0 ? $1 : $2)", "($0 ? $1 : $2)", "($0 ? $1 : $2)"},
};

/* ---- a growing text buffer (codegen.h) --------------------------------- */

void
ags_cg_put(text *t, const char *fmt, ...)
{
    va_list ap;
    int need;

    if (t->failed) {
        return;
    }
    va_start(ap, fmt);
    need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0) {
        t->failed = 1;
        return;
    }
    if (t->len + (size_t)need + 1 > t->cap) {
        size_t cap = (t->cap ? t->cap : 4096);
        char *grown;

        while (cap < t->len + (size_t)need + 1) {
            cap *= 2;
        }
        grown = PyMem_Realloc(t->data, cap);
        if (grown == NULL) {
            t->failed = 1;
            return;
        }
        t->data = grown;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->data + t->len, (size_t)need + 1, fmt, ap);
    va_end(ap);
    t->len += (size_t)need;
}

/* ---- emitting ---------------------------------------------------------- */

/* The literal of `x` in type `t`: exact for every double. */
void
ags_cg_put_number(text *t, int type, double x)
{
    switch (ags_kernel_family(type)) {
    case BOOL_LIKE:
        ags_cg_put(t, "%s", x != 0.0 ? "true" : "false");
        return;
    case INT_LIKE:
        ags_cg_put(t, "((%s)%.0f)", ags_kernel_storage_name(type), x);
        return;
    default:
        if (isfinite(x)) {
            ags_cg_put(t, "((%s)%a)", ags_kernel_compute_name(type), x);
        }
        else {
            unsigned long long bits;

            memcpy(&bits, &x, sizeof bits);
            ags_cg_put(t, "((%s)ags_f64_bits(0x%llxULL))", ags_kernel_compute_name(type), bits);
        }
    }
}

/* The offset of the current element in an operand: `i` when contiguous,
 * else the dot product of the indices of its first `ndim` dimensions with
 * its strides `<prefix>_d`. */
static void
put_offset(text *t, int ndim, int strided, const char *prefix)
{
    if (!strided) {
        ags_cg_put(t, "i");
        return;
    }
    ags_cg_put(t, "(");
    for (int d = 0; d < ndim; d++) {
        ags_cg_put(t, "%si%d * %s_%d", d ? " + " : "", d, prefix, d);
    }
    if (ndim == 0) {
        ags_cg_put(t, "0");
    }
    ags_cg_put(t, ")");
}

/* How many of the space's dimensions input i's strides cover: all, the
 * rows' alone (read once a row through them), or none. */
int
ags_cg_input_strides(const kernel *k, int i)
{
    switch (k->in[i].strided) {
    case IN_STRIDED: return k->ndim;
    case IN_ROW_STRIDED: return k->ndim - k->nred;
    default: return 0;
    }
}

/* The field of the vector step's lane text.lane: .x to .w of CUDA's vectors
 * of 4, .v[l] of agspeed's of 8 (the prelude's). */
static void
put_lane(text *t)
{
    if (t->width == 4) {
        ags_cg_put(t, ".%c", "xyzw"[t->lane]);
    }
    else {
        ags_cg_put(t, ".v[%d]", t->lane);
    }
}

static void
put_load(text *t, const kernel *k, const instr *op)
{
    int src = op->args[0];
    int st = k->in[src].type;
    char prefix[32];

    snprintf(prefix, sizeof prefix, "si%d", src);
    ags_cg_put(t, "(%s)", ags_kernel_compute_name(op->type));
    if (t->lane >= 0 && ags_cg_vector_input(k, src)) {
        const char *conv = st == AGS_KTYPE_F16 ? "ags_from_f16"
                           : st == AGS_KTYPE_BF16 ? "ags_from_bf16" : "";

        ags_cg_put(t, "%s(a%d", conv, src);
        put_lane(t);
        ags_cg_put(t, ")");
        return;
    }
    if (st == AGS_KTYPE_F16) {
        ags_cg_put(t, "ags_from_f16(in%d[", src);
    }
    else if (st == AGS_KTYPE_BF16) {
        ags_cg_put(t, "ags_from_bf16(in%d[", src);
    }
    else {
        ags_cg_put(t, "(in%d[", src);
    }
    if (k->in[src].strided == IN_ROW) {
        ags_cg_put(t, "c");     /* the element's index within its row */
    }
    else if (k->in[src].strided == IN_PER_ROW) {
        ags_cg_put(t, "row");   /* the row's own value */
    }
    else {
        put_offset(t, ags_cg_input_strides(k, src), k->in[src].strided, prefix);
    }
    ags_cg_put(t, "])");
}

int
ags_cg_put_instr(text *t, const kernel *k, int i)
{
    const instr *op = &k->ops[i];
    const op_template *tpl = &templates[op->kop];
    const char *form;
    ags_kernel_family_t fam = ags_kernel_family(op->type);

    ags_cg_put(t, "%s v%d = ", ags_kernel_compute_name(op->type), i);
    switch (op->kop) {
    case AGS_KOP_LOAD:
        put_load(t, k, op);
        ags_cg_put(t, ";\n");
        return 0;
    case AGS_KOP_CONST:
        ags_cg_put_number(t, op->type, op->imm);
        ags_cg_put(t, ";\n");
        return 0;
    case AGS_KOP_CAST:
        if (fam == BOOL_LIKE) {
            ags_cg_put(t, "(v%d != 0);\n", op->args[0]);
        }
        else if (op->type == AGS_KTYPE_F16 || op->type == AGS_KTYPE_BF16) {
            /* rounded to the narrow type, as eager's tensor of it would be */
            const char *w = op->type == AGS_KTYPE_F16 ? "f16" : "bf16";

            ags_cg_put(t, "ags_from_%s(ags_to_%s((float)v%d));\n", w, w, op->args[0]);
        }
        else {
            ags_cg_put(t, "(%s)v%d;\n", ags_kernel_compute_name(op->type), op->args[0]);
        }
        return 0;
    default:
        break;
    }
    form = fam == FLOAT_LIKE ? tpl->f : fam == DOUBLE_LIKE ? tpl->d : tpl->i;
    /* comparisons and logic take their operands' family, not the result's */
    if (op->n > 0 && (fam == BOOL_LIKE) && form != NULL) {
        ags_kernel_family_t fa = ags_kernel_family(k->ops[op->args[0]].type);
        form = fa == FLOAT_LIKE ? tpl->f : fa == DOUBLE_LIKE ? tpl->d : tpl->i;
    }
    if (form == NULL) {
        PyErr_Format(PyExc_ValueError, "kernel description: %s is not defined "
                     "on %s values", ags_kernel_kop_name(op->kop),
                     ags_kernel_storage_name(op->type));
        return -1;
    }
    for (const char *c = form; *c; c++) {
        if (c[0] == '$' && c[1] >= '0' && c[1] <= '2') {
            ags_cg_put(t, "v%d", op->args[c[1] - '0']);
            c++;
        }
        else if (c[0] == '$' && c[1] == 'T') {
            ags_cg_put(t, "%s", ags_kernel_compute_name(op->type));
            c++;
        }
        else {
            ags_cg_put(t, "%c", *c);
        }
    }
    ags_cg_put(t, ";\n");
    return 0;
}

void
ags_cg_put_store(text *t, const kernel *k, int o)
{
    const output *out = &k->out[o];
    char prefix[32];

    snprintf(prefix, sizeof prefix, "so%d", o);
    if (t->lane >= 0 && !out->strided) {
        ags_cg_put(t, "o%d", o);
        put_lane(t);
        if (out->type == AGS_KTYPE_F16 || out->type == AGS_KTYPE_BF16) {
            ags_cg_put(t, " = ags_to_%s((float)v%d);\n",
                out->type == AGS_KTYPE_F16 ? "f16" : "bf16", out->value);
        }
        else if (out->type == AGS_KTYPE_BOOL) {
            ags_cg_put(t, " = (unsigned char)(v%d != 0);\n", out->value);
        }
        else {
            ags_cg_put(t, " = (%s)v%d;\n", ags_kernel_storage_name(out->type), out->value);
        }
        return;
    }
    ags_cg_put(t, "out%d[", o);
    if (out->strided == OUT_ROW) {     /* contiguous, at the row's index */
        ags_cg_put(t, "row");
    }
    else {
        put_offset(t, k->ndim, out->strided, prefix);
    }
    if (out->type == AGS_KTYPE_F16) {
        ags_cg_put(t, "] = ags_to_f16((float)v%d);\n", out->value);
    }
    else if (out->type == AGS_KTYPE_BF16) {
        ags_cg_put(t, "] = ags_to_bf16((float)v%d);\n", out->value);
    }
    else {
        ags_cg_put(t, "] = (%s)v%d;\n", ags_kernel_storage_name(out->type),
            out->value);
    }
}

/* The kernel's parameters, declared (`decl`) or passed on by name. */
static void
put_params(text *t, const kernel *k, int decl)
{
    const char *ll = decl ? "long long " : "";

    for (int i = 0; i < k->n_in; i++) {
        ags_cg_put(t, "%s", i ? ", " : "");
        if (decl) {
            ags_cg_put(t, "const %s *__restrict__ ", ags_kernel_storage_name(k->in[i].type));
        }
        ags_cg_put(t, "in%d", i);
    }
    for (int i = 0; i < k->n_out; i++) {
        ags_cg_put(t, "%s", k->n_in + i ? ", " : "");
        if (decl) {
            ags_cg_put(t, "%s *__restrict__ ", ags_kernel_storage_name(k->out[i].type));
        }
        ags_cg_put(t, "out%d", i);
    }
    for (int d = 0; d < k->ndim; d++) {
        ags_cg_put(t, ", %sn%d", ll, d);
    }
    for (int i = 0; i < k->n_in; i++) {
        for (int d = 0; d < ags_cg_input_strides(k, i); d++) {
            ags_cg_put(t, ", %ssi%d_%d", ll, i, d);
        }
    }
    for (int i = 0; i < k->n_out; i++) {
        for (int d = 0; k->out[i].strided == OUT_STRIDED && d < k->ndim; d++) {
            ags_cg_put(t, ", %sso%d_%d", ll, i, d);
        }
    }
    if (ags_kernel_column_outputs(k)) {
        ags_cg_put(t, ", %snslot", ll);
    }
}

/* A function of the kernel: `head`, its name followed by `suffix`, its
 * parameters; the body opened. */
static void
put_signature(text *t, const kernel *k, const char *head, const char *suffix)
{
    ags_cg_put(t, "%s %s%s(", head, k->name, suffix);
    put_params(t, k, 1);
    ags_cg_put(t, ")\n{\n");
}

int
ags_cg_any_strided(const kernel *k)
{
    for (int i = 0; i < k->n_in; i++) {
        if (k->in[i].strided == IN_STRIDED) {
            return 1;
        }
    }
    for (int i = 0; i < k->n_out; i++) {
        if (k->out[i].strided == OUT_STRIDED) {
            return 1;
        }
    }
    return 0;
}

static void
put_divisions(text *t, int lo, int hi, const char *var, const char *q, const char *decl)
{
    ags_cg_put(t, "%s q_ = (%s)%s;\n", q, q, var);
    for (int d = hi - 1; d > lo; d--) {
        ags_cg_put(t, "%si%d = q_ %% (%s)n%d; q_ /= (%s)n%d;\n", decl, d, q, d, q, d);
    }
    ags_cg_put(t, "%si%d = q_;\n", decl, lo);
}

/* Declares i<lo>..i<hi-1>, the indices of `var` over those dimensions
 * (the last one varying fastest).  The divisions are 32-bit ones where
 * `narrow` is "1" (var is below 2^32), 64-bit ones where it is NULL, and
 * either where it is a condition that says var is below 2^32 (the same on
 * every thread: no divergence; both forms are a few lines).  A 32-bit
 * division is about twenty instructions; a 64-bit one calls a routine of
 * about a hundred, which a kernel reading a strided operand ran at every
 * element, and which, unrolled, was much of a row kernel's compile. */
void
ags_cg_put_indices(text *t, int lo, int hi, const char *var, const char *narrow)
{
    if (hi <= lo) {
        return;
    }
    if (narrow == NULL || strcmp(narrow, "1") == 0) {
        put_divisions(t, lo, hi, var, narrow ? "unsigned int" : "long long",
                      "const long long ");
        return;
    }
    ags_cg_put(t, "long long i%d", lo);
    for (int d = lo + 1; d < hi; d++) {
        ags_cg_put(t, ", i%d", d);
    }
    ags_cg_put(t, ";\nif (%s) {\n", narrow);
    put_divisions(t, lo, hi, var, "unsigned int", "");
    ags_cg_put(t, "}\nelse {\n");
    put_divisions(t, lo, hi, var, "long long", "");
    ags_cg_put(t, "}\n");
}

/* Marks in `need` the element values that value `v` needs (itself
 * included), stopping at values that are not per element. */
void
ags_cg_mark_cone(const kernel *k, int v, char *need, const char *stop)
{
    const instr *op = &k->ops[v];

    if (op->variance != PER_ELEMENT || need[v]) {
        return;
    }
    need[v] = 1;
    if (stop != NULL && stop[v]) {
        return;
    }
    for (int a = 0; a < op->n && op->kop != AGS_KOP_LOAD; a++) {
        ags_cg_mark_cone(k, op->args[a], need, stop);
    }
}

int
ags_cg_put_marked(text *t, const kernel *k, const char *need)
{
    for (int i = 0; i < k->n_ops; i++) {
        if (need[i] && ags_cg_put_instr(t, k, i) < 0) {
            return -1;
        }
    }
    return 0;
}

int
ags_cg_put_uniforms(text *t, const kernel *k)
{
    for (int i = 0; i < k->n_ops; i++) {
        if (k->ops[i].variance == UNIFORM && ags_cg_put_instr(t, k, i) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The vector type that loads `width` values of storage type `type` at
 * once, or NULL where there is none worth having (8-byte types, 4-byte ones
 * by 8).  Those of 8 are the prelude's. */
const char *
ags_cg_vector_of(int type, int width)
{
    if (width == 8) {
        switch (type) {
        case AGS_KTYPE_F16: case AGS_KTYPE_BF16: return "ags_u16x8";
        case AGS_KTYPE_I8: return "ags_i8x8";
        case AGS_KTYPE_U8: case AGS_KTYPE_BOOL: return "ags_u8x8";
        default: return NULL;
        }
    }
    switch (type) {
    case AGS_KTYPE_F32: return "float4";
    case AGS_KTYPE_F16: case AGS_KTYPE_BF16: return "ushort4";
    case AGS_KTYPE_I32: return "int4";
    case AGS_KTYPE_I8: return "char4";
    case AGS_KTYPE_U8: case AGS_KTYPE_BOOL: return "uchar4";
    default: return NULL;
    }
}

int
ags_cg_vector_width(const kernel *k)
{
    int widest = 0;

    for (int i = 0; i < k->n_in; i++) {
        if (ags_cg_vector_input(k, i)
            && ags_kernel_storage_bytes(k->in[i].type) > widest) {
            widest = ags_kernel_storage_bytes(k->in[i].type);
        }
    }
    for (int o = 0; o < k->n_out; o++) {
        if (ags_cg_vector_output(k, o) && ags_kernel_storage_bytes(k->out[o].type) > widest) {
            widest = ags_kernel_storage_bytes(k->out[o].type);
        }
    }
    return widest > 0 && widest <= 2 ? 8 : 4;
}

int
ags_cg_vector_input(const kernel *k, int i)
{
    return k->in[i].strided == IN_CONTIGUOUS || k->in[i].strided == IN_ROW;
}

/* Whether output o is written as vectors: an element output, not strided
 * (a row kernel's row outputs are stored one at a time, its column sums
 * added one at a time). */
int
ags_cg_vector_output(const kernel *k, int o)
{
    return k->out[o].strided == OUT_CONTIGUOUS;
}

void
ags_cg_put_aligned(text *t, const kernel *k)
{
    ags_cg_put(t, "((0");
    for (int i = 0; i < k->n_in; i++) {
        if (ags_cg_vector_input(k, i)) {
            ags_cg_put(t, " | ((unsigned long long)in%d & %dULL)", i,
                ags_kernel_storage_bytes(k->in[i].type) * t->width - 1);
        }
    }
    for (int i = 0; i < k->n_out; i++) {
        if (ags_cg_vector_output(k, i)) {
            ags_cg_put(t, " | ((unsigned long long)out%d & %dULL)", i,
                ags_kernel_storage_bytes(k->out[i].type) * t->width - 1);
        }
    }
    ags_cg_put(t, ") == 0)");
}

/* The helpers every kernel may use, for NVRTC; the host shim has its own. */
static const char prelude[] =
    "#ifndef AGS_HOST\n"
    "#define AGS_BLOCK_MAX 32\n"
    "__device__ __forceinline__ float ags_from_f16(unsigned short h)\n"
    "{ float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n"
    "__device__ __forceinline__ unsigned short ags_to_f16(float f)\n"
    "{ unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));"
    " return h; }\n"
    "__device__ __forceinline__ float ags_from_bf16(unsigned short b)\n"
    "{ return __uint_as_float(((unsigned int)b) << 16); }\n"
    /* one instruction from sm_80 (what eager's conversion is there), rounding
     * to nearest even as the arithmetic below does */
    "__device__ __forceinline__ unsigned short ags_to_bf16(float f)\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "{ unsigned short h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
    "#else\n"
    "{ unsigned int u = __float_as_uint(f);\n"
    "  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);\n"
    "  u += 0x7fffu + ((u >> 16) & 1u); return (unsigned short)(u >> 16); }\n"
    "#endif\n"
    "__device__ __forceinline__ double ags_f64_bits(unsigned long long b)\n"
    "{ return __longlong_as_double((long long)b); }\n"
    "#define AGS_WARP_LANES 32\n"
    "#else\n"
    "#define AGS_WARP_LANES 1\n"      /* the harness's blocks are one thread */
    "#endif\n"
    /* vectors of 8 narrow values, 16 bytes of fp16 or bf16 a load as fp32's
     * float4 moves (CUDA's own vectors stop at 4) */
    "struct alignas(16) ags_u16x8 { unsigned short v[8]; };\n"
    "struct alignas(8) ags_u8x8 { unsigned char v[8]; };\n"
    "struct alignas(8) ags_i8x8 { signed char v[8]; };\n";

#define GLOBAL "extern \"C\" __global__ void"

/* A row kernel's functions.  Where the description tells the row's length
 * (static sizes), one: the warp path, then the block path for the rows it
 * does not take (misaligned ones), or, for rows longer than any warp path
 * takes, the block path alone, which is then all the kernel runs; driver.c
 * launches it for long rows too, finding no second function.  Otherwise
 * two, which share the block path as a device function of its own, compiled
 * once: the first runs the warp path or calls it, and <name>_block, which
 * driver.c launches for long rows, calls it.  Not inlined, <name>_block's
 * registers are the block path's alone (about 32, where the warp path's
 * arrays take 100 or more), so its large blocks launch and stay many to a
 * multiprocessor. */
static int
put_row_functions(text *t, const kernel *k, char *need, char *done)
{
    text call = {NULL, 0, 0, 0, -1, 4};
    int rc = -1;

    if (k->cols > 0) {
        put_signature(t, k, GLOBAL, "");
        if (ags_cg_put_rows(t, k, need, done, k->cols <= AGS_NVRTC_WARP_COLS, NULL) < 0) {
            return -1;
        }
        ags_cg_put(t, "}\n");
        return 0;
    }
    ags_cg_put(&call, "%s_block_path(", k->name);
    put_params(&call, k, 0);
    ags_cg_put(&call, ");\n");
    if (call.failed) {
        PyErr_NoMemory();
        goto done;
    }
    put_signature(t, k, "static __device__ __noinline__ void", "_block_path");
    if (ags_cg_put_rows(t, k, need, done, 0, NULL) < 0) {
        goto done;
    }
    ags_cg_put(t, "}\n");
    put_signature(t, k, GLOBAL, "");
    if (ags_cg_put_rows(t, k, need, done, 1, call.data) < 0) {
        goto done;
    }
    ags_cg_put(t, "}\n");
    put_signature(t, k, GLOBAL, AGS_NVRTC_BLOCK_SUFFIX);
    ags_cg_put(t, "%s}\n", call.data);
    rc = 0;
done:
    PyMem_Free(call.data);
    return rc;
}

/* desc: borrowed. Returns a new reference: the kernel's CUDA C source. */
PyObject *
ags_nvrtc_source(PyObject *desc)
{
    kernel k;
    text t = {NULL, 0, 0, 0, -1, 4};
    char *need = NULL, *done = NULL;
    PyObject *result = NULL;
    int rc;

    if (ags_kernel_read(desc, &k) < 0) {
        goto done;
    }
    t.width = ags_cg_vector_width(&k);
    need = PyMem_Calloc((size_t)k.n_ops + 1, 1);
    done = PyMem_Calloc((size_t)k.n_ops + 1, 1);
    if (need == NULL || done == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    ags_cg_put(&t, "%s#define AGS_WARP_ITEMS (%d / AGS_WARP_LANES)\n", prelude,
        k.warp_cols);
    if (k.kind == AGS_KKIND_ROWS) {
        rc = put_row_functions(&t, &k, need, done);
    }
    else {
        put_signature(&t, &k, GLOBAL, "");
        rc = ags_cg_put_pointwise(&t, &k, need);
        ags_cg_put(&t, "}\n");
    }
    if (rc < 0) {
        goto done;
    }
    if (t.failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyUnicode_FromStringAndSize(t.data, (Py_ssize_t)t.len);
done:
    PyMem_Free(need);
    PyMem_Free(done);
    PyMem_Free(t.data);
    ags_kernel_free(&k);
    return result;
}
