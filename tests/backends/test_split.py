"""backends/_split.py: cutting a captured training graph along gradient buckets."""

import operator

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import agspeed  # noqa: E402
from agspeed.backends import _split  # noqa: E402


def capture(model, *args, **options):
    """The graph agspeed captures for ``model(*args)`` (``optimize`` given ``options``)
    and its example inputs."""
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    agspeed.optimize(model, backend=backend, **options)(*args)
    (gm, inputs), = seen
    return gm, inputs


def stack(widths=(16, 32, 32, 32, 4)):
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def sizes_of(model):
    return {id(p): p.numel() * p.element_size() for p in model.parameters()}


def test_bucket_rule_fills_buckets_from_the_end():
    model = stack()
    gm, inputs = capture(model, torch.randn(3, 16))
    sizes = sizes_of(model)
    layer = (32 * 32 + 32) * 4  # one 32x32 Linear's bytes
    pieces = _split.plan(gm, inputs, sizes, cap=layer, first_cap=layer)
    # each bucket closes once a layer's worth is in it: the last layer (small) and the
    # one before share the first bucket, then one layer each
    assert _split.count(pieces) == 3
    order = [pieces[n] for n in gm.graph.nodes if n in pieces]
    assert order == sorted(order) and order[0] == 0  # contiguous, in forward order
    # the whole graph is one piece when a bucket holds everything
    assert _split.count(_split.plan(gm, inputs, sizes, cap=10**9, first_cap=10**9)) == 1


def test_candidates_run_from_the_bucket_rule_to_the_whole_graph():
    model = stack((16,) + (32,) * 8 + (4,))
    gm, inputs = capture(model, torch.randn(3, 16))
    layer = (32 * 32 + 32) * 4
    plans = _split.plans(gm, inputs, sizes_of(model), cap=layer, first_cap=layer)
    counts = [_split.count(p) for p in plans]
    assert counts == sorted(set(counts), reverse=True)
    assert counts[-1] == 1 and counts[0] >= 4


def test_parameters_not_reduced_do_not_fill_buckets():
    model = stack()
    gm, inputs = capture(model, torch.randn(3, 16))
    assert _split.count(_split.plan(gm, inputs, {}, cap=1, first_cap=1)) == 1


def test_unpacking_stays_with_its_source():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            top, where = torch.max(self.a(x), dim=1)
            return self.b(x) * top.unsqueeze(1) + where.unsqueeze(1)

    model = Net()
    gm, inputs = capture(model, torch.randn(4, 8))
    pieces = _split.plan(gm, inputs, sizes_of(model), cap=1, first_cap=1)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is operator.getitem:
            assert pieces[node] == pieces[node.args[0]]


def test_the_cut_graph_computes_what_the_graph_does():
    model = stack()
    x = torch.randn(5, 16)
    gm, inputs = capture(model, x)
    layer = (32 * 32 + 32) * 4
    pieces = _split.plan(gm, inputs, sizes_of(model), cap=layer, first_cap=layer)
    split = _split.cut(gm, pieces)
    assert len(list(split.named_children())) == 3
    for _, child in split.named_children():
        for node in child.graph.nodes:
            if node.op == "placeholder":
                assert "example_value" in node.meta
    torch.testing.assert_close(split(*inputs), gm(*inputs))


def test_symbolic_sizes_become_inputs_the_pieces_pass_on():
    model = stack()
    gm, inputs = capture(model, torch.randn(6, 16), dynamic=True)
    sized = _split.bind_sizes(gm)
    assert sized == [(0, 0)]  # the batch size of the data input
    assert _split.bind_sizes(gm) == []  # bound once
    sizes = _split.size_values(sized, inputs)
    layer = (32 * 32 + 32) * 4
    pieces = _split.plan(gm, sizes + inputs, sizes_of(model), cap=layer, first_cap=layer)
    split = _split.cut(gm, pieces)
    x = torch.randn(9, 16)  # another size, through the same cut graph
    args = [x if t is inputs[0] else t for t in inputs]
    torch.testing.assert_close(split(9, *args), gm(9, *args))
    torch.testing.assert_close(split(9, *args)[0], model(x))


def test_a_zero_byte_bucket_cap_ends():
    # DDP(bucket_cap_mb=0) is accepted by DDP: doubling a cap of 0 would never reach one
    # piece
    model = stack()
    gm, inputs = capture(model, torch.randn(3, 16))
    plans = _split.plans(gm, inputs, sizes_of(model), cap=0, first_cap=0)
    counts = [_split.count(p) for p in plans]
    assert counts[0] >= 3 and counts[-1] == 1


def test_nodes_before_the_first_layer_join_its_piece():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            with torch.autocast("cpu", enabled=False):
                return self.b(self.a(x * 2).relu())

    model = Net()
    gm, inputs = capture(model, torch.randn(4, 8))
    pieces = _split.plan(gm, inputs, sizes_of(model), cap=1, first_cap=1)
    first = [n for n in gm.graph.nodes if n in pieces and pieces[n] == 0]
    assert any(n.target is torch._C._nn.linear for n in first), [n.name for n in first]
    assert _split.count(pieces) == 2
    split = _split.cut(gm, pieces)
    torch.testing.assert_close(split(*inputs), gm(*inputs))


class CheckpointedStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = stack()

    def forward(self, x):
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
        return x


@pytest.mark.cxx_exceptions  # checkpoint's recomputation stops early by raising
def test_a_checkpointed_region_is_cut_with_its_submodule():
    import torch.utils.checkpoint  # noqa: F401

    model = CheckpointedStack()
    x = torch.randn(5, 16, requires_grad=True)
    gm, inputs = capture(model, x)
    layer = (32 * 32 + 32) * 4
    pieces = _split.plan(gm, inputs, sizes_of(model), cap=layer, first_cap=layer)
    for node in gm.graph.nodes:
        if node.op == "get_attr":   # a region's submodule, in its call's piece
            (call,) = node.users
            assert pieces[node] == pieces[call]
    split = _split.cut(gm, pieces)
    assert len(list(split.named_children())) == 3
    want = gm(*inputs)[0]
    got = split(*inputs)[0]
    torch.testing.assert_close(got, want)
    (g_want,) = torch.autograd.grad(want.sum(), x)
    (g_got,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(g_got, g_want)
