"""Running a fused kernel's CUDA C on the CPU, to check its arithmetic without a GPU.

codegen.c's kernels compile as host C++ when ``AGS_HOST`` is defined: this shim gives them
one thread per block and one block (the kernels loop over their elements and rows, so
that covers everything), host math, and conversions to and from fp16 (GCC's
``_Float16``) and bf16.  A kernel with column sums runs once per row slot instead (its
last int), as block ``blockIdx.x`` of a grid of that many, as the driver launches it.
``run(desc, tensors, ints)`` builds the source with g++ into a shared library, cached per
source in a temporary directory removed when the process exits, and calls the kernel
through ctypes with the tensors' data pointers.
"""

import atexit
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading

from agspeed import _C
from agspeed.backends.nvrtc import kernels

SHIM = r"""
#include <math.h>
#include <string.h>
#define AGS_HOST 1
#define AGS_BLOCK_MAX 1024
#ifndef AGS_COLUMN_BLOCK
#define AGS_COLUMN_BLOCK 1
#endif
#define __global__
#define __device__
#define __noinline__
#define __shared__ static
#define __restrict__ __restrict
struct ags_dim3 { unsigned int x, y, z; };
static const ags_dim3 threadIdx = {0, 0, 0}, blockDim = {1, 1, 1};
static ags_dim3 blockIdx = {0, 0, 0}, gridDim = {1, 1, 1};
extern "C" void ags_host_block(unsigned int b, unsigned int g)
{ blockIdx.x = b; gridDim.x = g; }
static inline void __syncthreads() {}
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, unsigned) { return v; }
struct float4 { float x, y, z, w; };
struct ushort4 { unsigned short x, y, z, w; };
struct int4 { int x, y, z, w; };
struct char4 { signed char x, y, z, w; };
struct uchar4 { unsigned char x, y, z, w; };
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float ags_from_f16(unsigned short h)
{ _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static inline unsigned short ags_to_f16(float x)
{ _Float16 f = (_Float16)x; unsigned short h; memcpy(&h, &f, 2); return h; }
static inline float ags_from_bf16(unsigned short b)
{ unsigned int u = ((unsigned int)b) << 16; float f; memcpy(&f, &u, 4); return f; }
static inline unsigned short ags_to_bf16(float f)
{ unsigned int u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u); return (unsigned short)(u >> 16); }
static inline double ags_f64_bits(unsigned long long b)
{ double d; memcpy(&d, &b, 8); return d; }
"""

_DIR = tempfile.mkdtemp(prefix="agspeed-nvrtc-host-")
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
_LIBS = {}
_LOCK = threading.Lock()   # the backend makes a graph's kernels on several threads


def build(source: str, defines: str = "") -> ctypes.CDLL:
    """``defines``: lines put before the shim (``#define AGS_COLUMN_BLOCK 64``: the
    column sums' registers sized for blocks of 64 threads, so that the harness's
    one-thread block takes the several steps a small block takes)."""
    key = hashlib.sha256((defines + source).encode()).hexdigest()[:16]
    with _LOCK:
        return _build(defines + SHIM + source, key)


def _build(source: str, key: str) -> ctypes.CDLL:
    if key not in _LIBS:
        src = os.path.join(_DIR, f"k{key}.cpp")
        lib = os.path.join(_DIR, f"k{key}.so")
        with open(src, "w") as f:
            f.write(source)
        subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", lib, src], check=True,
                       capture_output=True, text=True)
        _LIBS[key] = ctypes.CDLL(lib)
    return _LIBS[key]


def run(desc: tuple, tensors: list, ints: list, function: str = "",
        blocks: int | None = None, defines: str = "") -> None:
    """Runs the kernel of ``desc`` on CPU ``tensors`` (inputs then outputs) with ``ints``
    (sizes, then strides), as the launcher passes them; ``function``: the suffix of
    a row kernel's other function ("_block"); ``blocks``: a grid of that many blocks,
    where a kernel with column sums gets one a row slot; ``defines``: as ``build``'s."""
    lib = build(_C.nvrtc_source(desc), defines)
    fn = getattr(lib, desc[0] + function)
    fn.restype = None
    args = [ctypes.c_void_p(t.data_ptr()) for t in tensors]
    args += [ctypes.c_longlong(int(v)) for v in ints]
    _grid(lib, desc, list(ints), lambda: fn(*args), blocks)


def launcher(desc: tuple):
    """What ``agspeed.backends.nvrtc.compile_with`` takes: the kernel of ``desc`` as a
    ``launch(stream, *params)`` that runs it on the CPU (tensors' data pointers, ints)."""
    lib = build(_C.nvrtc_source(desc))
    fn = getattr(lib, desc[0])
    fn.restype = None

    def launch(stream, *params):
        args = [ctypes.c_void_p(p.data_ptr()) if hasattr(p, "data_ptr")
                else ctypes.c_longlong(int(p)) for p in params]
        ints = [p for p in params if not hasattr(p, "data_ptr")]
        _grid(lib, desc, ints, lambda: fn(*args))

    return launch


def _grid(lib: ctypes.CDLL, desc: tuple, ints: list, call, blocks: int | None = None
          ) -> None:
    """``call()`` once, or, for a kernel with column sums, once per row slot (the last
    int) as that block of the grid; or as each of ``blocks`` blocks."""
    if blocks is None:
        blocks = int(ints[-1]) if kernels.has_columns(desc) else 1
    for b in range(blocks):
        lib.ags_host_block(ctypes.c_uint(b), ctypes.c_uint(blocks))
        call()
    lib.ags_host_block(ctypes.c_uint(0), ctypes.c_uint(1))
