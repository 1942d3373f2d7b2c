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
from typing import Any, Callable, Iterable, Iterator

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


def _split_topics(words: Iterable[Any]) -> tuple[list[str], list[str]]:
    """The topics named by ``words`` ("all" names every topic), and the words that name none.

    Case and surrounding blanks do not matter; empty words are skipped.
    """
    topics: list[str] = []
    unknown: list[str] = []
    for raw in words:
        if not isinstance(raw, str):
            raise UnknownOptionError(
                f"agspeed.config.log takes topic names (str), not {type(raw).__name__}"
            )
        word = raw.strip().lower()
        if not word:
            continue
        if word == "all":
            topics.extend(_log.TOPICS)
        elif word in _log.TOPICS:
            topics.append(word)
        else:
            unknown.append(word)
    return topics, unknown


def _parse_topics(text: str) -> frozenset[str]:
    """AGSPEED_LOG: unknown topics are reported and dropped, the rest kept.

    Lenient on purpose: a typo in an environment variable must not stop a program, nor
    cost it the topics that were spelled right.
    """
    topics, unknown = _split_topics(text.split(","))
    for word in unknown:
        _warn_once(
            f"AGSPEED_LOG: unknown topic {word!r} ignored; "
            f"topics are {', '.join(_log.TOPICS)} or all"
        )
    return frozenset(topics)


def _check_topics(value: str | Iterable[str]) -> frozenset[str]:
    """``log`` given from Python (a comma list or a collection of names): strict.

    A name that is no topic raises, as any bad argument does; nothing is dropped silently.
    """
    words = value.split(",") if isinstance(value, str) else value
    topics, unknown = _split_topics(words)
    if unknown:
        raise ValueError(
            f"unknown log topic{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; topics are {', '.join(_log.TOPICS)} or all"
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


def _check_positive_int(value: int) -> int:
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _parse_positive_int(text: str) -> int:
    return _check_positive_int(int(text.strip()))


def _check_count(value: int) -> int:
    if isinstance(value, bool) or value < 0:
        raise ValueError(f"expected a whole number 0 or more, not {value!r}")
    return value


def _parse_count(text: str) -> int:
    return _check_count(int(text.strip()))


def _check_backend(value: str | None) -> str | None:
    return None if value is None else _parse_backend(value)


def _default_cache_dir() -> str:
    try:
        from platformdirs import user_cache_dir
    except ImportError:  # platformdirs is a dependency; this keeps a broken env importable
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                ".cache")
        return os.path.join(base, "agspeed")
    return user_cache_dir("agspeed", appauthor=False)


def _parse_names(text: str) -> tuple[str, ...] | None:
    """AGSPEED_AUTOTUNE_CANDIDATES: a comma list of backend names; empty: the default."""
    from agspeed.backends import candidate_names

    names = [w.strip() for w in text.split(",") if w.strip()]
    return candidate_names(names) if names else None


def _check_names(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):  # a comma list, as in the environment
        return _parse_names(value)
    if any(not isinstance(v, str) for v in value):
        raise ValueError("candidates are backend names (str)")
    return _parse_names(",".join(value))


def _parse_seconds(text: str) -> float:
    return _check_seconds(float(text.strip()))


def _check_seconds(value: float) -> float:
    if not value > 0:
        raise ValueError("must be a positive number of seconds")
    return float(value)


@dataclass(frozen=True)
class Knob:
    """One setting: its environment variable, default, parsers and meaning.

    ``parse`` reads the environment variable's text (and text given from Python for a knob
    whose ``types`` have no ``str``); ``check`` validates and normalizes a value of one of
    ``types`` given from Python.  Both raise ValueError on a bad value.
    """

    name: str
    env: str
    default: Callable[[], Any]
    parse: Callable[[str], Any]
    types: tuple
    check: Callable[[Any], Any]
    doc: str


def _same(value: Any) -> Any:
    return value


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("disable", "AGSPEED_DISABLE", lambda: False, _parse_bool, (bool,), _same,
             "turn the runtime off: optimize() returns its argument, existing "
             "optimized objects run plain eager"),
        Knob("log", "AGSPEED_LOG", frozenset, _parse_topics,
             (str, frozenset, builtins.set, list, tuple), _check_topics,
             "comma list of log topics (" + ", ".join(_log.TOPICS) + ") or all"),
        Knob("backend", "AGSPEED_BACKEND", lambda: None, _parse_backend, (str, type(None)),
             _check_backend, "backend name that overrides the one given to optimize()"),
        Knob("cache_dir", "AGSPEED_CACHE_DIR", _default_cache_dir, _parse_path, (str,),
             _parse_path, "directory of the knowledge base: tuning results per graph and "
             "compiled artifacts (inductor's caches)"),
        Knob("autotune_candidates", "AGSPEED_AUTOTUNE_CANDIDATES", lambda: None,
             _parse_names, (str, tuple, list, type(None)), _check_names,
             "comma list of the backends the autotuner tries (eager is always one); "
             "empty: the default for the graph's device"),
        Knob("tune_budget", "AGSPEED_TUNE_BUDGET", lambda: 600.0, _parse_seconds,
             (int, float), _check_seconds,
             "seconds the autotuner may spend on one graph; a candidate whose compile "
             "raises or runs past it is skipped and logged"),
        Knob("tune_after", "AGSPEED_TUNE_AFTER", lambda: 2, _parse_positive_int,
             (int,), _check_positive_int,
             "the call of a graph on which the autotuner tunes it (the calls before run "
             "it as captured): 2 leaves a graph called once uncompiled; 1 tunes on the "
             "call that captured it"),
        Knob("retune", "AGSPEED_RETUNE", lambda: False, _parse_bool, (bool,), _same,
             "tune every graph again, ignoring (and then overwriting) the knowledge "
             "base's choices"),
        Knob("progress", "AGSPEED_PROGRESS", lambda: True, _parse_bool, (bool,), _same,
             "show a progress bar on stderr while tuning takes more than a second "
             "(only when stderr is a terminal)"),
        Knob("confirm_steps", "AGSPEED_CONFIRM_STEPS", lambda: 5, _parse_count, (int,),
             _check_count,
             "training steps of each (the autotuner's choice and eager, in turns) on which "
             "a training graph's choice is checked on the program's own loop before it "
             "is kept for good; 0: the graph-level measurement alone decides"),
        Knob("ddp_tune_steps", "AGSPEED_DDP_TUNE_STEPS", lambda: 5, _parse_count,
             (int,), _check_count,
             "training steps each candidate cut of a DDP graph is measured for before "
             "one is chosen (the knowledge base remembers it); 0: DDP's bucket rule, "
             "unmeasured"),
        Knob("ddp_wait", "AGSPEED_DDP_WAIT", lambda: 60.0, _parse_seconds, (int, float),
             _check_seconds,
             "seconds a DDP rank waits for the other ranks' word on how to cut a graph "
             "before deciding alone (a rank whose batches took another shape never "
             "compiles that graph)"),
        Knob("recompile_limit", "AGSPEED_RECOMPILE_LIMIT", lambda: 8, _parse_positive_int,
             (int,), _check_positive_int,
             "most entries captured for one function (evicted ones included) before "
             "it runs eager"),
        Knob("cache_size_limit", "AGSPEED_CACHE_SIZE_LIMIT", lambda: 64, _parse_positive_int,
             (int,), _check_positive_int,
             "most cache entries kept for one function: a new one beyond it evicts the "
             "least recently used (logged under 'recompiles'); evicted entries still "
             "count toward recompile_limit"),
        Knob("dynamic_after", "AGSPEED_DYNAMIC_AFTER", lambda: 3, _parse_positive_int,
             (int,), _check_positive_int,
             "distinct sizes a data input's dimension shows across one function's "
             "captures before it becomes dynamic (one graph with a symbolic size serves "
             "every later size); optimize(dynamic=False) turns this off"),
        Knob("assume_branches", "AGSPEED_ASSUME_BRANCHES", lambda: True, _parse_bool,
             (bool,), _same,
             "where one way of a branch on a tensor's value only raises (`if not "
             "valid.all(): raise ...`), capture the other way and check the tensor "
             "after the graph (the frame runs eager where it fails); off: such a "
             "branch is a graph break"),
        Knob("guard_parameters", "AGSPEED_GUARD_PARAMETERS", lambda: False, _parse_bool,
             (bool,), _same,
             "check parameters' and buffers' dtype, device, shape, strides and "
             "requires_grad on every call, also while the model's structure is "
             "unchanged (sees `p.data = other`); off: an unchanged model costs a "
             "constant number of checks"),
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
    """``value`` for knob ``name`` given from Python, validated and normalized; raises if bad."""
    knob = KNOBS.get(name)
    if knob is None:
        raise UnknownOptionError(f"agspeed.config has no knob {name!r}; knobs: {', '.join(KNOBS)}")
    if isinstance(value, str) and str not in knob.types:
        validate = knob.parse  # text parses as in the environment
    elif isinstance(value, knob.types) and not (bool not in knob.types
                                                and isinstance(value, bool)):
        validate = knob.check
    else:
        raise UnknownOptionError(
            f"agspeed.config.{name} takes {' or '.join(t.__name__ for t in knob.types)}, "
            f"not {type(value).__name__}"
        )
    try:
        return validate(value)
    except ValueError as exc:
        raise ValueError(f"agspeed.config.{name}={value!r}: {exc}") from None


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
