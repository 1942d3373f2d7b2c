/* driver.c: NVRTC and the CUDA driver, opened at run time; kernel launches.
 *
 * Two libraries, each opened once per process by a path Python chooses
 * (backends/nvrtc/_libs.py searches the CUDA wheels beside torch, then the
 * system): libnvrtc compiles, libcuda loads and launches.  Only the entry
 * points used here are declared, with the driver's opaque handle types as
 * void pointers, so no CUDA header is needed to build.
 *
 *   nvrtc_open(path)              -> (major, minor) of the library
 *   nvrtc_archs()                 -> the sm_XY numbers it can compile for
 *   nvrtc_compile(src, name, options, cubin) -> bytes (PTX, NUL-ended, or
 *                                    a cubin); RuntimeError with NVRTC's
 *                                    log when the source does not compile
 *   nvrtc_source(desc)            -> codegen.c's source for a description
 *   cuda_open(path)               -> the driver's CUDA version (cuInit ran)
 *   cuda_device(ordinal)          -> (major, minor, multiprocessors)
 *   NVRTC_WARP_COLS               the longest row a row kernel's warp path takes
 *   CudaKernel(image, name, kind, ndim, nred, device, slots=False)
 *                                 -> a loaded kernel; calling it launches
 *
 * A launch: kernel(stream, *args), args being the kernel's parameters in
 * codegen.c's order: tensors (their data_ptr() is passed) and ints.  The
 * launch shape comes from the sizes (the ndim ints after the tensors):
 * POINTWISE, 256 threads a block and enough blocks to cover the elements,
 * at most 32 per multiprocessor (the kernels loop); ROWS, rows of up to
 * AGS_NVRTC_WARP_COLS elements one warp each (codegen_rows.c's warp path):
 * 256 threads a block, 8 rows, and enough blocks for the rows, at most 32
 * per multiprocessor; longer rows one block each, of the power of two at or
 * above a quarter of the row's length (32 to 512) threads, through the
 * kernel's second function, <name>_block, its block path compiled alone
 * (fewer registers than the warp path's: large blocks launch, and several
 * share a multiprocessor), or through the first where there is no second
 * (a row length told past the warp path's: the first is the block path
 * alone).  Each function's blocks are held to what its
 * registers allow (cuFuncGetAttribute).  The first function chooses its
 * path from the same sizes; either path is correct under either shape, the
 * shape is for speed.  A ROWS kernel with column sums (slots true) takes its
 * row slots' count as its last int, and is launched with exactly that many
 * warps (short rows, in blocks of 8) or blocks (long rows): each slot is
 * one warp's or one block's.  No Python code runs per launch.
 *
 * Every CudaKernel holds its module; the module is unloaded with it.  The
 * context is the device's primary one, torch's: when no context is
 * current on the thread (at load, or at a launch from a thread that has not
 * used the GPU yet, as autograd's backward threads), the primary one is made
 * current first.
 */
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "codegen.h"
#include "nvrtc.h"
#include "protocol.h"

#define MAX_PARAMS 512
#define AGS_NVRTC_MAX_DIMS 16

typedef int nvrtc_result;
typedef void *nvrtc_program;
typedef int cu_result;
typedef int cu_device;
typedef void *cu_context, *cu_module, *cu_function, *cu_stream;

enum { CU_ATTR_SM_COUNT = 16, CU_ATTR_MAJOR = 75, CU_ATTR_MINOR = 76 };
enum { CU_FUNC_MAX_THREADS = 0 };   /* CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK */

static struct {
    void *lib;
    nvrtc_result (*version)(int *, int *);
    const char *(*error_string)(nvrtc_result);
    nvrtc_result (*create)(nvrtc_program *, const char *, const char *, int,
                           const char *const *, const char *const *);
    nvrtc_result (*compile)(nvrtc_program, int, const char *const *);
    nvrtc_result (*log_size)(nvrtc_program, size_t *);
    nvrtc_result (*log)(nvrtc_program, char *);
    nvrtc_result (*ptx_size)(nvrtc_program, size_t *);
    nvrtc_result (*ptx)(nvrtc_program, char *);
    nvrtc_result (*cubin_size)(nvrtc_program, size_t *);
    nvrtc_result (*cubin)(nvrtc_program, char *);
    nvrtc_result (*destroy)(nvrtc_program *);
    nvrtc_result (*num_archs)(int *);
    nvrtc_result (*archs)(int *);
} nv;

static struct {
    void *lib;
    cu_result (*init)(unsigned int);
    cu_result (*driver_version)(int *);
    cu_result (*error_string)(cu_result, const char **);
    cu_result (*device_get)(cu_device *, int);
    cu_result (*attribute)(int *, int, cu_device);
    cu_result (*ctx_current)(cu_context *);
    cu_result (*ctx_set)(cu_context);
    cu_result (*primary_retain)(cu_context *, cu_device);
    cu_result (*load)(cu_module *, const void *);
    cu_result (*unload)(cu_module);
    cu_result (*function)(cu_function *, cu_module, const char *);
    cu_result (*launch)(cu_function, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, unsigned int, unsigned int,
                        cu_stream, void **, void **);
    cu_result (*function_attribute)(int *, int, cu_function);
} cu;

/* Opens `path` into *lib and fills the entry points named in `names` (NULL
 * ended) into `slots`.  0, or -1 with OSError. */
static int
open_library(PyObject *path, void **lib, const char *const *names,
             void **slots)
{
    const char *p = PyUnicode_AsUTF8(path);
    void *handle;

    if (p == NULL) {
        return -1;
    }
    handle = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        PyErr_Format(PyExc_OSError, "cannot open %s: %s", p, dlerror());
        return -1;
    }
    for (int i = 0; names[i] != NULL; i++) {
        slots[i] = dlsym(handle, names[i]);
        if (slots[i] == NULL) {
            PyErr_Format(PyExc_OSError, "%s has no %s", p, names[i]);
            dlclose(handle);
            return -1;
        }
    }
    *lib = handle;
    return 0;
}

static int
nv_check(nvrtc_result rc, const char *what)
{
    if (rc == 0) {
        return 0;
    }
    PyErr_Format(PyExc_RuntimeError, "NVRTC %s failed: %s", what,
                 nv.error_string ? nv.error_string(rc) : "?");
    return -1;
}

static int
cu_check(cu_result rc, const char *what)
{
    const char *text = NULL;

    if (rc == 0) {
        return 0;
    }
    if (cu.error_string == NULL || cu.error_string(rc, &text) != 0) {
        text = "unknown error";
    }
    PyErr_Format(PyExc_RuntimeError, "CUDA %s failed: %s (%d)", what, text, rc);
    return -1;
}

static PyObject *
nvrtc_open(PyObject *Py_UNUSED(m), PyObject *path)
{
    static const char *const names[] = {
        "nvrtcVersion", "nvrtcGetErrorString", "nvrtcCreateProgram",
        "nvrtcCompileProgram", "nvrtcGetProgramLogSize", "nvrtcGetProgramLog",
        "nvrtcGetPTXSize", "nvrtcGetPTX", "nvrtcGetCUBINSize", "nvrtcGetCUBIN",
        "nvrtcDestroyProgram", "nvrtcGetNumSupportedArchs",
        "nvrtcGetSupportedArchs", NULL};
    int major = 0, minor = 0;

    if (nv.lib == NULL) {
        void *slots[sizeof names / sizeof names[0]];

        if (open_library(path, &nv.lib, names, slots) < 0) {
            return NULL;
        }
        memcpy(&nv.version, slots, sizeof(void *) * 13);
    }
    if (nv_check(nv.version(&major, &minor), "nvrtcVersion") < 0) {
        return NULL;
    }
    return Py_BuildValue("(ii)", major, minor);
}

static int
need_nvrtc(void)
{
    if (nv.lib == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libnvrtc is not open "
                        "(agspeed._C.nvrtc_open)");
        return -1;
    }
    return 0;
}

static PyObject *
nvrtc_archs(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a))
{
    int n = 0, *archs;
    PyObject *result;

    if (need_nvrtc() < 0 || nv_check(nv.num_archs(&n), "arch count") < 0) {
        return NULL;
    }
    archs = PyMem_Calloc((size_t)n + 1, sizeof(int));
    if (archs == NULL) {
        return PyErr_NoMemory();
    }
    if (nv_check(nv.archs(archs), "arch list") < 0) {
        PyMem_Free(archs);
        return NULL;
    }
    result = PyTuple_New(n);
    for (int i = 0; result != NULL && i < n; i++) {
        PyObject *v = PyLong_FromLong(archs[i]);

        if (v == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyTuple_SET_ITEM(result, i, v);
    }
    PyMem_Free(archs);
    return result;
}

/* The program's log, as a str (new reference), or NULL. */
static PyObject *
program_log(nvrtc_program prog)
{
    size_t size = 0;
    char *buf;
    PyObject *text;

    if (nv_check(nv.log_size(prog, &size), "log size") < 0) {
        return NULL;
    }
    buf = PyMem_Malloc(size + 1);
    if (buf == NULL) {
        return PyErr_NoMemory();
    }
    buf[0] = '\0';
    if (size > 0 && nv_check(nv.log(prog, buf), "log") < 0) {
        PyMem_Free(buf);
        return NULL;
    }
    buf[size] = '\0';
    text = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace");
    PyMem_Free(buf);
    return text;
}

static PyObject *
nvrtc_compile(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n)
{
    const char *src, *name;
    const char **options = NULL;
    Py_ssize_t n_opt;
    int cubin, compiled;
    nvrtc_program prog = NULL;
    size_t size = 0;
    PyObject *image = NULL, *log;

    if (n != 4 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1])
        || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "nvrtc_compile(source: str, name: "
                        "str, options: tuple[str], cubin: bool)");
        return NULL;
    }
    if (need_nvrtc() < 0) {
        return NULL;
    }
    src = PyUnicode_AsUTF8(args[0]);
    name = PyUnicode_AsUTF8(args[1]);
    cubin = PyObject_IsTrue(args[3]);
    if (src == NULL || name == NULL || cubin < 0) {
        return NULL;
    }
    n_opt = PyTuple_GET_SIZE(args[2]);
    options = PyMem_Calloc((size_t)n_opt + 1, sizeof(char *));
    if (options == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n_opt; i++) {
        PyObject *o = PyTuple_GET_ITEM(args[2], i);

        options[i] = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
        if (options[i] == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "an NVRTC option must be "
                                "a str");
            }
            goto done;
        }
    }
    if (nv_check(nv.create(&prog, src, name, 0, NULL, NULL), "create") < 0) {
        goto done;
    }
    /* NVRTC is thread-safe: other threads (other kernels' compiles) run on */
    Py_BEGIN_ALLOW_THREADS
    compiled = nv.compile(prog, (int)n_opt, options) == 0;
    Py_END_ALLOW_THREADS
    if (!compiled) {
        log = program_log(prog);
        if (log != NULL) {
            PyErr_Format(PyExc_RuntimeError, "NVRTC could not compile %s:\n%U",
                         name, log);
            Py_DECREF(log);
        }
        goto done;
    }
    if (nv_check((cubin ? nv.cubin_size : nv.ptx_size)(prog, &size),
                 "image size") < 0) {
        goto done;
    }
    image = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (image == NULL) {
        goto done;
    }
    if (nv_check((cubin ? nv.cubin : nv.ptx)(prog, PyBytes_AS_STRING(image)),
                 "image") < 0) {
        Py_CLEAR(image);
    }
done:
    if (prog != NULL) {
        nv.destroy(&prog);
    }
    PyMem_Free(options);
    return image;
}

static PyObject *
nvrtc_source(PyObject *Py_UNUSED(m), PyObject *desc)
{
    return ags_nvrtc_source(desc);
}

static PyObject *
cuda_open(PyObject *Py_UNUSED(m), PyObject *path)
{
    static const char *const names[] = {
        "cuInit", "cuDriverGetVersion", "cuGetErrorString", "cuDeviceGet",
        "cuDeviceGetAttribute", "cuCtxGetCurrent", "cuCtxSetCurrent",
        "cuDevicePrimaryCtxRetain", "cuModuleLoadData", "cuModuleUnload",
        "cuModuleGetFunction", "cuLaunchKernel", "cuFuncGetAttribute", NULL};
    int version = 0;

    if (cu.lib == NULL) {
        void *slots[sizeof names / sizeof names[0]];
        void *lib;

        if (open_library(path, &lib, names, slots) < 0) {
            return NULL;
        }
        memcpy(&cu.init, slots, sizeof(void *) * 13);
        cu.lib = lib;
    }
    if (cu_check(cu.init(0), "cuInit") < 0
        || cu_check(cu.driver_version(&version), "cuDriverGetVersion") < 0) {
        return NULL;
    }
    return PyLong_FromLong(version);
}

static int
need_cuda(void)
{
    if (cu.lib == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libcuda is not open "
                        "(agspeed._C.cuda_open)");
        return -1;
    }
    return 0;
}

static PyObject *
cuda_device(PyObject *Py_UNUSED(m), PyObject *ordinal)
{
    long index = PyLong_AsLong(ordinal);
    cu_device dev;
    int major = 0, minor = 0, sms = 0;

    if ((index == -1 && PyErr_Occurred()) || need_cuda() < 0
        || cu_check(cu.device_get(&dev, (int)index), "cuDeviceGet") < 0
        || cu_check(cu.attribute(&major, CU_ATTR_MAJOR, dev), "attribute") < 0
        || cu_check(cu.attribute(&minor, CU_ATTR_MINOR, dev), "attribute") < 0
        || cu_check(cu.attribute(&sms, CU_ATTR_SM_COUNT, dev), "attribute") < 0) {
        return NULL;
    }
    return Py_BuildValue("(iii)", major, minor, sms);
}

/* ---- CudaKernel ---------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    cu_module module;
    cu_function function;
    cu_function block_function;    /* ROWS: <name>_block, for long rows */
    int max_threads, block_max_threads;     /* a block's, at most, for each */
    int kind, ndim, nred, sms, device;
    int slots;          /* ROWS with column sums: the last int is nslot */
} kernel_object;

static PyTypeObject *kernel_type;

/* Makes the device's primary context current when none is.  0 or -1. */
static int
ensure_context(int ordinal)
{
    cu_context ctx = NULL;
    cu_device dev;

    if (cu_check(cu.ctx_current(&ctx), "cuCtxGetCurrent") < 0) {
        return -1;
    }
    if (ctx != NULL) {
        return 0;
    }
    if (cu_check(cu.device_get(&dev, ordinal), "cuDeviceGet") < 0
        || cu_check(cu.primary_retain(&ctx, dev), "cuDevicePrimaryCtxRetain") < 0
        || cu_check(cu.ctx_set(ctx), "cuCtxSetCurrent") < 0) {
        return -1;
    }
    return 0;
}

/* A ROWS kernel's second function, its block path alone (codegen.c), into
 * self->block_function; an image without one (a row length told) keeps the
 * first. */
static void
find_block_function(kernel_object *self, const char *name)
{
    char block_name[256];
    cu_function f = NULL;

    if (PyOS_snprintf(block_name, sizeof block_name, "%s%s", name,
                      AGS_NVRTC_BLOCK_SUFFIX) >= (int)sizeof block_name) {
        return;
    }
    /* CUDA_ERROR_NOT_FOUND (500): an image of the one function only */
    if (cu.function(&f, self->module, block_name) == 0) {
        self->block_function = f;
    }
}

static PyObject *
kernel_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"image", "name", "kind", "ndim", "nred", "device",
                             "slots", NULL};
    Py_buffer image;
    const char *name;
    int kind, ndim, nred, device, sms = 0, slots = 0;
    cu_device dev;
    kernel_object *self;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*siiii|p", kwlist, &image,
                                     &name, &kind, &ndim, &nred, &device, &slots)) {
        return NULL;
    }
    if (kind < 0 || kind >= AGS_KKIND_COUNT || ndim < 0 || nred < 0
        || nred > ndim || (slots && kind != AGS_KKIND_ROWS)) {
        PyBuffer_Release(&image);
        PyErr_SetString(PyExc_ValueError, "CudaKernel: a bad kind or shape");
        return NULL;
    }
    self = (kernel_object *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyBuffer_Release(&image);
        return NULL;
    }
    self->kind = kind;
    self->slots = slots;
    self->device = device;
    self->ndim = ndim;
    self->nred = nred;
    if (need_cuda() < 0 || ensure_context(device) < 0
        || cu_check(cu.device_get(&dev, device), "cuDeviceGet") < 0
        || cu_check(cu.attribute(&sms, CU_ATTR_SM_COUNT, dev), "attribute") < 0
        || cu_check(cu.load(&self->module, image.buf), "cuModuleLoadData") < 0
        || cu_check(cu.function(&self->function, self->module, name),
                    "cuModuleGetFunction") < 0) {
        PyBuffer_Release(&image);
        Py_DECREF(self);
        return NULL;
    }
    self->sms = sms > 0 ? sms : 1;
    PyBuffer_Release(&image);
    self->block_function = self->function;
    if (kind == AGS_KKIND_ROWS) {
        find_block_function(self, name);
    }
    if (cu_check(cu.function_attribute(&self->max_threads, CU_FUNC_MAX_THREADS,
                                       self->function), "cuFuncGetAttribute") < 0
        || cu_check(cu.function_attribute(&self->block_max_threads, CU_FUNC_MAX_THREADS,
                                          self->block_function), "cuFuncGetAttribute") < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
kernel_dealloc(kernel_object *self)
{
    PyTypeObject *type = Py_TYPE(self);

    if (self->module != NULL && cu.unload != NULL) {
        (void)cu.unload(self->module);  /* at exit the driver may be gone */
    }
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* The 64-bit value of one parameter: an int, or a tensor's data_ptr(). */
static int
param_value(PyObject *arg, uint64_t *out, int *is_int)
{
    PyObject *ptr;

    *is_int = PyLong_Check(arg);
    if (*is_int) {
        long long v = PyLong_AsLongLong(arg);

        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        *out = (uint64_t)v;
        return 0;
    }
    ptr = PyObject_CallMethod(arg, "data_ptr", NULL);
    if (ptr == NULL) {
        return -1;
    }
    *out = (uint64_t)PyLong_AsUnsignedLongLong(ptr);
    Py_DECREF(ptr);
    return PyErr_Occurred() ? -1 : 0;
}

/* args: borrowed, n of them. */
static PyObject *
launch(kernel_object *self, PyObject *const *args, Py_ssize_t n)
{
    uint64_t values[MAX_PARAMS];
    void *params[MAX_PARAMS];
    long long sizes[AGS_NVRTC_MAX_DIMS];
    long long nslot = 0;    /* the last int, where the kernel has column sums */
    int seen_sizes = 0, is_int;
    long long outer = 1, inner = 1, total;
    unsigned int grid, block;
    cu_function function = self->function;
    uint64_t stream;

    if (n < 1 || n - 1 > MAX_PARAMS) {
        PyErr_SetString(PyExc_TypeError, "CudaKernel(stream, *params)");
        return NULL;
    }
    stream = (uint64_t)PyLong_AsUnsignedLongLong(args[0]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        if (param_value(args[i], &values[i - 1], &is_int) < 0) {
            return NULL;
        }
        params[i - 1] = &values[i - 1];
        if (is_int && seen_sizes < self->ndim) {
            sizes[seen_sizes++] = (long long)values[i - 1];
        }
        if (is_int) {
            nslot = (long long)values[i - 1];
        }
    }
    if (self->slots && (nslot < 1 || nslot > 0x7fffffffLL)) {
        PyErr_SetString(PyExc_ValueError, "CudaKernel: column sums need 1 to 2**31 - 1 "
                        "row slots (the last int)");
        return NULL;
    }
    if (seen_sizes != self->ndim) {
        PyErr_Format(PyExc_TypeError, "CudaKernel: %d sizes expected",
                     self->ndim);
        return NULL;
    }
    for (int d = 0; d < self->ndim; d++) {
        if (d < self->ndim - self->nred) {
            outer *= sizes[d];
        }
        else {
            inner *= sizes[d];
        }
    }
    total = outer * inner;
    /* a ROWS kernel over empty rows still writes each row's value (a sum of
     * nothing is 0) */
    if (self->kind == AGS_KKIND_ROWS ? outer == 0 : total == 0) {
        Py_RETURN_NONE;
    }
    /* autograd runs the backward on threads of its own */
    if (ensure_context(self->device) < 0) {
        return NULL;
    }
    if (self->kind == AGS_KKIND_ROWS && inner <= AGS_NVRTC_WARP_COLS) {
        long long want, cap = 32LL * self->sms;

        /* 8 warps, 8 rows at a time, fewer where the registers allow fewer */
        block = self->max_threads >= 256 ? 256 : self->max_threads >= 128 ? 128 : 32;
        want = (outer + block / 32 - 1) / (block / 32);
        grid = (unsigned int)(want < cap ? want : cap);
        if (self->slots) {
            grid = (unsigned int)((nslot + block / 32 - 1) / (block / 32));
        }
    }
    else if (self->kind == AGS_KKIND_ROWS) {
        function = self->block_function;
        /* a kernel with column sums: at most the block its registers are sized for */
        block = (unsigned int)ags_rows_block(inner, self->block_max_threads,
            self->slots ? AGS_COLUMN_BLOCK_MAX : AGS_ROWS_BLOCK_MAX);
        grid = outer > 0x7fffffffLL ? 0x7fffffffu : (unsigned int)outer;
        if (self->slots) {
            grid = (unsigned int)nslot;
        }
    }
    else {
        long long want = (total + 255) / 256, cap = 32LL * self->sms;

        block = 256;
        grid = (unsigned int)(want < cap ? want : cap);
    }
    if (cu_check(cu.launch(function, grid, 1, 1, block, 1, 1, 0,
                           (cu_stream)(uintptr_t)stream, params, NULL),
                 "cuLaunchKernel") < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
kernel_call(PyObject *self, PyObject *args, PyObject *kwds)
{
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "CudaKernel takes no keywords");
        return NULL;
    }
    return launch((kernel_object *)self, &PyTuple_GET_ITEM(args, 0),
                  PyTuple_GET_SIZE(args));
}

static PyType_Slot kernel_slots[] = {
    {Py_tp_new, kernel_new},
    {Py_tp_dealloc, kernel_dealloc},
    {Py_tp_call, kernel_call},
    {Py_tp_doc, "A fused kernel loaded on the GPU: kernel(stream, *params) "
                "launches it."},
    {0, NULL}
};

static PyType_Spec kernel_spec = {
    .name = "agspeed._C.CudaKernel",
    .basicsize = sizeof(kernel_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = kernel_slots,
};

static PyMethodDef nvrtc_methods[] = {
    {"nvrtc_open", nvrtc_open, METH_O,
     "nvrtc_open(path): open libnvrtc; its (major, minor) version."},
    {"nvrtc_archs", nvrtc_archs, METH_NOARGS,
     "The sm_XY numbers the open libnvrtc compiles for."},
    {"nvrtc_compile", (PyCFunction)(void (*)(void))nvrtc_compile, METH_FASTCALL,
     "nvrtc_compile(source, name, options, cubin): PTX or a cubin, as bytes."},
    {"nvrtc_source", nvrtc_source, METH_O,
     "nvrtc_source(desc): the CUDA C source of a fused kernel's description."},
    {"cuda_open", cuda_open, METH_O,
     "cuda_open(path): open libcuda and initialize it; the driver's version."},
    {"cuda_device", cuda_device, METH_O,
     "cuda_device(ordinal): (major, minor, multiprocessors)."},
    {NULL, NULL, 0, NULL}
};

int
ags_nvrtc_init(PyObject *module)
{
    PyObject *type;

    if (PyModule_AddFunctions(module, nvrtc_methods) < 0
        || PyModule_AddIntConstant(module, "NVRTC_WARP_COLS", AGS_NVRTC_WARP_COLS) < 0
        || PyModule_AddIntConstant(module, "NVRTC_COLUMN_COLS", AGS_NVRTC_COLUMN_COLS) < 0) {
        return -1;
    }
    type = PyType_FromModuleAndSpec(module, &kernel_spec, NULL);
    if (type == NULL) {
        return -1;
    }
    if (PyModule_AddObjectRef(module, "CudaKernel", type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    Py_XSETREF(kernel_type, (PyTypeObject *)type);
    return 0;
}
