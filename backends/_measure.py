"""How the autotuner runs, checks and times a compiled graph without changing the program.

* ``State`` is what a graph call may change besides its outputs: the tensors among its
  inputs that it mutates in place (BatchNorm's running statistics and counter, a data
  tensor updated with ``add_``) and the random number generators of the devices it
  uses.  ``State.take`` records them before tuning; ``restore`` puts them back, so each
  candidate starts where eager started, and the last restore leaves the program where it
  was before the tuning call.  A tensor counts as mutated when its version counter moved
  or its values differ from the copy (kernels such as batch norm's update the running
  statistics without moving the counter): only those are copied back, so tensors an
  outer autograd graph saved are not touched.  Inputs that require grad are copied only
  where the graph writes into them in place (an optimizer's step updating parameters
  under ``no_grad``: ``written_inputs``).
* ``run`` calls a compiled graph the way a training step uses it: the forward, then,
  when the graph needs gradients, the backward of its outputs for fixed output gradients.
  The backward goes through ``torch.autograd.grad``, which returns the gradients of the
  inputs (data and parameters) without accumulating them into ``.grad``.
* ``compare`` checks a candidate's outputs and gradients against eager's: the same
  structure and types, dtypes and shapes, exact equality for integer and boolean tensors,
  and a relative error within a tolerance of the dtype for floating ones (or, past it,
  within a few times eager's own error from a float64 run).
* ``time_pair`` times a candidate against eager in alternating turns (eager, candidate,
  eager, ...), so both see the same machine; the per-turn ratios give the speedup and
  its spread.  CUDA work is timed with events on the current stream, CPU work with a
  monotonic clock.
"""

from __future__ import annotations

import math
import time
from statistics import median
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["State", "Result", "run", "compare", "time_pair", "tolerance", "Mismatch"]

# How far a candidate's floating tensor may be from eager's, per dtype: the root mean
# square of the difference over the tensor's own root mean square magnitude (the "error"
# the log reports), and, ten times looser, the largest difference over its largest
# magnitude (a few wrong elements in a large tensor).  Both magnitudes are at least _FLOOR
# times the largest magnitude of the result's tensors of the same kind (outputs, or
# gradients): a gradient that is zero in exact arithmetic (a bias before a normalization)
# is rounding noise of the size of its neighbours on both sides.  Compiled kernels sum in
# other orders, so float32 results differ from eager's by ~1e-5 to 1e-4 of their size
# after a deep backward; a wrong kernel is off by percents.  Reduced precisions are bound
# by their epsilon.
_TOLERANCE = {"float64": 1e-7, "float32": 1e-3, "bfloat16": 2e-2, "float16": 5e-3}
_MAX_FACTOR = 10.0
_FLOOR = 0.05


def autocast_dtype(devices: set) -> Any:
    """The lowest precision autocast computes in on ``devices`` now, or None."""
    from agspeed.backends._protocol import autocast_state

    found = None
    for _, enabled, dtype in autocast_state(devices):
        if enabled and (found is None or tolerance(dtype) > tolerance(found)):
            found = dtype
    return found


def tolerance(dtype: Any) -> float:
    return _TOLERANCE.get(str(dtype).replace("torch.", ""), 1e-3)


class Mismatch(Exception):
    """A candidate's result differs from eager's; the message says where and how."""


def _tensors(values: list) -> list:
    import torch

    return [v for v in values if isinstance(v, torch.Tensor)]


def _version(t: Any) -> int:
    """A tensor's version counter; -1 for an inference tensor, which has none (its
    values are compared instead)."""
    return -1 if t.is_inference() else t._version


def _layout(t: Any) -> tuple:
    """A tensor's sizes, strides and storage offset: what an in-place view op
    (``unsqueeze_``, ``t_``, ``as_strided_``) changes without a new version."""
    return tuple(t.shape), t.stride(), t.storage_offset()


def _same(a: Any, b: Any) -> bool:
    """Equal values, NaN equal to NaN."""
    import torch

    if a.is_floating_point() or a.is_complex():
        with torch.no_grad():
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


_INPLACE_OPERATORS = ("iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow",
                      "iand", "ior", "ixor", "ilshift", "irshift", "imatmul", "setitem")


def _writes_first_argument(node: Any) -> bool:
    """Whether an FX node changes its first argument in place."""
    import operator

    target = node.target
    if node.kwargs.get("inplace") is True or "out" in node.kwargs:
        return True
    if node.op == "call_method":
        return isinstance(target, str) and (target.endswith("_") and not
                                            target.startswith("_") or target == "__setitem__")
    if node.op != "call_function":
        return False
    schema = getattr(target, "_schema", None)
    if schema is not None:   # an operator of torch's dispatcher
        return bool(schema.is_mutable)
    if any(target is getattr(operator, name) for name in _INPLACE_OPERATORS):
        return True
    name = getattr(target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


def written_inputs(gm: Any) -> set[int] | None:
    """The positions of ``gm``'s placeholders whose memory a node writes into in place
    (found by the storage of its first argument's example value, lists included); None
    when an example value is missing and it cannot be told."""
    import torch

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    storages: dict = {}
    for k, node in enumerate(placeholders):
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor):
            storages.setdefault(_storage_key(value), []).append(k)
    found: set[int] = set()
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method") or not node.args or \
                not _writes_first_argument(node):
            continue
        first = node.args[0]
        for arg in first if isinstance(first, (list, tuple)) else (first,):
            if not isinstance(arg, torch.fx.Node):
                continue
            value = arg.meta.get("example_value", arg.meta.get("val"))
            if not isinstance(value, torch.Tensor):
                return None
            found.update(storages.get(_storage_key(value), ()))
    return found


def _storage_key(value: Any) -> Any:
    try:
        return value.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 - a tensor without storage: its own identity
        return ("tensor", id(value))


class State:
    """The in-place-mutable inputs and the RNG states of one graph call."""

    def __init__(self, inputs: list, gm: Any = None) -> None:
        import torch

        written = written_inputs(gm) if gm is not None else set()
        if written is None:   # not known: every input that requires grad is copied
            written = set(range(len(inputs)))
        self._inputs = _tensors(inputs)
        self._versions = [_version(t) for t in self._inputs]
        self._layouts = [_layout(t) for t in self._inputs]
        self._saved: dict[int, Any] = {}
        self._cpu_rng = torch.get_rng_state()
        self._cuda = sorted({t.device.index or 0 for t in self._inputs
                             if t.device.type == "cuda"})
        self._cuda_rng = [torch.cuda.get_rng_state(d) for d in self._cuda]
        # A copy of every input not requiring grad (what a graph may mutate): taken now,
        # before any run, since which of them a graph mutates is known only after one.
        at = [k for k, v in enumerate(inputs) if isinstance(v, torch.Tensor)]
        with torch.no_grad():
            for k, t in enumerate(self._inputs):
                if not t.requires_grad or at[k] in written:
                    self._saved[k] = t.detach().clone()

    def mutated(self) -> list[int]:
        return [k for k, t in enumerate(self._inputs)
                if _version(t) != self._versions[k] or _layout(t) != self._layouts[k]
                or (k in self._saved and not _same(t, self._saved[k]))]

    def restore(self, rng: bool = True) -> None:
        """Put the mutated inputs (and, with ``rng``, the generators) back as taken: their
        layout (an in-place view op), then their values."""
        import torch

        with torch.no_grad():
            for k, t in enumerate(self._inputs):
                if _layout(t) != self._layouts[k]:
                    t.as_strided_(*self._layouts[k])
            for k in self.mutated():
                saved = self._saved.get(k)
                if saved is None:
                    raise RuntimeError("a graph mutated an input that requires grad")
                self._inputs[k].copy_(saved)
        self._versions = [_version(t) for t in self._inputs]
        if rng:
            torch.set_rng_state(self._cpu_rng)
            for d, s in zip(self._cuda, self._cuda_rng):
                torch.cuda.set_rng_state(s, d)


@dataclass
class Result:
    """Outputs (flattened, detached) and input gradients of one run, and the output
    gradients its backward used (to time other runs with the same ones)."""

    spec: Any
    outputs: list
    grads: list
    grad_outputs: list = field(default_factory=list)


def _grad_targets(inputs: list) -> list:
    return [t for t in _tensors(inputs) if t.requires_grad]


def _differentiable(outputs: Any) -> list:
    """The output tensors a backward starts from: floating ones that require grad."""
    import torch
    from torch.utils._pytree import tree_flatten

    leaves, _ = tree_flatten(outputs)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad
            and t.is_floating_point()]


def _draw(diff: list, seed: int = 0) -> list:
    """Fixed random gradients for the tensors ``diff``, the same in every process."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype)
            .to(t.device) for t in diff]


def backward(outputs: Any, inputs: list, grad_outputs: list | None = None
             ) -> tuple[list, list]:
    """Gradients of ``inputs`` (None where unused) for fixed gradients of the outputs:
    ``grad_outputs``, or drawn when None; returns them with the gradients used."""
    import torch

    targets = _grad_targets(inputs)
    diff = _differentiable(outputs)
    grads = _draw(diff) if grad_outputs is None else grad_outputs
    if not targets or not diff:
        return [], grads
    return list(torch.autograd.grad(diff, targets, grads, allow_unused=True)), grads


def run(fn: Callable, inputs: list, training: bool) -> Result:
    """One call of ``fn`` on ``inputs``, with its backward when ``training``."""
    import torch
    from torch.utils._pytree import tree_flatten

    out = fn(*inputs)
    grads, grad_outputs = backward(out, inputs) if training else ([], [])
    leaves, spec = tree_flatten(out)
    flat = [v.detach() if isinstance(v, torch.Tensor) else v for v in leaves]
    return Result(spec, flat, [g.detach() if g is not None else None for g in grads],
                  grad_outputs)


def _magnitude(values: list) -> float:
    import torch

    top = 0.0
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel():
            finite = v[v.isfinite()]
            if finite.numel():
                top = max(top, finite.abs().max().item())
    return top


def _by_state(value: Any) -> bool:
    """Whether an output that is neither a tensor nor a plain value is compared by what
    it holds: an object compared by identity (each run makes its own: a transformers
    cache), with attributes to compare, and a list, tuple or dict inside one."""
    kind = type(value)
    if kind in (list, tuple, dict):
        return True
    return kind.__eq__ is object.__eq__ and hasattr(value, "__dict__") and \
        not isinstance(value, type)


def _state_error(want: Any, got: Any, what: str, floor: float,
                 depth: int = 0) -> tuple[float, float]:
    """The largest errors over what two objects of one type hold (their attributes, and
    the lists, tuples and dicts in them), item by item."""
    if depth > 8:
        raise Mismatch(f"{what}: nested too deep to compare")
    if isinstance(want, dict) or hasattr(want, "__dict__") and type(want) not in (list, tuple):
        a = want if isinstance(want, dict) else vars(want)
        b = got if isinstance(got, dict) else vars(got)
        if list(a) != list(b):
            raise Mismatch(f"{what}: holds {sorted(map(str, b))} where eager's holds "
                           f"{sorted(map(str, a))}")
        pairs = [(a[k], b[k], f"{what}.{k}") for k in a]
    else:
        if len(want) != len(got):
            raise Mismatch(f"{what}: {len(got)} items where eager gives {len(want)}")
        pairs = [(x, y, f"{what}[{i}]") for i, (x, y) in enumerate(zip(want, got))]
    worst = (0.0, 0.0)
    for x, y, where in pairs:
        if type(x) is type(y) and _by_state(x):   # (a tensor compares by __eq__: not here)
            err = _state_error(x, y, where, floor, depth + 1)
        else:
            err = _error(x, y, where, floor)
            tol = tolerance(getattr(x, "dtype", None))
            if err[0] > tol or err[1] > _MAX_FACTOR * tol:   # no float64 second look here
                raise Mismatch(f"{where}: relative error {err[0]:.2e} (largest "
                               f"{err[1]:.2e}) over the {x.dtype} tolerance {tol:.0e}")
            err = (err[0] / tol * 1e-3, err[1] / tol * 1e-3)   # as a share of it
        worst = (max(worst[0], err[0]), max(worst[1], err[1]))
    return worst


def _error(want: Any, got: Any, what: str, floor: float = 0.0) -> tuple[float, float]:
    """(relative RMS error, relative largest error) of ``got`` against ``want``; raises
    Mismatch where they differ in kind, type, dtype, shape, device or non-finite places."""
    import torch

    if isinstance(want, torch.Tensor) != isinstance(got, torch.Tensor):
        raise Mismatch(f"{what}: {type(got).__name__} where eager gives "
                       f"{type(want).__name__}")
    if not isinstance(want, torch.Tensor):
        if type(want) is type(got) and _by_state(want):
            return _state_error(want, got, what, floor)
        if type(want) is not type(got) or want != got:
            raise Mismatch(f"{what}: {got!r} where eager gives {want!r}")
        return 0.0, 0.0
    if want.dtype != got.dtype or want.shape != got.shape or want.device != got.device:
        raise Mismatch(f"{what}: {got.dtype}{tuple(got.shape)} on {got.device} where "
                       f"eager gives {want.dtype}{tuple(want.shape)} on {want.device}")
    if not (want.is_floating_point() or want.is_complex()):
        if not torch.equal(want, got):
            raise Mismatch(f"{what}: integer values differ")
        return 0.0, 0.0
    if want.numel() == 0:
        return 0.0, 0.0
    w, g = want.double(), got.double()
    same_nan = torch.equal(w.isnan(), g.isnan()) and torch.equal(w.isinf() & (w > 0),
                                                                  g.isinf() & (g > 0))
    if not same_nan:
        raise Mismatch(f"{what}: non-finite values where eager has finite ones")
    finite = w.isfinite()
    if not finite.any():
        return 0.0, 0.0
    w, g = w[finite], g[finite]
    diff = w - g
    rms = max(w.square().mean().sqrt().item(), floor, 1e-6)
    top = max(w.abs().max().item(), floor, 1e-6)
    return diff.square().mean().sqrt().item() / rms, diff.abs().max().item() / top


def _pairs(want: Result, got: Result) -> list:
    """(what, eager's, candidate's, floor, index) for every output and gradient."""
    if want.spec != got.spec:
        raise Mismatch(f"output structure {got.spec} where eager gives {want.spec}")
    if len(want.grads) != len(got.grads):
        raise Mismatch("a different number of input gradients")
    out = []
    floor = _FLOOR * _magnitude(want.outputs)
    for k, (w, g) in enumerate(zip(want.outputs, got.outputs)):
        out.append((f"output {k}", w, g, floor, ("outputs", k)))
    floor = _FLOOR * _magnitude(want.grads)
    for k, (w, g) in enumerate(zip(want.grads, got.grads)):
        if (w is None) != (g is None):
            raise Mismatch(f"gradient {k}: {'none' if g is None else 'one'} where eager "
                           f"has {'none' if w is None else 'one'}")
        if w is not None:
            out.append((f"gradient of input {k}", w, g, floor, ("grads", k)))
    return out


# Against a float64 run: the candidate may be off by this many times eager's own error
# (plus a tenth of the tolerance), and the float64 run is trusted only where eager is
# within _TRUSTED of it (random draws that differ in float64 make it no reference).
_MULTIPLIER = 3.0
_TRUSTED = 0.05


def compare(want: Result, got: Result, exact: Callable[[], "Result | None"] | None = None,
            compute_dtype: Any = None) -> float:
    """The largest relative error of ``got`` against eager's ``want``; raises Mismatch.

    A tensor beyond its dtype's tolerance is checked against the float64 result that
    ``exact()`` computes (once, when first needed; None when it cannot): it passes when
    the candidate's error from float64 is within a few times eager's own, which is how
    far apart two correct float32 kernels that sum in different orders can drift.
    ``compute_dtype`` is the precision the graph computes in when it is lower than its
    results' (autocast's dtype): a float32 gradient computed from bfloat16 products
    carries bfloat16's rounding, so it is held to bfloat16's tolerance.
    """
    err = 0.0
    ref: list = []
    for what, w, g, floor, (part, k) in _pairs(want, got):
        e, top = _error(w, g, what, floor)
        err = max(err, e)
        tol = tolerance(getattr(w, "dtype", None))
        if compute_dtype is not None:
            tol = max(tol, tolerance(compute_dtype))
        if e <= tol and top <= _MAX_FACTOR * tol:
            continue
        if exact is not None and not ref:
            ref.append(exact())
        truth = getattr(ref[0], part)[k] if ref and ref[0] is not None else None
        if truth is not None:
            e_eager = _error(truth, w.to(truth.dtype), what, floor)[0]
            e_cand = _error(truth, g.to(truth.dtype), what, floor)[0]
            if e_eager <= _TRUSTED and e_cand <= _MULTIPLIER * e_eager + tol / 10:
                continue
            raise Mismatch(f"{what}: relative error {e:.2e} from eager (largest "
                           f"{top:.2e}; {w.dtype} tolerance {tol:.0e}), {e_cand:.2e} from "
                           f"float64 where eager is {e_eager:.2e} from it")
        raise Mismatch(f"{what}: relative error {e:.2e} (largest {top:.2e}) over the "
                       f"{w.dtype} tolerance {tol:.0e}")
    return err


def exact_run(fn: Callable, inputs: list, training: bool) -> "Result | None":
    """``fn`` run in float64 without autocast, on float64 copies of the floating inputs
    (leaves again, with the same requires_grad), as a reference; None if it fails."""
    import torch

    def widen(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t.detach().double().requires_grad_(t.requires_grad)
        return t.detach().clone() if isinstance(t, torch.Tensor) else t

    try:
        wide = [widen(t) for t in inputs]
        with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            return run(fn, wide, training)
    except Exception:  # noqa: BLE001 - a graph that cannot run in float64 has no reference
        return None


class _Clock:
    """Elapsed seconds of the work between ``start`` and ``stop``, on the inputs' device."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self._cuda = cuda
        if cuda:
            self._begin = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self._cuda:
            self._begin.record()
        else:
            self._t = time.perf_counter()

    def stop(self) -> float:
        if self._cuda:
            self._end.record()
            self._end.synchronize()
            return self._begin.elapsed_time(self._end) / 1e3
        return time.perf_counter() - self._t


def _quartile(xs: list, q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class Timing:
    """A candidate timed against eager in alternating turns."""

    eager_s: float      # eager's median time per call
    median_s: float     # the candidate's
    ratio: float        # median of eager/candidate over the turns (speedup)
    low: float          # its lower quartile: the speedup held in 3 of 4 turns
    high: float         # its upper quartile
    rounds: int


def time_pair(eager: Callable[[], Any], cand: Callable[[], Any], state: State, cuda: bool,
              warmup: int, seconds: float, min_rounds: int = 5,
              max_rounds: int = 41) -> Timing:
    """Time ``cand()`` against ``eager()`` (each one whole call: forward, backward).

    Turns alternate which of the two runs first.  Rounds continue until ``seconds`` are
    spent (at least ``min_rounds``, at most ``max_rounds``).  Mutated inputs are put back
    between calls, outside the timed part.
    """
    clock = _Clock(cuda)
    for _ in range(warmup):
        eager()
        cand()
        state.restore(rng=False)
    te: list[float] = []
    tc: list[float] = []
    began = time.perf_counter()
    rounds = 0
    while rounds < max_rounds and (rounds < min_rounds or
                                   time.perf_counter() - began < seconds):
        order = ((te, eager), (tc, cand)) if rounds % 2 == 0 else ((tc, cand), (te, eager))
        for times, fn in order:
            clock.start()
            fn()
            times.append(clock.stop())
            state.restore(rng=False)
        rounds += 1
    ratios = [e / c if c > 0 else math.inf for e, c in zip(te, tc)]
    return Timing(median(te), median(tc), median(ratios), _quartile(ratios, 0.25),
                  _quartile(ratios, 0.75), rounds)
