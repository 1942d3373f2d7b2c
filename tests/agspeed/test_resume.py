"""Graph breaks that resume (agspeed/_resume.py, agspeed/_resume_code.py, csrc/emit.c): the graph before the
break, the instruction run for real, the rest of the frame captured in a resume
function; results, gradients and types equal eager's, graph counts no higher than
torch._dynamo.explain's, second calls all cache hits."""

import collections
import functools
import gc
import os
import sys
import traceback
import typing

import pytest

import agspeed
from agspeed import _C

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch


def dynamo_graphs(fn, *args):
    import torch._dynamo

    try:
        return torch._dynamo.explain(fn)(*args).graph_count
    finally:
        torch._dynamo.reset()


def check(fn, make_args, graphs):
    """Capture fn, compare with eager (values, grads, type) and with dynamo's count."""
    args = make_args()
    report = agspeed.explain(fn, *args)
    assert report.graph_count == graphs
    assert report.graph_break_count >= 1
    assert report.resume_functions
    assert graphs <= dynamo_graphs(fn, *make_args())
    fast = agspeed.optimize(fn)
    for _ in range(2):
        args = make_args()
        ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        out, ref = fast(*args), fn(*ref_args)
        assert type(out) is type(ref)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        for a, r in zip(args, ref_args):
            if a.requires_grad:
                torch.testing.assert_close(a.grad, r.grad)
    return report


def vec():
    return (torch.randn(6, requires_grad=True),)


def printing(x):
    y = x.sin() * 2
    print("between graphs")
    return y.cos() + x


def test_print_in_the_middle(capsys):
    report = check(printing, vec, 2)
    before, after = report.resumed_breaks[0][1], report.resumed_breaks[0][2]
    assert before == 0 and after == [1]
    assert report.ops_per_graph[0] and report.ops_per_graph[1]
    assert capsys.readouterr().out.count("between graphs") == 1 + 2 * 2 + 1


def branching(x):
    y = x * 3
    if y.sum() > 0:
        return y.exp()
    return -y


def test_data_dependent_branch():
    check(branching, vec, 2)
    fast = agspeed.optimize(branching)
    for sign in (1.0, -1.0):   # both sides of the branch
        x = torch.full((4,), sign)
        torch.testing.assert_close(fast(x), branching(x))


def scalar(x):
    y = x.relu() + 1
    n = int(y.sum().item()) % 3
    return y * n + x


def test_item_feeding_python():
    check(scalar, vec, 2)


def explicit(x):
    y = x.tanh()
    torch._dynamo.graph_break()
    return y * x


def test_explicit_graph_break():
    check(explicit, vec, 2)


class _Holder:
    def __init__(self, d):
        self.d = d


def aliases_across_a_break(x):
    d = {"a": x + 1}
    e = d
    items = [x]
    same = items
    torch._dynamo.graph_break()
    e["b"] = x * 2              # changed through one name, read through the other
    same.append(x * 3)
    return d is e, len(d), items is same, sum(items)


def nested_across_a_break(x):
    d = {}
    held = [d, x + 1]
    kept = _Holder(d)
    torch._dynamo.graph_break()
    d["a"] = x
    return len(held[0]), held[0] is d, kept.d is d, held[1]


@pytest.mark.parametrize("fn", [aliases_across_a_break, nested_across_a_break],
                         ids=lambda f: f.__name__)
def test_a_list_or_dict_held_twice_at_a_break_stays_one_object(fn):
    opt = agspeed.optimize(fn, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        got, want = opt(x), fn(x)
        assert got[:-1] == want[:-1]
        torch.testing.assert_close(got[-1], want[-1])


class Holder:
    pass


def stored_then_grown(x, holder):
    items = [x + 1]
    holder.items = items             # a write replayed after the graph
    n = x.sum().item()               # a break
    items.append(x * n)              # grows what holder.items holds too, as in eager
    return items


def stored_and_returned(x, holder):
    table = {"a": x * 2}
    holder.table = table
    holder.again = table
    return table, x + 1


@pytest.mark.parametrize("fn", [stored_then_grown, stored_and_returned])
def test_a_container_written_to_the_program_and_held_by_the_frame_is_one_object(fn):
    # the write stores the frame's container itself, not a copy taken at the write
    opt = agspeed.optimize(fn, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        mine, theirs = Holder(), Holder()
        got, want = opt(x, mine), fn(x, theirs)
        if fn is stored_then_grown:
            assert mine.items is got and len(got) == len(want) == 2
            torch.testing.assert_close(got[1], want[1])
        else:
            assert mine.table is got[0] is mine.again
            torch.testing.assert_close(got[0]["a"], want[0]["a"])


def pick_from(t):
    def pick(i):
        return t[i]
    return pick


def combined(*fns):
    def both(i):
        return fns[0](i) + fns[1](i)
    return both


def apply_after_break(fn, x):
    torch._dynamo.graph_break()
    return fn(0) * x


def closure_over_graph_values(x):
    y = x * 2
    fn = combined(pick_from(y), functools.partial(torch.add, y + 1))
    return apply_after_break(fn, x)


def test_a_closure_over_graph_values_is_never_handed_to_eager_code():
    # the closure's cells hold values of the graph being captured: at the break it can
    # go on neither as it is nor rebuilt, so that frame runs eager
    fast = agspeed.optimize(closure_over_graph_values)
    for _ in range(2):
        x = vec()[0]
        assert torch.equal(fast(x), closure_over_graph_values(x))
    why = [r.decision for r in agspeed._runtime.frame_records()
           if r.name == "closure_over_graph_values"]
    assert why and "function" in why[0], why


def defaults_over_graph_values(x):
    y = x * 2
    return apply_after_break(lambda i, t=y: t[i] + 1, x) + \
        apply_after_break(lambda i, *, t=y + 1: t[i], x)


def test_a_function_whose_defaults_are_graph_values_is_never_handed_to_eager_code():
    fast = agspeed.optimize(defaults_over_graph_values)
    for _ in range(2):
        x = vec()[0]
        assert torch.equal(fast(x), defaults_over_graph_values(x))


class Inner(torch.nn.Module if torch else object):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = self.fc(x)
        print("inner")
        return torch.relu(x)


class Outer(torch.nn.Module if torch else object):
    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(4, 4)
        self.inner = Inner()

    def forward(self, x):
        return self.inner(self.pre(x)).sum(dim=-1)


def test_break_inside_an_inlined_callee():
    torch.manual_seed(0)
    model = Outer()
    report = check(model, lambda: (torch.randn(3, 4, requires_grad=True),), 4)
    assert any(name.startswith("resume_in_forward") for name in report.resume_functions)
    model.zero_grad()
    fast = agspeed.optimize(model)
    x = torch.randn(3, 4)
    fast(x).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(x).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad)


def test_second_call_is_all_cache_hits():
    fast = agspeed.optimize(printing)
    fast(torch.randn(6))
    _C.reset_counters()
    fast(torch.randn(6))
    counters = _C.counters()
    assert counters["cache_misses"] == 0, counters
    assert counters["cache_hits"] == 2   # the frame and its resume function


def failing(x):
    y = x + 1
    print("about to fail")
    z = y.view(7, 7)
    return z


@pytest.mark.cxx_exceptions   # the failing view throws inside libtorch
def test_traceback_names_the_users_line():
    fast = agspeed.optimize(failing)
    with pytest.raises(RuntimeError) as info:
        fast(torch.randn(3))
    frames = traceback.extract_tb(info.value.__traceback__)
    here = os.path.abspath(__file__)
    line = failing.__code__.co_firstlineno + 3
    assert any(f.filename == here and f.lineno == line for f in frames)


def test_generated_code_is_not_leaked_and_frames_are_cleared():
    fast = agspeed.optimize(printing)
    x = torch.randn(6)
    fast(x)
    from agspeed import _resume_code

    fn, resumes, _g = next(iter(_resume_code._CACHE[printing.__code__].values()))
    gc.collect()    # the capture's own cycles may still hold x: counted from after them
    counts = (sys.getrefcount(fn), sys.getrefcount(fn.__code__),
              [sys.getrefcount(r) for r in resumes])
    before = sys.getrefcount(x)
    for _ in range(5):
        fast(x)
    gc.collect()
    assert (sys.getrefcount(fn), sys.getrefcount(fn.__code__),
            [sys.getrefcount(r) for r in resumes]) == counts
    assert sys.getrefcount(x) == before


def test_fullgraph_still_raises_at_a_break():
    from agspeed.errors import GraphBreakError

    with pytest.raises(GraphBreakError):
        agspeed.optimize(printing, fullgraph=True)(torch.randn(6))


class Token:
    """A plain object passed through a break: nothing generated may keep it alive."""


def passes_token(x, token):
    y = x * 2
    print("token", type(token).__name__)
    return y + 1


def test_frames_of_generated_code_let_their_values_go():
    import weakref

    x = torch.randn(4)
    assert agspeed.explain(passes_token, x, Token()).resume_functions
    fast = agspeed.optimize(passes_token)
    for _ in range(2):    # the capture, then a cache hit
        token = Token()
        alive = weakref.ref(token)
        torch.testing.assert_close(fast(x, token), passes_token(x, token))
        del token
        gc.collect()
        assert alive() is None


# -- values the interpreter models differently from the program's own stack --------------
# A break there must not resume with the model in place of the object: the frame runs
# eager, with eager's result (each of these raised a TypeError from the break code).


class _Pair(typing.NamedTuple):
    a: "torch.Tensor"
    b: "torch.Tensor"

    def add(self):
        return self.a + self.b

    @classmethod
    def name(cls):
        return cls.__name__


def _fromkeys_of_a_subclass(x):
    d1 = dict.fromkeys(["a", "b"], x + 1)
    d2 = collections.defaultdict.fromkeys(iter(d1), x - 2)
    return d1["a"] * d2["b"]


def _namedtuple_methods(a, b):
    t = _Pair(a, b)
    return t.add(), t.name()


def _decorated_in_the_frame(x):
    @torch.no_grad()
    def augment(y):
        return (y + 1) * 2

    return augment(x)


@pytest.mark.parametrize("fn, nargs", [(_fromkeys_of_a_subclass, 1), (_namedtuple_methods, 2),
                                       (_decorated_in_the_frame, 1)])
def test_a_break_beside_a_modelled_value_gives_eagers_result(fn, nargs):
    fast = agspeed.optimize(fn, backend="eager")
    for _ in range(2):
        args = [torch.randn(3) for _ in range(nargs)]
        got, expected = fast(*args), fn(*args)
        assert type(got) is type(expected)
        if isinstance(expected, tuple):
            for a, b in zip(got, expected):
                if isinstance(b, torch.Tensor):
                    torch.testing.assert_close(a, b)
                else:
                    assert a == b
        else:
            torch.testing.assert_close(got, expected)


def _numpy_scalar_after_a_break(a):
    import numpy as np

    low = np.finfo(np.float32).min   # numpy runs for real; the rest resumes
    return a + low


def _numpy_array_after_a_break(x):
    arr = x.numpy()
    return torch.from_numpy(arr) * 2


@pytest.mark.parametrize("fn", [_numpy_scalar_after_a_break, _numpy_array_after_a_break])
def test_numpy_values_reaching_a_resumed_graph_give_eagers_result(fn):
    # a NumPy scalar constant is written as the Python number torch treats it as, and an
    # array breaks, instead of graph code naming them by a repr it cannot evaluate
    fast = agspeed.optimize(fn, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        got, expected = fast(x), fn(x)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)


def pair(t):
    print("pair")
    return t.sin(), t.cos()


def breaks_twice(x):
    a, _ = pair(x)
    b = a * 2
    c, d = pair(b)
    return c + a * d


def test_a_resume_functions_own_break_resumes_again():
    report = check(breaks_twice, vec, 3)
    # resumed where the user's code would be: a resume function of breaks_twice
    mine = {name for name in report.resume_functions if "breaks_twice" in name}
    assert len(mine) == 2
    assert all(name.startswith("resume_in_breaks_twice_at_") for name in mine)
    fast = agspeed.optimize(breaks_twice)
    fast(torch.randn(6))
    _C.reset_counters()
    x = torch.randn(6)
    torch.testing.assert_close(fast(x), breaks_twice(x))
    assert _C.counters()["cache_misses"] == 0
    from agspeed import _resume_code

    for fn, _r, _g in _resume_code._CACHE.get(_resume_of(breaks_twice), {}).values():
        names = fn.__code__.co_varnames
        assert len(set(names)) == len(names)   # each parameter read by its own name


def _resume_of(fn):
    from agspeed import _resume_code

    _f, resumes, _g = next(iter(_resume_code._CACHE[fn.__code__].values()))
    return resumes[0].__code__


class Doubling(torch.nn.Module if torch else object):
    def forward(self, x):
        return x * 2


class Calls_super(Doubling):
    def forward(self, x):
        y = super().forward(x)
        print("between supers")
        return y + super().forward(y.sin())


def test_argument_less_super_resumes():
    report = check(Calls_super(), vec, 2)
    assert report.resume_functions == ["resume_in_forward_at_"
                                       f"{Calls_super.forward.__code__.co_firstlineno + 2}"]


def scaled_by(k):
    def scales(x):
        y = x * k
        print("scaled")
        return y.tanh() + k
    return scales


def closes_over_later(x):
    s = x.sin()
    print("before the closure")
    f = lambda t: t * s   # noqa: E731
    return f(x)


@pytest.mark.parametrize("fn", [scaled_by(3.0), closes_over_later])
def test_free_and_cell_variables_resume(fn):
    check(fn, vec, 2)
    fast = agspeed.optimize(fn)
    fast(torch.randn(6))
    _C.reset_counters()
    fast(torch.randn(6))
    assert _C.counters()["cache_misses"] == 0


def over_token(token):
    def uses(x):
        y = x * 2
        print("token", type(token).__name__)
        return y + 1
    return uses


def test_closures_made_per_call_let_their_values_go():
    token = Token()
    fn = over_token(token)
    fast = agspeed.optimize(fn)
    x = torch.randn(4)
    fast(x)
    gc.collect()
    before = sys.getrefcount(token), sys.getrefcount(x)
    for _ in range(5):
        torch.testing.assert_close(fast(x), fn(x))
    gc.collect()
    assert (sys.getrefcount(token), sys.getrefcount(x)) == before


def raises_after_a_break(x):
    y = x * 2
    print("before raising")
    if y is not None:
        raise KeyError("raised after a break")
    return y


def test_values_of_a_frame_that_raises_after_a_break_are_let_go():
    import weakref

    fast = agspeed.optimize(raises_after_a_break)
    for _ in range(3):    # the captures, then cache hits
        x = torch.randn(3)
        alive = weakref.ref(x)
        with pytest.raises(KeyError):
            fast(x)
        del x
        gc.collect()
        assert alive() is None   # no guard keeps the exception, its traceback, x


class _Box:
    def __init__(self, tensor):
        self.tensor = tensor


def test_an_object_reached_through_an_argument_is_this_calls_after_the_break():
    # ``box`` is an item of the tuple argument, on the stack or in a local at the break:
    # the resume must get this call's box, not the first call's (an LSTM fed a
    # PackedSequence, then pad_packed_sequence, returned the first call's output)
    def f(x, boxes):
        box = boxes[0]
        y = x * 2
        torch._dynamo.graph_break()
        return y + box.tensor, boxes[1].tensor

    fast = agspeed.optimize(f, backend="eager")
    for _ in range(3):
        x = torch.randn(4, requires_grad=True)
        boxes = (_Box(torch.randn(4)), _Box(torch.randn(4)))
        out, ref = fast(x, boxes), f(x, boxes)
        torch.testing.assert_close(out, ref)
        assert out[1] is boxes[1].tensor
    assert agspeed.explain(f, x, boxes).resume_functions


@pytest.mark.cxx_exceptions  # _pad_packed_sequence on fake tensors throws through libtorch
def test_an_lstm_over_a_packed_sequence_gives_each_calls_result():
    lstm = torch.nn.LSTM(4, 3, batch_first=True)

    def f(x, lengths):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                         enforce_sorted=False)
        out, _ = lstm(packed)
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return out

    fast = agspeed.optimize(f, backend="eager")
    for _ in range(3):
        x = torch.randn(3, 5, 4, requires_grad=True)
        lengths = torch.tensor([5, 3, 4])
        out = fast(x, lengths)
        ref_x = x.detach().clone().requires_grad_()
        ref = f(ref_x, lengths)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x.grad, ref_x.grad)


@pytest.mark.cxx_exceptions  # the mask's fake index throws through libtorch
def test_a_break_at_a_data_dependent_subscript_resumes():
    # boolean-mask indexing: its size depends on the data; the break instruction is a
    # BINARY_SUBSCR, which takes no argument (its stack effect was asked with one)
    def f(x):
        y = x * 2
        picked = y[y > 0]
        return picked.sum() + torch.where(y > 0, y, 0.0).mean()

    report = check(f, lambda: (torch.randn(4, 5, requires_grad=True),), graphs=2)
    assert report.break_reasons[0].reason == "data_dependent"


def sliced_by_a_tensor(y):
    x = torch.arange(8.0)
    out = x[y[0]:]            # the bound is the graph's value: data-dependent
    x[y[1]:] = 0              # and a store through such a slice
    return (out + 3) * 5, x


@pytest.mark.cxx_exceptions   # the fake getitem's data-dependent error is libtorch's
def test_a_slice_bounded_by_a_tensor_gives_eagers_result():
    """A slice whose bound is a tensor breaks (its length depends on the data); the
    frame must not hand the break instruction the graph's placeholder for the bound."""
    fast = agspeed.optimize(sliced_by_a_tensor, backend="eager")
    for y in (torch.tensor([1, 5]), torch.tensor([3, 6])):
        got, want = fast(y), sliced_by_a_tensor(y)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
