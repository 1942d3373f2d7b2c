"""The models of the training benchmark (benchmarks/train.py), each wrapped as a task.

A task is an ``nn.Module`` whose ``forward`` takes one batch's tensors and returns the
scalar loss, so that a runtime optimizes the model and its loss together, the way a
training loop's compiled step would be.  Two families:

  zoo           the shapes of tests/models/test_zoo.py written again at benchmark sizes: an MLP, a
                small residual CNN with BatchNorm, a transformer encoder classifier with a
                padding mask, and a GPT-style decoder with a tied head;
  transformers  third-party models from HuggingFace ``transformers`` built from small
                configs with random weights (nothing is downloaded): BERT for sequence
                classification, GPT-2 with its LM head, ViT for image classification.

Dropout is off everywhere (p = 0, and the configs' dropout rates 0): the runtimes draw
different random numbers, and the benchmark compares their losses step by step.

Every model has two sizes: "full" (the benchmark's) and "quick" (tiny, for smoke runs).
``SPECS`` maps each name to its ``Spec``; ``build`` and ``batches`` are all a caller needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

# --- zoo models ------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.GELU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class ResNet(nn.Module):
    def __init__(self, channels: int, blocks: int, classes: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU())
        self.blocks = nn.Sequential(*(ResidualBlock(channels) for _ in range(blocks)))
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SelfAttention(nn.Module):
    """Multi-head self-attention written out (no fused kernel), causal or with a padding
    mask of the keys."""

    def __init__(self, dim: int, heads: int, causal: bool, ctx: int):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        if causal:
            self.register_buffer("tril", torch.ones(ctx, ctx).tril().view(1, 1, ctx, ctx))

    def forward(self, x, keep=None):
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, d).transpose(1, 2)
        k = k.view(b, t, self.heads, d).transpose(1, 2)
        v = v.view(b, t, self.heads, d).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        if self.causal:
            scores = scores.masked_fill(self.tril[:, :, :t, :t] == 0, float("-inf"))
        if keep is not None:
            scores = scores.masked_fill(keep[:, None, None, :] == 0, float("-inf"))
        y = scores.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool, ctx: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, causal, ctx)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, keep=None):
        x = x + self.attn(self.ln1(x), keep)
        return x + self.mlp(self.ln2(x))


class Encoder(nn.Module):
    """Token classifier over padded sequences: embeddings, encoder blocks with a padding
    mask, masked mean pooling, a linear head."""

    def __init__(self, vocab: int, dim: int, heads: int, layers: int, ctx: int, classes: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, False, ctx)
                                    for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids, keep):
        x = self.tok(ids) + self.pos(torch.arange(ids.size(1), device=ids.device))
        for block in self.blocks:
            x = block(x, keep)
        w = keep.unsqueeze(-1).to(x.dtype)
        return self.head(self.ln((x * w).sum(1) / w.sum(1)))


class GPT(nn.Module):
    """Decoder-only language model: token and position embeddings, causal blocks, final
    LayerNorm, head tied to the token embedding."""

    def __init__(self, vocab: int, dim: int, heads: int, layers: int, ctx: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, True, ctx)
                                    for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for emb in (self.wte, self.wpe):   # small, as GPT-2 has them: unit logits at start
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.size(1), device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# --- tasks: model and loss in one forward -----------------------------------------------


class Classify(nn.Module):
    """Cross-entropy of a classifier's logits against the batch's last tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *inputs):
        *features, labels = inputs
        return F.cross_entropy(self.model(*features).float(), labels)


class NextToken(nn.Module):
    """Language-model loss: each position predicts the next token."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids, targets):
        logits = self.model(ids)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                               targets.reshape(-1))


class HFTask(nn.Module):
    """A transformers model's own loss, returned as a tensor rather than its ModelOutput,
    so that every runtime returns the same thing.  Inputs go by keyword, as transformers'
    documentation passes them."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model


class SequenceClassifierTask(HFTask):
    def forward(self, ids, mask, labels):
        return self.model(input_ids=ids, attention_mask=mask, labels=labels).loss


class CausalLMTask(HFTask):
    def forward(self, ids, labels):
        return self.model(input_ids=ids, labels=labels).loss


class ImageClassifierTask(HFTask):
    def forward(self, pixels, labels):
        return self.model(pixel_values=pixels, labels=labels).loss


# --- specs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A benchmark model: its family, how to build its task for a size, and how to draw
    one batch of inputs for a size from a generator."""

    family: str
    build: Callable[[str], nn.Module]
    batch: Callable[[str, torch.Generator], tuple]
    about: str


def _tokens(gen, vocab, b, t):
    return torch.randint(0, vocab, (b, t), generator=gen)


def _keep_mask(gen, b, t):
    """1 for real tokens, 0 for padding: each row keeps a random prefix of at least one
    token, so that no row is all padding."""
    lengths = torch.randint(1, t + 1, (b, 1), generator=gen)
    return (torch.arange(t).unsqueeze(0) < lengths).long()


MLP_SIZES = {"full": dict(features=256, hidden=512, classes=10, batch=128),
             "quick": dict(features=16, hidden=32, classes=8, batch=8)}
RESNET_SIZES = {"full": dict(channels=16, blocks=2, classes=10, batch=16, image=32),
                "quick": dict(channels=4, blocks=1, classes=4, batch=2, image=8)}
ENCODER_SIZES = {"full": dict(vocab=1000, dim=128, heads=4, layers=2, ctx=64, classes=4,
                              batch=8),
                 "quick": dict(vocab=50, dim=16, heads=2, layers=1, ctx=8, classes=3,
                               batch=2)}
GPT_SIZES = {"full": dict(vocab=1000, dim=128, heads=4, layers=2, ctx=64, batch=8),
             "quick": dict(vocab=50, dim=16, heads=2, layers=1, ctx=8, batch=2)}
# transformers configs: hidden size, layers, heads, feed-forward width, sequence length
HF_SIZES = {"full": dict(vocab=1000, hidden=128, layers=2, heads=4, ffn=256, seq=64, batch=8,
                         image=32, patch=8),
            "quick": dict(vocab=50, hidden=16, layers=1, heads=2, ffn=32, seq=8, batch=2,
                          image=8, patch=4)}


def _mlp(size):
    s = MLP_SIZES[size]
    return Classify(MLP(s["features"], s["hidden"], s["classes"]))


def _mlp_batch(size, gen):
    s = MLP_SIZES[size]
    return (torch.randn(s["batch"], s["features"], generator=gen),
            torch.randint(0, s["classes"], (s["batch"],), generator=gen))


def _resnet(size):
    s = RESNET_SIZES[size]
    return Classify(ResNet(s["channels"], s["blocks"], s["classes"]))


def _resnet_batch(size, gen):
    s = RESNET_SIZES[size]
    return (torch.randn(s["batch"], 3, s["image"], s["image"], generator=gen),
            torch.randint(0, s["classes"], (s["batch"],), generator=gen))


def _encoder(size):
    s = ENCODER_SIZES[size]
    return Classify(Encoder(s["vocab"], s["dim"], s["heads"], s["layers"], s["ctx"],
                            s["classes"]))


def _encoder_batch(size, gen):
    s = ENCODER_SIZES[size]
    return (_tokens(gen, s["vocab"], s["batch"], s["ctx"]),
            _keep_mask(gen, s["batch"], s["ctx"]),
            torch.randint(0, s["classes"], (s["batch"],), generator=gen))


def _gpt(size):
    s = GPT_SIZES[size]
    return NextToken(GPT(s["vocab"], s["dim"], s["heads"], s["layers"], s["ctx"]))


def _gpt_batch(size, gen):
    s = GPT_SIZES[size]
    ids = _tokens(gen, s["vocab"], s["batch"], s["ctx"] + 1)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def have_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except Exception:   # absent, or present but broken against this torch
        return False
    return True


ATTENTION = "sdpa"   # transformers' attention kernel: torch's scaled_dot_product_attention


def _no_dropout(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    return model


def _bert(size):
    from transformers import BertConfig, BertForSequenceClassification

    s = HF_SIZES[size]
    config = BertConfig(vocab_size=s["vocab"], hidden_size=s["hidden"],
                        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                        intermediate_size=s["ffn"], max_position_embeddings=s["seq"],
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        classifier_dropout=0.0, num_labels=4)
    config._attn_implementation = ATTENTION
    model = BertForSequenceClassification(config)
    return SequenceClassifierTask(_no_dropout(model))


def _bert_batch(size, gen):
    s = HF_SIZES[size]
    return (_tokens(gen, s["vocab"], s["batch"], s["seq"]),
            _keep_mask(gen, s["batch"], s["seq"]),
            torch.randint(0, 4, (s["batch"],), generator=gen))


def _gpt2(size):
    from transformers import GPT2Config, GPT2LMHeadModel

    s = HF_SIZES[size]
    config = GPT2Config(vocab_size=s["vocab"], n_positions=s["seq"], n_embd=s["hidden"],
                        n_layer=s["layers"], n_head=s["heads"], n_inner=s["ffn"],
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    config._attn_implementation = ATTENTION
    return CausalLMTask(_no_dropout(GPT2LMHeadModel(config)))


def _gpt2_ckpt(size):
    task = _gpt2(size)
    # each layer checkpointed (non-reentrant) and a forward hook on the input embeddings,
    # as transformers' Trainer does with gradient_checkpointing=True
    task.model.gradient_checkpointing_enable()
    return task


def _gpt2_batch(size, gen):
    s = HF_SIZES[size]
    ids = _tokens(gen, s["vocab"], s["batch"], s["seq"])
    return ids, ids.clone()   # the model shifts the labels itself


def _vit(size):
    from transformers import ViTConfig, ViTForImageClassification

    s = HF_SIZES[size]
    config = ViTConfig(image_size=s["image"], patch_size=s["patch"], num_channels=3,
                       hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                       num_attention_heads=s["heads"], intermediate_size=s["ffn"],
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                       num_labels=10)
    config._attn_implementation = ATTENTION
    model = ViTForImageClassification(config)
    return ImageClassifierTask(_no_dropout(model))


def _vit_batch(size, gen):
    s = HF_SIZES[size]
    return (torch.randn(s["batch"], 3, s["image"], s["image"], generator=gen),
            torch.randint(0, 10, (s["batch"],), generator=gen))


SPECS: dict[str, Spec] = {
    "mlp": Spec("zoo", _mlp, _mlp_batch, "MLP 256-512-512-10, batch 128"),
    "resnet": Spec("zoo", _resnet, _resnet_batch,
                   "residual CNN with BatchNorm, 16 channels, 32x32, batch 16"),
    "encoder": Spec("zoo", _encoder, _encoder_batch,
                    "transformer encoder classifier, padding mask, dim 128, 2 layers, "
                    "seq 64, batch 8"),
    "gpt": Spec("zoo", _gpt, _gpt_batch,
                "GPT-style decoder, tied head, dim 128, 2 layers, seq 64, batch 8"),
    "hf_bert": Spec("transformers", _bert, _bert_batch,
                    "BertForSequenceClassification, hidden 128, 2 layers, seq 64, batch 8"),
    "hf_gpt2": Spec("transformers", _gpt2, _gpt2_batch,
                    "GPT2LMHeadModel, hidden 128, 2 layers, seq 64, batch 8"),
    "hf_gpt2_ckpt": Spec("transformers", _gpt2_ckpt, _gpt2_batch,
                         "GPT2LMHeadModel as hf_gpt2, with gradient_checkpointing_enable()"),
    "hf_vit": Spec("transformers", _vit, _vit_batch,
                   "ViTForImageClassification, hidden 128, 2 layers, 32x32, patch 8, batch 8"),
}


def build(name: str, size: str, seed: int = 0) -> nn.Module:
    """Model ``name``'s task at ``size``, its weights drawn from ``seed`` (the same in
    every process)."""
    torch.manual_seed(seed)
    return _no_dropout(SPECS[name].build(size)).train()


def batches(name: str, size: str, count: int, device: str, seed: int = 1) -> list[tuple]:
    """``count`` batches for model ``name``, the same for every runtime and process."""
    gen = torch.Generator().manual_seed(seed)
    return [tuple(t.to(device) for t in SPECS[name].batch(size, gen)) for _ in range(count)]
