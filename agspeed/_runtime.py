"""Capture contexts: what the C frame hook asks when a code object has no cached decision.

A ``Context`` is the callable the hook calls as ``ctx(code, f_locals, f_globals,
f_builtins)`` on a cache miss, with the frame's bound locals by name.  It answers with an
``agspeed._C.CacheEntry``:

* ``SKIP`` for code the runtime never captures: its own code, torch's internals, the
  standard library, frozen modules.  The mark is kept on the code object, so a later frame
  of it costs one flag test in C, in every context.
* ``CALL`` for user code that the symbolic interpreter captured whole (``agspeed._capture``):
  a graph compiled by the context's backend (``agspeed._compile``), guarded on everything
  the capture assumed.
* ``RUN_EAGER`` for the rest of user code: a graph break (logged under ``graph_breaks``),
  no tensor work, the recompile limit reached, or torch not imported.  The frame runs its
  own bytecode and only its callees pass through the hook.

This module owns the order of a miss (``Context._capture``) and the records of decisions
(``frame_records``); which entries of a function a context keeps (limits, eviction,
dynamic replacement) is ``agspeed._policy``'s, and making a graph's entry is
``agspeed._compile``'s.

The decision is cached on the code object by the hook, so a second call of the same code
costs no Python call at all.  An internal error while deciding never changes what the
user's program computes: it is logged and the code is skipped.  The one error a decision
raises on purpose is ``GraphBreakError``, for a break under ``optimize(...,
fullgraph=True)``: the hook throws it into the unstarted frame, so the user's call raises
it before the function runs, and no entry is cached, so the next call that breaks raises
again.

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

from agspeed import _C, _roots, log
from agspeed._compile import compiled_entry
from agspeed._ctx import runtime_work
from agspeed._policy import EntryPolicy, RecompileRecord, recompiles, widened
from agspeed._policy import clear as _clear_policy
from agspeed._resume import LOOP_ITEMS as _LOOP_PASSES
from agspeed._resume_code import in_loop as _resume_in_loop
from agspeed._resume_code import is_generated as is_break_code
from agspeed.errors import GraphBreakError
from agspeed.guards.state import in_transform

__all__ = ["Context", "context_for", "FrameRecord", "frame_records", "clear", "recompiles",
           "RecompileRecord"]

_frames_log = log.get("frames")
_graph_breaks_log = log.get("graph_breaks")
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
_records_total = 0  # records ever made: marks count from it


def records_mark() -> int:
    """A mark for ``records_since``."""
    return _records_total


def records_since(mark: int) -> list[FrameRecord]:
    """The records made after ``mark`` (those still kept)."""
    with _records_lock:
        n = min(_records_total - mark, len(_RECORDS))
        return list(_RECORDS)[len(_RECORDS) - n:] if n > 0 else []


def frame_records() -> list[FrameRecord]:
    """The most recent frames decided about (at most 1024), oldest first."""
    with _records_lock:
        return list(_RECORDS)


def clear() -> None:
    """Forget recorded frames and shared contexts (``agspeed.reset``)."""
    with _records_lock:
        _RECORDS.clear()
    _clear_policy()
    for ctx in list(_CONTEXTS.values()):
        ctx.policy.forget_evictions()
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


def _captured_torch_prefixes() -> tuple[str, ...]:
    """Parts of torch that are a training program's own work rather than the runtime's:
    an optimizer's ``step`` run eager by a frame that broke at the call (as torch.compile
    compiles it too)."""
    torch = _package_dir("torch")   # (a submodule's spec would import torch)
    return (os.path.join(torch, "optim") + os.sep,) if torch else ()


def _stdlib_prefixes() -> tuple[str, ...]:
    paths = (sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib"))
    return tuple(dict.fromkeys(os.path.realpath(p) + os.sep for p in paths if p))


_RUNTIME_PREFIXES = _runtime_prefixes()
_CAPTURED_TORCH_PREFIXES = _captured_torch_prefixes()
_STDLIB_PREFIXES = _stdlib_prefixes()
_THIRD_PARTY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def is_runtime_code(filename: str) -> bool:
    """True for code agspeed never captures: its own, torch's (but torch.optim's), the
    standard library's."""
    if filename.startswith("<frozen"):
        return True
    if not os.path.isabs(filename):
        return False  # <string>, <stdin>, notebook cells: user code
    path = os.path.realpath(filename)
    if path.startswith(_RUNTIME_PREFIXES):
        return not path.startswith(_CAPTURED_TORCH_PREFIXES)
    # A plain install keeps site-packages inside the standard library's directory.
    return path.startswith(_STDLIB_PREFIXES) and not any(m in path for m in _THIRD_PARTY_MARKERS)


def _is_namedtuple_new(code: Any, f_globals: dict) -> bool:
    """The ``__new__`` that ``collections.namedtuple`` compiles for each class: library
    code (it builds a tuple), though its file is ``<string>``."""
    name = f_globals.get("__name__")
    return code.co_filename == "<string>" and type(name) is str and \
        name.startswith("namedtuple_")


_COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>"})


def _is_comprehension(code: Any) -> bool:
    """The code of a list, dict or set comprehension where Python compiles it as a
    function of its own (before 3.12): named so, taking the iterator ``.0``."""
    return code.co_name in _COMPREHENSIONS and code.co_argcount == 1 and \
        code.co_varnames[:1] == (".0",)


_SKIP = _C.ACTION_SKIP
_RUN_EAGER = _C.ACTION_RUN_EAGER
_PASS = _C.ACTION_PASS
_DISABLE = _C.ACTION_DISABLE


def is_disable_wrapper(code: Any) -> bool:
    """The wrapper ``torch.compiler.disable`` (``torch._dynamo.disable``, recursive)
    puts around a function, also around ``torch.utils.checkpoint.checkpoint`` and other
    torch functions kept out of graphs: everything under it runs with capture off."""
    return code.co_name == "_fn" and \
        getattr(code, "co_qualname", "") == "DisableContext.__call__.<locals>._fn" and \
        code.co_filename.endswith(os.path.join("_dynamo", "eval_frame.py"))


def _where(code: Any) -> str:
    """How logs and records name a function: "name (file:line)"."""
    return f"{code.co_name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


class Context:
    """The capture context of optimized objects sharing one backend and option set."""

    __slots__ = ("backend_name", "backend", "options", "observer", "policy", "__weakref__")

    def __init__(self, backend_name: str, backend: Any, options: dict[str, Any],
                 observer: Any = None):
        self.backend_name = backend_name
        self.backend = backend
        self.options = dict(options)
        # Called as observer(kind, code, payload) for every decision about a user frame:
        # ("graph", code, Capture), ("break", code, CaptureBreak), ("eager", code, why).
        self.observer = observer
        # which entries of each code object this context keeps (agspeed._policy)
        self.policy = EntryPolicy()

    def __repr__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in sorted(self.options.items()))
        return f"<agspeed context backend={self.backend_name}{opts}>"

    def __call__(self, code: Any, f_locals: dict, f_globals: dict, f_builtins: dict) -> Any:
        try:
            with runtime_work():   # capturing, compiling and tuning are not the program's
                return self._decide(code, f_locals, f_globals, f_builtins)
        except GraphBreakError as exc:  # optimize(..., fullgraph=True) asked for it
            raise exc.with_traceback(None)  # the user's frames, not the runtime's
        except Exception:  # an agspeed bug must not change the user's program
            _internal_log.warning(
                "agspeed: internal error while deciding about %s (%s:%s); it runs eager",
                code.co_name, code.co_filename, code.co_firstlineno, exc_info=True,
            )
            return _C.CacheEntry(_SKIP)

    def _decide(self, code: Any, f_locals: dict, f_globals: dict, f_builtins: dict) -> Any:
        if is_disable_wrapper(code):
            return _C.CacheEntry(_DISABLE)
        if is_runtime_code(code.co_filename) and _roots.is_root(code) \
                and not _roots.claim(code):
            return _C.CacheEntry(_PASS)  # an optimized root's code, reached elsewhere
        if _is_comprehension(code):
            # a comprehension's own frame (Python 3.11) run by code left eager: its one
            # argument is its caller's iterator, which a capture cannot step (inlined
            # where the caller is captured, it is followed as part of it)
            return _C.CacheEntry(_SKIP)
        if (is_runtime_code(code.co_filename) and not _roots.is_root(code)) \
                or _is_namedtuple_new(code, f_globals) or is_break_code(code):
            if log.enabled("frames"):
                _frames_log.info("%s (%s:%s) -> skip (runtime code)", code.co_name,
                                 os.path.basename(code.co_filename), code.co_firstlineno)
            return _C.CacheEntry(_SKIP)
        if in_transform():
            # under torch.func's vmap, grad or jvp, tensors are the transform's wrappers:
            # the frame runs as torch.func runs it, and is captured where it is called
            # plainly (the level is in every guard's global state)
            _record_frame(code, f_locals, "run eager (inside a torch.func transform)")
            return _C.CacheEntry(_PASS)
        if _jit_tracing():
            # torch.jit.trace of a function sets no flag the regions read: its tracer
            # records what the code runs, so the call runs it, and keeps nothing
            _record_frame(code, f_locals, "run eager (under torch.jit.trace)")
            return _C.CacheEntry(_PASS)
        try:
            entry, decision = self._capture_alone(code, f_locals, f_globals, f_builtins)
        except GraphBreakError as exc:
            _record_frame(code, f_locals, f"raise GraphBreakError (graph break: "
                                          f"{os.path.basename(exc.filename)}:{exc.line} "
                                          f"{exc.instruction}: {exc.reason})")
            raise
        _record_frame(code, f_locals, decision)
        return entry

    def _capture_alone(self, code: Any, f_locals: dict, f_globals: dict,
                       f_builtins: dict) -> tuple[Any, str]:
        """``_capture``, one thread at a time in the process.

        Threads whose first calls come together (a server's workers) would each capture,
        compile and tune the same frame, and inductor's compiles do not run side by
        side.  A thread that waited while another made an entry for this code runs its
        frame eager once (``PASS``) rather than capture again; its next call finds the
        entry in the cache."""
        before = _entries(code, self)
        with _capture_lock:
            if _entries(code, self) != before:
                return (_C.CacheEntry(_PASS),
                        "run eager (another thread captured it meanwhile)")
            return self._capture(code, f_locals, f_globals, f_builtins)

    def _capture(self, code: Any, f_locals: dict, f_globals: dict,
                 f_builtins: dict) -> tuple[Any, str]:
        """The entry for a user frame and the decision in words.

        In order: the recompile limit (the policy may refuse another capture), one
        capture, a break under ``fullgraph`` raised, the policy admitting the new entry
        (room made, records kept, static entries it covers replaced), then the entry
        itself: eager for a break or a frame without tensor work, else the compiled
        graph.
        """
        if "torch" not in sys.modules:
            return _C.CacheEntry(_RUN_EAGER), "run eager"
        where = _where(code)
        # Each context counts its own entries: another optimized object's recompiles of
        # this code are not this one's.
        entries = self.policy.drop_gone(code, _entries(code, self))
        looped = _resume_in_loop(code)
        limited = self.policy.at_recompile_limit(code, where, entries, f_locals,
                                                 looped * _LOOP_PASSES)
        if limited is not None:
            self._observe("eager", code, "recompile limit")
            # unsigned: it serves the object's frames of every signature
            return (_C.CacheEntry(_RUN_EAGER, guard=limited if limited.held else None,
                                  context=self, signed=False),
                    "run eager (recompile limit)")
        graph, brk, guard, shapes = self._capture_frame(code, f_locals, f_globals,
                                                        f_builtins)
        if brk is not None and self.options.get("fullgraph"):
            raise self._graph_break_error(code, where, brk)
        not_resumed = ""
        if brk is not None and not looped and \
                _recurs_with_new_values(guard, entries, shapes):
            # a value the resumed entries relied on changes from call to call (a
            # counter): each would recapture, so the frame runs eager for all of them
            not_resumed = " (not resumed: a plain value it read changes between calls)"
        elif brk is not None:
            resumed = self._resume(code, where, brk, guard, f_locals, f_globals, f_builtins,
                                   shapes)
            if isinstance(resumed, str):    # why not: said in the frame's record
                not_resumed = f" (not resumed: {resumed})"
            else:
                entry, guard = resumed
                # (a loop's passes are entries of their own, not recompiles)
                self.policy.admit(code, where, entries, guard, shapes, not looped,
                                  (f_locals, f_globals, f_builtins))
                return entry, f"captured up to a graph break, resumed after it ({brk})"
        self.policy.admit(code, where, entries, guard, shapes,
                          graph is not None and not looped,
                          (f_locals, f_globals, f_builtins))
        if graph is None:
            entry, decision = self._eager_entry(code, where, brk, widened(guard, entries),
                                                f_locals)
            return entry, decision + not_resumed
        entry = compiled_entry(self, code, where, graph, f_locals)
        self._observe("graph", code, graph)
        return entry, "captured"

    def _capture_frame(self, code: Any, f_locals: dict, f_globals: dict,
                       f_builtins: dict) -> tuple:
        """One capture of the frame, under the dimensions the policy makes dynamic:
        ``(Capture or None, CaptureBreak or None, guard, DimPolicy)``; no graph and no
        break is a frame that did no tensor work."""
        from agspeed._capture import Capture, capture
        from agspeed.backends import supports_dynamic, takes_float_inputs

        keep_dynamo_out()
        shapes = self.policy.dimensions(code, self.options.get("dynamic"), f_locals,
                                        supports_dynamic(self.backend),
                                        takes_float_inputs(self.backend))
        result = capture(code, f_locals, f_globals, f_builtins, shapes)
        if isinstance(result, Capture):
            return result, None, result.guard, shapes
        brk, guard = result
        return None, brk, guard, shapes

    def _resume(self, code: Any, where: str, brk: Any, brk_guard: Any, f_locals: dict,
                f_globals: dict, f_builtins: dict, shapes: Any) -> tuple | str:
        """The CALL entry of a frame that broke at ``brk`` and resumes after it
        (``agspeed._resume``), with its guard; where it cannot resume, why not (the
        frame then runs eager as before)."""
        from agspeed import _resume, _resume_code
        from agspeed._assume import checked
        from agspeed._capture import Capture, Stopped, _guard, capture
        from agspeed._compile import compile_capture
        from agspeed._ctx import restoring_modes
        from agspeed._replay import replay
        from agspeed._sources import resolve
        from agspeed._tensor_check import arg_check

        # a resume function's break resumes in the user's code's resume functions
        base, offset, shift = _resume_code.original(code, brk.root_offset) or \
            (code, brk.root_offset, 0)
        site = _resume.break_site(base, offset)
        if not isinstance(site, str):
            stop = site.offset if base is code else \
                _resume_code.offset_in(code, base, site.offset, shift)
            stopped = capture(code, f_locals, f_globals, f_builtins, shapes, stop_at=stop)
            site = "capture did not reach the break again" \
                if not isinstance(stopped, Stopped) else site
        if not isinstance(site, str):
            builder = stopped.builder
            memo: dict = {}
            layout = _resume.layout_of(
                _resume_code.original_state(stopped.state, code, base), base, builder,
                lambda src: resolve(src, f_locals, f_globals, f_builtins, memo), offset)
            site = layout if isinstance(layout, str) else site
        if isinstance(site, str):
            return site
        import torch

        # writes to the program's objects before the break are replayed after the graph,
        # before the break code runs (as in eager, they happen before the break)
        builder.note_held(layout.outputs)
        effects = builder.effect_plan()
        ops = any(n.op in ("call_function", "call_method") for n in builder.graph.nodes)
        if not ops and not any(isinstance(v, torch.Tensor) for v in f_locals.values()):
            # no tensors here at all: generated code would only slow plain Python down
            return "no tensor work"
        _resume.close_contexts(stopped.state)   # the graph leaves the modes as it found them
        gm = builder.output(layout.outputs)
        guard = _guard(torch, builder, f_locals, code)
        guard.break_at = getattr(brk_guard, "break_at", None)
        try:
            fn, resumes = _resume_code.generated(base, f_globals, site, layout)
        except ValueError as exc:   # a layout the generated code cannot rebuild
            return str(exc)
        cap = Capture(gm, builder.read_sources, guard, builder.example_inputs(), effects,
                      len(builder.sources))
        if ops:
            graph = compile_capture(self, cap, where)
            self._observe("graph", code, cap)
        else:
            graph = checked(gm, gm)
        graph = restoring_modes(gm, graph)   # with blocks left if the graph raises
        if effects:
            graph = replay(effects, cap.n_inputs, graph)
        self._note_break(code, where, brk)
        self._observe("resume", code, (brk, [r.__code__ for r in resumes]))
        run = _resume_code.runner(graph, guard.read, layout, fn, resumes, code.co_freevars,
                                  chained=_resume_code.is_resume(code))
        signed = guard.sym is None
        entry = _C.CacheEntry(_C.ACTION_CALL, guard=guard, compiled=run, context=self,
                              signed=signed,
                              arg_check=arg_check(code, f_locals) if signed else None)
        return entry, guard

    def _eager_entry(self, code: Any, where: str, brk: Any, guard: Any,
                     f_locals: dict) -> tuple[Any, str]:
        """The ``RUN_EAGER`` entry of a capture that made no graph, and the decision.

        Guarded like a graph: these inputs (and only these) run eager, and the function
        is captured again for others.
        """
        from agspeed._tensor_check import arg_check

        signed = getattr(guard, "sym", None) is None
        entry = _C.CacheEntry(_RUN_EAGER, guard=guard, context=self, signed=signed,
                              arg_check=arg_check(code, f_locals) if signed else None)
        if brk is None:
            self._observe("eager", code, "no tensor work")
            return entry, "run eager (no tensor work)"
        self._note_break(code, where, brk)
        return entry, f"run eager (graph break: {brk})"

    def _graph_break_error(self, code: Any, where: str, brk: Any) -> GraphBreakError:
        """What a break is under ``fullgraph``: an error, noted as any break is, with no
        entry made, so the next call that breaks raises again."""
        self._note_break(code, where, brk)
        return GraphBreakError(brk.filename, brk.line, brk.function or code.co_name,
                               brk.instruction, brk.reason, brk.detail, brk.hint, where)

    def _note_break(self, code: Any, where: str, brk: Any) -> None:
        """Tell the observer about a graph break, and log it under ``graph_breaks``."""
        self._observe("break", code, brk)
        if log.enabled("graph_breaks"):
            _graph_breaks_log.info("%s: %s", where, brk)

    def _observe(self, kind: str, code: Any, payload: Any) -> None:
        if self.observer is not None:
            self.observer(kind, code, payload)


def _recurs_with_new_values(guard: Any, entries: list, shapes: Any = None) -> bool:
    """Whether an entry of ``entries`` stopped at the same break as ``guard`` and
    expected other plain values (what ``widened`` would drop), other than ints that may
    yet become symbols (``shapes.may_go_dynamic``): those are resumed, and go dynamic."""
    at = getattr(guard, "break_at", None)
    if at is None:
        return False
    may = getattr(shapes, "may_go_dynamic", None)
    for old in entries:
        if getattr(old.guard, "break_at", None) != at:
            continue
        kept = {id(c) for c in guard.widened(old.guard).checks}   # the same tuples
        if any(id(c) not in kept and (may is None or not may(*c)) for c in guard.checks):
            return True
    return False


def _record_frame(code: Any, f_locals: dict, decision: str) -> None:
    """Keep (and log under ``frames``) the decision about a user frame."""
    record = FrameRecord(
        code.co_name, code.co_filename, code.co_firstlineno,
        tuple((k, _describe(v)) for k, v in f_locals.items()),
        decision, weakref.ref(code),
    )
    global _records_total
    with _records_lock:
        _RECORDS.append(record)
        _records_total += 1
    if log.enabled("frames"):
        _frames_log.info("%s", record)


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


_tracers_told = False


def _jit_tracing() -> bool:
    """Whether torch.jit's tracer runs now (False while torch has not been imported)."""
    torch = sys.modules.get("torch")
    state = getattr(getattr(torch, "_C", None), "_get_tracing_state", None)
    return state is not None and state() is not None


def watch_tracers() -> None:
    """Tell the regions where torch keeps whether one of its tracers runs (a
    TorchDispatchMode such as make_fx's, FlopCounterMode or FakeTensorMode; a
    ``torch.jit.trace``): under one, an optimized call runs the program's own code, which
    the tracer is there to see (csrc/region.c)."""
    global _tracers_told
    if _tracers_told or "torch" not in sys.modules:
        return
    import torch

    flags, probes = [], []
    try:
        from torch.utils import _python_dispatch as dispatch
    except ImportError:   # a torch without Python dispatch modes
        dispatch = None
    if dispatch is not None and type(getattr(dispatch, "_is_in_torch_dispatch_mode",
                                             None)) is bool:
        flags.append((vars(dispatch), "_is_in_torch_dispatch_mode"))
    elif dispatch is not None and hasattr(dispatch, "_get_current_dispatch_mode_stack"):
        probes.append(dispatch._get_current_dispatch_mode_stack)   # (empty: false)
    # torch.jit.trace of a module keeps its module map there while it runs (a call of
    # torch's own tracing-state function costs more than the rest of a region's check)
    jit_trace = sys.modules.get("torch.jit._trace")
    if jit_trace is not None and hasattr(jit_trace, "_trace_module_map"):
        flags.append((vars(jit_trace), "_trace_module_map"))
    elif getattr(torch._C, "_get_tracing_state", None) is not None:
        probes.append(torch._C._get_tracing_state)
    _C.set_tracers(tuple(flags), tuple(probes))
    _tracers_told = True


_CONTEXTS: dict[tuple, Context] = {}
_contexts_lock = threading.Lock()
# held while a frame is captured, compiled and tuned (Context._capture_alone)
_capture_lock = threading.RLock()


def _entries(code: Any, ctx: Context) -> list:
    """``ctx``'s cache entries of ``code`` (entries compare by identity)."""
    return [e for e in _C.code_cache(code)["entries"] if e.context is ctx]


def context_for(backend_name: str, backend: Any, options: dict[str, Any]) -> Context:
    """The shared context for this backend (by identity) and these options."""
    keep_dynamo_out()
    watch_tracers()
    key = (backend_name, id(backend), tuple(sorted(options.items())))
    with _contexts_lock:
        ctx = _CONTEXTS.get(key)
        if ctx is None or ctx.backend is not backend:
            ctx = _CONTEXTS[key] = Context(backend_name, backend, options)
        return ctx
