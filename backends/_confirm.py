"""Choices checked on the program's own training steps.

The autotuner times a graph alone, forward and backward, on the call that captured it.
What the program feels is its whole step, and the two can disagree: the machine was busy
while the graph was measured, or what the compiled graph hands back (fresh outputs, other
strides, CUDA-graph copies) costs the code around it more than it saved.  So a training
graph tuned to a compiled backend is watched (``watching``): it runs its choice or eager
(its own captured forward) in turns, one per step, and keeps what the steps say is
faster.  A DDP graph's cuts are measured the same way (``agspeed._ddp``); ``Turns`` is the
mechanism both use:

- The clock is torch.optim's global step hook: the time from one ``optimizer.step()`` to
  the next is one training step, whatever runs between (data loading, the loss, the
  backward, clipping, other graphs).  Only an optimizer that updates the graph's
  parameters ticks its clock (for a graph without parameters, the first optimizer
  stepped), so a loop with two optimizers (a GAN's) is not timed by halves.  On CUDA the
  hook synchronizes while a graph is watched, so each step is charged its own kernels.
- From one step to the next the graph runs one variant: every call in a step runs the
  same one, so gradient accumulation (DDP's ``no_sync`` micro-batches included) and a
  graph called several times per step are timed whole.  A step in which the graph was not
  called (an evaluation loop between steps) counts for none.
- After unmeasured rounds (one for a watched choice), ``config.confirm_steps`` measured
  steps of each decide for a watched choice, compared side by side (a step of the choice
  against the eager step next to it, so that a machine whose speed drifts weighs on
  both): when nearly all pairs agree the verdict is theirs; while they disagree (noise
  as large as the difference) more steps are measured, up to three times as many, and
  then the median of the pairs' ratios decides.  The choice stays when it is faster;
  otherwise the graph runs eager from then on and the compiled callable is dropped.
  The verdict goes to the knowledge base (``knowledge.confirm``), so a later run takes
  it without watching.
- One graph takes its turns at a time, in the order they were compiled; the others run
  their first choice meanwhile, so a verdict is about one graph and not about whichever
  graphs changed together.  A graph not called in its step hands the turns to the next
  one and goes on where it paused when its turn comes back (a graph for a batch shape
  seen once does not hold up the others); one not called in ``_PATIENCE`` of its steps is
  let go with its first choice and no verdict, and so is one called ``_UNCLOCKED`` times
  before any optimizer stepped (a loop without torch.optim has no clock).

Watching never changes what the program computes beyond what choosing did: the choice
was checked against eager on the captured call, and eager is the reference.  A choice is
not watched in a distributed job (a rank's turns would be timed by the others' waits; a
DDP graph's cut is measured by whole steps already), or with ``confirm_steps`` 0.

The clock holds the graphs weakly and removes its hook once none is left, so a dropped
model's graphs are freed and a program with nothing to measure pays nothing per step.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from statistics import median
from typing import Any, Callable

__all__ = ["MORE", "Turns", "turns", "watching", "clear", "hooked", "distributed"]

_log = logging.getLogger("agspeed.autotune")
# Unmeasured steps of each variant before the measured ones: the first eager step after
# compiled ones pays for the allocator's new pattern, and the first compiled step a lazy
# setup some backends do on their second call.
_WARM = 1
# Steps a graph may go uncalled while it holds the turns (since it was last called)
# before it is let go.
_PATIENCE = 8
# Calls of a graph waiting for its turns, with no optimizer step ever seen, after which
# it is let go: a loop without torch.optim has no clock.
_UNCLOCKED = 32
# A watched choice's verdict: decided when this share of the side-by-side steps agree;
# while they disagree, ``confirm_steps`` more of each, up to this many times as many.
_CLEAR = 0.8
_MOST = 3


def _is_parameter(value: Any) -> bool:
    import torch

    return isinstance(value, torch.nn.Parameter)


def distributed() -> bool:
    """Whether this process is one rank of several."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


DONE, ON, IDLE = "done", "on", "idle"  # what a step did to a graph's turns
# what ``decide`` answers for another ``steps`` measured rounds of every variant
MORE = -1


class Turns:
    """A graph's callable that runs one of ``variants`` per training step, in turns,
    then the one ``decide`` picks.

    ``variants[0]`` is the default: it runs before the turns start, while ``decide``
    waits, and for good when the graph is let go.  After ``warm`` unmeasured rounds,
    ``steps`` measured rounds of every variant; then ``decide(samples)`` (the step
    seconds of each variant, in order) returns the winner's index, None to be asked
    again at the next step (it waits on something, running the default meanwhile), or
    ``MORE`` for another ``steps`` rounds of every variant.
    ``gave_up()`` is called instead when the turns end without a decision.  The graph's
    parameters, among ``inputs``, say which optimizer's steps are its steps."""

    __slots__ = ("fn", "variants", "turns", "warm", "rounds", "index", "calls", "seen",
                 "idle", "samples", "decide", "gave_up", "cuda", "where", "params", "done",
                 "__weakref__")

    def __init__(self, variants: list, steps: int, warm: int, cuda: bool, where: str,
                 decide: Callable[[list], int | None],
                 gave_up: Callable[[], None] | None = None, inputs: Any = ()) -> None:
        self.variants = list(variants)
        self.fn = self.variants[0]       # what calls run now
        n = len(self.variants)
        self.turns = (warm + steps) * n  # turn k runs variant k % n: one of each per round
        self.warm = warm * n
        self.rounds = steps
        self.index = -1                  # the turn of the current step; -1: not begun
        self.calls = self.seen = self.idle = 0
        self.samples: list[list[float]] = [[] for _ in range(n)]
        self.decide, self.gave_up = decide, gave_up
        self.cuda, self.where = cuda, where
        self.params = frozenset(id(v) for v in inputs if _is_parameter(v))
        self.done = False

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.index < 0 and self.calls > _UNCLOCKED and not _clock.ticked:
            self._let_go("no optimizer step came")  # nothing will time it: free the rest
        return self.fn(*args)

    def begin(self) -> None:
        """The turns start, or go on where they paused, with the next step."""
        self._turn(max(self.index, 0))

    def pause(self) -> None:
        """Another graph takes the turns; this one runs its default until it is back."""
        self.fn = self.variants[0]

    def _turn(self, index: int) -> None:
        self.index, self.seen = index, self.calls
        self.fn = self.variants[index % len(self.variants)]

    def tick(self, seconds: float) -> str:
        """A step of ``seconds`` ended: ``DONE``, ``ON`` (its turns go on) or ``IDLE``
        (not called in that step: another graph may take the turns meanwhile)."""
        if self.done:
            return DONE
        if self.index >= self.turns:  # the turns are over; decide waits
            return self._decide()
        if self.calls == self.seen:
            self.idle += 1
            if self.idle >= _PATIENCE:
                self._let_go(f"not called in {_PATIENCE} of its steps")
                return DONE
            return IDLE
        self.idle = 0
        if self.index >= self.warm:
            self.samples[self.index % len(self.variants)].append(seconds)
        if self.index + 1 < self.turns:
            self._turn(self.index + 1)
            return ON
        self.index = self.turns
        self.fn = self.variants[0]
        return self._decide()

    def _decide(self) -> str:
        k = self.decide(self.samples)
        if k is None:
            return ON
        if k == MORE:
            start = self.turns
            self.turns += self.rounds * len(self.variants)
            self._turn(start)
            return ON
        self._finish(k)
        return DONE

    def _finish(self, k: int) -> Callable[[], None] | None:
        """Run variant ``k`` for good; returns ``gave_up`` for the caller to call."""
        self.fn = self.variants[k]
        self.variants = []  # the others' memory goes; self.fn holds the winner
        self.done = True
        gave_up = self.gave_up
        self.decide = self.gave_up = None
        return gave_up

    def _let_go(self, why: str) -> None:
        if not self.done:
            _log.info("%s: %s; it runs its first choice, unmeasured", self.where, why)
            gave_up = self._finish(0)
            if gave_up is not None:
                gave_up()

    def settle(self) -> None:
        """Stop the turns now, on the default (``agspeed.reset``)."""
        if not self.done:
            self._finish(0)


class _Clock:
    """The optimizer-step hook and the watches waiting for it, oldest first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: deque[weakref.ref] = deque()
        self.handle: Any = None
        self.optimizer: Any = None       # weak reference to the optimizer that ticks
        self.last: float | None = None   # when it last stepped
        self.head: Any = None            # weak reference to the watch whose turns run
        self.ticked = False              # whether any optimizer has stepped
        self.steps: Any = weakref.WeakKeyDictionary()  # optimizer -> steps the head's graph

    def add(self, watch: Turns) -> None:
        with self.lock:
            self.queue.append(weakref.ref(watch))
            if self.handle is None:
                from torch.optim.optimizer import register_optimizer_step_post_hook

                self.handle = register_optimizer_step_post_hook(self._stepped)

    def _next(self) -> Turns | None:
        while self.queue:
            watch = self.queue.popleft()()
            if watch is not None and not watch.done:
                return watch
        return None

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        with self.lock:
            self.ticked = True
            head = self.head() if self.head is not None else None
            if not self._clocks(optimizer, head):
                return
            if head is not None and head.cuda:
                import torch

                torch.cuda.synchronize()
            now = time.perf_counter()
            if head is not None and self.last is not None:
                state = self._tick(head, now - self.last)
                if state == DONE:
                    head = None
                elif state == IDLE and any(r() is not None for r in self.queue):
                    # not called in its step: the next graph takes the turns, and this
                    # one goes on where it paused when it is back at the front
                    head.pause()
                    self.queue.append(weakref.ref(head))
                    head = None
            if head is None:
                head = self._next()
                if head is None:
                    self.head = None
                    self._stop()
                    return
                self.head = weakref.ref(head)
                self.steps = weakref.WeakKeyDictionary()
                head.begin()
            self.last = time.perf_counter()

    def _clocks(self, optimizer: Any, head: Turns | None) -> bool:
        """Whether ``optimizer``'s step is a step of ``head``'s graph: it updates the
        graph's parameters (the first optimizer stepped, for a graph without any)."""
        if head is not None and head.params:
            steps = self.steps.get(optimizer)
            if steps is None:
                steps = self.steps[optimizer] = any(
                    id(p) in head.params for g in optimizer.param_groups for p in g["params"])
            return steps
        ticking = self.optimizer() if self.optimizer is not None else None
        if ticking is None:
            self.optimizer, self.last = weakref.ref(optimizer), None
        return ticking is None or ticking is optimizer

    @staticmethod
    def _tick(head: Turns, seconds: float) -> str:
        try:
            return head.tick(seconds)
        except Exception as exc:  # noqa: BLE001 - the program's step must go on
            _log.warning("agspeed: %s: measuring its turns failed (%s: %s); it runs its "
                         "first choice", head.where, type(exc).__name__, exc)
            head.settle()
            return DONE

    def _stop(self) -> None:
        if self.handle is not None:
            self.handle.remove()
        self.handle = self.optimizer = self.last = None

    def clear(self) -> None:
        with self.lock:
            for ref in [self.head, *self.queue]:
                watch = ref() if ref is not None else None
                if watch is not None:
                    watch.settle()
            self.queue.clear()
            self.head = None
            self._stop()

    def active(self) -> bool:
        return self.handle is not None


_clock = _Clock()


def turns(variants: list, steps: int, warm: int, cuda: bool, where: str,
          decide: Callable[[list], int | None],
          gave_up: Callable[[], None] | None = None, inputs: Any = ()) -> Turns:
    """A ``Turns`` over ``variants``, queued on the optimizer-step clock."""
    t = Turns(variants, steps, warm, cuda, where, decide, gave_up, inputs)
    _clock.add(t)
    return t


def watching(chosen: Callable, eager: Callable, cuda: bool, where: str,
             report: Callable[[dict], None], inputs: Any = ()) -> Callable:
    """``chosen`` for a training graph whose eager form is ``eager``, checked against it
    on the program's steps (see above); ``report(verdict)`` is called once with the
    verdict: ``{"kept": bool, "median_s": the choice's step, "eager_s": eager's step,
    "ratio": eager_s / median_s, "steps": measured steps of each}``.  ``chosen`` itself
    when nothing is to be watched."""
    from agspeed import config

    steps = config.confirm_steps
    if steps <= 0 or distributed():
        return chosen

    def decide(samples: list) -> int:
        kept = _faster(samples[0], samples[1], len(samples[0]) >= _MOST * steps)
        if kept is None:
            return MORE
        mine, eager_s = median(samples[0]), median(samples[1])
        verdict = {"kept": kept, "median_s": mine, "eager_s": eager_s,
                   "ratio": eager_s / mine if mine > 0 else 0.0, "steps": len(samples[0])}
        _log.info("%s: on the program's steps (median of %d each) the choice takes "
                  "%.3f ms, eager %.3f ms: %s", where, verdict["steps"], mine * 1e3,
                  eager_s * 1e3, "kept" if kept else "eager from now on")
        report(verdict)
        return 0 if kept else 1

    return turns([chosen, eager], steps, _WARM, cuda, where, decide, inputs=inputs)


def _faster(mine: list, eager: list, last: bool) -> bool | None:
    """Whether the choice's steps beat eager's, from the steps side by side (the k-th of
    each ran one after the other, so a machine that slows down or speeds up weighs on
    both): when nearly every pair agrees, or, ``last``, by the median of the pairs'
    ratios; None (measure more) while they disagree."""
    ratios = [a / b for a, b in zip(mine, eager) if b > 0]
    if not ratios:
        return True
    wins = sum(r < 1.0 for r in ratios)
    needed = max(1, round(_CLEAR * len(ratios)))
    if wins >= needed or len(ratios) - wins >= needed or last:
        return median(ratios) < 1.0
    return None


def clear() -> None:
    """Stop watching (``agspeed.reset``): every watched graph runs its first choice (the
    autotuner's; DDP's bucket rule) from now on."""
    _clock.clear()


def hooked() -> bool:
    """Whether the optimizer-step hook is installed."""
    return _clock.active()
