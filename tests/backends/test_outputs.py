"""backends/_outputs.py: a compiled backend gets a graph returning a flat tuple, and the
optimized call still returns the frame's own structure (containers, namedtuples,
``torch.return_types``, constants, one object where the frame returned one twice)."""

import collections
import sys
import weakref

import pytest

torch = pytest.importorskip("torch")
import agspeed  # noqa: E402

pytestmark = pytest.mark.torch

Pair = collections.namedtuple("Pair", "low high")
seen = []


def listing(gm, example_inputs):
    """What inductor does: its callable answers a list for the graph's flat tuple."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    seen.append(out.args[0])
    return lambda *args: list(gm.forward(*args))


def nested(x):
    y = x.sin()
    return (y, [x.cos(), 4, "s", None], {"k": x + 1, 2: (y,)},
            Pair(x.min(), x.max()), torch.max(x, dim=0), x.shape)


def test_the_backend_gets_a_flat_tuple_and_the_call_returns_the_frames_structure():
    seen.clear()
    f = agspeed.optimize(nested, backend=listing)
    x = torch.randn(3, 2)
    want = nested(x)
    got = f(x)
    (flat,) = seen
    assert type(flat) is tuple and all(isinstance(n, torch.fx.Node) for n in flat)
    assert len(flat) == len(set(flat))  # each output node once
    assert type(got) is tuple and type(got[1]) is list and type(got[2]) is dict
    assert type(got[3]) is Pair and type(got[4]) is torch.return_types.max
    assert type(got[5]) is torch.Size and got[5] == want[5]
    assert got[1][1:] == [4, "s", None] and list(got[2]) == ["k", 2]
    assert got[2][2][0] is got[0]  # one tensor returned twice is one object
    for a, b in zip(torch.utils._pytree.tree_leaves(got),
                    torch.utils._pytree.tree_leaves(want)):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b)
        else:
            assert a == b
    # a new container on every call, as the frame makes them
    again = f(x)
    assert again[1] is not got[1] and again[2] is not got[2]


def test_the_rebuilt_result_holds_no_extra_references():
    f = agspeed.optimize(lambda x: (x * 2, [x + 1]), backend=listing)
    x = torch.randn(4)
    f(x)
    out = f(x)
    ref = weakref.ref(out[0])
    count = sys.getrefcount(out[1])  # the tuple's and the call's
    assert count == 2
    del out
    assert ref() is None


def test_inductor_compiles_nested_outputs():
    f = agspeed.optimize(nested, backend="inductor")
    x = torch.randn(3, 2, requires_grad=True)
    got = f(x)
    assert type(got[3]) is Pair and type(got[4]) is torch.return_types.max
    (got[0].sum() + got[2]["k"].sum()).backward()
    g = x.grad.clone()
    x.grad = None
    want = nested(x)
    (want[0].sum() + want[2]["k"].sum()).backward()
    torch.testing.assert_close(g, x.grad)
    assert not any("failed" in str(r.decision) for r in agspeed._runtime.frame_records())


class Layer:
    def __init__(self, key):
        self.key = key


class Cache:
    def __init__(self, keys):
        self.layers = [Layer(k) for k in keys]


class Output(collections.OrderedDict):
    """A dict subclass with attributes, as transformers' ModelOutput is."""


def made_objects(x):
    cache = Cache([x.sin(), x.cos()])
    out = Output(logits=x * 2, cache=cache)
    return out, cache


def test_objects_the_frame_made_are_rebuilt_around_a_flat_tuple():
    """Objects made in the frame (a model output holding a cache holding layers) leave a
    compiled graph as a flat tuple of tensors; the call rebuilds them, one object where
    the frame returned one twice."""
    seen.clear()
    f = agspeed.optimize(made_objects, backend=listing)
    x = torch.randn(3)
    got, cache = f(x)
    (flat,) = seen
    assert all(n.meta["example_value"].__class__.__name__ == "FakeTensor" for n in flat)
    assert len(flat) == 3
    assert type(got) is Output and type(cache) is Cache and got["cache"] is cache
    assert [type(layer) for layer in cache.layers] == [Layer, Layer]
    torch.testing.assert_close(got["logits"], x * 2)
    torch.testing.assert_close(cache.layers[1].key, x.cos())
    again, _ = f(x)
    assert again is not got and again["cache"] is not cache


def collections_out(x):
    return (collections.deque([x.sin()], maxlen=3), collections.OrderedDict(a=x.cos()),
            collections.defaultdict(list, {"k": x + 1}))


def test_collections_the_frame_built_are_rebuilt_around_a_flat_tuple():
    seen.clear()
    f = agspeed.optimize(collections_out, backend=listing)
    x = torch.randn(3)
    dq, od, dd = f(x)
    (flat,) = seen
    assert len(flat) == 3 and all(isinstance(n.meta["example_value"], torch.Tensor)
                                  for n in flat)
    assert type(dq) is collections.deque and dq.maxlen == 3
    assert type(od) is collections.OrderedDict and list(od) == ["a"]
    assert type(dd) is collections.defaultdict and dd.default_factory is list
    torch.testing.assert_close(dd["k"], x + 1)


class Holder:
    pass


def shared_containers(x, holder):
    d = {"a": x + 1}
    items = [x * 2]
    seen_set = {1, 2}
    holder.items = items     # a write the graph replays: the program's object holds it
    return d, d, [items, items], {"k": items}, seen_set, (seen_set,), Layer(items)


@pytest.mark.parametrize("backend", ["eager", listing])
def test_a_container_returned_twice_is_one_object(backend):
    # the frame returns one list, dict or set in several places (and stores one on an
    # object of the program): the call returns one object for each, new on every call
    seen.clear()
    f = agspeed.optimize(shared_containers, backend=backend)
    results = []
    for _ in range(2):
        x, holder = torch.randn(3), Holder()
        got = f(x, holder)
        want = shared_containers(x, Holder())
        d, d2, pair, table, s, (s2,), layer = got
        assert d is d2 and pair[0] is pair[1] is table["k"] is layer.key is holder.items
        assert s is s2 and type(s) is set and s == {1, 2}
        assert type(d) is dict and type(pair[0]) is list
        torch.testing.assert_close(d["a"], want[0]["a"])
        torch.testing.assert_close(pair[0][0], want[2][0][0])
        results.append(got)
    assert results[0][0] is not results[1][0] and results[0][2][0] is not results[1][2][0]
    if backend is listing:
        assert seen and all(isinstance(n, torch.fx.Node) for n in seen[0])
