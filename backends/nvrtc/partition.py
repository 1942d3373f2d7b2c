"""Fusible groups of an aten graph, and the graph that runs them as kernels.

``groups(gm)`` walks the graph once, in order, and puts each fusible node (lower.py) in
the group of one of its producers when it fits there, else in a new group:

* a POINTWISE group has one *space*, the shape every member has; operands from outside
  broadcast into it (read through strides, 0 along a broadcast dimension);
* a reduction over the trailing dimensions of a value of the space's shape turns the
  group into a ROWS group (or starts one): its members are then *element* values (of the
  space's shape) or *row* values (the reduction's shape, kept dimensions or not). An
  element op may use a row value only with its dimensions kept (so that it broadcasts
  along the row); a row op takes no operand from outside;
* a node joins a group only if none of its operands from outside depends on the group:
  the groups and the remaining nodes stay acyclic, so the graph can run them in order.

``rewrite(gm, groups, make_kernel)`` returns a new GraphModule where each group is one
call, ``make_kernel(description, plan)`` giving its callable, and the other nodes run
as before through aten.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from typing import Any, Callable

from agspeed.backends.nvrtc import lower
from agspeed.protocol import KernelKind, KernelOp as K, KernelType as T

__all__ = ["Group", "groups", "rewrite", "describe"]


def _shape(node: Any) -> tuple | None:
    val = getattr(node, "meta", {}).get("val")
    if val is None or not hasattr(val, "shape") or not hasattr(val, "dtype"):
        return None
    return tuple(d.node.expr if hasattr(d, "node") else int(d) for d in val.shape)


def _is_tensor_node(x: Any) -> bool:
    return hasattr(x, "op") and _shape(x) is not None


class Group:
    """Nodes computed by one kernel."""

    _ids = itertools.count()

    def __init__(self, space: tuple, nred: int) -> None:
        self.id = next(self._ids)
        self.space, self.nred = space, nred
        self.nodes: list = []

    @property
    def outer(self) -> int:
        return len(self.space) - self.nred

    def rows(self) -> tuple[tuple, tuple]:
        """The two shapes of a row value: dimensions kept, and dropped."""
        kept = self.space[:self.outer] + (1,) * self.nred
        return kept, self.space[:self.outer]

    def place(self, shape: tuple) -> str | None:
        """"element", "row" or "row_kept" for a member of ``shape``; None if none fits."""
        if shape == self.space:
            return "element"
        if self.nred:
            kept, dropped = self.rows()
            if shape == kept:
                return "row_kept"
            if shape == dropped:
                return "row"
        return None


def _operands(node: Any) -> list:
    return [a for a in node.all_input_nodes]


def _scalar_ok(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) or _is_tensor_node(x) or x is None


def _fits(group: Group, node: Any, group_of: dict) -> bool:
    """Whether pointwise ``node`` can be computed in ``group``."""
    place = group.place(_shape(node))
    if place is None:
        return False
    for a in node.args:
        if not _scalar_ok(a):
            return False
        if not _is_tensor_node(a):
            continue
        inside = group_of.get(a) is group
        if place != "element":          # a row op: only row values of the group
            if not inside or group.place(_shape(a)) not in ("row", "row_kept"):
                return False
            if group.place(_shape(a)) != place and _shape(a) != ():
                return False
        elif inside and group.place(_shape(a)) == "row":
            return False                # would broadcast along the wrong dimension
    return True


def groups(gm: Any) -> list[Group]:
    """The fusible groups of ``gm``'s graph, in the order their first nodes appear."""
    group_of: dict = {}
    upstream: dict = {}   # node -> ids of the groups it depends on
    found: list[Group] = []
    for node in gm.graph.nodes:
        ups: set = set()
        for o in _operands(node):
            ups |= upstream.get(o, set())
            if o in group_of:
                ups.add(group_of[o].id)
        upstream[node] = ups
        chosen = _choose(node, group_of, upstream)
        if chosen is None:
            continue
        if chosen == "new":
            chosen = _new_group(node)
            if chosen is None:
                continue
            found.append(chosen)
        chosen.nodes.append(node)
        group_of[node] = chosen
    return [g for g in found if g.nodes]


def _acyclic(group: Group, node: Any, group_of: dict, upstream: dict) -> bool:
    return all(group.id not in upstream.get(o, set())
               for o in _operands(node) if group_of.get(o) is not group)


def _choose(node: Any, group_of: dict, upstream: dict) -> Any:
    """The group ``node`` joins, "new", or None when it is not fused."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:      # var_mean's two results
        src = node.args[0]
        return group_of.get(src) if src in group_of else None
    red = lower.reduction_of(node)
    if red is None and not lower.fusible(node):
        return None
    candidates = [group_of[o] for o in _operands(node) if o in group_of]
    for g in dict.fromkeys(candidates):
        if not _acyclic(g, node, group_of, upstream):
            continue
        if red is not None:
            kop, nred, x = red
            if _shape(x) == g.space and g.nred in (0, nred) \
                    and (group_of.get(x) is not g or g.place(_shape(x)) == "element"):
                g.nred = nred
                return g
        elif _fits(g, node, group_of):
            return g
    return "new"


def _new_group(node: Any) -> Group | None:
    red = lower.reduction_of(node)
    if red is not None:
        return Group(_shape(red[2]), red[1])
    if node.target is operator.getitem:
        return None
    if any(_is_tensor_node(a) and _shape(a) != _shape(node) and
           not _broadcasts(_shape(a), _shape(node)) for a in node.args):
        return None
    return Group(_shape(node), 0)


def _broadcasts(small: tuple, space: tuple) -> bool:
    if len(small) > len(space):
        return False
    return all(s == 1 or s == b for s, b in zip(reversed(small), reversed(space)))


# ---- descriptions ----------------------------------------------------------------------

class Plan:
    """How a group's kernel is called: its inputs (nodes), its outputs (nodes, and for
    each its place), and the group's space."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self.inputs: list = []
        self.outputs: list = []     # (node, place)


def describe(group: Group, name: str) -> tuple[tuple, Plan]:
    """The kernel description of ``group`` and how to call it."""
    import torch

    k = lower.Kernel()
    plan = Plan(group)
    values: dict = {}
    members = set(group.nodes)

    def operand(a: Any) -> Any:
        if a in values:
            return values[a]
        if _is_tensor_node(a):
            storage = lower.storage_of(a.meta["val"].dtype)
            strided = _shape(a) != group.space or not _contiguous(a)
            return k.load(a, storage, strided)
        return a

    for node in group.nodes:
        if node.target is operator.getitem:
            values[node] = values[node.args[0]][node.args[1]]
            continue
        red = lower.reduction_of(node)
        if red is not None:
            values[node] = _reduce(k, node, red, operand(red[2]), group)
            continue
        args = [operand(a) for a in node.args]
        values[node] = lower.lowering(node.target)(k, node, *args)
    for node in group.nodes:
        outside = [u for u in node.users if u not in members]
        if outside and type(values[node]) is not tuple:   # not var_mean's pair
            plan.outputs.append((node, group.place(_shape(node))))
    plan.inputs = [src for src, _, _ in k.inputs]
    outs = []
    for node, place in plan.outputs:
        storage = lower.storage_of(node.meta["val"].dtype)
        strided = place == "element" and not _contiguous(node)
        outs.append((values[node].index, storage, int(strided)))
    kind = KernelKind.ROWS if group.nred else KernelKind.POINTWISE
    desc = (name, int(kind), len(group.space), group.nred,
            tuple((int(st), int(s)) for _, st, s in k.inputs), tuple(k.ops), tuple(outs))
    del torch
    return desc, plan


def _contiguous(node: Any) -> bool:
    val = node.meta["val"]
    try:
        return bool(val.is_contiguous())
    except Exception:  # noqa: BLE001 - a symbolic layout it cannot decide
        return False


def _count(group: Group) -> int:
    n = 1
    for d in group.space[group.outer:]:
        n *= int(d)
    return n


def _reduce(k: lower.Kernel, node: Any, red: tuple, x: Any, group: Group) -> Any:
    kop, _, _ = red
    kt = T.F64 if x.ktype == T.F64 else T.F32
    x = k.cast(x, kt)
    if kop >= 0:
        out = k.emit(kop, kt, x)
        return k.cast(out, lower.ktype_of(node.meta["val"].dtype))
    n = _count(group)
    mean = k.emit(K.MUL, kt, k.emit(K.SUM, kt, x), k.const(1.0 / n, kt))
    if kop == -2:
        return mean
    correction = node.kwargs.get("correction", 1)
    centred = k.emit(K.SUB, kt, x, mean)
    squares = k.emit(K.SUM, kt, k.emit(K.MUL, kt, centred, centred))
    var = k.emit(K.MUL, kt, squares, k.const(1.0 / max(n - correction, 0) if
                                             n - correction > 0 else float("nan"), kt))
    return (var, mean)


# ---- the rewritten graph ---------------------------------------------------------------

def rewrite(gm: Any, found: list[Group], make_kernel: Callable[[tuple, Plan], Any]) -> Any:
    """A GraphModule computing what ``gm`` does, each group of ``found`` one call of
    ``make_kernel(description, plan)``'s callable (which takes the plan's inputs and
    returns its outputs)."""
    import torch.fx

    group_of = {n: g for g in found for n in g.nodes}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    plans = {}
    for g in found:
        desc, plan = describe(g, f"ags_fused_{len(plans)}")
        plans[g.id] = (make_kernel(desc, plan), plan)
    units: dict = {}   # unit key -> (first position, nodes or group)
    for n in gm.graph.nodes:
        g = group_of.get(n)
        key = ("g", g.id) if g is not None else ("n", n)
        if key not in units:
            units[key] = (order[n], g if g is not None else n)
    deps: dict = {key: set() for key in units}
    users: dict = {key: set() for key in units}
    for key, (_, unit) in units.items():
        nodes = unit.nodes if isinstance(unit, Group) else [unit]
        for n in nodes:
            for o in _operands(n):
                g = group_of.get(o)
                src = ("g", g.id) if g is not None else ("n", o)
                if src != key:
                    deps[key].add(src)
                    users[src].add(key)
    ready = [(units[k][0], i, k) for i, k in enumerate(units) if not deps[k]]
    heapq.heapify(ready)
    tie = itertools.count(len(units))
    graph = torch.fx.Graph()
    env: dict = {}
    while ready:
        _, _, key = heapq.heappop(ready)
        unit = units[key][1]
        if isinstance(unit, Group):
            fn, plan = plans[unit.id]
            call = graph.call_function(fn, tuple(env[i] for i in plan.inputs))
            for j, (node, _) in enumerate(plan.outputs):
                env[node] = graph.call_function(operator.getitem, (call, j))
                env[node].meta = dict(node.meta)
        else:
            env[unit] = graph.node_copy(unit, lambda a: env[a])
        for user in users[key]:
            deps[user].discard(key)
            if not deps[user]:
                heapq.heappush(ready, (units[user][0], next(tie), user))
    out = torch.fx.GraphModule(gm, graph)
    return out
