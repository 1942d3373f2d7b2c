"""A float that changes every step: training with an annealed temperature, compiled.

The decoder LM of ``dynamic.py`` (fixed sequence length here) trains with its logits
divided by a temperature that anneals from 2.0 to 1.0 over the run, a Python float
passed to ``forward`` on every step (as distillation and Gumbel-softmax schedules do).
Each runtime starts from the same weights and sees the same batches:

  eager             plain PyTorch;
  agspeed           optimize(backend="inductor"): the float is a constant of the first
                    graphs, then a symbol (after dynamic_after values), which inductor
                    reads as a 0-d tensor: one compiled graph for every later value;
  torch.compile     torch.compile(backend="inductor"), its own handling of floats.

Reported: graphs compiled, the run's total time (compiles included) and the median
step of the last half, both as ratios to eager; and whether the losses match eager's.

    python benchmarks/floats.py [--quick] [--steps N] [--device cpu|cuda] [--out FILE]
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
import torch.nn.functional as F  # noqa: E402

import agspeed  # noqa: E402
from _report import add_device_args, default_out, machine, sync  # noqa: E402
from dynamic import TinyLM, batches, report  # noqa: E402


class Tempered(TinyLM):
    def forward(self, idx, targets, temperature):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x)) / temperature
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def graphs_made(runtime: str) -> int:
    if runtime == "agspeed":
        return sum(r.decision == "captured" for r in agspeed._runtime.frame_records())
    if runtime == "torch.compile":
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    return 0


def train(runtime: str, data: list, device: str) -> dict:
    torch.manual_seed(0)
    model = Tempered().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    agspeed.reset()
    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    step_fn = model if runtime == "eager" else \
        agspeed.optimize(model, backend="inductor") if runtime == "agspeed" else \
        torch.compile(model, backend="inductor")
    losses, times = [], []
    sync(device)
    start = time.perf_counter()
    for k, (idx, targets) in enumerate(data):
        t0 = time.perf_counter()
        temperature = 2.0 - k / max(len(data) - 1, 1)     # 2.0 down to 1.0
        loss = step_fn(idx, targets, temperature)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())   # also waits for the device
        times.append(time.perf_counter() - t0)
    total = time.perf_counter() - start
    return {"graphs": graphs_made(runtime), "total_s": total,
            "steady_ms": statistics.median(times[len(times) // 2:]) * 1e3,
            "losses": losses}


RUNTIMES = ("eager", "agspeed", "torch.compile")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=60)
    add_device_args(parser)
    args = parser.parse_args()
    args.out = default_out(args, "floats")
    steps = 6 if args.quick else args.steps
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
    data = batches(steps, 8, range(64, 65), args.device)
    results = {name: train(name, data, args.device) for name in RUNTIMES}
    print(f"a temperature annealed over {steps} steps on {args.device}: "
          f"{machine(args.device)}, torch {torch.__version__}")
    return report("floats", results, args, steps)


if __name__ == "__main__":
    raise SystemExit(main())
