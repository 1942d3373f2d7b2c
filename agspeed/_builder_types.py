"""What the graph builder's parts share: the break they raise, the shape of symbolic
sizes, and how they name values in messages.

``GraphBuilder`` (``agspeed/_graph.py``) is assembled from parts with one job each: the
recording of graph nodes (``_graph``), the call policy (``_calls``), folds of known
values (``_folds``) and argument binding (``_binding``).  They raise ``GraphBreak`` with a
``agspeed.protocol.Reason`` when capture must stop.
"""

from __future__ import annotations

import collections
import functools
import operator
import types
from typing import Any

from agspeed.protocol import Reason

__all__ = ["GraphBreak", "StorageSize", "SymShape", "concrete", "describe_callable",
           "holds_node", "DICT_VIEWS"]


class SymShape(tuple):
    """``tensor.shape`` with symbolic sizes: size nodes and ints (``torch.Size`` cannot
    hold graph nodes).  A graph that returns one builds a ``torch.Size`` of it."""

    __slots__ = ()


DICT_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))


def holds_node(value: Any, node_type: type, depth: int = 0) -> bool:
    """Whether ``value`` is a graph node or holds one somewhere: in a container (tuples,
    lists, sets, deques, dict values), or in the cells or default values of a function
    or the arguments of a ``functools.partial`` made during capture."""
    if type(value) is node_type:
        return True
    if depth > 8:
        return False
    if isinstance(value, dict):
        return any(holds_node(v, node_type, depth + 1) for v in value.values())
    if type(value) in DICT_VIEWS:   # d.items() of a dict the capture holds nodes in
        return holds_node(dict(value.mapping), node_type, depth + 1)
    if isinstance(value, (tuple, list, set, frozenset, collections.deque)):
        return any(holds_node(v, node_type, depth + 1) for v in value)
    if type(value) is types.FunctionType:
        cells = [_cell_value(c) for c in value.__closure__ or ()]
        return holds_node((cells, value.__defaults__ or (), value.__kwdefaults__ or {}),
                          node_type, depth + 1)
    if type(value) is functools.partial:
        return holds_node((value.func, value.args, value.keywords), node_type, depth + 1)
    if type(value) is operator.methodcaller:
        return holds_node(value.__reduce__()[1], node_type, depth + 1)
    return False


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


class StorageSize:
    """``x.untyped_storage()`` of a graph input, as far as the capture reads it: its
    size in bytes (``size()``, ``nbytes()``), guarded on the input's source."""

    def __init__(self, nbytes: int) -> None:
        self.bytes = nbytes

    def size(self) -> int:
        return self.bytes

    def nbytes(self) -> int:
        return self.bytes


class GraphBreak(Exception):
    """Capture of a frame must stop here, for ``reason`` (an ``agspeed.protocol.Reason``;
    anything else fails loudly)."""

    def __init__(self, reason: Reason, detail: str):
        if not isinstance(reason, Reason):
            raise ValueError(f"unknown graph-break reason {reason!r} (agspeed.protocol.Reason)")
        self.reason = reason
        self.detail = detail
        self.explanation, self.hint = reason.what, reason.hint
        super().__init__(f"{reason.id}: {detail} ({self.explanation}; hint: {self.hint})")


def concrete(value: Any) -> Any:
    """The plain value of an int/float/bool, or of a SymInt/SymFloat/SymBool the ShapeEnv
    knows to be constant; None for a symbolic one."""
    if isinstance(value, (int, float, bool)):
        return value
    node = getattr(value, "node", None)
    if node is None:
        return None
    kind = type(value).__name__   # SymInt, SymFloat, SymBool
    fn = getattr(node, {"SymInt": "maybe_as_int", "SymFloat": "maybe_as_float"}.get(
        kind, "maybe_as_bool"), None)
    return fn() if fn is not None else None


def describe_callable(fn: Any) -> str:
    module = getattr(fn, "__module__", None) if isinstance(
        fn, (types.FunctionType, types.BuiltinFunctionType, type)) else None
    name = getattr(fn, "__qualname__", None) if isinstance(
        fn, (types.FunctionType, types.BuiltinFunctionType, type)) else None
    if name:
        return f"{module}.{name}" if module else name
    if isinstance(fn, (types.MethodDescriptorType, types.ClassMethodDescriptorType)):
        return f"{fn.__objclass__.__qualname__}.{fn.__name__}, a builtin method"
    return f"a {type(fn).__name__}"
