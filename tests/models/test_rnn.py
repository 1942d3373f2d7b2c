"""Recurrent layers (nn.LSTM, nn.GRU, nn.RNN): each model is one graph (torch._VF's
builtins read past its module __getattr__, the layers' weak references to their flat
weights followed to the parameters the graph reads); loss and every gradient are eager's
over training steps on fresh random inputs, and later calls hit the cache."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(12, 8, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(12, 8)
        self.rnn = nn.RNN(12, 8, nonlinearity="relu")
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        y, (h, c) = self.lstm(x)
        g, _ = self.gru(x.transpose(0, 1))
        r, _ = self.rnn(x.transpose(0, 1), torch.zeros(1, x.shape[0], 8))
        return self.head(y).logsumexp(-1).mean() + g.mean() + r.mean() + h.mean() + c.mean()


def _pair():
    torch.manual_seed(0)
    eager = Tagger()
    model = Tagger()
    model.load_state_dict(eager.state_dict())
    return eager, model


def test_one_graph():
    explained = agspeed.explain(Tagger(), torch.randn(2, 5, 12))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        explained.break_reasons


def test_training_steps_equal_eagers_and_hit_the_cache():
    eager, model = _pair()
    opt = agspeed.optimize(model)
    sgd_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    sgd_o = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        x = torch.randn(2, 5, 12)
        want, got = eager(x), opt(x)
        torch.testing.assert_close(got, want)
        want.backward()
        got.backward()
        for p, q in zip(eager.parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad)
        sgd_e.step()
        sgd_o.step()
        sgd_e.zero_grad()
        sgd_o.zero_grad()
    assert agspeed.counters()["cache_hits"] >= 3


def test_a_replaced_weight_is_the_one_used():
    eager, model = _pair()
    opt = agspeed.optimize(model)
    x = torch.randn(2, 5, 12)
    torch.testing.assert_close(opt(x), eager(x))
    weight = torch.randn(24, 8)
    eager.gru.weight_hh_l0 = nn.Parameter(weight.clone())
    model.gru.weight_hh_l0 = nn.Parameter(weight.clone())
    for _ in range(2):
        x = torch.randn(2, 5, 12)
        torch.testing.assert_close(opt(x), eager(x))
