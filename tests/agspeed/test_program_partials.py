"""A functools.partial the program passes in (or holds in a global, a module attribute):
its function, bound arguments and keywords are guarded, so another partial of the same
function never runs this one's graph; the tensors it holds are graph inputs, read on
every call; results equal eager's, and the captured frame keeps no partial alive."""

import functools
import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch


def scaled(x, k=1, y=None):
    return x * k if y is None else x * k * y


def apply(f, x):
    return f(x) + 1


def both(f0, f1, x):
    return f0(x) * f1(x)


class Joined(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(torch.cat((x, y), dim=1))


def _captures():
    return [r for r in agspeed._runtime.frame_records() if r.decision == "captured"]


def test_partials_of_one_function_with_other_bound_values_give_their_own_results():
    agspeed.reset()
    fast = agspeed.optimize(apply, backend="eager", fullgraph=True)
    x = torch.randn(3)
    for p in (functools.partial(scaled, k=2), functools.partial(scaled, k=3),
              functools.partial(scaled, 3), functools.partial(scaled, 3),
              functools.partial(scaled, k=2)):
        torch.testing.assert_close(fast(p, x), apply(p, x))
    assert len(_captures()) == 3


def test_a_keyword_changed_in_place_is_seen():
    fast = agspeed.optimize(apply, backend="eager", fullgraph=True)
    x = torch.randn(3)
    p = functools.partial(scaled, k=2)
    torch.testing.assert_close(fast(p, x), apply(p, x))
    p.keywords["k"] = 5
    torch.testing.assert_close(fast(p, x), apply(p, x))


def test_another_function_under_the_same_bound_values_is_seen():
    fast = agspeed.optimize(apply, backend="eager", fullgraph=True)
    x = torch.randn(3)
    for fn in (scaled, lambda x, k: x - k, lambda x, k: x + k):
        p = functools.partial(fn, k=2)
        torch.testing.assert_close(fast(p, x), apply(p, x))


@pytest.mark.parametrize("make", [
    lambda: functools.partial(scaled, y=torch.randn(2, 2)),
    lambda: functools.partial(scaled, torch.randn(2, 2)),
    lambda: functools.partial(Joined(), y=torch.randn(2, 2)),
], ids=["keyword", "positional", "module"])
def test_tensors_held_by_a_partial_are_graph_inputs(make):
    agspeed.reset()
    fast = agspeed.optimize(both, backend="eager", fullgraph=True)
    p0, p1 = make(), make()
    for _ in range(2):
        x = torch.randn(2, 2)
        torch.testing.assert_close(fast(p0, p1, x), both(p0, p1, x))
        torch.testing.assert_close(fast(p1, p0, x), both(p1, p0, x))
        p0 = make()   # new tensors of the same kind: the same graph, their values
    mine = functools.partial(scaled, y=torch.randn(2, 2, requires_grad=True))
    ref = functools.partial(scaled, y=mine.keywords["y"].detach().clone().requires_grad_())
    x = torch.randn(2, 2)
    fast(mine, mine, x).sum().backward()
    both(ref, ref, x).sum().backward()
    torch.testing.assert_close(mine.keywords["y"].grad, ref.keywords["y"].grad)


def test_a_partial_holding_something_else_still_runs_as_eager():
    fast = agspeed.optimize(apply, backend="eager")
    p = functools.partial(lambda x, extra: x * len(extra), extra=[torch.ones(1)] * 3)
    x = torch.randn(3)
    torch.testing.assert_close(fast(p, x), apply(p, x))
    with pytest.raises(agspeed.GraphBreakError, match="partial"):
        agspeed.optimize(apply, backend="eager", fullgraph=True)(p, x)


def test_the_entry_keeps_no_partial_nor_its_tensors_alive():
    fast = agspeed.optimize(both, backend="eager")
    y = torch.randn(2, 2)
    p = functools.partial(scaled, y=y)
    fast(p, p, torch.randn(2, 2))
    fast(p, p, torch.randn(2, 2))
    gone = weakref.ref(p), weakref.ref(y)
    del p, y
    gc.collect()
    assert gone[0]() is None and gone[1]() is None
