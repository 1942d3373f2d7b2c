"""``copy.deepcopy`` and ``copy.copy`` of plain data inside a captured frame (a config
copied and adjusted, as transformers' encoder-decoder configs do when a cache is made),
``setattr`` and ``delattr`` with constant names: eager's results, one graph, the copy the
capture's own object (writable, returnable), what was copied guarded whole (a change of
the original is a miss with eager's new answer); what is not plain data (a tensor, a
class with its own copy hooks) breaks and still gives eager's answer; nothing is kept
alive by the cache."""

import copy
import gc
import weakref

import pytest

try:
    import torch
    from torch import nn
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = None

import agspeed
from test_checks import Counting

pytestmark = pytest.mark.torch


class Options:
    def __init__(self):
        self.scale = 2.0
        self.names = ["a", "b"]
        self.extra = {"k": (1, 2), "dtype": torch.float32 if torch else None}


class Mapped:
    """A config-like class: reads and writes go through its own methods and super()."""

    attribute_map = {"width": "hidden"}

    def __init__(self):
        self.hidden = 4
        self.layers = 2

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)


class CopiesOptions(nn.Module if nn is not None else object):
    def __init__(self):
        super().__init__()
        self.opts = Options()
        self.cfg = Mapped()

    def forward(self, x):
        o = copy.deepcopy(self.opts)
        o.scale = o.scale * 3
        o.names.append("c")
        c = copy.deepcopy(self.cfg)
        setattr(c, "width", c.width + 1)
        c.extra = 1
        delattr(c, "extra")
        return x * o.scale + len(o.names) + c.hidden, o, c


def test_a_deep_copy_of_plain_data_is_the_captures_own_object():
    model = CopiesOptions()
    backend = Counting()
    fast = agspeed.optimize(model, backend=backend)
    original = model.opts
    for _ in range(3):
        x = torch.randn(3)
        got, o, c = fast(x)
        want, p, d = model(x)
        torch.testing.assert_close(got, want)
        assert type(o) is Options and o is not original and o.__dict__ == p.__dict__
        assert type(c) is Mapped and vars(c) == vars(d) == {"hidden": 5, "layers": 2}
    assert backend.graphs == 1
    assert original.names == ["a", "b"] and original.scale == 2.0   # never changed
    assert model.cfg.hidden == 4


def test_a_change_of_what_was_copied_captures_again():
    model = CopiesOptions()
    fast = agspeed.optimize(model, backend="eager")
    x = torch.randn(3)
    fast(x)
    model.opts.extra["k"] = (1, 3)      # deep inside: the copy would differ
    model.opts.scale = 5.0
    got, o, _ = fast(x)
    want, p, _ = model(x)
    torch.testing.assert_close(got, want)
    assert o.__dict__ == p.__dict__ and o.extra["k"] == (1, 3)
    (record,) = agspeed.recompiles()
    assert "copy.deepcopy(self.opts)" in record.reasons[0]


class HoldsTensor:
    def __init__(self):
        self.w = torch.ones(2) if torch else None


class OwnHook:
    copies = 0

    def __deepcopy__(self, memo):
        OwnHook.copies += 1
        return OwnHook()


def copies_what_is_not_plain(x, thing):
    y = copy.deepcopy(thing)
    return x + 1, type(y).__name__


@pytest.mark.parametrize("make", [HoldsTensor, OwnHook, lambda: [torch.ones(1)]])
def test_what_is_not_plain_data_breaks_with_eagers_answer(make):
    thing = make()
    before = OwnHook.copies
    fast = agspeed.optimize(copies_what_is_not_plain, backend="eager")
    x = torch.randn(2)
    got = fast(x, thing)
    assert got[1] == type(thing).__name__
    torch.testing.assert_close(got[0], x + 1)
    assert OwnHook.copies - before == (1 if isinstance(thing, OwnHook) else 0)
    report = agspeed.explain(copies_what_is_not_plain, x, thing)
    assert report.graph_break_count >= 1


class Flat:
    def __init__(self):
        self.a, self.b = 1, (2, 3)


def shallow(x, flat, nested):
    f = copy.copy(flat)
    f.a = 10
    return x * f.a + f.b[1], f, copy.copy(nested)


def test_a_shallow_copy_sharing_nothing_mutable_is_folded():
    flat, nested = Flat(), {"x": 1}
    fast = agspeed.optimize(shallow, backend="eager")
    x = torch.randn(2)
    got, f, n = fast(x, flat, nested)
    torch.testing.assert_close(got, x * 10 + 3)
    assert flat.a == 1 and f.a == 10 and f.b == flat.b
    assert n == nested and n is not nested
    report = agspeed.explain(shallow, x, flat, nested)
    assert (report.graph_count, report.graph_break_count) == (1, 0)


class SetsItself(nn.Module if nn is not None else object):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        setattr(self, "last", x.sum())    # a write on the module, replayed after the graph
        return x * 2


def test_setattr_on_an_object_of_the_program_is_replayed():
    model = SetsItself()
    fast = agspeed.optimize(model, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(fast(x), x * 2)
        torch.testing.assert_close(model.last, x.sum())
    report = agspeed.explain(SetsItself(), torch.randn(3))
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def deletes(x, obj):
    delattr(obj, "a")
    return x + 1


def test_delattr_on_an_object_of_the_program_keeps_eagers_effect():
    obj = Flat()
    fast = agspeed.optimize(deletes, backend="eager")
    torch.testing.assert_close(fast(torch.ones(1), obj), torch.full((1,), 2.0))
    assert not hasattr(obj, "a")


def test_the_cache_does_not_keep_what_was_copied_alive():
    model = CopiesOptions()
    fast = agspeed.optimize(model, backend="eager")
    for _ in range(2):
        fast(torch.randn(3))
    opts = weakref.ref(model.opts)
    model.opts = Options()
    gc.collect()
    assert opts() is None


SCALES = {int: 2.0, float: 3.0, type(None): 1.0}


def scaled_by_type(x, n):
    return x * SCALES.get(type(n), 0.0)


def test_a_registry_keyed_by_types_is_read_item_by_item():
    backend = Counting()
    fast = agspeed.optimize(scaled_by_type, backend=backend)
    x = torch.randn(2)
    for _ in range(2):
        x = torch.randn(2)
        torch.testing.assert_close(fast(x, 1), x * 2.0)
    assert backend.graphs == 1
    SCALES[int] = 4.0                     # the item read is guarded: a miss, eager's value
    try:
        torch.testing.assert_close(fast(x, 1), x * 4.0)
    finally:
        SCALES[int] = 2.0
    report = agspeed.explain(scaled_by_type, x, None)
    assert (report.graph_count, report.graph_break_count) == (1, 0)


class Checked:
    """Writes run validators from a registry on the class, as strict dataclasses do."""

    validators = {"scale": [float]}

    def __init__(self, scale):
        self.scale = scale

    def __setattr__(self, name, value):
        for check in self.validators.get(name, []):
            value = check(value)
        object.__setattr__(self, name, value)


def validates(x):
    c = Checked(2)
    c.scale = c.scale + 1
    return x * c.scale, c.scale


def test_a_class_registry_read_through_an_object_made_in_the_frame():
    fast = agspeed.optimize(validates, backend="eager")
    x = torch.randn(2)
    got, scale = fast(x)
    torch.testing.assert_close(got, x * 3.0)
    assert type(scale) is float and scale == 3.0
    report = agspeed.explain(validates, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    Checked.validators["scale"] = [int]   # a change of the class's registry: eager's answer
    try:
        assert type(fast(x)[1]) is int
    finally:
        Checked.validators["scale"] = [float]
