"""Sources: how a value the capture used is reached from a frame, and how to reach it again.

The interpreter (csrc/interp*.c) gives every value it loads a *source*, a nested tuple:

* ``("local", name)``: a local of the captured frame (arguments, free variables);
* ``("global", name)``: a global of the captured frame, or a builtin;
* ``("gmod", module name, name)``: a global (or builtin) of an inlined function's module;
* ``("attr", base, name)``: an attribute found by ``static_attr`` (below);
* ``("item", base, key)``: ``base[key]`` of a tuple (a structseq such as
  ``torch.return_types.topk`` included), list, dict or deque;
* ``("cell", function, index)``: the contents of a closure cell of a function;
* ``("fget", property)``: the getter of a property;
* ``("type", base)``: the type of a value;
* ``("cvar", base)``: the value of a ``contextvars.ContextVar`` (``var.get()``);
* ``("numpy", base)``: the tensor sharing the memory of the NumPy array ``base``;
* ``("keys", base)``: the keys of the dict ``base`` as a tuple, in their order;
* ``("values", base)``: its values as a tuple, in the same order;
* ``("storage", base)``: the size in bytes of the storage under the tensor ``base``;
* ``("state", base)``: a snapshot of the plain data ``base`` holds, deeply
  (``agspeed._copies.plain_state``: what a folded ``copy.deepcopy`` of it read);
* ``("inference", base)``: whether the tensor ``base`` is an inference tensor.

Guards check each source's value on every call, and a cache hit reads the graph's inputs
by their sources, so resolving must run no user code: ``static_attr`` reads instance and
class dictionaries (and nn.Module's parameter, buffer and submodule stores) without
calling descriptors other than plain functions and properties, or any ``__getattr__``.
"""

from __future__ import annotations

import _thread
import builtins
import collections
import contextvars
import functools
import os
import sys
import types
from typing import Any

from agspeed.protocol import Attr

__all__ = ["MISSING", "SHARED_DTYPES", "static_attr", "resolve", "name_of", "describe",
           "numpy_tensor"]


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


#: What a source resolves to when the thing is not there (any guard on it fails).
MISSING: Any = _Missing()

_MODULE_STORES = ("_parameters", "_buffers", "_modules")
_object_getattribute = object.__getattribute__
_LOCAL_GETATTRIBUTE = _thread._local.__getattribute__


def _instance_dict(obj: Any, cls: type) -> dict:
    """``obj``'s own ``__dict__`` (a ``threading.local``'s: the calling thread's, which
    its guards read on the thread they check); AttributeError where it has none."""
    if issubclass(cls, _thread._local):
        return _LOCAL_GETATTRIBUTE(obj, "__dict__")
    return _object_getattribute(obj, "__dict__")


def _class_lookup(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        d = klass.__dict__
        if name in d:
            return d[name]
    return MISSING


def compared_by_identity(value: Any) -> bool:
    """Whether ``value`` hashes and compares as ``object`` does, by identity (a module, a
    plain instance, a function): set membership of it runs no program code."""
    cls = type(value)
    return _class_lookup(cls, "__eq__") is object.__eq__ and \
        _class_lookup(cls, "__hash__") is object.__hash__


def _own_getattr(cls: type) -> Any:
    """The ``__getattr__`` instances of ``cls`` fall back to, past optimized-module view
    classes (whose ``__getattr__`` only forwards to the viewed class's)."""
    for klass in cls.__mro__:
        d = klass.__dict__
        if "__getattr__" in d and "__agspeed_view__" not in d:
            return d["__getattr__"]
    return MISSING


def is_namedtuple_type(cls: Any) -> bool:
    """A ``collections.namedtuple``/``typing.NamedTuple`` class whose items and fields
    are read the plain tuple way (no ``__getitem__`` or ``__new__`` of its own)."""
    if not isinstance(cls, type) or not issubclass(cls, tuple) or cls is tuple:
        return False
    # The class that defines __new__ must be the generated one (which has _fields).
    maker = next((k for k in cls.__mro__ if "__new__" in k.__dict__), tuple)
    return (isinstance(maker.__dict__.get("_fields"), tuple)
            and _class_lookup(cls, "__getitem__") is tuple.__getitem__)


# a class's names and its method resolution order: type's own getters, no user code
_TYPE_NAMES = {name: type.__dict__[name] for name in ("__name__", "__qualname__", "__mro__")}
_OBJECT_CLASS = object.__dict__["__class__"]
_TUPLEGETTER = type(collections.namedtuple("_Probe", "field").field)
_PROPERTY_GET = property.__dict__["__get__"]
#: a classmethod over a property reads as the property of the class (before 3.13)
_CLASSMETHOD_CHAINS = sys.version_info < (3, 13)


def _is_type_info(cls: type) -> bool:
    """torch.finfo, iinfo, device, dtype: immutable values whose attributes are C getters
    (``x.device.type``, ``dtype.is_floating_point``)."""
    torch = sys.modules.get("torch")
    return torch is not None and cls in (torch.finfo, torch.iinfo, torch.device, torch.dtype)


def _module_type() -> Any:
    torch = sys.modules.get("torch")
    return torch.nn.Module if torch is not None else None


def _tensor_grad(obj: Any, cls: type, found: Any) -> tuple[Attr, Any] | None:
    """``tensor.grad`` of a tensor whose type neither redefines ``grad`` nor has a
    ``__torch_function__`` of its own (torch.Tensor, Parameter, Buffer): torch's C getter,
    which runs no user code. A non-leaf tensor that keeps no gradient is refused: eager
    warns on that read, and a guard must not."""
    torch = sys.modules.get("torch")
    if torch is None or found is not torch._C.TensorBase.__dict__["grad"]:
        return None
    if cls is not torch.Tensor and \
            _class_lookup(cls, "__torch_function__") is not torch._C._disabled_torch_function_impl:
        return None
    if not obj.is_leaf and not obj.retains_grad:
        return Attr.UNSUPPORTED, "the gradient of a non-leaf tensor"
    return Attr.VALUE, found.__get__(obj, cls)


def static_attr(obj: Any, name: str) -> tuple[Attr, Any]:
    """``(how, value)`` for ``obj.name`` found without running user code.

    how is an ``agspeed.protocol.Attr``: ``VALUE`` (an instance or module-store value, a
    class constant), ``METHOD`` (a plain function found on the class, or a classmethod's
    function: value is the function), ``PROPERTY`` (value is the property object), ``MISSING``, or
    ``UNSUPPORTED`` (a descriptor or ``__getattr__`` that only running code could answer;
    value says which).
    """
    # Kinds of objects are told by their type, never by isinstance(), which asks the
    # object's __class__ and so runs a custom __getattribute__.
    cls = type(obj)
    if issubclass(cls, types.ModuleType):
        d = _object_getattribute(obj, "__dict__")
        if name not in d and cls.__name__ == "VFModule" and cls.__module__ == "torch._VF":
            # torch._VF: its __getattr__ reads torch's own builtins (torch._VF.lstm)
            found = getattr(d.get("vf"), name, MISSING)
            if type(found) is types.BuiltinFunctionType:
                return Attr.VALUE, found
        return (Attr.VALUE, d[name]) if name in d else (Attr.MISSING, MISSING)
    if issubclass(cls, super):
        return _super_attr(obj, name)
    if cls.__qualname__ == "cuBLASModule" and cls.__module__ == "torch.backends.cuda" and \
            name.startswith("allow_"):
        # torch.backends.cuda.matmul's flags: its __getattr__ reads torch's own state
        return Attr.VALUE, getattr(obj, name)
    found = _class_lookup(cls, name)
    if name == "grad" and type(found) is types.GetSetDescriptorType:
        grad = _tensor_grad(obj, cls, found)
        if grad is not None:
            return grad
    if cls is contextvars.ContextVar and name == "get":
        return Attr.METHOD, found   # a read the capture models (its value is guarded)
    if found is _OBJECT_CLASS:
        return Attr.VALUE, cls
    if name == "__dict__" and type(found) is types.GetSetDescriptorType and \
            not issubclass(cls, type):
        return Attr.VALUE, _instance_dict(obj, cls)   # an instance's own
    if found is not MISSING:
        kind = type(found)
        if kind is property or issubclass(kind, property) and \
                _class_lookup(kind, "__get__") is _PROPERTY_GET:
            return Attr.PROPERTY, found   # (a subclass that reads as property does too)
        if kind is _TUPLEGETTER:  # a namedtuple field: an item of the tuple
            return Attr.VALUE, found.__get__(obj, cls)
        if hasattr(kind, "__set__") or hasattr(kind, "__delete__"):
            if issubclass(cls, type) and name in _TYPE_NAMES and found is _TYPE_NAMES[name]:
                return Attr.VALUE, found.__get__(obj, cls)   # a class's own name
            if kind is types.MemberDescriptorType or kind is types.GetSetDescriptorType:
                if cls.__module__ == "builtins" or kind is types.MemberDescriptorType \
                        or _is_type_info(cls):
                    try:
                        return Attr.VALUE, found.__get__(obj, cls)
                    except AttributeError:  # a __slots__ member never set
                        return Attr.MISSING, MISSING
            return Attr.UNSUPPORTED, f"data descriptor {kind.__name__}"
    try:
        d = _instance_dict(obj, cls)
    except AttributeError:
        d = None
    if issubclass(cls, type) and name not in d:
        # a class's attribute is found on its MRO before its metaclass's plain
        # descriptors (type.__getattribute__ does not hide a class's own)
        value = _class_lookup(obj, name)
        if type(value) is types.FunctionType:
            return Attr.VALUE, value
    if d is not None and name in d:
        value = d[name]
        if issubclass(cls, type):   # a class's own dict: its descriptors, unbound
            if type(value) is staticmethod:
                return Attr.VALUE, value.__func__
            if type(value) is classmethod and type(value.__func__) is types.FunctionType:
                return Attr.METHOD, value.__func__   # called with the class as self
            if type(value) is classmethod and type(value.__func__) is property and \
                    _CLASSMETHOD_CHAINS:
                return Attr.PROPERTY, value.__func__   # its getter runs with the class
        return Attr.VALUE, value
    if found is not MISSING:
        kind = type(found)
        if kind is types.FunctionType:
            return (Attr.METHOD, found) if not issubclass(cls, type) else (Attr.VALUE, found)
        if kind is staticmethod:
            return Attr.VALUE, found.__func__
        if kind is classmethod and type(found.__func__) is types.FunctionType:
            return Attr.METHOD, found.__func__   # called with the class as self
        if kind is functools._lru_cache_wrapper and not issubclass(cls, type):
            return Attr.METHOD, found   # an lru_cache'd method: bound as a function is
        if hasattr(kind, "__get__") and kind not in (types.BuiltinFunctionType, type):
            if kind is types.MethodDescriptorType:
                # a builtin type's method: loaded as the class's function with the
                # object as self, so that a call the capture cannot follow breaks at
                # the call (resumable), not at the load
                return Attr.METHOD, found
            if kind is types.WrapperDescriptorType:
                return Attr.UNSUPPORTED, "method of a builtin type"
            return Attr.UNSUPPORTED, f"descriptor {kind.__name__}"
        return Attr.VALUE, found
    module_type = _module_type()
    if module_type is not None and issubclass(cls, module_type) and d is not None:
        for store in _MODULE_STORES:
            s = d.get(store)
            if s is not None and name in s:
                return Attr.VALUE, s[name]
        if _own_getattr(cls) is not module_type.__getattr__:
            return Attr.UNSUPPORTED, "a custom __getattr__"
        return Attr.MISSING, MISSING
    if issubclass(cls, type):
        value = _class_lookup(obj, name)
        if value is not MISSING:
            if type(value) is staticmethod:
                return Attr.VALUE, value.__func__
            if type(value) is classmethod and type(value.__func__) is types.FunctionType:
                return Attr.METHOD, value.__func__
            if type(value) in (classmethod, property):
                return Attr.UNSUPPORTED, type(value).__name__
            return Attr.VALUE, value
    if _class_lookup(cls, "__getattr__") is not MISSING:
        return Attr.UNSUPPORTED, "a custom __getattr__"
    return Attr.MISSING, MISSING


def _super_attr(sup: super, name: str) -> tuple[str, Any]:
    start, self = sup.__thisclass__, sup.__self__
    mro = type(self).__mro__ if not issubclass(type(self), type) else self.__mro__
    after = False
    for klass in mro:
        if after and name in klass.__dict__:
            value = klass.__dict__[name]
            if type(value) is types.FunctionType:
                return Attr.METHOD, value
            if type(value) is staticmethod:
                return Attr.VALUE, value.__func__
            if type(value) is classmethod and type(value.__func__) is types.FunctionType \
                    and isinstance(self, type):
                # super().f() inside a classmethod: the base's classmethod, bound to the
                # same class (an instance's super() would bind its type: not modelled)
                return Attr.METHOD, value.__func__
            if type(value) in (types.MethodDescriptorType, types.WrapperDescriptorType) and \
                    klass.__module__ == "builtins":
                return Attr.METHOD, value   # a builtin base's method, called with self
            return Attr.UNSUPPORTED, f"super() attribute of type {type(value).__name__}"
        after = after or klass is start
    return Attr.MISSING, MISSING


def _lookup_global(d: dict, name: str) -> Any:
    if name in d:
        return d[name]
    b = d.get("__builtins__", builtins)
    b = b if isinstance(b, dict) else b.__dict__
    return b.get(name, MISSING)


def resolve(source: tuple, f_locals: dict, f_globals: dict, f_builtins: dict,
            memo: dict) -> Any:
    """The value ``source`` reaches now (``MISSING`` if it reaches nothing)."""
    got = memo.get(source, memo)
    if got is not memo:
        return got
    kind = source[0]
    if kind == "local":
        value = f_locals.get(source[1], MISSING)
    elif kind == "global":
        name = source[1]
        value = f_globals[name] if name in f_globals else f_builtins.get(name, MISSING)
    elif kind == "gmod":
        mod = sys.modules.get(source[1])
        value = MISSING if mod is None else _lookup_global(mod.__dict__, source[2])
    else:
        base = resolve(source[1], f_locals, f_globals, f_builtins, memo)
        key = source[2] if len(source) > 2 else None  # ("type", src), ("fget", src)
        value = MISSING if base is MISSING else resolve_step(kind, base, key)
    memo[source] = value
    return value


def resolve_step(kind: str, base: Any, key: Any) -> Any:
    """What the source ``(kind, <base's source>, key)`` reaches from ``base`` (``MISSING``
    if nothing).  Also the guard programs' way for what they do not do in C
    (guards/program.c), so that both read sources alike."""
    if kind == "attr":
        how, found = static_attr(base, key)
        return found if how in (Attr.VALUE, Attr.METHOD, Attr.PROPERTY) else MISSING
    if kind == "item":
        try:
            if type(base) in (tuple, list, dict, collections.deque) or _is_size(base) or \
                    is_namedtuple_type(type(base)):
                return base[key]
            if isinstance(base, dict):   # a subclass: its store, past its own methods
                return dict.__getitem__(base, key)
            if isinstance(base, tuple) and \
                    _class_lookup(type(base), "__getitem__") is tuple.__getitem__:
                return tuple.__getitem__(base, key)   # torch.return_types.topk...
            if base is os.environ:
                return base[key]
        except (IndexError, KeyError, TypeError):
            pass
        return MISSING
    if kind == "cell":
        closure = getattr(base, "__closure__", None) or ()
        try:
            return closure[key].cell_contents
        except (IndexError, ValueError):
            return MISSING
    if kind == "fget":
        return base.fget if issubclass(type(base), property) else MISSING
    if kind == "cvar":
        if type(base) is not contextvars.ContextVar:
            return MISSING
        try:
            return base.get()
        except LookupError:
            return MISSING
    if kind == "numpy":
        return numpy_tensor(base)
    if kind == "keys":   # a subclass's store, past its own methods
        if type(base) is collections.OrderedDict:   # its own order (move_to_end)
            return tuple(base)
        return tuple(dict.keys(base)) if isinstance(base, dict) else MISSING
    if kind == "values":   # in the order of "keys"
        if type(base) is collections.OrderedDict:
            return tuple(collections.OrderedDict.values(base))
        return tuple(dict.values(base)) if isinstance(base, dict) else MISSING
    if kind == "storage":
        return storage_bytes(base)
    if kind == "state":
        from agspeed._copies import plain_state

        return plain_state(base)
    if kind == "inference":
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(base, torch.Tensor):
            return MISSING
        return base.is_inference()
    if kind == "type":
        return type(base)
    if kind == "gmod":  # base: the module
        return _lookup_global(base.__dict__, key)
    return MISSING


#: the NumPy dtypes torch shares memory with (torch.from_numpy)
SHARED_DTYPES = frozenset({"bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16",
                           "int32", "int64", "float16", "float32", "float64", "complex64",
                           "complex128"})


def numpy_tensor(array: Any) -> Any:
    """The tensor sharing the memory of ``array``, an exact ``numpy.ndarray`` torch can
    share as it is (writeable, native byte order, a dtype torch has, no negative
    stride), decided before asking torch, which would raise; ``MISSING`` otherwise."""
    np = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    if np is None or torch is None or type(array) is not np.ndarray or \
            not array.flags.writeable or array.dtype.name not in SHARED_DTYPES or \
            not array.dtype.isnative or any(s < 0 for s in array.strides):
        return MISSING
    return torch.from_numpy(array)


def storage_bytes(tensor: Any) -> Any:
    """The size in bytes of the storage under ``tensor`` (a strided tensor that has
    one), else ``MISSING``."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(tensor, torch.Tensor) or \
            tensor.layout is not torch.strided or tensor.is_nested or tensor.is_meta:
        return MISSING
    return tensor.untyped_storage().nbytes()


def _is_size(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and type(value) is torch.Size


def describe(source: tuple) -> str:
    """Python-like text for a source: ``self.layers[0].weight``."""
    kind = source[0]
    if kind in ("local", "global"):
        return source[1]
    if kind == "gmod":
        return f"{source[1]}.{source[2]}"
    base = describe(source[1])
    if kind == "attr":
        return f"{base}.{source[2]}"
    if kind == "item":
        return f"{base}[{source[2]!r}]"
    if kind == "cell":
        return f"{base}.__closure__[{source[2]}]"
    text = _DESCRIBED.get(kind)
    return text.format(base) if text is not None else repr(source)


# how the sources of one base and no key read, as Python
_DESCRIBED = {"fget": "{}.fget", "cvar": "{}.get()", "numpy": "torch.from_numpy({})",
              "keys": "tuple({})", "values": "tuple({}.values())",
              "storage": "{}.untyped_storage().nbytes()",
              "type": "type({})", "state": "copy.deepcopy({})"}


def name_of(source: tuple) -> str:
    """An identifier made from a source (for graph placeholders)."""
    text = describe(source)
    out = "".join(c if c.isalnum() else "_" for c in text).strip("_") or "input"
    while "__" in out:
        out = out.replace("__", "_")
    return out if not out[0].isdigit() else f"_{out}"
