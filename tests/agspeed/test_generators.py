"""Generator expressions and generator functions consumed inside the optimized code.

Each form is captured as one graph, with eager's results, result types and gradients on
fresh inputs, and no more graphs than torch._dynamo.explain reports for it.
"""

import gc
import sys
import weakref

import pytest

import agspeed
from _dynamo_ref import dynamo_graph_count

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch


def pair(x):
    yield x * 2
    yield x + 1


def returns_after(x):
    yield torch.sin(x)
    return x.cos()


def delegating(x):
    yield from pair(x)
    last = yield from returns_after(x)
    yield last


def sum_of_genexpr(x, y):
    return sum(x * i for i in range(3)) + y


def shape_tuple(x, y):
    return x.view(tuple(s for s in x.shape)) * y


def any_none(x, y):
    xs = (x, None, y)
    if any(t is None for t in xs):
        return x * y
    return x + y


def all_two_dims(x, y):
    return x * y if all(t.dim() == 2 for t in (x, y)) else x - y


def cat_of_list(x, y):
    return torch.cat(list(torch.sin(t) * 2 for t in (x, y)))


def dict_of_pairs(x, y):
    return dict((name, t * 3) for name, t in zip(("a", "b"), (x, y)))


def sum_of_generator_function(x, y):
    return sum(pair(x)) * y


def loop_over_generator_function(x, y):
    out = y
    for v in pair(x):
        out = out * v
    return out


def yield_from(x, y):
    return tuple(delegating(x)), y


def max_and_sorted(x, y):
    n = max(s for s in x.shape)
    dims = sorted((d for d in range(x.dim())), reverse=True)
    return x.permute(dims) * n + y.t()


def next_of_generator(x, y):
    g = pair(x)
    first = next(g)
    return first + next(g) + next(g, y)


def enumerate_a_genexpr(x, y):
    out = y
    for i, v in enumerate(torch.relu(x * k) for k in range(3)):
        out = out + v * i
    return out


class Blocks(torch.nn.Module if torch else object):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x, y):
        return sum(layer(x) for layer in self.layers) + y


class BlocksByMethod(Blocks):
    def each(self):
        yield from self.layers

    def forward(self, x, y):
        out = y
        for layer in self.each():
            out = layer(out) + x
        return out


FORMS = [sum_of_genexpr, shape_tuple, any_none, all_two_dims, cat_of_list,
         dict_of_pairs, sum_of_generator_function, loop_over_generator_function, yield_from,
         max_and_sorted, next_of_generator, enumerate_a_genexpr, "module", "module_method"]


def inputs():
    return (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True))


def leaves(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [v for o in out.values() for v in leaves(o)]
    return [v for o in out for v in leaves(o)]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: getattr(f, "__name__", f))
def test_generator_forms_capture_as_one_graph_like_eager(form):
    torch.manual_seed(0)
    fn = {"module": Blocks, "module_method": BlocksByMethod}.get(form, lambda: form)()
    report = agspeed.explain(fn, *inputs())
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    assert report.graph_count <= dynamo_graph_count(fn, *inputs())
    fast = agspeed.optimize(fn)
    for _ in range(3):
        args = inputs()
        got, want = fast(*args), fn(*args)
        assert type(got) is type(want)
        got_leaves, want_leaves = leaves(got), leaves(want)
        assert len(got_leaves) == len(want_leaves)
        for g, w in zip(got_leaves, want_leaves):
            torch.testing.assert_close(g, w)
        grads = torch.autograd.grad(sum(g.sum() for g in got_leaves), args)
        want_grads = torch.autograd.grad(sum(w.sum() for w in want_leaves), args)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w)


def returns_generator(x):
    return pair(x)


def keeps_generator_on_a_list(x):
    return [pair(x)], x


def test_a_generator_leaving_the_code_breaks_and_runs_eager():
    for fn in (returns_generator, keeps_generator_on_a_list):
        x = torch.randn(3)
        report = agspeed.explain(fn, x)
        assert report.graph_count == 0
        assert [r.reason for r in report.break_reasons] == ["generator"]
        # where the generator leaves: the return, or the list that would hold it
        where = "RETURN_VALUE" if fn is returns_generator else "BUILD_LIST"
        assert report.break_reasons[0].instruction == where
        out = agspeed.optimize(fn)(x)
        gen = out if fn is returns_generator else out[0][0]
        got = list(gen)
        torch.testing.assert_close(got, [x * 2, x + 1])


def suspended_then_breaks(x, y):
    g = pair(x)
    first = next(g)
    print("eager only")
    return first + y


def test_generator_frames_keep_nothing_alive(capsys):
    for fn in (sum_of_generator_function, suspended_then_breaks):
        agspeed.explain(fn, *inputs())
        gc.collect()        # the first capture's garbage (a break's code made once)
        before = sys.getrefcount(pair), sys.getrefcount(pair.__code__)
        refs = []
        for _ in range(5):
            x, y = inputs()
            report = agspeed.explain(fn, x, y)
            assert report.graph_break_count == (fn is suspended_then_breaks)
            refs.append(weakref.ref(x))
            del x, y, report
        gc.collect()
        assert [r() for r in refs] == [None] * 5
        assert (sys.getrefcount(pair), sys.getrefcount(pair.__code__)) == before
