"""Every knob of agspeed, in one place.

Each knob has an environment variable, read when agspeed is imported and again by
``reload()``; a value set in Python (``set()``) or inside a ``with override(...)``
block wins over the environment until the next ``reload()`` or the end of the block.
A malformed environment value warns once (``agspeed.ConfigWarning``) and the knob keeps
its default; it never raises.  A bad value given from Python raises, like any bad
argument.  docs/env_vars.md lists the same table for users.

Read a knob as an attribute: ``agspeed.config.backend``.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from agspeed import _C
from agspeed import log as _log
from agspeed.errors import ConfigWarning, UnknownOptionError

__all__ = ["KNOBS", "reload", "set", "override", "snapshot"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE - {''})}")


def _parse_topics(text: str) -> frozenset[str]:
    """Comma list of topics; unknown ones are reported and dropped, the rest kept."""
    topics: list[str] = []
    for raw in text.split(","):
        word = raw.strip().lower()
        if not word:
            continue
        if word == "all":
            topics.extend(_log.TOPICS)
        elif word in _log.TOPICS:
            topics.append(word)
        else:
            _warn_once(
                f"AGSPEED_LOG: unknown topic {word!r} ignored; "
                f"topics are {', '.join(_log.TOPICS)} or all"
            )
    return frozenset(topics)


def _parse_backend(text: str) -> str | None:
    name = text.strip()
    if not name:
        return None
    from agspeed.backends import list_backends

    known = list_backends()
    if name not in known:
        raise ValueError(f"no backend named {name!r}; known: {', '.join(known)}")
    return name


def _parse_path(text: str) -> str:
    path = text.strip()
    if not path:
        raise ValueError("empty path")
    return os.path.abspath(os.path.expanduser(path))


def _parse_positive_int(text: str) -> int:
    value = int(text.strip())
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "agspeed")


@dataclass(frozen=True)
class Knob:
    """One setting: its environment variable, default, parser and meaning."""

    name: str
    env: str
    default: Callable[[], Any]
    parse: Callable[[str], Any]
    types: tuple
    doc: str


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("disable", "AGSPEED_DISABLE", lambda: False, _parse_bool, (bool,),
             "turn the runtime off: optimize() returns its argument, existing "
             "optimized objects run plain eager"),
        Knob("log", "AGSPEED_LOG", frozenset, _parse_topics, (frozenset, builtins.set, list, tuple),
             "comma list of log topics (" + ", ".join(_log.TOPICS) + ") or all"),
        Knob("backend", "AGSPEED_BACKEND", lambda: None, _parse_backend, (str, type(None)),
             "backend name that overrides the one given to optimize()"),
        Knob("cache_dir", "AGSPEED_CACHE_DIR", _default_cache_dir, _parse_path, (str,),
             "directory of the persistent cache (tuning results)"),
        Knob("recompile_limit", "AGSPEED_RECOMPILE_LIMIT", lambda: 8, _parse_positive_int,
             (int,), "most cache entries compiled for one function before it runs eager"),
    )
}

_values: dict[str, Any] = {}
_warned: builtins.set[str] = builtins.set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, ConfigWarning, stacklevel=3)


def _from_env(knob: Knob) -> Any:
    text = os.environ.get(knob.env)
    if text is None:
        return knob.default()
    try:
        return knob.parse(text)
    except ValueError as exc:
        _warn_once(f"{knob.env}={text!r} ignored ({exc}); using the default")
        return knob.default()


def _check(name: str, value: Any) -> Any:
    knob = KNOBS.get(name)
    if knob is None:
        raise UnknownOptionError(f"agspeed.config has no knob {name!r}; knobs: {', '.join(KNOBS)}")
    if isinstance(value, str) and str not in knob.types:
        return knob.parse(value)
    if not isinstance(value, knob.types) or (knob.types == (int,) and isinstance(value, bool)):
        raise UnknownOptionError(
            f"agspeed.config.{name} takes {' or '.join(t.__name__ for t in knob.types)}, "
            f"not {type(value).__name__}"
        )
    if name == "log":
        return _parse_topics(",".join(value))
    if name == "backend" and value is not None:
        return _parse_backend(value)
    if name == "recompile_limit" and value < 1:
        raise ValueError("agspeed.config.recompile_limit must be at least 1")
    return value


def _apply() -> None:
    _C.set_enabled(not _values["disable"])
    _log.configure(_values["log"])


def reload() -> None:
    """Read every knob from the environment again, dropping values set from Python."""
    for knob in KNOBS.values():
        _values[knob.name] = _from_env(knob)
    _apply()


def set(**values: Any) -> None:  # noqa: A001 - the verb users expect
    """Set knobs from Python, e.g. ``agspeed.config.set(log="frames")``."""
    checked = {name: _check(name, value) for name, value in values.items()}
    _values.update(checked)
    _apply()


def snapshot() -> dict[str, Any]:
    """A copy of every knob's current value."""
    return dict(_values)


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Set knobs for the length of a ``with`` block, then restore them."""
    saved = snapshot()
    set(**values)
    try:
        yield
    finally:
        _values.clear()
        _values.update(saved)
        _apply()


def __getattr__(name: str) -> Any:
    try:
        return _values[name]
    except KeyError:
        raise AttributeError(f"agspeed.config has no knob {name!r}") from None
