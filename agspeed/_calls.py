"""The call policy of the graph builder: how each call and attribute is captured.

The interpreter asks ``plan_call`` how to capture a call and gets a ``Plan`` (see
csrc/protocol.h): a graph node for torch functions and tensor methods (``can_record``),
an inlined ``forward`` for an nn.Module (with its forward hooks, ``agspeed._hooks``), an
inlined Python function, a fold of a builtin on known values, or a constant for the
capture probes libraries call (``torch.compiler.is_compiling()``).  ``attr`` finds an attribute without running user
code (``agspeed._sources.static_attr``) and answers with an ``Attr`` kind.  Every module
fact a plan relies on (its type, hook dicts, ``forward``) is appended to the builder's
assumptions, so the guard checks it.
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import sys
import types
import weakref
from typing import Any

from agspeed._builder_types import GraphBreak, describe_callable
from agspeed._folds import FOLDABLE, kl_dispatch
from agspeed._hooks import capturable
from agspeed._hooks import hooked as hooked_call
from agspeed._sources import MISSING, _class_lookup, is_namedtuple_type, static_attr
from agspeed.protocol import Attr, Plan, Reason

_TORCH_PY_LEAVES = ("torch.nn.functional", "torch.functional", "torch._jit_internal",
                    "torch.nn.init", "torch._tensor", "torch.random")
_SIDE_EFFECT_PREFIXES = ("set_", "use_", "manual_seed", "seed", "_set", "initial_seed")
# torch.func's transforms (vmap, grad, jvp...): they enter and leave levels of torch's
# global functorch state, which a capture must never do
_TRANSFORM_FILES = tuple(f"{sep}torch{sep}_functorch{sep}{name}.py"
                         for sep in ("/", "\\")
                         for name in ("apis", "eager_transforms", "vmap", "pyfunctorch"))
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
               "_backward_pre_hooks", "_forward_hooks_with_kwargs")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks",
                 "_global_backward_hooks", "_global_backward_pre_hooks")


@functools.lru_cache(maxsize=None)
def _custom_op_def() -> type | None:
    """The type of what ``torch.library.custom_op`` makes, where torch has one."""
    try:
        from torch._library.custom_ops import CustomOpDef
    except ImportError:
        return None
    return CustomOpDef


class FunctionApply:
    """The graph target of a call of a user's ``torch.autograd.Function`` (``cls.apply``):
    the node runs the Function for real, its forward now and its backward in the
    backward pass, as eager does, and compilers trace through both.  As with
    ``torch._dynamo.allow_in_graph``, the forward also runs once on fake tensors while
    capturing, to learn its outputs.  Not made into a node (the call breaks the graph,
    as before): torch's own Functions, a forward that marks its inputs dirty (an
    in-place change the graph would not know of), a call handed a function or module
    (a forward that runs the code it is given, like reentrant checkpointing)."""

    def __init__(self, cls: Any) -> None:
        self.cls = cls   # None: the plan's marker, the class being the call's first argument
        name = cls.__name__ if cls is not None else "function"
        self.__name__ = self.__qualname__ = f"apply_{name}"
        self.__module__ = __name__

    def __repr__(self) -> str:
        return f"<{self.__name__}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.cls.apply(*args, **kwargs)


_OPTIM_DIR = f"{os.sep}torch{os.sep}optim{os.sep}"


def _dynamo_init(fn: Any) -> Any:
    """The function torch._dynamo wrapped ``fn`` around for its own use, else None: the
    ``nn.Module.__init__`` it patches once it has run (tagging the module), and an
    optimizer's ``_init_group``, which it disables for itself (it models that call in its
    own way) once any torch.compile has run in the process."""
    if type(fn) is types.FunctionType and "_torchdynamo_disable" in fn.__dict__:
        orig = fn.__dict__.get("_torchdynamo_orig_callable")
        if type(orig) is types.FunctionType and orig.__name__ == "_init_group" and \
                _OPTIM_DIR in orig.__code__.co_filename:
            return orig
        return None
    if getattr(fn, "__module__", None) != "torch._dynamo.mutation_guard" or \
            getattr(fn, "__name__", None) != "patched_init" or not fn.__closure__:
        return None
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__))
    init = cells["init"].cell_contents if "init" in cells else None
    return init if type(init) is types.FunctionType else None


def _python_getter(obj: Any, name: str) -> Any:
    """For a non-data descriptor whose ``__get__`` is written in Python, found on the
    class of ``obj`` (an object the capture made, so no guard needs to see it again:
    ``torch.distributions``' ``lazy_property``): a property whose getter calls that
    ``__get__``, to be inlined as a property's; else None."""
    cls = type(obj)
    found = _class_lookup(cls, name)
    if found is MISSING:
        return None
    kind = type(found)
    get = _class_lookup(kind, "__get__")
    if type(get) is not types.FunctionType or _class_lookup(kind, "__set__") is not MISSING \
            or _class_lookup(kind, "__delete__") is not MISSING:
        return None

    def fget(instance: Any, get: Any = get, descriptor: Any = found, owner: Any = cls) -> Any:
        return get(descriptor, instance, owner)   # (defaults: no cells to reach)

    return property(fget)


class CallPolicy:
    """The part of ``GraphBuilder`` that plans calls and finds attributes."""

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
            if not (module == "torch" or module.startswith("torch.")) or \
                    module == "torch._C._functorch":   # transform levels: global state
                return False
            return not fn.__name__.startswith(_SIDE_EFFECT_PREFIXES)
        if kind is types.FunctionType:
            return (module == "torch" or module in _TORCH_PY_LEAVES) and \
                not fn.__name__.startswith(_SIDE_EFFECT_PREFIXES)
        # an operator of the dispatcher (torch.ops.aten.add.Tensor, torch.ops.aten.add, a
        # library's custom op): it runs on fakes through its fake or meta kernel
        return kind is self._torch._ops.OpOverload or kind is self._torch._ops.OpOverloadPacket

    def attr(self, obj: Any, name: str) -> tuple[Attr, Any, Any]:
        """``(how, value, self)`` for ``obj.name`` (see ``_sources.static_attr``)."""
        written = self.written(obj, name)  # type: ignore[attr-defined]
        if written is not None:
            return Attr.WRITTEN, written[0], None
        if name == "__dict__" and not isinstance(obj, type):
            self.dict_read(obj)  # type: ignore[attr-defined]
        pure = self.pure_method(obj, name)
        if pure is not None:
            return pure
        const, value = self.numpy_const_attr(obj, name)  # type: ignore[attr-defined]
        if const:
            return Attr.VALUE, value, None
        how, value = static_attr(obj, name)
        if how is Attr.METHOD and type(value) is functools._lru_cache_wrapper and \
                isinstance(obj, logging.Logger):
            # a logger's cached method (transformers' warning_once): called for its
            # effect after the graph, where its cache keeps eager's once-only output
            self.replayed_calls = self.replayed_calls | {value}  # type: ignore
        if how is Attr.UNSUPPORTED and self.is_owned(obj):  # type: ignore[attr-defined]
            getter = _python_getter(obj, name)
            if getter is not None:
                return Attr.PROPERTY, getter, None
        if how is Attr.UNSUPPORTED:
            raise GraphBreak(Reason.UNSUPPORTED_ATTRIBUTE,
                             f"{type(obj).__name__}.{name}: {value}")
        if how is Attr.MISSING:
            return how, MISSING, None
        if how is Attr.VALUE and isinstance(value, self._torch.Tensor) and \
                isinstance(obj, self._torch.nn.Module):
            self._note_buffer(obj, name, value)
        bound = obj.__self__ if isinstance(obj, super) else obj
        if isinstance(obj, super) and how is Attr.METHOD and \
                type(value) is types.FunctionType and value.__closure__:
            self._note_home(obj, name, value)
        if how is Attr.METHOD and not isinstance(bound, type) and \
                type(_class_lookup(type(bound), name)) is classmethod:
            bound = type(bound)   # a classmethod called on an instance
        return how, value, bound if how is Attr.METHOD else None

    def _note_buffer(self, module: Any, name: str, value: Any) -> None:
        """A registered buffer read from its module: its placeholder is marked as living
        beyond the step, as a parameter does (see backends/_aot.static_marked)."""
        stores = module.__dict__.get("_buffers")
        if stores is not None and stores.get(name) is value:
            self.lifetime_static[id(value)] = value   # type: ignore[attr-defined]

    def _note_home(self, sup: super, name: str, fn: Any) -> None:
        """A function with a closure found through ``super()`` (a base class's method
        wrapped by a decorator, or patched: ``nn.Module.__init__`` once torch._dynamo
        has run): reached again through the module-level class that holds it, so that
        its cells are read, and it is guarded, by that source."""
        owner = sup.__self__
        mro = owner.__mro__ if isinstance(owner, type) else type(owner).__mro__
        start = mro.index(sup.__thisclass__) + 1 if sup.__thisclass__ in mro else len(mro)
        klass = next((k for k in mro[start:] if name in k.__dict__), None)
        if klass is None or "." in klass.__qualname__ or \
                getattr(sys.modules.get(klass.__module__), klass.__qualname__, None) \
                is not klass:
            return
        home = ("attr", ("gmod", klass.__module__, klass.__qualname__), name)
        self.assumptions.append((home, fn))  # type: ignore[attr-defined]
        self.known.setdefault(id(fn), (fn, home))  # type: ignore[attr-defined]

    def plan_call(self, fn: Any, source: Any) -> tuple:
        """How the interpreter captures a call of ``fn`` (see csrc/interp_call.c)."""
        torch = self._torch
        const = self._consts.get(id(fn))
        if const is not None and const[0] is fn:
            return (Plan.CONST, const[1])
        ctx = self.plan_ctx(fn)  # type: ignore[attr-defined]  # agspeed._ctx
        if ctx is not None:
            return ctx
        ckpt = self.checkpoint_plan(fn)  # type: ignore[attr-defined]  # agspeed._checkpoint
        if ckpt is not None:
            return ckpt
        if isinstance(fn, torch.nn.Module):
            return self._plan_module(fn, source)
        try:
            hash(fn)
        except TypeError:   # a weakref to a dict, say: no table below can hold it
            plan = self._instance_call(fn, source)   # (a dataclass compared by value)
            if plan is not None:
                return plan
            raise GraphBreak(Reason.UNSUPPORTED_CALL,
                             f"calling a {type(fn).__name__} that is not hashable") from None
        if fn in self.replayed_calls:  # type: ignore[attr-defined]
            return (Plan.GRAPH, fn)  # recorded by call_function, replayed after the graph
        if fn is logging.getLogger or fn is torch._C._log_api_usage_once or \
                fn is torch._C._group_tensors_by_device_and_dtype or fn is kl_dispatch():
            # the same logger for the same name, made at most once; torch's usage log,
            # once per process (nn.Module.__init__ calls it): both done at capture; the
            # foreach paths' grouping of tensors by device and dtype (_foreach_groups);
            # torch.distributions' choice of a KL function for two classes (its registry
            # searched; the memo it is then stored in is guarded as any dict read)
            return (Plan.FOLD, fn)
        if type(fn) is weakref.ReferenceType:
            return (Plan.FOLD, fn)   # its object, as the graph reads it (Folds._dereference)
        if fn is super:
            return (Plan.SUPER,)
        if fn is object.__getattribute__:
            return (Plan.RAW_GETATTR,)
        if fn is getattr or fn is hasattr:
            return (Plan.GETATTR,) if fn is getattr else (Plan.HASATTR,)
        if fn is setattr:
            return (Plan.SETATTR,)
        if fn is delattr:   # of an object the capture made (Objects.delattr_fold)
            return (Plan.FOLD, fn)
        plan = self.stdlib_plan(fn, source)
        if plan is None:
            plan = self.numpy_plan(fn)  # type: ignore[attr-defined]  # agspeed._numpy
        if plan is not None:
            return plan
        if fn is self._torch.autograd.Function.apply.__func__:
            return (Plan.GRAPH, FunctionApply(None))  # the class comes first (call_function)
        if type(fn) is types.FunctionType and fn in self._dict_views:  # self comes first
            return (Plan.FOLD, fn)
        if type(fn) is types.MethodType:
            if fn.__func__ in self._dict_views:
                return (Plan.FOLD, fn)
            if fn.__func__ is self._torch.autograd.Function.apply.__func__:
                return (Plan.GRAPH, FunctionApply(fn.__self__))
            # a method used as a value (``m = obj.f; m(...)``): its function keeps the
            # source it was loaded by, through which its cells are read
            if (init := _dynamo_init(fn.__func__)) is not None:
                return (Plan.INLINE, init, fn.__self__, None)
            known = self.known.get(id(fn.__func__))
            fsource = known[1] if known is not None and known[0] is fn.__func__ else None
            return (Plan.INLINE, fn.__func__, fn.__self__, fsource)
        if type(fn) is _custom_op_def():
            # torch.library.custom_op's object: a call is its operator's
            return (Plan.GRAPH, fn._opoverload)
        if self.can_record(fn) or type(fn) in (types.MethodDescriptorType,
                                               types.WrapperDescriptorType) and \
                getattr(fn, "__objclass__", None) is torch._C.TensorBase:
            return (Plan.GRAPH, fn)
        if fn in FOLDABLE or fn is torch.autograd._is_checkpoint_valid or (
                type(fn) is types.BuiltinFunctionType and fn.__module__ == "math") or \
                is_namedtuple_type(fn) or fn is torch.finfo or fn is torch.iinfo or \
                fn is torch.device or fn is torch.Size:
            return (Plan.FOLD, fn)
        if isinstance(fn, enum.EnumMeta) and \
                _class_lookup(type(fn), "__call__") is enum.EnumMeta.__call__:
            return (Plan.FOLD, fn)   # Mode("a"): the member of a plain value (Folds.fold)
        if type(fn) is types.FunctionType:
            if getattr(fn, "__module__", "") in ("torch._dynamo.eval_frame",
                                                 "torch._dynamo.decorators"):
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{fn.__qualname__} (capture disabled)")
            if fn.__code__.co_filename.endswith(_TRANSFORM_FILES):
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"torch.func's {fn.__name__} (a "
                                 f"transform runs eager, its function too)")
            if (init := _dynamo_init(fn)) is not None:
                return (Plan.INLINE, init, None, None)
            if source is None and fn.__closure__:
                known = self.known.get(id(fn))  # type: ignore[attr-defined]
                source = known[1] if known is not None and known[0] is fn else None
            return (Plan.INLINE, fn, None, source)
        plan = self._instance_call(fn, source)
        if plan is not None:
            return plan
        raise GraphBreak(Reason.UNSUPPORTED_CALL, f"calling {describe_callable(fn)}")

    def _instance_call(self, fn: Any, source: Any) -> tuple | None:
        """An instance of a Python class with ``__call__`` (a loss object, a scaler, a
        dataclass): its class's function inlined with the instance first, found on the
        class where a guard finds it again; None for anything else."""
        call = _class_lookup(type(fn), "__call__")
        if type(call) is not types.FunctionType or isinstance(fn, type):
            return None
        fsource = None if source is None else ("attr", ("type", source), "__call__")
        if fsource is not None:
            self.assumptions.append((fsource, call))  # type: ignore[attr-defined]
        return (Plan.INLINE, call, fn, fsource)

    def function_target(self, cls: Any, args: tuple, kwargs: dict) -> "FunctionApply":
        """The graph target calling ``cls.apply`` (a user's ``torch.autograd.Function``)
        on ``args``; a GraphBreak where it cannot be one (see ``FunctionApply``)."""
        torch = self._torch
        if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)) or \
                cls.__module__.split(".")[0] == "torch":
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"torch.autograd.Function.apply of "
                             f"{describe_callable(cls)}")
        forward = _class_lookup(cls, "forward")
        code = getattr(getattr(forward, "__func__", forward), "__code__", None)
        if code is None or "mark_dirty" in code.co_names:
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{cls.__name__}.apply: a forward "
                             f"that changes its inputs in place")
        if any(callable(v) and not isinstance(v, self.node_type)  # type: ignore[attr-defined]
               for v in (*args, *kwargs.values())):
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{cls.__name__}.apply handed a "
                             f"function (its forward would run it on fake tensors)")
        targets = self.__dict__.setdefault("_function_targets", {})
        if id(cls) not in targets:
            targets[id(cls)] = FunctionApply(cls)
        return targets[id(cls)]

    def _made_in_frame(self, module: Any) -> bool:
        """A module the capture made: a layer of torch.nn folded, or an instance of a
        class of the program whose ``__init__`` it followed (Plan.NEW)."""
        return self.made_modules.get(id(module)) is module or \
            self.is_owned(module)  # type: ignore[attr-defined]

    def _plan_module(self, module: Any, source: Any) -> tuple:
        torch = self._torch
        cls = type(module)
        own_call = _class_lookup(cls, "__call__")
        if own_call is not torch.nn.Module.__call__:
            # the class's own __call__, inlined as the method it is (what it calls,
            # forward or nn.Module.__call__ through super(), is planned in its turn)
            if type(own_call) is not types.FunctionType:
                raise GraphBreak(Reason.HOOKS, f"{cls.__name__} has its own __call__")
            if source is not None:
                self.assumptions.append((("type", source), cls))
            elif not self._made_in_frame(module):
                raise GraphBreak(Reason.UNSUPPORTED_CALL,
                                 f"a {cls.__name__} reached by no source")
            return (Plan.INLINE, own_call, module, None)
        d = object.__getattribute__(module, "__dict__")
        hooked = [h for h in _HOOK_DICTS if d.get(h)]
        globally = [h for h in _GLOBAL_HOOKS if getattr(torch.nn.modules.module, h, None)]
        compiled_impl = static_attr(module, "_compiled_call_impl")[1]
        inline_hooks = bool(hooked) and not globally and capturable(d)
        if (hooked and not inline_hooks) or globally or \
                compiled_impl not in (None, MISSING):
            raise GraphBreak(Reason.HOOKS, f"{cls.__name__} has "
                             f"{', '.join(hooked + globally) or 'a compiled call'}")
        how, forward = static_attr(module, "forward")
        found = forward   # what the instance holds: a forward bound to it there
        if how is Attr.VALUE and type(forward) is types.MethodType and \
                forward.__self__ is module:   # (m.forward = MethodType(f, m))
            how, forward = Attr.METHOD, forward.__func__
        if how not in (Attr.METHOD, Attr.VALUE) or type(forward) is not types.FunctionType:
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{cls.__name__}.forward is not a function")
        if source is None and self._made_in_frame(module):
            if inline_hooks:
                return (Plan.INLINE, hooked_call, module, None)
            return (Plan.MODULE, forward, module if how is Attr.METHOD else None, None)
        if source is None:
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"a {cls.__name__} reached by no source")
        self.assumptions.append((("type", source), cls))
        for h in _HOOK_DICTS:
            if h in d:
                self.assumptions.append((("attr", source, h), d[h]))
        self.assumptions.append((("attr", source, "_compiled_call_impl"), compiled_impl))
        for h in _GLOBAL_HOOKS:
            value = getattr(torch.nn.modules.module, h, None)
            if value is not None:
                self.assumptions.append((("gmod", "torch.nn.modules.module", h), value))
        if inline_hooks:    # Module.__call__'s hook loop, inlined (agspeed._hooks)
            return (Plan.INLINE, hooked_call, module, None)
        fsource = ("attr", source, "forward")
        self.assumptions.append((fsource, found))
        if found is not forward:   # the bound method, by identity; its function by its own
            fsource = ("attr", fsource, "__func__")
        return (Plan.MODULE, forward, module if how is Attr.METHOD else None, fsource)
