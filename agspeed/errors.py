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
    "GraphBreakError",
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


class GraphBreakError(AgspeedError, RuntimeError):
    """Capture of a frame stopped at a graph break under ``optimize(..., fullgraph=True)``.

    Without ``fullgraph`` that frame would run eager; with it the call raises this, before
    the frame runs, and so does every later call that breaks: nothing is cached for it.
    The attributes say where and why, as ``agspeed.explain`` does: ``filename`` and
    ``line`` of the instruction that stopped capture, ``function`` (the function it is
    in, maybe one inlined into the frame), ``instruction`` (its opcode name), ``reason``
    (a stable id, ``agspeed.protocol.Reason``), ``detail`` (the operation or value),
    ``hint`` (what to do about it) and ``frame`` (the captured frame, "name (file:line)").
    """

    def __init__(self, filename: str, line: int | None, function: str, instruction: str,
                 reason: str, detail: str, hint: str = "", frame: str = "") -> None:
        # All in args, so that the error pickles (to a parent process) and copies whole.
        super().__init__(filename, line, function, instruction, reason, detail, hint, frame)
        self.filename = filename
        self.line = line
        self.function = function
        self.instruction = instruction
        self.reason = reason
        self.detail = detail
        self.hint = hint
        self.frame = frame

    def __str__(self) -> str:
        frame = f" of {self.frame}" if self.frame else ""
        lines = [f"fullgraph=True: capture{frame} stopped at a graph break",
                 f"  at {self.filename}:{self.line} in {self.function}, instruction "
                 f"{self.instruction}",
                 f"  reason: {self.reason} ({self.detail})"]
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        lines.append("Remove the break, or drop fullgraph=True to run this frame eager "
                     "(its callees are still captured).")
        return "\n".join(lines)


class ConfigWarning(UserWarning):
    """A malformed environment variable or config value, ignored in favour of the default."""
