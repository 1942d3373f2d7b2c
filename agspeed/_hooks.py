"""Module forward hooks, captured: what the interpreter inlines for a hooked module's call.

A module called with forward pre-hooks or forward hooks used to break the graph at the
call (``Module.__call__`` runs them, and it is torch's code).  ``hooked`` is that part of
``Module.__call__`` written out, with the same order and rules: pre-hooks see
``(module, args)`` (or ``(module, args, kwargs)`` when registered ``with_kwargs``) and may
replace the arguments, forward hooks see the arguments and the result and may replace
the result.  The interpreter inlines it like any Python function, so the hooks' tensor
work joins the graph and their guards (the hook dicts, each hook) join the entry's.

``capturable`` says which hooks qualify: plain functions and bound methods of code
outside torch (a user's logging or masking hook, transformers'
``enable_input_require_grads``).  Backward hooks, global hooks and torch's own hooks
(FSDP's all-gathers, parametrizations, pruning) still break the graph at the call, where
``Module.__call__`` runs them eagerly as before.
"""

from __future__ import annotations

import types
from typing import Any

__all__ = ["capturable", "hooked"]

# hook dicts Module.__call__ reads; the first two are what ``hooked`` runs
FORWARD = ("_forward_pre_hooks", "_forward_hooks")
OTHERS = ("_backward_hooks", "_backward_pre_hooks")


def hooked(module: Any, *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` with its forward pre-hooks and forward hooks."""
    for hook_id, hook in module._forward_pre_hooks.items():
        if hook_id in module._forward_pre_hooks_with_kwargs:
            both = hook(module, args, kwargs)
            if both is not None:
                if isinstance(both, tuple) and len(both) == 2:
                    args, kwargs = both
                else:
                    raise RuntimeError("forward pre-hook must return None or a tuple of "
                                       f"(new_args, new_kwargs), but got {both}.")
        else:
            replaced = hook(module, args)
            if replaced is not None:
                args = replaced if isinstance(replaced, tuple) else (replaced,)
    result = module.forward(*args, **kwargs)
    for hook_id, hook in module._forward_hooks.items():
        if hook_id in module._forward_hooks_with_kwargs:
            replaced = hook(module, args, kwargs, result)
        else:
            replaced = hook(module, args, result)
        if replaced is not None:
            result = replaced
    return result


def _user_code(fn: Any) -> bool:
    if type(fn) is types.MethodType:
        fn = fn.__func__
    if type(fn) is not types.FunctionType:
        return False
    module = fn.__module__ or ""
    return not (module == "torch" or module.startswith("torch."))


def capturable(hooks: dict) -> bool:
    """Whether every hook in these dicts of a module (its ``__dict__``) can be inlined:
    forward ones only, each a function or method of code outside torch."""
    if any(hooks.get(name) for name in OTHERS):
        return False
    return all(_user_code(hook) for name in FORWARD for hook in (hooks.get(name) or {})
               .values())
