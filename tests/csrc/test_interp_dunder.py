"""Special methods written in Python, inlined by the interpreter (csrc/interp_dunder.c):
subscripts, `in` / `not in` (through __contains__, else __iter__), len(), iter() and
for loops, and truth (if, not, bool()) of objects whose class defines them in Python,
with the recording builder of test_interp.  Torch-free."""

from _calls_recorder import CallsRecorder
from agspeed.protocol import Reason
from test_interp import T, capture


class Box:
    """A mapping-like class with every special method in Python."""

    def __init__(self, **items):
        self.items = items

    def __getitem__(self, key):
        return self.items[key]

    def __contains__(self, key):
        return key in self.items

    def __len__(self):
        return len(self.items)

    def __bool__(self):
        return len(self.items) > 0


class Gen:
    """Iterable by a generator __iter__; `in` falls back to iterating it."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield i * 10


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def use_box(x, box):
    y = x * box["scale"]
    if "shift" in box and "other" not in box:
        y = y + box["shift"]
    if box:
        y = y * len(box)
    return y, not box, bool(box)


def test_getitem_contains_len_and_truth_are_inlined():
    out, b = capture(use_box, CallsRecorder(), x=T(), box=Box(scale=2, shift=3))
    assert out["status"] == "graph", out
    y, negated, truth = out["result"]
    assert negated is False and truth is True
    assert [op[0] for op in b.ops] == ["mul", "add", "mul"]
    assert [op[1][1] for op in b.ops] == [2, 3, 2]


def test_a_key_absent_from_contains_skips_its_branch():
    out, b = capture(use_box, CallsRecorder(), x=T(), box=Box(scale=5))
    assert out["status"] == "graph", out
    assert [op[0] for op in b.ops] == ["mul", "mul"]
    assert [op[1][1] for op in b.ops] == [5, 1]
    assert out["result"][1:] == (False, True)


def iterate(x, g):
    for k in g:
        x = x + k
    return x, 20 in g, 25 in g, list(iter(g))


def test_for_loop_iter_and_in_through_a_generator_iter():
    out, b = capture(iterate, CallsRecorder(), x=T(), g=Gen(3))
    assert out["status"] == "graph", out
    _, has20, has25, listed = out["result"]
    assert (has20, has25, listed) == (True, False, [0, 10, 20])
    assert [op[1][1] for op in b.ops] == [0, 10, 20]


def truth_by_len(x, s):
    return x * 2 if s else x, bool(s), len(s)


def test_truth_falls_back_to_len():
    for n, ops in ((0, []), (4, ["mul"])):
        out, b = capture(truth_by_len, CallsRecorder(), x=T(), s=Sized(n))
        assert out["status"] == "graph", out
        assert [op[0] for op in b.ops] == ops
        assert out["result"][1:] == (bool(n), n)


class BadBool:
    def __bool__(self):
        return 1


def branch(x, s):
    return x * 2 if s else x


def test_a_bool_that_is_not_a_bool_breaks():
    out, _ = capture(branch, CallsRecorder(), x=T(), s=BadBool())
    assert out["status"] == "break" and out["reason"] == Reason.BAD_CALL


class Counted(list):
    """A list subclass with a Python __iter__: `in` keeps list's own __contains__."""

    def __iter__(self):
        yield "from __iter__"


class Truthy(int):
    """An int subclass with a Python __len__: truth keeps int's own __bool__."""

    def __len__(self):
        return 0


def builtin_slots(x, c, t):
    return "a" in c, "from __iter__" in c, x * 2 if t else x


def test_builtin_slots_are_not_bypassed_by_python_fallbacks():
    out, b = capture(builtin_slots, CallsRecorder(), x=T(), c=Counted(["a"]), t=Truthy(1))
    assert out["status"] == "graph", out
    assert out["result"][:2] == (True, False)
    assert [op[0] for op in b.ops] == ["mul"]


class Version:
    """Rich comparisons in Python; != is object's, `not ==`."""

    def __init__(self, n):
        self.n = n

    def __eq__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self.n == other.n

    def __lt__(self, other):
        return self.n < other.n


def compares(x, a, b):
    flags = (a == b, a != b, a < b, b > a, a == None, a != 3)  # noqa: E711
    return flags, x * 2 if a < b else x


def test_rich_comparisons_follow_cpythons_order():
    out, b = capture(compares, CallsRecorder(), x=T(), a=Version(1), b=Version(2))
    assert out["status"] == "graph", out
    assert out["result"][0] == (False, True, True, True, False, True)
    assert [op[0] for op in b.ops] == ["mul"]


class Base:
    def __eq__(self, other):
        return "base"


class Derived(Base):
    def __eq__(self, other):
        return "derived"


def eq_both_ways(x, a, b):
    return a == b, b == a


def test_a_subclass_reflected_method_goes_first():
    out, _ = capture(eq_both_ways, CallsRecorder(), x=T(), a=Base(), b=Derived())
    assert out["status"] == "graph", out
    assert out["result"] == ("derived", "derived")


class Declining:
    def __lt__(self, other):
        return NotImplemented


def ordered_with_none(x, a):
    return a < None


def test_an_ordering_no_side_answers_breaks():
    out, _ = capture(ordered_with_none, CallsRecorder(), x=T(), a=Declining())
    assert out["status"] == "break" and out["reason"] == Reason.UNSUPPORTED_VALUE


class IntLike(int):
    """A heap type whose == is int's builtin one."""


class Shy:
    def __eq__(self, other):
        return NotImplemented


def eq(x, a, b):
    return a == b


def test_a_builtin_slot_that_might_answer_is_not_guessed():
    out, _ = capture(eq, CallsRecorder(), x=T(), a=IntLike(3), b=Shy())
    assert out["status"] == "break" and out["reason"] == Reason.UNSUPPORTED_VALUE
    out, _ = capture(eq, CallsRecorder(), x=T(), a=None, b=Shy())
    assert out["status"] == "graph" and out["result"] is False
