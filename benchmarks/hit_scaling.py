"""Cache-hit cost as inputs and layers grow: agspeed next to torch.compile and eager.

Cases (eval mode, no_grad, one thread, backend "eager" on both sides, tiny tensors so
that runtime costs dominate):

  inputs_K   a function of K tensor arguments (K = 1, 4, 16) adding them up;
  layers_L   a model of L Linear(8, 8) layers in a ModuleList (L = 1, 100).

For each: the time per call of eager, agspeed and torch.compile, taking turns within each
round, median over rounds; agspeed's guard alone (the entry's guard program called on the
frame's arguments); and each runtime's own cost per call ("runtime"): the same calls
with a backend whose compiled graph does nothing (it returns its first result again), so
that what is left is entering the call, finding and checking the cache entry, gathering
the graph's inputs and calling it, apart from any tensor work.  That is the figure that
must not grow with the model, and it compares the two runtimes directly.

    python benchmarks/hit_scaling.py [--quick] [--device cpu|cuda] [--out FILE]
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

import agspeed  # noqa: E402
from agspeed import _C  # noqa: E402
from _report import add_device_args, default_out, machine, save, sync  # noqa: E402


def add1(a):
    return a + 1


def add4(a, b, c, d):
    return a + b + c + d


def add16(a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p):  # noqa: E741
    return a + b + c + d + e + f + g + h + i + j + k + l + m + n + o + p


class Layers(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


DEVICE = "cpu"


def cases() -> dict:
    torch.manual_seed(0)

    def t(*shape):
        return torch.randn(*shape, device=DEVICE)

    return {
        "inputs_1": (add1, [t(4)]),
        "inputs_4": (add4, [t(4) for _ in range(4)]),
        "inputs_16": (add16, [t(4) for _ in range(16)]),
        "layers_1": (Layers(1).to(DEVICE).eval(), [t(2, 8)]),
        "layers_100": (Layers(100).to(DEVICE).eval(), [t(2, 8)]),
    }


def per_call_us(fn, args, calls: int) -> float:
    sync(DEVICE)
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn(*args)
    sync(DEVICE)
    return (time.perf_counter_ns() - start) / calls / 1e3


def serving_entry(target, args) -> tuple:
    """(entry, frame): the agspeed entry serving a call of ``target`` on ``args``, and
    that call's frame as guard programs take it."""
    fn = target.forward if isinstance(target, torch.nn.Module) else target
    code = fn.__code__
    names = code.co_varnames[:code.co_argcount]
    values = ([optimized_views[id(target)]] if isinstance(target, torch.nn.Module) else []) \
        + list(args)
    frame = (dict(zip(names, values)), fn.__globals__, {})
    # the entry serving this frame (layers_1 and layers_100 share forward's code)
    (entry,) = [e for e in _C.code_cache(code)["entries"]
                if e.action == _C.ACTION_CALL and e.guard(*frame)]
    return entry, frame


def guard_us(entry, frame, calls: int) -> float:
    """The agspeed entry's guard alone, on the frame the call makes."""
    samples = []
    for _ in range(9):   # median of rounds, as for the calls
        start = time.perf_counter_ns()
        for _ in range(calls):
            entry.guard(*frame)
        samples.append((time.perf_counter_ns() - start) / calls / 1e3)
    return statistics.median(samples)


optimized_views: dict[int, object] = {}


def interleaved(fns: dict, inputs, rounds: int, calls: int) -> dict:
    """Median per-call time of each of ``fns``, taking turns within each round."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    for r in range(rounds):
        shift = r % len(keys)
        for k in keys[shift:] + keys[:shift]:
            samples[k].append(per_call_us(fns[k], inputs, calls))
    return {k: statistics.median(v) for k, v in samples.items()}


def noop_backend(gm, example_inputs):
    """A compiled graph that does nothing: it returns what the graph returned on its
    first call, so that a call costs the runtime alone."""
    first = []

    def run(*args):
        if not first:
            first.append(gm(*args))
        return first[0]
    return run


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    add_device_args(parser)
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    args.out = default_out(args, "hit_scaling")
    torch.set_num_threads(1)
    rounds, calls = (2, 20) if args.quick else (15, 300)
    agspeed.reset()
    torch._dynamo.reset()
    results = {}
    with torch.no_grad():
        for name, (target, inputs) in cases().items():
            fns = {"eager": target,
                   "agspeed": agspeed.optimize(target, backend="eager"),
                   "dynamo": torch.compile(target, backend="eager")}
            if isinstance(target, torch.nn.Module):
                optimized_views[id(target)] = fns["agspeed"]
            for fn in fns.values():
                for _ in range(3):
                    fn(*inputs)
            samples = interleaved(fns, inputs, rounds, calls)
            row = {f"{k}_us": v for k, v in samples.items()}
            entry, frame = serving_entry(target, inputs)
            row["agspeed_guard_us"] = guard_us(entry, frame, calls * 5)
            # each runtime again with a graph that does nothing: what the runtime costs
            agspeed.reset()
            torch._dynamo.reset()
            bare = {"agspeed": agspeed.optimize(target, backend=noop_backend),
                    "dynamo": torch.compile(target, backend=noop_backend)}
            for fn in bare.values():
                for _ in range(3):
                    fn(*inputs)
            for k, v in interleaved(bare, inputs, rounds, calls).items():
                row[f"{k}_runtime_us"] = v
            row["runtime_vs_dynamo"] = row["agspeed_runtime_us"] / row["dynamo_runtime_us"]
            row["agspeed_vs_eager"] = row["agspeed_us"] / row["eager_us"]
            row["agspeed_vs_dynamo"] = row["agspeed_us"] / row["dynamo_us"]
            # what each runtime adds to the same eager work, and agspeed's share of dynamo's
            row["agspeed_overhead_us"] = row["agspeed_us"] - row["eager_us"]
            row["dynamo_overhead_us"] = row["dynamo_us"] - row["eager_us"]
            row["overhead_vs_dynamo"] = (row["agspeed_overhead_us"] / row["dynamo_overhead_us"]
                                         if row["dynamo_overhead_us"] > 0 else None)
            results[name] = row
    l1, l100 = results["layers_1"], results["layers_100"]
    summary = {"guard_100_vs_1_layers": l100["agspeed_guard_us"] / l1["agspeed_guard_us"],
               "runtime_100_vs_1_layers":
                   l100["agspeed_runtime_us"] / l1["agspeed_runtime_us"],
               "dynamo_runtime_100_vs_1_layers":
                   l100["dynamo_runtime_us"] / l1["dynamo_runtime_us"]}
    print(f"cache-hit scaling ({DEVICE}) on {machine(DEVICE)}, torch {torch.__version__}")
    print(f"  {'case':11s} {'eager':>9s} {'agspeed':>9s} {'dynamo':>9s} {'guard':>6s} "
          f"{'ag/eager':>8s} {'ag/dyn':>7s} {'ovh/dyn':>7s} {'rt ag':>6s} {'rt dyn':>6s} "
          f"{'rt/dyn':>6s}   (us per call)")
    for name, r in results.items():
        print(f"  {name:11s} {r['eager_us']:9.1f} {r['agspeed_us']:9.1f} {r['dynamo_us']:9.1f} "
              f"{r['agspeed_guard_us']:6.1f} {r['agspeed_vs_eager']:8.2f} "
              f"{r['agspeed_vs_dynamo']:7.2f} {_ratio(r['overhead_vs_dynamo']):>7s} "
              f"{r['agspeed_runtime_us']:6.1f} {r['dynamo_runtime_us']:6.1f} "
              f"{r['runtime_vs_dynamo']:6.2f}")
    print(f"  100 layers / 1 layer: agspeed's runtime cost "
          f"{summary['runtime_100_vs_1_layers']:.1f}x (its guard alone "
          f"{summary['guard_100_vs_1_layers']:.1f}x), torch.compile's "
          f"{summary['dynamo_runtime_100_vs_1_layers']:.1f}x")
    data = {"benchmark": "hit_scaling", "machine": machine(DEVICE), "device": DEVICE,
            "torch": torch.__version__,
            "quick": args.quick, "cases": results, "summary": summary}
    save(data, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
