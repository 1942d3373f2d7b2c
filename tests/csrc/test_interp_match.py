"""The match statement (csrc/interp_match.c, agspeed/_match.py), followed with the
recording builder of test_interp on every version's bytecode: class patterns (with
``__match_args__``, keywords, builtin classes matching themselves), mapping and sequence
patterns, guards, or-patterns and star patterns; a class pattern CPython rejects stops
the capture (the frame then raises eagerly).  Torch-free."""

import dataclasses

from _calls_recorder import CallsRecorder
from agspeed import _match
from test_interp import T, capture


class MatchRecorder(CallsRecorder):
    FOLDS = CallsRecorder.FOLDS + (hasattr, type)
    match_len = staticmethod(_match.get_len)
    match_keys = staticmethod(_match.match_keys)
    match_class = staticmethod(_match.match_class)


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Plain:
    def __init__(self, k):
        self.k = k


def by_class(t, subject):
    match subject:
        case Point(0, y=yy):
            return t * yy
        case Point(xx, yy) if xx > yy:
            return t + xx
        case Plain(k=3):
            return t - 3
        case int(n) | float(n):
            return t * n
        case str():
            return t
        case _:
            return None


def test_class_patterns():
    for subject, op, expected in ((Point(0, 5), "mul", 5), (Point(4, 1), "add", 4),
                                  (Plain(3), "sub", 3), (7, "mul", 7), (2.5, "mul", 2.5)):
        out, b = capture(by_class, MatchRecorder(), t=T(), subject=subject)
        assert out["status"] == "graph", (subject, out)
        assert [op_[0] for op_ in b.ops] == [op], subject
        assert b.ops[0][1][1] == expected
    for subject in ("s", Point(1, 2), Plain(4), None):
        out, b = capture(by_class, MatchRecorder(), t=T(), subject=subject)
        assert out["status"] in ("graph", "no_graph"), (subject, out)
        assert b.ops == []


def by_shape(t, cfg, dims):
    match dims:
        case (a, b):
            t = t * (a + b)
        case [a, *rest]:
            t = t * len(rest)
    match cfg:
        case {"act": "relu", "scale": s}:
            return t * s
        case {"act": act, **others}:
            return t + len(others)
        case {}:
            return t


def test_mapping_and_sequence_patterns():
    out, b = capture(by_shape, MatchRecorder(), t=T(), cfg={"act": "relu", "scale": 4},
                     dims=(2, 3))
    assert out["status"] == "graph", out
    assert [(o[0], o[1][1]) for o in b.ops] == [("mul", 5), ("mul", 4)]
    out, b = capture(by_shape, MatchRecorder(), t=T(), cfg={}, dims=[1, 2, 3, 4])
    assert out["status"] == "graph", out
    assert [(o[0], o[1][1]) for o in b.ops] == [("mul", 3)]
    # the keys present and absent are read through the dict's own source
    read = {src for src, _ in out["assumptions"]}
    assert ("local", "cfg") in read or any(s[:2] == ("item", ("local", "cfg"))
                                           for s in read if isinstance(s, tuple))


def test_a_tensor_subject_is_neither_mapping_nor_sequence():
    def fn(t):
        match t:
            case [a, b]:
                return a
            case {"k": v}:
                return v
            case _:
                return t * 2

    out, b = capture(fn, MatchRecorder(), t=T())
    assert out["status"] == "graph", out
    assert [o[0] for o in b.ops] == ["mul"]


def test_a_pattern_cpython_rejects_stops_the_capture():
    def fn(t, p):
        match p:
            case Plain(1):     # Plain has no __match_args__
                return t
        return t * 2

    out, _ = capture(fn, MatchRecorder(), t=T(), p=Plain(1))
    assert out["status"] == "break" and out["code"].co_name == "match_class"


def test_a_builder_without_the_helpers_breaks():
    out, _ = capture(by_class, CallsRecorder(), t=T(), subject=Point(0, 1))
    assert out["status"] == "break" and "match statement" in str(out)


def test_match_class_follows_cpython():
    """The helper alone, against CPython's own match on the same subjects."""
    def real(subject):
        match subject:
            case Point(a, b):
                return (a, b)
            case int(n):
                return (n,)
        return None

    for subject in (Point(1, 2), 5, True, "x", Plain(1)):
        got = _match.match_class(subject, Point, 2, ()) or \
            _match.match_class(subject, int, 1, ())
        assert got == real(subject)
    assert _match.match_keys({"a": 1, "b": 2}, ("b", "a")) == (2, 1)
    assert _match.match_keys({"a": 1}, ("a", "z")) is None
    for bad in ((Point(1, 2), Point, 3, ()), (1, int, 2, ()), (Plain(1), Plain, 1, ()),
                (Point(1, 2), Point, 1, ("x",))):
        try:
            _match.match_class(*bad)
        except TypeError:
            continue
        raise AssertionError(f"{bad} did not raise")
