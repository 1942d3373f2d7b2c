/* codegen_columns.c: a row kernel's column sums (outputs of flag
 * OUT_COLUMNS: an element value summed over the rows, a norm's weight and
 * bias gradients), for codegen_rows.c.
 *
 * The rows are dealt to nslot slots, a warp each on the warp path, a block
 * each on the block path.  A thread handles the same columns in every row
 * of its slot, so it sums them alone, in registers, cs<o>[j], stored into
 * the slot's row of out<o> after the slot's last row: beside the kept
 * values on the warp path; on the block path (rows longer than the warp
 * path's, of a told length up to AGS_NVRTC_COLUMN_COLS) kc_ places a
 * thread, the row's length over the block the driver launches for it.  A
 * block path behind a warp path (misaligned rows only) or a scalar form
 * beside a vector form adds into the slot's row of out<o> itself at every
 * row instead (the slots' rows stay in L2).  No atomics: the caller sums
 * the slots, in an order that does not change from run to run.
 */
#include "codegen_rows.h"

/* The index, in a thread's register arrays (the warp path's kept values,
 * column sums), of the element the pass is at: j_, or j_ * W + lane on a
 * vector form. */
void
ags_cg_put_item_index(const text *t, char *buf, size_t size)
{
    if (t->lane >= 0) {
        snprintf(buf, size, "j_ * %d + %d", t->width, t->lane);
    }
    else {
        snprintf(buf, size, "j_");
    }
}

/* Output o's column sum at this element: added into the thread's register
 * for the column, or into the slot's row of out<o> where the block path's
 * sums stay in memory (the column is the same thread's in every row of the
 * slot). */
void
ags_cg_put_column_sum(text *t, const rows *g, int o)
{
    const output *out = &g->k->out[o];
    const char *ct = ags_kernel_compute_name(out->type);
    char item[32];

    if (!g->warp && !g->regs) {
        ags_cg_put(t, "out%d[slot_ * cols + c] += (%s)v%d;\n", o, ct, out->value);
        return;
    }
    ags_cg_put_item_index(t, item, sizeof item);
    ags_cg_put(t, "cs%d[%s] += (%s)v%d;\n", o, item, ct, out->value);
}

/* Output o's column sums from its registers into the slot's row: `count`
 * places a thread, place j_ at (first + j_ * stride), w columns a place; op
 * "=" or "+=" (a step's sums, added, are then zeroed for the next). */
static void
put_store(text *t, int o, int w, const char *count, const char *first,
          const char *stride, const char *op)
{
    ags_cg_put(t, "#pragma unroll\nfor (int j_ = 0; j_ < %s; j_++) {\n", count);
    if (w > 1) {
        ags_cg_put(t, "#pragma unroll\nfor (int l_ = 0; l_ < %d; l_++) {\n"
            "const long long c = (%s + (long long)j_ * %s) * %d + l_;\n"
            "if (c < cols) out%d[slot_ * cols + c] %s cs%d[j_ * %d + l_];\n",
            w, first, stride, w, o, op, o, w);
        if (op[0] == '+') {
            ags_cg_put(t, "cs%d[j_ * %d + l_] = 0;\n", o, w);
        }
        ags_cg_put(t, "}\n");
    }
    else {
        ags_cg_put(t, "const long long c = %s + (long long)j_ * %s;\n"
            "if (c < cols) out%d[slot_ * cols + c] %s cs%d[j_];\n", first, stride, o, op, o);
        if (op[0] == '+') {
            ags_cg_put(t, "cs%d[j_] = 0;\n", o);
        }
    }
    ags_cg_put(t, "}\n");
}

/* The block path's column sums in registers, of the step from place s_ (op
 * "+=": added into the slot's row, the registers zeroed) or of the one step
 * that covered the row (op "=": stored). */
void
ags_cg_put_column_flush(text *t, const rows *g, const char *op)
{
    const kernel *k = g->k;
    const char *first = op[0] == '+' ? "s_ + threadIdx.x" : "threadIdx.x";

    for (int o = 0; o < k->n_out; o++) {
        if (k->out[o].strided == OUT_COLUMNS) {
            put_store(t, o, g->vector ? t->width : 1, "kc_", first, "blockDim.x", op);
        }
    }
}

/* The column sums' start, before a slot's rows: the warp path's registers
 * at 0, or the block path's row of each output zeroed (then a barrier: the
 * threads that zero a column are not those that add to it in a vector form). */
void
ags_cg_put_columns_start(text *t, const rows *g)
{
    const kernel *k = g->k;
    int w = g->vector ? t->width : 1;

    if (g->regs) {  /* kc_ places a thread cover the row under the driver's blocks */
        ags_cg_put(t, "enum { kc_ = (%lld + %d * AGS_COLUMN_BLOCK - 1) / (%d * AGS_COLUMN_BLOCK) };\n"
            "const bool multi_ = (long long)kc_ * %d * blockDim.x < cols;\n",
            (long long)k->cols, w, w, w);
    }
    for (int o = 0; o < k->n_out; o++) {
        const char *ct = ags_kernel_compute_name(k->out[o].type);

        if (k->out[o].strided != OUT_COLUMNS) {
            continue;
        }
        if (g->warp) {
            ags_cg_put(t, "%s cs%d[AGS_WARP_ITEMS];\n#pragma unroll\n"
                "for (int j_ = 0; j_ < AGS_WARP_ITEMS; j_++) cs%d[j_] = (%s)0;\n",
                ct, o, o, ct);
        }
        if (g->regs) {
            ags_cg_put(t, "%s cs%d[kc_ * %d];\n#pragma unroll\n"
                "for (int j_ = 0; j_ < kc_ * %d; j_++) cs%d[j_] = (%s)0;\n",
                ct, o, w, w, o, ct);
        }
        if (!g->warp) {     /* the slot's row, where the sums are added */
            ags_cg_put(t, "%sfor (long long c = threadIdx.x; c < cols; c += blockDim.x) "
                "out%d[slot_ * cols + c] = (%s)0;\n", g->regs ? "if (multi_) " : "", o, ct);
        }
    }
    if (!g->warp) {
        ags_cg_put(t, "__syncthreads();\n");
    }
}

/* The column sums after the slot's last row: the warp path's registers, or
 * the block path's where one step covered the row, stored at their columns
 * of the slot's row (the block path's in memory are there already). */
void
ags_cg_put_columns_end(text *t, const rows *g)
{
    const kernel *k = g->k;
    char count[32];

    if (g->regs) {
        ags_cg_put(t, "if (!multi_) {\n");
        ags_cg_put_column_flush(t, g, "=");
        ags_cg_put(t, "}\n");
        return;
    }
    if (g->vector) {
        snprintf(count, sizeof count, "AGS_WARP_ITEMS / %d", t->width);
    }
    else {
        snprintf(count, sizeof count, "AGS_WARP_ITEMS");
    }
    for (int o = 0; g->warp && o < k->n_out; o++) {
        if (k->out[o].strided == OUT_COLUMNS) {
            put_store(t, o, g->vector ? t->width : 1, count, "lane_", "AGS_WARP_LANES", "=");
        }
    }
}
