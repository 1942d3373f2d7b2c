"""The signature hash: XXH3-64 from the system xxHash library.  Torch-free."""

import pytest

import agspeed.guards
from agspeed import _C


def test_known_vector_of_the_empty_input():
    assert _C.signature_hash(b"") == 0x2D06800538D394C2


def test_data_and_seed_change_the_hash():
    base = _C.signature_hash(b"float32:4x8:cpu")
    assert _C.signature_hash(b"float32:4x9:cpu") != base
    assert _C.signature_hash(b"float32:4x8:cpu", seed=1) != base
    assert _C.signature_hash(b"float32:4x8:cpu", seed=0) == base
    assert 0 <= base < 2**64


def test_accepts_any_bytes_like_object():
    data = b"\x00\x01\x02" * 50
    expected = _C.signature_hash(data)
    assert _C.signature_hash(bytearray(data)) == expected
    assert _C.signature_hash(memoryview(data)) == expected


def test_rejects_text():
    with pytest.raises(TypeError):
        _C.signature_hash("text")


def test_guards_package_exposes_the_same_function():
    assert agspeed.guards.signature_hash is _C.signature_hash
