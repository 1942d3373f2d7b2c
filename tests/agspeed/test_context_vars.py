"""contextvars.ContextVar.get() inside captured code: a plain value is guarded whole; an
object of the program the variable holds (a dict collecting a model's hidden states, as
transformers' output capturing sets one) is reached through the variable like an
attribute's value: its reads guarded, and what the frame appends written back to the
object the variable holds on that call."""

import contextvars

import pytest

import agspeed

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch

COLLECTOR = contextvars.ContextVar("test_context_vars_collector", default=None)


def layer(x):
    y = x.sin()
    collected = COLLECTOR.get()
    if collected is not None and "hidden" in collected:
        collected["hidden"].append(y * 2)
    return y


def _run(fn, x, collected):
    token = COLLECTOR.set(collected)
    try:
        return fn(x)
    finally:
        COLLECTOR.reset(token)


@pytest.mark.parametrize("make", [lambda: {"hidden": []}, dict, lambda: None],
                         ids=["collecting", "empty", "unset"])
def test_a_dict_the_variable_holds_is_this_calls(make):
    agspeed.reset()
    fast = agspeed.optimize(layer, backend="eager")
    for _ in range(3):
        x = torch.randn(3)
        got_into, want_into = make(), make()
        torch.testing.assert_close(_run(fast, x, got_into), _run(layer, x, want_into))
        if want_into is None:
            assert got_into is None
            continue
        assert got_into.keys() == want_into.keys()
        for key in want_into:
            assert len(got_into[key]) == len(want_into[key])
            for a, b in zip(got_into[key], want_into[key]):
                assert type(a) is torch.Tensor      # (not a graph node)
                torch.testing.assert_close(a, b)
    token = COLLECTOR.set(make())
    try:
        report = agspeed.explain(layer, torch.randn(3))
    finally:
        COLLECTOR.reset(token)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons


def test_the_guard_follows_what_the_variable_holds():
    agspeed.reset()
    fast = agspeed.optimize(layer, backend="eager")
    x = torch.randn(3)
    for collected in ({"hidden": []}, {}, None, {"hidden": []}):
        want = {"hidden": []} if collected == {"hidden": []} else collected
        torch.testing.assert_close(_run(fast, x, collected), _run(layer, x, want))
        if collected:
            assert len(collected["hidden"]) == 1
