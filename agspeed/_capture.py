"""From a frame to a cache entry: capture, guard, compile.

``capture_entry`` runs the C symbolic interpreter over a frame's code with a
``GraphBuilder``.  When the whole function was captured, the graph is handed to the
backend and the result is a ``CALL`` entry: its compiled callable reads the graph's
inputs from the frame's locals by source and returns what the function would have, and
its guard checks every assumption the capture made, so the entry is used only where it
computes what eager would:

* each tensor input: exact type, dtype, device, shape, strides, requires_grad;
* each other argument it used: exact type and equality (plain values only: an object
  whose ``__eq__`` is user code is never compared, the frame runs eager instead);
* each global and module attribute: identity;
* global state: grad mode, inference mode, autocast (per device type: enabled, dtype,
  cache) and the default dtype.

When capture stops at an instruction, the result is a ``CaptureBreak`` saying where and
why; the caller runs the frame eager and logs it.

This is the first slice of capture: straight-line functions of tensors.  Guards are
Python callables for now; they become C guard programs with the signature hash.
"""

from __future__ import annotations

import dis
import os
import weakref
from typing import Any, Callable, NamedTuple

from agspeed import _C
from agspeed._graph import GraphBuilder

_PLAIN = (int, float, bool, str, type(None))
_AUTOCAST_DEVICES = ("cpu", "cuda")


class CaptureBreak(NamedTuple):
    """Where and why capture of a frame stopped."""

    filename: str
    line: int | None
    instruction: str
    reason: str
    detail: str

    def __str__(self) -> str:
        where = f"{os.path.basename(self.filename)}:{self.line}"
        return f"{where} {self.instruction}: {self.reason} ({self.detail})"


def _line_of(code: Any, offset: int) -> int | None:
    for ins in dis.get_instructions(code):
        if ins.offset == offset:
            return ins.positions.lineno if ins.positions else None
    return None


def _autocast_state(torch: Any) -> tuple:
    """(enabled, dtype) of autocast per device type, on torch 2.4+ and older."""
    try:
        return tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                     for d in _AUTOCAST_DEVICES)
    except TypeError:  # before 2.4 these took no device argument
        return ((torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()),
                (torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()))


def global_state(torch: Any) -> tuple:
    """Everything outside the frame that changes what a graph computes."""
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.is_autocast_cache_enabled(), _autocast_state(torch),
            torch.get_default_dtype())


def _holder(value: Any) -> Callable[[], Any]:
    """How a guard keeps a global it checks by identity: weakly where it can.

    An entry lives in its code object's co_extra, which the cyclic GC cannot see, so a
    strong reference to, say, a user module whose functions lead back to that code
    object would never be freed.  A dead weak reference fails the guard.
    """
    try:
        return weakref.ref(value)
    except TypeError:  # builtins, ints: cannot lead back to user code
        return lambda: value


def _tensor_spec(t: Any) -> tuple:
    return (type(t), t.dtype, t.device, tuple(t.shape), t.stride(), t.requires_grad)


def _make_guard(torch: Any, builder: GraphBuilder, f_locals: dict,
                assumptions: list) -> Any:
    tensors = [(src, _tensor_spec(f_locals[src])) for src in builder.sources]
    plain, globals_, attrs = [], [], []
    for kind, source, value in assumptions:
        if kind == "local":
            plain.append((source, type(value), value))
        elif kind == "global":
            globals_.append((source, _holder(value)))
        else:
            owner, _, name = source.rpartition(".")
            attrs.append((owner, name, _holder(value)))
    state = global_state(torch)
    missing = object()

    def guard(f_locals: dict, f_globals: dict, f_builtins: dict) -> bool:
        for src, spec in tensors:
            t = f_locals.get(src, missing)
            if type(t) is not spec[0] or _tensor_spec(t) != spec:
                return False
        for src, kind, value in plain:
            v = f_locals.get(src, missing)
            if type(v) is not kind or v != value:
                return False
        for name, held in globals_:
            value = held()
            if value is None or f_globals.get(name, f_builtins.get(name, missing)) is not value:
                return False
        for owner, name, held in attrs:
            value = held()
            module = f_globals.get(owner, f_builtins.get(owner, missing))
            if value is None or getattr(module, name, missing) is not value:
                return False
        return global_state(torch) == state

    return guard


def capture_entry(code: Any, f_locals: dict, f_globals: dict, f_builtins: dict,
                  backend: Any, context: Any) -> Any:
    """A CALL entry for this frame, a ``CaptureBreak`` when it cannot be captured, or
    None when it does no tensor work (it then runs eager: guarding a pure-Python
    function on its argument values would recompile for every new value)."""
    import torch

    builder = GraphBuilder()
    out = _C.capture(code, f_locals, f_globals, f_builtins, builder, torch.Tensor)
    if out["status"] == "break":
        return CaptureBreak(code.co_filename, _line_of(code, out["offset"]),
                            dis.opname[out["opcode"]], out["reason"], out["detail"])
    for kind, source, value in out["assumptions"]:
        if kind == "local" and type(value) not in _PLAIN:
            return CaptureBreak(code.co_filename, code.co_firstlineno, "(argument)",
                                "unsupported_value",
                                f"argument {source} is a {type(value).__name__}, which "
                                f"cannot be guarded without running its code")
    if not builder.sources or not any(
            n.op in ("call_function", "call_method") for n in builder.graph.nodes):
        return None
    gm = builder.output(out["result"])
    compiled = backend(gm, builder.example_inputs())
    sources = builder.sources

    def run(f_locals: dict) -> Any:
        return compiled(*[f_locals[src] for src in sources])

    guard = _make_guard(torch, builder, f_locals, out["assumptions"])
    run.graph_module = gm
    return _C.CacheEntry(_C.ACTION_CALL, guard=guard, compiled=run, context=context)
