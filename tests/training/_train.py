"""Shared pieces of the training-loop tests: small models, an ordinary training step
as a user writes it, and comparisons of two runs' parameters and optimizer state."""

import copy

import torch
from torch import nn


class Block(nn.Module):
    """A pre-norm MLP block: LayerNorm, Linear, GELU, Dropout, Linear, residual."""

    def __init__(self, width=32, dropout=0.0):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.down(self.drop(torch.nn.functional.gelu(self.up(self.norm(x)))))


class Net(nn.Module):
    """Input projection, BatchNorm, ``depth`` blocks, a classifier and its loss: the
    forward returns the cross-entropy of ``x`` against ``y`` (logits when y is None)."""

    def __init__(self, width=32, depth=2, classes=5, dropout=0.0):
        super().__init__()
        # no bias before BatchNorm: its gradient is zero up to rounding, which an
        # adaptive optimizer would blow up into steps that differ between kernels
        self.inp = nn.Linear(16, width, bias=False)
        self.bn = nn.BatchNorm1d(width)
        self.blocks = nn.ModuleList(Block(width, dropout) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x, y=None):
        h = self.bn(self.inp(x))
        for block in self.blocks:
            h = block(h)
        logits = self.head(h)
        if y is None:
            return logits
        return nn.functional.cross_entropy(logits, y)


def batches(n, batch=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 16, generator=g), torch.randint(0, 5, (batch,), generator=g))
            for _ in range(n)]


def twins(make=Net, seed=0, **kwargs):
    """Two models with the same initial weights."""
    torch.manual_seed(seed)
    a = make(**kwargs)
    return a, copy.deepcopy(a)


def max_diff(a, b):
    """The largest absolute difference between two state dicts (or parameter lists)."""
    if isinstance(a, dict):
        assert list(a) == list(b)
        a, b = list(a.values()), list(b.values())
    return max(float((x.detach().double() - y.detach().double()).abs().max())
               for x, y in zip(a, b))


def optimizer_diff(a, b):
    """The largest absolute difference between two optimizers' per-parameter states."""
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    assert sa.keys() == sb.keys()
    out = 0.0
    for k in sa:
        assert sa[k].keys() == sb[k].keys()
        for name, v in sa[k].items():
            w = sb[k][name]
            if torch.is_tensor(v):
                out = max(out, float((v.double() - w.double()).abs().max()))
            else:
                assert v == w
    return out
