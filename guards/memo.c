/* memo.c: the structure memo of a guard program, and the dict and type
 * watchers that keep it cheap.
 *
 * Most of a model's guard is about its structure: each submodule is the
 * same object, has no hooks, is in the same training mode, and each
 * parameter is the same tensor.  Checking all of it costs time in
 * proportion to the model.  After an evaluation that passed, the memo
 * remembers the values of the loads below the frame's nn.Module argument
 * (the root, `self`) that were answered in C from places it can watch, and
 * the facts that keep those answers valid (witnesses):
 *
 *   TYPEOF   an object still has its type, and the type's version tag is
 *            unchanged (no attribute of it or of its bases was set since);
 *   DICTPTR  an object's __dict__ is the same dict, with the same version;
 *   DICT     a dict reached from there (an nn.Module store, a hook dict, a
 *            dict indexed by the program) has the same version.
 *
 * Which loads are remembered, and what each depends on, is the load op's
 * row (load.c, ags_load_depends); which checks a remembered load makes
 * needless is the check kind's row (check.c, ags_check_memo_rule).  This
 * file only keeps the facts.
 *
 * CPython gives a dict a new version tag on every change, so while the
 * root is the same object and the witnesses hold, every remembered load
 * would find the same object again and the checks on them (identity,
 * equality of immutable values, absence, lengths of remembered dicts and
 * tuples) would answer as before: they are skipped.  So are tensor checks
 * on remembered tensors (parameters and buffers): a tensor's metadata
 * changed in place (`p.data = other`) without any dict changing is not
 * seen, unless the program has AGS_GFLAG_CHECK_KNOWN_TENSORS.
 *
 * Witnesses are kept in load order, parents first, and checked in that
 * order: an object is looked at only after the facts that keep it alive
 * held, so no pointer is followed to a freed object.  The memo owns no
 * reference but a weak one to its root.
 *
 * With watchers (3.12+) every witnessed dict and type is watched, and any
 * change to any of them bumps the epoch.  While the epoch has not moved
 * since the memo was last confirmed no version needs reading: a confirmed
 * memo costs the root's identity and one type comparison per object,
 * whatever the model's size.
 */
#include "program.h"

/* A fact the memo relies on. */
enum { W_TYPEOF, W_DICTPTR, W_DICT };

typedef struct g_witness_ {
    int kind;
    PyObject *obj;       /* borrowed: TYPEOF/DICTPTR: the object; DICT: the
                            dict */
    PyObject *dict;      /* borrowed: DICTPTR: the object's __dict__ */
    PyObject **where;    /* DICTPTR: where the object keeps its __dict__
                            (fixed by its type's layout, which TYPEOF before
                            it keeps) */
    PyTypeObject *type;  /* borrowed: TYPEOF: the object's type */
    uint64_t version;    /* TYPEOF: the type's version tag; DICTPTR/DICT:
                            the dict's version tag */
    int repeat;          /* TYPEOF: an earlier witness has the same type,
                            so its version is read once */
} g_witness;

static uint64_t watch_epoch;
#ifdef AGS_HAVE_WATCHERS
static int dict_watcher = -1, type_watcher = -1;

static int
on_dict_event(PyDict_WatchEvent event, PyObject *dict, PyObject *key,
              PyObject *new_value)
{
    (void)event;
    (void)dict;
    (void)key;
    (void)new_value;
    watch_epoch++;
    return 0;
}

static int
on_type_event(PyTypeObject *type)
{
    (void)type;
    watch_epoch++;
    return 0;
}
#endif

int
ags_memo_init(void)
{
#ifdef AGS_HAVE_WATCHERS
    /* None free (another extension holds them all): versions alone. */
    if (dict_watcher < 0) {
        dict_watcher = PyDict_AddWatcher(on_dict_event);
    }
    if (type_watcher < 0) {
        type_watcher = PyType_AddWatcher(on_type_event);
    }
    if (dict_watcher < 0 || type_watcher < 0) {
        PyErr_Clear();   /* not an error: the memo reads versions instead */
    }
#endif
    return 0;
}

void
ags_memo_release(g_memo *m)
{
    Py_CLEAR(m->root_ref);
    PyMem_Free(m->frozen);
    PyMem_Free(m->values);
    PyMem_Free(m->skip);
    PyMem_Free(m->live);
    PyMem_Free(m->typeof_w);
    PyMem_Free(m->skip_alias);
    PyMem_Free(m->apart);
    PyMem_Free(m->fresh);
    PyMem_Free(m->w);
    memset(m, 0, sizeof(*m));
}

static int
add_witness(g_memo *m, int kind, PyObject *obj, PyObject *dict)
{
    g_witness *w;

    if (m->n_w == m->cap_w) {
        Py_ssize_t cap = m->cap_w ? 2 * m->cap_w : 16;
        g_witness *grown = PyMem_Realloc(m->w,
                                         (size_t)cap * sizeof(g_witness));
        if (grown == NULL) {
            return -1;
        }
        m->w = grown;
        m->cap_w = cap;
    }
    w = &m->w[m->n_w++];
    w->kind = kind;
    w->obj = obj;
    w->dict = dict;
    w->where = NULL;
    w->type = Py_TYPE(obj);
    w->version = 0;
    w->repeat = 0;
    return 0;
}

/* The witnesses of the loads answered in C on `obj`: its type, its
 * __dict__ and, for an nn.Module, its first `stores` stores. */
static int
witness_object(g_program *p, PyObject *obj, int stores)
{
    g_memo *m = &p->memo;
    PyObject **dp, *dict;

    if (add_witness(m, W_TYPEOF, obj, NULL) < 0) {
        return -1;
    }
    dp = _PyObject_GetDictPtr(obj);
    if (dp == NULL || *dp == NULL) {
        PyErr_Clear();
        return 0;        /* no instance dict: attributes come from the type */
    }
    dict = *dp;
    if (!PyDict_Check(dict) || add_witness(m, W_DICTPTR, obj, dict) < 0) {
        return -1;
    }
    m->w[m->n_w - 1].where = dp;
    if (PyObject_TypeCheck(obj, (PyTypeObject *)p->module_type)) {
        for (int s = 0; s < stores; s++) {
            PyObject *store = PyDict_GetItemWithError(dict,
                                                      ags_gp_names.stores[s]);
            if (store == NULL && PyErr_Occurred()) {
                return -1;
            }
            if (store != NULL && PyDict_Check(store)
                && add_witness(m, W_DICT, store, store) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* The witnesses of load `slot`'s value, once per build (seen[slot]): an
 * object's, for attribute answers that went as deep as `via`, or with
 * VIA_PYTHON a dict's version alone. */
static int
witness_once(g_program *p, char *seen, Py_ssize_t slot, PyObject *obj, int via)
{
    if (seen[slot]) {
        return 0;
    }
    seen[slot] = 1;
    if (via == VIA_PYTHON) {
        return add_witness(&p->memo, W_DICT, obj, obj);
    }
    return witness_object(p, obj,
                          via >= VIA_NOWHERE ? 3 : via - VIA_CLASS_OR_DICT);
}

/* The root: the first local holding an nn.Module that takes weak
 * references, or -1. */
static int
find_root(const g_program *p, const g_values *t)
{
    for (Py_ssize_t i = 0; i < p->n_loads; i++) {
        PyObject *v = t->vals[i];
        if (p->loads[i].op == AGS_LOAD_LOCAL && v != NULL && v != G_MISSING
            && PyObject_TypeCheck(v, (PyTypeObject *)p->module_type)
            && Py_TYPE(v)->tp_weaklistoffset != 0) {
            return (int)i;
        }
    }
    return -1;
}

/* Which loads are remembered, and what each object's answers depended on
 * (pass 0); then the witnesses, parents first (pass 1). */
static int
remember_loads(g_program *p, g_values *t, int root, char *seen, char *depth)
{
    g_memo *m = &p->memo;

    for (int pass = 0; pass < 2; pass++) {
        for (Py_ssize_t i = root + 1; i < p->n_loads; i++) {
            const g_load *ld = &p->loads[i];
            PyObject *v = t->vals[i], *base;
            int via;

            if (v == NULL || ld->parent < 0 || !m->frozen[ld->parent]) {
                continue;
            }
            base = t->vals[ld->parent];
            if (base == G_MISSING) {
                continue;
            }
            via = ags_load_depends(p, t, i, base);
            if (pass == 0) {
                m->frozen[i] = via != DEP_NONE;
                if (via > depth[ld->parent]) {
                    depth[ld->parent] = (char)via;
                }
            }
            else if (via >= 0) {
                int deepest = via == VIA_PYTHON ? via : depth[ld->parent];
                if (witness_once(p, seen, ld->parent, base, deepest) < 0) {
                    return -1;
                }
            }
        }
    }
    return 0;
}

/* Which checks and aliases the remembered loads make needless. */
static int
skip_checks(g_program *p, g_values *t, char *seen)
{
    g_memo *m = &p->memo;

    for (Py_ssize_t c = 0; c < p->n_checks; c++) {
        const g_check *ck = &p->checks[c];
        PyObject *v = t->vals[ck->slot];
        g_memo_rule rule = G_MEMO_RUN;

        if (m->frozen[ck->slot] && v != NULL) {
            rule = ags_check_memo_rule(p, ck, v);
        }
        if (rule == G_MEMO_SKIP_DICT
            && witness_once(p, seen, ck->slot, v, VIA_PYTHON) < 0) {
            return -1;
        }
        m->skip[c] = rule != G_MEMO_RUN;
    }
    m->n_live = 0;
    for (Py_ssize_t c = 0; c < p->n_checks; c++) {
        if (!m->skip[c]) {
            m->live[m->n_live++] = (int)c;
        }
    }
    for (Py_ssize_t a = 0; a < p->n_aliases; a++) {
        m->skip_alias[a] = m->frozen[p->aliases[2 * a]]
                           && m->frozen[p->aliases[2 * a + 1]];
    }
    return 0;
}

/* Notes each TYPEOF witness, and which repeat an earlier one's type. */
static int
index_types(g_memo *m)
{
    PyMem_Free(m->typeof_w);
    m->typeof_w = PyMem_Calloc((size_t)m->n_w + 1, sizeof(int));
    if (m->typeof_w == NULL) {
        return -1;
    }
    m->n_typeof = 0;
    for (Py_ssize_t k = 0; k < m->n_w; k++) {
        if (m->w[k].kind == W_TYPEOF) {
            for (Py_ssize_t j = 0; j < m->n_typeof; j++) {   /* a model has */
                if (m->w[m->typeof_w[j]].type == m->w[k].type) {   /* few */
                    m->w[k].repeat = 1;                            /* types */
                    break;
                }
            }
            m->typeof_w[m->n_typeof++] = (int)k;
        }
    }
    return 0;
}

/* Watches every witness (first: watching a dict changes its version tag's
 * low bits), then reads their versions.  0, or -1 if a type has no valid
 * version tag (a change would go unseen). */
static int
read_versions(g_memo *m)
{
    m->watched = 0;
#ifdef AGS_HAVE_WATCHERS
    m->watched = dict_watcher >= 0 && type_watcher >= 0;
    for (Py_ssize_t k = 0; m->watched && k < m->n_w; k++) {
        g_witness *w = &m->w[k];
        int rc = w->kind == W_TYPEOF
                 ? PyType_Watch(type_watcher, (PyObject *)w->type)
                 : PyDict_Watch(dict_watcher, w->dict);
        if (rc < 0) {
            PyErr_Clear();   /* not watched: versions are read instead */
            m->watched = 0;
        }
    }
#endif
    for (Py_ssize_t k = 0; k < m->n_w; k++) {
        g_witness *w = &m->w[k];
        if (w->kind == W_TYPEOF) {
            w->version = w->type->tp_version_tag;
            if (w->version == 0) {
                return -1;
            }
        }
        else {
            w->version = ags_compat_dict_version(w->dict);
        }
    }
    return 0;
}

void
ags_memo_build(g_program *p, g_values *t)
{
    g_memo *m = &p->memo;
    Py_ssize_t n = p->n_loads;
    char *seen, *depth;
    int root;

    m->valid = 0;
    Py_CLEAR(m->root_ref);
    m->n_w = 0;
    if ((p->flags & AGS_GFLAG_NO_MEMO) || p->module_type == NULL) {
        return;
    }
    root = find_root(p, t);
    if (root < 0) {
        return;
    }
    if (m->frozen == NULL) {
        m->frozen = PyMem_Calloc((size_t)n + 1, 3);  /* frozen, seen, depth */
        m->values = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
        m->skip = PyMem_Calloc((size_t)p->n_checks + 1, 1);
        m->live = PyMem_Calloc((size_t)p->n_checks + 1, sizeof(int));
        m->skip_alias = PyMem_Calloc((size_t)p->n_aliases + 1, 1);
        if (!m->frozen || !m->values || !m->skip || !m->live
            || !m->skip_alias) {
            ags_memo_release(m);
            return;
        }
    }
    seen = m->frozen + n;     /* objects already witnessed, by load */
    depth = seen + n;         /* how deep attribute answers on it went */
    memset(m->frozen, 0, 3 * (size_t)n);
    m->slot = root;
    m->frozen[root] = 1;
    if (remember_loads(p, t, root, seen, depth) < 0
        || skip_checks(p, t, seen) < 0 || index_types(m) < 0
        || read_versions(m) < 0) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        m->values[i] = m->frozen[i] ? t->vals[i] : NULL;
    }
    if (ags_alias_memo(p) < 0) {
        goto fail;
    }
    m->root_ref = PyWeakref_NewRef(t->vals[root], NULL);
    if (m->root_ref == NULL) {
        goto fail;
    }
    m->epoch = watch_epoch;
    m->valid = 1;
    return;
fail:
    PyErr_Clear();   /* no memo: the program runs in full, as it may */
    m->valid = 0;
    m->n_w = 0;
}

int
ags_memo_confirm(g_program *p, ags_gframe *frame)
{
    g_memo *m = &p->memo;
    PyObject *cur, *root;

    cur = ags_load_local(frame, &p->loads[m->slot]);
    root = ags_compat_weak_target(m->root_ref);
    if (cur == NULL || cur != root) {
        PyErr_Clear();   /* an unreadable root: the full program reports */
        return 0;
    }
    if (m->watched && m->epoch == watch_epoch) {
        for (Py_ssize_t k = 0; k < m->n_typeof; k++) {
            g_witness *w = &m->w[m->typeof_w[k]];
            if (Py_TYPE(w->obj) != w->type) {
                return 0;
            }
        }
        return 1;
    }
    for (Py_ssize_t k = 0; k < m->n_w; k++) {
        g_witness *w = &m->w[k];
        switch (w->kind) {
        case W_TYPEOF:
            if (Py_TYPE(w->obj) != w->type
                || (!w->repeat && w->type->tp_version_tag != w->version)) {
                return 0;
            }
            break;
        case W_DICTPTR:
            if (*w->where != w->dict
                || ags_compat_dict_version(w->dict) != w->version) {
                return 0;
            }
            break;
        default:
            if (ags_compat_dict_version(w->dict) != w->version) {
                return 0;
            }
        }
    }
    m->epoch = watch_epoch;   /* confirmed: the moves were elsewhere */
    return 1;
}

PyObject *
ags_memo_report(g_program *p)
{
    g_memo *m = &p->memo;
    Py_ssize_t frozen = 0, skipped = 0;

    for (Py_ssize_t i = 0; m->valid && i < p->n_loads; i++) {
        frozen += m->frozen[i] != 0;
    }
    for (Py_ssize_t i = 0; m->valid && i < p->n_checks; i++) {
        skipped += m->skip[i] != 0;
    }
    return Py_BuildValue("{s:O,s:n,s:n,s:n,s:O,s:K,s:K,s:K}", "valid",
                         m->valid ? Py_True : Py_False,
                         "remembered_loads", frozen,
                         "skipped_checks", skipped,
                         "witnesses", m->valid ? m->n_w : 0,
                         "watched",
                         m->valid && m->watched ? Py_True : Py_False,
                         "fast", (unsigned long long)m->fast,
                         "full", (unsigned long long)m->full,
                         "builds", (unsigned long long)m->builds);
}
