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
