"""Operations handed a one-element tensor where they take a Python number.

``x.addcmul_(a, b, value=t)``, ``torch._foreach_lerp_(xs, ys, t)``,
``torch._foreach_pow(t, ys)`` with ``t`` a 0-dim tensor (an optimizer's tensor learning
rate or step, a weight computed by the model): eager reads the number out of ``t``,
which a capture cannot do, since the graph computes or receives ``t``.  Where such a call
fails so while recording (the fake run asks for the value), it is recorded as what it
computes with ``t`` as a tensor operand (one that requires grad eager refuses, and so
does the fake run, before this):

* ``addcmul``/``addcdiv`` (function, method, in place): ``x + (a * b) * t`` and
  ``x + (a / b) * t``, in place ``x.add_(...)``;
* a ``_foreach_`` operation: the same operation on each element, the list arguments
  taken item by item and the rest as given, the in-place ones answering their first
  argument as eager does, the others a tuple.  Only the elementwise families are taken,
  and only where every tensor given whole is 0-dim (one value for every element).

``rewrite`` answers ``NOT_HANDLED`` for anything else: the caller's graph break stands.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NOT_HANDLED", "rewrite"]

NOT_HANDLED = object()

# addc<op>: the product of its two operands
_ADDC = {"addcmul": "mul", "addcdiv": "div"}
# the _foreach_ families that are their base operation applied to each element
_FOREACH = frozenset({"add", "sub", "mul", "div", "pow", "lerp", "addcmul", "addcdiv",
                      "clamp_min", "clamp_max", "maximum", "minimum", "copy"})


def rewrite(builder: Any, kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
    """The recorded result of ``target`` (a call the fake run refused for reading a
    tensor's value) computed with the tensor as an operand; ``NOT_HANDLED`` where it is
    not one of the operations above."""
    torch = builder._torch
    name = target if kind == "call_method" else getattr(target, "__name__", "")
    if not isinstance(name, str):
        return NOT_HANDLED
    if kind == "call_function" and name.startswith("_foreach_") and \
            getattr(torch, name, None) is target:
        return _foreach(builder, name[len("_foreach_"):], args, kwargs)
    base = name[:-1] if name.endswith("_") else name
    if base in _ADDC and (kind == "call_method" or getattr(torch, base, None) is target):
        return _addc(builder, base, name != base, args, kwargs)
    return NOT_HANDLED


def _scalar_tensor(builder: Any, value: Any) -> bool:
    """Whether ``value`` is a node of a 0-dim tensor."""
    if type(value) is not builder.node_type:
        return False
    fake = value.meta.get("example_value")
    return isinstance(fake, builder._torch.Tensor) and fake.dim() == 0


def _addc(builder: Any, base: str, inplace: bool, args: tuple, kwargs: dict) -> Any:
    value = kwargs.get("value")
    if len(args) != 3 or set(kwargs) != {"value"} or not _scalar_tensor(builder, value):
        return NOT_HANDLED
    torch = builder._torch
    x, a, b = args
    product = builder.call_function(getattr(torch, _ADDC[base]), (a, b))
    scaled = builder.call_function(torch.mul, (product, value))
    if inplace:
        return builder.call_method("add_", (x, scaled))
    return builder.call_function(torch.add, (x, scaled))


def _foreach(builder: Any, base: str, args: tuple, kwargs: dict) -> Any:
    inplace = base.endswith("_")
    op = base[:-1] if inplace else base
    if op not in _FOREACH:
        return NOT_HANDLED
    lists = [a for a in args if type(a) in (list, tuple)]
    if not lists or len({len(a) for a in lists}) != 1:
        return NOT_HANDLED
    whole = [a for a in (*args, *kwargs.values()) if type(a) not in (list, tuple)]
    if any(type(a) is builder.node_type and not _scalar_tensor(builder, a) for a in whole):
        return NOT_HANDLED
    torch = builder._torch
    if not inplace and getattr(torch, op, None) is None:
        return NOT_HANDLED
    out = []
    for k in range(len(lists[0])):
        each = tuple(a[k] if type(a) in (list, tuple) else a for a in args)
        if inplace:
            out.append(builder.call_method(base, each, dict(kwargs)))
        else:
            out.append(builder.call_function(getattr(torch, op), each, dict(kwargs)))
    return args[0] if inplace else tuple(out)   # as eager answers
