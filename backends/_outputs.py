"""The output contract between the runtime and a compiled backend.

A captured graph returns what the frame returned: a tensor, or tuples, lists and dicts
of tensors and constants, namedtuples and ``torch.Size`` made by call nodes of their
class, and the ``(result, values)`` pair of a graph with side effects.  Compilers take
less: Inductor and AOTAutograd want a graph returning one flat tuple of values, hand back
a list for it, and fail on nested containers.  So every backend but eager (which runs
the captured graph itself) is given a copy of the graph that returns a flat tuple of its
output nodes, each node once, in order of first appearance, and its callable's result is
rebuilt into the captured structure by a function generated for that structure:
containers made new on every call, as the frame made them, and an output node that
appears twice is the same object twice.  This is the graph torch.compile
gives a backend, so any backend written for torch.compile takes it.

This module does not import torch at import time.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

__all__ = ["flat_output"]


_STRUCTURES = (tuple, list, dict, set, frozenset, collections.deque)


def _is_builder(node: Any) -> bool:
    """A call node that only makes the output's structure: a namedtuple, torch.Size,
    set, deque, dict subclass (or a list or dict the output holds twice) made of output
    values by calling its class, or an object the frame made (a dataclass, a
    ``ModelOutput``) remade from its state (``agspeed._objects``)."""
    if node.op != "call_function":
        return False
    target = node.target
    return (isinstance(target, type) and issubclass(target, _STRUCTURES)) or \
        hasattr(target, "agspeed_rebuilds")


class _Template:
    """Walks a graph's output argument, collecting its nodes and writing the expression
    that rebuilds it from ``r``, the backend's flat result."""

    def __init__(self) -> None:
        self.leaves: list = []
        self.index: dict = {}
        self.names: dict[str, Any] = {}
        self.builders: list = []  # the builder nodes the expression makes
        self.built: dict = {}  # builder node -> its name in the expression
        self.structural: set = set()  # builder nodes only the output's structure uses

    def find_structure(self, graph: Any) -> None:
        """The builder nodes used by the output alone, or by builders that are: made
        by the rebuilding function once each (one object wherever the output holds it),
        whatever the order the output reaches them in."""
        found = {n for n in graph.nodes if _is_builder(n)}
        while True:
            kept = {n for n in found if all(u in found for u in n.users)}
            if kept == found:
                break
            found = kept
        self.structural = found

    def const(self, value: Any) -> str:
        if value is None or type(value) in (bool, int) or \
                (type(value) is float and value == value and abs(value) != float("inf")):
            return repr(value)
        name = f"c{len(self.names)}"
        self.names[name] = value
        return name

    def expr(self, value: Any) -> str:
        from torch.fx import Node

        if isinstance(value, Node):
            if value in self.structural:
                # used by the output alone, or by a structure that is: made once, as
                # b<k>, and that one object wherever it appears again
                if value in self.built:
                    return self.built[value]
                name = self.built[value] = f"b{len(self.built)}"
                self.builders.append(value)
                args = [self.expr(a) for a in value.args]
                kwargs = [f"{k}={self.expr(v)}" for k, v in value.kwargs.items()]
                return f"({name} := {self.const(value.target)}({', '.join(args + kwargs)}))"
            if value not in self.index:
                self.index[value] = len(self.leaves)
                self.leaves.append(value)
            return f"r[{self.index[value]}]"
        # fx keeps an argument's lists and dicts as its immutable subclasses of them
        kind = type(value)
        if kind is tuple:
            items = [self.expr(v) for v in value]
            return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
        if isinstance(value, list):
            return f"[{', '.join(self.expr(v) for v in value)}]"
        if isinstance(value, dict):
            pairs = (f"{self.const(k)}: {self.expr(v)}" for k, v in value.items())
            return f"{{{', '.join(pairs)}}}"
        return self.const(value)


def flat_output(gm: Any) -> tuple[Any, Callable[[Callable], Callable]]:
    """A copy of ``gm`` returning a flat tuple of its output nodes, with ``wrap``, which
    turns a backend's callable for the copy into one returning the captured structure.
    A copy, since compilers may rewrite the graph they get and eager and the other
    candidates must keep the captured one; node metadata (the fake values) is shared."""
    import torch.fx

    graph = torch.fx.Graph()
    template = _Template()
    copied = graph.graph_copy(gm.graph, {})
    template.find_structure(graph)
    expr = template.expr(copied)
    graph.output(tuple(template.leaves))
    made = set(template.builders)
    for node in reversed(list(graph.nodes)):  # consumers before what they use
        if node in made and not node.users:
            graph.erase_node(node)
    flat = torch.fx.GraphModule(gm, graph)
    flat.meta = dict(getattr(gm, "meta", {}))
    names = template.names
    source = ("def wrap(compiled):\n"
              "    def run(*args):\n"
              "        r = compiled(*args)\n"
              f"        return {expr}\n"
              "    run.__wrapped__ = compiled\n"
              "    return run\n")
    code = compile(source, f"<agspeed output of {gm.meta.get('agspeed_where', 'a graph')}>",
                   "exec")
    exec(code, names)  # noqa: S102 - generated from the graph's own structure
    return flat, names["wrap"]
