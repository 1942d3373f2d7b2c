"""What the backends that trace through AOTAutograd (inductor, nvrtc) share: the values
they trace a captured graph with, and a dynamic graph's sizes as inputs of their own.

A static graph is traced with fake copies of the real inputs, with static sizes, under
a fake mode that has a ShapeEnv (inductor's FX graph cache and AOTAutograd's cache keep
a compile's guards there, and compile again in every process without one).  A dynamic
graph is traced with the capture's own fake values, whose sizes are the capture's
symbols, so one compile serves every size; and each size symbol becomes an input of its
own, read from the tensors on every call.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from agspeed.backends import _split
from agspeed.backends._protocol import is_dynamic, placeholder_values

__all__ = ["example_values", "sizes_bound", "compile_bound", "floats_as_tensors",
           "static_marked"]


def static_fakes(example_inputs: list) -> list:
    """Fake copies of real inputs, with static sizes, under a fake mode that has a
    ShapeEnv: inductor's FX graph cache and AOTAutograd's cache store the guards of a
    compile in it, and bypass (compile again in every process) without one."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    return [mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t
            for t in example_inputs]


def example_values(gm: Any, example_inputs: list) -> list:
    """What to trace ``gm`` with: the fake values with symbolic sizes for a dynamic graph
    (so one compile serves every size), static fakes of the real inputs for another."""
    if not is_dynamic(gm):
        return static_fakes(example_inputs)
    fakes = placeholder_values(gm)
    if len(fakes) != len(example_inputs) or any(f is None for f in fakes):
        raise RuntimeError("a dynamic graph without fake values on its placeholders")
    return fakes


def _copy(gm: Any) -> Any:
    """A module over a copy of ``gm``'s graph (its nodes' metadata copied too), with
    ``gm``'s ``meta``: to change without changing ``gm``."""
    import torch.fx

    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    made = torch.fx.GraphModule(gm, graph)
    made.meta.update(gm.meta)
    return made


def sizes_bound(gm: Any) -> tuple[Any, list]:
    """A copy of ``gm`` that takes each size symbol of its tensor inputs as an input of
    its own, first (``_split.bind_sizes``), and those sizes' places; ``gm`` and ``[]``
    when it has none.  AOTAutograd hands the backward the sizes it needs as the forward
    computed them: without the symbol itself among the forward's inputs, a backward that
    needs ``s`` where the forward only computed ``s + 1`` (padding by one, a causal LM's
    shifted labels) gets ``s + 1`` alone, and inductor refuses to compile it."""
    if not is_dynamic(gm):
        return gm, []
    bound = _copy(gm)
    sized = _split.bind_sizes(bound)
    return (bound, sized) if sized else (gm, [])


def floats_as_tensors(gm: Any, example_inputs: list) -> tuple[Any, list, list]:
    """A copy of ``gm`` whose float symbols (plain floats the capture made inputs) are
    0-d float64 tensors read back with ``.item()``, the inputs to trace it with, and the
    floats' positions; ``gm``, ``example_inputs`` and ``[]`` when it has none.

    AOTAutograd traces a SymFloat input as the constant it held (a later value would be
    computed with the first one); a tensor input is data, and ``.item()`` of it is a
    value the compiled code reads on each call, as Dynamo's own tensorify pass makes it."""
    import torch
    import torch.fx
    from torch._guards import detect_fake_mode

    values = placeholder_values(gm)
    floats = [k for k, v in enumerate(values) if type(v).__name__ == "SymFloat"]
    if not floats:
        return gm, example_inputs, []
    fake_mode = detect_fake_mode(values)
    inputs = [as_tensor(v) if k in floats else v for k, v in enumerate(example_inputs)]
    graph = torch.fx.Graph()
    env: dict = {}
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for k, node in enumerate(places):
        made = graph.placeholder(node.name)
        made.meta.update(node.meta)
        if k in floats:
            made.meta["example_value"] = fake_mode.from_tensor(inputs[k]) \
                if fake_mode is not None else inputs[k]
            env[node] = graph.call_method("item", (made,))
            env[node].meta["example_value"] = node.meta.get("example_value")  # the float
        else:
            env[node] = made
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            env[node] = graph.node_copy(node, lambda arg: env[arg])
    _tensor_weights(graph)
    made_gm = torch.fx.GraphModule(gm, graph)
    made_gm.meta.update(gm.meta)
    return made_gm, inputs, floats


def _tensor_weights(graph: Any) -> None:
    """Each ``lerp`` (and foreach ``lerp``) whose weight is computed from a float symbol
    takes it as a 0-d float64 tensor (on each tensor's device): the weight then stays a
    value read on each call, where inductor's decomposition of a float weight branches on
    it (a guard no float symbol can give).  Eager computes the same values either way."""
    import torch

    foreach = {torch.lerp: False, torch.Tensor.lerp: False, torch.Tensor.lerp_: False,
               torch._foreach_lerp: True, torch._foreach_lerp_: True}
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in foreach:
            of_lists = foreach[node.target]
        elif node.op == "call_method" and node.target in ("lerp", "lerp_"):
            of_lists = False
        else:
            continue
        args, kwargs = list(node.args), dict(node.kwargs)
        weight = args[2] if len(args) > 2 else kwargs.get("weight")
        if not isinstance(weight, torch.fx.Node) or \
                type(weight.meta.get("example_value")).__name__ != "SymFloat":
            continue
        made: dict = {}

        def tensor_on(start: Any) -> Any:
            value = start.meta.get("example_value") if isinstance(start, torch.fx.Node) \
                else None
            device = getattr(value, "device", None)
            if device not in made:
                with graph.inserting_before(node):
                    made[device] = graph.call_function(
                        torch.scalar_tensor, (weight,),
                        {"dtype": torch.float64, "device": device})
            return made[device]

        starts = args[0]
        new = [tensor_on(t) for t in starts] if of_lists else tensor_on(starts)
        if len(args) > 2:
            args[2] = new
        else:
            kwargs["weight"] = new
        node.args, node.kwargs = tuple(args), kwargs


@contextlib.contextmanager
def _scalar_outputs(example: list) -> Iterator[None]:
    """While compiling: the fake mode of the values traced (a dynamic graph's is the
    capture's) lets ``.item()`` of a fake make a symbol, as the floats' reads need."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode(example) if example else None
    if mode is None:
        yield
        return
    # the capture's ShapeEnv still holds the floats' own symbols, which AOTAutograd's
    # tensorify pass would otherwise ask Dynamo to specialize (a restart that is
    # Dynamo's alone): they are marked as dealt with while this graph compiles
    try:
        from torch._dynamo.symbolic_convert import TensorifyState
        marks = TensorifyState.force_specializations
    except (ImportError, AttributeError):   # another torch: the compile may fail, and
        marks = set()                       # the graph then runs eager, logged
    env = mode.shape_env
    mine = [str(s) for s in (getattr(env, "backed_var_to_val", None) or {})
            if str(s).startswith("zf")] if env is not None else []
    saved = set(marks)
    before = mode.allow_scalar_outputs
    mode.allow_scalar_outputs = True
    marks.update(mine)
    try:
        yield
    finally:
        mode.allow_scalar_outputs = before
        marks.clear()
        marks.update(saved)


def static_marked(gm: Any, inputs: list) -> Any:
    """``gm`` for AOTAutograd with its parameters and buffers marked as inputs that
    live beyond the step (a parameter, or a placeholder the capture marked
    ``static_lifetime``: a module's registered buffer), as Dynamo marks the graphs it
    hands a backend.  AOTAutograd's partitioner then counts saving them for the
    backward as free: it may save the buffer itself and recompute cheap functions of it
    in the backward.  Without the marks, a GPT's bf16 training graph saved its causal
    mask (``tril == 0``) from the forward instead, fusing its computation into another
    kernel, and ran its compiled kernels 0.8 ms a step slower than torch.compile's.

    The marks are Dynamo's metadata, read by AOTAutograd only where the graph module's
    ``meta`` holds ``dynamo_compile_id``; they go on a copy of the graph, so the graph
    given to the other backends is unchanged."""
    import torch

    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(places) != len(inputs) or next(gm.parameters(), None) is not None or \
            next(gm.buffers(), None) is not None:
        return gm   # AOTAutograd would lift those as Dynamo's, with sources it lacks
    static = [isinstance(v, torch.nn.Parameter) or bool(n.meta.get("static_lifetime"))
              for n, v in zip(places, inputs)]
    if not any(static):
        return gm
    marked = _copy(gm)
    copies = [n for n in marked.graph.nodes if n.op == "placeholder"]
    for node, keep in zip(copies, static):
        node._dynamo_source = None   # type: ignore[attr-defined]  # no guard of Dynamo's
        if keep:
            node.meta["tensor_dict"] = {"_dynamo_static_input_type": "unguarded"}
    marked.meta["dynamo_compile_id"] = None
    marked._param_name_to_source = {}   # type: ignore[attr-defined]  # none lifted
    return marked


def as_tensor(value: Any) -> Any:
    """A float input as the 0-d tensor ``floats_as_tensors``' graph takes."""
    import torch

    return torch.tensor(float(value), dtype=torch.float64)


def compile_bound(gm: Any, example_inputs: list,
                  compile_fn: Callable[[Any, list], Callable[..., Any]]) -> Callable[..., Any]:
    """``compile_fn(graph, values)`` on ``gm`` with its sizes bound, its floats made
    tensors and the values to trace with; the callable takes ``gm``'s own inputs."""
    gm, example_inputs, floats = floats_as_tensors(gm, example_inputs)
    example = example_values(gm, example_inputs)
    gm, sized = sizes_bound(gm)
    gm = static_marked(gm, [None] * len(sized) + list(example_inputs))
    with _scalar_outputs(example if floats else []):
        compiled = compile_fn(gm, _split.size_values(sized, example) + example)
    if not sized and not floats:
        return compiled
    floats = frozenset(floats)

    def bound(*args: Any) -> Any:
        if floats:
            args = tuple(as_tensor(v) if k in floats else v for k, v in enumerate(args))
        return compiled(*_split.size_values(sized, args), *args)
    return bound
