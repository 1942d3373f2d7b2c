/* interp_flow.c: comparisons, truth, jumps, iteration and returns for the
 * symbolic interpreter (see interp.h).
 *
 * A branch is followed only when its condition is known while capturing:
 * a constant (shapes, `self.training`, `is None`), or the truth of a
 * container the capture built.  The truth of a tensor depends on its data:
 * the capture breaks there (reason data_dependent) and the frame runs
 * eager; but where one way of the branch only raises (`if not
 * valid.all(): raise ValueError(...)`, `assert (x > 0).all()`), the builder
 * may assume the other way, checked after the graph (assume_truth).
 * Loops run as often as their known sequence is long, which
 * unrolls them into the graph; GET_ITER turns any iterable the builder can
 * list without running user code (tuples, ranges, ModuleList, Sequential,
 * dict keys) into an ITER value over a tuple.
 */
#include "interp.h"

/* COMPARE_OP's operator numbers are Include/object.h's Py_LT...Py_GE, in
 * the order of the first rows of AGS_COMPARE_LIST (protocol.h). */
_Static_assert(Py_LT == AGS_COMPARE_LT && Py_LE == AGS_COMPARE_LE
               && Py_EQ == AGS_COMPARE_EQ && Py_NE == AGS_COMPARE_NE
               && Py_GT == AGS_COMPARE_GT && Py_GE == AGS_COMPARE_GE,
               "COMPARE_OP's operators are the first rows of the compare "
               "table");

/* The truth of a value.  AGS_GO with *truth set, or a break / error. */
int
ags_truth(ags_interp *it, const ags_value *v, int *truth)
{
    PyObject *out;

    switch (v->kind) {
    case AGS_VK_TUPLE:
    case AGS_VK_LIST:
    case AGS_VK_DICT:
    case AGS_VK_SET:
        *truth = PyObject_Length(v->obj) > 0;
        return AGS_GO;
    case AGS_VK_ITER:
    case AGS_VK_GENERATOR:
        *truth = 1;
        return AGS_GO;
    case AGS_VK_TENSOR:
        /* a size node (dynamic shapes) has a guarded truth; a tensor's
         * truth depends on its data: the builder breaks with data_dependent */
    case AGS_VK_CONST:
        if (v->kind == AGS_VK_CONST) {
            /* a Python __bool__ or __len__ (interp_dunder.c) */
            int rc = ags_dunder_truth(it, v, truth);
            if (rc != AGS_DUNDER_NOT_MINE) {
                return rc;
            }
        }
        out = ags_call_builder(it, AGS_BOP_TRUTH, "(O)", v->obj);
        if (out == NULL) {
            return ags_take_break(it);
        }
        *truth = out == Py_True;
        Py_DECREF(out);
        return AGS_GO;
    default:
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE, "the truth of a %s",
                         ags_kind_names[v->kind]);
    }
}

/* New tuple of graph arguments: the elements of an iterable value. */
int
ags_elements(ags_interp *it, const ags_value *v, PyObject **elems)
{
    PyObject *source, *pairs;
    Py_ssize_t n;

    switch (v->kind) {
    case AGS_VK_TUPLE:
    case AGS_VK_LIST:
        *elems = PySequence_Tuple(v->obj);
        return *elems ? AGS_GO : AGS_ERROR;
    case AGS_VK_DICT:
    case AGS_VK_SET:
        *elems = PySequence_Tuple(v->obj);  /* a dict's keys */
        return *elems ? AGS_GO : AGS_ERROR;
    case AGS_VK_ITER:
        *elems = PyTuple_GetSlice(v->obj, v->pos, PyTuple_GET_SIZE(v->obj));
        return *elems ? AGS_GO : AGS_ERROR;
    case AGS_VK_GENERATOR:
        return ags_gen_drain(it, v, elems);  /* runs it to its end */
    case AGS_VK_CONST:
        n = ags_owned_iterator(it, v);
        if (n != 0) {
            /* consumed, as list(it) does */
            *elems = n > 0 ? PySequence_Tuple(v->obj) : NULL;
            return *elems ? AGS_GO : AGS_ERROR;
        }
        break;
    case AGS_VK_TENSOR:
        break;  /* its rows (the builder unbinds it; the length is guarded) */
    default:
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                         "iterating over a %s",
                         ags_kind_names[v->kind]);
    }
    /* A known object: the builder lists it as (element, source or None). */
    source = ags_source_of(it, v);
    pairs = ags_call_builder(it, AGS_BOP_ITERATE, "(OO)", v->obj,
                             source ? source : Py_None);
    Py_XDECREF(source);
    if (pairs == NULL) {
        return ags_take_break(it);
    }
    n = PyTuple_GET_SIZE(pairs);
    *elems = PyTuple_New(n);
    for (Py_ssize_t i = 0; *elems != NULL && i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(pairs, i);
        PyObject *elem = PyTuple_GET_ITEM(pair, 0);
        PyObject *src = PyTuple_GET_ITEM(pair, 1);
        ags_value loaded;

        if (src != Py_None) {
            PyObject *arg;
            if (ags_load_object(it, src, elem, &loaded) < 0) {
                Py_CLEAR(*elems);
                break;
            }
            arg = ags_graph_arg(it, &loaded);
            ags_value_clear(&loaded);
            if (arg == NULL) {
                Py_CLEAR(*elems);
                Py_DECREF(pairs);
                return AGS_BREAK;
            }
            PyTuple_SET_ITEM(*elems, i, arg);
        }
        else {
            PyTuple_SET_ITEM(*elems, i, Py_NewRef(elem));
        }
    }
    Py_DECREF(pairs);
    return *elems ? AGS_GO : AGS_ERROR;
}

/* ------------------------------------------------------------------ */
/* Comparisons */

/* Pushes the builder's answer to `a op b` (graph arguments); op is an
 * AGS_COMPARE_*. */
static int
compare(ags_interp *it, ags_frame *f, int op, int swap)
{
    ags_value rhs = ags_pop(f), lhs = ags_pop(f);
    PyObject *a = ags_graph_arg(it, swap ? &rhs : &lhs), *b = NULL, *out;
    ags_value v;
    int rc = AGS_BREAK;

    if (a != NULL && (b = ags_graph_arg(it, swap ? &lhs : &rhs)) != NULL) {
        out = ags_call_builder(it, AGS_BOP_COMPARE, "(iOO)", op, a, b);
        if (out == NULL) {
            rc = ags_take_break(it);
        }
        else {
            rc = ags_value_of(it, out, &v) < 0 ? AGS_ERROR : ags_push(f, v);
            Py_DECREF(out);
        }
    }
    Py_XDECREF(a);
    Py_XDECREF(b);
    ags_value_clear(&lhs);
    ags_value_clear(&rhs);
    return rc;
}

AGS_HANDLER
op_compare_op(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    uint32_t op = ins->arg >> AGS_COMPARE_SHIFT;
    int rc;

    if (op > AGS_COMPARE_GE) {
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_INSTRUCTION,
                         "COMPARE_OP %u",
                         (unsigned)ins->arg);
    }
    /* a Python __eq__, __lt__... of either side (interp_dunder.c) */
    rc = ags_dunder_compare(it, f, (int)op);
    if (rc != AGS_DUNDER_NOT_MINE) {
        return rc;
    }
    return compare(it, f, (int)op, 0);
}

AGS_HANDLER
op_contains_op(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    /* a Python __contains__ or __iter__ (interp_dunder.c) */
    int rc = ags_dunder_contains(it, f, ins->arg != 0);

    if (rc != AGS_DUNDER_NOT_MINE) {
        return rc;
    }
    return compare(it, f, ins->arg ? AGS_COMPARE_NOT_IN : AGS_COMPARE_IN, 0);
}

/* None, True, False, Ellipsis, NotImplemented: `x is <one of them>` says
 * something about x's type or value, not about which object x is. */
static int
is_singleton(PyObject *obj)
{
    return obj == Py_None || obj == Py_True || obj == Py_False
           || obj == Py_Ellipsis || obj == Py_NotImplemented;
}

/* `a is b` of two graph tensors: one node, or two nodes of one fake tensor
 * (fake tensors stand one for one for the tensors eager would have: each
 * input tensor has its own, a new tensor a new one, and an op returning
 * its argument returns that argument's).  The distinct guard keeps two
 * inputs that were different objects different (guards/alias.c).  A
 * NumPy array is not the tensor whose fake it shares: by node only.  1, 0,
 * or -1 on error. */
static int
same_tensor(PyObject *a, PyObject *b)
{
    PyObject *ma, *mb, *fa, *fb;
    int same = 0;

    if (a == b) {
        return 1;
    }
    ma = PyObject_GetAttrString(a, "meta");
    mb = ma ? PyObject_GetAttrString(b, "meta") : NULL;
    if (mb == NULL || !PyDict_Check(ma) || !PyDict_Check(mb)) {
        Py_XDECREF(ma);
        Py_XDECREF(mb);
        return PyErr_Occurred() ? -1 : 0;
    }
    fa = PyDict_GetItemString(ma, "example_value");
    fb = PyDict_GetItemString(mb, "example_value");
    if (fa != NULL && fa == fb && PyDict_GetItemString(ma, "numpy") == NULL
        && PyDict_GetItemString(mb, "numpy") == NULL) {
        same = 1;
    }
    Py_DECREF(ma);
    Py_DECREF(mb);
    return same;
}

AGS_HANDLER
op_is_op(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value rhs = ags_pop(f), lhs = ags_pop(f);
    int same = 0, rc = AGS_GO;

    if (lhs.kind == AGS_VK_CONST && rhs.kind == AGS_VK_CONST) {
        same = lhs.obj == rhs.obj;
        if (!is_singleton(lhs.obj) && !is_singleton(rhs.obj)) {
            /* the answer rests on which objects these are: the builder keeps
             * them guarded by identity (agspeed/_identity.py) */
            PyObject *out = ags_call_builder(it, AGS_BOP_IDENTITY, "(OO)",
                                             lhs.obj, rhs.obj);
            rc = out == NULL ? ags_take_break(it) : AGS_GO;
            Py_XDECREF(out);
        }
    }
    else if (lhs.kind == AGS_VK_TENSOR && rhs.kind == AGS_VK_TENSOR) {
        same = same_tensor(lhs.obj, rhs.obj);
        rc = same < 0 ? AGS_ERROR : AGS_GO;
    }
    else if (AGS_BUILT_CONTAINER(&lhs) && AGS_BUILT_CONTAINER(&rhs)) {
        /* the capture's own lists, dicts and sets are their objects */
        same = lhs.obj == rhs.obj;
    }
    else if ((lhs.kind == AGS_VK_CONST && rhs.kind != AGS_VK_TENSOR
              && rhs.kind != AGS_VK_CONST)
             || (rhs.kind == AGS_VK_CONST && lhs.kind != AGS_VK_TENSOR
                 && lhs.kind != AGS_VK_CONST)
             || (lhs.kind == AGS_VK_CONST && lhs.obj == Py_None)
             || (rhs.kind == AGS_VK_CONST && rhs.obj == Py_None)) {
        /* A built container or a graph tensor is a fresh object: never a
         * known one, never None. */
        same = 0;
    }
    else {
        rc = ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                       "`is` between a %s and a %s",
                       AGS_DESCRIBE(&lhs), AGS_DESCRIBE(&rhs));
    }
    ags_value_clear(&lhs);
    ags_value_clear(&rhs);
    if (rc != AGS_GO) {
        return rc;
    }
    same = ins->arg ? !same : same;
    return ags_push(f, ags_value_make(AGS_VK_CONST,
                                      Py_NewRef(same ? Py_True : Py_False),
                                      NULL));
}

/* Whether the code from instruction `i` on only raises: straight-line
 * code (no jump, return or yield) ending in a `raise` of an exception. */
static int
only_raises(const ags_frame *f, Py_ssize_t i)
{
    for (int n = 0; i >= 0 && i < f->bc.n && n < 64; i++, n++) {
        const ags_instr *ins = &f->bc.instrs[i];

        if (ins->opcode == RAISE_VARARGS) {
            return ins->arg >= 1;
        }
        if (ins->target >= 0 || ins->opcode == RETURN_VALUE
            || ins->opcode == YIELD_VALUE || ins->opcode == RERAISE
#ifdef RETURN_CONST
            || ins->opcode == RETURN_CONST
#endif
            ) {
            return 0;
        }
    }
    return 0;
}

/* For the conditional jump at instruction `at`, taken on truth
 * `jump_when`: the truth that goes the way that does not only raise, when
 * the other way only raises; else -1. */
static int
truth_not_raising(const ags_frame *f, Py_ssize_t at, int jump_when)
{
    const ags_instr *ins = &f->bc.instrs[at];
    int falls, jumps;

    if (ins->target < 0) {
        return -1;
    }
    falls = only_raises(f, at + 1);
    jumps = only_raises(f, f->bc.index[ins->target / 2]);
    if (falls == jumps) {
        return -1;
    }
    return falls ? jump_when : !jump_when;
}

/* The truth of `v` for the conditional jump at instruction `at` (taken on
 * truth `jump_when`): a tensor's, where one way only raises, as the
 * builder assumes it (assume_truth); else as ags_truth. */
static int
branch_truth(ags_interp *it, const ags_frame *f, const ags_value *v,
             Py_ssize_t at, int jump_when, int *truth)
{
    PyObject *out;
    int want;

    if (v->kind != AGS_VK_TENSOR
        || (want = truth_not_raising(f, at, jump_when)) < 0) {
        return ags_truth(it, v, truth);
    }
    out = ags_call_builder(it, AGS_BOP_ASSUME_TRUTH, "(OO)", v->obj,
                           want ? Py_True : Py_False);
    if (out == NULL) {
        return ags_take_break(it);
    }
    *truth = out == Py_True;
    Py_DECREF(out);
    return AGS_GO;
}

/* The truth on which the conditional jump `op` jumps: 1 or 0, or -1 for an
 * instruction that is no such jump. */
static int
jump_truth(uint8_t op)
{
#ifdef POP_JUMP_IF_TRUE
    if (op == POP_JUMP_IF_TRUE) {
        return 1;
    }
    if (op == POP_JUMP_IF_FALSE) {
        return 0;
    }
#endif
#ifdef POP_JUMP_FORWARD_IF_TRUE
    if (op == POP_JUMP_FORWARD_IF_TRUE || op == POP_JUMP_BACKWARD_IF_TRUE) {
        return 1;
    }
    if (op == POP_JUMP_FORWARD_IF_FALSE || op == POP_JUMP_BACKWARD_IF_FALSE) {
        return 0;
    }
#endif
    return -1;
}

int
ags_feeds_raising_branch(const ags_frame *f)
{
    Py_ssize_t at = f->pc + 1;
    int when;

    if (f->pc < 0 || f->pc >= f->bc.n || f->bc.instrs[f->pc].opcode != CALL) {
        return 0;
    }
#ifdef TO_BOOL
    if (at < f->bc.n && f->bc.instrs[at].opcode == TO_BOOL) {
        at++;
    }
#endif
    if (at >= f->bc.n || (when = jump_truth(f->bc.instrs[at].opcode)) < 0) {
        return 0;
    }
    return truth_not_raising(f, at, when) >= 0;
}

/* The truth TO_BOOL (3.13) takes of `v`: for the conditional jump right
 * after it, as branch_truth; else as ags_truth. */
static int
to_bool_truth(ags_interp *it, const ags_frame *f, const ags_value *v,
              int *truth)
{
#ifdef TO_BOOL
    if (f->pc + 1 < f->bc.n) {
        int when = jump_truth(f->bc.instrs[f->pc + 1].opcode);
        if (when >= 0) {
            return branch_truth(it, f, v, f->pc + 1, when, truth);
        }
    }
#endif
    (void)f;
    return ags_truth(it, v, truth);
}

/* UNARY_NOT and TO_BOOL: a known truth. */
static int
push_truth(ags_interp *it, ags_frame *f, int negate)
{
    ags_value v = ags_pop(f);
    int truth = 0, rc = negate ? ags_truth(it, &v, &truth)
                               : to_bool_truth(it, f, &v, &truth);

    ags_value_clear(&v);
    if (rc != AGS_GO) {
        return rc;
    }
    truth = negate ? !truth : truth;
    return ags_push(f, ags_value_make(AGS_VK_CONST,
                                      Py_NewRef(truth ? Py_True : Py_False),
                                      NULL));
}

AGS_HANDLER
op_unary_not(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return push_truth(it, f, 1);
}

AGS_HANDLER
op_to_bool(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)ins;
    return push_truth(it, f, 0);
}

/* ------------------------------------------------------------------ */
/* Jumps */

static void
jump_to(ags_frame *f, const ags_instr *ins, int skip)
{
    f->jump = f->bc.index[ins->target / 2] + skip;
}

AGS_HANDLER
op_jump(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    jump_to(f, ins, 0);
    return AGS_GO;
}

/* POP_JUMP_IF_TRUE / FALSE, and 3.11's FORWARD / BACKWARD forms. */
static int
pop_jump_if(ags_interp *it, ags_frame *f, const ags_instr *ins, int when)
{
    ags_value v = ags_pop(f);
    int truth = 0, rc = branch_truth(it, f, &v, f->pc, when, &truth);

    ags_value_clear(&v);
    if (rc == AGS_GO && truth == when) {
        jump_to(f, ins, 0);
    }
    return rc;
}

AGS_HANDLER
op_pop_jump_if_true(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return pop_jump_if(it, f, ins, 1);
}

AGS_HANDLER
op_pop_jump_if_false(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return pop_jump_if(it, f, ins, 0);
}

static int
pop_jump_if_none(ags_interp *it, ags_frame *f, const ags_instr *ins, int when)
{
    ags_value v = ags_pop(f);
    int is_none = v.kind == AGS_VK_CONST && v.obj == Py_None;

    (void)it;
    ags_value_clear(&v);
    if (is_none == when) {
        jump_to(f, ins, 0);
    }
    return AGS_GO;
}

AGS_HANDLER
op_pop_jump_if_none(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return pop_jump_if_none(it, f, ins, 1);
}

AGS_HANDLER
op_pop_jump_if_not_none(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return pop_jump_if_none(it, f, ins, 0);
}

/* 3.11's JUMP_IF_TRUE_OR_POP / JUMP_IF_FALSE_OR_POP: keep the value and
 * jump, or pop it and go on. */
static int
jump_if_or_pop(ags_interp *it, ags_frame *f, const ags_instr *ins, int when)
{
    int truth = 0, rc = ags_truth(it, ags_peek(f, 1), &truth);

    if (rc != AGS_GO) {
        return rc;
    }
    if (truth == when) {
        jump_to(f, ins, 0);
    }
    else {
        ags_drop(f, 1);
    }
    return AGS_GO;
}

AGS_HANDLER
op_jump_if_true_or_pop(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return jump_if_or_pop(it, f, ins, 1);
}

AGS_HANDLER
op_jump_if_false_or_pop(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    return jump_if_or_pop(it, f, ins, 0);
}

/* ------------------------------------------------------------------ */
/* Iteration */

/* Is obj a view of a dict (keys(), values(), items()): live, as long as
 * its dict. */
static int
dict_view(PyObject *obj)
{
    return PyDictKeys_Check(obj) || PyDictValues_Check(obj)
           || PyDictItems_Check(obj);
}

/* The list, dict or set a loop over v iterates and the loop's body may
 * change (borrowed): one the capture built, or one of the program's that
 * a change during capture shadows (interp_effects.c), or a view of a dict
 * (whose length is its dict's); else NULL. */
static PyObject *
changeable(const ags_value *v)
{
    switch (v->kind) {
    case AGS_VK_LIST:
    case AGS_VK_DICT:
    case AGS_VK_SET:
        return v->obj;
    case AGS_VK_CONST:
    case AGS_VK_LAZY:
        return PyList_CheckExact(v->obj) || PyDict_Check(v->obj)
                       || dict_view(v->obj)
                   ? v->obj
                   : NULL;
    default:
        return NULL;
    }
}

/* Brings an ITER's elements up to date with the container it follows
 * (iter->of), as CPython's iterators see it: a list is read at the
 * iterator's index, so what the body appended, removed or replaced is
 * seen; a dict or set that changed size makes eager raise RuntimeError
 * at the next step, so the capture stops there and the frame runs eager.
 * AGS_GO, a break, or AGS_ERROR. */
int
ags_iter_follow(ags_interp *it, ags_value *iter)
{
    PyObject *view, *now;
    Py_ssize_t n, live;

    if (iter->of == NULL) {
        return AGS_GO;
    }
    view = ags_live_view(it, iter->of);
    if (view == NULL) {
        return AGS_ERROR;
    }
    if (view == iter->of && iter->of_program) {
        return AGS_GO;  /* the program's, with no shadow: not changed */
    }
    n = PyTuple_GET_SIZE(iter->obj);
    if (!PyList_Check(view)) {
        live = PyObject_Length(view);
        if (live < 0) {
            return AGS_ERROR;
        }
        if (live == n) {
            return AGS_GO;
        }
        return ags_stopf(it, AGS_REASON_RAISE,
                         "a %s changed size while a loop iterated it",
                         Py_TYPE(view)->tp_name);
    }
    live = PyList_GET_SIZE(view);
    if (live == n && (iter->pos >= n
                      || PyList_GET_ITEM(view, iter->pos)
                             == PyTuple_GET_ITEM(iter->obj, iter->pos))) {
        return AGS_GO;
    }
    now = PyList_AsTuple(view);
    if (now == NULL) {
        return AGS_ERROR;
    }
    Py_SETREF(iter->obj, now);
    return AGS_GO;
}

AGS_HANDLER
op_get_iter(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value v, iter;
    PyObject *elems = NULL;
    /* a Python __iter__ gives the iterator (interp_dunder.c) */
    int rc = ags_dunder_get_iter(it, f);

    if (rc != AGS_GO) {
        return rc;
    }
    if (ags_peek(f, 1)->kind == AGS_VK_GENERATOR) {
        return AGS_GO;  /* its own iterator, stepped by FOR_ITER */
    }
    v = ags_pop(f);
    rc = ags_owned_iterator(it, &v);

    (void)ins;
    if (rc != 0) {
        /* iter(it) is it: FOR_ITER steps the object itself */
        return rc < 0 ? AGS_ERROR : ags_push(f, v);
    }
    rc = ags_elements(it, &v, &elems);
    if (rc != AGS_GO) {
        ags_value_clear(&v);
        return rc;
    }
    iter = ags_value_make(AGS_VK_ITER, elems, NULL);
    iter.of = Py_XNewRef(changeable(&v));
    /* a view shows its dict as it is now, the capture's or one the capture
     * never changes: followed as the capture's own */
    iter.of_program = iter.of != NULL && !dict_view(iter.of)
                      && (v.kind == AGS_VK_CONST || v.kind == AGS_VK_LAZY);
    ags_value_clear(&v);
    return ags_push(f, iter);
}

/* FOR_ITER over a generator: one step of its frame (interp_gen.c). */
static int
for_iter_generator(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value v;
    int rc = ags_gen_next(it, f, ags_peek(f, 1), &v);

    if (rc == AGS_GO) {
        return ags_push(f, v);
    }
    if (rc == AGS_DONE) {
        ags_value_clear(&v);
        ags_drop(f, 1);
        jump_to(f, ins, AGS_FOR_ITER_SKIP);
        return AGS_GO;
    }
    return rc;
}

/* Exhausted: the iterator is popped and the jump lands past the loop's
 * END_FOR (and 3.13's POP_TOP after it): AGS_FOR_ITER_SKIP instructions
 * after the target. */
AGS_HANDLER
op_for_iter(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    ags_value *iter = ags_peek(f, 1);
    ags_value v;
    int exhausted = 0, rc;

    switch (iter->kind) {
    case AGS_VK_GENERATOR:
        return for_iter_generator(it, f, ins);
    case AGS_VK_ITER:
        rc = ags_iter_follow(it, iter);
        if (rc != AGS_GO) {
            return rc;
        }
        exhausted = iter->pos >= PyTuple_GET_SIZE(iter->obj);
        if (exhausted) {
            break;
        }
        if (ags_value_of(it, PyTuple_GET_ITEM(iter->obj, iter->pos), &v) < 0) {
            return AGS_ERROR;
        }
        iter->pos++;
        return ags_push(f, v);
    case AGS_VK_CONST:
        rc = ags_owned_iterator(it, iter);
        if (rc <= 0) {
            return rc < 0 ? AGS_ERROR
                          : ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                                      "FOR_ITER over a %s",
                                      AGS_DESCRIBE(iter));
        }
        rc = ags_iter_step(it, f, iter, &exhausted);
        if (rc != AGS_GO || !exhausted) {
            return rc;
        }
        break;
    default:
        return ags_stopf(it, AGS_REASON_UNSUPPORTED_VALUE,
                         "FOR_ITER over a %s",
                         AGS_DESCRIBE(iter));
    }
    ags_drop(f, 1);
    jump_to(f, ins, AGS_FOR_ITER_SKIP);
    return AGS_GO;
}

AGS_HANDLER
op_end_for(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    (void)ins;
    ags_drop(f, AGS_END_FOR_POPS);
    return AGS_GO;
}

/* ------------------------------------------------------------------ */
/* Returns and raises */

AGS_HANDLER
op_return_value(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    (void)it;
    (void)ins;
    ags_value_clear(&f->retval);
    f->retval = ags_pop(f);
    return AGS_DONE;
}

AGS_HANDLER
op_return_const(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    PyObject *c = PyTuple_GET_ITEM(f->code->co_consts, ins->arg);

    (void)it;
    ags_value_clear(&f->retval);
    f->retval = ags_value_make(AGS_VK_CONST, Py_NewRef(c), NULL);
    return AGS_DONE;
}

AGS_HANDLER
op_raise(ags_interp *it, ags_frame *f, const ags_instr *ins)
{
    /* a LookupError an inlined handler may catch (interp_catch.c) */
    int rc = ags_raise(it, f, ins);

    if (rc != AGS_DUNDER_NOT_MINE) {
        return rc;
    }
    return ags_stopf(it, AGS_REASON_RAISE,
                     "the code raises here for these inputs: "
                     "eager raises it");
}
