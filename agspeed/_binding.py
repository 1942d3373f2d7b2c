"""Argument binding for inlined calls, as CPython binds a call's arguments.

``bind`` answers the interpreter's question for a function it inlines: which argument
goes to which parameter slot.  Each slot is an argument index or a ``Bind`` kind with its
payload (csrc/protocol.h): a default value, the arguments that go to ``*args``, those
that go to ``**kwargs``.  A call that CPython would refuse (too many positional
arguments, an unknown or repeated keyword, a missing argument) breaks the graph as
``bad_call``, so the frame runs eager and raises CPython's own TypeError.
"""

from __future__ import annotations

from typing import Any

from agspeed._builder_types import GraphBreak
from agspeed.protocol import Bind, Reason


class Binding:
    """The part of ``GraphBuilder`` that binds arguments to parameters."""

    def bind(self, func: Any, nargs: int, kwnames: Any) -> tuple:
        """Parameter slots of ``func`` for a call with ``nargs`` arguments, the last
        ``len(kwnames)`` by keyword (see csrc/interp.c bind_params)."""
        code = func.__code__
        kwnames = tuple(kwnames or ())
        npos = nargs - len(kwnames)
        argc, kwc, posonly = code.co_argcount, code.co_kwonlyargcount, code.co_posonlyargcount
        has_star, has_starstar = bool(code.co_flags & 0x04), bool(code.co_flags & 0x08)
        names = code.co_varnames
        slots: list[Any] = [None] * (argc + kwc)
        for i in range(min(npos, argc)):
            slots[i] = i
        extra = tuple(range(argc, npos))
        if extra and not has_star:
            raise GraphBreak(Reason.BAD_CALL, f"{func.__qualname__}() takes {argc} positional "
                             f"arguments but {npos} were given")
        spill: dict[str, int] = {}
        for j, name in enumerate(kwnames):
            try:
                k = names.index(name, posonly, argc + kwc)
            except ValueError:
                k = -1
            if k >= 0 and slots[k] is None:
                slots[k] = npos + j
            elif k < 0 and has_starstar:
                spill[name] = npos + j
            else:
                raise GraphBreak(Reason.BAD_CALL, f"{func.__qualname__}() got a bad or repeated "
                                 f"keyword argument {name!r}")
        defaults = func.__defaults__ or ()
        kwdefaults = func.__kwdefaults__ or {}
        for k, slot in enumerate(slots):
            if slot is not None:
                continue
            if k < argc and k >= argc - len(defaults):
                slots[k] = (Bind.DEFAULT, defaults[k - (argc - len(defaults))])
            elif k >= argc and names[k] in kwdefaults:
                slots[k] = (Bind.DEFAULT, kwdefaults[names[k]])
            else:
                raise GraphBreak(Reason.BAD_CALL, f"{func.__qualname__}() missing argument "
                                 f"{names[k]!r}")
        if has_star:
            slots.append((Bind.STAR, extra))
        if has_starstar:
            slots.append((Bind.STARSTAR, spill))
        return tuple(slots)
