"""The ``eager`` backend: run the captured graph as it is, through its own ``forward``.

No compilation, so it is the reference the other backends are checked against and the
fastest to be ready.  Works for any ``torch.fx.GraphModule`` on any device.
"""

from __future__ import annotations

from typing import Any, Callable

from agspeed.backends._protocol import Capabilities


def backend(gm: Any, example_inputs: list) -> Callable[..., Any]:
    """Return the GraphModule's forward, unchanged."""
    return gm.forward


# any device, training, graphs with symbolic sizes: they run as they are
backend.capabilities = Capabilities(float_inputs=True)
