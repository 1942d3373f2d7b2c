"""Fusible groups of an aten graph, and the graph that runs them as kernels.

``groups(gm)`` walks the graph once, in order, and puts each fusible node (lower.py) in
the group of one of its producers when it fits there, else in a new group:

* a POINTWISE group has one *space*, the shape every member has; operands from outside
  broadcast into it (read through strides, 0 along a broadcast dimension);
* a reduction over the trailing dimensions of a value of the space's shape turns the
  group into a ROWS group (or starts one): its members are then *element* values (of the
  space's shape) or *row* values (the reduction's shape, kept dimensions or not). An
  element op may use a row value only with its dimensions kept (so that it broadcasts
  along the row); a row op takes row values of the group, or operands from outside of
  its own shape, read once a row (a statistic the forward saved); a POINTWISE group
  computing in a row shape of a ROWS group joins it as row ops where they fit;
* a sum over the leading dimensions of an element value (a norm's weight gradient, a
  bias gradient) joins that value's group, or the group of one of its readers, as
  *column sums* where the rows left are known to take the warp path (``_takes_columns``),
  turning a POINTWISE group into a ROWS group whose rows are the dimensions left; it is
  an output only, which no member may use (it is complete only when the kernel is);
* a node joins a group only if none of its operands from outside depends on the group:
  the groups and the remaining nodes stay acyclic, so the graph can run them in order.

``rewrite(gm, groups, make_kernel)`` returns a new GraphModule where each group is one
call, ``make_kernel(description, plan)`` giving its callable, and the other nodes run
as before through aten.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import operator
import os
from typing import Any, Callable

from agspeed import _C
from agspeed.backends.nvrtc import lower
from agspeed.protocol import KernelKind, KernelOp as K, KernelType as T

__all__ = ["Group", "groups", "rewrite", "describe", "column_sums"]

# Whether sums over the leading dimensions join row kernels as column sums (else they
# run through aten); benchmarks/nvrtc.py turns it off to measure what they save.
column_sums = True


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
        self.columns: set = set()   # members that are column sums

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
    """Whether argument ``x`` of a fusible node leaves it fusible in a group: a scalar,
    a tensor, None, a dtype (a conversion's target, which lower.py reads from the node's
    value), or constant sizes (an expand's, which its value's shape says too)."""
    import torch

    if isinstance(x, (list, tuple)):
        return all(type(d) is int for d in x)
    return isinstance(x, (bool, int, float, torch.dtype)) or _is_tensor_node(x) or x is None


def _row_read(a: Any, node: Any) -> bool:
    """Whether row op ``node`` can read ``a`` from outside its group once a row: ``a``
    has the op's own (row) shape and a type kernels hold."""
    return _shape(a) == _shape(node) and lower.storage_of(a.meta["val"].dtype) is not None


def _fits(group: Group, node: Any, inside_of: Callable[[Any], bool]) -> bool:
    """Whether pointwise ``node`` can be computed in ``group``, whose members are those
    for which ``inside_of`` is true."""
    place = group.place(_shape(node))
    if place is None:
        return False
    for a in node.args:
        if not _scalar_ok(a):
            return False
        if not _is_tensor_node(a):
            continue
        inside = inside_of(a)
        if inside and a in group.columns:
            return False                # complete only once the kernel is
        if place != "element":          # a row op: row values of the group, row reads
            if not inside:
                if not _row_read(a, node):
                    return False
                continue
            if group.place(_shape(a)) not in ("row", "row_kept"):
                return False
            if group.place(_shape(a)) != place and _shape(a) != ():
                return False
        elif inside and group.place(_shape(a)) == "row":
            return False                # would broadcast along the wrong dimension
    return True


class _State:
    """The grouping so far: each node's group, and what each node and group depends on
    (the groups upstream of it, through any path), kept as sets shared by reference so
    that a group's grows as members join."""

    def __init__(self) -> None:
        self.group_of: dict = {}
        self.upstream: dict = {}    # ungrouped node -> set of groups (maybe merged away)
        self.gdeps: dict = {}       # group id -> set of groups its members depend on
        self.into: dict = {}        # id of a group merged away -> the group it joined
        self.pos: dict = {}

    def resolve(self, g: Group) -> Group:
        while g.id in self.into:
            g = self.into[g.id]
        return g

    def group(self, node: Any) -> Group | None:
        g = self.group_of.get(node)
        return None if g is None else self.resolve(g)

    def deps(self, node: Any) -> set:
        g = self.group(node)
        return self.gdeps[g.id] if g is not None else self.upstream.get(node, set())

    def depends(self, node: Any, g: Group) -> bool:
        """Whether ``node`` (or the group it is in) depends on group ``g``."""
        return any(self.resolve(h) is g for h in self.deps(node))

    def reach(self, node: Any) -> set:
        """The groups ``node`` needs: those of its operands and theirs."""
        out: set = set()
        for o in _operands(node):
            out |= self.deps(o)
            if self.group(o) is not None:
                out.add(self.group(o))
        return out

    def join(self, g: Group, node: Any) -> None:
        g.nodes.append(node)
        self.group_of[node] = g
        self.gdeps.setdefault(g.id, set()).update(
            h for h in self.reach(node) if self.resolve(h) is not g)

    def acyclic(self, g: Group, node: Any) -> bool:
        """Whether ``node`` can join ``g``: none of its operands from outside needs g."""
        return all(not self.depends(o, g) for o in _operands(node) if self.group(o) is not g)

    def merge(self, a: Group, b: Group) -> bool:
        """Puts ``b``'s nodes in ``a`` when both compute in one space and neither
        reaches the other through nodes outside them; whether it did."""
        if a is b:
            return False
        space, nred = a.space, a.nred or b.nred
        if a.space != b.space:          # a POINTWISE group in a row shape of the other
            if a.nred and not b.nred and b.space in a.rows():
                nred = a.nred
            elif b.nred and not a.nred and a.space in b.rows():
                space, nred = b.space, b.nred
            else:
                return False
        elif a.nred and b.nred and a.nred != b.nred:
            return False
        if any(self.depends(o, b) for m in a.nodes for o in _operands(m)
               if self.group(o) not in (a, b)) or \
                any(self.depends(o, a) for m in b.nodes for o in _operands(m)
                    if self.group(o) not in (a, b)):
            return False
        members = set(a.nodes) | set(b.nodes)
        trial = Group.__new__(Group)
        trial.space, trial.nred = space, nred
        trial.columns = a.columns | b.columns
        if not all(_fits_merged(trial, m, members) for m in members):
            return False
        a.space, a.nred = space, nred
        a.columns = trial.columns
        a.nodes = sorted(a.nodes + b.nodes, key=self.pos.__getitem__)
        self.into[b.id] = a
        self.gdeps[a.id] = {h for h in self.gdeps[a.id] | self.gdeps.pop(b.id, set())
                            if self.resolve(h) is not a}
        b.nodes = []
        return True


def groups(gm: Any) -> list[Group]:
    """The fusible groups of ``gm``'s graph, in the order their first nodes appear (sums
    over views first rewritten by ``_sums_through_views``)."""
    if column_sums:
        _sums_through_views(gm)
    st = _State()
    found: list[Group] = []
    for i, node in enumerate(gm.graph.nodes):
        st.pos[node] = i
        chosen = _choose(node, st)
        if chosen is None:
            st.upstream[node] = st.reach(node)
            continue
        if chosen == "new":
            chosen = _new_group(node)
            if chosen is None:
                st.upstream[node] = st.reach(node)
                continue
            found.append(chosen)
        st.join(chosen, node)
        # the node's other producers' groups, where they fit, become one kernel with it
        for o in _operands(node):
            other = st.group(o)
            if other is not None and other is not chosen and lower.reduction_of(node) is None:
                st.merge(chosen, other)
    found = [g for g in found if g.nodes]
    _merge_siblings(found, st)
    return _without_cycles(gm, [g for g in found if g.nodes])


def _sums_through_views(gm: Any) -> None:
    """Rewrites in place each sum over the leading dimensions of a view that keeps the
    trailing ones (``sum(view(g, [B * T, C]), [0], True)``: a linear layer's bias
    gradient) as the sum of the view's source over its own leading dimensions
    (``sum(g, [0, 1])``, viewed as (1, C) where the dimensions were kept), the same
    values, so that it can join the kernel computing ``g`` as column sums; the view
    stays for its other users.  A keepdim sum of a symbolic shape is left as it is."""
    import torch

    aten = torch.ops.aten
    views = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
    changed = False
    for node in list(gm.graph.nodes):
        col = lower.column_sum_of(node)
        if col is None:
            continue
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if keep and not all(type(d) is int for d in _shape(node)):
            continue
        nlead, view = col
        if view.op != "call_function" or view.target not in views \
                or not _is_tensor_node(view.args[0]):
            continue
        source, inner = view.args[0], _shape(view)[nlead:]
        lead = len(_shape(source)) - len(inner)
        if lead < 1 or _shape(source)[lead:] != inner:
            continue
        with gm.graph.inserting_after(node):
            total = gm.graph.call_function(aten.sum.dim_IntList, (source, list(range(lead))))
        total.meta = dict(node.meta)
        if keep:    # (1, C) from (C,)
            total.meta["val"] = node.meta["val"].reshape(inner)
            with gm.graph.inserting_after(total):
                kept = gm.graph.call_function(aten.view.default, (total, list(_shape(node))))
            kept.meta = dict(node.meta)
        node.replace_all_uses_with(kept if keep else total)
        gm.graph.erase_node(node)
        if not view.users:
            gm.graph.erase_node(view)
        changed = True
    if changed:
        gm.recompile()


def _merge_siblings(found: list[Group], st: _State) -> None:
    """Groups that read the same input and fit together become one kernel: the input
    is read once, and one launch does both."""
    readers: dict = {}
    for g in found:
        for n in g.nodes:
            for o in _operands(n):
                if st.group(o) is None:
                    readers.setdefault(o, []).append(g)
    for gs in readers.values():
        live = list(dict.fromkeys(st.resolve(g) for g in gs))
        for g in live[1:]:
            if g.nodes and st.resolve(g) is g:
                st.merge(st.resolve(live[0]), g)


def _units(gm: Any, found: list[Group]) -> tuple[dict, dict, dict]:
    """The graph of units (a group, or a node of no group): each unit's position, the
    units it needs and the units that need it."""
    group_of = {n: g for g in found for n in g.nodes}
    units: dict = {}
    for i, n in enumerate(gm.graph.nodes):
        g = group_of.get(n)
        key = ("g", g.id) if g is not None else ("n", n)
        units.setdefault(key, (i, g if g is not None else n))
    deps: dict = {key: set() for key in units}
    users: dict = {key: set() for key in units}
    for key, (_, unit) in units.items():
        for n in (unit.nodes if isinstance(unit, Group) else [unit]):
            for o in _operands(n):
                g = group_of.get(o)
                src = ("g", g.id) if g is not None else ("n", o)
                if src != key:
                    deps[key].add(src)
                    users[src].add(key)
    return units, deps, users


def _order(units: dict, deps: dict, users: dict) -> list:
    """The units in an order where each comes after what it needs (earliest first);
    those left out are on a cycle or after one."""
    waiting = {k: len(v) for k, v in deps.items()}
    ready = [(units[k][0], i, k) for i, k in enumerate(units) if not waiting[k]]
    heapq.heapify(ready)
    tie = itertools.count(len(units))
    order = []
    while ready:
        _, _, key = heapq.heappop(ready)
        order.append(key)
        for user in users[key]:
            waiting[user] -= 1
            if not waiting[user]:
                heapq.heappush(ready, (units[user][0], next(tie), user))
    return order


def _without_cycles(gm: Any, found: list[Group]) -> list[Group]:
    """``found`` less the groups that a cycle through nodes outside them would make
    impossible to run in order (their nodes then run through aten)."""
    while True:
        units, deps, users = _units(gm, found)
        done = set(_order(units, deps, users))
        stuck = {key[1] for key in units if key not in done and key[0] == "g"}
        if not stuck:
            return found
        found = [g for g in found if g.id not in stuck]


def _fits_merged(group: Group, node: Any, members: set) -> bool:
    """Whether ``node`` still has its place in ``group`` made of ``members``."""
    if node.target is operator.getitem:
        return True
    if node in group.columns:
        nlead, x = lower.column_sum_of(node)
        return (x in members or any(u in members for u in x.users if u is not node)) \
            and _takes_columns(group, x, nlead)
    red = lower.reduction_of(node)
    if red is not None:
        x = red[2]
        return _shape(x) == group.space and red[1] == group.nred \
            and (x not in members or group.place(_shape(x)) == "element")
    return _fits(group, node, members.__contains__)


def _choose(node: Any, st: _State) -> Any:
    """The group ``node`` joins, "new", or None when it is not fused."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:      # var_mean's two results
        return st.group(node.args[0])
    col = lower.column_sum_of(node) if column_sums else None
    if col is not None:     # only in the group of its input, or of one reading it
        nlead, x = col
        for g in dict.fromkeys([st.group(x)] + [st.group(u) for u in x.users]):
            if g is not None and st.acyclic(g, node) and _takes_columns(g, x, nlead):
                g.nred = len(g.space) - nlead
                g.columns.add(node)
                return g
        return None
    red = lower.reduction_of(node)
    if red is None and not lower.fusible(node):
        return None
    candidates = [st.group(o) for o in _operands(node) if st.group(o) is not None]
    for g in dict.fromkeys(candidates):
        if not st.acyclic(g, node):
            continue
        if red is not None:
            kop, nred, x = red
            if _shape(x) == g.space and g.nred in (0, nred) \
                    and (st.group(x) is not g or g.place(_shape(x)) == "element"):
                g.nred = nred
                return g
        elif _fits(g, node, lambda a, g=g: st.group(a) is g):
            return g
    return "new"


def _takes_columns(group: Group, x: Any, nlead: int) -> bool:
    """Whether ``group`` can add up its element value ``x`` over its ``nlead`` leading
    dimensions: its rows are then the dimensions left, as its reductions' are, of a
    static length up to ``NVRTC_COLUMN_COLS``, whose sums a thread keeps in registers
    (the warp path's up to 1024, the block path's beyond).  Longer rows (or rows of a
    symbolic length) leave the sum to aten.  On an H100 the sums in registers made
    residual+LayerNorm's step 1.28-1.34x faster over rows of 1024; kept in the slots'
    rows of memory instead (read and written back at every row), 1.34-1.36x slower over
    rows of 4096 (benchmarks/nvrtc.py --column-sums-ab), which is why the block path
    keeps them in registers too."""
    cols = 1
    for d in group.space[nlead:]:
        if not isinstance(d, int):
            return False
        cols *= d
    return _shape(x) == group.space and cols <= _C.NVRTC_COLUMN_COLS \
        and (group.nred == 0 or group.outer == nlead)


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

    def operand(a: Any, row_op: bool = False) -> Any:
        if a in values:
            return values[a]
        if _is_tensor_node(a):
            storage = lower.storage_of(a.meta["val"].dtype)
            return k.load(a, storage, _PER_ROW if row_op else _read_as(a, group))
        return a

    for node in group.nodes:
        if node.target is operator.getitem:
            values[node] = values[node.args[0]][node.args[1]]
            continue
        if node in group.columns:           # an output alone (below)
            continue
        red = lower.reduction_of(node)
        if red is not None:
            values[node] = _as_stored(k, node, _reduce(k, node, red, operand(red[2]), group))
            continue
        row_op = group.place(_shape(node)) in ("row", "row_kept")
        args = [operand(a, row_op) for a in node.args]
        values[node] = _as_stored(k, node, lower.lowering(node.target)(k, node, *args))
    for node in group.nodes:
        if node in group.columns:
            keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
            plan.outputs.append((node, "columns_kept" if keep else "columns"))
            x = operand(lower.column_sum_of(node)[1])
            values[node] = k.cast(x, T.F64 if x.ktype == T.F64 else T.F32)
            continue
        outside = [u for u in node.users if u not in members]
        if outside and type(values[node]) is not tuple:   # not var_mean's pair
            plan.outputs.append((node, group.place(_shape(node))))
    plan.inputs = [src for src, _, _ in k.inputs]
    outs = []
    for node, place in plan.outputs:
        if place.startswith("columns"):     # sums in the compute type, over slots
            outs.append((values[node].index, values[node].ktype, _COLUMNS))
            continue
        storage = lower.storage_of(node.meta["val"].dtype)
        if place != "element":
            flag = _ROW_OUT
        else:
            flag = _CONTIGUOUS if _contiguous(node) else _STRIDED
        outs.append((values[node].index, storage, flag))
    kind = KernelKind.ROWS if group.nred else KernelKind.POINTWISE
    # where the sizes are static, a row's length (the warp path's arrays and loops for
    # that length, or no warp path past it: codegen_rows.c), or a pointwise kernel's
    # element count (32-bit index divisions where it allows)
    inner = group.space[group.outer:] if group.nred else group.space
    cols = math.prod(inner) if all(isinstance(d, int) for d in inner) else 0
    desc = (name, int(kind), len(group.space), group.nred,
            tuple((int(st), int(s)) for _, st, s in k.inputs), tuple(k.ops), tuple(outs),
            cols)
    del torch
    return desc, plan


# How a kernel reads an input (kernel.h): at the element's linear index, through
# strides, or as a row (the same for every row, contiguous along it)
_CONTIGUOUS, _STRIDED, _ROW = 0, 1, 2
_PER_ROW = 3     # once a row, at the row's index (a row op's operand from outside)
_ROW_STRIDED = 4     # once a row, through its strides over the rows' dimensions
# Where it writes an output: at each element as an input is read (0 and 1), as column
# sums, or once a row, at the row's index (a row value: a norm's mean)
_COLUMNS, _ROW_OUT = 2, 3


def _read_as(a: Any, group: Group) -> int:
    """How group's kernel reads input ``a``: contiguous when it has the space's shape
    and layout; in a ROWS group, once a row when it has a row value's shape with the
    dimensions kept (a saved mean or rstd: (rows, 1)), and as a row when it is one
    contiguous row broadcast over the others (a norm's weight: (cols,) or (1, cols)
    against (rows, cols)); once a row through its strides when it is the same along
    every reduced dimension (a batch norm's (1, C, 1, 1) weight in a sum over H and
    W: its row value loaded once, not its index worked out at each element); else
    through its strides."""
    shape = _shape(a)
    if not _contiguous(a):
        return _ROW_STRIDED if _same_along_rows(shape, group) else _STRIDED
    if shape == group.space:
        return _CONTIGUOUS
    if group.nred and shape == group.rows()[0]:
        return _PER_ROW     # one value a row, dimensions kept: it broadcasts along it
    inner = group.space[group.outer:]
    if group.nred and len(shape) >= len(inner) and shape[len(shape) - len(inner):] == inner \
            and all(d == 1 for d in shape[:len(shape) - len(inner)]):
        return _ROW
    return _ROW_STRIDED if _same_along_rows(shape, group) else _STRIDED


def _same_along_rows(shape: tuple | None, group: Group) -> bool:
    """Whether an operand of ``shape`` (aligned at the right with the space) is 1, or
    absent, along every reduced dimension of ``group``, so one value serves a row."""
    if not group.nred or shape is None or len(shape) > len(group.space):
        return False
    return all(d == 1 for d in shape[max(0, len(shape) - group.nred):])


def _as_stored(k: lower.Kernel, node: Any, v: Any) -> Any:
    """``node``'s value ``v`` rounded to the node's fp16 or bf16 type, as eager's tensor
    of it holds it (the kernel computes in fp32 between nodes); unchanged where it is
    already exact: another type, a load, a rounding."""
    if not isinstance(v, lower.Value):      # var_mean's pair
        return v
    storage = lower.storage_of(node.meta["val"].dtype)
    if storage not in (T.F16, T.BF16) \
            or v.ktype == storage or k.ops[v.index][0] == int(K.LOAD):
        return v
    return lower.rounded(k, v, storage)


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

def content_name(desc: tuple) -> str:
    """The kernel's name made from the rest of its description: groups that compute the
    same thing on the same layout get one source, so NVRTC compiles it once (a CNN's
    blocks, a transformer's layers) and the disk cache serves it to every graph that
    has it.  The kind is in the name, for profiles."""
    body = repr(tuple(desc[1:])).encode()
    kind = "rows" if desc[1] == int(KernelKind.ROWS) else "pointwise"
    return f"ags_{kind}_{hashlib.blake2b(body, digest_size=8).hexdigest()}"


def _made(found: list[Group], make_kernel: Callable[[tuple, Plan], Any]) -> list:
    """(kernel, plan) of each group, or the exception that stopped it.  The kernels are
    made on a few threads at once, since NVRTC compiles without holding the GIL; row
    kernels, which take several times a pointwise one's compile, start first."""
    from concurrent.futures import ThreadPoolExecutor

    def make(g: Group) -> Any:
        try:
            desc, plan = describe(g, "ags_fused")
            desc = (content_name(desc),) + tuple(desc[1:])
            return make_kernel(desc, plan), plan
        except Exception as exc:  # noqa: BLE001 - that group runs through aten
            return exc

    if len(found) < 2:
        return [make(g) for g in found]
    order = sorted(range(len(found)), key=lambda i: found[i].nred == 0)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        made = dict(zip(order, pool.map(make, [found[i] for i in order])))
    return [made[i] for i in range(len(found))]


def rewrite(gm: Any, found: list[Group], make_kernel: Callable[[tuple, Plan], Any],
            refused: Callable[[Group, Exception], None] | None = None) -> Any:
    """A GraphModule computing what ``gm`` does, each group of ``found`` one call of
    ``make_kernel(description, plan)``'s callable (which takes the plan's inputs and
    returns its outputs).  A group whose description or kernel cannot be made runs
    through aten instead, after ``refused(group, exception)`` when given; without it the
    exception propagates."""
    import torch.fx

    plans = {}
    for g, made in zip(found, _made(found, make_kernel)):
        if isinstance(made, Exception):
            if refused is None:
                raise made
            refused(g, made)
        else:
            plans[g.id] = made
    found = [g for g in found if g.id in plans]
    units, deps, users = _units(gm, found)
    order = _order(units, deps, users)
    if len(order) != len(units):
        raise RuntimeError("fused groups that cannot run in order")
    graph = torch.fx.Graph()
    env: dict = {}
    for key in order:
        unit = units[key][1]
        if isinstance(unit, Group):
            fn, plan = plans[unit.id]
            call = graph.call_function(fn, tuple(env[i] for i in plan.inputs))
            for j, (node, _) in enumerate(plan.outputs):
                env[node] = graph.call_function(operator.getitem, (call, j))
                env[node].meta = dict(node.meta)
        else:
            env[unit] = graph.node_copy(unit, lambda a: env[a])
    out = torch.fx.GraphModule(gm, graph)
    return out
