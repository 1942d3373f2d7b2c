"""How the capture reads classes and calls instances of the program: a classmethod
over a property read from its class, a ``threading.local`` read for the calling thread,
and instances of Python classes with ``__call__`` inlined, each guarded so that a change
to what it read is seen on the next call."""

import dataclasses
import enum
import sys
import threading

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402
from test_dynamic_scalars import entries  # noqa: E402

pytestmark = pytest.mark.torch


class Indices:
    @classmethod
    @property
    def POINT(cls):
        return cls.base + 1

    base = 1


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="a classmethod over a property "
                    "reads as the property only before Python 3.13")
def test_a_classmethod_over_a_property_reads_its_value_from_the_class():
    def pick(x):
        return x[Indices.POINT] * 2

    e = agspeed.explain(pick, torch.randn(4))
    assert e.graph_break_count == 0, e.break_reasons
    opt = agspeed.optimize(pick)
    for _ in range(3):
        x = torch.randn(4)
        assert torch.equal(opt(x), pick(x))
    assert len(entries(pick)) == 1   # its guard reads the class's dict, not the value


SETTINGS = threading.local()


def scaled_per_thread(x):
    return x * SETTINGS.scale


def test_a_threading_local_is_read_for_the_thread_that_calls():
    SETTINGS.scale = 2.0
    e = agspeed.explain(scaled_per_thread, torch.randn(3))
    assert e.graph_break_count == 0, e.break_reasons
    fast = agspeed.optimize(scaled_per_thread, backend="eager")
    results = {}

    def work(scale):
        SETTINGS.scale = scale
        for _ in range(3):
            x = torch.randn(3)
            results.setdefault(scale, []).append(torch.equal(fast(x), x * scale))

    threads = [threading.Thread(target=work, args=(s,)) for s in (3.0, 5.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    work(2.0)
    assert results == {s: [True] * 3 for s in (2.0, 3.0, 5.0)}
    assert len(entries(scaled_per_thread)) <= 3   # one per value, none per call


class Scaler:
    def __init__(self, s):
        self.s = s

    def __call__(self, x, *, bias=0.0):
        return x * self.s + bias


@dataclasses.dataclass
class Affine:   # compared by value: not hashable
    w: object

    def __call__(self, x):
        return x @ self.w


SCALER = Scaler(3.0)


def calls_instances(x, affine):
    return SCALER(x, bias=1.0) + affine(x).sum() + Scaler(2.0)(x)


def test_instances_with_a_python_call_are_inlined_and_guarded_by_their_class():
    e = agspeed.explain(calls_instances, torch.randn(2, 4), Affine(torch.randn(4, 4)))
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    fast = agspeed.optimize(calls_instances, backend="eager")
    affine = Affine(torch.randn(4, 4, requires_grad=True))
    for _ in range(2):
        x = torch.randn(2, 4, requires_grad=True)
        got, want = fast(x, affine), calls_instances(x, affine)
        torch.testing.assert_close(got, want)
        grads = [torch.autograd.grad(r.sum(), (x, affine.w)) for r in (got, want)]
        for g, w in zip(*grads):
            torch.testing.assert_close(g, w)
    assert len(entries(calls_instances)) == 1
    original = Scaler.__call__
    try:
        Scaler.__call__ = lambda self, x, bias=0.0: x - self.s + bias   # the class changed
        x = torch.randn(2, 4)
        torch.testing.assert_close(fast(x, affine), calls_instances(x, affine))
    finally:
        Scaler.__call__ = original
    SCALER.s = 5.0
    try:
        torch.testing.assert_close(fast(x, affine), calls_instances(x, affine))
    finally:
        SCALER.s = 3.0


class Mode(str, enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def picks_mode(x, name):
    mode = Mode(name)   # the member of a plain value: folded, guarded by the value
    return x * (2 if mode is Mode.EVAL else 3) * Level(2)


def test_an_enum_class_called_with_a_value_gives_its_member():
    e = agspeed.explain(picks_mode, torch.randn(2), "eval")
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    fast = agspeed.optimize(picks_mode, backend="eager")
    for name in ("eval", "train", "eval"):
        x = torch.randn(2)
        torch.testing.assert_close(fast(x, name), picks_mode(x, name))
    with pytest.raises(ValueError, match="'other' is not a valid Mode"):
        fast(torch.randn(2), "other")
