"""Optimized nn.Modules: a view of the original module whose call goes through the runtime.

``optimize(module)`` returns an instance of a subclass made for it, named like the
original class, whose instance ``__dict__`` *is* the original's.  So the two share
everything a module is made of: parameters, buffers, submodules, hooks, ``training``,
``state_dict()`` keys (no prefix), ``parameters()`` identity, and ``isinstance`` still
holds.  Only the class attribute ``__call__`` differs: an ``agspeed._C.Region`` that
runs the original class's ``__call__`` (hooks and all) inside the capture context.
The original object and its class are not modified.

Rejected: a wrapper module holding the original as a child (state_dict keys gain a
prefix and attribute access needs forwarding), and patching the original's class or
instance (the original must stay a plain module).

Copies.  ``copy.copy``, ``copy.deepcopy`` and pickling copy the original as they would a
plain module and optimize the copy with the same arguments: a shallow copy has its own
``__dict__`` whose values are shared, a deep copy is independent.  Pickling stores the
original plus the optimize() arguments and optimizes again on load.  ``copy.copy`` needs
its own ``__copy__``: through ``__reduce_ex__`` it would get the original itself (a
shallow copy does not copy the reduce arguments) and share its ``__dict__``.
"""

from __future__ import annotations

import copy
from typing import Any

from agspeed import _C


def _reoptimize(original: Any, backend: Any, options: dict) -> Any:
    from agspeed.api import optimize

    return optimize(original, backend=backend, **options)


def _reduce_ex(self: Any, protocol: int) -> tuple:
    spec = type(self).__agspeed_spec__
    return (_reoptimize, (type(self)._orig_mod, spec["backend"], spec["options"]))


def _copy(self: Any) -> Any:
    spec = type(self).__agspeed_spec__
    return _reoptimize(copy.copy(type(self)._orig_mod), spec["backend"], spec["options"])


def optimize_module(module: Any, ctx: Any, spec: dict) -> Any:
    """An optimized view of ``module`` (see the module docstring)."""
    cls = type(module)
    namespace = {
        "__call__": _C.Region(cls.__call__, ctx),
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "__reduce_ex__": _reduce_ex,
        "__copy__": _copy,
        "__agspeed_spec__": spec,
        "_orig_mod": module,
    }
    optimized_cls = type(cls)(cls.__name__, (cls,), namespace)
    view = object.__new__(optimized_cls)
    object.__setattr__(view, "__dict__", module.__dict__)
    return view
