"""Activation checkpointing inside captured code.

``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)`` in a captured frame
does not end the graph: the interpreter inlines ``checkpointed`` in its place, which
captures ``fn(*args)`` like any call between two markers, ``_begin`` and ``_end``.  The
builder tags the nodes made between them (``CheckpointPolicy``), and when the graph is
finished ``outline`` moves each tagged region into a submodule of its own, called through
``run``: at run time that is ``torch.utils.checkpoint.checkpoint`` on the submodule with
the program's own options, so the region's activations are freed after the forward and
recomputed in the backward, as in eager.  Backends that trace through AOTAutograd
(inductor, cudagraphs) get the regions as torch's ``tag_activation_checkpoint`` operator
(``tagged``), whose nodes the partitioner recomputes in the backward.

Only the non-reentrant form is captured, with its default ``context_fn``: a reentrant
checkpoint (``use_reentrant=True``, also what an unspecified ``use_reentrant`` means, with
torch's warning) gives gradients only to the region's tensor arguments that need them, not
to the parameters it reads, which a region whose parameters are graph inputs cannot keep;
it and a selective policy (a ``context_fn``) run eager, as before.  A graph break inside
the region ends the graph before the ``checkpoint`` call, which then runs eager.
"""

from __future__ import annotations

import operator
import sys
from typing import Any

from agspeed._builder_types import GraphBreak
from agspeed.protocol import Reason

__all__ = ["checkpointed", "is_checkpoint", "CheckpointPolicy", "outline", "run", "tagged",
           "has_regions"]

# the node meta key naming a node's region
TAG = "agspeed_checkpoint"


def _begin(*options: Any) -> int:
    """Marks where a region's nodes start (the builder answers; never run)."""
    raise AssertionError("only captured")


def _end(region: int, out: Any) -> Any:
    """Marks where region ``region`` ends, its result ``out`` (the builder answers)."""
    raise AssertionError("only captured")


_UNSET = object()


def checkpointed(function: Any, *args: Any, use_reentrant: Any = None,
                 context_fn: Any = _UNSET, determinism_check: Any = "default",
                 debug: Any = False, early_stop: Any = True, preserve_rng_state: Any = True,
                 **kwargs: Any) -> Any:
    """What the interpreter inlines for a ``checkpoint`` call (the same parameters)."""
    region = _begin(args, use_reentrant, context_fn is _UNSET, determinism_check, debug,
                    early_stop, preserve_rng_state)
    return _end(region, function(*args, **kwargs))


def is_checkpoint(fn: Any) -> bool:
    """Whether ``fn`` is ``torch.utils.checkpoint.checkpoint``."""
    module = sys.modules.get("torch.utils.checkpoint")
    return module is not None and fn is getattr(module, "checkpoint", None)


class CheckpointPolicy:
    """The part of ``GraphBuilder`` that marks checkpointed regions."""

    checkpoint_markers = frozenset({_begin, _end})

    def _checkpoint_init(self) -> None:
        self.checkpoint_regions: dict[int, dict] = {}  # region -> run's options, once ended
        self._ckpt_open: list = []  # (the last node before it, options) per open region
        self._ckpt_count = 0

    def checkpoint_plan(self, fn: Any) -> tuple | None:
        from agspeed.protocol import Plan

        if fn is _begin or fn is _end:
            return (Plan.GRAPH, fn)
        if is_checkpoint(fn):
            return (Plan.INLINE, checkpointed, None, None)
        return None

    def checkpoint_call(self, fn: Any, args: tuple) -> Any:
        """The answer to a marker's call."""
        if fn is _begin:
            return self._checkpoint_begin(args)
        region, out = args
        marker, options = self._ckpt_open.pop()
        node = marker.next
        while node.op != "root":
            if node.op not in ("placeholder", "get_attr", "output"):
                node.meta[TAG] = region   # an enclosing region's tag replaces it later
            node = node.next
        self.checkpoint_regions[region] = options
        return out

    def _checkpoint_begin(self, args: tuple) -> int:
        import torch.fx

        explicit, reentrant, plain_context, determinism, debug, early_stop, preserve = args
        if any(isinstance(v, self.node_type) for v in args[1:]):
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, "checkpoint options from the graph")
        if reentrant is not False:
            raise GraphBreak(Reason.UNSUPPORTED_CALL,
                             "torch.utils.checkpoint.checkpoint with use_reentrant="
                             f"{reentrant!r} (capture disabled; use_reentrant=False is captured)")
        if not plain_context:
            raise GraphBreak(Reason.UNSUPPORTED_CALL,
                             "torch.utils.checkpoint.checkpoint with a context_fn "
                             "(capture disabled)")
        options = {"use_reentrant": False, "determinism_check": determinism, "debug": debug,
                   "early_stop": early_stop, "preserve_rng_state": preserve}
        last = next(reversed(self.graph.nodes), None)
        marker = last if last is not None else self.graph._root
        saved: list = []  # checkpoint saves the tensors passed to it, and only them
        torch.fx.node.map_arg(explicit, saved.append)
        options["saved"] = saved
        self._ckpt_open.append((marker, options))
        self._ckpt_count += 1
        return self._ckpt_count


def run(body: Any, state: tuple, *args: Any, **options: Any) -> Any:
    """A checkpointed region at run time: ``body(*args, *state)`` through torch's
    checkpoint, which saves ``args`` (the tensors the program passed to it) and holds
    ``state`` (what the region reads besides: parameters, closures) as eager's function
    would, by reference."""
    from torch.utils.checkpoint import checkpoint

    return checkpoint(_with_state, body, state, *args, **options)


def _with_state(body: Any, state: tuple, *args: Any) -> Any:
    return body(*args, *state)


def outline(graph: Any, root: Any, regions: dict) -> None:
    """Each region of ``graph`` moved into a submodule of ``root``, called by ``run``."""
    import torch.fx

    if not regions:
        return
    members: dict[int, list] = {}
    for node in graph.nodes:
        region = node.meta.get(TAG)
        if region is not None:
            members.setdefault(region, []).append(node)
    moved: dict = {}  # a region's output -> the node that now gives it
    for k, (region, nodes) in enumerate(members.items()):
        options = dict(regions[region])
        passed = {moved.get(n, n) for n in options.pop("saved")}
        inside = set(nodes)
        reads: dict = {}
        for node in nodes:
            for arg in node.all_input_nodes:
                if arg not in inside:
                    reads.setdefault(arg, None)
        saved = [n for n in reads if n in passed]
        state = [n for n in reads if n not in passed]
        outputs = [n for n in nodes if any(u not in inside for u in n.users)]
        body = torch.fx.Graph()
        env: dict = {}
        for arg in saved + state:
            env[arg] = body.placeholder(arg.name)
            env[arg].meta.update(arg.meta)
        for node in nodes:
            env[node] = body.node_copy(node, env.__getitem__)
            env[node].meta.pop(TAG, None)
        body.output(tuple(env[n] for n in outputs))
        name = f"checkpoint_{k}"
        root.add_module(name, torch.fx.GraphModule(torch.nn.Module(), body))
        with graph.inserting_after(nodes[-1]):
            attr = graph.get_attr(name)
        with graph.inserting_after(attr):
            call = graph.call_function(run, (attr, tuple(state), *saved), options)
        call.meta["example_value"] = tuple(n.meta.get("example_value") for n in outputs)
        after = call
        for i, node in enumerate(outputs):
            with graph.inserting_after(after):
                after = graph.call_function(operator.getitem, (call, i))
            after.meta["example_value"] = node.meta.get("example_value")
            node.replace_all_uses_with(after, delete_user_cb=lambda u: u not in inside)
            moved[node] = after
        for node in reversed(nodes):
            graph.erase_node(node)


def has_regions(gm: Any) -> bool:
    return any(n.op == "call_function" and n.target is run for n in gm.graph.nodes)


def tagged(gm: Any) -> Any:
    """``gm`` for a backend that traces it through AOTAutograd: each region called
    through torch's ``tag_activation_checkpoint``, whose nodes AOTAutograd's partitioner
    recomputes in the backward.  ``gm`` itself when it has none."""
    if not has_regions(gm):
        return gm
    import copy

    import torch.fx
    from torch._higher_order_ops.wrap import tag_activation_checkpoint

    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        if node.op == "call_function" and node.target is run:
            body, state, *saved = node.args
            node.target = tag_activation_checkpoint
            node.args = (body, *saved, *state)
            node.kwargs = {}
    out = torch.fx.GraphModule(gm, graph)  # the regions' submodules are shared
    out.meta.update(gm.meta)
    return out
