"""NumPy code on tensors, captured through torch's NumPy layer (``torch._numpy``).

``x.numpy()`` of a CPU tensor, and NumPy functions called on tensors or on the arrays
made so, are graph nodes: an array is a tensor node tagged ``meta["numpy"]``, and every
NumPy function, ufunc, array method, array attribute and operator on arrays is recorded
as a ``NumpyCall``, which runs ``torch._numpy``'s version of it on the tensors (NumPy's
semantics: type promotion, ``axis=``, default float64).  So the graph computes the
arrays, backends compile them like any tensor code, and what leaves the graph as an
array (returned, stored, live at a graph break) is made a real ``numpy.ndarray`` right
after the graph runs, sharing the tensor's memory as ``x.numpy()`` does.

NumPy gives a scalar (``numpy.float32``), not a 0-d array, for a reduction to one value
and for a ufunc of scalars; a node whose value NumPy would give as a scalar is tagged
``"scalar"`` and leaves the graph as one.

What stays eager:

* ``numpy.random``: its calls advance NumPy's own global generator, which a graph would
  not (torch's generator gives other numbers): the frame runs eager.
* ``x.numpy()`` of a tensor that requires grad or lives on a GPU: eager raises its error.
* A NumPy array the program already holds (a global, an argument) is not a graph input.

Values that only describe arrays (``np.dtype``, ``np.finfo``, ``np.iinfo``, scalar types)
are evaluated at capture on their constant arguments, as NumPy would.
"""

from __future__ import annotations

import collections
import copy
import sys
import types
from typing import Any

from agspeed._builder_types import GraphBreak
from agspeed._sources import SHARED_DTYPES
from agspeed.protocol import Plan, Reason

__all__ = ["NumpyCall", "NumpyPolicy", "numpy_outputs"]

# NumPy callables evaluated at capture when their arguments are constants
_FOLDED = ("dtype", "finfo", "iinfo", "result_type", "promote_types", "can_cast")
_DICTS = (dict, collections.OrderedDict, collections.defaultdict)
_FUNCTION_TYPES = (types.FunctionType, types.BuiltinFunctionType)
# the submodules whose functions torch._numpy mirrors (numpy.random is left out: above)
_SUBMODULES = ("linalg", "fft")
# functions and methods whose 0-d result NumPy gives as an array, not a scalar
_KEEP_ARRAY = frozenset({
    "array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray", "copy",
    "reshape", "ravel", "transpose", "squeeze", "expand_dims", "atleast_1d", "view",
    "astype", "zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like",
    "full_like", "T", "real", "imag", "flatten", "broadcast_to", "moveaxis", "swapaxes",
    "numpy", "flip", "fliplr", "flipud", "roll", "rot90", "sort", "fill_diagonal",
})


class NumpyCall:
    """A graph target running ``torch._numpy``'s version of a NumPy operation on
    tensors: arguments that are tensors become ``torch._numpy`` arrays, results that
    are arrays become their tensors again."""

    def __init__(self, name: str, fn: Any = None, method: str | None = None,
                 attr: str | None = None, real: Any = None) -> None:
        self.fn, self.method, self.attr = fn, method, attr
        self.real = real   # NumPy's own function, for constant arguments
        self.__name__ = self.__qualname__ = "numpy_" + name.replace(".", "_")
        self.__module__ = __name__

    def __repr__(self) -> str:
        return f"<{self.__name__}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = _to_arrays(args), _to_arrays(kwargs)
        if self.attr is not None:
            out = getattr(args[0], self.attr)
        elif self.method is not None:
            out = getattr(args[0], self.method)(*args[1:], **kwargs)
        else:
            out = self.fn(*args, **kwargs)
        return _to_tensors(out)


def _identity(t: Any) -> Any:
    return t


_AS_ARRAY = NumpyCall("numpy", _identity)       # x.numpy(): the same data, as an array
_AS_TENSOR = NumpyCall("from_numpy", _identity)  # torch.from_numpy(a): its tensor


def _to_arrays(value: Any) -> Any:
    import torch
    import torch._numpy as tnp

    kind = type(value)
    if isinstance(value, torch.Tensor):
        return tnp.ndarray(value)
    if kind in (tuple, list):
        return kind(_to_arrays(v) for v in value)
    if kind is dict:
        return {k: _to_arrays(v) for k, v in value.items()}
    return value


def _to_tensors(value: Any) -> Any:
    import torch._numpy as tnp

    kind = type(value)
    if kind is tnp.ndarray:
        return value.tensor
    if kind in (tuple, list):
        return kind(_to_tensors(v) for v in value)
    return value


def _numpy() -> Any:
    return sys.modules.get("numpy")


class _Map:
    """NumPy's callables by id, each with its ``torch._numpy`` counterpart."""

    def __init__(self, np: Any) -> None:
        import torch._numpy as tnp

        self.np = np
        self.calls: dict[int, tuple[Any, NumpyCall]] = {}
        self.folded: dict[int, Any] = {}
        pairs = [(np, tnp, "")] + [(getattr(np, m), getattr(tnp, m), m + ".")
                                   for m in _SUBMODULES]
        for real_mod, torch_mod, prefix in pairs:
            for name in dir(torch_mod):
                if name.startswith("_"):
                    continue
                real = getattr(real_mod, name, None)
                mine = getattr(torch_mod, name, None)
                if real is None or mine is None or not callable(real) or \
                        not prefix and name in _FOLDED or \
                        isinstance(real, type) and not issubclass(real, np.generic):
                    continue
                # a scalar type (np.float32(2.0)) or a ufunc (np.sqrt(64)) of constants
                # gives NumPy's own scalar: NumPy's callable answers those
                constant = real if isinstance(real, (type, np.ufunc)) else None
                self.calls[id(real)] = (real, NumpyCall(prefix + name, mine, real=constant))
        for name in _FOLDED:   # values that describe arrays, evaluated at capture
            real = getattr(np, name, None)
            if real is not None:
                self.folded[id(real)] = real


_maps: dict[int, _Map] = {}


def _map() -> _Map | None:
    np = _numpy()
    if np is None:
        return None
    got = _maps.get(id(np))
    if got is None or got.np is not np:
        got = _maps[id(np)] = _Map(np)
    return got


class NumpyPolicy:
    """The part of ``GraphBuilder`` that captures NumPy code on tensors."""

    def _numpy_init(self) -> None:
        self._numpy_nodes: set = set()   # nodes whose value is a NumPy array or scalar
        np = _numpy()
        # arrays of the program the interpreter offers as graph inputs (csrc: INPUT)
        self.ndarray_type: Any = None if np is None else np.ndarray
        # known values like an int: dtypes, scalars, finfo, iinfo
        self._numpy_constants: tuple = () if np is None else (
            np.dtype, np.generic, np.finfo, np.iinfo)

    def is_ndarray(self, value: Any) -> bool:
        """Whether ``value`` is a node standing for a NumPy array (or scalar)."""
        return type(value) is self.node_type and value in self._numpy_nodes  # type: ignore

    def numpy_plan(self, fn: Any) -> tuple | None:
        """``(GRAPH, NumpyCall)`` for a NumPy function or ufunc, ``(FOLD, fn)`` for one
        that describes arrays; None for anything else.  Decided from types and plain
        attributes of functions and classes, so no code of the program runs."""
        np = _numpy()
        if np is None:
            return None
        kind = type(fn)
        if kind is types.MethodType:   # np.random.randn: a method of NumPy's generator
            module = type(fn.__self__).__module__
        elif isinstance(fn, type) or kind in _FUNCTION_TYPES or \
                kind.__name__ == "cython_function_or_method":
            module = getattr(fn, "__module__", None)   # a plain attribute of these
        elif kind.__module__.startswith("numpy"):      # a ufunc, a dispatcher
            module = kind.__module__
        else:
            return None
        if not isinstance(module, str) or not module.startswith("numpy"):
            return None
        if module.startswith("numpy.random"):
            raise GraphBreak(Reason.UNSUPPORTED_CALL,
                             f"numpy.random.{getattr(fn, '__name__', '?')} (it draws from "
                             f"NumPy's own generator)")
        mapped = _map()
        assert mapped is not None
        if mapped.folded.get(id(fn)) is fn:
            return (Plan.FOLD, fn)
        call = mapped.calls.get(id(fn))
        if call is not None and call[0] is fn:
            return (Plan.GRAPH, call[1])
        return None

    def numpy_input(self, source: Any, array: Any) -> Any:
        """A NumPy array of the program (an argument, a global, one live at a graph
        break): the tensor sharing its memory as a graph input, read from
        ``("numpy", source)`` on every call and tagged as an array; None (a constant
        to the capture) for one torch cannot share."""
        from agspeed._sources import MISSING, numpy_tensor

        tensor = numpy_tensor(array)
        if tensor is MISSING:
            return None
        node = self.input(("numpy", source), tensor)  # type: ignore[attr-defined]
        self._numpy_nodes.add(node)
        node.meta["numpy"] = "array"
        return node

    def numpy_type_view(self, node: Any) -> Any:
        """For type checks on an array node: an empty array (or a scalar) of its dtype,
        as NumPy would have made it."""
        fake = node.meta["example_value"]
        dtype = _numpy().dtype(_numpy_dtype(fake.dtype))
        if node.meta.get("numpy") == "scalar":
            return dtype.type(0)
        return _numpy().empty((0,) * fake.dim(), dtype)

    def numpy_fold(self, fn: Any, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        """``(True, value)`` for a NumPy value describing arrays (``np.dtype("float")``,
        ``np.finfo(np.float32)``) evaluated now on constants; ``(False, None)`` for
        any other call."""
        mapped = _map()
        if mapped is None or mapped.folded.get(id(fn)) is not fn:
            return False, None
        np = mapped.np
        for a in (*args, *kwargs.values()):
            if not (self._is_static(a) or isinstance(a, np.dtype) or  # type: ignore
                    isinstance(a, type) and issubclass(a, np.generic)):
                raise GraphBreak(Reason.UNSUPPORTED_CALL,
                                 f"numpy.{fn.__name__} of a {type(a).__name__}")
        try:
            return True, fn(*args, **kwargs)
        except Exception as exc:
            raise GraphBreak(Reason.OP_FAILED, f"numpy.{fn.__name__} raised "
                             f"{type(exc).__name__}: {exc}") from exc

    def numpy_const_attr(self, obj: Any, name: str) -> tuple[bool, Any]:
        """``(True, value)`` for an attribute of a NumPy dtype, finfo or iinfo (read
        now: they are constants), else ``(False, None)``."""
        np = _numpy()
        if np is None or not isinstance(obj, (np.dtype, np.finfo, np.iinfo)) or \
                name.startswith("__"):
            return False, None
        try:
            return True, getattr(obj, name)
        except AttributeError:
            return False, None

    def numpy_call(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """Record ``fn`` (a ``NumpyCall``) on graph arguments; the tensor results are
        tagged as arrays (or scalars)."""
        args, kwargs = self._numpy_args(args), self._numpy_args(kwargs)
        nodes = [a for a in _leaves((args, kwargs))
                 if isinstance(a, self.node_type)]  # type: ignore[attr-defined]
        if fn.real is not None and not nodes:
            # a ufunc or scalar type of constants only (np.sqrt(64), np.float32(2.0)):
            # NumPy's own answer, kept when it is a scalar; an array is made by the graph
            try:
                out = fn.real(*args, **kwargs)
            except Exception as exc:
                raise GraphBreak(Reason.OP_FAILED, f"{fn.__name__} raised "
                                 f"{type(exc).__name__}: {exc}") from exc
            if self._is_static(out):  # type: ignore
                return out
        for a in nodes:
            if a not in self._numpy_nodes and fn is not _AS_ARRAY:
                self._check_numpy_source(a)   # a tensor NumPy reads as an array
        out = self._record("call_function", fn, args, kwargs)  # type: ignore
        name = fn.attr or fn.method or fn.__name__[len("numpy_"):]
        for node in _leaves(out):
            if isinstance(node, self.node_type) and \
                    isinstance(node.meta.get("example_value"), self._torch.Tensor):  # type: ignore
                scalar = node.meta["example_value"].dim() == 0 and \
                    name.rsplit("_", 1)[-1] not in _KEEP_ARRAY and name not in _KEEP_ARRAY
                self._numpy_nodes.add(node)
                node.meta["numpy"] = "scalar" if scalar else "array"
        return out

    def to_ndarray(self, node: Any, kwargs: dict) -> Any:
        """``x.numpy()``: the tensor's data as an array (eager's errors run eager)."""
        fake = node.meta["example_value"]
        if set(kwargs) - {"force"} or type(kwargs.get("force", False)) is not bool:
            raise GraphBreak(Reason.BAD_CALL, "Tensor.numpy() with these arguments")
        if kwargs.get("force"):   # a detached CPU copy of any tensor NumPy has a dtype for
            self._check_numpy_dtype(fake)
        else:
            self._check_numpy_source(node)
        args: tuple = (node,)
        if fake.requires_grad:
            args = (self._record("call_method", "detach", (node,), {}),)  # type: ignore
        if fake.device.type != "cpu":
            args = (self._record("call_method", "cpu", args, {}),)  # type: ignore
        return self.numpy_call(_AS_ARRAY, args, {})

    def _check_numpy_source(self, node: Any) -> None:
        fake = node.meta["example_value"]
        if not isinstance(fake, self._torch.Tensor):  # type: ignore
            return
        if fake.requires_grad:
            raise GraphBreak(Reason.OP_FAILED, "a NumPy array of a tensor that requires grad")
        if fake.device.type != "cpu":
            raise GraphBreak(Reason.OP_FAILED, f"a NumPy array of a {fake.device.type} tensor")
        self._check_numpy_dtype(fake)

    def _check_numpy_dtype(self, fake: Any) -> None:
        if _numpy_dtype(fake.dtype) is None:   # bfloat16, float8: NumPy has none
            raise GraphBreak(Reason.OP_FAILED, f"a NumPy array of {fake.dtype}")

    def numpy_method(self, name: str, args: tuple, kwargs: dict) -> Any:
        """``a.name(...)`` on an array node."""
        return self.numpy_call(NumpyCall(name, method=name), args, kwargs)

    def numpy_attr(self, node: Any, name: str) -> Any:
        """``a.name`` of an array node: a node for an array, a constant for metadata."""
        import torch._numpy as tnp

        np = _numpy()
        fake = node.meta["example_value"]
        try:
            with self.fake_mode:  # type: ignore
                out = getattr(tnp.ndarray(fake), name)
        except AttributeError as exc:
            raise GraphBreak(Reason.UNSUPPORTED_ATTRIBUTE, f"ndarray.{name}") from exc
        if type(out) is tnp.ndarray:
            return self.numpy_call(NumpyCall(name, attr=name), (node,), {})
        if isinstance(out, tnp.DType):
            return np.dtype(out.name)
        if callable(out):
            raise GraphBreak(Reason.UNSUPPORTED_ATTRIBUTE, f"ndarray.{name} taken as a value")
        if self._sym_types:  # type: ignore
            out = _specialize_all(self, out)
        if self._is_static(out):  # type: ignore
            return out
        raise GraphBreak(Reason.UNSUPPORTED_ATTRIBUTE, f"ndarray.{name}")

    def numpy_route(self, kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
        """A call on graph arguments of which some are arrays: NumPy's version of an
        operator, ``torch.from_numpy``; None when the call is not about arrays."""
        if not any(self.is_ndarray(a) for a in _leaves((args, kwargs))):
            return None
        torch = self._torch  # type: ignore
        if kind != "call_function":
            raise GraphBreak(Reason.OP_FAILED, f"Tensor.{target} given a NumPy array")
        if target is torch.from_numpy or (target is torch.as_tensor and not kwargs):
            # back to a tensor: a new one sharing the memory (never the input itself,
            # which eager's from_numpy(x.numpy()) is not either), without gradient
            tensor = self._record("call_function", _AS_TENSOR, args, {})  # type: ignore
            return self._record("call_method", "detach", (tensor,), {})  # type: ignore
        if getattr(target, "__module__", None) in ("_operator", "operator"):
            name = getattr(target, "__name__", "op")
            if any(type(a) is self.node_type and a not in self._numpy_nodes and  # type: ignore
                   isinstance(a.meta.get("example_value"), torch.Tensor) for a in args):
                # an array and a tensor: eager raises, or converts by the left operand's
                # rules (torch's for `tensor + array`): it decides
                raise GraphBreak(Reason.OP_FAILED, f"{name} of a NumPy array and a tensor")
            return self.numpy_call(NumpyCall(name, target), args, kwargs)
        raise GraphBreak(Reason.OP_FAILED,
                         f"{getattr(target, '__name__', target)} given a NumPy array")

    def _numpy_args(self, value: Any) -> Any:
        """Arguments as the graph's code writes them for torch._numpy: NumPy dtypes and
        scalar types by name, NumPy scalars as Python numbers."""
        np = _numpy()
        kind = type(value)
        if kind in (tuple, list):
            return kind(self._numpy_args(v) for v in value)
        if kind is dict:
            return {k: self._numpy_args(v) for k, v in value.items()}
        if np is not None:
            if isinstance(value, np.dtype):
                return value.name
            if isinstance(value, type) and (issubclass(value, np.generic) or
                                            value in (bool, int, float, complex)):
                return np.dtype(value).name   # dtype=float: NumPy's float64, by name
            if isinstance(value, np.ndarray):
                raise GraphBreak(Reason.UNSUPPORTED_VALUE,
                                 "a NumPy array of the program in NumPy code")
        return self._writable(value)  # type: ignore

    def is_numpy_constant(self, value: Any) -> bool:
        """A NumPy dtype, scalar, finfo or iinfo: a known value, like an int."""
        return bool(self._numpy_constants) and isinstance(value, self._numpy_constants)

    def numpy_output(self, value: Any, _inside: frozenset = frozenset()) -> tuple[Any, Any]:
        """``(graph_value, template)`` for the graph's output ``value``: NumPy
        constants left out of the graph (its code cannot write them), and how the
        result becomes what the program sees (``numpy_outputs``): None where nothing
        changes, "array"/"scalar" for a node NumPy holds, a ``_Const`` for a constant,
        the same structure for tuples, lists and dicts holding some."""
        if _numpy() is None:
            return value, None
        if type(value) is self.node_type:  # type: ignore
            return value, value.meta.get("numpy") if value in self._numpy_nodes else None
        if self.is_numpy_constant(value):
            return None, _Const(value)
        if id(value) in _inside:
            return value, None   # a container of the program that holds itself (as is)
        if isinstance(value, (tuple, list)):
            inside = _inside | {id(value)}
            pairs = [self.numpy_output(v, inside) for v in value]
            if all(t is None for _, t in pairs):
                return value, None
            items = [v for v, _ in pairs]
            kind = type(value)
            if kind in (tuple, list):
                stripped: Any = kind(items)
            elif hasattr(kind, "_fields"):
                stripped = kind(*items)
            else:
                stripped = kind(items)
            return stripped, tuple(t for _, t in pairs)
        if type(value) in _DICTS:
            inside = _inside | {id(value)}
            pairs2 = {k: self.numpy_output(v, inside) for k, v in value.items()}
            if all(t is None for _, t in pairs2.values()):
                return value, None
            made = copy.copy(value)   # an OrderedDict, a defaultdict keep their kind
            for k, (v, _) in pairs2.items():
                made[k] = v
            return made, {k: t for k, (_, t) in pairs2.items()}
        if any(self.is_ndarray(v) or self.is_numpy_constant(v)
               for v in _leaves_deep(self, value)):
            raise GraphBreak(Reason.UNSUPPORTED_VALUE,
                             f"a NumPy value in a {type(value).__name__} the frame returns")
        return value, None


class _Const:
    """A NumPy constant the frame returns, put in place after the graph."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _numpy_dtype(dtype: Any) -> str | None:
    """The name of NumPy's dtype for a torch dtype, or None where NumPy has none."""
    name = str(dtype).rpartition(".")[2]
    return name if name in SHARED_DTYPES else None


def _specialize_all(builder: Any, value: Any) -> Any:
    """Sizes read from a symbolic array as the plain values they have now (the
    ShapeEnv guards that they stay so)."""
    if isinstance(value, tuple):
        return tuple(_specialize_all(builder, v) for v in value)
    if isinstance(value, builder._torch.SymInt):
        return int(value)
    if isinstance(value, builder._torch.SymFloat):
        return float(value)
    return value


def _leaves(value: Any) -> list:
    out: list = []
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) in (tuple, list) or (isinstance(v, tuple) and hasattr(v, "_fields")):
            stack.extend(v)
        elif type(v) is dict:
            stack.extend(v.values())
        else:
            out.append(v)
    return out


def _leaves_deep(builder: Any, value: Any) -> list:
    if type(value) in (set, frozenset) or type(value).__name__ == "deque":
        return list(value)
    if builder.can_escape(value):
        return _leaves(list(builder.escape_parts(value)))
    return []


def numpy_outputs(template: Any, compiled: Any) -> Any:
    """``compiled`` with the outputs ``template`` marks made NumPy arrays (or scalars)
    after it runs; ``compiled`` itself when there are none."""
    if template is None:
        return compiled

    def run(*args: Any) -> Any:
        return _convert(compiled(*args), template)

    run.__wrapped__ = compiled  # type: ignore[attr-defined]
    return run


def _convert(value: Any, template: Any) -> Any:
    if template is None:
        return value
    if type(template) is _Const:
        return template.value
    if template == "array":
        return value.detach().numpy()
    if template == "scalar":
        return value.detach().numpy()[()]
    if isinstance(value, list):
        for i, t in enumerate(template):
            value[i] = _convert(value[i], t)
        return value
    if isinstance(value, tuple):
        items = [_convert(v, t) for v, t in zip(value, template)]
        kind = type(value)
        if kind is tuple:
            return tuple(items)
        return kind(*items) if hasattr(kind, "_fields") else kind(items)
    if isinstance(value, dict):
        for k, t in template.items():
            value[k] = _convert(value[k], t)
        return value
    return value

