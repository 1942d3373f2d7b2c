"""agspeed demo: short real training runs, eager vs torch.compile vs agspeed, in one table.

Two small models learn from generated data: a transformer language model (token and
position embeddings, causal self-attention blocks, next-token loss) on sequences that
follow a rule it can learn, and a residual CNN classifying images.  Each trains in FP32
and in AMP (``torch.autocast``: bfloat16 on the CPU, float16 with a ``GradScaler`` on
CUDA) three times from the same weights on the same batches: plain eager,
``torch.compile(model)``, and ``agspeed.optimize(model)`` with its autotuner.  The three
take their steps in turn, so all see the same machine.

The table gives, per model and precision and runtime: the median step time over the
last third of the steps (forward, loss, backward, optimizer step), the speedup over
eager, the warm-up (what the rest took beyond that median: capture, compile,
tuning; agspeed's autotuner also runs some of those steps eager, to check its choice
against eager on the program's own loop), the
graphs compiled and how many of them came after the first step (recompiles), the backend
that runs each graph, and whether every step's loss matches eager's (within the rounding
a compiled kernel's other summation order explains: 2e-3 relative in FP32, 3e-2 in AMP).
The exit status is 1 when agspeed's losses do not match.  Run it twice: the second run
finds agspeed's choices in its knowledge base and tunes nothing.

    python scripts/demo.py [--steps N] [--device cpu|cuda] [--models lm,cnn]
        [--precisions fp32,amp] [--no-compile]

The data is generated, so the demo downloads nothing.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import agspeed
from agspeed import _runtime
from agspeed.backends import autotune

WARM = 3  # the fewest steps whose time is warm-up, not steady state
TOLERANCE = {"fp32": 2e-3, "amp": 3e-2}


def warm_steps(steps: int) -> int:
    """The steps counted as warm-up: the first two thirds of the run (at least WARM),
    which hold the captures, the compiles and agspeed's checks of its choices (up to 16
    steps of each of the choice and eager, in turns; here each one's clock also counts
    the other runtimes' steps between its own, which makes the turns noisier and longer
    than in a real loop)."""
    return max(WARM, steps * 2 // 3)


# --- the models -----------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """A GPT-style language model; ``forward(tokens)`` returns the next-token loss."""

    def __init__(self, vocab: int = 256, dim: int = 128, heads: int = 4, layers: int = 2,
                 context: int = 64):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        positions = torch.arange(inputs.shape[1], device=tokens.device)
        x = self.tok(inputs) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class ResidualBlock(nn.Module):
    """Conv-BN-ReLU twice with a residual connection."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class SmallCNN(nn.Module):
    """A residual CNN for 3x32x32 images; ``forward(images, labels)`` returns the loss."""

    def __init__(self, width: int = 32, depth: int = 3, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(ResidualBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, images, labels):
        x = F.relu(self.stem(images))
        for block in self.blocks:
            x = block(x)
        logits = self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return F.cross_entropy(logits, labels)


def lm_batches(steps: int, device: str, batch: int = 16, length: int = 65,
               vocab: int = 256):
    """Sequences counting up from a random start by a random stride (1 to 4), modulo the
    vocabulary: after two tokens the rest is predictable, so the loss falls."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=gen)
        stride = torch.randint(1, 5, (batch, 1), generator=gen)
        out.append(((start + stride * torch.arange(length)) % vocab,))
    return [tuple(t.to(device) for t in b) for b in out]


def cnn_batches(steps: int, device: str, batch: int = 32):
    """Images whose class is the brightest of ten fixed patterns mixed into noise."""
    gen = torch.Generator().manual_seed(0)
    patterns = torch.randn(10, 3, 32, 32, generator=gen)
    out = []
    for _ in range(steps):
        labels = torch.randint(0, 10, (batch,), generator=gen)
        images = 0.5 * patterns[labels] + torch.randn(batch, 3, 32, 32, generator=gen)
        out.append((images, labels))
    return [tuple(t.to(device) for t in b) for b in out]


MODELS = {"lm": ("transformer LM", TinyLM, lm_batches),
          "cnn": ("residual CNN", SmallCNN, cnn_batches)}


# --- one runtime's training -------------------------------------------------------------


class Run:
    """One runtime's model, optimizer and (CUDA AMP) GradScaler."""

    def __init__(self, runtime: str, model: nn.Module, precision: str, device: str):
        self.runtime, self.precision, self.device = runtime, precision, device
        self.kind = "cuda" if device.startswith("cuda") else "cpu"
        self.amp_dtype = torch.float16 if self.kind == "cuda" else torch.bfloat16
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.scaler = torch.amp.GradScaler(self.kind) \
            if precision == "amp" and self.kind == "cuda" else None
        self.times: list[float] = []
        self.losses: list[float] = []
        self.graphs_after_first = 0
        if runtime == "eager":
            self.fn = model
        elif runtime == "torch.compile":
            self.fn = torch.compile(model)
        else:
            self.fn = agspeed.optimize(model)

    def step(self, batch: tuple) -> None:
        if self.kind == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast(self.kind, dtype=self.amp_dtype, enabled=self.precision == "amp"):
            loss = self.fn(*batch)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.losses.append(loss.item())  # waits for the device
        self.times.append(time.perf_counter() - start)


def _graphs(runtime: str) -> int:
    """Graphs compiled so far by ``runtime`` (since its counters were last reset)."""
    if runtime == "agspeed":
        return sum(1 for r in _runtime.frame_records() if r.decision == "captured")
    if runtime == "torch.compile":
        from torch._dynamo.utils import counters

        return counters["stats"]["unique_graphs"]
    return 0


def _backends(runtime: str) -> str:
    if runtime == "eager":
        return "-"
    if runtime == "torch.compile":
        return "inductor"
    chosen: dict[str, int] = {}
    for d in autotune.decisions():
        chosen[d.choice] = chosen.get(d.choice, 0) + 1
    tuned = any(d.source == "tuned" for d in autotune.decisions())
    text = ", ".join(f"{n}x {name}" if n > 1 else name for name, n in chosen.items())
    return (text or "eager") + ("" if tuned or not chosen else " (remembered)")


def _mismatch(losses: list[float], eager: list[float]) -> float:
    return max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, eager))


def train_case(name: str, precision: str, runtimes: list[str], steps: int,
               device: str) -> list[dict]:
    """Train model ``name`` in ``precision`` with each runtime; one table row each."""
    _, make, make_batches = MODELS[name]
    torch.manual_seed(0)
    reference = make().to(device)
    batches = make_batches(steps, device)
    agspeed.reset()
    if "torch.compile" in runtimes:
        torch._dynamo.reset()
    runs = {rt: Run(rt, copy.deepcopy(reference), precision, device) for rt in runtimes}
    for k, batch in enumerate(batches):
        order = runtimes[k % len(runtimes):] + runtimes[:k % len(runtimes)]
        for rt in order:
            before = _graphs(rt)
            runs[rt].step(batch)
            if k > 0:
                runs[rt].graphs_after_first += _graphs(rt) - before
    eager_losses = runs["eager"].losses
    rows = []
    warm = warm_steps(steps)
    eager_ms = statistics.median(runs["eager"].times[warm:]) * 1e3
    for rt, run in runs.items():
        steady = statistics.median(run.times[warm:])
        warmup = sum(max(t - steady, 0.0) for t in run.times[:warm])
        diff = _mismatch(run.losses, eager_losses)
        rows.append({"model": name, "precision": precision, "runtime": rt,
                     "step_ms": steady * 1e3, "speedup": eager_ms / (steady * 1e3),
                     "warmup_s": warmup, "graphs": _graphs(rt),
                     "recompiles": run.graphs_after_first, "backends": _backends(rt),
                     "loss_diff": diff, "match": diff <= TOLERANCE[precision],
                     "first_loss": run.losses[0], "last_loss": run.losses[-1]})
    return rows


def print_table(rows: list[dict]) -> None:
    head = (f"{'model':15s} {'prec':5s} {'runtime':14s} {'step ms':>8s} {'speedup':>8s} "
            f"{'warm-up s':>9s} {'graphs':>6s} {'recomp':>6s}  {'losses match':14s} "
            f"backends")
    print(head)
    print("-" * len(head))
    for r in rows:
        match = ("yes" if r["match"] else "NO") + f" ({r['loss_diff']:.0e})"
        label = MODELS[r["model"]][0]
        print(f"{label:15s} {r['precision']:5s} {r['runtime']:14s} {r['step_ms']:8.2f} "
              f"{r['speedup']:7.2f}x {r['warmup_s']:9.1f} {r['graphs']:6d} "
              f"{r['recompiles']:6d}  {match:14s} {r['backends']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="lm,cnn")
    parser.add_argument("--precisions", default="fp32,amp")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    args = parser.parse_args()
    if args.steps <= WARM:
        parser.error(f"--steps must be more than {WARM}")
    models = [m for m in args.models.split(",") if m]
    precisions = [p for p in args.precisions.split(",") if p]
    bad = sorted(set(models) - set(MODELS)) + sorted(set(precisions) - set(TOLERANCE))
    if bad:
        parser.error(f"unknown {bad}; models: {', '.join(MODELS)}; precisions: fp32, amp")
    if not args.device.startswith("cuda"):
        # inductor's compile workers would take the CPU in the background while the
        # other runtimes' steps are timed
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
    runtimes = ["eager"] + ([] if args.no_compile else ["torch.compile"]) + ["agspeed"]
    amp = "bfloat16" if not args.device.startswith("cuda") else "float16 + GradScaler"
    print(f"agspeed {agspeed.__version__} demo on {args.device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {args.steps} steps per run (the first "
          f"{warm_steps(args.steps)} warm-up), AMP = {amp}; "
          f"knowledge base: {agspeed.cache.info()['cache_dir']}")
    rows = []
    for name in models:
        for precision in precisions:
            start = time.perf_counter()
            case = train_case(name, precision, runtimes, args.steps, args.device)
            rows += case
            agspeed_row = case[-1]
            print(f"  {MODELS[name][0]} {precision}: done in {time.perf_counter() - start:.0f} s; "
                  f"loss {agspeed_row['first_loss']:.3f} -> {agspeed_row['last_loss']:.3f}",
                  flush=True)
    print()
    print_table(rows)
    ours = [r for r in rows if r["runtime"] == "agspeed"]
    geo = math.exp(statistics.fmean(math.log(r["speedup"]) for r in ours))
    print(f"\nagspeed's geometric-mean speedup over eager: {geo:.2f}x", end="")
    theirs = [r for r in rows if r["runtime"] == "torch.compile"]
    if theirs:
        geo_c = math.exp(statistics.fmean(math.log(r["speedup"]) for r in theirs))
        print(f" (torch.compile: {geo_c:.2f}x)", end="")
    print()
    ok = all(r["match"] for r in ours)
    if not ok:
        print("agspeed's losses do not match eager's: see the table")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
