"""From a frame to a cache entry: capture, guard, compile.

``capture_entry`` runs the C symbolic interpreter over a frame's code with a
``GraphBuilder``.  When the whole function was captured (inlined modules and functions
included), the graph is handed to the backend and the result is a ``CALL`` entry: its
compiled callable reads the graph's inputs from the frame by their sources and returns
what the function would have, and its guard checks every assumption the capture made, so
the entry is used only where it computes what eager would:

* each tensor input (arguments, parameters, buffers, tensors in globals): exact type,
  dtype, device, shape, strides, requires_grad; two sources that reached one tensor
  (tied weights) must still reach one tensor;
* each plain value read (ints, strings, ``self.training``, tuples of them, dtypes): type
  and equality;
* each container read (hook dicts, module stores, argument tuples): type and length;
* every other object (modules, functions, Python modules): identity, held weakly where
  possible (see ``_holder``);
* global state: grad mode, inference mode, autocast (per device type: enabled, dtype,
  cache) and the default dtype;
* for a capture with dynamic dimensions (``agspeed._shapes``): each such input's
  static sizes, its symbolic sizes bound to symbols and its strides as expressions of
  them, and every fact the capture relied on about the symbols (``x.size(0) >= 2``,
  ``Eq(x.size(1), y.size(1))``).  Such an entry serves many signatures, so it is not
  signed: lookups try it by its guard.

When capture stops at an instruction, the result is a ``CaptureBreak`` saying where and
why; the caller runs the frame eager (under a guard built from what was assumed until
then) and logs it.  Guards are Python callables for now; they become C guard programs
with the signature hash.
"""

from __future__ import annotations

import dis
import os
import weakref
from typing import Any, Callable, NamedTuple

from agspeed import _C
from agspeed import config as _config
from agspeed._graph import GraphBreak, GraphBuilder
from agspeed.protocol import Reason
from agspeed._shapes import NeedsSymbolic, SymbolicGuards
from agspeed._sources import MISSING, describe, resolve, resolve_step

_AUTOCAST_DEVICES = ("cpu", "cuda")


class CaptureBreak(NamedTuple):
    """Where and why capture of a frame stopped."""

    filename: str
    line: int | None
    instruction: str
    reason: str
    detail: str
    function: str = ""  # the function (maybe inlined) whose instruction stopped capture

    @property
    def hint(self) -> str:
        """What the user can do about it (``agspeed.protocol.Reason``)."""
        reason = Reason.by_id.get(self.reason)
        return reason.hint if reason is not None else ""

    def __str__(self) -> str:
        where = f"{os.path.basename(self.filename)}:{self.line}"
        hint = f"; hint: {self.hint}" if self.hint else ""
        return f"{where} {self.instruction}: {self.reason} ({self.detail}{hint})"


def _line_of(code: Any, offset: int) -> int | None:
    """The line of the instruction at ``offset``; the code's first line for an offset
    before any instruction (-1: capture stopped at the start) or one with no line."""
    for ins in dis.get_instructions(code):
        if ins.offset == offset and ins.positions and ins.positions.lineno is not None:
            return ins.positions.lineno
    return code.co_firstlineno


def _autocast_state(torch: Any) -> tuple:
    """(enabled, dtype) of autocast per device type, on torch 2.4+ and older; the dtype
    is None where autocast is off (it then changes nothing)."""
    try:
        pairs = [(torch.is_autocast_enabled(d), lambda d=d: torch.get_autocast_dtype(d))
                 for d in _AUTOCAST_DEVICES]
    except TypeError:  # before 2.4 these took no device argument
        pairs = [(torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype),
                 (torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype)]
    return tuple((on, dtype() if on else None) for on, dtype in pairs)


def _any_autocast(torch: Any) -> Any:
    """torch._C._is_any_autocast_enabled, where this torch has it (one call for every
    device type), else None."""
    return getattr(torch._C, "_is_any_autocast_enabled", None)


def _deterministic_state(torch: Any) -> tuple:
    """(on, warn_only) of torch.use_deterministic_algorithms; warn_only is None where
    it is off (it then changes nothing)."""
    on = torch.are_deterministic_algorithms_enabled()
    return on, (torch.is_deterministic_algorithms_warn_only_enabled() if on else None)


def global_state(torch: Any) -> tuple:
    """Everything outside the frame that changes what a graph computes: grad mode,
    inference mode, the autocast cache, autocast on any device type (None where torch
    cannot tell), autocast per device type, the default dtype, deterministic mode."""
    any_on = _any_autocast(torch)
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.is_autocast_cache_enabled(), any_on() if any_on else None,
            _autocast_state(torch), torch.get_default_dtype(), _deterministic_state(torch))


def _holder(value: Any) -> Callable[[], Any]:
    """How a guard keeps an object it checks by identity: weakly where it can.

    An entry lives in its code object's co_extra, which the cyclic GC cannot see, so a
    strong reference to, say, a user module whose functions lead back to that code
    object would never be freed.  A dead weak reference fails the guard.
    """
    try:
        return weakref.ref(value)
    except TypeError:  # builtins, ints: cannot lead back to user code
        return lambda: value


def _tensor_spec(t: Any) -> tuple:
    return (type(t), t.dtype, t.device, tuple(t.shape), t.stride(), t.requires_grad)


# Check kinds: what a guard compares for one source (guards/program.c C_*).
_TENSOR, _EQ, _LEN, _ID, _ABSENT, _DYN = range(6)
_CHECK_NAMES = {_TENSOR: "tensor", _EQ: "==", _LEN: "len", _ID: "is", _ABSENT: "absent",
                _DYN: "tensor"}


def _check_for(builder: GraphBuilder, value: Any) -> tuple:
    if value is MISSING:
        return (_ABSENT, None)
    if builder._is_static(value):
        return (_EQ, (type(value), value))
    if isinstance(value, (dict, list, tuple)):
        return (_LEN, (type(value), len(value)))
    return (_ID, _holder(value))


def _binds(expected: tuple, spec: tuple, sym: Any, bound: dict) -> bool:
    """Whether a tensor with ``spec`` (type, dtype, device, shape, stride, grad) passes
    the dynamic tensor check ``expected`` (sizes may be symbols, strides expressions of
    them), binding symbols in ``bound`` as the C check does."""
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
                sym.value(want, bound) != got:
            return False
    return True


def _passes(kind: int, expected: Any, value: Any, sym: Any = None,
            bound: dict | None = None) -> bool:
    if kind == _TENSOR:
        return type(value) is expected[0] and _tensor_spec(value) == expected
    if kind == _DYN:
        return hasattr(value, "stride") and _binds(expected, _tensor_spec(value), sym,
                                                   bound if bound is not None else {})
    if kind == _EQ:
        return type(value) is expected[0] and value == expected[1]
    if kind == _LEN:
        return type(value) is expected[0] and len(value) == expected[1]
    if kind == _ID:
        held = expected()
        return held is not None and value is held
    return value is MISSING


def _shown(kind: int, expected: Any, sym: Any = None) -> str:
    if kind == _DYN:
        kind_, dtype, device, sizes, strides, grad = expected
        shown = [sym.readable(d) if sym is not None else str(d) for d in sizes]
        strides_ = [sym.readable(d) if sym is not None else str(d) for d in strides]
        return (f"{kind_.__name__}(dtype={dtype}, device={device}, shape=[{', '.join(shown)}], "
                f"stride=[{', '.join(strides_)}], requires_grad={grad})")
    if kind == _TENSOR:
        kind_, dtype, device, shape, stride, grad = expected
        return (f"{kind_.__name__}(dtype={dtype}, device={device}, shape={list(shape)}, "
                f"stride={list(stride)}, requires_grad={grad})")
    if kind == _EQ:
        return repr(expected[1])
    if kind == _LEN:
        return f"{expected[0].__name__} of length {expected[1]}"
    if kind == _ID:
        held = expected()
        return f"the same {type(held).__name__} (id {id(held):#x})" if held is not None \
            else "an object that no longer exists"
    return "nothing"


def _got(kind: int, value: Any) -> str:
    if value is MISSING:
        return "nothing"
    if kind in (_TENSOR, _DYN) and hasattr(value, "stride"):
        return _shown(_TENSOR, _tensor_spec(value))
    if kind == _LEN and isinstance(value, (dict, list, tuple)):
        return f"{type(value).__name__} of length {len(value)}"
    if kind == _ID:
        return f"a {type(value).__name__} (id {id(value):#x})"
    return repr(value) if isinstance(value, (int, float, str, bool, type(None))) \
        else type(value).__name__


class Guard(_C.GuardProgram):
    """The checks of one entry, callable as the hook's guard.

    The checks are kept here as data (for logs, ``failures`` and ``lines``) and compiled
    into the C guard program this class extends (guards/program.c), which is what the
    hook calls: no Python frame runs on a passing or failing call.  ``sym`` holds the
    symbolic part of a capture with dynamic dimensions (a ``SymbolicGuards``), or None.
    """

    __slots__ = ("checks", "aliases", "state", "torch", "break_at", "inputs", "sym", "args")

    def __init__(self, torch: Any, builder: GraphBuilder, f_locals: dict, code: Any = None):
        seen: set = set()
        checks = []
        self.sym = SymbolicGuards(builder) if builder.symbolic else None
        if self.sym is not None and not self.sym.symbols:
            self.sym = None   # every dimension turned out static (sizes 0 and 1)
        specs = self.sym.specs if self.sym is not None else {}
        for source, (node, value) in zip(builder.sources, builder._inputs.values()):
            spec = _tensor_spec(value)
            if source in specs:
                sizes, strides = specs[source]
                checks.append((source, _DYN, (spec[0], spec[1], spec[2], sizes, strides,
                                              spec[5])))
            else:
                checks.append((source, _TENSOR, spec))
            seen.add(source)
        for source, value in builder.assumptions:
            if source in seen:
                continue
            seen.add(source)
            checks.append((source, *_check_for(builder, value)))
        # Identity checks of parents first: a cheap early miss, and what later checks
        # resolve through.
        checks.sort(key=lambda c: _depth(c[0]))
        self.checks = tuple(checks)
        self.aliases = tuple(builder.aliases)
        self.torch = torch
        self.state = global_state(torch)
        self.break_at: tuple | None = None  # (file, line, instruction, reason) of a break
        self.inputs = tuple(builder.sources)  # what read() returns: the graph's inputs
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
                kind = source[0]
                if kind == "local" and source[1] in self.args:
                    load = (_LOAD_OPS[kind], -1, source[1], self.args.index(source[1]))
                elif kind in ("local", "global"):
                    load = (_LOAD_OPS[kind], -1, source[1])
                elif kind == "gmod":
                    load = (_LOAD_OPS[kind], -1, (source[1], source[2]))
                else:
                    load = (_LOAD_OPS[kind], slot(source[1]),
                            source[2] if len(source) > 2 else None)
                got = slots[source] = len(loads)
                loads.append(load)
            return got

        symbolic, strides = (None, {}) if self.sym is None else self.sym.program()
        index = {} if self.sym is None else {s: k for k, s in enumerate(self.sym.symbols)}
        checks = []
        for source, kind, expected in self.checks:
            if kind == _TENSOR:
                a, b = expected[0], expected[1:]
            elif kind == _DYN:
                kind_, dtype, device, sizes, strides_, grad = expected
                a = kind_
                b = (dtype, device,
                     tuple(d if isinstance(d, int) else -index[d] - 1 for d in sizes),
                     tuple(d if isinstance(d, int) else -strides[d] - 1 for d in strides_),
                     grad)
            elif kind in (_EQ, _LEN):
                a, b = expected
            elif kind == _ID:
                weak = isinstance(expected, weakref.ref)
                a, b = (expected if weak else expected()), weak
            else:
                a = b = None
            checks.append((slot(source), kind, a, b))
        aliases = [(slot(a), slot(b)) for a, b in self.aliases]
        outputs = [slot(s) for s in self.inputs]
        flags = _CHECK_KNOWN_TENSORS if _config.guard_parameters else 0
        self._set_program(loads, checks, aliases, _state_probes(self.torch, self.state),
                          resolve_step, MISSING, self.torch.nn.Module, outputs, flags,
                          symbolic)

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
                           if c[1] != _EQ or theirs.get((c[0], _EQ), c[2]) == c[2])
        out.aliases, out.state, out.torch = self.aliases, self.state, self.torch
        out.break_at, out.inputs, out.sym = self.break_at, self.inputs, self.sym
        out.args = self.args
        out._compile()
        return out

    def covers(self, other: Any) -> bool:
        """Whether this guard passes for every frame ``other`` (a Guard) passes for, as
        far as ``other``'s checks tell: a dynamic entry then replaces ``other``'s
        static one.  Read from the expectations alone; nothing of the frame is needed."""
        if not isinstance(other, Guard) or other.state != self.state or \
                set(other.aliases) != set(self.aliases):
            return False
        theirs = {c[0]: (c[1], c[2]) for c in other.checks}
        bound: dict = {}
        for source, kind, expected in self.checks:
            got = theirs.get(source)
            if got is None:
                return False
            okind, oexp = got
            if kind == _DYN:
                if okind not in (_TENSOR, _DYN) or okind == _DYN and oexp != expected or \
                        okind == _TENSOR and not _binds(expected, oexp, self.sym, bound):
                    return False
            elif kind == _ID:
                if okind != _ID or oexp() is None or oexp() is not expected():
                    return False
            elif (okind, oexp) != (kind, expected):
                return False
        if self.sym is None:
            return True
        return len(bound) == len(self.sym.symbols) and \
            all(self.sym.holds(g, bound) for g in self.sym.guards)

    def _walk(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> list[tuple]:
        """Every failing part, as (kind, index, text), kinds and indices as the C program
        names them (``why``): the Python reading of the program, for logs and tests."""
        memo: dict = {}
        bound: dict = {}
        out = []
        for i, (source, kind, expected) in enumerate(self.checks):
            value = resolve(source, f_locals, f_globals, f_builtins, memo)
            if not _passes(kind, expected, value, self.sym, bound):
                out.append(("check", i, f"{describe(source)}: expected "
                            f"{_shown(kind, expected, self.sym)}, got {_got(kind, value)}"))
        for i, (a, b) in enumerate(self.aliases):
            if resolve(a, f_locals, f_globals, f_builtins, memo) is not \
                    resolve(b, f_locals, f_globals, f_builtins, memo):
                out.append(("alias", i, f"{describe(a)} is {describe(b)}: no longer the "
                            f"same tensor"))
        if self.sym is not None and not out:
            values = ", ".join(f"{n}={bound[s]}" for s, n in
                               zip(self.sym.symbols, self.sym.names) if s in bound)
            for i, g in self.sym.ordered_guards():
                if not self.sym.holds(g, bound):
                    out.append(("size", i, f"size guard {self.sym.readable(g)}: false for "
                                f"{values}"))
        state = global_state(self.torch)
        if state != self.state:
            out.append(("probe", -1, f"global state: expected {_state_text(self.state)}, "
                        f"got {_state_text(state)}"))
        return out

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
        kind, index = why
        for k, i, text in self._walk(f_locals, f_globals, f_builtins):
            if k == kind and (i == index or kind == "probe"):
                return text
        return f"{kind} {index} (the guard changed while it ran)"

    def lines(self) -> list[str]:
        """The checks, readable (for AGSPEED_LOG=guards and explain)."""
        out = [f"{describe(s)} {_CHECK_NAMES[k]} {_shown(k, e, self.sym)}"
               for s, k, e in self.checks]
        out += [f"{describe(a)} is {describe(b)}" for a, b in self.aliases]
        if self.sym is not None:
            out += [f"size: {self.sym.readable(g)}" for g in self.sym.guards]
        out.append(f"global state == {_state_text(self.state)}")
        return out


_LOAD_OPS = {"local": 0, "global": 1, "gmod": 2, "attr": 3, "item": 4, "cell": 5,
             "type": 6, "fget": 7}  # guards/program.c L_*


def _state_probes(torch: Any, state: tuple) -> tuple:
    """``global_state`` as (function, args, expected) triples the C program calls: the
    same facts, so the program and ``global_state`` always agree.  With autocast off
    everywhere, one probe stands for every device type (the common case: six calls)."""
    grad, inference, cache, any_on, autocast, default, (det, warn_only) = state
    probes = [(torch.is_grad_enabled, (), grad),
              (torch.is_inference_mode_enabled, (), inference),
              (torch.is_autocast_cache_enabled, (), cache)]
    if any_on is not None:
        probes.append((_any_autocast(torch), (), any_on))
    if any_on is not False:   # on somewhere, or unknown: per device type
        try:
            torch.is_autocast_enabled("cpu")
            checks = [(torch.is_autocast_enabled, torch.get_autocast_dtype, (d,))
                      for d in _AUTOCAST_DEVICES]
        except TypeError:  # before 2.4 (see _autocast_state)
            checks = [(torch.is_autocast_cpu_enabled, torch.get_autocast_cpu_dtype, ()),
                      (torch.is_autocast_enabled, torch.get_autocast_gpu_dtype, ())]
        for (enabled_fn, dtype_fn, args), (enabled, dtype) in zip(checks, autocast):
            probes.append((enabled_fn, args, enabled))
            if enabled:
                probes.append((dtype_fn, args, dtype))
    probes.append((torch.get_default_dtype, (), default))
    probes.append((torch.are_deterministic_algorithms_enabled, (), det))
    if det:
        probes.append((torch.is_deterministic_algorithms_warn_only_enabled, (), warn_only))
    return tuple(probes)


def arg_names(code: Any) -> tuple:
    """The names of ``code``'s argument slots, in order (what the hook can read by index:
    positional, keyword-only, *args, **kwargs)."""
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + \
        bool(code.co_flags & 0x08)
    return tuple(code.co_varnames[:n])


def _depth(source: tuple) -> int:
    return 0 if source[0] in ("local", "global", "gmod") else 1 + _depth(source[1])


def _state_text(state: tuple) -> str:
    grad, inference, cache, _any, autocast, dtype, (det, warn_only) = state
    amp = ", ".join(f"{d}:{'on ' + str(t).replace('torch.', '') if on else 'off'}"
                    for d, (on, t) in zip(_AUTOCAST_DEVICES, autocast))
    deterministic = ("off" if not det else "warn_only" if warn_only else "on")
    return (f"(grad={'on' if grad else 'off'}, inference={'on' if inference else 'off'}, "
            f"autocast[{amp}], autocast_cache={'on' if cache else 'off'}, "
            f"default_dtype={str(dtype).replace('torch.', '')}, "
            f"deterministic={deterministic})")


class ArgumentTypes:
    """The guard of a function that did no tensor work: the types of its arguments.

    Guarding such a function on its argument values would capture it again for every
    new value; on their types, a later call with a tensor is captured, while one with
    another int runs eager at once.
    """

    __slots__ = ("types",)

    def __init__(self, f_locals: dict):
        self.types = tuple((k, type(v)) for k, v in f_locals.items())

    def __call__(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> bool:
        if len(f_locals) != len(self.types):
            return False
        for name, kind in self.types:
            if type(f_locals.get(name, MISSING)) is not kind:
                return False
        return True

    def failures(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> list[str]:
        now = {k: type(v).__name__ for k, v in f_locals.items()}
        then = {k: t.__name__ for k, t in self.types}
        return [f"argument types: expected {then}, got {now}"] if now != then else []

    def lines(self) -> list[str]:
        return [f"type({k}) is {t.__name__}" for k, t in self.types]


class Capture(NamedTuple):
    """A finished capture: the graph, its inputs' sources, its guard."""

    graph_module: Any
    sources: list
    guard: Guard
    example_inputs: list


def capture(code: Any, f_locals: dict, f_globals: dict, f_builtins: dict,
            shapes: Any = None) -> Any:
    """A ``Capture``, a ``(CaptureBreak, Guard)`` pair, or ``(None, Guard)`` when the
    function does no tensor work.  ``shapes``: the ``_shapes.DimPolicy`` saying which
    dimensions are dynamic (None: all static)."""
    import torch

    symbolic = False
    while True:
        builder = GraphBuilder(shapes, symbolic)
        try:
            out = _C.capture(code, f_locals, f_globals, f_builtins, builder, torch.Tensor)
            return _finish(torch, code, f_locals, builder, out)
        except NeedsSymbolic:   # a dynamic input turned up: again, under a ShapeEnv
            symbolic = True
        except _Unguardable:    # a size fact the guard cannot check: capture static
            if shapes is None:
                raise
            shapes, symbolic = None, False


class _Unguardable(Exception):
    """A dynamic capture assumed something of its sizes no guard can check (a size that
    no input gives): it is done again with static shapes."""


def _guard(torch: Any, builder: GraphBuilder, f_locals: dict, code: Any) -> Guard:
    try:
        return Guard(torch, builder, f_locals, code)
    except ValueError as exc:
        if builder.symbolic:
            raise _Unguardable(str(exc)) from exc
        raise


def _finish(torch: Any, code: Any, f_locals: dict, builder: GraphBuilder, out: dict) -> Any:
    if out["status"] == "break":
        where = out["code"]
        brk = CaptureBreak(where.co_filename, _line_of(where, out["offset"]),
                           dis.opname[out["opcode"]] if out["opcode"] >= 0 else "(start)",
                           Reason(out["reason"]).id, out["detail"], where.co_name)
        guard = _guard(torch, builder, f_locals, code)
        guard.break_at = (brk.filename, brk.line, brk.instruction, brk.reason)
        return brk, guard
    result = out["result"]
    try:
        builder.check_output(result)
    except GraphBreak as exc:
        brk = CaptureBreak(code.co_filename, code.co_firstlineno, "RETURN_VALUE",
                           exc.reason.id, exc.detail, code.co_name)
        return brk, _guard(torch, builder, f_locals, code)
    if not any(n.op in ("call_function", "call_method") for n in builder.graph.nodes):
        return None, ArgumentTypes(f_locals)
    gm = builder.output(result)
    guard = _guard(torch, builder, f_locals, code)
    return Capture(gm, builder.sources, guard, builder.example_inputs())


_CHECK_KNOWN_TENSORS = 1  # guards/program.c P_CHECK_KNOWN_TENSORS


def make_entry(cap: Capture, compiled: Any, context: Any, arg_check: Any = None) -> Any:
    """The CALL entry running ``compiled`` on the inputs its guard program reads;
    ``arg_check`` as ``agspeed._tensor_check.arg_check`` makes it (None: none)."""
    guard = cap.guard
    assert guard.inputs == tuple(cap.sources)
    read = guard.read

    def run(f_locals: dict, f_globals: dict, f_builtins: dict) -> Any:
        return compiled(*read(f_locals, f_globals, f_builtins))

    run.graph_module = cap.graph_module
    run.guard = guard
    # the hook calls compiled(*inputs) with the inputs the guard program gathered while
    # checking; `run` serves the first call, made before the entry is in the cache
    return _C.CacheEntry(_C.ACTION_CALL, guard=guard, compiled=run, context=context,
                         graph=compiled, signed=guard.sym is None,
                         arg_check=arg_check if guard.sym is None else None)
