"""A method of an object of the program taken as a value before a graph break (``m =
d.get``, ``m = batch.scale``), and builtin methods the capture does not follow
(``ContextVar.set``): the break resumes, and each call's method is bound to that
call's object (agspeed/_resume.py, the "bound" slot)."""

import contextvars
import functools

import pytest

import agspeed

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

from test_dynamic_scalars import entries  # noqa: E402

pytestmark = pytest.mark.torch


def dict_method_across_break(x, d):
    m = d.get
    y = x.sin()
    print("", end="")       # a graph break
    return y * m("k", 2)


class Scale:
    def __init__(self, k):
        self.k = k

    def scale(self, y):
        return y * self.k


def object_method_across_break(x, obj):
    m = obj.scale
    y = x.cos()
    print("", end="")
    return m(y)


def partial_of_dict_method(x, d):
    m = functools.partial(d.get, "k")
    y = x.sin()
    print("", end="")
    return y * m(2)


@pytest.mark.parametrize("fn, make", [
    (dict_method_across_break, lambda i: {"k": i}),
    (object_method_across_break, Scale),
    (partial_of_dict_method, lambda i: {"k": i}),
], ids=["dict", "object", "partial"])
def test_a_method_taken_before_a_break_is_this_calls(fn, make):
    agspeed.reset()
    fast = agspeed.optimize(fn, backend="eager")
    x = torch.randn(3)
    for i in range(5):
        torch.testing.assert_close(fast(x, make(i)), fn(x, make(i)))


def test_the_bound_method_is_rebuilt_not_recaptured():
    agspeed.reset()
    fast = agspeed.optimize(dict_method_across_break, backend="eager")
    x = torch.randn(3)
    for i in range(6):
        torch.testing.assert_close(fast(x, {"k": i}), x.sin() * i)
    assert len(entries(dict_method_across_break)) == 1
    report = agspeed.explain(dict_method_across_break, x, {"k": 1})
    assert report.graph_count == 2


_VAR = contextvars.ContextVar("test_resume_methods_var", default=1.0)


def set_var_then_use(x):
    y = x.sin()
    token = _VAR.set(2.0)       # a builtin method: runs eager at a break
    y = y * 3
    _VAR.reset(token)
    return y + 1


def test_a_builtin_method_the_capture_cannot_follow_breaks_at_its_call_and_resumes():
    agspeed.reset()
    fast = agspeed.optimize(set_var_then_use, backend="eager")
    for _ in range(6):
        x = torch.randn(4)
        torch.testing.assert_close(fast(x), x.sin() * 3 + 1)
        assert _VAR.get() == 1.0
    report = agspeed.explain(set_var_then_use, torch.randn(4))
    assert report.graph_count >= 2      # resumed (it used to run the frame eager)
    assert "ContextVar.set, a builtin method" in str(report)
    assert agspeed.recompiles() == []
