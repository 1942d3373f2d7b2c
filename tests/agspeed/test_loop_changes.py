"""A loop over a list, dict or set that its own body changes (csrc/interp_flow.c,
``ags_iter_follow``): the capture iterates what the program would, as CPython's
iterators do.  A list is read at the iterator's index, so items appended, removed or
replaced during the loop are seen; a dict or set that changes size raises eager's
RuntimeError (the frame runs eager).  A loop over the program's list that breaks goes on
over that very list, stepped to where the loop was, so that what later passes change is
seen; a loop over a list the frame made, which the program can still change in the
passes after the break, runs eager rather than resuming over a stale copy of it."""

import gc
import sys

import pytest

import agspeed

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch


def _break():
    print("", end="")   # noqa: T201 - a call the capture does not model


def grows(x):
    work = [x, x * 2]
    out = x
    for w in work:
        if len(work) < 5:
            work.append(w + 1)
        out = out + w
    return out, len(work)


def shrinks(x):
    work = [x, x * 2, x * 3, x * 4]
    out = x
    for w in work:
        work.pop()
        out = out * w
    return out, len(work)


def replaces_ahead(x):
    work = [x, x * 2, x * 3]
    out = x
    for i, w in enumerate(work):
        if i + 1 < len(work):
            work[i + 1] = w * 10
        out = out + w
    return out


def grows_argument(x, items):
    for w in items:
        if len(items) < 4:
            items.append(w + 1)
        x = x + w
    return x


def deletes_from_dict(x):
    d = {"a": x, "b": x * 2}
    for k in d:
        if k == "a":
            del d["b"]
        x = x + 1
    return x


def adds_to_set(x):
    s = {1, 2}
    for k in s:
        s.add(k + 10)
        x = x + k
    return x


def rewrites_dict_values(x, d):
    for k in d:
        d[k] = d[k] * 2
        x = x + d[k]
    return x


def grows_with_a_break(x):
    work = [x, x * 2]
    for w in work:
        _break()
        x = x * w if len(work) > 4 else x + w
        if len(work) < 5:
            work.append(w + 1)
    return x, len(work)


def iterates_kept_list_with_a_break(x):
    layers = [x, x * 2, x * 3]
    for w in layers:
        x = x * w
        _break()
    return x, len(layers)


def grows_after_its_break(x, items):
    for w in items:
        _break()
        if len(items) < 4:
            items.append(w + 1)
        x = x + w
    return x


def pops_before_its_break(x, items):
    for w in items:
        if len(items) > 1:
            items.pop()
        if len(items) > 1:
            items.pop()     # the second pass breaks with the list shorter than its step
        _break()
        x = x + w
    return x


def scales_by_a_kept_list_with_a_break(x):
    scales = [x.sin(), x.cos(), x.tanh()]
    for scale in scales:
        x = x * scale
        _break()
    return x, scales


def _run(fn, *args):
    try:
        return fn(*args)
    except RuntimeError as exc:
        return f"RuntimeError: {exc}"


@pytest.mark.parametrize("fn", [grows, shrinks, replaces_ahead, grows_with_a_break,
                                iterates_kept_list_with_a_break],
                         ids=lambda f: f.__name__)
def test_a_list_changed_by_its_loop_is_followed(fn):
    fast = agspeed.optimize(fn, backend="eager")
    for _ in range(3):
        x = torch.randn(3, requires_grad=True)
        ref = x.detach().clone().requires_grad_()
        out, want = fast(x), fn(ref)
        assert type(out) is type(want)
        torch.testing.assert_close(out, want)
        first = out[0] if isinstance(out, tuple) else out
        first_ref = want[0] if isinstance(want, tuple) else want
        first.sum().backward()
        first_ref.sum().backward()
        torch.testing.assert_close(x.grad, ref.grad)


@pytest.mark.parametrize("fn", [grows, shrinks, replaces_ahead], ids=lambda f: f.__name__)
def test_a_list_changed_by_its_loop_is_one_graph(fn):
    report = agspeed.explain(fn, torch.randn(3))
    assert report.graph_count == 1
    assert report.graph_break_count == 0


@pytest.mark.parametrize("fn", [grows_argument, grows_after_its_break],
                         ids=lambda f: f.__name__)
def test_an_argument_list_grown_by_its_loop(fn):
    # grows_after_its_break: the first pass breaks before the body changes the list, so
    # the capture cannot see it change; the resume function steps the list itself
    fast = agspeed.optimize(fn, backend="eager")
    for _ in range(3):
        x, item = torch.randn(2), torch.randn(2)
        mine, theirs = [item], [item.clone()]
        torch.testing.assert_close(fast(x, mine), fn(x.clone(), theirs))
        assert len(mine) == len(theirs) == 4
        torch.testing.assert_close(mine, theirs)


@pytest.mark.parametrize("fn", [grows_after_its_break, pops_before_its_break],
                         ids=lambda f: f.__name__)
def test_a_loop_over_an_argument_list_changed_around_its_break_resumes(fn):
    fast = agspeed.optimize(fn, backend="eager")
    for n in (4, 4, 5, 1):
        x = torch.randn(2)
        mine = [torch.randn(2) for _ in range(n)]
        theirs = list(mine)
        torch.testing.assert_close(fast(x, mine), fn(x, theirs))
        torch.testing.assert_close(mine, theirs)
    report = agspeed.explain(fn, torch.randn(2), [torch.randn(2) for _ in range(4)])
    assert report.graph_count >= 2      # resumed, not run eager


class _Schedule(torch.nn.Module if torch else object):
    """A module stepping through a plain list of its own that its forward grows in the
    passes after a break: no local holds the list."""

    def __init__(self):
        super().__init__()
        self.scales = [1.0, 2.0]
        self.proj = torch.nn.Linear(3, 3)

    def forward(self, x):
        for s in self.scales:
            _break()
            x = self.proj(x) * s
            if len(self.scales) < 5:
                self.scales.append(s + 0.5)
        return x


def test_a_modules_own_list_grown_after_the_break_is_followed():
    torch.manual_seed(0)
    mine = _Schedule()
    theirs = _Schedule()
    theirs.load_state_dict(mine.state_dict())
    fast = agspeed.optimize(mine, backend="eager")
    for _ in range(3):
        x = torch.randn(2, 3, requires_grad=True)
        ref = x.detach().clone().requires_grad_()
        out, want = fast(x), theirs(ref)
        torch.testing.assert_close(out, want)
        out.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x.grad, ref.grad)
        assert mine.scales == theirs.scales


def test_an_argument_list_grown_by_its_loop_is_one_graph():
    report = agspeed.explain(grows_argument, torch.randn(2), [torch.randn(2)])
    assert report.graph_count == 1


def adds_under_values(x):
    d = {"a": x, "b": x * 2}
    for v in d.values():
        d["c"] = v
        x = x + v
    return x


def deletes_under_items(x):
    d = {"a": x, "b": x * 2}
    for k, v in d.items():
        if k == "a":
            del d["b"]      # (a break: the frame resumes after it only where it may)
        x = x + v
    return x


def adds_to_an_argument_dict(x, d):
    for k in d:
        d[k + "!"] = x
        x = x + 1
    return x


@pytest.mark.parametrize("fn", [deletes_from_dict, adds_to_set, adds_under_values,
                                deletes_under_items], ids=lambda f: f.__name__)
def test_a_dict_or_set_resized_by_its_loop_raises_as_eager(fn):
    fast = agspeed.optimize(fn, backend="eager")
    want = _run(fn, torch.ones(2))
    assert want.startswith("RuntimeError")
    for _ in range(2):
        assert _run(fast, torch.ones(2)) == want


def test_an_argument_dict_grown_by_its_loop_raises_as_eager():
    want = _run(adds_to_an_argument_dict, torch.ones(2), {"a": 1})
    assert want.startswith("RuntimeError")
    fast = agspeed.optimize(adds_to_an_argument_dict, backend="eager")
    for _ in range(2):
        mine = {"a": 1}
        assert _run(fast, torch.ones(2), mine) == want
        assert mine == {"a": 1, "a!": mine["a!"]}       # eager's one write before it


def test_a_dict_whose_values_the_loop_rewrites_needs_no_break():
    fast = agspeed.optimize(rewrites_dict_values, backend="eager")
    for _ in range(2):
        x = torch.randn(2)
        mine = {"a": torch.randn(2), "b": torch.randn(2)}
        theirs = {k: v.clone() for k, v in mine.items()}
        torch.testing.assert_close(fast(x, mine), rewrites_dict_values(x, theirs))
        torch.testing.assert_close(mine, theirs)
    report = agspeed.explain(rewrites_dict_values, torch.randn(2),
                             {"a": torch.randn(2)})
    assert report.graph_count == 1


def test_a_kept_list_the_loop_body_does_not_read_still_resumes():
    fast = agspeed.optimize(scales_by_a_kept_list_with_a_break, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(fast(x), scales_by_a_kept_list_with_a_break(x))
    report = agspeed.explain(scales_by_a_kept_list_with_a_break, torch.randn(3))
    assert report.graph_count >= 2


def test_a_loop_that_breaks_over_an_unchanged_argument_list_still_resumes():
    def over(x, ys):
        for y in ys:
            x = x + y
            _break()
        return x

    report = agspeed.explain(over, torch.randn(2), [torch.randn(2) for _ in range(3)])
    assert report.graph_count >= 2     # before the break, and the resumed passes


@pytest.mark.parametrize("fn", [grows_argument, grows_after_its_break],
                         ids=lambda f: f.__name__)
def test_the_followed_list_is_not_kept(fn):
    fast = agspeed.optimize(fn, backend="eager")
    x = torch.randn(2)
    for _ in range(3):
        fast(x, [torch.randn(2)])
    gc.collect()
    gc.collect()
    items = [torch.randn(2)]
    before = sys.getrefcount(items)
    fast(x, items)
    assert gc.collect() == 0
    assert sys.getrefcount(items) == before


def enumerates_and_grows_with_a_break(x):
    work = [x, x * 2]
    out = x
    for i, w in enumerate(work):
        if len(work) < 4:
            work.append(w * i)
        _break()
        out = out + w
    return out, len(work)


def iterates_its_own_iterator(x):
    work = [x, x * 2]
    it = iter(work)
    work.append(x * 3)
    return sum(it), tuple(reversed(work))


@pytest.mark.parametrize("fn", [replaces_ahead, enumerates_and_grows_with_a_break,
                                iterates_its_own_iterator],
                         ids=lambda f: f.__name__)
def test_iterators_made_by_builtins_read_the_list_as_they_step(fn):
    fast = agspeed.optimize(fn, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(fast(x), fn(x))


def test_a_dict_resized_under_its_items_iterator_raises_as_eager():
    def resize(x):
        d = {"a": x, "b": x * 2}
        for k in iter(d):
            d[k + "!"] = x
        return x

    want = _run(resize, torch.ones(2))
    assert want.startswith("RuntimeError")
    assert _run(agspeed.optimize(resize, backend="eager"), torch.ones(2)) == want
