"""Bad input stays quiet: an input that makes the captured code raise (a wrong shape,
dtype, device, argument count) gets exactly eager's error, type and message, prints
nothing (torch's fake-tensor layer logs each failing op it ran during capture), and the
cache still serves the next good call without capturing again."""

import pytest

import agspeed
from agspeed import _C

try:
    import torch
    from torch import nn
except ImportError:  # collected on torch-free Pythons, deselected there by -m "not torch"
    torch = nn = None

pytestmark = pytest.mark.torch


class Block(nn.Module if nn is not None else object):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.norm = nn.LayerNorm(3)

    def forward(self, x, scale=1.0):
        return self.norm(self.fc(x).relu()) * scale


def _error_of(call):
    try:
        call()
    except Exception as exc:  # the error is what is compared
        return type(exc), str(exc)
    return None


BAD = {
    "wrong_inner_size": lambda: ((torch.randn(2, 5),), {}),
    "wrong_rank": lambda: ((torch.randn(5),), {}),
    "wrong_dtype": lambda: ((torch.randn(2, 4, dtype=torch.float64),), {}),
    "integer_input": lambda: ((torch.ones(2, 4, dtype=torch.int64),), {}),
    "meta_device": lambda: ((torch.randn(2, 4, device="meta"),), {}),
    "too_few_arguments": lambda: ((), {}),
    "too_many_arguments": lambda: ((torch.randn(2, 4), 2.0, 3), {}),
    "unknown_keyword": lambda: ((torch.randn(2, 4),), {"shift": 1.0}),
    "not_a_tensor": lambda: (([[1.0] * 4],), {}),
}


@pytest.mark.cxx_exceptions
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_eagers_error_and_prints_nothing(case, capfd):
    torch.manual_seed(0)
    model = Block()
    fast = agspeed.optimize(model, backend="eager")
    good = torch.randn(2, 4)
    torch.testing.assert_close(fast(good), model(good))
    capfd.readouterr()

    args, kwargs = BAD[case]()
    expected = _error_of(lambda: model(*args, **kwargs))
    assert expected is not None, "the case must make eager raise"
    for _ in range(2):  # the second bad call takes whatever the first one cached
        assert _error_of(lambda: fast(*args, **kwargs)) == expected
    out, err = capfd.readouterr()
    assert out == "" and err == ""

    before = _C.counters()
    again = torch.randn(2, 4)
    torch.testing.assert_close(fast(again), model(again))
    after = _C.counters()
    assert after["cache_misses"] == before["cache_misses"]  # served from the cache
    assert after["graph_calls"] > before["graph_calls"]


@pytest.mark.cxx_exceptions
def test_bad_input_to_an_optimized_function_is_quiet(capfd):
    def f(a, b):
        return (a @ b).tanh()

    fast = agspeed.optimize(f, backend="eager")
    fast(torch.randn(2, 3), torch.randn(3, 4))
    capfd.readouterr()
    a, b = torch.randn(2, 3), torch.randn(5, 4)
    expected = _error_of(lambda: f(a, b))
    assert _error_of(lambda: fast(a, b)) == expected
    assert capfd.readouterr() == ("", "")


@pytest.mark.cxx_exceptions
@pytest.mark.parametrize("backend", ["jit", "auto"])
@pytest.mark.parametrize("case", ["wrong_dtype", "integer_input"])
def test_a_first_call_with_bad_input_names_no_backend(case, backend, capfd, caplog):
    """The first call captures and compiles on the bad input itself: the backend fails
    on it as eager does, which is the program's error, not a backend's to report."""
    torch.manual_seed(0)
    model = Block()
    args, kwargs = BAD[case]()
    expected = _error_of(lambda: model(*args, **kwargs))
    with agspeed.config.override(autotune_candidates="eager,jit"):
        fast = agspeed.optimize(model, backend=backend)
        capfd.readouterr()
        assert _error_of(lambda: fast(*args, **kwargs)) == expected
        out, err = capfd.readouterr()
        said = out + err + caplog.text
        assert "backend" not in said and "failed" not in said, said
        good = torch.randn(2, 4)
        torch.testing.assert_close(fast(good), model(good))
