"""The ``jit`` backend: the captured graph traced into TorchScript and run by torch's graph
executor (the profiling executor: it profiles the first call, then runs an optimized plan
with autodiff for the backward and, where torch has one for the device, a fuser).

It owns the translation from a ``torch.fx.GraphModule`` to a traced ``ScriptModule`` and
back to the graph's own calling convention: ``compiled(*inputs)`` returns what
``gm.forward(*inputs)`` returns, with the same containers (tuple, list, namedtuple, dict)
and the same non-tensor values.  TorchScript can only return tensors and tuples of them,
so the trace returns the output's tensor leaves and the callable puts them back into the
structure recorded while tracing, with the non-tensor leaves (ints, ``torch.Size``,
``None``) as the constants they were: agspeed gives this backend static graphs only, one
per size, so a size-valued output cannot change under a graph's guards.

Decisions, and why:

* Never freeze.  agspeed passes parameters and buffers as graph inputs, so
  ``torch.jit.freeze`` / ``optimize_for_inference`` find no attributes to fold: the graph
  comes back the same (conv/batch-norm folding and prepacking need constant weights).
  Freezing a module that holds the weights as attributes would bake their values in, and
  the callable would go on computing with stale weights once they change (training
  between two evaluations).  Not freezing is the only choice that stays correct.
* Fusers.  On CUDA the TensorExpr fuser (NNC) is used.  On CPU it is used only where
  torch was built with LLVM (``torch._C._llvm_enabled()``): without LLVM, allowing CPU
  fusion makes the first optimized run fail with "LLVM Backend not found".  The switches
  are process-global in torch and the user's own TorchScript reads them too, so each call
  of a compiled graph sets the ones it needs (``_jit_set_texpr_fuser_enabled``,
  ``_jit_override_can_fuse_on_cpu``, ``_jit_override_can_fuse_on_gpu``), only where they
  differ from what it wants, and puts them back after the call: the executor optimizes
  (and fuses) the forward during calls.  The backward runs inside autograd after the call
  returned, under the switches as the process has them.  One switch is changed for good:
  CPU fusion switched on in a torch without LLVM is switched off (and logged) when a graph
  is compiled, since there it can only fail, in the user's TorchScript as in ours.
  ``describe()`` says what this process gets.
* Tracing runs the graph once on the real inputs, and a run has side effects: batch norm
  in training updates its running statistics, in-place ops write their inputs, dropout
  draws from the generator.  The trace must not count as a step of the program, so the
  generators' states are saved and put back, and so is every input or graph state the
  trace changed.  Copied before the trace: the tensors that are not parameters (buffers,
  data: batch norm writes its statistics without moving their version counter, so only a
  copy can tell), and, where the graph has an in-place op, the parameters that autograd
  would let it write (all of them with grad mode off, frozen ones with it on).  A write
  to a tensor not copied shows in its version counter and makes the backend refuse the
  graph.
* Tensors turned into Python values during the trace (``bool(t)``, ``int(t)``,
  ``t.item()``) become constants of the trace.  Under a trace sizes are tensors, so this
  happens for sizes too (``F.batch_norm`` checks its batch size that way): sound for a
  static graph.  Each conversion is judged by what the traced value derives from; one
  derived from a tensor's data makes the backend refuse the graph, as does a
  ``TracerWarning`` about an in-place write through one of several views.  To see every
  conversion, ``torch.Tensor``'s conversion methods are wrapped for the duration of a
  trace (process-global; other threads pass straight through) and traces are serialized.
* Autocast: the graph runs under the autocast state it was captured in (agspeed guards
  it), so the trace records the casts autocast inserts.  Autocast's weight cache is off
  during the trace (and only then): a cast it already holds would be traced as a constant,
  which fails for weights that require gradients and would hide later weight changes.
  The compiled graph casts on every call: where weights change in place inside one
  autocast region with the cache on, it sees the new weights and eager the cached casts.
* ``torch.jit.trace`` warns that TorchScript is deprecated.  That is agspeed's business,
  not the user's: those warnings are swallowed during the trace and one line is logged,
  once per process, on ``agspeed.autotune``.  Warnings of the graph's own code are passed
  on.

Refused (``RuntimeError``; the runtime then runs the graph eagerly): graphs with symbolic
sizes (``Capabilities(dynamic=False)`` keeps the runtime from asking), inputs that are not
tensors, outputs with no tensor or with leaves that are neither tensors nor constants,
graphs that fail to trace, the unsound traces above, and trained graphs that enter an
autocast region of their own (TorchScript differentiates a cast region's ops as if their
operands shared one dtype).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import operator
import sys
import threading
import warnings
from typing import Any, Callable

from agspeed.backends._protocol import Capabilities, is_dynamic

__all__ = ["backend", "describe"]

_log = logging.getLogger("agspeed.autotune")
_said_deprecated = False
# One trace at a time: the conversion wrappers and the warning filters are process-wide.
_TRACE_LOCK = threading.RLock()

# Leaf types an output may hold besides tensors: values a static graph returns unchanged
# on every call.  torch's by name, so that importing this module does not import torch.
_CONSTANT_TYPES = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis), slice)
_TORCH_CONSTANT_TYPES = ("Size", "dtype", "device", "layout", "memory_format")

# TracerWarnings, other than tensor-to-Python conversions (judged by _Conversions), that
# mean the traced graph is wrong for other inputs: an in-place write the trace recorded
# on one view of memory that other views share.
_UNSOUND = ("live references to the data region",)


@functools.lru_cache(maxsize=None)
def _unavailable() -> str | None:
    """Why TorchScript cannot run in this process, or None (asked often: cached)."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    try:
        import torch
    except Exception as exc:  # a broken install must read as "unavailable", not raise
        return f"torch does not import ({type(exc).__name__})"
    jit = getattr(torch, "jit", None)
    if jit is None or not hasattr(jit, "trace"):
        return "this torch has no TorchScript (torch.jit.trace)"
    state = getattr(getattr(jit, "_state", None), "_enabled", None)
    if state is not None and not state.enabled:
        return "TorchScript is switched off (PYTORCH_JIT=0)"
    return None


def describe() -> str:
    """The executor and the fuser per device type this process gets, in one line."""
    reason = _unavailable()
    if reason:
        return f"unavailable: {reason}"
    import torch

    c = torch._C
    # The executor mode has a setter that answers the previous value, and no getter.
    profiling = c._jit_set_profiling_executor(True)
    c._jit_set_profiling_executor(profiling)
    parts = ["profiling executor" if profiling else "legacy executor"]
    if not c._get_graph_executor_optimize():
        parts.append("optimizations off (no fusion, no autodiff)")
    parts.append("CPU fuser: NNC (LLVM)" if c._llvm_enabled()
                 else "CPU fuser: none (torch built without LLVM)")
    parts.append("CUDA fuser: NNC" if torch.backends.cuda.is_built()
                 else "CUDA fuser: none (torch built without CUDA)")
    return "; ".join(parts)


def _disarm_cpu_fusion(torch: Any) -> None:
    """Switch CPU fusion off for good where torch has no LLVM and it is on.

    There it can only fail ("LLVM Backend not found"), in the user's TorchScript as in
    ours; and the backward of a compiled graph runs inside autograd, after the call that
    could have switched it off for the forward has returned."""
    c = torch._C
    if not c._llvm_enabled() and c._jit_can_fuse_on_cpu():
        c._jit_override_can_fuse_on_cpu(False)
        _log.info("jit: CPU fusion was on, but this torch has no LLVM to compile fused "
                  "kernels; switched it off")


def _switches(torch: Any, devices: set[str]) -> tuple:
    """The fuser switches a graph on ``devices`` needs: (getter, setter, wanted) each."""
    c = torch._C
    wanted = [(c._jit_can_fuse_on_cpu, c._jit_override_can_fuse_on_cpu, c._llvm_enabled())]
    if "cuda" in devices:
        wanted.append((c._jit_can_fuse_on_gpu, c._jit_override_can_fuse_on_gpu, True))
    if "cuda" in devices or c._llvm_enabled():
        wanted.append((c._jit_texpr_fuser_enabled, c._jit_set_texpr_fuser_enabled, True))
    return tuple(wanted)


def _is_constant(torch: Any, leaf: Any) -> bool:
    """Whether an output leaf is a plain value that the graph returns on every call."""
    return isinstance(leaf, _CONSTANT_TYPES) or any(
        isinstance(leaf, getattr(torch, name)) for name in _TORCH_CONSTANT_TYPES)


def _untraced(torch: Any, leaf: Any) -> Any:
    """An output leaf of the trace run as eager returns it.  The tracer turns sizes
    (``x.size(0)``, ``x.numel()``, the items of ``x.shape``) and arithmetic on them into
    0-d tensors; eager has Python numbers there, constants of a static graph."""
    if isinstance(leaf, torch.Size):
        return torch.Size(int(d) for d in leaf)
    if isinstance(leaf, torch.Tensor) and leaf.dim() == 0 and torch._C._is_tracing():
        try:
            value = torch._C._get_value_trace(leaf)
        except Exception:  # not a value of the trace: a tensor of its own
            return leaf
        if _from_numbers(torch, value):
            return leaf.item()
    return leaf


def _from_numbers(torch: Any, value: Any, depth: int = 0) -> bool:
    """Whether a value of the trace is a wrapped Python number (``prim::NumToTensor``) or
    an op on such numbers and constants only."""
    node = value.node()
    if node.kind() == "prim::NumToTensor":
        return True
    if depth > 32:  # a long chain of arithmetic on sizes is not worth the walk
        return False
    numbers = 0
    for i in range(node.inputsSize()):  # by index: see _Conversions._from_sizes
        arg = node.inputsAt(i)
        if not isinstance(arg.type(), torch._C.TensorType):
            continue
        if arg.node().kind() == "prim::Constant":  # a Python scalar operand
            continue
        if not _from_numbers(torch, arg, depth + 1):
            return False
        numbers += 1
    return numbers > 0


@functools.lru_cache(maxsize=None)
def _flat_module() -> type:
    """The module the trace runs: the graph with its output flattened to tensor leaves.

    Built on first use so that importing this backend does not import torch."""
    import torch
    from torch.utils._pytree import tree_flatten

    class FlatOutputs(torch.nn.Module):
        def __init__(self, gm: Any, layout: dict) -> None:
            super().__init__()
            self.gm = gm
            self.layout = layout  # filled by the trace's single run

        def forward(self, *args: Any) -> Any:
            # torch.Size is a constant of the output, not a tuple to rebuild (it would
            # come back a plain tuple)
            leaves, spec = tree_flatten(self.gm(*args),
                                        is_leaf=lambda x: isinstance(x, torch.Size))
            leaves = [_untraced(torch, leaf) for leaf in leaves]
            tensors = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
            # Keep the structure, not this run's tensors (nor the autograd graph behind them)
            self.layout.update(leaves=[None if i in tensors else leaf
                                       for i, leaf in enumerate(leaves)],
                               spec=spec, tensors=tensors)
            for i, leaf in enumerate(leaves):
                if i not in tensors and not _is_constant(torch, leaf):
                    self.layout["refused"] = (f"jit: graph output leaf {i} is a "
                                              f"{type(leaf).__name__}, neither a tensor "
                                              f"nor a constant")
            if not tensors:
                self.layout["refused"] = "jit: the graph returns no tensor; nothing to trace"
            if "refused" in self.layout:
                # Said after the trace: an exception raised here would cross libtorch's
                # C++ frames as a C++ exception.
                return torch.zeros(())
            if spec.is_leaf():
                return leaves[0]
            return tuple(leaves[i] for i in tensors)

    return FlatOutputs


# Tensor methods that hand a tensor's value to Python: under a trace, the value becomes a
# constant of the graph.
_CONVERSIONS = ("__bool__", "__int__", "__float__", "__index__", "__complex__", "item",
                "tolist")
# Nodes of a trace whose result depends on a tensor's metadata only, not its data.
_METADATA = frozenset({"prim::Constant", "aten::size", "aten::sym_size", "aten::numel",
                       "aten::sym_numel", "aten::dim", "prim::dtype", "prim::device",
                       "prim::layout", "prim::shape"})
_IN_PLACE_OPERATORS = frozenset({operator.setitem, operator.iadd, operator.isub,
                                 operator.imul, operator.itruediv, operator.ifloordiv,
                                 operator.imod, operator.ipow, operator.iand, operator.ior,
                                 operator.ixor, operator.ilshift, operator.irshift,
                                 operator.imatmul})


def _may_write(gm: Any) -> bool:
    """Whether the graph has an op that may write a tensor it did not create (in-place
    methods and operators, ``out=``, ``inplace=True``, modules with buffers)."""
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        if node.kwargs.get("inplace") is True or "out" in node.kwargs:
            return True
        if node.op == "call_module":
            sub = gm.get_submodule(node.target)
            if getattr(sub, "inplace", False) is True or next(sub.buffers(), None) is not None:
                return True
            continue
        target = node.target
        if node.op == "call_function" and target in _IN_PLACE_OPERATORS:
            return True
        schema = getattr(target, "_schema", None)  # torch.ops overloads say it themselves
        if schema is not None and schema.is_mutable:
            return True
        name = target if isinstance(target, str) else getattr(target, "__name__", "")
        if name.endswith("_") and not name.endswith("__"):
            return True
    return False


class _UndoTrace:
    """Saves what the tracing run may change (generator states, inputs, graph state) and
    puts back what it changed, so that compiling changes nothing the program can see."""

    def __init__(self, torch: Any, gm: Any, example_inputs: list) -> None:
        self.torch = torch
        state = {}
        for t in (*example_inputs, *gm.parameters(), *gm.buffers()):
            state.setdefault(id(t), t)
        self.state = list(state.values())
        self.versions = [self._version(t) for t in self.state]
        writes = _may_write(gm)
        grad = torch.is_grad_enabled()
        self.saved = []
        with torch.no_grad():
            for t in self.state:
                weight = isinstance(t, torch.nn.Parameter) or t.is_leaf and t.requires_grad
                # in grad mode, autograd refuses in-place writes to leaves requiring grad
                locked = grad and t.is_leaf and t.requires_grad
                if not weight or writes and not locked:
                    self.saved.append((t, t.detach().clone(), self._version(t)))
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = (torch.cuda.get_rng_state_all()
                         if torch.cuda.is_available() and torch.cuda.is_initialized() else None)

    @staticmethod
    def _version(t: Any) -> int | None:
        try:
            return t._version
        except Exception:  # inference tensors have no version counter
            return None

    def _changed(self, t: Any, copy: Any, version: int | None) -> bool:
        if version is not None and self._version(t) != version:
            return True
        if t.is_inference() and not self.torch.is_inference_mode_enabled():
            return False  # nothing can have written it: writes need inference mode
        with self.torch.no_grad():
            same = t == copy
            if t.is_floating_point() or t.is_complex():
                same |= t.isnan() & copy.isnan()
            return not bool(same.all())

    def restore(self) -> None:
        torch = self.torch
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        # Only what changed is written back: an outer autograd graph may have saved the
        # others, and a write (even of equal values) would invalidate them.
        with torch.no_grad():
            for t, copy, version in self.saved:
                if self._changed(t, copy, version):
                    t.copy_(copy)
                    if version is not None:
                        # the values are the old ones again, and so is their version
                        torch._C._autograd._unsafe_set_version_counter((t,), (version,))
        saved = {id(t) for t, _, _ in self.saved}
        unsaved = [t for t, v in zip(self.state, self.versions)
                   if id(t) not in saved and v is not None and self._version(t) != v]
        if unsaved:
            shapes = ", ".join(str(tuple(t.shape)) for t in unsaved[:3])
            raise RuntimeError(f"jit: tracing wrote {len(unsaved)} parameter(s) (shapes "
                               f"{shapes}) in place; the backend cannot undo that")


class _Conversions:
    """Judges each tensor the trace hands to Python (``bool(t)``, ``int(t)``, ``t.item()``):
    the trace keeps its value as a constant.  That is sound for a static graph where the
    value derives from sizes only, unsound where it derives from data.

    The methods are wrapped on ``torch.Tensor`` for the duration of the trace (undone on
    exit; in other threads, which are not tracing, the wrappers just call the method)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.judged = 0
        self.from_data: list[str] = []

    def __enter__(self) -> "_Conversions":
        base = self.torch._C.TensorBase
        for name in _CONVERSIONS:
            setattr(self.torch.Tensor, name, self._wrap(name, getattr(base, name)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in _CONVERSIONS:
            if name in vars(self.torch.Tensor):
                delattr(self.torch.Tensor, name)

    def _wrap(self, name: str, method: Callable) -> Callable:
        torch = self.torch

        def converted(t: Any, *args: Any, **kwargs: Any) -> Any:
            if torch._C._is_tracing():
                self.judged += 1
                if not self._from_sizes(t):
                    self.from_data.append(f"Tensor.{name} of a value computed from data")
            return method(t, *args, **kwargs)

        return converted

    def _from_sizes(self, t: Any) -> bool:
        try:
            value = self.torch._C._get_value_trace(t)
        except Exception:  # not a traced value: a constant of the trace already
            return True
        seen = set()
        stack = [value]
        while stack:
            v = stack.pop()
            if v.unique() in seen:
                continue
            seen.add(v.unique())
            node = v.node()
            kind = node.kind()
            if kind in _METADATA:
                continue
            if kind in ("prim::Param", "prim::GetAttr"):  # an input's or a weight's data
                return False
            # by index: iterating node.inputs() ends with a C++ exception (pybind11)
            stack.extend(node.inputsAt(i) for i in range(node.inputsSize()))
        return True


def _say_deprecated(torch: Any) -> None:
    global _said_deprecated
    if not _said_deprecated:
        _said_deprecated = True
        _log.info("jit: TorchScript is deprecated in torch %s; agspeed uses it as one "
                  "candidate backend (%s)", torch.__version__, describe())


@functools.lru_cache(maxsize=None)
def _no_stored_inputs(trace: Any) -> dict:
    """The argument that keeps ``torch.jit.trace`` from storing its example inputs in the
    traced module: they are the graph's real inputs (the model's parameters among them),
    which the compiled graph would keep alive for as long as its cache entry lives."""
    import inspect

    return {"_store_inputs": False} if "_store_inputs" in inspect.signature(trace).parameters \
        else {}


def _trace(torch: Any, module: Any, example_inputs: list) -> Any:
    """``torch.jit.trace`` of ``module`` with its warnings sorted: TorchScript's own
    deprecation notices dropped, unsound traces raised, other warnings passed on."""
    with warnings.catch_warnings(record=True) as caught, _Conversions(torch) as conversions:
        warnings.simplefilter("always")  # see every TracerWarning, torch's own included
        try:
            traced = torch.jit.trace(module, tuple(example_inputs), check_trace=False,
                                     strict=False, **_no_stored_inputs(torch.jit.trace))
        except Exception as exc:
            raise RuntimeError(f"jit: tracing failed ({type(exc).__name__}: {exc})") from exc
    _say_deprecated(torch)
    unsound = list(conversions.from_data)
    converted = 0
    for w in caught:
        text = str(w.message)
        if issubclass(w.category, DeprecationWarning) and "torch.jit" in text:
            continue
        if issubclass(w.category, torch.jit.TracerWarning):
            if text.startswith("Converting a tensor to a"):  # a Python value, a NumPy array
                converted += 1
            elif any(marker in text for marker in _UNSOUND):
                unsound.append(text.split(". ")[0])
            continue
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    if converted > conversions.judged:  # converted by a path the wrappers do not see
        unsound.append("a tensor was converted to a Python value")
    if unsound:
        raise RuntimeError(f"jit: the trace would not be valid for other inputs: "
                           f"{unsound[0]}")
    return traced


def _check_graph(torch: Any, gm: Any, example_inputs: list) -> set[str]:
    """Refuse what TorchScript cannot take; the graph's device types otherwise."""
    reason = _unavailable()
    if reason:
        raise RuntimeError(f"jit: unavailable: {reason}")
    if is_dynamic(gm):
        raise RuntimeError("jit: the graph has symbolic sizes; TorchScript traces take "
                           "static sizes only (one graph per size)")
    for i, t in enumerate(example_inputs):
        if not isinstance(t, torch.Tensor):
            raise RuntimeError(f"jit: graph input {i} is a {type(t).__name__}, not a tensor; "
                               f"TorchScript traces tensor inputs only")
    from agspeed._checkpoint import has_regions

    if has_regions(gm):
        raise RuntimeError("jit: the graph checkpoints activations (torch.utils.checkpoint); "
                           "a TorchScript trace would record the region's operations and "
                           "keep their activations")
    if any(n.op == "call_function" and n.target is torch._C._set_grad_enabled
           for n in gm.graph.nodes):
        raise RuntimeError("jit: the graph switches grad mode (a with block); a TorchScript "
                           "trace would record the operations but not the switch")
    if any(n.op == "call_function" and n.target is torch.amp._enter_autocast
           for n in gm.graph.nodes) and any(t.requires_grad for t in example_inputs):
        raise RuntimeError("jit: the graph enters autocast regions and is trained; "
                           "TorchScript's autodiff mixes the regions' dtypes in the backward")
    devices = {t.device.type for t in example_inputs}
    foreign = devices - {"cpu", "cuda"}
    if foreign:
        raise RuntimeError(f"jit: runs on cpu and cuda, not {', '.join(sorted(foreign))}")
    return devices


def backend(gm: Any, example_inputs: list) -> Callable[..., Any]:
    """Trace ``gm`` on ``example_inputs`` into TorchScript; return a callable with the
    graph's signature and output structure.  Raises RuntimeError for graphs it refuses."""
    import torch
    from torch.utils._pytree import tree_unflatten

    devices = _check_graph(torch, gm, example_inputs)
    _disarm_cpu_fusion(torch)
    layout: dict = {}
    module = _flat_module()(gm, layout)
    undo = _UndoTrace(torch, gm, example_inputs)
    cache = torch.is_autocast_cache_enabled()
    with _TRACE_LOCK:
        try:
            torch.set_autocast_cache_enabled(False)
            traced = _trace(torch, module, example_inputs)
        finally:
            torch.set_autocast_cache_enabled(cache)
            undo.restore()
    if "refused" in layout:
        raise RuntimeError(layout["refused"])
    leaves, spec, tensors = layout["leaves"], layout["spec"], layout["tensors"]
    switches = _switches(torch, devices)
    # tuple(traced(...)) is the output itself for one tensor or a plain tuple of tensors
    as_is = spec.is_leaf() or (spec.type is tuple and len(tensors) == len(leaves)
                               and spec.num_nodes == spec.num_leaves + 1)

    def compiled(*args: Any) -> Any:
        restore = None
        for get, put, want in switches:
            now = get()
            if now != want:
                restore = restore or []
                restore.append((put, now))
                put(want)
        try:
            out = traced(*args)
        finally:
            if restore:
                for put, now in restore:
                    put(now)
        if as_is:
            return out
        rebuilt = list(leaves)
        for i, t in zip(tensors, out):
            rebuilt[i] = t
        return tree_unflatten(rebuilt, spec)

    compiled.traced = traced  # for tests and logs: the ScriptModule that runs
    return compiled


# Traces have static sizes; TorchScript's autodiff runs the backward; the TensorExpr fuser
# covers cpu (with LLVM) and cuda, and the interpreter runs anything else there.
backend.capabilities = Capabilities(training=True, dynamic=False, devices={"cpu", "cuda"},
                                    unavailable=_unavailable)
