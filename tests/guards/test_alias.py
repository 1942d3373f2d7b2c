"""Identity among a guard's values (guards/alias.c): aliases must reach one object, the
distinct loads different ones, through every path of the check (a few values compared
pairwise, many through an address set, and through the structure memo only the values
read afresh); and captures whose graph depends on two tensors being different objects
are not reused for one tensor passed twice."""

import gc
import sys
import weakref

import pytest

from agspeed import _C
from agspeed._sources import MISSING, resolve_step
from agspeed.protocol import Check, Load

LOCAL, ATTR = Load.LOCAL, Load.ATTR


def program(names, distinct, module_type=None, checks=()):
    """Locals ``names`` (read() returns them), the ones named in ``distinct`` distinct."""
    loads = [(LOCAL, -1, n) for n in names]
    p = _C.GuardProgram()
    p._set_program(loads, list(checks), [], (), resolve_step, MISSING, module_type,
                   list(range(len(names))), 0, None, [names.index(n) for n in distinct])
    return p


@pytest.mark.parametrize("count", [2, 5, 33, 200], ids=lambda n: f"{n} loads")
def test_distinct_loads_pass_apart_and_fail_together(count):
    names = [f"v{i}" for i in range(count)]
    values = [object() for _ in names]
    p = program(names, names)
    frame = dict(zip(names, values))
    assert p(frame, {}, {}) is True
    assert p._program_size()["distinct"] == count
    for i, j in {(0, 1), (count - 1, 0), (count // 2, count - 1)} - {(1, 1)}:
        same = {**frame, names[i]: values[j]}
        assert p(same, {}, {}) is False
        part, index = p.why(same, {}, {})
        assert part == "distinct" and index in (i, j)
    # loads outside the list may repeat
    q = program(names, names[1:])
    assert q({**frame, names[0]: values[1]}, {}, {}) is True


def test_distinct_and_aliases_together():
    a, b = object(), object()
    p = _C.GuardProgram()
    p._set_program([(LOCAL, -1, "x"), (LOCAL, -1, "y"), (LOCAL, -1, "z")], [], [(0, 1)], (),
                   resolve_step, MISSING, None, [0, 2], 0, None, [0, 2])
    assert p({"x": a, "y": a, "z": b}, {}, {}) is True
    assert p.why({"x": a, "y": b, "z": b}, {}, {}) == ("alias", 0)
    assert p.why({"x": a, "y": a, "z": a}, {}, {})[0] == "distinct"


def test_bad_distinct_lists_are_refused():
    p = _C.GuardProgram()
    with pytest.raises(ValueError, match="bad guard distinct"):
        p._set_program([(LOCAL, -1, "x")], [], [], (), resolve_step, MISSING, None, [],
                       0, None, [4])
    with pytest.raises(TypeError, match="distinct"):
        p._set_program([(LOCAL, -1, "x")], [], [], (), resolve_step, MISSING, None, [],
                       0, None, (0,))
    with pytest.raises(RuntimeError, match="not compiled"):
        p({}, {}, {})


@pytest.mark.parametrize("count", [3, 100])
def test_the_distinct_check_keeps_no_reference(count):
    names = [f"v{i}" for i in range(count)]
    values = [object() for _ in names]
    p = program(names, names)
    frame = dict(zip(names, values))
    same = {**frame, names[1]: values[0]}
    for _ in range(3):
        p(frame, {}, {}), p(same, {}, {})
    before = [sys.getrefcount(v) for v in values]
    for _ in range(50):
        assert p(frame, {}, {}) is True
        assert p(same, {}, {}) is False
        assert p.why(same, {}, {})[0] == "distinct"
    assert [sys.getrefcount(v) for v in values] == before


class FakeModule:
    """What the structure memo needs of a module: the three stores and a __getattr__."""

    def __init__(self, **params):
        self.__dict__.update(_parameters=dict(params), _buffers={}, _modules={},
                             _hooks={}, training=True)

    def __getattr__(self, name):
        if name in self.__dict__["_parameters"]:
            return self.__dict__["_parameters"][name]
        raise AttributeError(name)


@pytest.mark.parametrize("fresh", [2, 12], ids=lambda n: f"{n} fresh")
@pytest.mark.parametrize("count", [2, 80], ids=lambda n: f"{n} weights")
def test_through_the_memo_a_fresh_value_is_checked_against_remembered_ones(count, fresh):
    """self.w<i> are remembered while the memo holds; the locals a<j> are read each call.
    A weight passed as a local, or one local passed as another, fails; the weights are
    not compared among themselves again (they cannot have changed without the memo
    seeing it)."""
    weights = {f"w{i}": object() for i in range(count)}
    root = FakeModule(**weights)
    names = [f"a{j}" for j in range(fresh)]
    loads = [(LOCAL, -1, "self")] + [(LOCAL, -1, n) for n in names]
    loads += [(ATTR, 0, name) for name in weights]
    checks = [(0, Check.ID, weakref.ref(root), True)]
    p = _C.GuardProgram()
    p._set_program(loads, checks, [], (), resolve_step, MISSING, FakeModule,
                   list(range(1, len(loads))), 0, None, list(range(1, len(loads))))
    frame = {"self": root, **{n: object() for n in names}}
    for _ in range(3):
        assert p(frame, {}, {}) is True
    memo = p._memo()
    assert memo["valid"] and memo["fast"] >= 2
    last = f"w{count - 1}"
    for name, value in [(names[0], weights["w0"]), (names[-1], frame[names[0]]),
                        (names[1], weights[last]), (names[-1], frame[names[-2]])]:
        assert p.why({**frame, name: value}, {}, {})[0] == "distinct"
        assert p._memo()["valid"]
    assert p(frame, {}, {}) is True
    # a weight replaced by another one in the store: the memo sees it, and the full
    # evaluation compares every pair
    root._parameters["w1"] = weights["w0"]
    assert p.why(frame, {}, {})[0] == "distinct"
    del root
    gc.collect()


# -- captures (torch) ---------------------------------------------------------------------

torch = pytest.importorskip("torch")
agspeed = pytest.importorskip("agspeed")

pytestmark = pytest.mark.torch


def test_a_set_of_two_tensors_is_not_reused_for_one_tensor_twice():
    def f(a, b):
        if len({a, b}) == 2:
            return a + b
        return a * 10

    g = agspeed.optimize(f)
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(g(x, y), f(x, y))
    torch.testing.assert_close(g(x, x), f(x, x))
    torch.testing.assert_close(g(y, x), f(y, x))
    torch.testing.assert_close(g(y, y), f(y, y))


def test_is_between_an_argument_and_a_weight():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            if x is self.w:
                return x * 2
            return x + self.w

    m = M()
    opt = agspeed.optimize(m)
    x = torch.randn(4)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(opt(x), m(x))
        torch.testing.assert_close(opt(m.w), m(m.w))
        torch.testing.assert_close(opt(x), m(x))


def test_the_recompile_reason_names_the_two_sources():
    def f(a, b):
        return a + b if a is not b else a

    g = agspeed.optimize(f)
    x, y = torch.randn(3), torch.randn(3)
    g(x, y)
    guard = [e.guard for e in _C.code_cache(f.__code__)["entries"]
             if e.action == _C.ACTION_CALL][0]
    assert guard.first_failure({"a": x, "b": x}, f.__globals__, {}) == \
        "a is b: the graph was captured for two different tensors"
    assert guard.failures({"a": x, "b": x}, f.__globals__, {}) == \
        ["a is b: the graph was captured for two different tensors"]
    assert any(line.startswith("all different: a, b") for line in guard.lines())
    torch.testing.assert_close(g(x, x), x)
