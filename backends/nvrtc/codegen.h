/* codegen.h: what codegen.c (the text buffer, instructions, loads and stores,
 * pointwise kernels, the whole source) and codegen_rows.c (row kernels: one
 * block per row, reductions across the block) share.  Internal to the nvrtc
 * backend's code generation; nvrtc.h is its interface to the module.
 */
#ifndef AGS_NVRTC_CODEGEN_H
#define AGS_NVRTC_CODEGEN_H

#include <Python.h>

#include "kernel.h"

/* A growing text buffer: writes after a failed allocation are dropped and
 * `failed` says so. */
typedef struct {
    char *data;
    size_t len, cap;
    int failed;
    int lane;           /* >= 0: writing lane <lane> of a vector step */
} text;

void ags_cg_put(text *t, const char *fmt, ...);
/* The literal of x in kernel type `type`, exact for every double. */
void ags_cg_put_number(text *t, int type, double x);
/* Instruction i's value, v<i>; -1 with an exception set. */
int ags_cg_put_instr(text *t, const kernel *k, int i);
/* Output o stored at the element (per_row 0) or at the row's index. */
void ags_cg_put_store(text *t, const kernel *k, int o, int per_row);
/* The indices of dimensions lo..hi-1 from the linear index `var`. */
void ags_cg_put_indices(text *t, int lo, int hi, const char *var);
/* Marks in need[] the instructions value v depends on. */
void ags_cg_mark_cone(const kernel *k, int v, char *need);
/* The marked instructions, in order; -1 with an exception set. */
int ags_cg_put_marked(text *t, const kernel *k, const char *need);
/* The instructions of constants only, before any loop. */
int ags_cg_put_uniforms(text *t, const kernel *k);
/* Whether any input or output is read or written through strides. */
int ags_cg_any_strided(const kernel *k);

/* codegen_rows.c: the body of a ROWS kernel. */
int ags_cg_put_rows(text *t, const kernel *k, char *need, char *done);

#endif
