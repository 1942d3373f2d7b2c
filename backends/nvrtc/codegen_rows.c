/* codegen_rows.c: the body of a ROWS kernel (codegen.c writes the rest).
 *
 * One block per row, rows in a grid-stride loop.  Each reduction makes one
 * pass over the row, recomputing the element values it needs (a row may be
 * longer than a block holds in registers); each thread accumulates its
 * elements, each warp combines its lanes by shuffles, the warps' partials
 * meet in shared memory and the first warp combines them: two barriers a
 * reduction, whatever the block's size (driver.c picks 32 to 512 threads).
 * The row values known after a reduction are computed right away; a last
 * pass computes and stores the element outputs, and thread 0 the row ones.
 * In the host harness a block is one thread, where every combine across
 * lanes is empty.
 */
#include <math.h>

#include "codegen.h"

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
        ags_cg_put(t, "(%s + %s)", a, b);
        break;
    case AGS_KOP_AMAX:
        ags_cg_put(t, "((%s != %s || %s > %s) ? %s : %s)", a, a, a, b, a, b);
        break;
    default:
        ags_cg_put(t, "((%s != %s || %s < %s) ? %s : %s)", a, a, a, b, a, b);
        break;
    }
}

/* What a reduction starts from: 0 for a sum, -inf for a max, +inf for a min. */
static void
put_identity(text *t, const instr *op)
{
    ags_cg_put_number(t, op->type, op->kop == AGS_KOP_SUM ? 0.0
               : op->kop == AGS_KOP_AMAX ? -INFINITY : INFINITY);
}

/* acc_ combined across the lanes of its warp (of the block, when the block is
 * smaller than a warp, as in the host harness's one-thread blocks). */
static void
put_warp_combine(text *t, int kop, const char *ct)
{
    ags_cg_put(t, "for (unsigned int o_ = (blockDim.x < 32u ? blockDim.x : 32u) / 2u; o_ > 0u;"
        " o_ >>= 1) {\n%s b_ = __shfl_xor_sync(0xffffffffu, acc_, o_);\nacc_ = ", ct);
    put_combine(t, kop, "acc_", "b_");
    ags_cg_put(t, ";\n}\n");
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

    ags_cg_put(t, "%s v%d;\n{\n%s acc_ = ", ct, r, ct);
    put_identity(t, op);
    ags_cg_put(t, ";\nfor (long long c = threadIdx.x; c < cols; c += blockDim.x) {\n"
        "const long long i = row * cols + c;\n(void)i;\n");
    if (strided) {
        ags_cg_put_indices(t, k->ndim - k->nred, k->ndim, "c");
    }
    memset(need, 0, (size_t)k->n_ops);
    ags_cg_mark_cone(k, arg, need);
    if (ags_cg_put_marked(t, k, need) < 0) {
        return -1;
    }
    snprintf(b, sizeof b, "(%s)v%d", ct, arg);
    ags_cg_put(t, "acc_ = ");
    put_combine(t, op->kop, "acc_", b);
    ags_cg_put(t, ";\n}\n");
    /* within each warp by shuffles, the warps' partials through shared memory, those by
     * the first warp: two barriers a reduction, whatever the block's size */
    put_warp_combine(t, op->kop, ct);
    ags_cg_put(t, "if ((threadIdx.x & 31u) == 0) %s[threadIdx.x >> 5] = acc_;\n"
        "__syncthreads();\n"
        "if (threadIdx.x < 32u) {\n"
        "acc_ = threadIdx.x < (blockDim.x + 31u) / 32u ? %s[threadIdx.x] : ", sh, sh);
    put_identity(t, op);
    ags_cg_put(t, ";\n");
    put_warp_combine(t, op->kop, ct);
    ags_cg_put(t, "if (threadIdx.x == 0) %s[0] = acc_;\n}\n__syncthreads();\n"
        "v%d = %s[0];\n__syncthreads();\n}\n", sh, r, sh);
    return 0;
}

int
ags_cg_put_rows(text *t, const kernel *k, char *need, char *done)
{
    int outer = k->ndim - k->nred;
    int strided = ags_cg_any_strided(k);
    int uses[3] = {0, 0, 0};
    int element_outputs = 0;

    ags_cg_put(t, "long long rows = 1, cols = 1;\n");
    for (int d = 0; d < k->ndim; d++) {
        ags_cg_put(t, "%s *= n%d;\n", d < outer ? "rows" : "cols", d);
    }
    for (int i = 0; i < k->n_ops; i++) {
        if (ags_kernel_is_reduction(k->ops[i].kop)) {
            ags_kernel_family_t f = ags_kernel_family(k->ops[i].type);
            uses[f == FLOAT_LIKE ? 0 : f == DOUBLE_LIKE ? 1 : 2] = 1;
        }
    }
    if (uses[0]) {
        ags_cg_put(t, "__shared__ float ags_sh_f[AGS_BLOCK_MAX];\n");
    }
    if (uses[1]) {
        ags_cg_put(t, "__shared__ double ags_sh_d[AGS_BLOCK_MAX];\n");
    }
    if (uses[2]) {
        ags_cg_put(t, "__shared__ long long ags_sh_i[AGS_BLOCK_MAX];\n");
    }
    if (ags_cg_put_uniforms(t, k) < 0) {
        return -1;
    }
    ags_cg_put(t, "for (long long row = blockIdx.x; row < rows; row += gridDim.x) {\n");
    if (strided) {
        ags_cg_put_indices(t, 0, outer, "row");
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
                if (ags_cg_put_instr(t, k, i) < 0) {
                    return -1;
                }
                done[i] = 1;
            }
        }
    }
    memset(need, 0, (size_t)k->n_ops);
    for (int o = 0; o < k->n_out; o++) {
        if (k->ops[k->out[o].value].variance == PER_ELEMENT) {
            ags_cg_mark_cone(k, k->out[o].value, need);
            element_outputs = 1;
        }
    }
    if (element_outputs) {
        ags_cg_put(t, "for (long long c = threadIdx.x; c < cols; c += blockDim.x) {\n"
            "const long long i = row * cols + c;\n(void)i;\n");
        if (strided) {
            ags_cg_put_indices(t, outer, k->ndim, "c");
        }
        if (ags_cg_put_marked(t, k, need) < 0) {
            return -1;
        }
        for (int o = 0; o < k->n_out; o++) {
            if (k->ops[k->out[o].value].variance == PER_ELEMENT) {
                ags_cg_put_store(t, k, o, 0);
            }
        }
        ags_cg_put(t, "}\n");
    }
    ags_cg_put(t, "if (threadIdx.x == 0) {\n");
    for (int o = 0; o < k->n_out; o++) {
        if (k->ops[k->out[o].value].variance == PER_ROW) {
            ags_cg_put_store(t, k, o, 1);
        }
    }
    ags_cg_put(t, "}\n}\n");
    return 0;
}
