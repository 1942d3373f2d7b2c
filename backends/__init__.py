"""The backend registry.

A backend turns a captured ``torch.fx.GraphModule`` into a callable, with the signature
torch.compile uses: ``backend(gm, example_inputs) -> callable``, where ``gm`` returns a
flat tuple and the callable a sequence as long (``_outputs.py`` rebuilds the frame's
result from it).  The built-in backends
are the modules of this package, one per backend, found by file name: ``eager.py`` is the
backend ``"eager"`` and defines a function ``backend``.  Users register theirs with
``register_backend`` (also a decorator), and may pass any such callable to
``agspeed.optimize(..., backend=fn)`` without registering it.

Each backend declares what it can take (training, symbolic sizes, devices, whether it can
run here at all) through one protocol, ``backend.capabilities`` (``_protocol.py``).

``"auto"`` is the autotuner (``autotune.py``): itself a backend, it compiles each candidate
backend on a new graph, checks it against eager, times it and keeps the fastest, remembering
the choice in the knowledge base (``knowledge.py``).

Nothing here imports torch: a backend module is imported when it is first asked for.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from typing import Any, Callable

from agspeed.backends._protocol import Capabilities, capabilities_of, why_not
from agspeed.errors import InvalidArgumentError, UnknownBackendError

__all__ = ["Backend", "Capabilities", "register_backend", "get_backend", "list_backends",
           "resolve", "supports_dynamic", "takes_float_inputs", "capabilities_of", "why_not",
           "TOOLS", "candidate_names"]

# Modules of this package that are not backends.
TOOLS = ("autotune", "knowledge")

Backend = Callable[[Any, list], Callable[..., Any]]

_AUTO = "auto"
# TORCHINDUCTOR_CACHE_DIR as it was when agspeed was imported: importing torch._dynamo
# later sets it to torch's default, which must not pass for the user's choice.
INDUCTOR_DIR_AT_IMPORT = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
_registered: dict[str, Backend] = {}


def _builtin_names() -> list[str]:
    return [m.name for m in pkgutil.iter_modules(__path__)
            if not m.name.startswith("_") and m.name not in TOOLS]


def register_backend(name: str, fn: Backend | None = None, *, override: bool = False):
    """Register ``fn`` as the backend ``name``; without ``fn``, return a decorator."""
    if not isinstance(name, str) or not name or name == _AUTO:
        raise InvalidArgumentError(f"a backend name must be a non-empty string other than 'auto', not {name!r}")
    if fn is None:
        return lambda f: register_backend(name, f, override=override)
    if not callable(fn):
        raise InvalidArgumentError(f"backend {name!r} must be callable, not {type(fn).__name__}")
    if not override and (name in _registered or name in _builtin_names()):
        raise ValueError(f"a backend named {name!r} exists; pass override=True to replace it")
    _registered[name] = fn
    return fn


def list_backends() -> list[str]:
    """Every backend name ``optimize()`` accepts, ``"auto"`` included."""
    return sorted({_AUTO, *_builtin_names(), *_registered})


def candidate_names(names: Any) -> tuple[str, ...]:
    """``names`` as the autotuner takes them: known backends other than ``"auto"``, in
    order, each once.  Raises ValueError naming the ones that are not."""
    known = [n for n in list_backends() if n != _AUTO]
    bad = [n for n in names if not isinstance(n, str) or n not in known]
    if bad:
        raise ValueError(f"no backend named {', '.join(map(repr, bad))}; "
                         f"known: {', '.join(known)}")
    return tuple(dict.fromkeys(names))


def get_backend(name: str) -> Backend:
    """The backend callable registered as ``name`` (``"auto"``: the autotuner)."""
    if name == _AUTO:
        return importlib.import_module(f"{__name__}.autotune").autotuner
    if name in _registered:
        return _registered[name]
    if name in _builtin_names():
        return importlib.import_module(f"{__name__}.{name}").backend
    raise UnknownBackendError(f"no backend named {name!r}; known backends: {', '.join(list_backends())}")


def supports_dynamic(backend: Backend) -> bool:
    """Whether ``backend`` takes graphs with symbolic sizes (dynamic shapes).

    A backend says no through ``Capabilities(dynamic=False)`` (or the older attribute
    ``supports_dynamic = False``); it then gets one static graph per size.  Otherwise the
    answer is yes: a GraphModule with symbolic sizes runs like any other, and backends
    with torch.compile's signature read the symbols from the placeholders'
    ``example_value`` metadata.
    """
    return capabilities_of(backend).dynamic


def takes_float_inputs(backend: Backend) -> bool:
    """Whether ``backend`` takes plain floats made symbols (``Capabilities.float_inputs``;
    only backends that declare it)."""
    caps = capabilities_of(backend)
    return caps.dynamic and caps.float_inputs


def resolve(backend: str | Backend) -> tuple[str, Backend]:
    """``(name, callable)`` for a backend given by name or as a callable."""
    if isinstance(backend, str):
        return backend, get_backend(backend)
    if callable(backend):
        return getattr(backend, "__name__", type(backend).__name__), backend
    raise InvalidArgumentError(
        f"backend must be a backend name or a callable (gm, example_inputs) -> callable, "
        f"not {type(backend).__name__}"
    )
