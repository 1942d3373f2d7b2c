"""Building one torch.fx graph during capture, with fake tensors standing in for data.

The symbolic interpreter (C) walks a frame's bytecode; for every tensor operation it asks
a ``GraphBuilder`` to record a node.  The builder runs the operation on fake tensors
(``FakeTensorMode``: shape, dtype, device, requires_grad, no data) to learn what it
produces, so the interpreter can go on with exact metadata, and keeps that fake value in
``node.meta["example_value"]``.  Each graph input is recorded with its *source* (how to
reach it from the frame: ``x``, ``self.fc1.weight``), which is what the guards check and
what the cache entry reads on a hit.

What cannot be captured is reported as a ``GraphBreak`` with a stable reason id from
``REASONS``, a detail naming the operation, and a hint for the user:

* ``data_dependent``: the result's shape or value depends on tensor data (``.item()``,
  ``nonzero()``): Python would branch on it, a graph cannot.
* ``op_failed``: the operation raised on fake inputs (a shape mismatch, a bad argument).
  Eager raises too, but fake (meta) kernels word their errors differently, so the frame
  must then run eager: the user sees eager's own exception and message.

Operations are recorded as calls of the torch functions and tensor methods the program
made, not as aten ops, so running the graph under ``torch.autocast`` casts exactly as
eager would, with ``cache_enabled`` either way.

torch is imported when a builder is made, never when agspeed is imported.
"""

from __future__ import annotations

import re
import types
from typing import Any, Callable

__all__ = ["GraphBreak", "GraphBuilder", "REASONS"]

#: Stable graph-break reason ids: (what happened, what the user can do).
REASONS: dict[str, tuple[str, str]] = {
    "data_dependent": (
        "the result depends on the values inside a tensor",
        "keep data-dependent Python (.item(), nonzero, branching on tensor values) outside "
        "the optimized code, or accept a graph break there",
    ),
    "op_failed": (
        "the operation failed on the shapes and dtypes it was given",
        "the frame runs eager, which raises eager's own error for these inputs",
    ),
}


class GraphBreak(Exception):
    """Capture of a frame must stop here; ``reason`` is a key of ``REASONS``."""

    def __init__(self, reason: str, detail: str):
        if reason not in REASONS:
            raise ValueError(f"unknown graph-break reason {reason!r}")
        self.reason = reason
        self.detail = detail
        self.explanation, self.hint = REASONS[reason]
        super().__init__(f"{reason}: {detail} ({self.explanation}; hint: {self.hint})")


def _placeholder_name(source: str) -> str:
    name = re.sub(r"\W+", "_", source).strip("_") or "input"
    return name if not name[0].isdigit() else f"_{name}"


def _target_name(kind: str, target: Any) -> str:
    if kind == "call_method":
        return f"Tensor.{target}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", repr(target))
    return f"{module}.{name}" if module else name


class GraphBuilder:
    """One graph being captured: inputs by source, nodes with fake example values."""

    def __init__(self) -> None:
        import torch
        import torch.fx
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
            FakeTensorMode,
        )

        self._torch = torch
        self._data_dependent = (DataDependentOutputException, DynamicOutputShapeException)
        self.graph = torch.fx.Graph()
        self.fake_mode = FakeTensorMode()
        self._inputs: dict[str, tuple[Any, Any]] = {}  # source -> (node, real value)

    # -- inputs ---------------------------------------------------------------------

    def input(self, source: str, value: Any) -> Any:
        """The placeholder of the tensor reached by ``source`` (one per source)."""
        known = self._inputs.get(source)
        if known is not None:
            return known[0]
        if not isinstance(value, self._torch.Tensor):
            raise TypeError(f"graph inputs are tensors; {source} is {type(value).__name__}")
        node = self.graph.placeholder(_placeholder_name(source))
        node.meta["example_value"] = self.fake_mode.from_tensor(value, static_shapes=True)
        node.meta["source"] = source
        self._inputs[source] = (node, value)
        return node

    @property
    def sources(self) -> list[str]:
        """The inputs' sources, in placeholder order."""
        return list(self._inputs)

    def example_inputs(self) -> list[Any]:
        """The real values of the inputs, in placeholder order (for backends)."""
        return [value for _, value in self._inputs.values()]

    # -- operations -----------------------------------------------------------------

    def _fake(self, value: Any) -> Any:
        import torch.fx

        return torch.fx.node.map_arg(value, lambda node: node.meta["example_value"])

    def call_function(self, fn: Callable, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Record ``fn(*args, **kwargs)``; args may hold nodes, constants and containers."""
        return self._record("call_function", fn, args, kwargs or {})

    def call_method(self, name: str, args: tuple, kwargs: dict | None = None) -> Any:
        """Record ``args[0].name(*args[1:], **kwargs)`` on a tensor node."""
        return self._record("call_method", name, args, kwargs or {})

    def _record(self, kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
        fake_args, fake_kwargs = self._fake(tuple(args)), self._fake(dict(kwargs))
        try:
            with self.fake_mode:
                if kind == "call_method":
                    out = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
                else:
                    out = target(*fake_args, **fake_kwargs)
        except self._data_dependent as exc:
            raise GraphBreak("data_dependent",
                             f"{_target_name(kind, target)} ({type(exc).__name__})") from exc
        except Exception as exc:  # the operation itself is wrong for these inputs
            raise GraphBreak("op_failed",
                             f"{_target_name(kind, target)} raised {type(exc).__name__}: {exc}"
                             ) from exc
        node = self.graph.create_node(kind, target, tuple(args), dict(kwargs))
        node.meta["example_value"] = out
        return node

    def can_record(self, fn: Any) -> bool:
        """Whether a call of ``fn`` on graph values may be recorded (and run on fakes).

        Only torch's own functions and the operator module's: anything else (``print``,
        a user function) would run on fake tensors during capture, which eager never
        does.  Decided from the object's type and its C-level ``__module__``, so no
        user code runs while asking.
        """
        if type(fn) not in (types.BuiltinFunctionType, types.FunctionType):
            return False
        module = fn.__module__ or ""
        return module in ("torch", "operator", "_operator") or module.startswith("torch.")

    def is_tensor(self, node: Any) -> bool:
        """Whether a recorded node produces a tensor (not a size, an int, a tuple)."""
        return isinstance(node.meta.get("example_value"), self._torch.Tensor)

    # -- result ---------------------------------------------------------------------

    def output(self, result: Any) -> Any:
        """Finish the graph returning ``result`` (nodes, constants, tuples/lists/dicts)."""
        import torch.fx

        self.graph.output(result)
        self.graph.lint()
        return torch.fx.GraphModule(self._torch.nn.Module(), self.graph)
