/* codegen_pointwise.c: the body of a POINTWISE kernel (codegen.c writes
 * the rest): a grid-stride loop over the elements, each computing the
 * values its outputs need and storing them; before it, where every operand
 * is contiguous and of a type with a vector of the kernel's width, a vector
 * path that takes W elements a step, loading and storing 16 bytes of each
 * operand at once, when the count and every pointer allow it. */

#include <Python.h>
#include <string.h>

#include "codegen.h"
#include "kernel.h"

/* Whether a kernel gets a vector path: every operand contiguous and of a
 * type with a vector of the kernel's width. */
static int
vectorizable(const text *t, const kernel *k)
{
    if (ags_cg_any_strided(k)) {
        return 0;
    }
    for (int i = 0; i < k->n_in; i++) {
        if (ags_cg_vector_of(k->in[i].type, t->width) == NULL) {
            return 0;
        }
    }
    for (int i = 0; i < k->n_out; i++) {
        if (ags_cg_vector_of(k->out[i].type, t->width) == NULL) {
            return 0;
        }
    }
    return 1;
}

/* The vector path: taken when the count is a multiple of the width W and
 * every pointer is aligned to its vector; each step loads W values of each
 * input at once, computes the W elements and stores W values of each output
 * at once. */
static int
put_vector_path(text *t, const kernel *k, const char *need)
{
    ags_cg_put(t, "if (total %% %d == 0 && ", t->width);
    ags_cg_put_aligned(t, k);
    ags_cg_put(t, ") {\n");
    ags_cg_put(t, "for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;"
        " j < total / %d; j += (long long)gridDim.x * blockDim.x) {\n", t->width);
    for (int i = 0; i < k->n_in; i++) {
        const char *v = ags_cg_vector_of(k->in[i].type, t->width);

        ags_cg_put(t, "const %s a%d = ((const %s *)in%d)[j];\n", v, i, v, i);
    }
    for (int o = 0; o < k->n_out; o++) {
        ags_cg_put(t, "%s o%d;\n", ags_cg_vector_of(k->out[o].type, t->width), o);
    }
    for (t->lane = 0; t->lane < t->width; t->lane++) {
        ags_cg_put(t, "{\n");
        if (ags_cg_put_marked(t, k, need) < 0) {
            t->lane = -1;
            return -1;
        }
        for (int o = 0; o < k->n_out; o++) {
            ags_cg_put_store(t, k, o);
        }
        ags_cg_put(t, "}\n");
    }
    t->lane = -1;
    for (int o = 0; o < k->n_out; o++) {
        ags_cg_put(t, "((%s *)out%d)[j] = o%d;\n",
            ags_cg_vector_of(k->out[o].type, t->width), o, o);
    }
    ags_cg_put(t, "}\nreturn;\n}\n");
    return 0;
}

int
ags_cg_put_pointwise(text *t, const kernel *k, char *need)
{
    ags_cg_put(t, "const long long total = 1");
    for (int d = 0; d < k->ndim; d++) {
        ags_cg_put(t, " * n%d", d);
    }
    ags_cg_put(t, ";\n");
    if (ags_cg_any_strided(k) && k->cols == 0) {
        ags_cg_put(t, "const bool narrow_ = total <= 0xffffffffLL;\n");
    }
    if (ags_cg_put_uniforms(t, k) < 0) {
        return -1;
    }
    memset(need, 0, (size_t)k->n_ops);
    for (int o = 0; o < k->n_out; o++) {
        ags_cg_mark_cone(k, k->out[o].value, need, NULL);
    }
    if (vectorizable(t, k) && put_vector_path(t, k, need) < 0) {
        return -1;
    }
    ags_cg_put(t, "for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;"
        " i < total; i += (long long)gridDim.x * blockDim.x) {\n");
    if (ags_cg_any_strided(k)) {
        /* the count told (static sizes): one form, the one it fits */
        ags_cg_put_indices(t, 0, k->ndim, "i",
                           k->cols == 0 ? "narrow_" : k->cols <= 0xffffffffLL ? "1" : NULL);
    }
    if (ags_cg_put_marked(t, k, need) < 0) {
        return -1;
    }
    for (int o = 0; o < k->n_out; o++) {
        ags_cg_put_store(t, k, o);
    }
    ags_cg_put(t, "}\n");
    return 0;
}
