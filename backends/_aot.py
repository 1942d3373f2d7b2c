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

from typing import Any, Callable

from agspeed.backends import _split
from agspeed.backends._protocol import is_dynamic, placeholder_values

__all__ = ["example_values", "sizes_bound", "compile_bound"]


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


def sizes_bound(gm: Any) -> tuple[Any, list]:
    """A copy of ``gm`` that takes each size symbol of its tensor inputs as an input of
    its own, first (``_split.bind_sizes``), and those sizes' places; ``gm`` and ``[]``
    when it has none.  AOTAutograd hands the backward the sizes it needs as the forward
    computed them: without the symbol itself among the forward's inputs, a backward that
    needs ``s`` where the forward only computed ``s + 1`` (padding by one, a causal LM's
    shifted labels) gets ``s + 1`` alone, and inductor refuses to compile it."""
    import torch.fx

    if not is_dynamic(gm):
        return gm, []
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    bound = torch.fx.GraphModule(gm, graph)
    bound.meta.update(gm.meta)
    sized = _split.bind_sizes(bound)
    return (bound, sized) if sized else (gm, [])


def compile_bound(gm: Any, example_inputs: list,
                  compile_fn: Callable[[Any, list], Callable[..., Any]]) -> Callable[..., Any]:
    """``compile_fn(graph, values)`` on ``gm`` with its sizes bound and the values to
    trace with; the callable takes ``gm``'s own inputs."""
    example = example_values(gm, example_inputs)
    gm, sized = sizes_bound(gm)
    compiled = compile_fn(gm, _split.size_values(sized, example) + example)
    if not sized:
        return compiled

    def with_sizes(*args: Any) -> Any:
        return compiled(*_split.size_values(sized, args), *args)
    return with_sizes
