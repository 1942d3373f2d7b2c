"""Modules reached through containers and calls that ``nn.Module`` itself handles: ``key in
self.blocks`` on a ModuleDict is decided at capture and guarded (the key present with its
module, or absent), so adding or removing a block captures again and answers as eager; a
module whose class defines ``__call__`` (and may go on through ``super().__call__``) has
that method inlined rather than the call broken out."""

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import agspeed  # noqa: E402
from test_checks import Counting  # noqa: E402

pytestmark = pytest.mark.torch


class Routed(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)})

    def forward(self, x):
        if "a" in self.blocks:
            x = self.blocks["a"](x)
        if "extra" not in self.blocks:
            return x.relu()
        return self.blocks["extra"](x) * 3


def test_in_on_a_module_dict_is_decided_and_guarded():
    backend = Counting()
    model = Routed()
    fast = agspeed.optimize(model, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 4)
        torch.testing.assert_close(fast(x), model.forward(x))
    assert backend.graphs == 1
    model.blocks["extra"] = nn.Linear(4, 4)       # a key the guard said was absent
    x = torch.randn(2, 4)
    torch.testing.assert_close(fast(x), model.forward(x))
    del model.blocks["a"]                         # one it said was present
    torch.testing.assert_close(fast(x), model.forward(x))
    assert backend.graphs == 3
    torch.testing.assert_close(fast(x), model.forward(x))
    assert backend.graphs == 3


class Picky(nn.ModuleDict):
    """Answers ``in`` its own way: only for keys switched on."""

    on = ()

    def __contains__(self, key):
        return key in self.on


def test_a_module_dict_with_its_own_contains_is_not_read_as_one():
    model = Routed()
    model.blocks = Picky({"a": nn.Linear(4, 4), "extra": nn.Linear(4, 4)})
    fast = agspeed.optimize(model)
    x = torch.randn(2, 4)
    want = model.forward(x)
    torch.testing.assert_close(fast(x), want)
    torch.testing.assert_close(fast(x), want)


class Doubling(nn.Module):
    """A module whose class defines ``__call__`` itself."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def __call__(self, x):
        return self.fc(x) * 2


class Scaled(nn.Module):
    """A ``__call__`` that adds an argument and goes on through ``nn.Module.__call__``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) - 1

    def __call__(self, x, scale=1.0):
        return super().__call__(x) * scale


class Calls(nn.Module):
    def __init__(self):
        super().__init__()
        self.twice, self.scaled = Doubling(), Scaled()

    def forward(self, x):
        return self.scaled(self.twice(x) + 1, scale=3.0)


def test_modules_with_their_own_call_are_inlined():
    backend = Counting()
    model = Calls()
    fast = agspeed.optimize(model, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 4, requires_grad=True)
        got, want = fast(x), model.forward(x)
        torch.testing.assert_close(got, want)
        gx, = torch.autograd.grad(got.sum(), x)
        wx, = torch.autograd.grad(want.sum(), x)
        torch.testing.assert_close(gx, wx)
    assert backend.graphs == 1
    seen = []
    model.scaled.register_forward_hook(lambda m, args, out: seen.append(1))
    x = torch.randn(2, 4)
    torch.testing.assert_close(agspeed.optimize(model)(x), model.forward(x))
    assert len(seen) == 2   # the hook ran once for agspeed's call and once for eager's


class Walks(nn.Module):
    """Walks its own tree as torch's named_modules does, with a set of the modules seen
    (a shared block is visited once), and a set display of modules."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Sequential(self.a, nn.ReLU())

    def forward(self, x):
        names = [name for name, _ in self.named_modules()]
        seen = set()
        for m in self.modules():
            if m in seen:
                continue
            seen.add(m)
            x = x + 0.5 * len(seen)
        both = {self.a, self.b}
        return self.b(x) * len(names) + (self.a in both) + (self in both)


class EqualByName(nn.Module):
    """Compares by a name: membership would run this class's own __eq__."""

    def __eq__(self, other):
        return isinstance(other, EqualByName)

    __hash__ = nn.Module.__hash__

    def forward(self, x):
        return x


def test_modules_in_sets_are_compared_by_identity_without_a_break():
    backend = Counting()
    model = Walks()
    fast = agspeed.optimize(model, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 4)
        torch.testing.assert_close(fast(x), model.forward(x))
    assert backend.graphs == 1


def test_a_module_with_its_own_eq_in_a_set_breaks_and_answers_as_eager():
    first, second = EqualByName(), EqualByName()

    def fn(x):
        seen = {first}
        return x * 2 if second in seen else x

    fast = agspeed.optimize(fn, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(fast(x), fn(x))
    assert any("graph break" in r.decision for r in agspeed._runtime.frame_records())


class LayersByIndex(nn.Module):
    """A module that is its own container: ``self[i]`` and ``len(self)`` by its own
    ``__getitem__`` and ``__len__`` over a ModuleList, ``self["w"]`` over a ParameterDict."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6)])
        self.params = nn.ParameterDict({"w": nn.Parameter(torch.randn(6, 6))})

    def __getitem__(self, key):
        return self.params[key] if isinstance(key, str) else self.layers[key]

    def __len__(self):
        return len(self.layers)

    def forward(self, x):
        for i in range(len(self)):
            x = self[i](x)
        return x @ self["w"]


def test_a_module_with_its_own_getitem_and_len_is_one_graph():
    torch.manual_seed(0)
    model = LayersByIndex()
    twin = copy.deepcopy(model)
    x = torch.randn(4, 6)
    report = agspeed.explain(model, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    fast = agspeed.optimize(twin, backend="eager")
    for _ in range(2):
        x = torch.randn(4, 6)
        got, want = fast(x), model(x)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad)
    twin.layers.append(nn.Tanh())      # the container changed: captured again, right
    model.layers.append(nn.Tanh())
    torch.testing.assert_close(fast(x), model(x))
