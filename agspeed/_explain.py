"""``agspeed.explain``: what capture makes of one call, without keeping anything.

The call runs once under a private capture context whose backend is eager and which
reports every decision to an observer: each captured graph (with its guard) and each
graph break (with where and why).  Afterwards the context's cache entries are dropped, so
explaining a function neither speeds up nor changes any later call of it, and an object
optimized elsewhere keeps its own entries.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, NamedTuple

__all__ = ["explain", "ExplainOutput", "BreakReason"]


class BreakReason(NamedTuple):
    """One graph break: where capture of a frame stopped and why."""

    filename: str
    line: int | None
    function: str
    instruction: str
    reason: str
    detail: str
    frame: str  # the frame that runs eager: "name (file:line)"
    hint: str = ""  # what the user can do about it

    def __str__(self) -> str:
        where = f"{os.path.basename(self.filename)}:{self.line}"
        return f"{where} in {self.function}, {self.instruction}: {self.reason} ({self.detail})"


class ExplainOutput:
    """What ``explain`` saw.  ``print()`` it for a report.

    graphs            the captured ``torch.fx.GraphModule``s, in capture order
    graph_count       len(graphs)
    graph_break_count how many frames stopped at a graph break (resumed after it, or run
                      eager where they could not resume)
    break_reasons     a ``BreakReason`` per break
    guards            every guard of every captured graph, readable, in graph order
    guards_per_graph  the same, one list per graph
    ops_per_graph     the operations each graph calls
    op_count          their total
    eager_frames      frames run eager without a break: ("name (file:line)", why)
    resume_functions  names of the resume functions breaks generated, in order
    resumed_breaks    per break that resumed: (BreakReason, index in ``graphs`` of
                      the graph before it or None, indices of the graphs its resume
                      functions captured)
    result            what the call returned
    """

    def __init__(self) -> None:
        self.graphs: list = []
        self.guards_per_graph: list[list[str]] = []
        self.break_reasons: list[BreakReason] = []
        self.eager_frames: list[tuple[str, str]] = []
        self.resume_functions: list[str] = []
        self._graph_codes: list = []
        self._resumed: list = []  # (BreakReason, graph before, resume code objects)
        self.result: Any = None

    @property
    def resumed_breaks(self) -> list[tuple]:
        return [(brk, before, [i for i, c in enumerate(self._graph_codes) if c in codes])
                for brk, before, codes in self._resumed]

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_break_count(self) -> int:
        return len(self.break_reasons)

    @property
    def guards(self) -> list[str]:
        return [line for lines in self.guards_per_graph for line in lines]

    @property
    def ops_per_graph(self) -> list[list[str]]:
        return [_ops(gm) for gm in self.graphs]

    @property
    def op_count(self) -> int:
        return sum(len(ops) for ops in self.ops_per_graph)

    def __repr__(self) -> str:
        return (f"<ExplainOutput graphs={self.graph_count} "
                f"breaks={self.graph_break_count} ops={self.op_count}>")

    def __str__(self) -> str:
        out = [f"Graph Count: {self.graph_count}",
               f"Graph Break Count: {self.graph_break_count}",
               f"Op Count: {self.op_count}"]
        if self.break_reasons:
            out.append("Break Reasons:")
            for n, brk in enumerate(self.break_reasons, 1):
                out += [f"  Break Reason {n}:",
                        f"    Reason: {brk.reason} ({brk.detail})",
                        f"    Instruction: {brk.instruction}",
                        f"    Location: {brk.filename}:{brk.line} in {brk.function}",
                        f"    Frame: {brk.frame}"]
                resumed = [r for r in self.resumed_breaks if r[0] is brk]
                if resumed:
                    _b, before, after = resumed[0]
                    first = before + 1 if before is not None else "-"
                    out.append(f"    Resumed: graph before {first}, "
                               f"graphs after {[i + 1 for i in after] or '-'}")
                else:
                    out.append("    Frame run eager")
                if brk.hint:
                    out.append(f"    Hint: {brk.hint}")
        if self.resume_functions:
            out.append("Resume Functions:")
            out += [f"  {name}" for name in self.resume_functions]
        if self.eager_frames:
            out.append("Frames Run Eager Without A Break:")
            out += [f"  {frame}: {why}" for frame, why in self.eager_frames]
        if self.graphs:
            out.append("Ops per Graph:")
            for n, ops in enumerate(self.ops_per_graph, 1):
                out.append(f"  Ops {n}:")
                out += [f"    {op}" for op in ops]
            out.append("Guards:")
            for n, lines in enumerate(self.guards_per_graph, 1):
                out.append(f"  Graph {n}:")
                out += [f"    {line}" for line in lines]
        return "\n".join(out)


def _ops(gm: Any) -> list[str]:
    """The graph's calls, named as a reader knows them: ``torch.relu``, ``Tensor.view``."""
    names = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            target = node.target
            module = getattr(target, "__module__", None) or ""
            module = "operator" if module == "_operator" else module
            name = getattr(target, "__name__", None) or str(target)
            names.append(f"{module}.{name}" if module else name)
        elif node.op == "call_method":
            names.append(f"Tensor.{node.target}")
        elif node.op == "call_module":
            names.append(f"module {node.target}")
    return names


def _where(code: Any) -> str:
    return f"{code.co_name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


def _unoptimized(obj: Any) -> Any:
    """What ``optimize`` was handed, for an object it returned: its own runtime context
    would capture the call, and the report would see nothing."""
    from agspeed import _C
    from agspeed._module import _is_view, _record

    if _is_view(obj):
        return _record(obj).root
    if isinstance(obj, _C.Region) and hasattr(obj, "__wrapped__"):
        return obj.__wrapped__
    return obj


def explain(fn_or_module: Any, *args: Any, **kwargs: Any) -> ExplainOutput:
    """Call ``fn_or_module(*args, **kwargs)`` once under capture and report what happened.

    Graphs are compiled with the eager backend (they run as captured), so the call
    returns what eager would; ``result`` holds it.  Nothing is left cached: the next
    call of the function, optimized or not, is unaffected.  An object ``optimize``
    returned is explained as what it was made from.
    """
    from agspeed import _C, _roots, _runtime
    from agspeed.errors import InvalidArgumentError

    if not callable(fn_or_module):
        raise InvalidArgumentError(
            f"agspeed.explain() takes an nn.Module or a callable, not "
            f"{type(fn_or_module).__name__}")
    fn_or_module = _unoptimized(fn_or_module)
    report = ExplainOutput()

    def observe(kind: str, code: Any, payload: Any) -> None:
        if kind == "graph":
            report._graph_codes.append(code)
            report.graphs.append(payload.graph_module)
            report.guards_per_graph.append(payload.guard.lines())
        elif kind == "break":
            report.break_reasons.append(BreakReason(
                payload.filename, payload.line, payload.function or code.co_name,
                payload.instruction, payload.reason, payload.detail, _where(code),
                payload.hint))
        elif kind == "resume":
            _brk, codes = payload
            report.resume_functions.extend(c.co_name for c in codes)
            last = len(report.graphs) - 1
            before = last if last >= 0 and report._graph_codes[last] is code else None
            report._resumed.append((report.break_reasons[-1], before, codes))
        else:
            report.eager_frames.append((_where(code), payload))

    def eager(gm: Any, example_inputs: list) -> Any:
        return gm.forward

    ctx = _runtime.Context("eager", eager, {}, observer=observe)
    torch = sys.modules.get("torch")
    is_module = torch is not None and isinstance(fn_or_module, torch.nn.Module)
    try:
        if is_module:
            from agspeed._module import optimize_module

            target = optimize_module(fn_or_module, ctx, {"backend": "eager", "options": {}})
        else:
            root = _roots.take(fn_or_module, False)
            target = _C.Region(fn_or_module if root is None else functools.partial(
                _roots.call_expecting, root, fn_or_module), ctx)
        report.result = target(*args, **kwargs)
    finally:
        _C.clear_caches(ctx)
    return report
