"""The graph builder the interpreter drives: fx nodes with fake-tensor metadata."""

import pytest

from agspeed import backends

try:
    import torch
    import torch.nn.functional as F

    from agspeed._graph import GraphBreak, GraphBuilder
    from agspeed.protocol import Reason
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = F = None

pytestmark = pytest.mark.torch


def build_relu_add(x, y):
    b = GraphBuilder()
    nx, ny = b.input("x", x), b.input("y", y)
    out = b.call_function(torch.add, (b.call_function(torch.relu, (nx,)),
                                      b.call_function(torch.mul, (ny, 2.0))))
    return b, b.output(out)


def test_graph_matches_eager_on_fresh_inputs_with_gradients():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    builder, gm = build_relu_add(x, y)
    run = backends.get_backend("eager")(gm, builder.example_inputs())
    for _ in range(3):
        a = torch.randn(3, 4, requires_grad=True)
        c = torch.randn(3, 4, requires_grad=True)
        got = run(a, c)
        torch.testing.assert_close(got, torch.relu(a) + c * 2.0)
        got.sum().backward()
        torch.testing.assert_close(a.grad, (a > 0).float())
        torch.testing.assert_close(c.grad, torch.full_like(c, 2.0))


def test_fake_values_carry_exact_metadata():
    x = torch.randn(2, 5, requires_grad=True)
    b = GraphBuilder()
    nx = b.input("self.fc.weight", x)
    t = b.call_method("transpose", (nx, 0, 1))
    s = b.call_function(F.softmax, (t,), {"dim": -1})
    fake = s.meta["example_value"]
    assert tuple(fake.shape) == (5, 2) and fake.dtype == torch.float32
    assert fake.requires_grad
    assert nx.meta["source"] == "self.fc.weight" and nx.name == "self_fc_weight"
    assert b.sources == ["self.fc.weight"]


def test_one_placeholder_per_source():
    x = torch.randn(2)
    b = GraphBuilder()
    assert b.input("x", x) is b.input("x", x)
    assert len([n for n in b.graph.nodes if n.op == "placeholder"]) == 1
    with pytest.raises(TypeError, match="tensors"):
        b.input("n", 3)


@pytest.mark.cxx_exceptions
def test_data_dependent_operations_break_the_graph():
    b = GraphBuilder()
    nx = b.input("x", torch.randn(4))
    with pytest.raises(GraphBreak) as info:
        b.call_method("nonzero", (nx,))
    assert info.value.reason is Reason.DATA_DEPENDENT and "Tensor.nonzero" in info.value.detail
    with pytest.raises(GraphBreak) as info:
        b.call_method("item", (b.call_method("sum", (nx,)),))
    assert info.value.reason is Reason.DATA_DEPENDENT
    assert info.value.hint == Reason.DATA_DEPENDENT.hint


@pytest.mark.cxx_exceptions
def test_failing_operation_breaks_the_graph_naming_the_error():
    # The fake (meta) kernel words the error differently from eager's, which is why the
    # frame must then run eager: the user gets eager's exception, not this one.
    a, c = torch.randn(3, 4), torch.randn(3, 4)
    b = GraphBuilder()
    with pytest.raises(RuntimeError) as eager:
        torch.mm(a, c)
    with pytest.raises(GraphBreak) as info:
        b.call_function(torch.mm, (b.input("a", a), b.input("c", c)))
    assert info.value.reason is Reason.OP_FAILED
    assert info.value.detail.startswith(f"torch.mm raised {type(eager.value).__name__}: ")
    assert all(n.op == "placeholder" for n in b.graph.nodes)  # nothing half-recorded


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_autocast_is_applied_when_the_graph_runs(cache_enabled):
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache_enabled):
        b = GraphBuilder()
        out = b.call_function(torch.mm, (b.input("x", x), b.input("w", w)))
        assert out.meta["example_value"].dtype == torch.bfloat16
        gm = b.output(out)
        torch.testing.assert_close(gm(x, w), torch.mm(x, w))
        assert gm(x, w).dtype == torch.bfloat16


def test_outputs_may_be_containers_and_constants():
    x = torch.randn(3)
    b = GraphBuilder()
    nx = b.input("x", x)
    gm = b.output((b.call_method("neg", (nx,)), {"n": 3, "t": b.call_function(torch.sin, (nx,))}))
    neg, rest = gm(x)
    torch.testing.assert_close(neg, -x)
    assert rest["n"] == 3
    torch.testing.assert_close(rest["t"], torch.sin(x))


def test_unknown_reason_is_a_bug():
    with pytest.raises(ValueError):
        GraphBreak("nope", "x")


def captured(fn, **f_locals):
    import builtins

    from agspeed import _C

    builder = GraphBuilder()
    out = _C.capture(fn.__code__, f_locals, fn.__globals__, builtins.__dict__, builder,
                     torch.Tensor)
    return out, builder


def block(x, w, b, scale):
    h = F.linear(x, w, b)
    h = F.gelu(h) * scale + x.sum(dim=-1, keepdim=True)
    return h.softmax(dim=-1), torch.tanh(h)


def test_interpreter_capture_matches_eager_on_fresh_inputs():
    x, w, bias = torch.randn(4, 6), torch.randn(6, 6), torch.randn(6)
    out, builder = captured(block, x=x, w=w, b=bias, scale=0.5)
    assert out["status"] == "graph"
    assert builder.sources == [("local", "x"), ("local", "w"), ("local", "b")]
    gm = builder.output(out["result"])
    for _ in range(3):
        args = [torch.randn_like(t).requires_grad_() for t in (x, w, bias)]
        got = gm(*args)
        want = block(*args, 0.5)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
        sum(t.sum() for t in got).backward()
        grads = [a.grad.clone() for a in args]
        for a in args:
            a.grad = None
        sum(t.sum() for t in want).backward()
        for g, a in zip(grads, args):
            torch.testing.assert_close(g, a.grad)


def prints(x):
    print("side effect")
    return x


def test_interpreter_never_runs_python_side_effects(capsys):
    out, _ = captured(prints, x=torch.randn(2))
    assert out["status"] == "break" and out["reason"] == Reason.UNSUPPORTED_CALL
    assert capsys.readouterr().out == ""


def item_of(x):
    return x.sum().item()


@pytest.mark.cxx_exceptions
def test_data_dependent_call_is_a_graph_break():
    out, _ = captured(item_of, x=torch.randn(3))
    assert out["status"] == "break" and out["reason"] == Reason.DATA_DEPENDENT
