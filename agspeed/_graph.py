"""Building one torch.fx graph during capture, with fake tensors standing in for data.

The symbolic interpreter (C) walks a frame's bytecode; for every tensor operation it asks
a ``GraphBuilder`` to record a node.  The builder runs the operation on fake tensors
(``FakeTensorMode``: shape, dtype, device, requires_grad, no data) to learn what it
produces, so the interpreter can go on with exact metadata, and keeps that fake value in
``node.meta["example_value"]``.  Each graph input is recorded with its *source* (how to
reach it from the frame: ``x``, ``self.fc1.weight``), which is what the guards check and
what the cache entry reads on a hit.

What cannot be captured is reported as a ``GraphBreak`` with a stable reason (an
``agspeed.protocol.Reason``, defined with its explanation and hint in csrc/protocol.h), a
detail naming the operation, and a hint for the user:

* ``data_dependent``: the result's shape or value depends on tensor data (``.item()``,
  ``nonzero()``): Python would branch on it, a graph cannot.
* ``op_failed``: the operation raised on fake inputs (a shape mismatch, a bad argument).
  Eager raises too, but fake (meta) kernels word their errors differently, so the frame
  must then run eager: the user sees eager's own exception and message.

Operations are recorded as calls of the torch functions and tensor methods the program
made, not as aten ops, so running the graph under ``torch.autocast`` casts exactly as
eager would, with ``cache_enabled`` either way.

The builder is also the interpreter's policy, in parts with one job each: the call
policy (``agspeed/_calls.py``: ``plan_call``, ``attr``), folds of known values
(``agspeed/_folds.py``: ``fold``, ``getitem``, ``compare``, ``truth``, ``iterate``...) and
argument binding (``agspeed/_binding.py``).  The operations the interpreter calls are the
``BuilderOp`` rows of csrc/protocol.h, checked when this module loads.  Every source a
part reads is appended to ``assumptions``.

Dynamic shapes (``agspeed/_shapes.py``): a builder given a ``DimPolicy`` makes the
dimensions it names symbolic, under a ``ShapeEnv``.  A size the code reads from such a
dimension (``x.shape[0]``, ``x.size(1)``, ``len(x)``, arithmetic on them) is then a graph
node whose example value is a ``SymInt``, so the graph computes it for every size; a
branch on it, or a use that needs a plain int (``range(n)``, a format), evaluates it for
the example's size and the ShapeEnv records the guard that makes that answer hold.
``x.shape`` of such a tensor is a ``SymShape``: a tuple of size nodes and ints.

torch is imported when a builder is made, never when agspeed is imported.
"""

from __future__ import annotations

import contextlib
import functools
import keyword
import operator
import sys
import types
from typing import Any, Callable

from agspeed import _match
from agspeed import _torch_state as torch_state
from agspeed._assume import Assumptions
from agspeed._binding import Binding
from agspeed._builder_types import (GraphBreak, StorageSize, SymShape, concrete,
                                   describe_callable, holds_node)
from agspeed._calls import CallPolicy, FunctionApply
from agspeed._checkpoint import CheckpointPolicy
from agspeed._copies import Copies
from agspeed._effects import SideEffects
from agspeed._ctx import ContextPolicy
from agspeed._dunders import Dunders
from agspeed._folds import Folds
from agspeed._identity import Identities
from agspeed._numpy import NumpyCall, NumpyPolicy
from agspeed._objects import Objects, is_structseq_type
from agspeed._output import Outputs
from agspeed._sources import name_of, static_attr
from agspeed._tensor_scalars import NOT_HANDLED
from agspeed._tensor_scalars import rewrite as rewrite_scalar_tensor
from agspeed.protocol import Attr, Reason, check_builder

__all__ = ["GraphBreak", "GraphBuilder", "SymShape"]

_UNSUPPORTED_METHODS = frozenset({
    "backward", "register_hook", "retain_grad", "numpy", "tolist", "item", "data_ptr",
    "storage", "untyped_storage", "record_stream", "share_memory_", "pin_memory",
})
_TENSOR_META = frozenset({
    "shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "requires_grad", "layout",
    "is_sparse", "is_quantized", "is_nested", "is_meta", "is_leaf",
})
_TENSOR_VIEWS = frozenset({"T", "mT", "H", "mH", "real", "imag"})
_PLAIN = (int, float, bool, str, type(None), complex, bytes)


def _target_name(kind: str, target: Any) -> str:
    if kind == "call_method":
        return f"Tensor.{target}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", repr(target))
    return f"{module}.{name}" if module else name


class GraphBuilder(Outputs, Identities, Objects, CallPolicy, Folds, Binding, SideEffects, ContextPolicy,
                   Dunders, NumpyPolicy, CheckpointPolicy, Copies, Assumptions):
    """One graph being captured: inputs by source, nodes with fake example values.

    The recording of nodes lives here; planning calls (``CallPolicy``), evaluating known
    values (``Folds``), binding arguments (``Binding``), the objects the capture makes
    (``Objects``), side effects on the program's objects (``SideEffects``), context
    managers (``ContextPolicy``), Python special methods to inline (``Dunders``), NumPy
    code on tensors (``NumpyPolicy``), activation checkpointing (``CheckpointPolicy``)
    and which objects are needed by identity (``Identities``) are its other parts."""

    # a root byte offset the interpreter stops before (agspeed._resume), or None
    stop_at: int | None = None
    # the match statement's instructions, inlined (csrc/interp_match.c)
    match_len = staticmethod(_match.get_len)
    match_keys = staticmethod(_match.match_keys)
    match_class = staticmethod(_match.match_class)

    def __init__(self, shapes: Any = None, symbolic: bool = False) -> None:
        import torch
        import torch.fx
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
            FakeTensorMode,
        )

        self._torch = torch
        self._data_dependent: tuple = (DataDependentOutputException,
                                       DynamicOutputShapeException)
        self.graph = torch.fx.Graph()
        # shapes: the _shapes.DimPolicy of this capture (None: every input static);
        # symbolic: fake tensors run under a ShapeEnv, so dimensions can be symbols
        self.shapes = shapes
        self.symbolic = symbolic
        if symbolic:
            from torch.fx.experimental.symbolic_shapes import (
                GuardOnDataDependentSymNode,
                ShapeEnv,
            )

            self._data_dependent += (GuardOnDataDependentSymNode,)
            self.fake_mode = FakeTensorMode(shape_env=ShapeEnv(
                duck_shape=False, allow_dynamic_output_shape_ops=False,
                allow_scalar_outputs=False))
            self._sym_types: tuple = (torch.SymInt, torch.SymFloat, torch.SymBool)
        else:
            self.fake_mode = FakeTensorMode()
            self._sym_types = ()
        self._size_nodes: dict[tuple, Any] = {}  # (node, dim) -> its size node
        self.node_type = torch.fx.Node
        self.assumptions: list[tuple[tuple, Any]] = []
        self.state_reads: list[tuple] = []   # (query, args, answer): agspeed._torch_state
        self.owned_ids: set[int] = set()   # ids of what the interpreter made (shared with C)
        self.aliases: list[tuple[tuple, tuple]] = []  # (source, first source of the tensor)
        self.known: dict[int, tuple[Any, Any]] = {}  # id -> (object, source), shared with C
        self.objects: dict[int, Any] = {}  # id -> object the capture made (_objects.py)
        self.made_modules: dict[int, Any] = {}  # id -> torch.nn layer made in the frame
        self._escaping: set[int] = set()    # objects check_output is inside of
        self._twice: set[int] = set()       # containers the result holds twice
        self.lifetime_static: dict[int, Any] = {}   # id -> a module's buffer read here
        self._escaped: dict[int, Any] = {}  # id -> the node rebuilding it (escape)
        self._inputs: dict[Any, tuple[Any, Any]] = {}  # source -> (node, real value)
        self._effects_init()
        self._by_id: dict[int, tuple[Any, Any]] = {}  # id(tensor) -> (node, source)
        self._static = (torch.dtype, torch.device, torch.layout, torch.memory_format,
                        torch.Size, torch.finfo, torch.iinfo, *_PLAIN)
        self._consts = self._constant_calls(torch)
        self._constant_makers = frozenset({torch.tensor, torch.as_tensor, torch.scalar_tensor})
        md = torch.nn.ModuleDict
        self._dict_views = {md.items: "items", md.keys: "keys", md.values: "values"}
        self._ctx_init()  # grad mode and autocast as the capture goes (agspeed/_ctx.py)
        self._checkpoint_init()  # checkpointed regions (agspeed/_checkpoint.py)
        self._numpy_init()  # arrays of NumPy code on tensors (agspeed/_numpy.py)
        self._copies_init()  # copies of plain data (agspeed/_copies.py)
        self._identity_init()  # objects needed by identity (agspeed/_identity.py)
        self._assume_init()  # branches assumed where the other way raises (_assume.py)
        # sources of the plain ints and floats this capture makes symbols (the
        # interpreter asks input() for them instead of holding their value)
        self.symbolic_scalars = frozenset(shapes.scalars) if shapes is not None and \
            getattr(shapes, "scalars", None) else None

    @staticmethod
    def _constant_calls(torch: Any) -> dict:
        out: dict = {}
        for path, value in (("compiler.is_compiling", True), ("compiler.is_dynamo_compiling", True),
                            ("_dynamo.is_compiling", True), ("jit.is_scripting", False),
                            ("jit.is_tracing", False), ("_C._get_tracing_state", None),
                            ("_utils.is_compiling", True)):
            obj: Any = torch
            for part in path.split("."):
                obj = getattr(obj, part, None)
            if obj is not None:
                out[id(obj)] = (obj, value)
        return out

    # -- inputs ---------------------------------------------------------------------

    def input(self, source: Any, value: Any) -> Any:
        """The placeholder of the tensor reached by ``source`` (one per tensor)."""
        known = self._inputs.get(source)
        if known is not None:
            return known[0]
        if type(value) is self.ndarray_type:   # the tensor sharing its memory
            return self.numpy_input(source, value)
        if type(value) in (int, float) and self.symbolic_scalars and \
                source in self.symbolic_scalars:
            if type(value) is int and not -(1 << 63) <= value < (1 << 63):
                return None   # beyond int64 (what guards compute in): kept a constant
            return self._scalar_input(source, value)
        if not isinstance(value, self._torch.Tensor):
            raise TypeError(f"graph inputs are tensors; {source} is {type(value).__name__}")
        if isinstance(value, self._torch.nn.parameter.UninitializedTensorMixin):
            # a lazy module's parameter before its first call: no shape to read, so
            # no graph input; the capture holds it as an object of the program
            return None
        same = self._by_id.get(id(value))
        if same is not None:
            self.aliases.append((source, same[1]))
            return same[0]
        dims = self.shapes.decide(source, value) if self.shapes is not None else {}
        if dims and not self.symbolic:
            from agspeed._shapes import NeedsSymbolic

            raise NeedsSymbolic(source)
        name = name_of(source) if isinstance(source, tuple) else _legacy_name(source)
        node = self.graph.placeholder(name)
        if dims:
            from agspeed._sources import describe
            from agspeed._shapes import fake_input

            node.meta["example_value"] = fake_input(self.fake_mode, source, describe(source),
                                                    value, dims)
        else:
            node.meta["example_value"] = self.fake_mode.from_tensor(value, static_shapes=True)
        node.meta["source"] = source
        if self.lifetime_static.get(id(value)) is value:
            node.meta["static_lifetime"] = True   # a module's buffer
        self._inputs[source] = (node, value)
        self._by_id[id(value)] = (node, source)
        return node

    def _scalar_input(self, source: Any, value: int | float) -> Any:
        """The placeholder of a plain int or float made a symbol: the graph computes with
        it for every value, and what the code decides on it the ShapeEnv guards."""
        if not self.symbolic:
            from agspeed._shapes import NeedsSymbolic

            raise NeedsSymbolic(source)
        from agspeed._shapes import symbolic_scalar
        from agspeed._sources import describe

        node = self.graph.placeholder(name_of(source))
        node.meta["example_value"] = symbolic_scalar(self.fake_mode, describe(source),
                                                     value)
        node.meta["source"] = source
        self._inputs[source] = (node, value)
        return node

    @property
    def sources(self) -> list:
        """The inputs' sources, in placeholder order."""
        return list(self._inputs)

    @property
    def read_sources(self) -> list:
        """What the cache entry reads on each call: the inputs' sources, then the
        sources of the objects the frame writes to (``agspeed._effects``)."""
        return self.sources + self.owner_sources

    def example_inputs(self) -> list[Any]:
        """The real values of the inputs, in placeholder order (for backends)."""
        return [value for _, value in self._inputs.values()]

    # -- operations -----------------------------------------------------------------

    def _fake(self, value: Any) -> Any:
        """``value`` with each node replaced by its example value; a ``torch.Size`` stays
        one (``x.new(size)`` reads a Size as a shape, a tuple as data)."""
        kind = type(value)
        if kind is self.node_type:
            return value.meta["example_value"]
        if kind is self._torch.Size:
            return value
        if kind in (tuple, list):
            return kind(self._fake(v) for v in value)
        if kind is dict:
            return {k: self._fake(v) for k, v in value.items()}
        if isinstance(value, (tuple, list, dict)) or kind is slice:
            import torch.fx

            return torch.fx.node.map_arg(value, lambda node: node.meta["example_value"])
        return value

    def call_function(self, fn: Callable, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Record ``fn(*args, **kwargs)``; args may hold nodes, constants and containers.
        A call made for its effect (logging) is replayed after the graph instead."""
        if fn in self.replayed_calls:
            return self.replay_call(fn, args, kwargs or {})
        if fn in self.checkpoint_markers:
            return self.checkpoint_call(fn, tuple(args))
        if fn is self._torch.is_inference and len(args) == 1 and not kwargs and \
                isinstance(args[0], self.node_type):
            return self._inference_of(args[0])
        if fn is self._torch._check and args and not kwargs:
            if type(args[0]) is bool:   # decided now: a check that holds is nothing
                if args[0]:
                    return None
                raise GraphBreak(Reason.OP_FAILED, "torch._check of False (eager raises)")
            args = args[:1]             # on a size the graph computes: its message a
                                        # function the graph's code cannot write
        if isinstance(fn, NumpyCall):
            return self.numpy_call(fn, tuple(args), dict(kwargs or {}))
        if args and self.is_size(args[0]) and type(fn) is types.FunctionType and \
                getattr(type(args[0].meta["example_value"]), fn.__name__, None) is fn:
            # a symbolic number's method taken as a value (tensor_attr): recorded as the
            # method, which the graph's code calls on the plain number it is given
            return self.call_method(fn.__name__, tuple(args), kwargs)
        if isinstance(fn, FunctionApply):   # a user's autograd.Function
            if fn.cls is None:
                fn, args = self.function_target(args[0], args[1:], kwargs or {}), args[1:]
            else:
                fn = self.function_target(fn.cls, args, kwargs or {})
        handled, value = torch_state.answer(self, fn, tuple(args), dict(kwargs or {}))
        if handled:   # a query of torch's state, answered now and probed by the guard
            return value
        return self._record("call_function", fn, tuple(args), dict(kwargs or {}))

    def call_method(self, name: str, args: tuple, kwargs: dict | None = None) -> Any:
        """Record ``args[0].name(*args[1:], **kwargs)`` on a tensor node."""
        if name == "type" and len(args) == 2 and not kwargs and \
                type(args[1]) is type(self._torch.DoubleTensor):
            # x.type(torch.DoubleTensor): graph code cannot name the legacy class
            cls = args[1]
            return self._record("call_method", "to", (args[0],), {
                "device": "cuda" if cls.is_cuda else "cpu", "dtype": cls.dtype})
        if name == "__len__" and len(args) == 1 and not kwargs:
            return self._tensor_len(args[0])   # as len(x): its first size
        if name == "numpy" and len(args) == 1:
            return self.to_ndarray(args[0], dict(kwargs or {}))
        if self._numpy_nodes and args and self.is_ndarray(args[0]):
            return self.numpy_method(name, tuple(args), dict(kwargs or {}))
        if name == "untyped_storage" and len(args) == 1 and not kwargs:
            return self._storage_of(args[0])
        if name == "is_inference" and len(args) == 1 and not kwargs:
            return self._inference_of(args[0])
        if name in _UNSUPPORTED_METHODS:
            if name in ("item", "tolist"):
                raise GraphBreak(Reason.DATA_DEPENDENT, f"Tensor.{name}()")
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"Tensor.{name}()")
        return self._record("call_method", name, tuple(args), dict(kwargs or {}))

    def _storage_of(self, node: Any) -> Any:
        """``x.untyped_storage()`` of a graph input: its size, read now and guarded on
        ``("storage", source)``; of a computed tensor, a break (its storage is the
        graph's to choose)."""
        from agspeed._sources import MISSING, storage_bytes

        source = node.meta.get("source") if node.op == "placeholder" else None
        real = self._inputs.get(source, (None, None))[1] if source is not None else None
        nbytes = storage_bytes(real) if real is not None else MISSING
        if nbytes is MISSING:
            raise GraphBreak(Reason.UNSUPPORTED_CALL, "Tensor.untyped_storage()")
        self.assumptions.append((("storage", source), nbytes))
        return StorageSize(nbytes)

    def _inference_of(self, node: Any) -> Any:
        """``x.is_inference()``: of a graph input, read now and guarded on
        ``("inference", source)`` (a fake tensor made of it is never one); of a
        computed tensor, its fake's (made one where the capture was in inference
        mode, as eager's is)."""
        if node.op == "placeholder":
            flag = bool(self._real_type_view(node).is_inference())
            self.assumptions.append((("inference", node.meta["source"]), flag))
            return flag
        return bool(node.meta["example_value"].is_inference())

    def _dispatcher(self) -> Any:
        """Where sizes can be symbols, composite ops run their Python decompositions
        (torch's python dispatcher, as torch.compile traces them): their C++ bodies read
        sizes as plain ints (``F.pad``), which fixes every dynamic dimension they touch."""
        if not self.symbolic:
            return contextlib.nullcontext()
        from torch._dispatch.python import enable_python_dispatcher

        return enable_python_dispatcher()

    def _record(self, kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
        if self._numpy_nodes and not isinstance(target, NumpyCall):
            routed = self.numpy_route(kind, target, args, kwargs)
            if routed is not None:   # an operator on arrays, torch.from_numpy
                return routed
        if any(keyword.iskeyword(k) for k in kwargs):
            # t.uniform_(**{"from": 0}): a graph's code cannot spell the keyword
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{_target_name(kind, target)} with "
                             f"a keyword argument named as a Python keyword")
        args, kwargs = self._writable(args), self._writable(kwargs)
        self.note_identity(target, args, kwargs)   # constants the graph will hold
        fake_args, fake_kwargs = self._fake(args), self._fake(kwargs)
        try:
            with self.fake_mode, self.mode_scope(), self._dispatcher():
                if kind == "call_method":
                    out = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
                else:
                    out = target(*fake_args, **fake_kwargs)
        except self._data_dependent as exc:
            done = rewrite_scalar_tensor(self, kind, target, args, kwargs)
            if done is not NOT_HANDLED:   # a 0-dim tensor where a number is taken
                return done
            raise GraphBreak(Reason.DATA_DEPENDENT,
                             f"{_target_name(kind, target)} ({type(exc).__name__})") from exc
        except GraphBreak:
            raise
        except Exception as exc:  # the operation itself is wrong for these inputs
            raise GraphBreak(Reason.OP_FAILED,
                             f"{_target_name(kind, target)} raised {type(exc).__name__}: {exc}"
                             ) from exc
        self._check_assumable(kind, target, args, kwargs, out)
        node = self.graph.create_node(kind, target, args, kwargs)
        if type(target) is types.BuiltinFunctionType and target in self._constant_makers \
                and args and type(args[0]) in (int, bool) and \
                not holds_node(kwargs, self.node_type):
            # a tensor of plain values (torch.as_tensor(2)): its value is known now, for
            # Python that reads it (a list indexed by it)
            with self.mode_scope():
                node.meta["constant"] = target(*args, **kwargs)
        return self._wrap(node, out, kind, target)

    def _writable(self, value: Any) -> Any:
        """``value`` as the graph's generated code can write it: a NumPy scalar becomes
        the Python number torch treats it as; a NumPy array, which the code would name
        by a repr it cannot evaluate, is a break."""
        kind = type(value)
        if kind in (tuple, list):
            return kind(self._writable(v) for v in value)
        if kind is dict:
            return {k: self._writable(v) for k, v in value.items()}
        if kind.__module__.startswith("numpy"):
            np = sys.modules["numpy"]
            if isinstance(value, np.generic) and hasattr(value, "item"):
                return value.item()
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"a NumPy {kind.__name__} in the graph")
        if kind is type and value in (bool, int, float):
            # x.to(float), dtype=int: the dtype torch reads the Python type as
            return {bool: self._torch.bool, int: self._torch.int64,
                    float: self._torch.float64}[value]
        if kind is self._torch.Generator:   # fx would write its repr into the code
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, "a torch.Generator as an argument of "
                             "a graph operation")
        if kind in (types.FunctionType, types.MethodType, types.BuiltinFunctionType):
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"a function ({describe_callable(value)}) "
                             f"as an argument of a graph operation")
        return value

    def _is_static(self, value: Any, depth: int = 0) -> bool:
        if isinstance(value, (tuple, list)) and type(value) in (tuple, list, self._torch.Size):
            # (a list that holds itself, or nests deeper than data does, is no constant)
            return depth < 64 and all(self._is_static(v, depth + 1) for v in value)
        return type(value) in self._static or self.is_numpy_constant(value)

    def _wrap(self, node: Any, out: Any, kind: str, target: Any) -> Any:
        """The graph argument for a recorded call's result ``out`` (a fake value)."""
        torch = self._torch
        node.meta["example_value"] = out
        if isinstance(out, torch.Tensor):
            # an op that returns one of its tensor arguments itself (x.add_(1), x.t_(),
            # x.contiguous() of a contiguous x) answers that argument's node, as eager
            # answers the same object: `y is x`, {x, y} and dict keys see one tensor
            # (the node stays in the graph for what it does)
            args = [a for a in (*node.args, *node.kwargs.values())
                    if isinstance(a, self.node_type)]
            if not isinstance(target, NumpyCall) and not any("numpy" in a.meta for a in args):
                # (NumPy's arrays and their tensors share fakes but are not one object)
                for arg in args:
                    if arg.meta.get("example_value") is out:
                        return arg
            return node
        if self._sym_types and isinstance(out, self._sym_types):
            value = concrete(out)
            if value is None:
                return node   # a size (or a test on sizes) the graph computes
            self.graph.erase_node(node)
            return value
        mutates = (kind == "call_method" and str(target).endswith("_")) or target in (
            operator.setitem, operator.delitem)
        if out is None:
            return None  # kept in the graph: it was called for its effect
        if self._is_static(out) and not mutates:
            self.graph.erase_node(node)
            return out
        if isinstance(out, (tuple, list)) and all(
                isinstance(v, torch.Tensor) or self._is_static(v) or self._is_sym(v)
                for v in out):
            items = []
            for i, v in enumerate(out):
                if isinstance(v, torch.Tensor) or self._is_sym(v):
                    item = self.graph.create_node("call_function", operator.getitem, (node, i))
                    item.meta["example_value"] = v
                    items.append(item)
                else:
                    items.append(v)
            if isinstance(out, torch.Size):
                return SymShape(items)
            # torch.return_types results keep their type (.values, .indices), and an
            # operator returning Tensor[] (torch.ops.aten.split_with_sizes) a list
            if is_structseq_type(type(out)):
                return type(out)(items)
            return list(items) if type(out) is list else tuple(items)
        self.graph.erase_node(node)
        raise GraphBreak(Reason.NON_TENSOR_RESULT,
                         f"{_target_name(kind, target)} returned a {type(out).__name__}")

    # -- symbolic sizes ----------------------------------------------------------------

    def _is_sym(self, value: Any) -> bool:
        """A SymInt/SymFloat/SymBool that is not a known constant."""
        return bool(self._sym_types) and isinstance(value, self._sym_types) and \
            concrete(value) is None

    def is_size(self, value: Any) -> bool:
        """A graph node computing a size (or a test on sizes), not a tensor."""
        return isinstance(value, self.node_type) and \
            self._is_sym(value.meta.get("example_value"))

    def _size_node(self, node: Any, dim: int) -> Any:
        """``node.size(dim)`` as a node, one per tensor and dimension."""
        got = self._size_nodes.get((node, dim))
        if got is None:
            got = self._size_nodes[(node, dim)] = self._record("call_method", "size",
                                                                (node, dim), {})
        return got

    def _shape_of(self, node: Any) -> Any:
        """``node.shape``: a torch.Size when every size is known, else a SymShape."""
        shape = node.meta["example_value"].shape
        if not self._sym_types or all(concrete(d) is not None for d in shape):
            return shape if not self._sym_types else \
                self._torch.Size(int(concrete(d)) for d in shape)
        return SymShape(self._size_node(node, i) if concrete(d) is None else concrete(d)
                        for i, d in enumerate(shape))

    def _specialize(self, value: Any) -> Any:
        """A size node as the plain value it has now (the ShapeEnv guards it stays so);
        tuples of them likewise.  Anything else unchanged."""
        if self.is_size(value):
            ev = value.meta["example_value"]
            torch = self._torch
            kind = int if isinstance(ev, torch.SymInt) else \
                float if isinstance(ev, torch.SymFloat) else bool
            return kind(ev)
        if type(value) in (tuple, list, SymShape) and self._sym_types:
            out = [self._specialize(v) for v in value]
            return self._torch.Size(out) if type(value) is SymShape else type(value)(out)
        return value

    def _has_size_node(self, value: Any) -> bool:
        if self.is_size(value):
            return True
        return type(value) in (tuple, list, SymShape) and any(
            self._has_size_node(v) for v in value)

    def is_tensor(self, node: Any) -> bool:
        """Whether a recorded node produces a tensor (not a size, an int, a tuple)."""
        return isinstance(node.meta.get("example_value"), self._torch.Tensor)

    # -- the interpreter's policy ---------------------------------------------------

    def tensor_attr(self, node: Any, name: str) -> Any:
        """``tensor.name``: metadata as a constant, a view as a node."""
        if self._numpy_nodes and node in self._numpy_nodes:
            return self.numpy_attr(node, name)
        fake = node.meta["example_value"]
        if name == "shape" and self._sym_types:
            return self._shape_of(node)
        if name in _TENSOR_META:
            if name == "is_leaf" and node.op != "placeholder":
                raise GraphBreak(Reason.UNSUPPORTED_ATTRIBUTE, "Tensor.is_leaf of a computed tensor")
            if name in ("is_leaf", "requires_grad") and node.op == "placeholder":
                return getattr(self._real_type_view(node), name)
            return getattr(fake, name)
        if name in _TENSOR_VIEWS:
            return self._record("call_function", getattr, (node, name), {})
        if name == "grad":
            return self._grad_of(node)
        if name == "__class__":   # the input's own class (guarded), else a plain Tensor
            return type(self._real_type_view(node))
        torch = self._torch
        if isinstance(fake, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            # a number made a symbol: its method taken as a value (``getattr(m, name)``)
            # is the symbolic type's, recorded when called as ``m.name()`` is
            method = getattr(type(fake), name, None)
            if type(method) is types.FunctionType and not name.startswith("_"):
                return functools.partial(method, node)
            raise GraphBreak(Reason.UNSUPPORTED_ATTRIBUTE, f"{type(fake).__name__}.{name}")
        method = getattr(self._torch.Tensor, name, None)
        if type(method) in (types.MethodDescriptorType, types.WrapperDescriptorType) and \
                name not in _UNSUPPORTED_METHODS and not name.startswith("_"):
            # a method taken as a value (``x.view`` called with ``*shape``): bound to the
            # node, and called through the interpreter's partial plan as Tensor.view(x, ...)
            return functools.partial(method, node)
        raise GraphBreak(Reason.UNSUPPORTED_ATTRIBUTE, f"Tensor.{name}")

    def _grad_of(self, node: Any) -> Any:
        """``p.grad`` of a tensor the frame was given (a parameter, an argument): the
        gradient the program holds is an input of its own, reached from the tensor's
        source, or None, guarded so. A computed tensor's gradient is the backward's."""
        source = node.meta.get("source") if node.op == "placeholder" else None
        if source is None or source[0] == "numpy":
            raise GraphBreak(Reason.UNSUPPORTED_ATTRIBUTE, "Tensor.grad of a computed tensor")
        how, grad = static_attr(self._real_type_view(node), "grad")
        if how is not Attr.VALUE:
            raise GraphBreak(Reason.UNSUPPORTED_ATTRIBUTE, f"Tensor.grad ({grad})")
        source = ("attr", source, "grad")
        if grad is None:
            self.assumptions.append((source, None))
            return None
        return self.input(source, grad)

    def setitem(self, container: Any, index: Any, value: Any) -> None:
        """``container[index] = value`` on a tensor: recorded in the graph; on another
        object, ``Objects.store_item``."""
        if not isinstance(container, self.node_type):
            self.store_item(container, index, value)
            return
        self._record("call_function", operator.setitem, (container, index, value), {})

    # -- result ---------------------------------------------------------------------

def _legacy_name(source: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in str(source)).strip("_") or "input"
    return out if not out[0].isdigit() else f"_{out}"


check_builder(GraphBuilder)   # every operation the interpreter calls exists
