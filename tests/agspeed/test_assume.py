"""Branches assumed where the other way only raises (agspeed/_assume.py).

A value check (`if not valid.all(): raise ValueError(...)`, `assert (x >= 0).all()`,
torch.distributions' argument validation) is captured into the graph instead of breaking
it; on inputs that pass, results and gradients are eager's, on fresh random inputs; on an
input that fails, the frame runs eager and raises eager's error, with eager's message,
once; the program's objects and the RNG see one run, not two.  Graphs that change their
inputs in place or draw random numbers after the check are not assumed (the check is a
break, as before).
"""

import gc
import operator
import sys
import weakref

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch


def _error(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 (the error itself is compared)
        return type(exc), str(exc)
    return None


def _fallbacks():
    return agspeed.counters()["assumption_fallbacks"]


def checked_scale(x, w):
    if not torch.isfinite(x).all():
        raise ValueError(f"expected finite values, got a tensor of shape {tuple(x.shape)}")
    y = (x @ w).tanh()
    if (y.abs() > 1).any():
        raise RuntimeError("tanh out of range")
    return y * 2 + 1


def test_a_value_check_is_one_graph_with_eager_results_and_errors():
    explained = agspeed.explain(checked_scale, torch.randn(4, 3), torch.randn(3, 5))
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    opt = agspeed.optimize(checked_scale)
    for _ in range(3):
        x = torch.randn(4, 3, requires_grad=True)
        w = torch.randn(3, 5, requires_grad=True)
        want, got = checked_scale(x, w), opt(x, w)
        assert type(got) is torch.Tensor and torch.allclose(want, got)
        gw = torch.autograd.grad(want.sum(), (x, w))
        gg = torch.autograd.grad(got.sum(), (x, w))
        assert all(torch.allclose(a, b) for a, b in zip(gw, gg))
    bad = torch.randn(4, 3)
    bad[1, 2] = float("inf")
    w = torch.randn(3, 5)
    before = _fallbacks()
    want = _error(checked_scale, bad, w)
    assert want is not None and want[0] is ValueError
    assert _error(opt, bad, w) == want
    assert _fallbacks() == before + 1
    x = torch.randn(4, 3)   # the entry still serves passing inputs
    assert torch.allclose(opt(x, w), checked_scale(x, w))
    assert _fallbacks() == before + 1


def test_an_assert_fails_with_eagers_assertion_error():
    # compiled here: pytest rewrites the assert statements of test modules
    scope = {}
    exec(compile("def positive_log(x):\n"
                 "    assert (x > 0).all(), 'log of a non-positive value'\n"
                 "    return x.log()\n", __file__, "exec"), scope)
    positive_log = scope["positive_log"]
    opt = agspeed.optimize(positive_log)
    x = torch.rand(6) + 0.5
    assert torch.allclose(opt(x), x.log())
    assert _error(opt, -x) == _error(positive_log, -x)
    assert _error(opt, -x)[0] is AssertionError


def test_torch_distributions_with_validation_is_one_graph():
    def nll(x, mu, scale):
        d = torch.distributions.Normal(mu, scale.abs() + 0.1, validate_args=True)
        return -d.log_prob(x).sum()

    args = (torch.randn(8), torch.randn(8), torch.randn(8))
    explained = agspeed.explain(nll, *args)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    opt = agspeed.optimize(nll)
    for _ in range(3):
        x, mu, scale = (torch.randn(8, requires_grad=True) for _ in range(3))
        want, got = nll(x, mu, scale), opt(x, mu, scale)
        assert torch.allclose(want, got)
        gw = torch.autograd.grad(want, (x, mu, scale))
        gg = torch.autograd.grad(got, (x, mu, scale))
        assert all(torch.allclose(a, b) for a, b in zip(gw, gg))
    nan = torch.full((8,), float("nan"))
    want = _error(nll, torch.randn(8), nan, torch.randn(8))
    assert want[0] is ValueError and "loc" in want[1]
    assert _error(opt, torch.randn(8), nan, torch.randn(8)) == want


@pytest.mark.cxx_exceptions   # the graph's index op raises in libtorch on the bad input
def test_an_error_of_the_graph_on_a_failing_input_is_eagers_check_error():
    def lookup(table, idx):
        if (idx >= table.shape[0]).any():
            raise IndexError(f"index beyond the {table.shape[0]} rows")
        return table[idx] * 2

    opt = agspeed.optimize(lookup)
    table, idx = torch.randn(5, 3), torch.tensor([0, 4, 2])
    assert torch.equal(opt(table, idx), lookup(table, idx))
    bad = torch.tensor([0, 7])
    assert _error(opt, table, bad) == _error(lookup, table, bad)
    assert _error(opt, table, bad)[0] is IndexError


def test_a_check_caught_in_the_frame_gives_eagers_other_result():
    def safe_log(x):
        try:
            if not (x > 0).all():
                raise ValueError("non-positive")
            return x.log()
        except ValueError:
            return x.abs().add(1).log()

    opt = agspeed.optimize(safe_log)
    for x in (torch.rand(5) + 0.1, torch.randn(5) - 3, torch.rand(5) + 0.1):
        got = opt(x)
        assert torch.allclose(got, safe_log(x))


class Counted(torch.nn.Module):
    """Writes to itself and changes its buffer: each must happen once per call."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        if not torch.isfinite(x).all():
            raise ValueError("non-finite input")
        self.calls += 1
        return self.lin(x).relu()


def test_the_programs_objects_see_one_run_when_a_check_fails():
    torch.manual_seed(0)
    eager = Counted()
    model = Counted()
    model.load_state_dict(eager.state_dict())
    opt = agspeed.optimize(model)
    bad = torch.randn(2, 4)
    bad[0, 0] = float("nan")
    for x in (torch.randn(2, 4), bad, torch.randn(2, 4), bad):
        if torch.isfinite(x).all():
            assert torch.allclose(opt(x), eager(x))
        else:
            assert _error(opt, x) == _error(eager, x)
    assert model.calls == eager.calls == 2


def test_in_place_changes_to_inputs_after_a_check_keep_the_break():
    def bump(x, counter):
        if not (x > -10).all():
            raise ValueError("too small")
        counter.add_(1)      # the program's tensor, changed once per call
        return x * counter

    opt = agspeed.optimize(bump)
    explained = agspeed.explain(bump, torch.randn(3), torch.zeros(1))
    assert explained.graph_break_count == 1
    assert explained.break_reasons[0].reason == "data_dependent"
    c1, c2 = torch.zeros(1), torch.zeros(1)
    for x in (torch.randn(3), torch.randn(3) - 20, torch.randn(3)):
        assert _error(opt, x, c1) == _error(bump, x, c2)
        assert torch.equal(c1, c2)


def test_in_place_changes_before_a_check_keep_the_break():
    def norm_then_check(x, running):
        running.mul_(0.9).add_(x.mean() * 0.1)
        if not torch.isfinite(running).all():
            raise ValueError("diverged")
        return x - running

    explained = agspeed.explain(norm_then_check, torch.randn(3), torch.zeros(1))
    assert explained.graph_break_count == 1
    opt = agspeed.optimize(norm_then_check)
    r1, r2 = torch.zeros(1), torch.zeros(1)
    for _ in range(3):
        x = torch.randn(3)
        assert torch.allclose(opt(x, r1), norm_then_check(x, r2)) and torch.equal(r1, r2)


def test_in_place_changes_of_the_graphs_own_values_are_assumed():
    def fill(x):
        buf = x.new_zeros(2, *x.shape)
        buf[0] = x                    # an input written into the graph's own tensor
        if not (x.abs() < 100).all():
            raise ValueError("too large")
        y = x * 2
        y.clamp_(min=0)
        return y + buf.sum(0)

    explained = agspeed.explain(fill, torch.randn(5))
    assert explained.graph_count == 1 and explained.graph_break_count == 0


def test_random_numbers_drawn_before_a_failing_check_are_put_back():
    def noisy(x, training):
        y = torch.nn.functional.dropout(x, 0.5, training)
        if not torch.isfinite(x).all():
            raise ValueError("non-finite")
        return y + torch.rand_like(y)

    for training in (True, False):
        assert agspeed.explain(noisy, torch.randn(4), training).graph_break_count == 0
    opt = agspeed.optimize(noisy)
    bad = torch.ones(64)
    bad[3] = float("nan")
    for x in (torch.ones(64), bad, torch.ones(64)):
        torch.manual_seed(3)
        want = _error(noisy, x, True) or noisy(x, True)
        after_eager = torch.rand(3)
        torch.manual_seed(3)
        got = _error(opt, x, True) or opt(x, True)
        assert torch.rand(3).equal(after_eager)   # one run's numbers drawn, not two
        assert type(want) is type(got)
        assert want == got if type(want) is tuple else torch.equal(want, got)


def test_random_numbers_of_an_explicit_generator_are_drawn_once():
    gens = [torch.Generator().manual_seed(0) for _ in range(2)]

    def noisy(x, gen):
        if not torch.isfinite(x).all():
            raise ValueError("non-finite")
        return x + torch.rand(x.shape, generator=gen)

    explained = agspeed.explain(noisy, torch.randn(4), torch.Generator())
    assert any("torch.Generator" in r.detail for r in explained.break_reasons)
    opt = agspeed.optimize(noisy)
    bad = torch.full((4,), float("nan"))
    for x in (torch.randn(4), bad, torch.randn(4)):
        want, got = _error(noisy, x, gens[0]) or noisy(x, gens[0]), \
            _error(opt, x, gens[1]) or opt(x, gens[1])
        assert want == got if type(want) is tuple else torch.equal(want, got)
    assert torch.rand(3, generator=gens[0]).equal(torch.rand(3, generator=gens[1]))


def test_checks_with_a_graph_break_after_them_fall_back_whole():
    def with_break(x):
        if not (x > -100).all():
            raise ValueError("out of range")
        y = x * 2
        flag = y.sum().item() > 0     # a break: .item() of a computed value
        return y + 1 if flag else y - 1

    opt = agspeed.optimize(with_break)
    for _ in range(3):
        x = torch.randn(6)
        assert torch.allclose(opt(x), with_break(x))
    bad = torch.full((6,), -1000.0)
    assert _error(opt, bad) == _error(with_break, bad)


def test_assuming_can_be_turned_off():
    with agspeed.config.override(assume_branches=False):
        explained = agspeed.explain(checked_scale, torch.randn(4, 3), torch.randn(3, 5))
    assert explained.graph_break_count >= 1
    assert all(r.reason == "data_dependent" for r in explained.break_reasons)


def test_fullgraph_takes_an_assumed_check():
    opt = agspeed.optimize(checked_scale, fullgraph=True)
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    assert torch.allclose(opt(x, w), checked_scale(x, w))


def test_failing_checks_keep_no_reference_to_inputs_or_results():
    opt = agspeed.optimize(checked_scale)
    w = torch.randn(3, 5)
    opt(torch.randn(4, 3), w)
    bad = torch.full((4, 3), float("nan"))
    base = sys.getrefcount(bad), sys.getrefcount(w)
    for _ in range(5):
        assert _error(opt, bad, w)[0] is ValueError
    gc.collect()
    assert (sys.getrefcount(bad), sys.getrefcount(w)) == base
    out = opt(torch.randn(4, 3), w)
    ref = weakref.ref(out)
    del out
    gc.collect()
    assert ref() is None


def test_a_compiled_backend_checks_too():
    opt = agspeed.optimize(checked_scale, backend="inductor")
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    assert torch.allclose(opt(x, w), checked_scale(x, w), atol=1e-6)
    bad = torch.full((4, 3), float("inf"))
    assert _error(opt, bad, w) == _error(checked_scale, bad, w)


def test_on_a_gpu_no_check_is_assumed_before_indexing_by_a_tensor():
    """An index out of range on a GPU ends the CUDA context: with a tested tensor there,
    a graph that indexes by a tensor's values does not assume (the rule, on the builder:
    the GPU's own tests run on a lent machine)."""
    from agspeed._graph import GraphBuilder

    builder = GraphBuilder()
    table = builder.input(("local", "table"), torch.randn(5, 3))
    idx = builder.input(("local", "idx"), torch.tensor([1, 2]))
    mask = builder.input(("local", "mask"), torch.tensor([True, False, True, True, False]))
    emb = torch.nn.functional.embedding
    calls = [("call_function", emb, (idx, table), {}, True),
             ("call_function", operator.getitem, (table, idx), {}, True),
             ("call_function", operator.getitem, (table, (slice(None), 0)), {}, False),
             ("call_function", operator.getitem, (table, mask), {}, False),
             ("call_method", "relu", (table,), {}, False)]
    for on_device in (False, True):
        builder.assumed_on_device = on_device
        for kind, target, args, kwargs, indexes in calls:
            assert builder._leaves_trace(kind, target, args, kwargs) is (on_device and indexes)


def test_a_first_call_that_fails_its_check_raises_and_keeps_the_graph():
    def doubled(x):
        if not torch.isfinite(x).all():
            raise ValueError("bad input")
        return x * 2

    for options in ({}, {"fullgraph": True}):
        agspeed.reset()
        opt = agspeed.optimize(doubled, **options)
        with pytest.raises(ValueError, match="bad input"):
            opt(torch.tensor([1.0, float("nan")]))
        x = torch.randn(2)
        torch.testing.assert_close(opt(x), x * 2)
        counters = agspeed.counters()
        assert counters["assumption_fallbacks"] == 1 and counters["cache_hits"] >= 1


def test_an_assert_on_item_of_a_0d_check_is_assumed_too():
    # prophetnet: `assert torch.all(ids >= 0).item(), msg`
    scope = {"torch": torch}
    exec(compile("def shifted(ids):\n"
                 "    assert torch.all(ids >= 0).item(), 'negative ids'\n"
                 "    return ids.roll(1, -1) * 2\n", __file__, "exec"), scope)
    shifted = scope["shifted"]
    explained = agspeed.explain(shifted, torch.arange(6))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    opt = agspeed.optimize(shifted)
    ids = torch.randint(0, 9, (2, 5))
    assert torch.equal(opt(ids), shifted(ids))
    assert _error(opt, -ids - 1) == _error(shifted, -ids - 1)
    assert _error(opt, -ids - 1)[0] is AssertionError
