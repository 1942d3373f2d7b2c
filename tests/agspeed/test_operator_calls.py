"""operator.itemgetter, attrgetter and methodcaller objects, set algebra reached by name
and str.join over an iterator the capture made: one graph with eager's results
(agspeed/_stdlib.py: the getters are called through inlined equivalents)."""

import operator

import pytest

import agspeed

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

from test_python_calls import assert_same  # noqa: E402

pytestmark = pytest.mark.torch


def getters_and_callers(x):
    items = operator.itemgetter(0, slice(1, 3))(x)
    attrs = operator.attrgetter("shape", "dtype")(x)
    scaled = operator.methodcaller("add", x, alpha=2.0)(x)
    first = operator.itemgetter(1)(x)
    return items, attrs, scaled, first, operator.methodcaller("size", 0)(x)


def frozenset_methods_by_name(x):
    fruit = frozenset({"apple", "banana", "cherry"})
    firms = frozenset({"google", "apple"})
    kinds = [type(getattr(fruit, name)(firms)) is frozenset
             for name in ("union", "difference", "intersection")]
    return x * len(fruit.copy()) if all(kinds) else x


def join_over_a_map(x):
    names = "-".join(map(lambda n: n.upper(), ["a", "b", "c"]))
    return x * len(names), names


@pytest.mark.parametrize("fn", [getters_and_callers, frozenset_methods_by_name,
                                join_over_a_map], ids=lambda f: f.__name__)
def test_one_graph_with_eagers_results(fn):
    x = torch.randn(4, 3)
    report = agspeed.explain(fn, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    fast = agspeed.optimize(fn, backend="eager")
    for _ in range(2):
        x = torch.randn(4, 3)
        assert_same(fast(x), fn(x))


def _caller_of_a_tensor(x):
    return operator.methodcaller("add", x * 2), x + 1


def test_a_methodcaller_holding_a_graph_value_does_not_leave_the_graph():
    fast = agspeed.optimize(_caller_of_a_tensor, backend="eager")
    x = torch.randn(3)
    caller, y = fast(x)
    torch.testing.assert_close(caller(torch.zeros(3)), x * 2)   # a real tensor
    torch.testing.assert_close(y, x + 1)
