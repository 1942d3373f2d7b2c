"""Backends with real torch.fx graphs: the registry and the eager backend."""

import pytest

import agspeed
from agspeed import backends

try:
    import torch
    import torch.nn as nn
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = None

pytestmark = pytest.mark.torch


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


@pytest.mark.parametrize("name", ["eager", "auto"])
def test_builtin_backend_runs_an_fx_graph_like_the_model(name):
    model = small_model()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(3, 4)
    compiled = backends.get_backend(name)(gm, [x])
    for _ in range(2):
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(x), model(x))


def test_eager_backend_output_is_differentiable():
    model = small_model()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(5, 4, requires_grad=True)
    backends.get_backend("eager")(gm, [x])(x).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    model(x).sum().backward()
    torch.testing.assert_close(x.grad, expected)


def test_user_backend_with_the_torch_compile_signature():
    def counting(gm, example_inputs):
        assert isinstance(gm, torch.fx.GraphModule)
        return gm.forward

    model = small_model()
    try:
        agspeed.register_backend("test_counting", counting)
        for backend in ("test_counting", counting, lambda gm, ex: gm.forward):
            optimized = agspeed.optimize(model, backend=backend)
            x = torch.randn(2, 4)
            torch.testing.assert_close(optimized(x), model(x))
        gm = torch.fx.symbolic_trace(model)
        x = torch.randn(2, 4)
        torch.testing.assert_close(backends.get_backend("test_counting")(gm, [x])(x), model(x))
    finally:
        backends._registered.pop("test_counting", None)
