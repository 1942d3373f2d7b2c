"""The ``inductor`` backend: torch's own compiler (``torch._inductor``), CPU and CUDA.

Training graphs go through AOTAutograd (inside ``compile_fx``): it traces the forward
and the backward, and inductor turns both into fused kernels (C++/OpenMP on the CPU,
Triton on CUDA).  Graphs with symbolic sizes are compiled once for every size: the
placeholders' fake example values, which carry the capture's ShapeEnv symbols, are what
inductor is given, so the compiled code reads each size from its input at run time.

Five settings differ from a plain ``torch.compile`` and are agspeed's decisions:

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
* No two gradients share memory: where two parameters' gradients are the same value
  (``p + q`` of two parameters of one shape), inductor's backward returns two views of
  one buffer, autograd keeps both as the parameters' ``.grad`` without copying, and the
  next accumulation, or an in-place ``clip_grad_norm_``, counts twice (a bug of
  ``torch.compile`` too).  Each backward output that shares its storage with an earlier
  one is made a copy of its own in the graph inductor lowers (a post-grad pass, which
  also keys agspeed's compiled artifacts apart from torch.compile's).
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

from agspeed.backends import _aot
from agspeed.backends._protocol import Capabilities

__all__ = ["backend", "capabilities", "cache_dir", "distinct_outputs"]

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


# floats made symbols are traced as 0-d tensors (_aot.floats_as_tensors)
capabilities = Capabilities(training=True, dynamic=True, float_inputs=True,
                            devices={"cpu", "cuda"}, unavailable=_unavailable)


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


def distinct_outputs(graph: Any) -> int:
    """Make each output of ``graph`` (an AOTAutograd backward's FX graph) that shares its
    storage with an earlier output a copy of its own; how many were copied."""
    import torch

    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    values = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    seen: set = set()
    copied = 0
    outputs = []
    for value in values:
        if isinstance(value, torch.fx.Node):
            fake = value.meta.get("val")
            key = (fake.untyped_storage()._cdata if isinstance(fake, torch.Tensor)
                   else id(value))
            if key in seen:
                with graph.inserting_before(out):
                    copy = graph.call_function(torch.ops.aten.clone.default, (value,))
                if isinstance(fake, torch.Tensor):
                    copy.meta["val"] = fake.clone()
                value = copy
                copied += 1
            else:
                seen.add(key)
        outputs.append(value)
    if copied:
        out.args = (type(values)(outputs) if isinstance(out.args[0], (tuple, list))
                    else outputs[0],)
    return copied


@functools.lru_cache(maxsize=None)
def _pass_type() -> type:
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

    class DistinctGradients(CustomGraphPass):
        """Inductor's post-grad pass that applies ``distinct_outputs`` to backward
        graphs (their inputs are the tangents), then the pass the program had set, if
        any.  Its uuid, part of inductor's and AOTAutograd's cache keys, follows this
        file, so artifacts compiled otherwise (by ``torch.compile``, or by an earlier
        agspeed) are never taken for agspeed's."""

        def __init__(self, then: Any) -> None:
            self.then = then

        def __call__(self, graph: Any) -> None:
            if any(n.op == "placeholder" and n.name.startswith("tangents")
                   for n in graph.nodes):
                distinct_outputs(graph)
            if self.then is not None:
                self.then(graph)

        def uuid(self) -> Any:
            then = self.then.uuid() if hasattr(self.then, "uuid") else self.then
            return (get_hash_for_files((__file__,)), then)

    return DistinctGradients


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
    passes = _pass_type()(inductor_config.post_grad_custom_post_pass)
    with inductor_config.patch(fallback_random=True, post_grad_custom_post_pass=passes), \
            functorch_config.patch(force_non_lazy_backward_lowering=True):
        return _aot.compile_bound(tagged(gm), example_inputs, compile_fx)


backend.capabilities = capabilities
