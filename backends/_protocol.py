"""What a backend declares about itself: the one capability protocol of the registry.

A backend is a callable with torch.compile's signature, ``backend(gm, example_inputs) ->
callable``.  Beside it, it may carry ``backend.capabilities``, a ``Capabilities``:

* ``training``: its callable's outputs carry gradients back to the graph's inputs (the
  backward runs through it, or through autograd as in eager).  False: the backend is
  for graphs that need no gradient (inference, or ``torch.no_grad()`` regions).
* ``dynamic``: it takes graphs whose placeholders have symbolic sizes (one graph for many
  sizes), or are ints made symbols (SymInt placeholders).  False: the runtime gives it
  one static graph per size and value.
* ``float_inputs``: it takes plain floats made symbols (SymFloat placeholders; off unless
  declared).  Tracing them through AOTAutograd outside torch.compile either fails or
  fixes the float's value silently, so only backends that run the graph as it is
  declare it; the others get floats as constants of the graph.
* ``devices``: the device types of inputs it can run (``"cpu"``, ``"cuda"``).
* ``static_inputs_only``: it needs every input at a fixed address and size (CUDA graphs).
* ``unavailable``: a function answering why the backend cannot run in this process at
  all (a missing library, no GPU), or None when it can.  Asked once per question, so it
  must be cheap and must not raise.

``why_not(fn, example_inputs, training)`` is the one place that reads these: it says
why ``fn`` cannot take a given graph, or None.  A callable without ``capabilities`` (any
user backend) can take anything; the older attribute ``supports_dynamic = False`` is
read as ``Capabilities(dynamic=False)``.

This module does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Capabilities", "capabilities_of", "why_not", "graph_devices", "is_dynamic",
           "placeholder_values", "autocast_state"]


def _always() -> str | None:
    return None


@dataclass(frozen=True)
class Capabilities:
    """What a backend can take; see the module docstring."""

    training: bool = True
    dynamic: bool = True
    float_inputs: bool = False
    devices: frozenset = frozenset({"cpu", "cuda"})
    static_inputs_only: bool = False
    unavailable: Callable[[], "str | None"] = _always

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", frozenset(self.devices))


_ANYTHING = Capabilities()


def capabilities_of(fn: Any) -> Capabilities:
    """The capabilities ``fn`` declares (everything, for a plain callable)."""
    caps = getattr(fn, "capabilities", None)
    if isinstance(caps, Capabilities):
        return caps
    if getattr(fn, "supports_dynamic", True) is False:
        return Capabilities(dynamic=False)
    return _ANYTHING


def graph_devices(example_inputs: list) -> set[str]:
    """The device types of a graph's tensor inputs."""
    return {t.device.type for t in example_inputs if hasattr(t, "device")}


def placeholder_values(gm: Any) -> list:
    """The example values the capture recorded on the graph's placeholders (fake tensors;
    with symbolic sizes in a dynamic capture), in input order; None where absent."""
    return [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]


def is_dynamic(gm: Any) -> bool:
    """Whether the graph's placeholders have symbolic sizes, or are symbols themselves
    (a plain int or float the capture made one): a dynamic capture."""
    values = placeholder_values(gm)
    return any(type(v).__name__ in ("SymInt", "SymFloat") for v in values) or \
        any(type(d).__name__ == "SymInt" for v in values for d in getattr(v, "shape", ()))


def has_float_symbols(gm: Any) -> bool:
    """Whether a placeholder of the graph is a plain float the capture made a symbol."""
    return any(type(v).__name__ == "SymFloat" for v in placeholder_values(gm))


def autocast_state(devices: Any) -> list:
    """(device, enabled, dtype) of autocast on this thread for each device type in
    ``devices``; dtype None for a device type without autocast."""
    import torch

    state = []
    for device in sorted(set(devices)):
        try:
            state.append((device, torch.is_autocast_enabled(device),
                          torch.get_autocast_dtype(device)))
        except (RuntimeError, TypeError):  # a device type without autocast
            state.append((device, False, None))
    return state


def why_not(fn: Any, gm: Any, example_inputs: list, training: bool) -> str | None:
    """Why ``fn`` cannot take this graph, in a few words, or None when it can."""
    caps = capabilities_of(fn)
    reason = caps.unavailable()
    if reason:
        return reason
    devices = graph_devices(example_inputs)
    wrong = sorted(devices - caps.devices)
    if wrong:
        return f"runs on {', '.join(sorted(caps.devices))}, not {', '.join(wrong)}"
    if caps.static_inputs_only and len(devices) > 1:
        return "needs every input on one device"
    if training and not caps.training:
        return "cannot run a backward (graph needs gradients)"
    if not caps.dynamic and is_dynamic(gm):
        return "takes static sizes only (graph has symbolic sizes)"
    if not caps.float_inputs and has_float_symbols(gm):
        return "takes no float symbols (a float input varies from call to call)"
    return None
