"""Modules and dict subclasses the frame makes: a bare dict subclass, a module made of
torch's layers alone or with its own ``__init__`` (run on every call, as eager runs it), a
module class of the program looked up in a table, decorated methods reached through
``super()``, a module made in the frame and returned, ``object.__setattr__`` storing a
container, and layers that draw their parameters from the generator as eager does.

Each compares the optimized function's result with eager's on fresh inputs (``check``
of test_objects.py: one graph, no break, no more graphs than Dynamo's)."""

import collections
import functools
import gc

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402
from test_objects import check  # noqa: E402

pytestmark = pytest.mark.torch


class Batch(collections.OrderedDict):
    pass


class PlainDict(dict):
    """A docstring is all it adds."""


class Cat(torch.nn.Module):
    def forward(self, x, y):
        return torch.nn.ReLU()(torch.cat((x, y), dim=1))


def test_bare_dict_subclass_made_in_the_frame():
    def f(x):
        b = Batch(sample=x + 1, n=3)
        p = PlainDict([("a", x * 2)])
        b["more"] = p["a"].sum()
        return b, p

    got = check(f, (2, 3))
    assert list(got[0]) == ["sample", "n", "more"]


def test_module_made_by_torch_code_alone():
    def f(x, y):
        call = Cat()                      # no __init__ of its own: torch's code makes it
        return call(x, y) + Cat().forward(y, x).sum()

    check(f, (2, 3), (2, 3))


def test_module_with_its_own_init_made_in_the_frame_runs_it_on_every_call():
    class Counting(torch.nn.Module):
        made = 0

        def __init__(self):
            super().__init__()
            Counting.made += 1   # the program's code: it runs on every call, as eager

        def forward(self, x):
            return x + 1

    def f(x):
        return Counting()(x)

    opt = agspeed.optimize(f)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(opt(x), f(x))
    assert Counting.made == 6


class Scaled(torch.nn.Module):
    """An activation of the program, its __init__ its own (transformers' ACT2FN)."""

    def __init__(self, scale=1.0, smooth=False):
        super().__init__()
        self.scale = scale
        self.act = self._smooth if smooth else torch.tanh

    def _smooth(self, x):
        return torch.nn.functional.softplus(x) - 1

    def forward(self, x):
        return self.act(x) * self.scale


class Activations(collections.OrderedDict):
    """Makes the layer a name stands for on each lookup."""

    def __getitem__(self, key):
        cls, kwargs = super().__getitem__(key)
        return cls(**kwargs)


ACTIVATIONS = Activations(tanh=(Scaled, {"scale": 2.0}), smooth=(Scaled, {"smooth": True}))


def test_a_module_of_the_program_made_in_the_frame_is_captured_whole():
    def f(x):
        h = ACTIVATIONS["tanh"](x)
        layer = ACTIVATIONS["smooth"]
        return layer(h), layer.training, layer.scale

    check(f, (2, 5))
    opt = agspeed.optimize(f)
    x = torch.randn(2, 5)
    # what the constructor was handed is guarded: a changed argument is a new capture
    kwargs = dict.__getitem__(ACTIVATIONS, "tanh")[1]
    try:
        kwargs["scale"] = 3.0
        torch.testing.assert_close(opt(x), f(x))
        kwargs["scale"] = 2.0
        torch.testing.assert_close(opt(x), f(x))
    finally:
        kwargs["scale"] = 2.0


def test_a_module_made_in_the_frame_after_torch_compile_ran():
    # torch._dynamo wraps nn.Module.__init__ once it has run (to tag the modules it
    # sees made): the capture follows the init it wraps
    import torch._dynamo.mutation_guard as guard

    guard.install_generation_tagging_init()
    assert torch.nn.Module.__init__.__name__ == "patched_init"

    def f(x):
        return Scaled(2.0)(x)

    check(f, (4,))


def _twice(fn):
    @functools.wraps(fn)
    def wrapper(self, x):
        return fn(self, fn(self, x))
    return wrapper


class Doubled(torch.nn.Module):
    @_twice
    def forward(self, x):
        return x.sin() + 1


class Extended(Doubled):
    def forward(self, x):
        return super().forward(x) * 2


def test_a_decorated_method_found_through_super_is_read_through_its_class():
    # the decorator's function has cells: read, and guarded, through Doubled.forward
    m = Extended()
    ex = agspeed.explain(m, torch.randn(3))
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons
    opt = agspeed.optimize(m)
    x = torch.randn(3)
    torch.testing.assert_close(opt(x), m(x))
    saved = Doubled.forward
    try:
        Doubled.forward = lambda self, x: x - 1     # the guard sees the class change
        torch.testing.assert_close(opt(x), m(x))
    finally:
        Doubled.forward = saved


def test_a_module_of_the_program_made_in_the_frame_can_be_returned():
    def f(x):
        layer = Scaled(0.5)
        return layer(x), layer

    opt = agspeed.optimize(f)
    x = torch.randn(3)
    out, layer = opt(x)
    torch.testing.assert_close(out, f(x)[0])
    assert type(layer) is Scaled and layer.scale == 0.5 and layer.training
    torch.testing.assert_close(layer(x), out)       # a working module, made anew
    assert layer is not opt(x)[1]


class Wrapped(torch.nn.Module):
    """Assigns submodules in its __init__: nn.Module.__setattr__ stores them in the
    ``_modules`` dict its own ``super().__setattr__`` made."""

    def __init__(self, scale):
        super().__init__()
        self.act = torch.nn.GELU()
        self.inner = Scaled(scale)
        self.drop = torch.nn.Dropout(0.0)

    def forward(self, x):
        return self.drop(self.inner(self.act(x)))


def test_a_module_made_in_the_frame_holds_the_submodules_its_init_assigns():
    def f(x):
        layer = Wrapped(1.5)
        return layer(x) + layer.inner.scale, len(layer._modules), list(layer._modules)

    check(f, (3, 4))

    def made(x):
        layer = Wrapped(0.5)
        return layer(x), layer

    opt = agspeed.optimize(made)
    x = torch.randn(3, 4)
    out, layer = opt(x)
    torch.testing.assert_close(out, made(x)[0])
    assert list(layer._modules) == ["act", "inner", "drop"]
    assert type(layer.inner) is Scaled and layer.inner.scale == 0.5
    torch.testing.assert_close(layer(x), out)
    gc.collect()
    before = sum(type(o) is Wrapped for o in gc.get_objects())
    for _ in range(3):
        opt(torch.randn(3, 4))
    gc.collect()
    assert sum(type(o) is Wrapped for o in gc.get_objects()) == before


class Sealed:
    """Refuses attribute writes; its __init__ stores through object.__setattr__."""

    def __setattr__(self, name, value):
        raise AttributeError(f"{name} is read-only")

    def __init__(self, x):
        items = {}
        object.__setattr__(self, "items", items)
        items["x"] = x * 2                  # through the code's reference
        object.__setattr__(self, "parts", [x])
        self.parts.append(x + 1)            # through the object's


def test_object_setattr_stores_the_container_built_in_the_frame_itself():
    class Bag:
        pass

    def f(x, bag):
        sealed = Sealed(x)
        seen = []
        object.__setattr__(bag, "seen", seen)
        seen.append(x.sum())
        same = sealed.items is sealed.__dict__["items"]
        return sealed.items["x"] + sealed.parts[1], same, len(sealed.parts), \
            sealed.items is sealed.parts

    e = agspeed.explain(f, torch.randn(3), Bag())
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    opt = agspeed.optimize(f)
    for _ in range(2):
        x, mine, theirs = torch.randn(3), Bag(), Bag()
        got, want = opt(x, mine), f(x, theirs)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:] == (True, 2, False)
        assert type(mine.seen) is list and len(mine.seen) == 1
        torch.testing.assert_close(mine.seen[0], theirs.seen[0])


def test_layers_with_parameters_made_in_the_frame_draw_what_eager_draws():
    # the capture makes torch's layer to see what it holds, then breaks: the generator
    # must be where the program left it when the call runs eager
    class Drawn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)

    def layer(x):
        torch.manual_seed(0)
        return torch.nn.Linear(4, 4)(x)

    def module(x):
        torch.manual_seed(0)
        return Drawn()(x)

    for fn in (layer, module):
        opt = agspeed.optimize(fn, backend="eager")
        for _ in range(2):
            x = torch.randn(2, 4)
            torch.testing.assert_close(opt(x), fn(x))
