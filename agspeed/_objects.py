"""Objects of the program that a capture makes or returns: structseqs, namedtuples,
dataclasses (transformers' ``ModelOutput`` among them) and instances of user classes.

The value model is the interpreter's: an object the capture makes is a REAL Python
object of the program's class whose attributes (and, for a dict subclass, items) hold
graph arguments (a graph node for a tensor, the object itself for anything else).  The
builder keeps each in ``objects`` (id -> object), which both keeps it alive while
capturing and says it is *owned*: writes to it are recorded on the object itself, not
refused as side effects, because no one outside the frame can see them yet.

How each kind is made:

* ``torch.return_types`` structseqs (``x.max(dim=1)``) come out of recorded calls: the
  result is the structseq type holding the item nodes (``GraphBuilder._wrap``), so
  ``.values``, ``[0]`` and unpacking read the tuple;
* namedtuples are folds of their class on graph arguments (``_folds``);
* a plain class (``UC(x)``, a dataclass) is planned ``Plan.NEW``: the interpreter asks
  ``new_object`` for an instance made by the class's builtin ``__new__`` and inlines its
  ``__init__`` on it; ``STORE_ATTR`` on it comes to ``store_attr`` (which answers a
  Python ``__setattr__`` to inline, or stores the graph argument);
* a ``ModelOutput`` is made by running its (library) constructor on the fake values of
  its tensors, then putting the graph nodes back in place of the fakes: its
  ``__post_init__`` asks ``is_tensor`` of its fields, which a node is not.

What leaves the graph (its output, or, for resume functions, the state at a break) goes
through ``escape``: it turns a value into the graph argument that rebuilds it after the
graph runs: a call node of the structseq or namedtuple class, or of ``rebuild_object``
(an instance of the real class, its state set without running ``__init__``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import sys
import types
from collections import OrderedDict
from typing import Any

from agspeed._builder_types import GraphBreak
from agspeed._sources import MISSING, _class_lookup, is_namedtuple_type, static_attr
from agspeed.protocol import Attr, Plan, Reason

__all__ = ["Objects", "bare_dict_subclass", "is_structseq_type", "rebuild_object"]

# Builtin methods of an owned object that only read it (or, for the mutators, write
# the object itself): folded by calling them for real.
_DICT_READERS = frozenset({"keys", "values", "items", "get", "__getitem__", "__contains__",
                           "__len__", "__iter__", "copy"})
_OWNED_WRITERS = frozenset({"__setattr__", "__setitem__", "__init__", "__delattr__"})
_BUILTIN_BOUND = (types.BuiltinMethodType, types.MethodWrapperType)
_CVAR_GET = contextvars.ContextVar.get


def is_structseq_type(cls: Any) -> bool:
    """A ``torch.return_types``/``os.stat_result``-like struct sequence class."""
    return isinstance(cls, type) and len(cls.__mro__) == 3 and cls.__mro__[1] is tuple \
        and isinstance(cls.__dict__.get("n_sequence_fields"), int)


def _model_output_type() -> Any:
    mod = sys.modules.get("transformers.utils.generic")
    return getattr(mod, "ModelOutput", None)


def _builtin_base(cls: type) -> type:
    """The builtin class whose ``__new__`` makes instances of ``cls``."""
    for klass in cls.__mro__:
        if "__new__" in klass.__dict__:
            return klass
    return object


def _torch_made(cls: type) -> bool:
    """Whether making an instance of the nn.Module subclass ``cls`` runs torch's code
    alone (no class of the program defines ``__init__`` or ``__new__``)."""
    for name in ("__init__", "__new__"):
        found = _class_lookup(cls, name)
        module = getattr(found, "__module__", None) or ""
        if found is not object.__new__ and not module.startswith("torch."):
            return False
    return True


# what a class body holds that runs no code when its instances are made or read
_INERT = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
                    "__annotations__", "__firstlineno__", "__static_attributes__"})


def bare_dict_subclass(cls: type) -> bool:
    """A subclass of dict or OrderedDict (``class Batch(OrderedDict): pass``) whose
    classes add no code of their own: it is made and read as its dict is."""
    if cls in (dict, OrderedDict) or type(cls) is not type or not issubclass(cls, dict):
        return False
    for klass in cls.__mro__:
        if klass in (dict, OrderedDict):
            return True
        if set(klass.__dict__) - _INERT:
            return False
    return False


def _dict_keys(args: tuple, kwargs: dict) -> list:
    """The keys ``dict(*args, **kwargs)`` would have (the positional one a mapping or
    pairs)."""
    keys = list(kwargs)
    if len(args) > 1:
        raise TypeError(f"expected at most 1 argument, got {len(args)}")
    if args:
        first = args[0]
        if isinstance(first, dict):
            keys += list(first)
        elif type(first) in (tuple, list):
            keys += [p[0] for p in first]
        else:
            raise TypeError(f"made from a {type(first).__name__}")
    return keys


def _dict_base(cls: type) -> Any:
    """``OrderedDict`` or ``dict`` for a subclass of one (the store its items live in)."""
    for klass in cls.__mro__:
        if klass is OrderedDict or klass is dict:
            return klass
    return None


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    return names


def _state(obj: Any) -> tuple[tuple, tuple]:
    """``(attributes, items)`` of an object: ((name, value), ...) pairs."""
    cls = type(obj)
    attrs = []
    for name in _slot_names(cls):
        try:
            attrs.append((name, object.__getattribute__(obj, name)))
        except AttributeError:
            pass
    try:
        attrs.extend(object.__getattribute__(obj, "__dict__").items())
    except AttributeError:
        pass
    base = _dict_base(cls)
    items = tuple(base.items(obj)) if base is not None else ()
    return tuple(attrs), items


def rebuild_object(cls: type, attrs: tuple, items: tuple) -> Any:
    """An instance of ``cls`` with these attributes and (dict subclasses) items, made
    without running ``__init__`` or a custom ``__setattr__`` (as ``copy`` does)."""
    obj = _builtin_base(cls).__new__(cls)
    for name, value in attrs:
        object.__setattr__(obj, name, value)
    base = _dict_base(cls)
    for key, value in items:
        base.__setitem__(obj, key, value)
    return obj


def _rebuilder(cls: type) -> Any:
    """A function making instances of ``cls`` from their state, named after the class:
    graph code names its call targets, but would write a class passed as an argument
    by its repr.  Made per graph (the graph holds it), so no table keeps classes
    alive."""
    def rebuild(attrs: tuple, items: tuple) -> Any:
        return rebuild_object(cls, attrs, items)

    rebuild.__name__ = rebuild.__qualname__ = f"rebuild_{cls.__name__}"
    rebuild.agspeed_rebuilds = cls  # type: ignore[attr-defined]  # see backends._outputs
    return rebuild


class Objects:
    """The part of ``GraphBuilder`` that makes, reads, writes and returns objects."""

    objects: dict[int, Any]
    _escaped: dict[int, Any]

    def is_owned(self, obj: Any) -> bool:
        """Whether the capture made ``obj`` (so writes to it are its own)."""
        return obj is not None and self.objects.get(id(obj)) is obj

    def _own(self, obj: Any) -> Any:
        self.objects[id(obj)] = obj
        return obj

    # -- making objects -----------------------------------------------------------

    def _plain_class(self, cls: type) -> bool:
        """A class whose call is ``type.__call__``: its builtin ``__new__`` (object's or
        a dict's) and then its ``__init__``, both of which the capture can follow."""
        if type(cls) is not type and _class_lookup(type(cls), "__call__") is not \
                type.__call__:
            return False
        if cls.__module__ == "builtins" or cls.__module__.startswith("torch") and \
                not cls.__module__.startswith("torch.distributions."):
            return False
        base = _builtin_base(cls)
        if base not in (object, dict, OrderedDict):
            return False
        init = _class_lookup(cls, "__init__")
        return type(init) is types.FunctionType or init in (object.__init__, dict.__init__)

    def new_object(self, cls: type) -> Any:
        """A fresh instance of ``cls`` made by its builtin ``__new__``, owned by the
        capture (``__init__`` is inlined by the interpreter)."""
        return self._own(_builtin_base(cls).__new__(cls))

    def _make_model_output(self, cls: type, args: tuple, kwargs: dict) -> Any:
        """``cls(*args, **kwargs)`` for a ModelOutput: run on the fake tensors, the
        nodes then put back in their places."""
        import torch.fx

        back: dict[int, Any] = {}

        def note(node: Any) -> Any:
            fake = node.meta["example_value"]
            back[id(fake)] = node
            return fake

        fargs = torch.fx.node.map_arg(args, note)
        fkwargs = torch.fx.node.map_arg(kwargs, note)
        try:
            obj = cls(*fargs, **fkwargs)
        except Exception as exc:
            raise GraphBreak(Reason.BAD_CALL, f"{cls.__qualname__}(): {exc}") from exc

        def swap(value: Any) -> Any:
            node = back.get(id(value))
            if node is not None and node.meta["example_value"] is value:
                return node
            if type(value) in (tuple, list):
                return type(value)(swap(v) for v in value)
            return value

        attrs, items = _state(obj)
        for name, value in attrs:
            object.__setattr__(obj, name, swap(value))
        base = _dict_base(cls)
        for key, value in items:
            base.__setitem__(obj, key, swap(value))
        swap = None  # type: ignore[assignment]   (it calls itself through this cell)
        return self._own(obj)

    # -- writing owned objects -------------------------------------------------------

    def store_attr(self, obj: Any, name: str, value: Any) -> Any:
        """``obj.name = value``: on an owned object, stored (None), or the Python
        ``__setattr__`` to inline as ``f(obj, name, value)``, or a property's setter to
        inline as ``fset(obj, value)``; on any other object, a side effect."""
        if not self.is_owned(obj):
            raise GraphBreak(Reason.SIDE_EFFECT,
                             f"setting attribute {name!r} of a {type(obj).__name__}")
        cls = type(obj)
        setter = _class_lookup(cls, "__setattr__")
        if type(setter) is types.FunctionType:
            return setter
        found = _class_lookup(cls, name)
        if type(found) is property and type(found.fset) is types.FunctionType:
            return found.fset   # inlined as fset(obj, value)
        if found is not MISSING and hasattr(type(found), "__set__") and \
                type(found) is not types.MemberDescriptorType:
            raise GraphBreak(Reason.UNSUPPORTED_ATTRIBUTE,
                             f"setting {cls.__name__}.{name}, a {type(found).__name__}")
        if setter is not object.__setattr__ and setter is not dict.__setattr__:
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{cls.__name__}.__setattr__")
        object.__setattr__(obj, name, value)
        return None

    # -- the policy, extended to objects -----------------------------------------------

    def plan_call(self, fn: Any, source: Any) -> tuple:
        if isinstance(fn, type) and self.plan_ctx(fn) is None:  # type: ignore[attr-defined]
            # (context managers the builder models are made by agspeed._ctx)
            mo = _model_output_type()
            if is_structseq_type(fn) or (mo is not None and issubclass(fn, mo)):
                return (Plan.FOLD, fn)
            if issubclass(fn, self._torch.nn.Module) and (
                    fn.__module__.startswith("torch.nn.modules.") or _torch_made(fn)):
                return (Plan.FOLD, fn)   # a layer made by torch's code alone (fold)
            if bare_dict_subclass(fn):
                return (Plan.FOLD, fn)   # made by its dict's own __init__ (fold)
            if not is_namedtuple_type(fn) and self._plain_class(fn):
                init = _class_lookup(fn, "__init__")
                if type(init) is not types.FunctionType:
                    return (Plan.NEW, fn, None, None)
                isrc = _init_source(fn, source)
                if isrc is not None:   # a later call must not run a replaced __init__
                    self.assumptions.append((isrc, init))
                return (Plan.NEW, fn, init, isrc)
        if fn is object.__setattr__ or fn is object.__init__ or fn is _CVAR_GET or \
                fn is dataclasses.fields:
            return (Plan.FOLD, fn)
        if type(fn) in _BUILTIN_BOUND and self.is_owned(getattr(fn, "__self__", None)):
            return (Plan.FOLD, fn)
        mo = _model_output_type()
        if mo is not None and fn in (mo.__getitem__, mo.to_tuple):
            return (Plan.FOLD, fn)
        return super().plan_call(fn, source)  # type: ignore[misc]

    def fold(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        if is_structseq_type(fn):
            if len(args) != 1 or kwargs:
                raise GraphBreak(Reason.BAD_CALL, f"{fn.__qualname__}() with these arguments")
            return fn(tuple(args[0]))
        mo = _model_output_type()
        if mo is not None and isinstance(fn, type) and issubclass(fn, mo):
            return self._make_model_output(fn, args, kwargs)
        if isinstance(fn, type) and issubclass(fn, self._torch.nn.Module):
            return self._make_module(fn, args, kwargs)
        if isinstance(fn, type) and bare_dict_subclass(fn):
            try:
                keys = _dict_keys(args, kwargs)
            except (TypeError, IndexError, KeyError) as exc:
                raise GraphBreak(Reason.BAD_CALL, f"{fn.__qualname__}(): {exc}") from exc
            for key in keys:
                if not self._is_static(key):
                    raise GraphBreak(Reason.UNSUPPORTED_VALUE,
                                     f"{fn.__qualname__}() keyed by a {type(key).__name__}")
            return self._run(fn, args, kwargs)   # owned by the interpreter, as a dict
        if mo is not None and fn in (mo.__getitem__, mo.to_tuple):
            if not args or not self.is_owned(args[0]):
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"ModelOutput.{fn.__name__}")
            return self._run(fn, args, kwargs)
        if fn is _CVAR_GET:
            return self._context_var(args, kwargs)
        if fn is dataclasses.fields and len(args) == 1 and not kwargs and (
                self.is_owned(args[0]) or isinstance(args[0], type)):
            return self._run(fn, args, kwargs)   # the class's Field objects
        if fn is object.__setattr__ and len(args) == 3 and not kwargs and \
                type(args[1]) is str and not self.is_owned(args[0]):
            known = self.known.get(id(args[0]))
            if known is not None and known[0] is args[0]:
                # past the class's own __setattr__ (inlined): a side effect, replayed
                self.effect_setattr(args[0], known[1], args[1], args[2],  # type: ignore
                                    raw=True)
                return None
        if fn is object.__setattr__ or fn is object.__init__:
            if not args or not self.is_owned(args[0]):
                raise GraphBreak(Reason.SIDE_EFFECT, f"object.{fn.__name__} of an object of "
                                 f"the program")
            return self._run(fn, args, kwargs)
        if type(fn) in _BUILTIN_BOUND and self.is_owned(getattr(fn, "__self__", None)):
            return self._owned_builtin(fn, args, kwargs)
        if fn in (str, repr) and len(args) == 1 and not kwargs and isinstance(args[0], type) \
                and _class_lookup(type(args[0]), "__repr__") is type.__repr__:
            return fn(args[0])
        if fn is hasattr and len(args) == 2 and type(args[1]) is str:
            # of a tensor or a container built here: its type answers, which no user
            # code defines (the tensor's type is guarded)
            if isinstance(args[0], self.node_type):
                return hasattr(self._real_type_view(args[0]), args[1])
            kind = type(args[0])
            if kind in (tuple, list, dict) or is_structseq_type(kind) or \
                    is_namedtuple_type(kind):
                return hasattr(args[0], args[1])
        return super().fold(fn, args, kwargs)  # type: ignore[misc]

    def _make_module(self, cls: type, args: tuple, kwargs: dict) -> Any:
        """A layer of torch.nn made in the frame (``CrossEntropyLoss()``, ``nn.ReLU()``)
        from plain arguments: made now, the same on every call the guards admit, so it
        holds no state of its own; one with parameters or tensors breaks."""
        if not all(self._is_static(a) for a in (*args, *kwargs.values())):
            raise GraphBreak(Reason.UNSUPPORTED_CALL,
                             f"{cls.__name__}() with arguments that are not plain values")
        with self._torch.random.fork_rng(devices=()):
            # a layer with parameters draws them from the generator, which the program
            # then draws from again when the call runs eager after the break
            module = self._run(cls, args, kwargs)
        if any(True for _ in module.parameters()) or \
                any(b is not None for b in module.buffers()):
            raise GraphBreak(Reason.UNSUPPORTED_CALL,
                             f"{cls.__name__}() made in the frame with parameters or buffers")
        self.made_modules[id(module)] = module
        return module

    def _context_var(self, args: tuple, kwargs: dict) -> Any:
        """``var.get([default])``: its value now, guarded on ``("cvar", var's source)``."""
        var = args[0] if args else None
        known = self.known.get(id(var))
        if type(var) is not contextvars.ContextVar or kwargs or len(args) > 2:
            raise GraphBreak(Reason.BAD_CALL, "ContextVar.get() with these arguments")
        if known is None or known[0] is not var:
            raise GraphBreak(Reason.UNGUARDABLE_GLOBAL, "a ContextVar reached by no source")
        try:
            value = var.get()
        except LookupError:
            value = MISSING
        out = value if value is not MISSING else args[1] if len(args) == 2 else MISSING
        if out is MISSING:
            raise GraphBreak(Reason.OP_FAILED, f"ContextVar {var.name!r} has no value")
        if value is not MISSING and not self._is_static(value):
            if isinstance(value, self._torch.Tensor) or self.is_owned(value):
                raise GraphBreak(Reason.UNSUPPORTED_VALUE,
                                 f"ContextVar {var.name!r} holds a {type(value).__name__}")
            # an object of the program (a dict collecting outputs): reached through
            # the variable, as an attribute's value is, its reads guarded and its
            # changes written back to the object the variable holds on each call
            self.known.setdefault(id(value), (value, ("cvar", known[1])))
        self.assumptions.append((("cvar", known[1]), value))
        return out

    def _run(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise GraphBreak(Reason.OP_FAILED, f"{getattr(fn, '__qualname__', fn)} raised "
                             f"{type(exc).__name__}: {exc}") from exc

    def _owned_builtin(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """A builtin method bound to an owned object: read methods of its dict store,
        and ``object``'s and the dict's own writers (from ``super()``)."""
        name = fn.__name__
        if name not in _DICT_READERS and name not in _OWNED_WRITERS:
            raise GraphBreak(Reason.UNSUPPORTED_CALL,
                             f"{type(fn.__self__).__name__}.{name}() (a builtin method)")
        out = self._run(fn, args, kwargs)
        if name in ("keys", "values", "items", "__iter__"):
            out = tuple(out)
        return out

    def delattr_fold(self, args: tuple, kwargs: dict) -> None:
        """``delattr(obj, name)`` of an object the capture made, whose class deletes as
        ``object`` does: done now, on the object itself."""
        if len(args) != 2 or kwargs or type(args[1]) is not str:
            raise GraphBreak(Reason.BAD_CALL, "delattr() takes an object and a name")
        obj, name = args
        if not self.is_owned(obj) or \
                _class_lookup(type(obj), "__delattr__") is not object.__dict__["__delattr__"]:
            raise GraphBreak(Reason.SIDE_EFFECT,
                             f"deleting attribute {name!r} of a {type(obj).__name__}")
        found = _class_lookup(type(obj), name)
        if found is not MISSING and hasattr(type(found), "__delete__"):
            raise GraphBreak(Reason.SIDE_EFFECT,
                             f"deleting {name!r} of a {type(obj).__name__}: a "
                             f"{type(found).__name__} of its class")
        self._run(object.__delattr__, (obj, name), {})

    def attr(self, obj: Any, name: str) -> tuple:
        if isinstance(obj, super) and self.is_owned(obj.__self__):
            if name == "__getattribute__" and \
                    _super_builtin(obj, name) is not None and \
                    _class_lookup(obj.__thisclass__, name) is not object.__getattribute__:
                # past the class's own __getattribute__ to object's, as for an object of
                # the program: read by the interpreter (Plan.RAW_GETATTR), not run
                return Attr.METHOD, object.__getattribute__, obj.__self__
            found = _super_builtin(obj, name)
            if found is not None and name == "__setattr__" and \
                    found == object.__setattr__.__get__(obj.__self__):
                # object's store (nn.Module.__init__'s ``super().__setattr__``): called
                # unbound, so the interpreter hands it the containers built here
                # themselves, and the object holds them as the code does
                return Attr.METHOD, object.__setattr__, obj.__self__
            if found is not None:
                return Attr.VALUE, found, None
        if self.is_owned(obj):
            if name == "__class__":
                return Attr.VALUE, type(obj), None   # fixed when it was made
            if name == "__dict__" and type(_class_lookup(type(obj), name)) is \
                    types.GetSetDescriptorType:
                # its store, read as the object is (nn.Module.__setattr__'s
                # ``self.__dict__.get("_parameters")``)
                return Attr.VALUE, self._own(object.__getattribute__(obj, name)), None
            if name in _DICT_READERS and _dict_base(type(obj)):
                found = _class_lookup(type(obj), name)
                if type(found) in (types.MethodDescriptorType, types.WrapperDescriptorType):
                    return Attr.VALUE, getattr(obj, name), None
            self._guard_class_attr(obj, name)
        return super().attr(obj, name)  # type: ignore[misc]

    def _guard_class_attr(self, obj: Any, name: str) -> None:
        """An owned object's attribute that its class answers (a method, a class
        constant) is guarded on the class's source: the object has none, but a later
        call must not run with the class changed."""
        attrs, _ = _state(obj)
        if name in ("__dict__", "__class__") or any(k == name for k, _ in attrs):
            return   # the object's own (its __dict__ is not its class's)
        cls = type(obj)
        known = self.known.get(id(cls))
        if known is None or known[0] is not cls:
            return
        how, value = static_attr(cls, name)
        if how in (Attr.VALUE, Attr.METHOD, Attr.MISSING):
            self.assumptions.append((("attr", known[1], name), value))
            if how is Attr.VALUE and type(value) in (dict, list, tuple):
                # a class's registry read through an instance (a dataclass's validators):
                # reached by that source, so its reads are guarded there
                self.known.setdefault(id(value), (value, ("attr", known[1], name)))

    def store_item(self, container: Any, index: Any, value: Any) -> None:
        """``container[index] = value`` on an object that is not a tensor: a ModelOutput
        the capture made (``outputs["hidden_states"] = ...``) runs its own
        ``__setitem__``, which sets the item and the attribute; other objects break."""
        mo = _model_output_type()
        if mo is None or not isinstance(container, mo) or not self.is_owned(container) or \
                type(index) is not str or \
                _class_lookup(type(container), "__setitem__") is not mo.__setitem__:
            raise GraphBreak(Reason.SIDE_EFFECT,
                             f"item assignment on a {type(container).__name__}")
        self._run(mo.__setitem__, (container, index, value), {})

    def getitem(self, container: Any, index: Any, source: Any) -> tuple[Any, Any]:
        if is_structseq_type(type(container)):
            return super().getitem(tuple(container), index, source)  # type: ignore[misc]
        if self.is_owned(container):
            mo = _model_output_type()
            if mo is not None and isinstance(container, mo):
                return self._run(mo.__getitem__, (container, index), {}), None
            base = _dict_base(type(container))
            if base is not None and _class_lookup(type(container), "__getitem__") is \
                    base.__getitem__:
                return self._run(base.__getitem__, (container, index), {}), None
        mo = _model_output_type()
        if mo is not None and isinstance(container, mo) and source is not None and \
                _class_lookup(type(container), "__getitem__") is mo.__getitem__ and \
                type(index) in (str, int):
            # the program's ModelOutput (a submodule's, called after a break): by name,
            # or by position among the fields it holds, whose names are guarded
            keys = tuple(dict.keys(container))
            self.assumptions.append((("keys", source), keys))
            try:
                key = index if type(index) is str else keys[index]
            except IndexError as exc:
                raise GraphBreak(Reason.OP_FAILED, f"{type(container).__name__}[{index}] "
                                 f"raised IndexError: {exc}") from exc
            plain = dict.fromkeys(keys)
            plain.update((k, dict.__getitem__(container, k)) for k in keys)
            return super().getitem(plain, key, source)  # type: ignore[misc]
        return super().getitem(container, index, source)  # type: ignore[misc]

    def truth(self, obj: Any) -> bool:
        if self.is_owned(obj):
            cls = type(obj)
            if _dict_base(cls) is not None and \
                    _class_lookup(cls, "__len__") is _dict_base(cls).__len__:
                return len(obj) > 0
            if _class_lookup(cls, "__bool__") is MISSING and \
                    _class_lookup(cls, "__len__") is MISSING:
                return True
        return super().truth(obj)  # type: ignore[misc]

    def iterate(self, obj: Any, source: Any) -> tuple:
        if is_structseq_type(type(obj)):
            return tuple((v, None) for v in obj)
        return super().iterate(obj, source)  # type: ignore[misc]

    # -- leaving the graph ---------------------------------------------------------------

    def can_escape(self, value: Any) -> bool:
        """Whether ``escape`` can rebuild ``value`` (checked before the graph ends)."""
        if is_structseq_type(type(value)):
            return True
        return self.is_owned(value)

    def escape_parts(self, value: Any) -> tuple:
        """The values inside an object that leaves the graph (each checked like a
        result)."""
        if is_structseq_type(type(value)):
            return tuple(value)
        attrs, items = _state(value)
        return tuple(v for _, v in attrs) + tuple(v for _, v in items)

    def escape(self, value: Any, inner: Any) -> Any:
        """The graph argument that rebuilds ``value`` after the graph runs, ``inner``
        making the arguments of the values inside it: a call of the structseq class, or
        of ``rebuild_object`` with the object's class and state."""
        graph = self.graph
        if is_structseq_type(type(value)):
            return graph.call_function(type(value), (tuple(inner(v) for v in value),))
        done = self._escaped.get(id(value))
        if done is not None:
            return done   # one object reached twice is rebuilt once
        attrs, items = _state(value)
        node = self._escaped[id(value)] = graph.call_function(_rebuilder(type(value)), (
            tuple((k, inner(v)) for k, v in attrs),
            tuple((k, inner(v)) for k, v in items)))
        return node


def _init_source(cls: type, source: Any) -> Any:
    """The source of ``cls.__init__`` through the class that defines it (its closure
    cells are guarded on it), or None."""
    if source is None:
        return None
    for k, klass in enumerate(cls.__mro__):
        if "__init__" in klass.__dict__:
            owner = source if k == 0 else ("item", ("attr", source, "__mro__"), k)
            return ("attr", owner, "__init__")
    return None


def _super_builtin(sup: super, name: str) -> Any:
    """``super().name`` when it is a builtin method of ``object`` or a dict store (so
    bound to an owned object it can be folded); None otherwise."""
    start, self = sup.__thisclass__, sup.__self__
    after = False
    for klass in type(self).__mro__:
        if after and name in klass.__dict__:
            if klass in (object, dict, OrderedDict):
                return getattr(sup, name)
            return None
        after = after or klass is start
    return None
