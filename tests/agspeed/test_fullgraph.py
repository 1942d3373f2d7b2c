"""optimize(..., fullgraph=True): a graph break raises GraphBreakError naming where and
why, on every call that breaks, with nothing cached for it; break-free code runs as one
graph and computes what eager does; without fullgraph a break still runs eager."""

import gc
import inspect
import pickle
import sys
import weakref

import pytest

import agspeed
from agspeed import _C
from agspeed.protocol import Reason

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch


def line_of(fn, text):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def prints(x):
    y = x * 2
    print("eager only")  # the break
    return y + 1


def explicit(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y * 2


def helper(x):
    print("inside the helper")  # the break, in an inlined function
    return x


def calls_helper(x):
    return helper(x.cos()) + 1


def maybe_prints(x, loud):
    if loud:
        print("loud")
    return x * 3


def clean(x, w):
    return torch.tanh(x @ w).sum(dim=1) * 2 + 1


class Block(torch.nn.Module if torch else object):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.b(torch.relu(self.norm(self.a(x))))


def _entries(fn):
    return _C.code_cache(fn.__code__)["entries"]


def test_a_break_raises_graph_break_error_naming_file_line_instruction_and_reason():
    opt = agspeed.optimize(prints, backend="eager", fullgraph=True)
    with pytest.raises(agspeed.GraphBreakError) as info:
        opt(torch.randn(3))
    err = info.value
    line = line_of(prints, "the break")
    assert (err.filename, err.line, err.function) == (__file__, line, "prints")
    assert "CALL" in err.instruction
    assert err.reason == "unsupported_call" and "print" in err.detail
    assert err.hint == Reason.UNSUPPORTED_CALL.hint
    assert err.frame.startswith("prints (test_fullgraph.py:")
    message = str(err)
    for part in (f"{__file__}:{line}", "in prints", err.instruction, err.reason,
                 err.detail, err.hint, "fullgraph=True"):
        assert part in message, (part, message)
    assert isinstance(err, agspeed.AgspeedError) and isinstance(err, RuntimeError)


def test_an_explicit_dynamo_graph_break_raises():
    opt = agspeed.optimize(explicit, backend="eager", fullgraph=True)
    with pytest.raises(agspeed.GraphBreakError, match="graph_break") as info:
        opt(torch.randn(3))
    assert info.value.line == line_of(explicit, "graph_break()")


def test_a_break_in_an_inlined_function_names_that_function_and_the_frame():
    opt = agspeed.optimize(calls_helper, backend="eager", fullgraph=True)
    with pytest.raises(agspeed.GraphBreakError) as info:
        opt(torch.randn(3))
    err = info.value
    assert err.function == "helper" and err.line == line_of(helper, "the break")
    assert err.frame.startswith("calls_helper (")
    assert "capture of calls_helper" in str(err)


def test_every_call_that_breaks_raises_and_nothing_is_cached_for_it():
    opt = agspeed.optimize(prints, backend="eager", fullgraph=True)
    for shape in ((3,), (3,), (5, 2), (3,)):
        with pytest.raises(agspeed.GraphBreakError):
            opt(torch.randn(*shape))
        assert _entries(prints) == []
    decisions = [r.decision for r in agspeed._runtime.frame_records() if r.name == "prints"]
    assert len(decisions) == 4 and all(d.startswith("raise GraphBreakError") for d in decisions)
    assert agspeed.counters()["callback_errors"] == 4   # each one a decision that raised


def test_without_fullgraph_a_break_still_runs_eager():
    for options in ({}, {"fullgraph": False}):
        agspeed.reset()
        opt = agspeed.optimize(prints, backend="eager", **options)
        x = torch.randn(4)
        torch.testing.assert_close(opt(x), prints(x))
        torch.testing.assert_close(opt(x), prints(x))   # the cached eager entry
        (record,) = [r for r in agspeed._runtime.frame_records() if r.name == "prints"]
        assert "graph break" in record.decision and "raise" not in record.decision


def test_a_fullgraph_error_leaves_other_optimized_objects_eager_entry_alone():
    eager_at_break = agspeed.optimize(prints, backend="eager")
    strict = agspeed.optimize(prints, backend="eager", fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(eager_at_break(x), prints(x))
    for _ in range(2):   # the other context's eager entry never serves this one
        with pytest.raises(agspeed.GraphBreakError):
            strict(x)
    torch.testing.assert_close(eager_at_break(x), prints(x))
    assert len(_entries(prints)) == 1


def test_a_break_free_function_runs_as_one_graph_and_matches_eager():
    opt = agspeed.optimize(clean, backend="eager", fullgraph=True)
    for _ in range(3):   # fresh inputs each call: the first captures, the rest hit
        x = torch.randn(5, 8, requires_grad=True)
        w = torch.randn(8, 6, requires_grad=True)
        xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out, ref = opt(x, w), clean(xe, we)
        torch.testing.assert_close(out, ref)
        grad = torch.randn_like(ref)
        out.backward(grad)
        ref.backward(grad)
        torch.testing.assert_close(x.grad, xe.grad)
        torch.testing.assert_close(w.grad, we.grad)
    decisions = [r.decision for r in agspeed._runtime.frame_records() if r.name == "clean"]
    assert decisions == ["captured"]


def test_a_break_free_module_runs_as_one_graph_and_matches_eager():
    torch.manual_seed(0)
    model = Block()
    opt = agspeed.optimize(model, fullgraph=True)   # the default backend, "auto"
    for _ in range(3):
        x = torch.randn(6, 8)
        model.zero_grad()
        ref = model(x)
        ref.sum().backward()
        expected = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        out = opt(x)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, expected[name], msg=name)
    decisions = [r.decision for r in agspeed._runtime.frame_records()
                 if r.name == "forward"]
    assert decisions == ["captured"]


def test_a_module_whose_forward_breaks_raises():
    class Loud(Block):
        def forward(self, x):
            print("loud")
            return super().forward(x)

    opt = agspeed.optimize(Loud(), backend="eager", fullgraph=True)
    for _ in range(2):
        with pytest.raises(agspeed.GraphBreakError, match="forward"):
            opt(torch.randn(2, 8))


def test_a_frame_without_tensor_work_is_no_break():
    opt = agspeed.optimize(lambda a, b: a + b, backend="eager", fullgraph=True)
    assert opt(2, 3) == 5 and opt(2, 3) == 5


def test_inputs_that_break_raise_while_other_inputs_keep_their_graph():
    opt = agspeed.optimize(maybe_prints, backend="eager", fullgraph=True)
    x = torch.randn(3)
    with agspeed.config.override(cache_size_limit=1):
        torch.testing.assert_close(opt(x, False), x * 3)
        (entry,) = _entries(maybe_prints)
        for _ in range(2):   # at the cache size limit: the raising call evicts nothing
            with pytest.raises(agspeed.GraphBreakError, match="builtins.print"):
                opt(x, True)
            assert _entries(maybe_prints) == [entry]
        hits = entry.hits
        torch.testing.assert_close(opt(x, False), x * 3)
        assert entry.hits == hits + 1
    assert agspeed.recompiles() == []


def test_the_error_leaves_the_interpreter_and_the_runtime_usable():
    opt = agspeed.optimize(prints, backend="eager", fullgraph=True)

    def outer(x):   # an optimized caller without fullgraph: the error passes through it
        return opt(x) * 2

    opt_outer = agspeed.optimize(outer, backend="eager")
    with pytest.raises(agspeed.GraphBreakError):
        opt_outer(torch.randn(3))
    assert _C.current_context() is None and not _C.hook_installed()
    x = torch.randn(3)
    torch.testing.assert_close(prints(x), x * 2 + 1)
    fine = agspeed.optimize(clean, backend="eager", fullgraph=True)
    w = torch.randn(3, 2)
    torch.testing.assert_close(fine(x[None], w), clean(x[None], w))


def test_a_handled_error_keeps_no_input_alive_and_leaves_no_entry():
    opt = agspeed.optimize(prints, backend="eager", fullgraph=True)
    x = torch.randn(16)
    gone = weakref.ref(x)
    try:
        opt(x)
    except agspeed.GraphBreakError:
        pass
    del x
    gc.collect()
    assert gone() is None
    assert _entries(prints) == []
    y = torch.randn(16)
    before = sys.getrefcount(y)
    for _ in range(3):
        try:
            opt(y)
        except agspeed.GraphBreakError:
            pass
    assert sys.getrefcount(y) == before
    assert _entries(prints) == []


def test_the_error_pickles_with_its_fields():
    opt = agspeed.optimize(prints, backend="eager", fullgraph=True)
    with pytest.raises(agspeed.GraphBreakError) as info:
        opt(torch.randn(2))
    back = pickle.loads(pickle.dumps(info.value))
    assert str(back) == str(info.value)
    assert (back.filename, back.line, back.reason, back.hint) == \
        (info.value.filename, info.value.line, info.value.reason, info.value.hint)
