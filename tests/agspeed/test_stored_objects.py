"""Objects the frame makes and stores in the program's objects (``self.state =
State(y)``, a list of the program, a dict argument): eager stores a new object on every
call, holding that call's tensors, so the replay after the graph does too
(agspeed/_effects.py templates, ``agspeed._replay._Made``)."""

import collections
import dataclasses
import gc
import weakref

import pytest

import agspeed

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch


class State:
    def __init__(self, value, step=0):
        self.value = value
        self.step = step


@dataclasses.dataclass
class Record:
    loss: "torch.Tensor"
    note: str = "r"


Pair = collections.namedtuple("Pair", "a b")


class Keeps(torch.nn.Module if torch else object):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        y = self.fc(x)
        self.state = State(y.detach(), step=2)
        self.record = Record(y.sum())
        self.top = torch.max(y, 1)
        self.pair = Pair(y * 2, 1)
        self.window = collections.deque([y + 1], maxlen=4)
        self.both = self.state          # one object in two places
        return y.relu()


def _run(model, xs):
    out = []
    for x in xs:
        model(x)
        out.append((model.state, model.record, model.top, model.pair, model.window,
                    model.both))
    return out


def test_a_made_object_stored_is_new_and_holds_this_calls_tensors():
    torch.manual_seed(0)
    model = Keeps()
    fast = agspeed.optimize(model, backend="eager")
    xs = [torch.randn(2, 3) for _ in range(3)]
    got = _run(fast, xs)
    want = _run(model, xs)
    for g, w in zip(got, want):
        state, record, top, pair, window, both = g
        assert type(state) is State and type(record) is Record
        assert type(top) is type(w[2]) and type(pair) is Pair
        assert type(window) is collections.deque and window.maxlen == 4
        for a, b in ((state.value, w[0].value), (record.loss, w[1].loss),
                     (top.values, w[2].values), (top.indices, w[2].indices),
                     (pair.a, w[3].a), (window[0], w[4][0])):
            assert isinstance(a, torch.Tensor)      # (it held a graph node before)
            torch.testing.assert_close(a, b)
        assert state.step == 2 and record.note == "r" and pair.b == 1
        assert both is state                         # one object, as in eager
    # a new object each call: changing one does not change the next
    assert len({id(g[0]) for g in got}) == 3
    report = agspeed.explain(model, xs[0])
    assert (report.graph_count, report.graph_break_count) == (1, 0)


LOG = []


def append_made(x, log):
    y = x * 3
    LOG.append(State(y))
    log["last"] = Record(y.mean())
    return y


def test_made_objects_written_to_a_list_and_a_dict_of_the_program():
    LOG.clear()
    fast = agspeed.optimize(append_made, backend="eager")
    log = {}
    xs = [torch.randn(4) for _ in range(3)]
    lasts = []
    for x in xs:
        fast(x, log)
        lasts.append(log["last"])
    assert len({id(s) for s in LOG}) == 3
    for s, r, x in zip(LOG, lasts, xs):
        torch.testing.assert_close(s.value, x * 3)
        torch.testing.assert_close(r.loss, (x * 3).mean())
    LOG[0].value.zero_()        # the first call's object is its own
    torch.testing.assert_close(LOG[1].value, xs[1] * 3)


class StoresIterator(torch.nn.Module if torch else object):
    def forward(self, x):
        self.pending = State(iter([1, 2]))
        return x + 1


class StoresItself(torch.nn.Module if torch else object):
    def forward(self, x):
        s = State(x * 2)
        s.me = s
        self.state = s
        return x + 1


def test_what_cannot_be_made_again_breaks_and_stays_eagers():
    it_model = StoresIterator()
    fast = agspeed.optimize(it_model, backend="eager")
    firsts = []
    for _ in range(3):
        x = torch.randn(2)
        torch.testing.assert_close(fast(x), x + 1)
        firsts.append(it_model.pending.value)
    assert [next(i) for i in firsts] == [1, 1, 1]     # each call's own iterator
    report = agspeed.explain(it_model, torch.randn(2))
    assert report.graph_break_count >= 1
    assert "list_iterator made in the frame" in str(report)

    self_model = StoresItself()
    fast = agspeed.optimize(self_model, backend="eager")
    for _ in range(2):
        x = torch.randn(2)
        torch.testing.assert_close(fast(x), x + 1)
        assert self_model.state.me is self_model.state
        torch.testing.assert_close(self_model.state.value, x * 2)


class StoresAndReturns(torch.nn.Module if torch else object):
    def __init__(self, brk):
        super().__init__()
        self.brk = brk

    def forward(self, x):
        o = State(x * 2)
        self.kept = o
        if self.brk:
            print("", end="")      # a graph break with o live
            o.value = o.value + 1
        return o, x + 1


@pytest.mark.parametrize("brk", [False, True], ids=["one graph", "across a break"])
def test_a_made_object_stored_and_returned_is_one_object(brk):
    model = StoresAndReturns(brk)
    fast = agspeed.optimize(model, backend="eager")
    seen = []
    for _ in range(3):
        x = torch.randn(2)
        o, _ = fast(x)
        assert o is model.kept
        torch.testing.assert_close(o.value, x * 2 + (1 if brk else 0))
        seen.append(o)
    assert len({id(o) for o in seen}) == 3


class Remembers(torch.nn.Module if torch else object):
    """Keeps the batches it was called with, as a model keeping its last input does."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.cur = self.prev = None
        self.seen = {}

    def forward(self, batch, other):
        self.prev = self.cur
        self.cur = batch
        self.pair = (batch, other, 3)
        self.seen["last"] = other
        return self.fc(batch.value) + other.value, batch


def test_a_batch_object_stored_on_the_program_is_this_calls_without_recapture():
    """``self.cur = batch``: the write stores the object of each call, read through its
    source, so the entry guards its type, not the first batch (which it would keep
    alive and miss on every later call)."""
    from test_dynamic_scalars import entries

    model = Remembers()
    fast = agspeed.optimize(model, backend="eager")
    other, prev = State(torch.randn(2, 3)), None
    firsts = []
    for i in range(10):
        batch = State(torch.randn(2, 3))
        if i < 2:
            firsts.append(batch)
        twin = other if i % 3 else State(torch.randn(2, 3))
        out, back = fast(batch, twin)
        torch.testing.assert_close(out, model.fc(batch.value) + twin.value)
        assert back is batch and model.cur is batch and model.prev is prev
        assert model.pair[0] is batch and model.pair[1] is twin and model.pair[2] == 3
        assert model.seen["last"] is twin
        prev = batch
    # the first call saw no earlier batch; the second one made the entry every later
    # call used
    assert sum(r.count for r in agspeed.recompiles()) <= 2
    assert len(entries(model)) <= 2
    # the one object passed twice is not the entry's two objects
    batch = State(torch.randn(2, 3))
    out, back = fast(batch, batch)
    torch.testing.assert_close(out, model.fc(batch.value) + batch.value)
    assert model.pair[0] is model.pair[1] is batch
    # no entry holds the batches of the first calls
    refs = [weakref.ref(b) for b in firsts]
    del firsts, batch, back, prev
    model.cur = model.prev = model.pair = None
    model.seen.clear()
    gc.collect()
    assert [r() for r in refs] == [None, None]
