"""The errors agspeed raises: one base class, one subclass per kind of mistake.

Each subclass also derives from the builtin error a Python user would expect
(``TypeError`` for a wrong kind of argument, ``ValueError`` for a wrong value),
so ``except TypeError`` keeps working around ``agspeed.optimize``.
"""

from __future__ import annotations

__all__ = [
    "AgspeedError",
    "InvalidArgumentError",
    "UnknownOptionError",
    "UnknownBackendError",
    "ConfigWarning",
]


class AgspeedError(Exception):
    """Base class of every error raised by agspeed itself."""


class InvalidArgumentError(AgspeedError, TypeError):
    """An argument of the wrong kind, e.g. optimizing something that is not callable."""


class UnknownOptionError(AgspeedError, TypeError):
    """An option ``optimize()`` or ``config`` does not know, or one with a value of the wrong type."""


class UnknownBackendError(AgspeedError, ValueError):
    """A backend name that no registered or built-in backend has."""


class ConfigWarning(UserWarning):
    """A malformed environment variable or config value, ignored in favour of the default."""
