"""Which objects of the program a capture needs by identity, and which by type alone.

An object of the program that the capture uses (an argument, an item of one, an
attribute) is guarded on its source.  The default check is identity: it is always
sound, and for modules, functions and classes it is what the program means.  For an
instance of a plain user class (a dataclass batch, a small config or state object,
made afresh by the program for each call) identity is too strict: every call brings a
new object, misses the cache and is captured again, each capture costing more than the
step it serves.

Most uses of such an object depend only on its class and its attributes, and both are
guarded already: an attribute read is an assumption on its own source (its tensor read
as an input, its plain value compared), a method is looked up on the class, and a
special method is the class's.  Such an object is guarded by its exact type instead
(the source ``("type", src)``), so the entry serves every object of that class whose
attributes pass their own checks.

Identity is kept wherever the capture's result could depend on which object it was:

* ``a is b`` or ``==`` between two objects (not with None or another singleton),
  membership, a dict or set keyed by it, ``id()``, ``hash()``, any fold of a function
  on it other than the few that read only its class (``isinstance``, ``type``,
  ``callable``, ``dataclasses.fields``...);
* held by the graph (an argument of a node), by its output, by an object the capture
  made, by a replayed effect (a value written to the program or passed to a logging
  call), by a container method's arguments, by an f-string (a default ``repr`` shows
  the address), or as a constant of a resume function's state;
* but not where the result holds it in a place the entry fills from its source after
  the graph (``return x, cache``, a ModelOutput made in the frame around the cache
  passed in: ``agspeed._effects``), nor where a write to the program stores it (``self.
  last = batch``: the replay reads it from its source on each call), nor for making a
  ModelOutput around it, which is noted where that object goes;
* reached through two sources (``f(b, b)``, or a batch also kept on ``self``): the
  capture saw one object, and writes through one name were read through the other.

Only instances of heap classes whose metaclass is ``type`` (or ``abc.ABCMeta``) are
candidates: not modules (the module machinery guards their structure), enums (whose
members are compared by identity), exceptions, containers (checked by length), or
classes with metaclasses of their own.  So are instances of the builtin classes that
show nothing but their class and attributes (``_C.opaque_type``: no number, sequence or
mapping protocol, no iteration, call, comparison or hash of their own, attributes read
the generic way), a ``contextvars.Token`` among them: a program that makes one per call
and hands it on through the frame (a resume function's stack, an argument passed to
code that runs eager) would otherwise be captured again on every call.  torch's and
NumPy's own classes (``torch.dtype``, ``torch.layout``) are not: their instances are
singletons that mean what they are.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import functools
import types
from typing import Any

from agspeed import _C
from agspeed._objects import _model_output_type
from agspeed.protocol import Compare

__all__ = ["Identities", "plain_instance"]

_HEAPTYPE = 1 << 9          # Py_TPFLAGS_HEAPTYPE
_METACLASSES = (type, abc.ABCMeta)
_SINGLETONS = (None, True, False, Ellipsis, NotImplemented)
# functions whose answer depends on an object's class alone
# (and len(), whose answer for a container is its length, whatever its items are)
_TYPE_ONLY = (isinstance, type, callable, dataclasses.fields, dataclasses.is_dataclass, len)
_EXCLUDED = (BaseException, types.ModuleType, tuple, list, dict, set, frozenset,
             collections.deque)


def _makes_model_output(fn: Any) -> bool:
    """Whether ``fn`` is a transformers ModelOutput class (made as an object of the
    capture's own, its fields noted where it goes)."""
    base = _model_output_type()
    return base is not None and isinstance(fn, type) and issubclass(fn, base)


def plain_instance(value: Any, module_type: Any = None) -> bool:
    """Whether ``value`` is an instance of a plain user class (see the module's
    docstring); ``module_type``: torch.nn.Module, excluded with its subclasses."""
    cls = type(value)
    if not cls.__flags__ & _HEAPTYPE:
        return _opaque(cls)
    if type(cls) not in _METACLASSES:
        return False
    if issubclass(cls, _EXCLUDED):
        return False
    return module_type is None or not issubclass(cls, module_type)


@functools.lru_cache(maxsize=256)
def _opaque(cls: type) -> bool:
    """Whether ``cls`` is a builtin class whose instances show only their class and
    attributes, and not torch's or NumPy's own."""
    module = getattr(cls, "__module__", "") or ""
    if module.split(".")[0] in ("torch", "numpy"):
        return False
    return _C.opaque_type(cls)


def _is_singleton(value: Any) -> bool:
    return any(value is s for s in _SINGLETONS)


class Identities:
    """The builder's part that notes which objects' identity the capture relied on
    (a mixin of ``agspeed._graph.GraphBuilder``, first among its bases so that the
    operations below see their arguments before the part that answers them)."""

    def _identity_init(self) -> None:
        self.identity_used: set[int] = set()

    def note_identity(self, *values: Any, skip: Any = ()) -> None:
        """Note every plain instance in ``values``, looking inside containers, partials,
        bound methods and the objects the capture made (not those whose ids are in
        ``skip``)."""
        module_type = self._torch.nn.Module  # type: ignore[attr-defined]
        node_type = self.node_type  # type: ignore[attr-defined]
        seen: set[int] = set(skip)
        todo = list(values)
        while todo:
            value = todo.pop()
            if id(value) in seen or isinstance(value, node_type) or _is_singleton(value):
                continue
            seen.add(id(value))
            kind = type(value)
            if kind in (tuple, list, set, frozenset, collections.deque) or \
                    isinstance(value, tuple):
                todo.extend(value)
            elif isinstance(value, dict):
                todo.extend(value.keys())
                todo.extend(value.values())
            elif kind is functools.partial:
                todo.extend((value.func, *value.args, *value.keywords.values()))
            elif kind is types.MethodType:
                todo.append(value.__self__)
            elif kind is types.BuiltinMethodType and \
                    not isinstance(value.__self__, (type, types.ModuleType)):
                todo.append(value.__self__)   # a builtin type's method, bound
            elif kind is slice:
                todo.extend((value.start, value.stop, value.step))
            elif self.is_owned(value):  # type: ignore[attr-defined]
                todo.extend(getattr(value, "__dict__", {}).values())
            elif plain_instance(value, module_type):
                self.identity_used.add(id(value))

    def by_type(self) -> set:
        """The sources whose objects are guarded by their type instead of identity:
        plain instances reached by one source only, whose identity nothing relied on."""
        module_type = self._torch.nn.Module  # type: ignore[attr-defined]
        reached: dict[int, set] = {}
        for source, value in self.assumptions:  # type: ignore[attr-defined]
            if plain_instance(value, module_type):
                reached.setdefault(id(value), set()).add(source)
        return {next(iter(sources)) for key, sources in reached.items()
                if len(sources) == 1 and key not in self.identity_used}

    # -- the operations in which identity can matter ---------------------------------

    def identity(self, a: Any, b: Any) -> None:
        self.note_identity(a, b)

    def compare(self, op: Any, a: Any, b: Any) -> Any:
        if not (Compare(op) in (Compare.EQ, Compare.NE) and
                (_is_singleton(a) or _is_singleton(b))):
            self.note_identity(a, b)
        return super().compare(op, a, b)  # type: ignore[misc]

    def fold(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        if not any(fn is f for f in _TYPE_ONLY) and not _makes_model_output(fn):
            self.note_identity(fn, args, kwargs)
        return super().fold(fn, args, kwargs)  # type: ignore[misc]

    def getitem(self, container: Any, index: Any, source: Any) -> tuple[Any, Any]:
        self.note_identity(index)
        return super().getitem(container, index, source)  # type: ignore[misc]

    def format(self, value: Any, conversion: int, spec: Any) -> str:
        self.note_identity(value)
        return super().format(value, conversion, spec)  # type: ignore[misc]

    def container_method(self, spec: tuple, args: tuple, kwargs: dict) -> Any:
        self.note_identity(args, kwargs)
        return super().container_method(spec, args, kwargs)  # type: ignore[misc]

    def store_attr(self, obj: Any, name: str, value: Any) -> Any:
        self.note_identity(value)
        return super().store_attr(obj, name, value)  # type: ignore[misc]

    def effect_setattr(self, obj: Any, source: Any, name: str, value: Any,
                       raw: bool = False) -> Any:
        # (an instance reached by a source is stored by reading it there on each call)
        self.note_identity(value, skip=self.sourced_ids(value))  # type: ignore[attr-defined]
        return super().effect_setattr(obj, source, name, value, raw)  # type: ignore[misc]

    def replay_call(self, fn: Any, args: tuple, kwargs: dict) -> None:
        self.note_identity(args, kwargs)
        return super().replay_call(fn, args, kwargs)  # type: ignore[misc]

    def ctx(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        self.note_identity(args, kwargs)
        return super().ctx(fn, args, kwargs)  # type: ignore[misc]

    def enter_with(self, cm: Any, source: Any) -> tuple[Any, Any]:
        self.note_identity(cm)
        return super().enter_with(cm, source)  # type: ignore[misc]

    def iterate(self, obj: Any, source: Any) -> tuple:
        if source is None or type(obj) not in (list, tuple):
            self.note_identity(obj)   # (a list's items are each read through its source)
        return super().iterate(obj, source)  # type: ignore[misc]
