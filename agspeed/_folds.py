"""Folds of the graph builder: what is evaluated now, on known values, while capturing.

A builtin called on known values (``len``, ``isinstance``, ``range``, ``min``...) is run
at capture time and its result becomes a constant of the graph; so are comparisons,
truth tests, iteration, indexing and f-string formatting of known objects, and the
methods of containers the capture built.  None of it runs user code: objects whose
answer would need it break the graph.  A size the graph computes (dynamic shapes) is
taken at its current value, which the ShapeEnv then guards.
"""

from __future__ import annotations

import builtins
import collections
import enum
import logging
import operator
import sys
import types
import weakref
from typing import Any

from agspeed import _C
from agspeed._builder_types import GraphBreak, SymShape, concrete, describe_callable
from agspeed._compare import Comparisons, _tensor_keyed
from agspeed._foreach_groups import group_by_device_and_dtype
from agspeed._shapes import scalar_parts
from agspeed._sources import (MISSING, _class_lookup, compared_by_identity, is_namedtuple_type,
                              static_attr)
from agspeed._stdlib import _FACTORIES, _VIEWS, SAFE_ITERATORS, StdlibFolds
from agspeed.protocol import Attr, Reason

_LIST_READS = (list.index, list.count)
_STRUCTURAL_FOLDS = (enumerate, zip, reversed, list, tuple, len, iter, dict, set, frozenset)
_TYPE_FOLDS = (isinstance, issubclass, type, callable)
_VALUE_FOLDS = (range, min, max, abs, int, float, bool, str, sum, any, all, round, divmod,
                pow, sorted, repr, hash, ord, chr, slice, sys.intern)
#: every builtin ``fold`` evaluates (the call policy plans them as folds)
FOLDABLE = frozenset(_STRUCTURAL_FOLDS + _TYPE_FOLDS + _VALUE_FOLDS)
# Folds whose result is an object rather than a plain value: the same object for the same
# arguments, so reading it again on a later call needs no guard.
_OBJECT_FOLDS = frozenset({logging.getLogger})
_COLLECTIONS = (collections.OrderedDict, collections.defaultdict, collections.deque)

# Folds that move sizes the graph computes around without reading their values: they
# keep them as size nodes (a dynamic dimension stays dynamic through ``tuple(x.shape)``).
_KEEPS_SIZES = frozenset({len, tuple, list, iter, reversed, zip, enumerate})
_SEQUENCE_OPS = frozenset({operator.add, operator.concat, operator.iadd, operator.mul,
                           operator.imul})

_HINT_MODULES = ("builtins", "typing", "typing_extensions", "collections", "collections.abc",
                 "types")


def _type_hint(obj: Any) -> bool:
    """A class of the standard library or a ``typing`` form: what subscripting makes
    a type hint (``list[int]``, ``Optional[str]``, ``Callable[[int], bool]``)."""
    module = getattr(type(obj), "__module__", None) if not isinstance(obj, type) else \
        getattr(obj, "__module__", None)
    return module in _HINT_MODULES


def _type_hint_args(index: Any) -> bool:
    """Arguments of a type hint: classes, ``typing`` forms, their tuples and lists,
    ``...``, None and strings (forward references)."""
    if type(index) in (tuple, list):
        return all(_type_hint_args(i) for i in index)
    return index is None or index is Ellipsis or type(index) is str or \
        isinstance(index, type) or _type_hint(index)


# What the structural folds would call on their arguments: dict() a mapping's keys and
# items, list() and the others an iterable's __iter__ (or the old __getitem__ protocol).
_PROTOCOL = ("__iter__", "keys", "__getitem__", "__len__")


def _python_protocol(value: Any, module_type: type) -> bool:
    """Whether ``value``'s class defines one of the fold protocol's methods in Python
    (never for a module, whose containers are read by their sources)."""
    kind = type(value)
    if kind.__module__ == "builtins" or isinstance(value, module_type):
        return False
    return any(type(_class_lookup(kind, name)) is types.FunctionType for name in _PROTOCOL)



def holds_container(value: Any) -> bool:
    """Whether ``value`` is a tuple holding a list, dict or set (at any depth through
    tuples): one of the program's is returned as itself, so that those are the
    program's own objects, not copies (``GraphBuilder.program_object``)."""
    return type(value) is tuple and any(
        type(v) in (list, dict, set) or holds_container(v) for v in value)

def _type_form(value: Any) -> bool:
    """Whether ``value`` is a class or a typing form built of them (``list[int]``,
    ``Sequence[Tensor]``, ``int | None``): what ``|`` joins into a union without running
    the program's code."""
    import typing

    kind = type(value)
    if issubclass(kind, type):   # a class, its metaclass's | type's own
        return _class_lookup(kind, "__or__") is type.__dict__["__or__"]
    return value is None or kind in (types.GenericAlias, types.UnionType) \
        or kind.__module__ == "typing" and issubclass(kind, typing._Final)


def kl_dispatch() -> Any:
    """``torch.distributions.kl._dispatch_kl`` where that module is loaded, else None:
    the KL function registered for two distribution classes, found by comparing
    ``_Match`` objects (whose ``__lt__`` is Python: folded whole instead)."""
    kl = sys.modules.get("torch.distributions.kl")
    return getattr(kl, "_dispatch_kl", None) if kl is not None else None


_SET_ALGEBRA = frozenset({"union", "intersection", "difference", "symmetric_difference",
                          "issubset", "issuperset", "isdisjoint", "copy"})
# folds that read only what an object is, never step it
_CLASS_ONLY = (isinstance, issubclass, type, callable, id, hasattr, getattr)


class Folds(Comparisons, StdlibFolds):
    """The part of ``GraphBuilder`` that evaluates known values (the standard library's
    iterators, itertools, functools and container methods in ``_stdlib``)."""

    def fold(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """``fn(*args, **kwargs)`` evaluated now on known values (sizes the graph would
        compute taken at their current, guarded, values)."""
        if fn is delattr:
            return self.delattr_fold(args, kwargs)  # type: ignore[attr-defined]
        if isinstance(fn, enum.EnumMeta) and (len(args) != 1 or kwargs):
            # (an enum class called otherwise makes a new class: the functional API)
            raise GraphBreak(Reason.UNSUPPORTED_CALL, f"calling {describe_callable(fn)} "
                             f"other than with one value")
        if fn in _LIST_READS:   # lst.index(v), lst.count(v): compared as values
            if not (args and type(args[0]) is list and self._plain_contents(args, 0)):
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"list.{fn.__name__} of values "
                                 f"other than plain ones")
            self._guard_contents(args[0])
        if fn not in _CLASS_ONLY and any(
                hasattr(type(a), "__next__") and self._of_program(a)  # type: ignore[attr-defined]
                for a in (*args, *kwargs.values())):
            # zip(range(3), it), enumerate(it)...: what the fold makes would step the
            # program's iterator during the capture, and the program's next read would
            # miss what it took
            raise GraphBreak(Reason.SIDE_EFFECT, "consuming an iterator of the program")
        if self._sym_types and fn in _SEQUENCE_OPS and len(args) == 2 and not kwargs:
            joined = self._sequence_op(fn, *args)
            if joined is not None:
                return joined
        if self._sym_types and fn in (min, max) and not kwargs:
            kept = self._size_extreme(fn, args)
            if kept is not None:
                return kept
        if self._sym_types and fn not in _KEEPS_SIZES and fn not in _TYPE_FOLDS:
            # (a size's type is its kind's, whatever its value: _real_type_view)
            args = tuple(self._specialize(a) for a in args)
            kwargs = {k: self._specialize(v) for k, v in kwargs.items()}
        if type(fn) is types.MethodType and fn.__func__ in self._dict_views:
            args, fn = (fn.__self__, *args), fn.__func__
        if type(fn) is types.FunctionType and fn in self._dict_views:
            if len(args) != 1 or kwargs or not isinstance(args[0], self._torch.nn.ModuleDict):
                raise GraphBreak(Reason.BAD_CALL, f"ModuleDict.{self._dict_views[fn]}() with "
                                 f"these arguments")
            return self._module_dict_view(args[0], self._dict_views[fn])
        if type(fn) is types.MethodType and type(fn.__func__) in (
                types.MethodDescriptorType, types.ClassMethodDescriptorType):
            fn, args = fn.__func__, (fn.__self__, *args)
        elif type(fn) is types.BuiltinMethodType and type(fn.__self__) in (set, frozenset) \
                and fn.__name__ in _SET_ALGEBRA:
            # set algebra bound to its set (getattr(s, "union")): the class's function
            # with the set first, as the rule below knows it
            fn, args = getattr(type(fn.__self__), fn.__name__), (fn.__self__, *args)
        if fn is self._torch._C._group_tensors_by_device_and_dtype:
            return group_by_device_and_dtype(self, args, kwargs)
        if type(fn) is weakref.ReferenceType and not args and not kwargs:
            return self._dereference(fn)
        if fn is operator.or_ and len(args) == 2 and not kwargs and \
                all(_type_form(a) for a in args):
            return args[0] | args[1]   # an annotation's union (typing.cast's first argument)
        handled, out = self.stdlib_fold(fn, args, kwargs)
        if not handled:
            handled, out = self.numpy_fold(fn, args, kwargs)  # type: ignore[attr-defined]
        if handled:
            return out
        if is_namedtuple_type(fn):  # fields may be tensors: it holds their nodes
            try:
                return fn(*args, **kwargs)
            except TypeError as exc:
                raise GraphBreak(Reason.BAD_CALL, f"{fn.__qualname__}(): {exc}") from exc
        if fn is iter and len(args) != 1:
            raise GraphBreak(Reason.UNSUPPORTED_CALL, "iter() with a sentinel calls a function")
        for a in args:
            if type(a) in SAFE_ITERATORS:
                self.consumable(a)   # an iterator of the program breaks
        if fn in _STRUCTURAL_FOLDS:
            if fn is not len:
                args = tuple(self._unbind(a) if isinstance(a, self.node_type)
                             else self._materialize(a) for a in args)
            if fn is len and isinstance(args[0], self.node_type):
                return self._tensor_len(args[0])
            out = fn(*args, **kwargs) if fn is not len else len(args[0])
            user = next((a for a in args if _python_protocol(a, self._torch.nn.Module)),
                        None) if fn in (dict, list, tuple, set, frozenset) else None
            if user is not None and self._holds_real_tensor(out):
                # dict(mapping) ran the program's keys() and __getitem__, which handed
                # out its real tensors: held by the graph, they would be this call's
                raise GraphBreak(Reason.UNSUPPORTED_CALL,
                                 f"{fn.__name__}() of a {type(user).__name__} holding "
                                 f"tensors, read through its Python methods")
            if fn is iter and type(out) not in SAFE_ITERATORS:
                # a real iterator: next() and for share its position (one over a
                # list, dict or set the capture built reads it as it steps)
                out = iter(tuple(out))
            return out
        if fn in _TYPE_FOLDS:
            args = tuple(self._real_type_view(a) for a in args)
            return fn(*args, **kwargs)
        if fn is kl_dispatch() and len(args) == 2 and not kwargs and \
                all(type(a) is type for a in args):
            return fn(*args)   # a registered function, or NotImplemented
        if fn in (sum, any, all) and args:
            # a ParameterList or ModuleList: its members, each from its source
            args = (self._materialize(args[0]), *args[1:])
        if fn in (any, all) and len(args) == 1 and not kwargs and \
                type(args[0]) in (tuple, list):
            # each item's truth as Python takes it, stopping where Python stops
            truths = (self.truth(v) for v in args[0])
            return any(truths) if fn is any else all(truths)
        if fn is bool and len(args) == 1 and not kwargs and \
                type(args[0]) in (tuple, list, dict, set, frozenset, *_VIEWS, *_COLLECTIONS):
            return len(args[0]) > 0     # a container's truth: its size, whatever it holds
        if fn is sum and args and type(args[0]) in (tuple, list) and \
                any(isinstance(a, self.node_type) for a in args[0]):
            return self._sum_nodes(args, kwargs)
        if any(isinstance(a, self.node_type) for a in (*args, *kwargs.values())):
            if fn in (min, max, abs, pow, round):
                raise GraphBreak(Reason.UNSUPPORTED_CALL, f"{fn.__name__}() of a tensor")
        if fn is operator.mul and len(args) == 2 and not kwargs and \
                {type(a) for a in args} in ({int, list}, {int, tuple}):
            return args[0] * args[1]   # a sequence repeated: its items as they are
        if fn in (min, max, sum, any, all, sorted) and args and \
                (type(args[0]) in (*_VIEWS, dict, set, frozenset, *_COLLECTIONS) or
                 type(args[0]) in SAFE_ITERATORS):
            args = (tuple(args[0]), *args[1:])
        if fn is str.join and len(args) == 2 and type(args[1]) in SAFE_ITERATORS:
            args = (args[0], tuple(args[1]))   # "".join(map(str, xs)): what it yields
        if type(fn) is types.MethodDescriptorType and fn.__objclass__ in (set, frozenset) \
                and not kwargs and all(self._plain_set(a) for a in args):
            try:   # set.difference(a, b): members hashed as Python does
                return fn(*args)
            except Exception as exc:   # eager raises it: the frame runs eager
                raise GraphBreak(Reason.OP_FAILED, f"{describe_callable(fn)} raised "
                                 f"{type(exc).__name__}: {exc}") from exc
        if not all(self._is_static(a) or isinstance(a, (range, slice))
                   for a in (*args, *kwargs.values())):
            if fn in (min, max, sum, any, all, sorted) and len(args) == 1 and \
                    isinstance(args[0], (tuple, list)) and all(self._is_static(a) for a in args[0]):
                pass
            elif fn in (int, float, bool, complex) and len(args) == 1 and \
                    isinstance(args[0], self.node_type) and self.is_tensor(args[0]):
                raise GraphBreak(Reason.DATA_DEPENDENT, f"{fn.__name__}() of a tensor "
                                 f"(Python takes its value)")
            else:
                kinds = ("Tensor" if isinstance(a, self.node_type) and self.is_tensor(a)
                         else "a symbolic number" if isinstance(a, self.node_type)
                         else type(a).__name__ for a in args)
                raise GraphBreak(Reason.UNSUPPORTED_CALL,
                                 f"{describe_callable(fn)} on {', '.join(kinds)}")
        if fn is collections.namedtuple and "module" not in kwargs:
            # its module is the caller's, as eager's (it reads its caller's globals)
            site = _C.capture_site()
            if site:
                kwargs = {**kwargs, "module": site[0][2].get("__name__")}
        try:
            out = fn(*args, **kwargs)
        except Exception as exc:
            raise GraphBreak(Reason.OP_FAILED, f"{describe_callable(fn)} raised "
                             f"{type(exc).__name__}: {exc}") from exc
        if isinstance(out, (range, slice)) or self._is_static(out) or fn in _OBJECT_FOLDS \
                or isinstance(fn, enum.EnumMeta):   # (a member: one for one value)
            return out
        if fn is collections.namedtuple:
            return out   # a class made from plain values: made once, at capture
        raise GraphBreak(Reason.NON_TENSOR_RESULT, f"{describe_callable(fn)} returned a "
                         f"{type(out).__name__}")

    def _size_extreme(self, fn: Any, args: tuple) -> Any:
        """``max(n - w + 1, 0)``, ``min(a, b)`` of ints among which are sizes: a size
        again (``torch.sym_max``/``sym_min`` in the graph), so a dimension or a counter
        made dynamic stays so; None where the arguments are anything else."""
        items = tuple(args[0]) if len(args) == 1 and type(args[0]) in (tuple, list) \
            else args
        torch = self._torch
        sizes = [v for v in items if isinstance(v, self.node_type)]
        if len(items) < 2 or not sizes or not all(
                type(v) is int or isinstance(v, self.node_type) and
                isinstance(v.meta.get("example_value"), torch.SymInt) for v in items):
            return None
        pick = torch.sym_max if fn is max else torch.sym_min
        out = items[0]
        for v in items[1:]:
            out = self.call_function(pick, (out, v))
        return out

    def _sum_nodes(self, args: tuple, kwargs: dict) -> Any:
        """``sum(items, start)`` over items holding tensors: the additions eager makes, in
        its order (``start + items[0] + items[1] ...``), recorded."""
        if len(args) > 2 or set(kwargs) - {"start"} or (len(args) == 2 and kwargs):
            raise GraphBreak(Reason.BAD_CALL, "sum() with these arguments")
        total = args[1] if len(args) == 2 else kwargs.get("start", 0)
        for item in args[0]:
            total = self.call_function(operator.add, (total, item))
        return total

    def _holds_real_tensor(self, out: Any) -> bool:
        """Whether a container a fold made holds a tensor that is not a graph value (in
        it or in a tuple in it)."""
        items = [*out, *out.values()] if isinstance(out, dict) else list(out)
        items += [v for item in items if type(item) is tuple for v in item]
        return any(isinstance(v, self._torch.Tensor) and not isinstance(v, self.node_type)
                   for v in items)

    def _materialize(self, obj: Any) -> Any:
        """A module container as a tuple of its members, each loaded from its source
        (guarded, and remembered for the interpreter), so that enumerate() or zip() of it
        keeps every member's source."""
        torch = self._torch
        if not isinstance(obj, (torch.nn.ModuleList, torch.nn.Sequential,
                                torch.nn.ParameterList, torch.nn.ModuleDict)):
            return obj
        known = self.known.get(id(obj))
        source = known[1] if known is not None and known[0] is obj else None
        items = []
        for value, src in self.iterate(obj, source):
            if src is None:
                items.append(value)
            elif isinstance(value, torch.Tensor):
                items.append(self.input(src, value))
            else:
                self.assumptions.append((src, value))
                self.known.setdefault(id(value), (value, src))
                items.append(value)
        return tuple(items)

    def _module_dict_view(self, container: Any, which: str) -> tuple:
        """``ModuleDict.items()/keys()/values()`` as a tuple, each member loaded from its
        source so that calling it inlines and guards it."""
        known = self.known.get(id(container))
        source = known[1] if known is not None and known[0] is container else None
        if source is None:
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, "a ModuleDict reached by no source")
        store = object.__getattribute__(container, "__dict__")["_modules"]
        self._guard_store(container, source, store)
        out = []
        for key, member in store.items():
            src = ("attr", source, key)
            self.assumptions.append((src, member))
            self.known.setdefault(id(member), (member, src))
            out.append(key if which == "keys" else member if which == "values"
                       else (key, member))
        return tuple(out)

    def _tensor_len(self, node: Any) -> Any:
        shape = node.meta["example_value"].shape
        if len(shape) == 0:
            raise GraphBreak(Reason.OP_FAILED, "len() of a 0-d tensor")
        if self._sym_types and concrete(shape[0]) is None:
            return self._size_node(node, 0)
        return int(shape[0])

    def _unbind(self, node: Any) -> tuple:
        """Iterating a tensor: its rows, as eager's ``Tensor.__iter__`` gives them
        (``unbind(0)``: views that refuse in-place changes where autograd tracks them;
        the builder answers a call returning a tuple with a ``getitem`` node per item,
        and the length is the first dimension, a guarded shape)."""
        shape = node.meta["example_value"].shape
        if len(shape) == 0:
            raise GraphBreak(Reason.OP_FAILED, "iteration over a 0-d tensor")
        if shape[0] > 1000:
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, "iterating over more than 1000 rows")
        return tuple(self.call_function(self._torch.unbind, (node, 0)))

    def _real_type_view(self, value: Any) -> Any:
        """For type checks: a placeholder stands for its real input, another node for
        its fake value (a plain Tensor, as eager's result would be)."""
        if isinstance(value, self.node_type):
            if self.is_size(value):
                ev = value.meta["example_value"]   # a number of its kind, not its value
                torch = self._torch
                return 0 if isinstance(ev, torch.SymInt) else \
                    0.0 if isinstance(ev, torch.SymFloat) else False
            if self._numpy_nodes and value in self._numpy_nodes:  # type: ignore
                return self.numpy_type_view(value)  # type: ignore[attr-defined]
            if value.op == "placeholder":
                for node, real in self._inputs.values():
                    if node is value:
                        return real
            fake = value.meta["example_value"]
            if type(fake) is self._torch._subclasses.FakeTensor:
                # eager's result of an operator is a plain Tensor: so is its type
                return self._plain_tensor()
            return fake
        return value

    def _plain_tensor(self) -> Any:
        """A plain ``torch.Tensor`` of no data: what type checks see for a tensor the
        graph computes."""
        plain = getattr(self, "_plain", None)
        if plain is None:
            plain = self._plain = self._torch.empty(0, device="meta")
        return plain

    def _sequence_op(self, fn: Any, a: Any, b: Any) -> Any:
        """``a + b`` or ``a * n`` of shapes, tuples or lists that hold size nodes, with the
        sizes kept symbolic: ``x.size()[:-1] + (n,)`` and ``x.shape[1:] * 2`` are shapes
        again (as with a torch.Size), ``(-1,) + tuple(x.shape)[1:]`` a tuple.  None for
        anything else, which is evaluated with the sizes taken at their values."""
        shaped = (tuple, SymShape, self._torch.Size)
        if fn in (operator.mul, operator.imul):
            if type(a) is int:
                a, b = b, a
            if type(b) is not int or type(a) not in (*shaped, list) or \
                    (fn is operator.imul and type(a) is list):   # *= on a list: in place
                return None
            out, kinds = a * b, (type(a),)
        else:
            kinds = (type(a), type(b))
            if kinds == (list, list) and fn is not operator.iadd:   # += is in place
                out = a + b
            elif kinds[0] in shaped and kinds[1] in shaped:
                out = tuple(a) + tuple(b)
            else:
                return None
        if not self._has_size_node(out):
            return None
        if SymShape in kinds or self._torch.Size in kinds:
            return SymShape(out)
        return out if type(out) is list else tuple(out)

    def getitem(self, container: Any, index: Any, source: Any) -> tuple[Any, Any]:
        """``(container[index], its source or None)``."""
        torch = self._torch
        if isinstance(container, self.node_type):
            if self.is_size(index) and self.is_tensor(container):
                # t[n] with a symbolic n: Tensor.__getitem__ would take n's value (a
                # guard pinning it); select keeps it a symbol, with eager's result
                return self.call_method("select", (container, 0, index)), None
            return self.call_function(operator.getitem, (container, index)), None
        if self._sym_types:   # sizes as the indices of a known sequence: taken now
            index = self._specialize(index)
            if type(index) is slice:
                index = slice(*(self._specialize(v) for v in (index.start, index.stop,
                                                              index.step)))
        if isinstance(index, self.node_type) and isinstance(container, dict) and \
                index.meta.get("constant") is None:
            # a tensor as a key: the capture's own dict is keyed by nodes; one of the
            # program's (reached by ``source``) by the tensors themselves
            if source is not None or _tensor_keyed(self, container):
                return self._tensor_key_get("__getitem__", (container, index), {}, 2,
                                            source), None
            if index not in container:
                if type(container) is not collections.defaultdict:
                    raise GraphBreak(Reason.OP_FAILED, "dict[tensor] raised KeyError")
                if container.default_factory not in _FACTORIES:
                    raise GraphBreak(Reason.UNSUPPORTED_VALUE, "a tensor key missing from "
                                     "a defaultdict whose factory is Python code")
                if self.is_shadow(container):   # the factory's value joins it: a key
                    self.dict_key(container, index)   # the entry can write back
            return container[index], None
        if isinstance(index, self.node_type):
            known = index.meta.get("constant")   # torch.as_tensor(2): known at capture
            if known is None or known.dim() != 0 or known.is_floating_point() or \
                    known.is_complex():
                raise GraphBreak(Reason.UNSUPPORTED_VALUE, "indexing a sequence with a tensor")
            index = operator.index(known)
        if isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential,
                                  torch.nn.ModuleDict, torch.nn.ParameterList,
                                  torch.nn.ParameterDict)):
            return self._module_item(container, index, source)
        if type(container) in (tuple, list, dict, str, torch.Size, range, SymShape,
                               *_COLLECTIONS) or \
                is_namedtuple_type(type(container)) or \
                (isinstance(container, dict) and _class_lookup(type(container), "__getitem__")
                 is dict.__getitem__):   # a dict subclass that keeps dict's item read
            try:
                out = container[index]
            except Exception as exc:
                raise GraphBreak(Reason.OP_FAILED, f"{type(container).__name__}[{index!r}] raised "
                                 f"{type(exc).__name__}: {exc}") from exc
            if type(container) is SymShape and type(index) is slice:
                out = SymShape(out)     # a slice of a shape is a shape
            symbol = source is not None and type(index) is not slice and \
                self._symbolic_at(("item", source, index), out)
            if source is not None and not self._is_static(container) and not symbol:
                self._guard_read(container, index, source, out)
                if type(index) is slice and type(container) in (tuple, list):
                    # the tensors of a slice of the program's sequence: graph inputs
                    where = range(*index.indices(len(container)))
                    out = type(out)(self.input(("item", source, i), v)
                                    if isinstance(v, torch.Tensor) else v
                                    for i, v in zip(where, out))
            # (a list keeps its source even when it holds plain values: the program may
            # change it in place, through that source)
            keep = source is not None and not isinstance(index, slice) and \
                (type(out) is list or holds_container(out) or
                 not self._is_static(out) or symbol) and \
                not isinstance(out, self.node_type)
            return out, (("item", source, index) if keep else None)
        if _type_hint(container) and _type_hint_args(index):
            # an annotation evaluated in the frame (``def helper(x: list[Any])``):
            # a generic alias, made as Python makes it
            try:
                return container[index], None
            except Exception as exc:
                raise GraphBreak(Reason.OP_FAILED, f"{container!r}[{index!r}] raised "
                                 f"{type(exc).__name__}: {exc}") from exc
        raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"indexing a {type(container).__name__}")

    def _symbolic_at(self, source: tuple, value: Any) -> bool:
        """Whether the plain ``value`` at ``source`` is, or holds, an int or float this
        capture makes a symbol (the interpreter loads it by its source then)."""
        symbolic = self.symbolic_scalars
        return bool(symbolic) and any(part in symbolic
                                      for part, _ in scalar_parts(source, value))

    def _plain_set(self, value: Any) -> bool:
        """A set or frozenset whose members hash and compare without program code
        (plain values, objects compared by identity), so set algebra on it runs none."""
        return type(value) in (set, frozenset) and all(
            self._is_static(m) or compared_by_identity(m) for m in value)

    def _guard_read(self, container: Any, index: Any, source: Any, out: Any) -> None:
        """Plain values read out of a container of the program whose own guard holds
        only its type and length (a dict, a list or tuple of objects): each item read is
        guarded where it is (a value loaded by its source gets its guard there)."""
        if isinstance(index, slice):
            for i in range(*index.indices(len(container))):
                if self._is_static(container[i]):
                    self.assumptions.append((("item", source, i), container[i]))
        elif self._is_static(out) and type(out) is not list:   # (a list: by its load)
            self.assumptions.append((("item", source, index), out))

    def _module_item(self, container: Any, index: Any, source: Any) -> tuple[Any, Any]:
        d = object.__getattribute__(container, "__dict__")
        store = d["_parameters"] if isinstance(container, (self._torch.nn.ParameterList,
                                                           self._torch.nn.ParameterDict)) \
            else d["_modules"]
        keys = list(store)
        if type(index) is slice and type(container) in (self._torch.nn.ModuleList,
                                                       self._torch.nn.ParameterList):
            # `self.layers[:n]`: the modules themselves, each guarded on its source,
            # in a list (what the code then iterates, indexes or measures)
            if source is None:
                raise GraphBreak(Reason.UNSUPPORTED_VALUE,
                                 "a module container reached by no source")
            self._guard_store(container, source, store)
            picked = keys[index]
            for key in picked:
                item_source = ("attr", source, key)
                self.assumptions.append((item_source, store[key]))
                self.known.setdefault(id(store[key]), (store[key], item_source))
            return [store[k] for k in picked], None
        if isinstance(index, int) and not isinstance(index, bool) and \
                not isinstance(container, (self._torch.nn.ModuleDict, self._torch.nn.ParameterDict)):
            if not -len(keys) <= index < len(keys):
                raise GraphBreak(Reason.OP_FAILED, f"index {index} out of range")
            key = keys[index]
        elif isinstance(index, str) and index in store:
            key = index
        else:
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"{type(container).__name__}[{index!r}]")
        if source is None:
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, "a module container reached by no source")
        self._guard_store(container, source, store)
        return store[key], ("attr", source, key)

    def _guard_store(self, container: Any, source: Any, store: dict) -> None:
        name = "_parameters" if store is object.__getattribute__(
            container, "__dict__").get("_parameters") else "_modules"
        self.assumptions.append((("attr", source, name), store))

    def _dereference(self, ref: Any) -> Any:
        """``ref()`` of a weak reference the capture reached (the RNN modules' check that
        their flat weights are still their parameters): None, or the graph's input for a
        tensor it already reads (a guarded reference reaches one object while it lives)."""
        value = ref()
        if value is None:
            return None
        known = self._by_id.get(id(value))  # type: ignore[attr-defined]
        if known is not None and isinstance(value, self._torch.Tensor):
            return known[0]
        raise GraphBreak(Reason.UNSUPPORTED_CALL, f"calling a weak reference to a "
                         f"{type(value).__name__} the capture does not read otherwise")

    def truth(self, obj: Any) -> bool:
        """The truth of a known object, decided without running user code; of a size
        node, its truth for the example's sizes (guarded)."""
        torch = self._torch
        if isinstance(obj, self.node_type):
            if self.is_size(obj):
                return bool(self._specialize(obj))
            raise GraphBreak(Reason.DATA_DEPENDENT, "the truth of a tensor (Python branches on "
                             "its value)")
        if self._is_static(obj) or type(obj) in (tuple, list, dict, set, frozenset, range,
                                                 *_VIEWS, *_COLLECTIONS):
            return bool(obj)
        if isinstance(obj, torch.nn.Module):
            if isinstance(obj, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)):
                return len(object.__getattribute__(obj, "__dict__")["_modules"]) > 0
            cls = type(obj)
            if static_attr(cls, "__bool__")[0] is Attr.MISSING and \
                    static_attr(cls, "__len__")[0] is Attr.MISSING:
                return True
        elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type,
                              types.ModuleType)):
            return True
        elif _class_lookup(type(obj), "__bool__") is MISSING and \
                _class_lookup(type(obj), "__len__") is MISSING:
            return True   # an object whose class defines neither is true (a Logger)
        raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"the truth of a {type(obj).__name__}")

    def iterate(self, obj: Any, source: Any) -> tuple:
        """The elements of a known iterable as ``(element, source or None)`` pairs."""
        torch = self._torch
        if isinstance(obj, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ParameterList)):
            if source is None:
                raise GraphBreak(Reason.UNSUPPORTED_VALUE, "a module container reached by no source")
            d = object.__getattribute__(obj, "__dict__")
            store = d["_parameters"] if isinstance(obj, torch.nn.ParameterList) else d["_modules"]
            self._guard_store(obj, source, store)
            return tuple((v, ("attr", source, k)) for k, v in store.items())
        if isinstance(obj, torch.nn.ModuleDict):
            if source is None:
                raise GraphBreak(Reason.UNSUPPORTED_VALUE, "a module container reached by no source")
            store = object.__getattribute__(obj, "__dict__")["_modules"]
            self._guard_store(obj, source, store)
            return tuple((k, None) for k in store)
        if type(obj) in (tuple, list, torch.Size) or is_namedtuple_type(type(obj)):
            pairs = tuple((v, ("item", source, i) if source is not None and not
                           self._is_static(v) else None) for i, v in enumerate(obj))
            if source is not None:
                for i, (v, src) in enumerate(pairs):
                    if type(v) in (list, dict, set) or \
                            src is not None and not isinstance(v, torch.Tensor):
                        # where a loop's item is reached: a break in the loop reads it
                        # there on each call (an empty list is static, yet the program's)
                        self.known.setdefault(id(v), (v, ("item", source, i)))
            return pairs
        if type(obj) in (dict, str, set, frozenset, *_COLLECTIONS):
            if self._of_program(obj) and type(obj) is collections.deque:
                raise GraphBreak(Reason.UNSUPPORTED_VALUE, "iterating a deque of the program")
            return tuple((k, None) for k in obj)
        if type(obj) is range:
            if len(obj) > 10000:
                raise GraphBreak(Reason.UNSUPPORTED_VALUE, "a range longer than 10000")
            return tuple((i, None) for i in obj)
        if type(obj) in _VIEWS or (type(obj) in SAFE_ITERATORS and self.consumable(obj)):
            return tuple((v, None) for v in obj)
        if isinstance(obj, self.node_type):
            return tuple((row, None) for row in self._unbind(obj))
        raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"iterating over a {type(obj).__name__}")

    def format(self, value: Any, conversion: int, spec: Any) -> str:
        """A known value as an f-string formats it."""
        if not self._is_static(value) or (spec is not None and type(spec) is not str):
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"formatting a {type(value).__name__}")
        value = {1: str, 2: repr, 3: ascii}.get(conversion, lambda v: v)(value)
        return builtins.format(value, spec or "")
