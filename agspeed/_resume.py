"""Graph breaks that resume: where a frame's capture stopped, and how its state there
is rebuilt on every call.

This module finds the break site (``break_site``) and the ``Layout`` of the stopped
state (``layout_of``); ``agspeed._resume_code`` writes the code that runs from there
(for ``csrc/emit.c``, its assembler) and the runner of the frame's entry.  The design
is in docs/architecture.md ("Graph breaks that resume").  In short, for a break at
root instruction *i* of a frame:

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
code and resume functions are the original's for that place
(``agspeed._resume_code.original``).

Loops.  A break inside a loop resumes (torch._dynamo runs such a frame eager).  A ``for``
loop's iterator crosses as the tuple of the items it had left, which the resume
function's prologue iterates; every later pass breaks in that resume function and
resumes in it again, one entry per pass.  The runner of a resume function hands the
call it would make back to the runner that began the chain (``_resume_code._Then``), so
the passes run at one depth of Python frames.

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
import gc
import itertools
import sys
import types
from typing import Any, NamedTuple

from agspeed import _C
from agspeed._builder_types import DICT_VIEWS, holds_node
from agspeed._stdlib import SAFE_ITERATORS

__all__ = ["decode", "BreakSite", "break_site", "Layout", "layout_of", "close_contexts",
           "LOOP_ITEMS"]

_OP = dis.opmap

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
    ("unbound",) a local with no value, ("bound", function, slot) the function bound
    to what ``slot`` reads (a method of an object of the program taken as a value),
    ("ctx", cls, args) the exit of a with block
    whose manager ``cls(*args)`` makes anew (the generated code makes and enters one
    around the break instruction, and the resume function another around the rest:
    made in their own code, of constants, so that capturing it assumes nothing of a
    manager handed in), ("iter", slots) the iterator of a ``for`` loop the break is in:
    the runner hands a tuple of what it had left to yield (each item a slot as above,
    or ("tuple", slots) for a tuple of them), and the resume function's prologue
    iterates it (``agspeed._resume_code.runner``); ("iter", slot, position) the
    iterator of the program's list that ``slot`` reads, at the loop's position."""

    stack: tuple
    locals: tuple
    outputs: tuple  # the graph's outputs (nodes and containers of them)
    cells: tuple = ()   # the cell variables that are not parameters, as ``locals``

    def key(self) -> tuple:
        """What the generated code depends on: which stack slots are NULL, a with
        block's exit (the slot itself) or a loop's iterator (and how far along the
        program's list it is), which locals are unbound."""
        return (tuple(s if s[0] == "ctx" else ("live", s[2]) if s[0] == "iter" and len(s) == 3
                      else s[0] if s[0] in ("null", "iter") else "value" for s in self.stack),
                tuple(s[0] == "unbound" for s in self.locals + self.cells))


# (a builtin type's method descriptor is not among them: CPython's method call
# protocol holds it unbound beside its object, as the interpreter does)
_DESCRIPTORS = (types.ClassMethodDescriptorType, types.WrapperDescriptorType,
                classmethod, staticmethod)


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
    if kind is types.FunctionType and value.__closure__ and \
            id(value) in getattr(builder, "owned_ids", ()):
        # its cells are the capture's: graph values, and copies of the program's cells
        # (a nonlocal it sets would not reach the program's variable)
        return "a function made in the frame that closes over variables, at the break"
    return ""


_BOUND_METHODS = (types.MethodType, types.BuiltinMethodType)


def _rebound(value: Any, builder: Any, slot: Any) -> tuple | str | None:
    """A method bound at capture to an object of the program (``m = d.get``, then the
    break): ("bound", function, its self's slot), bound again on each call to what
    that slot reads, so that a call with another object does not call the first one's
    method.  None where its self is no such object (it stays a constant)."""
    if type(value) not in _BOUND_METHODS:
        return None
    owner = value.__self__
    if owner is None or isinstance(owner, (type, types.ModuleType)):
        return None
    func = getattr(value, "__func__", None)
    if func is None:      # a builtin method: its class's descriptor
        func = getattr(type(owner), value.__name__, None)
        if type(func) is not types.MethodDescriptorType:
            return None
    known = builder.known.get(id(owner))
    source = known[1] if known is not None and known[0] is owner else None
    if source is None:
        return None
    inner = slot("CONST", owner, source, False)
    if isinstance(inner, str) or inner[0] == "constant":
        return inner if isinstance(inner, str) else None
    return ("bound", func, inner)


def _binds_program_object(value: Any, builder: Any) -> bool:
    """Whether ``value`` holds (in a partial, a tuple, a list) a method bound to a
    list, dict or set the capture reached through a source: guarded by their lengths,
    not by identity, so that held as a constant it would call the first call's
    container's method on every call (other objects' identity is checked where
    ``note_identity`` finds them)."""
    todo, seen = [value], set()
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if type(item) in _BOUND_METHODS:
            owner = item.__self__
            known = builder.known.get(id(owner))
            if known is not None and known[0] is owner and \
                    isinstance(owner, (list, dict, set, collections.deque)):
                return True
        elif type(item) is functools.partial:
            todo += [item.func, *item.args, *item.keywords.values()]
        elif type(item) in (tuple, list):
            todo += item
    return False


def _modelled_exit(value: Any) -> Any:
    """The ``agspeed._ctx._Ctx`` whose exit ``value`` is, or None."""
    from agspeed._ctx import _Ctx

    if type(value) is types.MethodType and type(value.__self__) is _Ctx \
            and value.__func__ is _Ctx.exit:
        return value.__self__
    return None


def _maker(model: Any) -> tuple:
    """``(cls, args)``: ``cls(*args)`` is a real manager entering what ``model``
    entered: its grad mode, its autocast state, inference mode, the attention backends
    it selects, or nothing (``nullcontext``, whose value was bound already)."""
    import contextlib

    import torch

    if model.sdpa is not None:
        from agspeed._sdpa import sdpa_kernel_of

        names, priority = model.sdpa
        return sdpa_kernel_of, (priority, *names)
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
              reach: Any = None, at: int = -1) -> Layout | str:
    """The ``Layout`` of a stopped capture's ``state``, or why it cannot be rebuilt.

    ``reach(source)`` is what a source reaches in the frame as it started (``MISSING``
    when nothing).  A value of the program that the capture reached through a source
    (an item of a tuple the frame was given, an attribute of an argument) is read
    through that source on every call, as the graph's inputs are: held as a constant it
    would be the first call's object on every later call.  Only where the source
    reaches that very object now is it trusted; the rest stay constants."""
    outputs: list = []

    def reread(source: Any, obj: Any) -> tuple | None:
        # the slot reading ``obj`` again on each call: the frame's local ``source``
        # names, or ``source`` where it reaches ``obj`` in the frame as it started
        if type(source) is tuple and len(source) == 2 and source[0] == "local":
            return ("local", source[1])
        if source is not None and reach is not None and reach(source) is obj:
            return ("source", source)
        return None

    def slot(kind: str, payload: Any, source: Any, in_stack: bool) -> tuple | str:
        if kind == "NULL_MARK" and in_stack or kind == "UNBOUND" and in_stack:
            # the call protocol's NULL, or a variable an inlined comprehension hid
            # while it had no value (3.12 on): both NULL on CPython's stack
            return ("null",)
        if kind == "UNBOUND" and not in_stack:
            return ("unbound",)
        if kind in ("LIST", "DICT", "SET") and builder.is_shadow(payload):
            # the program's own object, its contents written back before the break
            again = reread(builder.shadow_source(payload), builder.shadow_original(payload))
            if again is not None:
                return again
        if kind in ("TUPLE", "LIST", "DICT") and _holds_shadow(payload, builder):
            # the program's own object must go on, not a copy of its contents
            return "a list or dict of the program changed before the break"
        if kind == "TENSOR" and builder.is_ndarray(payload):
            # the graph's tensor for a NumPy value: the program holds an array there,
            # and what the break instruction does with it is NumPy's (or an error)
            return "a NumPy array at the break"
        if kind in ("TENSOR", "TUPLE", "LIST", "DICT"):
            try:
                builder.check_output(payload, placed=False)
            except Exception:
                return f"a {kind.lower()} the graph cannot return"
            if kind != "TENSOR":    # one list or dict in two slots: one object again
                at = next((i for i, o in enumerate(outputs) if o is payload), None)
                if at is not None:
                    return ("output", at)
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
                    builder.check_output(payload, placed=False)
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
            bound = _rebound(payload, builder, slot)
            if bound is not None:
                return bound
            if _binds_program_object(payload, builder):
                return "a method of an object of the program, held at the break"
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
            elements, position, followed, programs = payload
            live = type(followed) is list and (programs or builder.is_shadow(followed)) \
                and live_list(followed)
            # (a resume code per position: bounded as the passes of the tuple are)
            if live and len(followed) - position <= LOOP_ITEMS:
                return ("iter", live, position)
            if followed is not None:
                why = changeable(followed, elements)
                if why:
                    return why
                if not programs or builder.is_shadow(followed):
                    elements = tuple(followed)  # what the body changed since the last step
            items = elements[position:]
        else:
            why = next(filter(None, (changeable(c, None) for c in _iterated(payload))), None)
            if why:
                return why
            try:
                items = list(itertools.islice(payload, LOOP_ITEMS + 1))
            except Exception as exc:    # noqa: BLE001 - then the frame runs eager
                return f"the loop's iterator raised {type(exc).__name__} at the break"
        if len(items) > LOOP_ITEMS:
            return f"a loop with more than {LOOP_ITEMS} items left at the break"
        slots = tuple(item_slot(item) for item in items)
        why = next((s for s in slots if isinstance(s, str)), None)
        return why or ("iter", slots)

    def live_list(followed: list) -> tuple | None:
        # a list of the program that each call reaches again (a local, or through the
        # source the capture read it from): the resume function steps that very list
        # from the loop's position, as the program's own iterator would, so that what
        # later passes add, remove or replace is seen.  Its shadow's writes are made
        # before the break.
        if builder.is_shadow(followed):
            return reread(builder.shadow_source(followed), builder.shadow_original(followed))
        known = builder.known.get(id(followed))
        return reread(known[1], followed) if known and known[0] is followed else None

    def changeable(followed: Any, elements: tuple | None) -> str | None:
        # the loop goes on over a tuple of the items it has left: right only where no
        # later pass can change what it iterates, that is where no variable holding it
        # is read inside the loops around the break
        what = type(followed).__name__
        if elements is not None and not isinstance(followed, list) and \
                len(followed) != len(elements):
            return f"a {what} changed size in its loop before the break " \
                   f"(eager raises at the next step)"
        if type(followed) in DICT_VIEWS:    # a view changes with its dict
            followed = next((d for d in gc.get_referents(followed) if isinstance(d, dict)),
                            followed)
        holders = {_local_name(code, i) for i, (_k, payload, _s) in enumerate(state["locals"])
                   if payload is followed}
        if builder.is_shadow(followed):
            original = builder.shadow_source(followed)
            if not (type(original) is tuple and len(original) == 2 and original[0] == "local"):
                return f"a {what} of the program that its loop iterates changed before " \
                       f"the break"
            holders.add(original[1])
        if any(payload is followed for kind, payload, _s in rows if kind != "ITER") or \
                holders and holders & _loop_reads(code, at):
            return f"a {what} that its loop iterates, read in the loop's body, which " \
                   f"can change it in the passes after the break"
        return None

    def item_slot(item: Any, source: Any = None) -> tuple | str:
        # an item the loop has left: read through the source the capture read it from,
        # where it has one, so that each call hands on the program's objects of that
        # call (a list to append to, a block to call, a tensor of a tuple it was
        # given), not the first call's; a tuple (enumerate's, zip's) item by item, each
        # part through its item of the tuple's source
        if isinstance(item, builder.node_type):
            return slot("TENSOR", item, None, False)
        known = builder.known.get(id(item))
        source = known[1] if known and known[0] is item else source
        if type(item) is tuple and not builder.can_escape(item):
            again = reread(source, item)
            if again is not None:
                return again
            parts = tuple(item_slot(v, None if source is None else ("item", source, j))
                          for j, v in enumerate(item))
            why = next((s for s in parts if isinstance(s, str)), None)
            return why or ("tuple", parts)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(item, torch.Tensor) and \
                reread(source, item) is None:
            # the program's tensor, but none of this call's sources reaches it: held,
            # it would be the first call's data on every call
            return "a tensor the loop has left that no source reaches again"
        return slot("CONST", item, source, False)

    try:
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
        ncells = len(cell_only(code))
        for kind, payload, source in state["locals"][:code.co_nlocals + ncells]:
            s = slot(kind, payload, source, False)
            if isinstance(s, str):
                return s
            local.append(s)
        if state["cells"]:
            return "a local shared with a closure made before the break"
        if _shared_containers(outputs, builder):
            # the graph's outputs are rebuilt apart: a list held both by a variable and by
            # another list (or an object the frame made) would be two lists after the break
            return "a list or dict the frame made, held in two places at the break"
        return Layout(tuple(stack), tuple(local[:code.co_nlocals]), tuple(outputs),
                      tuple(local[code.co_nlocals:]))
    finally:
        # slot and item_slot call themselves through their cells: emptied, the builder
        # and the frame's locals the helpers reach go with this call, not at the next
        # collection of cycles
        slot = item_slot = None  # type: ignore[assignment]


def _shared_containers(outputs: list, builder: Any) -> bool:
    """Whether a list, dict or set is reached twice from the graph's outputs (each
    output once; an object the frame made once, as ``escape`` rebuilds it)."""
    seen: set = set()
    objects: set = set()

    def walk(value: Any) -> bool:
        if isinstance(value, builder.node_type):
            return False
        if builder.can_escape(value):   # rebuilt once however often it is reached
            if id(value) in objects:
                return False
            objects.add(id(value))
            return any(map(walk, builder.escape_parts(value)))
        if type(value) in (list, dict, set) or isinstance(value, dict):
            if id(value) in seen:
                return True
            seen.add(id(value))
        if isinstance(value, (tuple, list, set, frozenset)):
            return any(map(walk, value))
        if isinstance(value, dict):
            return any(map(walk, value.values()))
        return False

    try:
        return any(map(walk, outputs))
    finally:
        walk = None  # type: ignore   (a cycle through its own cell, holding the builder)


# instructions reading a local variable (3.13's paired forms name two, a half byte each)
_LOCAL_READS = {_OP[n] for n in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR",
                                 "DELETE_FAST", "LOAD_FAST_LOAD_FAST",
                                 "STORE_FAST_LOAD_FAST") if n in _OP}
_PAIRED_READS = {_OP[n] for n in ("LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST") if n in _OP}


def _local_name(code: types.CodeType, index: int) -> str | None:
    try:
        return code._varname_from_oparg(index)
    except (IndexError, ValueError):
        return None


def _loop_reads(code: types.CodeType, at: int) -> frozenset:
    """The local variables read inside the loops around byte offset ``at`` of ``code``
    (each loop: from a backward jump's target to the jump)."""
    rows = _C.decode(code)
    spans = [(r[4], r[1]) for r in rows if 0 <= r[4] <= at <= r[1]]
    names = set()
    for _s, offset, op, arg, _t, _n in rows:
        if op in _LOCAL_READS and any(lo <= offset <= hi for lo, hi in spans):
            for index in ((arg >> 4, arg & 15) if op in _PAIRED_READS else (arg,)):
                names.add(_local_name(code, index))
    return frozenset(names - {None})


def _iterated(iterator: Any, depth: int = 4) -> list:
    """The lists, dicts and sets a builtin iterator reads as it steps (an enumerate()
    of a list's iterator, a zip() of several), found through their ``__reduce__``,
    which for these C iterators runs no code of the program."""
    if type(iterator) not in SAFE_ITERATORS or depth == 0:
        return []
    try:
        parts = iterator.__reduce__()
    except Exception:   # noqa: BLE001 - one that cannot say: nothing found
        return []
    found = []
    for arg in parts[1] if len(parts) > 1 and type(parts[1]) is tuple else ():
        if type(arg) in (list, dict, set):
            found.append(arg)
        else:
            found.extend(_iterated(arg, depth - 1))
    return found


def cell_only(code: types.CodeType) -> list:
    """The cell variables of ``code`` that are not among its locals (parameters are),
    in the order of their slots."""
    return [name for name in code.co_cellvars if name not in code.co_varnames]


def _writes_free(code: types.CodeType) -> bool:
    """Whether ``code`` stores to or deletes a free variable (``nonlocal``)."""
    writes = {_OP[n] for n in ("STORE_DEREF", "DELETE_DEREF")}
    return any(op in writes and code._varname_from_oparg(arg) in code.co_freevars
               for _s, _o, op, arg, _t, _n in _C.decode(code))
