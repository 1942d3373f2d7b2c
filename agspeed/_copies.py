"""``copy.deepcopy`` and ``copy.copy`` of plain data, folded.

Library code copies configuration objects inside a forward: transformers' encoder-decoder
configs deep-copy themselves when a cache is made (``get_text_config`` then ``to_dict``),
and a training script may copy a small options object.  Following ``copy.deepcopy``'s
Python code would need ``id()`` of the capture's values and ``object.__reduce_ex__``, so
the capture evaluates such a copy itself instead, when what is copied is *plain data*:

* ``None``, bools, numbers, strings, bytes, torch's dtypes, devices, layouts and memory
  formats, classes and functions (which ``deepcopy`` keeps as they are);
* tuples, lists and exact dicts of plain data;
* instances of plain classes holding plain data in their ``__dict__``: a class whose
  metaclass is ``type`` (or ``abc.ABCMeta``), made by ``object.__new__``, without
  ``__slots__`` and with none of the hooks that change how an object is copied or
  pickled (``__deepcopy__``, ``__copy__``, ``__reduce__``, ``__reduce_ex__``,
  ``__getstate__``, ``__setstate__``, ``__getnewargs__``, ``__getnewargs_ex__``).

The copy is made the way ``deepcopy`` makes it for such data (a new instance by
``object.__new__``, its ``__dict__`` filled with copies, shared references kept shared)
without running any of the program's code; a class's own ``__getattribute__`` or
``__setattr__`` is not consulted, as ``deepcopy`` consults it only for the hooks above.
The instances the copy makes are owned by the capture (``Objects``): the program can set
their attributes and return them.  What was copied is guarded whole: an object of the
program reached by a source gets the check ``("state", source)`` equal to its snapshot
(``plain_state``: every value inside, by type and equality), so a change anywhere in it
is a miss.  Anything else (a tensor, a module, a cycle, a class with its own copy hooks)
is a graph break, as before.  ``copy.copy`` is folded only where the copy shares nothing
mutable with the original: each attribute or item immutable plain data.
"""

from __future__ import annotations

import abc
import copy
import sys
import types
from typing import Any

from agspeed._builder_types import GraphBreak
from agspeed._sources import MISSING, _class_lookup
from agspeed.protocol import Reason

__all__ = ["Copies", "plain_state"]

_ATOMIC = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis),
           types.FunctionType, types.BuiltinFunctionType, type, abc.ABCMeta)
_HOOKS = ("__deepcopy__", "__copy__", "__reduce__", "__reduce_ex__", "__getstate__",
          "__setstate__", "__getnewargs__", "__getnewargs_ex__")
_MAX_DEPTH = 32


def _torch_atoms() -> tuple:
    torch = sys.modules.get("torch")   # (a guard may read a state without torch loaded)
    if torch is None:
        return ()
    return (torch.dtype, torch.device, torch.layout, torch.memory_format)


def plain_class(cls: type) -> bool:
    """Whether instances of ``cls`` are copied by ``deepcopy`` as a new object with a
    copied ``__dict__``, nothing of the class's own running."""
    if type(cls) not in (type, abc.ABCMeta) or cls.__module__ == "builtins":
        return False
    if _class_lookup(cls, "__new__") is not object.__dict__["__new__"]:
        return False
    for klass in cls.__mro__[:-1]:
        if "__slots__" in klass.__dict__ or any(h in klass.__dict__ for h in _HOOKS):
            return False
    return True


def plain_state(value: Any) -> Any:
    """A snapshot of ``value`` made of plain values alone, equal for two values exactly
    when a deep copy of either is the same data, or MISSING when ``value`` is not plain
    data (see the module doc).  Classes and functions appear as their module, name and
    id; instances as their class's snapshot and their ``__dict__``'s."""
    try:
        return _state(value, _torch_atoms(), set(), 0)
    except _NotPlain:
        return MISSING


class _NotPlain(Exception):
    pass


def _named(obj: Any) -> tuple:
    return ("class", getattr(obj, "__module__", None), getattr(obj, "__qualname__", None),
            id(obj))


def _state(value: Any, atoms: tuple, active: set, depth: int) -> Any:
    kind = type(value)
    if kind in (type(None), bool, int, float, complex, str, bytes, type(Ellipsis)):
        return value
    if kind in atoms:
        return value
    if kind in (types.FunctionType, types.BuiltinFunctionType, type, abc.ABCMeta):
        return _named(value)
    if depth > _MAX_DEPTH or id(value) in active:
        raise _NotPlain   # deep or cyclic
    active.add(id(value))
    try:
        if kind in (tuple, list):
            return (kind.__name__, tuple(_state(v, atoms, active, depth + 1) for v in value))
        if kind is dict:
            return ("dict", tuple((_state(k, atoms, active, depth + 1),
                                   _state(v, atoms, active, depth + 1))
                                  for k, v in value.items()))
        if plain_class(kind):
            attrs = object.__getattribute__(value, "__dict__")
            return ("object", _named(kind), _state(attrs, atoms, active, depth + 1))
        raise _NotPlain
    finally:
        active.discard(id(value))


def _deep(value: Any, atoms: tuple, memo: dict, made: list, containers: list) -> Any:
    """A deep copy of plain data (``plain_state`` said it is), as ``deepcopy`` makes it;
    each instance made is appended to ``made``, each list and dict to ``containers``."""
    kind = type(value)
    if kind in _ATOMIC or kind in atoms:
        return value
    done = memo.get(id(value))
    if done is not None:
        return done
    out: Any
    if kind is list:
        out = memo[id(value)] = []
        containers.append(out)
        out.extend(_deep(v, atoms, memo, made, containers) for v in value)
        return out
    if kind is tuple:
        items = tuple(_deep(v, atoms, memo, made, containers) for v in value)
        out = value if all(a is b for a, b in zip(items, value)) else items
        memo[id(value)] = out
        return out
    if kind is dict:
        out = memo[id(value)] = {}
        containers.append(out)
        for k, v in value.items():
            out[_deep(k, atoms, memo, made, containers)] = \
                _deep(v, atoms, memo, made, containers)
        return out
    out = memo[id(value)] = object.__new__(kind)
    made.append(out)
    into = object.__getattribute__(out, "__dict__")
    containers.append(into)   # its __dict__ is the capture's too (read by __getattribute__s)
    for k, v in object.__getattribute__(value, "__dict__").items():
        into[k] = _deep(v, atoms, memo, made, containers)   # keys: strings
    return out


def _immutable(value: Any, atoms: tuple) -> bool:
    kind = type(value)
    if kind in _ATOMIC or kind in atoms:
        return True
    return kind is tuple and all(_immutable(v, atoms) for v in value)


class Copies:
    """The part of ``GraphBuilder`` that folds ``copy.deepcopy`` and ``copy.copy``."""

    fresh_containers: list

    def _copies_init(self) -> None:
        # the lists and dicts inside a copy just made, which the interpreter owns once
        # the fold answers (it empties this list); kept alive for the whole capture, so
        # that no object of the program can take the id of one
        self.fresh_containers = []
        self._copied: list = []

    def copy_plan(self, fn: Any) -> bool:
        """Whether a call of ``fn`` is a copy folded here."""
        return fn is copy.deepcopy or fn is copy.copy

    def copy_fold(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """``fn(*args, **kwargs)`` for ``copy.deepcopy``/``copy.copy`` of plain data."""
        memo = kwargs.get("memo", args[1] if len(args) > 1 else None)
        if len(args) < 1 or len(args) > (2 if fn is copy.deepcopy else 1) or \
                set(kwargs) - {"memo"} or (kwargs and fn is copy.copy) or memo is not None:
            raise GraphBreak(Reason.UNSUPPORTED_CALL,
                             f"copy.{fn.__name__}() with these arguments")
        value = args[0]
        snapshot = plain_state(value)
        if snapshot is MISSING:
            raise GraphBreak(Reason.UNSUPPORTED_CALL,
                             f"copy.{fn.__name__} of a {type(value).__name__} holding "
                             f"more than plain data")
        self._guard_state(value, snapshot)
        atoms = _torch_atoms()
        made: list = []
        containers: list = []
        if fn is copy.deepcopy:
            out = _deep(value, atoms, {}, made, containers)
        else:
            out = self._shallow(value, atoms, made)
        for obj in made:
            self._own(obj)  # type: ignore[attr-defined]
        self.keep_fresh([c for c in containers if c is not out])  # the answer: by C
        return out

    def keep_fresh(self, containers: list) -> None:
        """Lists and dicts inside a fold's answer, which the interpreter owns once the
        fold answers; held until the capture ends."""
        self.fresh_containers.extend(containers)
        self._copied.extend(containers)

    def _shallow(self, value: Any, atoms: tuple, made: list) -> Any:
        kind = type(value)
        if kind in _ATOMIC or kind in atoms or kind is tuple:
            return value
        parts = value.values() if kind is dict else value if kind is list else \
            object.__getattribute__(value, "__dict__").values()
        if not all(_immutable(v, atoms) for v in parts):
            raise GraphBreak(Reason.UNSUPPORTED_CALL,
                             f"copy.copy of a {kind.__name__} holding mutable values "
                             f"(the copy would share them)")
        if kind in (list, dict):
            return kind(value)
        out = object.__new__(kind)
        object.__getattribute__(out, "__dict__").update(
            object.__getattribute__(value, "__dict__"))
        made.append(out)
        return out

    def _guard_state(self, value: Any, snapshot: Any) -> None:
        """What a copy of ``value`` reads is guarded: the whole of a value of the program
        (one the capture reached by a source) through ``("state", source)``; a value the
        capture made holds what the capture put there, the values of the program among
        them guarded the same way."""
        known = self.known.get(id(value))  # type: ignore[attr-defined]
        if known is not None and known[0] is value:
            self.assumptions.append((("state", known[1]), snapshot))  # type: ignore
            # the class of the copy (its identity is in the snapshot) is reached through
            # the original's type: its own __setattr__ and methods are guarded there
            self.known.setdefault(id(type(value)),  # type: ignore[attr-defined]
                                  (type(value), ("type", known[1])))
            return
        kind = type(value)
        if kind in (tuple, list):
            inner = list(value)
        elif kind is dict:
            inner = [*value.keys(), *value.values()]
        elif self.is_owned(value):  # type: ignore[attr-defined]
            inner = list(object.__getattribute__(value, "__dict__").values())
        else:
            raise GraphBreak(Reason.UNSUPPORTED_CALL,
                             f"copy of a {kind.__name__} the capture cannot guard")
        atoms = _torch_atoms()
        for v in inner:
            if not (type(v) in _ATOMIC or type(v) in atoms):
                self._guard_state(v, plain_state(v))
