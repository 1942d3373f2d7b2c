"""Operators of torch's dispatcher called by name in captured code: ``torch.ops.aten.*``
(overloads and packets) and the custom operators a library defines with
``torch.library.custom_op`` (transformers' mixture-of-experts matmul is one).  They are
graph nodes, run on fake tensors through their fake kernels while capturing; one
without a fake kernel breaks the graph at its call and the program still computes
eager's result."""

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch


@torch.library.custom_op("agspeed_tests::scaled", mutates_args=())
def scaled(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s


@scaled.register_fake
def _(x, s):
    return torch.empty_like(x)


def _scaled_backward(ctx, grad):
    return grad * ctx.s, None


def _scaled_setup(ctx, inputs, output):
    ctx.s = inputs[1]


scaled.register_autograd(_scaled_backward, setup_context=_scaled_setup)


@torch.library.custom_op("agspeed_tests::bump_", mutates_args=("x",))
def bump_(x: torch.Tensor) -> None:
    x.add_(1)


@bump_.register_fake
def _(x):
    return None


@torch.library.custom_op("agspeed_tests::no_fake", mutates_args=())
def no_fake(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@pytest.fixture(autouse=True)
def _fresh():
    agspeed.reset()
    yield
    agspeed.reset()


def _decisions():
    return [r.decision for r in agspeed._runtime.frame_records()]


CASES = {
    "custom op by name": lambda x: torch.ops.agspeed_tests.scaled(x + 1, 2.0).relu(),
    "custom op object": lambda x: scaled(x, 3.0) * 2,
    "aten overload": lambda x: torch.ops.aten.add.Tensor(x, x) * 2,
    "aten packet": lambda x: torch.ops.aten.mul(x, 2) - torch.ops.aten.sum.dim_IntList(x, [0]),
    "aten in place": lambda x: torch.ops.aten.add_.Tensor(x, 1) * 2,
    "aten tuple result": lambda x: torch.ops.aten.var_mean.correction(x, [0], correction=1)[0],
    "mutating custom op": lambda x: (bump_(x), x * 2)[1],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_operator_call_is_captured_in_the_graph(name):
    fn = CASES[name]
    fast = agspeed.optimize(fn, backend="eager")
    for _ in range(2):   # the capture, then a cache hit on new values
        x = torch.randn(4, 3)
        want_x, got_x = x.clone(), x.clone()
        want, got = fn(want_x), fast(got_x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_x, want_x)   # what the call wrote, as eager
    assert _decisions() == ["captured"]


def test_a_custom_op_trains_through_its_registered_backward():
    lin = torch.nn.Linear(3, 3)

    def loss(x):
        return scaled(lin(x), 1.5).square().sum()

    fast = agspeed.optimize(loss, backend="eager")
    x = torch.randn(5, 3)
    want = loss(x)
    want.backward()
    want_grad = lin.weight.grad.clone()
    lin.weight.grad = None
    got = fast(x)
    got.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(lin.weight.grad, want_grad)
    assert _decisions() == ["captured"]


@pytest.mark.cxx_exceptions   # the fake dispatch of an op without a fake kernel throws
def test_a_custom_op_without_a_fake_kernel_breaks_and_computes_eagers_result():
    def fn(x):
        return no_fake(x + 1) * 2

    fast = agspeed.optimize(fn, backend="eager")
    x = torch.randn(4)
    torch.testing.assert_close(fast(x), fn(x))
    assert any("no_fake" in d and "graph break" in d for d in _decisions())


@pytest.mark.cxx_exceptions   # nonzero on fakes throws through libtorch
def test_a_data_dependent_operator_breaks_as_item_does():
    def fn(x):
        return torch.ops.aten.nonzero(x > 0).float().sum() + x.sum()

    fast = agspeed.optimize(fn, backend="eager")
    x = torch.randn(6)
    torch.testing.assert_close(fast(x), fn(x))
    assert any("data_dependent" in d for d in _decisions())


def test_an_operator_returning_a_tensor_list_gives_a_list_the_frame_may_change():
    def fn(x):
        parts = torch.ops.aten.split_with_sizes(x, [7, 16, 9])
        kind = type(parts) is list
        parts.append(x * 2)
        parts[0] = parts[0] + 1
        return kind, [p.sum() for p in parts], torch.ops.aten.unbind(x.view(4, 8))

    x = torch.randn(32)
    report = agspeed.explain(fn, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    got, want = agspeed.optimize(fn, backend="eager")(x), fn(x)
    assert got[0] is want[0] is True
    assert type(got[2]) is type(want[2]) is list and len(got[2]) == 4
    for a, b in zip(got[1] + got[2], want[1] + want[2]):
        torch.testing.assert_close(a, b)
