"""``torch._C._group_tensors_by_device_and_dtype`` folded at capture.

torch's foreach paths (``clip_grad_norm_``, ``clip_grad_value_``, the optimizers' foreach
and fused steps) sort lists of tensors into groups of one device and dtype before calling
the ``_foreach_`` operators.  The grouping depends only on each tensor's device and
dtype, which the graph's fake values carry and the guards fix, so it is answered while
capturing: the same dict, keyed ``(device, dtype)``, holding the graph's values in the
places eager's would hold the real tensors.  The order of the groups is torch's own: the
C function is asked about empty stand-ins of the same devices and dtypes.
"""

from __future__ import annotations

from typing import Any

from agspeed._builder_types import GraphBreak
from agspeed.protocol import Reason

__all__ = ["group_by_device_and_dtype"]


def group_by_device_and_dtype(builder: Any, args: tuple, kwargs: dict) -> dict:
    """``_group_tensors_by_device_and_dtype(tensorlistlist, with_indices=False)`` on the
    graph's values: lists of nodes (and None where a list other than the first has no
    tensor)."""
    torch = builder._torch
    names = ("tensorlistlist", "with_indices")
    bound = dict(zip(names, args))
    if len(args) > 2 or set(kwargs) - set(names) or set(kwargs) & set(bound):
        raise GraphBreak(Reason.BAD_CALL, "_group_tensors_by_device_and_dtype() with "
                         "these arguments")
    bound.update(kwargs)
    lists, with_indices = bound.get("tensorlistlist"), bool(bound.get("with_indices", False))
    if type(lists) not in (list, tuple) or not all(type(x) in (list, tuple) for x in lists):
        raise GraphBreak(Reason.BAD_CALL, "_group_tensors_by_device_and_dtype() of a "
                         f"{type(lists).__name__}")
    stand_ins = [[_stand_in(builder, t) for t in each] for each in lists]
    grouped = torch._C._group_tensors_by_device_and_dtype(stand_ins, True)
    out: dict = {}
    for key, (_, indices) in grouped.items():
        tensors = [[each[i] for i in indices] for each in lists]
        kept = list(indices) if with_indices else []
        builder.keep_fresh([*tensors, kept])
        out[key] = (tensors, kept)
    return out


def _stand_in(builder: Any, value: Any) -> Any:
    """An empty tensor of the device and dtype of the graph value ``value``, or None."""
    if value is None:
        return None
    if not isinstance(value, builder.node_type) or not builder.is_tensor(value):
        raise GraphBreak(Reason.UNSUPPORTED_VALUE, "_group_tensors_by_device_and_dtype() "
                         "of a list holding what is not a tensor of the graph")
    fake = value.meta["example_value"]
    return builder._torch.empty(0, device=fake.device, dtype=fake.dtype)
