"""The ``nvrtc_cudagraphs`` backend: nvrtc's fused kernels, each of the forward and the
backward replayed as one CUDA graph.

``nvrtc`` removes the memory traffic between the ops of a chain; the graph that calls
its kernels and aten's still launches each one from Python.  On small models and
batches a GPU step is bound by those launches, which is what CUDA graphs remove: here
the rewritten forward and backward graphs of ``nvrtc`` are recorded on their first call
and replayed by ``cudagraphs``' machinery (static input buffers, outputs copied out of
the graph's memory, the random stream put back).  So its needs are both backends':
CUDA inputs on one device, static sizes, libnvrtc and the driver.
"""

from __future__ import annotations

from typing import Any, Callable

from agspeed.backends._protocol import Capabilities

__all__ = ["backend", "capabilities"]


def _unavailable() -> str | None:
    from agspeed.backends import cudagraphs, nvrtc

    return cudagraphs.capabilities.unavailable() or nvrtc.capabilities.unavailable()


capabilities = Capabilities(training=True, dynamic=False, devices={"cuda"},
                            static_inputs_only=True, unavailable=_unavailable)


def backend(gm: Any, example_inputs: list) -> Callable[..., Any]:
    """``gm`` through ``nvrtc``, its forward and backward replayed as CUDA graphs."""
    from agspeed.backends import cudagraphs, nvrtc

    reason = _unavailable()
    if reason:
        raise RuntimeError(f"nvrtc_cudagraphs is unavailable: {reason}")
    return nvrtc.backend(gm, example_inputs, wrap=cudagraphs.replay)


backend.capabilities = capabilities
