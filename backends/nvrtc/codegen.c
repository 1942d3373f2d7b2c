/* codegen.c: CUDA C for one fused kernel, from its description.
 *
 * The partitioner (backends/nvrtc/partition.py) finds the fusible groups of
 * an aten graph and writes each as a description: a tuple that names the
 * kernel, its iteration space and its instructions (protocol.h's KOP
 * table), nothing of torch.  describe.c reads and checks a description;
 * this file turns it into the source of one `extern "C" __global__`
 * function; NVRTC compiles it (driver.c).
 *
 *   (name, kind, ndim, nred, inputs, ops, outputs)
 *     kind     KKIND: POINTWISE (one thread per element of an ndim-sized
 *              space, in a grid-stride loop) or ROWS (the last nred
 *              dimensions are reduced: one block per row, a row being the
 *              elements that share the leading ndim - nred indices)
 *     inputs   ((ktype, strided), ...): storage type of each input; a
 *              strided one is read at sum(index[d] * stride[d]) with the
 *              strides passed in (0 for a broadcast dimension), another at
 *              the element's linear index (contiguous in the space)
 *     ops      ((kop, ktype, (operand, ...), immediate), ...): instruction
 *              i defines value v<i> of the type ktype computes in
 *     outputs  ((value, ktype, strided), ...): stored in that storage
 *              type; an element value at each element, a row value (a
 *              reduction and what follows from it alone) once per row,
 *              at the row's index
 *
 * The kernel's parameters, in order: the inputs' pointers, the outputs'
 * pointers, the space's sizes (n0.., long long), then ndim strides for
 * each strided input, then for each strided output.  Sizes are run-time
 * values, so one kernel serves every size of its space.
 *
 * Values and their variance.  A CONST, or an instruction of constants
 * only, is computed once per thread before any loop; a LOAD and whatever
 * depends on one varies per element; a reduction, and what depends only on
 * reductions and constants, is a row value.  A ROWS kernel makes one pass
 * over a row per reduction, computing in it the element values that
 * reduction needs (recomputed rather than kept: a row may be longer than a
 * block holds in registers), reduces across the block through shared
 * memory, then computes the row values that have become known; a last pass
 * computes and stores the element outputs.  Reductions accumulate in their
 * type: float for every floating storage type but double.
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

/* ---- a growing text buffer ------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap;
    int failed;
    int lane;           /* >= 0: writing lane <lane> of a vector step */
} text;

static void
put(text *t, const char *fmt, ...)
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
static void
put_number(text *t, int type, double x)
{
    switch (ags_kernel_family(type)) {
    case BOOL_LIKE:
        put(t, "%s", x != 0.0 ? "true" : "false");
        return;
    case INT_LIKE:
        put(t, "((%s)%.0f)", ags_kernel_storage_name(type), x);
        return;
    default:
        if (isfinite(x)) {
            put(t, "((%s)%a)", ags_kernel_compute_name(type), x);
        }
        else {
            unsigned long long bits;

            memcpy(&bits, &x, sizeof bits);
            put(t, "((%s)ags_f64_bits(0x%llxULL))", ags_kernel_compute_name(type), bits);
        }
    }
}

/* The offset of the current element in an operand: `i` when contiguous,
 * else the dot product of the indices with its strides `<prefix>_d`. */
static void
put_offset(text *t, const kernel *k, int strided, const char *prefix)
{
    if (!strided) {
        put(t, "i");
        return;
    }
    put(t, "(");
    for (int d = 0; d < k->ndim; d++) {
        put(t, "%si%d * %s_%d", d ? " + " : "", d, prefix, d);
    }
    if (k->ndim == 0) {
        put(t, "0");
    }
    put(t, ")");
}

/* The offset of the current row's value in an output (ROWS kernels). */
static void
put_row_offset(text *t, const kernel *k, int strided, const char *prefix)
{
    int outer = k->ndim - k->nred;

    if (!strided) {
        put(t, "row");
        return;
    }
    put(t, "(");
    for (int d = 0; d < outer; d++) {
        put(t, "%si%d * %s_%d", d ? " + " : "", d, prefix, d);
    }
    if (outer == 0) {
        put(t, "0");
    }
    put(t, ")");
}

static void
put_load(text *t, const kernel *k, const instr *op)
{
    int src = op->args[0];
    int st = k->in[src].type;
    char prefix[32];

    snprintf(prefix, sizeof prefix, "si%d", src);
    put(t, "(%s)", ags_kernel_compute_name(op->type));
    if (t->lane >= 0) {
        const char *conv = st == AGS_KTYPE_F16 ? "ags_from_f16"
                           : st == AGS_KTYPE_BF16 ? "ags_from_bf16" : "";

        put(t, "%s(a%d.%c)", conv, src, "xyzw"[t->lane]);
        return;
    }
    if (st == AGS_KTYPE_F16) {
        put(t, "ags_from_f16(in%d[", src);
    }
    else if (st == AGS_KTYPE_BF16) {
        put(t, "ags_from_bf16(in%d[", src);
    }
    else {
        put(t, "(in%d[", src);
    }
    put_offset(t, k, k->in[src].strided, prefix);
    put(t, "])");
}

static int
put_instr(text *t, const kernel *k, int i)
{
    const instr *op = &k->ops[i];
    const op_template *tpl = &templates[op->kop];
    const char *form;
    ags_kernel_family_t fam = ags_kernel_family(op->type);

    put(t, "%s v%d = ", ags_kernel_compute_name(op->type), i);
    switch (op->kop) {
    case AGS_KOP_LOAD:
        put_load(t, k, op);
        put(t, ";\n");
        return 0;
    case AGS_KOP_CONST:
        put_number(t, op->type, op->imm);
        put(t, ";\n");
        return 0;
    case AGS_KOP_CAST:
        if (fam == BOOL_LIKE) {
            put(t, "(v%d != 0);\n", op->args[0]);
        }
        else if (op->type == AGS_KTYPE_F16 || op->type == AGS_KTYPE_BF16) {
            /* rounded to the narrow type, as eager's tensor of it would be */
            const char *w = op->type == AGS_KTYPE_F16 ? "f16" : "bf16";

            put(t, "ags_from_%s(ags_to_%s((float)v%d));\n", w, w, op->args[0]);
        }
        else {
            put(t, "(%s)v%d;\n", ags_kernel_compute_name(op->type), op->args[0]);
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
            put(t, "v%d", op->args[c[1] - '0']);
            c++;
        }
        else if (c[0] == '$' && c[1] == 'T') {
            put(t, "%s", ags_kernel_compute_name(op->type));
            c++;
        }
        else {
            put(t, "%c", *c);
        }
    }
    put(t, ";\n");
    return 0;
}

static void
put_store(text *t, const kernel *k, int o, int per_row)
{
    const output *out = &k->out[o];
    char prefix[32];

    snprintf(prefix, sizeof prefix, "so%d", o);
    if (t->lane >= 0) {
        char c = "xyzw"[t->lane];

        if (out->type == AGS_KTYPE_F16 || out->type == AGS_KTYPE_BF16) {
            put(t, "o%d.%c = ags_to_%s((float)v%d);\n", o, c,
                out->type == AGS_KTYPE_F16 ? "f16" : "bf16", out->value);
        }
        else if (out->type == AGS_KTYPE_BOOL) {
            put(t, "o%d.%c = (unsigned char)(v%d != 0);\n", o, c, out->value);
        }
        else {
            put(t, "o%d.%c = (%s)v%d;\n", o, c, ags_kernel_storage_name(out->type),
                out->value);
        }
        return;
    }
    put(t, "out%d[", o);
    if (per_row) {
        put_row_offset(t, k, out->strided, prefix);
    }
    else {
        put_offset(t, k, out->strided, prefix);
    }
    if (out->type == AGS_KTYPE_F16) {
        put(t, "] = ags_to_f16((float)v%d);\n", out->value);
    }
    else if (out->type == AGS_KTYPE_BF16) {
        put(t, "] = ags_to_bf16((float)v%d);\n", out->value);
    }
    else {
        put(t, "] = (%s)v%d;\n", ags_kernel_storage_name(out->type),
            out->value);
    }
}

static void
put_signature(text *t, const kernel *k)
{
    put(t, "extern \"C\" __global__ void %s(", k->name);
    for (int i = 0; i < k->n_in; i++) {
        put(t, "%sconst %s *__restrict__ in%d", i ? ", " : "",
            ags_kernel_storage_name(k->in[i].type), i);
    }
    for (int i = 0; i < k->n_out; i++) {
        put(t, "%s%s *__restrict__ out%d", k->n_in + i ? ", " : "",
            ags_kernel_storage_name(k->out[i].type), i);
    }
    for (int d = 0; d < k->ndim; d++) {
        put(t, ", long long n%d", d);
    }
    for (int i = 0; i < k->n_in; i++) {
        for (int d = 0; k->in[i].strided && d < k->ndim; d++) {
            put(t, ", long long si%d_%d", i, d);
        }
    }
    for (int i = 0; i < k->n_out; i++) {
        for (int d = 0; k->out[i].strided && d < k->ndim; d++) {
            put(t, ", long long so%d_%d", i, d);
        }
    }
    put(t, ")\n{\n");
}

static int
any_strided(const kernel *k)
{
    for (int i = 0; i < k->n_in; i++) {
        if (k->in[i].strided) {
            return 1;
        }
    }
    for (int i = 0; i < k->n_out; i++) {
        if (k->out[i].strided) {
            return 1;
        }
    }
    return 0;
}

/* Declares i<lo>..i<hi-1>, the indices of `var` over those dimensions
 * (the last one varying fastest). */
static void
put_indices(text *t, int lo, int hi, const char *var)
{
    if (hi <= lo) {
        return;
    }
    put(t, "long long q_ = %s;\n", var);
    for (int d = hi - 1; d > lo; d--) {
        put(t, "const long long i%d = q_ %% n%d; q_ /= n%d;\n", d, d, d);
    }
    put(t, "const long long i%d = q_;\n", lo);
}

/* Marks in `need` the element values that value `v` needs (itself
 * included), stopping at values that are not per element. */
static void
mark_cone(const kernel *k, int v, char *need)
{
    const instr *op = &k->ops[v];

    if (op->variance != PER_ELEMENT || need[v]) {
        return;
    }
    need[v] = 1;
    for (int a = 0; a < op->n && op->kop != AGS_KOP_LOAD; a++) {
        mark_cone(k, op->args[a], need);
    }
}

static int
put_marked(text *t, const kernel *k, const char *need)
{
    for (int i = 0; i < k->n_ops; i++) {
        if (need[i] && put_instr(t, k, i) < 0) {
            return -1;
        }
    }
    return 0;
}

static int
put_uniforms(text *t, const kernel *k)
{
    for (int i = 0; i < k->n_ops; i++) {
        if (k->ops[i].variance == UNIFORM && put_instr(t, k, i) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The vector type that loads 4 values of storage type `type` at once, or
 * NULL where there is none worth having (8-byte types). */
static const char *
vector_of(int type)
{
    switch (type) {
    case AGS_KTYPE_F32: return "float4";
    case AGS_KTYPE_F16: case AGS_KTYPE_BF16: return "ushort4";
    case AGS_KTYPE_I32: return "int4";
    case AGS_KTYPE_I8: return "char4";
    case AGS_KTYPE_U8: case AGS_KTYPE_BOOL: return "uchar4";
    default: return NULL;
    }
}

static int
vector_bytes(int type)
{
    switch (type) {
    case AGS_KTYPE_F32: case AGS_KTYPE_I32: return 16;
    case AGS_KTYPE_F16: case AGS_KTYPE_BF16: return 8;
    default: return 4;
    }
}

/* Whether a pointwise kernel gets a vector path: every operand contiguous and
 * of a type with a vector of 4. */
static int
vectorizable(const kernel *k)
{
    if (any_strided(k)) {
        return 0;
    }
    for (int i = 0; i < k->n_in; i++) {
        if (vector_of(k->in[i].type) == NULL) {
            return 0;
        }
    }
    for (int i = 0; i < k->n_out; i++) {
        if (vector_of(k->out[i].type) == NULL) {
            return 0;
        }
    }
    return 1;
}

/* The vector path: taken when the count is a multiple of 4 and every pointer
 * is aligned to its vector; each step loads 4 values of each input at once,
 * computes the 4 elements and stores 4 values of each output at once. */
static int
put_vector_path(text *t, const kernel *k, const char *need)
{
    put(t, "if (total %% 4 == 0 && ((0");
    for (int i = 0; i < k->n_in; i++) {
        put(t, " | ((unsigned long long)in%d & %dULL)", i, vector_bytes(k->in[i].type) - 1);
    }
    for (int i = 0; i < k->n_out; i++) {
        put(t, " | ((unsigned long long)out%d & %dULL)", i,
            vector_bytes(k->out[i].type) - 1);
    }
    put(t, ") == 0)) {\n");
    put(t, "for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;"
        " j < total / 4; j += (long long)gridDim.x * blockDim.x) {\n");
    for (int i = 0; i < k->n_in; i++) {
        const char *v = vector_of(k->in[i].type);

        put(t, "const %s a%d = ((const %s *)in%d)[j];\n", v, i, v, i);
    }
    for (int o = 0; o < k->n_out; o++) {
        put(t, "%s o%d;\n", vector_of(k->out[o].type), o);
    }
    for (t->lane = 0; t->lane < 4; t->lane++) {
        put(t, "{\n");
        if (put_marked(t, k, need) < 0) {
            t->lane = -1;
            return -1;
        }
        for (int o = 0; o < k->n_out; o++) {
            put_store(t, k, o, 0);
        }
        put(t, "}\n");
    }
    t->lane = -1;
    for (int o = 0; o < k->n_out; o++) {
        put(t, "((%s *)out%d)[j] = o%d;\n", vector_of(k->out[o].type), o, o);
    }
    put(t, "}\nreturn;\n}\n");
    return 0;
}

static int
put_pointwise(text *t, const kernel *k, char *need)
{
    put(t, "const long long total = 1");
    for (int d = 0; d < k->ndim; d++) {
        put(t, " * n%d", d);
    }
    put(t, ";\n");
    if (put_uniforms(t, k) < 0) {
        return -1;
    }
    memset(need, 0, (size_t)k->n_ops);
    for (int o = 0; o < k->n_out; o++) {
        mark_cone(k, k->out[o].value, need);
    }
    if (vectorizable(k) && put_vector_path(t, k, need) < 0) {
        return -1;
    }
    put(t, "for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;"
        " i < total; i += (long long)gridDim.x * blockDim.x) {\n");
    if (any_strided(k)) {
        put_indices(t, 0, k->ndim, "i");
    }
    memset(need, 0, (size_t)k->n_ops);
    for (int o = 0; o < k->n_out; o++) {
        mark_cone(k, k->out[o].value, need);
    }
    if (put_marked(t, k, need) < 0) {
        return -1;
    }
    for (int o = 0; o < k->n_out; o++) {
        put_store(t, k, o, 0);
    }
    put(t, "}\n");
    return 0;
}

static const char *
shared_of(int type)
{
    switch (ags_kernel_family(type)) {
    case FLOAT_LIKE: return "ags_sh_f";
    case DOUBLE_LIKE: return "ags_sh_d";
    default: return "ags_sh_i";
    }
}

static void
put_combine(text *t, int kop, const char *a, const char *b)
{
    switch (kop) {
    case AGS_KOP_SUM:
        put(t, "(%s + %s)", a, b);
        break;
    case AGS_KOP_AMAX:
        put(t, "((%s != %s || %s > %s) ? %s : %s)", a, a, a, b, a, b);
        break;
    default:
        put(t, "((%s != %s || %s < %s) ? %s : %s)", a, a, a, b, a, b);
        break;
    }
}

/* What a reduction starts from: 0 for a sum, -inf for a max, +inf for a min. */
static void
put_identity(text *t, const instr *op)
{
    put_number(t, op->type, op->kop == AGS_KOP_SUM ? 0.0
               : op->kop == AGS_KOP_AMAX ? -INFINITY : INFINITY);
}

/* acc_ combined across the lanes of its warp (of the block, when the block is
 * smaller than a warp, as in the host harness's one-thread blocks). */
static void
put_warp_combine(text *t, int kop, const char *ct)
{
    put(t, "for (unsigned int o_ = (blockDim.x < 32u ? blockDim.x : 32u) / 2u; o_ > 0u;"
        " o_ >>= 1) {\n%s b_ = __shfl_xor_sync(0xffffffffu, acc_, o_);\nacc_ = ", ct);
    put_combine(t, kop, "acc_", "b_");
    put(t, ";\n}\n");
}

/* One pass over the row for reduction `r`, leaving its value in v<r>. */
static int
put_reduction(text *t, const kernel *k, int r, char *need, int strided)
{
    const instr *op = &k->ops[r];
    const char *ct = ags_kernel_compute_name(op->type);
    const char *sh = shared_of(op->type);
    int arg = op->args[0];
    char b[48];

    put(t, "%s v%d;\n{\n%s acc_ = ", ct, r, ct);
    put_identity(t, op);
    put(t, ";\nfor (long long c = threadIdx.x; c < cols; c += blockDim.x) {\n"
        "const long long i = row * cols + c;\n(void)i;\n");
    if (strided) {
        put_indices(t, k->ndim - k->nred, k->ndim, "c");
    }
    memset(need, 0, (size_t)k->n_ops);
    mark_cone(k, arg, need);
    if (put_marked(t, k, need) < 0) {
        return -1;
    }
    snprintf(b, sizeof b, "(%s)v%d", ct, arg);
    put(t, "acc_ = ");
    put_combine(t, op->kop, "acc_", b);
    put(t, ";\n}\n");
    /* within each warp by shuffles, the warps' partials through shared memory, those by
     * the first warp: two barriers a reduction, whatever the block's size */
    put_warp_combine(t, op->kop, ct);
    put(t, "if ((threadIdx.x & 31u) == 0) %s[threadIdx.x >> 5] = acc_;\n"
        "__syncthreads();\n"
        "if (threadIdx.x < 32u) {\n"
        "acc_ = threadIdx.x < (blockDim.x + 31u) / 32u ? %s[threadIdx.x] : ", sh, sh);
    put_identity(t, op);
    put(t, ";\n");
    put_warp_combine(t, op->kop, ct);
    put(t, "if (threadIdx.x == 0) %s[0] = acc_;\n}\n__syncthreads();\n"
        "v%d = %s[0];\n__syncthreads();\n}\n", sh, r, sh);
    return 0;
}

static int
put_rows(text *t, const kernel *k, char *need, char *done)
{
    int outer = k->ndim - k->nred;
    int strided = any_strided(k);
    int uses[3] = {0, 0, 0};
    int element_outputs = 0;

    put(t, "long long rows = 1, cols = 1;\n");
    for (int d = 0; d < k->ndim; d++) {
        put(t, "%s *= n%d;\n", d < outer ? "rows" : "cols", d);
    }
    for (int i = 0; i < k->n_ops; i++) {
        if (ags_kernel_is_reduction(k->ops[i].kop)) {
            ags_kernel_family_t f = ags_kernel_family(k->ops[i].type);
            uses[f == FLOAT_LIKE ? 0 : f == DOUBLE_LIKE ? 1 : 2] = 1;
        }
    }
    if (uses[0]) {
        put(t, "__shared__ float ags_sh_f[AGS_BLOCK_MAX];\n");
    }
    if (uses[1]) {
        put(t, "__shared__ double ags_sh_d[AGS_BLOCK_MAX];\n");
    }
    if (uses[2]) {
        put(t, "__shared__ long long ags_sh_i[AGS_BLOCK_MAX];\n");
    }
    if (put_uniforms(t, k) < 0) {
        return -1;
    }
    put(t, "for (long long row = blockIdx.x; row < rows; row += gridDim.x) {\n");
    if (strided) {
        put_indices(t, 0, outer, "row");
    }
    memset(done, 0, (size_t)k->n_ops);
    for (int r = 0; r < k->n_ops; r++) {
        if (!ags_kernel_is_reduction(k->ops[r].kop)) {
            continue;
        }
        if (put_reduction(t, k, r, need, strided) < 0) {
            return -1;
        }
        done[r] = 1;
        /* the row values that are known now */
        for (int i = r + 1; i < k->n_ops; i++) {
            const instr *op = &k->ops[i];
            int ready = op->variance == PER_ROW && !ags_kernel_is_reduction(op->kop)
                        && !done[i];

            for (int a = 0; ready && a < op->n; a++) {
                const instr *arg = &k->ops[op->args[a]];
                ready = arg->variance == UNIFORM || done[op->args[a]];
            }
            if (ready) {
                if (put_instr(t, k, i) < 0) {
                    return -1;
                }
                done[i] = 1;
            }
        }
    }
    memset(need, 0, (size_t)k->n_ops);
    for (int o = 0; o < k->n_out; o++) {
        if (k->ops[k->out[o].value].variance == PER_ELEMENT) {
            mark_cone(k, k->out[o].value, need);
            element_outputs = 1;
        }
    }
    if (element_outputs) {
        put(t, "for (long long c = threadIdx.x; c < cols; c += blockDim.x) {\n"
            "const long long i = row * cols + c;\n(void)i;\n");
        if (strided) {
            put_indices(t, outer, k->ndim, "c");
        }
        if (put_marked(t, k, need) < 0) {
            return -1;
        }
        for (int o = 0; o < k->n_out; o++) {
            if (k->ops[k->out[o].value].variance == PER_ELEMENT) {
                put_store(t, k, o, 0);
            }
        }
        put(t, "}\n");
    }
    put(t, "if (threadIdx.x == 0) {\n");
    for (int o = 0; o < k->n_out; o++) {
        if (k->ops[k->out[o].value].variance == PER_ROW) {
            put_store(t, k, o, 1);
        }
    }
    put(t, "}\n}\n");
    return 0;
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
    "__device__ __forceinline__ unsigned short ags_to_bf16(float f)\n"
    "{ unsigned int u = __float_as_uint(f);\n"
    "  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);\n"
    "  u += 0x7fffu + ((u >> 16) & 1u); return (unsigned short)(u >> 16); }\n"
    "__device__ __forceinline__ double ags_f64_bits(unsigned long long b)\n"
    "{ return __longlong_as_double((long long)b); }\n"
    "#endif\n";

/* desc: borrowed. Returns a new reference: the kernel's CUDA C source. */
PyObject *
ags_nvrtc_source(PyObject *desc)
{
    kernel k;
    text t = {NULL, 0, 0, 0, -1};
    char *need = NULL, *done = NULL;
    PyObject *result = NULL;
    int rc;

    if (ags_kernel_read(desc, &k) < 0) {
        goto done;
    }
    need = PyMem_Calloc((size_t)k.n_ops + 1, 1);
    done = PyMem_Calloc((size_t)k.n_ops + 1, 1);
    if (need == NULL || done == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    put(&t, "%s", prelude);
    put_signature(&t, &k);
    rc = k.kind == AGS_KKIND_ROWS ? put_rows(&t, &k, need, done)
                                  : put_pointwise(&t, &k, need);
    if (rc < 0) {
        goto done;
    }
    put(&t, "}\n");
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
