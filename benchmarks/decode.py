"""Decoding with a key/value cache: the position is a plain int that changes every step.

A small decoder (rotary-free LLaMA-style blocks: RMSNorm, attention over a key/value
cache, SiLU MLP) generates tokens greedily: one call for the prompt, then one call per
new token with ``start_pos``, the number of tokens cached so far, as an int argument.
The cache is written at ``start_pos`` and read up to ``start_pos + n``, so every step has
another position and, without symbolic ints, another graph.  Each runtime starts from the
same weights and prompt:

  eager             plain PyTorch;
  agspeed           the default: an int that keeps changing becomes a symbol after
                    dynamic_after values, and one graph serves every later position;
  agspeed static    optimize(dynamic=False): one graph per position, up to the limits;
  dynamo            torch.compile(dynamic=None), its automatic dynamic ints;
  dynamo static     torch.compile(dynamic=False).

All compiled runtimes use the backend "eager" (run the captured graph as is), so the
figures are what capture, guards and dispatch cost and save.  Reported: graphs compiled,
the whole generation's time (captures included) and the median decoding step after the
first quarter, both as ratios to eager; and whether the generated tokens match eager's.

    python benchmarks/decode.py [--quick] [--tokens N] [--device cpu|cuda] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from _report import add_device_args, default_out, machine, save, sync  # noqa: E402
from dynamic import RUNTIMES, Counting, print_rows, wrapped  # noqa: E402


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, batch: int, ctx: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        shape = (batch, heads, ctx, dim // heads)
        self.register_buffer("cache_k", torch.zeros(shape), persistent=False)
        self.register_buffer("cache_v", torch.zeros(shape), persistent=False)

    def forward(self, x, start_pos: int):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        self.cache_k[:b, :, start_pos:start_pos + n] = k
        self.cache_v[:b, :, start_pos:start_pos + n] = v
        keys = self.cache_k[:b, :, :start_pos + n]
        values = self.cache_v[:b, :, :start_pos + n]
        scores = q @ keys.transpose(2, 3) * (d // self.heads) ** -0.5
        if n > 1:   # the prompt: causal within it
            mask = torch.full((n, n), float("-inf"), device=x.device).triu(1)
            scores = scores + torch.hstack([torch.zeros(n, start_pos, device=x.device),
                                            mask])
        y = scores.softmax(-1) @ values
        return self.out(y.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, batch: int, ctx: int):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attn = Attention(dim, heads, batch, ctx)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim, bias=False), nn.SiLU(),
                                 nn.Linear(4 * dim, dim, bias=False))

    def forward(self, x, start_pos: int):
        x = x + self.attn(self.norm1(x), start_pos)
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, layers: int = 2, heads: int = 4,
                 batch: int = 4, ctx: int = 256):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, batch, ctx) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens, start_pos: int):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, start_pos)
        return self.head(self.norm(x[:, -1]))


@torch.no_grad()
def generate(runtime: str, prompt: torch.Tensor, tokens: int, device: str) -> dict:
    torch.manual_seed(0)
    model = Decoder(batch=prompt.shape[0], ctx=prompt.shape[1] + tokens + 1).to(device)
    backend = Counting()
    step = wrapped(runtime, model, backend)
    out, times = [], []
    sync(device)
    start = time.perf_counter()
    nxt = step(prompt, 0).argmax(-1, keepdim=True)
    out.append(nxt)
    pos = prompt.shape[1]
    for _ in range(tokens - 1):
        t0 = time.perf_counter()
        nxt = step(nxt, pos).argmax(-1, keepdim=True)
        sync(device)
        times.append(time.perf_counter() - t0)
        out.append(nxt)
        pos += 1
    total = time.perf_counter() - start
    steady = statistics.median(times[len(times) // 4:])
    return {"graphs": backend.graphs, "total_s": total, "steady_ms": steady * 1e3,
            "tokens": torch.cat(out, 1).cpu()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tokens", type=int, default=128)
    add_device_args(parser)
    args = parser.parse_args()
    args.out = default_out(args, "decode")
    tokens = 16 if args.quick else args.tokens
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
    prompt = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(args.device)
    results = {name: generate(name, prompt, tokens, args.device) for name in RUNTIMES}
    eager = results["eager"]
    reference = eager["tokens"]
    print(f"greedy decoding with a key/value cache ({tokens} tokens after a "
          f"{prompt.shape[1]}-token prompt, batch {prompt.shape[0]}) on {args.device}: "
          f"{machine(args.device)}, torch {torch.__version__}")
    for r in results.values():
        r["tokens_match"] = bool(torch.equal(r.pop("tokens"), reference))
    print_rows(results, "tokens_match")
    data_out = {"benchmark": "decode", "machine": machine(args.device), "device": args.device,
                "torch": torch.__version__, "quick": args.quick, "tokens": tokens,
                "runtimes": results}
    save(data_out, args.out)
    bad = [name for name, r in results.items() if not r["tokens_match"]]
    if bad:
        print(f"  tokens differ from eager for: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
