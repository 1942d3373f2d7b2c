"""Capture contexts: what the C frame hook asks when a code object has no cached decision.

A ``Context`` is the callable the hook calls as ``ctx(code, f_locals, f_globals,
f_builtins)`` on a cache miss, with the frame's bound locals by name.  It answers with an ``agspeed._C.CacheEntry``:

* ``SKIP`` for code the runtime never captures: its own code, torch's internals, the
  standard library, frozen modules.  The mark is kept on the code object, so a later frame
  of it costs one flag test in C, in every context.
* ``CALL`` for user code that the symbolic interpreter captured whole (``agspeed._capture``):
  a graph compiled by the context's backend, guarded on everything the capture assumed.
* ``RUN_EAGER`` for the rest of user code: a graph break (logged under ``graph_breaks``),
  no tensor work, the recompile limit reached, or torch not imported.  The frame runs its
  own bytecode and only its callees pass through the hook.

The decision is cached on the code object by the hook, so a second call of the same code
costs no Python call at all.  An internal error while deciding never changes what the
user's program computes: it is logged and the code is skipped.

Contexts are shared: ``context_for`` returns one object per (backend, options), so entries
cached for one optimized object are valid for another optimized with the same settings.
"""

from __future__ import annotations

import collections
import importlib.util
import logging
import os
import sys
import sysconfig
import threading
import weakref
from typing import Any, NamedTuple

from agspeed import _C, log

__all__ = ["Context", "context_for", "FrameRecord", "frame_records", "clear", "recompiles",
           "RecompileRecord"]

_frames_log = log.get("frames")
_graph_breaks_log = log.get("graph_breaks")
_graphs_log = log.get("graphs")
_recompiles_log = log.get("recompiles")
_recompiles_verbose_log = log.get("recompiles_verbose")
_guards_log = log.get("guards")
_internal_log = logging.getLogger("agspeed")


class FrameRecord(NamedTuple):
    """One frame the runtime decided about: where it is, its locals, and the decision."""

    name: str
    filename: str
    firstlineno: int
    locals: tuple  # ((name, short description of the value), ...)
    decision: str
    code: Any  # weakref.ref to the code object

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.locals)
        where = f"{os.path.basename(self.filename)}:{self.firstlineno}"
        return f"{self.name} ({where}) [{args}] -> {self.decision}"


_RECORDS: collections.deque[FrameRecord] = collections.deque(maxlen=1024)
_records_lock = threading.Lock()


def frame_records() -> list[FrameRecord]:
    """The most recent frames decided about (at most 1024), oldest first."""
    with _records_lock:
        return list(_RECORDS)


def clear() -> None:
    """Forget recorded frames and shared contexts (``agspeed.reset``)."""
    with _records_lock:
        _RECORDS.clear()
        _RECOMPILES.clear()
    for ctx in list(_CONTEXTS.values()):
        ctx._evicted.clear()
    _CONTEXTS.clear()


def _describe(value: Any) -> str:
    """A short description of a local for records and logs.

    It must run no code of the user's: no attribute access on the value, which could
    reach a ``__getattr__`` (eager would not have run it, and it may not be ready: the
    frame has not started).  Only exact tensors and parameters, whose metadata is read
    in C, are described beyond their type's name.
    """
    kind = type(value)
    torch = sys.modules.get("torch")
    if torch is not None and kind in (torch.Tensor, torch.nn.Parameter):
        dims = ",".join(str(d) for d in value.shape)
        return f"{kind.__name__}[{str(value.dtype).replace('torch.', '')}]({dims})"
    return kind.__name__


def _package_dir(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(list(spec.submodule_search_locations)[0]) + os.sep


def _runtime_prefixes() -> tuple[str, ...]:
    own = os.path.dirname(os.path.realpath(__file__)) + os.sep
    found = (_package_dir(p) for p in ("agspeed.guards", "agspeed.backends", "torch", "functorch"))
    return tuple(dict.fromkeys([own, *(f for f in found if f)]))


def _stdlib_prefixes() -> tuple[str, ...]:
    paths = (sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib"))
    return tuple(dict.fromkeys(os.path.realpath(p) + os.sep for p in paths if p))


_RUNTIME_PREFIXES = _runtime_prefixes()
_STDLIB_PREFIXES = _stdlib_prefixes()
_THIRD_PARTY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def is_runtime_code(filename: str) -> bool:
    """True for code agspeed never captures: its own, torch's, the standard library's."""
    if filename.startswith("<frozen"):
        return True
    if not os.path.isabs(filename):
        return False  # <string>, <stdin>, notebook cells: user code
    path = os.path.realpath(filename)
    if path.startswith(_RUNTIME_PREFIXES):
        return True
    # A plain install keeps site-packages inside the standard library's directory.
    return path.startswith(_STDLIB_PREFIXES) and not any(m in path for m in _THIRD_PARTY_MARKERS)


def _is_namedtuple_new(code: Any, f_globals: dict) -> bool:
    """The ``__new__`` that ``collections.namedtuple`` compiles for each class: library
    code (it builds a tuple), though its file is ``<string>``."""
    name = f_globals.get("__name__")
    return code.co_filename == "<string>" and type(name) is str and \
        name.startswith("namedtuple_")


_SKIP = _C.ACTION_SKIP
_RUN_EAGER = _C.ACTION_RUN_EAGER


class Context:
    """The capture context of optimized objects sharing one backend and option set."""

    __slots__ = ("backend_name", "backend", "options", "observer", "_evicted",
                 "_history", "__weakref__")

    def __init__(self, backend_name: str, backend: Any, options: dict[str, Any],
                 observer: Any = None):
        self.backend_name = backend_name
        self.backend = backend
        self.options = dict(options)
        # Called as observer(kind, code, payload) for every decision about a user frame:
        # ("graph", code, Capture), ("break", code, CaptureBreak), ("eager", code, why).
        self.observer = observer
        # code -> entries of it evicted under the cache size limit (they still count
        # toward the recompile limit, so a cycle of shapes cannot recompile forever)
        self._evicted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # code -> _shapes.ShapeHistory: the sizes its data inputs showed at captures,
        # which decide when a dimension that keeps changing becomes dynamic
        self._history: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in sorted(self.options.items()))
        return f"<agspeed context backend={self.backend_name}{opts}>"

    def __call__(self, code: Any, f_locals: dict, f_globals: dict, f_builtins: dict) -> Any:
        try:
            return self._decide(code, f_locals, f_globals, f_builtins)
        except Exception:  # an agspeed bug must not change the user's program
            _internal_log.warning(
                "agspeed: internal error while deciding about %s (%s:%s); it runs eager",
                code.co_name, code.co_filename, code.co_firstlineno, exc_info=True,
            )
            return _C.CacheEntry(_SKIP)

    def _decide(self, code: Any, f_locals: dict, f_globals: dict, f_builtins: dict) -> Any:
        if is_runtime_code(code.co_filename) or _is_namedtuple_new(code, f_globals):
            if log.enabled("frames"):
                _frames_log.info("%s (%s:%s) -> skip (runtime code)", code.co_name,
                                 os.path.basename(code.co_filename), code.co_firstlineno)
            return _C.CacheEntry(_SKIP)
        entry, decision = self._capture(code, f_locals, f_globals, f_builtins)
        record = FrameRecord(
            code.co_name, code.co_filename, code.co_firstlineno,
            tuple((k, _describe(v)) for k, v in f_locals.items()),
            decision, weakref.ref(code),
        )
        with _records_lock:
            _RECORDS.append(record)
        if log.enabled("frames"):
            _frames_log.info("%s", record)
        return entry

    def _capture(self, code: Any, f_locals: dict, f_globals: dict,
                 f_builtins: dict) -> tuple[Any, str]:
        """The entry for a user frame and the decision in words."""
        if "torch" not in sys.modules:
            return _C.CacheEntry(_RUN_EAGER), "run eager"
        from agspeed import config
        from agspeed._capture import Capture, capture, make_entry
        from agspeed._shapes import DimPolicy, history_of
        from agspeed._tensor_check import arg_check
        from agspeed.backends import supports_dynamic

        where = f"{code.co_name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"
        # Each context counts its own entries: another optimized object's recompiles of
        # this code are not this one's.
        entries = [e for e in _C.code_cache(code)["entries"] if e.context is self]
        observe = self.observer or _ignore
        evicted = self._evicted.get(code, 0)
        if len(entries) + evicted >= config.recompile_limit:
            _recompiles_log.info("%s hit the recompile limit (%d): it runs eager from now "
                                 "on", where, config.recompile_limit)
            observe("eager", code, "recompile limit")
            return _C.CacheEntry(_RUN_EAGER, context=self), "run eager (recompile limit)"
        if len(entries) >= config.cache_size_limit:
            self._evict_lru(code, where, entries)
        keep_dynamo_out()
        history = history_of(self._history, code)
        shapes = DimPolicy(self.options.get("dynamic"), config.dynamic_after, history,
                           f_locals, supports_dynamic(self.backend))
        result = capture(code, f_locals, f_globals, f_builtins, shapes)
        guard = result.guard if isinstance(result, Capture) else result[1]
        _record_sizes(history, guard, f_locals)
        if entries and isinstance(result, Capture):
            self._log_recompile(code, where, entries, f_locals, f_globals, f_builtins)
        if getattr(guard, "sym", None) is not None:
            self._went_dynamic(code, where, guard, shapes, entries)
        if not isinstance(result, Capture):
            brk, guard = result
            # Guarded like a graph: these inputs (and only these) run eager, and the
            # function is captured again for others.  The same break again, with only
            # plain values changed, widens the guard past those values.
            at = getattr(guard, "break_at", None)
            for old in entries:
                if at is not None and getattr(old.guard, "break_at", None) == at:
                    guard = guard.widened(old.guard)
            signed = getattr(guard, "sym", None) is None
            entry = _C.CacheEntry(_RUN_EAGER, guard=guard, context=self, signed=signed,
                                  arg_check=arg_check(code, f_locals) if signed else None)
            if brk is None:
                observe("eager", code, "no tensor work")
                return entry, "run eager (no tensor work)"
            observe("break", code, brk)
            if log.enabled("graph_breaks"):
                _graph_breaks_log.info("%s: %s", where, brk)
            return entry, f"run eager (graph break: {brk})"
        compiled = self._compile(result, where)
        if log.enabled("guards"):
            _guards_log.info("%s guards:\n  %s", where, "\n  ".join(result.guard.lines()))
        if log.enabled("graphs"):
            _graphs_log.info("%s captured:\n%s", where, result.graph_module.code)
        observe("graph", code, result)
        return make_entry(result, compiled, self, arg_check(code, f_locals)), "captured"

    def _compile(self, result: Any, where: str) -> Any:
        """The captured graph compiled by this context's backend (the autotuner for
        ``"auto"``); its own forward, with a warning saying why, when the backend could
        not take it.  The graph runs either way."""
        from agspeed.backends.autotune import compile_graph

        gm = result.graph_module
        gm.meta["agspeed_where"] = where
        gm.meta["agspeed_options"] = self.options
        compiled, failed = compile_graph(self.backend_name, self.backend, gm,
                                         result.example_inputs)
        if failed:
            _internal_log.warning("agspeed: %s: %s; its graph runs eagerly", where, failed)
        return compiled

    def _went_dynamic(self, code: Any, where: str, guard: Any, shapes: Any,
                      entries: list) -> None:
        """Say which dimensions a capture made dynamic and why, and drop this context's
        entries of ``code`` that the new one serves as well (the static graphs of sizes
        seen before the dimension went dynamic).  Those drops are replacements, not
        evictions: they do not count toward the recompile limit."""
        sym = guard.sym
        sizes = [(source, d, name) for (source, what, d), name in zip(sym.dims, sym.names)
                 if what == "size"]
        new = _record_dynamic(code, where, [name for _, _, name in sizes])
        for source, d, name in sizes:
            why = shapes.decided.get(source, {}).get(d, "dynamic")
            if name in new and log.enabled("recompiles"):
                _recompiles_log.info("%s: %s is dynamic from now on (%s): one graph "
                                     "serves every size of it", where, name, why)
        for name in _record_dynamic(code, where, sym.specialized, pinned=True):
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

    def _evict_lru(self, code: Any, where: str, entries: list) -> None:
        """Drop this context's least recently used entries of ``code`` down to one under
        the cache size limit, and say so."""
        from agspeed import config

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

    @staticmethod
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


class RecompileRecord(NamedTuple):
    """Recompiles of one function: how many, the guard that failed each time, how many
    entries the cache size limit evicted, and which dimensions went dynamic."""

    function: str   # "name (file:line)"
    count: int
    reasons: tuple  # the closest entry's first failing guard, per recompile (last 16)
    evictions: int = 0
    dynamic: tuple = ()  # dimensions made dynamic ("x.size(0)"), in order


_RECOMPILES: dict[Any, list] = {}   # weakref to code -> [where, count, reasons, ev, dyn]


def _recompile_row(code: Any, where: str) -> list:
    return _RECOMPILES.setdefault(weakref.ref(code),
                                  [where, 0, collections.deque(maxlen=16), 0, {}])


def _record_dynamic(code: Any, where: str, dims: list, pinned: bool = False) -> list:
    """Note dimensions made dynamic (or, ``pinned``, asked dynamic but fixed by the
    code); returns those not noted before."""
    with _records_lock:
        row = _recompile_row(code, where)[4]
        new = [name for name in dims if (name, pinned) not in row]
        for name in new:
            row[(name, pinned)] = None
    return new


def _record_sizes(history: Any, guard: Any, f_locals: dict) -> None:
    """Remember the sizes of the data inputs a capture's guard checks."""
    from agspeed._shapes import is_data_source

    for source, kind, expected in getattr(guard, "checks", ()):
        if kind in (0, 5) and is_data_source(source, f_locals):  # _TENSOR, _DYN
            history.record(source, expected[3])


def _record_recompile(code: Any, where: str, reason: str) -> None:
    with _records_lock:
        row = _recompile_row(code, where)
        row[1] += 1
        row[2].append(reason)


def _record_eviction(code: Any, where: str) -> None:
    with _records_lock:
        _recompile_row(code, where)[3] += 1


def recompiles() -> list[RecompileRecord]:
    """Every function that was captured again since ``agspeed.reset()``, most first."""
    with _records_lock:
        rows = [RecompileRecord(w, n, tuple(r), ev,
                                tuple(name for name, pinned in dyn if not pinned))
                for key, (w, n, r, ev, dyn) in _RECOMPILES.items() if key() is not None]
    return sorted(rows, key=lambda r: -r.count)


def _ignore(kind: str, code: Any, payload: Any) -> None:
    pass


_dynamo_told = False


def keep_dynamo_out() -> None:
    """Ask torch._dynamo, if it is loaded, never to trace agspeed's own code.

    Guards and compiled entries run Python inside another tool's evaluation function
    when a ``torch.compile``-d function calls an optimized one; that tool must treat
    them as the runtime internals they are.
    """
    global _dynamo_told
    if _dynamo_told or "torch._dynamo" not in sys.modules:
        return
    try:
        from torch._dynamo import trace_rules

        for name in ("agspeed", "agspeed.guards", "agspeed.backends"):
            trace_rules.add(name)
    except Exception:  # an older or newer torch without this API: nothing to do
        pass
    _dynamo_told = True


_CONTEXTS: dict[tuple, Context] = {}
_contexts_lock = threading.Lock()


def context_for(backend_name: str, backend: Any, options: dict[str, Any]) -> Context:
    """The shared context for this backend (by identity) and these options."""
    keep_dynamo_out()
    key = (backend_name, id(backend), tuple(sorted(options.items())))
    with _contexts_lock:
        ctx = _CONTEXTS.get(key)
        if ctx is None or ctx.backend is not backend:
            ctx = _CONTEXTS[key] = Context(backend_name, backend, options)
        return ctx
