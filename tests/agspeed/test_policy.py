"""The cache size limit: a function keeps at most ``cache_size_limit`` entries, a new one
beyond it evicts the least recently used with a log line, evicted entries still count
toward ``recompile_limit`` (no eviction storm), and results stay equal to eager's."""

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402
from agspeed import _C  # noqa: E402
from test_checks import logged  # noqa: E402

pytestmark = pytest.mark.torch


def work(x):
    return x * 2 + 1


def _entries():
    return _C.code_cache(work.__code__)["entries"]


def _sizes(n):
    return [torch.randn(k + 1) for k in range(n)]


def test_the_least_recently_used_entry_is_evicted_and_logged():
    opt = agspeed.optimize(work, backend="eager", dynamic=False)
    a, b, c, d = _sizes(4)
    with agspeed.config.override(cache_size_limit=3, recompile_limit=100), \
            logged("recompiles") as messages:
        for x in (a, b, c):
            torch.testing.assert_close(opt(x), work(x))
        opt(a)          # a is used again: b is now the least recently used
        opt(c)
        torch.testing.assert_close(opt(d), work(d))
    assert len(_entries()) == 3
    shapes = sorted(e.guard.lines()[0] for e in _entries())
    assert not any("shape=[2]" in s for s in shapes), shapes   # b's entry went
    assert any("shape=[1]" in s for s in shapes)
    evictions = [m for m in messages if "evicted" in m]
    assert len(evictions) == 1
    assert "work" in evictions[0] and "cache size limit (3)" in evictions[0]
    assert "shape=[2]" in evictions[0]
    (rec,) = [r for r in agspeed.recompiles() if r.function.startswith("work")]
    assert rec.evictions == 1


def test_an_evicted_shape_is_captured_again_and_correct():
    opt = agspeed.optimize(work, backend="eager", dynamic=False)
    xs = _sizes(5)
    with agspeed.config.override(cache_size_limit=2, recompile_limit=100):
        for _ in range(3):
            for x in xs:
                torch.testing.assert_close(opt(x), work(x))
                assert len(_entries()) <= 2


def test_evictions_count_toward_the_recompile_limit():
    opt = agspeed.optimize(work, backend="eager", dynamic=False)
    xs = _sizes(4)
    with agspeed.config.override(cache_size_limit=2, recompile_limit=5):
        for _ in range(4):     # a cycle of 4 shapes over 2 places
            for x in xs:
                torch.testing.assert_close(opt(x), work(x))
    captured = [r for r in agspeed._runtime.frame_records()
                if r.name == "work" and r.decision == "captured"]
    assert len(captured) == 5
    assert any("recompile limit" in r.decision for r in agspeed._runtime.frame_records())


def test_an_evicted_entry_and_its_graph_are_freed():
    opt = agspeed.optimize(work, backend="eager", dynamic=False)
    x, y = _sizes(2)
    with agspeed.config.override(cache_size_limit=1, recompile_limit=100):
        opt(x)
        (first,) = _entries()
        ref = weakref.ref(first)
        gm_ref = weakref.ref(first.compiled.graph_module)
        del first
        opt(y)
    gc.collect()
    assert ref() is None and gm_ref() is None
    assert len(_entries()) == 1


def test_evict_refuses_bad_arguments_and_ignores_unknown_entries():
    with pytest.raises(TypeError):
        _C.evict("not code", None)
    assert _C.evict(work.__code__, object()) is False
