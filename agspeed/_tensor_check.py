"""One call that tells whether a frame's tensor arguments have an entry's exact metadata.

A cache hit must confirm, for every tensor argument, the dtype, device, requires_grad,
sizes and strides the entry was made for.  Read through torch's Python attributes that is
five calls per tensor, each paying torch's error and warning handling: most of a hit's
cost for a function of many tensors.  torch ships a C++ checker of exactly these facts,
``torch._C._dynamo.guards.TensorGuards``, whose ``check(*tensors)`` reads each tensor's
metadata in C++ (torch's own runtime, reached as a Python object like any other torch
function; nothing of torch._dynamo's Python is imported).

It is private API, so it is used only where it behaves as required, which ``available()``
checks once per process by behaviour, not by version: a checker made for one tensor must
accept another tensor of the same type and metadata and refuse one differing in any of
dtype, rank, sizes, strides, requires_grad (with grad mode on and off) or type.  Where it
cannot be built or fails any of that, lookups compute the signature as before;
``set_enabled(False)`` forces that path (tests run both).

``batch_checker(tensors)`` is the same checker for the tensors a guard program reaches
other than the frame's arguments (parameters, gradients, an optimizer's state), made
for one list of its checks after they passed one by one (guards/batch.c).

``arg_check(code, f_locals)`` is what a signed CacheEntry carries (csrc/codecache.c, "The
steady state"): the types of the frame's argument slots (their addresses, as in the
signature: no reference is kept), the positions of its tensor arguments, and a checker
for them.  Only exact ``torch.Tensor`` and ``nn.Parameter``
arguments are handled: a subclass could answer attribute reads in Python differently
from its C++ metadata.
"""

from __future__ import annotations

from typing import Any

__all__ = ["available", "arg_check", "batch_checker", "set_enabled"]

_state: dict[str, Any] = {"checked": False, "ok": False, "enabled": True, "why": ""}


def _make(tensors: list) -> Any:
    from torch._C._dynamo.guards import TensorGuards

    return TensorGuards(*tensors, dynamic_dims_sizes=[list(t.size()) for t in tensors],
                        dynamic_dims_strides=[list(t.stride()) for t in tensors])


def _self_test() -> str:
    """"" if the checker behaves as required, else what it got wrong."""
    import torch

    base = torch.zeros(2, 3)
    same = torch.ones(2, 3)
    different = {
        "dtype": torch.zeros(2, 3, dtype=torch.float64),
        "rank": torch.zeros(6),
        "sizes": torch.zeros(3, 2),
        "strides": torch.zeros(3, 2).t(),
        "requires_grad": torch.zeros(2, 3, requires_grad=True),
        "type": torch.nn.Parameter(torch.zeros(2, 3), requires_grad=False),
        "storage layout": torch.zeros(2, 6)[:, ::2],
    }
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            check = _make([base])
            if check.check(same) is not True:
                return "refuses a tensor of the same metadata"
            for what, other in different.items():
                if check.check(other) is not False:
                    return f"accepts a different {what}"
            pair = _make([base, different["requires_grad"]])
            if pair.check(same, torch.zeros(2, 3)) is not False:
                return "accepts a different requires_grad in a second tensor"
    return ""


def available() -> bool:
    """Whether the C++ checker is there and passes the self-test (checked once)."""
    if not _state["checked"]:
        _state["checked"] = True
        try:
            why = _self_test()
        except Exception as exc:   # not there, or another constructor: not used
            why = f"{type(exc).__name__}: {exc}"
        _state["ok"], _state["why"] = not why, why
    return _state["ok"] and _state["enabled"]


def set_enabled(on: bool) -> None:
    """Use the checker where available (True, the default) or never (False)."""
    _state["enabled"] = bool(on)


def arg_check(code: Any, f_locals: dict) -> Any:
    """``(types, tensor positions, checker)`` for a frame of ``code`` with arguments
    ``f_locals``, or None where the checker is not used or an argument is a tensor of
    another class."""
    if not available():
        return None
    import torch

    from agspeed.guards import arg_names

    types, where, tensors = [], [], []
    missing = object()
    for i, name in enumerate(arg_names(code)):
        value = f_locals.get(name, missing)
        # the type's address, as the signature keeps it: a reference could keep a
        # user class alive (an optimized module's view class holds its model)
        types.append(0 if value is missing else id(type(value)))
        if isinstance(value, torch.Tensor):
            where.append(i)
            tensors.append(value)
    checker = batch_checker(tuple(tensors)) if tensors else _no_tensors
    return None if checker is None else (tuple(types), tuple(where), checker)


def batch_checker(tensors: tuple) -> Any:
    """``check(*tensors)`` for tensors of the same types and metadata as ``tensors``
    (exact ``torch.Tensor`` and ``nn.Parameter`` only), or None where the checker is not
    used."""
    if not available():
        return None
    import torch

    exact = (torch.Tensor, torch.nn.Parameter)
    if any(type(t) not in exact for t in tensors):
        return None
    try:
        return _make(list(tensors)).check
    except Exception:   # a tensor it cannot describe (sparse, nested): none
        return None


def _no_tensors() -> bool:
    return True
