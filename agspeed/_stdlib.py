"""Folds of the standard library: iterators, sums, itertools, functools, operator, the pure
methods of ``str`` and the methods of containers the capture built.

Everything here runs CPython's own C code on graph arguments (fx nodes for tensors, the
objects themselves otherwise) and never user code: an iterator the capture made is a real
iterator over real containers of graph arguments, so stepping it (``next``, ``for``) is
exact, and the interpreter owns the fresh lists, dicts, sets and iterators these folds
answer (csrc/interp_call.c), so the program can keep mutating or stepping them.
Iterators of the program itself are never stepped (a side effect).  Calls that would run
a function per element (``map``, ``filter``, ``functools.reduce``, a ``functools.partial``)
are planned here and run by the interpreter (csrc/interp_iter.c), which inlines the
function.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import itertools
import operator
import os
import types
from typing import Any

from agspeed._builder_types import GraphBreak, describe_callable, holds_node
from agspeed._inlined import STEPPED_ITERTOOLS, getter_plan
from agspeed._sources import MISSING, _class_lookup, compared_by_identity
from agspeed.protocol import Attr, Plan, Reason

_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))
#: iterators whose ``__next__`` is C code that calls nothing of the program's
SAFE_ITERATORS = frozenset({
    type(iter(())), type(iter([])), type(reversed([])), type(iter(range(0))),
    type(iter({})), type(iter({}.values())), type(iter({}.items())), type(iter(set())),
    type(iter("")), type(iter(range(1 << 70))), zip, enumerate, reversed,
    itertools.product, itertools.chain, itertools.combinations, itertools.permutations,
    itertools.combinations_with_replacement, itertools.zip_longest, itertools.islice,
    itertools.repeat, itertools.pairwise, itertools.accumulate,
})
#: itertools constructors folded on graph arguments (their answers are safe iterators)
_ITERTOOLS = (itertools.product, itertools.chain, itertools.combinations,
              itertools.permutations, itertools.combinations_with_replacement,
              itertools.zip_longest, itertools.islice, itertools.repeat, itertools.pairwise,
              itertools.accumulate)
_PURE_METHODS = {
    str: frozenset({"join", "split", "rsplit", "splitlines", "format", "startswith",
                    "endswith", "replace", "lower", "upper", "strip", "lstrip", "rstrip",
                    "find", "rfind", "index", "rindex", "count", "partition", "rpartition",
                    "isdigit", "isalpha", "isalnum", "isidentifier", "isupper", "islower",
                    "isspace", "isdecimal", "isnumeric", "isascii", "isprintable",
                    "istitle", "title", "capitalize", "casefold", "zfill", "center",
                    "ljust", "rjust", "removeprefix", "removesuffix", "swapcase", "encode",
                    "expandtabs", "translate"}),
    bytes: frozenset({"decode", "startswith", "endswith", "split", "join", "replace"}),
    int: frozenset({"bit_length", "to_bytes", "conjugate", "bit_count", "as_integer_ratio"}),
    float: frozenset({"is_integer", "hex", "as_integer_ratio", "conjugate"}),
    tuple: frozenset({"index", "count", "__contains__"}),
    frozenset: frozenset({"__contains__", "issubset", "issuperset", "isdisjoint", "union",
                          "intersection", "difference", "symmetric_difference", "copy"}),
    # (the set-making ones, called unbound: ``set.difference(a, b)``)
    set: frozenset({"issubset", "issuperset", "isdisjoint", "union", "intersection",
                    "difference", "symmetric_difference"}),
}
#: the types of values a method bound to them folds as its arguments allow
_IMMUTABLE_SELVES = (str, bytes, int, float, tuple, frozenset)
#: torch.Size's own methods that only read its sizes
_SIZE_METHODS = frozenset({"numel", "count", "index"})
#: a list's methods that only read it, folded where it holds plain values (guarded whole)
_LIST_READS = frozenset({"index", "count"})
_DICT_METHODS = ("get", "items", "keys", "values", "pop", "setdefault", "update", "copy",
                 "popitem", "clear", "__ior__")
#: a set's in-place operators (``seen |= {k}``): their operand's elements join it
_SET_INPLACE = ("__ior__", "__iand__", "__isub__", "__ixor__")
_CONTAINER_METHODS = {
    collections.OrderedDict: (*_DICT_METHODS, "move_to_end"),
    collections.defaultdict: _DICT_METHODS,
    list: ("append", "extend", "insert", "pop", "index", "count", "copy", "remove",
           "reverse", "sort", "clear", "__iadd__", "__imul__"),
    dict: _DICT_METHODS,
    set: ("add", "update", "discard", "remove", "copy", "clear", "union", "intersection",
          "difference", "symmetric_difference", "issubset", "issuperset", "isdisjoint",
          "intersection_update", "difference_update", "symmetric_difference_update",
          *_SET_INPLACE),
    tuple: ("index", "count"),
}
_SET_OPERATORS = (operator.or_, operator.and_, operator.sub, operator.xor)
_DESCRIPTORS = (types.MethodDescriptorType, types.ClassMethodDescriptorType)
# the code of every function @contextlib.contextmanager makes (its closure: the generator
# function it wraps)
_CONTEXTMANAGER_CODE = contextlib.contextmanager(lambda: iter(())).__code__
# dict's own readers, called on a dict of the program (or a subclass's store)
_DICT_READS = frozenset(dict.__dict__[n] for n in ("get", "__getitem__", "__contains__"))
_DICT_VIEWS = frozenset(dict.__dict__[n] for n in ("items", "keys", "values"))
# dicts of the program whose reads and views are dict's own (an OrderedDict's in its order:
# module hook dicts)
_PLAIN_DICTS = (dict, collections.OrderedDict)
_DEQUE_METHODS = frozenset({"append", "appendleft", "pop", "popleft", "extend",
                            "extendleft", "rotate", "clear", "copy", "count", "index",
                            "reverse", "insert", "remove"})
#: container methods that change the container: on one of the program's, a side effect
_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "reverse", "sort",
                       "clear", "setdefault", "update", "popitem", "add", "discard",
                       "intersection_update", "difference_update",
                       "symmetric_difference_update", "appendleft", "popleft",
                       "extendleft", "rotate", "move_to_end"})
_MUTABLE = (list, dict, set, collections.OrderedDict, collections.defaultdict,
            collections.deque)
#: default factories a defaultdict may call while capturing (C, no user code)
_FACTORIES = (list, dict, set, int, float, str, tuple, None)


def _runs_as_missing(factory: Any) -> bool:
    """Whether a defaultdict's missing keys can be captured with ``factory``: a builtin
    type the builder calls, or a Python function the interpreter inlines where a
    subscript misses (interp_subscr.c), as ``__missing__`` calls it."""
    return factory in _FACTORIES or type(factory) is types.FunctionType


#: methods that compare or hash their arguments: plain values only (a tensor compares
#: by value in eager, which would need its data)
_COMPARING = frozenset({"index", "count", "remove", "sort"})
#: classmethods of builtin containers folded on known values
_CLASS_FOLDS = frozenset({(dict, "fromkeys"), (collections.OrderedDict, "fromkeys"),
                          (collections.defaultdict, "fromkeys"),
                          (itertools.chain, "from_iterable")})


_COLLECTIONS = (collections.OrderedDict, collections.defaultdict, collections.deque)


def _identity_key(key: Any) -> bool:
    """Whether ``key`` hashes and compares by identity, running nothing of the program's
    (a class, ``typing.Union``): a registry keyed by types is read item by item."""
    kind = type(key)
    return _class_lookup(kind, "__eq__") is object.__dict__["__eq__"] and \
        _class_lookup(kind, "__hash__") is object.__dict__["__hash__"]


def _one_of(fn: Any, options: tuple) -> bool:
    return any(fn is option for option in options)


def _marked_constant(fn: Any) -> bool:
    """Whether ``fn`` (or the function an ``lru_cache`` wraps) carries the mark of
    ``torch._dynamo.assume_constant_result``: its result is fixed for the process."""
    if type(fn) is functools._lru_cache_wrapper:
        fn = fn.__wrapped__
    return type(fn) is types.FunctionType and \
        fn.__dict__.get("_dynamo_marked_constant") is True


def _keys_in(name: str, args: tuple) -> list:
    """The keys ``dict.setdefault``, ``update`` or ``__ior__`` would put in with
    ``args`` (a mapping's, or each pair's first; those of anything else are Python's
    to refuse)."""
    if not args:
        return []
    if name == "setdefault":
        return [args[0]]
    if isinstance(args[0], dict):
        return list(args[0])
    if type(args[0]) in (tuple, list):
        return [pair[0] for pair in args[0] if type(pair) in (tuple, list) and pair]
    return []


_RECREATE_CM = contextlib._GeneratorContextManager._recreate_cm


def _fresh_cm(self: Any) -> Any:
    """What ``_GeneratorContextManager._recreate_cm`` answers (the fresh manager a
    ``@contextmanager`` object used as a decorator enters on each call), inlined in its
    place: made as ``with cm_function(...)`` makes one, through the decorated
    function's helper, whose generator the interpreter steps (the original stores the
    generator on a new object, which the capture cannot follow)."""
    if type(self) is not contextlib._GeneratorContextManager:
        return self.__class__(self.func, self.args, self.kwds)
    return contextlib.contextmanager(self.func)(*self.args, **self.kwds)


class StdlibFolds:
    """The part of ``GraphBuilder`` that folds the standard library (see the module doc)."""

    # -- plans ---------------------------------------------------------------------------

    def stdlib_plan(self, fn: Any, source: Any) -> tuple | None:
        """The plan for a call of ``fn`` handled here, or None.  ``fn`` is compared by
        identity only: its ``__eq__`` could be the program's."""
        if fn is map:
            return (Plan.MAP,)
        if fn is filter:
            return (Plan.FILTER,)
        if fn is functools.reduce:
            return (Plan.REDUCE,)
        kind = type(fn)
        if kind is types.FunctionType and fn.__code__ is _CONTEXTMANAGER_CODE:
            wrapped = fn.__closure__[0].cell_contents   # the decorated generator function
            if source is None:
                return (Plan.GEN_CTX, wrapped, None)
            self.assumptions.append((("cell", source, 0), wrapped))  # type: ignore
            return (Plan.GEN_CTX, wrapped, ("cell", source, 0))
        if fn is _RECREATE_CM:   # a @contextmanager object used as a decorator
            return (Plan.INLINE, _fresh_cm, None, None)
        if kind is types.MethodType and fn.__func__ is _RECREATE_CM:
            return (Plan.INLINE, _fresh_cm, fn.__self__, None)
        if kind is functools.partial:
            return self._plan_partial(fn, source)
        if _marked_constant(fn):
            # torch._dynamo.assume_constant_result's mark (transformers sets it on its
            # install probes): called now, its answer a constant, as in Dynamo
            return (Plan.FOLD, fn)
        if kind is functools._lru_cache_wrapper:
            wrapped = fn.__wrapped__
            if type(wrapped) is not types.FunctionType:
                return None
            return (Plan.INLINE, wrapped, None,
                    ("attr", source, "__wrapped__") if source is not None else None)
        if _one_of(fn, _COLLECTIONS):
            return (Plan.FOLD, fn)
        if kind is types.MethodDescriptorType and fn.__objclass__ is collections.deque and \
                fn.__name__ in _DEQUE_METHODS:
            return (Plan.FOLD, fn)
        if kind is types.BuiltinMethodType and type(fn.__self__) in _IMMUTABLE_SELVES and \
                fn.__name__ in _PURE_METHODS.get(type(fn.__self__), ()) and \
                self._plain_value(fn.__self__):
            # a pure method bound to an immutable value (keyword.iskeyword is a
            # frozenset's __contains__): its answer depends on its arguments only
            return (Plan.FOLD, fn)
        if fn in _DICT_READS or fn in _DICT_VIEWS:
            # on a dict of the program (pure_method, super())
            return (Plan.FOLD, fn)
        if fn is inspect.signature or fn is functools.update_wrapper:
            return (Plan.FOLD, fn)   # (of functions the capture holds / made)
        if fn is collections.namedtuple:   # a class made in the frame, from plain values
            return (Plan.FOLD, fn)
        if self.copy_plan(fn):  # type: ignore[attr-defined]
            return (Plan.FOLD, fn)
        for tool, stepped in STEPPED_ITERTOOLS:
            if fn is tool:
                return (Plan.PARTIAL, stepped, (), {}, None)
        if fn is next or fn is functools.partial or _one_of(fn, _ITERTOOLS) or \
                _one_of(fn, (operator.itemgetter, operator.attrgetter,
                             operator.methodcaller)):
            return (Plan.FOLD, fn)
        getter = getter_plan(fn)
        if getter is not None:
            return getter
        if kind is types.MethodType and type(fn.__func__) in _DESCRIPTORS:
            # a pure method used as a value: folded with its self (Folds.fold unbinds it)
            return (Plan.FOLD, fn) if self.stdlib_plan(fn.__func__, None) else None
        if kind is types.ClassMethodDescriptorType and (fn.__objclass__, fn.__name__) in \
                _CLASS_FOLDS:
            return (Plan.FOLD, fn)
        if kind is types.MethodDescriptorType and \
                fn.__name__ in _PURE_METHODS.get(fn.__objclass__, ()):
            return (Plan.FOLD, fn)
        if kind is types.MethodDescriptorType and fn.__objclass__ is list and \
                fn.__name__ in _LIST_READS:
            return (Plan.FOLD, fn)   # of plain values only (Folds.fold)
        if kind is types.MethodDescriptorType and fn.__objclass__ is self._torch.Size and \
                fn.__name__ in _SIZE_METHODS:
            return (Plan.FOLD, fn)   # torch.Size.numel(shape) of known sizes
        return None

    def _plan_partial(self, fn: functools.partial, source: Any) -> tuple:
        """``(PARTIAL, func, args, keywords, func's source)``.  A partial of the program
        (one with a source) is read part by part, each guarded: its function by
        identity, its bound arguments by value, a tensor among them as a graph input
        (so another partial of the same function does not run this one's graph, and the
        tensors it holds are read on every call)."""
        if source is None:   # made in the frame: its parts are the capture's own values
            return (Plan.PARTIAL, fn.func, fn.args, dict(fn.keywords), None)
        func = ("attr", source, "func")
        self.assumptions.append((func, fn.func))  # type: ignore[attr-defined]
        args = tuple(self._partial_part(("attr", source, "args"), fn.args, range(len(fn.args))))
        keywords = dict(zip(fn.keywords, self._partial_part(
            ("attr", source, "keywords"), fn.keywords, fn.keywords)))
        return (Plan.PARTIAL, fn.func, args, keywords, func)

    def _partial_part(self, source: Any, part: Any, keys: Any) -> list:
        """The items of a partial's ``args`` tuple or ``keywords`` dict (``part``, reached
        by ``source``) at ``keys``, guarded: its length, and each item by value, a tensor
        as a graph input."""
        assumptions = self.assumptions  # type: ignore[attr-defined]
        assumptions.append((source, part))   # (a tuple or dict: its type and length)
        out = []
        for k in keys:
            value, item = part[k], ("item", source, k)
            if isinstance(value, self._torch.Tensor):  # type: ignore[attr-defined]
                out.append(self.input(item, value))  # type: ignore[attr-defined]
            elif self._is_static(value):  # type: ignore[attr-defined]
                assumptions.append((item, value))
                out.append(value)
            else:
                raise GraphBreak(Reason.UNSUPPORTED_VALUE,
                                 f"a functools.partial of the program holding a "
                                 f"{type(value).__name__}")
        return out

    def pure_method(self, obj: Any, name: str) -> tuple | None:
        """``(Attr.METHOD, descriptor, obj)`` for a pure method of a plain value or a folded
        classmethod of a builtin type: the descriptor is what a guard finds on the type, and
        the call folds it with ``obj`` first."""
        if type(obj) is type and (obj, name) in _CLASS_FOLDS:
            return Attr.METHOD, _class_lookup(obj, name), obj   # (maybe inherited)
        if type(obj) in _MUTABLE and name in _MUTATORS and self._of_program(obj):
            raise GraphBreak(Reason.SIDE_EFFECT, f"{type(obj).__name__}.{name}() on a "
                             "container of the program")
        if obj is os.environ and name in ("get", "__getitem__", "__contains__") and \
                self._of_program(obj):
            # read as a dict's (the fold below answers it for os.environ): dict's own
            # method, not Mapping.get, which other mappings run as Python
            return Attr.METHOD, dict.__dict__[name], obj
        if type(obj) in _PLAIN_DICTS and name in ("get", "items", "keys", "values") and \
                self._of_program(obj):
            return Attr.METHOD, dict.__dict__[name], obj   # read item by item, guarded
        if type(obj) is collections.deque and name in _DEQUE_METHODS:
            return Attr.METHOD, collections.deque.__dict__[name], obj
        if type(obj) is list and name in _LIST_READS and self._of_program(obj) and \
                self._plain_contents(obj, 0):  # type: ignore[attr-defined]
            return Attr.METHOD, list.__dict__[name], obj   # (Folds.fold guards it whole)
        if type(obj) is self._torch.Size and name in _SIZE_METHODS and self._is_static(obj):
            return Attr.METHOD, _class_lookup(self._torch.Size, name), obj   # sizes known
        names = _PURE_METHODS.get(type(obj))
        if names is None or name not in names:
            return None
        if type(obj) is tuple and not self._is_static(obj):
            return None
        return Attr.METHOD, type(obj).__dict__[name], obj

    # -- folds ---------------------------------------------------------------------------

    def stdlib_fold(self, fn: Any, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        """``(True, fn(*args, **kwargs))`` when ``fn`` is folded here, else
        ``(False, None)``."""
        if fn is next:
            return True, self._next(args, kwargs)
        if _one_of(fn, _COLLECTIONS):
            return True, self._collection(fn, args, kwargs)
        if type(fn) is types.MethodDescriptorType and fn.__objclass__ is collections.deque:
            return True, self._deque_method(fn, args, kwargs)
        if fn in _DICT_VIEWS and len(args) == 1 and not kwargs and \
                type(args[0]) in _PLAIN_DICTS and self._of_program(args[0]):
            return True, self._program_dict_view(fn, args[0])
        if fn in _DICT_READS and args and (isinstance(args[0], dict) or
                                           args[0] is os.environ) and \
                self._of_program(args[0]):
            return True, self._program_dict_get(fn, args, kwargs)
        if fn is inspect.signature:
            return True, self._signature(args, kwargs)
        if fn is functools.update_wrapper:
            return True, self._update_wrapper(args, kwargs)
        if self.copy_plan(fn):  # type: ignore[attr-defined]
            return True, self.copy_fold(fn, args, kwargs)  # type: ignore[attr-defined]
        if fn is functools.partial:
            if not args or not callable(args[0]):
                raise GraphBreak(Reason.BAD_CALL, "functools.partial() of a non-callable")
            return True, functools.partial(*args, **kwargs)
        if fn is sum and args and (self._holds_nodes(args[0]) or
                                   type(args[0]) in SAFE_ITERATORS):
            args = (tuple(self._elements(args[0])), *args[1:])
            return True, self._sum(args, kwargs)
        if _one_of(fn, _ITERTOOLS):
            return True, self._itertool(fn, args, kwargs)
        if type(fn) is types.ClassMethodDescriptorType:   # cls first, as the call bound it
            if not args or (args[0], fn.__name__) not in _CLASS_FOLDS:
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{describe_callable(fn)}")
            return True, self._itertool(fn.__get__(None, args[0]), args[1:], kwargs)
        if _one_of(fn, (operator.itemgetter, operator.attrgetter)):
            if kwargs or not all(self._is_static(a) or type(a) is slice and all(
                    self._is_static(v) for v in (a.start, a.stop, a.step)) for a in args):
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"operator.{fn.__name__} of "
                                 f"values that are not plain")
            return True, fn(*args)
        if fn is operator.methodcaller:
            if not args or type(args[0]) is not str:
                raise GraphBreak(Reason.BAD_CALL, "operator.methodcaller of these "
                                 "arguments")
            # (its arguments may be graph values: it is called inlined, and goes
            # nowhere else, holds_node)
            return True, fn(*args, **kwargs)
        if _one_of(fn, (str, repr)) and len(args) == 1 and not kwargs and \
                issubclass(type(args[0]), type) and type(args[0]) is not type and \
                type(type(args[0])).__repr__ is type.__repr__:
            return True, fn(args[0])   # a class under a metaclass that keeps type's repr
        if _one_of(fn, (set, frozenset)) and not kwargs and len(args) <= 1:
            items = tuple(self._elements(args[0])) if args else ()
            self._check_hashable(items)
            return True, fn(items)
        if _one_of(fn, (operator.add, operator.mul)) and len(args) == 2 and (
                type(args[0]) in (list, tuple) and type(args[1]) is type(args[0]) or
                type(args[0]) in (list, tuple) and type(args[1]) is int):
            return True, fn(*args)   # a fresh sequence of the same graph arguments
        if _one_of(fn, _SET_OPERATORS) and len(args) == 2 and \
                all(type(a) in (set, frozenset, _VIEWS[0], _VIEWS[2]) for a in args):
            self._check_hashable((*args[0], *args[1]))
            return True, fn(*args)
        return False, None

    def _elements(self, value: Any) -> Any:
        if type(value) in (tuple, list, set, frozenset, dict, str, range, *_VIEWS, *_MUTABLE):
            return value
        if type(value) in SAFE_ITERATORS and self.consumable(value):
            return value
        raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"the elements of a {type(value).__name__}")

    def _check_hashable(self, items: Any) -> None:
        """Set members must hash and compare without user code: plain values, tensors'
        nodes (which hash by identity, as the tensors they stand for do) and objects
        compared by identity."""
        for item in items:
            if type(item) is tuple:
                self._check_hashable(item)
            elif not (self._is_static(item) or type(item) is frozenset
                      or isinstance(item, self.node_type) and self.is_tensor(item)
                      or compared_by_identity(item)):
                raise GraphBreak(Reason.UNSUPPORTED_VALUE,
                                 f"a set member of type {type(item).__name__}")

    def consumable(self, value: Any) -> bool:
        """Whether ``value`` is a view or an iterator the capture may read to the end."""
        if type(value) in _VIEWS:
            return True
        if type(value) not in SAFE_ITERATORS:
            return False
        known = self.known.get(id(value))
        if known is not None and known[0] is value:
            raise GraphBreak(Reason.SIDE_EFFECT, "consuming an iterator of the program")
        return True

    def _of_program(self, obj: Any) -> bool:
        known = self.known.get(id(obj))
        return known is not None and known[0] is obj

    def _plain_value(self, value: Any) -> bool:
        """A plain value, or a frozenset of them: comparing with it runs no program code."""
        if type(value) is frozenset:
            return all(self._is_static(m) for m in value)
        return self._is_static(value)

    def _collection(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """OrderedDict, defaultdict and deque made in the frame: real objects of graph
        arguments the interpreter owns (a deque is stepped and mutated in place)."""
        if fn is collections.defaultdict:
            if not args or not _runs_as_missing(args[0]):
                raise GraphBreak(Reason.UNSUPPORTED_CALL,
                                 "a defaultdict whose factory is neither a builtin type "
                                 "nor a Python function")
        rest = args[1:] if fn is collections.defaultdict else args
        for a in (*rest, *kwargs.values()):
            if type(a) in SAFE_ITERATORS:
                self.consumable(a)
            elif not (self._is_static(a) or isinstance(a, self.node_type) or
                      type(a) in (tuple, list, dict, range, *_VIEWS, *_MUTABLE)):
                raise GraphBreak(Reason.UNSUPPORTED_CALL,
                                 f"{fn.__name__}() of a {type(a).__name__}")
        return fn(*args, **kwargs)

    def _deque_method(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        if not args or type(args[0]) is not collections.deque:
            raise GraphBreak(Reason.BAD_CALL, f"deque.{fn.__name__}() of a non-deque")
        if fn.__name__ in _MUTATORS and self._of_program(args[0]):
            raise GraphBreak(Reason.SIDE_EFFECT, f"deque.{fn.__name__}() on a deque of the "
                             "program")
        if fn.__name__ in ("count", "index") and any(
                isinstance(a, self.node_type) for a in args[1:]):
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"deque.{fn.__name__}() of a tensor")
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise GraphBreak(Reason.OP_FAILED, f"deque.{fn.__name__}() raised "
                             f"{type(exc).__name__}: {exc}") from exc

    def _signature(self, args: tuple, kwargs: dict) -> Any:
        """``inspect.signature(f)`` of a Python function or a method bound to one: read
        from its code and defaults, which the function's guard fixes."""
        target = args[0] if len(args) == 1 and not kwargs else None
        func = target.__func__ if type(target) is types.MethodType else target
        if type(func) is not types.FunctionType or \
                "__signature__" in getattr(func, "__dict__", {}):
            raise GraphBreak(Reason.UNSUPPORTED_CALL, "inspect.signature() of a "
                             f"{type(target).__name__}")
        return inspect.signature(target)

    def _update_wrapper(self, args: tuple, kwargs: dict) -> Any:
        """``functools.update_wrapper(wrapper, wrapped)`` (``@functools.wraps``, and so
        ``@contextlib.contextmanager``, applied in the frame): done now, on a function
        the frame made, copying from a Python function; its names, its dict and
        ``__wrapped__`` are set as eager sets them."""
        try:
            bound = inspect.signature(functools.update_wrapper).bind(*args, **kwargs)
        except TypeError as exc:
            raise GraphBreak(Reason.BAD_CALL, f"functools.update_wrapper(): {exc}") from exc
        wrapper, wrapped = bound.arguments["wrapper"], bound.arguments["wrapped"]
        if type(wrapper) is not types.FunctionType or id(wrapper) not in self.owned_ids or \
                type(wrapped) is not types.FunctionType:
            raise GraphBreak(Reason.UNSUPPORTED_CALL, "functools.update_wrapper() of a "
                             f"{type(wrapper).__name__} the frame did not make")
        return functools.update_wrapper(*args, **kwargs)

    def _program_dict_view(self, fn: Any, d: dict) -> Any:
        """``d.items()``, ``keys()`` or ``values()`` of a dict of the program: a view of
        the capture's copy, each value loaded from ``("item", source, key)`` (a tensor
        becomes a graph input) and the keys guarded in their order."""
        source = self.known[id(d)][1]
        keys = tuple(d)
        if not all(type(k) in (str, int, bool, type(None)) for k in keys):
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, "iterating a dict of the program "
                             "whose keys are not plain values")
        self.assumptions.append((("keys", source), keys))
        copy = {k: self._shadow_item(source, k, dict.__getitem__(d, k))  # type: ignore
                for k in keys}
        return fn(copy)

    def _program_dict_get(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """``d.get(key, default)``, ``d[key]`` and ``key in d`` by dict's own methods on
        a dict of the program (a subclass's store, reached through ``super()``): the item
        loaded from ``("item", source, key)`` (a tensor becomes a graph input), or the
        default with the key's absence guarded."""
        name = fn.__name__
        most = 3 if name == "get" else 2
        if len(args) > 1 and holds_node(args[1], self.node_type):
            # the node stands for a tensor of this call, which the dict may hold as a
            # key: looked up by the tensor itself
            return self._tensor_key_get(name, args, kwargs, most)
        if kwargs or not 2 <= len(args) <= most or not (
                self._is_static(args[1]) or _identity_key(args[1])):
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"dict.{name}() with these arguments")
        d, key = args[0], args[1]
        src = ("item", self.known[id(d)][1], key)
        if d is os.environ:   # read as the guard reads it: a str for a str key
            if type(key) is not str:
                raise GraphBreak(Reason.UNSUPPORTED_CALL, "os.environ read with a non-str key")
            d = dict(os.environ)
        if not dict.__contains__(d, key):
            self.assumptions.append((src, MISSING))
            if name == "__getitem__":
                raise GraphBreak(Reason.OP_FAILED, f"dict[{key!r}] raised KeyError")
            return False if name == "__contains__" else args[2] if len(args) == 3 else None
        if name == "__contains__":
            self.assumptions.append((src, dict.__getitem__(d, key)))
            return True
        return self._dict_value(src, dict.__getitem__(d, key))

    def _dict_value(self, item: Any, value: Any) -> Any:
        """A value read from a dict of the program at source ``item``: a tensor as a
        graph input, anything else guarded and known by that source."""
        if isinstance(value, self._torch.Tensor):
            return self.input(item, value)
        self.assumptions.append((item, value))
        self.known.setdefault(id(value), (value, item))
        return value

    def _tensor_key_get(self, name: str, args: tuple, kwargs: dict, most: int,
                        source: Any = None) -> Any:
        """``d.get(t, default)``, ``d[t]``, ``t in d`` on a dict of the program, for ``t``
        a tensor the graph is given (a parameter, an argument): looked up by the tensor
        itself (hashed by identity).  Found at place ``k`` among the keys, the key there
        is guarded to be that tensor and the value there is read; absent from a dict with
        no tensor key, its keys are guarded equal; otherwise a break."""
        d, key = args[0], args[1]
        real = None
        if isinstance(key, self.node_type) and key.op == "placeholder" and \
                isinstance(key.meta.get("example_value"), self._torch.Tensor):
            real = self._inputs.get(key.meta.get("source"), (None, None))[1]
        known = self.known.get(id(d), (None, None))
        src = source if source is not None else known[1] if known[0] is d else None
        if real is None or kwargs or not 2 <= len(args) <= most or src is None or \
                type(d) not in (dict, collections.OrderedDict, collections.defaultdict):
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"dict.{name}() of a tensor key")
        keys = tuple(d)
        at = next((k for k, each in enumerate(keys) if each is real), None)
        if at is None and name == "__getitem__" and type(d) is collections.defaultdict \
                and d.default_factory in _FACTORIES:
            return self._missing_tensor_key(d, src, key)
        if at is None:
            if not self._is_static(keys):
                # (its keys guarded equal only where they are plain values)
                raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"dict.{name}() of a tensor key "
                                 f"absent from a dict keyed by other objects")
            self.assumptions.append((("keys", src), keys))
            if name == "__getitem__":
                raise GraphBreak(Reason.OP_FAILED, "dict[tensor] raised KeyError")
            return False if name == "__contains__" else args[2] if len(args) == 3 else None
        self.input(("item", ("keys", src), at), real)   # the same node: guarded the same
        if name == "__contains__":
            return True
        return self._dict_value(("item", ("values", src), at), dict.__getitem__(d, real))

    def _missing_tensor_key(self, d: Any, source: Any, key: Any) -> Any:
        """``d[t]`` of a defaultdict of the program without the key ``t`` (an optimizer's
        ``self.state[p]`` on its first step): the factory's value is added to the dict's
        shadow (which the interpreter then reads for ``d``, and whose contents are
        written back), and the capture owns it.  A present key is read from the dict
        itself: no shadow, nothing written back on later calls."""
        shadow = self.shadow(d, source)  # type: ignore[attr-defined]  # agspeed._effects
        self.shadow_map[id(d)] = shadow  # type: ignore[attr-defined]
        self.owned_ids.add(id(shadow))  # type: ignore[attr-defined]
        self.dict_key(shadow, key)  # type: ignore[attr-defined]
        value = shadow[key]
        self.owned_ids.add(id(value))  # type: ignore[attr-defined]
        return value

    def _holds_nodes(self, value: Any) -> bool:
        if type(value) in (tuple, list) or type(value) in _VIEWS:
            return any(isinstance(v, self.node_type) for v in value)
        return False

    def _next(self, args: tuple, kwargs: dict) -> Any:
        if kwargs or not 1 <= len(args) <= 2:
            raise GraphBreak(Reason.BAD_CALL, "next() takes an iterator and a default")
        if type(args[0]) not in SAFE_ITERATORS or not self.consumable(args[0]):
            raise GraphBreak(Reason.UNSUPPORTED_VALUE,
                             f"next() of a {type(args[0]).__name__}")
        try:
            return next(*args)
        except StopIteration as exc:
            raise GraphBreak(Reason.RAISE, "next() of an exhausted iterator") from exc

    def _sum(self, args: tuple, kwargs: dict) -> Any:
        """``sum`` of a sequence holding tensors: one graph add per element, in order."""
        if len(args) > 2 or set(kwargs) - {"start"}:
            raise GraphBreak(Reason.BAD_CALL, "sum() with these arguments")
        acc = args[1] if len(args) > 1 else kwargs.get("start", 0)
        if all(self._is_static(v) for v in (acc, *args[0])):
            return sum(args[0], acc)   # CPython's own float summation
        for item in args[0]:
            if isinstance(acc, self.node_type) or isinstance(item, self.node_type):
                acc = self.call_function(operator.add, (acc, item))
            elif self._is_static(acc) and self._is_static(item):
                acc = acc + item
            else:
                raise GraphBreak(Reason.UNSUPPORTED_VALUE,
                                 f"sum() over a {type(item).__name__}")
        return acc

    def _itertool(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """An itertools iterator (or ``dict.fromkeys``) over graph arguments."""
        plain = (tuple, list, dict, set, frozenset, str, range, *_VIEWS, *SAFE_ITERATORS)
        for a in (*args, *kwargs.values()):
            if not (self._is_static(a) or type(a) in plain or isinstance(a, self.node_type)):
                # a callable (accumulate's func) or an object could run user code
                raise GraphBreak(Reason.UNSUPPORTED_CALL,
                                 f"{describe_callable(fn)} on a {type(a).__name__}")
            if type(a) in SAFE_ITERATORS:
                self.consumable(a)
        if fn is itertools.accumulate:
            return self._accumulate(args, kwargs)
        if fn is itertools.repeat and len(args) + len(kwargs) != 2:
            # endless: a later list() of it would never end while capturing
            raise GraphBreak(Reason.UNSUPPORTED_CALL, "itertools.repeat without a count")
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise GraphBreak(Reason.OP_FAILED, f"{describe_callable(fn)} raised "
                             f"{type(exc).__name__}: {exc}") from exc

    def _accumulate(self, args: tuple, kwargs: dict) -> Any:
        if len(args) != 1 or set(kwargs) - {"initial"}:
            raise GraphBreak(Reason.UNSUPPORTED_CALL, "itertools.accumulate with a function")
        out = [] if kwargs.get("initial") is None else [kwargs["initial"]]
        for item in args[0]:
            if not out:
                out.append(item)
            elif isinstance(out[-1], self.node_type) or isinstance(item, self.node_type):
                out.append(self.call_function(operator.add, (out[-1], item)))
            else:
                out.append(out[-1] + item)
        return iter(tuple(out))

    # -- containers built while capturing ----------------------------------------------

    def container_method(self, spec: tuple, args: tuple, kwargs: dict) -> Any:
        """``container.name(*args)`` for lists, dicts, sets and tuples built while
        capturing; dict views stay live, as Python's are."""
        name, container = spec
        allowed = _CONTAINER_METHODS.get(type(container), ())
        if name not in allowed:
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{type(container).__name__}.{name}()")
        if type(container) is set and self._sym_types:  # type: ignore[attr-defined]
            # a size joins a set as its number, which eager hashes by value
            args = tuple(self._specialize(a) for a in args)  # type: ignore[attr-defined]
        values = (*args, *kwargs.values())
        if isinstance(container, dict) and name in ("setdefault", "update", "__ior__") \
                and any(holds_node(k, self.node_type) for k in _keys_in(name, args)):
            # a tensor as a key: hashed by the node standing for it, which is no
            # tensor once the dict leaves the capture (BUILD_MAP refuses it too)
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, "a dict key that is a TENSOR")
        if type(container) is set:
            if self.is_shadow(container) and holds_node(values, self.node_type):  # type: ignore
                # the program's set would hold the graph's stand-in, not the tensor
                raise GraphBreak(Reason.SIDE_EFFECT, "a tensor put in a set of the program")
            for v in values:
                self._check_hashable(self._elements(v) if name in _SET_INPLACE or
                                     name.endswith(("update", "union", "intersection",
                                                    "difference", "subset", "superset",
                                                    "disjoint")) else (v,))
        elif name in _COMPARING:
            if name == "sort":
                if kwargs.get("key") is not None or \
                        not all(self._is_static(v) for v in container):
                    raise GraphBreak(Reason.UNSUPPORTED_CALL, "sort() of tensors or by a key")
            elif type(container) is not set and holds_node(values, self.node_type):
                # (one holding a tensor too: its == reaches the tensor's, as eager's does)
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{name}() of a tensor")
        if any(type(v) in SAFE_ITERATORS for v in values):
            for v in values:
                if type(v) in SAFE_ITERATORS:
                    self.consumable(v)
        try:
            out = getattr(container, name)(*args, **kwargs)
        except Exception as exc:
            raise GraphBreak(Reason.OP_FAILED, f"{type(container).__name__}.{name}() raised "
                             f"{type(exc).__name__}: {exc}") from exc
        if out is NotImplemented:   # `s |= [1]`: Python goes on to the plain operator
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{type(container).__name__}.{name}() "
                             f"of a {type(args[0]).__name__}")
        return out
