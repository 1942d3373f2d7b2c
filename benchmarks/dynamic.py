"""Varying shapes: a training run whose sequence length changes every step.

A small decoder LM (embeddings, causal self-attention blocks, tied head) trains for a
number of steps on batches whose sequence length is drawn from a range, as with
variable-length text, and whose last batch is smaller.  Each runtime starts from the same
weights and sees the same batches:

  eager             plain PyTorch;
  agspeed           automatic dynamic shapes (the default): a length that keeps
                    changing becomes a symbolic size after dynamic_after lengths;
  agspeed static    optimize(dynamic=False): one graph per length, up to the limits;
  dynamo            torch.compile(dynamic=None), its automatic dynamic shapes;
  dynamo static     torch.compile(dynamic=False).

All compiled runtimes use the backend "eager" (run the captured graph as is), so the
figures are what capture, guards and dispatch cost and save, not a code generator's.
Reported: graphs compiled, the run's total time (captures included) and the median
step after the first quarter (steady state), both as ratios to eager; and whether the
losses match eager's.

    python benchmarks/dynamic.py [--quick] [--steps N] [--device cpu|cuda] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import agspeed  # noqa: E402
from _report import add_device_args, default_out, machine, save, sync  # noqa: E402


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, layers: int = 2, heads: int = 4,
                 ctx: int = 256):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx, targets):
        t = idx.size(1)
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class Counting:
    """The eager backend, counting the graphs it is given."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def batches(steps: int, batch: int, lengths: range, device: str, seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for step in range(steps):
        t = int(torch.randint(lengths.start, lengths.stop, (1,), generator=gen))
        b = batch if step < steps - 1 else max(batch // 2, 2)   # a short last batch
        ids = torch.randint(0, 256, (b, t + 1), generator=gen)
        out.append((ids[:, :-1].to(device), ids[:, 1:].to(device)))
    return out


def wrapped(runtime: str, model: nn.Module, backend: Counting):
    """``model`` as ``runtime`` (one of RUNTIMES) runs it, both runtimes reset first."""
    agspeed.reset()
    torch._dynamo.reset()
    if runtime == "eager":
        return model
    if runtime.startswith("agspeed"):
        return agspeed.optimize(model, backend=backend,
                                **({"dynamic": False} if runtime.endswith("static") else {}))
    return torch.compile(model, backend=backend,
                         dynamic=False if runtime.endswith("static") else None)


def print_rows(results: dict, match: str) -> None:
    """The table of ``results`` (runtime -> figures, eager first), with ratios to eager
    added to each; ``match`` names the boolean that says whether it agrees with eager."""
    eager = results["eager"]
    print(f"  {'runtime':16s} {'graphs':>6s} {'total s':>8s} {'x eager':>8s} "
          f"{'step ms':>8s} {'x eager':>8s}  {match.split('_')[0]}")
    for name, r in results.items():
        r["total_vs_eager"] = r["total_s"] / eager["total_s"]
        r["steady_vs_eager"] = r["steady_ms"] / eager["steady_ms"]
        print(f"  {name:16s} {r['graphs']:6d} {r['total_s']:8.2f} {r['total_vs_eager']:8.2f} "
              f"{r['steady_ms']:8.3f} {r['steady_vs_eager']:8.2f}  "
              f"{'match' if r[match] else 'DIFFER'}")


def train(runtime: str, data: list, device: str) -> dict:
    torch.manual_seed(0)
    model = TinyLM().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    backend = Counting()
    step_fn = wrapped(runtime, model, backend)
    losses, times = [], []
    sync(device)
    start = time.perf_counter()
    for idx, targets in data:
        t0 = time.perf_counter()
        loss = step_fn(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())   # also waits for the device
        times.append(time.perf_counter() - t0)
    total = time.perf_counter() - start
    steady = statistics.median(times[len(times) // 4:])
    return {"graphs": backend.graphs, "total_s": total, "steady_ms": steady * 1e3,
            "losses": losses}


RUNTIMES = ("eager", "agspeed", "agspeed static", "dynamo", "dynamo static")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=120)
    add_device_args(parser)
    args = parser.parse_args()
    args.out = default_out(args, "dynamic")
    steps = 12 if args.quick else args.steps
    lengths = range(16, 25) if args.quick else range(16, 129)
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
    data = batches(steps, 8, lengths, args.device)
    results = {name: train(name, data, args.device) for name in RUNTIMES}
    print(f"varying sequence length ({steps} steps, lengths {lengths.start}-"
          f"{lengths.stop - 1}, {len({d[0].shape for d in data})} distinct shapes) on "
          f"{args.device}: {machine(args.device)}, torch {torch.__version__}")
    return report("dynamic", results, args, steps, lengths=[lengths.start, lengths.stop - 1])


def report(benchmark: str, results: dict, args: Any, steps: int, **extra: Any) -> int:
    """Compares every runtime's losses with eager's, prints the table, saves the run
    (``extra`` fields added) and answers the exit status: 1 where losses differ."""
    eager = results["eager"]
    for r in results.values():
        r["losses_match"] = all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5)
                                for a, b in zip(r["losses"], eager["losses"]))
    print_rows(results, "losses_match")
    save({"benchmark": benchmark, "machine": machine(args.device), "device": args.device,
          "torch": torch.__version__, "quick": args.quick, "steps": steps, **extra,
          "runtimes": {k: {kk: vv for kk, vv in v.items() if kk != "losses"}
                       for k, v in results.items()}}, args.out)
    bad = [name for name, r in results.items() if not r["losses_match"]]
    if bad:
        print(f"  losses differ from eager for: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
