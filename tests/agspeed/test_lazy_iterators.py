"""map() and filter() are lazy in eager: a function whose calls change state, or a
consumer that changes what the function reads as it steps (``y.extend(map(f, xs))``),
must not see the calls come early; and an iterator of the program (``itertools.count()``
made at a break) is never stepped by the capture (csrc/interp_iter.c,
agspeed/_folds.py).  itertools' compress, filterfalse, takewhile and dropwhile are
stepped as generators, their functions inlined (agspeed/_stdlib.py)."""

import collections
import itertools

import pytest

import agspeed

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

from test_python_calls import assert_same  # noqa: E402

pytestmark = pytest.mark.torch


def extend_by_map(a):
    y = [1]

    def inner(z):
        return z + y[-1]

    y.extend(map(inner, range(3)))
    return a + 1, y


def extendleft_by_map(a):
    y = collections.deque([1])

    def inner(z):
        return z + y[0]

    y.extendleft(map(inner, range(3)))
    return a + 1, y


def zip_stops_early(a, b):
    calls = [0]

    def f(x):
        calls[0] += 1
        return x

    pairs = list(zip([a, b], map(f, [1, 2, 3, 4])))
    return a + calls[0], len(pairs)


def appends_to_the_programs_list(x, acc):
    pairs = list(zip([1, 2], map(lambda v: acc.append(v) or v, [1, 2, 3, 4])))
    return x + len(pairs), len(acc)


def count_at_a_break(x):
    return x + 1, list(zip(range(3), itertools.count()))


def map_over_count(a, b):
    return list(map(lambda x, y: x + y, [a, b], itertools.count(3)))


@pytest.mark.parametrize("fn, nargs", [
    (extend_by_map, 1), (extendleft_by_map, 1), (zip_stops_early, 2),
    (count_at_a_break, 1), (map_over_count, 2), (appends_to_the_programs_list, 1),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_lazy_iteration_gives_eagers_results(fn, nargs):
    agspeed.reset()
    fast = agspeed.optimize(fn, backend="eager")
    lists = fn is appends_to_the_programs_list
    for _ in range(2):
        args = [torch.randn(2) for _ in range(nargs)]
        got = fast(*args, *([[]] if lists else []))
        want = fn(*args, *([[]] if lists else []))
        assert_same(got, want)


LIN = torch.nn.Linear(3, 3) if torch else None


class Wrap:
    def __init__(self, t):
        self.t = t * 2


def pure_maps(xs):
    a = tuple(map(lambda t: t.to(torch.float64), xs))
    b = [o.t for o in map(Wrap, xs)]      # __init__ writes only to what it made
    c = list(map(LIN, xs))
    out = []
    out.extend(map(torch.sigmoid, xs))    # a torch function: no Python to run
    return a, b, c, out


def test_maps_whose_calls_change_nothing_stay_in_the_graph():
    xs = [torch.randn(3) for _ in range(4)]
    report = agspeed.explain(pure_maps, xs)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    got, want = agspeed.optimize(pure_maps, backend="eager")(xs), pure_maps(xs)
    for g, w in zip(got, want):
        for gi, wi in zip(g, w):
            torch.testing.assert_close(gi, wi)


def stepped_itertools(x, xs, keep):
    small = list(itertools.filterfalse(lambda t: t.shape[0] > 2, xs))
    kept = list(itertools.compress(xs, keep))
    head = [t * 2 for t in itertools.takewhile(lambda t: t.dim() == 1, xs)]
    tail = tuple(itertools.dropwhile(lambda t: t.numel() < 3, xs))
    calls = []
    lazy = itertools.filterfalse(lambda t: calls.append(t.shape) or t.dim() > 1, xs)
    first = next(lazy)   # one item asked: the predicate ran once, as in eager
    return sum(small) + x, kept, head, tail, first, len(calls)


def test_itertools_that_take_a_function_are_stepped_in_one_graph():
    fast = agspeed.optimize(stepped_itertools, backend="eager", fullgraph=True)
    for keep in ([1, 0, 1, 0], [0, 1, 1, 1]):
        xs = [torch.randn(2), torch.randn(3), torch.randn(2, 2), torch.randn(2)]
        x = torch.randn(2, requires_grad=True)
        assert_same(fast(x, xs, keep), stepped_itertools(x, xs, keep))
