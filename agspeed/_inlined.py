"""Python equivalents of builtin callables the capture cannot step, inlined in their
place by the interpreter: ``operator.itemgetter``/``attrgetter``/``methodcaller``
objects (their parts read from ``__reduce__``), and the itertools constructors that take
a function or a truth per item, as generators of the same items (each call of the
program's function inlined, each truth a branch).  Planned by ``agspeed._stdlib``.
"""

from __future__ import annotations

import functools
import itertools
import operator
from typing import Any

from agspeed.protocol import Plan

__all__ = ["STEPPED_ITERTOOLS", "getter_plan"]


def _get_items(items: tuple, obj: Any) -> Any:
    """What ``operator.itemgetter(*items)(obj)`` answers, inlined in its place (so that
    items of a tensor are graph operations)."""
    if len(items) == 1:
        return obj[items[0]]
    out = []
    for item in items:
        out.append(obj[item])
    return tuple(out)


def _get_attrs(names: tuple, obj: Any) -> Any:
    """What ``operator.attrgetter(*names)(obj)`` answers (dotted names followed),
    inlined in its place."""
    out = []
    for name in names:
        value = obj
        for part in name.split("."):
            value = getattr(value, part)
        out.append(value)
    return out[0] if len(names) == 1 else tuple(out)


def _call_method(name: str, args: tuple, kwargs: dict, obj: Any) -> Any:
    """What ``operator.methodcaller(name, *args, **kwargs)(obj)`` answers, inlined."""
    return getattr(obj, name)(*args, **kwargs)


def _compress(data: Any, selectors: Any) -> Any:
    """``itertools.compress``, stepped by the capture as a generator (a selector that is
    a tensor's truth breaks there, as any branch on data does)."""
    for item, keep in zip(data, selectors):
        if keep:
            yield item


def _filterfalse(predicate: Any, iterable: Any) -> Any:
    """``itertools.filterfalse``: the predicate (the program's function) inlined."""
    for item in iterable:
        if not (item if predicate is None else predicate(item)):
            yield item


def _takewhile(predicate: Any, iterable: Any) -> Any:
    """``itertools.takewhile``, the predicate inlined."""
    for item in iterable:
        if not predicate(item):
            return
        yield item


def _dropwhile(predicate: Any, iterable: Any) -> Any:
    """``itertools.dropwhile``, the predicate inlined."""
    dropping = True
    for item in iterable:
        if dropping and predicate(item):
            continue
        dropping = False
        yield item


#: itertools constructors that take a function or a truth per item: generators of the
#: same items, which the interpreter steps (each call of the function inlined)
STEPPED_ITERTOOLS = ((itertools.compress, _compress), (itertools.filterfalse, _filterfalse),
                     (itertools.takewhile, _takewhile), (itertools.dropwhile, _dropwhile))


def getter_plan(fn: Any) -> tuple | None:
    """The PARTIAL plan calling an itemgetter, attrgetter or methodcaller object through
    its inlined equivalent, its parts read from its ``__reduce__``; None for another
    object, or one of a subclass."""
    kind = type(fn)
    if kind not in (operator.itemgetter, operator.attrgetter, operator.methodcaller):
        return None
    maker, parts = fn.__reduce__()[:2]
    if kind is operator.itemgetter:
        return (Plan.PARTIAL, _get_items, (tuple(parts),), {}, None)
    if kind is operator.attrgetter:
        return (Plan.PARTIAL, _get_attrs, (tuple(parts),), {}, None)
    if type(maker) is functools.partial:   # methodcaller with keywords
        return (Plan.PARTIAL, _call_method, (maker.args[0], tuple(parts),
                                             dict(maker.keywords)), {}, None)
    return (Plan.PARTIAL, _call_method, (parts[0], tuple(parts[1:]), {}), {}, None)
