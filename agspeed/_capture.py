"""From a frame to a capture: the graph, or the break, and the guard.

``capture`` runs the C symbolic interpreter over a frame's code with a ``GraphBuilder``.
When the whole function was captured (inlined modules and functions included), the
graph is handed to the backend (``agspeed/_compile.py``) and ``make_entry`` makes the
``CALL`` entry: its
compiled callable reads the graph's inputs from the frame by their sources and returns
what the function would have, and its guard checks every assumption the capture made, so
the entry is used only where it computes what eager would (``agspeed.guards.Guard``, a
C guard program; one check kind per line below, ``agspeed.guards.checks``):

* each tensor input (arguments, parameters, buffers, tensors in globals): exact type,
  dtype, device, shape, strides, requires_grad; two sources that reached one tensor
  (tied weights) must still reach one tensor;
* each plain value read (ints, strings, ``self.training``, tuples of them, dtypes): type
  and equality;
* each container read (hook dicts, module stores, argument tuples): type and length;
* every other object (modules, functions, Python modules): identity, held weakly where
  possible (see ``agspeed.guards.checks.holder``);
* global state: grad mode, inference mode, autocast (per device type: enabled, dtype,
  cache), the default dtype and deterministic mode (``agspeed.guards.state``);
* for a capture with dynamic dimensions (``agspeed._shapes``): each such input's
  static sizes, its symbolic sizes bound to symbols and its strides as expressions of
  them, and every fact the capture relied on about the symbols (``x.size(0) >= 2``,
  ``Eq(x.size(1), y.size(1))``).  Such an entry serves many signatures, so it is not
  signed: lookups try it by its guard.

When capture stops at an instruction, the result is a ``CaptureBreak`` saying where and
why; the caller runs the frame eager (under a guard built from what was assumed until
then) and logs it, or raises it under ``fullgraph=True``.
"""

from __future__ import annotations

import contextlib
import dis
import logging
import os
import threading
from typing import Any, NamedTuple

from agspeed import _C
from agspeed._assume import AssumedUnsafe
from agspeed._replay import replay
from agspeed._graph import GraphBreak, GraphBuilder
from agspeed._shapes import NeedsSymbolic, ScalarDecided
from agspeed.protocol import Reason
from agspeed.guards import ArgumentTypes, Guard


class CaptureBreak(NamedTuple):
    """Where and why capture of a frame stopped."""

    filename: str
    line: int | None
    instruction: str
    reason: str
    detail: str
    function: str = ""  # the function (maybe inlined) whose instruction stopped capture
    root_offset: int = -1  # the frame's own instruction the break surfaced in

    @property
    def hint(self) -> str:
        """What the user can do about it (``agspeed.protocol.Reason``)."""
        reason = Reason.by_id.get(self.reason)
        return reason.hint if reason is not None else ""

    def __str__(self) -> str:
        where = f"{os.path.basename(self.filename)}:{self.line}"
        hint = f"; hint: {self.hint}" if self.hint else ""
        return f"{where} {self.instruction}: {self.reason} ({self.detail}{hint})"


def _line_of(code: Any, offset: int) -> int | None:
    """The line of the instruction at ``offset``; the code's first line for an offset
    before any instruction (-1: capture stopped at the start) or one with no line."""
    for ins in dis.get_instructions(code):
        if ins.offset == offset and ins.positions and ins.positions.lineno is not None:
            return ins.positions.lineno
    return code.co_firstlineno


class Capture(NamedTuple):
    """A finished capture: the graph, its inputs' sources, its guard."""

    graph_module: Any
    sources: list  # what the entry reads: the graph's inputs, then written objects
    guard: Guard
    example_inputs: list
    effects: tuple = ()  # agspeed._effects.SideEffects.effect_plan
    n_inputs: int = 0  # how many of ``sources`` the graph takes


class Stopped(NamedTuple):
    """A capture asked to stop before a root instruction (``stop_at``): its builder
    (the graph so far, no output yet) and the root frame's state there
    (``agspeed._resume.layout_of`` reads it)."""

    builder: GraphBuilder
    state: dict


def capture(code: Any, f_locals: dict, f_globals: dict, f_builtins: dict,
            shapes: Any = None, stop_at: int | None = None) -> Any:
    """A ``Capture``, a ``(CaptureBreak, Guard)`` pair, or ``(None, Guard)`` when the
    function does no tensor work; a ``Stopped`` when it reached ``stop_at`` (a root
    byte offset).  ``shapes``: the ``_shapes.DimPolicy`` saying which dimensions are
    dynamic (None: all static)."""
    import torch

    symbolic = bool(getattr(shapes, "scalars", None))   # scalar symbols need a ShapeEnv
    assume = True
    with _quiet_fake_tensors():
        while True:
            builder = GraphBuilder(shapes, symbolic)
            builder.stop_at = stop_at
            builder.assume_branches = assume
            try:
                out = _C.capture(code, f_locals, f_globals, f_builtins, builder, torch.Tensor)
                return _finish(torch, code, f_locals, builder, out)
            except NeedsSymbolic:   # a dynamic input turned up: again, under a ShapeEnv
                symbolic = True
            except ScalarDecided as exc:   # floats the guard cannot check: constants
                shapes.keep_constant(exc.sources)
            except AssumedUnsafe:   # a branch assumed, then an input changed: no assuming
                assume = False
            except _Unguardable:    # a size fact the guard cannot check: capture static
                if shapes is None:
                    raise
                shapes, symbolic = None, False


class _DropOwnThread(logging.Filter):
    """Drops the records of one thread: an op that fails on fake tensors during capture
    is a graph break (the frame then runs eager and raises eager's own error), not
    something to print, and torch's fake-tensor layer logs each such failure with its
    traceback."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


@contextlib.contextmanager
def _quiet_fake_tensors() -> Any:
    drop = _DropOwnThread()
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


class _Unguardable(Exception):
    """A dynamic capture assumed something of its sizes no guard can check (a size that
    no input gives): it is done again with static shapes."""


def _guard(torch: Any, builder: GraphBuilder, f_locals: dict, code: Any) -> Guard:
    try:
        return Guard(torch, builder, f_locals, code)
    except ValueError as exc:
        if builder.symbolic:
            raise _Unguardable(str(exc)) from exc
        raise


def _finish(torch: Any, code: Any, f_locals: dict, builder: GraphBuilder, out: dict) -> Any:
    if out["status"] == "stopped":
        return Stopped(builder, out["state"])
    if out["status"] == "break":
        where = out["code"]
        brk = CaptureBreak(where.co_filename, _line_of(where, out["offset"]),
                           dis.opname[out["opcode"]] if out["opcode"] >= 0 else "(start)",
                           Reason(out["reason"]).id, out["detail"], where.co_name,
                           out.get("root_offset", -1))
        guard = _guard(torch, builder, f_locals, code)
        guard.break_at = (brk.filename, brk.line, brk.instruction, brk.reason)
        return brk, guard
    result = out["result"]
    try:
        builder.check_output(result)
        builder.numpy_output(result)   # arrays where they can be made after the graph
        if not any(n.op in ("call_function", "call_method") for n in builder.graph.nodes):
            return None, _idle_guard(torch, builder, f_locals, code)
        # (the writes' values leave the graph too: one it cannot make ends it here)
        gm = builder.output(result)
    except GraphBreak as exc:
        brk = CaptureBreak(code.co_filename, code.co_firstlineno, "RETURN_VALUE",
                           exc.reason.id, exc.detail, code.co_name)
        builder.forget_effects()
        return brk, _guard(torch, builder, f_locals, code)
    guard = _guard(torch, builder, f_locals, code)
    return Capture(gm, builder.read_sources, guard, builder.example_inputs(),
                   builder.effect_plan(), len(builder.sources))


def _idle_guard(torch: Any, builder: GraphBuilder, f_locals: dict, code: Any) -> Any:
    """The guard of a call that did no tensor work.  Where tensors were passed in, what
    the call read (the int it branched on, say) decides, as for a graph: another value
    may do the tensor work, and is captured.  Plain Python (no tensor among the
    arguments) is guarded on its argument types only, so another value runs it eager at
    once rather than capturing it again."""
    def tensor(v: Any) -> bool:
        return isinstance(v, torch.Tensor) or isinstance(v, (list, tuple)) and \
            any(isinstance(e, torch.Tensor) for e in v)

    if any(tensor(v) for v in f_locals.values()):
        try:
            return _guard(torch, builder, f_locals, code)
        except (ValueError, _Unguardable):
            pass
    return ArgumentTypes(f_locals)


def make_entry(cap: Capture, compiled: Any, context: Any, arg_check: Any = None) -> Any:
    """The CALL entry running ``compiled`` on the inputs its guard program reads;
    ``arg_check`` as ``agspeed._tensor_check.arg_check`` makes it (None: none)."""
    from agspeed._ctx import restoring_modes

    guard = cap.guard
    assert guard.inputs == tuple(cap.sources)
    read = guard.read
    compiled = restoring_modes(cap.graph_module, compiled)  # with blocks left on a raise
    if cap.effects:  # writes to the program's objects, applied after the graph
        compiled = replay(cap.effects, cap.n_inputs, compiled)

    def run(f_locals: dict, f_globals: dict, f_builtins: dict) -> Any:
        return compiled(*read(f_locals, f_globals, f_builtins))

    run.graph_module = cap.graph_module
    run.guard = guard
    # the hook calls compiled(*inputs) with the inputs the guard program gathered while
    # checking; `run` serves the first call, made before the entry is in the cache
    return _C.CacheEntry(_C.ACTION_CALL, guard=guard, compiled=run, context=context,
                         graph=compiled, signed=guard.sym is None,
                         arg_check=arg_check if guard.sym is None else None)
