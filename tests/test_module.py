"""Optimized nn.Modules behave exactly like the original and share its state.

Every comparison is against eager on fresh random inputs: outputs and gradients.
"""

import copy
import io
import os
import pickle
import threading

import pytest

import agspeed

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = F = None

pytestmark = pytest.mark.torch

if torch is not None:

    def helper_scale(x, k):
        return x * k

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x)))

    class ResBlockCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
            self.head = nn.Linear(8, 5)

        def forward(self, x):
            y = F.relu(self.bn(self.conv1(x)))
            y = y + self.conv2(y)
            return self.head(y.mean(dim=(2, 3)))

    class LoopModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(6, 6) for _ in range(3))
            self.register_buffer("offset", torch.linspace(-1, 1, 6))

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = helper_scale(torch.tanh(layer(x)), 1.0 + i) + self.offset
            return x

    MODELS = {
        "mlp": (MLP, lambda: torch.randn(5, 8)),
        "cnn": (ResBlockCNN, lambda: torch.randn(4, 3, 10, 10)),
        "loop": (LoopModel, lambda: torch.randn(3, 6)),
    }
else:
    MODELS = {}


def make(name, seed=0):
    torch.manual_seed(seed)
    cls, inputs = MODELS[name]
    return cls(), inputs


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", sorted(MODELS) or ["none"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_outputs_gradients_and_buffers_match_eager(name, mode):
    model, inputs = make(name)
    reference = copy.deepcopy(model)
    optimized = agspeed.optimize(model)
    optimized.train(mode == "train")
    reference.train(mode == "train")
    for _ in range(3):
        x = inputs()
        out_ref, out = reference(x), optimized(x)
        torch.testing.assert_close(out, out_ref)
        out_ref.square().sum().backward()
        out.square().sum().backward()
        for key, g in grads(reference).items():
            torch.testing.assert_close(grads(model)[key], g)
    for (k1, b1), (k2, b2) in zip(reference.named_buffers(), model.named_buffers()):
        assert k1 == k2
        torch.testing.assert_close(b2, b1)


def test_state_is_shared_with_the_original():
    model, inputs = make("cnn")
    optimized = agspeed.optimize(model)
    assert list(optimized.state_dict()) == list(model.state_dict())
    for a, b in zip(optimized.state_dict().values(), model.state_dict().values()):
        assert a.data_ptr() == b.data_ptr()
    assert all(a is b for a, b in zip(optimized.parameters(), model.parameters()))
    fresh = make("cnn", seed=1)[0].state_dict()
    optimized.load_state_dict(fresh)
    torch.testing.assert_close(model.conv1.weight, fresh["conv1.weight"])
    optimized.eval()
    assert not model.training and not model.bn.training
    model.train()
    assert optimized.training and optimized.bn.training
    optimized.extra = nn.Linear(2, 2)
    assert isinstance(model.extra, nn.Linear) and "extra.weight" in model.state_dict()


def test_hooks_are_shared_and_run():
    model, inputs = make("mlp")
    optimized = agspeed.optimize(model)
    calls = []
    optimized.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    model.register_forward_hook(lambda m, args, out: out * 0 + 7)
    x = inputs()
    assert torch.all(optimized(x) == 7)
    assert torch.all(model(x) == 7)
    assert calls == ["pre", "pre"]
    model.fc1.register_forward_hook(lambda m, args, out: calls.append("fc1"))
    optimized(x)
    assert calls[-2:] == ["pre", "fc1"]


def test_original_is_untouched_and_runs_without_the_hook():
    model, inputs = make("loop")
    cls = type(model)
    optimized = agspeed.optimize(model)
    assert type(model) is cls and isinstance(optimized, cls)
    assert type(optimized).__name__ == cls.__name__
    assert repr(optimized) == repr(model)
    agspeed.reset()
    model(inputs())
    assert agspeed.counters()["frames_seen"] == 0
    optimized(inputs())
    assert agspeed.counters()["frames_seen"] > 0


def test_pickle_and_deepcopy():
    model, inputs = make("mlp")
    optimized = agspeed.optimize(model, backend="eager")
    plain = pickle.loads(pickle.dumps(model))
    assert type(plain) is MLP
    restored = pickle.loads(pickle.dumps(optimized))
    assert isinstance(restored, MLP) and type(restored) is not MLP
    assert restored._orig_mod is not model
    x = inputs()
    torch.testing.assert_close(restored(x), model(x))
    agspeed.reset()
    restored(x)
    assert agspeed.counters()["frames_seen"] > 0  # still optimized
    clone = copy.deepcopy(optimized)
    with torch.no_grad():
        clone.fc1.weight.add_(1.0)
    assert not torch.equal(clone.fc1.weight, model.fc1.weight)
    torch.testing.assert_close(optimized(x), model(x))


def test_torch_save_load_round_trip():
    model, inputs = make("cnn")
    optimized = agspeed.optimize(model)
    buffer = io.BytesIO()
    torch.save(optimized.state_dict(), buffer)
    buffer.seek(0)
    fresh = make("cnn", seed=3)[0]
    fresh.load_state_dict(torch.load(buffer))
    model.eval(), fresh.eval()
    x = inputs()
    torch.testing.assert_close(fresh(x), optimized(x))


def test_the_hook_sees_the_user_forward_and_caches_decisions():
    model, inputs = make("loop")
    optimized = agspeed.optimize(model)
    agspeed.reset()
    optimized(inputs())
    records = agspeed._runtime.frame_records()
    names = {r.name for r in records}
    assert {"forward", "helper_scale"} <= names
    torch_dir = os.path.dirname(torch.__file__)
    assert not any(r.filename.startswith(torch_dir) for r in records)
    misses = agspeed.counters()["cache_misses"]
    hits = agspeed.counters()["cache_hits"]
    optimized(inputs())
    optimized(inputs())
    assert agspeed.counters()["cache_misses"] == misses
    assert agspeed.counters()["cache_hits"] > hits


def test_disable_returns_the_module(monkeypatch):
    model, _ = make("mlp")
    assert agspeed.optimize(model, disable=True) is model
    monkeypatch.setenv("AGSPEED_DISABLE", "1")
    agspeed.config.reload()
    assert agspeed.optimize(model) is model


def test_training_steps_match_eager():
    model, inputs = make("cnn")
    reference = copy.deepcopy(model)
    optimized = agspeed.optimize(model)
    opt_a = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(optimized.parameters(), lr=0.1, momentum=0.9)
    target = torch.randint(0, 5, (4,))
    for _ in range(4):
        x = inputs()
        for net, opt in ((reference, opt_a), (optimized, opt_b)):
            opt.zero_grad()
            F.cross_entropy(net(x), target).backward()
            opt.step()
    for a, b in zip(reference.state_dict().values(), model.state_dict().values()):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_cpu_autocast_bf16_matches_eager(cache_enabled):
    model, inputs = make("mlp")
    optimized = agspeed.optimize(model)
    x = inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache_enabled):
        expected = model(x)
        got = optimized(x)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected)


def test_grad_modes_behave_as_eager():
    model, inputs = make("mlp")
    optimized = agspeed.optimize(model)
    with torch.no_grad():
        assert not optimized(inputs()).requires_grad
    with torch.inference_mode():
        assert optimized(inputs()).is_inference()
    assert optimized(inputs()).requires_grad


@pytest.mark.cxx_exceptions
def test_bad_input_raises_the_eager_error():
    model, _ = make("mlp")
    optimized = agspeed.optimize(model)
    wrong = torch.randn(2, 3)
    with pytest.raises(Exception) as eager_error:
        model(wrong)
    with pytest.raises(type(eager_error.value)) as optimized_error:
        optimized(wrong)
    assert str(optimized_error.value) == str(eager_error.value)


def test_threads_calling_one_optimized_module():
    model, _ = make("mlp")
    model.eval()
    optimized = agspeed.optimize(model)
    torch.manual_seed(5)
    batches = [torch.randn(3, 8) for _ in range(40)]
    expected = [model(b) for b in batches]
    results = [None] * len(batches)

    def work(indices):
        for i in indices:
            results[i] = optimized(batches[i])

    threads = [threading.Thread(target=work, args=(range(k, len(batches), 2),))
               for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected):
        torch.testing.assert_close(got, want)
    assert agspeed._C._eval_frame_owner() == "default"


def _sin_plus_one(x):
    return torch.sin(x) + 1


def _double(y):
    return y * 2


@pytest.mark.cxx_exceptions
def test_torch_compile_inside_and_around_optimized_calls():
    # torch._dynamo is another PEP 523 user: each must keep working inside the other,
    # with eager's results, and the interpreter's evaluation function is CPython's
    # again afterwards.
    torch._dynamo.reset()
    compiled = torch.compile(_sin_plus_one, backend="eager")
    x = torch.randn(6)

    def user(v):
        return _double(compiled(v))

    optimized_user = agspeed.optimize(user)
    optimized_double = agspeed.optimize(_double)
    compiled_outer = torch.compile(lambda v: optimized_double(v) + 1, backend="eager")
    for _ in range(3):
        torch.testing.assert_close(optimized_user(x), (torch.sin(x) + 1) * 2)
        torch.testing.assert_close(compiled_outer(x), x * 2 + 1)
        assert agspeed._C._eval_frame_owner() == "default"
    assert "user" in {r.name for r in agspeed._runtime.frame_records()}
    torch._dynamo.reset()


@pytest.mark.cxx_exceptions
@pytest.mark.parametrize("kind", ["script", "trace"])
def test_torchscript_modules_can_be_optimized(kind):
    model, inputs = make("mlp")
    x = inputs()
    scripted = torch.jit.script(model) if kind == "script" else torch.jit.trace(model, x)
    optimized = agspeed.optimize(scripted)
    torch.testing.assert_close(optimized(x), scripted(x))
    assert list(optimized.state_dict()) == list(scripted.state_dict())
