"""The autotuner (backend "auto"): what it chooses, and that choosing changes nothing.

Candidates here are small backends registered by the tests, each with one known trait
(fast and right, fast and wrong, slowed down, the same as eager, raising, hanging), on
graphs whose eager cost is known, so each decision is certain whatever the machine's
load: a chain of 300 multiplications by one against a single one, a 20 ms sleep against
a graph of microseconds.  One test tunes a real backend (inductor) on a model with
dropout and BatchNorm and checks the whole training state against an eager run.
"""

import logging
import sys
import time

import pytest

import agspeed
from _logs import logged
from agspeed import backends
from agspeed.backends import autotune, knowledge

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = F = None

pytestmark = pytest.mark.torch

if torch is not None:

    class Chain(nn.Module):
        """300 multiplications by one: slow in eager, equal to one multiplication."""

        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(8))

        def forward(self, x):
            y = x * self.scale
            for _ in range(300):
                y = y * 1.0
            return y

    class Noisy(nn.Module):
        """Dropout and BatchNorm in training: RNG and buffers change on every call."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 16)
            self.bn = nn.BatchNorm1d(16)
            self.drop = nn.Dropout(0.3)
            self.out = nn.Linear(16, 4)

        def forward(self, x):
            return self.out(self.drop(F.relu(self.bn(self.fc(x)))))


def _one_mul(gm, example_inputs):
    """Right for Chain, 300 times cheaper."""
    return lambda x, scale: (x * scale,)


def _one_mul_off(gm, example_inputs):
    """Fast and wrong: one percent off."""
    return lambda x, scale: (x * scale * 1.01,)


def _slowed(gm, example_inputs):
    def run(*args):
        time.sleep(0.02)
        return gm.forward(*args)
    return run


def _same(gm, example_inputs):
    return gm.forward


def _raising(gm, example_inputs):
    raise ValueError("this candidate cannot compile anything")


def _hanging(gm, example_inputs):
    time.sleep(3)
    return gm.forward


def _twice(gm, example_inputs):
    """Every call runs the graph twice: the BatchNorm counter, running statistics and the
    RNG move twice per call, and with dropout the result is another mask's."""
    def run(*args):
        gm.forward(*args)
        return gm.forward(*args)
    return run


_CANDIDATES = {"t_fast": _one_mul, "t_wrong": _one_mul_off, "t_slow": _slowed,
               "t_same": _same, "t_raise": _raising, "t_hang": _hanging,
               "t_twice": _twice}


@pytest.fixture
def candidates(tmp_path):
    for name, fn in _CANDIDATES.items():
        agspeed.register_backend(name, fn, override=True)
    with agspeed.config.override(cache_dir=str(tmp_path / "kb"), progress=False,
                                 tune_after=1):   # tuned on the capturing call
        yield
    for name in _CANDIDATES:
        backends._registered.pop(name, None)


def _tuned(model, *inputs, **options):
    """Optimize ``model`` with the autotuner and call it once; returns the optimized
    model, the output and the knowledge base's records."""
    optimized = agspeed.optimize(model, **options)
    out = optimized(*inputs)
    return optimized, out, knowledge.records()


def _chain_input():
    return torch.randn(4, 8)


def test_a_fast_right_candidate_wins_and_runs_later_calls(candidates):
    model = Chain()
    x = _chain_input()
    optimized, out, recs = _tuned(model, x, candidates=("t_fast",))
    torch.testing.assert_close(out, model(x))
    (rec,) = recs
    assert rec["choice"] == "t_fast"
    m = rec["candidates"]["t_fast"]
    assert m["status"] == "ok" and m["ratio"] > 2 and m["low"] > 1.01
    # later calls hit the cache and run the chosen callable: no 300-node graph
    y = torch.randn(4, 8)
    torch.testing.assert_close(optimized(y), model(y))
    assert agspeed.counters()["cache_hits"] >= 1


def test_a_wrong_candidate_is_never_chosen_however_fast(candidates):
    model = Chain()
    x = _chain_input()
    _, out, (rec,) = _tuned(model, x, candidates=("t_wrong",))
    torch.testing.assert_close(out, model(x))  # the call itself is right
    assert rec["candidates"]["t_wrong"]["status"] == "wrong"
    assert "relative error" in rec["candidates"]["t_wrong"]["reason"]
    assert rec["choice"] == "eager"


def test_a_wrong_candidate_loses_to_a_right_one(candidates):
    _, _, (rec,) = _tuned(Chain(), _chain_input(), candidates=("t_wrong", "t_fast"))
    assert rec["choice"] == "t_fast"
    assert rec["candidates"]["t_wrong"]["status"] == "wrong"


def test_wrong_gradients_are_caught_in_training(candidates):
    def right_forward_wrong_backward(gm, example_inputs):
        class Off(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, scale):
                ctx.save_for_backward(x, scale)
                return x * scale

            @staticmethod
            def backward(ctx, g):
                x, scale = ctx.saved_tensors
                return g * scale, (g * x).sum(0) * 2  # the scale's gradient doubled

        return lambda x, scale: (Off.apply(x, scale),)

    agspeed.register_backend("t_badgrad", right_forward_wrong_backward, override=True)
    try:
        model = Chain()
        x = _chain_input().requires_grad_()
        _, out, (rec,) = _tuned(model, x, candidates=("t_badgrad",))
    finally:
        backends._registered.pop("t_badgrad", None)
    m = rec["candidates"]["t_badgrad"]
    assert m["status"] == "wrong" and "gradient" in m["reason"]
    assert rec["choice"] == "eager" and rec["training"] is True


def test_a_slowed_down_candidate_loses(candidates):
    _, _, (rec,) = _tuned(Noisy().eval(), torch.randn(4, 8), candidates=("t_slow",))
    m = rec["candidates"]["t_slow"]
    assert m["status"] == "ok" and m["ratio"] < 1
    assert rec["choice"] == "eager"


def test_a_tie_keeps_eager(candidates):
    """A candidate no faster than eager's own spread loses: decided by the pick rule
    on measurements, not by how this machine's timings fell today (the end-to-end run
    records what the rule picks from its own measurements)."""
    tie = {"status": "ok", "ratio": 1.03, "low": 0.98}
    ahead = {"status": "ok", "ratio": 1.30, "low": 1.20}
    assert autotune._pick({"eager": {"status": "ok"}, "t_same": tie}) == "eager"
    assert autotune._pick({"eager": {"status": "ok"}, "t_same": tie,
                           "t_fast": ahead}) == "t_fast"
    _, _, (rec,) = _tuned(Noisy().eval(), torch.randn(4, 8), candidates=("t_same",))
    assert rec["candidates"]["t_same"]["status"] == "ok"
    assert rec["choice"] == autotune._pick(rec["candidates"])


def test_a_raising_candidate_is_skipped_and_logged(candidates):
    model = Chain()
    x = _chain_input()
    with logged("autotune") as messages:
        _, out, (rec,) = _tuned(model, x, candidates=("t_raise", "t_fast"))
    torch.testing.assert_close(out, model(x))
    m = rec["candidates"]["t_raise"]
    assert m["status"] == "failed" and "cannot compile anything" in m["reason"]
    assert rec["choice"] == "t_fast"
    table = "\n".join(messages)
    assert "t_raise" in table and "failed" in table and "t_fast wins" in table


def test_a_candidate_past_the_budget_is_abandoned(candidates):
    model = Chain()
    x = _chain_input()
    _, out, (rec,) = _tuned(model, x, candidates=("t_hang",), tune_budget=0.5)
    torch.testing.assert_close(out, model(x))
    m = rec["candidates"]["t_hang"]
    assert m["status"] == "failed" and "budget" in m["reason"]
    assert rec["choice"] == "eager"


def test_the_budget_knob_reaches_the_autotuner(candidates):
    with agspeed.config.override(tune_budget=0.5):
        _, _, (rec,) = _tuned(Chain(), _chain_input(), candidates=("t_hang",))
    assert "budget" in rec["candidates"]["t_hang"]["reason"]


def _train_step(model, opt, x, seed):
    torch.manual_seed(seed)
    opt.zero_grad(set_to_none=True)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    return loss.detach()


@pytest.mark.parametrize("names", [("t_twice", "t_same"), ("inductor", "t_twice")])
def test_tuning_leaves_the_training_state_of_one_eager_step(candidates, names):
    torch.manual_seed(0)
    eager = Noisy()
    tuned = Noisy()
    tuned.load_state_dict(eager.state_dict())
    optimized = agspeed.optimize(tuned, candidates=names)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_t = torch.optim.SGD(tuned.parameters(), lr=0.1)
    x = torch.randn(16, 8)
    for step in range(3):  # the first step tunes; the next ones run the choice
        loss_e = _train_step(eager, opt_e, x, step)
        rng_e = torch.get_rng_state()
        loss_t = _train_step(optimized, opt_t, x, step)
        rng_t = torch.get_rng_state()
        assert torch.equal(rng_e, rng_t), f"RNG state differs after step {step}"
        torch.testing.assert_close(loss_t, loss_e)
        for (name, a), b in zip(eager.state_dict().items(), tuned.state_dict().values()):
            torch.testing.assert_close(b, a, msg=f"{name} after step {step}")
        for (name, p), q in zip(eager.named_parameters(), tuned.parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=f"{name}.grad after step {step}")
    assert tuned.bn.num_batches_tracked.item() == 3
    (rec,) = knowledge.records()
    assert set(names) <= set(rec["candidates"])
    # t_twice's second run draws another dropout mask: not what eager computes
    assert rec["candidates"]["t_twice"]["status"] == "wrong"
    assert rec["choice"] != "t_twice"


def test_the_knowledge_base_answers_a_second_optimize_without_tuning(candidates):
    x = _chain_input()
    _tuned(Chain(), x, candidates=("t_fast",))
    agspeed.reset()  # forget the code caches: the graph is captured and compiled again
    with logged("autotune") as messages:
        _tuned(Chain(), x, candidates=("t_fast",))
    text = "\n".join(messages)
    assert "knowledge base says t_fast" in text and "not tuning" in text
    assert "tuned" not in text.replace("tuned 20", "")  # no new table


def test_retune_measures_again(candidates):
    x = _chain_input()
    _tuned(Chain(), x, candidates=("t_fast",))
    agspeed.reset()
    with logged("autotune") as messages, agspeed.config.override(retune=True):
        _tuned(Chain(), x, candidates=("t_fast",))
    text = "\n".join(messages)
    assert "tuned t_fast" in text and "knowledge base says" not in text


def test_an_unavailable_candidate_is_skipped_with_its_reason(candidates):
    # cudagraphs takes CUDA inputs only; on CPU inputs it declines, whatever the machine
    _, _, (rec,) = _tuned(Chain(), _chain_input(), candidates=("cudagraphs", "t_fast"))
    m = rec["candidates"]["cudagraphs"]
    assert m["status"] == "failed" and "unavailable" in m["reason"]
    assert rec["choice"] == "t_fast"


def test_only_eager_means_no_tuning_and_no_record(candidates):
    model = Chain()
    x = _chain_input()
    _, out, recs = _tuned(model, x, candidates=("eager",))
    torch.testing.assert_close(out, model(x))
    assert recs == []


def test_the_progress_bar_shows_on_a_terminal_only(candidates, monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def slow_compile(gm, example_inputs):
        time.sleep(1.3)  # past the bar's one-second delay
        return lambda x, scale: (x * scale,)

    agspeed.register_backend("t_slowcompile", slow_compile, override=True)
    try:
        screen = Terminal()
        monkeypatch.setattr(sys, "stderr", screen)
        with agspeed.config.override(progress=True):
            _tuned(Chain(), _chain_input(), candidates=("t_slowcompile",))
        assert "agspeed tuning" in screen.getvalue()
        agspeed.reset()
        knowledge.clear()
        piped = io.StringIO()
        monkeypatch.setattr(sys, "stderr", piped)
        with agspeed.config.override(progress=True):
            _tuned(Chain(), _chain_input(), candidates=("t_slowcompile",))
        assert "agspeed tuning" not in piped.getvalue()
    finally:
        backends._registered.pop("t_slowcompile", None)


def test_a_failing_fixed_backend_leaves_the_graph_captured_and_eager(caplog):
    model = Chain()
    x = _chain_input()
    with caplog.at_level(logging.WARNING, logger="agspeed"):
        out = agspeed.optimize(model, backend=_raising)(x)
    torch.testing.assert_close(out, model(x))
    assert "cannot compile anything" in caplog.text and "runs eagerly" in caplog.text
    assert any(r.decision == "captured" for r in agspeed._runtime.frame_records())


def test_a_fixed_backend_that_runs_the_graph_while_compiling_changes_no_state():
    # a compile that runs the graph (as tracing does) must not move BatchNorm or the RNG
    def running(gm, example_inputs):
        gm.forward(*example_inputs)
        return gm.forward

    torch.manual_seed(0)
    eager, model = Noisy(), Noisy()
    model.load_state_dict(eager.state_dict())
    x = torch.randn(16, 8)
    torch.manual_seed(1)
    want = eager(x)
    rng = torch.get_rng_state()
    torch.manual_seed(1)
    got = agspeed.optimize(model, backend=running)(x)
    torch.testing.assert_close(got, want)
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.bn.num_batches_tracked.item() == 1
    torch.testing.assert_close(model.bn.running_mean, eager.bn.running_mean)


def test_candidates_option_is_checked():
    with pytest.raises(ValueError, match="no backend named 'nope'"):
        agspeed.optimize(Chain(), candidates=("nope",))
    with pytest.raises(ValueError, match="positive"):
        agspeed.optimize(Chain(), tune_budget=0)
    with pytest.raises(agspeed.UnknownOptionError):
        agspeed.optimize(Chain(), tune_budget=True)


def test_default_candidates_per_device():
    assert autotune.default_candidates({"cpu"})[0] == "eager"
    assert "inductor" in autotune.default_candidates({"cpu"})
    assert "cudagraphs" not in autotune.default_candidates({"cpu"})
    assert "cudagraphs" in autotune.default_candidates({"cuda"})


def test_float32_noise_passes_against_float64_and_an_error_does_not():
    from agspeed.backends import _measure
    from torch.utils._pytree import tree_flatten

    gen = torch.Generator().manual_seed(0)
    truth = torch.randn(1000, dtype=torch.float64, generator=gen)
    _, spec = tree_flatten(torch.zeros(1))

    def result(t):
        return _measure.Result(spec, [t], [])

    noise = truth.abs().max().item() * 3e-3   # past float32's tolerance from eager
    eager = (truth + noise * torch.randn(1000, dtype=torch.float64, generator=gen)).float()
    close = (truth + noise * torch.randn(1000, dtype=torch.float64, generator=gen)).float()
    off = (truth + 10 * noise * torch.randn(1000, dtype=torch.float64, generator=gen)).float()
    exact = lambda: result(truth)  # noqa: E731
    assert _measure.compare(result(eager), result(close), exact) > 1e-3
    with pytest.raises(_measure.Mismatch, match="from float64"):
        _measure.compare(result(eager), result(off), exact)
    with pytest.raises(_measure.Mismatch, match="tolerance"):
        _measure.compare(result(eager), result(close))  # no float64 reference
    # a float64 run that is no reference (eager is far from it) decides nothing
    with pytest.raises(_measure.Mismatch):
        _measure.compare(result(eager), result(close), lambda: result(-truth))


@pytest.mark.parametrize("names", [("t_same",), ("t_fast",)])
def test_tuning_under_inference_mode(candidates, names):
    # inference tensors have no version counter: the state check reads their values
    model = Chain()
    with torch.inference_mode():
        x = _chain_input()
        out = agspeed.optimize(model, candidates=names)(x)
        torch.testing.assert_close(out, model(x))
    (rec,) = knowledge.records()
    assert rec["candidates"][names[0]]["status"] == "ok"


if torch is not None:

    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(8, 8) / 3)

        def forward(self, x):
            return torch.tanh(x @ self.weight)

    class Reused(nn.Module):
        """One block called twice around a graph break: the second call's graph takes the
        first's output, a non-leaf whose history holds the same parameters."""

        def __init__(self):
            super().__init__()
            self.block = Dense()

        def forward(self, x):
            h = self.block(x)
            if h.sum().item() > 1e9:  # data-dependent: the frame breaks, its callees not
                h = h * 0
            return self.block(h)


def test_tuning_a_graph_fed_by_an_earlier_graph_leaves_that_graph_intact(candidates):
    # regression: tuning's backward went through the earlier graph's saved tensors and
    # freed them, so the program's own backward failed ("backward through the graph a
    # second time")
    torch.manual_seed(0)
    eager, model = Reused(), Reused()
    model.load_state_dict(eager.state_dict())
    optimized = agspeed.optimize(model, candidates=("t_same",))
    for _ in range(2):
        x = torch.randn(4, 8)
        optimized(x).square().sum().backward()
        eager(x).square().sum().backward()
        torch.testing.assert_close(model.block.weight.grad, eager.block.weight.grad)
    assert len(knowledge.records()) == 2  # both graphs were tuned


def test_under_autocast_results_are_held_to_the_autocast_dtypes_tolerance():
    from agspeed.backends import _measure
    from torch.utils._pytree import tree_flatten

    _, spec = tree_flatten(torch.zeros(1))
    gen = torch.Generator().manual_seed(0)
    want = torch.randn(1000, generator=gen)
    # noise of about 0.6% of the tensor's RMS: past float32's 1e-3, within bfloat16's 2e-2
    got = want + 6e-3 * want.square().mean().sqrt() * torch.randn(1000, generator=gen)
    a, b = _measure.Result(spec, [want], []), _measure.Result(spec, [got], [])
    with pytest.raises(_measure.Mismatch):
        _measure.compare(a, b)
    assert _measure.compare(a, b, compute_dtype=torch.bfloat16) < 2e-2
    assert _measure.autocast_dtype({"cpu"}) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _measure.autocast_dtype({"cpu"}) == torch.bfloat16


def test_tuning_does_not_call_the_parameters_own_hooks(monkeypatch):
    """A hook on a parameter (gradient logging) sees the program's backward passes only,
    not the autotuner's measurements."""
    monkeypatch.setenv("AGSPEED_AUTOTUNE_CANDIDATES", "eager,jit")
    monkeypatch.setattr(agspeed.config, "autotune_candidates", ("eager", "jit"))
    lin = torch.nn.Linear(8, 8)
    calls = []
    lin.weight.register_hook(lambda g: calls.append(1))
    model = agspeed.optimize(lin, backend="auto")
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
    assert len(calls) == 3


def test_a_float_that_varies_runs_eager_instead_of_compiling_per_value(candidates):
    """A float argument is a constant of the graph at first, as for a backend that cannot
    take it; once it has varied it is a symbol, which only eager takes among the
    candidates: one more graph, then no capture or compile per new value."""
    import torch

    def mix(x, y, lam):
        return lam * x + (1 - lam) * y

    fast = agspeed.optimize(mix, candidates=("t_same",))
    x, y = torch.randn(4), torch.randn(4)
    for i in range(8):
        lam = 0.1 * (i + 1)
        torch.testing.assert_close(fast(x, y, lam), mix(x, y, lam))
    made = autotune.decisions()
    assert 2 <= len(made) <= 4                   # not one per value
    assert made[-1].choice == "eager"
    assert agspeed.recompiles()[-1].dynamic
    first, last = knowledge.records()[0], knowledge.records()[-1]
    assert first["candidates"]["t_same"]["status"] != "failed"
    left_out = last["candidates"]["t_same"]
    assert left_out["status"] == "failed" and "float" in left_out["reason"]


class _Cache:
    """Stands for a transformers cache: a fresh object each run, compared by identity,
    holding tensors in lists of objects."""

    class Layer:
        def __init__(self, k, v):
            self.keys, self.values, self.seen = k, v, 3

    def __init__(self, tensors):
        self.layers = [self.Layer(k, v) for k, v in tensors]
        self.offloading = False


def test_objects_made_per_run_are_compared_by_what_they_hold():
    from agspeed.backends import _measure
    from torch.utils._pytree import tree_flatten

    gen = torch.Generator().manual_seed(0)
    kv = [(torch.randn(2, 4, generator=gen), torch.randn(2, 4, generator=gen))
          for _ in range(2)]

    def result(tensors):
        leaves, spec = tree_flatten((torch.ones(2), _Cache(tensors)))
        return _measure.Result(spec, leaves, [])

    assert _measure.compare(result(kv), result([(k.clone(), v.clone()) for k, v in kv])) \
        == 0.0
    near = [(k + 1e-7, v) for k, v in kv]
    assert _measure.compare(result(kv), result(near)) <= 1e-3
    with pytest.raises(_measure.Mismatch, match=r"layers\[1\]\.values"):
        _measure.compare(result(kv), result([kv[0], (kv[1][0], kv[1][1] + 1)]))
    with pytest.raises(_measure.Mismatch, match="items"):
        _measure.compare(result(kv), result(kv[:1]))
