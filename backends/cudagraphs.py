"""The ``cudagraphs`` backend: forward and backward replayed as CUDA graphs.

A CUDA graph records the kernels of one call once and replays them with one launch, so
a graph of many small kernels stops paying the CPU's launch cost per kernel.  What it
needs decides where it applies:

* every input on one CUDA device, sizes static (a replay reads the same addresses with
  the same shapes): declared in ``capabilities``, so the runtime and the autotuner never
  give it anything else, and on a machine without CUDA it says it is unavailable;
* parameters read in place: the recording reads each parameter at its own address (the
  optimizer updates it there), and a parameter that moves makes a new recording;
* static buffers for the other inputs: each call copies its data into buffers allocated
  at the recording, in one batched copy (a batch of data comes at a new address on each
  call);
* outputs are copied out of the graph's memory, which the next replay reuses, in one
  batched copy.

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


# recordings of one graph before it stops reading parameters in place
_RECORDS_MAX = 8


class _Replay:
    """One AOTAutograd graph (forward or backward), recorded on its first real call.

    Parameters are read where they live: the recording takes their addresses, so a
    replay sees the optimizer's in-place updates with no copy, and a model's weights
    (most of a step's inputs) cost neither a copy nor a second buffer.  Every other
    tensor input is copied into a buffer of the recording, all of them in one batched
    copy, and the outputs are copied out in another.  A parameter found away from the
    recording's address (``load_state_dict(assign=True)``, ``p.data = ...``) makes a new
    recording; one that moves twice is copied like the others from then on."""

    _boxed_call = True  # AOTAutograd calls it with one list of arguments

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.cuda_graph = None
        self.static_in: list = []
        self.static_out: Any = None
        # per input: (address, strides) where it is read in place, else None; the
        # other inputs' buffers are in static_in
        self.places: list = []
        self.buffers: list = []     # the copied inputs' buffers
        self.copied: list = []      # and those inputs' positions
        self.moves: dict = {}       # position -> times a parameter left its place
        self.passed: list = []      # (output, input) positions of outputs that are inputs
        self.records = 0
        self.written = _written_inputs(graph)

    def _reads_in_place(self, i: int, a: Any) -> bool:
        import torch

        return (isinstance(a, torch.nn.Parameter) and self.written is not None
                and i not in self.written and self.moves.get(i, 0) < 2
                and self.records < _RECORDS_MAX)

    def _record(self, args: list) -> None:
        import torch

        self.cuda_graph = self.static_out = None
        self.static_in, self.places, self.buffers, self.copied = [], [], [], []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                self.places.append(None)
                self.static_in.append(a)
            elif self._reads_in_place(i, a):
                self.places.append((a.data_ptr(), a.stride()))
                self.static_in.append(a)
            else:
                self.places.append(None)
                self.static_in.append(a.clone())
                self.buffers.append(self.static_in[-1])
                self.copied.append(i)
        self.records += 1
        self.cuda_graph, out = self._capture()
        # a parameter the graph hands back as it is (AOTAutograd's forward saving a
        # weight for the backward) is handed back as it is on each call, as eager does
        mine = {id(a): i for i, (a, p) in enumerate(zip(self.static_in, self.places))
                if p is not None}
        self.passed = [(j, mine[id(o)]) for j, o in enumerate(out) if id(o) in mine]
        # the recording knows the parameters by address alone: holding them would keep a
        # dropped model's weights alive, and each call checks the address it is given
        self.static_out = [None if id(o) in mine else o for o in out]
        self.static_in = [None if p is not None else a
                          for a, p in zip(self.static_in, self.places)]

    def _capture(self) -> tuple:
        """The graph recorded over ``static_in``, and the outputs its replays write."""
        import torch

        # the warm-up and the recording draw random numbers that no call uses: put the
        # generator back so the program's random stream is eager's
        rng = torch.cuda.get_rng_state()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.graph(*self.static_in)  # warm-up, off the recording
        torch.cuda.current_stream().wait_stream(side)
        recorded = torch.cuda.CUDAGraph()
        with torch.cuda.graph(recorded):
            out = self.graph(*self.static_in)
        torch.cuda.set_rng_state(rng)
        return recorded, out

    def _moved(self, args: list) -> bool:
        """Whether a parameter read in place is somewhere else now (counted in moves)."""
        moved = False
        for i, place in enumerate(self.places):
            if place is not None and (args[i].data_ptr() != place[0]
                                      or args[i].stride() != place[1]):
                self.moves[i] = self.moves.get(i, 0) + 1
                moved = True
        return moved

    def __call__(self, args: list) -> Any:
        import torch

        if self.cuda_graph is None or self._moved(args):
            # the warm-up and the recording ran the graph on buffers: run it once more on
            # the real inputs for this call's result (its side effects happen once)
            self._record(list(args))
            out = self.graph(*args)
            args.clear()
            return out
        if self.buffers:
            torch._foreach_copy_(self.buffers, [args[i] for i in self.copied])
        passed = [(j, args[i]) for j, i in self.passed]
        args.clear()
        self.cuda_graph.replay()
        return _copied_out(self.static_out, passed)


def _copied_out(outs: Any, passed: list) -> list:
    """The replay's outputs in new tensors (the next replay writes over its own), copied
    in one batched copy; ``passed``: (position, input) of the outputs that are inputs."""
    import torch

    fresh = [torch.empty_like(o) if isinstance(o, torch.Tensor) else o for o in outs]
    for j, arg in passed:
        fresh[j] = arg
    pairs = [(f, o) for f, o in zip(fresh, outs)
             if isinstance(o, torch.Tensor) and f is not o]
    if pairs:
        torch._foreach_copy_([f for f, _ in pairs], [o for _, o in pairs])
    return fresh


def _written_inputs(graph: Any) -> set | None:
    """Positions of the inputs that ``graph`` writes (an op whose schema writes an
    argument that is a placeholder), or None when the graph cannot be read.  The graphs
    AOTAutograd gives are functional, so this is empty but for a graph that keeps an
    input's mutation; ops that are not aten's (nvrtc's kernels) allocate their results."""
    import torch

    g = getattr(graph, "graph", None)
    if g is None:
        return None
    holders = {}
    for n in g.nodes:
        if n.op == "placeholder":
            holders[n] = len(holders)
    written = set()
    for n in g.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        schema = n.target._schema
        given = list(zip(schema.arguments, n.args))
        given += [(a, n.kwargs[a.name]) for a in schema.arguments if a.name in n.kwargs]
        for arg, value in given:
            if (arg.alias_info is not None and arg.alias_info.is_write
                    and isinstance(value, torch.fx.Node) and value in holders):
                written.add(holders[value])
    return written


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
