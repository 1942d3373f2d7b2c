"""Iterators and dict views made in the frame and still live at a graph break (``zip``,
``enumerate``, ``iter``, ``reversed``, ``map``, ``itertools.chain``, ``d.items()``): the
capture's object holds graph values or the first call's state, so the frame is not
resumed there; it runs eager, with eager's results on every call.  Before, the resume
function was handed the capture's own iterator and the program met graph nodes."""

import collections
import itertools

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch


def _break():
    print("", end="")   # noqa: T201 - a call the capture does not model


def over_zip(x, xs):
    y = x * 2
    pairs = zip(xs, [y, y])
    _break()
    for a, b in pairs:
        y = y + a + b
    return y


def over_enumerate(x, xs):
    y = x * 2
    items = enumerate([y, x])
    _break()
    for i, a in items:
        y = y + a * i
    return y


def over_iter(x, xs):
    rest = iter([x * 2, x])
    _break()
    return next(rest) + sum(rest)


def over_reversed(x, xs):
    back = reversed([x * 2, x + 1])
    _break()
    return torch.stack(list(back))


def over_map(x, xs):
    relus = map(torch.relu, [x * 2, x])
    _break()
    return sum(relus)


def over_chain(x, xs):
    both = itertools.chain([x * 2], xs)
    _break()
    return sum(both)


def over_items(x, table):
    items = table.items()
    y = x * 2
    _break()
    for _, v in items:
        y = y + v
    return y


@pytest.mark.parametrize("fn", [over_zip, over_enumerate, over_iter, over_reversed,
                                over_map, over_chain])
def test_an_iterator_live_at_a_break_gives_eagers_results(fn):
    fast = agspeed.optimize(fn, backend="eager")
    for _ in range(3):
        x, xs = torch.randn(3), [torch.randn(3), torch.randn(3)]
        torch.testing.assert_close(fast(x, xs), fn(x, xs))


def test_a_dict_view_live_at_a_break_shows_this_calls_dict():
    fast = agspeed.optimize(over_items, backend="eager")
    for scale in (1.0, 2.0, 3.0):
        x = torch.randn(3)
        table = {"a": torch.full((3,), scale), "b": scale}    # a new dict every call
        torch.testing.assert_close(fast(x, table), over_items(x, table))


class Holder:
    def __init__(self, t):
        self.t = t

    def tripled(self):
        return self.t * 3


def bound_method_of_a_made_object(x, xs):
    get = Holder(x * 2).tripled
    _break()
    return get() + 1


def deque_made_in_the_frame(x, xs):
    q = collections.deque([x * 2, x])
    _break()
    return q[0] + q[1]


@pytest.mark.parametrize("fn", [bound_method_of_a_made_object, deque_made_in_the_frame])
def test_other_values_made_in_the_frame_live_at_a_break(fn):
    fast = agspeed.optimize(fn, backend="eager")
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(fast(x, []), fn(x, []))
