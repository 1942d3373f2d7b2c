"""What a guard checks of one value: one class per check kind.

The kinds are ``agspeed.protocol.Check``, the rows of csrc/protocol.h's AGS_CHECK_LIST.
The C program checks each with its row in guards/check.c (a fast check, a rule for the
structure memo, what it accepts as expectation).  Here each kind is one class saying, for
the same kind:

* ``compile``: what the C program receives for an expectation, the ``(a, b)`` of
  ``GuardProgram._set_program``;
* ``passes``: whether a value passes, read in Python (for logs and tests; the tests keep
  it in agreement with C);
* ``shown`` and ``got``: a failure explained, the expectation and the value in words;
* ``covers``: whether the check passes for every value another guard's check on the same
  source lets through (``Guard.covers``).

An assumption of the capture becomes a check through ``check_for``: absent, equal, of a
length, or identical, in that order of preference.  ``KINDS`` maps every ``Check`` to its
class's instance; a kind without a class fails at import.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, NamedTuple

from agspeed._sources import MISSING
from agspeed.protocol import Check

__all__ = ["AbsentCheck", "CheckKind", "DynIntCheck", "DynTensorCheck", "EqCheck", "IdCheck",
           "KINDS", "LenCheck", "Symbols", "TensorCheck", "check_for", "holder", "tensor_spec"]


class Symbols(NamedTuple):
    """How a dynamic program numbers its symbols and stride expressions (for
    ``compile``): ``index`` maps a symbol to its slot, ``exprs`` an expression to its
    index in the program's expression table."""

    index: dict
    exprs: dict


NO_SYMBOLS = Symbols({}, {})


def tensor_spec(t: Any) -> tuple:
    """(type, dtype, device, shape, stride, requires_grad): what a tensor check expects."""
    return (type(t), t.dtype, t.device, tuple(t.shape), t.stride(), t.requires_grad)


def holder(value: Any) -> Callable[[], Any]:
    """How a guard keeps an object it checks by identity: weakly where it can.

    An entry lives in its code object's co_extra, which the cyclic GC cannot see, so a
    strong reference to, say, a user module whose functions lead back to that code
    object would never be freed.  A dead weak reference fails the guard.
    """
    try:
        return weakref.ref(value)
    except TypeError:  # builtins, ints: cannot lead back to user code
        return lambda: value


def _plain(value: Any) -> str:
    return repr(value) if isinstance(value, (int, float, str, bool, type(None))) \
        else type(value).__name__


class CheckKind:
    """One check kind: subclasses set ``kind`` (a ``Check``) and ``word`` (how guard
    lines name it)."""

    kind: Check
    word: str
    #: a recurring graph break may drop this check where another capture expected a
    #: different value (``Guard.widened``): plain values only
    widenable = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind!r}>"

    def takes(self, builder: Any, value: Any) -> bool:
        """Whether an assumed ``value`` is guarded by this kind (``check_for``)."""
        return False

    def expect(self, value: Any) -> Any:
        """The expectation that ``value`` passes."""
        raise NotImplementedError

    def compile(self, expected: Any, symbols: Symbols) -> tuple:
        """``(a, b)`` for the C program (guards/check.c says what each kind takes)."""
        raise NotImplementedError

    def passes(self, expected: Any, value: Any, sym: Any = None,
               bound: dict | None = None) -> bool:
        raise NotImplementedError

    def shown(self, expected: Any, sym: Any = None) -> str:
        """The expectation, readable."""
        raise NotImplementedError

    def got(self, value: Any) -> str:
        """The value found, readable next to ``shown``."""
        return "nothing" if value is MISSING else _plain(value)

    def covers(self, expected: Any, other_kind: Check, other_expected: Any, sym: Any,
               bound: dict) -> bool:
        """Whether this check passes for every value ``(other_kind, other_expected)``
        passes for; ``bound`` collects the symbols a dynamic check binds."""
        return (other_kind, other_expected) == (self.kind, expected)


class TensorCheck(CheckKind):
    """A tensor's exact type, dtype, device, shape, strides and requires_grad."""

    kind, word = Check.TENSOR, "tensor"

    def expect(self, value: Any) -> tuple:
        return tensor_spec(value)

    def compile(self, expected: tuple, symbols: Symbols) -> tuple:
        return expected[0], expected[1:]

    def passes(self, expected, value, sym=None, bound=None) -> bool:
        return type(value) is expected[0] and tensor_spec(value) == expected

    def shown(self, expected, sym=None) -> str:
        kind, dtype, device, shape, stride, grad = expected
        return (f"{kind.__name__}(dtype={dtype}, device={device}, shape={list(shape)}, "
                f"stride={list(stride)}, requires_grad={grad})")

    def got(self, value: Any) -> str:
        if value is not MISSING and hasattr(value, "stride"):
            return self.shown(tensor_spec(value))
        return super().got(value)


def _snapshot(value: Any) -> Any:
    """``value`` with every list and set in it copied (tuples of plain values stay as they
    are)."""
    if type(value) is list:
        return [_snapshot(v) for v in value]
    if type(value) is set:
        return set(value)
    if type(value) is tuple and any(type(v) in (list, tuple) for v in value):
        return tuple(_snapshot(v) for v in value)
    return value


def _by_value(builder: Any, value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is compared by equality: what the builder holds static, and the
    parts of an index a subscript takes whole (``...``, slices of plain values), in tuples
    and lists, and sets of static values (a set is read whole: ``len(s)``, ``k in s``).
    A list that holds itself (or nests past any data's depth) is not."""
    kind = type(value)
    if kind is type(Ellipsis):
        return True
    if depth > 64:
        return False
    if kind is slice:
        return all(_by_value(builder, v, depth + 1)
                   for v in (value.start, value.stop, value.step))
    if kind in (tuple, list):
        return all(_by_value(builder, v, depth + 1) for v in value)
    if kind in (set, frozenset):
        return all(builder._is_static(v) for v in value)
    return builder._is_static(value)


class EqCheck(CheckKind):
    """A plain value's exact type and equality."""

    kind, word, widenable = Check.EQ, "==", True

    def takes(self, builder, value) -> bool:
        return _by_value(builder, value)

    def expect(self, value: Any) -> tuple:
        # a list is compared with what it held then, not with itself: the program may
        # change it in place between calls
        return (type(value), _snapshot(value))

    def compile(self, expected: tuple, symbols: Symbols) -> tuple:
        return expected

    def passes(self, expected, value, sym=None, bound=None) -> bool:
        return type(value) is expected[0] and _same_types(value, expected[1]) and \
            value == expected[1]

    def shown(self, expected, sym=None) -> str:
        return repr(expected[1])


def _same_types(value: Any, plain: Any) -> bool:
    """Whether ``value`` has the types of ``plain`` all the way down through tuples and
    lists (as guards/check.c asks before comparing: no element of another type, a
    tensor, is asked to compare itself)."""
    if type(value) is not type(plain):
        return False
    if type(value) in (tuple, list):
        return len(value) == len(plain) and all(map(_same_types, value, plain))
    return True


class LenCheck(CheckKind):
    """A container's exact type and length."""

    kind, word = Check.LEN, "len"

    def takes(self, builder, value) -> bool:
        return isinstance(value, (dict, list, tuple))

    def expect(self, value: Any) -> tuple:
        return (type(value), len(value))

    def compile(self, expected: tuple, symbols: Symbols) -> tuple:
        return expected

    def passes(self, expected, value, sym=None, bound=None) -> bool:
        return type(value) is expected[0] and len(value) == expected[1]

    def shown(self, expected, sym=None) -> str:
        return f"{expected[0].__name__} of length {expected[1]}"

    def got(self, value: Any) -> str:
        if value is not MISSING and isinstance(value, (dict, list, tuple)):
            return f"{type(value).__name__} of length {len(value)}"
        return super().got(value)


class IdCheck(CheckKind):
    """Identity with one object, held weakly where it can be (``holder``)."""

    kind, word = Check.ID, "is"

    def takes(self, builder, value) -> bool:
        return True

    def expect(self, value: Any) -> Callable[[], Any]:
        return holder(value)

    def compile(self, expected: Callable[[], Any], symbols: Symbols) -> tuple:
        weak = isinstance(expected, weakref.ref)
        return (expected if weak else expected()), weak

    def passes(self, expected, value, sym=None, bound=None) -> bool:
        held = expected()
        return held is not None and value is held

    def shown(self, expected, sym=None) -> str:
        held = expected()
        return f"the same {type(held).__name__} (id {id(held):#x})" if held is not None \
            else "an object that no longer exists"

    def got(self, value: Any) -> str:
        if value is MISSING:
            return "nothing"
        return f"a {type(value).__name__} (id {id(value):#x})"

    def covers(self, expected, other_kind, other_expected, sym, bound) -> bool:
        return other_kind == Check.ID and other_expected() is not None and \
            other_expected() is expected()


class AbsentCheck(CheckKind):
    """The attribute or item is not there."""

    kind, word = Check.ABSENT, "absent"

    def takes(self, builder, value) -> bool:
        return value is MISSING

    def expect(self, value: Any) -> None:
        return None

    def compile(self, expected: None, symbols: Symbols) -> tuple:
        return None, None

    def passes(self, expected, value, sym=None, bound=None) -> bool:
        return value is MISSING

    def shown(self, expected, sym=None) -> str:
        return "nothing"


class DynTensorCheck(CheckKind):
    """A tensor check whose sizes may be symbols and whose strides may be expressions of
    them: (type, dtype, device, sizes, strides, requires_grad), as the capture's
    ``SymbolicGuards`` gives them."""

    kind, word = Check.DYNTENSOR, "tensor"

    def compile(self, expected: tuple, symbols: Symbols) -> tuple:
        kind, dtype, device, sizes, strides, grad = expected
        return kind, (dtype, device,
                      tuple(d if isinstance(d, int) else -symbols.index[d] - 1
                            for d in sizes),
                      tuple(d if isinstance(d, int) else -symbols.exprs[d] - 1
                            for d in strides),
                      grad)

    def binds(self, expected: tuple, spec: tuple, sym: Any, bound: dict) -> bool:
        """Whether a tensor with ``spec`` (type, dtype, device, shape, stride, grad)
        passes, binding symbols in ``bound`` as the C check does."""
        kind, dtype, device, sizes, strides, grad = expected
        if (spec[0], spec[1], spec[2], spec[5]) != (kind, dtype, device, grad) or \
                len(spec[3]) != len(sizes) or len(spec[4]) != len(strides):
            return False
        for want, got in zip(sizes, spec[3]):
            if isinstance(want, int):
                if want != got:
                    return False
            elif bound.setdefault(want, got) != got:
                return False
        for want, got in zip(strides, spec[4]):   # a stride of its own first (non-dense)
            if getattr(want, "is_Symbol", False) and bound.setdefault(want, got) != got:
                return False
        for want, got in zip(strides, spec[4]):
            if isinstance(want, int):
                if want != got:
                    return False
            elif not set(want.free_symbols) <= set(bound) or \
                    not _same(sym.substitute(want, bound), got):
                return False
        return True

    def passes(self, expected, value, sym=None, bound=None) -> bool:
        return hasattr(value, "stride") and self.binds(
            expected, tensor_spec(value), sym, bound if bound is not None else {})

    def shown(self, expected, sym=None) -> str:
        kind, dtype, device, sizes, strides, grad = expected
        shown = [sym.readable(d) if sym is not None else str(d) for d in sizes]
        strides_ = [sym.readable(d) if sym is not None else str(d) for d in strides]
        return (f"{kind.__name__}(dtype={dtype}, device={device}, "
                f"shape=[{', '.join(shown)}], stride=[{', '.join(strides_)}], "
                f"requires_grad={grad})")

    def got(self, value: Any) -> str:
        return KINDS[Check.TENSOR].got(value)

    def covers(self, expected, other_kind, other_expected, sym, bound) -> bool:
        # another capture's dynamic check: its symbols are bound as they stand (this
        # check's symbol may stand for one of them, or for a size it fixed)
        if other_kind in (Check.DYNTENSOR, Check.TENSOR):
            return self.binds(expected, other_expected, sym, bound)
        return False


class DynIntCheck(CheckKind):
    """A Python int the capture made dynamic: its exact type, its value bound to a
    symbol (``expected`` is the sympy symbol) that the size guards then read."""

    kind, word = Check.DYNINT, "int"

    def compile(self, expected: Any, symbols: Symbols) -> tuple:
        return int, -symbols.index[expected] - 1

    def passes(self, expected, value, sym=None, bound=None) -> bool:
        if type(value) is not int or not -(1 << 63) <= value < (1 << 63):
            return False
        bound = bound if bound is not None else {}
        return bound.setdefault(expected, value) == value

    def shown(self, expected, sym=None) -> str:
        return f"an int ({sym.readable(expected) if sym is not None else expected})"

    def covers(self, expected, other_kind, other_expected, sym, bound) -> bool:
        if other_kind == Check.DYNINT:   # another capture's symbol, bound as it stands
            return bound.setdefault(expected, other_expected) == other_expected
        if other_kind == Check.EQ and other_expected[0] is int:
            return self.passes(expected, other_expected[1], sym, bound)
        return False


def _same(a: Any, b: Any) -> bool:
    """Whether two sizes, ints or sympy expressions, are equal for every value of their
    symbols."""
    a, b = (int(v) if getattr(v, "is_Integer", False) else v for v in (a, b))
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    import sympy

    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


def _table(*classes: type) -> dict:
    kinds = {cls.kind: cls() for cls in classes}
    missing = [k.name for k in Check if k not in kinds]
    if missing or len(kinds) != len(classes):
        raise ImportError(f"agspeed.guards.checks: no single class for the check kinds "
                          f"{missing or 'listed twice'} (csrc/protocol.h AGS_CHECK_LIST)")
    return kinds


#: The class of each check kind, by ``Check``.
KINDS: dict = _table(TensorCheck, EqCheck, LenCheck, IdCheck, AbsentCheck, DynTensorCheck,
                     DynIntCheck)

# The kinds an assumption may become, in order of preference (``check_for``).
_ASSUMED = tuple(KINDS[k] for k in (Check.ABSENT, Check.EQ, Check.LEN, Check.ID))


def check_for(builder: Any, value: Any) -> tuple:
    """``(kind, expected)``: the check of a value the capture assumed (``builder``, the
    capture's ``GraphBuilder``, says which values are plain)."""
    for check in _ASSUMED:
        if check.takes(builder, value):
            return check.kind, check.expect(value)
    raise AssertionError("IdCheck takes every value")
