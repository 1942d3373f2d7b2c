"""A 0-dim tensor where an operation takes a Python number (``value=`` of addcmul and
addcdiv, the weight of ``_foreach_lerp_``, the base of ``_foreach_pow``): captured in the
graph, with eager's values, result types and in-place changes, no gradient reaching the
number, and one graph for every value of it."""

import copy

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402

# the fake run of each call refuses the number by raising through torch's C++ (the
# refusal is what the rewrite answers)
pytestmark = [pytest.mark.torch, pytest.mark.cxx_exceptions]


def _addcmul_(x, y, z, s):
    return x.addcmul_(y, z, value=s)


def _addcdiv(x, y, z, s):
    return torch.addcdiv(x, y, z, value=s) * 2


def _addcmul_method(x, y, z, s):
    return x.addcmul(y, z, value=s).sum(0)


def _lerp_(xs, ys, s):
    return torch._foreach_lerp_(xs, ys, s)


def _pow(s, ys):
    return torch._foreach_pow(s, ys)


def _addcmul_each_(xs, ys, zs, s):
    torch._foreach_addcmul_(xs, ys, zs, value=s)
    return xs[0] + xs[1].sum()


def _mul_then(xs, s):
    return [t.sum() for t in torch._foreach_mul(xs, s * 2)]


def _cases():
    def pair():
        return [torch.randn(3, 2), torch.randn(4)]

    return [
        (_addcmul_, lambda: (torch.randn(2, 2), torch.randn(2, 2), torch.rand(2, 2),
                             torch.rand(()))),
        (_addcdiv, lambda: (torch.randn(3), torch.randn(3), torch.rand(3) + 1,
                            torch.randn(()))),
        (_addcmul_method, lambda: (torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3),
                                   torch.randn((), dtype=torch.float64))),
        (_lerp_, lambda: (pair(), pair(), torch.rand(()))),
        (_pow, lambda: (torch.rand(()) + 0.5, [torch.rand(2), torch.rand(3)])),
        (_addcmul_each_, lambda: (pair(), pair(), pair(), torch.randn(()))),
        (_mul_then, lambda: (pair(), torch.randn(()))),
    ]


def _flat(value):
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _flat(item)]
    return [value]


@pytest.mark.parametrize("fn,make", _cases(), ids=lambda c: getattr(c, "__name__", ""))
def test_a_tensor_number_is_captured_with_eagers_results(fn, make):
    agspeed.reset()
    fast = agspeed.optimize(fn, backend="eager", fullgraph=True)
    for _ in range(4):   # new values of the number each call: one graph serves them
        args = make()
        mine = copy.deepcopy(args)
        want = fn(*args)
        got = fast(*mine)
        assert type(got) is type(want)
        for g, w in zip(_flat(got), _flat(want)):
            torch.testing.assert_close(g, w)
        for g, w in zip(_flat(mine), _flat(args)):   # in-place changes as eager's
            torch.testing.assert_close(g, w)
    captured = [r for r in agspeed._runtime.frame_records() if r.decision == "captured"]
    assert len(captured) == 1, [r.decision for r in agspeed._runtime.frame_records()]


def test_an_in_place_foreach_answers_its_first_argument_and_changes_it():
    fast = agspeed.optimize(_lerp_, backend="eager", fullgraph=True)
    xs, ys = [torch.zeros(2), torch.zeros(3)], [torch.ones(2), torch.ones(3)]
    first = xs[0]
    out = fast(xs, ys, torch.tensor(0.25))
    assert out[0] is first and torch.equal(first, torch.full((2,), 0.25))


@pytest.mark.cxx_exceptions
def test_a_number_that_requires_grad_is_refused_as_eager_refuses_it():
    def f(x, y, z, s):
        return torch.addcmul(x, y, z, value=s).pow(2).sum()

    fast = agspeed.optimize(f, backend="eager")
    args = [torch.randn(3) for _ in range(3)] + [torch.tensor(0.5, requires_grad=True)]
    with pytest.raises(TypeError) as want:
        f(*args)
    with pytest.raises(TypeError) as got:
        fast(*args)
    assert str(got.value) == str(want.value)
    leaves = [torch.randn(3, requires_grad=True) for _ in range(3)] + [torch.tensor(0.5)]
    mine = [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]
    f(*leaves).backward()
    agspeed.optimize(f, backend="eager", fullgraph=True)(*mine).backward()
    for g, w in zip(mine[:3], leaves[:3]):
        torch.testing.assert_close(g.grad, w.grad)


def test_a_tensor_per_element_is_not_taken_for_one_number():
    # a 1-D tensor given whole is not a number for every element: it stays a break
    def f(xs, s):
        return torch._foreach_add(xs, s)

    fast = agspeed.optimize(f, backend="eager")
    xs = [torch.randn(2), torch.randn(2)]
    s = torch.randn(2)
    with pytest.raises(Exception) as want:
        f(xs, s)
    with pytest.raises(type(want.value)):
        fast(xs, s)
