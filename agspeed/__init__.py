"""agspeed: graph capture for unmodified PyTorch code, with a C frame hook.

    model = agspeed.optimize(model)

The C extension ``agspeed._C`` hooks Python frame evaluation (PEP 523) while an
optimized object runs, keeps a cache of decisions on each code object, and asks the
capture context (``agspeed._runtime``) only on a miss.  Importing agspeed does not
import torch.  Knobs: ``agspeed.config`` and the ``AGSPEED_*`` environment variables
(docs/env_vars.md).
"""

from agspeed import _C, cache, config, log
from agspeed.api import counters, disable, optimize, reset
from agspeed._explain import explain
from agspeed._runtime import recompiles
from agspeed._shapes import mark_dynamic, mark_static
from agspeed.backends import list_backends, register_backend
from agspeed.errors import (
    AgspeedError,
    ConfigWarning,
    GraphBreakError,
    InvalidArgumentError,
    UnknownBackendError,
    UnknownOptionError,
)

__version__ = "0.1.0"

__all__ = [
    "optimize",
    "disable",
    "reset",
    "explain",
    "recompiles",
    "mark_dynamic",
    "mark_static",
    "counters",
    "config",
    "cache",
    "log",
    "list_backends",
    "register_backend",
    "AgspeedError",
    "ConfigWarning",
    "GraphBreakError",
    "InvalidArgumentError",
    "UnknownBackendError",
    "UnknownOptionError",
]

config.reload()
