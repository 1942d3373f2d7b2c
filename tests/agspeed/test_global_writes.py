"""``global name; name = value`` (STORE_GLOBAL), in the optimized function or in one it calls
from another module: the write is a side effect on the module, replayed after the graph
in program order, and reads later in the same capture see what was stored, so the module
ends each call as eager leaves it and the result is eager's."""

import gc
import sys

import pytest

import agspeed
import _global_writer as writer

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch

total = None
steps = 0


def accumulates(x):
    global total, steps
    y = x.cos()
    total = y if steps == 0 else total + y     # read back what this call stored
    steps = steps + 1
    return total * 2


def test_a_frames_global_writes_are_replayed_and_read_back():
    global total, steps
    results = {}
    for runtime in ("eager", "agspeed"):
        total, steps = None, 0
        torch.manual_seed(0)
        fn = accumulates if runtime == "eager" else \
            agspeed.optimize(accumulates, backend="eager", fullgraph=True)
        outs = [fn(torch.randn(3)) for _ in range(3)]
        results[runtime] = (outs, total, steps)
    (e_outs, e_total, e_steps), (a_outs, a_total, a_steps) = results["eager"], \
        results["agspeed"]
    assert a_steps == e_steps == 3
    torch.testing.assert_close(a_total, e_total)
    for a, e in zip(a_outs, e_outs):
        torch.testing.assert_close(a, e)


def calls_another_module(x):
    return writer.count_and_double(x) - 1


def test_a_global_write_in_a_function_of_another_module():
    writer.calls, writer.last = 0, None
    fast = agspeed.optimize(calls_another_module, backend="eager", fullgraph=True)
    xs = [torch.randn(4) for _ in range(3)]
    outs = [fast(x) for x in xs]
    assert writer.calls == 3
    torch.testing.assert_close(writer.last, xs[-1] * 2)
    assert writer.last is not xs[-1]
    for i, (x, out) in enumerate(zip(xs, outs), start=1):
        torch.testing.assert_close(out, x * 2 + i - 1)


def writes_then_breaks(x):
    global steps
    steps = steps + 10
    print("a break after the write")     # noqa: T201 - runs eager, after the graph
    return x + steps


def test_a_write_before_a_break_happens_once(capsys):
    global steps
    steps = 0
    fast = agspeed.optimize(writes_then_breaks, backend="eager")
    x = torch.randn(2)
    out = fast(x)
    assert steps == 10
    torch.testing.assert_close(out, x + 10)
    out = fast(x)
    assert steps == 20
    torch.testing.assert_close(out, x + 20)


def test_the_written_module_and_values_are_not_kept_alive():
    writer.calls, writer.last = 0, None
    fast = agspeed.optimize(calls_another_module, backend="eager")
    fast(torch.randn(4))
    fast(torch.randn(4))
    count = sys.getrefcount(writer)
    fast(torch.randn(4))
    assert sys.getrefcount(writer) == count
    last = writer.last
    before = sys.getrefcount(last)
    writer.last = None
    gc.collect()
    assert sys.getrefcount(last) == before - 1   # only this test holds it now
