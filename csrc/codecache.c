/* codecache.c: the per-code-object cache and the CacheEntry type.
 *
 * Layout.  Each code object the runtime has decided about carries an
 * ags_code_state in a co_extra slot reserved once per process.  The state
 * holds flags (AGS_CODE_SKIP) and an array of strong references to
 * CacheEntry objects in most-recently-used order.  All live states are on
 * one circular doubly-linked list headed by `registry`, so that
 * agspeed.reset() can empty every cache without knowing the code objects.
 *
 * Lifetime.  CPython calls state_free() when the code object is
 * deallocated; it unlinks the state and releases the entries.  A state
 * never owns its code object, and entries must not either (directly or
 * through a function or module that refers to the code), or the code
 * object could never die: code objects are not tracked by the cyclic GC.
 *
 * Invariants.  `entries[0..n_entries)` are non-NULL strong references;
 * `version` changes on every mutation, so a lookup that called out to
 * Python (a guard) can tell whether the array moved under it.  Every
 * mutation is done with the GIL held.
 *
 * Lookup.  An entry made for a frame carries that frame's signature
 * (guards/signature.c: argument types and tensor metadata, XXH3).  The
 * state keeps a hash table from signature to entries, rebuilt after each
 * insert or removal; a lookup computes the frame's signature once and runs
 * only the guards of entries with it.  Entries without a signature (no
 * guard, or made with signed=False: a graph with dynamic dimensions serves
 * many signatures) are tried first, most recently used first.
 *
 * The steady state.  A training loop calls a function with the same
 * shapes step after step, and reading each tensor argument's metadata
 * through torch's Python attributes costs five calls per tensor.  So the
 * state remembers the last signed entry it hit (fast_entry), and when that
 * entry has an arg_check, a lookup first asks it: the same argument types,
 * and one call of its checker over the tensor arguments (torch's own C++
 * tensor check, see agspeed/_tensor_check.py) that is True only when each
 * tensor has the dtype, device, requires_grad, sizes and strides of the
 * entry's frame.  That is the frame having the entry's signature, so its
 * guard runs with the argument checks settled, and no signature is
 * computed.  A miss there costs one failed check, then the table.
 *
 * Calls that cycle through many shapes never match the last hit: after
 * AGS_FAST_FAILS failed checks in a row the check rests for the next
 * AGS_FAST_REST lookups, so such a function pays one check in that many.
 *
 * The hit path makes no locals dict: signatures and guard programs read
 * the argument slots of the frame by index, and the dict is made only for
 * a guard that reads something else (a closure variable, a Python guard).
 */
#include "agspeed.h"
#include <stddef.h>
#include <structmember.h>
#include <string.h>

PyTypeObject *ags_entry_type;

#define AGS_FAST_FAILS 4    /* see "The steady state" above */
#define AGS_FAST_REST 64

static Py_ssize_t extra_index = -1;
static uint64_t version;
static uint64_t use_clock;   /* ticks on every insert and hit: LRU order */
static ags_code_state registry = {.prev = &registry, .next = &registry};

static void
state_free(void *ptr)
{
    ags_code_state *state = (ags_code_state *)ptr;
    ags_entry **entries;
    PyObject *retcode;
    Py_ssize_t n;

    if (state == NULL) {
        return;
    }
    state->prev->next = state->next;
    state->next->prev = state->prev;
    entries = state->entries;
    n = state->n_entries;
    retcode = state->retcode;
    PyMem_Free(state->table);
    PyMem_Free(state);
    version++;
    /* Release after unlinking: a finalizer may run arbitrary code. */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(entries[i]);
    }
    PyMem_Free(entries);
    Py_XDECREF(retcode);
}

int
ags_cache_init(void)
{
    if (extra_index >= 0) {
        return 0;
    }
    extra_index = ags_compat_extra_index(state_free);
    if (extra_index < 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "agspeed: no free co_extra slot left in this "
                        "interpreter (too many PEP 523 tools loaded)");
        return -1;
    }
    return 0;
}

ags_code_state *
ags_cache_get(PyCodeObject *code)
{
    void *extra = NULL;
    int rc = ags_compat_get_extra((PyObject *)code, extra_index, &extra);

    /* Fails only for a non-code object, which the callers never pass. */
    assert(rc == 0);
    (void)rc;
    return (ags_code_state *)extra;
}

ags_code_state *
ags_cache_ensure(PyCodeObject *code)
{
    ags_code_state *state = ags_cache_get(code);

    if (state != NULL) {
        return state;
    }
    state = PyMem_Calloc(1, sizeof(*state));
    if (state == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    if (ags_compat_set_extra((PyObject *)code, extra_index, state) < 0) {
        PyMem_Free(state);
        return NULL;
    }
    state->next = registry.next;
    state->prev = &registry;
    registry.next->prev = state;
    registry.next = state;
    return state;
}

static void
move_to_front(ags_code_state *state, Py_ssize_t i)
{
    ags_entry *hit = state->entries[i];

    memmove(&state->entries[1], &state->entries[0],
            (size_t)i * sizeof(ags_entry *));
    state->entries[0] = hit;
}

/* Returns 1 if `entry`'s guard holds, 0 if not, -1 on error.  For an
 * entry with a graph, *inputs is set to the graph's inputs the guard
 * program gathered on the way (a new tuple).  signed_frame: the frame's
 * signature matched the entry's exactly. */
static int
guard_holds(ags_entry *entry, ags_gframe *fr, int signed_frame,
            PyObject **inputs)
{
    PyObject *verdict;
    int ok;

    if (entry->guard == Py_None) {
        return 1;
    }
    if (ags_is_guard_program(entry->guard)) {
        int graph = entry->graph != NULL && entry->graph != Py_None;
        return ags_guard_run(entry->guard, fr, signed_frame, graph ? inputs : NULL);
    }
    if (fr->f_locals == NULL) {
        fr->f_locals = ags_frame_locals(fr->iframe);
        if (fr->f_locals == NULL) {
            return -1;
        }
    }
    {
        PyObject *args[3] = {fr->f_locals, fr->globals, fr->builtins};
        verdict = PyObject_Vectorcall(entry->guard, args, 3, NULL);
    }
    if (verdict == NULL) {
        return -1;
    }
    ok = PyObject_IsTrue(verdict);
    Py_DECREF(verdict);
    return ok;
}

/* (Re)builds the signature table of `state` for its current entries. */
static int
build_table(ags_code_state *state)
{
    Py_ssize_t signed_n = 0, cap = 8;

    for (Py_ssize_t i = 0; i < state->n_entries; i++) {
        signed_n += state->entries[i]->has_signature != 0;
    }
    while (cap < 2 * signed_n) {
        cap *= 2;
    }
    if (cap != state->table_cap) {
        ags_entry **table = PyMem_Calloc((size_t)cap, sizeof(ags_entry *));
        if (table == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        PyMem_Free(state->table);
        state->table = table;
        state->table_cap = cap;
    }
    else {
        memset(state->table, 0, (size_t)cap * sizeof(ags_entry *));
    }
    /* In the entries' order (most recent first), so that among entries of
     * one signature the most recent is tried first. */
    for (Py_ssize_t i = 0; i < state->n_entries; i++) {
        ags_entry *entry = state->entries[i];
        if (entry->has_signature) {
            Py_ssize_t k = (Py_ssize_t)(entry->signature & (uint64_t)(cap - 1));
            while (state->table[k] != NULL) {
                k = (k + 1) & (cap - 1);
            }
            state->table[k] = entry;
        }
    }
    state->n_unsigned = state->n_entries - signed_n;
    state->table_stamp = state->stamp;
    return 0;
}

/* Tries one entry: 1 (hit: *found is a new reference), 0 (go on),
 * 2 (stop: the cache changed while its guard ran; a miss is always
 * correct, only slower), -1 (error). */
static int
try_entry(ags_entry *entry, PyObject *ctx, ags_gframe *fr, int signed_frame,
          ags_entry **found, PyObject **inputs)
{
    uint64_t seen = version;
    int ok;

    if (entry->context != Py_None && entry->context != ctx) {
        return 0;
    }
    Py_INCREF(entry);
    ok = guard_holds(entry, fr, signed_frame, inputs);
    if (ok <= 0 || version != seen) {
        Py_CLEAR(*inputs);
        Py_DECREF(entry);
        return ok < 0 ? -1 : version != seen ? 2 : 0;
    }
    entry->hits++;
    entry->last_used = ++use_clock;
    *found = entry;
    return 1;
}

/* 1 if the frame's arguments match `entry`'s arg_check (the entry's
 * signature, without computing it), 0 if not, -1 on error. */
static int
args_match(ags_entry *entry, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *types = PyTuple_GET_ITEM(entry->arg_check, 0);
    PyObject *where = PyTuple_GET_ITEM(entry->arg_check, 1);
    PyObject *small[16], **tensors = small, *verdict;
    Py_ssize_t nt = PyTuple_GET_SIZE(where);
    int ok;

    if (PyTuple_GET_SIZE(types) != nargs) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {   /* type addresses, 0: unbound */
        void *want = PyLong_AsVoidPtr(PyTuple_GET_ITEM(types, i));
        if (want != (args[i] == NULL ? NULL : (void *)Py_TYPE(args[i]))) {
            return 0;
        }
    }
    if (nt == 0) {
        return 1;
    }
    if (nt > 16) {
        tensors = PyMem_Malloc((size_t)nt * sizeof(PyObject *));
        if (tensors == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    for (Py_ssize_t k = 0; k < nt; k++) {   /* positions checked at entry_new */
        tensors[k] = args[PyLong_AsSsize_t(PyTuple_GET_ITEM(where, k))];
    }
    verdict = PyObject_Vectorcall(PyTuple_GET_ITEM(entry->arg_check, 2), tensors,
                                  (size_t)nt, NULL);
    if (tensors != small) {
        PyMem_Free(tensors);
    }
    if (verdict == NULL) {
        return -1;
    }
    ok = verdict == Py_True ? 1 : verdict == Py_False ? 0 : PyObject_IsTrue(verdict);
    Py_DECREF(verdict);
    return ok;
}

int
ags_cache_lookup(ags_code_state *state, PyObject *ctx,
                 struct _PyInterpreterFrame *frame, PyObject **f_locals,
                 ags_entry **found, PyObject **inputs)
{
    uint64_t seen = version, sig;
    Py_ssize_t k, mask;
    ags_sig words;
    PyCodeObject *code = ags_frame_code(frame);
    ags_gframe fr = {*f_locals, ags_frame_globals(frame), ags_frame_builtins(frame),
                     ags_frame_args(frame), ags_code_nargs(code), frame};
    int rc = 0;

    if (state->n_entries == 0) {
        return 0;
    }
    if (state->table_stamp != state->stamp || state->table == NULL) {
        if (build_table(state) < 0) {
            return -1;
        }
    }
    /* Entries without a signature (no guard, or made outside a frame):
     * in most-recently-used order. */
    for (Py_ssize_t i = 0; state->n_unsigned > 0 && i < state->n_entries; i++) {
        ags_entry *entry = state->entries[i];
        if (entry->has_signature) {
            continue;
        }
        rc = try_entry(entry, ctx, &fr, 0, found, inputs);
        if (rc == 1 && i > 0) {
            move_to_front(state, i);
        }
        if (rc != 0) {
            rc = rc == 2 ? 0 : rc;
            goto out;
        }
    }
    if (state->n_unsigned == state->n_entries) {
        goto out;
    }
    /* The last signed hit, if the arguments match it (see "The steady
     * state" above). */
    if (state->fast_rest > 0) {
        state->fast_rest--;
    }
    else if (state->fast_entry != NULL && state->fast_stamp == state->stamp
             && state->fast_entry->arg_check != Py_None) {
        rc = args_match(state->fast_entry, fr.args, fr.nargs);
        if (rc == 1) {
            rc = try_entry(state->fast_entry, ctx, &fr, 1, found, inputs);
            ags_stats.arg_check_hits += rc == 1;
        }
        if (rc == 1) {
            state->fast_fails = 0;
        }
        else if (rc == 0 && ++state->fast_fails >= AGS_FAST_FAILS) {
            state->fast_fails = 0;          /* shapes that keep changing: */
            state->fast_rest = AGS_FAST_REST;   /* rest, then try again */
        }
        if (rc != 0 || version != seen) {
            rc = rc == 2 || rc == 0 ? 0 : rc;   /* the cache moved: a miss */
            goto out;
        }
    }
    /* The rest by the frame's signature: only entries made for it run
     * their guards, which also settle hash collisions. */
    if (ags_sig_compute(code, fr.args, &words, &sig) < 0) {
        rc = -1;
        goto out;
    }
    if (version != seen) {
        goto done;   /* reading tensor metadata ran code that changed caches */
    }
    mask = state->table_cap - 1;
    for (k = (Py_ssize_t)(sig & (uint64_t)mask); state->table[k] != NULL;
         k = (k + 1) & mask) {
        ags_entry *entry = state->table[k];
        /* an equal hash of different words is a collision: not this one */
        if (entry->signature != sig || !ags_entry_sig_equal(entry, &words)) {
            continue;
        }
        rc = try_entry(entry, ctx, &fr, 1, found, inputs);
        if (rc == 1 && entry->arg_check != Py_None) {
            state->fast_entry = entry;
            state->fast_stamp = state->stamp;
        }
        if (rc != 0) {
            rc = rc == 2 ? 0 : rc;
            goto done;
        }
    }
done:
    ags_sig_release(&words);
out:
    *f_locals = fr.f_locals;
    return rc;
}

int
ags_cache_insert(ags_code_state *state, ags_entry *entry)
{
    if (state->n_entries == state->cap_entries) {
        Py_ssize_t cap = state->cap_entries ? 2 * state->cap_entries : 2;
        ags_entry **grown = PyMem_Realloc(state->entries,
                                          (size_t)cap * sizeof(ags_entry *));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        state->entries = grown;
        state->cap_entries = cap;
    }
    memmove(&state->entries[1], &state->entries[0],
            (size_t)state->n_entries * sizeof(ags_entry *));
    state->entries[0] = (ags_entry *)Py_NewRef(entry);
    entry->last_used = ++use_clock;
    state->n_entries++;
    state->stamp++;
    version++;
    if (entry->has_signature && entry->arg_check != Py_None) {
        state->fast_entry = entry;   /* the next call most likely matches it */
        state->fast_stamp = state->stamp;
    }
    return 0;
}

PyCodeObject *
ags_cache_return_code(ags_code_state *state, PyCodeObject *code)
{
    if (state->retcode == NULL) {
        state->retcode = ags_bc_return_code(code);
    }
    return (PyCodeObject *)state->retcode;
}

int
ags_cache_evict(PyCodeObject *code, PyObject *entry)
{
    ags_code_state *state = ags_cache_get(code);

    for (Py_ssize_t i = 0; state != NULL && i < state->n_entries; i++) {
        if ((PyObject *)state->entries[i] == entry) {
            memmove(&state->entries[i], &state->entries[i + 1],
                    (size_t)(state->n_entries - i - 1) * sizeof(ags_entry *));
            state->n_entries--;
            state->stamp++;
            version++;
            Py_DECREF(entry);
            return 1;
        }
    }
    return 0;
}

/* Empties every code cache (ctx == NULL: entries and skip marks) or drops
 * the entries of one context only (skip marks and other contexts' entries
 * stay).  Returns how many code objects had a state, or -1. */
Py_ssize_t
ags_cache_clear(PyObject *ctx)
{
    Py_ssize_t n_states = 0, n_refs = 0, k = 0;
    ags_entry **doomed;

    for (ags_code_state *s = registry.next; s != &registry; s = s->next) {
        n_states++;
        n_refs += s->n_entries;
    }
    doomed = PyMem_Malloc((size_t)(n_refs ? n_refs : 1) * sizeof(*doomed));
    if (doomed == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    /* Empty the states first, release afterwards: releasing an entry may
     * free a code object and unlink its state from the list. */
    for (ags_code_state *s = registry.next; s != &registry; s = s->next) {
        Py_ssize_t kept = 0;

        for (Py_ssize_t i = 0; i < s->n_entries; i++) {
            ags_entry *entry = s->entries[i];

            if (ctx == NULL || entry->context == ctx) {
                doomed[k++] = entry;
            }
            else {
                s->entries[kept++] = entry;
            }
        }
        if (kept != s->n_entries) {
            s->stamp++;
        }
        s->n_entries = kept;
        if (ctx == NULL) {
            s->flags = 0;
        }
    }
    version++;
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_DECREF(doomed[i]);
    }
    PyMem_Free(doomed);
    return n_states;
}

PyObject *
ags_cache_describe(PyCodeObject *code)
{
    ags_code_state *state = ags_cache_get(code);
    PyObject *entries = NULL, *result = NULL;
    Py_ssize_t n = state ? state->n_entries : 0;
    uint32_t flags = state ? state->flags : 0;

    entries = PyList_New(n);
    if (entries == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyList_SET_ITEM(entries, i, Py_NewRef(state->entries[i]));
    }
    result = Py_BuildValue("{s:O,s:I,s:O,s:O,s:O}",
                           "has_cache", state ? Py_True : Py_False,
                           "flags", (unsigned int)flags,
                           "skip", (flags & AGS_CODE_SKIP) ? Py_True
                                                           : Py_False,
                           "disable", (flags & AGS_CODE_DISABLE) ? Py_True
                                                                 : Py_False,
                           "entries", entries);
done:
    Py_XDECREF(entries);
    return result;
}

/* ------------------------------------------------------------------ */
/* CacheEntry */

static const char *const action_names[] = {
#define AGS_X(name, doc) #name,
    AGS_ACTION_LIST(AGS_X)
#undef AGS_X
};

/* 0 if `spec` is a well-formed arg_check: (types, positions, checker),
 * types a tuple of type addresses (ints, 0: unbound; no reference is
 * kept, as in signatures), positions a tuple of indices of bound ones,
 * checker callable; else -1 with an exception. */
static int
check_arg_check(PyObject *spec)
{
    PyObject *types, *where;

    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3
        || !PyTuple_Check(PyTuple_GET_ITEM(spec, 0))
        || !PyTuple_Check(PyTuple_GET_ITEM(spec, 1))
        || !PyCallable_Check(PyTuple_GET_ITEM(spec, 2))) {
        goto bad;
    }
    types = PyTuple_GET_ITEM(spec, 0);
    where = PyTuple_GET_ITEM(spec, 1);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); i++) {
        if (!PyLong_CheckExact(PyTuple_GET_ITEM(types, i))) {
            goto bad;
        }
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(where); k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(where, k));
        if (i < 0 || i >= PyTuple_GET_SIZE(types)
            || PyLong_AsVoidPtr(PyTuple_GET_ITEM(types, i)) == NULL) {
            PyErr_Clear();
            goto bad;
        }
    }
    return 0;
bad:
    PyErr_SetString(PyExc_TypeError, "CacheEntry: arg_check must be None or "
                    "(type ids, tensor positions, checker)");
    return -1;
}

static PyObject *
entry_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"action", "guard", "compiled", "context",
                             "graph", "signed", "arg_check", NULL};
    int action, sign = 1;
    PyObject *guard = Py_None, *compiled = Py_None;
    PyObject *context = Py_None, *graph = Py_None, *arg_check = Py_None;
    ags_entry *self;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|OOOOpO:CacheEntry", kwlist,
                                     &action, &guard, &compiled, &context, &graph, &sign, &arg_check)) {
        return NULL;
    }
    if (arg_check != Py_None && check_arg_check(arg_check) < 0) {
        return NULL;
    }
    if (graph != Py_None && !(PyCallable_Check(graph) && ags_is_guard_program(guard))) {
        PyErr_SetString(PyExc_TypeError, "CacheEntry: graph must be None, or a "
                        "callable with a compiled guard program as guard");
        return NULL;
    }
    if (action < 0 || action >= AGS_ACTION_COUNT) {
        PyErr_Format(PyExc_ValueError,
                     "CacheEntry: unknown action %d (see agspeed._C."
                     "ACTION_NAMES)", action);
        return NULL;
    }
    if (guard != Py_None && !PyCallable_Check(guard)) {
        PyErr_Format(PyExc_TypeError,
                     "CacheEntry: guard must be None or callable, not %s",
                     Py_TYPE(guard)->tp_name);
        return NULL;
    }
    self = (ags_entry *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->action = action;
    self->guard = Py_NewRef(guard);
    self->compiled = Py_NewRef(compiled);
    self->context = Py_NewRef(context);
    self->graph = Py_NewRef(graph);
    self->unsigned_only = !sign;
    self->arg_check = Py_NewRef(arg_check);
    return (PyObject *)self;
}

static int
entry_traverse(ags_entry *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->guard);
    Py_VISIT(self->compiled);
    Py_VISIT(self->context);
    Py_VISIT(self->graph);
    Py_VISIT(self->arg_check);
    return 0;
}

static int
entry_clear(ags_entry *self)
{
    Py_CLEAR(self->guard);
    Py_CLEAR(self->compiled);
    Py_CLEAR(self->context);
    Py_CLEAR(self->graph);
    Py_CLEAR(self->arg_check);
    return 0;
}

static void
entry_dealloc(ags_entry *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    entry_clear(self);
    PyMem_Free(self->sig_words);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *
entry_repr(ags_entry *self)
{
    return PyUnicode_FromFormat("<agspeed CacheEntry %s hits=%llu>",
                                action_names[self->action],
                                (unsigned long long)self->hits);
}

static PyObject *
entry_get_action_name(ags_entry *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(action_names[self->action]);
}

static PyMemberDef entry_members[] = {
    {"action", T_INT, offsetof(ags_entry, action), READONLY,
     "what the hook does with a matching frame (see ACTION_NAMES)"},
    {"guard", T_OBJECT, offsetof(ags_entry, guard), READONLY,
     "None, or a callable(f_locals, f_globals, f_builtins) -> bool that "
     "must hold"},
    {"compiled", T_OBJECT, offsetof(ags_entry, compiled), READONLY,
     "the compiled callable that replaces the frame, or None"},
    {"context", T_OBJECT, offsetof(ags_entry, context), READONLY,
     "None (any context) or the one context the entry is valid in"},
    {"graph", T_OBJECT, offsetof(ags_entry, graph), READONLY,
     "None, or the graph the hook calls with the inputs its guard program "
     "gathers"},
    {"arg_check", T_OBJECT, offsetof(ags_entry, arg_check), READONLY,
     "None, or (types, tensor positions, checker): how a lookup tells, "
     "without computing it, that a frame has the entry's signature"},
    {"signature", T_ULONGLONG, offsetof(ags_entry, signature), READONLY,
     "the frame signature the entry was made for (if has_signature)"},
    {"has_signature", T_INT, offsetof(ags_entry, has_signature), READONLY,
     "1 if lookups compare the frame's signature before the guard"},
    {"hits", T_ULONGLONG, offsetof(ags_entry, hits), READONLY,
     "frames this entry was used for"},
    {"last_used", T_ULONGLONG, offsetof(ags_entry, last_used), READONLY,
     "when it was last used or inserted, on a clock of all entries: the "
     "smallest in a cache is its least recently used entry"},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ags_entry, weakrefs),
     READONLY, NULL},
    {NULL}
};

static PyObject *
entry_get_signed(ags_entry *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(!self->unsigned_only);
}

static PyGetSetDef entry_getset[] = {
    {"action_name", (getter)entry_get_action_name, NULL,
     "the action's name", NULL},
    {"signed", (getter)entry_get_signed, NULL,
     "False if the entry is never given a frame signature (it serves many: "
     "a graph with dynamic dimensions) and lookups try it by its guard", NULL},
    {NULL}
};

static PyType_Slot entry_slots[] = {
    {Py_tp_new, entry_new},
    {Py_tp_dealloc, entry_dealloc},
    {Py_tp_traverse, entry_traverse},
    {Py_tp_clear, entry_clear},
    {Py_tp_repr, entry_repr},
    {Py_tp_members, entry_members},
    {Py_tp_getset, entry_getset},
    {Py_tp_doc,
     "CacheEntry(action, guard=None, compiled=None, context=None, "
     "graph=None, signed=True, arg_check=None)\n\n"
     "One decision of a capture context for a code object, kept in the "
     "code's cache and used for every later frame of it whose guard holds."},
    {0, NULL}
};

PyType_Spec ags_entry_spec = {
    .name = "agspeed._C.CacheEntry",
    .basicsize = sizeof(ags_entry),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = entry_slots,
};

/* ------------------------------------------------------------------ */
/* Entry signatures */

int
ags_entry_set_signature(ags_entry *entry, const ags_sig *sig, uint64_t hash)
{
    int64_t *words = PyMem_Malloc((size_t)(sig->n + 1) * sizeof(int64_t));

    if (words == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(words, sig->words, (size_t)sig->n * sizeof(int64_t));
    PyMem_Free(entry->sig_words);
    entry->sig_words = words;
    entry->sig_n = sig->n;
    entry->signature = hash;
    entry->has_signature = 1;
    return 0;
}

int
ags_entry_sig_equal(const ags_entry *entry, const ags_sig *sig)
{
    return entry->sig_words != NULL && entry->sig_n == sig->n
           && memcmp(entry->sig_words, sig->words,
                     (size_t)sig->n * sizeof(int64_t)) == 0;
}
