"""Graph breaks that resume after side effects (agspeed/_effects.py): what the frame
wrote to the program's objects, the lists it changed and the logging it did before the
break happen before the break instruction runs, as in eager."""

import logging

import pytest

import agspeed
from agspeed import _C

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

from _dynamo_ref import dynamo_graph_count

pytestmark = pytest.mark.torch

EVENTS = []


class _Events(logging.Handler):
    def emit(self, record):
        EVENTS.append(("log", record.getMessage()))


logger = logging.getLogger("agspeed_test_resume_effects")
logger.addHandler(_Events())
logger.setLevel(logging.INFO)
logger.propagate = False


def note(*values):
    """At the break (it prints): writes down what the program's objects hold there."""
    EVENTS.append(("note", getattr(values[0], "tag", None)))
    print("at the break")


class Writes(torch.nn.Module if torch else object):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        self.last = y
        self.tag = "written"
        logger.info("before the %s", "break")
        note(self)
        return self.last.relu() + x


def test_writes_and_logging_before_a_break_happen_before_it():
    torch.manual_seed(0)
    model = Writes()
    make = lambda: (torch.randn(2, 4, requires_grad=True),)  # noqa: E731
    report = agspeed.explain(model, *make())
    assert report.graph_count == 2 <= dynamo_graph_count(model, *make())
    assert any(r.startswith("resume_in_forward") for r in report.resume_functions)
    fast = agspeed.optimize(model)
    for call in range(2):
        x = make()[0]
        ref_x = x.detach().clone().requires_grad_()
        EVENTS.clear()
        model.tag = model.last = None
        if call:
            _C.reset_counters()
        out = fast(x)
        if call:
            assert _C.counters()["cache_misses"] == 0, _C.counters()
        seen, last = list(EVENTS), model.last
        EVENTS.clear()
        model.tag = model.last = None
        ref = model(ref_x)
        assert seen == EVENTS == [("log", "before the break"), ("note", "written")]
        assert type(out) is type(ref)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(last, model.last)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x.grad, ref_x.grad)


def appends(x, acc):
    y = x * 2
    acc.append(y)
    note(acc)
    acc.append(y + 1)
    return y.sin()


def test_a_list_changed_before_a_break_is_the_programs_at_it():
    report = agspeed.explain(appends, torch.randn(3), [])
    assert report.graph_count == 2 <= dynamo_graph_count(appends, torch.randn(3), [])
    fast = agspeed.optimize(appends)
    for _ in range(2):
        x, acc, ref_acc = torch.randn(3, requires_grad=True), [], []
        out, ref = fast(x, acc), appends(x, ref_acc)
        torch.testing.assert_close(out, ref)
        assert len(acc) == len(ref_acc) == 2
        for a, r in zip(acc, ref_acc):
            torch.testing.assert_close(a, r)
