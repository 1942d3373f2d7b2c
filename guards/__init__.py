"""The guard system: what a cached graph assumed, checked in C before it is reused.

Guard programs, evaluated in C, and the signature hash that keys each code's cache.
So far this package exposes the hash; guard programs come with capture.
"""

from __future__ import annotations

from agspeed._C import signature_hash

__all__ = ["signature_hash"]
