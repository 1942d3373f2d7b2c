"""Graph breaks that resume: what runs a frame whose capture stopped at an instruction.

The design is in ``csrc/emit.c`` (the assembler this module writes for) and in
docs/architecture.md ("Graph breaks that resume").  In short, for a break at root
instruction *i* of a frame:

1. the frame is captured again, stopping *before* i (``GraphBuilder.stop_at``), which
   hands back the root frame's abstract stack and locals there (csrc/interp_resume.c).
   A break inside an inlined callee surfaces at the root's call instruction, so the
   call runs for real and the callee gets its own frame through the hook;
2. the graph's outputs are the live tensors (and containers of them) of that state;
3. the *break code* (never captured: marked skip) is called with every live value: it
   pushes the stack back, runs instruction i (with the KW_NAMES / PRECALL that belong
   to a call), and calls the *resume function* of the path taken with the new stack
   and the locals;
4. a resume function is the original code behind a prologue that pushes the stack and
   jumps to the instruction after the break.  It keeps the user's file, lines and
   names (``resume_in_<name>_at_<line>``), so the hook captures and caches it like any
   user code, and tracebacks through it name the user's lines.

The frame's CALL entry (``agspeed._runtime``) runs the graph, replays the side effects
the capture recorded before the break (attribute writes, lists and dicts written back,
logging: in eager they happen before the break instruction), then the break code; the
generated code objects are cached per (code, break offset, layout), so later calls
reuse them and their cache entries.

With blocks.  A break inside ``with`` blocks of the managers the builder models
(torch's grad modes, inference mode, autocast, ``nullcontext``; ``agspeed._ctx``)
resumes as torch._dynamo's does: the capture leaves the open blocks at the end of the
graph (so the graph ends in the modes the frame started in); the break code makes a
manager of each block anew, of constants in its own code, and enters it around the
break instruction (leaving it before calling on); the resume function makes and enters
another in its prologue, at the block's place on the stack, so the rest of the block,
its normal exit and its exception handler run as in the original.  An exception from
the break instruction leaves the break code's blocks and goes on in a resume function
that starts at the innermost handler (the with block's cleanup), with the exception
and its offset pushed where CPython pushes them, so the manager's exit sees it and
outer handlers run.

Cells and free variables.  A resume function keeps the original's cell and free
variables: its prologue copies a closure that the runner makes per call from the
values the frame started with (the hook reads a closure's contents), makes the cells,
and fills the cells that are not parameters from parameters of their own; the original
instructions' cell and free slots move past the added parameters.  Argument-less
``super()`` works, as it finds ``__class__`` among the free variables and ``self`` in
the first slot.

A resume function's own break resumes where the user's code would: the offset maps
back to the original code (the prologue is all a resume function adds), and the break
code and resume functions are the original's for that place (``original``).

Loops.  A break inside a loop resumes (torch._dynamo runs such a frame eager).  A ``for``
loop's iterator crosses as the tuple of the items it had left, which the resume
function's prologue iterates; every later pass breaks in that resume function and
resumes in it again, one entry per pass.  The runner of a resume function hands the
call it would make back to the runner that began the chain (``_Then``), so the passes
run at one depth of Python frames.

What is refused (the frame then runs eager as before, and says why), matching
torch._dynamo where it has a rule: a loop with more than ``LOOP_ITEMS`` items left at
the break, under ``try`` whose handler is not a with block's
(torch._dynamo compiles no graph there either), in a with block of a manager the
builder does not model (a user's ``__enter__``/``__exit__``), in code that writes a
variable of an enclosing function (the resume function's cells are its own), a local
shared with a closure made before the break, an exception or exception class at the
break (a guard would keep it, and its traceback's frames, alive), generators, and break
instructions that are not a plain stack operation or a conditional jump.
"""

from __future__ import annotations

import collections
import dis
import functools
import itertools
import sys
import types
import weakref
from typing import Any, NamedTuple

from agspeed import _C
from agspeed._builder_types import DICT_VIEWS, holds_node

__all__ = ["decode", "BreakSite", "break_site", "Layout", "layout_of", "generated",
           "is_generated"]

_OP = dis.opmap
_NO_OP = -1

# Per-version facts of the code this module writes (values are opcode names).
# CALL_FUNCTION_EX takes [NULL, callable, args] on 3.11/3.12, [callable, NULL, args]
# on 3.13: pushing these two in this order and then SWAP 3 puts the callable where it
# belongs (the args tuple comes first).
_CALL_EX_PUSH = {(3, 11): ("LOAD_FAST", "PUSH_NULL"), (3, 12): ("LOAD_FAST", "PUSH_NULL"),
                 (3, 13): ("PUSH_NULL", "LOAD_FAST")}[sys.version_info[:2]]
# ... and CALL takes [NULL, callable, args] on 3.11/3.12, [callable, NULL, args] on 3.13.
_CALL_PUSH = ("PUSH_NULL", "LOAD_CONST") if sys.version_info < (3, 13) else \
    ("LOAD_CONST", "PUSH_NULL")
# Instructions that belong with the CALL after them (they only set up the call).
_CALL_PREFIX = {n for n in ("KW_NAMES", "PRECALL") if n in _OP}
_BRANCHES = {_OP[n] for n in _OP if n.startswith("POP_JUMP") and "IF_" in n}
# Instructions a break code can run for real: no locals, no jumps, the frame goes on.
_REFUSED = set(dis.haslocal) | set(dis.hasfree) | {
    _OP[n] for n in ("RETURN_VALUE", "RETURN_CONST", "YIELD_VALUE", "RAISE_VARARGS",
                     "RERAISE", "FOR_ITER", "END_FOR", "SEND", "BEFORE_WITH",
                     "PUSH_EXC_INFO", "POP_EXCEPT", "RETURN_GENERATOR", "SETUP_ANNOTATIONS",
                     "IMPORT_STAR", "LOAD_LOCALS", "EXTENDED_ARG")
    if n in _OP}
# Loads that may push the call protocol's NULL (a method load, a global or attribute
# loaded for a call: the argument's low bit): a break code cannot hand a NULL it did
# not know of to a resume function, so a break there is not resumed.
_NULL_LOADS = {_OP[n] for n in ("LOAD_METHOD", "PUSH_NULL") if n in _OP}
_NULL_BIT_LOADS = {_OP[n] for n in (("LOAD_GLOBAL",) if sys.version_info < (3, 12)
                                     else ("LOAD_GLOBAL", "LOAD_ATTR", "LOAD_SUPER_ATTR"))}
# How the handler of a with block's body starts (an exception leaving the block).
_WITH_CLEANUP = ["PUSH_EXC_INFO", "WITH_EXCEPT_START"]
_CO_VAR = 0x04 | 0x08  # CO_VARARGS | CO_VARKEYWORDS: a resume function takes a tuple
_UNRESUMABLE = 0x20 | 0x80 | 0x100 | 0x200  # generators, coroutines
# The most items a loop broken inside may have left: the runner hands them on as a
# tuple at every break, and each place in the loop is an entry of the resume function.
LOOP_ITEMS = 64


def decode(code: types.CodeType) -> tuple[list, list, dict]:
    """``code`` as ``_C.emit`` takes it: instructions (opcode, arg, target index,
    position), handlers (start, end, handler, depth, lasti) by index, and the map from
    an instruction's byte offset to its index."""
    rows = _C.decode(code)
    positions = list(code.co_positions())
    index = {}
    for i, row in enumerate(rows):
        index[row[0]] = index[row[1]] = i
    instrs = []
    for start, offset, op, arg, target, _next in rows:
        pos = positions[offset // 2]
        instrs.append((op, arg, index[target] if target >= 0 else -1,
                       tuple(pos) if pos[0] is not None else None))
    handlers = [(index[s], index.get(e, len(rows)), index[h], d, lasti)
                for s, e, h, d, lasti in _C.exception_table(code)]
    return instrs, handlers, index


class BreakSite(NamedTuple):
    """The root instructions a break code runs: ``first``..``last`` (indices), the
    last a branch or not; ``offset`` the byte offset capture stops before;
    ``handler`` the innermost exception handler covering them, (index, depth, lasti),
    or None."""

    first: int
    last: int
    offset: int
    branch: bool
    handler: tuple | None = None


def break_site(code: types.CodeType, root_offset: int) -> BreakSite | str:
    """Where the break code of a break at ``root_offset`` starts and ends, or why
    the frame cannot resume there."""
    if code.co_flags & _UNRESUMABLE:
        return "generators are not resumed"
    if code.co_freevars and _writes_free(code):
        # a resume function gets cells of its own holding the values the frame
        # started with: a write would not reach the enclosing function's
        return "a write to a variable of an enclosing function is not resumed"
    if root_offset < 0:
        return "capture stopped before the first instruction"
    rows = _C.decode(code)
    at = next((i for i, r in enumerate(rows) if r[1] == root_offset), None)
    if at is None:
        return "no instruction at the break"
    start = rows[at][0]
    handler = None
    for s, e, h, d, lasti in _C.exception_table(code):
        if s <= start < e:
            where = next((i for i, r in enumerate(rows) if r[0] == h), None)
            if where is None:
                return "an exception handler at no instruction"
            if _restores_comprehension(rows, where, code):
                continue        # nothing to restore in a frame the exception leaves
            if [dis.opname[r[2]] for r in rows[where:where + 2]] != _WITH_CLEANUP:
                # (torch._dynamo does not resume there either: it compiles no graph)
                return "a break under try runs the frame eager (as torch._dynamo does)"
            handler = (where, d, lasti)
    op = rows[at][2]
    first = at
    while first > 0 and dis.opname[rows[first - 1][2]] in _CALL_PREFIX \
            and dis.opname[op] == "CALL":
        first -= 1
    if op in _BRANCHES:
        return BreakSite(first, at, rows[first][1], True, handler)
    if op in _REFUSED or rows[at][4] >= 0 or dis.opname[op] in _CALL_PREFIX \
            or op in _NULL_LOADS or (op in _NULL_BIT_LOADS and rows[at][3] & 1):
        return f"{dis.opname[op]} cannot be run by a break code"
    return BreakSite(first, at, rows[first][1], False, handler)


_RESTORING = {"SWAP", "POP_TOP", "STORE_FAST", "STORE_FAST_STORE_FAST"}


def _restores_comprehension(rows: list, where: int, code: types.CodeType) -> bool:
    """Whether the handler at row ``where`` only puts back the variables an inlined
    comprehension (3.12 on) hid, and re-raises, with no handler of its own: the break
    code, running its instruction without it, lets the exception leave the frame as
    it would (the variables it would put back are the leaving frame's)."""
    names = []
    for row in rows[where:]:
        names.append(dis.opname[row[2]])
        if names[-1] not in _RESTORING:
            break
    if names[:2] != ["SWAP", "POP_TOP"] or names[-1] != "RERAISE":
        return False
    start = rows[where][0]
    return not any(s <= start < e for s, e, _h, _d, _l in _C.exception_table(code))


class Layout(NamedTuple):
    """How each slot of the state at a break is rebuilt: per stack slot and per local
    (co_varnames order), ("output", i) the graph's i-th output, ("constant", obj),
    ("local", name) the frame's local, ("source", src) what the source reaches on the
    call (``agspeed._sources``), ("null",) the call protocol's NULL,
    ("unbound",) a local with no value, ("ctx", cls, args) the exit of a with block
    whose manager ``cls(*args)`` makes anew (the generated code makes and enters one
    around the break instruction, and the resume function another around the rest:
    made in their own code, of constants, so that capturing it assumes nothing of a
    manager handed in), ("iter", slots) the iterator of a ``for`` loop the break is in:
    the runner hands a tuple of what it had left to yield (each item a slot as above),
    and the resume function's prologue iterates it."""

    stack: tuple
    locals: tuple
    outputs: tuple  # the graph's outputs (nodes and containers of them)
    cells: tuple = ()   # the cell variables that are not parameters, as ``locals``

    def key(self) -> tuple:
        """What the generated code depends on: which stack slots are NULL or a with
        block's exit (the slot itself), which locals are unbound."""
        return (tuple(s if s[0] == "ctx" else s[0] if s[0] in ("null", "iter")
                      else "value" for s in self.stack),
                tuple(s[0] == "unbound" for s in self.locals + self.cells))


_DESCRIPTORS = (types.MethodDescriptorType, types.ClassMethodDescriptorType,
                types.WrapperDescriptorType, classmethod, staticmethod)


def _not_the_programs(value: Any, builder: Any) -> str:
    """Why a constant the capture holds is not the object the program's own stack would
    hold there ("" when it is): a model the builder made of it (a context manager's
    steps, a tensor method bound to a node), or a descriptor the interpreter split from
    the object it was looked up on, where CPython holds the bound method."""
    kind = type(value)
    if kind.__module__.split(".")[0] == "agspeed":
        return f"a {kind.__name__} the capture models at the break"
    if isinstance(value, _DESCRIPTORS):
        return "a method split from its object at the break"
    if isinstance(value, functools.partial) and any(
            isinstance(a, builder.node_type)
            for a in (*value.args, *(value.keywords or {}).values())):
        return "a method bound to a graph value at the break"
    if kind is types.MethodType and (builder.can_escape(value.__self__) or
                                     holds_node(value.__self__, builder.node_type)):
        # the capture's object, its tensors graph values: not the one eager would bind
        return "a method of an object made in the frame at the break"
    return ""


def _modelled_exit(value: Any) -> Any:
    """The ``agspeed._ctx._Ctx`` whose exit ``value`` is, or None."""
    from agspeed._ctx import _Ctx

    if type(value) is types.MethodType and type(value.__self__) is _Ctx \
            and value.__func__ is _Ctx.exit:
        return value.__self__
    return None


def _maker(model: Any) -> tuple:
    """``(cls, args)``: ``cls(*args)`` is a real manager entering what ``model``
    entered: its grad mode, its autocast state, inference mode, or nothing
    (``nullcontext``, whose value was bound already)."""
    import contextlib

    import torch

    if model.autocast is not None:
        device, dtype, enabled, cache = model.autocast
        return torch.autocast, (device, dtype, enabled, cache)
    if model.inference is not None:
        return torch.inference_mode, (model.inference,)
    if model.mode is None:
        return contextlib.nullcontext, ()
    return (torch.enable_grad if model.mode else torch.no_grad), ()


def _is_exception(value: Any) -> bool:
    """Whether ``value`` is an exception or an exception class."""
    return isinstance(value, BaseException) or (
        isinstance(value, type) and issubclass(value, BaseException))


def _holds_shadow(value: Any, builder: Any) -> bool:
    """Whether ``value`` is, or holds, the capture's copy of a list or dict of the
    program (``agspeed._effects``: changed before the break)."""
    if builder.is_shadow(value):
        return True
    if type(value) in (tuple, list):
        return any(_holds_shadow(v, builder) for v in value)
    if type(value) is dict:
        return any(_holds_shadow(v, builder) for v in value.values())
    return False


def close_contexts(state: dict) -> None:
    """Leave, in the capture, the with blocks open at the break (innermost first), so
    the graph ends in the modes the frame started in: the generated code enters them
    again around the rest."""
    for kind, payload, _source in reversed(state["stack"]):
        model = _modelled_exit(payload) if kind == "CONST" else None
        if model is not None:
            model.exit(None, None, None)


def layout_of(state: dict, code: types.CodeType, builder: Any,
              reach: Any = None) -> Layout | str:
    """The ``Layout`` of a stopped capture's ``state``, or why it cannot be rebuilt.

    ``reach(source)`` is what a source reaches in the frame as it started (``MISSING``
    when nothing).  A value of the program that the capture reached through a source
    (an item of a tuple the frame was given, an attribute of an argument) is read
    through that source on every call, as the graph's inputs are: held as a constant it
    would be the first call's object on every later call.  Only where the source
    reaches that very object now is it trusted; the rest stay constants."""
    outputs: list = []

    def slot(kind: str, payload: Any, source: Any, in_stack: bool) -> tuple | str:
        if kind == "NULL_MARK" and in_stack or kind == "UNBOUND" and in_stack:
            # the call protocol's NULL, or a variable an inlined comprehension hid
            # while it had no value (3.12 on): both NULL on CPython's stack
            return ("null",)
        if kind == "UNBOUND" and not in_stack:
            return ("unbound",)
        if kind in ("LIST", "DICT") and builder.is_shadow(payload):
            # the program's own object, its contents written back before the break
            original = builder.shadow_source(payload)
            if type(original) is tuple and len(original) == 2 and original[0] == "local":
                return ("local", original[1])
            if reach is not None and reach(original) is builder.shadow_original(payload):
                return ("source", original)
        if kind in ("TUPLE", "LIST", "DICT") and _holds_shadow(payload, builder):
            # the program's own object must go on, not a copy of its contents
            return "a list or dict of the program changed before the break"
        if kind == "TENSOR" and builder.is_ndarray(payload):
            # the graph's tensor for a NumPy value: the program holds an array there,
            # and what the break instruction does with it is NumPy's (or an error)
            return "a NumPy array at the break"
        if kind in ("TENSOR", "TUPLE", "LIST", "DICT"):
            try:
                builder.check_output(payload)
            except Exception:
                return f"a {kind.lower()} the graph cannot return"
            outputs.append(payload)
            return ("output", len(outputs) - 1)
        if kind == "CONST" and in_stack and _modelled_exit(payload) is not None:
            return ("ctx", *_maker(_modelled_exit(payload)))
        if kind == "CONST" and type(payload) is types.MethodType \
                and getattr(payload.__func__, "__name__", "") == "__exit__":
            return "a with block of a manager the capture does not model at the break"
        if kind in ("LAZY", "CONST") and _is_exception(payload):
            # what the frame goes on to raise: the resume function's guard would keep
            # it (no weak reference to an exception), and with it its traceback's frames
            return "an exception being made or raised at the break"
        if kind == "CONST" and type(payload) is slice and any(
                isinstance(v, builder.node_type)
                for v in (payload.start, payload.stop, payload.step)):
            # x[t:] with a tensor bound: the slice holds the graph's value, which the
            # break instruction would be handed as it is
            return "a slice bounded by a tensor at the break"
        if kind in ("LAZY", "CONST"):
            if type(source) is tuple and len(source) == 2 and source[0] == "local":
                return ("local", source[1])
            if kind == "CONST" and (builder.can_escape(payload) or
                                    holds_node(payload, builder.node_type)):
                # an object the capture made (its tensors are graph values): the graph
                # rebuilds it with real ones, once however many slots hold it
                try:
                    builder.check_output(payload)
                except Exception:
                    return f"a {type(payload).__name__} made in the frame the graph " \
                           f"cannot return"
                outputs.append(payload)
                return ("output", len(outputs) - 1)
            why = _not_the_programs(payload, builder)
            if why:
                return why
            if source is not None and reach is not None and reach(source) is payload:
                return ("source", source)
            if hasattr(type(payload), "__next__") or type(payload) in DICT_VIEWS:
                # zip(), enumerate(), iter(), map()... made by the capture: stateful, and
                # what it yields may be graph values; a constant would hand every call
                # the first call's, half consumed.  A dict view likewise shows the dict
                # of the first call
                return f"a {type(payload).__name__} made in the frame at the break"
            builder.note_identity(payload)   # this very object, on every call
            return ("constant", payload)
        if kind == "METHOD":
            import torch
            found = getattr(torch.Tensor, payload, None)
            if found is None:   # a NumPy array's own method (x.tobytes())
                return f"the method {payload!r} of an array at the break"
            return ("constant", found)
        return f"a {kind.lower()} value at the break"

    def loop_iterator(kind: str, payload: Any) -> tuple | str:
        # what the loop had left to yield, made a tuple the resume function iterates:
        # the rest of the capture's elements (ITER: (elements, position)) or of an
        # iterator it made (spent by this: the capture is over)
        if kind == "ITER":
            items = payload[0][payload[1]:]
        else:
            try:
                items = list(itertools.islice(payload, LOOP_ITEMS + 1))
            except Exception as exc:    # noqa: BLE001 - then the frame runs eager
                return f"the loop's iterator raised {type(exc).__name__} at the break"
        if len(items) > LOOP_ITEMS:
            return f"a loop with more than {LOOP_ITEMS} items left at the break"
        slots = []
        for item in items:
            s = slot("TENSOR" if isinstance(item, builder.node_type) else "CONST", item,
                     None, False)
            if isinstance(s, str):
                return s
            slots.append(s)
        return ("iter", tuple(slots))

    rows = state["stack"]
    held = collections.Counter(id(payload[0] if kind == "ITER" else payload)
                               for kind, payload, _source in (*rows, *state["locals"]))
    owned = state.get("owned", ())
    stack, local = [], []
    for i, (kind, payload, source) in enumerate(rows):
        owner = rows[i + 1] if kind == "METHOD" and i + 1 < len(rows) else None
        if kind == "METHOD" and owner is not None and owner[0] in ("LIST", "DICT") \
                and builder.is_shadow(owner[1]):
            # a method of a list or dict of the program (``self.acts.append(y.item())``
            # broken in its argument): the unbound method, the object itself after it
            stack.append(("constant", getattr(type(owner[1]), payload)))
            continue
        if kind == "METHOD" and (owner is None or owner[0] != "TENSOR"):
            return "a method of a value other than a tensor at the break"
        if kind == "ITER" and held[id(payload[0])] == 1 or \
                kind == "CONST" and held[id(payload)] == 1 and id(payload) in owned \
                and hasattr(type(payload), "__next__") and type(payload) not in DICT_VIEWS:
            s = loop_iterator(kind, payload)  # a for loop's, held nowhere else
        else:
            s = slot(kind, payload, source, True)
        if isinstance(s, str):
            return s
        stack.append(s)
    ncells = len(_cell_only(code))
    for kind, payload, source in state["locals"][:code.co_nlocals + ncells]:
        s = slot(kind, payload, source, False)
        if isinstance(s, str):
            return s
        local.append(s)
    if state["cells"]:
        return "a local shared with a closure made before the break"
    return Layout(tuple(stack), tuple(local[:code.co_nlocals]), tuple(outputs),
                  tuple(local[code.co_nlocals:]))


def _cell_only(code: types.CodeType) -> list:
    """The cell variables of ``code`` that are not among its locals (parameters are),
    in the order of their slots."""
    return [name for name in code.co_cellvars if name not in code.co_varnames]


def _writes_free(code: types.CodeType) -> bool:
    """Whether ``code`` stores to or deletes a free variable (``nonlocal``)."""
    writes = {_OP[n] for n in ("STORE_DEREF", "DELETE_DEREF")}
    return any(op in writes and code._varname_from_oparg(arg) in code.co_freevars
               for _s, _o, op, arg, _t, _n in _C.decode(code))


# ---------------------------------------------------------------------------------
# Generated code

# code -> {(offset, layout key, id(globals)): (break function, resume functions)}
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GENERATED: weakref.WeakSet = weakref.WeakSet()
_RESUMES: weakref.WeakSet = weakref.WeakSet()  # the resume functions' code objects
# a resume function's code -> (the code it continues, how many instructions its
# prologue put before that code's own)
_ORIGIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


_LOOPED: weakref.WeakSet = weakref.WeakSet()  # those that start inside a loop


def is_resume(code: types.CodeType) -> bool:
    """True for a resume function's code."""
    return code in _RESUMES


def in_loop(code: types.CodeType) -> bool:
    """True for a resume function's code that starts inside a loop: it is called
    once per pass, each pass with its own values (the items left, the loop's
    variables), so each pass is an entry of its own rather than a recompile."""
    return code in _LOOPED


def _in_loop(code: types.CodeType, at: int) -> bool:
    """Whether instruction ``at`` of ``code`` lies inside a loop (a jump backwards
    passes over it)."""
    rows = _C.decode(code)
    start = rows[at][0]
    return any(0 <= row[4] <= start < row[0] for row in rows)


def original(code: types.CodeType, offset: int) -> tuple | None:
    """For a break at byte ``offset`` of a resume function's ``code``: the user's code
    it continues, the offset of the same instruction there, and how many instructions
    prologues put before it in ``code`` (``(base, offset, shift)``); None where
    ``code`` is not a resume function or the offset is in a prologue.

    A break in a resume function then resumes as a break of the user's code would: its
    resume functions are those the user's code has for that place (a loop's every pass
    after the first breaks in one resume function, whose code is made once)."""
    if code not in _ORIGIN:
        return None
    rows = _C.decode(code)
    at = next((i for i, r in enumerate(rows) if r[1] == offset), None)
    total = 0
    while at is not None and code in _ORIGIN:
        code, shift = _ORIGIN[code]
        if at < shift:
            return None
        at, total = at - shift, total + shift
    if at is None:
        return None
    return code, _C.decode(code)[at][1], total


def offset_in(code: types.CodeType, base: types.CodeType, offset: int,
              shift: int) -> int:
    """The byte offset in the resume function ``code`` of the instruction at
    ``offset`` of ``base``, which ``code``'s prologues moved ``shift`` on."""
    at = next(i for i, r in enumerate(_C.decode(base)) if r[1] == offset)
    return _C.decode(code)[at + shift][1]


def original_state(state: dict, code: types.CodeType, base: types.CodeType) -> dict:
    """A resume function's stopped ``state`` as ``base``'s frame would hold it there:
    ``base``'s locals, then its cells, without the parameters the prologues took."""
    if code is base:
        return state
    cells = len(_cell_only(base))
    rows = state["locals"]
    return dict(state, locals=rows[:base.co_nlocals] +
                rows[code.co_nlocals:code.co_nlocals + cells])


def is_generated(code: types.CodeType) -> bool:
    """True for a break code (never captured)."""
    return code in _GENERATED


def _line(code: types.CodeType, instrs: list, i: int) -> int:
    pos = instrs[i][3]
    return pos[0] if pos else code.co_firstlineno


def _fresh(code: types.CodeType, prefix: str, count: int) -> tuple:
    """``count`` parameter names ``prefix``0, 1, ... that ``code`` does not have yet: a
    resume function's own break adds stack parameters to those it has, and a local is
    read by its name (two of one name gave the second's value for both)."""
    taken = sum(1 for name in code.co_varnames if name.startswith(prefix))
    return tuple(f"{prefix}{taken + i}" for i in range(count))


def _enter(out: list, slot: tuple, consts: list, pos: Any) -> None:
    """Make and enter the manager of a ("ctx", cls, args) stack slot: its exit stays
    on the stack."""
    def const(obj: Any) -> tuple:
        consts.append(obj)
        return (_OP["LOAD_CONST"], len(consts) - 1, _NO_OP, pos)

    _kind, cls, args = slot
    for name in _CALL_PUSH:         # the callable and the call protocol's NULL
        out.append(const(cls) if name == "LOAD_CONST" else (_OP["PUSH_NULL"], 0, _NO_OP, pos))
    out += [const(a) for a in args]
    if "PRECALL" in _OP:
        out.append((_OP["PRECALL"], len(args), _NO_OP, pos))
    out += [(_OP["CALL"], len(args), _NO_OP, pos), (_OP["BEFORE_WITH"], 0, _NO_OP, pos),
            (_OP["POP_TOP"], 0, _NO_OP, pos)]


def _is_ctx(kind: Any) -> bool:
    return type(kind) is tuple


def _is_param(kind: Any) -> bool:
    """Whether a stack slot of this kind is handed over as a parameter (a NULL or a
    with block's exit is made anew)."""
    return kind in ("value", "iter")


def _leave(out: list, count: int, none: int, pos: Any) -> None:
    """Call ``count`` with-block exits lying under the top value, innermost first,
    with no exception (``exit(None, None, None)``, the way a block's normal end calls
    it: the exit takes the place of a method and the first None of its self)."""
    for _ in range(count):
        out.append((_OP["SWAP"], 2, _NO_OP, pos))
        out += [(_OP["LOAD_CONST"], none, _NO_OP, pos)] * 3
        if "PRECALL" in _OP:
            out.append((_OP["PRECALL"], 2, _NO_OP, pos))
        out += [(_OP["CALL"], 2, _NO_OP, pos), (_OP["POP_TOP"], 0, _NO_OP, pos)]


def _resume_function(code: types.CodeType, f_globals: dict, instrs: list, handlers: list,
                     target: int, kinds: tuple, unbound: tuple) -> tuple[Any, int]:
    """The function continuing ``code`` at instruction ``target`` with the stack
    (its "value" slots) and every local as arguments: (locals..., stack...); a with
    block's slot gets a manager made and entered there again.  Also how far the
    original instructions moved (their index in the new code is theirs plus this)."""
    nv = code.co_nlocals
    cells = _cell_only(code)
    nstack = sum(1 for kind in kinds if _is_param(kind))
    shift_slots = len(cells) + nstack   # parameters added before the cell slots
    consts = list(code.co_consts)
    pos = instrs[target][3]
    pro: list = []
    if code.co_freevars:    # the closure the runner makes per call
        pro.append((_OP["COPY_FREE_VARS"], len(code.co_freevars), _NO_OP, pos))
    slot_of = {name: code.co_varnames.index(name) if name in code.co_varnames
               else nv + shift_slots + cells.index(name) for name in code.co_cellvars}
    pro += [(_OP["MAKE_CELL"], slot_of[name], _NO_OP, pos) for name in code.co_cellvars]
    pro.append((_OP["RESUME"], 0, _NO_OP, pos))
    for i, gone in enumerate(unbound[:nv]):
        if gone:
            cell = code.co_varnames[i] in slot_of
            pro.append((_OP["DELETE_DEREF" if cell else "DELETE_FAST"], i, _NO_OP, pos))
    for j, name in enumerate(cells):  # values of the cells that are not parameters
        if not unbound[nv + j]:
            pro += [(_OP["LOAD_FAST"], nv + j, _NO_OP, pos),
                    (_OP["STORE_DEREF"], slot_of[name], _NO_OP, pos)]
    nv += len(cells)
    k = 0
    for kind in kinds:
        if kind == "null":
            pro.append((_OP["PUSH_NULL"], 0, _NO_OP, pos))
            continue
        if _is_ctx(kind):
            _enter(pro, kind, consts, pos)
            continue
        pro.append((_OP["LOAD_FAST"], nv + k, _NO_OP, pos))
        if kind == "iter":          # the items the loop had left
            pro.append((_OP["GET_ITER"], 0, _NO_OP, pos))
        k += 1
    shift = len(pro) + 1
    pro.append((_OP["JUMP_FORWARD"], 0, target + shift, pos))
    body = [(*_moved_slots(op, arg, code.co_nlocals, shift_slots), t + shift if t >= 0 else t,
             p) for op, arg, t, p in instrs]
    moved = [(s + shift, e + shift, h + shift, d, lasti) for s, e, h, d, lasti in handlers]
    line = _line(code, instrs, target)
    name = f"resume_in_{code.co_name}_at_{line}"
    varnames = code.co_varnames + _fresh(code, ".cell", len(cells)) + \
        _fresh(code, ".stack", nstack)
    new = _C.emit(code, pro + body, moved, {
        "co_name": name, "co_qualname": name, "co_varnames": varnames,
        "co_argcount": len(varnames), "co_posonlyargcount": 0, "co_kwonlyargcount": 0,
        "co_nlocals": len(varnames), "co_consts": tuple(consts),
        "co_flags": code.co_flags & ~_CO_VAR})
    _RESUMES.add(new)
    _ORIGIN[new] = (code, shift)
    if _in_loop(code, target):
        _LOOPED.add(new)
    closure = tuple(types.CellType() for _ in code.co_freevars) or None
    return types.FunctionType(new, f_globals, name, None, closure), shift


# 3.13's instructions naming two locals, one per half of the argument's low byte
_PAIRED = {_OP[n] for n in ("LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST",
                            "STORE_FAST_STORE_FAST") if n in _OP}
_SLOTTED = (set(dis.haslocal) | set(dis.hasfree)) - _PAIRED
_PROLOGUE = {_OP[n] for n in ("COPY_FREE_VARS", "MAKE_CELL") if n in _OP}


def _moved_slots(op: int, arg: int, nv: int, by: int) -> tuple:
    """``(op, arg)`` of an original instruction in a resume function, whose cell and
    free slots (those from ``nv`` on) are ``by`` further on; the original prologue
    (which the resume function jumps over, having its own) becomes NOPs."""
    if op in _PROLOGUE:
        return _OP["NOP"], 0
    if op in _SLOTTED:
        return op, arg + by if arg >= nv else arg
    if op in _PAIRED:
        hi, lo = arg >> 4, arg & 15
        hi, lo = (hi + by if hi >= nv else hi), (lo + by if lo >= nv else lo)
        if hi > 15 or lo > 15:
            raise ValueError("a paired local instruction past slot 15 after the shift")
        return op, hi << 4 | lo
    return op, arg


def _tail(instrs_out: list, nv: int, nstack: int, below: list, unbound: tuple, fn: int,
          consts: list, pos: Any, exits: int = 0) -> None:
    """Return ``fn(*locals, *below, *top)``: ``top`` the ``nstack`` values on the
    stack, ``below`` the parameters holding the stack slots under them; the ``exits``
    with-block exits under ``top`` are called first."""
    def const(obj: Any) -> int:
        consts.append(obj)
        return len(consts) - 1

    none = const(None)
    out = instrs_out
    out.append((_OP["BUILD_TUPLE"], nstack, _NO_OP, pos))
    _leave(out, exits, none, pos)
    for i in range(nv):
        out.append((_OP["LOAD_CONST"], none, _NO_OP, pos) if unbound[i]
                   else (_OP["LOAD_FAST"], i, _NO_OP, pos))
    out += [(_OP["LOAD_FAST"], p, _NO_OP, pos) for p in below]
    out.append((_OP["BUILD_TUPLE"], nv + len(below), _NO_OP, pos))
    out.append((_OP["SWAP"], 2, _NO_OP, pos))
    out.append((_OP["BINARY_OP"], 0, _NO_OP, pos))   # locals + stack
    for name in _CALL_EX_PUSH:     # fn: the parameter holding the resume function
        out.append((_OP[name], fn if name == "LOAD_FAST" else 0, _NO_OP, pos))
    out.append((_OP["SWAP"], 3, _NO_OP, pos))
    out.append((_OP["CALL_FUNCTION_EX"], 0, _NO_OP, pos))
    out.append((_OP["RETURN_VALUE"], 0, _NO_OP, pos))


def generated(code: types.CodeType, f_globals: dict, site: BreakSite,
              layout: Layout) -> tuple[Any, list]:
    """The break function of ``site`` for ``layout`` and the resume functions it
    calls.  It is called with every local (None for an unbound one) and then the
    stack's values (its NULL slots left out).

    With blocks open at the break (stack slots of kind "ctx") get a manager made
    anew, entered around the break instructions and left before the resume function
    is called, which makes and enters another around the rest of the block.  When a
    with block's handler covers the break, an exception from the break instructions
    leaves the blocks and goes on in a resume function that starts at that handler,
    with the exception (and the offset it is said to come from) where CPython would
    push them."""
    key = (site.offset, layout.key(), id(f_globals))
    per_code = _CACHE.setdefault(code, {})
    hit = per_code.get(key)
    if hit is not None and hit[2] is f_globals:
        return hit[0], hit[1]
    instrs, handlers, _index = decode(code)
    kinds, unbound = layout.key()
    cells = _cell_only(code)
    nv = code.co_nlocals + len(cells)   # parameters before the stack's: locals, cells
    depth = len(kinds)
    effect = 0
    for i in range(site.first, site.last + 1):
        op, arg = instrs[i][0], instrs[i][1]
        if i == site.last and site.branch:
            effect -= 1
        elif dis.opname[op] not in ("KW_NAMES",):
            # an instruction without an argument (BINARY_SUBSCR) takes none here
            effect += dis.stack_effect(op, arg if op >= dis.HAVE_ARGUMENT else None,
                                       jump=False)
    after = depth + effect
    consumed = _consumed(instrs, site, depth, kinds)
    keep = depth - consumed         # slots below the operands, left as they are
    produced = after - keep
    if produced < 0:
        raise ValueError("the break instruction's stack effect is not modelled")
    ctxs = [j for j, kind in enumerate(kinds) if _is_ctx(kind)]
    if any(j >= keep for j in ctxs):
        raise ValueError("a with block's exit among the break instruction's operands")
    if "iter" in kinds[keep:] and not _comprehension_call(layout.stack[keep:]):
        # the callee would be handed an iterator of another type than the program's
        raise ValueError("an iterator made in the frame handed on at the break")
    if site.handler is not None and site.handler[1] > keep:
        raise ValueError("an exception handler keeping the break instruction's operands")
    resumes = []
    targets = [site.last + 1]
    if site.branch:
        targets.append(instrs[site.last][2])
    for target in targets:
        resumes.append(_resume_function(code, f_globals, instrs, handlers, target,
                                        kinds[:keep] + ("value",) * produced, unbound)[0])
    consts = list(code.co_consts)
    pos0 = instrs[site.first][3]
    out: list = [(_OP["RESUME"], 0, _NO_OP, pos0)]
    params = []                     # parameter index of each non-NULL stack slot
    for kind in kinds:
        params.append(nv + sum(1 for p in params if p is not None)
                      if _is_param(kind) else None)
    for j in ctxs:
        _enter(out, kinds[j], consts, pos0)
    for j in range(keep, depth):
        out.append((_OP["PUSH_NULL"], 0, _NO_OP, pos0) if params[j] is None
                   else (_OP["LOAD_FAST"], params[j], _NO_OP, pos0))
        if kinds[j] == "iter":      # an iterator the call is handed (3.11's comprehension)
            out.append((_OP["GET_ITER"], 0, _NO_OP, pos0))
    branch_at = None
    guarded = len(out)
    for i in range(site.first, site.last + 1):
        op, arg, _t, pos = instrs[i]
        if i == site.last and site.branch:
            branch_at = len(out)
        out.append((op, arg, _NO_OP, pos))
    guarded_end = len(out)
    last_pos = instrs[site.last][3]
    below = [p for p in params[:keep] if p is not None]
    nstack = sum(1 for p in params if p is not None)
    nres = len(resumes) + (site.handler is not None)
    _tail(out, nv, produced, below, unbound, nv + nstack, consts, last_pos, len(ctxs))
    if branch_at is not None:
        op, arg, _t, pos = out[branch_at]
        out[branch_at] = (op, arg, len(out), pos)
        _tail(out, nv, produced, below, unbound, nv + nstack + 1, consts, last_pos,
              len(ctxs))
    own_handlers = []
    if site.handler is not None:
        at, hdepth, lasti = site.handler
        onto = kinds[:hdepth] + ("value",) * (1 + bool(lasti))
        fn, shift = _resume_function(code, f_globals, instrs, handlers, at, onto, unbound)
        # never captured: the interpreter does not enter handlers (it would run eager
        # anyway), and a capture would keep the exception and its frames in its records
        _C.mark_skip(fn.__code__)
        resumes.append(fn)
        own_handlers.append((guarded, guarded_end, len(out), len(ctxs), 0))
        consts.append(None)
        _leave(out, len(ctxs), len(consts) - 1, last_pos)
        if lasti:   # where CPython would say the exception came from, in code units
            rows = _C.decode(fn.__code__)
            consts.append(rows[site.last + shift][1] // 2)
            out.append((_OP["LOAD_CONST"], len(consts) - 1, _NO_OP, last_pos))
            out.append((_OP["SWAP"], 2, _NO_OP, last_pos))
        held = [p for p in params[:hdepth] if p is not None]
        _tail(out, nv, 1 + bool(lasti), held, unbound, nv + nstack + nres - 1, consts,
              last_pos)
    # the resume functions are parameters with defaults, not constants: a tool that
    # traces this code (torch._dynamo) need not model a function constant
    varnames = code.co_varnames + _fresh(code, ".cell", len(cells)) + \
        _fresh(code, ".stack", nstack) + _fresh(code, ".resume", len(resumes))
    name = f"break_in_{code.co_name}_at_{_line(code, instrs, site.last)}"
    new = _C.emit(code, out, own_handlers, {
        "co_name": name, "co_qualname": name, "co_varnames": varnames,
        "co_argcount": len(varnames), "co_posonlyargcount": 0, "co_kwonlyargcount": 0,
        "co_nlocals": len(varnames), "co_consts": tuple(consts),
        "co_cellvars": (), "co_freevars": (), "co_flags": code.co_flags & ~_CO_VAR})
    _C.mark_skip(new)
    _GENERATED.add(new)
    fn = types.FunctionType(new, f_globals, name, tuple(resumes))
    per_code[key] = (fn, resumes, f_globals)
    return fn, resumes


def _comprehension_call(operands: tuple) -> bool:
    """Whether the break instruction's operands call a comprehension's function
    (3.11), which only iterates the iterator it is handed."""
    fns = [s[1] for s in operands if s[0] == "constant" and type(s[1]) is types.FunctionType]
    return bool(fns) and fns[0].__code__.co_name.startswith("<")


def _consumed(instrs: list, site: BreakSite, depth: int, kinds: tuple) -> int:
    """How many stack slots, from the top, the break instructions read: a call's
    callable and arguments, a branch's condition, an operator's operands; all of them
    for anything else (then no NULL, with-block exit or loop iterator may be among
    them)."""
    op, arg = instrs[site.last][0], instrs[site.last][1]
    if site.branch:
        return 1
    name = dis.opname[op]
    if name == "CALL":
        return arg + 2              # callable and self-or-NULL, then the arguments
    if name == "CALL_KW":
        return arg + 3              # ... and the tuple of keyword names (3.13)
    if name == "CALL_FUNCTION_EX":
        return 3 + (arg & 1)        # NULL, callable, args tuple, kwargs dict
    if name in _POPS and _POPS[name] <= depth:
        return _POPS[name]
    if any(kind != "value" for kind in kinds):  # (a with block's exit is not "value")
        raise ValueError("a NULL, a with block's exit or a loop's iterator on the stack "
                         "at a break that is not a call")
    return depth


# How many values from the top of the stack an instruction a break code runs reads,
# where that does not depend on its argument (for the rest: everything there is).
_POPS = {"UNARY_NEGATIVE": 1, "UNARY_NOT": 1, "UNARY_INVERT": 1, "TO_BOOL": 1,
         "GET_ITER": 1, "GET_LEN": 1, "UNPACK_SEQUENCE": 1, "LOAD_ATTR": 1,
         "BINARY_OP": 2, "BINARY_SUBSCR": 2, "COMPARE_OP": 2, "CONTAINS_OP": 2,
         "IS_OP": 2, "STORE_ATTR": 2, "DELETE_SUBSCR": 2, "STORE_SUBSCR": 3,
         "BINARY_SLICE": 3, "STORE_SLICE": 4}


class _Then(NamedTuple):
    """What a resume function's runner returns instead of calling its break function:
    the call the runner of the frame that began the chain makes next.  A chain of
    breaks (one per pass of a loop) thus runs at one depth of Python frames."""

    fn: Any
    args: tuple


_NAMES = ("output", "constant", "local", "unbound", "source", "iter", "weak")


def _plan(slot: tuple) -> tuple:
    """(kind's index, what to read) of a layout's slot.  A module held as a constant
    (a loop's block left to call) is held weakly: an entry must not keep a model
    alive, and its guard fails once the module is gone (it checks it by identity)."""
    if slot[0] == "iter":
        return 5, tuple(_plan(s) for s in slot[1])
    if slot[0] == "constant" and _is_module(slot[1]):
        return 6, weakref.ref(slot[1])
    return _NAMES.index(slot[0]), slot[1] if len(slot) > 1 else None


def _is_module(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


def _items(plan: tuple, outs: Any) -> tuple:
    """The tuple of a loop's items left (a plan of outputs and constants)."""
    return tuple(outs[v] if k == 0 else v if k == 1 else v() if k == 6 else _items(v, outs)
                 for k, v in plan)


def runner(graph: Any, read: Any, layout: Layout, fn: Any, resumes: list = (),
           free: tuple = (), chained: bool = False) -> Any:
    """The compiled callable of a resumed frame's CALL entry: run ``graph`` on the
    inputs ``read`` gathers, rebuild the locals and stack from its outputs, the
    frame's locals and constants, and call the break function ``fn`` with them
    (through the hook, so the resume functions it calls are captured).  For code
    with free variables (``free``, their names), each call makes the ``resumes``
    anew over cells holding the values the frame started with.

    ``chained``: the frame is a resume function's, called by a break function only,
    whose caller is a runner: the call is handed back to that runner (``_Then``)."""
    from agspeed._sources import resolve

    plan = tuple(_plan(s) for s in layout.locals + layout.cells + layout.stack
                 if s[0] not in ("null", "ctx"))
    sourced = tuple(dict.fromkeys(v for k, v in plan if k == 4))
    made = [(r.__code__, r.__name__) for r in resumes] if free else []

    def run(f_locals: dict, f_globals: dict, f_builtins: dict) -> Any:
        # read before the graph, whose replayed writes may change what a source reaches
        memo: dict = {}
        for source in sourced:
            resolve(source, f_locals, f_globals, f_builtins, memo)
        outs = graph(*read(f_locals, f_globals, f_builtins))
        args = tuple(outs[v] if k == 0 else v if k == 1 else f_locals[v] if k == 2
                     else memo[v] if k == 4 else _items(v, outs) if k == 5
                     else v() if k == 6 else None for k, v in plan)
        if made:
            closure = tuple(types.CellType(f_locals[n]) if n in f_locals
                            else types.CellType() for n in free)
            args += tuple(types.FunctionType(c, f_globals, n, None, closure)
                          for c, n in made)
        if chained:
            return _Then(fn, args)
        result = _C.call_user(fn, args)
        while type(result) is _Then:
            result = _C.call_user(result.fn, result.args)
        return result

    return run
