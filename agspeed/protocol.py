"""The kinds that cross between C and Python, as the C core defines them.

Every kind the interpreter, the builder, the guard compiler and the guard programs
exchange (break reasons, builder operations, call plans, attribute answers, parameter
bindings, comparisons, guard loads, check kinds, program flags), and the fused kernels'
instructions and storage types, is one row of a table in csrc/protocol.h.  The extension exports the tables (``agspeed._C.PROTOCOL``) and this
module makes one ``IntEnum`` of each, so Python names a kind by its member and C receives
the member's value: nothing is copied by hand, and a value C does not know fails loudly
there.

Members carry the table's columns: ``.doc`` (what it means) on every member,
``.id`` (the lower-case name: sources' tags, reason ids in logs), ``Reason.hint``,
``Compare.op`` ("<", "in"...), ``SizeOp.immediates`` and ``GuardFlag`` values that are
bits.
"""

from __future__ import annotations

import enum
from typing import Any

from agspeed import _C

__all__ = ["Action", "Attr", "Bind", "BuilderOp", "Check", "Compare", "GuardFlag", "Load",
           "KernelKind", "KernelOp", "KernelType", "Part", "Plan", "Reason", "SizeOp", "check_builder"]


def _table(name: str, table: str, columns: tuple[str, ...], flag: bool = False) -> Any:
    rows = _C.PROTOCOL[table]
    base = enum.IntFlag if flag else enum.IntEnum
    cls = base(name, [(row[0], row[1]) for row in rows], module=__name__)
    for row in rows:
        member = cls[row[0]]
        member.id = row[0].lower()
        for column, value in zip(columns, row[2:]):
            setattr(member, column, value)
    cls.by_id = {m.id: m for m in cls}
    return cls


Action = _table("Action", "action", ("doc",))
Reason = _table("Reason", "reason", ("what", "hint"))
BuilderOp = _table("BuilderOp", "builder_op", ("doc",))
Plan = _table("Plan", "plan", ("doc",))
Attr = _table("Attr", "attr", ("doc",))
Bind = _table("Bind", "bind", ("doc",))
Compare = _table("Compare", "compare", ("op", "doc"))
Load = _table("Load", "load", ("doc",))
Check = _table("Check", "check", ("doc",))
Part = _table("Part", "part", ("doc",))
GuardFlag = _table("GuardFlag", "guard_flag", ("doc",), flag=True)
SizeOp = _table("SizeOp", "size_op", ("immediates", "doc"))
KernelOp = _table("KernelOp", "kernel_op", ("operands", "doc"))
KernelKind = _table("KernelKind", "kernel_kind", ("doc",))
KernelType = _table("KernelType", "kernel_type", ("ctype", "bytes", "doc"))

for _member in Reason:
    _member.doc = _member.what


def check_builder(cls: type) -> type:
    """Refuses a builder class that lacks a method for any ``BuilderOp``: the interpreter
    calls each by its name."""
    missing = [op.id for op in BuilderOp if not callable(getattr(cls, op.id, None))]
    if missing:
        raise TypeError(f"{cls.__name__} lacks the builder operations {missing} that the "
                        f"interpreter calls (csrc/protocol.h AGS_BUILDER_OP_LIST)")
    return cls
