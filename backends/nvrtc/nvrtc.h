/* nvrtc.h: agspeed's fused CUDA kernels, the C half (backends/nvrtc).
 *
 *   codegen.c   a kernel's description -> its CUDA C source (row kernels'
 *               bodies in codegen_rows.c)
 *   driver.c    libnvrtc and libcuda, opened at run time (dlopen): NVRTC
 *               compiles a source to PTX or a cubin, the driver loads it
 *               and launches the kernel on a stream
 *
 * Neither library is linked: agspeed builds and imports where CUDA is
 * absent, and Python asks driver.c what could be opened and says why not.
 */
#ifndef AGS_NVRTC_H
#define AGS_NVRTC_H

#include <Python.h>

/* desc: borrowed (the tuple codegen.c documents). Returns a new reference,
 * the source, or NULL with ValueError/TypeError naming what is wrong. */
PyObject *ags_nvrtc_source(PyObject *desc);

/* Adds the module's nvrtc functions and the CudaKernel type.  0 or -1. */
int ags_nvrtc_init(PyObject *module);

#endif /* AGS_NVRTC_H */
