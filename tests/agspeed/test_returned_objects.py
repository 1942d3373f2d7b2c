"""Objects of the program in a frame's result (agspeed/_effects.py, ``_RESULT``).

A frame that returns an object it was given (``return x, cache``, ``return self``, a
ModelOutput made around the cache passed in) returns that very object in eager.  The
graph returns None in its place and the entry puts the object there, read through its
source on each call, so an object of the same class on a later call is served by the
same entry (guarded by type, not identity) and is the one returned."""

import gc
import weakref

import pytest

import agspeed
from _refs import assert_not_held

try:
    import torch
    from torch import nn
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = None

pytestmark = pytest.mark.torch


class Cache:
    def __init__(self):
        self.layers = []
        self.seen = 0


def grows(x, cache):
    cache.layers.append(x * 2)
    cache.seen = cache.seen + x.shape[0]
    return x + 1, cache


def hands_back(x, cache):
    return {"out": x.sin(), "cache": cache, "both": [cache, x.cos()]}


class Step(nn.Module if nn is not None else object):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self, self.fc(x)


def _recaptures(name):
    return sum(r.count for r in agspeed.recompiles() if r.function.startswith(name + " "))


def test_an_argument_changed_and_returned_is_that_object_on_every_call():
    agspeed.reset()
    fast = agspeed.optimize(grows, backend="eager")
    caches = [Cache() for _ in range(4)]
    for cache in caches:
        for _ in range(2):
            x = torch.randn(3)
            out, back = fast(x, cache)
            torch.testing.assert_close(out, x + 1)
            assert back is cache
            torch.testing.assert_close(cache.layers[-1], x * 2)
    assert all(c.seen == 6 and len(c.layers) == 2 for c in caches)
    # one entry per value of `seen` read before it is written, not one per object
    assert _recaptures("grows") <= 2
    report = agspeed.explain(grows, torch.randn(3), Cache())
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def test_objects_of_the_program_inside_the_result_are_those_objects():
    fast = agspeed.optimize(hands_back, backend="eager")
    for _ in range(3):
        cache, x = Cache(), torch.randn(2)
        got = fast(x, cache)
        assert got["cache"] is cache and got["both"][0] is cache
        torch.testing.assert_close(got["out"], x.sin())
        torch.testing.assert_close(got["both"][1], x.cos())


def test_a_module_returning_itself():
    torch.manual_seed(0)
    model = Step()
    fast = agspeed.optimize(model, backend="eager")
    for n in range(1, 4):
        x = torch.randn(2, 3)
        me, y = fast(x)
        assert me is fast and model.calls == n   # the object the caller holds
        torch.testing.assert_close(y, model.fc(x))


def test_a_returned_object_is_not_kept_alive_by_the_entry():
    fast = agspeed.optimize(grows, backend="eager")
    x = torch.randn(3)
    fast(x, Cache())
    cache = Cache()
    fast(x, cache)
    assert_not_held(lambda c: fast(x, c)[1], cache)
    gone = weakref.ref(cache)
    del cache
    gc.collect()
    assert gone() is None


class _Point:
    def __init__(self, v):
        self.v = v


def hands_back_in_a_namedtuple(x, p):
    return torch.return_types.max((x, p))


def test_an_object_where_it_cannot_be_put_back_breaks_with_eagers_result():
    """Inside a structseq the graph's output would hold the object itself: the frame
    breaks and runs eager, which returns it."""
    p = _Point(1)
    fast = agspeed.optimize(hands_back_in_a_namedtuple, backend="eager")
    x = torch.randn(2)
    got = fast(x, p)
    assert type(got) is torch.return_types.max and got[1] is p


class _Holder:
    pass


def stores_and_returns(x, holder, cache):
    items = [cache, x * 2]    # a list made here, holding the program's object,
    holder.items = items      # stored on the program's object and returned: one list
    return x + 1, items


def test_a_list_stored_and_returned_holds_the_programs_object():
    fast = agspeed.optimize(stores_and_returns, backend="eager")
    for _ in range(3):
        holder, cache, x = _Holder(), Cache(), torch.randn(2)
        out, items = fast(x, holder, cache)
        assert items is holder.items and items[0] is cache
        torch.testing.assert_close(items[1], x * 2)
        torch.testing.assert_close(out, x + 1)


def _returns_an_entry(d, x):
    return d["pair"], x + 1


def _changes_and_returns_an_entry(d, x):
    d["step"] = x * 2
    return d["pair"]


@pytest.mark.parametrize("fn", [_returns_an_entry, _changes_and_returns_an_entry])
def test_a_tuple_of_the_program_holding_a_list_is_returned_as_itself(fn):
    """A tuple read from the program's dict holds the program's list: eager returns
    that tuple, so the list the caller gets is the one in the dict (a later append
    through either reaches both), on every call, not a copy or the first call's."""
    fast = agspeed.optimize(fn, backend="eager", fullgraph=True)
    for _ in range(3):
        items = [1, 2]
        d = {"pair": ("tag", items)}
        x = torch.randn(2)
        got = fast(d, x)
        pair = got[0] if fn is _returns_an_entry else got
        assert pair is d["pair"] and pair[1] is items
        if fn is _changes_and_returns_an_entry:
            torch.testing.assert_close(d["step"], 2 * x)
