/* codegen.h: what codegen.c (the text buffer, instructions, loads and
 * stores, the whole source), codegen_pointwise.c (pointwise kernels' body),
 * codegen_rows.c and codegen_columns.c (row kernels: a warp per short row, a
 * block per long one; their column sums) share.  Internal to the nvrtc backend's code generation; nvrtc.h is
 * its interface to the module.
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
    int width;          /* the kernel's vector step: 4 or 8 lanes */
} text;

void ags_cg_put(text *t, const char *fmt, ...);
/* The literal of x in kernel type `type`, exact for every double. */
void ags_cg_put_number(text *t, int type, double x);
/* Instruction i's value, v<i>; -1 with an exception set. */
int ags_cg_put_instr(text *t, const kernel *k, int i);
/* Output o stored at its place: the element's, or the row's (OUT_ROW). */
void ags_cg_put_store(text *t, const kernel *k, int o);
/* The indices of dimensions lo..hi-1 from the linear index `var`, in 32
 * bits where `narrow` ("1", or a condition; NULL: never). */
void ags_cg_put_indices(text *t, int lo, int hi, const char *var, const char *narrow);
/* How many leading dimensions input i's strides cover (0: none passed). */
int ags_cg_input_strides(const kernel *k, int i);
/* Marks in need[] the element values value v depends on, itself included,
 * not looking past the values in stop[] (NULL: none). */
void ags_cg_mark_cone(const kernel *k, int v, char *need, const char *stop);
/* The marked instructions, in order; -1 with an exception set. */
int ags_cg_put_marked(text *t, const kernel *k, const char *need);
/* The instructions of constants only, before any loop. */
int ags_cg_put_uniforms(text *t, const kernel *k);
/* Whether any input or output is read or written through strides at each
 * element (an input read as a row is not: its index is the element's within
 * the row; nor one read once a row through its strides). */
int ags_cg_any_strided(const kernel *k);

/* The vector path's machinery (pointwise kernels, and the vector forms of
 * both paths of row kernels).  With text.lane = l >= 0, a load of a
 * contiguous input reads lane l of a<input> and a store of a contiguous
 * element output writes lane l of o<output>, vectors of text.width the
 * caller declares; strided operands are read and written one element at a
 * time, through the indices. */
/* The lanes of k's vector step: 8 where every operand moved as a vector is
 * 2 bytes or narrower (so fp16 and bf16 move 16 bytes a load, as fp32
 * does), else 4. */
int ags_cg_vector_width(const kernel *k);
/* The vector type of `width` values of storage type `type`, or NULL (none). */
const char *ags_cg_vector_of(int type, int width);
/* Whether input i is read as vectors where the kernel's vector form is taken
 * (contiguous, or a row). */
int ags_cg_vector_input(const kernel *k, int i);
/* Whether output o is a contiguous element output (stored as vectors). */
int ags_cg_vector_output(const kernel *k, int o);
/* A condition: every contiguous input and element output aligned to its
 * vector. */
void ags_cg_put_aligned(text *t, const kernel *k);

/* A ROWS kernel's second function, its block path alone (driver.c launches
 * it for rows longer than AGS_NVRTC_WARP_COLS): the name, then this. */
#define AGS_NVRTC_BLOCK_SUFFIX "_block"

/* codegen_pointwise.c: the body of a POINTWISE kernel; -1 with an
 * exception set.  need: scratch, n_ops bytes. */
int ags_cg_put_pointwise(text *t, const kernel *k, char *need);

/* codegen_rows.c: the body of a ROWS kernel: the block path alone (warp
 * 0), or the warp path and, for the rows it does not take, the block path
 * (block_call NULL) or the statement block_call (a call of the block path's
 * function). */
int ags_cg_put_rows(text *t, const kernel *k, char *need, char *done, int warp,
                    const char *block_call);

#endif
