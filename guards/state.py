"""Torch's global state that a guard checks, and the probes that read it.

Everything outside the frame that changes what a graph computes: grad mode, inference
mode, the autocast cache, autocast per device type (enabled, dtype), the default dtype,
deterministic mode, and the level of the torch.func transform (vmap, grad, jvp) the call
runs under, if any: inside one, tensors are the transform's wrappers, which a graph
compiled for plain tensors must not be given.  ``global_state`` reads it as a tuple (what a ``Guard`` remembers and
compares in Python); ``state_probes`` turns one reading into (function, args, expected)
triples that the C program calls with torch's own functions, so both read the same facts.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["AUTOCAST_DEVICES", "global_state", "state_probes", "state_functions",
           "state_text", "transform_level", "in_transform"]

AUTOCAST_DEVICES = ("cpu", "cuda")


def _autocast_state(torch: Any) -> tuple:
    """(enabled, dtype) of autocast per device type, on torch 2.4+ and older; the dtype
    is None where autocast is off (it then changes nothing)."""
    try:
        pairs = [(torch.is_autocast_enabled(d), lambda d=d: torch.get_autocast_dtype(d))
                 for d in AUTOCAST_DEVICES]
    except TypeError:  # before 2.4 these took no device argument
        pairs = [(torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype),
                 (torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype)]
    return tuple((on, dtype() if on else None) for on, dtype in pairs)


def _any_autocast(torch: Any) -> Any:
    """torch._C._is_any_autocast_enabled, where this torch has it (one call for every
    device type), else None."""
    return getattr(torch._C, "_is_any_autocast_enabled", None)


def _deterministic_state(torch: Any) -> tuple:
    """(on, warn_only) of torch.use_deterministic_algorithms; warn_only is None where
    it is off (it then changes nothing)."""
    on = torch.are_deterministic_algorithms_enabled()
    return on, (torch.is_deterministic_algorithms_warn_only_enabled() if on else None)


def _transform_level(torch: Any) -> Any:
    """torch._C._functorch.maybe_current_level where this torch has it (None outside
    every torch.func transform), else None."""
    functorch = getattr(torch._C, "_functorch", None)
    return getattr(functorch, "maybe_current_level", None)


def transform_level(torch: Any) -> int | None:
    """The level of the torch.func transform running now, or None outside them."""
    level = _transform_level(torch)
    return level() if level is not None else None


def in_transform() -> bool:
    """Whether a torch.func transform (vmap, grad, jvp) is running now (False while
    torch has not been imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and transform_level(torch) is not None


def global_state(torch: Any) -> tuple:
    """Everything outside the frame that changes what a graph computes: grad mode,
    inference mode, the autocast cache, autocast on any device type (None where torch
    cannot tell), autocast per device type, the default dtype, deterministic mode, the
    torch.func transform level (None outside them)."""
    any_on = _any_autocast(torch)
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.is_autocast_cache_enabled(), any_on() if any_on else None,
            _autocast_state(torch), torch.get_default_dtype(), _deterministic_state(torch),
            transform_level(torch))


def state_probes(torch: Any, state: tuple) -> tuple:
    """``global_state`` as (function, args, expected) triples the C program calls: the
    same facts, so the program and ``global_state`` always agree.  With autocast off
    everywhere, one probe stands for every device type (the common case: six calls)."""
    grad, inference, cache, any_on, autocast, default, (det, warn_only), level = state
    probes = [(torch.is_grad_enabled, (), grad),
              (torch.is_inference_mode_enabled, (), inference),
              (torch.is_autocast_cache_enabled, (), cache)]
    if any_on is not None:
        probes.append((_any_autocast(torch), (), any_on))
    if any_on is not False:   # on somewhere, or unknown: per device type
        try:
            torch.is_autocast_enabled("cpu")
            checks = [(torch.is_autocast_enabled, torch.get_autocast_dtype, (d,))
                      for d in AUTOCAST_DEVICES]
        except TypeError:  # before 2.4 (see _autocast_state)
            checks = [(torch.is_autocast_cpu_enabled, torch.get_autocast_cpu_dtype, ()),
                      (torch.is_autocast_enabled, torch.get_autocast_gpu_dtype, ())]
        for (enabled_fn, dtype_fn, args), (enabled, dtype) in zip(checks, autocast):
            probes.append((enabled_fn, args, enabled))
            if enabled:
                probes.append((dtype_fn, args, dtype))
    probes.append((torch.get_default_dtype, (), default))
    probes.append((torch.are_deterministic_algorithms_enabled, (), det))
    if det:
        probes.append((torch.is_deterministic_algorithms_warn_only_enabled, (), warn_only))
    level_fn = _transform_level(torch)
    if level_fn is not None:
        probes.append((level_fn, (), level))
    return tuple(probes)


def state_functions(torch: Any) -> frozenset:
    """The ids of every function of torch ``global_state`` and ``state_probes`` read the
    state through (on this torch): a query of one of them needs no probe of its own."""
    names = ("is_grad_enabled", "is_inference_mode_enabled", "is_autocast_cache_enabled",
             "is_autocast_enabled", "get_autocast_dtype", "is_autocast_cpu_enabled",
             "get_autocast_cpu_dtype", "get_autocast_gpu_dtype", "get_default_dtype",
             "are_deterministic_algorithms_enabled",
             "is_deterministic_algorithms_warn_only_enabled")
    found = [getattr(torch, n, None) for n in names]
    found += [_any_autocast(torch), _transform_level(torch)]
    return frozenset(id(f) for f in found if f is not None)


def state_text(state: tuple) -> str:
    """A ``global_state`` reading, readable (guard lines and recompile logs)."""
    grad, inference, cache, _any, autocast, dtype, (det, warn_only), level = state
    amp = ", ".join(f"{d}:{'on ' + str(t).replace('torch.', '') if on else 'off'}"
                    for d, (on, t) in zip(AUTOCAST_DEVICES, autocast))
    deterministic = ("off" if not det else "warn_only" if warn_only else "on")
    return (f"(grad={'on' if grad else 'off'}, inference={'on' if inference else 'off'}, "
            f"autocast[{amp}], autocast_cache={'on' if cache else 'off'}, "
            f"default_dtype={str(dtype).replace('torch.', '')}, "
            f"deterministic={deterministic}"
            f"{'' if level is None else f', torch.func level {level}'})")
