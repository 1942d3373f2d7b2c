"""A cache entry's guard: what its capture assumed, compiled into a C guard program.

``Guard`` turns a capture's assumptions (its ``GraphBuilder``: the graph's tensor inputs,
every other value read, the aliases among them) into checks, one per source, each of a
kind of ``agspeed.guards.checks``, plus torch's global state (``agspeed.guards.state``).
It keeps them as data, for logs (``lines``), recompile reasons (``failures``,
``first_failure``) and ``widened``/``covers``, and compiles them into the
``agspeed._C.GuardProgram`` it extends (guards/program.c), which is what the hook calls:
loads by source (``agspeed.protocol.Load``), checks by kind (``Check``), the aliases, the
probes, the symbolic part of a capture with dynamic dimensions.

``ArgumentTypes`` is the guard of a function that did no tensor work.
"""

from __future__ import annotations

import weakref
from typing import Any

from agspeed import _C
from agspeed import config as _config
from agspeed._shapes import SymbolicGuards, scalar_items
from agspeed._sources import MISSING, describe, resolve, resolve_step
from agspeed._tensor_check import batch_checker
from agspeed.guards.checks import KINDS, NO_SYMBOLS, Symbols, check_for, tensor_spec
from agspeed.guards.state import global_state, state_probes, state_text
from agspeed.protocol import Check, GuardFlag, Load, Part

__all__ = ["ArgumentTypes", "Guard", "SameObjects", "arg_names"]

# Loads read from the frame (no parent), and the key each takes from its source.
_ROOT_KEYS = {Load.LOCAL: lambda s: s[1], Load.GLOBAL: lambda s: s[1],
              Load.GMOD: lambda s: (s[1], s[2])}


def arg_names(code: Any) -> tuple:
    """The names of ``code``'s argument slots, in order (what the hook can read by index:
    positional, keyword-only, *args, **kwargs)."""
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + \
        bool(code.co_flags & 0x08)
    return tuple(code.co_varnames[:n])


def _depth(source: tuple) -> int:
    return 0 if Load.by_id[source[0]] in _ROOT_KEYS else 1 + _depth(source[1])


class Guard(_C.GuardProgram):
    """The checks of one entry, callable as the hook's guard.

    ``checks`` is a tuple of ``(source, kind, expected)``, kind a ``Check``, expected as
    that kind's class in ``agspeed.guards.checks`` describes it (for tensors,
    ``(type, dtype, device, shape, stride, requires_grad)``).  No Python frame runs on a
    passing or failing call: the C program this class extends answers.  ``sym`` holds the
    symbolic part of a capture with dynamic dimensions (a ``SymbolicGuards``), or None.
    """

    __slots__ = ("checks", "aliases", "different", "state", "reads", "torch", "break_at",
                 "inputs", "sym", "args", "floats")

    def __init__(self, torch: Any, builder: Any, f_locals: dict, code: Any = None):
        """``builder``: the capture's ``agspeed._graph.GraphBuilder``."""
        seen: set = set()
        checks = []
        self.sym = SymbolicGuards(builder) if builder.symbolic else None
        if self.sym is not None and not self.sym.symbols and not self.sym.floats:
            self.sym = None   # every dimension turned out static (sizes 0 and 1)
        specs = self.sym.specs if self.sym is not None else {}
        ints = self.sym.ints if self.sym is not None else {}
        #: the floats the capture made symbols (graph inputs checked for their type)
        self.floats = tuple(s for s, (_, v) in builder._inputs.items() if type(v) is float)
        for source, (node, value) in zip(builder.sources, builder._inputs.values()):
            if type(value) is float:
                checks.append((("type", source), *check_for(builder, float)))
                seen.add(("type", source))
                continue
            if type(value) is int:   # a plain int the capture made a symbol
                symbol = ints.get(source, value)
                checks.append((source, *check_for(builder, value)) if type(symbol) is int
                              else (source, Check.DYNINT, symbol))
                seen.add(source)
                continue
            spec = tensor_spec(value)
            if source in specs:
                sizes, strides = specs[source]
                checks.append((source, Check.DYNTENSOR,
                               (spec[0], spec[1], spec[2], sizes, strides, spec[5])))
            else:
                checks.append((source, Check.TENSOR, spec))
            seen.add(source)
        # plain instances whose identity the capture did not rely on: their exact type
        by_type = builder.by_type() if hasattr(builder, "by_type") else set()
        for source, value in builder.assumptions:
            if source in by_type and check_for(builder, value)[0] == Check.ID:
                source, value = ("type", source), type(value)
            if source in seen:
                continue
            seen.add(source)
            if any(item in builder._inputs for item, _ in scalar_items(source, value)):
                # a tuple of plain values loaded item by item (an item a symbol): each
                # item is checked by itself, the tuple by its length
                checks.append((source, Check.LEN, KINDS[Check.LEN].expect(value)))
                continue
            checks.append((source, *check_for(builder, value)))
        # Identity checks of parents first: a cheap early miss, and what later checks
        # resolve through.
        checks.sort(key=lambda c: _depth(c[0]))
        self.checks = tuple(checks)
        self.aliases = tuple(builder.aliases)
        # the tensors the capture saw as different objects: a frame bringing one tensor
        # through two of these sources is not the frame the graph was made for (see
        # guards/alias.c); the tensors NumPy arrays share are new objects every call
        self.different = tuple(s for s, (_, v) in builder._inputs.items()
                              if isinstance(v, torch.Tensor) and s[0] != "numpy")
        self.torch = torch
        self.state = global_state(torch)
        # the queries of torch's other state the frame branched on (agspeed._torch_state):
        # (function, args, answer), probed after the global state
        self.reads = tuple(getattr(builder, "state_reads", ()))
        self.break_at: tuple | None = None  # (file, line, instruction, reason) of a break
        # what read() returns: the graph's inputs, then the objects the frame writes to
        self.inputs = tuple(getattr(builder, "read_sources", builder.sources))
        # the argument names in slot order: the hook reads those locals by index
        self.args = arg_names(code) if code is not None else ()
        self._compile()

    def _compile(self) -> None:
        """Turn checks, aliases and state into the C program (see guards/program.c)."""
        slots: dict[tuple, int] = {}
        loads: list[tuple] = []

        def slot(source: tuple) -> int:
            got = slots.get(source)
            if got is None:
                op = Load.by_id[source[0]]
                root_key = _ROOT_KEYS.get(op)
                if root_key is None:
                    load = (op, slot(source[1]), source[2] if len(source) > 2 else None)
                elif op is Load.LOCAL and source[1] in self.args:
                    load = (op, -1, source[1], self.args.index(source[1]))
                else:
                    load = (op, -1, root_key(source))
                got = slots[source] = len(loads)
                loads.append(load)
            return got

        symbolic, strides = (None, {}) if self.sym is None else self.sym.program()
        if symbolic is not None and self.sym.floats:   # the floats' loads, for the fallback
            symbolic += (tuple(slot(source) for _, source in self.sym.floats),)
        symbols = NO_SYMBOLS if self.sym is None else \
            Symbols({s: k for k, s in enumerate(self.sym.symbols)}, strides)
        checks = [(slot(source), kind, *KINDS[kind].compile(expected, symbols))
                  for source, kind, expected in self.checks]
        aliases = [(slot(a), slot(b)) for a, b in self.aliases]
        distinct = [slot(s) for s in self.different]
        outputs = [slot(s) for s in self.inputs]
        flags = GuardFlag.CHECK_KNOWN_TENSORS if _config.guard_parameters else GuardFlag(0)
        slot = None  # type: ignore[assignment]   (it calls itself through this cell)
        self._set_program(loads, checks, aliases,
                          state_probes(self.torch, self.state) + self.reads,
                          resolve_step, MISSING, self.torch.nn.Module, outputs, int(flags),
                          symbolic, distinct, batch_checker)

    def widened(self, other: "Guard") -> "Guard":
        """This guard less the plain-value checks ``other`` expects differently.

        For a graph break that recurs where only plain values changed (a counter in
        ``self.step += 1``, a flag): the eager entry then serves every value of them,
        instead of each call recapturing the same break.  Tensor checks always stay, so
        an input that breaks for its shape never shadows the graph of other shapes.
        """
        theirs = {(c[0], c[1]): c[2] for c in other.checks}
        out = Guard.__new__(Guard)
        out.checks = tuple(c for c in self.checks
                           if not KINDS[c[1]].widenable
                           or theirs.get((c[0], c[1]), c[2]) == c[2])
        out.aliases, out.state, out.torch = self.aliases, self.state, self.torch
        out.reads = self.reads
        out.different = self.different
        out.break_at, out.inputs, out.sym = self.break_at, self.inputs, self.sym
        out.args, out.floats = self.args, self.floats
        out._compile()
        return out

    def covers(self, other: Any) -> bool:
        """Whether this guard passes for every frame ``other`` (a Guard) passes for, as
        far as ``other``'s checks tell: a dynamic entry then replaces ``other``'s
        static one.  Read from the expectations alone; nothing of the frame is needed."""
        if not isinstance(other, Guard) or other.state != self.state or \
                any(r not in other.reads for r in self.reads) or \
                set(other.aliases) != set(self.aliases) or \
                not set(self.different) <= set(other.different):
            return False
        theirs = {c[0]: (c[1], c[2]) for c in other.checks}
        bound: dict = {}
        for source, kind, expected in self.checks:
            got = theirs.get(source)
            if got is None or not KINDS[kind].covers(expected, *got, self.sym, bound):
                return False
        if self.sym is None:
            return True
        return len(bound) == len(self.sym.symbols) and \
            all(self.sym.implied(g, bound, other.sym) for g in self.sym.guards)

    def _walk(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> list[tuple]:
        """Every failing part, as (part, index, text), parts and indices as the C program
        names them (``why``: a ``Part`` id): the Python reading of the program, for logs
        and tests."""
        memo: dict = {}
        bound: dict = {}
        out = []
        for i, (source, kind, expected) in enumerate(self.checks):
            check = KINDS[kind]
            value = resolve(source, f_locals, f_globals, f_builtins, memo)
            if not check.passes(expected, value, self.sym, bound):
                out.append((Part.CHECK.id, i, f"{describe(source)}: expected "
                            f"{check.shown(expected, self.sym)}, got {check.got(value)}"))
        for i, (a, b) in enumerate(self.aliases):
            if resolve(a, f_locals, f_globals, f_builtins, memo) is not \
                    resolve(b, f_locals, f_globals, f_builtins, memo):
                out.append((Part.ALIAS.id, i, f"{describe(a)} is {describe(b)}: no longer "
                            f"the same tensor"))
        if not out:
            out += self._repeats([resolve(s, f_locals, f_globals, f_builtins, memo)
                                  for s in self.different])
        if self.sym is not None and not out:
            values = ", ".join(f"{n}={bound[s]}" for s, n in
                               zip(self.sym.symbols, self.sym.names) if s in bound)
            for i, g in self.sym.ordered_guards():
                if not self.sym.holds(g, bound):
                    out.append((Part.SIZE.id, i, f"size guard {self.sym.readable(g)}: "
                                f"false for {values}"))
        state = global_state(self.torch)
        if state != self.state:
            out.append((Part.PROBE.id, -1, f"global state: expected "
                        f"{state_text(self.state)}, got {state_text(state)}"))
        for fn, args, expected in self.reads:
            got = fn(*args)
            if got != expected:
                out.append((Part.PROBE.id, -1, f"{_call_text(fn, args)}: expected "
                            f"{expected!r}, got {got!r}"))
        return out

    def _repeats(self, values: list) -> list[tuple]:
        """The DISTINCT failure of ``values`` (the distinct sources' values, in order):
        the first that repeats an earlier one, as the C program reports it."""
        first: dict[int, int] = {}
        for i, value in enumerate(values):
            j = first.setdefault(id(value), i)
            if j != i and value is not MISSING:
                a, b = describe(self.different[j]), describe(self.different[i])
                return [(Part.DISTINCT.id, i, f"{a} is {b}: the graph was captured for "
                                              f"two different tensors")]
        return []

    def check_in_python(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> bool:
        """The same answer as calling the guard, computed in Python (for tests)."""
        return not self._walk(f_locals, f_globals, f_builtins)

    def failures(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> list[str]:
        """Every failing check, as "source: expected X, got Y" (for recompile logs)."""
        return [text for _, _, text in self._walk(f_locals, f_globals, f_builtins)]

    def first_failure(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> str | None:
        """What failed first when the C program ran on this frame (``why``), in words;
        None if it passes."""
        why = self.why(f_locals, f_globals, f_builtins)
        if why is None:
            return None
        part, index = why
        for k, i, text in self._walk(f_locals, f_globals, f_builtins):
            # probes: the Python reading compares the whole state at once (index -1);
            # a repeat among distinct tensors may be reported from either side
            if k == part and (i == index or part in (Part.PROBE.id, Part.DISTINCT.id)):
                return text
        return f"{part} {index} (the guard changed while it ran)"

    def gone(self) -> bool:
        """Whether an object this guard checks by identity has been freed: no frame can
        pass it again, so its entry only costs a failing check and a recompile slot."""
        return any(kind == Check.ID and expected() is None
                   for _, kind, expected in self.checks)

    def identities(self) -> tuple:
        """``(name, weakref-or-holder)`` of the frame's arguments this guard checks by
        identity (a method's ``self``): which object the entry was captured for."""
        return tuple((source[1], expected) for source, kind, expected in self.checks
                     if kind == Check.ID and Load.by_id[source[0]] is Load.LOCAL)

    def lines(self) -> list[str]:
        """The checks, readable (for AGSPEED_LOG=guards and explain)."""
        out = [f"{describe(s)} {KINDS[k].word} {KINDS[k].shown(e, self.sym)}"
               for s, k, e in self.checks]
        out += [f"{describe(a)} is {describe(b)}" for a, b in self.aliases]
        if len(self.different) > 1:
            out.append("all different: " + ", ".join(describe(s) for s in self.different))
        if self.sym is not None:
            out += [f"size: {self.sym.readable(g)}" for g in self.sym.guards]
        out.append(f"global state == {state_text(self.state)}")
        out += [f"{_call_text(fn, args)} == {expected!r}" for fn, args, expected in self.reads]
        return out


def _call_text(fn: Any, args: tuple) -> str:
    module = getattr(fn, "__module__", None)
    name = f"{module}.{fn.__name__}" if module and hasattr(fn, "__name__") else repr(fn)
    return f"{name}({', '.join(map(repr, args))})"


class ArgumentTypes:
    """The guard of a function that did no tensor work: the types of its arguments.

    Guarding such a function on its argument values would capture it again for every
    new value; on their types, a later call with a tensor is captured, while one with
    another int runs eager at once.  The types are held weakly: an optimized module's
    view class holds its model, and the entry lives on a code object that outlives it.
    """

    __slots__ = ("types",)

    def __init__(self, f_locals: dict):
        self.types = tuple((k, weakref.ref(type(v))) for k, v in f_locals.items())

    def __call__(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> bool:
        if len(f_locals) != len(self.types):
            return False
        for name, kind in self.types:
            if type(f_locals.get(name, MISSING)) is not kind():
                return False
        return True

    def gone(self) -> bool:
        """Whether a class of the arguments has been freed: no frame can pass again."""
        return any(kind() is None for _, kind in self.types)

    def failures(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> list[str]:
        now = {k: type(v).__name__ for k, v in f_locals.items()}
        then = {k: _type_name(t) for k, t in self.types}
        return [f"argument types: expected {then}, got {now}"] if now != then else []

    def lines(self) -> list[str]:
        return [f"type({k}) is {_type_name(t)}" for k, t in self.types]


def _type_name(kind: Any) -> str:
    alive = kind()
    return "(a freed class)" if alive is None else alive.__name__


class SameObjects:
    """The guard of an entry that serves one object's calls: the frame's arguments are
    the objects ``identities`` names (held as a ``Guard`` holds them, weakly where it
    can).  An empty one passes every frame."""

    __slots__ = ("held",)

    def __init__(self, identities: tuple):
        self.held = identities

    def __call__(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> bool:
        for name, expected in self.held:
            obj = expected()
            if obj is None or f_locals.get(name, MISSING) is not obj:
                return False
        return True

    def gone(self) -> bool:
        return any(expected() is None for _, expected in self.held)

    def identities(self) -> tuple:
        return self.held

    def failures(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> list[str]:
        return [f"{name}: not the object this entry serves" for name, expected in self.held
                if f_locals.get(name, MISSING) is not expected()]

    def lines(self) -> list[str]:
        return [f"{name} is the same {type(expected()).__name__}" for name, expected
                in self.held]
