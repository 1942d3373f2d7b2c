"""The ``nvrtc`` backend: agspeed's own fused CUDA kernels.

The memory-bound chains of a graph (pointwise ops, broadcasts, reductions over the last
dimensions: bias + activation, residual + norm, softmax, their backwards) become one
kernel each, generated as CUDA C, compiled at run time by NVRTC and launched from C on
torch's current stream; matmuls, convolutions and attention run through aten between
them.  The parts:

* ``describe.c`` and ``codegen*.c`` (C): a kernel's description, a tuple of protocol.h's
  ``KernelOp`` / ``KernelType`` / ``KernelKind`` rows, read and written as its CUDA C
  source (``codegen_pointwise.c`` the pointwise kernels, ``codegen_rows.c`` the row
  kernels, ``codegen_columns.c`` their column sums);
* ``driver.c`` (C): libnvrtc and libcuda opened at run time (dlopen), so agspeed builds
  and imports without CUDA: NVRTC compiles a source to PTX or a cubin, the driver loads
  it, and ``agspeed._C.CudaKernel`` launches it without running Python per launch;
* ``_libs.py``: where libnvrtc and libcuda are found, and why not;
* ``lower.py``: which aten ops a kernel computes, and their instructions;
* ``partition.py``: the fusible groups of an aten graph, and the graph that calls one
  kernel per group;
* ``kernels.py``: ``Fused``, a group's callable (outputs allocated, sizes and strides
  worked out, the kernel launched), and the NVRTC compile with its disk cache.

A graph goes through AOTAutograd with inductor's decomposition table (layer norm,
softmax, GELU... become the primitive ops and reductions a kernel does; dropout stays
eager's, as with the inductor backend), and each of the forward and backward graphs is
partitioned and rewritten.  Everything but the launch runs the same on the CPU through
the tests' host launcher, which compiles the kernels' source as C++.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from agspeed.backends._protocol import Capabilities

__all__ = ["backend", "capabilities", "compile_aten", "compile_with"]

_log = logging.getLogger("agspeed.autotune")

def _unavailable() -> str | None:
    from agspeed.backends.nvrtc import _libs

    version, why = _libs.nvrtc()
    if version is None:
        return why
    driver, why = _libs.cuda()
    if driver is None:
        return why
    return None


capabilities = Capabilities(training=True, dynamic=True, devices={"cuda"},
                            unavailable=_unavailable)


def compile_aten(gm: Any, launcher: Callable[[tuple], Any]) -> Any:
    """``gm`` (an aten graph with fake values on its nodes) with each fusible group one
    kernel, made by ``launcher(description)``."""
    from agspeed.backends.nvrtc import kernels, partition

    def refused(group: Any, exc: Exception) -> None:
        _log.info("nvrtc: %s: a group of %d nodes (%s...) runs through aten: %s: %s",
                  gm.meta.get("agspeed_where", "graph"), len(group.nodes),
                  group.nodes[0].target, type(exc).__name__, exc)

    found = partition.groups(gm)
    start = time.perf_counter()
    out = partition.rewrite(gm, found,
                            lambda desc, plan: kernels.Fused(desc, plan, launcher(desc)),
                            refused)
    kernels.compiled["graph_seconds"].append(time.perf_counter() - start)
    return out


def compile_with(launcher: Callable[[tuple], Any],
                 wrap: Callable[[Any], Any] | None = None) -> Callable[..., Any]:
    """A backend whose kernels ``launcher(description)`` makes: the real one launches on
    the GPU, the tests' runs the kernels' source on the CPU.  ``wrap``, when given, makes
    the boxed callable of each rewritten forward and backward graph (``nvrtc_cudagraphs``
    replays them as CUDA graphs)."""

    def compile_graph(gm: Any, example_inputs: list) -> Callable[..., Any]:
        import torch._inductor.config as inductor_config
        from functorch.compile import make_boxed_func
        from torch._functorch.aot_autograd import aot_module_simplified
        from torch._inductor.decomposition import select_decomp_table

        from agspeed._checkpoint import tagged
        from agspeed.backends import _aot

        def compiler(aten_gm: Any, inputs: list) -> Callable[..., Any]:
            fused = compile_aten(aten_gm, launcher)
            return wrap(fused) if wrap is not None else make_boxed_func(fused.forward)

        with inductor_config.patch(fallback_random=True):
            table = select_decomp_table()
        return _aot.compile_bound(
            tagged(gm), example_inputs,
            lambda graph, values: aot_module_simplified(
                graph, values, fw_compiler=compiler, bw_compiler=compiler,
                decompositions=table))

    return compile_graph


def backend(gm: Any, example_inputs: list, wrap: Callable[[Any], Any] | None = None
            ) -> Callable[..., Any]:
    """``gm``'s forward and backward with their memory-bound chains fused into NVRTC
    kernels (CUDA inputs); ``wrap`` as in ``compile_with``."""
    reason = _unavailable()
    if reason:
        raise RuntimeError(f"nvrtc is unavailable: {reason}")
    from agspeed.backends.nvrtc import kernels

    devices = {t.device.index or 0 for t in example_inputs if hasattr(t, "device")
               and t.device.type == "cuda"}
    if len(devices) != 1:
        raise RuntimeError("nvrtc compiles graphs on one CUDA device")
    device = devices.pop()
    return compile_with(lambda desc: kernels.cuda_launcher(desc, device), wrap)(
        gm, example_inputs)


backend.capabilities = capabilities
