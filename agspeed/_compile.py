"""The compile step: a finished capture made into the ``CALL`` entry that runs it.

The captured GraphModule goes to the context's backend through
``backends.autotune.compile_graph`` (for ``"auto"`` the autotuner, which chooses a
backend for this graph); a training graph of a module under DDP is cut into pieces
first, each compiled so (``agspeed._ddp``), and a training graph compiled outside DDP
is cut the first time it runs under one (``_ddp.later``).  A backend that cannot take
the graph, or fails on it, is logged with a warning and the graph runs as captured
(``gm.forward``): the entry runs either way.  The new entry's guards and graph are
logged here (``guards`` and ``graphs`` topics), once per entry.

Which entries exist, and whether a capture gets one at all, is decided before this step
(``agspeed._policy``, ``agspeed._runtime``).
"""

from __future__ import annotations

import logging
from typing import Any

from agspeed import log

__all__ = ["compile_capture", "compiled_entry"]

_guards_log = log.get("guards")
_graphs_log = log.get("graphs")
_internal_log = logging.getLogger("agspeed")


def compile_capture(ctx: Any, result: Any, where: str) -> Any:
    """The graph of ``result`` (a ``_capture.Capture``) compiled by ``ctx``'s backend;
    its own forward, with a warning saying why, when the backend could not take it."""
    from agspeed import _ddp
    from agspeed._assume import checked
    from agspeed._numpy import numpy_outputs
    from agspeed.backends.autotune import compile_graph

    gm = result.graph_module
    gm.meta["agspeed_where"] = where
    gm.meta["agspeed_options"] = ctx.options
    inputs = result.example_inputs
    ddp = _ddp.active()
    if ddp is not None and _ddp.wants_cut(ctx.backend, inputs, ddp):
        compiled, failed = _ddp.compile_cut(ctx.backend_name, ctx.backend, gm, inputs, ddp)
    else:
        compiled, failed = compile_graph(ctx.backend_name, ctx.backend, gm, inputs)
        if ddp is None and not failed:
            compiled = _ddp.later(ctx.backend_name, ctx.backend, gm, inputs, compiled)
    if failed:
        _internal_log.warning("agspeed: %s: %s; its graph runs eagerly", where, failed)
    # branches assumed are checked first: their tested tensors follow the result
    return numpy_outputs(gm.meta.get("agspeed_numpy"), checked(gm, compiled))


def compiled_entry(ctx: Any, code: Any, where: str, result: Any, f_locals: dict) -> Any:
    """The ``CALL`` entry of ``ctx`` for ``result``, a capture of a frame of ``code``
    with ``f_locals``: the graph compiled, then the entry's guards and graph logged."""
    from agspeed._capture import make_entry
    from agspeed._tensor_check import arg_check

    compiled = compile_capture(ctx, result, where)
    if log.enabled("guards"):
        _guards_log.info("%s guards:\n  %s", where, "\n  ".join(result.guard.lines()))
    if log.enabled("graphs"):
        _graphs_log.info("%s captured:\n%s", where, result.graph_module.code)
    return make_entry(result, compiled, ctx, arg_check(code, f_locals))
