"""torch's state outside the global state every guard checks: a branch on a query of it
(the profiler, saved-tensors hooks, forward-mode AD) is taken again when it changes; a
function that changes it is never called while capturing, so a capture that breaks
leaves the process as eager leaves it."""

import contextlib

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch


@contextlib.contextmanager
def _fwd_grad_flipped():
    old = torch._C._is_fwd_grad_enabled()
    torch._C._set_fwd_grad_enabled(not old)
    try:
        yield
    finally:
        torch._C._set_fwd_grad_enabled(old)


_QUERIES = {
    "profiler": (lambda: torch.autograd._profiler_enabled(),
                 lambda: torch.autograd.profiler.profile()),
    "saved_tensors_hooks": (lambda: torch._C._autograd._saved_tensors_hooks_is_enabled(),
                            lambda: torch.autograd.graph.disable_saved_tensors_hooks("no")),
    "fwd_grad": (lambda: torch._C._is_fwd_grad_enabled(), _fwd_grad_flipped),
}


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("name", sorted(_QUERIES))
def test_a_branch_on_a_query_of_torchs_state_is_taken_again_when_it_changes(name,
                                                                           fullgraph):
    query, changed = _QUERIES[name]

    def fn(x):
        return x + 1 if query() else x - 1

    x = torch.ones(3)
    for captured_inside in (False, True):
        agspeed.reset()
        fast = agspeed.optimize(fn, backend="eager", fullgraph=fullgraph)
        if captured_inside:
            with changed():
                assert torch.equal(fast(x), fn(x))
        assert torch.equal(fast(x), fn(x))
        with changed():
            assert torch.equal(fast(x), fn(x))
        assert torch.equal(fast(x), fn(x))


def test_the_probe_is_in_the_guard_and_says_what_changed():
    def fn(x):
        return x * 2 if torch._C._is_fwd_grad_enabled() else x

    agspeed.reset()
    report = agspeed.explain(fn, torch.ones(2))
    assert "torch._C._is_fwd_grad_enabled() == True" in report.guards


def test_a_capture_that_breaks_leaves_saved_tensors_hooks_as_eager_does():
    def fn(x):
        with torch.autograd.graph.disable_saved_tensors_hooks("not here"):
            y = x + 1
            torch._dynamo.graph_break()
            return y * 2

    def later(x):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            return (x * x).sum()

    agspeed.reset()
    x = torch.randn(3, requires_grad=True)
    torch.testing.assert_close(agspeed.optimize(fn, backend="eager")(x), (x + 1) * 2)
    assert torch._C._autograd._saved_tensors_hooks_is_enabled()
    later(x).backward()   # raised "not here" while the capture's disable leaked


def test_a_function_changing_torchs_state_breaks_and_is_called_once_by_eager():
    calls = []

    def fn(x):
        torch._C._autograd._saved_tensors_hooks_disable("off")
        calls.append(torch._C._autograd._saved_tensors_hooks_is_enabled())
        torch._C._autograd._saved_tensors_hooks_enable()
        return x + 1

    agspeed.reset()
    x = torch.ones(2)
    torch.testing.assert_close(agspeed.optimize(fn, backend="eager")(x), x + 1)
    assert calls == [False] and torch._C._autograd._saved_tensors_hooks_is_enabled()
    with pytest.raises(agspeed.GraphBreakError, match="changes torch's state"):
        agspeed.optimize(fn, backend="eager", fullgraph=True)(x)
    assert torch._C._autograd._saved_tensors_hooks_is_enabled()


def inference_branch(x):
    if x.is_inference():
        return x + 1
    return x - 1


def inference_flags(x):
    y = x + 1
    with torch.inference_mode():
        z = x * 2
        inner = z.is_inference()
    return y.is_inference(), inner, torch.is_inference(x), x.is_inference()


def test_whether_an_input_is_an_inference_tensor_is_guarded():
    agspeed.reset()
    fast = agspeed.optimize(inference_branch, backend="eager")
    with torch.inference_mode():
        made_there = torch.zeros(2)
    for x in (torch.zeros(2), made_there, torch.zeros(2), made_there):
        torch.testing.assert_close(fast(x), inference_branch(x))
    report = agspeed.explain(inference_branch, torch.zeros(2))
    assert "inference" in str(report)


def test_is_inference_of_computed_tensors_follows_the_mode():
    agspeed.reset()
    fast = agspeed.optimize(inference_flags, backend="eager")
    with torch.inference_mode():
        made_there = torch.zeros(2)
    for x in (torch.zeros(2), made_there):
        assert fast(x) == inference_flags(x)
    with torch.inference_mode():
        assert fast(made_there) == inference_flags(made_there) == (True, True, True, True)
