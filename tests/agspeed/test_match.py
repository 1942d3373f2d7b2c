"""The match statement in captured code (csrc/interp_match.c): class patterns on
tensors, batch objects and builtin classes, mapping patterns on the program's dicts and
sequence patterns on shapes are one graph; each entry is guarded on what its patterns
read, so a subject that takes another case is captured again, with eager's results."""

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402
from test_python_calls import assert_same  # noqa: E402

pytestmark = pytest.mark.torch


@dataclasses.dataclass
class Batch:
    x: "torch.Tensor"
    kind: str = "train"


def by_subject(t, subject):
    match subject:
        case Batch(x, kind="train"):
            return t + x
        case Batch(x=x):
            return t - x
        case torch.Tensor(shape=(n, d)) if n > 1:
            return t * subject.sum(0)
        case torch.Tensor():
            return t * 2
        case int(k) | float(k):
            return t * k
        case (a, b):
            return t * a + b
        case {"scale": s, "shift": b}:
            return t * s + b
        case _:
            return t


def test_each_subject_takes_eagers_case_in_one_graph():
    fast = agspeed.optimize(by_subject, backend="eager", fullgraph=True)
    subjects = [Batch(torch.randn(3)), Batch(torch.randn(3), "eval"), torch.randn(2, 3),
                torch.randn(1, 3), torch.randn(3), 3, 0.5, (2.0, 1.0),
                {"scale": 2.0, "shift": torch.randn(3)}, {"scale": 2.0}, "other", None]
    for _ in range(2):   # the second round from the cache
        for subject in subjects:
            t = torch.randn(3, requires_grad=True)
            assert_same(fast(t, subject), by_subject(t, subject))


def test_a_dict_of_the_program_changed_between_calls_takes_its_new_case():
    cfg = {"scale": 2.0, "shift": 1.0}

    def fn(t):
        match cfg:
            case {"scale": s, "shift": b}:
                return t * s + b
            case {"scale": s}:
                return t * s
        return t

    fast = agspeed.optimize(fn, backend="eager", fullgraph=True)
    t = torch.randn(3)
    for change in (None, lambda: cfg.pop("shift"), lambda: cfg.update(scale=3.0),
                   lambda: cfg.clear(), lambda: cfg.update(scale=1.0, shift=2.0)):
        if change is not None:
            change()
        torch.testing.assert_close(fast(t), fn(t))


def test_a_class_pattern_python_rejects_raises_eagers_error():
    class NoArgs:
        pass

    def fn(t, p):
        match p:
            case NoArgs(1):
                return t
        return t * 2

    fast = agspeed.optimize(fn, backend="eager")
    with pytest.raises(TypeError, match="accepts 0 positional sub-patterns"):
        fast(torch.randn(2), NoArgs())
