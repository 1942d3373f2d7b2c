"""Lists of the program that a frame only appends to (``self.features.append(h)``, a
global history, an output list passed in): one capture serves every call however long the
list has grown, the appends land on the program's own list after the graph, in eager's
order; a read of the list in the same capture sees the whole list, items and length
guarded as any read; a source that no longer holds a plain list captures again and gives
eager's answer or error; nothing is kept alive by the cache."""

import gc
import sys
import weakref

import pytest

try:
    import torch
    from torch import nn
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = None

import agspeed
from test_checks import Counting
from test_dynamic_scalars import entries

pytestmark = pytest.mark.torch


def same(a, b):
    """Two lists of the program item by item: tensors by value, the rest by ==."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(y, torch.Tensor):
            torch.testing.assert_close(x, y)
        else:
            assert type(x) is type(y) and x == y


HISTORY = []


class Collects(nn.Module if nn is not None else object):
    """Keeps each layer's output on itself and a loss term in a global history."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)
        self.features = []

    def forward(self, x):
        h = self.fc1(x).relu()
        self.features.append(h)
        out = self.fc2(h)
        self.features.append(out)
        HISTORY.append(out.pow(2).mean())
        HISTORY.extend([h.sum(), 1])
        return out


def test_a_growing_list_is_captured_once_and_gets_eagers_items():
    torch.manual_seed(0)
    model, ref = Collects(), Collects()
    ref.load_state_dict(model.state_dict())
    backend = Counting()
    fast = agspeed.optimize(model, backend=backend)
    features = model.features
    HISTORY.clear()
    got, want = [], []
    for _ in range(6):
        x = torch.randn(3, 4, requires_grad=True)
        out = fast(x)
        got += HISTORY
        HISTORY.clear()
        torch.testing.assert_close(out, ref(x))
        HISTORY.clear()   # ref's own appends
        out.sum().backward()
    assert backend.graphs == 1
    (entry,) = entries(model)
    assert entry.hits == 5
    assert model.features is features and len(features) == 12
    same(features, ref.features)
    for h, out in zip(features[0::2], features[1::2]):
        want += [out.pow(2).mean(), h.sum(), 1]
    same(got, want)
    HISTORY.clear()
    assert features[0].grad_fn is not None   # the graph's own tensors, autograd kept


def fills(x, out):
    y = x.sin()
    out.append(y)
    out.extend([y * 2, "tag"])
    out.append(len(x))
    return y + 1


def test_an_output_list_argument_gets_its_appends_whatever_it_held():
    backend = Counting()
    fast = agspeed.optimize(fills, backend=backend)
    for held in ([], [1, 2, 3], [torch.ones(2)] * 5, ["a"] * 40):
        mine, theirs = list(held), list(held)
        x = torch.randn(4)
        torch.testing.assert_close(fast(x, mine), fills(x, theirs))
        same(mine, theirs)
    assert backend.graphs == 1


def appends_then_reads(x, out):
    out.append(x * 2)
    n = len(out)
    out.append(out[0] + n)
    return x + n


def test_a_read_after_an_append_sees_the_whole_list_and_is_guarded():
    fast = agspeed.optimize(appends_then_reads, backend="eager")
    for held in ([torch.zeros(3)], [torch.ones(3)], [torch.ones(3)] * 2, [torch.ones(3)]):
        mine, theirs = list(held), list(held)
        x = torch.randn(3)
        torch.testing.assert_close(fast(x, mine), appends_then_reads(x, theirs))
        same(mine, theirs)


class Window(nn.Module if nn is not None else object):
    """Appends, then keeps only the last two: a change past appending."""

    def __init__(self):
        super().__init__()
        self.kept = []

    def forward(self, x):
        self.kept.append(x.cos())
        if len(self.kept) > 2:
            self.kept.pop(0)
        return x * len(self.kept)


def test_appends_followed_by_other_changes_match_eager():
    model, ref = Window(), Window()
    fast = agspeed.optimize(model, backend="eager")
    for _ in range(5):
        x = torch.randn(2)
        torch.testing.assert_close(fast(x), ref(x))
        same(model.kept, ref.kept)


def through_a_local(x, out):
    acts = out
    acts.append(x + 1)
    out.append(x + 2)
    acts.append(x + 3)
    return x


def test_the_same_list_under_two_names_gets_every_append_in_order():
    fast = agspeed.optimize(through_a_local, backend="eager")
    for k in range(3):
        mine, theirs = [k], [k]
        x = torch.randn(2)
        fast(x, mine)
        through_a_local(x, theirs)
        same(mine, theirs)


REGISTRY = []


class Registers(nn.Module if nn is not None else object):
    def __init__(self, sink):
        super().__init__()
        self.sink = sink

    def forward(self, x):
        REGISTRY.append(x.sum())
        self.sink.append(x.mean())
        return x * 2


def test_a_list_reached_by_two_sources_follows_each_source():
    REGISTRY.clear()
    model = Registers(REGISTRY)   # self.sink is REGISTRY on the first call
    fast = agspeed.optimize(model, backend="eager")
    x = torch.randn(3)
    fast(x)
    assert len(REGISTRY) == 2
    torch.testing.assert_close(REGISTRY[0], x.sum())
    torch.testing.assert_close(REGISTRY[1], x.mean())
    model.sink = own = []         # now another list: each append goes where eager's goes
    y = torch.randn(3)
    fast(y)
    assert len(REGISTRY) == 3 and len(own) == 1
    torch.testing.assert_close(REGISTRY[2], y.sum())
    torch.testing.assert_close(own[0], y.mean())
    REGISTRY.clear()


class CountingList(list):
    def __init__(self):
        super().__init__()
        self.appends = 0

    def append(self, value):
        self.appends += 1
        super().append(value)


def test_a_source_holding_another_type_captures_again_with_eagers_answer():
    model = Collects()
    fast = agspeed.optimize(model, backend="eager")
    x = torch.randn(2, 4)
    fast(x)
    model.features = CountingList()   # its own append must run
    fast(x)
    assert model.features.appends == 2 and len(model.features) == 2
    model.features = ()               # eager's AttributeError
    with pytest.raises(AttributeError, match="append"):
        model(x)
    with pytest.raises(AttributeError, match="append"):
        fast(x)
    HISTORY.clear()


def test_a_break_after_an_append_keeps_it_once():
    def breaks_after(x, out):
        out.append(x + 1)
        if x.sum().item() > 1e9:   # data-dependent: the rest runs eager
            x = x * 0
        out.append(x + 2)
        return x

    fast = agspeed.optimize(breaks_after, backend="eager")
    for _ in range(3):
        mine, theirs = [], []
        x = torch.randn(2)
        torch.testing.assert_close(fast(x, mine), breaks_after(x, theirs))
        same(mine, theirs)


def test_the_cache_keeps_neither_the_list_nor_what_was_appended():
    model = Collects()
    fast = agspeed.optimize(model, backend="eager")
    features = model.features
    for _ in range(3):
        fast(torch.randn(2, 4))
    gc.collect()
    refs = sys.getrefcount(features)
    fast(torch.randn(2, 4))
    gc.collect()
    assert sys.getrefcount(features) == refs
    kept = weakref.ref(features[-1])
    features.clear()
    HISTORY.clear()
    gc.collect()
    assert kept() is None
    del model.features
    gc.collect()
    assert sys.getrefcount(features) == 2   # this name and the call's argument only


class LogsItems(nn.Module if nn is not None else object):
    """Appends a Python number read from a tensor: the capture breaks in the append's
    argument, with the list's method on the stack."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.losses = []

    def forward(self, x):
        y = self.fc(x).tanh()
        self.losses.append(y.pow(2).mean().item())
        return y * 2


def test_a_break_inside_an_appends_argument_resumes_with_the_programs_list():
    torch.manual_seed(0)
    model, ref = LogsItems(), LogsItems()
    ref.load_state_dict(model.state_dict())
    report = agspeed.explain(LogsItems(), torch.randn(2, 3))
    assert report.graph_count >= 1   # the layer before the break is a graph
    fast = agspeed.optimize(model, backend="eager")
    losses = model.losses
    for _ in range(4):
        x = torch.randn(2, 3)
        torch.testing.assert_close(fast(x), ref(x))
    assert model.losses is losses and len(losses) == 4
    assert all(type(v) is float for v in losses)
    assert losses == pytest.approx(ref.losses)


STATS = {"norms": [], "means": []}


def records_stats(x):
    y = x.tanh()
    STATS["norms"].append(y.norm())
    STATS["means"].append(y.mean())
    return y


def test_lists_in_a_registry_dict_grow_with_one_capture():
    for v in STATS.values():
        v.clear()
    backend = Counting()
    fast = agspeed.optimize(records_stats, backend=backend)
    xs = [torch.randn(4) for _ in range(5)]
    for x in xs:
        fast(x)
    assert backend.graphs == 1
    assert len(STATS["norms"]) == len(STATS["means"]) == 5
    for x, n, m in zip(xs, STATS["norms"], STATS["means"]):
        torch.testing.assert_close(n, x.tanh().norm())
        torch.testing.assert_close(m, x.tanh().mean())
    for v in STATS.values():
        v.clear()
