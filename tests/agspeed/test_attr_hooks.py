"""Attribute reads the way CPython does them: a class's own ``__getattribute__`` written in
Python runs for every read (inlined, with ``super().__getattribute__`` the read past it),
``getattr`` defaults and ``hasattr`` through such a class, builtin methods reached through
``super()`` on objects of the program (a dict subclass's ``super().get``), an instance's
``__dict__`` and ``__class__``; and the guards that keep reads of a program's dicts right
when the dict changes between calls."""

import gc
import sys
import weakref

import pytest

import agspeed
from _dynamo_ref import dynamo_graph_count

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch


def _check(fn, *args, **kwargs):
    """fn captured as one graph with no break, equal to eager and no more graphs than
    Dynamo; returns the optimized function for further calls."""
    ex = agspeed.explain(fn, *args, **kwargs)
    assert ex.graph_break_count == 0, ex.break_reasons
    assert ex.graph_count == 1
    if not kwargs:
        assert ex.graph_count <= max(1, dynamo_graph_count(fn, *args))
    opt = agspeed.optimize(fn, backend="eager")
    fresh = tuple(torch.randn_like(a) if isinstance(a, torch.Tensor) else a for a in args)
    torch.testing.assert_close(opt(*fresh, **kwargs), fn(*fresh, **kwargs))
    return opt


class Registry(dict):
    """A dict keyed by class name, whose own get reads the store through super()."""

    def get(self, key):
        return super().get(str(key)) or {}

    def __setitem__(self, key, value):
        super().__setitem__(str(key), value)


REGISTRY = Registry()
REGISTRY["a"] = 3.0


def test_super_get_on_a_dict_subclass_of_the_program():
    def f(x):
        return x * REGISTRY.get("a") + ("a" in REGISTRY)

    opt = _check(f, torch.randn(4))
    x = torch.randn(4)
    REGISTRY["a"] = 5.0    # the store changes: the guard on the item sees it
    try:
        torch.testing.assert_close(opt(x), f(x))
        assert torch.equal(opt(x), x * 5.0 + 1)
    finally:
        REGISTRY["a"] = 3.0


class Config:
    """A config whose reads go through a name map, as transformers' PretrainedConfig."""

    attribute_map = {"hidden_size": "n_embd"}

    def __init__(self):
        self.n_embd = 2.0
        self.layers = 3

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


CONFIG = Config()


def test_own_getattribute_runs_for_reads():
    def f(x):
        return x * CONFIG.hidden_size + getattr(CONFIG, "layers") + CONFIG.n_embd

    opt = _check(f, torch.randn(4))
    x = torch.randn(4)
    CONFIG.n_embd = 7.0
    try:
        torch.testing.assert_close(opt(x), f(x))
        Config.attribute_map = {"hidden_size": "layers"}   # the map itself changes
        torch.testing.assert_close(opt(x), f(x))
        assert torch.equal(opt(x), x * 3 + 3 + 7.0)
    finally:
        Config.attribute_map = {"hidden_size": "n_embd"}
        CONFIG.n_embd = 2.0


def test_getattr_default_and_hasattr_through_own_getattribute():
    def f(x):
        scale = getattr(CONFIG, "missing_field", 4.0)
        mapped = getattr(CONFIG, "hidden_size", 100.0)
        return x * scale + mapped + hasattr(CONFIG, "layers") + 10 * hasattr(CONFIG, "nope")

    opt = _check(f, torch.randn(4))
    x = torch.randn(4)
    CONFIG.missing_field = 0.5   # now present: the guard on its absence fails
    try:
        torch.testing.assert_close(opt(x), f(x))
        assert torch.equal(opt(x), x * 0.5 + 2.0 + 1)
    finally:
        del CONFIG.missing_field


class Guarded:
    """A __getattribute__ that handles the missing attribute itself: its except runs in
    eager, so the capture must not take the getattr() default for it."""

    def __init__(self):
        self.w = 2.0

    def __getattribute__(self, key):
        try:
            return super().__getattribute__(key)
        except AttributeError:
            return 9.0


GUARDED = Guarded()


def test_getattr_default_not_taken_past_a_handler_in_the_hook():
    def f(x):
        return x * getattr(GUARDED, "absent", 1.0) + GUARDED.w

    opt = agspeed.optimize(f, backend="eager")
    x = torch.randn(4)
    torch.testing.assert_close(opt(x), f(x))
    assert torch.equal(opt(x), x * 9.0 + 2.0)


def test_instance_dict_and_class_reads():
    class Holder:
        def __init__(self):
            self.scale = 3.0

    h = Holder()

    def f(x):
        d = h.__dict__
        return x * d.get("scale", 1.0) * (h.__class__ is Holder) + d.get("other", 0.5)

    opt = _check(f, torch.randn(4))
    x = torch.randn(4)
    h.other = 2.0
    torch.testing.assert_close(opt(x), f(x))


FLAGS = {"a": 1, "b": 2}
TABLE = {"a": 2.0}


def test_reads_of_a_program_dict_are_guarded():
    def f(x):
        k = "b" if "b" in TABLE else "a"
        return x * TABLE[k] * (3 if "a" in FLAGS else 1)

    opt = _check(f, torch.randn(4))
    x = torch.randn(4)
    try:
        TABLE["a"] = 3.0
        torch.testing.assert_close(opt(x), f(x))
        TABLE["b"] = 4.0
        torch.testing.assert_close(opt(x), f(x))
        FLAGS.pop("a")
        torch.testing.assert_close(opt(x), f(x))
        assert torch.equal(opt(x), x * 4.0)
    finally:
        TABLE.clear()
        TABLE["a"] = 2.0
        FLAGS["a"] = 1


def test_number_plus_equals_tensor():
    def f(xs):
        total = 0
        for x in xs:
            total += x * 2
        return total

    _check(f, [torch.randn(3, requires_grad=True) for _ in range(3)])
    xs = [torch.randn(3, requires_grad=True) for _ in range(3)]
    opt = agspeed.optimize(f, backend="eager")
    opt(xs).sum().backward()
    assert all(torch.equal(x.grad, torch.full((3,), 2.0)) for x in xs)


def test_closure_sees_the_kwargs_dict_as_changed():
    def f(x, **kwargs):
        flag = kwargs.pop("return_dict", True)
        picked = {k: kwargs.get(f"o_{k}", False) for k in FLAGS}
        return x * (len(picked) + picked["a"]) + flag

    _check(f, torch.randn(4), o_a=True, return_dict=False)
    opt = agspeed.optimize(f, backend="eager")
    x = torch.randn(4)
    kw = {"o_a": True, "return_dict": False}
    torch.testing.assert_close(opt(x, **kw), f(x, **kw))
    assert kw == {"o_a": True, "return_dict": False}   # the caller's dict untouched


def test_hooked_reads_keep_no_references():
    def f(x):
        return x * CONFIG.hidden_size

    opt = agspeed.optimize(f, backend="eager")
    x = torch.randn(4)
    opt(x)
    before = sys.getrefcount(CONFIG), sys.getrefcount(Config.__getattribute__)
    for _ in range(5):
        opt(x)
    assert (sys.getrefcount(CONFIG), sys.getrefcount(Config.__getattribute__)) == before

    class Temp(Config):
        pass

    t = Temp()
    gone = weakref.ref(t)

    def g(x):
        return x * t.hidden_size

    agspeed.optimize(g, backend="eager")(x)
    del t, g
    agspeed.reset()
    gc.collect()
    assert gone() is None


def test_environment_reads_are_guarded(monkeypatch):
    import os

    monkeypatch.delenv("AGSPEED_TEST_FLAG", raising=False)
    monkeypatch.delenv("AGSPEED_TEST_OTHER", raising=False)

    def f(x):
        if os.environ.get("AGSPEED_TEST_FLAG", "0") == "1":
            return x + 1
        return x * (2 if "AGSPEED_TEST_OTHER" in os.environ else 3)

    opt = _check(f, torch.randn(4))
    x = torch.randn(4)
    monkeypatch.setenv("AGSPEED_TEST_FLAG", "1")
    assert torch.equal(opt(x), x + 1)
    monkeypatch.delenv("AGSPEED_TEST_FLAG")
    monkeypatch.setenv("AGSPEED_TEST_OTHER", "yes")
    assert torch.equal(opt(x), x * 2)


def test_signature_of_a_method_is_read_from_its_code():
    import inspect

    class Chunked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def step(self, x):
            return self.fc(x)

        def forward(self, x):
            n = len(inspect.signature(self.step).parameters)
            return self.step(x) * n

    m = Chunked()
    ex = agspeed.explain(m, torch.randn(2, 3))
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons
    x = torch.randn(2, 3)
    torch.testing.assert_close(agspeed.optimize(m, backend="eager")(x), m(x))


class Settings:
    """A config whose writes go through a name map and a validating __setattr__."""

    attribute_map = {"kind": "problem_type"}

    def __init__(self):
        self.problem_type = None
        self.calls = 0

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        if key == "calls" and value < 0:
            raise ValueError("calls cannot be negative")
        super().__setattr__(key, value)


def test_own_setattr_of_a_program_object_is_inlined_and_replayed():
    settings = Settings()

    def f(x):
        if settings.problem_type is None:
            settings.kind = "single"       # mapped by the class's own __setattr__
        settings.calls = settings.calls + 1
        return x * 2

    ex = agspeed.explain(f, torch.randn(3))
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons
    settings.__dict__.update(problem_type=None, calls=0)
    opt = agspeed.optimize(f, backend="eager")
    x = torch.randn(3)
    assert torch.equal(opt(x), x * 2)
    assert settings.__dict__ == {"problem_type": "single", "calls": 1}
    opt(x)
    assert settings.__dict__ == {"problem_type": "single", "calls": 2}


def test_slice_of_a_module_list():
    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(3, 3) for _ in range(3))
            self.used = 2

        def forward(self, x):
            for layer in self.layers[: self.used]:
                x = layer(x)
            return x

    m = Stack()
    x = torch.randn(2, 3)
    ex = agspeed.explain(m, x)
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons
    assert ex.graph_count <= dynamo_graph_count(m, x)
    opt = agspeed.optimize(m, backend="eager")
    torch.testing.assert_close(opt(x), m(x))
    m.used = 3    # the slice bound is guarded
    torch.testing.assert_close(opt(x), m(x))


def test_torch_layers_made_in_the_frame():
    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 4)

        def forward(self, x, y):
            logits = torch.nn.ReLU()(self.fc(x))
            return torch.nn.CrossEntropyLoss(ignore_index=-100)(logits, y)

    m = Head()
    x, y = torch.randn(5, 3), torch.randint(0, 4, (5,))
    ex = agspeed.explain(m, x, y)
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons
    assert ex.graph_count <= dynamo_graph_count(m, x, y)
    opt = agspeed.optimize(m, backend="eager")
    loss = opt(x, y)
    loss.backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    ref = m(x, y)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    for g, p in zip(grads, m.parameters()):
        torch.testing.assert_close(g, p.grad)
