"""The guard system: what a cached graph assumed, checked in C before it is reused.

* ``Guard`` (guard.py): a capture's assumptions as checks, compiled into the C guard
  program it extends (``agspeed._C.GuardProgram``: guards/program.c, with load.c,
  check.c and memo.c), which the frame hook runs on every lookup of a cache entry;
  ``ArgumentTypes``, the guard of a function that did no tensor work.
* ``checks`` (checks.py): one class per check kind (``agspeed.protocol.Check``): how it
  compiles for C, whether a value passes, how a failure reads.
* ``global_state`` (state.py): torch's global state a guard checks, and its probes.
* ``signature_hash``: the 64-bit hash (guards/signature.c) that keys each code's cache.
"""

from __future__ import annotations

from agspeed._C import GuardProgram, signature_hash
from agspeed.guards.checks import KINDS, CheckKind
from agspeed.guards.guard import ArgumentTypes, Guard, SameObjects, arg_names
from agspeed.guards.state import global_state

__all__ = ["ArgumentTypes", "CheckKind", "Guard", "GuardProgram", "KINDS", "arg_names",
           "global_state", "signature_hash"]
