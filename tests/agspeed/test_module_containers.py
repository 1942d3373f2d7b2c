"""Modules reached through containers and calls that ``nn.Module`` itself handles: ``key in
self.blocks`` on a ModuleDict is decided at capture and guarded (the key present with its
module, or absent), so adding or removing a block captures again and answers as eager; a
module whose class defines ``__call__`` (and may go on through ``super().__call__``) has
that method inlined rather than the call broken out."""

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
