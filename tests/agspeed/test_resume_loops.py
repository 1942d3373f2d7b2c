"""Graph breaks inside loops (agspeed/_resume.py, agspeed/_resume_code.py): the frame is
captured up to the break, and the rest of the pass, the passes after it and the code after the loop are
captured in the resume function of that place.  A ``for`` loop's iterator crosses as
the tuple of what it had left; every pass after the first breaks in the same resume
function code, one entry per pass; a chain of passes runs at one depth of Python
frames.  Results, gradients and types equal eager's."""

import gc
import sys
import types
import weakref

import pytest

import agspeed
from agspeed import _C, _resume, _resume_code

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch

DEPTHS: list = []


def _break():
    print("", end="")   # noqa: T201 - a call the capture does not model


def _depth():
    DEPTHS.append(len(_frames()))


def _frames():
    frames, f = [], sys._getframe()
    while f is not None:
        frames.append(f)
        f = f.f_back
    return frames


def compare(fn, make_args, calls=2):
    """fn optimized against fn eager on fresh inputs: values, types, gradients."""
    fast = agspeed.optimize(fn)
    for _ in range(calls):
        args = make_args()
        refs = [a.detach().clone().requires_grad_(a.requires_grad)
                if isinstance(a, torch.Tensor) else
                [t.detach().clone().requires_grad_(t.requires_grad) for t in a]
                for a in args]
        out, ref = fast(*args), fn(*refs)
        assert type(out) is type(ref)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        for a, r in zip(args, refs):
            for t, u in zip(a if isinstance(a, list) else [a],
                            r if isinstance(r, list) else [r]):
                if t.requires_grad:
                    torch.testing.assert_close(t.grad, u.grad)
    return fast


def vec():
    return (torch.randn(6, requires_grad=True),)


def over_range(x):
    for i in range(4):
        x = x * 2 + i
        _break()
    return x.sin()


def resume_codes(name):
    return {c for c in list(_resume_code._RESUMES) if c.co_name == name}


def test_a_break_in_a_for_loop_resumes_in_one_resume_function():
    report = agspeed.explain(over_range, *vec())
    # the frame up to the first pass's break, then a graph for each pass after it
    # (with the rest of the pass before), then the rest of the last pass and the sin
    assert report.graph_count == 5
    assert report.ops_per_graph[-1] == ["Tensor.sin"]
    assert all(ops == ["operator.mul", "operator.add"] for ops in report.ops_per_graph[:4])
    names = {name for name in report.resume_functions}
    assert len(names) == 1
    assert len(resume_codes(names.pop())) == 1
    compare(over_range, vec)


def test_every_pass_hits_the_cache_on_the_second_call():
    agspeed.reset()
    fast = agspeed.optimize(over_range)
    fast(*vec())
    # a pass is an entry of its own, not a recompile
    assert not [r for r in agspeed.recompiles() if "over_range" in r.function]
    _C.reset_counters()
    fast(*vec())
    counters = _C.counters()
    assert counters["cache_misses"] == 0, counters
    assert counters["cache_hits"] >= 5       # the frame and four passes


def while_loop(x):
    n = 0
    while n < 3:
        x = x + n
        _break()
        n += 1
    return x * 3


def test_a_break_in_a_while_loop():
    report = agspeed.explain(while_loop, *vec())
    assert report.graph_count == 4
    assert report.ops_per_graph[-1] == ["operator.mul"]
    compare(while_loop, vec)


def branchy(x):
    for _ in range(3):
        if x.sum() > 0:     # a branch on a tensor's value: the condition breaks
            x = x - 1
        else:
            x = x * -2
    return x


def test_a_data_dependent_branch_in_a_loop():
    report = agspeed.explain(branchy, *vec())
    assert report.graph_count >= 4
    fast = compare(branchy, vec, calls=4)
    for start in (5.0, -5.0, 0.4):
        x = torch.full((6,), start)
        torch.testing.assert_close(fast(x), branchy(x))


def over_tensors(x, ys):
    for i, y in enumerate(ys):
        x = x * y + i
        _break()
    return x


def test_items_left_that_are_graph_values():
    def make():
        return torch.randn(5, requires_grad=True), [torch.randn(5, requires_grad=True)
                                                    for _ in range(3)]
    report = agspeed.explain(over_tensors, *make())
    assert report.graph_count == 3     # the last pass's rest computes nothing
    compare(over_tensors, make)


def over_pairs(x, ys):
    for i, y in enumerate(ys):
        x = x * y + i
        _break()
    return x * 2


def test_items_left_are_each_calls_own():
    # after the first pass the loop goes on over a tuple of (i, y) pairs the resume
    # function is handed; a pair it has not reached yet holds this call's tensor, which
    # a later call must not find replaced by the first call's
    def make():
        return torch.randn(5, requires_grad=True), [torch.randn(5, requires_grad=True)
                                                    for _ in range(3)]
    compare(over_pairs, make, calls=4)
    fast = agspeed.optimize(over_pairs)
    for scale in (2.0, 3.0):
        x, ys = torch.ones(5), [torch.full((5,), scale) for _ in range(3)]
        torch.testing.assert_close(fast(x, ys), over_pairs(x, ys))


def nested(x):
    for i in range(2):
        for j in range(2):
            x = x + i * j + 1
            _break()
        x = x.cos()
    return x


def test_a_break_in_an_inner_loop():
    report = agspeed.explain(nested, *vec())
    assert report.graph_count == 5
    compare(nested, vec)


def comprehension(xs):
    return torch.stack([(_break(), x * 2)[1] for x in xs]).sum(0)


def test_a_break_in_a_comprehension():
    compare(comprehension, lambda: ([torch.randn(3, requires_grad=True)
                                     for _ in range(3)],))


def under_no_grad(x):
    with torch.no_grad():
        for _ in range(3):
            x = x * 2
            _break()
    return x + 1


def test_a_break_in_a_loop_in_a_with_block():
    fast = agspeed.optimize(under_no_grad)
    for _ in range(2):
        x = torch.randn(4, requires_grad=True)
        out, ref = fast(x), under_no_grad(x)
        torch.testing.assert_close(out, ref)
        assert not out.requires_grad and not ref.requires_grad
        assert torch.is_grad_enabled()
        y = torch.randn(4, requires_grad=True)
        assert (fast(y) * y).requires_grad      # grad mode back on after the block


def long_loop(x):
    for _ in range(_resume.LOOP_ITEMS + 5):
        x = x + 1
        _break()
    return x


def test_a_loop_with_too_many_items_left_runs_eager():
    report = agspeed.explain(long_loop, torch.zeros(2))
    assert report.graph_count == 0
    torch.testing.assert_close(agspeed.optimize(long_loop)(torch.zeros(2)),
                               long_loop(torch.zeros(2)))


def deep(x):
    for _ in range(40):
        x = x + 1
        _depth()
    return x


def test_passes_run_at_one_depth():
    fast = agspeed.optimize(deep)
    for _ in range(2):      # the capturing call and the cached one
        DEPTHS.clear()
        torch.testing.assert_close(fast(torch.zeros(2)), torch.full((2,), 40.0))
        assert len(DEPTHS) == 40
        assert max(DEPTHS) - min(DEPTHS) <= 4, DEPTHS
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(_frames()) + 60)
    try:
        torch.testing.assert_close(fast(torch.zeros(2)), torch.full((2,), 40.0))
    finally:
        sys.setrecursionlimit(limit)


class Block(torch.nn.Module if torch is not None else object):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).relu()


class Stack(torch.nn.Module if torch is not None else object):
    """A root calling blocks with forward hooks in a loop (FSDP's shape)."""

    def __init__(self, n=6):
        super().__init__()
        self.inp = torch.nn.Linear(8, 8)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(n))
        self.out = torch.nn.Linear(8, 3)
        for b in self.blocks:
            b.register_forward_pre_hook(lambda m, a: _break())

    def forward(self, x):
        h = self.inp(x) * 2
        for block in self.blocks:
            h = block(h) + h
        return self.out(h).log_softmax(-1)


def test_a_root_calling_hooked_blocks_in_a_loop_is_captured():
    torch.manual_seed(0)
    model, twin = Stack(), Stack()
    report = agspeed.explain(model, torch.randn(4, 8))
    # the root: before the loop, a graph a pass (the residual add), the head;
    # every block's own forward
    assert report.graph_count == 1 + 6 + 6
    for m in (model, twin):     # another instance's own modules, not the first's
        fast = agspeed.optimize(m)
        for _ in range(2):
            x = torch.randn(4, 8)
            m.zero_grad()
            fast(x).sum().backward()
            grads = [p.grad.clone() for p in m.parameters()]
            m.zero_grad()
            ref = m(x)
            ref.sum().backward()
            torch.testing.assert_close(fast(x), ref)
            for g, p in zip(grads, m.parameters()):
                torch.testing.assert_close(g, p.grad)


def test_the_loops_values_are_not_kept():
    # the eager backend: no tuning runs on later calls (its one-time garbage aside)
    fast = agspeed.optimize(over_tensors, backend="eager")
    ys = [torch.randn(5) for _ in range(3)]
    x = torch.randn(5)
    for _ in range(3):
        fast(x, ys)
    # twice: code that died in the first collection frees what its caches held
    # (weak-keyed: their entries go in the weak references' callbacks) in the second
    gc.collect()
    gc.collect()
    refs = [sys.getrefcount(y) for y in ys]
    out = fast(x, ys)
    assert gc.collect() == 0        # no cycles made per call (they would hold tensors)
    now = [sys.getrefcount(y) for y in ys]
    assert now == refs
    gone = weakref.ref(out)
    del out
    assert gone() is None
    model = Stack(3)
    fast_model = agspeed.optimize(model, backend="eager")
    for _ in range(3):
        fast_model(torch.randn(2, 8))
    gc.collect()
    # a block is held by the layout of its pass (the constant its guard checks),
    # not once more per call
    block = model.blocks[1]
    after = sys.getrefcount(block)
    for _ in range(3):
        fast_model(torch.randn(2, 8))
    assert gc.collect() == 0
    now = sys.getrefcount(block)
    assert now == after
    gone = weakref.ref(block)
    del block
    del model, fast_model
    gc.collect()
    assert gone() is None           # the cache does not keep the model alive


class Printing(torch.nn.Module if torch is not None else object):
    """A root whose own forward breaks after each block of its loop (not in a hook)."""

    def __init__(self, n=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x) * 2
            _break()
        return x


def test_a_model_breaking_in_its_own_loop_is_freed_with_its_view():
    # the last pass does no tensor work: its entry (guarded on its arguments' types,
    # among them the view's class, which holds the model) must not keep the model
    def use():
        model = Printing()
        fast = agspeed.optimize(model, backend="eager")
        for _ in range(2):
            x = torch.randn(2, 4)
            torch.testing.assert_close(fast(x), model(x))
        return weakref.ref(model), weakref.ref(type(fast))

    model, view_class = use()
    gc.collect()
    gc.collect()
    assert model() is None
    assert view_class() is None
    # a new model of the class is captured afresh, and the freed class's entries go
    model, view_class = use()
    gc.collect()
    gc.collect()
    assert model() is None


def attribute_in_loop(x):
    with torch.no_grad():
        for _ in range(2):
            x = x * 2
            size = "abc".__len__    # noqa: F841 - a load the capture refuses: not a call
            x = x + 1
    return x - 1


def test_a_break_at_a_load_in_a_loop_in_a_with_block():
    # the break instruction reads one value: the iterator and the block's exit below
    # it stay where they are
    report = agspeed.explain(attribute_in_loop, torch.randn(3))
    assert [b.instruction for b in report.break_reasons] == ["LOAD_ATTR"] * 2
    assert report.graph_count == 3
    fast = agspeed.optimize(attribute_in_loop)
    for _ in range(2):
        x = torch.randn(3, requires_grad=True)
        out, ref = fast(x), attribute_in_loop(x)
        torch.testing.assert_close(out, ref)
        assert out.requires_grad == ref.requires_grad


def rows_with_a_break(x):
    acc = x[0] * 0
    for row in x:           # a tensor's rows (unbound in the graph, the length guarded)
        acc = acc + row.sin()
        _break()
    return acc


def rows_stacked(x):
    return torch.stack([row * 2 for row in x]) + 1


def test_iterating_a_tensor():
    report = agspeed.explain(rows_stacked, torch.randn(3, 4))
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    compare(rows_stacked, lambda: (torch.randn(3, 4, requires_grad=True),))
    report = agspeed.explain(rows_with_a_break, torch.randn(4, 3))
    assert report.graph_count == 4      # the last pass's rest adds nothing
    compare(rows_with_a_break, lambda: (torch.randn(4, 3, requires_grad=True),))
    fast = agspeed.optimize(rows_stacked)
    torch.testing.assert_close(fast(torch.ones(5, 2)), rows_stacked(torch.ones(5, 2)))
    with pytest.raises(TypeError, match="0-d tensor"):
        fast(torch.tensor(1.0))


def _kind_of(it):
    _break()
    return type(it).__name__


def hands_an_iterator_on(x, a, b):
    y = x * 2
    return y + 1, _kind_of(zip(a, b))


def test_an_iterator_handed_to_a_call_at_the_break_keeps_its_type():
    # a loop's iterator may cross as a tuple's: nothing sees it; a callee would
    fast = agspeed.optimize(hands_an_iterator_on)
    for _ in range(2):
        out, kind = fast(torch.ones(2), [1, 2], [3, 4])
        assert kind == "zip"
        torch.testing.assert_close(out, torch.full((2,), 3.0))


def Logs(n):
    # an owner guarded by identity: its lists are reached through its source
    return types.SimpleNamespace(logs=[[] for _ in range(n)])


def appends_to_each(x, owner):
    for log in owner.logs:
        x = x + 1
        _break()
        log.append("seen")
    return x


class PlainLogs:
    """An owner of a plain class: guarded by its type, not its identity."""

    def __init__(self, n):
        self.logs = [[] for _ in range(n)]


@pytest.mark.parametrize("owner", [Logs, PlainLogs], ids=["namespace", "plain_class"])
def test_each_call_hands_on_its_own_objects_left_in_the_loop(owner):
    # the lists left to iterate, and the loop's variable, are read through the source
    # the capture read them from (owner.logs[i]), not held as the first call's objects
    fast = agspeed.optimize(appends_to_each, backend="eager")
    for i in range(4):
        x = torch.randn(2)
        mine, theirs = owner(3), owner(3)
        if i == 3:
            _C.reset_counters()
        torch.testing.assert_close(fast(x, mine), appends_to_each(x, theirs))
        assert mine.logs == theirs.logs and all(len(log) == 1 for log in mine.logs)
    if owner is PlainLogs:
        assert _C.counters()["cache_misses"] == 0   # a new owner is no recompile


class Numbered(torch.nn.Module if torch is not None else object):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x) * (i + 1)
            _break()
        return x


def test_enumerated_blocks_are_each_instances_own():
    # enumerate's (i, block) items: each part through its own source
    for _ in range(2):
        model = Numbered()
        fast = agspeed.optimize(model, backend="eager")
        x = torch.randn(2, 4)
        torch.testing.assert_close(fast(x), model(x))
        torch.testing.assert_close(fast(x), model(x))


def kind_of_argument(a, b):
    y = a + 1
    return y, (lambda z: (_break(), type(z).__name__)[1])(zip(a, b))


def test_a_lambda_handed_an_iterator_sees_the_programs_type():
    # only a comprehension's function is handed a tuple's iterator in its place
    a, b = torch.randn(3), torch.randn(3)
    fast = agspeed.optimize(kind_of_argument, backend="eager")
    for _ in range(2):
        assert fast(a, b)[1] == kind_of_argument(a, b)[1] == "zip"


def halves_while_positive(x):
    for _ in range(6):
        x = x - 1
        if x.sum() > 0:
            x = x * 0.5
    return x


def test_a_branch_to_the_loops_jump_back_is_inside_the_loop():
    # an if without else at the end of the body jumps to the loop's own jump back:
    # the resume function starting there is a loop's, its passes entries
    fast = agspeed.optimize(halves_while_positive, backend="eager")
    for start in (20.0, 3.0):
        x = torch.full((2,), start)
        torch.testing.assert_close(fast(x), halves_while_positive(x))
    looped = [c for c in list(_resume_code._RESUMES)
              if c.co_name.startswith("resume_in_halves_while_positive")]
    assert len(looped) >= 2 and all(_resume_code.in_loop(c) for c in looped)
    assert not [r for r in agspeed.recompiles() if "halves_while_positive" in r.function]


def changes_rows_in_place(x):
    y = x * 1
    for row in y:
        row.mul_(2)
    return y


@pytest.mark.cxx_exceptions   # autograd's refusal is thrown through libtorch
def test_iterating_a_tensor_gives_unbinds_rows():
    # eager iterates a tensor through unbind(0): where autograd tracks the rows,
    # changing one in place raises, and so it does through agspeed
    fast = agspeed.optimize(changes_rows_in_place, backend="eager")
    x = torch.randn(3, 2)
    torch.testing.assert_close(fast(x), changes_rows_in_place(x))
    x = torch.randn(3, 2, requires_grad=True)
    with pytest.raises(RuntimeError, match="Unbind"):
        changes_rows_in_place(x)
    with pytest.raises(RuntimeError, match="Unbind"):
        fast(x)


def records_each(x, owner):
    for log in owner.logs:
        x = x * 2
        log.append(x.sum().item())      # breaks in the argument of the item's method
    return x


def test_a_method_of_the_loops_item_is_each_calls_own():
    fast = agspeed.optimize(records_each, backend="eager")
    for _ in range(3):
        x = torch.randn(2)
        mine, theirs = PlainLogs(3), PlainLogs(3)
        torch.testing.assert_close(fast(x, mine), records_each(x, theirs))
        assert mine.logs == theirs.logs
        assert all(len(log) == 1 for log in mine.logs)
