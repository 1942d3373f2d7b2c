"""Iterators the capture made, and map/filter/reduce/partial calls through the interpreter
(csrc/interp_iter.c), with the recording builder of test_interp.  Torch-free."""

import functools
import sys

from _calls_recorder import CallsRecorder
from agspeed.protocol import Reason
from test_interp import T, capture, tlib


def steps(x):
    it = iter([x, 1, 2, 3])
    first = next(it)
    for v in it:          # continues where next() left it
        if v == 2:
            break
    rest = list(it)
    return first, rest, next(it, "done")


def test_next_for_and_list_share_one_iterators_position():
    out, b = capture(steps, CallsRecorder(), x=T())
    assert out["status"] == "graph", out
    first, rest, tail = out["result"]
    assert repr(first) == "x" and rest == [3] and tail == "done"


def double(t):
    return t * 2


def per_element(x):
    ys = list(map(double, [x, x]))
    odd = list(filter(lambda n: n % 2, range(5)))
    kept = list(filter(None, [0, "a", None]))
    prod = functools.reduce(lambda a, b: a * b, [x, 3, 4])
    p = functools.partial(tlib.relu, x, inplace=False)
    return ys, odd, kept, prod, p(scale=2)


def test_map_filter_reduce_and_partial_call_through_the_interpreter():
    out, b = capture(per_element, CallsRecorder(allowed=(tlib.relu,)), x=T())
    assert out["status"] == "graph", out
    ys, odd, kept, prod, relu = out["result"]
    assert len(ys) == 2 and odd == [1, 3] and len(kept) == 1
    names = [op[0] for op in b.ops]
    assert names == ["mul", "mul", "mul", "mul", "relu"]   # double inlined twice
    assert b.ops[-1][2] == {"inplace": False, "scale": 2}


def filters_on_tensor_truth(x):
    return list(filter(None, [x]))


def test_filter_on_a_tensors_truth_breaks_as_data_dependent():
    out, _ = capture(filters_on_tensor_truth, CallsRecorder(), x=T())
    assert out["status"] == "break" and out["reason"] == Reason.DATA_DEPENDENT


def test_owned_iterators_leak_no_references():
    x = T()
    b = CallsRecorder(allowed=(tlib.relu,))
    capture(steps, b, x=x)
    capture(per_element, b, x=x)
    b.ops.clear()
    b.assumptions.clear()
    b.known.clear()
    before = [sys.getrefcount(o) for o in (x, double, tlib.relu)]
    for _ in range(30):
        b.ops.clear()
        b.assumptions.clear()
        b.known.clear()
        capture(steps, b, x=x)
        capture(per_element, b, x=x)
    b.assumptions.clear()
    b.known.clear()
    assert [sys.getrefcount(o) for o in (x, double, tlib.relu)] == before
