/* signature.c: the 64-bit signature hash that keys the code caches.
 *
 * The guard system reduces everything a cached graph assumed about its
 * tensor inputs and the global state (dtype, device, sizes, strides,
 * requires_grad, grad mode, autocast) to a flat byte string and hashes it;
 * a code's cache maps that hash to its entries, so many shapes of one
 * function cost one lookup.  The hash is XXH3-64 from the system xxHash
 * library (Debian libxxhash-dev): fast on short inputs, stable across
 * processes and machines for a given seed, which the persistent cache
 * needs.
 *
 * Stable API: ags_signature_hash().  Python sees it as
 * agspeed._C.signature_hash(data, seed=0), for tests and for keys built in
 * Python.
 */
#include "guards.h"

#include <xxhash.h>

uint64_t
ags_signature_hash(const void *data, size_t len, uint64_t seed)
{
    return (uint64_t)XXH3_64bits_withSeed(data, len, (XXH64_hash_t)seed);
}

/* ------------------------------------------------------------------ */
/* Frame signatures */

int ags_signature_bits = 64;

static PyObject *tensor_type;   /* torch.Tensor, once torch is imported */
static PyObject *s_torch, *s_tensor;
ags_tensor_names ags_tnames;

typedef ags_sig sig_buf;

static int
put(sig_buf *b, int64_t w)
{
    if (b->n == b->cap) {
        Py_ssize_t cap = 2 * b->cap;
        int64_t *grown = PyMem_Malloc((size_t)cap * sizeof(int64_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(grown, b->words, (size_t)b->n * sizeof(int64_t));
        if (b->words != b->small) {
            PyMem_Free(b->words);
        }
        b->words = grown;
        b->cap = cap;
    }
    b->words[b->n++] = w;
    return 0;
}

int
ags_tensor_names_init(void)
{
    if (ags_tnames.requires_grad != NULL) {
        return 0;
    }
    s_torch = PyUnicode_InternFromString("torch");
    s_tensor = PyUnicode_InternFromString("Tensor");
    ags_tnames.dtype = PyUnicode_InternFromString("dtype");
    ags_tnames.device = PyUnicode_InternFromString("device");
    ags_tnames.shape = PyUnicode_InternFromString("shape");
    ags_tnames.stride = PyUnicode_InternFromString("stride");
    ags_tnames.requires_grad = PyUnicode_InternFromString("requires_grad");
    if (!(s_torch && s_tensor && ags_tnames.dtype && ags_tnames.device
          && ags_tnames.shape && ags_tnames.stride && ags_tnames.requires_grad)) {
        ags_tnames.requires_grad = NULL;   /* try again next time */
        return -1;
    }
    return 0;
}

/* torch.Tensor (borrowed, kept), or NULL without an exception while torch
 * is not imported: then no argument can be a tensor. */
static PyObject *
get_tensor_type(void)
{
    PyObject *torch;

    if (tensor_type != NULL) {
        return tensor_type;
    }
    torch = PyImport_GetModule(s_torch);
    if (torch == NULL) {
        return NULL;
    }
    tensor_type = PyObject_GetAttr(torch, s_tensor);
    Py_DECREF(torch);
    if (tensor_type != NULL && !PyType_Check(tensor_type)) {
        Py_CLEAR(tensor_type);
    }
    PyErr_Clear();
    return tensor_type;
}

/* The words of an int tuple (torch.Size or a stride tuple). */
static int
put_ints(sig_buf *b, PyObject *seq)
{
    if (seq == NULL) {
        return -1;
    }
    if (!PyTuple_Check(seq)) {
        Py_DECREF(seq);
        return put(b, -2);
    }
    if (put(b, PyTuple_GET_SIZE(seq)) < 0) {
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(seq); i++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
        if ((v == -1 && PyErr_Occurred()) || put(b, v) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

static int
put_tensor(sig_buf *b, PyObject *t)
{
    PyObject *got;
    Py_hash_t h;

    got = PyObject_GetAttr(t, ags_tnames.dtype);   /* dtypes are singletons */
    if (got == NULL || put(b, (int64_t)(intptr_t)got) < 0) {
        Py_XDECREF(got);
        return -1;
    }
    Py_DECREF(got);
    got = PyObject_GetAttr(t, ags_tnames.requires_grad);
    if (got == NULL || put(b, got == Py_True) < 0) {
        Py_XDECREF(got);
        return -1;
    }
    Py_DECREF(got);
    got = PyObject_GetAttr(t, ags_tnames.device);
    h = got ? PyObject_Hash(got) : -1;
    Py_XDECREF(got);
    if (h == -1 || put(b, (int64_t)h) < 0) {
        return -1;
    }
    if (put_ints(b, PyObject_GetAttr(t, ags_tnames.shape)) < 0) {
        return -1;
    }
    return put_ints(b, PyObject_CallMethodNoArgs(t, ags_tnames.stride));
}

void
ags_sig_release(ags_sig *b)
{
    if (b->words != b->small) {
        PyMem_Free(b->words);
    }
    b->words = b->small;
    b->n = 0;
}

int
ags_sig_compute(PyCodeObject *code, PyObject *const *args, ags_sig *b, uint64_t *out)
{
    PyObject *ttype;
    int nargs = ags_code_nargs(code);
    int rc = 0;

    b->words = b->small;
    b->n = 0;
    b->cap = (Py_ssize_t)(sizeof(b->small) / sizeof(b->small[0]));
    if (ags_tensor_names_init() < 0) {
        return -1;
    }
    ttype = get_tensor_type();
    for (int i = 0; rc == 0 && i < nargs; i++) {
        PyObject *value = args[i];

        if (value == NULL) {
            rc = put(b, 0);
            continue;
        }
        rc = put(b, (int64_t)(intptr_t)Py_TYPE(value));
        if (rc == 0 && ttype != NULL
            && PyObject_TypeCheck(value, (PyTypeObject *)ttype)) {
            rc = put_tensor(b, value);
            if (rc < 0 && PyErr_ExceptionMatches(PyExc_RuntimeError)) {
                /* metadata that raises (a lazy module's uninitialized
                 * parameter has no shape): the words so far, then a mark;
                 * the entries' guards decide */
                PyErr_Clear();
                rc = put(b, -3);
            }
        }
    }
    if (rc == 0) {
        uint64_t h = ags_signature_hash(b->words, (size_t)b->n * sizeof(int64_t), 0);
        *out = ags_signature_bits >= 64 ? h
               : h & ((UINT64_C(1) << ags_signature_bits) - 1);
    }
    else {
        ags_sig_release(b);
    }
    return rc;
}

int
ags_frame_signature(PyCodeObject *code, PyObject *const *args, uint64_t *out)
{
    ags_sig b;
    int rc = ags_sig_compute(code, args, &b, out);

    ags_sig_release(&b);
    return rc;
}
