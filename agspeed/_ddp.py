"""DDP: the wrapped module is captured, and its gradients are still reduced during the
backward, at cut points chosen by measurement.

Both ``optimize(DDP(model))`` and ``DDP(optimize(model))`` reach here.  DDP's own
``forward`` is torch's code and runs eager (``agspeed._roots``); the wrapped module's
frames are captured as anywhere else.  While DDP runs the wrapped module it names itself
in ``DistributedDataParallel._active_ddp_module``, and that is how a compile knows its
graph is trained under DDP (``active``).

Such a graph, compiled by any backend but eager (which runs op by op, so gradients become
ready one by one as in plain PyTorch), is cut into pieces along DDP's buckets
(``backends._split``), each piece compiled on its own.  How many pieces is a trade:
DDP's bucket rule, which torch.compile uses, starts communication earliest; fewer pieces
fuse more.  So the candidates are that rule and the rule with its bucket caps doubled
again and again, down to the whole graph, and the first training steps measure them
(``backends._confirm.Turns``): each candidate runs for a whole step in turn, a step
being the time from one ``optimizer.step()`` to the next (micro-batches under
``no_sync()`` included), and after ``config.ddp_tune_steps`` measured steps of each (and
two unmeasured rounds) the ranks post their medians to each other (``_Board``), and each
takes the same fastest candidate by the slowest rank's time (a step is as slow as the
slowest rank), once all have posted (``_Decider``; the steps go on with the bucket rule
meanwhile).  A candidate must beat the bucket rule by more than ``_MARGIN`` to replace
it.  A loop without torch.optim has no step clock: it keeps the bucket rule.

The choice is stored in the knowledge base (a record keyed by the graph, its inputs, the
environment and the DDP layout: world size, bucket caps, communication backend).  A later
run compiles only the remembered cut; rank 0's knowledge base decides for every rank
(posted when the graph is compiled), so ranks whose bases differ still agree.  The ranks
talk through the job's key-value store, never through collectives: a rank that never
compiles the graph delays the others by at most ``config.ddp_wait`` seconds and cannot
hang them.  With ``ddp_tune_steps`` 0 the bucket rule is used without measuring.  A cut
that fails to compile falls back to the whole graph, and that to eager, with a warning.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import sys
import threading
import time
import weakref
from statistics import median
from typing import Any, NamedTuple

__all__ = ["active", "wants_cut", "compile_cut", "later", "Split", "splits",
           "clear_splits"]

_log = logging.getLogger("agspeed.autotune")
_warn = logging.getLogger("agspeed")
# A candidate replaces the bucket rule only when its step is faster by more than this.
_MARGIN = 0.02
# Rounds of candidates run before measuring (first calls set things up).
_WARM_ROUNDS = 2


class Split(NamedTuple):
    """How one DDP graph was cut, in this process."""

    graph: str              # "forward (model.py:12)"
    pieces: int             # the pieces of the chosen cut
    candidates: dict        # pieces -> median step seconds on the slowest rank; {} if not measured
    source: str             # "tuned", "knowledge base", "bucket rule", "only cut", "fallback"


_SPLITS: list[Split] = []
_splits_lock = threading.Lock()


def splits() -> list[Split]:
    """The DDP graphs cut since the last ``agspeed.reset()``, with their cuts."""
    with _splits_lock:
        return list(_SPLITS)


def clear_splits() -> None:
    with _splits_lock:
        _SPLITS.clear()


def _note(split: Split) -> None:
    with _splits_lock:
        _SPLITS.append(split)


def active() -> Any:
    """The DDP module running its wrapped module now, or None."""
    module = sys.modules.get("torch.nn.parallel.distributed")
    if module is None:
        return None
    return getattr(module.DistributedDataParallel, "_active_ddp_module", None)


def _reduced(ddp: Any) -> dict[int, int]:
    """id -> bytes of the parameters whose gradients ``ddp`` reduces."""
    ignored = getattr(ddp, "parameters_to_ignore", ()) or ()
    return {id(p): p.numel() * p.element_size()
            for name, p in ddp.module.named_parameters()
            if p.requires_grad and name not in ignored}


def _caps(ddp: Any) -> tuple[int, int]:
    """DDP's (bucket cap, first bucket cap) in bytes."""
    import torch.distributed as dist

    config = getattr(ddp, "_bucket_config", None)
    if config is not None and hasattr(config, "first_bucket_bytes_cap"):
        return int(config.bucket_bytes_cap), int(config.first_bucket_bytes_cap)
    cap = int(ddp.bucket_bytes_cap)
    small = getattr(ddp, "bucket_bytes_cap_default", False)
    first = min(int(getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", cap)), cap) if small else cap
    return cap, first


def _trains(backend: Any) -> bool:
    """Whether a graph compiled now by ``backend`` may be cut for DDP: gradients are on
    and the backend is not eager (which runs op by op, so gradients are ready one by
    one already)."""
    import torch

    from agspeed.backends import eager

    return backend is not eager.backend and torch.is_grad_enabled()


def wants_cut(backend: Any, inputs: list, ddp: Any) -> bool:
    """Whether a graph compiled by ``backend`` on ``inputs`` under ``ddp`` is cut: a
    training graph reading parameters DDP reduces, for a backend other than eager."""
    if not _trains(backend):
        return False
    reduced = _reduced(ddp)
    return any(id(v) in reduced for v in inputs)


class _Board:
    """What the ranks of one DDP group tell each other about one graph, through the
    job's key-value store (the one ``init_process_group`` made).

    Not a collective: a rank that never compiles the graph (its batches took another
    shape) cannot hang the others, who wait at most ``config.ddp_wait`` seconds and
    then go on with what they have, saying so.  Keys name the graph (its code and inputs and the
    DDP layout, which every rank shares) and how many times this process compiled it.
    """

    _seen: dict = {}
    _lock = threading.Lock()

    def __init__(self, group: Any, graph: str) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        self.store = c10d._get_default_store()
        self.ranks = sorted(dist.get_process_group_ranks(group))
        self.rank = dist.get_rank()
        with self._lock:
            n = self._seen[graph] = self._seen.get(graph, 0) + 1
        self.prefix = f"agspeed/ddp/{graph}/{n}/"

    def post(self, name: str, value: Any) -> None:
        self.store.set(f"{self.prefix}{name}/{self.rank}", json.dumps(value))

    def peek(self, name: str, ranks: list) -> dict:
        """rank -> value posted as ``name`` by those of ``ranks`` that have, now."""
        got = {}
        for r in ranks:
            key = f"{self.prefix}{name}/{r}"
            if self.store.check([key]):
                got[r] = json.loads(self.store.get(key))
        return got

    def read(self, name: str, ranks: list) -> dict:
        """rank -> value posted as ``name`` by each of ``ranks`` within the wait."""
        import datetime

        from agspeed import config

        keys = [f"{self.prefix}{name}/{r}" for r in ranks]
        try:
            self.store.wait(keys, datetime.timedelta(seconds=config.ddp_wait))
        except Exception:  # noqa: BLE001 - a timeout: take what arrived
            pass
        return self.peek(name, ranks)


def _board(group: Any, gm: Any, inputs: list, layout: "_Layout") -> "_Board | None":
    """The graph's board, or None (and a warning) where the store cannot be reached."""
    from agspeed.backends import knowledge

    graph = knowledge.graph_key(gm, inputs, {"ddp": layout._asdict()})
    try:
        return _Board(group, graph)
    except Exception as exc:  # noqa: BLE001 - private torch API: the ranks decide alone
        _warn.warning("agspeed: no store to agree on DDP cuts (%s: %s); each rank "
                      "decides alone", type(exc).__name__, exc)
        return None


def _label(n: int) -> str:
    return "1 piece" if n == 1 else f"{n} pieces"


def later(name: str, backend: Any, gm: Any, inputs: list, compiled: Any) -> Any:
    """``compiled``, ``gm`` compiled outside DDP, made to cut the graph the first time a
    call runs under DDP: a model run before it is wrapped (a warm-up or evaluation
    forward) reuses its graph under DDP, since DDP is not part of the guard, and uncut its
    gradients would all reach DDP at the end of the backward.  ``compiled`` itself for a
    graph no DDP would cut."""
    import torch

    dist = torch.distributed
    if not _trains(backend) or not dist.is_available() or not dist.is_initialized():
        return compiled  # no DDP without a process group
    if not any(isinstance(v, torch.nn.Parameter) and v.requires_grad for v in inputs):
        return compiled
    return _Later(name, backend, gm, compiled)


class _Later:
    """A training graph compiled outside DDP: ``fn`` outside DDP, its cut under one."""

    __slots__ = ("fn", "name", "backend", "gm", "ddp", "cut")

    def __init__(self, name: str, backend: Any, gm: Any, fn: Any) -> None:
        self.fn, self.name, self.backend, self.gm = fn, name, backend, gm
        self.ddp: Any = None   # weak reference to the DDP module ``cut`` was made under
        self.cut: Any = None

    def __call__(self, *args: Any) -> Any:
        ddp = active()
        if ddp is None:
            return self.fn(*args)
        if self.ddp is None or self.ddp() is not ddp:
            self.cut = self._compile(ddp, list(args))
            self.ddp = weakref.ref(ddp)
        return self.cut(*args)

    def _compile(self, ddp: Any, args: list) -> Any:
        """The graph cut for ``ddp`` and compiled on this call's inputs, as a capture
        under it would have; ``fn`` when it reads no parameter ``ddp`` reduces."""
        if not wants_cut(self.backend, args, ddp):
            return self.fn
        where = self.gm.meta.get("agspeed_where", "graph")
        _log.info("%s: compiled outside DDP, now trained under it: cutting it", where)
        fn, failed = compile_cut(self.name, self.backend, self.gm, args, ddp)
        if failed:
            _warn.warning("agspeed: %s: %s; it runs as compiled outside DDP", where, failed)
            return self.fn
        return fn


class _Layout(NamedTuple):
    """What a DDP graph's cut depends on besides the graph."""

    world: int
    cap: int
    first_cap: int
    comm: str


def _layout(ddp: Any) -> _Layout:
    import torch.distributed as dist

    group = ddp.process_group
    cap, first = _caps(ddp)
    return _Layout(dist.get_world_size(group), cap, first, str(dist.get_backend(group)))


def _build(name: str, backend: Any, flat: Any, inputs: list, pieces: dict,
           sized: list) -> Any:
    """``flat`` cut into ``pieces``, each compiled by ``backend``: the flat graph's
    callable.  The pieces are compiled in order, each on the values the earlier ones
    computed from ``inputs``; state they change is put back.  ``sized`` lists the
    (input, dimension) of each size input ``flat`` takes first (``_split.bind_sizes``)."""
    import torch

    from agspeed.backends import _measure, _split
    from agspeed.backends.autotune import compile_graph

    split = _split.cut(flat, pieces)
    where = flat.meta.get("agspeed_where", "graph")
    total = _split.count(pieces)
    state = _measure.State(inputs, flat)

    class Compiling(torch.fx.Interpreter):
        def call_module(self, target: str, args: tuple, kwargs: dict) -> Any:
            child = self.fetch_attr(target)
            k = int(target.rsplit("_", 1)[-1])
            child.meta["agspeed_where"] = f"{where}, piece {k + 1} of {total}"
            fn, failed = compile_graph(name, backend, child, list(args))
            if failed:
                raise RuntimeError(f"piece {k + 1} of {total}: {failed}")
            setattr(split, target, _piece_class()(fn))
            return fn(*args)

    try:
        Compiling(split).run(*_split.size_values(sized, inputs), *inputs)
    finally:
        state.restore()
    if not sized:
        return split.forward
    forward = split.forward

    def with_sizes(*args: Any) -> Any:
        return forward(*_split.size_values(sized, args), *args)

    return with_sizes


@functools.lru_cache(maxsize=None)
def _piece_class() -> type:
    import torch

    class Piece(torch.nn.Module):
        """One compiled piece, in the place of its graph in the cut graph."""

        def __init__(self, fn: Any) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, *args: Any) -> Any:
            return self.fn(*args)

    return Piece


class _Candidates:
    """A DDP graph's cuts: compiled on demand, in a fixed order (most pieces first)."""

    def __init__(self, name: str, backend: Any, gm: Any, inputs: list, ddp: Any) -> None:
        from agspeed.backends import _split
        from agspeed.backends._outputs import flat_output

        self.name, self.backend, self.gm, self.inputs = name, backend, gm, inputs
        self.flat, self.wrap = flat_output(gm)
        self.flat.meta.update(gm.meta)
        self.sized = _split.bind_sizes(self.flat)
        sizes = _split.size_values(self.sized, inputs)
        cap, first = _caps(ddp)
        self.plans = _split.plans(self.flat, sizes + list(inputs), _reduced(ddp), cap, first)
        self.sizes = [_split.count(p) for p in self.plans]

    def compile(self, k: int) -> Any:
        """Candidate ``k``'s callable; raises when it cannot be compiled."""
        from agspeed.backends.autotune import compile_graph

        if self.sizes[k] == 1:
            fn, failed = compile_graph(self.name, self.backend, self.gm, self.inputs)
            if failed:
                raise RuntimeError(failed)
            return fn
        run = _build(self.name, self.backend, self.flat, self.inputs, self.plans[k],
                     self.sized)
        return self.wrap(run)


def _key(cands: _Candidates, layout: _Layout) -> tuple[str, dict]:
    from agspeed.backends import knowledge
    from agspeed.backends._protocol import graph_devices

    env = dict(knowledge.environment(graph_devices(cands.inputs)),
               ddp=layout._asdict(), backend=cands.name)
    return knowledge.graph_key(cands.gm, cands.inputs, env), env


def compile_cut(name: str, backend: Any, gm: Any, inputs: list, ddp: Any) -> tuple[Any, str | None]:
    """``gm`` compiled by ``backend`` for training under ``ddp``; like ``compile_graph``,
    (callable, None) or (a fallback, why)."""
    from agspeed import config
    from agspeed.backends import _confirm, knowledge
    from agspeed.backends._protocol import graph_devices
    from agspeed.backends.autotune import compile_graph

    where = gm.meta.get("agspeed_where", "graph")
    try:
        cands = _Candidates(name, backend, gm, inputs, ddp)
    except Exception as exc:  # noqa: BLE001 - the whole graph still compiles
        _warn.warning("agspeed: %s: cannot cut the graph for DDP (%s: %s); compiled whole",
                      where, type(exc).__name__, exc)
        return compile_graph(name, backend, gm, inputs)
    if len(cands.sizes) == 1:  # nothing to choose, to remember or to agree on
        return _compile_one(cands, 0, where, "only cut")
    layout = _layout(ddp)
    key, env = _key(cands, layout)
    rec = None if config.retune else knowledge.load(key, env)
    remembered = rec.get("choice") if rec else None
    board = _board(ddp.process_group, gm, inputs, layout)
    if board is not None:  # rank 0's memory decides for every rank
        first = board.ranks[0]
        if board.rank == first:
            board.post("remembered", remembered)
        got = board.read("remembered", [first])
        if first in got:
            remembered = got[first]
        else:
            _warn.warning("agspeed: %s: rank %d did not say how to cut this graph; this "
                          "rank decides alone", where, first)
    labels = [_label(n) for n in cands.sizes]
    if remembered in labels or config.ddp_tune_steps == 0:
        k = labels.index(remembered) if remembered in labels else 0
        source = "knowledge base" if remembered in labels else "bucket rule"
        if source == "knowledge base":
            _log.info("%s: knowledge base says cut in %s for DDP; not measuring again",
                      where, labels[k])
        return _compile_one(cands, k, where, source)
    compiled = []
    for k in range(len(labels)):
        try:
            compiled.append(cands.compile(k))
        except Exception as exc:  # noqa: BLE001 - that cut is left out
            _warn.warning("agspeed: %s: the DDP cut in %s failed to compile (%s: %s)",
                          where, labels[k], type(exc).__name__, exc)
            compiled.append(None)
    live = [k for k, fn in enumerate(compiled) if fn is not None]
    if not live:
        return compile_graph(name, backend, gm, inputs)
    if len(live) == 1:  # nothing left to choose between
        _note(Split(where, cands.sizes[live[0]], {}, "only cut"))
        return compiled[live[0]], None
    meta = {"graph": where, "kind": "ddp cut", "training": True}
    cuda = "cuda" in graph_devices(inputs)
    decide = _Decider(board, cands.sizes, live, key, env, meta, config.ddp_tune_steps)
    return _confirm.turns([compiled[k] for k in live], config.ddp_tune_steps,
                          _WARM_ROUNDS, cuda, where, decide, decide.gave_up, inputs), None


def _compile_one(cands: _Candidates, k: int, where: str,
                 source: str) -> tuple[Any, str | None]:
    """Candidate ``k`` compiled, or else the whole graph, like ``compile_graph``:
    (callable, why the backend failed or None); the cut used is noted with ``source``
    ("fallback" when it was the whole graph instead)."""
    from agspeed.backends.autotune import compile_graph

    if cands.sizes[k] == 1:  # the whole graph: its failure is compile_graph's to report
        _note(Split(where, 1, {}, source))
        return compile_graph(cands.name, cands.backend, cands.gm, cands.inputs)
    try:
        fn = cands.compile(k)
    except Exception as exc:  # noqa: BLE001 - the whole graph still runs
        _warn.warning("agspeed: %s: the DDP cut in %s failed to compile (%s: %s); "
                      "compiled whole", where, _label(cands.sizes[k]), type(exc).__name__,
                      exc)
        _note(Split(where, 1, {}, "fallback"))
        return compile_graph(cands.name, cands.backend, cands.gm, cands.inputs)
    _note(Split(where, cands.sizes[k], {}, source))
    return fn, None


class _Decider:
    """How a DDP graph's measured cuts become one choice, the same on every rank: each
    rank posts its median step time per cut to the board and takes, once every rank has
    posted (or ``config.ddp_wait`` seconds after its own post, with a warning), the
    fastest cut by the slowest rank's time.  It never blocks: until the others have
    posted, the steps go on with the bucket rule (``_confirm.Turns`` asks again at each
    step), so ranks whose turns began at different steps (one recompiled for a shape the
    others saw earlier) cannot stall each other's allreduce.  Ranks in step decide at
    the same step: the one after they post."""

    def __init__(self, board: "_Board | None", sizes: list, live: list, key: str,
                 env: dict, meta: dict, steps: int) -> None:
        self.board, self.sizes, self.live = board, sizes, live
        self.key, self.env, self.meta = key, env, meta
        self.steps = steps
        self.posted: float | None = None

    def __call__(self, samples: list) -> int | None:
        local = [median(s) if s else math.inf for s in samples]
        times = self._slowest(local)
        if times is None:
            return None
        base = times[0]
        best = min(range(len(times)), key=times.__getitem__)
        if not times[best] < base * (1 - _MARGIN):
            best = 0
        self._remember(times, best)
        return best

    def gave_up(self) -> None:
        """The turns ended without a decision: the bucket rule stays, unremembered."""
        _note(Split(self.meta["graph"], self.sizes[self.live[0]], {}, "bucket rule"))

    def _slowest(self, local: list) -> list | None:
        """Each cut's time on the slowest rank, in ``self.live``'s order, or None while
        ranks have yet to post.  Posted by label, so ranks whose compiled cuts differ
        still compare the same cuts; a cut some rank lacks counts as never faster.
        Without a board, this rank's own times."""
        if self.board is None:
            return local
        labels = [_label(self.sizes[k]) for k in self.live]
        if self.posted is None:
            # read from the next step on: that step's allreduce passes every rank in
            # step with this one past its own post, so such ranks decide together
            self.board.post("times", dict(zip(labels, local)))
            self.posted = time.monotonic()
            return None
        got = self.board.peek("times", self.board.ranks)
        missing = sorted(set(self.board.ranks) - set(got))
        if missing:
            from agspeed import config

            if time.monotonic() - self.posted < config.ddp_wait:
                return None
            _warn.warning("agspeed: %s: ranks %s did not report their DDP step times; "
                          "the cut is chosen without them", self.meta["graph"], missing)
        rows = [v for v in got.values() if isinstance(v, dict)] or [dict(zip(labels, local))]
        return [max(row.get(label, math.inf) for row in rows) for label in labels]

    def _remember(self, times: list, best: int) -> None:
        from agspeed.backends import knowledge

        k = self.live[best]
        measured = {_label(self.sizes[j]): t for j, t in zip(self.live, times)}
        base = times[0]
        for j, t in zip(self.live, times):
            ratio = base / t if t and math.isfinite(base) else 0.0
            m = {"status": "ok", "median_s": t, "ratio": ratio, "rounds": self.steps} \
                if math.isfinite(t) else {"status": "failed",
                                          "reason": "not measured on every rank"}
            try:
                knowledge.record(self.key, self.env, self.meta, _label(self.sizes[j]), m)
            except OSError as exc:
                _warn.warning("agspeed: cannot write the knowledge base (%s)", exc)
                break
        else:
            try:
                if math.isfinite(times[best]):
                    knowledge.choose(self.key, self.env, self.meta, _label(self.sizes[k]))
            except (OSError, ValueError) as exc:
                _warn.warning("agspeed: cannot write the knowledge base (%s)", exc)
        where = self.meta["graph"]
        _note(Split(where, self.sizes[k], {self.sizes[j]: t for j, t in
                                           zip(self.live, times)}, "tuned"))
        if _log.isEnabledFor(logging.INFO):
            shown = ", ".join(f"{label} {t * 1e3:.2f} ms" for label, t in measured.items())
            _log.info("%s: DDP step by cut (slowest rank, median of %d): %s; %s chosen",
                      where, self.steps, shown, _label(self.sizes[k]))
