/* codegen_rows.h: what codegen_rows.c (a row kernel's paths, passes and
 * reductions) and codegen_columns.c (its column sums) share.  Internal to
 * the nvrtc backend's code generation.
 */
#ifndef AGS_NVRTC_CODEGEN_ROWS_H
#define AGS_NVRTC_CODEGEN_ROWS_H

#include "codegen.h"

/* A row kernel being written: the path and form, and the scratch marks of
 * the values its passes compute. */
typedef struct {
    const kernel *k;
    int warp;           /* 1: the warp path, 0: the block path */
    int vector;         /* 1: the path's vector form */
    int strided;
    char *need;         /* scratch: the values a pass computes */
    char *done;         /* row values computed so far */
    const char *kept;   /* values kept in ca<i>[] (warp path) */
    char *loaded;       /* kept values an earlier pass has computed */
    int columns;        /* how many outputs are column sums */
    int regs;           /* the block path's column sums in registers */
} rows;

/* The index, in a thread's register arrays (kept values, column sums), of
 * the element the pass is at, into buf. */
void ags_cg_put_item_index(const text *t, char *buf, size_t size);
/* Output o's column sum at this element (codegen_columns.c). */
void ags_cg_put_column_sum(text *t, const rows *g, int o);
/* The block path's column sums in registers into the slot's row: op "+="
 * after a step from place s_ (then zeroed), "=" after the one step. */
void ags_cg_put_column_flush(text *t, const rows *g, const char *op);
/* Before a slot's first row, and after its last. */
void ags_cg_put_columns_start(text *t, const rows *g);
void ags_cg_put_columns_end(text *t, const rows *g);

#endif
