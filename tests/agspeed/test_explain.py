"""agspeed.explain: graphs, breaks with where and why, guards, and nothing left behind."""

import gc
import weakref

import pytest

import agspeed
from agspeed import _C

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch


def helper(x):
    return torch.tanh(x) * 3


def breaks_then_calls(x):
    y = x + 1
    print("eager only")  # the break
    return helper(y)


def plain(x, w):
    return torch.relu(x @ w) + 1


class Net(torch.nn.Module if torch else object):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Branchy(Net):
    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:  # data dependent: breaks
            h = h * 2
        return self.b(h)


def line_of(fn, text):
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_one_function_is_one_graph_with_its_ops_and_guards():
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    out = agspeed.explain(plain, x, w)
    assert out.graph_count == 1
    assert out.graph_break_count == 0
    assert out.break_reasons == []
    assert isinstance(out.graphs[0], torch.fx.GraphModule)
    torch.testing.assert_close(out.result, plain(x, w))
    # the graph computes the function
    torch.testing.assert_close(out.graphs[0](x, w), plain(x, w))
    assert out.ops_per_graph == [["operator.matmul", "torch.relu", "operator.add"]]
    assert out.op_count == 3
    text = "\n".join(out.guards)
    assert "x tensor" in text and "shape=[3, 4]" in text
    assert "w tensor" in text and "shape=[4, 5]" in text
    assert "global state" in text
    assert out.guards == out.guards_per_graph[0]


def test_a_module_is_one_graph_with_parameters_as_inputs():
    net = Net()
    x = torch.randn(2, 4)
    out = agspeed.explain(net, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    torch.testing.assert_close(out.result, net(x))
    placeholders = [n for n in out.graphs[0].graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 5  # x and two weights and two biases
    assert any("self.a.weight tensor" in line for line in out.guards)


def test_an_optimized_module_or_function_is_explained_as_what_it_was_made_from():
    net = Net()
    x = torch.randn(2, 4)
    fast = agspeed.optimize(net, backend="eager")
    out = agspeed.explain(fast, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    torch.testing.assert_close(out.result, net(x))
    assert agspeed.counters()["graph_calls"] == 1  # explain's own graph, not fast's
    fast(x)  # its own cache was left alone
    assert agspeed.counters()["graph_calls"] == 2

    def f(a):
        return a.sin() + 1

    out = agspeed.explain(agspeed.optimize(f, backend="eager"), x)
    assert out.graph_count == 1


def test_a_break_says_file_line_instruction_and_reason_and_callees_still_capture(capsys):
    x = torch.randn(3)
    out = agspeed.explain(breaks_then_calls, x)
    assert "eager only" in capsys.readouterr().out  # the call really ran
    torch.testing.assert_close(out.result, torch.tanh(x + 1) * 3)
    assert out.graph_break_count == 1
    brk = out.break_reasons[0]
    assert brk.filename == __file__
    assert brk.line == line_of(breaks_then_calls, "print(")
    assert brk.function == "breaks_then_calls"
    assert brk.instruction.startswith("CALL")
    assert brk.reason == "unsupported_call"
    assert "print" in brk.detail
    assert brk.frame.startswith("breaks_then_calls (test_explain.py:")
    # the frame resumed after the break: the graph before it, then the resume function's
    # (helper inlined there), as torch._dynamo.explain counts them
    assert out.graph_count == 2
    assert out.ops_per_graph == [["operator.add"], ["torch.tanh", "operator.mul"]]
    assert out.resume_functions == [f"resume_in_breaks_then_calls_at_{brk.line}"]
    assert out.resumed_breaks == [(brk, 0, [1])]


def test_a_data_dependent_branch_in_a_module_is_reported_at_its_line():
    net = Branchy()
    x = torch.randn(2, 4)
    out = agspeed.explain(net, x)
    torch.testing.assert_close(out.result, net(x))
    assert out.graph_break_count == 1
    brk = out.break_reasons[0]
    assert brk.reason == "data_dependent"
    assert brk.line == line_of(Branchy.forward, "if h.sum()")
    assert brk.instruction.startswith("POP_JUMP")


def test_a_python_number_taken_from_a_tensor_is_reported_as_data_dependent():
    def f(x):
        return float(x.sum()) + 1, int(x[0] > 0)

    x = torch.randn(3)
    out = agspeed.explain(f, x)
    assert out.result == f(x)
    assert [b.reason for b in out.break_reasons] == ["data_dependent"] * 2
    assert out.break_reasons[0].detail.startswith("float() of a tensor")
    assert not any("Node" in b.detail for b in out.break_reasons)   # the user's words


def test_the_report_reads_like_dynamos():
    text = str(agspeed.explain(breaks_then_calls, torch.randn(3)))
    lines = text.splitlines()
    assert lines[:3] == ["Graph Count: 2", "Graph Break Count: 1", "Op Count: 3"]
    assert "Break Reasons:" in lines and "Ops per Graph:" in lines and "Guards:" in lines
    assert "Resume Functions:" in lines
    assert any(line.strip() == "Resumed: graph before 1, graphs after [2]" for line in lines)
    assert any(line.strip().startswith("Reason: unsupported_call") for line in lines)
    assert any(f"{__file__}:{line_of(breaks_then_calls, 'print(')}" in line for line in lines)
    assert repr(agspeed.explain(plain, torch.randn(2, 2), torch.randn(2, 2))) == \
        "<ExplainOutput graphs=1 breaks=0 ops=3>"


def test_no_tensor_work_is_listed_as_run_eager_not_as_a_break():
    def arithmetic(a, b):
        return a * b + 1

    out = agspeed.explain(arithmetic, 3, 4)
    assert out.result == 13
    assert (out.graph_count, out.graph_break_count) == (0, 0)
    assert [why for _, why in out.eager_frames] == ["no tensor work"]


def test_explain_leaves_nothing_cached_and_keeps_other_entries():
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    fast = agspeed.optimize(plain)
    fast(x, w)
    before = _C.code_cache(plain.__code__)["entries"]
    assert len(before) == 1
    agspeed.explain(plain, x, w)
    after = _C.code_cache(plain.__code__)["entries"]
    assert after == before  # the optimized object's entry survives, explain's is gone
    agspeed.explain(helper, x)
    assert _C.code_cache(helper.__code__)["entries"] == []


def test_explain_holds_no_reference_to_the_function_or_its_inputs():
    def local(x):
        return x * 2

    x = torch.randn(4)
    out = agspeed.explain(local, x)
    assert out.graph_count == 1
    fn_ref, x_ref = weakref.ref(local), weakref.ref(x)
    del local, x, out
    gc.collect()
    assert fn_ref() is None
    assert x_ref() is None


def test_a_non_callable_is_refused():
    with pytest.raises(agspeed.InvalidArgumentError, match="not int"):
        agspeed.explain(3)


@pytest.mark.cxx_exceptions
def test_errors_propagate_as_eager_raises_them():
    with pytest.raises(RuntimeError) as eager:
        plain(torch.randn(3, 4), torch.randn(5, 5))
    with pytest.raises(RuntimeError) as explained:
        agspeed.explain(plain, torch.randn(3, 4), torch.randn(5, 5))
    assert str(explained.value) == str(eager.value)
