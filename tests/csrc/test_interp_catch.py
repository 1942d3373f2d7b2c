"""A KeyError or IndexError of a subscript, or raised in an inlined function, caught by a
handler of an inlined function (csrc/interp_catch.c): the handler runs in the capture; a
handler of the root frame ends the capture, and one that does not match re-raises to it.
With the recording builder of test_interp.  Torch-free."""

import collections.abc
import gc
import sys

from _calls_recorder import CallsRecorder
from agspeed.protocol import Reason
from test_interp import GraphBreakLike, T, capture


class RaisingRecorder(CallsRecorder):
    """As GraphBuilder.getitem: a failed subscript breaks, caused by what it raised."""

    def getitem(self, container, index, source):
        try:
            return super().getitem(container, index, source)
        except LookupError as exc:
            raise GraphBreakLike(Reason.OP_FAILED, f"raised {exc!r}") from exc


def lookup(d, k, default):
    try:
        return d[k]
    except KeyError:
        return default


def nested(d, k):
    try:
        return lookup_strict(d, k)
    except (IndexError, KeyError) as e:
        return -1


def lookup_strict(d, k):
    return d[k]


def first(xs):
    try:
        return xs[0]
    except IndexError:
        return None


def use(x, d, xs):
    return x * lookup(d, "a", 5), x * lookup(d, "b", 7), nested(d, "c"), first(xs)


def test_a_missing_key_is_caught_by_the_inlined_handler():
    out, b = capture(use, RaisingRecorder(), x=T(), d={"a": 2}, xs=[])
    assert out["status"] == "graph", out
    assert [op[1][1] for op in b.ops] == [2, 7]
    assert out["result"][2:] == (-1, None)


def wrong_handler(d):
    try:
        return d["z"]
    except IndexError:
        return 0


def calls_wrong(x, d):
    return x * wrong_handler(d)


def test_a_handler_that_does_not_match_reraises_to_the_root():
    out, _ = capture(calls_wrong, RaisingRecorder(), x=T(), d={})
    assert out["status"] == "break" and out["reason"] == Reason.RAISE


def root_handler(x, d):
    try:
        return x * d["z"]
    except KeyError:
        return x


def test_the_root_frames_handler_is_not_entered():
    out, _ = capture(root_handler, RaisingRecorder(), x=T(), d={})
    assert out["status"] == "break" and out["reason"] == Reason.OP_FAILED


class Env(collections.abc.Mapping):
    """os.environ's shape: Mapping.get and `in` through a Python __getitem__."""

    def __init__(self, data):
        self._data = data

    def __getitem__(self, key):
        try:
            value = self._data["env_" + key]
        except KeyError:
            raise KeyError(key) from None   # about the caller's key, as os.environ
        return value

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


def env_reads(x, env):
    return env.get("home", "?"), env.get("nope", "dflt"), "nope" in env, "home" in env


def test_mapping_get_and_in_with_present_and_missing_keys():
    out, _ = capture(env_reads, RaisingRecorder(), x=T(), env=Env({"env_home": "/h"}))
    assert out["status"] == "graph", out
    assert out["result"] == ("/h", "dflt", False, True)


def other_error(d):
    try:
        return d["k"] / 0
    except ZeroDivisionError:
        return 0


def calls_other(x, d):
    return x * other_error(d)


def test_other_exceptions_still_end_the_capture():
    out, _ = capture(calls_other, RaisingRecorder(), x=T(), d={"k": 1})
    assert out["status"] == "break" and out["reason"] != Reason.RAISE


def lookup_key(x, d, k):
    return x * lookup(d, k, 3)


def root_lookup(x, d, k):
    try:
        return d[k]
    except KeyError:
        return x


def test_the_exceptions_raised_while_capturing_are_released():
    key = "".join(["mis", "sing"])   # a fresh object, referred to by the KeyErrors
    before = sys.getrefcount(key)
    for fn in (lookup_key, root_lookup, lookup_key):
        out, b = capture(fn, RaisingRecorder(), x=T(), d={}, k=key)
        assert out["status"] == ("graph" if fn is lookup_key else "break")
        del out, b
    gc.collect()
    assert sys.getrefcount(key) == before
