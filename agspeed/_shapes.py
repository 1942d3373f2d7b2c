"""Dynamic shapes: which dimensions a capture treats as symbolic, and what it assumed.

A dimension is *static* by default: the graph is captured for its size, and guarded on it,
so each size compiles once and is then found by the signature table.  A dimension becomes
*dynamic* (one graph with a symbolic size serves every size of it) when:

* the user asked: ``agspeed.mark_dynamic(t, dim)`` on the tensor, or
  ``optimize(..., dynamic=True)`` for every dimension of the data inputs (tensors reached
  from the frame's arguments other than through a module: not parameters or buffers);
* or it kept changing: with ``dynamic`` unset (None), a data input's dimension that has
  shown ``config.dynamic_after`` distinct sizes across the captures of one function (in
  one context) is made dynamic at the capture that sees the last of them.

``mark_static`` and ``optimize(..., dynamic=False)`` keep dimensions static; a mark is
the more specific request and wins over the option.  A backend that declares
``supports_dynamic = False`` gets static graphs only.

Sizes 0 and 1 are always static (torch's ShapeEnv specializes them: broadcasting and
contiguity depend on them), so a dynamic entry never serves them and they compile apart.

Mechanics.  A dynamic capture runs its fake tensors under a ``ShapeEnv``: each dynamic
dimension of an input is a fresh symbol (no "duck sizing": equal sizes do not share a
symbol unless the code makes them equal), operations propagate symbolic sizes, and every
decision the capture takes on a size (a branch, a slice bound, two sizes that must match)
is recorded by the ShapeEnv as a guard.  ``SymbolicGuards`` turns those guards, and each
symbol's value range, into postfix programs over the symbols that the C guard program
evaluates (guards/symbolic.c), with a Python fallback for the few expressions the postfix
language cannot say.

Plain ints and floats go the same way: one reached from a local (a position argument, a
counter ``self.steps``, a mixing weight) that has shown ``dynamic_after`` distinct values
becomes a symbol (``DimPolicy.scalars``, ``symbolic_scalar``), a graph input.  The guard
binds an int's symbol with a DYNINT check; a float's is only checked for its type, and a
capture that decided anything on it (``ScalarDecided``) is done again with it constant.
One the code fixes anyway (``range(n)``) is pinned in the history and stays a constant.

Static captures use no ShapeEnv at all (it costs capture time); when a capture finds a
dynamic input only after it started, it is restarted once with one (``NeedsSymbolic``).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable

__all__ = ["mark_dynamic", "mark_static", "DimPolicy", "NeedsSymbolic", "ScalarDecided",
           "SymbolicGuards", "ShapeHistory", "from_locals", "is_data_source",
           "scalar_items", "scalar_parts", "symbolic_scalar", "to_postfix"]

_DYNAMIC_MARK = "_agspeed_dynamic_dims"
_STATIC_MARK = "_agspeed_static_dims"
# torch._dynamo's marks, honoured the same way: code written for torch.compile keeps
# meaning what it says.
_DYNAMO_DYNAMIC = ("_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices")
_DYNAMO_STATIC = ("_dynamo_static_indices",)


class NeedsSymbolic(Exception):
    """A capture without a ShapeEnv reached an input with a dynamic dimension: capture
    again with one (internal; never reaches the user)."""


def _dims_of(t: Any, dim: int | Iterable[int], verb: str) -> set[int]:
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"agspeed.{verb}() takes a tensor, not {type(t).__name__}")
    dims = [dim] if isinstance(dim, int) and not isinstance(dim, bool) else list(dim)
    out = set()
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool):
            raise TypeError(f"agspeed.{verb}(): dimensions are ints, not {type(d).__name__}")
        if not -t.dim() <= d < max(t.dim(), 1):
            raise IndexError(f"agspeed.{verb}(): dimension {d} is out of range for a tensor "
                             f"of {t.dim()} dimensions")
        out.add(d % t.dim() if t.dim() else 0)
    return out


def _marks(t: Any, name: str) -> set[int]:
    try:
        found = object.__getattribute__(t, "__dict__").get(name)
    except AttributeError:
        return set()
    return set(found) if found else set()


def mark_dynamic(t: Any, dim: int | Iterable[int]) -> None:
    """Make dimension ``dim`` (an int or several) of tensor ``t`` dynamic wherever ``t``
    is captured: the graph serves every size of it, with no recompile per size."""
    dims = _dims_of(t, dim, "mark_dynamic")
    setattr(t, _DYNAMIC_MARK, _marks(t, _DYNAMIC_MARK) | dims)
    setattr(t, _STATIC_MARK, _marks(t, _STATIC_MARK) - dims)


def mark_static(t: Any, dim: int | Iterable[int]) -> None:
    """Keep dimension ``dim`` of tensor ``t`` static: never made dynamic, whatever sizes
    it shows (one graph per size)."""
    dims = _dims_of(t, dim, "mark_static")
    setattr(t, _STATIC_MARK, _marks(t, _STATIC_MARK) | dims)
    setattr(t, _DYNAMIC_MARK, _marks(t, _DYNAMIC_MARK) - dims)


def _marked(t: Any, names: tuple) -> set[int]:
    out: set[int] = set()
    for name in names:
        out |= _marks(t, name)
    return out


def is_data_source(source: tuple, f_locals: dict) -> bool:
    """Whether ``source`` reaches a data input: from an argument of the frame that is not
    an nn.Module, through items and attributes only (``x``, ``batch["ids"]``,
    ``batch.ids``).  Parameters, buffers and globals are not data."""
    kind = source[0]
    if kind in ("item", "attr"):
        return is_data_source(source[1], f_locals)
    if kind != "local":
        return False
    import torch

    return not isinstance(f_locals.get(source[1]), torch.nn.Module)


def from_locals(source: tuple) -> bool:
    """Whether ``source`` reaches its value from a local through attributes and items
    (``n``, ``self.steps``, ``batch["pos"]``): the plain ints that may become symbols."""
    while source[0] in ("attr", "item", "values"):   # (a dict's values, by place)
        source = source[1]
    return source[0] == "local"


def scalar_parts(source: tuple, value: Any) -> list:
    """``[(source, value)]`` of the plain ints and floats one guarded value is that may
    become symbols: itself, or the floats of a short tuple of ints and floats (the
    ``betas`` a scheduler moves every step), each reached by its own item source (the
    interpreter loads such a tuple item by item once an item is a symbol,
    csrc/interp_args.c).  A tuple's ints stay constants: sizes, a loop's position."""
    if type(value) in (int, float):
        return [(source, value)]
    return [(s, v) for s, v in scalar_items(source, value) if type(v) is float]


def scalar_items(source: tuple, value: Any) -> list:
    """``[(item source, item)]`` of a short tuple of plain ints and floats, which the
    interpreter loads item by item once one of them is a symbol; else ``[]``."""
    if type(value) is tuple and 0 < len(value) <= _SCALAR_TUPLE_MAX and \
            all(type(v) in (int, float) for v in value):
        return [(("item", source, i), v) for i, v in enumerate(value)]
    return []


_SCALAR_TUPLE_MAX = 8   # as AGS_SCALAR_TUPLE_MAX


class ShapeHistory:
    """The sizes each data input of one function showed at its captures (in one context):
    source -> one set of sizes per dimension; the dimensions a capture made dynamic
    (``(source, ndim)`` -> dims), which stay dynamic in the later captures; and the values
    each plain int or float the captures read showed (source -> set of values)."""

    __slots__ = ("sizes", "dynamic", "scalars", "pinned")

    def __init__(self) -> None:
        self.sizes: dict[tuple, list[set[int]]] = {}
        self.dynamic: dict[tuple, set[int]] = {}
        self.scalars: dict[tuple, set] = {}
        self.pinned: set[tuple] = set()   # scalars a capture fixed to one value anyway

    def pin(self, source: tuple) -> None:
        """Never make the int or float at ``source`` a symbol again: the code branches on
        it, or loops over it, so every value compiles apart whatever is done."""
        self.pinned.add(source)
        self.scalars.pop(source, None)

    def record_scalar(self, source: tuple, value: Any) -> None:
        got = self.scalars.setdefault(source, set())
        if len(got) < 64:   # bounded memory
            got.add(value)

    def seen(self, source: tuple, ndim: int) -> list[set[int]] | None:
        got = self.sizes.get(source)
        return got if got is not None and len(got) == ndim else None

    def record(self, source: tuple, shape: tuple) -> None:
        """Add the sizes of ``shape``; a symbolic one notes its dimension as dynamic."""
        got = self.seen(source, len(shape))
        if got is None:
            got = self.sizes[source] = [set() for _ in shape]
        for d, size in enumerate(shape):
            if not isinstance(size, int):
                self.dynamic.setdefault((source, len(shape)), set()).add(d)
            elif len(got[d]) < 64:   # bounded memory
                got[d].add(size)

    def went_dynamic(self, source: tuple, ndim: int) -> set[int]:
        """The dimensions of the input at ``source`` (of ``ndim`` dimensions) that an
        earlier capture made dynamic."""
        return self.dynamic.get((source, ndim), set())


class DimPolicy:
    """Which dimensions of each input one capture makes dynamic, and why.

    ``mode`` is ``optimize(dynamic=...)``: None (automatic), True or False.
    """

    def __init__(self, mode: bool | None, after: int, history: ShapeHistory | None,
                 f_locals: dict, supported: bool = True, floats: bool = False):
        self.mode = mode
        self.floats = floats   # the backend takes float symbols
        self.after = after
        self.history = history
        self.f_locals = f_locals
        self.supported = supported
        self.decided: dict[tuple, dict[int, str]] = {}   # source -> dim -> why
        #: source -> why, for the plain ints and floats this capture makes symbols
        self.scalars: dict[tuple, str] = self._dynamic_scalars()

    def may_go_dynamic(self, source: tuple, kind: Any, expected: Any) -> bool:
        """Whether a guard's check ``(source, kind, expected)`` is of a plain int or
        float that a later capture may make a symbol (one reached from a local, not fixed
        by the code before)."""
        from agspeed.protocol import Check

        if kind != Check.EQ or not self.supported or self.mode is False or \
                self.history is None or not from_locals(source):
            return False
        parts = scalar_parts(source, expected[1]) if type(expected[1]) is expected[0] \
            else []
        return bool(parts) and all(type(v) in self._kinds() and s not in self.history.pinned
                                   for s, v in parts)

    def _kinds(self) -> tuple:
        """The types of plain values this capture may make symbols."""
        return (int, float) if self.floats else (int,)

    def _dynamic_scalars(self) -> dict[tuple, str]:
        """The plain ints and floats (by source) that have shown ``after`` distinct
        values across this function's captures: a counter (``self.step += 1``), a
        position argument, a mixing weight.  Each becomes a symbol, so one graph serves
        every value."""
        if not self.supported or self.mode is False or self.history is None:
            return {}
        from agspeed._sources import resolve

        out = {}
        memo: dict = {}
        kinds = self._kinds()
        if self.mode is True:   # the frame's own int (and float) arguments, at once
            for name, value in self.f_locals.items():
                if type(value) in kinds and ("local", name) not in self.history.pinned:
                    out[("local", name)] = "optimize(dynamic=True)"
        for source, values in self.history.scalars.items():
            now = resolve(source, self.f_locals, {}, {}, memo)
            if type(now) not in kinds:   # the value this capture sees decides the type
                continue
            # the value this capture sees counts, as a size does
            values = {v for v in values if type(v) is type(now)} | {now}
            if len(values) >= max(self.after, 2):
                shown = ", ".join(map(repr, sorted(values, key=float)[:8]))
                out[source] = (f"{len(values)} distinct values ({shown}) reached "
                               f"dynamic_after={self.after}")
        return out

    def keep_constant(self, sources: list) -> None:
        """Make the scalars at ``sources`` constants in this capture and the later ones
        (a capture decided something on them that no guard can check)."""
        for source in sources:
            self.scalars.pop(source, None)
            if self.history is not None:
                self.history.pin(source)

    def decide(self, source: Any, value: Any) -> dict[int, str]:
        """``{dim: why}`` for the dimensions of ``value`` (reached by ``source``) that this
        capture makes dynamic (sizes 0 and 1 included: the ShapeEnv keeps them static)."""
        if not self.supported or not isinstance(source, tuple):
            return {}
        shape = tuple(value.shape)
        static = _marked(value, (_STATIC_MARK, *_DYNAMO_STATIC))
        marked = _marked(value, (_DYNAMIC_MARK, *_DYNAMO_DYNAMIC)) - static
        out = {d: "marked dynamic" for d in marked if d < len(shape)}
        data = None
        if self.mode is not False:
            data = is_data_source(source, self.f_locals)
        if self.mode is True and data:
            out.update({d: "optimize(dynamic=True)" for d in range(len(shape))
                        if d not in static and d not in out})
        elif self.mode is None and data and self.history is not None:
            seen = self.history.seen(source, len(shape)) or [set() for _ in shape]
            before = self.history.went_dynamic(source, len(shape))
            for d in range(len(shape)):
                if d in static or d in out:
                    continue
                if d in before:
                    # a dimension dynamic once stays so: the sizes that made it so were
                    # seen before its graph served every other size unrecorded
                    out[d] = "dynamic since an earlier capture"
                    continue
                sizes = seen[d] | {shape[d]}
                if len(sizes) >= self.after:
                    shown = ", ".join(map(str, sorted(sizes)[:8]))
                    out[d] = (f"{len(sizes)} distinct sizes ({shown}) reached "
                              f"dynamic_after={self.after}")
        if out:
            self.decided[source] = out
        return out


def fake_input(fake_mode: Any, source: tuple, name: str, value: Any,
               dims: dict[int, str]) -> Any:
    """A fake tensor for ``value`` whose dimensions ``dims`` are fresh symbols."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    sizes = [DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC
             for d in range(value.dim())]
    return fake_mode.from_tensor(value, symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=sizes), source=ConstantSource(name))


def symbolic_scalar(fake_mode: Any, name: str, value: int | float) -> Any:
    """A SymInt or SymFloat standing for the plain ``value``: a fresh symbol of any
    sign."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    env = fake_mode.shape_env
    src = ConstantSource(name)
    sym = env.create_unspecified_symbol(value, src, dynamic_dim=DimDynamic.DYNAMIC)
    make = env.create_symintnode if type(value) is int else env.create_symfloatnode
    return make(sym, hint=value, source=src)


class ScalarDecided(Exception):
    """A capture decided something on a float it made a symbol (a branch, a value a
    call needed as such): the guard program computes in int64 and cannot check it, so
    the capture is done again with those floats constant (``sources``), and they stay
    so."""

    def __init__(self, sources: list) -> None:
        super().__init__(", ".join(map(str, sources)))
        self.sources = sources


# -- the postfix language of guards/symbolic.c --------------------------------------------

def _ops() -> dict[str, int]:
    from agspeed.protocol import SizeOp

    return {op.name: int(op) for op in SizeOp}


# sympy class names (torch's own functions included) -> (postfix op, n-ary fold)
_FOLDS = {"Add": "ADD", "Mul": "MUL", "Max": "MAX", "Min": "MIN", "And": "AND", "Or": "OR"}
_BINARY = {"FloorDiv": "FLOORDIV", "CleanDiv": "FLOORDIV", "IntTrueDiv": None,
           "Mod": "MOD", "PythonMod": "MOD", "Pow": "POW", "PowByNatural": "POW",
           "Equality": "EQ", "Unequality": "NE", "StrictLessThan": "LT", "LessThan": "LE",
           "StrictGreaterThan": "GT", "GreaterThan": "GE"}


def to_postfix(expr: Any, index: dict) -> tuple | None:
    """``expr`` (a sympy integer or boolean expression over the symbols of ``index``,
    symbol -> slot) as a postfix program of guards/symbolic.c, or None where the language
    cannot say it (fractions, unknown functions, symbols outside ``index``)."""
    ops = _ops()
    out: list[int] = []

    def emit(e: Any) -> bool:
        if e is True or getattr(e, "is_Boolean", False) and e.__class__.__name__ in (
                "BooleanTrue", "BooleanFalse"):
            out.extend((ops["CONST"], 1 if bool(e) else 0))
            return True
        if getattr(e, "is_Integer", False):
            value = int(e)
            if not -(1 << 63) <= value < (1 << 63):
                return False
            out.extend((ops["CONST"], value))
            return True
        if getattr(e, "is_Symbol", False):
            k = index.get(e)
            if k is None:
                return False
            out.extend((ops["SYM"], k))
            return True
        name = type(e).__name__
        args = getattr(e, "args", ())
        if name in _FOLDS and args:
            if not emit(args[0]):
                return False
            for a in args[1:]:
                if not emit(a):
                    return False
                out.append(ops[_FOLDS[name]])
            return True
        if name == "Not" and len(args) == 1:
            if not emit(args[0]):
                return False
            out.append(ops["NOT"])
            return True
        op = _BINARY.get(name)
        if op is not None and len(args) == 2:
            if op == "POW" and not (getattr(args[1], "is_Integer", False) and int(args[1]) >= 0):
                return False
            if not (emit(args[0]) and emit(args[1])):
                return False
            out.append(ops[op])
            return True
        return False

    said = emit(expr)
    emit = None  # type: ignore[assignment]   (it calls itself through this cell)
    return tuple(out) if said else None


# sympy class names -> Python's operator, for the guards the fallback evaluates
_PY_FOLDS = {"Add": " + ", "Mul": " * ", "And": " and ", "Or": " or "}
_PY_BINARY = {"FloorDiv": " // ", "Mod": " % ", "PythonMod": " % ", "Pow": " ** ",
              "PowByNatural": " ** ", "Equality": " == ", "Unequality": " != ",
              "StrictLessThan": " < ", "LessThan": " <= ", "StrictGreaterThan": " > ",
              "GreaterThan": " >= "}


def to_python(expr: Any, index: dict) -> str | None:
    """``expr`` as a Python expression over ``v0, v1...`` (symbol -> k in ``index``),
    evaluated as the program's own code computes it (ints exactly, floats in double
    precision, a float constant at its exact value), or None where it cannot say it."""
    if expr is True or expr is False:
        return repr(bool(expr))
    name = type(expr).__name__
    if name in ("BooleanTrue", "BooleanFalse"):
        return repr(bool(expr))
    if getattr(expr, "is_Symbol", False):
        return f"v{index[expr]}" if expr in index else None
    if getattr(expr, "is_Integer", False):
        return repr(int(expr))
    if getattr(expr, "is_Float", False):
        value = float(expr)
        return repr(value) if value == value and abs(value) != float("inf") else None
    if getattr(expr, "is_Rational", False):
        return f"({int(expr.p)} / {int(expr.q)})"
    parts = [to_python(a, index) for a in getattr(expr, "args", ())]
    if not parts or any(p is None for p in parts):
        return None
    if name == "Not" and len(parts) == 1:
        return f"(not {parts[0]})"
    if name in ("Max", "Min"):
        return f"{name.lower()}({', '.join(parts)})"
    op = _PY_FOLDS.get(name) or (_PY_BINARY.get(name) if len(parts) == 2 else None)
    return f"({op.join(parts)})" if op else None


def python_check(guards: list, symbols: list) -> Callable[..., bool] | None:
    """One function of the symbols' values that is true where every guard holds (an
    unbound symbol, a division by zero: false, as in the C program); None where one
    guard cannot be said in Python."""
    index = {s: k for k, s in enumerate(symbols)}
    said = [to_python(g, index) for g in guards]
    if any(t is None for t in said):
        return None
    names = ", ".join(f"v{k}" for k in range(len(symbols)))
    test = eval(f"lambda {names}: {' and '.join(said) or 'True'}", {})  # noqa: S307

    def check(values: tuple) -> bool:
        if None in values:
            return False
        try:
            return bool(test(*values))
        except (ArithmeticError, ValueError, TypeError):
            return False

    return check


class SymbolicGuards:
    """What a dynamic capture assumed about its symbols, ready for the guard program.

    ``symbols``: the input symbols in slot order, with ``names`` ("x.size(0)");
    ``specs``: input source -> (sizes, strides) with symbols and sympy expressions;
    ``guards``: sympy booleans that must hold (the ShapeEnv's guards and each symbol's
    value range); ``specialized``: names of dimensions asked dynamic that the capture
    pinned to one value anyway.
    """

    def __init__(self, builder: Any):
        import sympy

        from agspeed._sources import describe

        env = builder.fake_mode.shape_env
        raw: dict[tuple, tuple] = {}
        named: dict = {}      # every input symbol -> (name, (source, kind, dim))
        floats: dict = {}     # the symbol of each float input -> its source
        for source, (node, _value) in builder._inputs.items():
            fake = node.meta["example_value"]
            if type(_value) is int:   # a plain int made a symbol
                named.setdefault(_raw(fake), (describe(source), (source, "int", None)))
                continue
            if type(_value) is float:   # a float: an input nothing may be decided on
                floats[_raw(fake)] = source
                continue
            sizes = tuple(_raw(s) for s in fake.size())
            strides = tuple(_raw(s) for s in fake.stride())
            if all(isinstance(s, int) for s in sizes + strides):
                continue
            raw[source] = (sizes, strides)
            for d, s in enumerate(sizes):
                if not isinstance(s, int):
                    named.setdefault(s, (f"{describe(source)}.size({d})", (source, "size", d)))
            for d, s in enumerate(strides):   # a non-dense input's own stride symbols
                if getattr(s, "is_Symbol", False):
                    named.setdefault(s, (f"{describe(source)}.stride({d})",
                                         (source, "stride", d)))
        # A float the code fixed to a value (``== 0.9``) is that value: its symbol is no
        # use.  One only compared (``momentum != 0``) stays a symbol: the fallback reads
        # its value and checks what was decided on it.
        decided = [source for s, source in floats.items() if s in env.replacements or
                   _pinned(env, s) is not None]
        if decided:
            raise ScalarDecided(decided)
        used = set().union(*(g.expr.free_symbols for g in env.guards)) if env.guards else set()
        #: (symbol, source) of each float a guard decides on, in the fallback's order
        self.floats = [(s, source) for s, source in floats.items() if s in used]
        # Symbols the capture fixed to one value (Linear's in_features, a mask's full
        # size) are that value: their dimension is static in this graph.
        pinned = {s: _pinned(env, s) for s in named}
        pinned = {s: v for s, v in pinned.items() if v is not None}
        self.specialized = [named[s][0] for s in pinned if named[s][1][1] in ("size", "int")]
        #: the plain ints made symbols: source -> the symbol, or the value the capture
        #: pinned it to (then checked as any int is, by equality)
        self.ints = {named[s][1][0]: (int(pinned[s]) if s in pinned else s)
                     for s in named if named[s][1][1] == "int"}
        #: per symbol, (source, "size", "stride" or "int", dim): a dynamic dimension, the
        #: stride of a non-dense input that is a symbol of its own, or a plain int
        self.symbols = [s for s in named if s not in pinned]
        self.names = [named[s][0] for s in self.symbols]
        self.dims = [named[s][1] for s in self.symbols]
        self.specs: dict[tuple, tuple] = {}
        for source, (sizes, strides) in raw.items():
            sizes, strides = (tuple(_fold(e, pinned) for e in part) for part in (sizes, strides))
            if not all(isinstance(e, int) for e in sizes + strides):
                self.specs[source] = (sizes, strides)
        index = set(self.symbols) | {s for s, _ in self.floats}
        guards: list = []
        for g in env.guards:
            expr = g.expr.xreplace(pinned) if pinned else g.expr
            if not expr.free_symbols <= index:
                raise ValueError(f"a guard on a size no input gives: {g.expr}")
            guards.append(expr)
        for s in self.symbols:
            vr = env.var_to_range.get(s)
            if vr is None:
                continue
            if getattr(vr.lower, "is_Integer", False):
                guards.append(sympy.Ge(s, int(vr.lower)))
            if getattr(vr.upper, "is_Integer", False):
                guards.append(sympy.Le(s, int(vr.upper)))
        seen: set = set()
        self.guards = []
        for g in guards:
            if g is sympy.true or g in seen:
                continue
            if g is sympy.false:   # the example itself broke it: never serve anything
                raise ValueError("a size guard that no size satisfies")
            seen.add(g)
            self.guards.append(g)
        self._readable = {s: sympy.Symbol(n, integer=True)
                          for s, n in zip(self.symbols, self.names)}
        self._readable.update((s, sympy.Symbol(describe(source))) for s, source in self.floats)

    def readable(self, expr: Any) -> str:
        """``expr`` with each symbol named by its input's dimension."""
        try:
            return str(expr.xreplace(self._readable))
        except AttributeError:
            return str(expr)

    def holds(self, expr: Any, values: dict) -> bool:
        """``expr`` evaluated by sympy for symbol values ``values`` (the slow path)."""
        import sympy

        got = expr.xreplace({s: sympy.Float(v) if type(v) is float else sympy.Integer(v)
                             for s, v in values.items()})
        return bool(got) if got in (sympy.true, sympy.false) or isinstance(got, bool) \
            else bool(got != 0)

    def value(self, expr: Any, values: dict) -> int:
        """The integer value of ``expr`` for symbol values ``values``."""
        import sympy

        return int(expr.xreplace({s: sympy.Integer(v) for s, v in values.items()}))

    @staticmethod
    def substitute(expr: Any, values: dict) -> Any:
        """``expr`` with this guard's symbols replaced at once by ``values``: ints, or
        expressions in another guard's symbols (whose names may be the same as these)."""
        import sympy

        return expr.xreplace({s: sympy.Integer(v) if isinstance(v, int) else v
                              for s, v in values.items()})

    def implied(self, expr: Any, values: dict, other: Any) -> bool:
        """Whether the guard ``expr`` holds for every frame that ``other`` (another
        capture's SymbolicGuards, or None) lets through, where ``values`` bind this
        guard's symbols to ints and to expressions in ``other``'s symbols: true outright,
        or, still symbolic, one of ``other``'s own guards (no reasoning beyond that)."""
        import sympy

        got = self.substitute(expr, values)
        if not getattr(got, "free_symbols", None):   # a number: evaluated as ``holds`` does
            return bool(got) if got in (sympy.true, sympy.false) or isinstance(got, bool) \
                else bool(got != 0)
        return other is not None and got in set(other.guards)

    def ordered_guards(self) -> list[tuple[int, Any]]:
        """The guards as the C program numbers them (``why``): those it evaluates in
        postfix first, in order, then the fallback's, all numbered len(postfix)."""
        index = {s: k for k, s in enumerate(self.symbols)}
        in_c = [to_postfix(g, index) is not None for g in self.guards]
        fast = [g for g, c in zip(self.guards, in_c) if c]
        slow = [g for g, c in zip(self.guards, in_c) if not c]
        return list(enumerate(fast)) + [(len(fast), g) for g in slow]

    def program(self) -> tuple[tuple, dict]:
        """``(symbolic, stride_slots)`` for the C program: symbolic is (n_syms, exprs,
        guard indices, fallback); stride_slots maps each symbolic stride expression to
        its index among exprs."""
        index = {s: k for k, s in enumerate(self.symbols)}
        exprs: list[tuple] = []
        slots: dict = {}
        for sizes, strides in self.specs.values():
            for st in strides:
                if not isinstance(st, int) and st not in slots:
                    code = to_postfix(st, index)
                    if code is None:
                        raise ValueError(f"a stride the guard cannot compute: {st}")
                    slots[st] = len(exprs)
                    exprs.append(code)
        guard_slots, slow = [], []
        for g in self.guards:
            code = to_postfix(g, index)
            if code is None:
                slow.append(g)
            else:
                guard_slots.append(len(exprs))
                exprs.append(code)
        fallback = None
        if slow:   # (a Python call, a microsecond where Python can say the guards)
            symbols = list(self.symbols) + [s for s, _ in self.floats]
            fallback = python_check(slow, symbols) or self._sympy_check(slow, symbols)
        return (len(self.symbols), tuple(exprs), tuple(guard_slots), fallback), slots


    def _sympy_check(self, slow: list, symbols: list) -> Callable[..., bool]:
        """The guards ``slow`` evaluated by sympy (the slow path), as the fallback."""
        def fallback(values: tuple) -> bool:
            # (the floats' values follow the symbols'; a float load's value has passed
            # its type check)
            bound = {s: v for s, v in zip(symbols, values) if v is not None}
            try:
                return all(self.holds(g, bound) for g in slow)
            except TypeError:   # sympy orders no NaN: captured again, as eager runs
                return False
        return fallback


def _raw(size: Any) -> Any:
    """An int, or the sympy expression of an input's SymInt as it was made: its own
    symbol, before any replacement the capture learnt (those are guards)."""
    if isinstance(size, int):
        return size
    node = size.node
    expr = getattr(node, "_expr", None)
    if expr is None:
        expr = node.expr
    return int(expr) if getattr(expr, "is_Integer", False) else expr


def _fold(expr: Any, pinned: dict) -> Any:
    """``expr`` with pinned symbols replaced by their values: an int when constant."""
    if isinstance(expr, int):
        return expr
    out = expr.xreplace(pinned) if pinned else expr
    return int(out) if getattr(out, "is_Integer", False) else out


def _pinned(env: Any, symbol: Any) -> Any:
    """The sympy Integer a capture fixed ``symbol`` to (a guard made it a constant), or
    None."""
    replaced = env.replacements.get(symbol)
    if replaced is not None and getattr(replaced, "is_Integer", False):
        return replaced
    vr = env.var_to_range.get(symbol)
    if vr is not None and getattr(vr.lower, "is_Integer", False) and vr.lower == vr.upper:
        return vr.lower
    return None


def history_of(table: weakref.WeakKeyDictionary, code: Any) -> ShapeHistory:
    """The ShapeHistory of ``code`` in ``table``, made on first use."""
    got = table.get(code)
    if got is None:
        got = table[code] = ShapeHistory()
    return got
