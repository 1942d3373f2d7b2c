/* interp.h: what the symbolic interpreter's files share (interp*.c only).
 *
 * The interpreter is split by job:
 *   interp.c       values, frames, the instruction loop, inlining, the entry
 *   interp_args.c  graph arguments, sources, assumptions, ownership
 *   interp_data.c  loads and stores, stack shuffles, containers
 *   interp_subscr.c  slices and subscripts
 *   interp_attr.c  attributes: of known objects, of tensors, getattr, super
 *   interp_call.c  calls: torch ops, modules, functions, folds, by plan
 *   interp_func.c  functions: binding arguments and closures, making them
 *   interp_ops.c   operators and f-strings
 *   interp_flow.c  comparisons, truth, jumps, iteration, returns
 *   interp_resume.c  the root frame's state where capture stops (resume)
 *   interp_effects.c  the program's lists and dicts changed in capture
 *   interp_gen.c   generators: a suspended frame stepped to its next yield
 *   interp_exc.c   try blocks (exception tables) and with blocks
 *   interp_build.c sets and dict merges assembled at run time
 *   interp_import.c  imports of loaded modules
 *   interp_iter.c  owned iterators; map, filter, reduce, partial calls
 *   interp_object.c  objects the capture makes: class calls, their
 *                  attribute writes
 *   interp_catch.c  a subscript's KeyError/IndexError caught by a handler
 *                  of an inlined function
 *   interp_dunder.c  special methods written in Python (__getitem__,
 *                  __contains__, __len__, __iter__, __bool__), inlined
 *
 * Abstract values.  A value is one of AGS_VALUE_KINDS.  It owns a
 * reference to `obj` and to `source` (how the value is reached from the
 * root frame, a tuple such as ("attr", ("local", "self"), "fc1"); NULL for
 * computed values).  Containers the capture built (TUPLE, LIST, DICT,
 * SET) hold their elements as "graph arguments": a graph node for a
 * tensor, the object itself for anything else.  Objects that were loaded
 * from a source are remembered in the capture's `known` map (id ->
 * (object, source)), so a module taken back out of a tuple still has its
 * source.
 *
 * Policy lives in the builder (agspeed._graph.GraphBuilder): which calls
 * become graph nodes, which are inlined, how an attribute is found without
 * running user code.  The C side walks bytecode and keeps the stacks.
 */
#ifndef AGS_INTERP_H
#define AGS_INTERP_H

#include "agspeed.h"

#define AGS_VALUE_KINDS(X) \
    X(UNBOUND, "a local with no value (also pushed by LOAD_FAST_AND_CLEAR)") \
    X(NULL_MARK, "the NULL of the call protocol") \
    X(CONST, "a Python object known while capturing") \
    X(TENSOR, "a tensor the graph computes: obj is its graph node") \
    X(METHOD, "a tensor method looked up for a call: obj is its name") \
    X(TUPLE, "a tuple built during capture: obj holds graph arguments") \
    X(LIST, "a list built during capture: obj holds graph arguments") \
    X(DICT, "a dict built during capture: obj holds graph arguments") \
    X(SET, "a set built during capture: obj holds graph arguments") \
    X(ITER, "an iterator over the tuple obj, at position pos") \
    X(LAZY, "an argument not read yet: obj is its value, guarded once read") \
    X(GENERATOR, "a generator the capture made: obj owns its suspended " \
      "frame (interp_gen.c)")

typedef enum {
#define AGS_X(name, doc) AGS_VK_##name,
    AGS_VALUE_KINDS(AGS_X)
#undef AGS_X
} ags_vkind;

extern const char *const ags_kind_names[];

typedef struct {
    int kind;
    int of_program;     /* ITER only: `of` is the program's own object,
                         * which the capture changes only in its shadow */
    Py_ssize_t pos;     /* ITER only */
    PyObject *obj;      /* strong or NULL */
    PyObject *source;   /* strong or NULL */
    PyObject *of;       /* ITER only: the list, dict or set iterated, whose
                         * changes FOR_ITER follows (strong), or NULL */
} ags_value;

/* A list, dict or set the capture built: the value is that object itself
 * (never the program's, which is a CONST until shadowed). */
#define AGS_BUILT_CONTAINER(v) \
    ((v)->kind == AGS_VK_LIST || (v)->kind == AGS_VK_DICT \
     || (v)->kind == AGS_VK_SET)

/* For messages: the kind, or the type of a constant. */
#define AGS_DESCRIBE(v) \
    ((v)->kind == AGS_VK_CONST ? Py_TYPE((v)->obj)->tp_name \
                               : ags_kind_names[(v)->kind])

/* Handler results. */
#define AGS_GO 0        /* next instruction */
#define AGS_DONE 1      /* the frame returned: its retval is set */
#define AGS_ERROR (-1)  /* a Python exception is set: a bug or MemoryError */
#define AGS_BREAK (-2)  /* capture stops here; the capture's brk_* say why */
#define AGS_STOPPED (-3) /* the root frame reached it->stop_at, not run */
#define AGS_YIELD 2     /* a generator's frame yielded: its retval is set */

/* Inlining deeper than this ends the capture (recursion). */
#define AGS_MAX_DEPTH 32
/* Instructions one capture may execute (unrolled loops included). */
#define AGS_MAX_STEPS 200000

typedef struct ags_frame {
    struct ags_frame *parent;
    PyCodeObject *code;
    ags_bytecode bc;
    PyObject *func;             /* borrowed: the inlined function, or NULL */
    PyObject *fsource;          /* borrowed: its source, or NULL at the root */
    PyObject *globals;          /* borrowed */
    PyObject *builtins;         /* borrowed */
    ags_value *locals;
    int nlocals;
    /* Per local slot, NULL or a real cell shared with a function this
     * capture made (MAKE_FUNCTION with a closure): the slot's value lives
     * in the cell, as a graph argument, so that writes on either side are
     * seen on the other.  Strong; allocated on first use. */
    PyObject **cells;
    ags_value *stack;
    int sp, stack_cap;
    PyObject *kwnames;          /* borrowed: pending KW_NAMES (3.11, 3.12) */
    Py_ssize_t pc;              /* index of the current instruction */
    Py_ssize_t jump;            /* index to go to next, or -1 */
    ags_value retval;
    int depth;
} ags_frame;

typedef struct {
    PyObject *builder, *tensor_type, *node_type;
    PyObject *array_type;       /* numpy.ndarray (builder.ndarray_type), or
                                   NULL when NumPy is not loaded */
    PyObject *symbolic_scalars; /* frozenset of the sources of plain ints
                                   and floats the builder makes symbols
                                   (builder.symbolic_scalars), or NULL */
    PyObject *assumptions;      /* list of (source, value) */
    PyObject *known;            /* dict: id -> (object, source) */
    PyObject *owned;            /* set of ids of containers built here */
    PyObject *gen_boxes;        /* dict: id -> the *args tuple or **kwargs
                                   dict a call packed a generator into
                                   (interp_func.c), held alive here */
    PyObject *shadows;          /* dict: id of a list or dict of the program
                                   -> its shadow, or (tail, source) for a
                                   list only appended to (interp_effects.c) */
    PyObject *fresh;            /* list or NULL: builder.fresh_containers,
                                   lists and dicts a fold made inside what it
                                   answered, owned once it answers */
    /* Where the last assumption was made: the frame and instruction (a
     * list loaded right before its append is appended to unguarded). */
    ags_frame *assumed_in;
    Py_ssize_t assumed_at;
    long steps;
    ags_frame *top;             /* the innermost frame running */
    /* Where capture stopped: the innermost frame's code and instruction. */
    int brk_reason;             /* an AGS_REASON_*, or -1 before a break */
    PyObject *brk_detail;       /* strong str */
    PyCodeObject *brk_code;     /* borrowed (alive while capturing) */
    int brk_offset, brk_opcode;
    /* Strong or NULL: the exception the program's own operation raised
     * when that caused the builder's break (its GraphBreak's __cause__),
     * which a handler of an inlined frame may catch (interp_catch.c). */
    PyObject *brk_raised;
    /* Resuming (interp_resume.c): the root instruction capture stopped
     * in (where an inlined callee's break surfaces), and the root offset
     * to stop before without running it; -1 for none. */
    int root_offset, stop_at;
    /* getattr() with a default (or hasattr) running a class's own
     * __getattribute__ inlined: the frame of that call, where a read past
     * the hook of an absent attribute returns to (interp_attr.c); `absent`
     * says the break unwinding to it is that read's. */
    ags_frame *absent_to;
    int absent;
    /* A STORE_GLOBAL ran: later global reads first ask whether this capture
     * wrote the name (interp_data.c). */
    int wrote_globals;
    /* Instructions and container methods run so far that may change state
     * beyond their frame's own variables (stores to attributes, items,
     * globals and cells): map() and filter() compare it around the calls
     * they make ahead of eager (interp_iter.c). */
    long writes;
    /* While map() or filter() calls a function ahead: a copy of `owned`
     * from before the call (what it makes itself is its own to change);
     * else NULL. */
    PyObject *ahead_before;
    /* Set or NULL: the iterators map() and filter() of a Python function
     * answered, whose calls were made ahead; a container extended by one
     * breaks (interp_iter.c). */
    PyObject *ahead;
} ags_interp;

typedef int (*ags_handler)(ags_interp *, ags_frame *, const ags_instr *);

/* Each version's table (AGS_INTERP_OPS) uses some of the handlers: the
 * others are compiled and checked everywhere but unused on that version. */
#define AGS_HANDLER int __attribute__((unused))

/* interp_args.c */
PyObject *ags_graph_arg(ags_interp *it, const ags_value *v);
PyObject *ags_held_arg(ags_interp *it, const ags_value *v);
PyObject *ags_op_arg(ags_interp *it, const ags_value *v);
int ags_value_of(ags_interp *it, PyObject *obj, ags_value *out);
int ags_assume(ags_interp *it, PyObject *source, PyObject *value);
int ags_type_attr_source(ags_interp *it, const ags_value *v, const char *name,
                         PyObject *func, PyObject **out);
PyObject *ags_source_of(ags_interp *it, const ags_value *v);
int ags_load_object(ags_interp *it, PyObject *source, PyObject *value,
                    ags_value *out);
int ags_own(ags_interp *it, PyObject *container);
int ags_is_owned(ags_interp *it, PyObject *container);
/* 1 if obj is a tuple or dict a call packed a generator into. */
int ags_is_gen_box(ags_interp *it, PyObject *obj);

/* interp.c */
void ags_value_clear(ags_value *v);
ags_value ags_value_make(int kind, PyObject *obj, PyObject *source);
ags_value ags_value_copy(const ags_value *v);
/* Ends the capture here for `reason` (an AGS_REASON_*): returns AGS_BREAK,
 * or AGS_ERROR when `detail` (stolen) is NULL. */
int ags_stop(ags_interp *it, int reason, PyObject *detail);
int ags_stopf(ags_interp *it, int reason, const char *fmt, ...);
int ags_push(ags_frame *f, ags_value v);
ags_value ags_pop(ags_frame *f);
ags_value *ags_peek(ags_frame *f, int depth);
void ags_drop(ags_frame *f, int n);
int ags_take_break(ags_interp *it);
/* Forgets the break being taken, as a handler that caught it would. */
void ags_unbreak(ags_interp *it);

/* interp_catch.c: after a break at `ins` of f, AGS_GO when a handler of f
 * catches it (f->jump set, the exception pushed), else AGS_BREAK. */
int ags_catch(ags_interp *it, ags_frame *f, const ags_instr *ins);
/* RAISE_VARARGS of a LookupError in an inlined frame: a break ags_catch
 * may catch; else AGS_DUNDER_NOT_MINE. */
int ags_raise(ags_interp *it, ags_frame *f, const ags_instr *ins);
/* A builtin exception class called with known arguments: the exception,
 * made now (AGS_GO, *result set); else AGS_DUNDER_NOT_MINE. */
int ags_exception_new(ags_interp *it, PyObject *fn, const ags_value *self,
                      const ags_value *args, int nargs, PyObject *kwnames,
                      ags_value *result);
PyObject *ags_call_builder(ags_interp *it, int op, const char *fmt, ...);
int ags_frame_cell(ags_interp *it, ags_frame *f, int i, PyObject **cell);
int ags_is_free_slot(const ags_frame *f, int i);
int ags_inline(ags_interp *it, ags_frame *caller, PyObject *func,
               PyObject *fsource, ags_value *args, int nargs,
               PyObject *kwnames, ags_value *result);
int ags_push_callable(ags_frame *f, ags_value callable, ags_value *self);
void ags_frame_release(ags_frame *f);
int ags_frame_run_from(ags_interp *it, ags_frame *f, Py_ssize_t pc);

/* interp_data.c */
int ags_materialize(ags_interp *it, ags_value *v);

/* interp_attr.c */
int ags_load_attr(ags_interp *it, ags_frame *f, PyObject *name, int method);
/* ags_call_getattr's modes: getattr(), hasattr(), object.__getattribute__
 * (the read past a class's own __getattribute__) */
enum { AGS_GETATTR_GET, AGS_GETATTR_HAS, AGS_GETATTR_RAW };
int ags_call_getattr(ags_interp *it, ags_frame *f, int mode, ags_value *args,
                     int nargs, PyObject *kwnames, ags_value *result);
int ags_push_super(ags_interp *it, ags_frame *f, PyObject *cls,
                   PyObject *self);
int ags_zero_arg_super(ags_interp *it, ags_frame *f);

/* interp_call.c */
int ags_do_call(ags_interp *it, ags_frame *f, int nargs, PyObject *kwnames);
int ags_call_value(ags_interp *it, ags_frame *f, ags_value *callable,
                   ags_value *self, ags_value *args, int nargs,
                   PyObject *kwnames, ags_value *result);
/* Calls the builder's operation `op` (an AGS_BOP_*) as op(extra, args,
 * kwargs) on graph arguments packed from `first` (or NULL) and args, the
 * last len(kwnames) by keyword, and sets *result. */
int ags_builder_call(ags_interp *it, int op, PyObject *extra,
                     const ags_value *first, ags_value *args, int nargs,
                     PyObject *kwnames, ags_value *result);

/* interp_func.c */
int ags_bind_params(ags_interp *it, ags_frame *f, PyObject *plan,
                    ags_value *args);
int ags_bind_closure(ags_interp *it, ags_frame *f, PyObject *func,
                     PyObject *fsource);

/* interp_build.c */
int ags_mapping_items(ags_interp *it, const ags_value *v, PyObject **items);
int ags_own_created(ags_interp *it, ags_value *v);
int ags_own_varkw(ags_interp *it, ags_frame *f, int i);

/* interp_iter.c */
int ags_extends_by_ahead(ags_interp *it, PyObject *name, const ags_value *args,
                         int nargs);
int ags_note_write(ags_interp *it, PyObject *target);
int ags_owned_iterator(ags_interp *it, const ags_value *v);
int ags_iter_step(ags_interp *it, ags_frame *f, ags_value *iter,
                  int *exhausted);
int ags_call_iter_plan(ags_interp *it, ags_frame *f, int kind,
                       PyObject *plan, ags_value *args, int nargs,
                       PyObject *kwnames, ags_value *result);

/* interp_ops.c */
int ags_ops_init(void);
PyObject *ags_binary_fn(uint32_t op);
int ags_is_deque(PyObject *obj);
int ags_is_deque_method(PyObject *fn);
int ags_is_defaultdict(PyObject *obj);
int ags_unary_positive(ags_interp *it, ags_frame *f);

/* interp_subscr.c: whether obj is a dict (or a subclass) storing items
 * with dict's or OrderedDict's own __setitem__ (no Python method runs). */
int ags_plain_dict_store(PyObject *obj);

/* interp_effects.c */
int ags_shadowed(ags_interp *it, PyObject *obj, ags_value *out);
PyObject *ags_live_view(ags_interp *it, PyObject *obj);
int ags_can_shadow(const ags_value *v);
int ags_container_kind(PyObject *obj);
int ags_is_mutator(PyObject *container, PyObject *name);
int ags_shadow(ags_interp *it, ags_value *v);
int ags_tail(ags_interp *it, ags_frame *f, ags_value *v, PyObject *name);
int ags_effect_setattr(ags_interp *it, ags_value *owner, PyObject *name,
                       PyObject *arg, PyObject **hook);
/* interp_object.c */
int ags_call_new(ags_interp *it, ags_frame *f, PyObject *plan,
                 ags_value *args, int nargs, PyObject *kwnames,
                 ags_value *result);
int ags_store_attr(ags_interp *it, ags_frame *f, ags_value *owner,
                   PyObject *name, ags_value *value);

/* interp_dunder.c: each answers AGS_DUNDER_NOT_MINE when the value's type
 * has no such Python method (the caller takes its usual path). */
#define AGS_DUNDER_NOT_MINE 4
int ags_dunder_call(ags_interp *it, ags_frame *f, const char *name,
                    const ags_value *self, const ags_value *args, int nargs,
                    ags_value *result);
int ags_dunder_truth(ags_interp *it, const ags_value *v, int *truth);
int ags_dunder_get_iter(ags_interp *it, ags_frame *f);
int ags_dunder_contains(ags_interp *it, ags_frame *f, int negate);
/* COMPARE_OP `op` (an AGS_COMPARE_* up to GE) on the two values on top,
 * when either side's type has the Python method (pushes the result). */
int ags_dunder_compare(ags_interp *it, ags_frame *f, int op);
int ags_dunder_builtin(ags_interp *it, ags_frame *f, PyObject *fn,
                       const ags_value *self, const ags_value *args,
                       int nargs, PyObject *kwnames, ags_value *result);

/* interp_flow.c */
int ags_truth(ags_interp *it, const ags_value *v, int *truth);
/* Whether the value the current instruction (a CALL) pushes goes straight
 * to a conditional jump (through 3.13's TO_BOOL) one of whose ways only
 * raises: the jump whose truth the builder may assume (interp_flow.c). */
int ags_feeds_raising_branch(const ags_frame *f);
int ags_elements(ags_interp *it, const ags_value *v, PyObject **elems);
int ags_iter_follow(ags_interp *it, ags_value *iter);

/* interp_resume.c */
/* New reference: {"stack": [...], "locals": [...], "cells": bool,
 * "owned": frozenset}, each value as (kind name, payload, source); owned:
 * the ids of the objects this capture made. */
PyObject *ags_frame_state(ags_interp *it, const ags_frame *f);
/* builder.stop_at into *out when the builder has one (else *out is left
 * alone).  0, or -1 with an exception set. */
int ags_stop_at(PyObject *builder, int *out);
/* interp_gen.c */
int ags_gen_code(PyCodeObject *code);
/* Takes the frame *f (bound, not started) into a new GENERATOR value. */
int ags_gen_new(ags_interp *it, ags_frame *f, PyObject *func,
                PyObject *fsource, ags_value *result);
/* Runs a GENERATOR's frame to its next yield: AGS_GO with *out the value
 * yielded, AGS_DONE with *out the value returned, or a break / error.
 * caller: the frame asking, or NULL. */
int ags_gen_next(ags_interp *it, ags_frame *caller, const ags_value *gen,
                 ags_value *out);
/* Runs a GENERATOR to its end: a new tuple of the graph arguments it
 * yielded. */
int ags_gen_drain(ags_interp *it, const ags_value *gen, PyObject **elems);
int ags_gen_ctx_new(ags_interp *it, ags_frame *f, PyObject *plan,
                    ags_value *args, int nargs, PyObject *kwnames,
                    ags_value *result);
int ags_gen_is_ctx(const ags_value *v);
/* 1 if obj is the capsule a GENERATOR value holds. */
int ags_gen_is_capsule(PyObject *obj);
int ags_gen_ctx_step(ags_interp *it, ags_frame *f, const ags_value *gen,
                     int enter, ags_value *result);
/* any()/all() of a GENERATOR, stepped only to the first decisive value:
 * *result is the known bool. */
int ags_gen_any_all(ags_interp *it, ags_frame *f, int want,
                    const ags_value *gen, ags_value *result);
/* Before a builtin fn folds args (borrowed stack slots): any()/all() of a
 * GENERATOR are answered (AGS_DONE, *result set); every other GENERATOR
 * argument is run to its end and replaced by the tuple of its values
 * (AGS_GO).  Or a break / error. */
int ags_gen_fold(ags_interp *it, ags_frame *f, PyObject *fn, ags_value *args,
                 int nargs, ags_value *result);
/* A call the builder cannot plan: next(gen) and next(gen, default) step
 * the GENERATOR (AGS_GO, *result set); other calls are AGS_GEN_NOT_MINE. */
#define AGS_GEN_NOT_MINE 3
int ags_gen_call(ags_interp *it, ags_frame *f, PyObject *fn, ags_value *args,
                 int nargs, PyObject *kwnames, ags_value *result);

/* The handlers of every file, by name, for the version tables. */
#define AGS_DECLARE_HANDLER(op, handler, doc) \
    AGS_HANDLER handler(ags_interp *, ags_frame *, const ags_instr *);

#endif
