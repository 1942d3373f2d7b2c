"""Tuples and lists of tensors the program hands in (an argument, a module's list, a
slice of one) given whole to torch (``torch.cat(xs)``, ``torch.stack(xs[1:])``,
``sum(xs)``): their tensors are graph inputs read by item, so the capture is one graph with
eager's results and gradients, the guard follows each tensor, and a ModuleDict subclass's
own ``values()``/``keys()``/``items()`` (DenseNet's blocks) are inlined like ModuleDict's."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import agspeed  # noqa: E402
from test_checks import Counting  # noqa: E402

pytestmark = pytest.mark.torch


def joined(xs, pair):
    (u, v), w = pair
    return (1.5 * torch.cat(xs, 1), torch.stack(xs[1:]).sum(0), sum(xs) * 2,
            torch.cat([u, v, w]), torch.cat(pair[0]), len(xs))


def leaves(n):
    return [torch.randn(2, 3, requires_grad=True) for _ in range(n)]


def test_sequences_of_tensors_given_whole_to_torch_are_one_graph():
    backend = Counting()
    fast = agspeed.optimize(joined, backend=backend)
    for _ in range(3):
        xs = leaves(3)
        pair = ((xs[0], xs[1]), xs[2])
        got, want = fast(xs, pair), joined(xs, pair)
        assert got[-1] == want[-1]
        for g, w in zip(got[:-1], want[:-1]):
            torch.testing.assert_close(g, w)
        grads = torch.autograd.grad(sum(t.sum() for t in got[:-1]), xs)
        wants = torch.autograd.grad(sum(t.sum() for t in want[:-1]), xs)
        for g, w in zip(grads, wants):
            torch.testing.assert_close(g, w)
    assert backend.graphs == 1
    assert agspeed.explain(joined, xs, pair).break_reasons == []
    # another length or shape of an item: captured again, right
    xs = leaves(4)
    torch.testing.assert_close(fast(xs, pair)[0], joined(xs, pair)[0])
    xs = [t.double() for t in xs]
    torch.testing.assert_close(fast(xs, pair)[0], joined(xs, pair)[0])
    assert backend.graphs == 3


class Block(nn.Module):
    def forward(self, features):
        return 1.5 * torch.cat(features, 1)


class DenseBlock(nn.ModuleDict):
    """torchvision's DenseNet pattern: a ModuleDict subclass iterating its own values,
    each layer given the list of all features so far."""

    def __init__(self, layers=3):
        super().__init__()
        for i in range(layers):
            self.add_module(f"layer{i}", Block())

    def forward(self, x):
        features = [x]
        for name, layer in self.items():
            assert name in self.keys()
            features.append(layer(features))
        return torch.cat(features, 1)


def test_a_module_dict_subclass_iterating_itself_is_one_graph():
    model = DenseBlock()
    backend = Counting()
    fast = agspeed.optimize(model, backend=backend)
    for _ in range(3):
        x = torch.randn(2, 3, requires_grad=True)
        got, want = fast(x), model(x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0],
                                   torch.autograd.grad(want.sum(), x)[0])
    assert backend.graphs == 1
    assert agspeed.counters()["cache_hits"] >= 2


def from_a_deque(x, q):
    return q[0] + q[-1] * x


def test_a_deque_argument_is_read_by_item():
    """A deque's items are graph inputs read by ("item", source, index) like a list's;
    the reader once knew only tuples, lists and dicts and handed the graph nothing."""
    import collections

    fast = agspeed.optimize(from_a_deque, backend="eager")
    for n in (2, 2, 3):
        q = collections.deque(torch.randn(3) for _ in range(n))
        x = torch.randn(3)
        torch.testing.assert_close(fast(x, q), from_a_deque(x, q))


K = None


def top_plus_one(x):
    return torch.topk(x, K)[0] + 1       # k a tensor: a break at topk, resumed after


def from_a_structseq(x, r):
    return r[0] * x + r.indices.float()


@pytest.mark.cxx_exceptions   # topk's k read from a fake tensor throws inside libtorch
def test_a_structseq_on_a_resume_functions_stack_is_read_by_item():
    """torch.return_types.topk (a tuple subclass the C reader does not index) on a resume
    function's stack after a break: its items are read by item like a tuple's; they once
    came to the graph as a missing marker."""
    global K
    K = torch.tensor(2)
    fast = agspeed.optimize(top_plus_one, backend="eager")
    for _ in range(2):
        x = torch.randn(5)
        torch.testing.assert_close(fast(x), top_plus_one(x))


def test_a_structseq_argument_is_read_by_item():
    fast = agspeed.optimize(from_a_structseq, backend="eager")
    for _ in range(3):
        x, r = torch.randn(2), torch.topk(torch.randn(5), 2)
        torch.testing.assert_close(fast(x, r), from_a_structseq(x, r))
