"""The steady-state lookup (csrc/codecache.c "The steady state", agspeed/_tensor_check.py):
a call whose arguments match the last signed entry is a hit without a signature; with the
check on or off the same calls hit the same entries with the same results; the check
keeps no tensor, model or class alive; a closure's tensor is still checked when the
arguments match."""

import gc
import sys
import weakref

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import agspeed  # noqa: E402
from agspeed import _C, _tensor_check  # noqa: E402
from test_checks import Counting  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(params=[True, False], ids=["arg_check", "signature_only"])
def check_on(request):
    _tensor_check.set_enabled(request.param)
    yield request.param
    _tensor_check.set_enabled(True)


def mix(x, w, k: int = 2, tag=None):
    return (x @ w) * k + (0 if tag is None else 1)


def test_torchs_checker_passes_the_self_test_here():
    assert _tensor_check.available(), _tensor_check._state["why"]


def test_repeated_calls_hit_through_the_argument_check(check_on):
    fast = agspeed.optimize(mix, backend="eager", dynamic=False)
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    fast(x, w)
    before = agspeed.counters()["arg_check_hits"]
    for _ in range(20):
        x = torch.randn(3, 4)          # new tensors each call, as in a training loop
        torch.testing.assert_close(fast(x, w), mix(x, w))
    (entry,) = _C.code_cache(mix.__code__)["entries"]
    assert entry.hits == 20 and (entry.arg_check is not None) == check_on
    assert agspeed.counters()["arg_check_hits"] - before == (20 if check_on else 0)


CHANGES = [
    ("dtype", lambda x, w: (x.double(), w.double())),
    ("shape", lambda x, w: (torch.randn(5, 4), w)),
    ("strides", lambda x, w: (torch.randn(4, 3).t(), w)),
    ("requires_grad", lambda x, w: (x.clone().requires_grad_(), w)),
    ("parameter", lambda x, w: (x, nn.Parameter(w.clone()))),
    ("no_grad", None),
    ("non-tensor type", lambda x, w: (x, w, 2.0)),
    ("keyword given", lambda x, w: (x, w, 2, "t")),
    ("same again", lambda x, w: (torch.randn(3, 4), w)),
]


def test_both_paths_see_every_change_and_agree(check_on):
    backend = Counting()
    fast = agspeed.optimize(mix, backend=backend, dynamic=False)
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    log = []
    with agspeed.config.override(recompile_limit=32):
        fast(x, w)
        for name, change in CHANGES:
            if change is None:
                with torch.no_grad():
                    got, want = fast(x, w), mix(x, w)
            else:
                args = change(x, w)
                got, want = fast(*args), mix(*args)
            torch.testing.assert_close(got, want)
            log.append((name, backend.graphs))
    # each change captured once; the last call reused the first entry
    assert [n for _, n in log] == list(range(2, len(CHANGES) + 1)) + [len(CHANGES)]


def test_the_argument_check_keeps_no_tensor_model_or_class_alive():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x)

    net = Net()
    fast = agspeed.optimize(net, backend="eager")
    x = torch.randn(3, 4)
    for _ in range(3):
        fast(x)
    (entry,) = _C.code_cache(Net.forward.__code__)["entries"]
    assert entry.arg_check is not None
    refs = [weakref.ref(net), weakref.ref(x), weakref.ref(type(fast))]
    del net, fast, x, entry
    gc.collect()
    assert [r() is None for r in refs] == [True, True, True]


def test_the_cached_check_follows_evictions(check_on):
    fast = agspeed.optimize(mix, backend="eager", dynamic=False)
    w = torch.randn(4, 2)
    with agspeed.config.override(cache_size_limit=2, recompile_limit=100):
        for _ in range(3):
            for n in (2, 3, 4):
                x = torch.randn(n, 4)
                torch.testing.assert_close(fast(x, w), mix(x, w))
                torch.testing.assert_close(fast(x, w), mix(x, w))   # hit the newest
    assert len(_C.code_cache(mix.__code__)["entries"]) == 2


def closure_over(t):
    def inner(x):
        return x * t.shape[-1] + t.sum()   # the graph folds t's shape
    return inner


def test_a_closure_tensor_is_checked_when_the_arguments_match(check_on):
    """A closure variable is read as a local but is no argument: a matching signature
    (or argument check) must not settle its tensor check."""
    fn = closure_over(torch.randn(3))
    fast = agspeed.optimize(fn, backend="eager", dynamic=False)
    x = torch.randn(3)
    torch.testing.assert_close(fast(x), fn(x))
    fn.__closure__[0].cell_contents = torch.randn(5)
    torch.testing.assert_close(fast(x), fn(x))
    fn.__closure__[0].cell_contents = torch.randn(2, 7, dtype=torch.float64)
    torch.testing.assert_close(fast(x), fn(x))


def test_malformed_argument_checks_are_refused():
    for bad in [(), ((1,), (0,)), ([1], (0,), len), ((1,), (1,), len), ((0,), (0,), len),
                (("int",), (), len), ((1,), (), 42)]:
        with pytest.raises(TypeError, match="arg_check"):
            _C.CacheEntry(_C.ACTION_RUN_EAGER, arg_check=bad)
    ok = _C.CacheEntry(_C.ACTION_RUN_EAGER, arg_check=((id(int), 0), (0,), len))
    assert ok.arg_check[1] == (0,)


def test_entries_made_while_disabled_have_no_check():
    _tensor_check.set_enabled(False)
    try:
        assert _tensor_check.arg_check(mix.__code__, {"x": torch.randn(2)}) is None
    finally:
        _tensor_check.set_enabled(True)
    got = _tensor_check.arg_check(mix.__code__, {"x": torch.randn(2), "w": 3})
    types, where, check = got
    assert types == (id(torch.Tensor), id(int), 0, 0) and where == (0,)
    assert check(torch.randn(2)) is True and check(torch.randn(3)) is False
    sub = type("Sub", (torch.Tensor,), {})
    assert _tensor_check.arg_check(mix.__code__, {"x": torch.randn(2).as_subclass(sub)}) \
        is None
    assert sys.getrefcount(check) >= 2


def test_the_check_rests_while_shapes_cycle_and_comes_back():
    fast = agspeed.optimize(mix, backend="eager", dynamic=False)
    w = torch.randn(4, 2)
    xs = [torch.randn(n, 4) for n in range(2, 8)]
    with agspeed.config.override(recompile_limit=32):
        for x in xs:
            fast(x, w)
        start = agspeed.counters()["arg_check_hits"]
        for _ in range(20):                   # a cycle never matches the last hit
            for x in xs:
                torch.testing.assert_close(fast(x, w), mix(x, w))
        cycling = agspeed.counters()["arg_check_hits"] - start
        start = agspeed.counters()["arg_check_hits"]
        for _ in range(100):                  # steady again: back after its rest
            torch.testing.assert_close(fast(xs[0], w), mix(xs[0], w))
        steady = agspeed.counters()["arg_check_hits"] - start
    assert cycling == 0
    assert 100 - 64 - 1 <= steady < 100


# -- tensors the guard reaches through objects: one checker for all (guards/batch.c) -----


class Held:
    """Tensors a frame reaches through an object of the program, not its arguments."""

    def __init__(self, n):
        self.ts = [torch.randn(3) for _ in range(n)]


HELD = Held(6)


def total(x):
    out = x
    for t in HELD.ts:
        out = out + t
    return out


HELD_CHANGES = [
    ("dtype", lambda t: t.double()),
    ("shape", lambda t: torch.randn(1)),
    ("strides", lambda t: torch.randn(6)[::2]),
    ("requires_grad", lambda t: t.clone().requires_grad_()),
    ("parameter", lambda t: nn.Parameter(t.clone())),
    ("subclass", lambda t: t.clone().as_subclass(type("Sub", (torch.Tensor,), {}))),
]


def _entries():
    return _C.code_cache(total.__code__)["entries"]


@pytest.mark.parametrize("name,change", HELD_CHANGES, ids=[n for n, _ in HELD_CHANGES])
def test_tensors_reached_through_objects_are_confirmed_by_one_checker(name, change):
    agspeed.reset()
    HELD.ts = [torch.randn(3) for _ in range(6)]
    fast = agspeed.optimize(total, backend="eager", dynamic=False)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(fast(x), total(x))
    (entry,) = _entries()
    assert entry.guard._batches()["checkers"] == [(6, True)]
    hits = entry.hits
    for _ in range(5):            # new tensors of the same metadata: the checker passes
        HELD.ts = [torch.randn(3) for _ in range(6)]
        torch.testing.assert_close(fast(x), total(x))
    assert entry.hits == hits + 5
    kept = HELD.ts[3]
    with agspeed.config.override(recompile_limit=32):
        HELD.ts[3] = change(kept)                 # refused by the checker, then by the
        got, want = fast(x), total(x)             # one-by-one check: captured again
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
        assert len(_entries()) == 2
        HELD.ts[3] = kept
        torch.testing.assert_close(fast(x), total(x))
    assert entry.hits == hits + 6 and entry.guard._batches()["stale"] == 0
    agspeed.reset()


def test_the_batch_checker_keeps_no_tensor_alive_and_few_tensors_go_one_by_one():
    agspeed.reset()
    HELD.ts = [torch.randn(3) for _ in range(6)]
    fast = agspeed.optimize(total, backend="eager", dynamic=False)
    x = torch.randn(3)
    for _ in range(2):
        fast(x)
    refs = [weakref.ref(t) for t in HELD.ts]
    HELD.ts = [torch.randn(3) for _ in range(6)]
    fast(x)
    gc.collect()
    assert [r() for r in refs] == [None] * 6
    agspeed.reset()
    HELD.ts = [torch.randn(3) for _ in range(2)]   # below the batch's minimum
    for _ in range(3):
        torch.testing.assert_close(fast(x), total(x))
    (entry,) = _entries()
    assert entry.guard._batches()["checkers"] == []
    agspeed.reset()
