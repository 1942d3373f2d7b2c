"""What ``optimize`` was handed: its code is captured, and its first call is watched.

Roots.  The hook skips torch's files, the standard library and agspeed's own code, so that
the frames a model reaches outside a captured frame (``Module.__call__``, hooks, library
helpers) cost nothing.  That rule is for frames reached, not for the object the user
asked to optimize: ``optimize(nn.Sequential(...))`` or ``optimize(nn.TransformerEncoder
(...))`` has its root ``forward`` in torch's files, and skipping it would leave nothing
captured.  So ``optimize`` registers the root's code here (``take``), and each call of the
optimized object says, for its thread, which code its root frame runs (``expecting``).
The runtime (``agspeed._runtime.Context._decide``) captures a frame of registered code
when it is that expected root, and otherwise answers ``PASS``: run untouched, remember
nothing, since the same code reached elsewhere (an ``nn.Sequential`` called from a user
frame that runs eager) is torch's code like any other.  A registered code object never
carries the hook's skip mark, which would hide its root frames too; the price is one
decision in Python each time such code is reached outside its root, and only while an
optimized call is running.  Distributed wrappers are not roots: DDP's and FSDP's own
``forward`` runs eager by design and the module they wrap is what gets captured.

The first call.  When a call of an optimized object ran no compiled graph at all, the user
would otherwise learn it only from the speed.  The first call of each optimized object
runs through a watcher that then steps aside (a Region's callable is swapped back), and
which logs once, on the ``agspeed`` logger, what the runtime decided for the frames of
that call: a warning when frames broke or were skipped, a note at INFO when the call
simply did no tensor work.  A call that raises is not reported: the error is the news.
"""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from typing import Any

from agspeed import _C

__all__ = ["add", "call_expecting", "claim", "is_root", "root_code", "take",
           "watch_first_call"]

_log = logging.getLogger("agspeed")
_ROOTS: "weakref.WeakSet[Any]" = weakref.WeakSet()


class _Expected(threading.local):
    code: Any = None


_expected = _Expected()

# Modules whose forward is a distributed wrapper's machinery: it runs eager, and the module
# it wraps is what gets captured.
_NOT_ROOTS = ("torch.nn.parallel", "torch.distributed", "torch.nn.utils.parametrize")


def add(code: Any) -> None:
    """Capture ``code`` wherever its file is, and lift a skip it already carries."""
    _ROOTS.add(code)
    _C.unmark_skip(code)


def is_root(code: Any) -> bool:
    """True for code registered by ``add`` (and still alive)."""
    return code in _ROOTS


def take(obj: Any, is_module: bool) -> Any:
    """Register ``obj``'s root code (``root_code``) if it needs it; that code, or None."""
    code = root_code(obj, is_module)
    if code is not None:
        add(code)
    return code


def call_expecting(code: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, whose root frame runs ``code``, on this thread."""
    saved, _expected.code = _expected.code, code
    try:
        return fn(*args, **kwargs)
    finally:
        _expected.code = saved


def claim(code: Any) -> bool:
    """True once for the root frame of the call ``call_expecting`` made on this thread."""
    if _expected.code is code:
        _expected.code = None
        return True
    return False


def _function_of(obj: Any, is_module: bool) -> Any:
    """The function ``optimize(obj)`` runs first (a module's forward)."""
    fn = getattr(type(obj), "forward", None) if is_module else obj
    fn = inspect.unwrap(fn) if callable(fn) else fn
    return getattr(fn, "__func__", fn)  # a bound or class method


def code_of(obj: Any, is_module: bool) -> Any:
    """The code object of ``obj`` (a module's forward's), or None where it has none."""
    return getattr(_function_of(obj, is_module), "__code__", None)


def root_code(obj: Any, is_module: bool) -> Any:
    """The code object whose frames ``optimize(obj)`` must capture even in skipped files,
    or None when ``obj``'s code is user code (captured anyway) or is not Python."""
    from agspeed._runtime import is_runtime_code

    fn = _function_of(obj, is_module)
    code = getattr(fn, "__code__", None)
    if code is None or not is_runtime_code(code.co_filename):
        return None
    owner = getattr(fn, "__module__", None) or ""
    if owner.startswith(_NOT_ROOTS) or owner.split(".")[0] == "agspeed":
        return None
    return code


def watch_first_call(region: Any, obj: Any, is_module: bool) -> None:
    """Make ``region``'s next call report, once, when it ran no compiled graph."""
    from agspeed import _runtime

    fn = region.__agspeed_fn__
    what, code = describe(obj), code_of(obj, is_module)

    def first_call(*args: Any, **kwargs: Any) -> Any:
        from agspeed.guards.state import in_transform

        if in_transform():
            return fn(*args, **kwargs)  # under torch.func nothing is captured: not yet
        region.__agspeed_fn__ = fn  # later calls go straight to fn
        before = _C.counters()["graph_calls"]
        mark = _runtime.records_mark()
        result = fn(*args, **kwargs)
        if _C.counters()["graph_calls"] == before and _C.is_enabled():
            with _C.Scope(None):  # the log's handlers are not the program's frames
                _report(what, _runtime.records_since(mark), code)
        return result

    region.__agspeed_fn__ = first_call


def _report(what: str, records: list, code: Any = None) -> None:
    decisions = [r for r in records if r.decision != "captured"]
    broke = [r for r in decisions if "no tensor work" not in r.decision]
    if not records:
        entries = _C.code_cache(code)["entries"] if code is not None else []
        if any(e.action == _C.ACTION_RUN_EAGER for e in entries):
            why = ("its code runs eager by a decision made earlier in this process: the "
                   "recompile limit, or an earlier call with these inputs that did no "
                   "tensor work (AGSPEED_LOG=frames,recompiles says which)")
        else:
            why = ("no frame of it reached the runtime: its code runs untouched (skipped "
                   "as library code, or disabled)")
        _log.warning("agspeed: nothing was captured in the first call of %s: %s", what, why)
        return
    shown = "; ".join(str(r) for r in (broke or decisions)[:4])
    more = f" (and {len(decisions) - 4} more)" if len(decisions) > 4 else ""
    if broke:
        _log.warning("agspeed: nothing was captured in the first call of %s: %s%s",
                     what, shown, more)
    else:
        _log.info("agspeed: the first call of %s did no tensor work: %s%s", what, shown, more)


def describe(obj: Any) -> str:
    """How the log names an optimized object."""
    kind = type(obj)
    name = getattr(obj, "__qualname__", None) or kind.__qualname__
    module = getattr(obj, "__module__", None) or kind.__module__
    return f"{module}.{name}" if module and module != "builtins" else str(name)
