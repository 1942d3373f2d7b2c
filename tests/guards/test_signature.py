"""The signature hash: XXH3-64 from the system xxHash library.  Torch-free."""

import ctypes
import ctypes.util
import random

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


def _system_xxh3():
    name = ctypes.util.find_library("xxhash")
    if name is None:
        pytest.skip("the system xxHash library is not loadable with ctypes")
    fn = getattr(ctypes.CDLL(name), "XXH3_64bits_withSeed", None)
    if fn is None:
        pytest.skip("the system xxHash library has no XXH3")
    fn.restype = ctypes.c_uint64
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
    return fn


# XXH3 has separate code paths for these length classes: 0, 1-3, 4-8, 9-16, 17-128,
# 129-240 and longer; every one must see all of the data and the seed.
@pytest.mark.parametrize("length", [0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 4096])
def test_matches_the_system_library_on_every_length_class(length):
    xxh3 = _system_xxh3()
    data = random.Random(length).randbytes(length)
    for seed in (0, 1, 2**63 + 12345):
        assert _C.signature_hash(data, seed=seed) == xxh3(data, length, seed)


# -- frame signatures (guards/signature.c) -------------------------------------------------


def two_args(a, b=1, *rest, key=None, **extra):
    return a


def test_frame_signature_follows_argument_types_only_for_non_tensors():
    code = two_args.__code__
    sig = _C.frame_signature
    base = sig(code, {"a": 1, "b": 2, "rest": (), "key": None, "extra": {}})
    assert base == sig(code, {"a": 5, "b": 7, "rest": (3,), "key": None, "extra": {}})
    assert base != sig(code, {"a": 1.0, "b": 2, "rest": (), "key": None, "extra": {}})
    assert base != sig(code, {"b": 2, "rest": (), "key": None, "extra": {}})  # a unbound
    # locals beyond the arguments do not count
    assert base == sig(code, {"a": 1, "b": 2, "rest": (), "key": None, "extra": {},
                              "other": object()})
    with pytest.raises(TypeError):
        sig(code, [])


def test_signature_bits_are_validated_and_mask_the_hash():
    code = two_args.__code__
    frame = {"a": 1.5, "b": 2, "rest": (), "key": None, "extra": {}}
    try:
        _C._set_signature_bits(3)
        assert _C.frame_signature(code, frame) < 8
    finally:
        _C._set_signature_bits(64)
    for bad in (0, 65):
        with pytest.raises(ValueError):
            _C._set_signature_bits(bad)
