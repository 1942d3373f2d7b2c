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
  cache) and the default dtype.

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
from agspeed._graph import REASONS, GraphBreak, GraphBuilder
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
        """What the user can do about it (``_graph.REASONS``)."""
        return REASONS.get(self.reason, ("", ""))[1]

    def __str__(self) -> str:
        where = f"{os.path.basename(self.filename)}:{self.line}"
        hint = f"; hint: {self.hint}" if self.hint else ""
        return f"{where} {self.instruction}: {self.reason} ({self.detail}{hint})"


def _line_of(code: Any, offset: int) -> int | None:
    for ins in dis.get_instructions(code):
        if ins.offset == offset:
            return ins.positions.lineno if ins.positions else None
    return code.co_firstlineno


def _autocast_state(torch: Any) -> tuple:
    """(enabled, dtype) of autocast per device type, on torch 2.4+ and older."""
    try:
        return tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                     for d in _AUTOCAST_DEVICES)
    except TypeError:  # before 2.4 these took no device argument
        return ((torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()),
                (torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()))


def global_state(torch: Any) -> tuple:
    """Everything outside the frame that changes what a graph computes."""
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.is_autocast_cache_enabled(), _autocast_state(torch),
            torch.get_default_dtype())


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


# Check kinds: what a guard compares for one source.
_TENSOR, _EQ, _LEN, _ID, _ABSENT = range(5)
_CHECK_NAMES = {_TENSOR: "tensor", _EQ: "==", _LEN: "len", _ID: "is", _ABSENT: "absent"}


def _check_for(builder: GraphBuilder, value: Any) -> tuple:
    if value is MISSING:
        return (_ABSENT, None)
    if builder._is_static(value):
        return (_EQ, (type(value), value))
    if isinstance(value, (dict, list, tuple)):
        return (_LEN, (type(value), len(value)))
    return (_ID, _holder(value))


def _passes(kind: int, expected: Any, value: Any) -> bool:
    if kind == _TENSOR:
        return type(value) is expected[0] and _tensor_spec(value) == expected
    if kind == _EQ:
        return type(value) is expected[0] and value == expected[1]
    if kind == _LEN:
        return type(value) is expected[0] and len(value) == expected[1]
    if kind == _ID:
        held = expected()
        return held is not None and value is held
    return value is MISSING


def _shown(kind: int, expected: Any) -> str:
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
    if kind == _TENSOR and hasattr(value, "stride"):
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
    hook calls: no Python frame runs on a passing or failing call.
    """

    __slots__ = ("checks", "aliases", "state", "torch", "break_at", "inputs")

    def __init__(self, torch: Any, builder: GraphBuilder, f_locals: dict):
        seen: set = set()
        checks = []
        for source, (node, value) in zip(builder.sources, builder._inputs.values()):
            checks.append((source, _TENSOR, _tensor_spec(value)))
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
        self._compile()

    def _compile(self) -> None:
        """Turn checks, aliases and state into the C program (see guards/program.c)."""
        slots: dict[tuple, int] = {}
        loads: list[tuple] = []

        def slot(source: tuple) -> int:
            got = slots.get(source)
            if got is None:
                kind = source[0]
                if kind in ("local", "global"):
                    load = (_LOAD_OPS[kind], -1, source[1])
                elif kind == "gmod":
                    load = (_LOAD_OPS[kind], -1, (source[1], source[2]))
                else:
                    load = (_LOAD_OPS[kind], slot(source[1]),
                            source[2] if len(source) > 2 else None)
                got = slots[source] = len(loads)
                loads.append(load)
            return got

        checks = []
        for source, kind, expected in self.checks:
            if kind == _TENSOR:
                a, b = expected[0], expected[1:]
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
                          resolve_step, MISSING, self.torch.nn.Module, outputs, flags)

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
        out.break_at, out.inputs = self.break_at, self.inputs
        out._compile()
        return out

    def check_in_python(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> bool:
        """The same answer as calling the guard, computed in Python (for tests)."""
        memo: dict = {}
        for source, kind, expected in self.checks:
            value = resolve(source, f_locals, f_globals, f_builtins, memo)
            if not _passes(kind, expected, value):
                return False
        for a, b in self.aliases:
            if resolve(a, f_locals, f_globals, f_builtins, memo) is not \
                    resolve(b, f_locals, f_globals, f_builtins, memo):
                return False
        return global_state(self.torch) == self.state

    def failures(self, f_locals: dict, f_globals: dict, f_builtins: dict) -> list[str]:
        """Every failing check, as "source: expected X, got Y" (for recompile logs)."""
        memo: dict = {}
        out = []
        for source, kind, expected in self.checks:
            value = resolve(source, f_locals, f_globals, f_builtins, memo)
            if not _passes(kind, expected, value):
                out.append(f"{describe(source)}: expected {_shown(kind, expected)}, "
                           f"got {_got(kind, value)}")
        for a, b in self.aliases:
            if resolve(a, f_locals, f_globals, f_builtins, memo) is not \
                    resolve(b, f_locals, f_globals, f_builtins, memo):
                out.append(f"{describe(a)} is {describe(b)}: no longer the same tensor")
        state = global_state(self.torch)
        if state != self.state:
            out.append(f"global state: expected {_state_text(self.state)}, "
                       f"got {_state_text(state)}")
        return out

    def lines(self) -> list[str]:
        """The checks, readable (for AGSPEED_LOG=guards and explain)."""
        out = [f"{describe(s)} {_CHECK_NAMES[k]} {_shown(k, e)}" for s, k, e in self.checks]
        out += [f"{describe(a)} is {describe(b)}" for a, b in self.aliases]
        out.append(f"global state == {_state_text(self.state)}")
        return out


_LOAD_OPS = {"local": 0, "global": 1, "gmod": 2, "attr": 3, "item": 4, "cell": 5,
             "type": 6, "fget": 7}  # guards/program.c L_*


def _state_probes(torch: Any, state: tuple) -> tuple:
    """``global_state`` as (function, args, expected) triples the C program calls."""
    grad, inference, cache, autocast, default = state
    probes = [(torch.is_grad_enabled, (), grad),
              (torch.is_inference_mode_enabled, (), inference),
              (torch.is_autocast_cache_enabled, (), cache)]
    try:
        torch.is_autocast_enabled("cpu")
        for device, (enabled, dtype) in zip(_AUTOCAST_DEVICES, autocast):
            probes += [(torch.is_autocast_enabled, (device,), enabled),
                       (torch.get_autocast_dtype, (device,), dtype)]
    except TypeError:  # before 2.4 (see _autocast_state)
        (cpu_on, cpu_dtype), (gpu_on, gpu_dtype) = autocast
        probes += [(torch.is_autocast_cpu_enabled, (), cpu_on),
                   (torch.get_autocast_cpu_dtype, (), cpu_dtype),
                   (torch.is_autocast_enabled, (), gpu_on),
                   (torch.get_autocast_gpu_dtype, (), gpu_dtype)]
    probes.append((torch.get_default_dtype, (), default))
    return tuple(probes)


def _depth(source: tuple) -> int:
    return 0 if source[0] in ("local", "global", "gmod") else 1 + _depth(source[1])


def _state_text(state: tuple) -> str:
    grad, inference, cache, autocast, dtype = state
    amp = ", ".join(f"{d}:{'on ' + str(t).replace('torch.', '') if on else 'off'}"
                    for d, (on, t) in zip(_AUTOCAST_DEVICES, autocast))
    return (f"(grad={'on' if grad else 'off'}, inference={'on' if inference else 'off'}, "
            f"autocast[{amp}], autocast_cache={'on' if cache else 'off'}, "
            f"default_dtype={str(dtype).replace('torch.', '')})")


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


def capture(code: Any, f_locals: dict, f_globals: dict, f_builtins: dict) -> Any:
    """A ``Capture``, a ``(CaptureBreak, Guard)`` pair, or ``(None, Guard)`` when the
    function does no tensor work."""
    import torch

    builder = GraphBuilder()
    out = _C.capture(code, f_locals, f_globals, f_builtins, builder, torch.Tensor)
    if out["status"] == "break":
        where = out["code"]
        brk = CaptureBreak(where.co_filename, _line_of(where, out["offset"]),
                           dis.opname[out["opcode"]] if out["opcode"] >= 0 else "(start)",
                           out["reason"], out["detail"], where.co_name)
        guard = Guard(torch, builder, f_locals)
        guard.break_at = (brk.filename, brk.line, brk.instruction, brk.reason)
        return brk, guard
    result = out["result"]
    try:
        builder.check_output(result)
    except GraphBreak as exc:
        brk = CaptureBreak(code.co_filename, code.co_firstlineno, "RETURN_VALUE",
                           exc.reason, exc.detail, code.co_name)
        return brk, Guard(torch, builder, f_locals)
    if not any(n.op in ("call_function", "call_method") for n in builder.graph.nodes):
        return None, ArgumentTypes(f_locals)
    guard = Guard(torch, builder, f_locals)
    gm = builder.output(result)
    return Capture(gm, builder.sources, guard, builder.example_inputs())


_CHECK_KNOWN_TENSORS = 1  # guards/program.c P_CHECK_KNOWN_TENSORS


def make_entry(cap: Capture, compiled: Any, context: Any) -> Any:
    """The CALL entry running ``compiled`` on the inputs its guard program reads."""
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
                         graph=compiled)
