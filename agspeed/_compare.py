"""Comparisons and membership the capture answers: ``a op b`` (``COMPARE_OP``,
``CONTAINS_OP``, ``IS_OP``'s neighbours) as a graph node for tensors, else a known bool,
with what it read of the program's containers guarded so the answer holds on every
call: a dict's key present or absent, a list's items, a set or list compared whole, a
ModuleDict's modules.  Part of ``GraphBuilder`` (agspeed/_graph.py), through
``agspeed._folds.Folds``.
"""

from __future__ import annotations

import operator
import os
from typing import Any

from agspeed._builder_types import GraphBreak
from agspeed._sources import MISSING, _class_lookup, compared_by_identity
from agspeed._stdlib import _VIEWS
from agspeed.protocol import Compare, Reason

__all__ = ["Comparisons"]

# builtin types whose __eq__ declines any type of another family (``{} == "a"`` compares
# identities): the family of each
_FAMILY = {dict: 1, list: 2, tuple: 3, str: 4, bytes: 5, set: 6, frozenset: 6,
           type(None): 7}
_KEYS_VIEW = type({}.keys())
_COMPARE = {Compare.LT: operator.lt, Compare.LE: operator.le, Compare.EQ: operator.eq,
            Compare.NE: operator.ne, Compare.GT: operator.gt, Compare.GE: operator.ge}


def _tensor_keyed(builder: Any, d: dict) -> bool:
    """Whether ``d`` is keyed by real tensors (a dict of the program), not by the
    capture's nodes."""
    return any(isinstance(k, builder._torch.Tensor) for k in d) or \
        builder.known.get(id(d), (None,))[0] is d


class Comparisons:
    """The comparison half of ``Folds``."""

    def _guard_membership(self, key: Any, container: Any) -> None:
        """``key in container`` for a container of the program: a dict's key guarded
        present (its value) or absent, a list's or tuple's items guarded."""
        known = self.known.get(id(container))  # type: ignore[attr-defined]
        if known is None or known[0] is not container or self._is_static(container):
            return
        source = known[1]
        if isinstance(container, dict) or container is os.environ:
            value = container.get(key, MISSING) if container is os.environ else \
                dict.get(container, key, MISSING)
            self.assumptions.append((("item", source, key), value))
        elif type(container) in (list, tuple):
            for i, v in enumerate(container):
                self.assumptions.append((("item", source, i), v))

    def compare(self, op: Compare, a: Any, b: Any) -> Any:
        """``a op b``: a graph node for tensors, else a known bool."""
        op = Compare(op)
        nodes = isinstance(a, self.node_type) or isinstance(b, self.node_type)
        if op in _COMPARE and nodes:
            return self.call_function(_COMPARE[op], (a, b))
        if self._sym_types and (self._has_size_node(a) or self._has_size_node(b)):
            # shapes compared as tuples: decided now, the ShapeEnv guards the answer
            a, b = self._specialize(a), self._specialize(b)
        if nodes and op in (Compare.IN, Compare.NOT_IN) and type(b) in (set, frozenset) and \
                isinstance(a, self.node_type):
            # a tensor hashes by identity: membership in a set of nodes is identity
            return (a in b) is (op is Compare.IN)
        if nodes and op in (Compare.IN, Compare.NOT_IN) and isinstance(a, self.node_type) \
                and isinstance(b, dict):
            # a tensor as a dict key: the capture's own dict is keyed by nodes; one of
            # the program's by the tensors themselves (``_tensor_key_get``)
            found = self._tensor_key_get("__contains__", (b, a), {}, 2) \
                if _tensor_keyed(self, b) else a in b
            return found is (op is Compare.IN)
        if nodes:
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"`{op.op}` with a tensor")
        if op in (Compare.IN, Compare.NOT_IN) and isinstance(b, self._torch.nn.ModuleDict) \
                and type(a) is str:
            found = self._module_dict_has(b, a)
            return found if op is Compare.IN else not found
        if op in (Compare.IN, Compare.NOT_IN):
            plain = type(b) in (tuple, list, dict, str, set, frozenset, range,
                                self._torch.Size, *_VIEWS) or \
                (isinstance(b, dict) and _class_lookup(type(b), "__contains__") is
                 dict.__contains__) or \
                (b is os.environ and type(a) is str)   # read as a dict, guarded
            if not (plain and (self._is_static(a) or self._enum_in(a, b)
                               or self._identity_in(a, b) or self._identity_key_in(a, b))):
                raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"`in` on a {type(b).__name__}")
            found = a in b
            self._guard_membership(a, b)
            return found if op is Compare.IN else not found
        if op in (Compare.EQ, Compare.NE) and _FAMILY.get(type(a), 0) and \
                _FAMILY.get(type(b), 0) and _FAMILY[type(a)] != _FAMILY[type(b)]:
            # builtin containers and strings of different kinds (a dict and a str): each
            # side's __eq__ declines the other, so Python compares identities
            return (a is b) is (op is Compare.EQ)
        if not (self._comparable(a, op) and self._comparable(b, op)):
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"comparing a {type(a).__name__} and a "
                             f"{type(b).__name__}")
        return _COMPARE[op](a, b)

    def _module_dict_has(self, container: Any, key: str) -> bool:
        """``key in container`` for a ModuleDict (its own ``__contains__``, a lookup in
        ``_modules``): the key guarded present, with its module, or absent."""
        torch = self._torch
        known = self.known.get(id(container))  # type: ignore[attr-defined]
        if _class_lookup(type(container), "__contains__") is not \
                torch.nn.ModuleDict.__contains__ or known is None or known[0] is not container:
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"`in` on a {type(container).__name__}")
        store = object.__getattribute__(container, "__dict__")["_modules"]
        self._guard_store(container, known[1], store)
        self.assumptions.append((("item", ("attr", known[1], "_modules"), key),
                                 dict.get(store, key, MISSING)))
        return key in store

    def _identity_in(self, a: Any, b: Any) -> bool:
        """Whether ``a in b`` is a question of identity the capture can answer: ``b`` a
        set the capture made (torch's ``named_modules`` keeps one of the modules seen), and
        ``a`` and every member either compared by identity (object's own ``__eq__`` and
        ``__hash__``) or a constant, so no program code runs to compare them."""
        if type(b) not in (set, frozenset) or id(b) in self.known:  # type: ignore[attr-defined]
            return False
        return compared_by_identity(a) and \
            all(compared_by_identity(v) or self._is_static(v) for v in b)

    def _identity_key_in(self, a: Any, b: Any) -> bool:
        """``a in b`` for a dict of the program (reached by a source) and a key that
        hashes and compares by identity (a class: registries keyed by type, as torch's
        pytree keeps): a lookup that runs no program code, guarded by the key's item."""
        if not isinstance(b, dict) or not compared_by_identity(a):
            return False
        known = self.known.get(id(b))  # type: ignore[attr-defined]
        return known is not None and known[0] is b

    def _enum_in(self, a: Any, b: Any) -> bool:
        """``a in b`` for a str or int enum member ``a`` and a tuple or list ``b`` of
        values compared the same way: no user code runs."""
        return type(b) in (tuple, list) and self._comparable(a, Compare.EQ) and \
            all(self._comparable(x, Compare.EQ) for x in b)

    def _comparable(self, value: Any, op: Any) -> bool:
        if self._is_static(value):
            return True
        if type(value) is _KEYS_VIEW:   # compared as a set of its (plain) keys
            return all(self._is_static(k) for k in value)
        kind = type(value)
        if op in (Compare.EQ, Compare.NE) and any(
                isinstance(value, base) and kind.__eq__ is base.__eq__ and
                kind.__ne__ is base.__ne__ for base in (str, int, float, bytes)):
            return True  # a str or int enum (`class Action(str, Enum)`): the base compares
        if kind in (list, tuple, set, frozenset, dict) and self._plain_contents(value, 0):
            self._guard_contents(value)
            return True   # containers of plain values compare as their values do
        return kind.__eq__ is object.__eq__  # identity comparison, no user code

    def _plain_contents(self, value: Any, depth: int) -> bool:
        """Whether a builtin container holds only plain values, and containers of them
        that the capture made itself (the program's nested ones would need guards)."""
        if depth > 16:
            return False
        parts = (*value.keys(), *value.values()) if type(value) is dict else value
        return all(self._is_static(v) or type(v) in (list, tuple, set, frozenset, dict)
                   and not self._of_program(v) and self._plain_contents(v, depth + 1)
                   for v in parts)  # type: ignore[attr-defined]

    def _guard_contents(self, value: Any) -> None:
        """A container of the program compared: guarded whole (a dict by its length
        and each item), so the comparison's answer holds on every call."""
        known = self.known.get(id(value))  # type: ignore[attr-defined]
        if known is None or known[0] is not value or self._is_static(value):
            return
        self.assumptions.append((known[1], value))  # type: ignore[attr-defined]
        if type(value) is dict:
            for k, v in value.items():
                self.assumptions.append((("item", known[1], k), v))  # type: ignore
