"""One test per Python feature capture supports: each function or module below captures as
exactly one graph with no break, and its outputs and gradients equal eager's on fresh
random inputs."""

import collections

import pytest

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch

SCALE = 3.0  # a global the captured code reads
Result = collections.namedtuple("Result", "value count")


def make_closure(k):
    def scaled(x):
        return x * k + torch.sin(x)
    return scaled


def helper(a, b=2.0, *rest, scale=1.0, **extra):
    out = a * b * scale
    for r in rest:
        out = out + r
    return out + extra.get("shift", 0.0)


# -- functions: name -> (function, input shapes) ------------------------------------------


def f_locals_globals_builtins(x):
    y = x * SCALE
    n = len(x.shape)
    return y + abs(-n) + max(1, 2)


def f_torch_and_functional(x):
    return F.gelu(torch.tanh(x) @ x.t()).softmax(-1) + F.layer_norm(x, x.shape[-1:]).sum()


def f_operators(x):
    return (-x) ** 2 / (x.abs() + 1) - x.detach() // 3 + x % 2 * (x > 0) + len(x)


def f_in_place_on_fresh(x):
    y = x * 1.0
    y += 1
    y.mul_(2).add_(x)
    return y


def f_indexing(x):
    idx = torch.tensor([0, 2])
    return (x[0] + x[1:, ::2].sum() + x[None, ..., 0].sum() + x[..., -1].mean()
            + x[idx].sum())


def f_setitem(x):
    y = torch.zeros_like(x)
    y[0] = x[0] * 2
    y[1:, :2] = x[1:, :2]
    y[..., -1] = 7.0
    return y * x


def f_user_calls(x):
    return helper(x) + helper(x, 3.0, x, x, scale=0.5, shift=1.0) + helper(b=1.0, a=x)


def f_builtins(x):
    parts = []
    for i, row in enumerate(x):
        if i < 2:
            parts.append(row * i)
    for a, b in zip(parts, range(10, 12)):
        parts.append(a + b)
    if not isinstance(x, torch.Tensor):  # not `assert`: pytest rewrites those here
        raise TypeError("x")
    return torch.stack(parts).sum(0) * min(len(parts), 3)


def f_metadata(x):
    b, n = x.shape
    if not (x.dim() == 2 and x.ndim == 2 and x.dtype == torch.float32):
        raise ValueError("metadata")
    if x.device.type != "cpu" or x.is_cuda or not x.dtype.is_floating_point:
        raise ValueError("device")
    y = x.reshape(b * n // 2, 2).view(-1, x.size(1))
    return y.new_ones(x.size(0), x.size(-1)) + y.reshape(x.shape)


def f_control_flow(x, mask=None, mode="sum"):
    if x.shape[0] > 2:
        x = x * 2
    else:
        x = x / 2
    if mask is not None:
        x = x.masked_fill(mask, 0.0)
    if mode == "sum":
        return x.sum(-1)
    return x.mean(-1)


def f_containers(x):
    pair = (x, x * 2)
    a, b = pair
    first, *rest = [a, b, a + b]
    d = {"a": first, "b": rest[0]}
    d["c"] = rest[-1]
    s = slice(0, 2)
    label = f"{x.shape[0]}x{x.shape[1]}"
    return {"sum": d["a"] + d["b"] + d["c"], "head": x[s], "label": label, "pair": [a, b]}


def f_returns_tuple(x):
    return x.sin(), 3, None


def f_returns_namedtuple(x):
    return Result(x.cos() * 2, x.shape[0])


FUNCTIONS = {
    "locals_globals_builtins": (f_locals_globals_builtins, [(3, 4)]),
    "closure": (make_closure(0.5), [(3, 4)]),
    "torch_and_functional": (f_torch_and_functional, [(3, 4)]),
    "operators": (f_operators, [(3, 4)]),
    "in_place_on_fresh": (f_in_place_on_fresh, [(3, 4)]),
    "indexing": (f_indexing, [(3, 4)]),
    "setitem": (f_setitem, [(3, 4)]),
    "user_calls": (f_user_calls, [(3, 4)]),
    "builtins": (f_builtins, [(3, 4)]),
    "metadata": (f_metadata, [(3, 4)]),
    "control_flow": (f_control_flow, [(3, 4)]),
    "containers": (f_containers, [(3, 4)]),
    "returns_tuple": (f_returns_tuple, [(3, 4)]),
    "returns_namedtuple": (f_returns_namedtuple, [(3, 4)]),
}


# -- modules ------------------------------------------------------------------------------


class Containers(nn.Module):
    """Sequential, ModuleList (iterated and indexed), ModuleDict (indexed, items(), keys),
    a parameter and a buffer."""

    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 2)})
        self.gain = nn.Parameter(torch.ones(4))
        self.register_buffer("offset", torch.full((4,), 0.1))

    def forward(self, x):
        x = self.seq(x) * self.gain + self.offset
        for layer in self.layers:
            x = x + layer(x)
        x = self.layers[-1](x)
        outs = [head(x) for name, head in self.heads.items()]
        for key in self.heads:
            outs.append(self.heads[key](x) * 0.5)
        return torch.cat(outs, -1)


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class Derived(Base):
    def forward(self, x):
        y = super().forward(x)
        if self.training:
            y = y * 2
        return y + 1


class Reflecting(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 4)
        self.kind = "relu"

    def forward(self, x):
        act = getattr(F, self.kind)
        h = act(getattr(self, "enc")(x))
        if hasattr(self, "dec"):
            h = self.dec(h)
        return h


MODULES = {"containers": Containers, "super_and_training": Derived, "getattr_hasattr": Reflecting}


# -- the checks ---------------------------------------------------------------------------


class Counting:
    """A backend that counts the graphs it is given and runs them as captured."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def tensors_in(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    return []


def assert_same(got, want):
    assert type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    elif isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    else:
        assert got == want


def check(fast, plain, backend, make_inputs, params=()):
    for _ in range(3):
        inputs = make_inputs()
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        got = fast(*leaves)
        ref_leaves = [t.detach().clone().requires_grad_() for t in inputs]
        want = plain(*ref_leaves)
        assert_same(got, want)
        outs, ref_outs = tensors_in(got), tensors_in(want)
        if any(t.requires_grad for t in ref_outs):
            sum(t.float().square().sum() for t in outs if t.requires_grad).backward()
            sum(t.float().square().sum() for t in ref_outs if t.requires_grad).backward()
            for a, b in zip(leaves, ref_leaves):
                torch.testing.assert_close(a.grad, b.grad)
    assert len(backend.graphs) == 1, f"{len(backend.graphs)} graphs"


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_feature_is_one_graph_matching_eager(name):
    fn, shapes = FUNCTIONS[name]
    backend = Counting()
    fast = agspeed.optimize(fn, backend=backend)
    check(fast, fn, backend, lambda: [torch.randn(*s) for s in shapes])
    explained = agspeed.explain(fn, *[torch.randn(*s) for s in shapes])
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        [str(b) for b in explained.break_reasons]


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_module_feature_is_one_graph_matching_eager(name, mode):
    torch.manual_seed(0)
    model = MODULES[name]()
    model.train(mode == "train")
    backend = Counting()
    fast = agspeed.optimize(model, backend=backend)
    check(fast, model, backend, lambda: [torch.randn(2, 4)])
    explained = agspeed.explain(model, torch.randn(2, 4))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        [str(b) for b in explained.break_reasons]


def test_arguments_by_keyword_and_defaults_reach_the_graph():
    backend = Counting()
    fast = agspeed.optimize(f_control_flow, backend=backend)
    x = torch.randn(3, 4)
    mask = x > 1
    torch.testing.assert_close(fast(x, mask=mask, mode="mean"), f_control_flow(x, mask, "mean"))
    torch.testing.assert_close(fast(x), f_control_flow(x))
    assert len(backend.graphs) == 2  # mask None vs a tensor, "mean" vs "sum": two programs
