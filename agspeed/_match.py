"""The match statement's instructions, as the capture follows them.

``MATCH_CLASS``, ``MATCH_KEYS`` and ``GET_LEN`` are run as calls of the functions
below, inlined like the program's own code (csrc/interp_match.c): each reads the subject
the way the instruction does (``isinstance``, ``__match_args__``, attributes, ``in`` and
items, ``len``), so every read is guarded as the program's own reads are and a subject
that is a tensor, a batch object or the program's dict is matched without a break.
``MATCH_MAPPING`` and ``MATCH_SEQUENCE`` read only the subject's class (its
``Py_TPFLAGS_MAPPING`` / ``Py_TPFLAGS_SEQUENCE``), answered in C.

Where the instruction raises (a pattern the class does not accept), so does the function:
the capture stops there and the frame runs eager, which raises CPython's own error.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["get_len", "match_class", "match_keys"]

# _Py_TPFLAGS_MATCH_SELF: the builtin classes (and their subclasses) whose one positional
# sub-pattern matches the subject itself (``case int(n)``)
_MATCH_SELF = 1 << 22
_NOT_A_CLASS = "called match pattern must be a " + \
    ("type" if sys.version_info < (3, 12) else "class")


def get_len(subject: Any) -> int:
    return len(subject)


def match_keys(subject: Any, keys: tuple) -> tuple | None:
    """The values of ``keys`` in the mapping ``subject``, or None where one is missing."""
    values = []
    for key in keys:
        if key not in subject:
            return None
        values.append(subject[key])
    return tuple(values)


def _attribute(subject: Any, name: Any, seen: list, cls: type) -> tuple:
    """``(found, value)`` of one attribute a class pattern names."""
    if type(name) is not str:
        raise TypeError(f"__match_args__ elements must be strings "
                        f"(got {type(name).__name__})")
    if name in seen:
        raise TypeError(f"{cls.__name__}() got multiple sub-patterns for attribute "
                        f"{name!r}")
    seen.append(name)
    if not hasattr(subject, name):
        return False, None
    return True, getattr(subject, name)


def match_class(subject: Any, cls: Any, count: int, names: tuple) -> tuple | None:
    """``case cls(p0, ..., name=p)``: the attributes the sub-patterns match (the
    subject itself for a builtin class's one positional sub-pattern), or None where the
    subject is not an instance or lacks one of them."""
    if not isinstance(cls, type):
        raise TypeError(_NOT_A_CLASS)
    if not isinstance(subject, cls):
        return None
    attrs, wanted = [], list(names)
    if count:
        if hasattr(cls, "__match_args__"):
            match_args = cls.__match_args__
            if type(match_args) is not tuple:
                raise TypeError(f"{cls.__name__}.__match_args__ must be a tuple "
                                f"(got {type(match_args).__name__})")
            if count > len(match_args):
                raise TypeError(f"{cls.__name__}() accepts {len(match_args)} positional "
                                f"sub-pattern{'' if len(match_args) == 1 else 's'} "
                                f"({count} given)")
            wanted[:0] = match_args[:count]
        elif cls.__flags__ & _MATCH_SELF:
            if count > 1:
                raise TypeError(f"{cls.__name__}() accepts 1 positional sub-pattern "
                                f"({count} given)")
            attrs.append(subject)
        else:
            raise TypeError(f"{cls.__name__}() accepts 0 positional sub-patterns "
                            f"({count} given)")
    seen: list = []
    for name in wanted:   # the positional sub-patterns' attributes, then the keywords'
        found, value = _attribute(subject, name, seen, cls)
        if not found:
            return None
        attrs.append(value)
    return tuple(attrs)
