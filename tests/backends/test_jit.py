"""The ``jit`` backend (TorchScript) on real graphs, against eager.

Graphs come from ``torch.fx.symbolic_trace`` (the backend called directly, weights held by
the graph) and from agspeed's capture (``agspeed.optimize(model, backend="jit")``, weights
passed as inputs).  Each test compares with eager on fresh random inputs: outputs,
gradients of inputs and parameters, batch-norm statistics, the random generator's state,
output containers; and checks what the backend refuses, that compiling changes nothing
the program can see, and that the user sees none of TorchScript's warnings.
"""

import collections
import copy
import logging
import warnings

import pytest

import agspeed
from agspeed import backends
from agspeed._runtime import frame_records
from agspeed.backends import jit as jit_module

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = F = None

pytestmark = pytest.mark.torch

BF16 = {"atol": 2e-2, "rtol": 2e-2}

if torch is not None:

    class MLP(nn.Module):
        def __init__(self, act):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.act = act
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class Functional(nn.Module):
        """The activation as a function call (``F.silu``, ``F.gelu``), not a module."""

        def __init__(self, fn):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.fn = fn
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(self.fn(self.fc1(x)))

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            y = F.relu(self.bn(self.conv(x)))
            return self.fc(y.mean((2, 3)))

    class Attention(nn.Module):
        """A pre-norm transformer block written out: LayerNorm, softmax attention, MLP."""

        def __init__(self, dim=16, heads=2):
            super().__init__()
            self.heads = heads
            self.norm1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.norm2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
            q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                       for z in (q, k, v))
            att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.norm2(x))

    class Encoder(nn.Module):
        """torch's own encoder layer, called from user code (agspeed skips torch's frames)."""

        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)

        def forward(self, x):
            return self.layer(x)

    class Dropped(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(F.dropout(torch.tanh(self.fc1(x)), 0.5, self.training))

    class Counting(nn.Module):
        """Counts its calls in a tensor it is given: an in-place write to a graph input."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, counter):
            counter.add_(1)
            return self.inner(x)

    class Pointwise(nn.Module):
        """A chain of elementwise ops after a linear layer: what a fuser would fuse."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            y = self.fc(x)
            return torch.tanh(y * 2 + 1).sigmoid() * y

    class Decaying(nn.Module):
        """Writes its own parameter in place on every call (an EMA-style update)."""

        def __init__(self, frozen):
            super().__init__()
            self.scale = nn.Parameter(torch.full((4,), 2.0), requires_grad=not frozen)

        def forward(self, x):
            self.scale.mul_(0.5)
            return x * self.scale

    Pair = collections.namedtuple("Pair", "first second")

    class Structured(nn.Module):
        """Returns its two results in the container named by ``kind``."""

        def __init__(self, kind):
            super().__init__()
            self.kind = kind
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            a = self.fc(x)
            b = torch.tanh(a)
            if self.kind == "tensor":
                return a
            if self.kind == "tuple":
                return a, b
            if self.kind == "list":
                return [a, b]
            if self.kind == "dict":
                return {"a": a, "b": b}
            if self.kind == "namedtuple":
                return Pair(a, b)
            return (a, [b, None, 3, x.shape], {"size": a.shape[1]})  # "mixed"

    def noisy(x):
        warnings.warn("noisy helper ran", UserWarning)
        return x * 2

    def data_valued(x):
        # the factor is read from the data: a trace would keep this run's value
        return x * float(x.abs().sum() > 1.0)

    torch.fx.wrap("noisy")
    torch.fx.wrap("data_valued")

    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return noisy(self.fc(x))  # by its global name: fx.wrap keeps it a call

    class DataValued(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return data_valued(self.fc(x))


def jit():
    return backends.get_backend("jit")


def seeded(make, *args):
    torch.manual_seed(0)
    model = make(*args)
    return model, copy.deepcopy(model)


def jit_fx(model, example):
    """The jit backend's callable for ``model``'s symbolic_trace graph."""
    return jit()(torch.fx.symbolic_trace(model), [example])


def captured():
    return [r for r in frame_records() if r.decision == "captured"]


def train_steps(run, model, ref, make_input, steps=4, ref_run=None, **tol):
    """``steps`` SGD steps of ``model`` through ``run`` and of its eager copy ``ref``
    (through ``ref_run``, ``ref`` itself by default) on the same inputs: outputs, input
    gradients and parameter gradients must agree each step (the weights change between
    steps, so a backend computing with stale weights fails)."""
    ref_run = ref_run or ref
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(steps):
        x = make_input()
        xa = x.clone().requires_grad_()
        xb = x.clone().requires_grad_()
        out, expected = run(xa), ref_run(xb)
        torch.testing.assert_close(out, expected, **tol)
        weight = torch.randn_like(expected)
        (out * weight).sum().backward()
        (expected * weight).sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad, **tol)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert p.grad is not None, name
            torch.testing.assert_close(p.grad, q.grad, **tol, msg=name)
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()


def assert_same_state(model, ref):
    for (name, a), b in zip(model.named_buffers(), ref.buffers()):
        torch.testing.assert_close(a, b, msg=name, rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, msg=name)


ACTIVATIONS = {
    "gelu": lambda: MLP(nn.GELU()),
    "gelu_tanh": lambda: MLP(nn.GELU(approximate="tanh")),
    "silu": lambda: MLP(nn.SiLU()),
    "F.gelu": lambda: Functional(F.gelu),
    "F.silu": lambda: Functional(F.silu),
}


# -- the backend as registered -----------------------------------------------------------


def test_jit_is_a_registered_backend_for_static_graphs_that_train():
    assert "jit" in agspeed.list_backends()
    fn = jit()
    assert fn is jit_module.backend
    caps = backends.capabilities_of(fn)
    assert caps.training and not caps.dynamic
    assert caps.devices == {"cpu", "cuda"}
    assert caps.unavailable() is None
    assert backends.supports_dynamic(fn) is False


def test_describe_names_the_executor_and_the_fuser_per_device():
    text = jit_module.describe()
    assert "executor" in text and "CPU fuser:" in text and "CUDA fuser:" in text
    if not torch._C._llvm_enabled():
        assert "CPU fuser: none (torch built without LLVM)" in text


# -- training: outputs and gradients equal eager's -----------------------------------------


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_fx_mlp_trains_like_eager_through_torchscript_autodiff(act):
    model, ref = seeded(ACTIVATIONS[act])
    compiled = jit_fx(model, torch.randn(5, 8, requires_grad=True))
    train_steps(compiled, model, ref, lambda: torch.randn(5, 8))
    compiled(torch.randn(5, 8, requires_grad=True))
    if torch._C._get_graph_executor_optimize():
        # the executor's plan differentiates the graph itself: the backward is TorchScript's
        assert "prim::DifferentiableGraph" in str(torch.jit.last_executed_optimized_graph())


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_optimized_mlp_trains_like_eager(act):
    model, ref = seeded(ACTIVATIONS[act])
    train_steps(agspeed.optimize(model, backend="jit"), model, ref, lambda: torch.randn(5, 8))
    assert len(captured()) == 1  # compiled by jit once (a failure would read "run eager")


@pytest.mark.parametrize("how", ["fx", "optimize"])
def test_cnn_with_batch_norm_in_training_updates_statistics_like_eager(how):
    model, ref = seeded(CNN)
    if how == "fx":
        run = jit_fx(model, torch.randn(2, 3, 6, 6))
    else:
        run = agspeed.optimize(model, backend="jit")
    train_steps(run, model, ref, lambda: torch.randn(2, 3, 6, 6))
    assert int(model.bn.num_batches_tracked) == 4  # the trace itself was not a step
    assert_same_state(model, ref)
    assert model.bn.running_mean._version == ref.bn.running_mean._version
    if how == "optimize":
        assert len(captured()) == 1


@pytest.mark.parametrize("how", ["fx", "optimize"])
def test_cnn_in_eval_mode_computes_like_eager_and_leaves_statistics(how):
    model, ref = seeded(CNN)
    with torch.no_grad():  # statistics that are not the initial ones
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    ref.load_state_dict(model.state_dict())
    model.eval()
    ref.eval()
    before = copy.deepcopy(model.state_dict())
    run = jit_fx(model, torch.randn(2, 3, 6, 6)) if how == "fx" else agspeed.optimize(
        model, backend="jit")
    for _ in range(3):
        x = torch.randn(2, 3, 6, 6)
        with torch.no_grad():
            torch.testing.assert_close(run(x), ref(x))
    train_steps(run, model, ref, lambda: torch.randn(2, 3, 6, 6), steps=2)
    for name, value in model.named_buffers():
        assert torch.equal(value, before[name]), name


def test_fx_attention_block_trains_like_eager():
    model, ref = seeded(Attention)
    run = jit_fx(model, torch.randn(2, 5, 16))
    train_steps(run, model, ref, lambda: torch.randn(2, 5, 16), atol=1e-5, rtol=1e-4)


def test_optimized_transformer_encoder_layer_trains_like_eager():
    model, ref = seeded(Encoder)
    run = agspeed.optimize(model, backend="jit")
    train_steps(run, model, ref, lambda: torch.randn(2, 5, 16), atol=1e-5, rtol=1e-4)
    assert len(captured()) == 1


# -- random numbers, side effects of compiling ------------------------------------------


@pytest.mark.parametrize("how", ["fx", "optimize"])
def test_dropout_draws_the_same_numbers_as_eager(how):
    model, ref = seeded(Dropped)
    run = jit_fx(model, torch.randn(4, 8)) if how == "fx" else agspeed.optimize(
        model, backend="jit")
    for seed in range(3):
        x = torch.randn(4, 8)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        torch.manual_seed(seed)
        out = run(xa)
        state = torch.get_rng_state()
        torch.manual_seed(seed)
        expected = ref(xb)
        assert torch.equal(torch.get_rng_state(), state)  # as many draws as eager
        torch.testing.assert_close(out, expected)
        assert (out != ref(x)).any()  # a different seed drops other units: dropout is live
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad)
        torch.testing.assert_close(model.fc1.weight.grad, ref.fc1.weight.grad)


def test_compiling_changes_no_statistics_no_input_and_no_random_state():
    dropped, x = Dropped(), torch.randn(4, 8)
    state = torch.get_rng_state()
    jit_fx(dropped, x)  # the trace runs dropout once
    assert torch.equal(torch.get_rng_state(), state)
    model = CNN()
    gm = torch.fx.symbolic_trace(Counting(model))
    counter = torch.zeros(())
    x = torch.randn(2, 3, 6, 6)
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    versions = {k: v._version for k, v in model.named_buffers()}
    versions["counter"] = counter._version
    compiled = jit()(gm, [x, counter])
    assert float(counter) == 0 and counter._version == versions.pop("counter")
    for name, value in model.named_buffers():
        assert torch.equal(value, buffers[name]), name
        assert value._version == versions[name], name
    compiled(x, counter)
    compiled(x, counter)
    assert float(counter) == 2  # each call writes once, like eager
    assert int(model.bn.num_batches_tracked) == 2


@pytest.mark.parametrize("frozen", [False, True])
def test_a_graph_writing_a_parameter_writes_it_once_per_call_not_when_compiled(frozen):
    model, ref = Decaying(frozen), Decaying(frozen)
    x = torch.randn(3, 4)
    # a parameter requiring grad can be written in place only with grad mode off
    with torch.set_grad_enabled(frozen):
        compiled = jit_fx(model, x)
        assert torch.equal(model.scale, ref.scale)
        assert model.scale._version == ref.scale._version
        for _ in range(3):
            torch.testing.assert_close(compiled(x), ref(x))
            torch.testing.assert_close(model.scale, ref.scale)


def test_a_no_grad_graph_is_not_frozen_and_sees_new_weights():
    model, ref = seeded(CNN)
    model.eval()
    ref.eval()
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        fx_run = jit_fx(model, x)
        optimized = agspeed.optimize(model, backend="jit")
        for run in (fx_run, optimized):
            torch.testing.assert_close(run(x), ref(x))
        for p, q in zip(model.parameters(), ref.parameters()):
            p.mul_(1.5)
            q.mul_(1.5)
        model.bn.running_mean.add_(0.25)
        ref.bn.running_mean.add_(0.25)
        for run in (fx_run, optimized):
            torch.testing.assert_close(run(x), ref(x))
    assert len(captured()) == 1


# -- autocast --------------------------------------------------------------------------------


@pytest.mark.parametrize("cache", [True, False])
def test_bf16_autocast_on_cpu_trains_like_eager(cache):
    model, ref = seeded(ACTIVATIONS["gelu"])
    run = agspeed.optimize(model, backend="jit")

    def autocast_run(module):
        def call(x):
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache):
                ref(x.detach())  # an eager call first: it fills the weight cache
                return module(x)
        return call

    train_steps(autocast_run(run), model, ref, lambda: torch.randn(5, 8), steps=3,
                ref_run=autocast_run(ref), **BF16)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache):
        assert run(torch.randn(5, 8, requires_grad=True)).dtype == torch.bfloat16
    assert len(captured()) == 1


@pytest.mark.parametrize("cache", [True, False])
def test_fx_graph_compiled_inside_autocast_after_an_eager_call(cache):
    model, ref = seeded(Attention)
    x = torch.randn(2, 5, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache):
        ref(x)  # the weight cache now holds bf16 casts of ref's weights
        model(x)  # and of model's, which the graph reads
        compiled = jit_fx(model, x)
        out = compiled(x)
        torch.testing.assert_close(out, ref(x), **BF16)
    assert out.grad_fn is not None  # the weights were inputs of the trace, not constants
    out.sum().backward()
    assert model.qkv.weight.grad is not None
    with torch.no_grad():  # outside the region, as an optimizer step would be
        for p, q in zip(model.parameters(), ref.parameters()):
            p.add_(0.1)
            q.add_(0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache):
        ref(x)
        torch.testing.assert_close(compiled(x), ref(x), **BF16)


# -- outputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tensor", "tuple", "list", "dict", "namedtuple", "mixed"])
def test_output_containers_and_constants_are_the_graphs(kind):
    model = Structured(kind)
    x = torch.randn(2, 4)
    out = jit_fx(model, x)(x)
    expected = model(x)
    assert type(out) is type(expected)
    torch.testing.assert_close(out, expected)
    if kind == "mixed":
        assert type(out[1]) is list and out[1][1:] == [None, 3, torch.Size([2, 4])]
        assert type(out[1][3]) is torch.Size and out[2] == {"size": 3}


@pytest.mark.parametrize("kind", ["list", "namedtuple", "mixed"])
def test_optimized_outputs_keep_their_containers(kind):
    model = Structured(kind)
    run = agspeed.optimize(model, backend="jit")
    for _ in range(2):
        x = torch.randn(2, 4)
        out = run(x)
        assert type(out) is type(model(x))
        torch.testing.assert_close(out, model(x))
    assert len(captured()) == 1


# -- warnings and logs --------------------------------------------------------------------


def test_compiling_shows_no_warning_and_logs_one_line(caplog, monkeypatch):
    monkeypatch.setattr(jit_module, "_said_deprecated", False)
    with caplog.at_level(logging.INFO, logger="agspeed.autotune"), \
            warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        for make in (ACTIVATIONS["silu"], CNN):
            model = make()
            x = torch.randn(2, 8) if make is not CNN else torch.randn(2, 3, 6, 6)
            compiled = jit_fx(model, x)
            for _ in range(3):
                compiled(x).sum().backward()
    assert [str(w.message) for w in shown] == []
    lines = [r.getMessage() for r in caplog.records if r.name == "agspeed.autotune"]
    assert len(lines) == 1 and "deprecated" in lines[0]


def test_warnings_of_the_users_own_code_still_reach_the_user():
    model = Noisy()
    x = torch.randn(2, 4)
    with pytest.warns(UserWarning, match="noisy helper ran"):
        compiled = jit_fx(model, x)
        expected = model(x)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        out = compiled(x)  # the trace runs no Python: the helper is not called again
    assert shown == []
    torch.testing.assert_close(out, expected)


# -- what the backend refuses --------------------------------------------------------------


def _dynamic_graph():
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    model = ACTIVATIONS["silu"]()
    agspeed.optimize(model, backend=keep, dynamic=True)(torch.randn(3, 8))
    assert len(graphs) == 1
    return graphs[0]


def test_a_graph_with_symbolic_sizes_is_refused_with_the_reason():
    gm, example_inputs = _dynamic_graph()
    with pytest.raises(RuntimeError, match="symbolic sizes"):
        jit()(gm, example_inputs)
    assert "static sizes" in backends.why_not(jit(), gm, example_inputs, True)


def _frozen_half(x, w):
    with torch.no_grad():
        frozen = x @ w
    return frozen, x @ w


def test_a_graph_that_switches_grad_mode_is_refused_and_runs_eager_instead():
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    x, w = torch.randn(3, 4), torch.randn(4, 4, requires_grad=True)
    agspeed.optimize(_frozen_half, backend=keep)(x, w)
    gm, example_inputs = graphs[0]
    with pytest.raises(RuntimeError, match="switches grad mode"):
        jit()(gm, example_inputs)
    fast = agspeed.optimize(_frozen_half, backend="jit")
    for _ in range(2):
        out, ref = fast(x, w), _frozen_half(x, w)
        assert [t.requires_grad for t in out] == [t.requires_grad for t in ref] == [False, True]
        torch.testing.assert_close(out, ref)


def test_optimize_dynamic_true_gives_jit_static_graphs_that_compute_like_eager():
    model, ref = seeded(ACTIVATIONS["gelu"])
    run = agspeed.optimize(model, backend="jit", dynamic=True)
    for batch in (3, 5, 7, 5):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(run(x), ref(x))
    assert len(captured()) == 3  # one static graph per size, each compiled by jit


def test_a_value_read_from_data_is_refused():
    model = DataValued()
    with pytest.raises(RuntimeError, match="not be valid for other inputs"):
        jit_fx(model, torch.randn(2, 4))


def test_a_non_tensor_input_is_refused():
    def scale(x, n):
        return x * n

    with pytest.raises(RuntimeError, match="input 1 is a int, not a tensor"):
        jit()(torch.fx.symbolic_trace(scale), [torch.randn(2), 3])


def test_a_graph_returning_no_tensor_is_refused():
    def shape_of(x):
        return x.shape[0] + 1

    with pytest.raises(RuntimeError, match="returns no tensor"):
        jit()(torch.fx.symbolic_trace(shape_of), [torch.randn(2)])


def test_a_refused_graph_runs_eager_under_optimize(caplog):
    model = DataValued()
    run = agspeed.optimize(model, backend="jit")
    with caplog.at_level(logging.CRITICAL, logger="agspeed"):
        for _ in range(2):
            x = torch.randn(2, 4)
            torch.testing.assert_close(run(x), model(x))
    # no graph holds the data's value: the frames break at float(tensor) and resume
    # after it, where the value is a plain float the resume function's guard checks
    records = captured()
    assert records and all(r.name.startswith("resume_in_data_valued") for r in records)


# -- process-global switches -----------------------------------------------------------------


def test_cpu_fusion_switched_on_does_not_break_a_compiled_graph():
    before = torch._C._jit_can_fuse_on_cpu()
    model, ref = seeded(Pointwise)
    try:
        torch._C._jit_override_can_fuse_on_cpu(True)
        compiled = jit_fx(model, torch.randn(5, 8))
        train_steps(compiled, model, ref, lambda: torch.randn(5, 8), steps=3)
        # kept where torch can fuse on CPU; off where it can only fail (no LLVM)
        assert torch._C._jit_can_fuse_on_cpu() is torch._C._llvm_enabled()
    finally:
        torch._C._jit_override_can_fuse_on_cpu(before)


def test_a_switch_the_graph_needs_is_set_for_its_calls_and_put_back():
    model, ref = seeded(Pointwise)
    x = torch.randn(5, 8)
    compiled = jit_fx(model, x)
    before = torch._C._jit_can_fuse_on_cpu()
    user = not torch._C._llvm_enabled()  # the opposite of what the graph wants
    try:
        # Set after compiling: without LLVM, CPU fusion on would make the optimized forward
        # fail ("LLVM Backend not found") unless the call switches it off for its duration.
        torch._C._jit_override_can_fuse_on_cpu(user)
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(compiled(x), ref(x))
                assert torch._C._jit_can_fuse_on_cpu() is user
    finally:
        torch._C._jit_override_can_fuse_on_cpu(before)


def test_a_compiled_graph_keeps_no_input_alive():
    # torch.jit.trace stores its example inputs in the traced module unless told not to:
    # here those are the model's parameters and the first batch, which the cache entry
    # would keep alive after the program dropped the model
    import gc
    import weakref

    model = MLP(nn.ReLU())
    fast = agspeed.optimize(model, backend="jit")
    x = torch.randn(4, 8, requires_grad=True)
    fast(x).sum().backward()
    assert agspeed.counters()["graph_calls"] == 1
    refs = [weakref.ref(t) for t in (x, *model.parameters())]
    del model, fast, x
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)
