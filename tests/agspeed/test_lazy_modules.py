"""Lazy modules (``nn.LazyLinear``...): their uninitialized parameters have no shape
until the first call materializes them, so they are never graph inputs, and a frame
handed one (the lazy module's own initialization) neither fails in the runtime nor
changes eager's result."""

import pytest

import agspeed

try:
    import torch
    from torch.nn.parameter import UninitializedParameter
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch


def materialize_then_add(p, x):
    p.materialize(x.shape)
    return x + 1


def test_a_frame_handed_an_uninitialized_parameter_runs_as_eager(caplog):
    agspeed.reset()
    fast = agspeed.optimize(materialize_then_add, backend="eager")
    with caplog.at_level("WARNING", logger="agspeed"):
        for _ in range(3):
            x = torch.randn(2)
            p = UninitializedParameter()
            torch.testing.assert_close(fast(p, x), x + 1)
            assert type(p) is torch.nn.Parameter and p.shape == (2,)
    # (its shape was read as a graph input's: an internal error, the frame eager)
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]


def test_a_model_of_lazy_layers_trains_as_eager():
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.ReLU(),
                                   torch.nn.LazyLinear(2))

    eager, model = make(), make()
    fast = agspeed.optimize(model, backend="eager")
    for step in range(3):
        x = torch.randn(4, 5)
        torch.manual_seed(step)
        want = eager(x)
        torch.manual_seed(step)
        got = fast(x)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        for a, b in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(a.grad, b.grad)
    report = agspeed.explain(fast, torch.randn(4, 5))
    assert (report.graph_count, report.graph_break_count) == (1, 0)
