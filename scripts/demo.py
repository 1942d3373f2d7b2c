"""agspeed demo: a short real training run, eager vs optimized, with a summary.

Trains the same small convolutional classifier twice from the same initial weights and
the same synthetic batches: once plain eager, once through ``agspeed.optimize`` with the
autotuner (``backend="auto"``).  Prints the median step time of each (forward + backward
+ optimizer step), the time the first optimized step spent capturing and tuning, the
backend the autotuner chose for each graph and by how much it beat eager, whether the two
runs ended with the same losses and weights (equal outright, or as close to the same
training in float64 as eager is: a compiled backend rounds differently), and the
runtime's counters.  Run it twice:
the second run finds its choices in the knowledge base and does not tune again.

    python scripts/demo.py [--steps N] [--batch B] [--device cpu|cuda]

The data is generated, so the demo needs no download.  This is a command-line program:
it prints its report.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import agspeed
from agspeed.backends import autotune


class Block(nn.Module):
    """Conv-BN-ReLU twice with a residual connection."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(x + y)


class SmallNet(nn.Module):
    """A small residual CNN for 3x32x32 images and 10 classes."""

    def __init__(self, width: int = 32, depth: int = 3):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        x = F.relu(self.stem(x))
        for block in self.blocks:
            x = block(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.head(x)


def make_batches(steps: int, batch: int, device: str):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(batch, 3, 32, 32, generator=gen).to(device),
         torch.randint(0, 10, (batch,), generator=gen).to(device))
        for _ in range(steps)
    ]


class Trainer:
    """One model and its optimizer; ``step`` runs one timed training step."""

    def __init__(self, model: nn.Module, device: str):
        self.model, self.device = model, device
        self.opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        self.times: list[float] = []
        self.losses: list[float] = []

    def step(self, x, y) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.opt.step()
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - start)
        self.losses.append(loss.item())


def _drift(losses: list[float], exact: list[float]) -> float:
    """The largest distance of a run's losses from the float64 run's, relative to the
    loss where it is above 1."""
    return max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, exact))


def _weights_drift(model: nn.Module, exact: list) -> float:
    """The largest distance of a model's final floating-point weights and buffers from
    the float64 run's."""
    out = 0.0
    for a, b in zip(model.state_dict().values(), exact):
        if a.is_floating_point():
            out = max(out, (a.double() - b).abs().max().item())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.device.startswith("cuda"):
        # cuDNN's and cuBLAS's fastest kernels may sum in a different order from one call
        # to the next, so two eager runs would drift apart too; deterministic kernels let
        # the check below compare the runtimes, not the kernels' rounding.
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False

    torch.manual_seed(0)
    reference = SmallNet().to(args.device)
    eager_model = copy.deepcopy(reference)
    optimized_model = agspeed.optimize(copy.deepcopy(reference))
    batches = make_batches(args.steps, args.batch, args.device)

    eager, optimized = Trainer(eager_model, args.device), Trainer(optimized_model, args.device)
    agspeed.reset()
    # Steps alternate between the two runs so both see the same machine state.
    for x, y in batches:
        eager.step(x, y)
        optimized.step(x, y)
    counters = agspeed.counters()
    eager_times, eager_losses = eager.times, eager.losses
    opt_times, opt_losses = optimized.times, optimized.losses

    warm = slice(min(3, args.steps - 1), None)  # the first steps include one-time set-up
    eager_ms = statistics.median(eager_times[warm]) * 1e3
    opt_ms = statistics.median(opt_times[warm]) * 1e3

    # The same training in float64 is the reference both runs are held to: a compiled
    # backend sums in another order than eager's kernels, and over many steps the two
    # float32 runs drift apart by rounding alone.  The optimized run passes when it is
    # as close to float64 as eager is (or equal to eager outright).
    exact = Trainer(copy.deepcopy(reference).double(), args.device)
    for x, y in batches:
        exact.step(x.double(), y)
    eager_drift = _drift(eager_losses, exact.losses)
    opt_drift = _drift(opt_losses, exact.losses)
    same_losses = all(abs(a - b) <= 1e-4 * max(1.0, abs(a))
                      for a, b in zip(eager_losses, opt_losses)) or \
        opt_drift <= 2 * eager_drift + 1e-5
    exact_weights = list(exact.model.state_dict().values())
    eager_wdrift = _weights_drift(eager_model, exact_weights)
    opt_wdrift = _weights_drift(optimized_model, exact_weights)
    same_weights = all(
        torch.allclose(a, b, rtol=1e-4, atol=1e-5)
        for a, b in zip(eager_model.state_dict().values(), optimized_model.state_dict().values())
    ) or opt_wdrift <= 2 * eager_wdrift + 1e-6

    print(f"agspeed {agspeed.__version__} demo: SmallNet, {args.steps} steps, batch {args.batch}, "
          f"{args.device}, torch {torch.__version__}")
    print(f"  step time (median after warm-up)  eager {eager_ms:8.2f} ms   "
          f"agspeed {opt_ms:8.2f} ms   ratio {opt_ms / eager_ms:5.3f}")
    print(f"  final loss                        eager {eager_losses[-1]:8.4f}      "
          f"agspeed {opt_losses[-1]:8.4f}")
    print(f"  largest distance from the float64 run: loss eager {eager_drift:.2e}, agspeed "
          f"{opt_drift:.2e}; weights eager {eager_wdrift:.2e}, agspeed {opt_wdrift:.2e}")
    print(f"  same losses at every step: {same_losses}; same final weights: {same_weights}")
    print("  runtime counters (optimized run):")
    for name, value in counters.items():
        print(f"    {name:16s} {value:8d}   {agspeed._C.COUNTER_DOCS[name]}")
    print("  frames the runtime decided about (user code; torch and stdlib are skipped):")
    seen = {}
    for record in agspeed._runtime.frame_records():
        seen.setdefault((record.name, record.filename, record.firstlineno), record)
    for record in seen.values():
        print(f"    {record}")
    print("  backends chosen per graph (autotuner: checked against eager, timed forward + "
          "backward):")
    for d in autotune.decisions():
        how = "tuned" if d.source == "tuned" else "from the knowledge base, not tuned"
        print(f"    {d.graph}: {d.choice} ({d.speedup:.2f}x over eager; {how} in "
              f"{d.seconds:.1f} s)")
    if not autotune.decisions():
        print("    (none: only eager was a candidate)")
    print(f"  first optimized step (capture + tuning): {opt_times[0]:.1f} s; "
          f"knowledge base: {agspeed.cache.info()['cache_dir']}")
    return 0 if same_losses and same_weights else 1


if __name__ == "__main__":
    raise SystemExit(main())
