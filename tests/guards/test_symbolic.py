"""Symbolic sizes in guard programs (guards/symbolic.c), torch-free: the postfix size
expressions evaluate as Python's integers do, bad programs are refused, a DYNTENSOR check
binds symbols and checks strides as expressions of them, the symbolic guards and their
Python fallback decide, and nothing leaks.  Tensors are stood in for by objects with
``dtype``, ``device``, ``shape``, ``stride()`` and ``requires_grad``, which is all a
guard program reads of a tensor."""

import gc
import itertools
import sys
import weakref

import pytest

from agspeed import _C
from test_program import program

from agspeed.protocol import Check, SizeOp

OP = {op.name: int(op) for op in SizeOp}
DYNTENSOR = int(Check.DYNTENSOR)
F32, CPU = object(), "cpu"   # a dtype is compared by identity, a device by ==


class FakeTensor:
    """What a guard program reads of a tensor."""

    def __init__(self, shape, stride=None, dtype=F32, device=CPU, requires_grad=False):
        self.shape = tuple(shape)
        self._stride = tuple(stride) if stride is not None else contiguous(shape)
        self.dtype, self.device, self.requires_grad = dtype, device, requires_grad

    def stride(self):
        return self._stride


def contiguous(shape):
    out, step = [], 1
    for size in reversed(shape):
        out.append(step)
        step *= size
    return tuple(reversed(out))


def sym(k):
    return (OP["SYM"], k)


def const(c):
    return (OP["CONST"], c)


def binary(name, a, b):
    return (*a, *b, OP[name])


# -- evaluation ---------------------------------------------------------------------------

PY = {"ADD": int.__add__, "MUL": int.__mul__, "FLOORDIV": int.__floordiv__,
      "MOD": int.__mod__, "MIN": min, "MAX": max, "EQ": int.__eq__, "NE": int.__ne__,
      "LT": int.__lt__, "LE": int.__le__, "GT": int.__gt__, "GE": int.__ge__,
      "AND": lambda a, b: bool(a and b), "OR": lambda a, b: bool(a or b)}


@pytest.mark.parametrize("name", sorted(PY))
def test_binary_ops_agree_with_python_on_signed_values(name):
    for a, b in itertools.product((-7, -3, -1, 0, 1, 2, 5, 9), repeat=2):
        got = _C.sym_eval(binary(name, sym(0), sym(1)), (a, b))
        if name in ("FLOORDIV", "MOD") and b == 0:
            assert got is None   # no value: the guard fails, never raises
            continue
        assert got == int(PY[name](a, b)), (name, a, b)


def test_unary_ops_and_powers():
    assert _C.sym_eval((*sym(0), OP["NEG"]), (5,)) == -5
    assert _C.sym_eval((*sym(0), OP["NOT"]), (0,)) == 1
    assert _C.sym_eval((*sym(0), OP["NOT"]), (3,)) == 0
    assert _C.sym_eval(binary("POW", sym(0), const(3)), (-2,)) == -8
    assert _C.sym_eval(binary("POW", sym(0), const(0)), (9,)) == 1
    assert _C.sym_eval(binary("POW", sym(0), const(-1)), (2,)) is None


def test_overflow_and_unbound_symbols_have_no_value():
    big = 1 << 62
    assert _C.sym_eval(binary("MUL", sym(0), const(4)), (big,)) is None
    top = (1 << 63) - 1
    assert _C.sym_eval(binary("ADD", sym(0), sym(0)), (top,)) is None
    assert _C.sym_eval((*sym(0), OP["NEG"]), (-top - 1,)) is None
    assert _C.sym_eval(binary("ADD", sym(0), const(-1)), (-top,)) == -top - 1
    assert _C.sym_eval(binary("POW", const(10), const(40)), ()) is None
    assert _C.sym_eval(binary("ADD", sym(0), sym(1)), (3, None)) is None
    assert _C.sym_eval(binary("FLOORDIV", const(-(1 << 63)), const(-1)), ()) is None


def test_malformed_programs_are_refused():
    for bad in [(), (OP["ADD"],), (OP["CONST"],), const(1) + const(2),
                (*sym(3),), (99,), (-1,), (*const(1), OP["NEG"], OP["ADD"])]:
        with pytest.raises(ValueError, match="bad symbolic"):
            _C.sym_eval(bad, (1, 2))
    with pytest.raises(TypeError):
        _C.sym_eval([OP["CONST"], 1], ())
    deep = const(1) * 65 + (OP["ADD"],) * 64
    with pytest.raises(ValueError, match="bad symbolic"):
        _C.sym_eval(deep, ())
    ok = const(1) * 64 + (OP["ADD"],) * 63
    assert _C.sym_eval(ok, ()) == 64


def test_the_op_table_documents_every_op():
    assert [int(op) for op in SizeOp] == list(range(len(SizeOp)))
    assert all(isinstance(op.doc, str) and op.doc for op in SizeOp)
    assert SizeOp.CONST.immediates == 1 and SizeOp.ADD.immediates == 0


# -- dynamic tensor checks ----------------------------------------------------------------

X = ("local", "x")
Y = ("local", "y")


def dyn(source, sizes, strides, grad=False, kind=FakeTensor):
    """A DYNTENSOR check: sizes < 0 name symbols, strides < 0 expressions."""
    return (source, DYNTENSOR, kind, (F32, CPU, tuple(sizes), tuple(strides), grad))


def symbolic(n_syms, exprs=(), guards=(), fallback=None):
    return (n_syms, tuple(exprs), tuple(guards), fallback)


# x: [s0, 16, s1], strides (16*s1, s1, 1); expression 0 = 16*s1, 1 = s1
X_CHECK = dyn(X, (-1, 16, -2), (-1, -2, 1))
X_EXPRS = (binary("MUL", const(16), sym(1)), sym(1))


def check(checks, n_syms=2, exprs=X_EXPRS, guards=(), fallback=None):
    return program([], checks, symbolic=symbolic(n_syms, exprs, guards, fallback))


def run(p, **tensors):
    return p(dict(tensors), {}, {})


def test_a_dynamic_check_serves_every_size_of_its_symbols():
    p = check([X_CHECK])
    for s0, s1 in [(2, 3), (7, 1), (100, 64)]:
        assert run(p, x=FakeTensor((s0, 16, s1))) is True
    assert run(p, x=FakeTensor((4, 15, 3))) is False            # a static size
    assert run(p, x=FakeTensor((4, 16))) is False               # the rank
    assert run(p, x=FakeTensor((4, 16, 3), dtype=object())) is False
    assert run(p, x=FakeTensor((4, 16, 3), device="cuda")) is False
    assert run(p, x=FakeTensor((4, 16, 3), requires_grad=True)) is False
    assert run(p, x=[4, 16, 3]) is False                        # the type
    assert run(p) is False                                      # nothing there


def test_strides_are_checked_as_expressions_of_the_symbols():
    p = check([X_CHECK])
    assert run(p, x=FakeTensor((4, 16, 3), stride=(48, 3, 1))) is True
    assert run(p, x=FakeTensor((4, 16, 3), stride=(3, 12, 1))) is False   # transposed
    assert run(p, x=FakeTensor((4, 16, 3), stride=(96, 3, 1))) is False   # padded rows


def test_a_symbol_shared_by_two_dimensions_makes_them_equal():
    p = check([X_CHECK, dyn(Y, (-1, -2), (-2, 1))])
    assert run(p, x=FakeTensor((5, 16, 3)), y=FakeTensor((5, 3))) is True
    assert run(p, x=FakeTensor((5, 16, 3)), y=FakeTensor((6, 3))) is False
    assert run(p, x=FakeTensor((5, 16, 3)), y=FakeTensor((5, 4))) is False


def test_symbolic_guards_must_hold():
    ge2 = binary("GE", sym(0), const(2))
    lt64 = binary("LT", sym(1), const(64))
    p = check([X_CHECK], exprs=X_EXPRS + (ge2, lt64), guards=(2, 3))
    assert run(p, x=FakeTensor((2, 16, 63))) is True
    assert run(p, x=FakeTensor((1, 16, 3))) is False
    assert run(p, x=FakeTensor((2, 16, 64))) is False


def test_a_guard_on_a_symbol_no_check_bound_fails():
    p = check([X_CHECK], n_syms=3, exprs=X_EXPRS + (binary("GE", sym(2), const(0)),),
              guards=(2,))
    assert run(p, x=FakeTensor((2, 16, 3))) is False


def test_the_fallback_sees_the_symbols_and_decides_last():
    seen = []

    def fallback(values):
        seen.append(values)
        return values[0] % 2 == 0

    ge2 = binary("GE", sym(0), const(2))
    p = check([X_CHECK], exprs=X_EXPRS + (ge2,), guards=(2,), fallback=fallback)
    assert run(p, x=FakeTensor((4, 16, 3))) is True
    assert run(p, x=FakeTensor((5, 16, 3))) is False
    assert run(p, x=FakeTensor((1, 16, 3))) is False   # a postfix guard failed first
    assert seen == [(4, 3), (5, 3)]

    def broken(values):
        raise KeyError("boom")

    p = check([X_CHECK], fallback=broken)
    with pytest.raises(KeyError):
        run(p, x=FakeTensor((4, 16, 3)))


def test_the_fallback_sees_the_float_symbols_values_after_the_symbols():
    # a plain float the capture made a symbol, decided on (momentum != 0): its load's
    # value follows the int symbols' in the fallback's tuple
    seen = []

    def fallback(values):
        seen.append(values)
        return values[2] != 0

    lam = ("local", "lam")
    p = program([lam], [X_CHECK], symbolic=(2, X_EXPRS, (), fallback, (0,)))
    momentum = 0.9 + 0.0125   # (a float made here, to count its references)
    before = sys.getrefcount(momentum)
    for _ in range(50):
        assert p({"x": FakeTensor((4, 16, 3)), "lam": momentum}, {}, {}) is True
    seen.clear()
    assert sys.getrefcount(momentum) == before
    assert p({"x": FakeTensor((4, 16, 3)), "lam": 0.0}, {}, {}) is False
    assert p.why({"x": FakeTensor((4, 16, 3)), "lam": 0.0}, {}, {}) == ("size", 0)
    assert seen[0] == (4, 3, 0.0)
    for bad in ((5,), (-1,), ("0",)):
        with pytest.raises((ValueError, TypeError)):
            program([lam], [X_CHECK], symbolic=(2, X_EXPRS, (), fallback, bad))


def test_why_names_the_failing_size_guard_or_the_fallback():
    ge2 = binary("GE", sym(0), const(2))
    lt64 = binary("LT", sym(1), const(64))
    p = check([X_CHECK], exprs=X_EXPRS + (ge2, lt64), guards=(2, 3),
              fallback=lambda values: values[0] != 7)
    assert p.why({"x": FakeTensor((2, 16, 63))}, {}, {}) is None
    assert p.why({"x": FakeTensor((1, 16, 3))}, {}, {}) == ("size", 0)
    assert p.why({"x": FakeTensor((2, 16, 64))}, {}, {}) == ("size", 1)
    assert p.why({"x": FakeTensor((7, 16, 3))}, {}, {}) == ("size", 2)   # the fallback
    assert p.why({"x": FakeTensor((2, 15, 3))}, {}, {}) == ("check", 0)


def test_bad_symbolic_tables_are_refused():
    with pytest.raises(ValueError, match="symbols"):
        check([], n_syms=65)
    with pytest.raises(ValueError, match="bad symbolic"):
        check([], exprs=((OP["ADD"],),))
    with pytest.raises(ValueError, match="names no expression"):
        check([], guards=(7,))
    with pytest.raises(TypeError, match="fallback"):
        check([], fallback=42)
    with pytest.raises(ValueError, match="bad guard check"):   # symbol 2 of 2
        check([dyn(X, (-3, 16, -2), (-1, -2, 1))])
    with pytest.raises(ValueError, match="bad guard check"):   # expression 9 of 2
        check([dyn(X, (-1, 16, -2), (-10, -2, 1))])
    with pytest.raises(ValueError, match="bad guard check"):   # ranks differ
        check([dyn(X, (-1, 16), (-1, -2, 1))])
    with pytest.raises(ValueError, match="bad guard check"):   # no symbolic table
        program([], [X_CHECK])


def test_the_program_reports_its_symbolic_size():
    size = check([X_CHECK], exprs=X_EXPRS + (binary("GE", sym(0), const(2)),),
                 guards=(2,))._program_size()
    assert size["symbols"] == 2 and size["symbolic_guards"] == 1


def test_dynamic_checks_leak_nothing_and_the_fallback_dies_with_the_program():
    class Verdict:
        def __call__(self, values):
            return True

    verdict = Verdict()
    ref = weakref.ref(verdict)
    p = check([X_CHECK], fallback=verdict)
    del verdict
    x = FakeTensor((4, 16, 3))
    for _ in range(5):
        run(p, x=x)
    before = (sys.getrefcount(x), sys.getrefcount(x.shape), sys.getrefcount(x._stride))
    for _ in range(200):
        assert run(p, x=x) is True
        assert run(p, x=FakeTensor((4, 15, 3))) is False
    assert (sys.getrefcount(x), sys.getrefcount(x.shape), sys.getrefcount(x._stride)) == before
    assert ref() is not None
    del p
    gc.collect()
    assert ref() is None
