"""Cutting a training graph into pieces along gradient buckets, for DDP.

A compiled training graph is one node of the autograd graph: its backward produces every
parameter's gradient at once, at its very end.  DDP reduces gradients bucket by bucket as
they become ready during the backward, so one graph would leave nothing to overlap with
communication.  Cut into pieces, each piece's backward hands over its parameters'
gradients as soon as it finishes, and the buckets holding them start reducing while the
earlier pieces' backwards still run.

The rule that places the cuts (``plan``) follows DDP's own bucketing: walking the graph
from its end (the order the backward produces gradients in), nodes join the current
piece until the parameters they read fill a bucket (``first_cap`` bytes for the first
bucket, which DDP keeps small to start communicating early, ``cap`` for the rest); the
next node starts a new piece.  With DDP's caps this is the rule torch.compile uses.
Larger caps give fewer, larger pieces: more fusion, later communication.  Which is faster
depends on the model, the network and the backend, so ``agspeed._ddp`` measures a few.

A node that only unpacks a value (``getitem`` of a tuple) stays in its source's piece, so
pieces exchange tensors and sizes, not tuples.

This module does not import torch at import time.
"""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["bind_sizes", "size_values", "plan", "plans", "cut"]


def _param_bytes(gm: Any, inputs: list, sizes: dict[int, int]) -> dict[Any, int]:
    """The placeholders of ``gm`` whose value is a parameter in ``sizes`` (by id), with
    its size in bytes."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return {node: sizes[id(value)] for node, value in zip(placeholders, inputs)
            if id(value) in sizes}


def plan(gm: Any, inputs: list, sizes: dict[int, int], cap: int,
         first_cap: int) -> dict[Any, int]:
    """The piece of each computing node of ``gm``, numbered in forward order from 0.

    ``sizes`` maps the id of each parameter whose gradient is reduced to its size in
    bytes; ``inputs`` are the placeholders' values.
    """
    owned = _param_bytes(gm, inputs, sizes)
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    cap, first_cap = max(cap, 1), max(first_cap, 1)  # a cap of 0 bytes: one per bucket
    backwards: dict[Any, int] = {}
    piece, filled, counted = 0, 0, set()
    for node in reversed(nodes):
        limit = first_cap if piece == 0 else cap
        if filled >= limit:
            piece, filled = piece + 1, 0
        for arg in node.all_input_nodes:
            if arg in owned and arg not in counted:
                counted.add(arg)
                filled += owned[arg]
        backwards[node] = piece
    if piece > 0 and filled == 0:
        # the nodes before the first layer read no parameter: a piece of their own
        # would only add a boundary (or hold no tensor at all), so they join the next
        backwards = {node: min(k, piece - 1) for node, k in backwards.items()}
        piece -= 1
    last = piece
    pieces = {node: last - k for node, k in backwards.items()}
    for node in nodes:  # forward order: a source's piece is final before its users
        if node.op == "call_function" and node.target is operator.getitem:
            source = node.args[0]
            if source in pieces:
                pieces[node] = pieces[source]
    for node in nodes:  # a submodule (a checkpointed region's) goes with its call
        if node.op == "get_attr" and node.users:
            pieces[node] = min(pieces[u] for u in node.users)
    return _renumber(pieces)


def _renumber(pieces: dict[Any, int]) -> dict[Any, int]:
    """Piece numbers made consecutive (moving unpacking nodes can empty a piece)."""
    order = {p: k for k, p in enumerate(sorted(set(pieces.values())))}
    return {node: order[p] for node, p in pieces.items()}


def count(pieces: dict[Any, int]) -> int:
    return len(set(pieces.values())) if pieces else 0


def plans(gm: Any, inputs: list, sizes: dict[int, int], cap: int,
          first_cap: int) -> list[dict[Any, int]]:
    """The candidate cuts of ``gm``: DDP's bucket rule, then the rule with caps doubled
    again and again, down to the whole graph as one piece; each number of pieces once,
    most pieces first."""
    found: dict[int, dict[Any, int]] = {}
    cap, first_cap = max(cap, 1), max(first_cap, 1)
    total = sum(b for node, b in _param_bytes(gm, inputs, sizes).items())
    scale = 1
    while True:
        pieces = plan(gm, inputs, sizes, cap * scale, first_cap * scale)
        n = count(pieces)
        found.setdefault(n, pieces)
        if n <= 1 or min(cap, first_cap) * scale > total:
            break
        scale *= 2
    if 1 not in found and found:
        found[1] = {node: 0 for node in next(iter(found.values()))}
    return [found[n] for n in sorted(found, reverse=True)]


def bind_sizes(gm: Any) -> list[tuple[int, int]]:
    """Make each symbolic size of ``gm``'s tensor inputs an input of its own, placed
    first; returns, for each added input in order, the (input, dimension) whose size it
    is: the caller passes those sizes before the graph's own inputs.

    A dynamic capture reads its sizes from its tensor inputs, but pieces pass sizes to
    each other as values, and the cut (torch.fx's ``split_module``) finds each size
    symbol's value by an input whose example value is that symbol.
    """
    import torch

    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    bound = {v.node.expr for n in placeholders
             if isinstance(v := n.meta.get("example_value"), torch.SymInt)}
    found: list[tuple[int, int, Any]] = []
    for index, node in enumerate(placeholders):
        value = node.meta.get("example_value")
        if not isinstance(value, torch.Tensor):
            continue
        for dim, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and size.node.expr.is_symbol \
                    and size.node.expr not in bound:
                bound.add(size.node.expr)
                found.append((index, dim, size))
    if not found:
        return []
    with gm.graph.inserting_before(nodes[0]):
        for k, (_, _, size) in enumerate(found):
            gm.graph.placeholder(f"size_{k}").meta["example_value"] = size
    gm.recompile()
    return [(index, dim) for index, dim, _ in found]


def size_values(sized: list[tuple[int, int]], values: Any) -> list:
    """The sizes ``bind_sizes`` made inputs, read from the graph's other ``values``."""
    return [values[i].size(d) for i, d in sized]


def cut(gm: Any, pieces: dict[Any, int]) -> Any:
    """``gm`` as a GraphModule calling one submodule per piece (``submod_<k>``), each
    with its nodes' metadata (the capture's example values) on it and its inputs."""
    from torch.fx.passes.split_module import split_module

    split = split_module(gm, gm, lambda node: pieces[node], keep_original_order=True)
    for name, child in split.named_children():
        child.meta.update({k: v for k, v in gm.meta.items() if k.startswith("agspeed_")})
        _check_inputs(child)
    return split


def _check_inputs(child: Any) -> None:
    """Each piece's placeholders must carry the example value the capture recorded
    (split_module copies the node's metadata); backends read their sizes from it."""
    for node in child.graph.nodes:
        if node.op == "placeholder" and "example_value" not in node.meta:
            raise RuntimeError(f"piece input {node.name} has no example value")
