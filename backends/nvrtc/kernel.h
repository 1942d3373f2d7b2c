/* kernel.h: a fused kernel's description in C (describe.c reads it,
 * codegen.c writes its source).  Internal to backends/nvrtc. */
#ifndef AGS_NVRTC_KERNEL_H
#define AGS_NVRTC_KERNEL_H

#include <Python.h>

#include "protocol.h"

#define AGS_KERNEL_MAX_DIMS 16
#define AGS_KERNEL_MAX_ITEMS 4096

/* The longest row a ROWS kernel's warp path takes (one warp a row, the row
 * in registers); longer rows take the block path.  codegen_rows.c writes it
 * into the kernel (or less, kernel.warp_cols, where the description gives a
 * shorter row), driver.c launches the warp path's geometry up to it. */
#define AGS_NVRTC_WARP_COLS 1024

/* The longest row whose column sums (a norm's weight and bias gradients)
 * join its row kernel: on the block path each thread keeps its columns'
 * sums in registers, cols / AGS_COLUMN_BLOCK_MAX of each (32 here). */
#define AGS_NVRTC_COLUMN_COLS 8192
#define AGS_COLUMN_BLOCK_MAX 256

/* The block a ROWS kernel's block path runs on, rows of `cols`: about four
 * elements of the row a thread (loads in flight, reductions that stay in
 * registers), a power of two from a warp to `cap` threads and to `most`
 * (what the function can launch, from its registers).  driver.c launches
 * it, capped at AGS_ROWS_BLOCK_MAX, or at AGS_COLUMN_BLOCK_MAX for a kernel
 * with column sums, whose registers codegen_columns.c sizes for it. */
#define AGS_ROWS_BLOCK_MAX 512

static inline int
ags_rows_block(long long cols, int most, int cap)
{
    int block = 32;

    while ((long long)block * 4 < cols && block < cap && block * 2 <= most) {
        block *= 2;
    }
    return block;
}

/* The block of a kernel with column sums, as many threads as it can launch. */
static inline int
ags_column_block(long long cols)
{
    return ags_rows_block(cols, AGS_COLUMN_BLOCK_MAX, AGS_COLUMN_BLOCK_MAX);
}

/* What a storage type computes in. */
typedef enum { INT_LIKE, FLOAT_LIKE, DOUBLE_LIKE, BOOL_LIKE } ags_kernel_family_t;

enum { UNIFORM = 0, PER_ROW = 1, PER_ELEMENT = 2 };

typedef struct {
    int kop, type, n, args[3];
    double imm;
    int variance;
} instr;

/* How an input is read: at the element's linear index (contiguous in the
 * space), through strides (passed in; 0 along a broadcast dimension), or,
 * in a ROWS kernel, as a row: the same values for every row, contiguous
 * along it, at the element's index within the row (a norm's weight); or,
 * in a ROWS kernel, once per row, at the row's index (contiguous, one value
 * a row: a statistic a forward saved), its value a row value; or, in a ROWS
 * kernel, once per row through strides over the rows' dimensions alone
 * (passed in), an input the same along every reduced dimension (a batch
 * norm's per-channel weight under a pooling's sum), its value a row value. */
enum { IN_CONTIGUOUS = 0, IN_STRIDED = 1, IN_ROW = 2, IN_PER_ROW = 3,
       IN_ROW_STRIDED = 4, IN_FLAGS };

typedef struct {
    int type, strided;  /* strided: one of the IN_ flags */
} operand;

/* Where an output is written: at each element, at its linear index
 * (contiguous in the space) or through strides (passed in), whatever the
 * value's variance (a row value is the same at every element of its row);
 * or, in a ROWS kernel, once a row, at the row's index (contiguous: a row
 * value, such as a norm's mean); or as column sums: an element value
 * summed over the rows, each of the kernel's `nslot` row slots (a parameter
 * after the strides) adding its rows into its own row of an (nslot, cols)
 * array of the value's compute type, which the caller then sums over the
 * slots (a norm's weight gradient).  describe.c checks the place against
 * the value's variance. */
enum { OUT_CONTIGUOUS = 0, OUT_STRIDED = 1, OUT_COLUMNS = 2, OUT_ROW = 3 };

typedef struct {
    int value, type;
    int strided;    /* the place: OUT_CONTIGUOUS, OUT_STRIDED, OUT_COLUMNS or OUT_ROW */
} output;

typedef struct {
    const char *name;
    int kind, ndim, nred;
    /* Where the description gives it (static sizes), the row's length in a
     * ROWS kernel, the element count in a POINTWISE one; else 0.  And the
     * longest row the warp path takes: the row's length rounded up to 128
     * (a lane's items, a multiple of 4), at most AGS_NVRTC_WARP_COLS, which
     * it is where the length is not given. */
    long long cols;
    int warp_cols;
    int n_in, n_ops, n_out;
    operand *in;
    instr *ops;
    output *out;
} kernel;

/* Reads and checks `desc` (borrowed) into *k, with every value's variance.
 * 0, or -1 with ValueError/TypeError; *k must be freed either way. */
int ags_kernel_read(PyObject *desc, kernel *k);
void ags_kernel_free(kernel *k);

ags_kernel_family_t ags_kernel_family(int ktype);
/* The C type values of `ktype` compute in ("float" for fp16 too). */
const char *ags_kernel_compute_name(int ktype);
/* The C type `ktype` is stored as. */
const char *ags_kernel_storage_name(int ktype);
/* The bytes a value of `ktype` takes in memory. */
int ags_kernel_storage_bytes(int ktype);
const char *ags_kernel_kop_name(int kop);
int ags_kernel_is_reduction(int kop);
/* How many of k's outputs are column sums (OUT_COLUMNS). */
int ags_kernel_column_outputs(const kernel *k);
/* Whether output o is written at each element (OUT_CONTIGUOUS, OUT_STRIDED). */
int ags_kernel_element_output(const kernel *k, int o);

#endif /* AGS_NVRTC_KERNEL_H */
