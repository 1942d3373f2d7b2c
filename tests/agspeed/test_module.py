"""Optimized nn.Modules behave exactly like the original and share its state.

``agspeed.optimize(module)`` returns a view of the module (a same-named subclass sharing
the original's ``__dict__``, see ``agspeed._module``).  Every comparison is against eager
on fresh random inputs: outputs, gradients, buffers.  Module forwards graph-break at
``self.<attr>`` today, so the models that reach captured graphs do it through plain
helper functions they call with tensors (``FunctionalNet``, ``LoopModel``).
"""

import abc
import collections
import copy
import io
import logging
import os
import pickle
import threading

import pytest

import agspeed

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.nn.utils.parametrize as parametrize
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = F = parametrize = None

pytestmark = pytest.mark.torch

# Models are defined at module level so that pickling can find their classes.
if torch is not None:

    def helper_scale(x, k):
        return x * k

    def dense(x, w, b):
        return torch.tanh(F.linear(x, w, b))

    def norm(x, mean, var, w, b, training):
        return F.batch_norm(x, mean, var, w, b, training, 0.1, 1e-5)

    def head(h, w, b, x):
        return F.linear(h, w, b) + x.sum(-1, keepdim=True)

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
        """A plain Python helper called in a loop over a ModuleList, and a buffer."""

        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(6, 6) for _ in range(3))
            self.register_buffer("offset", torch.linspace(-1, 1, 6))

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = helper_scale(torch.tanh(layer(x)), 1.0 + i) + self.offset
            return x

    class FunctionalNet(nn.Module):
        """Helpers get parameters and BatchNorm buffers as tensors: they are captured,
        so gradients and in-place running-stat updates go through captured graphs."""

        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.bn = nn.BatchNorm1d(16)
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x):
            h = dense(x, self.fc1.weight, self.fc1.bias)
            h = norm(h, self.bn.running_mean, self.bn.running_var, self.bn.weight,
                     self.bn.bias, self.training)
            return head(h, self.fc2.weight, self.fc2.bias, x)

    class Symmetric(nn.Module):
        """A parametrization: the symmetric matrix made from a tensor's upper triangle."""

        def forward(self, w):
            return w.triu() + w.triu(1).transpose(0, 1)

        def right_inverse(self, w):
            return w.triu()

    # name: (class, fresh input, names of the frames captured as graphs: each model's
    # forward, with its submodules and helper functions inlined into it)
    MODELS = {
        "mlp": (MLP, lambda: torch.randn(5, 8), {"forward"}),
        "cnn": (ResBlockCNN, lambda: torch.randn(4, 3, 10, 10), {"forward"}),
        "loop": (LoopModel, lambda: torch.randn(3, 6), {"forward"}),
        "functional": (FunctionalNet, lambda: torch.randn(5, 8), {"forward"}),
    }
else:
    MODELS = {}

ALL = sorted(MODELS) or ["none"]


def make(name, seed=0):
    torch.manual_seed(seed)
    cls, inputs, _ = MODELS[name]
    return cls(), inputs


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same_state(actual, expected):
    a, e = actual.state_dict(), expected.state_dict()
    assert list(a) == list(e)
    for key in e:
        torch.testing.assert_close(a[key], e[key], msg=lambda m: f"{key}: {m}")


def captured_names():
    return {r.name for r in agspeed._runtime.frame_records() if r.decision == "captured"}


# -- results ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
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
        expected = grads(reference)
        got = grads(model)
        assert list(got) == list(expected)
        for key, g in expected.items():
            torch.testing.assert_close(got[key], g, msg=lambda m: f"grad of {key}: {m}")
    # BatchNorm running stats (and num_batches_tracked) moved exactly as eager's
    assert_same_state(model, reference)
    assert MODELS[name][2] <= captured_names()  # the helpers really ran as graphs


def test_batchnorm_running_stats_change_in_train_mode_only():
    for name in ("cnn", "functional"):
        model, inputs = make(name)
        optimized = agspeed.optimize(model)
        before = model.bn.running_mean.clone()
        optimized.eval()
        optimized(inputs())
        torch.testing.assert_close(model.bn.running_mean, before)
        optimized.train()
        optimized(inputs())
        assert not torch.equal(model.bn.running_mean, before)


@pytest.mark.parametrize("name", ["cnn", "functional"])
def test_sgd_steps_match_eager(name):
    model, inputs = make(name)
    reference = copy.deepcopy(model)
    optimized = agspeed.optimize(model)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(optimized.parameters(), lr=0.1, momentum=0.9)
    n_classes = {"cnn": 5, "functional": 4}[name]
    target = torch.randint(0, n_classes, (inputs().shape[0],))
    start = copy.deepcopy(model.state_dict())
    for _ in range(4):
        x = inputs()
        for net, sgd in ((reference, opt_ref), (optimized, opt)):
            sgd.zero_grad()
            F.cross_entropy(net(x), target).backward()
            sgd.step()
    assert_same_state(model, reference)
    assert any(not torch.equal(v, start[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", ["mlp", "functional"])
@pytest.mark.parametrize("cache_enabled", [True, False])
def test_cpu_autocast_bf16_matches_eager(name, cache_enabled):
    model, inputs = make(name)
    reference = copy.deepcopy(model)
    optimized = agspeed.optimize(model)
    optimized(inputs())  # graphs captured outside autocast first: guards must notice
    for _ in range(2):
        x = inputs()
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache_enabled):
            expected = reference(x)
            got = optimized(x)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)
        expected.float().sum().backward()
        got.float().sum().backward()
        for key, g in grads(reference).items():
            torch.testing.assert_close(grads(model)[key], g)
    if name == "mlp":
        assert got.dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["mlp", "functional"])
def test_no_grad_and_inference_mode_behave_as_eager(name):
    model, inputs = make(name)
    reference = copy.deepcopy(model)
    optimized = agspeed.optimize(model)
    x = inputs()
    assert optimized(x).requires_grad and reference(x).requires_grad
    with torch.no_grad():
        got, expected = optimized(x), reference(x)
        assert got.requires_grad == expected.requires_grad is False
        torch.testing.assert_close(got, expected)
    with torch.inference_mode():
        got, expected = optimized(x), reference(x)
        assert got.is_inference() == expected.is_inference() is True
        assert got.requires_grad == expected.requires_grad is False
        torch.testing.assert_close(got, expected)
    # back in grad mode: graphs captured under no_grad must not be reused
    got, expected = optimized(x), reference(x)
    assert got.requires_grad and got.grad_fn is not None
    got.sum().backward()
    expected.sum().backward()
    for key, g in grads(reference).items():
        torch.testing.assert_close(grads(model)[key], g)


@pytest.mark.cxx_exceptions
@pytest.mark.parametrize("name", ["mlp", "functional"])
@pytest.mark.parametrize("bad", ["shape", "dtype"])
def test_bad_input_raises_the_eager_error(name, bad):
    model, _ = make(name)
    optimized = agspeed.optimize(model)
    optimized(torch.randn(2, 8))  # a captured graph exists for good inputs
    wrong = torch.randn(2, 3) if bad == "shape" else torch.randn(2, 8, dtype=torch.float64)
    with pytest.raises(Exception) as eager_error:
        model(wrong)
    with pytest.raises(type(eager_error.value)) as optimized_error:
        optimized(wrong)
    assert type(optimized_error.value) is type(eager_error.value)
    assert str(optimized_error.value) == str(eager_error.value)
    # and the module still works afterwards
    x = torch.randn(2, 8)
    torch.testing.assert_close(optimized(x), model(x))


@pytest.mark.cxx_exceptions
def test_one_bad_input_does_not_stop_the_captured_graph_serving_good_inputs():
    runs = []

    def counting(gm, example_inputs):
        def run(*args):
            runs.append(1)
            return gm.forward(*args)
        return run

    model, _ = make("functional")
    model.eval()
    optimized = agspeed.optimize(model, backend=counting)
    x = torch.randn(2, 8)
    optimized(x)
    optimized(x)
    assert len(runs) == 2  # the whole forward is one graph
    with pytest.raises(RuntimeError):
        optimized(torch.randn(2, 3))
    del runs[:]
    optimized(x)
    optimized(x)
    assert len(runs) == 2  # the bad shape's eager entry does not shadow the graph


@pytest.mark.parametrize("name", ["loop", "functional"])
def test_threads_calling_one_optimized_module_get_eager_results(name):
    model, inputs = make(name)
    model.eval()
    optimized = agspeed.optimize(model)
    torch.manual_seed(5)
    batches = [inputs() for _ in range(40)]
    with torch.no_grad():
        expected = [model(b) for b in batches]
    results = [None] * len(batches)
    errors = []
    barrier = threading.Barrier(2)

    def work(indices):
        try:
            barrier.wait()
            with torch.no_grad():
                for i in indices:
                    results[i] = optimized(batches[i])
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(range(k, len(batches), 2),))
               for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for got, want in zip(results, expected):
        torch.testing.assert_close(got, want)
    assert MODELS[name][2] <= captured_names()
    assert agspeed._C._eval_frame_owner() == "default"


# -- sharing ----------------------------------------------------------------------------


def test_state_dict_is_the_originals_same_keys_same_storage():
    model, _ = make("cnn")
    optimized = agspeed.optimize(model)
    got, expected = optimized.state_dict(), model.state_dict()
    assert list(got) == list(expected)
    assert not any(k.startswith("_orig_mod") for k in got)
    for key in expected:
        assert got[key].data_ptr() == expected[key].data_ptr(), key


def test_load_state_dict_through_the_optimized_module_changes_the_original():
    model, _ = make("cnn")
    optimized = agspeed.optimize(model)
    fresh = make("cnn", seed=1)[0].state_dict()
    assert not torch.equal(model.conv1.weight, fresh["conv1.weight"])
    optimized.load_state_dict(fresh)
    assert_same_state(model, make("cnn", seed=1)[0])


def test_parameters_and_buffers_are_the_same_objects():
    model, _ = make("loop")
    optimized = agspeed.optimize(model)
    params = list(model.parameters())
    assert len(params) == 6
    assert [id(p) for p in optimized.parameters()] == [id(p) for p in params]
    assert [id(b) for b in optimized.buffers()] == [id(b) for b in model.buffers()]
    assert optimized.offset is model.offset
    assert optimized.layers is model.layers
    assert optimized.__dict__ is model.__dict__


def test_train_and_eval_flip_both_and_all_submodules():
    model, _ = make("cnn")
    optimized = agspeed.optimize(model)
    assert optimized.eval() is optimized
    assert [m.training for m in model.modules()] == [False] * 5
    assert optimized.training is False
    model.train()
    assert [m.training for m in optimized.modules()] == [True] * 5
    optimized.train(False)
    assert not model.training and not model.bn.training
    model.eval()
    optimized.train()
    assert model.training and model.bn.training and model.conv2.training


def test_forward_hook_registered_on_either_fires_for_both():
    model, inputs = make("mlp")
    optimized = agspeed.optimize(model)
    seen = []
    on_opt = optimized.register_forward_hook(lambda m, a, out: seen.append(("opt", m)))
    on_orig = model.register_forward_hook(lambda m, a, out: seen.append(("orig", m)))
    model(inputs())
    assert seen == [("opt", model), ("orig", model)]
    del seen[:]
    optimized(inputs())
    assert seen == [("opt", optimized), ("orig", optimized)]
    on_opt.remove()  # removing through either handle removes it for both
    del seen[:]
    model(inputs())
    optimized(inputs())
    assert seen == [("orig", model), ("orig", optimized)]
    on_orig.remove()
    del seen[:]
    optimized(inputs())
    assert seen == []


def test_hooks_run_when_calling_the_optimized_module_and_can_change_things():
    model, inputs = make("functional")
    reference = copy.deepcopy(model)
    optimized = agspeed.optimize(model)
    order = []

    def pre(module, args):
        order.append("pre")
        return (args[0] * 2,)

    def post(module, args, out):
        order.append("post")
        return out + 100

    optimized.register_forward_pre_hook(pre)
    optimized.register_forward_hook(post)
    model.fc1.register_forward_pre_hook(lambda m, a: order.append("fc1"))  # never called
    x = inputs()
    torch.testing.assert_close(optimized(x), reference(x * 2) + 100)
    assert order == ["pre", "post"]
    torch.testing.assert_close(model(x), reference(x * 2) + 100)
    assert order == ["pre", "post"] * 2


def test_hooks_on_submodules_run_through_the_optimized_module():
    model, inputs = make("mlp")
    optimized = agspeed.optimize(model)
    seen = []
    model.fc1.register_forward_hook(lambda m, a, out: out.zero_())
    model.fc2.register_forward_pre_hook(lambda m, a: seen.append(a[0].abs().sum().item()))
    x = inputs()
    out = optimized(x)
    assert seen == [0.0]
    torch.testing.assert_close(out, model.fc2(torch.zeros(5, 16)).expand_as(out))


def test_forward_hooks_with_kwargs_run_when_calling_the_optimized_module():
    model, inputs = make("mlp")
    optimized = agspeed.optimize(model)
    seen = []
    optimized.register_forward_pre_hook(
        lambda m, args, kwargs: ((args[0] * 0,), kwargs), with_kwargs=True)
    optimized.register_forward_hook(
        lambda m, args, kwargs, out: seen.append(args[0].abs().sum().item()), with_kwargs=True)
    out = optimized(inputs())
    assert seen == [0.0]
    torch.testing.assert_close(out, model.fc2(F.gelu(model.fc1.bias)).expand_as(out))


def test_submodules_added_through_either_are_visible_on_both():
    model, inputs = make("mlp")
    optimized = agspeed.optimize(model)
    optimized.extra = nn.Linear(2, 2)
    assert model.extra is optimized.extra
    assert "extra.weight" in model.state_dict()
    model.more = nn.ReLU()
    assert optimized.more is model.more
    assert [n for n, _ in optimized.named_children()] == ["fc1", "fc2", "extra", "more"]
    del optimized.extra
    assert not hasattr(model, "extra")


def test_parametrizing_a_submodule_through_the_optimized_module():
    model, inputs = make("loop")
    reference = copy.deepcopy(model)
    optimized = agspeed.optimize(model)
    parametrize.register_parametrization(optimized.layers[0], "weight", Symmetric())
    parametrize.register_parametrization(reference.layers[0], "weight", Symmetric())
    w = model.layers[0].weight
    torch.testing.assert_close(w, w.T)
    x = inputs()
    torch.testing.assert_close(optimized(x), reference(x))
    torch.testing.assert_close(model(x), reference(x))


@pytest.mark.parametrize("on", ["original", "optimized"])
def test_parametrizing_the_root_module_keeps_both_working(on):
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    reference = copy.deepcopy(model)
    optimized = agspeed.optimize(model)
    view_class = type(optimized)
    parametrize.register_parametrization(
        model if on == "original" else optimized, "weight", Symmetric())
    parametrize.register_parametrization(reference, "weight", Symmetric())
    x = torch.randn(3, 4)
    torch.testing.assert_close(model(x), reference(x))
    torch.testing.assert_close(optimized(x), reference(x))
    # removed through the other object: both are plain again, the view in its first class
    parametrize.remove_parametrizations(
        optimized if on == "original" else model, "weight")
    parametrize.remove_parametrizations(reference, "weight")
    x = torch.randn(3, 4)
    torch.testing.assert_close(model(x), reference(x))
    torch.testing.assert_close(optimized(x), reference(x))
    assert type(model) is nn.Linear and type(optimized) is view_class
    assert "weight" in model._parameters and optimized.weight is model.weight
    assert not hasattr(model, "parametrizations") and not hasattr(optimized, "parametrizations")


@pytest.mark.parametrize("on", ["original", "optimized"])
def test_a_parametrized_root_tensor_reads_and_writes_alike_through_both(on):
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    optimized = agspeed.optimize(model)
    parametrize.register_parametrization(
        model if on == "original" else optimized, "weight", Symmetric())
    other = optimized if on == "original" else model
    # the other object sees the parametrized class: type, isinstance and __class__ agree
    assert type(model).__name__ == "ParametrizedLinear"
    assert isinstance(optimized, type(model)) and optimized.__class__ is type(model)
    assert parametrize.type_before_parametrizations(optimized) is nn.Linear
    torch.testing.assert_close(optimized.weight, model.weight)
    # assigning goes through right_inverse, not into the shared __dict__
    w = torch.randn(4, 4)
    other.weight = w + w.T
    assert "weight" not in vars(model)
    torch.testing.assert_close(model.weight, w + w.T)
    torch.testing.assert_close(optimized.weight, w + w.T)
    torch.testing.assert_close(model.parametrizations.weight.original, (w + w.T).triu())


@pytest.mark.parametrize("on", ["original", "optimized"])
@pytest.mark.parametrize("kind", ["weight_norm", "spectral_norm"])
def test_weight_and_spectral_norm_on_a_root_linear_keep_both_working(kind, on):
    apply = getattr(torch.nn.utils.parametrizations, kind)
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    reference = copy.deepcopy(model)
    optimized = agspeed.optimize(model)
    torch.manual_seed(1)  # spectral_norm starts its power iteration from random vectors
    apply(model if on == "original" else optimized)
    torch.manual_seed(1)
    apply(reference)
    assert list(optimized.state_dict()) == list(model.state_dict()) == list(reference.state_dict())
    for _ in range(3):  # in train mode spectral_norm updates its buffers on every call
        x = torch.randn(2, 6)
        torch.testing.assert_close(optimized(x), reference(x))
        torch.testing.assert_close(model(x), reference(x))
    optimized(x).sum().backward()
    reference(x).sum().backward()
    for key, g in grads(reference).items():
        torch.testing.assert_close(grads(model)[key], g, msg=lambda m: f"grad of {key}: {m}")


def test_deepcopy_of_a_parametrized_optimized_module_is_optimized_and_parametrized():
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    optimized = agspeed.optimize(model)
    parametrize.register_parametrization(optimized, "weight", Symmetric())
    clone = copy.deepcopy(optimized)
    assert parametrize.is_parametrized(clone, "weight")
    assert clone.__dict__ is not model.__dict__
    x = torch.randn(3, 4)
    torch.testing.assert_close(clone(x), model(x))
    agspeed.reset()
    clone(x)
    assert agspeed.counters()["frames_seen"] > 0  # the copy is optimized
    with torch.no_grad():
        clone.parametrizations.weight.original.add_(1.0)
    assert not torch.equal(clone.weight, model.weight)


def test_pickling_a_parametrized_optimized_module_raises_like_eager():
    model = nn.Linear(4, 4)
    optimized = agspeed.optimize(model)
    parametrize.register_parametrization(optimized, "weight", Symmetric())
    with pytest.raises(RuntimeError) as eager_error:
        pickle.dumps(model)
    with pytest.raises(RuntimeError) as optimized_error:
        pickle.dumps(optimized)
    assert str(optimized_error.value) == str(eager_error.value)


def test_parametrizing_a_view_of_a_view_keeps_all_three_working():
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    reference = copy.deepcopy(model)
    inner = agspeed.optimize(model)
    outer = agspeed.optimize(inner)
    parametrize.register_parametrization(outer, "weight", Symmetric())
    parametrize.register_parametrization(reference, "weight", Symmetric())
    x = torch.randn(3, 4)
    for module in (model, inner, outer):
        torch.testing.assert_close(module(x), reference(x))
    parametrize.remove_parametrizations(model, "weight")
    parametrize.remove_parametrizations(reference, "weight")
    for module in (model, inner, outer):
        torch.testing.assert_close(module(x), reference(x))
        assert module.__class__ is nn.Linear


def test_a_class_swap_on_either_object_reaches_the_other():
    class Doubled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = nn.Linear(3, 3)
    optimized = agspeed.optimize(model)
    view_class = type(optimized)
    x = torch.randn(2, 3)
    plain = model(x)
    model.__class__ = Doubled  # agspeed cannot see this: the view follows on its next call
    torch.testing.assert_close(optimized(x), 2 * plain)
    assert isinstance(optimized, Doubled) and type(optimized).__name__ == "Doubled"
    optimized.__class__ = nn.Linear  # through the view: the original follows at once
    assert type(model) is nn.Linear and type(optimized) is view_class
    torch.testing.assert_close(model(x), plain)
    torch.testing.assert_close(optimized(x), plain)
    optimized.__class__ = type(agspeed.optimize(nn.Linear(1, 1)))  # a view class stands for
    assert type(model) is nn.Linear                                  # the class under it


# -- the original is left alone ---------------------------------------------------------


def test_original_class_and_object_are_unchanged():
    model, _ = make("loop")
    cls = type(model)
    call_before = cls.__call__
    optimized = agspeed.optimize(model)
    assert type(model) is cls
    assert cls.__call__ is call_before
    assert "__call__" not in vars(model)
    assert type(optimized) is not cls
    assert isinstance(optimized, cls) and isinstance(optimized, nn.Module)
    assert type(optimized).__name__ == cls.__name__
    assert type(optimized).__qualname__ == cls.__qualname__
    assert type(optimized).__module__ == cls.__module__
    assert repr(optimized) == repr(model)


def test_optimize_does_not_run_the_classes_init_subclass():
    made = []

    class Registered(nn.Module):
        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            made.append(cls.__name__)

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.scale = nn.Parameter(torch.randn(3, 3))

        def forward(self, x):
            return self.fc(x) @ self.scale

    class Net(Registered):
        pass

    class Final(nn.Linear):
        def __init_subclass__(cls, **kwargs):
            raise TypeError("Final cannot be subclassed")

    class Abstract(nn.Module, abc.ABC):
        def __init_subclass__(cls, **kwargs):
            made.append(cls.__name__)

        @abc.abstractmethod
        def forward(self, x): ...

    class Concrete(Abstract):
        def forward(self, x):
            return x * 2

    assert made == ["Net", "Concrete"]
    x = torch.randn(2, 3)
    net = Net()
    optimized = agspeed.optimize(net)
    torch.testing.assert_close(optimized(x), net(x))
    final = Final(3, 3)
    torch.testing.assert_close(agspeed.optimize(final)(x), final(x))
    torch.testing.assert_close(agspeed.optimize(Concrete())(x), x * 2)
    assert made == ["Net", "Concrete"]
    # parametrize subclasses the class once, as in eager; the view adds no subclass of its own
    parametrize.register_parametrization(optimized, "scale", Symmetric())
    torch.testing.assert_close(optimized(x), net(x))
    assert made == ["Net", "Concrete", "ParametrizedNet"]


def test_a_module_class_with_slots_is_subclassed_the_ordinary_way():
    class Slotted(nn.Linear):
        __slots__ = ("note",)

    torch.manual_seed(0)
    model = Slotted(3, 3)
    optimized = agspeed.optimize(model)
    assert isinstance(optimized, Slotted) and optimized.__dict__ is model.__dict__
    x = torch.randn(2, 3)
    torch.testing.assert_close(optimized(x), model(x))
    parametrize.register_parametrization(optimized, "weight", Symmetric())
    torch.testing.assert_close(optimized(x), model(x))


def test_calling_the_original_does_not_go_through_the_hook():
    model, inputs = make("loop")
    optimized = agspeed.optimize(model)
    optimized(inputs())
    agspeed.reset()
    model(inputs())
    assert agspeed.counters()["frames_seen"] == 0
    assert agspeed._runtime.frame_records() == []
    optimized(inputs())
    assert agspeed.counters()["frames_seen"] > 0


def test_calling_forward_directly_bypasses_the_runtime_like_eager():
    model, inputs = make("loop")
    optimized = agspeed.optimize(model)
    agspeed.reset()
    x = inputs()
    torch.testing.assert_close(optimized.forward(x), model(x))
    assert agspeed.counters()["frames_seen"] == 0


# -- pickling and copies ----------------------------------------------------------------


def test_the_original_still_pickles_as_a_plain_module():
    model, inputs = make("cnn")
    agspeed.optimize(model)
    restored = pickle.loads(pickle.dumps(model))
    assert type(restored) is ResBlockCNN
    assert_same_state(restored, model)
    model.eval(), restored.eval()
    x = inputs()
    torch.testing.assert_close(restored(x), model(x))


@pytest.mark.parametrize("name", ["mlp", "cnn", "functional"])
def test_pickled_optimized_module_loads_as_an_optimized_module(name):
    model, inputs = make(name)
    model.eval()
    optimized = agspeed.optimize(model, backend="eager")
    restored = pickle.loads(pickle.dumps(optimized))
    cls = MODELS[name][0]
    assert isinstance(restored, cls)
    assert type(restored) is not cls and type(restored) is not type(optimized)
    assert type(restored).__name__ == cls.__name__
    assert type(restored).__agspeed_spec__ == {"backend": "eager", "options": {}}
    assert_same_state(restored, model)
    x = inputs()
    torch.testing.assert_close(restored(x), model(x))
    # it is optimized, and independent of the module it was pickled from
    agspeed.reset()
    restored(x)
    assert agspeed.counters()["frames_seen"] > 0
    with torch.no_grad():
        next(restored.parameters()).add_(1.0)
    assert not torch.equal(next(restored.parameters()), next(model.parameters()))


def test_pickling_original_and_optimized_together_keeps_them_sharing():
    model, inputs = make("mlp")
    optimized = agspeed.optimize(model)
    model2, optimized2 = pickle.loads(pickle.dumps((model, optimized)))
    assert type(model2) is MLP and isinstance(optimized2, MLP) and type(optimized2) is not MLP
    assert optimized2.__dict__ is model2.__dict__
    assert model2.__dict__ is not model.__dict__
    optimized2.eval()
    assert not model2.training and model.training


def test_torch_save_of_the_whole_optimized_module_round_trips():
    model, inputs = make("functional")
    model.eval()
    optimized = agspeed.optimize(model)
    buffer = io.BytesIO()
    torch.save(optimized, buffer)
    buffer.seek(0)
    restored = torch.load(buffer, weights_only=False)
    assert isinstance(restored, FunctionalNet) and type(restored) is not FunctionalNet
    x = inputs()
    torch.testing.assert_close(restored(x), model(x))


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_deepcopy_gives_an_independent_optimized_module(name):
    model, inputs = make(name)
    model.eval()
    optimized = agspeed.optimize(model)
    clone = copy.deepcopy(optimized)
    assert isinstance(clone, MODELS[name][0]) and type(clone) is not MODELS[name][0]
    assert clone.__dict__ is not model.__dict__
    assert_same_state(clone, model)
    x = inputs()
    torch.testing.assert_close(clone(x), model(x))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(1.0)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    clone.train()
    model.eval()
    assert clone.training and not model.training
    agspeed.reset()
    clone(x)
    assert agspeed.counters()["frames_seen"] > 0  # the copy is optimized


def test_shallow_copy_is_a_copy_like_eager():
    model, inputs = make("mlp")
    optimized = agspeed.optimize(model)
    eager_copy = copy.copy(model)
    eager_copy.training = False
    assert model.training  # eager: the copy's own attribute dict
    shallow = copy.copy(optimized)
    assert isinstance(shallow, MLP)
    shallow.training = False
    assert model.training


def test_shallow_copy_is_an_optimized_view_of_a_shallow_copy():
    model, inputs = make("mlp")
    optimized = agspeed.optimize(model, backend="eager")
    shallow = copy.copy(optimized)
    assert type(shallow) is not MLP and type(shallow) is not type(optimized)
    assert type(shallow).__agspeed_spec__ == {"backend": "eager", "options": {}}
    assert shallow.__dict__ is not model.__dict__
    for key, value in vars(model).items():  # a new dict, the same values, as for eager
        assert vars(shallow)[key] is value, key
    assert shallow.fc1 is model.fc1 and shallow.fc1.weight is model.fc1.weight
    x = inputs()
    torch.testing.assert_close(shallow(x), model(x))
    agspeed.reset()
    shallow(x)
    assert agspeed.counters()["frames_seen"] > 0  # the copy is optimized


def test_state_dict_saved_with_torch_save_loads_into_a_fresh_model():
    model, inputs = make("cnn")
    optimized = agspeed.optimize(model)
    optimized(inputs())  # move the running stats off their initial values
    buffer = io.BytesIO()
    torch.save(optimized.state_dict(), buffer)
    buffer.seek(0)
    fresh = make("cnn", seed=3)[0]
    fresh.load_state_dict(torch.load(buffer))
    assert_same_state(fresh, model)
    model.eval(), fresh.eval()
    x = inputs()
    torch.testing.assert_close(fresh(x), optimized(x))


# -- what the runtime sees --------------------------------------------------------------


@pytest.mark.parametrize("name,helpers", [("loop", {"helper_scale"}),
                                           ("functional", {"dense", "norm", "head"})])
def test_the_hook_sees_the_user_forward_and_caches_its_decisions(name, helpers):
    model, inputs = make(name)
    optimized = agspeed.optimize(model)
    agspeed.reset()
    optimized(inputs())
    records = agspeed._runtime.frame_records()
    names = {r.name for r in records}
    assert "forward" in names
    # the helpers were inlined into forward's graph: their frames never ran
    assert not helpers & names
    assert all(r.filename == __file__ for r in records if r.name == "forward")
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    assert not any(os.path.realpath(r.filename).startswith(torch_dir) for r in records)
    counts = agspeed.counters()
    assert counts["cache_misses"] > 0
    for _ in range(2):
        optimized(inputs())
        now = agspeed.counters()
        assert now["cache_misses"] == counts["cache_misses"]
        assert now["cache_hits"] > counts["cache_hits"]
        counts = now
    assert len(agspeed._runtime.frame_records()) == len(records)


def test_disable_option_returns_the_module_itself():
    model, inputs = make("mlp")
    assert agspeed.optimize(model, disable=True) is model
    assert type(model) is MLP


def test_agspeed_disable_env_returns_the_module_itself(monkeypatch):
    model, inputs = make("mlp")
    monkeypatch.setenv("AGSPEED_DISABLE", "1")
    agspeed.config.reload()
    assert agspeed.optimize(model) is model
    monkeypatch.delenv("AGSPEED_DISABLE")
    agspeed.config.reload()
    assert agspeed.optimize(model) is not model


def test_optimizing_an_optimized_module_still_shares_and_matches_eager():
    model, inputs = make("functional")
    optimized = agspeed.optimize(agspeed.optimize(model))
    assert optimized.__dict__ is model.__dict__ and isinstance(optimized, FunctionalNet)
    x = inputs()
    torch.testing.assert_close(optimized(x), copy.deepcopy(model)(x))
    restored = pickle.loads(pickle.dumps(optimized))
    torch.testing.assert_close(restored(x), model(x))


def test_optimized_submodule_inside_a_plain_parent():
    model, inputs = make("mlp")
    reference = copy.deepcopy(model)
    keys = list(model.state_dict())
    model.fc1 = agspeed.optimize(model.fc1)
    assert list(model.state_dict()) == keys
    x = inputs()
    torch.testing.assert_close(model(x), reference(x))
    restored = pickle.loads(pickle.dumps(model))
    torch.testing.assert_close(restored(x), reference(x))
    clone = copy.deepcopy(model)
    assert clone.fc1.weight is not model.fc1.weight
    torch.testing.assert_close(clone(x), reference(x))


def test_a_failing_forward_leaves_the_runtime_usable(caplog):
    class Fails(nn.Module):
        def forward(self, x):
            raise ValueError("from forward")

    optimized = agspeed.optimize(Fails())
    with caplog.at_level(logging.WARNING, logger="agspeed"):
        with pytest.raises(ValueError, match="from forward"):
            optimized(torch.randn(2))
    assert agspeed._C._eval_frame_owner() == "default"
    model, inputs = make("functional")
    x = inputs()
    torch.testing.assert_close(agspeed.optimize(model)(x), copy.deepcopy(model)(x))
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]


# -- other PEP 523 users and TorchScript ------------------------------------------------


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


def test_parameter_and_module_lists_summed_or_tested_stay_in_one_graph():
    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scales = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.randn(4)) for _ in range(3)])
            self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])

        def forward(self, x):
            if any(self.layers):   # the truth of each member
                x = x * sum(self.scales)
            return sum(layer(x) for layer in self.layers)

    model = Mixed()
    x = torch.randn(2, 4)
    report = agspeed.explain(model, x)
    assert report.graph_count == 1 and report.graph_break_count == 0
    fast = agspeed.optimize(model, backend="eager")
    out = fast(x)
    torch.testing.assert_close(out, model(x))
    out.sum().backward()
    assert all(p.grad is not None for p in model.scales)


class _OwnParameterStore(collections.OrderedDict):
    """What DeepSpeed's ZeRO puts in ``_parameters``: an OrderedDict with its own
    ``__getitem__`` (there, gathering a sharded weight)."""

    def __getitem__(self, key):
        return super().__getitem__(key)


def test_a_module_whose_parameter_store_is_a_mapping_of_its_own_reads_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    for mod in model.modules():
        store = _OwnParameterStore()
        for k, p in mod._parameters.items():
            store[k] = p
        mod._parameters = store
    fast = agspeed.optimize(model, backend="eager")
    for _ in range(2):
        x = torch.randn(3, 4)
        torch.testing.assert_close(fast(x), model(x))
    with torch.no_grad():
        model[0].weight.mul_(2)           # changed in place: read, not held
    x = torch.randn(3, 4)
    torch.testing.assert_close(fast(x), model(x))


def test_a_forward_bound_on_the_instance_is_captured_and_guarded():
    """``m.forward = types.MethodType(f, m)``: the bound method the instance holds is
    called (one graph); another one put there later is seen."""
    import types

    class _Plain(torch.nn.Module):
        pass

    class _Minus(torch.nn.Module):
        def forward(self, x):
            return x - 1

    class _Times(torch.nn.Module):
        def forward(self, x):
            return x * 3

    agspeed.reset()
    mod = _Plain()
    mod.forward = types.MethodType(_Minus.forward, mod)
    fast = agspeed.optimize(lambda x: mod(x) * 2, backend="eager", fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(fast(x), (x - 1) * 2)
    mod.forward = types.MethodType(_Times.forward, mod)
    torch.testing.assert_close(fast(x), x * 6)
