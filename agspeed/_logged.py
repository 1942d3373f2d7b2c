"""Calls made for their effect that the capture replays after the graph, where eager
makes them: ``logging`` (a Logger's methods and the module's functions) and
``warnings.warn``.  Each is made again on every run of the entry, at the place eager's
would name: the record's file, line and function, and the warning's location (with that
module's registry, so that filters such as "once per location" see what they see in
eager), read from the interpreter (``_C.capture_site``).  Part of the side effects of
``agspeed._effects``, which records the calls and their values' templates.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

from agspeed import _C
from agspeed._builder_types import GraphBreak
from agspeed.protocol import Reason

__all__ = ["logging_calls", "warn_at", "warn_args", "log_args", "log_at"]


def logging_calls() -> frozenset:
    """The logging functions whose calls are replayed rather than traced."""
    names = ("debug", "info", "warning", "warn", "error", "exception", "critical", "fatal",
             "log", "warning_once", "info_once")
    found = [getattr(logging.Logger, n, None) for n in names]
    found += [getattr(logging, n, None) for n in names]
    return frozenset([f for f in found if f is not None] + [warnings.warn])


class _Globals:
    """A module's globals in a replayed warning (kept whole: templates copy dicts)."""

    __slots__ = ("globals",)

    def __init__(self, globs: dict) -> None:
        self.globals = globs


def warn_at(message: Any, category: Any, filename: str, lineno: int, where: _Globals) -> None:
    """``warnings.warn`` as eager's would have been, from ``filename:lineno``."""
    if isinstance(message, Warning):
        category = type(message)
    elif category is None:
        category = UserWarning
    globs = where.globals
    registry = globs.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, category, filename, lineno, globs.get("__name__"),
                           registry, globs)


def _call_site(stacklevel: Any) -> tuple | None:
    """``(code, line, globals)`` of the frame ``stacklevel`` frames up from the call being
    captured (1: the frame making it), as warnings and logging count; None when that is
    not a frame of the capture (a caller of the optimized frame) or not an int."""
    site = _C.capture_site()
    if type(stacklevel) is not int or not 1 <= stacklevel <= len(site):
        return None
    code, offset, globs = site[stacklevel - 1]
    positions = list(code.co_positions())
    line = positions[offset // 2][0] if 0 <= offset // 2 < len(positions) else None
    return code, line if line is not None else code.co_firstlineno, globs


def warn_args(args: tuple, kwargs: dict) -> tuple:
    """The ``warn_at`` arguments of ``warnings.warn(*args, **kwargs)`` made now."""
    names = ("message", "category", "stacklevel")
    if len(args) > 3 or set(kwargs) - set(names) or any(n in kwargs for n in names[:len(args)]):
        raise GraphBreak(Reason.UNSUPPORTED_CALL, "warnings.warn with these arguments")
    given = dict(zip(names, args), **kwargs)
    site = _call_site(given.get("stacklevel", 1))
    if site is None:
        raise GraphBreak(Reason.UNSUPPORTED_CALL,
                         "warnings.warn naming a caller of the optimized frame")
    code, line, globs = site
    return (given.get("message"), given.get("category"), code.co_filename, line,
            _Globals(globs))


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "warn": logging.WARNING, "error": logging.ERROR, "exception": logging.ERROR,
           "critical": logging.CRITICAL, "fatal": logging.CRITICAL, "log": None}
_LOG_KEYWORDS = frozenset({"exc_info", "extra", "stack_info", "stacklevel"})


def log_args(fn: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The ``log_at`` arguments of a call of a ``logging.Logger`` method or a ``logging``
    function, with the place eager's record would name; None for any other call, or one
    whose arguments eager itself would refuse (replayed as it is, to raise the same)."""
    name = getattr(fn, "__name__", "")
    if name not in _LEVELS or set(kwargs) - _LOG_KEYWORDS or kwargs.get("stack_info"):
        return None
    if fn is getattr(logging.Logger, name, None) and args and \
            isinstance(args[0], logging.Logger):
        logger, rest = args[0], args[1:]
    elif fn is getattr(logging, name, None):
        logger, rest = None, args   # the root logger, set up on first use as eager does
    else:
        return None
    level = _LEVELS[name]
    if level is None:
        if not rest or type(rest[0]) is not int:
            return None
        level, rest = rest[0], rest[1:]
    site = _call_site(kwargs.get("stacklevel", 1))
    if not rest or site is None:
        return None
    code, line, _globs = site
    exc_info = kwargs.get("exc_info", name == "exception")
    return (logger, level, code.co_filename, line, code.co_name, rest[0], rest[1:],
            exc_info, kwargs.get("extra"))


def log_at(logger: Any, level: int, filename: str, lineno: int, func: str, msg: Any,
            args: tuple, exc_info: Any, extra: Any) -> None:
    """A logging call as eager's would have made it: the record names the line of the
    program that made the call, not the replay's (``Logger._log`` without its stack
    walk)."""
    if logger is None:
        logger = logging.root
        if not logger.handlers:
            logging.basicConfig()
    if not logger.isEnabledFor(level):
        return
    if exc_info:
        if isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        elif not isinstance(exc_info, tuple):
            exc_info = sys.exc_info()
    record = logger.makeRecord(logger.name, level, filename, lineno, msg, args,
                               exc_info or None, func, extra, None)
    logger.handle(record)
