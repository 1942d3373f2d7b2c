"""The public entry points: optimize, disable, reset, counters."""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable

from agspeed import _C, _roots, _runtime, config
from agspeed.backends import resolve
from agspeed.errors import InvalidArgumentError, UnknownOptionError

__all__ = ["optimize", "disable", "reset", "counters"]

# Options optimize() accepts, with the types each takes.
_OPTIONS: dict[str, tuple] = {
    "fullgraph": (bool,),       # a graph break is an error instead of a fallback
    "dynamic": (bool, type(None)),  # None: decide per dimension; True/False: all dynamic/static
    "disable": (bool,),         # return the object unchanged
    "tune_budget": (int, float),  # seconds the autotuner may spend per graph
    "candidates": (tuple, list),  # backends the autotuner tries (names)
    "tune_after": (int,),       # the call of a graph on which the autotuner tunes it
}


def _check_options(options: dict[str, Any]) -> dict[str, Any]:
    for name, value in options.items():
        types = _OPTIONS.get(name)
        if types is None:
            raise UnknownOptionError(
                f"optimize() got an unknown option {name!r}; options are {', '.join(_OPTIONS)}"
            )
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise UnknownOptionError(
                f"optimize() option {name!r} takes "
                f"{' or '.join('None' if t is type(None) else t.__name__ for t in types)}, "
                f"not {type(value).__name__}"
            )
    if "tune_budget" in options and not options["tune_budget"] > 0:
        raise ValueError(f"optimize() option 'tune_budget' must be a positive number of "
                         f"seconds, not {options['tune_budget']!r}")
    if "tune_after" in options and not options["tune_after"] > 0:
        raise ValueError(f"optimize() option 'tune_after' must be a positive number of "
                         f"calls, not {options['tune_after']!r}")
    if "candidates" in options:
        from agspeed.backends import candidate_names

        try:
            options["candidates"] = candidate_names(options["candidates"])
        except ValueError as exc:
            raise ValueError(f"optimize() option 'candidates': {exc}") from None
    return options


def _is_module(obj: Any) -> bool:
    torch = sys.modules.get("torch")  # nothing can be a Module if torch was never imported
    return torch is not None and isinstance(obj, torch.nn.Module)


def optimize(obj: Any = None, backend: Any = "auto", **options: Any) -> Any:
    """Return ``obj`` made to run through agspeed's runtime.

    ``obj`` is an ``nn.Module`` (the result shares its parameters, buffers, state_dict,
    train()/eval() and hooks; see ``agspeed._module``) or any callable (the result is a
    callable that wraps it, with ``functools.wraps`` applied).  Without ``obj``, returns a
    decorator: ``@agspeed.optimize(backend="eager")``.

    ``backend`` is a name from ``agspeed.backends.list_backends()`` or a callable
    ``(gm, example_inputs) -> callable``; ``AGSPEED_BACKEND`` overrides it.
    Options: ``fullgraph``, ``dynamic``, ``disable``; for ``backend="auto"``:
    ``tune_budget`` (seconds per graph), ``candidates`` (backend names to try) and
    ``tune_after`` (the call of a graph on which it is tuned).
    With ``fullgraph=True`` a frame whose capture stops at a graph break does not run
    eager: the call raises ``agspeed.GraphBreakError``, saying where and why, and so does
    every later call that breaks.
    """
    _check_options(options)
    if obj is None:
        return functools.partial(optimize, backend=backend, **options)
    if not callable(obj):
        raise InvalidArgumentError(
            f"agspeed.optimize() takes an nn.Module or a callable, not {type(obj).__name__}"
        )
    name, backend_fn = resolve(config.backend or backend)
    if options.get("disable") or config.disable:
        return obj
    ctx = _runtime.context_for(name, backend_fn, options)
    is_module = _is_module(obj)
    if is_module:
        from agspeed._module import _record, optimize_module

        view = optimize_module(obj, ctx, {"backend": backend, "options": options})
        _roots.watch_first_call(_record(view).region, obj, True)
        return view
    root = _roots.take(obj, False)
    call = obj if root is None else functools.partial(_roots.call_expecting, root, obj)
    region = functools.update_wrapper(_C.Region(call, ctx), obj)
    _roots.watch_first_call(region, obj, False)
    return region


class _OpenScopes(threading.local):
    """Per thread: the Scopes a ``_Disabled`` object entered there and has not left."""

    def __init__(self) -> None:
        self.stack: list = []


class _Disabled:
    """``with agspeed.disable():`` and ``@agspeed.disable()``; see ``disable``.

    One object may be entered by several threads at once, and again inside its own block;
    each thread leaves the innermost Scope it entered itself.  A stack shared by the threads
    would let one thread leave (and undo) another thread's Scope.
    """

    def __init__(self) -> None:
        self._open = _OpenScopes()
        self._open_anywhere: list = []  # every thread's, to tell "elsewhere" from "never"

    def __enter__(self) -> "_Disabled":
        scope = _C.Scope(None)
        scope.__enter__()
        self._open.stack.append(scope)
        self._open_anywhere.append(scope)
        return self

    def __exit__(self, *exc: Any) -> bool:
        stack = self._open.stack
        if stack:
            scope = stack.pop()
            self._open_anywhere.remove(scope)
            return scope.__exit__(*exc)
        if self._open_anywhere:
            # Entered on other threads only: a generator suspended in the block and resumed,
            # or closed by the garbage collector, on this one.  No thread can reach another's
            # context stack, so there is nothing to leave here; the entering thread drops its
            # push when the optimized call it was made in returns (docs/architecture.md).
            return False
        raise RuntimeError(
            "agspeed.disable(): __exit__ without a matching __enter__; "
            "leave each `with agspeed.disable():` block once"
        )

    def __call__(self, fn: Callable) -> Callable:
        return disable(fn)


def disable(fn: Callable | None = None) -> Any:
    """Run without agspeed: as ``with agspeed.disable():`` or as a decorator.

    Inside, nothing is captured, even under an optimized call; decorated functions (and
    everything they call) run plain eager wherever they are called from.
    """
    if fn is None:
        return _Disabled()
    if not callable(fn):
        raise InvalidArgumentError(f"agspeed.disable() takes a callable, not {type(fn).__name__}")
    return functools.update_wrapper(_C.Region(fn, None), fn)


def reset() -> None:
    """Forget everything the runtime cached: code caches, skip marks, counters, records,
    the autotuner's decisions, its checks on training steps and DDP cuts in this process
    (the knowledge base on disk stays)."""
    from agspeed._ddp import clear_splits
    from agspeed.backends import _confirm
    from agspeed.backends.autotune import clear_decisions

    _C.clear_caches()
    _C.reset_counters()
    _runtime.clear()
    clear_decisions()
    clear_splits()
    _confirm.clear()


def counters() -> dict[str, int]:
    """The runtime's counters since the last ``reset()``; meanings in ``agspeed._C.COUNTER_DOCS``."""
    return _C.counters()
