"""Context managers in a capture: ``with`` blocks and the global modes they switch.

The interpreter meets a ``with`` at BEFORE_WITH (csrc/interp_exc.c) and asks the builder
``enter_with(cm, source)`` for two callables: ``enter()``, called at once, and
``exit(None, None, None)``, called by the block's own bytecode when it ends normally.

* torch's grad-mode managers (``torch.no_grad()``, ``torch.enable_grad()``,
  ``torch.set_grad_enabled(b)``) and autocast (``torch.autocast``, ``torch.amp.autocast``,
  ``torch.cpu.amp.autocast``, ``torch.cuda.amp.autocast``) are modelled here: calling the
  class makes a ``_Ctx`` (``Plan.CTX``, ``ctx()``), and its ``enter``/``exit`` record the
  state change as graph nodes (``torch._C._set_grad_enabled``, ``torch.amp._enter_autocast``
  / ``_exit_autocast``: the nodes AOTAutograd and fx's dead-code elimination know as side
  effects) and switch the modes the builder runs its fake operations under
  (``mode_scope``), so a tensor computed under ``no_grad`` has ``requires_grad=False`` and
  one computed under autocast the autocast dtype, as in eager.  The modes at the start of
  the capture are the real ones, which the guard checks (``agspeed.guards.state``).
  ``torch.set_grad_enabled(b)`` switches the mode when it is called, as in eager, and its
  exit switches back; so does a bare ``torch._C._set_grad_enabled(b)`` (a user's own
  manager's ``__enter__``), without an exit.  As decorators, ``torch.no_grad(f)`` (no
  parentheses) and ``set_grad_enabled(b)(f)`` (which switches back first, as torch's
  does) wrap ``f`` as ``no_grad()(f)`` does.
* ``torch.inference_mode(mode)`` records ``_enter_inference_mode`` / ``_exit_inference_mode``
  (the same pair eager runs) and runs the block's fake operations in that mode, grad off.
* ``torch.nn.attention.sdpa_kernel(backends, set_priority)`` records the graph's own
  switches of the attention backends (agspeed/_sdpa.py) and runs the block's fake
  operations with those backends selected.
* ``contextlib.nullcontext(value)`` enters to ``value`` and records nothing.
* ``torch.autograd.profiler.record_function(name)`` (an optimizer's ``step`` opens one)
  records nothing either, as under torch.compile: a profile of a graph shows the graph's
  own call, not the ranges inside it.  ``as`` binds the manager, made and never entered.
* Such a manager made before the call (``self.amp = torch.autocast(...)`` in
  ``__init__``) is modelled from the fields its ``__enter__`` reads, each guarded.
* Any other manager is a Python object whose ``__enter__`` and ``__exit__`` are found on
  its class without running user code and inlined, bound to it; its type is guarded.

Nothing here changes the process's real grad mode or autocast state while capturing.
When the graph runs, its nodes switch the modes as the with blocks did; if it raises
midway (a failure that depends on tensor data), ``restoring_modes`` puts them back, as
the blocks' exits would have.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from typing import Any, Iterator

from agspeed._builder_types import GraphBreak
from agspeed._sources import MISSING
from agspeed._sources import _class_lookup as _class_attr
from agspeed.protocol import Attr, Plan, Reason

__all__ = ["ContextPolicy", "restoring_modes", "runtime_work"]

_AUTOCAST_FIELDS = ("device_type", "dtype", "enabled", "cache_enabled")


class _Ctx:
    """A context manager the builder models: what entering it sets, and how to undo it.

    ``grad``: the grad mode it enters (None: leaves it); ``autocast``: the arguments of
    ``torch.amp._enter_autocast`` (None: none); ``result``: what ``enter()`` answers."""

    def __init__(self, builder: Any, name: str, grad: bool | None = None,
                 autocast: tuple | None = None, result: Any = None,
                 inference: bool | None = None, sdpa: tuple | None = None) -> None:
        self.builder, self.name = builder, name
        self.grad, self.autocast, self.result = grad, autocast, result
        self.sdpa = sdpa    # (backend names, set_priority): sdpa_kernel's
        self.sdpa_node: Any = None
        self.mode = grad    # the grad mode inside the block (set_grad_enabled's too)
        self.inference = inference
        self.inference_node: Any = None
        self.prev_grad: bool | None = None
        self.autocast_node: Any = None
        self.entered = False

    def enter(self) -> Any:
        if self.entered:
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"entering {self.name} twice")
        self.entered = True
        b = self.builder
        if self.grad is not None:
            self.prev_grad = b.grad_mode
            b._switch_grad(self.grad)
        if self.autocast is not None:
            self.autocast_node = b._ctx_node(b._torch.amp._enter_autocast, self.autocast)
            b.autocast_stack.append(self.autocast)
        if self.inference is not None:
            grad_mode = b._torch.autograd.grad_mode
            self.inference_node = b._ctx_node(grad_mode._enter_inference_mode,
                                              (self.inference,))
            b.inference_stack.append((self.inference, b.grad_mode))
            b.grad_mode = b.grad_mode and not self.inference   # the mode turns grad off
        if self.sdpa is not None:
            self.sdpa_node = b._ctx_node(b._sdpa.enter_sdpa_kernel, self.sdpa)
            b.sdpa_stack.append(self.sdpa)
        return self.result

    def exit(self, *exc: Any) -> None:
        if not self.entered or any(e is not None for e in exc):
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"leaving {self.name} by hand")
        self.entered = False
        b = self.builder
        if self.sdpa is not None:
            if not b.sdpa_stack or b.sdpa_stack[-1] is not self.sdpa:
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{self.name} left out of order")
            b.sdpa_stack.pop()
            b._ctx_node(b._sdpa.exit_sdpa_kernel, (self.sdpa_node, self.sdpa[1]))
        if self.autocast is not None:
            if not b.autocast_stack or b.autocast_stack[-1] is not self.autocast:
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{self.name} left out of order")
            b.autocast_stack.pop()
            b._ctx_node(b._torch.amp._exit_autocast, (self.autocast_node,))
        if self.inference is not None:
            if not b.inference_stack:
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{self.name} left out of order")
            b.grad_mode = b.inference_stack.pop()[1]
            b._ctx_node(b._torch.autograd.grad_mode._exit_inference_mode,
                        (self.inference_node,))
        if self.prev_grad is not None:
            b._switch_grad(self.prev_grad)
        return None


class ContextPolicy:
    """The part of ``GraphBuilder`` that models context managers (see the module doc).

    Expects ``_torch``, ``graph``, ``node_type``, ``attr``, ``_is_static`` and
    ``assumptions`` from the builder."""

    _torch: Any
    graph: Any
    assumptions: list
    node_type: type
    attr: Any
    _is_static: Any

    def _ctx_init(self) -> None:
        torch = self._torch
        self.grad_mode: bool = torch.is_grad_enabled()
        self._initial_grad = self.grad_mode
        self.autocast_stack: list[tuple] = []
        self.inference_stack: list[tuple] = []   # (mode, grad mode before), innermost last
        self.sdpa_stack: list[tuple] = []   # sdpa_kernel's (names, set_priority), innermost last
        self._sdpa = _attention_switches()
        grad = torch.autograd.grad_mode
        # by id, so that asking never hashes or compares a user's object
        self._grad_classes = {id(grad.no_grad): False, id(grad.enable_grad): True}
        autocast = {torch.amp.autocast_mode.autocast: None}
        for device in ("cpu", "cuda"):
            cls = getattr(getattr(getattr(torch, device, None), "amp", None), "autocast", None)
            if isinstance(cls, type):
                autocast[cls] = device
        self._autocast_classes = {id(cls): device for cls, device in autocast.items()}
        self._ctx_classes = {id(cls): cls for cls in (
            grad.no_grad, grad.enable_grad, torch.set_grad_enabled, contextlib.nullcontext,
            grad.inference_mode, torch.autograd.profiler.record_function, *autocast,
            torch._C._set_grad_enabled)}
        if self._sdpa is not None:
            self._ctx_classes[id(torch.nn.attention.sdpa_kernel)] = \
                torch.nn.attention.sdpa_kernel

    def _modelled(self, cls: Any) -> bool:
        return self._ctx_classes.get(id(cls)) is cls

    # -- the interpreter's operations --------------------------------------------------

    def plan_ctx(self, fn: Any) -> tuple | None:
        """``(Plan.CTX, fn)`` when calling ``fn`` makes or steps a modelled manager, or
        decorates a function with one made in the frame (``torch.no_grad()(f)``)."""
        if type(fn) is _Ctx or type(fn) is types.MethodType and (
                isinstance(fn.__self__, _Ctx) or self._is_clone(fn)):
            return (Plan.CTX, fn)
        return (Plan.CTX, fn) if self._modelled(fn) else None

    def _is_clone(self, fn: types.MethodType) -> bool:
        """``no_grad().clone``: what ``@torch.no_grad()`` calls for a fresh manager."""
        cls = type(fn.__self__)
        return self._modelled(cls) and fn.__func__.__name__ == "clone" and \
            _class_attr(cls, "clone") is fn.__func__

    def ctx(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """Make (calling its class) or step (enter, exit) a modelled context manager."""
        if type(fn) is types.MethodType and isinstance(fn.__self__, _Ctx):
            return fn(*args, **kwargs)
        if type(fn) is _Ctx:
            return self._decorate(fn, args, kwargs)
        if type(fn) is types.MethodType:  # a decorator's clone(): the same manager, anew
            made = fn.__self__
            again = (made.mode,) if type(made) in (self._torch.set_grad_enabled,
                                               self._torch.inference_mode) else ()
            return self.ctx(type(made), again, {})
        torch = self._torch
        name = getattr(fn, "__qualname__", repr(fn))
        if any(isinstance(a, self.node_type) for a in (*args, *kwargs.values())):
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{name}() of a value the graph computes")
        if fn is contextlib.nullcontext:
            return _Ctx(self, name, result=self._bound(fn, args, kwargs)["enter_result"])
        if fn is torch._C._set_grad_enabled:   # the bare switch: no manager, no exit
            if len(args) != 1 or kwargs or type(args[0]) is not bool:
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{name} with these arguments")
            self._switch_grad(args[0])
            return None
        if id(fn) in self._grad_classes and len(args) == 1 and not kwargs and \
                type(args[0]) is types.FunctionType:   # @torch.no_grad, no parentheses
            return self._decorate(_Ctx(self, name, grad=self._grad_classes[id(fn)]), args, {})
        if fn is torch.autograd.profiler.record_function:
            self._bound(fn, args, kwargs)
            return _Ctx(self, name, result=fn(*args, **kwargs))
        if self._sdpa is not None and fn is torch.nn.attention.sdpa_kernel:
            values = self._bound(fn, args, kwargs)
            names = self._sdpa.backend_names(values["backends"])
            if names is None or type(values["set_priority"]) is not bool:
                raise GraphBreak(Reason.BAD_CALL, f"{name}() of these backends")
            return _Ctx(self, name, result={}, sdpa=(names, values["set_priority"]))
        if id(fn) in self._grad_classes:
            self._bound(fn, args, kwargs)
            return _Ctx(self, name, grad=self._grad_classes[id(fn)])
        if fn is torch.autograd.grad_mode.inference_mode:
            mode = self._bound(fn, args, kwargs)["mode"]
            if type(mode) is not bool:
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{name}({type(mode).__name__})")
            return _Ctx(self, name, inference=mode)
        if fn is torch.set_grad_enabled:
            mode = self._bound(fn, args, kwargs)["mode"]
            if type(mode) is not bool:
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{name}({type(mode).__name__})")
            made = _Ctx(self, name)
            made.prev_grad = self.grad_mode   # it switches when made, back on exit
            made.mode = mode
            self._switch_grad(mode)
            return made
        values = self._bound(fn, args, kwargs)
        device = self._autocast_classes[id(fn)]
        target = tuple(device if key == "device_type" and device is not None else
                       values.get(key) for key in _AUTOCAST_FIELDS)
        if target[2] is None:
            target = (*target[:2], True, target[3])
        if not isinstance(target[0], str) or not isinstance(target[2], bool):
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{name}{target}")
        return _Ctx(self, name, autocast=target)

    def _decorate(self, made: _Ctx, args: tuple, kwargs: dict) -> Any:
        """``torch.no_grad()(f)`` on a manager made in the frame: torch's own decorator
        around ``f``, made from a real manager of the same kind (its ``with`` on a clone
        of it is modelled when the decorated function runs)."""
        torch = self._torch
        grad = torch.autograd.grad_mode
        if len(args) != 1 or kwargs or type(args[0]) is not types.FunctionType or \
                made.entered or made.autocast is not None:
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{made.name}() called on these")
        if made.prev_grad is not None:
            # set_grad_enabled(b)(f): made, it switched; as a decorator it switches back
            # and wraps f with a manager of mode b, as torch's __call__ does
            self._switch_grad(made.prev_grad)
            made.prev_grad = None
            return (grad.no_grad() if made.mode is False else grad.enable_grad())(args[0])
        if made.inference is not None:
            real = grad.inference_mode(made.inference)
        elif made.grad is not None:
            real = grad.no_grad() if made.grad is False else grad.enable_grad()
        else:
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{made.name}() as a decorator")
        return real(args[0])

    def enter_with(self, cm: Any, source: Any) -> tuple[Any, Any]:
        """``(exit, enter)`` for ``with cm:`` (csrc/interp_exc.c)."""
        if isinstance(cm, _Ctx):
            return cm.exit, cm.enter
        if isinstance(cm, self.node_type):
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, "a with block on a tensor")
        cls = type(cm)
        made_here = self.is_owned(cm)  # type: ignore[attr-defined]  # agspeed._objects
        if source is None and not made_here:
            raise GraphBreak(Reason.UNSUPPORTED_VALUE,
                             f"a {cls.__qualname__} reached by no source")
        if self._modelled(cls):
            made = self._from_instance(cm, source)
            return made.exit, made.enter
        methods = []
        for name in ("__exit__", "__enter__"):
            how, func, _ = self.attr(cm, name)
            if how is not Attr.METHOD or type(func) is not types.FunctionType:
                raise GraphBreak(Reason.UNSUPPORTED_CALL,
                                 f"{cls.__qualname__}.{name} is not a Python method")
            methods.append(types.MethodType(func, cm))
        if not made_here:  # (the type of an object made here is its class, guarded already)
            self.assumptions.append((("type", source), cls))
        return methods[0], methods[1]

    def _from_instance(self, cm: Any, source: Any) -> _Ctx:
        """A modelled manager made before the call (``self.amp = torch.autocast(...)``),
        from the fields its ``__enter__`` reads, each guarded on its source."""
        cls = type(cm)
        name = cls.__qualname__
        fields: dict[str, Any] = {}
        inference = cls is self._torch.autograd.grad_mode.inference_mode
        wanted = ("enter_result",) if cls is contextlib.nullcontext else ("mode",) \
            if inference else \
            ("device", "fast_dtype", "_enabled", "_cache_enabled") \
            if id(cls) in self._autocast_classes else ()
        state = object.__getattribute__(cm, "__dict__")
        for field in wanted:
            value = state.get(field, MISSING)
            if value is MISSING or isinstance(value, self._torch.Tensor) or \
                    not self._is_static(value):
                raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"{name}.{field}")
            self.assumptions.append((("attr", source, field), value))
            fields[field] = value
        self.assumptions.append((("type", source), cls))
        if id(cls) in self._grad_classes:
            return _Ctx(self, name, grad=self._grad_classes[id(cls)])
        if cls is contextlib.nullcontext:
            return _Ctx(self, name, result=fields["enter_result"])
        if cls is self._torch.autograd.profiler.record_function:
            return _Ctx(self, name, result=cm)
        if inference and type(fields["mode"]) is bool:
            return _Ctx(self, name, inference=fields["mode"])
        if id(cls) in self._autocast_classes:
            return _Ctx(self, name, autocast=(fields["device"], fields["fast_dtype"],
                                              fields["_enabled"], fields["_cache_enabled"]))
        # set_grad_enabled switched the mode when it was made, before the call
        raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"a {name} made before the call")

    # -- the modes fake operations run under ---------------------------------------------

    def mode_scope(self) -> Any:
        """A context applying the capture's grad mode and autocast to fake operations."""
        if self.grad_mode == self._initial_grad and not self.autocast_stack and \
                not self.inference_stack and not self.sdpa_stack:
            return contextlib.nullcontext()
        return self._modes()

    @contextlib.contextmanager
    def _modes(self) -> Iterator[None]:
        torch = self._torch
        with contextlib.ExitStack() as stack:
            if self.inference_stack:
                stack.enter_context(torch.inference_mode(self.inference_stack[-1][0]))
            stack.enter_context(torch.set_grad_enabled(self.grad_mode))
            for device, dtype, enabled, cache in self.autocast_stack:
                stack.enter_context(torch.autocast(device, dtype, enabled, cache))
            if self.sdpa_stack:
                names, priority = self.sdpa_stack[-1]
                previous = self._sdpa.enter_sdpa_kernel(names, priority)
                stack.callback(self._sdpa.exit_sdpa_kernel, previous, priority)
            yield

    # -- helpers --------------------------------------------------------------------

    def _switch_grad(self, mode: bool) -> None:
        if mode != self.grad_mode:
            self._ctx_node(self._torch._C._set_grad_enabled, (mode,))
            self.grad_mode = mode

    def _ctx_node(self, target: Any, args: tuple) -> Any:
        node = self.graph.create_node("call_function", target, args, {})
        node.meta["example_value"] = None
        return node

    @staticmethod
    def _bound(fn: Any, args: tuple, kwargs: dict) -> dict:
        try:
            bound = inspect.signature(fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise GraphBreak(Reason.BAD_CALL, f"{fn.__qualname__}(): {exc}") from exc
        bound.apply_defaults()
        return dict(bound.arguments)


def _attention_switches() -> Any:
    """agspeed._sdpa, where this torch has ``sdpa_kernel`` (else None: the manager is
    inlined as any other, and breaks)."""
    try:
        from agspeed import _sdpa
    except ImportError:
        return None
    return _sdpa


@contextlib.contextmanager
def runtime_work() -> Iterator[None]:
    """The runtime's own work in the program's thread (capturing, compiling, tuning): a
    saved-tensors hook of the program's (activation checkpointing, offloading) does not
    see the tensors it saves, since they are not the program's."""
    import sys

    torch = sys.modules.get("torch")
    set_tracing = getattr(getattr(getattr(torch, "_C", None), "_autograd", None),
                          "_saved_tensors_hooks_set_tracing", None)
    prior = set_tracing(True) if set_tracing is not None else None
    try:
        yield
    finally:
        if set_tracing is not None:
            set_tracing(prior)


def restoring_modes(gm: Any, compiled: Any) -> Any:
    """``compiled`` itself when graph ``gm`` switches no mode; else ``compiled`` wrapped so
    that, when the graph raises midway (a failure that depends on tensor data, which the
    capture could not see), the grad mode and the autocast state are put back as the call
    found them, as the with blocks' exits would have in eager."""
    import torch

    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    devices = sorted({n.args[0] for n in nodes if n.target is torch.amp._enter_autocast})
    switches = _attention_switches()
    attention = switches is not None and \
        any(n.target is switches.enter_sdpa_kernel for n in nodes)
    if not devices and not attention and \
            not any(n.target is torch._C._set_grad_enabled for n in nodes):
        return compiled
    get_dtype = getattr(torch, "get_autocast_dtype", None)

    def nesting() -> int:
        level = torch.autocast_increment_nesting()
        torch.autocast_decrement_nesting()
        return level - 1

    def run(*inputs: Any) -> Any:
        grad = torch.is_grad_enabled()
        attention_state = switches.snapshot() if attention else None
        if devices:
            level, cache = nesting(), torch.is_autocast_cache_enabled()
            autocast = [(d, torch.is_autocast_enabled(d),
                         get_dtype(d) if get_dtype is not None else None) for d in devices]
        try:
            return compiled(*inputs)
        except BaseException:
            torch._C._set_grad_enabled(grad)
            if devices:
                for _ in range(nesting() - level):
                    torch.autocast_decrement_nesting()
                for device, enabled, dtype in autocast:
                    torch.set_autocast_enabled(device, enabled)
                    if dtype is not None:
                        torch.set_autocast_dtype(device, dtype)
                torch.set_autocast_cache_enabled(cache)
            if attention_state is not None:
                switches.restore(attention_state)
            raise

    return run
