"""The inductor backend on real captures: training, autocast, dynamic sizes, artifacts.

Each test compiles small graphs (inductor takes seconds per graph on a small CPU), and
the session shares one cache directory (tests/conftest.py), so graphs that repeat across
tests are compiled once.
"""

import logging
import os
import subprocess
import sys
import textwrap

import pytest

import agspeed
from agspeed import backends

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional


@pytest.fixture(autouse=True)
def _no_fallback(caplog):
    """Every graph here must really run through inductor: a compile that failed and left
    its graph eager would pass the comparisons with eager unseen."""
    with caplog.at_level(logging.WARNING, logger="agspeed"):
        yield
    fell_back = [r.getMessage() for r in caplog.get_records("call")
                 if "runs eagerly" in r.getMessage()]
    assert not fell_back


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.norm(self.fc1(x))))


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return self.drop(F.silu(self.bn(self.fc(x))))


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.fc(x)
        return y.relu(), [y.sigmoid(), y.shape[-1]]


def _twins(cls):
    torch.manual_seed(0)
    a = cls()
    b = cls()
    b.load_state_dict(a.state_dict())
    return a, b


def _check_training(eager, model, make_input, steps=2, autocast=None, seed=True):
    optimized = agspeed.optimize(model, backend="inductor")
    for step in range(steps):
        x = make_input()
        outs = []
        for m in (eager, optimized):
            if seed:
                torch.manual_seed(100 + step)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast is not None):
                out = m(x)
            out.float().square().mean().backward()
            outs.append(out)
        tol = {} if autocast is None else {"rtol": 2e-2, "atol": 2e-2}
        torch.testing.assert_close(outs[1], outs[0], **tol)
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=name, **tol)
        for (name, b), c in zip(eager.named_buffers(), model.buffers()):
            torch.testing.assert_close(c, b, msg=name, **tol)
    return optimized


def test_training_matches_eager_in_fp32():
    eager, model = _twins(Block)
    _check_training(eager, model, lambda: torch.randn(6, 8))


def test_training_matches_eager_under_bf16_autocast():
    eager, model = _twins(Block)
    _check_training(eager, model, lambda: torch.randn(6, 8), autocast=torch.bfloat16)


def test_batchnorm_and_dropout_train_like_eager_with_eagers_random_numbers():
    eager, model = _twins(Noisy)
    _check_training(eager, model, lambda: torch.randn(6, 8), steps=3)
    assert model.bn.num_batches_tracked.item() == 3
    # the same generator state after as eager's: dropout drew from eager's stream
    torch.manual_seed(5)
    eager(torch.randn(6, 8))
    want = torch.get_rng_state()
    torch.manual_seed(5)
    agspeed.optimize(model, backend="inductor")(torch.randn(6, 8))
    assert torch.equal(torch.get_rng_state(), want)


def test_a_second_backward_over_a_retained_graph_gives_eagers_gradients():
    """The backward compiled with the forward donates no saved activation, so
    ``retain_graph=True`` and a second backward through the same graph work, accumulate
    what eager accumulates, and leave the saved values intact."""
    eager, model = _twins(Block)
    optimized = agspeed.optimize(model, backend="inductor")
    for _ in range(2):
        x = torch.randn(6, 8)
        for m in (eager, optimized):
            out = m(x)
            first, second = out.square().mean(), out.sin().sum()
            first.backward(retain_graph=True)
            second.backward(retain_graph=True)
            first.backward()
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert agspeed.counters()["graph_calls"] >= 2


class TwoShifts(nn.Module):
    def __init__(self):
        super().__init__()
        self.shifts = nn.ParameterList([nn.Parameter(torch.randn(8)) for _ in range(2)])

    def forward(self, x):
        return x + (self.shifts[0] + self.shifts[1])


def test_two_equal_gradients_do_not_share_memory():
    """Both shifts' gradients are the same value: inductor returned them as two views
    of one buffer, autograd kept both as .grad, and every later accumulation (or an
    in-place clip) counted twice."""
    from agspeed.backends.inductor import distinct_outputs

    eager, model = _twins(TwoShifts)
    optimized = agspeed.optimize(model, backend="inductor")
    for _ in range(3):   # accumulated, never zeroed
        x = torch.randn(4, 8)
        eager(x).square().sum().backward()
        optimized(x).square().sum().backward()
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=name)
    a, b = (p.grad for p in model.shifts)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    torch.nn.utils.clip_grad_norm_(eager.parameters(), 0.1)
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad)

    graph = torch.fx.Graph()   # the pass itself: a repeated output becomes a copy
    t = graph.placeholder("tangents_1")
    total = graph.call_function(torch.ops.aten.sum.dim_IntList, (t, [0]))
    graph.output((total, total, None))
    assert distinct_outputs(graph) == 1
    outs = next(n for n in graph.nodes if n.op == "output").args[0]
    assert outs[0] is total and outs[1].target is torch.ops.aten.clone.default


def test_one_dynamic_graph_serves_every_size():
    eager, model = _twins(Block)
    sizes = iter([3, 5, 7, 9])
    _check_training(eager, model, lambda: torch.randn(next(sizes), 8), steps=4)
    # agspeed.optimize(dynamic=None) promotes the batch size after three sizes: captures
    # at 3, 5, then one dynamic capture serves 7 and 9
    captured = [r for r in agspeed._runtime.frame_records() if r.decision == "captured"]
    assert len(captured) == 3


def test_marked_dynamic_from_the_start():
    eager, model = _twins(Block)
    optimized = agspeed.optimize(model, backend="inductor", dynamic=True)
    for n in (4, 6, 11):
        x = torch.randn(n, 8)
        torch.testing.assert_close(optimized(x), eager(x))
    captured = [r for r in agspeed._runtime.frame_records() if r.decision == "captured"]
    assert len(captured) == 1


def test_a_dynamic_graph_whose_backward_needs_a_size_plus_one():
    """Padding by one (a causal LM's shifted labels) makes the backward slice a size
    ``s + 1`` back to ``s``; the backward must find ``s`` among its inputs."""
    torch.manual_seed(0)
    emb = nn.Embedding(20, 8)

    def loss_of(ids, labels):
        logits = emb(ids.view(-1, ids.size(1))) @ emb.weight.t()
        shifted = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
        return F.cross_entropy(logits.view(-1, 20), shifted.view(-1))

    optimized = agspeed.optimize(loss_of, backend="inductor", dynamic=True)
    for n in (5, 7, 9):
        ids = torch.randint(0, 20, (2, n))
        got = optimized(ids, ids.clone())
        (got_grad,) = torch.autograd.grad(got, emb.weight)
        want = loss_of(ids, ids.clone())
        (want_grad,) = torch.autograd.grad(want, emb.weight)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_grad, want_grad)
    captured = [r for r in agspeed._runtime.frame_records() if r.decision == "captured"]
    assert len(captured) == 1


class Windowed(nn.Module):
    """A position argument and a counter written back: plain ints made symbols."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.steps = 0

    def forward(self, x, pos):
        self.steps += 1
        return self.fc(x[:, pos:pos + 8]).relu() * (self.steps % 3 + 1)


def test_ints_made_symbols_train_through_one_graph():
    eager, model = _twins(Windowed)
    optimized = agspeed.optimize(model, backend="inductor")
    x = torch.randn(4, 24, requires_grad=True)
    for pos in range(8):
        got, want = optimized(x, pos), eager(x, pos)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(model.fc.weight.grad, eager.fc.weight.grad)
    assert model.steps == eager.steps == 8
    captured = [r for r in agspeed._runtime.frame_records() if r.decision == "captured"]
    assert len(captured) == 3   # 0 and 1 static, then one graph for every value
    assert agspeed.recompiles()[0].dynamic == ("self.steps", "pos")


class Tempered(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, scale, shift):
        return (self.fc(x) * scale + shift * 2.0).relu() / (scale + 1.0)


@pytest.mark.parametrize("rows", ["static", "varying"])
def test_floats_made_symbols_train_through_one_compiled_graph(rows):
    """A float that varies per call (a temperature, a mixing weight) becomes a symbol,
    read by the compiled code as a 0-d tensor: every value is right, with sizes fixed or
    symbolic as well, and the graph compiles once for all of them."""
    eager, model = _twins(Tempered)
    optimized = agspeed.optimize(model, backend="inductor")
    values = (0.5, 1.5, 2.5, -0.25, 3.0, 7.5)
    for k, v in enumerate(values):
        n = 4 if rows == "static" else 4 + k % 3
        x = torch.randn(n, 8, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        got, want = optimized(x, v, v * 3), eager(x2, v, v * 3)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x.grad, x2.grad)
        torch.testing.assert_close(model.fc.weight.grad, eager.fc.weight.grad)
    (record,) = agspeed.recompiles()
    assert {"scale", "shift"} <= set(record.dynamic)
    captured = [r for r in agspeed._runtime.frame_records() if r.decision == "captured"]
    assert len(captured) == 3   # two values, then one graph for every later value


def _lerped(xs, ys, a, b, w):
    torch._foreach_lerp_(xs, ys, 1 - w)
    return a.lerp(b, w), torch.lerp(a, b, weight=w * 0.5)


def test_a_lerp_weighted_by_a_float_symbol_compiles(caplog):
    """Adam's ``_foreach_lerp_(exp_avgs, grads, 1 - beta1)`` with ``beta1`` a symbol (a
    scheduler moving it): inductor's decomposition of a float weight branches on it,
    which no float symbol can guard; the weight goes in as a 0-d tensor instead, with
    eager's values on both sides of 0.5."""
    optimized = agspeed.optimize(_lerped, backend="inductor")
    for w in (0.1, 0.2, 0.3, 0.7, 0.45, 0.9):
        xs = [torch.randn(4, 4), torch.randn(3)]
        ys = [torch.randn(4, 4), torch.randn(3)]
        a, b = torch.randn(5), torch.randn(5)
        mine = [x.clone() for x in xs]
        with caplog.at_level("WARNING", logger="agspeed"):
            got = optimized(mine, ys, a, b, w)
        want = _lerped(xs, ys, a, b, w)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(mine, xs)
    assert "failed" not in caplog.text   # no graph ran eagerly for want of a compile
    (record,) = agspeed.recompiles()
    assert record.dynamic == ("w",) and record.count == 2


def test_output_containers_and_constants_come_back_as_eager_gives_them():
    eager, model = _twins(Pair)
    x = torch.randn(3, 8)
    want = eager(x)
    got = agspeed.optimize(model, backend="inductor")(x)
    assert type(got) is tuple and type(got[1]) is list
    assert got[1][1] == 4 and type(got[1][1]) is int
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1][0], want[1][0])


def test_inference_under_no_grad():
    eager, model = _twins(Block)
    optimized = agspeed.optimize(model.eval(), backend="inductor")
    eager.eval()
    with torch.no_grad():
        x = torch.randn(5, 8)
        out = optimized(x)
        torch.testing.assert_close(out, eager(x))
    assert not out.requires_grad


def test_declares_training_dynamic_and_both_devices():
    caps = backends.capabilities_of(backends.get_backend("inductor"))
    assert caps.training and caps.dynamic and caps.devices == {"cpu", "cuda"}
    assert caps.float_inputs
    assert caps.unavailable() is None  # this machine has torch._inductor and g++


SCRIPT = textwrap.dedent('''
    import torch, torch.nn as nn, agspeed
    from torch._dynamo.utils import counters

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return torch.tanh(self.fc(x))

    torch.manual_seed(0)
    model = agspeed.optimize(Net(), backend="inductor")
    model(torch.randn(4, 8)).sum().backward()
    print("hits", counters["inductor"]["fxgraph_cache_hit"]
          + counters["aot_autograd"]["autograd_cache_hit"])
''')


def test_a_second_process_reuses_the_compiled_artifacts(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, AGSPEED_CACHE_DIR=str(tmp_path / "kb"))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    runs = [subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert runs[0].stdout.split() == ["hits", "0"]
    assert int(runs[1].stdout.split()[1]) >= 1
    assert any((tmp_path / "kb" / "inductor").iterdir())  # under agspeed's cache dir


class Masked(nn.Module):
    """A registered buffer (a causal mask's source), a plain tensor attribute, and a
    weight: what AOTAutograd's partitioner may save or recompute.  Each has a shape of
    its own, by which the test tells them apart."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 6)
        self.register_buffer("tril", torch.tril(torch.ones(6, 6)))
        self.scale = torch.full((1, 6), 0.5)   # not a buffer

    def forward(self, x):
        scores = self.fc(x).unsqueeze(1).masked_fill(self.tril == 0, float("-inf"))
        return scores.softmax(-1) * self.scale


def test_parameters_and_buffers_are_inputs_that_outlive_the_step(monkeypatch):
    """As Dynamo marks them: AOTAutograd's partitioner then counts saving the weight or
    buffer itself for the backward as free (it lives on), and recomputes what the
    forward computed from it (the mask) in the backward, as in torch.compile's graph."""
    import torch._functorch.config as functorch_config
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.config as inductor_config

    seen = []
    real = compile_fx.min_cut_rematerialization_partition

    def partition(gm, inputs, **kwargs):
        primals = [tuple(v.shape) for v in inputs[0]]   # (primals, tangents)
        seen.append(sorted(primals[k] for k in kwargs.get("static_lifetime_input_indices")
                           or ()))
        return real(gm, inputs, **kwargs)

    monkeypatch.setattr(compile_fx, "min_cut_rematerialization_partition", partition)
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)
    monkeypatch.setattr(functorch_config, "enable_autograd_cache", False)
    eager, model = _twins(Masked)
    _check_training(eager, model, lambda: torch.randn(4, 8, requires_grad=True))
    assert seen == [[(6,), (6, 6), (6, 8)]]
