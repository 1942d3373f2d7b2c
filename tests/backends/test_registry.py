"""Backends with real torch.fx graphs: the registry and the eager backend.

A backend has torch.compile's signature, ``backend(gm, example_inputs) -> callable``.
These tests run the built-in ones on graphs from ``torch.fx.symbolic_trace`` and check
that user backends, registered by name or passed as callables, are the ones the runtime
compiles captured graphs with and calls on later hits.
"""

import logging

import pytest

import agspeed
from agspeed import backends
from agspeed.errors import InvalidArgumentError

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = F = None

pytestmark = pytest.mark.torch

if torch is not None:

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 8)
            self.fc2 = nn.Linear(8, 2)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    def dense(x, w, b):
        return torch.tanh(F.linear(x, w, b))

    class DenseNet(nn.Module):
        """Its forward inlines the helper ``dense``: one graph of three inputs."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return dense(x, self.fc.weight, self.fc.bias)


def mlp():
    torch.manual_seed(0)
    return MLP()


def dense_net():
    torch.manual_seed(0)
    return DenseNet()


class Recorder:
    """A backend with the torch.compile signature that records what it was given and
    counts calls of the callable it returns (the GraphModule's own forward)."""

    def __init__(self):
        self.graphs = []
        self.example_inputs = []
        self.runs = 0

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        self.example_inputs.append(list(example_inputs))

        def run(*args):
            self.runs += 1
            return gm.forward(*args)

        return run


def _registered(name, fn):
    agspeed.register_backend(name, fn)
    assert name in agspeed.list_backends()
    assert backends.get_backend(name) is fn


# -- built-in backends on fx graphs -----------------------------------------------------


@pytest.mark.parametrize("name", ["eager", "auto"])
def test_builtin_backend_runs_an_fx_graph_like_the_model(name):
    model = mlp()
    gm = torch.fx.symbolic_trace(model)
    example = torch.randn(3, 4)
    compiled = backends.get_backend(name)(gm, [example])
    assert callable(compiled)
    for batch in (3, 3, 7):  # the graph is not specialized to the example's shape
        x = torch.randn(batch, 4)
        torch.testing.assert_close(compiled(x), model(x))


def test_eager_backend_returns_the_graphs_own_forward():
    gm = torch.fx.symbolic_trace(mlp())
    compiled = backends.get_backend("eager")(gm, [torch.randn(2, 4)])
    assert compiled == gm.forward
    assert compiled.__self__ is gm


def test_eager_backend_output_is_differentiable_like_the_model():
    model = mlp()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(5, 4, requires_grad=True)
    compiled = backends.get_backend("eager")(gm, [x])
    compiled(x).square().sum().backward()
    got_x = x.grad.clone()
    got_w = model.fc1.weight.grad.clone()  # the graph holds the model's own parameters
    x.grad = None
    model.zero_grad()
    model(x).square().sum().backward()
    torch.testing.assert_close(got_x, x.grad)
    torch.testing.assert_close(got_w, model.fc1.weight.grad)


def test_auto_resolves_to_the_autotuner_which_has_the_backend_signature():
    from agspeed.backends.autotune import autotuner

    name, fn = backends.resolve("auto")
    assert name == "auto"
    assert fn is autotuner
    model = mlp()
    x = torch.randn(2, 4)
    torch.testing.assert_close(fn(torch.fx.symbolic_trace(model), [x])(x), model(x))


def test_resolve_by_name_and_by_callable():
    assert backends.resolve("eager") == ("eager", backends.get_backend("eager"))

    def mine(gm, example_inputs):
        return gm.forward

    lam = lambda gm, ex: gm.forward  # noqa: E731
    recorder = Recorder()
    assert backends.resolve(mine) == ("mine", mine)
    assert backends.resolve(mine)[1] is mine
    assert backends.resolve(lam)[1] is lam
    assert backends.resolve(recorder) == ("Recorder", recorder)  # no __name__: its type's
    with pytest.raises(InvalidArgumentError, match="backend must be"):
        backends.resolve(object())


# -- user backends used by optimize() ---------------------------------------------------


def test_registered_user_backend_compiles_the_captured_graphs():
    recorder = Recorder()
    model = dense_net()
    try:
        _registered("test_recorder", recorder)
        optimized = agspeed.optimize(model, backend="test_recorder")
        for _ in range(3):
            x = torch.randn(2, 4)
            torch.testing.assert_close(optimized(x), dense(x, model.fc.weight, model.fc.bias))
    finally:
        backends._registered.pop("test_recorder", None)
    assert "test_recorder" not in agspeed.list_backends()
    assert len(recorder.graphs) == 1  # one capture, then cache hits
    assert recorder.runs == 3  # the backend's callable is what ran, every call
    gm = recorder.graphs[0]
    assert isinstance(gm, torch.fx.GraphModule)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    example_inputs = recorder.example_inputs[0]
    assert len(example_inputs) == len(placeholders) == 3
    # example inputs are the real tensors of the frame, not fakes
    assert all(type(t) in (torch.Tensor, nn.Parameter) for t in example_inputs)
    assert example_inputs[1] is model.fc.weight and example_inputs[2] is model.fc.bias
    assert [tuple(t.shape) for t in example_inputs] == [(2, 4), (3, 4), (3,)]


def test_backend_callable_passed_directly_is_used():
    recorder = Recorder()
    model = dense_net()
    optimized = agspeed.optimize(model, backend=recorder)
    x = torch.randn(2, 4)
    torch.testing.assert_close(optimized(x), dense(x, model.fc.weight, model.fc.bias))
    torch.testing.assert_close(optimized(x), dense(x, model.fc.weight, model.fc.bias))
    assert len(recorder.graphs) == 1 and recorder.runs == 2
    assert recorder not in [backends.get_backend(n) for n in backends.list_backends()]


def test_lambda_returning_the_graphs_forward_is_accepted():
    model = dense_net()
    optimized = agspeed.optimize(model, backend=lambda gm, ex: gm.forward)
    for _ in range(2):
        x = torch.randn(2, 4)
        torch.testing.assert_close(optimized(x), dense(x, model.fc.weight, model.fc.bias))
    assert "forward" in {r.name for r in agspeed._runtime.frame_records()
                         if r.decision == "captured"}


def test_the_frame_returns_what_the_backends_callable_returns():
    # A backend may compute anything: the optimized call returns its result, not eager's.
    def doubling(gm, example_inputs):
        return lambda *args: (gm.forward(*args)[0] * 2,)

    model = dense_net()
    optimized = agspeed.optimize(model, backend=doubling)
    x = torch.randn(2, 4)
    torch.testing.assert_close(optimized(x), 2 * dense(x, model.fc.weight, model.fc.bias))
    torch.testing.assert_close(model(x), dense(x, model.fc.weight, model.fc.bias))


def test_a_backend_that_raises_leaves_the_program_computing_eager_results(caplog):
    def broken(gm, example_inputs):
        raise ValueError("backend failed")

    model = dense_net()
    optimized = agspeed.optimize(model, backend=broken)
    with caplog.at_level(logging.CRITICAL, logger="agspeed"):
        for _ in range(2):
            x = torch.randn(2, 4)
            torch.testing.assert_close(optimized(x), dense(x, model.fc.weight, model.fc.bias))


def unsqueezes_its_input(x):
    x.unsqueeze_(0)
    return x + 1


def transposes_its_input(x):
    x.t_()
    return x * 2


@pytest.mark.parametrize("fn", [unsqueezes_its_input, transposes_its_input])
def test_an_input_changed_in_place_in_its_layout_is_changed_once_when_the_backend_fails(
        fn, caplog):
    # the runtime runs the graph to tell the program's error from the backend's; what it
    # puts back after includes an in-place view op's sizes and strides, which change no
    # version and no value (the input was unsqueezed twice)
    def broken(gm, example_inputs):
        raise ValueError("backend failed")

    fast = agspeed.optimize(fn, backend=broken)
    with caplog.at_level(logging.CRITICAL, logger="agspeed"):
        for _ in range(2):
            x = torch.randn(3, 4)
            y = x.clone()
            got, want = fast(x), fn(y)
            assert (x.shape, x.stride()) == (y.shape, y.stride())
            torch.testing.assert_close(got, want)


def test_a_failing_backend_does_not_stop_other_backends_capturing_the_function(caplog):
    def broken(gm, example_inputs):
        raise ValueError("backend failed")

    model = dense_net()
    with caplog.at_level(logging.CRITICAL, logger="agspeed"):
        agspeed.optimize(model, backend=broken)(torch.randn(2, 4))
    recorder = Recorder()
    x = torch.randn(2, 4)
    torch.testing.assert_close(agspeed.optimize(model, backend=recorder)(x), model(x))
    assert len(recorder.graphs) == 1 and recorder.runs == 1


def test_each_backend_compiles_its_own_graph_for_the_same_function():
    first, second = Recorder(), Recorder()
    model = dense_net()
    a = agspeed.optimize(model, backend=first)
    b = agspeed.optimize(model, backend=second)
    x = torch.randn(2, 4)
    torch.testing.assert_close(a(x), b(x))
    a(x)
    assert (len(first.graphs), first.runs) == (1, 2)
    assert (len(second.graphs), second.runs) == (1, 1)


# -- the capability protocol --------------------------------------------------------------


def test_a_plain_callable_can_take_anything():
    caps = backends.capabilities_of(lambda gm, ex: gm.forward)
    assert caps.training and caps.dynamic and {"cpu", "cuda"} <= caps.devices


def test_the_older_supports_dynamic_attribute_still_reads():
    def static_only(gm, ex):
        return gm.forward

    static_only.supports_dynamic = False
    assert not backends.capabilities_of(static_only).dynamic
    assert not backends.supports_dynamic(static_only)


def test_why_not_names_the_device_training_and_dynamic_limits():
    gm = torch.fx.symbolic_trace(mlp())
    x = torch.randn(2, 4)

    def cuda_inference(gm, ex):
        return gm.forward

    cuda_inference.capabilities = backends.Capabilities(training=False, dynamic=False,
                                                        devices={"cuda"})
    assert "not cpu" in backends.why_not(cuda_inference, gm, [x], training=False)
    cuda_inference.capabilities = backends.Capabilities(training=False)
    assert "backward" in backends.why_not(cuda_inference, gm, [x], training=True)
    assert backends.why_not(cuda_inference, gm, [x], training=False) is None
    cuda_inference.capabilities = backends.Capabilities(unavailable=lambda: "no library")
    assert backends.why_not(cuda_inference, gm, [x], training=False) == "no library"


@pytest.mark.skipif(torch is not None and torch.cuda.is_available(), reason="a CPU-only check")
def test_cudagraphs_on_a_machine_without_cuda_says_so_and_the_graph_runs(caplog):
    fn = backends.get_backend("cudagraphs")
    assert "CUDA" in backends.capabilities_of(fn).unavailable()
    model = dense_net()
    x = torch.randn(2, 4)
    with caplog.at_level(logging.WARNING, logger="agspeed"):
        out = agspeed.optimize(model, backend="cudagraphs")(x)
    torch.testing.assert_close(out, dense(x, model.fc.weight, model.fc.bias))
    assert "cudagraphs cannot take this graph" in caplog.text and "CUDA" in caplog.text
    assert any(r.decision == "captured" for r in agspeed._runtime.frame_records())


@pytest.mark.skipif(torch is not None and torch.cuda.is_available(), reason="a CPU-only check")
def test_nvrtc_cudagraphs_says_what_it_lacks_here_and_the_graph_runs(caplog):
    fn = backends.get_backend("nvrtc_cudagraphs")
    caps = backends.capabilities_of(fn)
    assert not caps.dynamic and caps.devices == {"cuda"}
    assert "CUDA" in caps.unavailable()
    model = dense_net()
    x = torch.randn(2, 4)
    with caplog.at_level(logging.WARNING, logger="agspeed"):
        out = agspeed.optimize(model, backend="nvrtc_cudagraphs")(x)
    torch.testing.assert_close(out, dense(x, model.fc.weight, model.fc.bias))
    assert "nvrtc_cudagraphs cannot take this graph" in caplog.text


def test_threads_calling_first_together_compile_the_graph_once():
    """A server's worker threads whose first calls come at once: one thread captures and
    compiles while the others wait, then run that call eager (same results) and find
    the graph in the cache on their next call."""
    import threading
    import time

    compiled = []

    def slow(gm, example_inputs):
        compiled.append(threading.get_ident())
        time.sleep(0.3)     # long enough for every thread to arrive meanwhile
        return gm.forward

    agspeed.register_backend("t_slow_compile", slow, override=True)
    try:
        model = MLP()
        fast = agspeed.optimize(model, backend="t_slow_compile")
        x = torch.randn(3, 4)
        start = threading.Barrier(4)
        outs = [None] * 4

        def worker(k):
            start.wait()
            outs[k] = fast(x)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(compiled) == 1
        want = model(x)
        for out in outs:
            torch.testing.assert_close(out, want)
        calls = agspeed.counters()["graph_calls"]
        torch.testing.assert_close(fast(x), want)
        assert agspeed.counters()["graph_calls"] == calls + 1 and len(compiled) == 1
    finally:
        backends._registered.pop("t_slow_compile", None)


def test_a_user_backend_built_on_aot_autograd_keeps_a_dynamic_ints_value_an_input():
    # the backend traces under the capture's fake mode, as under torch.compile: the int
    # is a symbol there, not the first call's value baked into a graph reused for others
    from torch._functorch.aot_autograd import aot_module_simplified

    compiles = []

    def aot_backend(gm, example_inputs):
        compiles.append([type(v).__name__ for v in example_inputs])
        return aot_module_simplified(gm, example_inputs,
                                     fw_compiler=lambda traced, _: traced.forward)

    def scaled(x, d):
        return torch.arange(x.size(0)) * d + x

    run = agspeed.optimize(scaled, backend=aot_backend, dynamic=True)
    for n, d in ((3, 5), (4, 6), (5, 7), (3, -2)):
        x = torch.randn(n)
        assert torch.equal(run(x, d), scaled(x, d))
    assert compiles == [["Tensor", "int"]]
