"""Which cache entries of a function one capture context keeps.

The decisions about entries, apart from making them:

* ``recompile_limit`` (``agspeed.config``): a function captured that many times for one
  object (the arguments its guards check by identity, a method's ``self``), evicted
  entries included, runs eager for that object from then on, so a cycle of more shapes
  than fit cannot recompile forever; other instances of the class go on being captured.
* Freed objects: an entry whose guard checks a freed object by identity can never pass
  again; it is evicted at the next capture and counts toward nothing.
* ``cache_size_limit``: a new entry beyond it evicts the least recently used one
  (``CacheEntry.last_used``, a clock ticked by every hit and insert), with a log line.
* Dynamic replacement: a capture that made a dimension dynamic drops the static entries
  it serves as well (``Guard.covers``).  Those are replacements, not evictions: they do
  not count toward the recompile limit.
* Widening: a graph break that recurs where only plain values changed gets one eager
  entry for every value of them (``Guard.widened``).

It also keeps what the decisions are made from and what they leave behind: per code
object, the sizes its data inputs showed at captures (``_shapes.ShapeHistory``, which
makes a dimension that keeps changing dynamic), and per function, the recompiles,
evictions and dynamic dimensions that ``agspeed.recompiles()`` reports and the
``recompiles`` log topic prints.

Every count is per context: another optimized object's entries of the same code are not
this one's.  Nothing here imports torch.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any, NamedTuple

from agspeed import _C, config, log
from agspeed._shapes import DimPolicy, from_locals, history_of, is_data_source, scalar_parts
from agspeed._sources import describe
from agspeed.guards.guard import SameObjects
from agspeed.protocol import Check

__all__ = ["EntryPolicy", "RecompileRecord", "recompiles", "widened", "clear"]

_recompiles_log = log.get("recompiles")
_recompiles_verbose_log = log.get("recompiles_verbose")


class EntryPolicy:
    """The entry decisions of one context, and the state per code object they need."""

    __slots__ = ("_evicted", "_history")

    def __init__(self) -> None:
        # code -> entries of it evicted under the cache size limit (they still count
        # toward the recompile limit, so a cycle of shapes cannot recompile forever)
        self._evicted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # code -> _shapes.ShapeHistory: the sizes its data inputs showed at captures,
        # which decide when a dimension that keeps changing becomes dynamic
        self._history: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def forget_evictions(self) -> None:
        """Start counting evictions again (``agspeed.reset``)."""
        self._evicted.clear()

    def drop_gone(self, code: Any, entries: list) -> list:
        """``entries`` less those whose guard checks an object that has been freed (a
        model deleted, a sweep's earlier model): they are evicted from the cache, and
        count toward nothing."""
        live = []
        for entry in entries:
            gone = getattr(entry.guard, "gone", None)
            if gone is not None and gone():
                _C.evict(code, entry)
            else:
                live.append(entry)
        return live

    def at_recompile_limit(self, code: Any, where: str, entries: list,
                           f_locals: dict, passes: int = 0) -> Any:
        """None while ``code`` may be captured again for this frame; else the guard of
        the eager entry that serves the frame's object from now on (said in the
        ``recompiles`` log).  ``passes``: entries on top of the limit that are not
        recompiles (a resume function inside a loop has one per pass).

        The count is per object: only the entries captured for the objects this frame
        is called with (its arguments checked by identity, a method's ``self``) count,
        so that optimizing many instances of one class, alive together or one after
        another, does not run the later ones eager."""
        mine = [e for e in entries if _serves(e.guard, f_locals)]
        if len(mine) + self._evicted.get(code, 0) < config.recompile_limit + passes:
            return None
        _recompiles_log.info("%s hit the recompile limit (%d): it runs eager from now "
                             "on", where, config.recompile_limit)
        identities = getattr(mine[-1].guard, "identities", None) if mine else None
        return SameObjects(identities() if identities is not None else ())

    def dimensions(self, code: Any, mode: bool | None, f_locals: dict,
                   supported: bool, floats: bool = False) -> DimPolicy:
        """Which dimensions (and plain ints and floats) the next capture of ``code``
        makes dynamic: ``mode`` is ``optimize(dynamic=...)``, ``supported`` whether the
        backend takes symbolic sizes, ``floats`` whether it takes float symbols."""
        return DimPolicy(mode, config.dynamic_after, history_of(self._history, code),
                         f_locals, supported, floats)

    def admit(self, code: Any, where: str, entries: list, guard: Any, shapes: DimPolicy,
              captured: bool, frame: tuple) -> None:
        """Make room for the entry of a new capture of ``code`` and keep its records.

        ``entries``: this context's entries of ``code`` (evicted and replaced ones are
        removed from the cache, and evicted ones from the list); ``guard``: the new
        entry's; ``captured``: whether it is a graph (a recompile is logged only for
        one); ``frame``: the frame's ``(f_locals, f_globals, f_builtins)``.
        """
        if len(entries) >= config.cache_size_limit:
            self._evict_lru(code, where, entries)
        _record_sizes(shapes, guard, frame[0])
        if entries and captured:
            _log_recompile(code, where, entries, *frame)
        if getattr(guard, "sym", None) is not None or getattr(guard, "floats", ()):
            _went_dynamic(code, where, guard, shapes, entries)

    def _evict_lru(self, code: Any, where: str, entries: list) -> None:
        """Drop this context's least recently used entries of ``code`` down to one under
        the cache size limit, and say so."""
        while len(entries) >= config.cache_size_limit:
            lru = min(entries, key=lambda e: e.last_used)
            entries.remove(lru)
            if not _C.evict(code, lru):
                continue
            self._evicted[code] = self._evicted.get(code, 0) + 1
            _record_eviction(code, where)
            lines = lru.guard.lines() if hasattr(lru.guard, "lines") else ()
            first = lines[0] if lines else "(no guard)"
            _recompiles_log.info("%s: cache size limit (%d) reached: evicted the least "
                                 "recently used entry (%d hits; %s)", where,
                                 config.cache_size_limit, lru.hits, first)


def _serves(guard: Any, f_locals: dict) -> bool:
    """Whether an entry with ``guard`` was captured for the objects of this frame."""
    identities = getattr(guard, "identities", None)
    return identities is None or SameObjects(identities())(f_locals, {}, {})


def widened(guard: Any, entries: list) -> Any:
    """The guard of the eager entry at a graph break: ``guard``, less the plain-value
    checks of earlier entries that stopped at the same break (``Guard.widened``)."""
    at = getattr(guard, "break_at", None)
    for old in entries:
        if at is not None and getattr(old.guard, "break_at", None) == at:
            guard = guard.widened(old.guard)
    return guard


def _went_dynamic(code: Any, where: str, guard: Any, shapes: DimPolicy,
                  entries: list) -> None:
    """Say which dimensions a capture made dynamic and why, and drop this context's
    entries of ``code`` that the new one serves as well (the static graphs of sizes seen
    before the dimension went dynamic).  Those drops are replacements, not evictions:
    they do not count toward the recompile limit."""
    sym = guard.sym
    sizes = [] if sym is None else \
        [(source, what, d, name) for (source, what, d), name in zip(sym.dims, sym.names)
         if what in ("size", "int")]
    sizes += [(source, "float", None, describe(source)) for source in guard.floats]
    new = _record_dynamic(code, where, [name for *_, name in sizes])
    for source, what, d, name in sizes:
        why = shapes.scalars.get(source, "dynamic") if what in ("int", "float") else \
            shapes.decided.get(source, {}).get(d, "dynamic")
        if name in new and log.enabled("recompiles"):
            _recompiles_log.info("%s: %s is dynamic from now on (%s): one graph "
                                 "serves every %s of it", where, name, why,
                                 "size" if what == "size" else "value")
    for name in _record_dynamic(code, where, sym.specialized if sym else (), pinned=True):
        if log.enabled("recompiles"):
            _recompiles_log.info("%s: %s was made dynamic but the code fixes it to "
                                 "one value (a size guard pins it): it stays static",
                                 where, name)
    replaced = 0
    for old in entries:
        if guard.covers(old.guard) and _C.evict(code, old):
            replaced += 1
    if replaced and log.enabled("recompiles"):
        _recompiles_log.info("%s: the dynamic graph replaces %d static entr%s",
                             where, replaced, "y" if replaced == 1 else "ies")


def _log_recompile(code: Any, where: str, entries: list, f_locals: dict,
                   f_globals: dict, f_builtins: dict) -> None:
    """Record (and log) why none of ``entries`` served this frame."""
    failures = []
    for entry in entries:
        guard = entry.guard
        failures.append(guard.failures(f_locals, f_globals, f_builtins)
                        if hasattr(guard, "failures") else ["(no guard details)"])
    # The entry that failed the fewest checks is the one this call nearly was; its
    # reason is what its C program found failing first.
    at = min(range(len(failures)), key=lambda k: len(failures[k]) or 1 << 30)
    closest = failures[at]
    first = entries[at].guard.first_failure(f_locals, f_globals, f_builtins) \
        if hasattr(entries[at].guard, "first_failure") else None
    reason = first or (closest[0] if closest else "(every guard passes now: a guard "
                                                  "changed while it ran)")
    _record_recompile(code, where, reason)
    if log.enabled("recompiles"):
        more = f" (+{len(closest) - 1} more)" if len(closest) > 1 else ""
        _recompiles_log.info("%s: recompiling, %d entr%s cached; the closest failed: "
                             "%s%s", where, len(entries),
                             "y" if len(entries) == 1 else "ies", reason, more)
    if log.enabled("recompiles_verbose"):
        for n, why in enumerate(failures, 1):
            _recompiles_verbose_log.info("%s: recompiling: entry %d of %d failed: %s",
                                         where, n, len(entries),
                                         "; ".join(why) or "(passes now)")


def _record_sizes(shapes: DimPolicy, guard: Any, f_locals: dict) -> None:
    """Remember the sizes of the data inputs a capture's guard checks, and the values of
    the plain ints and floats it checks that the frame reaches through its locals.  One
    this capture made a symbol that its guard still checks by value was fixed by the code
    (a branch, a loop over it): it is never made a symbol again."""
    history = shapes.history
    if history is None:
        return
    for source, kind, expected in getattr(guard, "checks", ()):
        if kind in (Check.TENSOR, Check.DYNTENSOR) and is_data_source(source, f_locals):
            history.record(source, expected[3])
        elif kind == Check.EQ and from_locals(source):
            for part, value in scalar_parts(source, expected[1]):
                if part in shapes.scalars:
                    history.pin(part)
                elif part not in history.pinned:
                    history.record_scalar(part, value)


# -- Records for agspeed.recompiles() ------------------------------------------------


class RecompileRecord(NamedTuple):
    """Recompiles of one function: how many, the guard that failed each time, how many
    entries the cache size limit evicted, and which dimensions went dynamic."""

    function: str   # "name (file:line)"
    count: int
    reasons: tuple  # the closest entry's first failing guard, per recompile (last 16)
    evictions: int = 0
    dynamic: tuple = ()  # dimensions made dynamic ("x.size(0)"), in order


_RECOMPILES: dict[Any, list] = {}   # weakref to code -> [where, count, reasons, ev, dyn]
_lock = threading.Lock()


def _recompile_row(code: Any, where: str) -> list:
    return _RECOMPILES.setdefault(weakref.ref(code),
                                  [where, 0, collections.deque(maxlen=16), 0, {}])


def _record_dynamic(code: Any, where: str, dims: list, pinned: bool = False) -> list:
    """Note dimensions made dynamic (or, ``pinned``, asked dynamic but fixed by the
    code); returns those not noted before."""
    with _lock:
        row = _recompile_row(code, where)[4]
        new = [name for name in dims if (name, pinned) not in row]
        for name in new:
            row[(name, pinned)] = None
    return new


def _record_recompile(code: Any, where: str, reason: str) -> None:
    with _lock:
        row = _recompile_row(code, where)
        row[1] += 1
        row[2].append(reason)


def _record_eviction(code: Any, where: str) -> None:
    with _lock:
        _recompile_row(code, where)[3] += 1


def recompiles() -> list[RecompileRecord]:
    """Every function that was captured again since ``agspeed.reset()``, most first."""
    with _lock:
        rows = [RecompileRecord(w, n, tuple(r), ev,
                                tuple(name for name, pinned in dyn if not pinned))
                for key, (w, n, r, ev, dyn) in _RECOMPILES.items() if key() is not None]
    return sorted(rows, key=lambda r: -r.count)


def clear() -> None:
    """Forget the records of every function (``agspeed.reset``)."""
    with _lock:
        _RECOMPILES.clear()
