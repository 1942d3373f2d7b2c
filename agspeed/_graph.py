"""Building one torch.fx graph during capture, with fake tensors standing in for data.

The symbolic interpreter (C) walks a frame's bytecode; for every tensor operation it asks
a ``GraphBuilder`` to record a node.  The builder runs the operation on fake tensors
(``FakeTensorMode``: shape, dtype, device, requires_grad, no data) to learn what it
produces, so the interpreter can go on with exact metadata, and keeps that fake value in
``node.meta["example_value"]``.  Each graph input is recorded with its *source* (how to
reach it from the frame: ``x``, ``self.fc1.weight``), which is what the guards check and
what the cache entry reads on a hit.

What cannot be captured is reported as a ``GraphBreak`` with a stable reason id from
``REASONS``, a detail naming the operation, and a hint for the user:

* ``data_dependent``: the result's shape or value depends on tensor data (``.item()``,
  ``nonzero()``): Python would branch on it, a graph cannot.
* ``op_failed``: the operation raised on fake inputs (a shape mismatch, a bad argument).
  Eager raises too, but fake (meta) kernels word their errors differently, so the frame
  must then run eager: the user sees eager's own exception and message.

Operations are recorded as calls of the torch functions and tensor methods the program
made, not as aten ops, so running the graph under ``torch.autocast`` casts exactly as
eager would, with ``cache_enabled`` either way.

The builder is also the interpreter's policy (see csrc/interp.h): ``attr`` finds an
attribute without running user code, ``plan_call`` says how a call is captured (a graph
node, an inlined module or function, a fold, a known constant), ``bind`` matches
arguments to parameters, and ``iterate``/``getitem``/``compare``/``truth`` evaluate
what is known while capturing.  Every source it reads is appended to ``assumptions``.

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

import builtins
import operator
import types
from typing import Any, Callable

from agspeed._sources import MISSING, _class_lookup, is_namedtuple_type, name_of, static_attr

__all__ = ["GraphBreak", "GraphBuilder", "REASONS", "SymShape"]

#: Stable graph-break reason ids: (what happened, what the user can do).
REASONS: dict[str, tuple[str, str]] = {
    "data_dependent": (
        "the result depends on the values inside a tensor",
        "keep data-dependent Python (.item(), nonzero, branching on tensor values) outside "
        "the optimized code, or accept a graph break there",
    ),
    "op_failed": (
        "the operation failed on the shapes and dtypes it was given",
        "the frame runs eager, which raises eager's own error for these inputs",
    ),
    "unsupported_call": (
        "a call the capture does not model",
        "move it out of the optimized code, or wrap it with agspeed.disable",
    ),
    "unsupported_attribute": (
        "an attribute that only running code could produce",
        "read it outside the optimized code and pass the value in",
    ),
    "unsupported_value": ("a value the capture does not model", "pass tensors and plain values"),
    "non_tensor_result": (
        "an operation returned something other than tensors and plain values",
        "keep such calls outside the optimized code",
    ),
    "bad_call": (
        "the call's arguments do not match the function's parameters",
        "the frame runs eager, which raises eager's own TypeError",
    ),
    "hooks": (
        "the module has hooks (or a custom __call__), which run only in eager",
        "the module runs eager with its hooks; its forward is still captured",
    ),
    # Reasons the C interpreter gives (csrc/interp*.c).
    "side_effect": (
        "a write to an object of the program (an attribute or an item)",
        "return the value instead and store it outside the optimized code",
    ),
    "unsupported_instruction": (
        "Python the capture does not model (try/except, with, del, yield...)",
        "move it into a helper called from the optimized code; the helper runs eager",
    ),
    "exception_handler": (
        "code under try/except or with, whose handler the graph could not run",
        "move the try block out of the optimized code, or the tensor work out of it",
    ),
    "generator": ("generators and coroutines run eager", "return a tensor or a tuple instead"),
    "raise": ("the code raises an exception", "the frame runs eager and raises it"),
    "too_long": ("too many instructions (a long or endless loop)",
                 "loop over fewer items, or move the loop out of the optimized code"),
    "too_deep": ("calls nested too deeply to inline", "flatten the recursion"),
    "closure": ("a nested function with free variables",
                "define the function at module level and pass values in"),
    "missing_attribute": ("the attribute does not exist", "the frame runs eager and raises"),
    "unbound_local": ("a local read before it is assigned",
                      "the frame runs eager and raises"),
    "unguardable_attribute": ("an attribute of an object with no source to guard it by",
                              "pass the value in as an argument"),
    "unguardable_global": ("a global the guard could not check", "pass the value in"),
    "unknown_global": ("a name that is neither a global nor a builtin",
                       "the frame runs eager and raises NameError"),
}

_TORCH_PY_LEAVES = ("torch.nn.functional", "torch.functional", "torch._jit_internal",
                    "torch.nn.init", "torch._tensor", "torch.random")
_SIDE_EFFECT_PREFIXES = ("set_", "use_", "manual_seed", "seed", "_set", "initial_seed")
_UNSUPPORTED_METHODS = frozenset({
    "backward", "register_hook", "retain_grad", "numpy", "tolist", "item", "data_ptr",
    "storage", "untyped_storage", "record_stream", "share_memory_", "pin_memory",
})
_TENSOR_META = frozenset({
    "shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "requires_grad", "layout",
    "is_sparse", "is_quantized", "is_nested", "is_meta", "is_leaf",
})
_TENSOR_VIEWS = frozenset({"T", "mT", "H", "mH", "real", "imag"})
_STRUCTURAL_FOLDS = (enumerate, zip, reversed, list, tuple, len, iter, dict)
_TYPE_FOLDS = (isinstance, issubclass, type, callable)
_VALUE_FOLDS = (range, min, max, abs, int, float, bool, str, sum, any, all, round, divmod,
                pow, sorted, repr, hash, ord, chr, slice)
_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
            ">": operator.gt, ">=": operator.ge}
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
               "_backward_pre_hooks", "_forward_hooks_with_kwargs")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks",
                 "_global_backward_hooks", "_global_backward_pre_hooks")
_PLAIN = (int, float, bool, str, type(None), complex, bytes)


class SymShape(tuple):
    """``tensor.shape`` with symbolic sizes: size nodes and ints (``torch.Size`` cannot
    hold graph nodes).  A graph that returns one builds a ``torch.Size`` of it."""

    __slots__ = ()


class GraphBreak(Exception):
    """Capture of a frame must stop here; ``reason`` is a key of ``REASONS``."""

    def __init__(self, reason: str, detail: str):
        if reason not in REASONS:
            raise ValueError(f"unknown graph-break reason {reason!r}")
        self.reason = reason
        self.detail = detail
        self.explanation, self.hint = REASONS[reason]
        super().__init__(f"{reason}: {detail} ({self.explanation}; hint: {self.hint})")


def _target_name(kind: str, target: Any) -> str:
    if kind == "call_method":
        return f"Tensor.{target}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", repr(target))
    return f"{module}.{name}" if module else name


class GraphBuilder:
    """One graph being captured: inputs by source, nodes with fake example values."""

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
        self.aliases: list[tuple[tuple, tuple]] = []  # (source, first source of the tensor)
        self.known: dict[int, tuple[Any, Any]] = {}  # id -> (object, source), shared with C
        self._inputs: dict[Any, tuple[Any, Any]] = {}  # source -> (node, real value)
        self._by_id: dict[int, tuple[Any, Any]] = {}  # id(tensor) -> (node, source)
        self._static = (torch.dtype, torch.device, torch.layout, torch.memory_format,
                        torch.Size, torch.finfo, torch.iinfo, *_PLAIN)
        self._consts = self._constant_calls(torch)
        md = torch.nn.ModuleDict
        self._dict_views = {md.items: "items", md.keys: "keys", md.values: "values"}

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
        if not isinstance(value, self._torch.Tensor):
            raise TypeError(f"graph inputs are tensors; {source} is {type(value).__name__}")
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
        self._inputs[source] = (node, value)
        self._by_id[id(value)] = (node, source)
        return node

    @property
    def sources(self) -> list:
        """The inputs' sources, in placeholder order."""
        return list(self._inputs)

    def example_inputs(self) -> list[Any]:
        """The real values of the inputs, in placeholder order (for backends)."""
        return [value for _, value in self._inputs.values()]

    # -- operations -----------------------------------------------------------------

    def _fake(self, value: Any) -> Any:
        import torch.fx

        return torch.fx.node.map_arg(value, lambda node: node.meta["example_value"])

    def call_function(self, fn: Callable, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Record ``fn(*args, **kwargs)``; args may hold nodes, constants and containers."""
        return self._record("call_function", fn, tuple(args), dict(kwargs or {}))

    def call_method(self, name: str, args: tuple, kwargs: dict | None = None) -> Any:
        """Record ``args[0].name(*args[1:], **kwargs)`` on a tensor node."""
        if name in _UNSUPPORTED_METHODS:
            if name in ("item", "tolist"):
                raise GraphBreak("data_dependent", f"Tensor.{name}()")
            raise GraphBreak("unsupported_call", f"Tensor.{name}()")
        return self._record("call_method", name, tuple(args), dict(kwargs or {}))

    def _record(self, kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
        fake_args, fake_kwargs = self._fake(args), self._fake(kwargs)
        try:
            with self.fake_mode:
                if kind == "call_method":
                    out = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
                else:
                    out = target(*fake_args, **fake_kwargs)
        except self._data_dependent as exc:
            raise GraphBreak("data_dependent",
                             f"{_target_name(kind, target)} ({type(exc).__name__})") from exc
        except GraphBreak:
            raise
        except Exception as exc:  # the operation itself is wrong for these inputs
            raise GraphBreak("op_failed",
                             f"{_target_name(kind, target)} raised {type(exc).__name__}: {exc}"
                             ) from exc
        node = self.graph.create_node(kind, target, args, kwargs)
        return self._wrap(node, out, kind, target)

    def _is_static(self, value: Any) -> bool:
        if isinstance(value, (tuple, list)) and type(value) in (tuple, list, self._torch.Size):
            return all(self._is_static(v) for v in value)
        return type(value) in self._static

    def _wrap(self, node: Any, out: Any, kind: str, target: Any) -> Any:
        """The graph argument for a recorded call's result ``out`` (a fake value)."""
        torch = self._torch
        node.meta["example_value"] = out
        if isinstance(out, torch.Tensor):
            return node
        if self._sym_types and isinstance(out, self._sym_types):
            concrete = _concrete(out)
            if concrete is None:
                return node   # a size (or a test on sizes) the graph computes
            self.graph.erase_node(node)
            return concrete
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
            return SymShape(items) if isinstance(out, torch.Size) else tuple(items)
        self.graph.erase_node(node)
        raise GraphBreak("non_tensor_result",
                         f"{_target_name(kind, target)} returned a {type(out).__name__}")

    # -- symbolic sizes ----------------------------------------------------------------

    def _is_sym(self, value: Any) -> bool:
        """A SymInt/SymFloat/SymBool that is not a known constant."""
        return bool(self._sym_types) and isinstance(value, self._sym_types) and \
            _concrete(value) is None

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
        if not self._sym_types or all(_concrete(d) is not None for d in shape):
            return shape if not self._sym_types else \
                self._torch.Size(int(_concrete(d)) for d in shape)
        return SymShape(self._size_node(node, i) if _concrete(d) is None else _concrete(d)
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

    def can_record(self, fn: Any) -> bool:
        """Whether a call of ``fn`` on graph values may be recorded (and run on fakes).

        Only torch's own operations and the operator module's: anything else (``print``,
        a user function) would run on fake tensors during capture, which eager never
        does.  Decided from the object's type and its C-level ``__module__``, so no
        user code runs while asking.
        """
        kind = type(fn)
        module = getattr(fn, "__module__", None) or "" if kind in (
            types.BuiltinFunctionType, types.FunctionType) else ""
        if kind is types.BuiltinFunctionType:
            if module in ("operator", "_operator"):
                return True
            if not (module == "torch" or module.startswith("torch.")):
                return False
            return not fn.__name__.startswith(_SIDE_EFFECT_PREFIXES)
        if kind is types.FunctionType:
            return (module == "torch" or module in _TORCH_PY_LEAVES) and \
                not fn.__name__.startswith(_SIDE_EFFECT_PREFIXES)
        return False

    def is_tensor(self, node: Any) -> bool:
        """Whether a recorded node produces a tensor (not a size, an int, a tuple)."""
        return isinstance(node.meta.get("example_value"), self._torch.Tensor)

    # -- the interpreter's policy ---------------------------------------------------

    def attr(self, obj: Any, name: str) -> tuple[str, Any, Any]:
        """``(how, value, self)`` for ``obj.name`` (see ``_sources.static_attr``)."""
        how, value = static_attr(obj, name)
        if how == "unsupported":
            raise GraphBreak("unsupported_attribute",
                             f"{type(obj).__name__}.{name}: {value}")
        if how == "missing":
            return "missing", MISSING, None
        bound = obj.__self__ if isinstance(obj, super) else obj
        return how, value, bound if how == "method" else None

    def plan_call(self, fn: Any, source: Any) -> tuple:
        """How the interpreter captures a call of ``fn`` (see csrc/interp_call.c)."""
        torch = self._torch
        const = self._consts.get(id(fn))
        if const is not None and const[0] is fn:
            return ("const", const[1])
        if isinstance(fn, torch.nn.Module):
            return self._plan_module(fn, source)
        if fn is super:
            return ("super",)
        if fn is getattr or fn is hasattr:
            return (fn.__name__,)
        if type(fn) is types.FunctionType and fn in self._dict_views:  # self comes first
            return ("fold", fn)
        if type(fn) is types.MethodType:
            if fn.__func__ in self._dict_views:
                return ("fold", fn)
            return ("inline", fn.__func__, fn.__self__, None)
        if self.can_record(fn) or type(fn) in (types.MethodDescriptorType,
                                               types.WrapperDescriptorType) and \
                getattr(fn, "__objclass__", None) is torch._C.TensorBase:
            return ("graph", fn)
        if fn in _STRUCTURAL_FOLDS or fn in _TYPE_FOLDS or fn in _VALUE_FOLDS or (
                type(fn) is types.BuiltinFunctionType and fn.__module__ == "math") or \
                is_namedtuple_type(fn) or fn is torch.finfo or fn is torch.iinfo:
            return ("fold", fn)
        if type(fn) is types.FunctionType:
            if getattr(fn, "__module__", "") in ("torch._dynamo.eval_frame",
                                                 "torch._dynamo.decorators"):
                raise GraphBreak("unsupported_call", f"{fn.__qualname__} (capture disabled)")
            return ("inline", fn, None, source)
        raise GraphBreak("unsupported_call", f"calling {_describe_callable(fn)}")

    def _plan_module(self, module: Any, source: Any) -> tuple:
        torch = self._torch
        cls = type(module)
        if _class_lookup(cls, "__call__") is not torch.nn.Module.__call__:
            raise GraphBreak("hooks", f"{cls.__name__} has its own __call__")
        d = object.__getattribute__(module, "__dict__")
        hooked = [h for h in _HOOK_DICTS if d.get(h)]
        hooked += [h for h in _GLOBAL_HOOKS
                   if getattr(torch.nn.modules.module, h, None)]
        compiled_impl = static_attr(module, "_compiled_call_impl")[1]
        if hooked or compiled_impl not in (None, MISSING):
            raise GraphBreak("hooks", f"{cls.__name__} has {', '.join(hooked) or 'a compiled call'}")
        how, forward = static_attr(module, "forward")
        if how not in ("method", "value") or type(forward) is not types.FunctionType:
            raise GraphBreak("unsupported_call", f"{cls.__name__}.forward is not a function")
        if source is None:
            raise GraphBreak("unsupported_call", f"a {cls.__name__} reached by no source")
        self.assumptions.append((("type", source), cls))
        for h in _HOOK_DICTS:
            if h in d:
                self.assumptions.append((("attr", source, h), d[h]))
        self.assumptions.append((("attr", source, "_compiled_call_impl"), compiled_impl))
        for h in _GLOBAL_HOOKS:
            value = getattr(torch.nn.modules.module, h, None)
            if value is not None:
                self.assumptions.append((("gmod", "torch.nn.modules.module", h), value))
        fsource = ("attr", source, "forward")
        self.assumptions.append((fsource, forward))
        return ("module", forward, module if how == "method" else None, fsource)

    @staticmethod
    def handled_ranges(code: Any) -> list[tuple[int, int]]:
        """Byte ranges of ``code`` whose exceptions a handler catches (see
        csrc/interp.c mark_handled)."""
        return handled_ranges(code)

    def bind(self, func: Any, nargs: int, kwnames: Any) -> tuple:
        """Parameter slots of ``func`` for a call with ``nargs`` arguments, the last
        ``len(kwnames)`` by keyword (see csrc/interp.c bind_params)."""
        code = func.__code__
        kwnames = tuple(kwnames or ())
        npos = nargs - len(kwnames)
        argc, kwc, posonly = code.co_argcount, code.co_kwonlyargcount, code.co_posonlyargcount
        has_star, has_starstar = bool(code.co_flags & 0x04), bool(code.co_flags & 0x08)
        names = code.co_varnames
        slots: list[Any] = [None] * (argc + kwc)
        for i in range(min(npos, argc)):
            slots[i] = i
        extra = tuple(range(argc, npos))
        if extra and not has_star:
            raise GraphBreak("bad_call", f"{func.__qualname__}() takes {argc} positional "
                             f"arguments but {npos} were given")
        spill: dict[str, int] = {}
        for j, name in enumerate(kwnames):
            try:
                k = names.index(name, posonly, argc + kwc)
            except ValueError:
                k = -1
            if k >= 0 and slots[k] is None:
                slots[k] = npos + j
            elif k < 0 and has_starstar:
                spill[name] = npos + j
            else:
                raise GraphBreak("bad_call", f"{func.__qualname__}() got a bad or repeated "
                                 f"keyword argument {name!r}")
        defaults = func.__defaults__ or ()
        kwdefaults = func.__kwdefaults__ or {}
        for k, slot in enumerate(slots):
            if slot is not None:
                continue
            if k < argc and k >= argc - len(defaults):
                slots[k] = ("default", defaults[k - (argc - len(defaults))])
            elif k >= argc and names[k] in kwdefaults:
                slots[k] = ("default", kwdefaults[names[k]])
            else:
                raise GraphBreak("bad_call", f"{func.__qualname__}() missing argument "
                                 f"{names[k]!r}")
        if has_star:
            slots.append(("star", extra))
        if has_starstar:
            slots.append(("starstar", spill))
        return tuple(slots)

    def fold(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """``fn(*args, **kwargs)`` evaluated now on known values (sizes the graph would
        compute taken at their current, guarded, values)."""
        if self._sym_types and fn is not len:
            args = tuple(self._specialize(a) for a in args)
            kwargs = {k: self._specialize(v) for k, v in kwargs.items()}
        if type(fn) is types.MethodType and fn.__func__ in self._dict_views:
            args, fn = (fn.__self__, *args), fn.__func__
        if type(fn) is types.FunctionType and fn in self._dict_views:
            if len(args) != 1 or kwargs or type(args[0]) is not self._torch.nn.ModuleDict:
                raise GraphBreak("bad_call", f"ModuleDict.{self._dict_views[fn]}() with "
                                 f"these arguments")
            return self._module_dict_view(args[0], self._dict_views[fn])
        if is_namedtuple_type(fn):  # fields may be tensors: it holds their nodes
            try:
                return fn(*args, **kwargs)
            except TypeError as exc:
                raise GraphBreak("bad_call", f"{fn.__qualname__}(): {exc}") from exc
        if fn in _STRUCTURAL_FOLDS:
            if fn is not len:
                args = tuple(self._unbind(a) if isinstance(a, self.node_type)
                             else self._materialize(a) for a in args)
            if fn is len and isinstance(args[0], self.node_type):
                return self._tensor_len(args[0])
            out = fn(*args, **kwargs) if fn is not len else len(args[0])
            if fn is iter:
                out = tuple(out)
            return out
        if fn in _TYPE_FOLDS:
            args = tuple(self._real_type_view(a) for a in args)
            return fn(*args, **kwargs)
        if any(isinstance(a, self.node_type) for a in (*args, *kwargs.values())):
            if fn in (min, max, abs, pow, round):
                raise GraphBreak("unsupported_call", f"{fn.__name__}() of a tensor")
        if not all(self._is_static(a) or isinstance(a, (range, slice))
                   for a in (*args, *kwargs.values())):
            if fn in (min, max, sum, any, all, sorted) and len(args) == 1 and \
                    isinstance(args[0], (tuple, list)) and all(self._is_static(a) for a in args[0]):
                pass
            else:
                raise GraphBreak("unsupported_call", f"{_describe_callable(fn)} on "
                                 f"{', '.join(type(a).__name__ for a in args)}")
        try:
            out = fn(*args, **kwargs)
        except Exception as exc:
            raise GraphBreak("op_failed", f"{_describe_callable(fn)} raised "
                             f"{type(exc).__name__}: {exc}") from exc
        if isinstance(out, (range, slice)) or self._is_static(out):
            return out
        raise GraphBreak("non_tensor_result", f"{_describe_callable(fn)} returned a "
                         f"{type(out).__name__}")

    def _materialize(self, obj: Any) -> Any:
        """A module container as a tuple of its members, each loaded from its source
        (guarded, and remembered for the interpreter), so that enumerate() or zip() of it
        keeps every member's source."""
        torch = self._torch
        if not isinstance(obj, (torch.nn.ModuleList, torch.nn.Sequential,
                                torch.nn.ParameterList, torch.nn.ModuleDict)):
            return obj
        known = self.known.get(id(obj))
        source = known[1] if known is not None and known[0] is obj else None
        items = []
        for value, src in self.iterate(obj, source):
            if src is None:
                items.append(value)
            elif isinstance(value, torch.Tensor):
                items.append(self.input(src, value))
            else:
                self.assumptions.append((src, value))
                self.known.setdefault(id(value), (value, src))
                items.append(value)
        return tuple(items)

    def _module_dict_view(self, container: Any, which: str) -> tuple:
        """``ModuleDict.items()/keys()/values()`` as a tuple, each member loaded from its
        source so that calling it inlines and guards it."""
        known = self.known.get(id(container))
        source = known[1] if known is not None and known[0] is container else None
        if source is None:
            raise GraphBreak("unsupported_value", "a ModuleDict reached by no source")
        store = object.__getattribute__(container, "__dict__")["_modules"]
        self._guard_store(container, source, store)
        out = []
        for key, member in store.items():
            src = ("attr", source, key)
            self.assumptions.append((src, member))
            self.known.setdefault(id(member), (member, src))
            out.append(key if which == "keys" else member if which == "values"
                       else (key, member))
        return tuple(out)

    def _tensor_len(self, node: Any) -> Any:
        shape = node.meta["example_value"].shape
        if len(shape) == 0:
            raise GraphBreak("op_failed", "len() of a 0-d tensor")
        if self._sym_types and _concrete(shape[0]) is None:
            return self._size_node(node, 0)
        return int(shape[0])

    def _unbind(self, node: Any) -> tuple:
        """Iterating a tensor: its rows, one ``getitem`` node each (the length is the
        first dimension, a guarded shape)."""
        shape = node.meta["example_value"].shape
        if len(shape) == 0:
            raise GraphBreak("op_failed", "iteration over a 0-d tensor")
        if shape[0] > 1000:
            raise GraphBreak("unsupported_value", "iterating over more than 1000 rows")
        return tuple(self.call_function(operator.getitem, (node, i))
                     for i in range(int(shape[0])))

    def _real_type_view(self, value: Any) -> Any:
        """For type checks: a placeholder stands for its real input, another node for
        its fake value (a plain Tensor, as eager's result would be)."""
        if isinstance(value, self.node_type):
            if value.op == "placeholder":
                for node, real in self._inputs.values():
                    if node is value:
                        return real
            return value.meta["example_value"]
        return value

    def container_method(self, spec: tuple, args: tuple, kwargs: dict) -> Any:
        """``container.name(*args)`` for lists, dicts and tuples built while capturing."""
        name, container = spec
        allowed = {list: ("append", "extend", "insert", "pop", "index", "count", "copy"),
                   dict: ("get", "items", "keys", "values", "pop", "setdefault", "update",
                          "copy"),
                   tuple: ("index", "count")}.get(type(container), ())
        if name not in allowed:
            raise GraphBreak("unsupported_call", f"{type(container).__name__}.{name}()")
        if name in ("index", "count") and any(isinstance(a, self.node_type) for a in args):
            raise GraphBreak("unsupported_call", f"{name}() of a tensor")
        out = getattr(container, name)(*args, **kwargs)
        if name in ("items", "keys", "values"):
            out = tuple(out) if name != "items" else tuple(tuple(kv) for kv in out)
        return out

    def tensor_attr(self, node: Any, name: str) -> Any:
        """``tensor.name``: metadata as a constant, a view as a node."""
        fake = node.meta["example_value"]
        if name == "shape" and self._sym_types:
            return self._shape_of(node)
        if name in _TENSOR_META:
            if name == "is_leaf" and node.op != "placeholder":
                raise GraphBreak("unsupported_attribute", "Tensor.is_leaf of a computed tensor")
            if name in ("is_leaf", "requires_grad") and node.op == "placeholder":
                return getattr(self._real_type_view(node), name)
            return getattr(fake, name)
        if name in _TENSOR_VIEWS:
            return self._record("call_function", getattr, (node, name), {})
        raise GraphBreak("unsupported_attribute", f"Tensor.{name}")

    def getitem(self, container: Any, index: Any, source: Any) -> tuple[Any, Any]:
        """``(container[index], its source or None)``."""
        torch = self._torch
        if isinstance(container, self.node_type):
            return self.call_function(operator.getitem, (container, index)), None
        if self._sym_types:   # sizes as the indices of a known sequence: taken now
            index = self._specialize(index)
            if type(index) is slice:
                index = slice(*(self._specialize(v) for v in (index.start, index.stop,
                                                              index.step)))
        if isinstance(index, self.node_type):
            raise GraphBreak("unsupported_value", "indexing a sequence with a tensor")
        if isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential,
                                  torch.nn.ModuleDict, torch.nn.ParameterList,
                                  torch.nn.ParameterDict)):
            return self._module_item(container, index, source)
        if type(container) in (tuple, list, dict, str, torch.Size, range, SymShape) or \
                is_namedtuple_type(type(container)):
            try:
                out = container[index]
            except Exception as exc:
                raise GraphBreak("op_failed", f"{type(container).__name__}[{index!r}] raised "
                                 f"{type(exc).__name__}: {exc}") from exc
            keep = source is not None and not isinstance(index, slice) and \
                not self._is_static(out) and not isinstance(out, self.node_type)
            return out, (("item", source, index) if keep else None)
        raise GraphBreak("unsupported_value", f"indexing a {type(container).__name__}")

    def _module_item(self, container: Any, index: Any, source: Any) -> tuple[Any, Any]:
        d = object.__getattribute__(container, "__dict__")
        store = d["_parameters"] if isinstance(container, (self._torch.nn.ParameterList,
                                                           self._torch.nn.ParameterDict)) \
            else d["_modules"]
        keys = list(store)
        if isinstance(index, int) and not isinstance(index, bool) and \
                not isinstance(container, (self._torch.nn.ModuleDict, self._torch.nn.ParameterDict)):
            if not -len(keys) <= index < len(keys):
                raise GraphBreak("op_failed", f"index {index} out of range")
            key = keys[index]
        elif isinstance(index, str) and index in store:
            key = index
        else:
            raise GraphBreak("unsupported_value", f"{type(container).__name__}[{index!r}]")
        if source is None:
            raise GraphBreak("unsupported_value", "a module container reached by no source")
        self._guard_store(container, source, store)
        return store[key], ("attr", source, key)

    def _guard_store(self, container: Any, source: Any, store: dict) -> None:
        name = "_parameters" if store is object.__getattribute__(
            container, "__dict__").get("_parameters") else "_modules"
        self.assumptions.append((("attr", source, name), store))

    def setitem(self, container: Any, index: Any, value: Any) -> None:
        """``container[index] = value`` on a tensor: recorded in the graph."""
        self._record("call_function", operator.setitem, (container, index, value), {})

    def compare(self, op: str, a: Any, b: Any) -> Any:
        """``a op b``: a graph node for tensors, else a known bool."""
        nodes = isinstance(a, self.node_type) or isinstance(b, self.node_type)
        if op in _COMPARE and nodes:
            return self.call_function(_COMPARE[op], (a, b))
        if self._sym_types and (self._has_size_node(a) or self._has_size_node(b)):
            # shapes compared as tuples: decided now, the ShapeEnv guards the answer
            a, b = self._specialize(a), self._specialize(b)
        if nodes:
            raise GraphBreak("unsupported_value", f"`{op}` with a tensor")
        if op in ("in", "not in"):
            if not (type(b) in (tuple, list, dict, str, set, frozenset, range, self._torch.Size)
                    and (self._is_static(a))):
                raise GraphBreak("unsupported_value", f"`in` on a {type(b).__name__}")
            found = a in b
            return found if op == "in" else not found
        if not (self._comparable(a) and self._comparable(b)):
            raise GraphBreak("unsupported_value", f"comparing a {type(a).__name__} and a "
                             f"{type(b).__name__}")
        return _COMPARE[op](a, b)

    def _comparable(self, value: Any) -> bool:
        if self._is_static(value):
            return True
        return type(value).__eq__ is object.__eq__  # identity comparison, no user code

    def truth(self, obj: Any) -> bool:
        """The truth of a known object, decided without running user code; of a size
        node, its truth for the example's sizes (guarded)."""
        torch = self._torch
        if isinstance(obj, self.node_type):
            if self.is_size(obj):
                return bool(self._specialize(obj))
            raise GraphBreak("data_dependent", "the truth of a tensor (Python branches on "
                             "its value)")
        if self._is_static(obj) or type(obj) in (tuple, list, dict, set, frozenset, range):
            return bool(obj)
        if isinstance(obj, torch.nn.Module):
            if isinstance(obj, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)):
                return len(object.__getattribute__(obj, "__dict__")["_modules"]) > 0
            cls = type(obj)
            if static_attr(cls, "__bool__")[0] == "missing" and \
                    static_attr(cls, "__len__")[0] == "missing":
                return True
        elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type,
                              types.ModuleType)):
            return True
        raise GraphBreak("unsupported_value", f"the truth of a {type(obj).__name__}")

    def iterate(self, obj: Any, source: Any) -> tuple:
        """The elements of a known iterable as ``(element, source or None)`` pairs."""
        torch = self._torch
        if isinstance(obj, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ParameterList)):
            if source is None:
                raise GraphBreak("unsupported_value", "a module container reached by no source")
            d = object.__getattribute__(obj, "__dict__")
            store = d["_parameters"] if isinstance(obj, torch.nn.ParameterList) else d["_modules"]
            self._guard_store(obj, source, store)
            return tuple((v, ("attr", source, k)) for k, v in store.items())
        if isinstance(obj, torch.nn.ModuleDict):
            if source is None:
                raise GraphBreak("unsupported_value", "a module container reached by no source")
            store = object.__getattribute__(obj, "__dict__")["_modules"]
            self._guard_store(obj, source, store)
            return tuple((k, None) for k in store)
        if type(obj) in (tuple, list, torch.Size) or is_namedtuple_type(type(obj)):
            return tuple((v, ("item", source, i) if source is not None and not
                          self._is_static(v) else None) for i, v in enumerate(obj))
        if type(obj) is dict or type(obj) is str:
            return tuple((k, None) for k in obj)
        if type(obj) is range:
            if len(obj) > 10000:
                raise GraphBreak("unsupported_value", "a range longer than 10000")
            return tuple((i, None) for i in obj)
        if type(obj) in (enumerate, zip, reversed):
            return tuple((v, None) for v in obj)
        if isinstance(obj, self.node_type):
            return tuple((row, None) for row in self._unbind(obj))
        raise GraphBreak("unsupported_value", f"iterating over a {type(obj).__name__}")

    def format(self, value: Any, conversion: int, spec: Any) -> str:
        """A known value as an f-string formats it."""
        if not self._is_static(value) or (spec is not None and type(spec) is not str):
            raise GraphBreak("unsupported_value", f"formatting a {type(value).__name__}")
        value = {1: str, 2: repr, 3: ascii}.get(conversion, lambda v: v)(value)
        return builtins.format(value, spec or "")

    # -- result ---------------------------------------------------------------------

    def check_output(self, result: Any) -> None:
        """Raise GraphBreak unless ``result`` is made of nodes, plain values and
        tuples/lists/dicts of them (what a graph can return)."""
        if isinstance(result, self.node_type) or self._is_static(result):
            return
        if type(result) in (tuple, list, SymShape) or is_namedtuple_type(type(result)):
            for v in result:
                self.check_output(v)
            return
        if type(result) is dict and all(self._is_static(k) for k in result):
            for v in result.values():
                self.check_output(v)
            return
        raise GraphBreak("unsupported_value", f"returning a {type(result).__name__}")

    def output(self, result: Any) -> Any:
        """Finish the graph returning ``result`` (nodes, constants, tuples/lists/dicts)."""
        import torch.fx

        self.graph.output(self._build_namedtuples(result))
        self._drop_unused_sizes()
        self.graph.lint()
        return torch.fx.GraphModule(self._torch.nn.Module(), self.graph)


    def _drop_unused_sizes(self) -> None:
        """Erase size computations nothing uses (the tests behind resolved branches)."""
        for node in reversed(list(self.graph.nodes)):
            if not node.users and node.op in ("call_method", "call_function") and \
                    (self.is_size(node) or isinstance(node.meta.get("example_value"),
                                                      self._torch.Size)):
                self.graph.erase_node(node)

    def _build_namedtuples(self, value: Any) -> Any:
        """``value`` with each namedtuple in it made by a call node of its class: fx
        writes an output literal by its repr, and a namedtuple's repr names a class that
        the generated code does not see (torch before 2.12)."""
        if is_namedtuple_type(type(value)):
            return self.graph.call_function(
                type(value), tuple(self._build_namedtuples(v) for v in value))
        if type(value) in (SymShape, self._torch.Size):
            # fx would write a torch.Size constant as a plain tuple
            return self.graph.call_function(self._torch.Size, (tuple(value),))
        if type(value) in (tuple, list):
            return type(value)(self._build_namedtuples(v) for v in value)
        if type(value) is dict:
            return {k: self._build_namedtuples(v) for k, v in value.items()}
        return value


def _concrete(value: Any) -> Any:
    """The plain value of an int/float/bool, or of a SymInt/SymFloat/SymBool the ShapeEnv
    knows to be constant; None for a symbolic one."""
    if isinstance(value, (int, float, bool)):
        return value
    node = getattr(value, "node", None)
    if node is None:
        return None
    kind = type(value).__name__   # SymInt, SymFloat, SymBool
    fn = getattr(node, {"SymInt": "maybe_as_int", "SymFloat": "maybe_as_float"}.get(
        kind, "maybe_as_bool"), None)
    return fn() if fn is not None else None


def _exception_table(code: Any) -> list[tuple[int, int, int]]:
    """(start, end, handler) byte offsets from ``co_exceptiontable`` (3.11+): entries of
    varints in 6-bit groups, 0x40 marking more groups and 0x80 an entry's first byte;
    start, length and handler in code units, then depth and lasti."""
    table, i, out = code.co_exceptiontable, 0, []

    def varint() -> int:
        nonlocal i
        byte = table[i]
        i += 1
        value = byte & 63
        while byte & 64:
            byte = table[i]
            i += 1
            value = (value << 6) | (byte & 63)
        return value

    while i < len(table):
        start = varint() * 2
        length = varint() * 2
        handler = varint() * 2
        varint()  # depth and lasti
        out.append((start, start + length, handler))
    return out


def handled_ranges(code: Any) -> list[tuple[int, int]]:
    """The ranges whose handler catches: it starts with PUSH_EXC_INFO (except and with
    blocks).  Cleanup handlers that only restore locals and re-raise do not count."""
    import dis

    opname_at = {ins.offset: ins.opname for ins in dis.get_instructions(code)}
    return [(start, end) for start, end, handler in _exception_table(code)
            if opname_at.get(handler) == "PUSH_EXC_INFO"]


def _legacy_name(source: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in str(source)).strip("_") or "input"
    return out if not out[0].isdigit() else f"_{out}"


def _describe_callable(fn: Any) -> str:
    module = getattr(fn, "__module__", None) if isinstance(
        fn, (types.FunctionType, types.BuiltinFunctionType, type)) else None
    name = getattr(fn, "__qualname__", None) if isinstance(
        fn, (types.FunctionType, types.BuiltinFunctionType, type)) else None
    if name:
        return f"{module}.{name}" if module else name
    return f"a {type(fn).__name__}"

