"""torch.distributions in captured code, argument validation on (torch's default).

Each function is one graph with no break (validation assumed to pass: agspeed/_assume.py;
``lazy_property`` getters and ``dependent_property`` inlined; the KL function chosen at
capture); values and gradients are eager's on fresh random inputs, and an invalid
argument raises eager's error with eager's message.
"""

import pytest

torch = pytest.importorskip("torch")

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch

D = torch.distributions


@pytest.fixture(autouse=True)
def validation_on():
    saved = D.Distribution._validate_args   # torch._dynamo turns it off for the process
    D.Distribution.set_default_validate_args(True)
    yield
    D.Distribution.set_default_validate_args(saved)


def normal_independent(x, m):
    return D.Independent(D.Normal(m, x.exp()), 1).log_prob(x).sum()


def categorical(x, m):
    c = D.Categorical(logits=m)
    return c.log_prob(x.argmax(-1)).sum() + c.entropy().sum() + c.probs.sum()


def bernoulli(x, m):
    return D.Bernoulli(logits=m).log_prob((x > 0).float()).sum()


def kl_normal(x, m):
    return D.kl_divergence(D.Normal(m, 1.0), D.Normal(x, x.exp())).sum()


def beta(x, m):
    return D.Beta(m.exp(), x.exp()).log_prob(torch.full_like(x, 0.3)).sum()


def reparameterized(x, m):
    eps = D.Normal(m, x.exp()).rsample()
    return (eps * 0 + m).sum()   # the draw itself differs by seed: its graph is checked


CASES = [normal_independent, categorical, bernoulli, kl_normal, beta, reparameterized]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_one_graph_with_eager_values_and_gradients(fn):
    explained = agspeed.explain(fn, torch.randn(4, 5), torch.randn(4, 5))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        explained.break_reasons
    opt = agspeed.optimize(fn)
    for _ in range(3):
        x = torch.randn(4, 5, requires_grad=True)
        m = torch.randn(4, 5, requires_grad=True)
        want, got = fn(x, m), opt(x, m)
        torch.testing.assert_close(got, want)
        gw = torch.autograd.grad(want, (x, m), allow_unused=True)
        gg = torch.autograd.grad(got, (x, m), allow_unused=True)
        for a, b in zip(gw, gg):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(b, a)


def test_invalid_arguments_raise_eagers_error():
    opt = agspeed.optimize(beta)
    x, m = torch.randn(3), torch.randn(3)
    opt(x, m)
    bad = torch.tensor([0.1, float("nan"), 0.3])
    with pytest.raises(ValueError) as want:
        beta(bad, m)
    with pytest.raises(ValueError) as got:
        opt(bad, m)
    assert str(got.value) == str(want.value)


def test_the_kl_memo_is_filled_as_eager_fills_it():
    memo = torch.distributions.kl._KL_MEMOIZE
    memo.clear()
    opt = agspeed.optimize(kl_normal)
    x, m = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(opt(x, m), kl_normal(x, m))
    assert list(memo) == [(D.Normal, D.Normal)]
    assert memo[D.Normal, D.Normal] is torch.distributions.kl._kl_normal_normal
    torch.testing.assert_close(opt(x, m), kl_normal(x, m))


def test_lazy_properties_are_computed_once_on_the_object():
    def probs_twice(m):
        c = D.Categorical(logits=m)
        first = c.probs
        return first is c.probs, first * 2, "probs" in c.__dict__

    opt = agspeed.optimize(probs_twice)
    m = torch.randn(2, 3)
    same, y, stored = opt(m)
    assert same is True and stored is True
    torch.testing.assert_close(y, probs_twice(m)[1])


def test_a_policy_samples_what_eager_samples():
    def policy_loss(logits):
        d = D.Categorical(logits=logits)
        action = d.sample()   # torch.Size().numel() of its sample shape folds
        return -(d.log_prob(action)).mean() - 0.01 * d.entropy().mean(), action

    explained = agspeed.explain(policy_loss, torch.randn(6, 4))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    opt = agspeed.optimize(policy_loss)
    for seed in range(3):
        logits = torch.randn(6, 4, requires_grad=True)
        torch.manual_seed(seed)
        want, want_action = policy_loss(logits)
        torch.manual_seed(seed)
        got, got_action = opt(logits)
        assert torch.equal(got_action, want_action)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(torch.autograd.grad(got, logits)[0],
                                   torch.autograd.grad(want, logits)[0])
