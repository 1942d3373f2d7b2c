"""The ``nvrtc`` backend: agspeed's own fused CUDA kernels.

The memory-bound chains of a graph (pointwise ops, broadcasts, reductions over the last
dimensions: bias + activation, residual + norm, softmax, their backwards) become one
kernel each, generated as CUDA C, compiled at run time by NVRTC and launched from C on
torch's current stream; matmuls, convolutions and attention run through aten between
them.  The parts:

* ``codegen.c`` (C): a kernel's description, a tuple of protocol.h's ``KernelOp`` /
  ``KernelType`` / ``KernelKind`` rows, to its CUDA C source;
* ``driver.c`` (C): libnvrtc and libcuda opened at run time (dlopen), so agspeed builds
  and imports without CUDA: NVRTC compiles a source to PTX or a cubin, the driver loads
  it, and ``agspeed._C.CudaKernel`` launches it without running Python per launch;
* ``_libs.py``: where libnvrtc and libcuda are found, and why not.

The partitioner that turns an AOTAutograd graph into kernel descriptions is not built
yet: until it is, the backend declares itself unavailable, with that reason, so neither
``optimize(backend="nvrtc")`` nor the autotuner hands it a graph.
"""

from __future__ import annotations

from typing import Any, Callable

from agspeed.backends._protocol import Capabilities

__all__ = ["backend", "capabilities"]

_NOT_BUILT = "its graph partitioner is not built yet (kernels compile, graphs do not)"


def _unavailable() -> str | None:
    from agspeed.backends.nvrtc import _libs

    version, why = _libs.nvrtc()
    if version is None:
        return why
    driver, why = _libs.cuda()
    if driver is None:
        return why
    return _NOT_BUILT


capabilities = Capabilities(training=True, dynamic=True, devices={"cuda"},
                            unavailable=_unavailable)


def backend(gm: Any, example_inputs: list) -> Callable[..., Any]:
    """Refuses every graph, saying why (see the module's docstring)."""
    raise RuntimeError(f"nvrtc is unavailable: {_unavailable()}")


backend.capabilities = capabilities
