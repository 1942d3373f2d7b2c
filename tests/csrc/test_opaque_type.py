"""_C.opaque_type: which builtin classes show the capture nothing but their class and
attributes, so that an instance only carried through a frame is guarded by its type
(agspeed/_identity.py)."""

import contextvars
import re
import threading

import pytest

from agspeed import _C


def test_a_context_variables_token_is_opaque():
    var = contextvars.ContextVar("opaque_type_var")
    token = var.set(1)
    assert _C.opaque_type(type(token)) is True
    var.reset(token)


@pytest.mark.parametrize("value", [
    contextvars.ContextVar("v"),     # get/set: its value is state
    threading.Lock(),                # a context manager, state
    re.compile("a"),                 # compared and hashed by pattern
    object(),                        # the base class itself: every class derives from it
    range(3), slice(1), 1.0, "s", None, (1,), [1], {1: 2}, b"a",
    iter([1]), memoryview(b"a"), property(), staticmethod(len),
    contextvars.copy_context(),      # a mapping
    len,                             # callable
    type,                            # a class
], ids=lambda v: type(v).__name__)
def test_builtin_objects_with_protocols_are_not(value):
    assert _C.opaque_type(type(value)) is False


def test_a_class_one_can_subclass_or_a_heap_class_is_not():
    class Plain:
        pass

    assert _C.opaque_type(Plain) is False
    assert _C.opaque_type(Exception) is False


def test_a_non_class_is_a_type_error():
    with pytest.raises(TypeError):
        _C.opaque_type(3)
