"""The graph's output: what a captured frame can return, and how the graph makes it.

A frame's result leaves the graph as nodes, plain values and the tuples, lists and dicts
holding them; namedtuples, sets, OrderedDicts, defaultdicts and deques are made by call
nodes of their type (fx writes no literal for them); a list, dict or set the result holds
in two places is made once, so both places hold one object; where the entry puts back an
object of the program, the graph returns None in its place.  Part of ``GraphBuilder``
(agspeed/_graph.py).
"""

from __future__ import annotations

import builtins
import collections
from typing import Any

from agspeed._builder_types import GraphBreak, SymShape
from agspeed._checkpoint import outline
from agspeed._folds import holds_container
from agspeed._objects import bare_dict_subclass
from agspeed._sources import is_namedtuple_type
from agspeed.protocol import Reason

__all__ = ["Outputs"]

_REBUILT_DICTS = (collections.OrderedDict, collections.defaultdict)
# the containers an output holds as themselves: two places, one object
_MUTABLE_OUTPUTS = (list, dict, set, collections.deque, *_REBUILT_DICTS)


class Outputs:
    """The output half of ``GraphBuilder``."""

    def check_output(self, result: Any, placed: bool = True) -> None:
        """Raise GraphBreak unless ``result`` is made of nodes, plain values and
        tuples/lists/dicts of them (what a graph can return), or of objects of the
        program reached by a source where the entry can put them back (``placed``:
        through exact tuples, lists and dicts and the objects the frame made)."""
        if isinstance(result, self.node_type) or self._is_static(result):
            return
        if placed and self.put_back_as(result) is not None:
            return   # the caller's own object, put in the result after the graph
        if id(result) in self._escaping:   # (a graph's output is a tree, not a cycle)
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"returning a "
                             f"{type(result).__name__} that holds itself")
        self._escaping.add(id(result))
        try:
            self._check_parts(result, placed)
        finally:
            self._escaping.discard(id(result))

    def _check_parts(self, result: Any, placed: bool) -> None:
        if type(result) in (tuple, list) and not isinstance(result, SymShape):
            for v in result:
                self.check_output(v, placed)
            return
        if type(result) is SymShape or is_namedtuple_type(type(result)):
            for v in result:
                self.check_output(v, False)
            return
        if (type(result) in (dict, *_REBUILT_DICTS) or bare_dict_subclass(type(result))) and \
                all(self._is_static(k) for k in result):
            for v in result.values():
                self.check_output(v, placed and type(result) is dict)
            return
        if type(result) in (set, frozenset, collections.deque):
            for v in result:
                self.check_output(v, False)
            return
        if self.can_escape(result):
            for v in self.escape_parts(result):
                self.check_output(v, placed and self.is_owned(result))
            return
        raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"returning a {type(result).__name__}")

    def program_object(self, value: Any) -> bool:
        """Whether ``value`` is an object of the program (an argument, ``self``, a
        cache object passed in, a submodule) reached by a source: what the frame
        returns as itself.  The graph holds None in its place and the entry puts the
        object there, read through that source (``agspeed._effects``: ``_RESULT``)."""
        if type(value) is tuple and (holds_container(value) or not self._is_static(value)):
            # one holding the program's lists, dicts or objects: eager returns the
            # tuple itself, so those in it are the program's, not copies
            known = self.known.get(id(value))
            return known is not None and known[0] is value and \
                not any(isinstance(v, self.node_type) for v in value)
        if isinstance(value, (self.node_type, self._torch.Tensor)) or \
                self._is_static(value) or self.is_owned(value) or \
                type(value) in (tuple, list, dict, set, frozenset, slice):
            return False
        known = self.known.get(id(value))
        return known is not None and known[0] is value

    def output(self, result: Any) -> Any:
        """Finish the graph returning ``result`` (nodes, constants, tuples/lists/dicts)."""
        import torch.fx

        self.note_result(result)   # the program's own lists and dicts returned
        if self._plan is None:
            self.note_held(result)     # containers both written and returned: one each
        effects = self.has_effects   # (the plan: where the entry puts the program's
        # objects in the result, which need no identity)
        self.note_identity(result, skip=self._put_back)
        if effects:  # the values the writes store come out of the graph too
            result = (result, tuple(self.effect_values()))
            self.note_identity(result[1])
        result, template = self.numpy_output(result)
        self._twice = self._returned_twice(result)
        # the effects' values are no place the entry puts an object in
        built = (self._build_namedtuples(result[0]), self._build_namedtuples(result[1], False)) \
            if effects else self._build_namedtuples(result)
        self.graph.output(self.assumed_output(built))   # the tested tensors after it
        self._drop_unused_sizes()
        root = self._torch.nn.Module()
        outline(self.graph, root, self.checkpoint_regions)
        self.graph.lint()
        gm = torch.fx.GraphModule(root, self.graph)
        if template is not None:   # arrays leave the graph as tensors (agspeed._numpy)
            gm.meta["agspeed_numpy"] = template
        if self.assumed:   # the truths assumed, checked after the graph (agspeed._assume)
            gm.meta["agspeed_assumed"] = tuple(truth for _, truth in self.assumed)
            gm.meta["agspeed_assumed_rng"] = self.draws_from_cpu_generator()
        return gm

    def _drop_unused_sizes(self) -> None:
        """Erase size computations nothing uses (the tests behind resolved branches)."""
        for node in reversed(list(self.graph.nodes)):
            if not node.users and node.op in ("call_method", "call_function") and \
                    (self.is_size(node) or isinstance(node.meta.get("example_value"),
                                                      self._torch.Size)):
                self.graph.erase_node(node)

    def containers_in(self, value: Any) -> Any:
        """The lists, dicts and sets ``value`` holds (itself included), once for each
        place that holds one: through tuples, namedtuples and those containers, and the
        state of the objects the capture made; each container looked into once."""
        seen: set[int] = set()
        todo = [value]
        while todo:
            value = todo.pop()
            kind = type(value)
            if isinstance(value, self.node_type):
                continue
            mutable = kind in _MUTABLE_OUTPUTS or bare_dict_subclass(kind)
            if mutable:
                yield value
            if id(value) in seen:
                continue
            if mutable and isinstance(value, dict):
                seen.add(id(value))
                todo.extend(value.values())
            elif mutable or kind is tuple or is_namedtuple_type(kind):
                seen.add(id(value))
                todo.extend(value)
            elif self.is_owned(value):
                seen.add(id(value))
                todo.extend(self.escape_parts(value))

    def _returned_twice(self, result: Any) -> set:
        """The ids of the lists, dicts and sets ``result`` holds in more than one place
        (``return d, d``; a list and the dict holding it)."""
        once: set[int] = set()
        twice: set[int] = set()
        for value in self.containers_in(result):
            (twice if id(value) in once else once).add(id(value))
        return twice

    def _build_namedtuples(self, value: Any, placed: bool = True) -> Any:
        """``value`` with each namedtuple in it made by a call node of its class: fx
        writes an output literal by its repr, and a namedtuple's repr names a class that
        the generated code does not see (torch before 2.12).  A list, dict or set held in
        two places is made once, by a call node of its type, so both hold one object.
        Where the entry puts an object of the program (``placed``: reached through
        tuples, lists, dicts and the objects the frame made), the graph returns None."""
        if placed and id(value) in self._put_back:
            return None
        if id(value) in self._twice:   # (only containers, alive in the result)
            done = self._escaped.get(id(value))
            if done is None:
                done = self._escaped[id(value)] = self._build_once(value)
            return done
        if is_namedtuple_type(type(value)):
            return self.graph.call_function(
                type(value), tuple(self._build_namedtuples(v, False) for v in value))
        if type(value) in (SymShape, self._torch.Size):
            # fx would write a torch.Size constant as a plain tuple
            return self.graph.call_function(self._torch.Size, (tuple(value),))
        if type(value) in (tuple, list):
            return type(value)(self._build_namedtuples(v, placed) for v in value)
        if type(value) is dict:
            return {k: self._build_namedtuples(v, placed) for k, v in value.items()}
        if not isinstance(value, self.node_type) and self.can_escape(value):
            inner = placed and self.is_owned(value)
            return self.escape(value, lambda v: self._build_namedtuples(v, inner))
        return self._build_collection(value)

    def _build_once(self, value: Any) -> Any:
        """The call node making a list, dict or set that the result holds twice."""
        kind = type(value)
        if kind is list:
            return self.graph.call_function(list, ([self._build_namedtuples(v)
                                                    for v in value],))
        if kind is dict:
            return self.graph.call_function(dict, ({k: self._build_namedtuples(v)
                                                    for k, v in value.items()},))
        return self._build_collection(value)

    def _build_collection(self, value: Any) -> Any:
        """A set, OrderedDict, defaultdict or deque the capture built, made by a call node
        of its type (fx has no literal for them)."""
        kind = type(value)
        if kind in (set, frozenset):
            return self.graph.call_function(kind, ([self._build_namedtuples(v, False)
                                                    for v in value],))
        if kind is collections.deque:
            return self.graph.call_function(
                kind, ([self._build_namedtuples(v, False) for v in value],), {"maxlen": value.maxlen})
        if kind in _REBUILT_DICTS or bare_dict_subclass(kind):
            items = {k: self._build_namedtuples(v, False) for k, v in value.items()}
            if kind is collections.defaultdict:   # fx writes no literal for a type
                factory = getattr(value.default_factory, "__name__", "None")
                return self.graph.call_function(_defaultdict, (factory, items))
            return self.graph.call_function(kind, (items,))
        return value


def _defaultdict(factory: str, items: dict) -> collections.defaultdict:
    """A defaultdict the graph returns; its factory (a builtin type) by name."""
    return collections.defaultdict(getattr(builtins, factory, None), items)


_defaultdict.agspeed_rebuilds = collections.defaultdict  # type: ignore[attr-defined]
