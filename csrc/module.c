/* module.c: the agspeed._C module: its types, constants and functions.
 *
 * Multi-phase initialization; the module state holds the heap types.  The
 * hook and the code caches are process-wide (see hook.c for why), so the
 * module may live in one interpreter only: 3.12+ say so with a module slot,
 * 3.11 is checked here.  Importing the module again in the same
 * interpreter (after deleting it from sys.modules) is fine: it shares the
 * process-wide state.
 */
#include "agspeed.h"
#include "emit.h"
#include "nvrtc.h"
#include <string.h>

typedef struct {
    PyTypeObject *region_type;
    PyTypeObject *scope_type;
    PyTypeObject *entry_type;
    PyTypeObject *guard_type;
} ags_module_state;

static PyInterpreterState *owner_interp;

static inline ags_module_state *
module_state(PyObject *module)
{
    return (ags_module_state *)PyModule_GetState(module);
}

static PyObject *
counters(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return Py_BuildValue("{"
#define AGS_X(name, doc) "s:K"
                         AGS_COUNTER_LIST(AGS_X)
#undef AGS_X
                         "}"
#define AGS_X(name, doc) , #name, (unsigned long long)ags_stats.name
                         AGS_COUNTER_LIST(AGS_X)
#undef AGS_X
    );
}

static PyObject *
reset_counters(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    memset(&ags_stats, 0, sizeof(ags_stats));
    Py_RETURN_NONE;
}

static PyObject *
clear_caches(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t n;

    (void)module;
    if (nargs > 1) {
        PyErr_Format(PyExc_TypeError,
                     "clear_caches() takes at most 1 argument (%zd given)",
                     nargs);
        return NULL;
    }
    n = ags_cache_clear(nargs == 1 && args[0] != Py_None ? args[0] : NULL);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static PyObject *
frame_signature(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t sig;
    PyCodeObject *code;
    PyObject **slots;
    int n, rc = 0;

    (void)module;
    if (nargs != 2 || !PyCode_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "frame_signature(code, f_locals): a code and a dict");
        return NULL;
    }
    /* the argument slots a frame would have, from the names */
    code = (PyCodeObject *)args[0];
    n = ags_code_nargs(code);
    slots = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    if (slots == NULL) {
        return PyErr_NoMemory();
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        slots[i] = PyDict_GetItemWithError(
            args[1], PyTuple_GET_ITEM(code->co_localsplusnames, i));
        rc = slots[i] == NULL && PyErr_Occurred() ? -1 : 0;
    }
    if (rc == 0) {
        rc = ags_frame_signature(code, slots, &sig);
    }
    PyMem_Free(slots);
    return rc < 0 ? NULL : PyLong_FromUnsignedLongLong(sig);
}

static PyObject *
set_signature_bits(PyObject *module, PyObject *arg)
{
    long bits = PyLong_AsLong(arg);

    (void)module;
    if (bits == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (bits < 1 || bits > 64) {
        PyErr_SetString(PyExc_ValueError, "signature bits must be 1..64");
        return NULL;
    }
    ags_signature_bits = (int)bits;
    Py_RETURN_NONE;
}

static PyObject *
set_enabled(PyObject *module, PyObject *flag)
{
    int on = PyObject_IsTrue(flag);

    (void)module;
    if (on < 0) {
        return NULL;
    }
    ags_hook_enabled = on;
    Py_RETURN_NONE;
}

static PyObject *
is_enabled(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(ags_hook_enabled);
}

static PyObject *
current_context(PyObject *module, PyObject *unused)
{
    PyObject *ctx = ags_ctx_current();

    (void)module;
    (void)unused;
    return Py_NewRef(ctx != NULL ? ctx : Py_None);
}

static PyObject *
hook_installed(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(ags_hook_is_installed());
}

/* 1 if `obj` is a code object; else 0 with a TypeError set. */
static int
is_code(PyObject *obj)
{
    if (PyCode_Check(obj)) {
        return 1;
    }
    PyErr_Format(PyExc_TypeError, "expected a code object, not %s",
                 Py_TYPE(obj)->tp_name);
    return 0;
}

static PyObject *
code_cache(PyObject *module, PyObject *code)
{
    (void)module;
    if (!is_code(code)) {
        return NULL;
    }
    return ags_cache_describe((PyCodeObject *)code);
}

static PyObject *
set_skip(PyObject *code, int skip)
{
    ags_code_state *state;

    if (!is_code(code)) {
        return NULL;
    }
    state = ags_cache_ensure((PyCodeObject *)code);
    if (state == NULL) {
        return NULL;
    }
    state->flags = skip ? state->flags | AGS_CODE_SKIP
                        : state->flags & ~(uint32_t)AGS_CODE_SKIP;
    Py_RETURN_NONE;
}

static PyObject *
mark_skip(PyObject *module, PyObject *code)
{
    (void)module;
    return set_skip(code, 1);
}

/* Undoes mark_skip and a SKIP decision: for code that agspeed.optimize()
 * was handed, which is captured even where it lives among skipped files. */
static PyObject *
unmark_skip(PyObject *module, PyObject *code)
{
    (void)module;
    return set_skip(code, 0);
}

static PyObject *
decode(PyObject *module, PyObject *code)
{
    (void)module;
    if (!is_code(code)) {
        return NULL;
    }
    return ags_bc_to_list((PyCodeObject *)code);
}

static PyObject *
exceptions(PyObject *module, PyObject *code)
{
    (void)module;
    if (!is_code(code)) {
        return NULL;
    }
    return ags_bc_exceptions_list((PyCodeObject *)code);
}

/* Whether a protocol table is absent or all NULL. */
static int
all_null(const void *table, size_t size)
{
    const unsigned char *p = table;

    if (table == NULL) {
        return 1;
    }
    for (size_t i = 0; i < size; i++) {
        if (p[i] != 0) {
            return 0;
        }
    }
    return 1;
}

/* Whether an instance of the builtin type `cls` shows the capture nothing
 * but its class and its attributes: no number, sequence, mapping or async
 * protocol, no iteration, no call, no comparison or hash of its own, no
 * descriptor behaviour, attributes read the generic way.  Such an object
 * (a ContextVar's Token) is guarded by its type where the capture only
 * carried it (agspeed/_identity.py). */
static PyObject *
opaque_type(PyObject *module, PyObject *cls)
{
    PyTypeObject *t;

    (void)module;
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "opaque_type(cls): a class");
        return NULL;
    }
    t = (PyTypeObject *)cls;
    if (PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE)
        || PyType_HasFeature(t, Py_TPFLAGS_BASETYPE)
        || t->tp_base != &PyBaseObject_Type
        || t->tp_getattro != PyObject_GenericGetAttr
        || (t->tp_setattro != PyObject_GenericSetAttr
            && t->tp_setattro != NULL)
        || t->tp_call != NULL || t->tp_iter != NULL || t->tp_iternext != NULL
        || t->tp_descr_get != NULL || t->tp_descr_set != NULL
        || (t->tp_richcompare != NULL
            && t->tp_richcompare != PyBaseObject_Type.tp_richcompare)
        || (t->tp_hash != PyBaseObject_Type.tp_hash
            && t->tp_hash != PyObject_HashNotImplemented)
        || !all_null(t->tp_as_number, sizeof(PyNumberMethods))
        || !all_null(t->tp_as_sequence, sizeof(PySequenceMethods))
        || !all_null(t->tp_as_mapping, sizeof(PyMappingMethods))
        || !all_null(t->tp_as_async, sizeof(PyAsyncMethods))) {
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyObject *
capture(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 6 || !PyCode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "capture(code, f_locals, globals, builtins, builder, "
                        "tensor_type)");
        return NULL;
    }
    return ags_interp_capture((PyCodeObject *)args[0], args[1], args[2],
                              args[3], args[4], args[5]);
}

static PyObject *
capture_site(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return ags_interp_site();
}

static PyObject *
emit(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "emit(template, instructions, handlers, fields)");
        return NULL;
    }
    return ags_emit_code(args[0], args[1], args[2], args[3]);
}

static PyObject *
call_user(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "call_user(fn, args)");
        return NULL;
    }
    return ags_hook_call_user(args[0], args[1]);
}

static PyObject *
evict(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !is_code(args[0])) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "evict(code, entry)");
        }
        return NULL;
    }
    return PyBool_FromLong(ags_cache_evict((PyCodeObject *)args[0], args[1]));
}

static PyObject *
signature_hash(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"data", "seed", NULL};
    Py_buffer view;
    unsigned long long seed = 0;
    uint64_t h;

    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*|K:signature_hash",
                                     kwlist, &view, &seed)) {
        return NULL;
    }
    h = ags_signature_hash(view.buf, (size_t)view.len, seed);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef module_methods[] = {
    {"counters", counters, METH_NOARGS,
     "counters() -> dict: the runtime's counters (see COUNTER_DOCS)."},
    {"reset_counters", reset_counters, METH_NOARGS,
     "reset_counters(): set every counter to zero."},
    {"evict", (PyCFunction)(void (*)(void))evict, METH_FASTCALL,
     "evict(code, entry) -> bool: drop the entry from the code's cache (False if "
     "it was not there)."},
    {"clear_caches", (PyCFunction)(void (*)(void))clear_caches, METH_FASTCALL,
     "clear_caches(context=None) -> int: empty every code cache (entries "
     "and skip marks), or drop only the entries of one context; returns how "
     "many code objects had a cache."},
    {"frame_signature", (PyCFunction)(void (*)(void))frame_signature, METH_FASTCALL,
     "frame_signature(code, f_locals) -> int: the signature the code cache "
     "keys entries by for a frame of code with these arguments."},
    {"_set_signature_bits", set_signature_bits, METH_O,
     "_set_signature_bits(n): keep n low bits of signatures (tests: force "
     "collisions); 64 restores."},
    {"set_enabled", set_enabled, METH_O,
     "set_enabled(flag): turn the runtime on or off for every region."},
    {"is_enabled", is_enabled, METH_NOARGS,
     "is_enabled() -> bool"},
    {"set_tracers", (PyCFunction)(void (*)(void))ags_set_tracers,
     METH_FASTCALL,
     "set_tracers(flags, probes): where torch keeps whether one of its "
     "tracers runs: (dict, key) pairs whose item is neither missing, None "
     "nor False then, and functions whose answer is true then.  Under one, "
     "a Region calls its target untouched (see region.c)."},
    {"current_context", current_context, METH_NOARGS,
     "current_context(): this thread's capture context, or None."},
    {"hook_installed", hook_installed, METH_NOARGS,
     "hook_installed() -> bool: is agspeed's evaluation function the "
     "interpreter's now."},
    {"code_cache", code_cache, METH_O,
     "code_cache(code) -> dict: what the runtime has cached for code."},
    {"mark_skip", mark_skip, METH_O,
     "mark_skip(code): never hook frames of code again (until reset)."},
    {"unmark_skip", unmark_skip, METH_O,
     "unmark_skip(code): the hook looks at code again (undoes a skip)"},
    {"decode", decode, METH_O,
     "decode(code) -> list of (start, offset, opcode, arg, target, next): "
     "the code's instructions, EXTENDED_ARG folded in, caches skipped, "
     "jump targets resolved (-1: not a jump); offsets in bytes."},
    {"exception_table", exceptions, METH_O,
     "exception_table(code) -> list of (start, end, handler, depth, lasti): "
     "the code's exception table, offsets in bytes."},
    {"emit", (PyCFunction)(void (*)(void))emit, METH_FASTCALL,
     "emit(template, instructions, handlers, fields): a code object "
     "assembled from [(opcode, arg, target index, position)], exception "
     "ranges [(start, end, handler, depth, lasti)] and code.replace() "
     "fields."},
    {"call_user", (PyCFunction)(void (*)(void))call_user, METH_FASTCALL,
     "call_user(fn, args): fn(*args) with the hook seeing the frames it "
     "starts, though the runtime is busy (code a graph break generated)."},
    {"capture", (PyCFunction)(void (*)(void))capture, METH_FASTCALL,
     "capture(code, f_locals, globals, builtins, builder, tensor_type) -> "
     "dict: run the symbolic interpreter over code (see csrc/interp.c)."},
    {"opaque_type", opaque_type, METH_O,
     "opaque_type(cls) -> bool: whether instances of the builtin class show "
     "nothing but their class and attributes (no protocols, calls, "
     "comparisons or hash of their own)."},
    {"capture_site", capture_site, METH_NOARGS,
     "capture_site() -> ((code, offset, globals), ...): the frames of the "
     "capture running on this thread, innermost first; () outside one"},
    {"signature_hash", (PyCFunction)(void (*)(void))signature_hash,
     METH_VARARGS | METH_KEYWORDS,
     "signature_hash(data, seed=0) -> int: XXH3-64 of a bytes-like "
     "object."},
    {"sym_eval", (PyCFunction)(void (*)(void))ags_sym_eval_py, METH_FASTCALL,
     "sym_eval(code, values) -> int or None: a symbolic size expression "
     "(postfix ints, see SYM_OPS) over symbol values (None: unbound); None "
     "where it has no value (unbound symbol, overflow, division by zero)."},
    {"_probe_install", ags_probe_install, METH_NOARGS,
     "Install the test probe, a foreign evaluation function."},
    {"_probe_remove", ags_probe_remove, METH_NOARGS,
     "Remove the test probe, restoring what it replaced."},
    {"_probe_count", ags_probe_count, METH_NOARGS,
     "Frames the test probe has evaluated."},
    {"_eval_frame_owner", ags_probe_owner, METH_NOARGS,
     "Who owns the evaluation function: 'default', 'agspeed', 'probe' or "
     "'other'."},
    {NULL}
};

static int
add_type(PyObject *module, PyType_Spec *spec, PyTypeObject **slot)
{
    PyObject *type = PyType_FromModuleAndSpec(module, spec, NULL);

    if (type == NULL) {
        return -1;
    }
    *slot = (PyTypeObject *)type;
    return PyModule_AddType(module, (PyTypeObject *)type);
}

static int
add_tables(PyObject *module)
{
    PyObject *names = NULL, *docs = NULL;
    int rc = -1;

#define AGS_X(name, doc) \
    if (PyModule_AddIntConstant(module, "ACTION_" #name, \
                                AGS_ACTION_##name) < 0) { \
        goto done; \
    }
    AGS_ACTION_LIST(AGS_X)
#undef AGS_X
    names = Py_BuildValue("("
#define AGS_X(name, doc) "s"
                          AGS_ACTION_LIST(AGS_X)
#undef AGS_X
                          ")"
#define AGS_X(name, doc) , #name
                          AGS_ACTION_LIST(AGS_X)
#undef AGS_X
    );
    docs = Py_BuildValue("{"
#define AGS_X(name, doc) "s:s"
                         AGS_COUNTER_LIST(AGS_X)
#undef AGS_X
                         "}"
#define AGS_X(name, doc) , #name, doc
                         AGS_COUNTER_LIST(AGS_X)
#undef AGS_X
    );
    if (names == NULL || docs == NULL
        || PyModule_AddObjectRef(module, "ACTION_NAMES", names) < 0
        || PyModule_AddObjectRef(module, "COUNTER_DOCS", docs) < 0) {
        goto done;
    }
    if (ags_protocol_export(module) < 0) {
        goto done;
    }
    rc = 0;
done:
    Py_XDECREF(names);
    Py_XDECREF(docs);
    return rc;
}

PyObject *ags_assumption_failed = NULL;

static int
add_assumption_failed(PyObject *module)
{
    PyObject *exc = PyErr_NewExceptionWithDoc(
        "agspeed._C.AssumptionFailed",
        "A branch the capture assumed (one whose other way only raises) went "
        "the other way: the frame runs its own bytecode instead of the graph.",
        PyExc_RuntimeError, NULL);

    if (exc == NULL) {
        return -1;
    }
    if (PyModule_AddObjectRef(module, "AssumptionFailed", exc) < 0) {
        Py_DECREF(exc);
        return -1;
    }
    /* the hook matches the class of the module loaded last */
    Py_XSETREF(ags_assumption_failed, exc);
    return 0;
}

static int
module_exec(PyObject *module)
{
    ags_module_state *st = module_state(module);
    PyInterpreterState *interp = PyInterpreterState_Get();

    if (owner_interp != NULL && owner_interp != interp) {
        PyErr_SetString(PyExc_ImportError,
                        "agspeed._C can be loaded in one interpreter per "
                        "process only");
        return -1;
    }
    owner_interp = interp;
    ags_protocol_init();
    ags_opcodes_init();
    if (add_assumption_failed(module) < 0
        || ags_cache_init() < 0 || ags_interp_init() < 0
        || add_type(module, &ags_region_spec, &st->region_type) < 0
        || add_type(module, &ags_scope_spec, &st->scope_type) < 0
        || add_type(module, &ags_entry_spec, &st->entry_type) < 0
        || ags_guard_init() < 0
        || add_type(module, &ags_guard_spec, &st->guard_type) < 0
        || add_tables(module) < 0
        || ags_nvrtc_init(module) < 0) {
        return -1;
    }
    /* The hook checks decisions against the CacheEntry type of the module
     * loaded last; entries of an earlier load stay valid as they are. */
    Py_XSETREF(ags_entry_type, (PyTypeObject *)Py_NewRef(st->entry_type));
    Py_XSETREF(ags_guard_type, (PyTypeObject *)Py_NewRef(st->guard_type));
    return 0;
}

static int
module_traverse(PyObject *module, visitproc visit, void *arg)
{
    ags_module_state *st = module_state(module);

    Py_VISIT(st->region_type);
    Py_VISIT(st->scope_type);
    Py_VISIT(st->entry_type);
    Py_VISIT(st->guard_type);
    return 0;
}

static int
module_clear(PyObject *module)
{
    ags_module_state *st = module_state(module);

    Py_CLEAR(st->region_type);
    Py_CLEAR(st->scope_type);
    Py_CLEAR(st->entry_type);
    Py_CLEAR(st->guard_type);
    return 0;
}

static void
module_free(void *module)
{
    module_clear((PyObject *)module);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    AGS_MOD_SLOTS_EXTRA
    {0, NULL}
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "agspeed._C",
    .m_doc = "agspeed's C core: the frame hook, code caches and capture "
             "contexts.",
    .m_size = sizeof(ags_module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC
PyInit__C(void)
{
    return PyModuleDef_Init(&module_def);
}
