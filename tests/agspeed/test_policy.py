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


class Cell(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).relu()


def _cell_entries():
    return _C.code_cache(Cell.forward.__code__)["entries"]




def test_entries_of_freed_objects_are_dropped_and_do_not_count():
    """A sweep optimizes one model after another: the entries of the freed ones can never
    pass again, so they are evicted and do not run the later models eager."""
    with agspeed.config.override(recompile_limit=3):
        for _ in range(6):
            model = Cell()
            opt = agspeed.optimize(model, backend="eager")
            x = torch.randn(2, 4)
            torch.testing.assert_close(opt(x), model(x))
            entries = [e for e in _cell_entries() if e.guard is not None]
            assert len(entries) == 1, [e.guard.lines()[:1] for e in entries]
            assert entries[0].compiled is not None      # a graph, not the limit's eager
            del model, opt, entries
            gc.collect()


def test_the_recompile_limit_counts_per_object():
    """Instances alive together each get their own entries; one that reaches the limit
    runs eager alone, and the others go on being captured."""
    models = [Cell() for _ in range(5)]
    opts = [agspeed.optimize(m, backend="eager", dynamic=False) for m in models]
    with agspeed.config.override(recompile_limit=3):
        for opt, model in zip(opts, models):
            x = torch.randn(2, 4)
            torch.testing.assert_close(opt(x), model(x))
        assert sum(e.compiled is not None for e in _cell_entries()) == 5
        busy = opts[0]
        for n in range(3, 7):                   # new shapes: the first model's limit
            x = torch.randn(n, 4)
            torch.testing.assert_close(busy(x), models[0](x))
        graphs = [e for e in _cell_entries() if e.compiled is not None]
        eager = [e for e in _cell_entries() if e.compiled is None]
        assert len(graphs) == 5 + 2 and len(eager) == 1
        assert "is the same Cell" in eager[0].guard.lines()[0]
        assert eager[0].guard({"self": opts[0], "x": x}, {}, {})
        assert not eager[0].guard({"self": opts[1], "x": x}, {}, {})
        x = torch.randn(9, 4)                   # another model still captures
        torch.testing.assert_close(opts[1](x), models[1](x))
        assert sum(e.compiled is not None for e in _cell_entries()) == 5 + 3
    del opts, models, graphs, eager, busy, opt, model
    gc.collect()
    assert not [e for e in _cell_entries() if e.guard is not None
                and not (hasattr(e.guard, "gone") and e.guard.gone())]
