"""The autotuner: the backend ``"auto"``, which picks the fastest correct backend per graph.

A graph it is handed runs as captured until its ``tune_after``-th call (``_Deferred``;
the second by default, so a graph called once is never compiled).  On that call, with
that call's real inputs, the autotuner:

1. looks the graph up in the knowledge base (``knowledge.py``); a graph tuned before, in
   this process or an earlier one, is compiled with the remembered backend only, and
   the log says so (``AGSPEED_RETUNE=1`` tunes again);
2. otherwise compiles each candidate that can take the graph (``_protocol.why_not``) and
   was not measured before (a tuning run that was interrupted resumes with the rest),
   each under the per-graph time budget: a compile that raises or runs past it is
   skipped, logged and remembered as failed;
3. runs each compiled candidate once on the graph's inputs from the state eager started
   from, and compares its outputs and, for a graph that needs gradients, the gradients of
   its inputs (data and parameters) with eager's (``_measure.compare``): a candidate that
   differs is never chosen;
4. times each correct candidate against eager in alternating turns, forward and backward
   together for a training graph, and writes the measurement to the knowledge base as
   soon as it is made;
5. keeps the candidate with the best median speedup among those whose speedup held in
   three turns of four by more than ``_MARGIN`` (the lower quartile of the per-turn
   ratios); otherwise eager.  Ties keep eager;
6. for a training graph, checks a compiled choice once more on the program's own steps
   (``_confirm``: the choice and eager in turns, timed from one optimizer step to the
   next), and runs eager from then on where the choice loses there.  The knowledge base
   keeps that verdict too, so a remembered choice is checked once, or, where the verdict
   was close (within ``_CLOSE`` of even, either way), once in each later process: what
   else the machine runs can turn a 10% win into a loss.  Eager gets the same
   second look: a compiled candidate whose median beat eager's though its turns did not
   hold it (a win within the noise), and, in a later process, the best candidate
   measured correct for a graph remembered as eager (measured then on a busy machine,
   say), is watched against eager on the steps, each candidate once (one per process);
   where it wins there it is the choice from then on.

Tuning never changes what the program computes.  Every run starts from the state eager
started from (``_measure.State``: mutated inputs and random generators put back), no
gradient is accumulated into ``.grad`` (``torch.autograd.grad``), and the state is put
back once more at the end, so the call that triggered the tuning then runs the chosen
backend exactly once, as if nothing had been tried.  A compile runs in a worker thread
that carries the caller's grad mode and autocast state; one that exceeds the budget is
abandoned there.  While tuning takes more than a second, a progress bar (tqdm, on stderr,
off when stderr is not a terminal or ``AGSPEED_PROGRESS=0``) shows the graph and the
candidate.  ``AGSPEED_LOG=autotune`` prints one table per graph.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from statistics import median
from typing import Any, Callable, NamedTuple

from agspeed.backends import _measure, knowledge
from agspeed.backends._outputs import flat_output
from agspeed.backends._protocol import (Capabilities, autocast_state, graph_devices,
                                        is_dynamic, placeholder_values, why_not)

__all__ = ["autotuner", "compile_graph", "default_candidates", "Autotuner", "Decision",
           "decisions", "clear_decisions"]

_log = logging.getLogger("agspeed.autotune")
_warn = logging.getLogger("agspeed")
# The lower quartile of a candidate's per-turn speedups must exceed 1 + _MARGIN: a win
# smaller than the noise of alternating turns is no win.
_MARGIN = 0.01
# A verdict of the program's steps (``_confirm``) closer than this to even, either way, is
# taken again once in each later process that tunes the graph from the knowledge base:
# whether a compiled step beats eager's by 10% can depend on what else the machine runs.
_CLOSE = 1.25
# Seconds of alternating turns spent timing each candidate (at least 5 rounds).
_TIME_PER_CANDIDATE = {"cpu": 1.0, "cuda": 0.5}
_DEFAULT = {"cpu": ("eager", "inductor", "jit"),
            "cuda": ("eager", "inductor", "cudagraphs", "nvrtc", "nvrtc_cudagraphs", "jit")}


class Decision(NamedTuple):
    """The autotuner's answer for one graph in this process."""

    graph: str          # "forward (model.py:12)"
    choice: str         # the backend that runs it
    speedup: float      # its median speedup over eager (1.0 for eager)
    seconds: float      # time spent deciding (tuning, or compiling the remembered choice)
    source: str         # "tuned" or "knowledge base"
    key: str            # the knowledge base's key
    # the choice's speedup over eager on the program's own training steps, once checked
    # there (``_confirm``); ``choice`` is then what won there
    loop: float | None = None


_DECISIONS: list[Decision] = []
_decisions_lock = threading.Lock()
# The graphs (keys) this process watched on its steps, so a close verdict is taken again
# once per process (until ``agspeed.reset()``).
_WATCHED: set = set()


def decisions() -> list[Decision]:
    """The graphs the autotuner decided about since the last ``agspeed.reset()``."""
    with _decisions_lock:
        return list(_DECISIONS)


def clear_decisions() -> None:
    with _decisions_lock:
        _DECISIONS.clear()
        _WATCHED.clear()


def _decided(t: "_Tuning", choice: str, speedup: float, source: str) -> None:
    with _decisions_lock:
        _DECISIONS.append(Decision(t.where, choice, speedup,
                                   time.perf_counter() - t.started, source, t.key))


def _checked(key: str, name: str, verdict: dict) -> None:
    """The program's steps gave ``verdict`` on the candidate ``name`` for ``key``: its
    decision says so, and what won there."""
    with _decisions_lock:
        for k in range(len(_DECISIONS) - 1, -1, -1):
            d = _DECISIONS[k]
            if d.key == key:
                _DECISIONS[k] = d._replace(choice=name if verdict["kept"] else "eager",
                                           loop=verdict["ratio"])
                return


def _second_look(candidates: dict, names: list, judged: Any, margin: float | None) -> Any:
    """For a graph whose choice is eager: the compiled candidate to watch against eager
    on the program's steps, or None.  Among those measured correct, offered now and not
    ``judged`` by the steps already, the best median speedup (above ``1 + margin``
    where a margin is given)."""
    best, best_ratio = None, 0.0 if margin is None else 1.0 + margin
    for name, m in candidates.items():
        if name == "eager" or name not in names or name in judged or \
                m.get("status") != "ok":
            continue
        if m.get("ratio", 0.0) > best_ratio:
            best, best_ratio = name, m["ratio"]
    return best


def _again(rec: dict, key: str, names: list) -> str | None:
    """The candidate whose verdict on the program's steps ``rec`` holds, when that
    verdict was close (a ratio within ``_CLOSE`` of even) and this process has not
    watched the graph yet: it is watched once more here.  None otherwise."""
    loop = rec.get("loop")
    if not isinstance(loop, dict) or loop.get("candidate") not in names or \
            rec["candidates"].get(loop["candidate"], {}).get("status") != "ok":
        return None
    ratio = loop.get("ratio")
    if not isinstance(ratio, (int, float)) or not 1.0 / _CLOSE < ratio < _CLOSE:
        return None
    with _decisions_lock:
        return None if key in _WATCHED else loop["candidate"]


def _watched(t: "_Tuning", choice: str, fn: Callable) -> Callable:
    """``fn``, the callable of ``choice`` for ``t``'s graph, checked on the program's own
    training steps first when it is a compiled choice for a training graph
    (``_confirm``); the verdict goes to the knowledge base and the decision."""
    from agspeed.backends import _confirm

    if not t.training or choice == "eager":
        return fn
    key, env, meta = t.key, t.env, t.meta  # not t: it holds the captured call's inputs
    with _decisions_lock:
        _WATCHED.add(key)

    def report(verdict: dict) -> None:
        _checked(key, choice, verdict)
        try:
            knowledge.confirm(key, env, meta, choice, verdict)
        except OSError as exc:
            _warn.warning("agspeed: cannot write the knowledge base (%s)", exc)

    return _confirm.watching(fn, t.gm.forward, t.cuda, t.where, report, t.program_inputs)


def default_candidates(devices: set) -> tuple:
    """The candidates tried on graphs whose inputs live on ``devices``."""
    return _DEFAULT["cuda" if "cuda" in devices else "cpu"]


def _tls_state() -> Callable[[Callable[[], Any]], Any]:
    """A function that runs a thunk in another thread under this thread's grad, inference
    and autocast state (all thread-local in torch)."""
    import torch

    grad = torch.is_grad_enabled()
    inference = torch.is_inference_mode_enabled()
    cache = torch.is_autocast_cache_enabled()
    autocast = [a for a in autocast_state(("cpu", "cuda")) if a[2] is not None]

    def within(thunk: Callable[[], Any]) -> Any:
        torch.set_autocast_cache_enabled(cache)
        for device, enabled, dtype in autocast:
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            return thunk()

    return within


def _compile(fn: Callable, gm: Any, inputs: list, budget: float) -> tuple[Any, float]:
    """``fn(gm, inputs)`` in a worker thread, waiting at most ``budget`` seconds.

    Returns (compiled, seconds); raises what the compile raised, or TimeoutError.
    """
    within = _tls_state()
    box: dict = {}

    def work() -> None:
        try:
            box["value"] = within(lambda: fn(gm, inputs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    start = time.perf_counter()
    worker = threading.Thread(target=work, name="agspeed-compile", daemon=True)
    worker.start()
    worker.join(max(budget, 0.0))
    seconds = time.perf_counter() - start
    if worker.is_alive():
        raise TimeoutError(f"compile still running after the {budget:.0f} s budget "
                           f"(abandoned)")
    if "error" in box:
        raise box["error"]
    if not callable(box.get("value")):
        raise TypeError(f"the backend returned {type(box.get('value')).__name__}, not a "
                        "callable")
    return box["value"], seconds


def _is_training(inputs: list) -> bool:
    import torch

    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)


def _progress(total: int, where: str) -> Any:
    from agspeed import config

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    quiet = not config.progress or not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())
    return tqdm(total=total, desc=f"agspeed tuning {where}", file=sys.stderr, delay=1.0,
                disable=quiet, leave=False, unit="step")


def _ok(t: _measure.Timing, compile_s: float, err: float) -> dict:
    return {"status": "ok", "compile_s": round(compile_s, 4), "median_s": t.median_s,
            "eager_s": t.eager_s, "ratio": t.ratio, "low": t.low, "high": t.high,
            "rounds": t.rounds, "max_err": err}


def _failed(status: str, reason: str, compile_s: float = 0.0) -> dict:
    return {"status": status, "reason": reason[:500], "compile_s": round(compile_s, 4)}


def _pick(measured: dict) -> str:
    """The winner among ``measured`` (name -> measurement): see step 5 above."""
    best, best_ratio = "eager", 1.0
    for name, m in measured.items():
        if name == "eager" or m.get("status") != "ok":
            continue
        low = m.get("low", m["ratio"])
        if low > 1.0 + _MARGIN and m["ratio"] > best_ratio:
            best, best_ratio = name, m["ratio"]
    return best


def _leaf(value: Any) -> Any:
    """An input that requires grad as a fresh leaf on the same memory: tuning's backward
    must stop at the graph's own inputs.  Reaching through a non-leaf (an earlier graph's
    output) into its history, whose parameters may be this graph's too, would free that
    graph's saved tensors, and the program's backward would fail; and a parameter's own
    hooks (``register_hook``: gradient logging, clipping) must see only the program's
    backward passes, not the measurement's."""
    import torch

    if isinstance(value, torch.Tensor) and value.requires_grad:
        return value.detach().requires_grad_(True)
    return value


def _names(options: dict, devices: set) -> list[str]:
    """The candidates for a graph on ``devices``: the option, the knob, or the default;
    eager first, always."""
    from agspeed import config

    names = options.get("candidates") or config.autotune_candidates or \
        default_candidates(devices)
    return list(dict.fromkeys(["eager", *names]))


class _Tuning:
    """One graph's tuning: its key, inputs, reference result and compiled candidates."""

    def __init__(self, gm: Any, inputs: list, options: dict) -> None:
        from agspeed import config

        self.gm, self.inputs = gm, [_leaf(v) for v in inputs]
        self.program_inputs = inputs   # the parameters themselves, for the step clock
        self.where = gm.meta.get("agspeed_where", "graph") if hasattr(gm, "meta") else "graph"
        self.training = _is_training(inputs)
        self.devices = graph_devices(inputs)
        self.cuda = "cuda" in self.devices
        self.compute_dtype = _measure.autocast_dtype(self.devices)
        self.budget = float(options.get("tune_budget") or config.tune_budget)
        self.names = _names(options, self.devices)
        self.env = knowledge.environment(self.devices)
        self.key = knowledge.graph_key(gm, inputs, self.env)
        ops = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method",
                                                          "call_module"))
        self.meta = {"graph": self.where, "ops": ops, "training": self.training}
        self.started = time.perf_counter()
        self.compiled: dict[str, Any] = {"eager": gm.forward}

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.started)

    def compile(self, name: str) -> tuple[Any, float]:
        from agspeed.backends import get_backend

        if name == "eager":
            return self.gm.forward, 0.0
        fn = get_backend(name)
        reason = why_not(fn, self.gm, self.inputs, self.training)
        if reason:
            raise _Unfit(reason)
        flat, wrap = flat_output(self.gm)
        compiled, seconds = _compile(fn, flat, self.inputs, self.left())
        return wrap(compiled), seconds

    def save(self, name: str, m: dict) -> None:
        try:
            knowledge.record(self.key, self.env, self.meta, name, m)
        except OSError as exc:  # a read-only or full disk costs the memory, not the run
            _warn.warning("agspeed: cannot write the knowledge base (%s)", exc)


class _Unfit(Exception):
    """The candidate declares it cannot take this graph."""


def _step(fn: Callable, inputs: list, training: bool, grads: list) -> Callable[[], None]:
    """One whole call as the program makes it: forward, and backward when training
    (for the output gradients ``grads``)."""

    def call() -> None:
        out = fn(*inputs)
        if training and grads:
            _measure.backward(out, inputs, grads)

    return call


def _log_table(t: _Tuning, measured: dict, chosen: str, tuned: list, seconds: float) -> None:
    if not _log.isEnabledFor(logging.INFO):
        return
    won = measured.get(chosen, {})
    verdict = (f"{chosen} wins, {won['ratio']:.2f}x over eager" if chosen != "eager"
               else "eager kept (no candidate beat it beyond the measurement's spread)")
    lines = [f"{t.where}: {'training' if t.training else 'inference'} graph, "
             f"{t.meta['ops']} ops, tuned {', '.join(tuned) or 'nothing new'} in "
             f"{seconds:.1f} s: {verdict}",
             f"  {'candidate':12s} {'compile':>8s} {'median':>10s} {'speedup':>8s} "
             f"{'max err':>8s}"]
    for name in t.names:
        m = measured.get(name)
        if m is None:
            continue
        mark = "  chosen" if name == chosen else ""
        if m["status"] == "ok" and not m["median_s"]:
            lines.append(f"  {name:12s} {'-':>8s} {'(not timed)':>10s}{mark}")
        elif m["status"] == "ok":
            lines.append(f"  {name:12s} {m['compile_s']:7.2f}s {m['median_s'] * 1e3:8.3f}ms "
                         f"{m['ratio']:7.2f}x {m['max_err']:8.1e}{mark}")
        else:
            lines.append(f"  {name:12s} {m['status']}: {m['reason']}")
    _log.info("\n".join(lines))


def _tune(t: _Tuning, done: dict) -> tuple[str, dict, list]:
    """Measure the candidates not in ``done``; returns (choice, measurements, tuned)."""
    measured = dict(done)
    todo = [n for n in t.names if n != "eager" and n not in done]
    state = _measure.State(t.inputs, t.gm)
    bar = _progress(2 * len(todo) + 1, t.where) if todo else None
    eager_s: list[float] = []
    try:
        if bar is not None:
            bar.set_postfix_str("eager")
        ref = _measure.run(t.gm.forward, t.inputs, t.training)
        state.restore()
        grads = ref.grad_outputs
        eager_step = _step(t.gm.forward, t.inputs, t.training, grads)

        def exact() -> Any:
            state.restore()
            result = _measure.exact_run(t.gm.forward, t.inputs, t.training)
            state.restore()
            return result

        if bar is not None:
            bar.update(1)
        for k, name in enumerate(todo):
            if bar is not None:
                bar.set_postfix_str(f"{name}: compiling")
            compile_s = 0.0
            try:
                fn, compile_s = t.compile(name)
                state.restore()  # a compile may run the graph (tracing)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(f"{name}: checking and timing")
                start = time.perf_counter()
                got = _measure.run(fn, t.inputs, t.training)  # first call: lazy setup
                compile_s += time.perf_counter() - start
                state.restore()
                err = _measure.compare(ref, got, exact, t.compute_dtype)
                seconds = min(_TIME_PER_CANDIDATE["cuda" if t.cuda else "cpu"],
                              max(t.left(), 0.0))
                timing = _measure.time_pair(eager_step, _step(fn, t.inputs, t.training, grads),
                                            state, t.cuda, warmup=2, seconds=seconds)
                state.restore()
                m = _ok(timing, compile_s, err)
                eager_s.append(timing.eager_s)
                t.compiled[name] = fn
            except _Unfit as exc:
                m = _failed("failed", f"unavailable: {exc}")
            except _measure.Mismatch as exc:
                state.restore()
                m = _failed("wrong", str(exc), compile_s)
            except Exception as exc:  # noqa: BLE001 - a candidate's failure is logged
                state.restore()
                m = _failed("failed", f"{type(exc).__name__}: {exc}", compile_s)
            measured[name] = m
            t.save(name, m)
            if bar is not None:
                bar.update(1 + 2 * (k + 1) - bar.n)
        if "eager" not in measured or todo:
            base = median(eager_s) if eager_s else \
                measured.get("eager", {}).get("median_s", 0.0)
            measured["eager"] = {"status": "ok", "compile_s": 0.0, "median_s": base,
                                 "ratio": 1.0, "low": 1.0, "high": 1.0, "max_err": 0.0,
                                 "rounds": 0}
            t.save("eager", measured["eager"])
    finally:
        state.restore()
        if bar is not None:
            bar.close()
    return _pick(measured), measured, todo


def tune(gm: Any, inputs: list, options: dict | None = None) -> Callable[..., Any]:
    """The autotuner's answer for one graph: the chosen backend's compiled callable, or,
    where the graph is to be tuned on a later call (``tune_after``), a callable that
    runs it as captured until then."""
    from agspeed import config
    from agspeed.backends import _confirm

    options = options or {}
    if _names(options, graph_devices(inputs)) == ["eager"]:
        return gm.forward  # nothing to choose between
    after = int(options.get("tune_after") or config.tune_after)
    if after > 1 and not _confirm.distributed():
        return _Deferred(gm, options, after)
    return _tune_now(gm, inputs, options)


class _Deferred:
    """A graph before its ``after``-th call: it runs as captured (its own forward), and
    that call tunes it on its own inputs, in the program's thread as a capture would
    (``_tune_now``), then runs the answer; from then on the answer runs.  A graph called
    once (a first call's one-off graphs, a batch shape seen once) is never compiled.

    Calls that come while another thread tunes run as captured.  A failure to tune
    leaves the graph as captured, with a warning, unless it is the program's own error
    on these inputs (the graph raises as captured too): that is raised as eager raises
    it, and the next call tunes."""

    __slots__ = ("fn", "gm", "options", "left", "lock")

    def __init__(self, gm: Any, options: dict, after: int) -> None:
        self.fn, self.gm, self.options = gm.forward, gm, options
        self.left = after
        self.lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        self.left -= 1
        if self.left > 0 or not self.lock.acquire(blocking=False):
            return self.fn(*args)
        try:
            if self.gm is None:   # tuned by another thread meanwhile
                return self.fn(*args)
            from agspeed._ctx import runtime_work

            with runtime_work():
                try:
                    fn = _tune_now(self.gm, list(args), self.options)
                except Exception as exc:  # noqa: BLE001 - the program must not stop
                    if _raises_eagerly(self.gm, list(args)):
                        self.left = 1
                        return self.fn(*args)
                    _warn.warning("agspeed: %s: tuning failed (%s: %s); its graph runs "
                                  "eagerly", self.gm.meta.get("agspeed_where", "graph"),
                                  type(exc).__name__, exc)
                    fn = self.gm.forward
            self.fn, self.gm, self.options = fn, None, None
            self.__class__ = _Tuned
        finally:
            self.lock.release()
        return self.fn(*args)


class _Tuned(_Deferred):
    """A ``_Deferred`` after its tuning: its answer, at the cost of one call."""

    __slots__ = ()

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _tune_now(gm: Any, inputs: list, options: dict) -> Callable[..., Any]:
    """The chosen backend's compiled callable for ``gm``, on ``inputs``."""
    from agspeed import config

    t = _Tuning(gm, inputs, options)
    rec = None if config.retune else knowledge.load(t.key, t.env)
    if rec is not None and rec.get("choice"):
        choice = rec["choice"]
        try:
            fn, seconds = t.compile(choice)
        except Exception as exc:  # noqa: BLE001 - logged; the graph runs eager
            _warn.warning("agspeed: %s: the remembered backend %s failed to compile (%s: "
                          "%s); it runs eager", t.where, choice, type(exc).__name__, exc)
            return gm.forward
        if _log.isEnabledFor(logging.INFO):
            ratio = rec["candidates"][choice]["ratio"]
            _log.info("%s: knowledge base says %s (%.2fx over eager, tuned %s); not tuning "
                      "again (compiled in %.2f s)", t.where, choice, ratio,
                      rec.get("updated", "before"), seconds)
        _decided(t, choice, rec["candidates"][choice]["ratio"], "knowledge base")
        again = _again(rec, t.key, t.names) if t.training else None
        if again == choice:     # a close win on another process's steps: once more here
            return _watched(t, choice, fn)
        if knowledge.confirmed(rec):
            return fn
        other = again or _second_look(rec["candidates"], t.names, rec.get("judged", ()),
                                      None) if choice == "eager" and t.training else None
        if other is not None:   # remembered as eager: the best other, once, on the steps
            try:
                return _watched(t, other, t.compile(other)[0])
            except Exception as exc:  # noqa: BLE001 - logged; eager it stays
                _log.info("%s: %s did not compile again (%s); eager stays", t.where,
                          other, exc)
        return _watched(t, choice, fn)
    done = {} if rec is None or config.retune else {
        n: m for n, m in rec["candidates"].items() if n in t.names}
    choice, measured, tuned = _tune(t, done)
    try:
        knowledge.choose(t.key, t.env, t.meta, choice)
    except (OSError, ValueError) as exc:
        _warn.warning("agspeed: cannot write the knowledge base (%s)", exc)
    _log_table(t, measured, choice, tuned, time.perf_counter() - t.started)
    _decided(t, choice, measured[choice]["ratio"], "tuned")
    other = _second_look(measured, t.names, (), _MARGIN) \
        if choice == "eager" and t.training else None
    if other is not None and t.compiled.get(other) is not None:
        return _watched(t, other, t.compiled[other])   # won, but within the noise
    fn = t.compiled.get(choice)
    if fn is None:  # measured by an earlier, interrupted run: compile it now
        try:
            fn, _ = t.compile(choice)
        except Exception as exc:  # noqa: BLE001
            _warn.warning("agspeed: %s: %s failed to compile again (%s); it runs eager",
                          t.where, choice, exc)
            return gm.forward
    return _watched(t, choice, fn)


class Autotuner:
    """The backend ``"auto"``: ``autotuner(gm, example_inputs)`` tunes and returns the
    fastest correct backend's callable for ``gm``."""

    __name__ = "auto"
    # eager is always among its answers: so it takes what eager takes, floats made
    # symbols included (the candidates that cannot take such a graph are left out, so a
    # float that varies from call to call runs eager rather than compiling per value)
    capabilities = Capabilities(float_inputs=True)

    def __call__(self, gm: Any, example_inputs: list) -> Callable[..., Any]:
        options = gm.meta.get("agspeed_options", {}) if hasattr(gm, "meta") else {}
        return tune(gm, list(example_inputs), options)


autotuner = Autotuner()


def _tracing_for(backend: Any, gm: Any) -> Any:
    """Where a backend of the user's compiles a dynamic graph: under a tracing context
    holding the capture's fake mode, as torch.compile compiles it, so that AOTAutograd
    (``aot_module_simplified``) traces with the capture's ShapeEnv and makes the ints
    inputs of the graph rather than constants of the example call.  agspeed's own
    backends read the symbols themselves."""
    import contextlib

    if getattr(backend, "__module__", "").startswith("agspeed.") or not is_dynamic(gm):
        return contextlib.nullcontext()
    from torch._guards import TracingContext, detect_fake_mode, tracing

    mode = detect_fake_mode([v for v in placeholder_values(gm) if v is not None])
    if mode is None or mode.shape_env is None:
        return contextlib.nullcontext()
    return tracing(TracingContext(mode))


def compile_graph(name: str, backend: Any, gm: Any, inputs: list) -> tuple[Any, str | None]:
    """Compile a captured graph with the context's backend; never raises.

    Returns (callable, None), or (the graph's own forward, why) when the backend cannot
    take the graph or fails on it: the graph still runs, eagerly.  State the compile
    changes (a backend that runs the graph while compiling) is put back.
    """
    training = _is_training(inputs)
    reason = why_not(backend, gm, inputs, training)
    if reason:
        return gm.forward, f"backend {name} cannot take this graph: {reason}"
    # The autotuner puts state back itself; eager's compile runs nothing.  Any other
    # backend may run the graph while compiling (tracing), so its effects are undone.
    from agspeed.backends import eager

    runs_nothing = backend is autotuner or backend is eager.backend
    state = None if runs_nothing else _measure.State(inputs, gm)
    try:
        if runs_nothing:
            return backend(gm, inputs), None
        flat, wrap = flat_output(gm)
        with _tracing_for(backend, gm):
            return wrap(backend(flat, inputs)), None
    except Exception as exc:  # noqa: BLE001 - the backend's failure must not stop the program
        if _raises_eagerly(gm, inputs):
            # the program's own error (a float64 batch for a float32 model): the graph
            # runs eagerly and raises what eager raises, with no word of a backend
            return gm.forward, None
        return gm.forward, f"backend {name} failed ({type(exc).__name__}: {exc})"
    finally:
        if state is not None:
            state.restore()


def _raises_eagerly(gm: Any, inputs: list) -> bool:
    """Whether the graph itself raises on these inputs, run as captured (state put
    back)."""
    import torch

    state = _measure.State(inputs, gm)
    try:
        with torch.no_grad():
            gm.forward(*inputs)
    except Exception:  # noqa: BLE001 - any error is the program's here
        return True
    finally:
        try:
            state.restore()
        except RuntimeError as exc:   # an input it cannot put back: said, not raised
            _warn.warning("agspeed: %s: %s", gm.meta.get("agspeed_where", "graph"), exc)
    return False
