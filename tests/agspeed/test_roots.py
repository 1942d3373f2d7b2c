"""What optimize() is handed is captured even when its code is torch's (agspeed/_roots.py):
nn.Sequential and torch.nn's other modules as the root, their results and gradients equal
to eager's, no more graphs than Dynamo makes; distributed wrappers are not roots; the first
call that captures nothing says so once in the log."""

import logging

import pytest

import agspeed
from _dynamo_ref import dynamo_graph_count
from agspeed import _C, _roots

try:
    import torch
    from torch import nn
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = None

pytestmark = pytest.mark.torch


def _models():
    torch.manual_seed(0)
    return {
        "sequential": (nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)),
                       lambda: (torch.randn(3, 8),)),
        "linear": (nn.Linear(8, 4), lambda: (torch.randn(3, 8),)),
        "nested": (nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.GELU()), nn.LayerNorm(8)),
                   lambda: (torch.randn(3, 8),)),
        "conv": (nn.Sequential(nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4), nn.ReLU()),
                 lambda: (torch.randn(2, 3, 9),)),
        "transformer_encoder": (
            nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                             batch_first=True), 2),
            lambda: (torch.randn(2, 5, 8),)),
    }


@pytest.mark.parametrize("name", ["sequential", "linear", "nested", "conv",
                                  "transformer_encoder"])
def test_torch_module_root_is_captured_and_matches_eager(name):
    model, make = _models()[name]
    report = agspeed.explain(model, *make())
    assert report.graph_count >= 1 and report.graph_break_count == 0
    assert report.graph_count <= dynamo_graph_count(model, *make())

    fast = agspeed.optimize(model, backend="eager")
    for _ in range(2):  # a capture, then a cache hit
        inputs = make()
        expected = model(*inputs)
        got = fast(*inputs)
        torch.testing.assert_close(got, expected)
        grads = torch.autograd.grad(expected.sum(), list(model.parameters()))
        got_grads = torch.autograd.grad(got.sum(), list(model.parameters()))
        for a, b in zip(got_grads, grads):
            torch.testing.assert_close(a, b)
    assert _C.counters()["graph_calls"] >= 2


def test_a_skip_the_code_already_carries_is_lifted():
    model = nn.Sequential(nn.Linear(4, 4))
    code = type(model).forward.__code__
    _C.mark_skip(code)
    assert _C.code_cache(code)["skip"]
    report = agspeed.explain(model, torch.randn(2, 4))
    assert report.graph_count == 1
    assert not _C.code_cache(code)["skip"]


class PrintsThenRunsAChild(nn.Module if nn is not None else object):
    def __init__(self):
        super().__init__()
        self.child = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def forward(self, x):
        print("runs eager")
        return self.child(x) + 1


def test_a_roots_torch_code_reached_outside_its_root_call_runs_untouched(capsys):
    agspeed.optimize(nn.Sequential(nn.Linear(4, 4)), backend="eager")  # registers the code
    code = nn.Sequential.forward.__code__
    assert _roots.is_root(code)
    model = PrintsThenRunsAChild()
    fast = agspeed.optimize(model, backend="eager")
    for _ in range(2):
        x = torch.randn(2, 4)
        torch.testing.assert_close(fast(x), model(x))
    # the child's Sequential.forward ran from an eager frame: torch's code, not captured,
    # and nothing remembered for it (its next root call must still capture)
    assert not [r for r in agspeed._runtime.frame_records() if r.code() is code]
    assert not _C.code_cache(code)["skip"] and not _C.code_cache(code)["entries"]
    report = agspeed.explain(model.child, torch.randn(2, 4))
    assert report.graph_count == 1


def test_distributed_wrappers_are_not_roots():
    inner = nn.Linear(4, 4)
    assert _roots.root_code(nn.DataParallel(inner), True) is None
    assert _roots.root_code(nn.Sequential(inner), True) is not None
    assert _roots.root_code(agspeed.optimize, False) is None  # agspeed's own code


def _collect(level):
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            if record.levelno >= level:
                messages.append(record.getMessage())

    return messages, Collect()


def test_nothing_captured_is_said_once_with_why():
    def talks(x):
        try:    # under try: the frame cannot resume after the break
            print("a print breaks the graph")
        except OSError:
            pass
        return x + 1

    messages, handler = _collect(logging.WARNING)
    root = logging.getLogger("agspeed")
    root.addHandler(handler)
    try:
        fast = agspeed.optimize(talks, backend="eager")
        for _ in range(3):
            torch.testing.assert_close(fast(torch.ones(2)), torch.ones(2) + 1)
    finally:
        root.removeHandler(handler)
    assert len(messages) == 1, messages
    assert "nothing was captured" in messages[0] and "talks" in messages[0]
    assert "print" in messages[0]  # why


def _grows(x, n):
    return x + 1 if n else x   # no tensor work for n == 0


def test_a_wrapper_served_by_an_earlier_eager_decision_says_so():
    # the code's first call through a second wrapper reaches no runtime: the decision
    # cached by the first wrapper's call (no tensor work) runs it eager, and the report
    # says that, not that the code is skipped
    agspeed.optimize(_grows, backend="eager")(torch.ones(2), 0)
    messages, handler = _collect(logging.WARNING)
    root = logging.getLogger("agspeed")
    root.addHandler(handler)
    try:
        fast = agspeed.optimize(_grows, backend="eager")
        torch.testing.assert_close(fast(torch.ones(2), 0), torch.ones(2))
    finally:
        root.removeHandler(handler)
    assert len(messages) == 1 and "decision made earlier" in messages[0], messages


def test_a_captured_first_call_says_nothing():
    messages, handler = _collect(logging.INFO)
    root = logging.getLogger("agspeed")
    root.addHandler(handler)
    try:
        fast = agspeed.optimize(nn.Sequential(nn.Linear(4, 4)), backend="eager")
        fast(torch.randn(2, 4))
        fast(torch.randn(2, 4))
    finally:
        root.removeHandler(handler)
    assert not [m for m in messages if "first call" in m]


def test_a_first_call_that_raises_reports_nothing_and_the_watch_steps_aside():
    messages, handler = _collect(logging.INFO)
    root = logging.getLogger("agspeed")
    root.addHandler(handler)
    calls = []

    def plain(x):
        calls.append(1)
        return x * 2

    try:
        fast = agspeed.optimize(plain, backend="eager")
        with pytest.raises(TypeError):
            fast()
        assert fast.__agspeed_fn__ is plain
        torch.testing.assert_close(fast(torch.ones(2)), torch.ones(2) * 2)
    finally:
        root.removeHandler(handler)
    assert not [m for m in messages if "first call" in m]
