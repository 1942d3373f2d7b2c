"""The replay of a capture's side effects after its graph (see agspeed/_effects.py, which
records them): the plan's effect kinds, the templates of the values they write (graph
outputs, graph inputs as dict keys and the program's own containers, filled in on each
call), and ``replay``, the callable a cache entry runs.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, NamedTuple

from agspeed._objects import _dict_base, rebuild_object

__all__ = ["replay"]

# _RAW_SET: object.__setattr__'s write; _TAIL: what a list of the program was extended by
_SET, _CALL, _CONTENTS, _RAW_SET, _TAIL, _RESULT = 0, 1, 2, 3, 4, 5
_DICTS = (dict, collections.OrderedDict, collections.defaultdict)


class _Slot(NamedTuple):
    """In an effect's template: the graph output that goes here."""

    index: int


class _Owner(NamedTuple):
    """In an effect's template: a list, dict or set of the program, read from its source
    when the entry is called (owner ``index``), so that a write puts that very object
    back, not the one the capture saw."""

    index: int


class _Made(NamedTuple):
    """In an effect's template: an object the frame made (an instance of a class), made
    again on each call from the templates of its attributes and items, as eager makes a
    new one on each call.  One object stored in two places is one template, made once
    per call."""

    cls: type
    attrs: tuple   # ((name, template), ...)
    items: tuple   # ((key, template), ...): a dict subclass's own items


class _Input(NamedTuple):
    """In an effect's template, as a dict key: the graph input that goes here (the
    program's own tensor, the same object)."""

    index: int


def _same_dict(like: Any, items: dict) -> Any:
    """A dict of ``like``'s type (and default factory) holding ``items``."""
    return type(like)(items) if type(like) is not collections.defaultdict else \
        collections.defaultdict(like.default_factory, items)


def _has_slot(template: Any) -> bool:
    """Whether ``template`` is filled in on each call (graph outputs, inputs as keys,
    the program's objects)."""
    if type(template) in (_Slot, _Owner, _Made):
        return True
    if type(template) in (tuple, list):
        return any(_has_slot(v) for v in template)
    if type(template) in _DICTS:
        return any(type(k) is _Input for k in template) or \
            any(_has_slot(v) for v in template.values())
    return False


def _fill(template: Any, outputs: tuple, inputs: tuple = (), owners: tuple = (),
          made: dict | None = None) -> Any:
    """``template`` filled in for this call; ``made``: the objects made so far in it
    (by template), so that one made object stored in two places is one object."""
    if type(template) is _Slot:
        return outputs[template.index]
    if type(template) is _Owner:
        return owners[template.index]
    made = {} if made is None else made
    if type(template) is _Made:
        obj = made.get(id(template))
        if obj is None:
            obj = made[id(template)] = rebuild_object(template.cls, (), ())
            for name, value in template.attrs:
                object.__setattr__(obj, name, _fill(value, outputs, inputs, owners, made))
            base = _dict_base(template.cls)
            for key, value in template.items:
                base.__setitem__(obj, key, _fill(value, outputs, inputs, owners, made))
        return obj
    if type(template) in (tuple, list):
        return type(template)(_fill(v, outputs, inputs, owners, made) for v in template)
    if type(template) in _DICTS:
        return _same_dict(template, {inputs[k.index] if type(k) is _Input else k:
                                     _fill(v, outputs, inputs, owners, made)
                                     for k, v in template.items()})
    return template


def _write_back(container: Any, contents: Any) -> None:
    if type(container) is list:
        container[:] = contents
    else:
        container.clear()
        container.update(contents)


class _Attr(NamedTuple):
    """A step of a path in a result: an attribute of an object the frame made."""

    name: str


class _Item(NamedTuple):
    """A step of a path in a result: an item of a dict subclass the frame made."""

    key: Any


def _put(result: Any, path: tuple, obj: Any) -> Any:
    """``result`` with ``obj`` at ``path`` (indices and keys through the tuples, lists
    and dicts the graph returned, attributes and items of the objects it rebuilt: all
    its own)."""
    if not path:
        return obj
    head, rest = path[0], path[1:]
    if type(head) is _Attr:
        object.__setattr__(result, head.name,
                           _put(object.__getattribute__(result, head.name), rest, obj))
        return result
    if type(head) is _Item:
        base = _dict_base(type(result))
        base.__setitem__(result, head.key, _put(base.__getitem__(result, head.key), rest, obj))
        return result
    if type(result) is tuple:
        return result[:head] + (_put(result[head], rest, obj),) + result[head + 1:]
    result[head] = _put(result[head], rest, obj)
    return result


def replay(plan: tuple, n_inputs: int, compiled: Callable) -> Callable:
    """A callable over the graph's inputs then the owners: runs ``compiled`` (whose
    output is ``(result, tensors)``), replays ``plan`` in order and returns the result."""
    def run(*inputs: Any) -> Any:
        result, outputs = compiled(*inputs[:n_inputs])
        owners = inputs[n_inputs:]
        made: dict = {}   # the objects made in this call, by template

        def fill(template: Any) -> Any:
            return _fill(template, outputs, inputs, owners, made)

        for kind, target, a, b, slots in plan:
            if kind == _SET:
                setattr(owners[target], a, fill(b) if slots else b)
            elif kind == _RAW_SET:
                object.__setattr__(owners[target], a, fill(b) if slots else b)
            elif kind == _CONTENTS:
                _write_back(owners[target], fill(b) if slots else b)
            elif kind == _TAIL:
                owners[target].extend(fill(b) if slots else b)
            elif kind == _RESULT:
                result = _put(result, a, owners[target])
            elif slots:
                target(*fill(a), **fill(b))
            else:
                target(*a, **b)
        return result

    return run
