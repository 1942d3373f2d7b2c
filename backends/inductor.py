"""The ``inductor`` backend: torch's own compiler (``torch._inductor``), CPU and CUDA.

Training graphs go through AOTAutograd (inside ``compile_fx``): it traces the forward
and the backward, and inductor turns both into fused kernels (C++/OpenMP on the CPU,
Triton on CUDA).  Graphs with symbolic sizes are compiled once for every size: the
placeholders' fake example values, which carry the capture's ShapeEnv symbols, are what
inductor is given, so the compiled code reads each size from its input at run time.

Four settings differ from a plain ``torch.compile`` and are agspeed's decisions:

* Random numbers come from eager's generator (inductor's ``fallback_random``): dropout
  draws the same mask from the same seed and leaves the generator where eager leaves it,
  so a compiled graph computes what eager computes and the autotuner can check it.
  Inductor's own RNG would be a little faster and never equal to eager.
* The backward is compiled with the forward (not lazily on the first backward), so a
  graph is ready, and timed, as a whole, and both land in the same cache.
* Saved activations are never donated to the backward (AOTAutograd's
  ``donated_buffer``): a donated buffer lets the compiled backward write over what the
  forward saved, so AOTAutograd refuses ``backward(retain_graph=True)`` on such a graph,
  and the backward compiled with the forward always has them.  A second backward over
  the same graph (several losses, GANs, ``retain_graph`` to probe gradients) works as in
  eager.  AOTAutograd reads the setting when the backward runs, not when it compiles,
  so it is switched off for the whole process on the first compile, a ``torch.compile``
  of the user's in the same process included (which then accepts ``retain_graph`` too).
* Compiled artifacts (inductor's FX graph cache, AOTAutograd's cache, the compiled
  kernels) live under agspeed's cache directory, ``<cache_dir>/inductor``, so a second
  process finds them there instead of compiling again.  A ``TORCHINDUCTOR_CACHE_DIR``
  that the user set before importing agspeed is theirs and is kept.  Inductor keeps the
  directory in the process environment, so it is set for the whole process: a
  ``torch.compile`` of the user's in the same process shares it.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from typing import Any, Callable

from agspeed.backends import _split
from agspeed.backends._protocol import Capabilities, is_dynamic, placeholder_values

__all__ = ["backend", "capabilities", "cache_dir"]

_log = logging.getLogger("agspeed.autotune")
_ENV = "TORCHINDUCTOR_CACHE_DIR"


def _users_dir() -> str | None:
    """The user's own TORCHINDUCTOR_CACHE_DIR: set before agspeed was imported, and not
    torch's default (which importing torch._dynamo writes into the environment)."""
    from agspeed.backends import INDUCTOR_DIR_AT_IMPORT as value

    if not value:
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return None if os.path.abspath(value) == os.path.abspath(default_cache_dir()) else value


@functools.lru_cache(maxsize=None)
def _unavailable() -> str | None:
    try:
        import torch._inductor.compile_fx  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not here"
        return f"torch._inductor cannot be imported ({type(exc).__name__}: {exc})"
    if not any(shutil.which(cc) for cc in (os.environ.get("CXX", "g++"), "g++", "c++",
                                             "clang++")):
        return "no C++ compiler found (inductor compiles C++ for the CPU)"
    return None


capabilities = Capabilities(training=True, dynamic=True, devices={"cpu", "cuda"},
                            unavailable=_unavailable)


def cache_dir() -> str:
    """Where inductor's artifacts go: the user's ``TORCHINDUCTOR_CACHE_DIR`` if they set
    one, else ``<agspeed cache_dir>/inductor``."""
    users = _users_dir()
    if users:
        return users
    from agspeed.backends import knowledge

    return knowledge.artifact_dir("inductor")


def _point_cache() -> None:
    directory = cache_dir()
    if os.environ.get(_ENV) != directory:
        os.makedirs(directory, exist_ok=True)
        os.environ[_ENV] = directory
        _log.debug("inductor: compiled artifacts in %s", directory)


def _static_fakes(example_inputs: list) -> list:
    """Fake copies of real inputs, with static sizes, under a fake mode that has a
    ShapeEnv: inductor's FX graph cache and AOTAutograd's cache store the guards of a
    compile in it, and bypass (compile again in every process) without one."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    return [mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t
            for t in example_inputs]


def _example_values(gm: Any, example_inputs: list) -> list:
    """What inductor traces with: the fake values with symbolic sizes for a dynamic graph
    (so one compile serves every size), static fakes of the real inputs for another."""
    if not is_dynamic(gm):
        return _static_fakes(example_inputs)
    fakes = placeholder_values(gm)
    if len(fakes) != len(example_inputs) or any(f is None for f in fakes):
        raise RuntimeError("a dynamic graph without fake values on its placeholders")
    return fakes


def backend(gm: Any, example_inputs: list) -> Callable[..., Any]:
    """Compile ``gm`` with inductor (forward and, where inputs need gradients, backward)."""
    reason = _unavailable()
    if reason:
        raise RuntimeError(f"inductor is unavailable: {reason}")
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    from agspeed._checkpoint import tagged

    _point_cache()
    functorch_config.donated_buffer = False     # see the module's docstring
    example = _example_values(gm, example_inputs)
    gm, sized = _sizes_bound(tagged(gm))
    with inductor_config.patch(fallback_random=True), \
            functorch_config.patch(force_non_lazy_backward_lowering=True):
        compiled = compile_fx(gm, _split.size_values(sized, example) + example)
    if not sized:
        return compiled

    def with_sizes(*args: Any) -> Any:
        return compiled(*_split.size_values(sized, args), *args)
    return with_sizes


def _sizes_bound(gm: Any) -> tuple[Any, list]:
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


backend.capabilities = capabilities
