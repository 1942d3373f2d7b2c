"""A user's torch.autograd.Function is one node of the graph (agspeed._calls.FunctionApply):
the frame stays one graph, its forward and its own backward run as in eager, compilers
trace through both; the Functions it cannot take break the graph and still compute
eager's results."""

import pytest

import agspeed

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch

if torch is not None:
    class Cube(torch.autograd.Function):
        """A backward that is not autograd's (3x the true gradient), so a test can tell
        whose backward ran."""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 9 * x * x * grad

    class RoundST(torch.autograd.Function):
        """Straight-through rounding: round forward, identity backward."""

        @staticmethod
        def forward(ctx, x):
            return torch.round(x)

        @staticmethod
        def backward(ctx, grad):
            return grad

    class ScaleShift(torch.autograd.Function):
        """Non-tensor arguments, two outputs, a gradient only where one is needed."""

        @staticmethod
        def forward(x, y, scale, shift=0.0):
            return x * scale + shift, (x * y).sum(-1)

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, y, scale = inputs[:3]
            ctx.scale = scale
            ctx.save_for_backward(x, y)

        @staticmethod
        def backward(ctx, g_out, g_sum):
            x, y = ctx.saved_tensors
            gx = g_out * ctx.scale + g_sum.unsqueeze(-1) * y
            gy = g_sum.unsqueeze(-1) * x if ctx.needs_input_grad[1] else None
            return gx, gy, None, None

    class Clamp_(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.mark_dirty(x)
            return x.clamp_(-0.5, 0.5)

        @staticmethod
        def backward(ctx, grad):
            return grad

    class Thresholded(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2 if x.sum().item() > 0 else x * 3

        @staticmethod
        def backward(ctx, grad):
            return grad

    class Call(torch.autograd.Function):
        @staticmethod
        def forward(ctx, fn, x):
            return fn(x)

        @staticmethod
        def backward(ctx, grad):
            return None, grad


def _net():
    lin = torch.nn.Linear(4, 4)

    def f(x, y):
        h = Cube.apply(lin(x))
        a, b = ScaleShift.apply(h, y, 0.5, shift=1.0)
        return RoundST.apply(a * 4) + b.unsqueeze(-1)
    return lin, f


def _inputs():
    return torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)


def _compare(fn, fast, params=(), steps=2):
    for _ in range(steps):
        x, y = _inputs()
        rx, ry = (t.detach().clone().requires_grad_() for t in (x, y))
        for p in params:
            p.grad = None
        out = fast(x, y)
        out.sum().backward()
        got = [x.grad, y.grad, *(p.grad.clone() for p in params)]
        for p in params:
            p.grad = None
        ref = fn(rx, ry)
        ref.sum().backward()
        want = [rx.grad, ry.grad, *(p.grad.clone() for p in params)]
        torch.testing.assert_close(out, ref)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)


def test_functions_are_nodes_of_one_graph_with_their_own_backward():
    lin, f = _net()
    report = agspeed.explain(f, *_inputs())
    assert report.graph_count == 1 and report.graph_break_count == 0
    assert str(report).count("apply_") == 3
    _compare(f, agspeed.optimize(f, backend="eager"), lin.parameters())


def test_the_functions_own_backward_runs():
    def f(x, y):
        return Cube.apply(x) + y

    fast = agspeed.optimize(f, backend="eager")
    x = torch.tensor([2.0], requires_grad=True)
    fast(x, torch.zeros(1)).backward()
    assert x.grad.item() == 36.0   # 9 x^2, not autograd's 3 x^2


def test_apply_taken_as_a_value_is_a_node_too():
    def f(x, y):
        op = RoundST.apply
        return op(x * 3) + y

    report = agspeed.explain(f, *_inputs())
    assert report.graph_count == 1 and report.graph_break_count == 0
    _compare(f, agspeed.optimize(f, backend="eager"))


def test_inductor_traces_through_the_forward_and_the_backward():
    lin, f = _net()
    _compare(f, agspeed.optimize(f, backend="inductor"), lin.parameters())


def test_under_autocast_the_function_sees_eagers_dtypes():
    lin, f = _net()
    fast = agspeed.optimize(f, backend="eager")
    x, y = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref = fast(x, y), f(x, y)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("which", [
    "dirty", "callable",
    # .item() of a fake tensor raises through libtorch
    pytest.param("item", marks=pytest.mark.cxx_exceptions)])
def test_functions_it_cannot_take_break_and_compute_eagers_results(which):
    def dirty(x, y):
        return Clamp_.apply(x * 1) + y

    def item(x, y):
        return Thresholded.apply(x * 1) + y

    def handed(x, y):
        return Call.apply(torch.sin, x * 1) + y

    f = {"dirty": dirty, "item": item, "callable": handed}[which]
    report = agspeed.explain(f, *_inputs())
    assert report.graph_break_count >= 1
    _compare(f, agspeed.optimize(f, backend="eager"))
