"""The ``cudagraphs`` backend: forward and backward replayed as CUDA graphs.

A CUDA graph records the kernels of one call once and replays them with one launch, so
a graph of many small kernels stops paying the CPU's launch cost per kernel.  What it
needs decides where it applies:

* every input on one CUDA device, sizes static (a replay reads the same addresses with
  the same shapes): declared in ``capabilities``, so the runtime and the autotuner never
  give it anything else, and on a machine without CUDA it says it is unavailable;
* static input buffers: each call copies its inputs into buffers allocated at capture
  (parameters and data alike: a copy costs little next to the kernels it replaces, and
  keeping the caller's own tensors as buffers would let a replay overwrite them);
* outputs are copied out of the graph's memory, which the next replay reuses.

Training goes through AOTAutograd: the forward and the backward are separate FX graphs,
each recorded on its first call after a warm-up call on a side stream (libraries allocate
their workspaces on first use, which a capture must not see).  In-place updates of
inputs (BatchNorm's running statistics) come back as outputs that AOTAutograd copies into
the real tensors, as with inductor.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from agspeed.backends._protocol import Capabilities

__all__ = ["backend", "capabilities", "replay"]


@functools.lru_cache(maxsize=None)
def _unavailable() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "CUDA is not available (CUDA graphs need a GPU)"
    return None


capabilities = Capabilities(training=True, dynamic=False, devices={"cuda"},
                            static_inputs_only=True, unavailable=_unavailable)


class _Replay:
    """One AOTAutograd graph (forward or backward), recorded on its first real call."""

    _boxed_call = True  # AOTAutograd calls it with one list of arguments

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.cuda_graph = None
        self.static_in: list = []
        self.static_out: Any = None

    def _record(self, args: list) -> None:
        import torch

        self.static_in = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        # the warm-up and the recording draw random numbers that no call uses: put the
        # generator back so the program's random stream is eager's
        rng = torch.cuda.get_rng_state()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.graph(*self.static_in)  # warm-up, off the recording
        torch.cuda.current_stream().wait_stream(side)
        self.cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.cuda_graph):
            self.static_out = self.graph(*self.static_in)
        torch.cuda.set_rng_state(rng)

    def __call__(self, args: list) -> Any:
        import torch

        if self.cuda_graph is None:
            # the warm-up and the recording ran the graph on copies: run it once more on
            # the real inputs for this call's result (its side effects happen once)
            self._record(list(args))
            out = self.graph(*args)
            args.clear()
            return out
        for static, arg in zip(self.static_in, args):
            if isinstance(static, torch.Tensor):
                static.copy_(arg)
        args.clear()
        self.cuda_graph.replay()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in self.static_out]


def replay(graph: Callable[..., Any]) -> Callable[..., Any]:
    """``graph`` (a callable of positional tensors returning a list or tuple, such as an
    AOTAutograd forward or backward graph) as a boxed callable recorded as a CUDA graph on
    its first call and replayed after."""
    return _Replay(graph)


def _compiler(graph: Any, example_inputs: list) -> Callable[..., Any]:
    return replay(graph)


def backend(gm: Any, example_inputs: list) -> Callable[..., Any]:
    """Replay ``gm``'s forward and backward as CUDA graphs (CUDA inputs, static sizes)."""
    reason = _unavailable()
    if reason:
        raise RuntimeError(f"cudagraphs is unavailable: {reason}")
    from torch._functorch.aot_autograd import aot_module_simplified

    from agspeed._checkpoint import tagged

    return aot_module_simplified(tagged(gm), list(example_inputs), fw_compiler=_compiler,
                                 bw_compiler=_compiler)


backend.capabilities = capabilities
