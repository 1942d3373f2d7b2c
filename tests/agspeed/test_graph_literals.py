"""Arguments the graph's generated code must write: a Python type used as a dtype
(``x.to(float)``, NumPy's ``dtype=float``) is the dtype torch and NumPy read it as, and
``torch._check``'s message function is left out of the graph (a check decided at capture
is nothing, one that fails is eager's error).  Each once made the generated code invalid
(``<class 'float'>``, ``<function <lambda>>``) and the frame ran eager after an internal
error."""

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import agspeed  # noqa: E402
from test_checks import Counting  # noqa: E402

pytestmark = pytest.mark.torch


def to_python_types(x):
    return x.to(float) + x.to(int) + x.to(bool)


def arange_of_float(x):
    return x + torch.from_numpy(np.arange(3, dtype=float)) + \
        torch.from_numpy(np.ones(3).astype(int))


def checked(x):
    torch._check(x.shape[0] > 1, lambda: "too short")
    return x + 1


def fails_its_check(x):
    torch._check(x.shape[0] > 100, lambda: "too short")
    return x + 1


@pytest.mark.parametrize("fn", [to_python_types, arange_of_float, checked])
def test_one_graph_with_eagers_result(fn):
    backend = Counting()
    fast = agspeed.optimize(fn, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        got, want = fast(x), fn(x)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    assert backend.graphs == 1


def test_a_check_on_sizes_that_change():
    fast = agspeed.optimize(checked, backend="eager", dynamic=True)
    for n in (3, 4, 5):
        x = torch.randn(n)
        torch.testing.assert_close(fast(x), checked(x))


def test_a_failing_check_raises_eagers_error():
    with pytest.raises(RuntimeError, match="too short"):
        fails_its_check(torch.randn(3))
    with pytest.raises(RuntimeError, match="too short"):
        agspeed.optimize(fails_its_check, backend="eager")(torch.randn(3))
