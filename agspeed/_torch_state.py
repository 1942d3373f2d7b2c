"""torch's functions of the process's state, called in captured code with no graph value.

torch's operators (``torch.add``, ``torch.zeros``, ``F.linear``: the dispatcher's) run on
fake tensors while capturing and become graph nodes.  Its other C functions read or
change the process's state, and run for real when called:

* a *query* (``torch.autograd._profiler_enabled()``, ``torch._C._is_fwd_grad_enabled()``,
  ``torch.get_num_threads()``, named as one: ``is_``, ``get_``, ``..._enabled``,
  ``..._count``...) is answered now, and the answer is a probe of the entry's guard,
  called on every call: a branch on it is taken again when it changes.  Queries of the
  state every guard checks already (grad mode, autocast, the default dtype) need none.
* any other (``torch._C._autograd._saved_tensors_hooks_disable(msg)``) would change the
  process while capturing, and a capture that then breaks would leave it changed: it is
  never called here; the call breaks, and eager makes it.
"""

from __future__ import annotations

import functools
import re
import types
from typing import Any

from agspeed._builder_types import GraphBreak, describe_callable, holds_node
from agspeed.guards.state import state_functions
from agspeed.protocol import Reason

__all__ = ["answer"]

# modules of torch's C functions that are operators (besides torch's own namespace)
_OPERATOR_MODULES = frozenset({"torch._C._nn", "torch._C._linalg", "torch._C._fft",
                               "torch._C._special", "torch._C._nested", "torch._C._sparse"})
_QUERY = re.compile(r"^_*(is|are|has|can|get|should)(_|[A-Z])|_(is|get)(_|[A-Z])"
                    r"|(enabled|available|count|Count|name|version|capability)$")
# answers fixed for the life of the process: no probe
_FIXED = frozenset({"_get_privateuse1_backend_name"})


def _is_state_function(torch: Any, fn: Any) -> bool:
    if type(fn) is not types.BuiltinFunctionType:
        return False
    module = getattr(fn, "__module__", None) or ""
    if module == "torch":
        return not hasattr(torch._C._VariableFunctions, fn.__name__)
    return module.startswith("torch._C") and module not in _OPERATOR_MODULES


# the queries of the global state every guard probes already (agspeed.guards.state)
_guarded_already = functools.cache(state_functions)


def answer(builder: Any, fn: Any, args: tuple, kwargs: dict) -> tuple[bool, Any]:
    """``(True, value)`` for a state function of torch called with no graph value: a
    query's answer, its probe noted in ``builder.state_reads``; an effect breaks.
    ``(False, None)`` for anything else (an operator is recorded)."""
    torch = builder._torch
    if not _is_state_function(torch, fn) or holds_node((args, kwargs), builder.node_type):
        return False, None
    name = fn.__name__
    if "_sdp" in name and getattr(builder, "sdpa_stack", None):
        # inside a modelled sdpa_kernel block: the guard would probe it outside
        raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{describe_callable(fn)} inside "
                         f"sdpa_kernel")
    if not _QUERY.search(name):
        raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{describe_callable(fn)}, which changes "
                         f"torch's state (eager calls it)")
    try:
        with builder.mode_scope():   # as the frame's modelled managers have set them
            value = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - eager raises it: the frame runs eager
        raise GraphBreak(Reason.OP_FAILED, f"{describe_callable(fn)} raised "
                         f"{type(exc).__name__}: {exc}") from exc
    if not builder._is_static(value):
        raise GraphBreak(Reason.NON_TENSOR_RESULT, f"{describe_callable(fn)} returned a "
                         f"{type(value).__name__}")
    if name not in _FIXED and id(fn) not in _guarded_already(torch):
        probe = (fn if not kwargs else _Bound(fn, kwargs), tuple(args), value)
        if probe not in builder.state_reads:
            builder.state_reads.append(probe)
    return True, value


class _Bound:
    """A query with keyword arguments, as the guard's probe calls it (positionally)."""

    __slots__ = ("fn", "kwargs")

    def __init__(self, fn: Any, kwargs: dict) -> None:
        self.fn, self.kwargs = fn, dict(kwargs)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args, **self.kwargs)

    def __eq__(self, other: Any) -> bool:
        return type(other) is _Bound and other.fn is self.fn and other.kwargs == self.kwargs

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{describe_callable(self.fn)}(**{self.kwargs!r})"
