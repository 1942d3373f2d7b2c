"""When the autotuner tunes a graph: on its ``tune_after``-th call (2 by default), the
calls before running it as captured.  A graph called once is never compiled; the tuning
call tunes on its own inputs and returns what eager returns; a program error on that call
is raised as eager raises it and the next call tunes; another thread's call meanwhile
runs as captured; the saved-tensors hooks of the program see none of the tuning."""

import threading

import pytest

import agspeed
from agspeed import backends
from agspeed.backends import autotune, knowledge

try:
    import torch
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = None

pytestmark = pytest.mark.torch

_COMPILED = []
_GATE = {"wait": None}


def _counting(gm, example_inputs):
    """Right and counted: each compile appends the graph's inputs' shapes."""
    _COMPILED.append([tuple(getattr(v, "shape", ())) for v in example_inputs])
    gate = _GATE["wait"]
    if gate is not None:   # hold the compile until the test lets it go
        gate.wait(10)
    return gm.forward


@pytest.fixture
def counting(tmp_path):
    _COMPILED.clear()
    _GATE["wait"] = None
    agspeed.register_backend("t_count", _counting, override=True)
    with agspeed.config.override(cache_dir=str(tmp_path / "kb"), progress=False):
        yield
    backends._registered.pop("t_count", None)
    _GATE["wait"] = None


def scaled(x, w):
    return (x @ w).tanh() * 2


def _args(n=4):
    return torch.randn(n, 8), torch.randn(8, 8)


def test_a_graph_called_once_is_never_compiled_and_the_second_call_tunes(counting):
    agspeed.reset()
    fast = agspeed.optimize(scaled, candidates=("t_count",))
    x, w = _args()
    torch.testing.assert_close(fast(x, w), scaled(x, w))
    assert _COMPILED == [] and autotune.decisions() == [] and knowledge.records() == []
    y, v = _args()
    torch.testing.assert_close(fast(y, v), scaled(y, v))
    assert _COMPILED == [[(4, 8), (8, 8)]]
    (decision,) = autotune.decisions()
    assert decision.source == "tuned"
    (rec,) = knowledge.records()
    assert rec["candidates"]["t_count"]["status"] == "ok"
    for _ in range(3):   # later calls run the answer: nothing compiles again
        x, w = _args()
        torch.testing.assert_close(fast(x, w), scaled(x, w))
    assert len(_COMPILED) == 1


@pytest.mark.parametrize("after", [1, 3])
def test_tune_after_from_the_knob_and_the_option(counting, tmp_path, after):
    agspeed.reset()
    with agspeed.config.override(tune_after=after):
        fast = agspeed.optimize(scaled, candidates=("t_count",))
        for call in range(1, 5):
            x, w = _args()
            torch.testing.assert_close(fast(x, w), scaled(x, w))
            assert len(_COMPILED) == (call >= after), call
    agspeed.reset()
    _COMPILED.clear()
    with agspeed.config.override(cache_dir=str(tmp_path / "another")):  # tunes again
        fast = agspeed.optimize(scaled, candidates=("t_count",), tune_after=after)
        for call in range(1, 5):
            fast(*_args())
            assert len(_COMPILED) == (call >= after), call


def test_tune_after_must_be_a_positive_int(counting):
    with pytest.raises(ValueError, match="tune_after"):
        agspeed.optimize(scaled, tune_after=0)
    with pytest.raises(agspeed.UnknownOptionError):
        agspeed.optimize(scaled, tune_after=1.5)


def _spd(n=4):
    a = torch.randn(n, n)
    return a @ a.mT + torch.eye(n)


@pytest.mark.cxx_exceptions
def test_a_program_error_on_the_tuning_call_is_eagers_and_the_next_call_tunes(counting):
    agspeed.reset()

    def factor(a):
        return torch.linalg.cholesky(a) * 2

    fast = agspeed.optimize(factor, candidates=("t_count",))
    a = _spd()
    torch.testing.assert_close(fast(a), factor(a))
    bad = -torch.eye(4)   # not positive-definite: eager raises, whatever runs it
    with pytest.raises(torch.linalg.LinAlgError) as want:
        factor(bad)
    with pytest.raises(torch.linalg.LinAlgError) as got:
        fast(bad)
    assert str(got.value) == str(want.value)
    assert _COMPILED == []
    a = _spd()
    torch.testing.assert_close(fast(a), factor(a))
    assert len(_COMPILED) == 1


def test_another_threads_call_runs_as_captured_while_the_graph_is_tuned(counting):
    agspeed.reset()
    gate = _GATE["wait"] = threading.Event()
    fast = agspeed.optimize(scaled, candidates=("t_count",))
    fast(*_args())
    done = {}

    def tuning_call():
        x, w = _args()
        done["tuned"] = torch.allclose(fast(x, w), scaled(x, w))

    worker = threading.Thread(target=tuning_call)
    worker.start()
    try:
        for _ in range(200):   # the worker's call is compiling, held at the gate
            if _COMPILED:
                break
            worker.join(0.05)
        assert _COMPILED, "the second call did not start tuning"
        x, w = _args()
        torch.testing.assert_close(fast(x, w), scaled(x, w))   # not held up
        assert worker.is_alive()
    finally:
        gate.set()
        worker.join(30)
    assert done == {"tuned": True} and len(_COMPILED) == 1


def test_the_programs_saved_tensors_hooks_see_none_of_the_tuning(counting):
    agspeed.reset()
    w = torch.randn(8, 8, requires_grad=True)
    fast = agspeed.optimize(scaled, candidates=("t_count",))
    counts = []
    for fn in (scaled, fast, scaled, fast):
        n = [0]

        def pack(t, n=n):
            n[0] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(torch.randn(4, 8), w).sum().backward()
        counts.append(n[0])
    assert len(_COMPILED) == 1            # the fourth call tuned
    assert counts[0] == counts[1] == counts[2] == counts[3] > 0, counts


def _sgd(params, lr):
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-lr)
    return params[0].detach() * 1


@pytest.mark.parametrize("after", [1, 2])
def test_a_graph_updating_parameters_in_place_is_tuned_updating_them_once(counting, after):
    """An optimizer-like graph writes into inputs that require grad: the tuning call
    copies them first and puts them back after each measured run, so the step it returns
    is taken once, as eager takes it."""
    agspeed.reset()
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fast = agspeed.optimize(_sgd, candidates=("t_count",), tune_after=after)
    for step in range(3):
        for ps in (params, twins):
            for p in ps:
                p.grad = torch.full_like(p, float(step + 1))
        ref = _sgd(params, 0.1)
        torch.testing.assert_close(fast(twins, 0.1), ref, rtol=0, atol=0)
        for p, q in zip(params, twins):
            torch.testing.assert_close(q, p, rtol=0, atol=0)
    assert len(_COMPILED) == 1


def test_written_inputs_finds_in_place_writes_into_placeholders_and_their_views():
    from agspeed.backends._measure import written_inputs

    def writes(a, b, c):
        a.view(-1).add_(1)              # a view of the first input
        d = b * 2
        d.mul_(3)                       # a computed tensor: not an input
        torch._foreach_add_([c], 1.0)   # a list argument
        return d

    def reads(a, b, c):
        return (a + b).relu() * c

    for fn, expected in ((writes, {0, 2}), (reads, set())):
        agspeed.reset()
        seen = []
        agspeed.register_backend("t_seen", lambda gm, ex: seen.append(gm) or gm.forward,
                                 override=True)
        try:
            args = (torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3))
            agspeed.optimize(fn, backend="t_seen", fullgraph=True)(*args)
        finally:
            backends._registered.pop("t_seen", None)
        assert [written_inputs(gm) for gm in seen] == [expected]
