"""The model zoo of issue 3: each model's forward captures as exactly one graph, and
outputs and gradients match eager on fresh random inputs, in train and eval mode, in
FP32 and under CPU bf16 autocast (cache_enabled True and False)."""

import math

import pytest

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import agspeed  # noqa: E402

pytestmark = pytest.mark.torch


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(),
                                 nn.Linear(32, 8))

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(out)))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.blocks = nn.Sequential(Block(8), Block(8))
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Attention(nn.Module):
    def __init__(self, dim, heads, causal):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.causal:
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        if mask is not None:
            att = att.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class EncoderBlock(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                 nn.Dropout(0.1))

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=50, dim=32, layers=2, ctx=16):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(EncoderBlock(dim) for _ in range(layers))
        for blk in self.blocks:
            blk.attn.causal = True
            blk.attn.register_buffer("bias", torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx):
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class LoopBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(12, 12) for _ in range(3))
        self.extra = nn.Linear(12, 12)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.tanh(layer(x)) * (i + 1)
        if self.training:
            x = self.drop(x)
        if x.shape[-1] > 8 and x.dim() == 2:
            x = self.extra(x)
        return x.sum(dim=-1), x


ZOO = {
    "mlp": (MLP, lambda: (torch.randn(4, 16),)),
    "resnet": (ResNet, lambda: (torch.randn(2, 3, 8, 8),)),
    "encoder": (EncoderBlock, lambda: (torch.randn(2, 6, 32),
                                       (torch.rand(2, 6) > 0.2).long())),
    "gpt": (GPT, lambda: (torch.randint(0, 50, (2, 10)),)),
    "loop": (LoopBranch, lambda: (torch.randn(5, 12),)),
}


def _outputs(out):
    return [t for t in (out if isinstance(out, tuple) else (out,))]


def _run(model, inputs):
    outs = _outputs(model(*inputs))
    sum(o.float().sum() for o in outs).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return outs, grads


def _captured(name):
    return [r for r in agspeed._runtime.frame_records() if r.decision == "captured"]


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("amp", ["fp32", "bf16", "bf16-nocache"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_is_one_graph_matching_eager(name, amp, mode):
    cls, make_inputs = ZOO[name]
    torch.manual_seed(0)
    model = cls()
    model.train(mode == "train")
    optimized = agspeed.optimize(model, backend="eager")
    if mode == "train":  # dropout: same random stream for both runs
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
    tol = {} if amp == "fp32" else {"atol": 2e-2, "rtol": 2e-2}
    for step in range(3):
        inputs = make_inputs()
        ctx = torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=amp != "bf16-nocache") \
            if amp != "fp32" else torch.autocast("cpu", enabled=False)
        bn_state = {k: v.clone() for k, v in model.state_dict().items()}
        with ctx:
            want, want_grads = _run(model, inputs)
        model.load_state_dict(bn_state)  # running stats advance once per step
        with ctx:
            got, got_grads = _run(optimized, inputs)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            torch.testing.assert_close(g, w, **tol)
        assert got_grads.keys() == want_grads.keys()
        for key in want_grads:
            torch.testing.assert_close(got_grads[key], want_grads[key], **tol,
                                       msg=lambda m: f"{key}: {m}")
    captured = [r for r in agspeed._runtime.frame_records()
                if r.decision == "captured" and r.name == "forward"]
    breaks = [r for r in agspeed._runtime.frame_records() if "graph break" in r.decision]
    assert len(captured) == 1, (captured, breaks)
    assert not breaks
