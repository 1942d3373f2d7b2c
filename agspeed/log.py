"""Log topics: one child logger of ``agspeed`` per topic, switched on by ``AGSPEED_LOG``.

``AGSPEED_LOG=frames,recompiles`` (or ``all``) sets those topics' loggers to DEBUG and,
unless the application already attached a handler to the ``agspeed`` logger, attaches
one that writes ``[agspeed.<topic>] message`` lines to stderr.  Topics that are off stay
at WARNING, so their messages cost one level check.  Messages are emitted at INFO.

Code that builds an expensive message checks ``enabled(topic)`` first.
"""

from __future__ import annotations

import logging
import sys
from typing import Iterable

__all__ = ["TOPICS", "enabled", "get", "configure"]

#: Every topic, with what it reports.
TOPICS = {
    "frames": "each frame the runtime decides about, and the decision",
    "guards": "the guards of every new cache entry",
    "recompiles": "each cache miss that compiles again, and the guard that failed",
    "recompiles_verbose": "on each recompile, every failing guard of every cached entry",
    "graphs": "each captured graph",
    "graph_breaks": "where and why capture of a frame stopped",
    "autotune": "each graph's tuning table (or the knowledge base's answer) and the winner",
}

ROOT = logging.getLogger("agspeed")
_handler: logging.Handler | None = None
_enabled: frozenset[str] = frozenset()


def get(topic: str) -> logging.Logger:
    """The logger of ``topic`` (``agspeed.<topic>``)."""
    if topic not in TOPICS:
        raise ValueError(f"unknown log topic {topic!r}; topics are {', '.join(TOPICS)}")
    return logging.getLogger(f"agspeed.{topic}")


def enabled(topic: str) -> bool:
    """True when ``topic`` is switched on."""
    return topic in _enabled


def configure(topics: Iterable[str]) -> None:
    """Switch exactly ``topics`` on (the others off). Called by ``agspeed.config``."""
    global _handler, _enabled
    _enabled = frozenset(topics)
    for topic in TOPICS:
        get(topic).setLevel(logging.DEBUG if topic in _enabled else logging.WARNING)
    if _enabled and _handler is None and not ROOT.handlers:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        ROOT.addHandler(_handler)
        ROOT.propagate = False
    elif not _enabled and _handler is not None:
        ROOT.removeHandler(_handler)
        ROOT.propagate = True
        _handler = None
