"""Frames called under torch.func's transforms (vmap, grad, jvp) run as torch.func runs
them: their tensors are the transform's wrappers, which a graph compiled for plain
tensors must never be given, and the transform level is part of every guard's global
state (guards/state.py)."""

import pytest

import agspeed

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch


class PlainOnly:
    """A backend whose graphs refuse the transforms' wrapped tensors (a compiled graph
    reads their storage, which they do not have), counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, gm, example_inputs):
        def run(*args):
            wrapped = torch._C._functorch.is_functorch_wrapped_tensor
            assert not any(isinstance(a, torch.Tensor) and wrapped(a) for a in args)
            self.calls += 1
            return gm(*args)
        return run


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def test_per_sample_gradients_of_an_optimized_loss_are_eagers():
    from torch.func import functional_call, grad, vmap

    model = _model()

    def loss(params, x, y):
        out = functional_call(model, params, (x.unsqueeze(0),))
        return (out.squeeze() - y) ** 2

    backend = PlainOnly()
    fast = agspeed.optimize(loss, backend=backend)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(5, 4), torch.randn(5)
    for _ in range(2):
        calls = backend.calls
        torch.testing.assert_close(fast(params, x[0], y[0]), loss(params, x[0], y[0]))
        assert backend.calls > calls   # a plain call runs the graph
        calls = backend.calls
        got = vmap(grad(fast), in_dims=(None, 0, 0))(params, x, y)
        want = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
        for name in want:
            torch.testing.assert_close(got[name], want[name])
        assert backend.calls == calls   # a transformed one runs eager


def test_a_transform_inside_the_optimized_function_is_eagers():
    def f(x):
        return torch.vmap(lambda r: (r * r).sum())(x) + \
            torch.func.grad(lambda t: t.sin().sum())(x).sum(-1)

    fast = agspeed.optimize(f, backend=PlainOnly())
    for _ in range(2):
        x = torch.randn(3, 4)
        torch.testing.assert_close(fast(x), f(x))


def test_capturing_around_a_transform_leaves_torch_func_state_as_it_was():
    # the capture once ran grad's own level bookkeeping on fake tensors and left a level
    # entered: every later frame of the process ran as if under a transform
    def f(x):
        return torch.func.grad(lambda t: (t * t).sum())(x) + 1

    fast = agspeed.optimize(f, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(fast(x), f(x))
    assert torch._C._functorch.maybe_current_level() is None
    assert "torch.func's grad" in str(agspeed.explain(f, x))


def test_a_graph_captured_inside_a_transform_is_not_used_outside_it():
    model = _model()
    backend = PlainOnly()
    fast = agspeed.optimize(model, backend=backend)
    x = torch.randn(5, 4)
    inside = torch.vmap(fast)(x)
    torch.testing.assert_close(inside, torch.vmap(model)(x))
    torch.testing.assert_close(fast(x), model(x))
    assert backend.calls == 1
