/* codegen_rows.c: the body of a ROWS kernel (codegen.c writes the rest).
 *
 * A row kernel makes one pass over a row per reduction, computing in it the
 * element values that reduction needs, combines the partial results of the
 * threads that share the row, then computes the row values that have become
 * known; a last pass computes and stores the element outputs, and one
 * thread the row ones.  Two paths do this, chosen at run time by the row's
 * length (the same on every thread, so a block never splits between them):
 *
 *   warp path, cols <= kernel.warp_cols (AGS_NVRTC_WARP_COLS, or the
 *     description's row length rounded up to 128 where it gives one, so a
 *     lane's register arrays and unrolled loops are no longer than the row
 *     needs): one warp per row, the block's warps on consecutive rows,
 *     rows in a grid-stride loop over warps.  A reduction combines its
 *     lanes by shuffles alone: no shared memory, no barrier.  Each lane
 *     holds the elements c = lane + 32 j, j below AGS_WARP_ITEMS (cols /
 *     32 at most), in a loop of constant count that
 *     the compiler unrolls: every load of the row is in flight at once.  An
 *     element value a later pass would otherwise recompute is kept in
 *     registers, ca<i>[j], by the pass that computes it (choose_kept): x for
 *     softmax's sum, then exp(x - max) for its division; g and y for
 *     softmax's backward; so the row is read from memory once and little is
 *     computed twice.  The row loop's bound is the same on every lane of a
 *     warp (all of them leave together), and the lanes past the row's end
 *     skip the element work but still shuffle, contributing the identity.
 *   block path, longer rows: one block per row, rows in a grid-stride loop;
 *     each thread accumulates its elements (the loop unrolled so loads
 *     overlap), each warp combines its lanes by shuffles, the warps'
 *     partials meet in shared memory and the first warp combines them: two
 *     barriers a reduction.  Element values are recomputed in each pass
 *     rather than kept (a long row does not fit in registers).
 *
 * Each path has a vector form, taken when cols is a multiple of the
 * kernel's vector width W (4, or 8 where every operand moved as a vector is
 * fp16, bf16 or a byte) and the pointers of the contiguous inputs and
 * element outputs are aligned (and those all have a vector type): a step
 * takes W consecutive columns (W cw_ to W cw_ + W - 1, cw_ where c was),
 * loading each contiguous input and storing each contiguous element output
 * as one vector (codegen.c's machinery: 16 bytes of fp32 or of bf16), and
 * each row input (a norm's weight, the same for every row) as one vector at
 * the columns' place in its row; strided operands go one element at a
 * time.
 *
 * Column sums: codegen_columns.c.
 *
 * The kernel's function holds both paths (the block path alone where the
 * description's row length is past AGS_NVRTC_WARP_COLS).  Where the row's
 * length is not told, the block path is a device function of its own that
 * the first function calls, and codegen.c adds a second kernel,
 * <name>_block, which calls it alone and which driver.c launches for long
 * rows: not inlined, its registers are its own (about 32, where the warp
 * path's arrays take 100 or more), so its 512-thread blocks launch and
 * several share a multiprocessor (put_row_functions).
 *
 * Why 1024: a lane keeps AGS_WARP_ITEMS values of each kept value in
 * registers; 32 each (at most AGS_ROWS_KEPT_MAX of them) stays within a
 * thread's 255 registers without spilling, where 2048 columns would need 64.
 * driver.c launches 256-thread blocks (8 warps) for the warp path; either
 * path is correct under either launch (the warp path needs whole warps:
 * driver.c's blocks are multiples of 32), so the two files agree on the
 * bound for speed, not for correctness.
 *
 * In the host harness a block is one thread and AGS_WARP_LANES is 1: the
 * warp path's one lane holds the whole row (AGS_WARP_ITEMS is then 1024) and
 * every combine across lanes is empty; both functions can be called.
 */
#include <math.h>

#include "codegen_rows.h"

/* Values kept in registers across passes, at most, in the warp path. */
#define AGS_ROWS_KEPT_MAX 4

/* When a column's index is below 2^32 (ags_cg_put_indices): always on the
 * warp path (its rows are at most warp_cols long) and on the block path
 * where the row's length is told and short enough; else where cols is. */
static const char *
narrow_columns(const rows *g)
{
    return g->warp || (g->k->cols > 0 && g->k->cols <= 0xffffffffLL)
           ? "1" : "cols <= 0xffffffffLL";
}

/* Whether an input is read once a row through its strides (the row's
 * indices are needed even where no element is strided). */
static int
read_through_rows(const kernel *k)
{
    for (int i = 0; i < k->n_in; i++) {
        if (k->in[i].strided == IN_ROW_STRIDED) {
            return 1;
        }
    }
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

/* acc_ combined across `lanes` lanes by a butterfly of shuffles: every lane
 * ends with the whole result.  Every lane of the warp must get here. */
static void
put_shuffle_combine(text *t, int kop, const char *ct, const char *lanes)
{
    ags_cg_put(t, "for (unsigned int o_ = %s / 2u; o_ > 0u; o_ >>= 1) {\n"
        "%s b_ = __shfl_xor_sync(0xffffffffu, acc_, o_);\nacc_ = ", lanes, ct);
    put_combine(t, kop, "acc_", "b_");
    ags_cg_put(t, ";\n}\n");
}

/* The pass after pass p: the next reduction's index, k->n_ops for the last
 * pass (the element outputs), k->n_ops + 1 past it; p = -1 for the first. */
static int
next_pass(const kernel *k, int p)
{
    for (int i = p + 1; i < k->n_ops; i++) {
        if (ags_kernel_is_reduction(k->ops[i].kop)) {
            return i;
        }
    }
    return p < k->n_ops ? k->n_ops : k->n_ops + 1;
}

/* Marks in need[] (cleared first) the values pass p computes, those in
 * stop[] read rather than computed. */
static void
mark_pass(const kernel *k, int p, char *need, const char *stop)
{
    memset(need, 0, (size_t)k->n_ops);
    if (p < k->n_ops) {
        ags_cg_mark_cone(k, k->ops[p].args[0], need, stop);
        return;
    }
    for (int o = 0; o < k->n_out; o++) {
        ags_cg_mark_cone(k, k->out[o].value, need, stop);
    }
}

/* Marks in kept[] the element values the warp path keeps in registers from
 * the pass that computes them for the later passes that read them: for each
 * pass in order, the values it computes at which a later pass's cone would
 * stop (x for softmax's sum, then exp(x - max) for its division, not x
 * again), AGS_ROWS_KEPT_MAX at most.  Never a load of a strided input (most
 * often a weight or a row statistic broadcast over the rows, which the cache
 * serves).  scratch: 4 n_ops bytes. */
static void
choose_kept(const kernel *k, char *kept, char *scratch)
{
    size_t n = (size_t)k->n_ops;
    char *avail = scratch, *computed = scratch + n, *stop = scratch + 2 * n;
    char *later = scratch + 3 * n;
    int n_kept = 0;
    /* column sums hold registers of their own (put_rows_loop) */
    int most = AGS_ROWS_KEPT_MAX - 2 * ags_kernel_column_outputs(k);

    memset(kept, 0, n);
    memset(avail, 0, n);
    for (int p = next_pass(k, -1); p <= k->n_ops; p = next_pass(k, p)) {
        mark_pass(k, p, computed, avail);
        for (size_t i = 0; i < n; i++) {
            stop[i] = (char)(avail[i] | computed[i]);
        }
        for (int q = next_pass(k, p); q <= k->n_ops; q = next_pass(k, q)) {
            mark_pass(k, q, later, stop);
            for (int i = 0; i < k->n_ops && n_kept < most; i++) {
                const instr *op = &k->ops[i];

                if (later[i] && computed[i] && !avail[i]
                    && !(op->kop == AGS_KOP_LOAD && k->in[op->args[0]].strided)) {
                    kept[i] = avail[i] = 1;
                    n_kept++;
                }
            }
        }
    }
}

/* The element values marked in g->need, in order; a kept value is computed
 * by the first pass that needs it (and put in its register) and read from
 * its register by the later ones.  -1 with an exception set. */
static int
put_pass_values(text *t, rows *g)
{
    const kernel *k = g->k;
    char slot[32];

    ags_cg_put_item_index(t, slot, sizeof slot);
    for (int i = 0; i < k->n_ops; i++) {
        int kept = g->warp && g->kept[i];

        if (!g->need[i]) {
            continue;
        }
        if (kept && g->loaded[i]) {
            ags_cg_put(t, "%s v%d = ca%d[%s];\n", ags_kernel_compute_name(k->ops[i].type),
                i, i, slot);
            continue;
        }
        if (ags_cg_put_instr(t, k, i) < 0) {
            return -1;
        }
        if (kept) {
            ags_cg_put(t, "ca%d[%s] = v%d;\n", i, slot, i);
        }
    }
    return 0;
}

/* What a pass does at each element once its values are known: reduction r
 * accumulates into acc_ (r >= 0), or the element outputs are stored and the
 * column sums added to. */
static void
put_element(text *t, const rows *g, int r)
{
    const kernel *k = g->k;
    char b[48];

    if (r >= 0) {
        const instr *op = &k->ops[r];

        snprintf(b, sizeof b, "(%s)v%d", ags_kernel_compute_name(op->type), op->args[0]);
        ags_cg_put(t, "acc_ = ");
        put_combine(t, op->kop, "acc_", b);
        ags_cg_put(t, ";\n");
        return;
    }
    for (int o = 0; o < k->n_out; o++) {
        if (k->out[o].strided == OUT_COLUMNS) {
            ags_cg_put_column_sum(t, g, o);
        }
        else if (ags_kernel_element_output(k, o)) {
            ags_cg_put_store(t, k, o);
        }
    }
}

/* The step of a pass's vector form: the thread's W columns (text.width)
 * from W cw_, each contiguous or row input this pass reads from memory
 * loaded as one vector, the W elements computed one after the other
 * (text.lane), each contiguous element output stored as one vector.
 * Strided operands are read and written one element at a time. */
static int
put_vector_step(text *t, rows *g, int r)
{
    const kernel *k = g->k;

    ags_cg_put(t, "const long long qw_ = row * (cols / %d) + cw_;\n(void)qw_;\n", t->width);
    for (int s = 0; s < k->n_in; s++) {
        int read = 0;   /* whether this pass loads input s from memory */

        for (int i = 0; i < k->n_ops; i++) {
            const instr *op = &k->ops[i];

            read |= g->need[i] && op->kop == AGS_KOP_LOAD && op->args[0] == s
                    && !(g->warp && g->kept[i] && g->loaded[i]);
        }
        if (read && ags_cg_vector_input(k, s)) {
            const char *v = ags_cg_vector_of(k->in[s].type, t->width);

            /* a row input at the columns' place in its one row */
            ags_cg_put(t, "const %s a%d = ((const %s *)in%d)[%s];\n", v, s, v, s,
                k->in[s].strided == IN_ROW ? "cw_" : "qw_");
        }
    }
    for (int o = 0; r < 0 && o < k->n_out; o++) {
        if (ags_cg_vector_output(k, o)) {
            ags_cg_put(t, "%s o%d;\n", ags_cg_vector_of(k->out[o].type, t->width), o);
        }
    }
    for (t->lane = 0; t->lane < t->width; t->lane++) {
        ags_cg_put(t, "{\nconst long long c = cw_ * %d + %d;\n"
            "const long long i = row * cols + c;\n(void)i;\n", t->width, t->lane);
        if (g->strided) {
            ags_cg_put_indices(t, k->ndim - k->nred, k->ndim, "c", narrow_columns(g));
        }
        if (put_pass_values(t, g) < 0) {
            t->lane = -1;
            return -1;
        }
        put_element(t, g, r);
        ags_cg_put(t, "}\n");
    }
    t->lane = -1;
    for (int o = 0; r < 0 && o < k->n_out; o++) {
        if (ags_cg_vector_output(k, o)) {
            ags_cg_put(t, "((%s *)out%d)[qw_] = o%d;\n",
                ags_cg_vector_of(k->out[o].type, t->width), o, o);
        }
    }
    return 0;
}

/* The head of a pass's loop over this thread's places of the row (var: cw_
 * on a vector form, w columns a place; c on a scalar form), with its
 * bounds check open.  The warp path's loop has a constant count (unrolled:
 * its loads all in flight, its register arrays registers); so has the block
 * path's last pass with its column sums in registers: steps of kc_ places a
 * thread from place s_, kc_ * blockDim.x places a step (one step covers the
 * row under the block the driver launches; a smaller one takes several). */
static void
put_pass_head(text *t, const rows *g, int r, const char *var, int w)
{
    char scale[16] = "";

    if (w > 1) {
        snprintf(scale, sizeof scale, " * %d", w);
    }
    if (g->warp || (g->regs && r < 0)) {
        if (g->warp && w > 1) {
            ags_cg_put(t, "#pragma unroll\nfor (int j_ = 0; j_ < AGS_WARP_ITEMS / %d; j_++) {\n"
                "const long long %s = lane_ + (long long)j_ * AGS_WARP_LANES;\n", w, var);
        }
        else if (g->warp) {
            ags_cg_put(t, "#pragma unroll\nfor (int j_ = 0; j_ < AGS_WARP_ITEMS; j_++) {\n"
                "const long long %s = lane_ + (long long)j_ * AGS_WARP_LANES;\n", var);
        }
        else {
            ags_cg_put(t, "for (long long s_ = 0; s_%s < cols; s_ += (long long)kc_ * blockDim.x) {\n"
                "#pragma unroll\nfor (int j_ = 0; j_ < kc_; j_++) {\n"
                "const long long %s = s_ + threadIdx.x + (long long)j_ * blockDim.x;\n",
                scale, var);
        }
        ags_cg_put(t, "if (%s%s < cols) {\n", var, scale);
    }
    else {
        ags_cg_put(t, "#pragma unroll %d\n"
            "for (long long %s = threadIdx.x; %s%s < cols; %s += blockDim.x) {\n",
            w > 1 ? 2 : 4, var, var, scale, var);
    }
}

/* One pass over the row computing the values marked in g->need at each of
 * this thread's elements, then put_element(r); a vector form takes
 * text.width columns a step. */
static int
put_pass(text *t, rows *g, int r)
{
    const kernel *k = g->k;

    if (g->vector) {
        put_pass_head(t, g, r, "cw_", t->width);
        if (put_vector_step(t, g, r) < 0) {
            return -1;
        }
    }
    else {
        put_pass_head(t, g, r, "c", 1);
        ags_cg_put(t, "const long long i = row * cols + c;\n(void)i;\n");
        if (g->strided) {
            ags_cg_put_indices(t, k->ndim - k->nred, k->ndim, "c", narrow_columns(g));
        }
        if (put_pass_values(t, g) < 0) {
            return -1;
        }
        put_element(t, g, r);
    }
    if (g->regs && r < 0 && !g->warp) {
        ags_cg_put(t, "}\n}\nif (multi_) {\n");   /* the step's sums to the slot's row */
        ags_cg_put_column_flush(t, g, "+=");
        ags_cg_put(t, "}\n}\n");
    }
    else {
        ags_cg_put(t, g->warp ? "}\n}\n" : "}\n");
    }
    /* the kept values this pass computed are in their registers now */
    for (int i = 0; g->warp && i < k->n_ops; i++) {
        g->loaded[i] |= g->need[i] && g->kept[i];
    }
    return 0;
}

/* One pass over the row for reduction `r`, leaving its value in v<r> on
 * every thread of the row. */
static int
put_reduction(text *t, rows *g, int r)
{
    const kernel *k = g->k;
    const instr *op = &k->ops[r];
    const char *ct = ags_kernel_compute_name(op->type);
    const char *sh = shared_of(op->type);

    ags_cg_put(t, "%s v%d;\n{\n%s acc_ = ", ct, r, ct);
    put_identity(t, op);
    ags_cg_put(t, ";\n");
    mark_pass(k, r, g->need, g->warp ? g->loaded : NULL);
    if (put_pass(t, g, r) < 0) {
        return -1;
    }
    if (g->warp) {
        put_shuffle_combine(t, op->kop, ct, "AGS_WARP_LANES");
        ags_cg_put(t, "v%d = acc_;\n}\n", r);
        return 0;
    }
    /* within each warp by shuffles (within the block, when it is smaller than
     * a warp, as in the host harness), the warps' partials through shared
     * memory, those by the first warp: two barriers a reduction */
    put_shuffle_combine(t, op->kop, ct, "(blockDim.x < 32u ? blockDim.x : 32u)");
    ags_cg_put(t, "if ((threadIdx.x & 31u) == 0) %s[threadIdx.x >> 5] = acc_;\n"
        "__syncthreads();\n"
        "if (threadIdx.x < 32u) {\n"
        "acc_ = threadIdx.x < (blockDim.x + 31u) / 32u ? %s[threadIdx.x] : ", sh, sh);
    put_identity(t, op);
    ags_cg_put(t, ";\n");
    put_shuffle_combine(t, op->kop, ct, "(blockDim.x < 32u ? blockDim.x : 32u)");
    ags_cg_put(t, "if (threadIdx.x == 0) %s[0] = acc_;\n}\n__syncthreads();\n"
        "v%d = %s[0];\n__syncthreads();\n}\n", sh, r, sh);
    return 0;
}

/* The row values not computed yet whose operands are all known (per-row
 * loads need none), in order. */
static int
put_ready_row_values(text *t, rows *g)
{
    const kernel *k = g->k;

    for (int i = 0; i < k->n_ops; i++) {
        const instr *op = &k->ops[i];
        int ready = op->variance == PER_ROW && !ags_kernel_is_reduction(op->kop)
                    && !g->done[i];

        for (int a = 0; ready && op->kop != AGS_KOP_LOAD && a < op->n; a++) {
            const instr *arg = &k->ops[op->args[a]];
            ready = arg->variance == UNIFORM || g->done[op->args[a]];
        }
        if (ready) {
            if (ags_cg_put_instr(t, k, i) < 0) {
                return -1;
            }
            g->done[i] = 1;
        }
    }
    return 0;
}

/* The work on one row (inside the path's row loop, `row` defined): the row
 * values of per-row inputs, the reductions with the row values that follow
 * from them, the element outputs, the row outputs. */
static int
put_row(text *t, rows *g)
{
    const kernel *k = g->k;
    int element_outputs = 0;

    if (g->strided || read_through_rows(k)) {
        ags_cg_put_indices(t, 0, k->ndim - k->nred, "row", NULL);
    }
    for (int i = 0; g->warp && i < k->n_ops; i++) {
        if (g->kept[i]) {
            ags_cg_put(t, "%s ca%d[AGS_WARP_ITEMS];\n",
                ags_kernel_compute_name(k->ops[i].type), i);
        }
    }
    memset(g->done, 0, (size_t)k->n_ops);
    memset(g->loaded, 0, (size_t)k->n_ops);
    if (put_ready_row_values(t, g) < 0) {
        return -1;
    }
    for (int r = 0; r < k->n_ops; r++) {
        if (!ags_kernel_is_reduction(k->ops[r].kop)) {
            continue;
        }
        if (put_reduction(t, g, r) < 0) {
            return -1;
        }
        g->done[r] = 1;
        /* the row values that are known now */
        if (put_ready_row_values(t, g) < 0) {
            return -1;
        }
    }
    for (int o = 0; o < k->n_out; o++) {   /* stored or summed at each element */
        element_outputs |= k->out[o].strided != OUT_ROW;
    }
    mark_pass(k, k->n_ops, g->need, g->warp ? g->loaded : NULL);
    if (element_outputs && put_pass(t, g, -1) < 0) {
        return -1;
    }
    ags_cg_put(t, "if (%s == 0) {\n", g->warp ? "lane_" : "threadIdx.x");
    for (int o = 0; o < k->n_out; o++) {
        if (k->out[o].strided == OUT_ROW) {
            ags_cg_put_store(t, k, o);
        }
    }
    ags_cg_put(t, "}\n");
    return 0;
}

/* The path's loop over rows: a warp a row (warps_ rows a block at a time)
 * or a block a row.  With column sums the rows are dealt to nslot slots (a
 * warp each, those past nslot idle; or a block each, in a grid-stride loop,
 * so that a grid shaped for the warp path, a block for 8 slots, still takes
 * them all when a row falls to the block path), slot s taking rows s,
 * s + nslot, ..., so that each column of a slot's sums is one thread's. */
static int
put_rows_loop(text *t, rows *g)
{
    if (g->columns) {
        ags_cg_put(t, g->warp
            ? "{\nconst long long slot_ = (long long)blockIdx.x * warps_"
              " + threadIdx.x / AGS_WARP_LANES;\nif (slot_ < nslot) {\n"
            : "for (long long slot_ = blockIdx.x; slot_ < nslot; slot_ += gridDim.x) {\n{\n");
        ags_cg_put_columns_start(t, g);
        ags_cg_put(t, "for (long long row = slot_; row < rows; row += nslot) {\n");
        if (put_row(t, g) < 0) {
            return -1;
        }
        ags_cg_put(t, "}\n");
        ags_cg_put_columns_end(t, g);
        ags_cg_put(t, "}\n}\n");
        return 0;
    }
    if (g->warp) {
        ags_cg_put(t, "for (long long row = (long long)blockIdx.x * warps_"
            " + threadIdx.x / AGS_WARP_LANES; row < rows; row += (long long)gridDim.x * warps_)"
            " {\n");
    }
    else {
        ags_cg_put(t, "for (long long row = blockIdx.x; row < rows; row += gridDim.x) {\n");
    }
    if (put_row(t, g) < 0) {
        return -1;
    }
    ags_cg_put(t, "}\n");
    return 0;
}

/* A path (g->warp says which): its vector form first, when the kernel has
 * one (`vector`) and the sizes and pointers allow, else its scalar form. */
static int
put_path(text *t, rows *g, int vector)
{
    int regs = g->regs;

    if (vector) {
        ags_cg_put(t, "if (cols %% %d == 0 && ", t->width);
        ags_cg_put_aligned(t, g->k);
        ags_cg_put(t, ") { /* its vector form */\n");
        g->vector = 1;
        if (put_rows_loop(t, g) < 0) {
            return -1;
        }
        ags_cg_put(t, "}\nelse {\n");
    }
    g->vector = 0;
    /* beside a vector form, the scalar form is for misaligned rows: its column
     * sums stay in memory (unrolled over a long row's places, it would cost
     * the kernel's compile more than those rows are worth) */
    g->regs = regs && !vector;
    if (put_rows_loop(t, g) < 0) {
        return -1;
    }
    g->regs = regs;
    ags_cg_put(t, vector ? "}\n" : "");
    return 0;
}

/* Whether the paths have a vector form: every contiguous or row input and
 * element output of a type with a vector of the kernel's width, and one
 * contiguous input at least (strided operands go one element at a time). */
static int
rows_vectorizable(const text *t, const kernel *k)
{
    int contiguous = 0;

    for (int i = 0; i < k->n_in; i++) {
        if (ags_cg_vector_input(k, i)
            && ags_cg_vector_of(k->in[i].type, t->width) == NULL) {
            return 0;
        }
        contiguous |= k->in[i].strided == IN_CONTIGUOUS;
    }
    for (int o = 0; o < k->n_out; o++) {
        if (ags_cg_vector_output(k, o)
            && ags_cg_vector_of(k->out[o].type, t->width) == NULL) {
            return 0;
        }
    }
    return contiguous;
}

int
ags_cg_put_rows(text *t, const kernel *k, char *need, char *done, int warp,
                const char *block_call)
{
    int outer = k->ndim - k->nred;
    int uses_shared[3] = {0, 0, 0};
    char *kept = PyMem_Calloc((size_t)k->n_ops + 1, 1);
    char *loaded = PyMem_Calloc((size_t)k->n_ops + 1, 1);
    char *scratch = PyMem_Calloc((size_t)k->n_ops + 1, 4);
    rows g = {.k = k, .warp = 1, .strided = ags_cg_any_strided(k), .need = need,
              .done = done, .kept = kept, .loaded = loaded,
              .columns = ags_kernel_column_outputs(k)};
    int vector = rows_vectorizable(t, k), rc = -1;

    if (kept == NULL || loaded == NULL || scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    choose_kept(k, kept, scratch);
    ags_cg_put(t, "long long rows = 1, cols = 1;\n");
    for (int d = 0; d < k->ndim; d++) {
        ags_cg_put(t, "%s *= n%d;\n", d < outer ? "rows" : "cols", d);
    }
    for (int i = 0; block_call == NULL && i < k->n_ops; i++) {  /* the block path's */
        if (ags_kernel_is_reduction(k->ops[i].kop)) {
            ags_kernel_family_t f = ags_kernel_family(k->ops[i].type);
            uses_shared[f == FLOAT_LIKE ? 0 : f == DOUBLE_LIKE ? 1 : 2] = 1;
        }
    }
    if (uses_shared[0]) {
        ags_cg_put(t, "__shared__ float ags_sh_f[AGS_BLOCK_MAX];\n");
    }
    if (uses_shared[1]) {
        ags_cg_put(t, "__shared__ double ags_sh_d[AGS_BLOCK_MAX];\n");
    }
    if (uses_shared[2]) {
        ags_cg_put(t, "__shared__ long long ags_sh_i[AGS_BLOCK_MAX];\n");
    }
    if (ags_cg_put_uniforms(t, k) < 0) {
        goto done;
    }
    /* the warp path: warps_ rows a block at a time, lane_ the thread's lane;
     * its vectors are of 4 where the kernel's are of 8 (every type with a
     * vector of 8 has one of 4): on an H100, bf16 rows of 1024 ran no faster
     * on vectors of 8 (softmax, 0.47 of peak against 0.46), and layer norm
     * slower (0.37 against 0.46) */
    if (warp) {
        int width = t->width, failed;
        /* where the row's length is told and a multiple of 4, the warp path
         * is its vector form alone: its scalar form, unrolled, was about
         * half of the kernel's compile, for rows of that length only their
         * pointers' misalignment would send there; those take the block
         * path (a view at an odd offset: rare, and still right) */
        int vector_only = vector && k->cols > 0 && k->cols % 4 == 0;

        t->width = 4;
        ags_cg_put(t, "if (cols <= %d", k->warp_cols);
        if (vector_only) {
            ags_cg_put(t, " && cols %% 4 == 0 && ");
            ags_cg_put_aligned(t, k);
        }
        ags_cg_put(t, ") { /* the warp path%s */\n"
            "const unsigned int lane_ = threadIdx.x %% AGS_WARP_LANES;\n"
            "const long long warps_ = blockDim.x / AGS_WARP_LANES;\n",
            vector_only ? ", its vector form alone" : "");
        g.warp = 1;
        if (vector_only) {
            g.vector = 1;
            failed = put_rows_loop(t, &g) < 0;
        }
        else {      /* a told length not a multiple of 4: the scalar form alone */
            failed = put_path(t, &g, vector && k->cols == 0) < 0;
        }
        t->width = width;
        if (failed) {
            goto done;
        }
        ags_cg_put(t, "}\nelse ");
        if (block_call != NULL) {
            ags_cg_put(t, "{ /* the block path */\n%s}\n", block_call);
            rc = 0;
            goto done;
        }
    }
    ags_cg_put(t, "{ /* the block path */\n");
    g.warp = 0;
    /* column sums need a told length (partition.py); past the warp path's
     * lengths they stay in registers, sized for the smallest block the driver
     * launches for that length.  Behind a warp path (misaligned rows only)
     * they stay in memory: unrolled there, the block path doubled the
     * kernel's compile (0.24 to 0.49 s for rows of 1024) */
    g.regs = g.columns > 0 && k->cols > 0 && k->cols <= AGS_NVRTC_COLUMN_COLS && !warp;
    if (g.regs) {
        ags_cg_put(t, "#ifndef AGS_COLUMN_BLOCK\n#define AGS_COLUMN_BLOCK %d\n#endif\n",
            ags_column_block(k->cols));
    }
    /* with a told length, a vector form the rows cannot take is left out:
     * where the warp path comes first, rows reach the block path only
     * misaligned (or of another length than told), and past it, the
     * length must be a multiple of the vectors' width */
    if (k->cols > 0 && (warp || k->cols % t->width != 0)) {
        vector = 0;
    }
    if (put_path(t, &g, vector) < 0) {
        goto done;
    }
    ags_cg_put(t, "}\n");
    rc = 0;
done:
    PyMem_Free(kept);
    PyMem_Free(loaded);
    PyMem_Free(scratch);
    return rc;
}
