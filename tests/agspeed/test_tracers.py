"""An optimized model under one of torch's tracers runs its own code, which the tracer
is there to see: ``make_fx`` records the model's operations (not the capture's nor a
compiled graph's), ``torch.jit.trace`` traces it (a module or a function) and passes its own checks,
``FlopCounterMode`` counts eager's FLOPs, ``FakeTensorMode`` computes fake results.
Nothing is captured under them, and the model's entries serve it again after."""

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402
from agspeed import _C  # noqa: E402
from test_checks import Counting  # noqa: E402

pytestmark = pytest.mark.torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2


def _optimized():
    torch.manual_seed(0)
    model = Net()
    backend = Counting()
    fast = agspeed.optimize(model, backend=backend)
    x = torch.randn(3, 8)
    torch.testing.assert_close(fast(x), model(x))   # captured, before any tracer
    assert backend.graphs == 1
    return model, fast, backend, x


def _ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _hits_again(fast, model, backend, x):
    _C.reset_counters()
    torch.testing.assert_close(fast(x), model(x))
    assert _C.counters()["cache_hits"] == 1 and backend.graphs == 1


def test_make_fx_records_the_models_own_operations():
    from torch.fx.experimental.proxy_tensor import make_fx

    model, fast, backend, x = _optimized()
    traced, plain = make_fx(fast)(x), make_fx(model)(x)
    assert _ops(traced) == _ops(plain)
    y = torch.randn(3, 8)
    torch.testing.assert_close(traced(y), model(y))
    assert backend.graphs == 1
    _hits_again(fast, model, backend, x)


@pytest.mark.cxx_exceptions   # (torch.jit's trace check throws in libtorch while comparing)
def test_jit_trace_of_an_optimized_module_passes_its_checks():
    model, fast, backend, x = _optimized()
    traced = torch.jit.trace(fast, x)   # (check_trace on: two traces compared)
    y = torch.randn(3, 8)
    torch.testing.assert_close(traced(y), model(y))
    assert backend.graphs == 1
    _hits_again(fast, model, backend, x)


def scaled_sine(x):
    return x.sin() * 2 + 1


@pytest.mark.cxx_exceptions
def test_jit_trace_of_an_optimized_function_first_called_there_traces_its_code(caplog):
    # function tracing keeps no module map: the capture asks torch's tracing state
    backend = Counting()
    fast = agspeed.optimize(scaled_sine, backend=backend)
    x = torch.randn(5)
    traced = torch.jit.trace(fast, x)
    kinds = {node.kind() for node in traced.graph.nodes()}
    assert {"aten::sin", "aten::mul", "aten::add"} <= kinds
    y = torch.randn(5)
    torch.testing.assert_close(traced(y), scaled_sine(y))
    assert "internal error" not in caplog.text
    torch.testing.assert_close(fast(y), scaled_sine(y))
    made = backend.graphs   # (its check ran it untraced, under no_grad: another graph)
    torch.testing.assert_close(fast(x), scaled_sine(x))
    assert backend.graphs == made


def test_flop_counter_counts_eagers_flops():
    from torch.utils.flop_counter import FlopCounterMode

    model, fast, backend, x = _optimized()
    counts = []
    for fn in (model, fast):
        with FlopCounterMode(display=False) as counter:
            fn(x).sum().backward()
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] > 0
    assert backend.graphs == 1
    _hits_again(fast, model, backend, x)


def test_fake_tensor_mode_computes_fake_results():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    model, fast, backend, x = _optimized()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        out = fast(mode.from_tensor(torch.randn(5, 8)))
    assert isinstance(out, FakeTensor) and out.shape == (5, 4)
    assert backend.graphs == 1
    _hits_again(fast, model, backend, x)
