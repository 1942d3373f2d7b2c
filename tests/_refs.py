"""Refcount checks shared by the cache tests."""

import gc
import sys


def assert_not_held(call, obj, times=5):
    """``call(obj)`` returns ``obj`` itself ``times`` times and leaves its reference
    count where it was: nothing the entry keeps holds it."""
    gc.collect()
    before = sys.getrefcount(obj)
    for _ in range(times):
        assert call(obj) is obj
    gc.collect()
    assert sys.getrefcount(obj) == before
