"""``torch.nn.attention.sdpa_kernel`` inside captured code: the graph's own switches.

``with sdpa_kernel(SDPBackend.MATH):`` selects which kernels ``scaled_dot_product_attention``
may use, by flags of the process (``torch._C._set_sdp_use_math`` and the like), restored
when the block ends.  The capture models the manager (agspeed/_ctx.py): entering it
records ``enter_sdpa_kernel(names, set_priority)`` in the graph and leaving it
``exit_sdpa_kernel(previous, set_priority)``, where ``previous`` is what the entry node
found selected when the graph runs.  Run as a graph (the eager backend) the nodes switch
the flags around the attention as the block did; a compiled backend traces through them,
so the kernels it picks are the ones the block selects.  Backends are named by their
``SDPBackend`` names, plain strings a graph can hold.

Both functions are marked as side effects for fx's dead-code elimination (an exit node
has no users).  Queries of the attention flags inside such a block break (the guard would
probe them outside it).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.fx.node
from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends, _sdpa_kernel, sdpa_kernel

__all__ = ["enter_sdpa_kernel", "exit_sdpa_kernel", "backend_names", "restore", "snapshot",
           "sdpa_kernel_of"]


def _mark_side_effect(fn: Any) -> Any:
    mark = getattr(torch.fx.node, "has_side_effect", None)
    if mark is not None:
        return mark(fn)
    torch.fx.node._side_effectful_functions.add(fn)
    return fn


def selected(set_priority: bool) -> tuple:
    """The names of the backends selected now (in priority order with ``set_priority``)."""
    return tuple(b.name for b in _cur_sdpa_kernel_backends(with_priority=set_priority))


@_mark_side_effect
def enter_sdpa_kernel(names: tuple, set_priority: bool) -> tuple:
    """Select the backends ``names``, as ``sdpa_kernel``'s enter; what was selected."""
    previous = selected(set_priority)
    _sdpa_kernel([getattr(SDPBackend, n) for n in names], set_priority)
    return previous


@_mark_side_effect
def exit_sdpa_kernel(previous: tuple, set_priority: bool) -> None:
    """Select ``previous`` again, as ``sdpa_kernel``'s exit."""
    _sdpa_kernel([getattr(SDPBackend, n) for n in previous], set_priority)


def snapshot() -> tuple:
    """The attention flags and priority order now (``restore`` puts them back)."""
    return selected(False), tuple(torch._C._get_sdp_priority_order())


def restore(state: tuple) -> None:
    names, order = state
    _sdpa_kernel([getattr(SDPBackend, n) for n in names], False)
    torch._C._set_sdp_priority_order(list(order))


def backend_names(backends: Any) -> tuple | None:
    """The names ``sdpa_kernel(backends)`` selects, in its order without repeats; None
    where it would refuse them (it raises)."""
    if isinstance(backends, SDPBackend):
        backends = [backends]
    if type(backends) is not list or not all(isinstance(b, SDPBackend) for b in backends):
        return None
    return tuple(dict.fromkeys(b.name for b in backends))


@contextlib.contextmanager
def sdpa_kernel_of(set_priority: bool, *names: str) -> Iterator[dict]:
    """``sdpa_kernel`` of the backends ``names``: what a resume function enters again
    after a break inside such a block (its arguments plain values, as the generated code
    holds them)."""
    with sdpa_kernel([getattr(SDPBackend, n) for n in names], set_priority) as got:
        yield got
