"""Dispatch among many cached shapes of one function: agspeed next to torch.compile.

A small function is called with N different input shapes until each has its own cache
entry (static shapes: dynamic=False and backend "eager" on both sides), then timed on a
cycle through all N shapes, so that no recency ordering helps, taking turns with plain
eager calls of the same function on the same inputs.  Reported per call in
microseconds, as what the runtime adds to eager's call, and as a ratio to N = 1: a flat
cost means dispatch does not grow with the number of entries.

agspeed keys each entry by the frame's signature (argument types and tensor metadata,
hashed with XXH3) and runs only the guards of entries with the frame's signature.
torch.compile's cache is measured with its recompile limits raised to N; its capture of
N shapes is slow, so its largest N is smaller by default (--dynamo-max).

    python benchmarks/dispatch.py [--quick] [--sizes 1,10,100,1000] [--dynamo-max 100]
                                  [--device cpu|cuda]
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


def work(x):
    return x * 2 + 1


DEVICE = "cpu"


def inputs_for(n: int) -> list:
    return [torch.randn(k + 1, device=DEVICE) for k in range(n)]


def timed_cycle(fns: list, xs: list, rounds: int) -> list:
    """Median over rounds of the time per call of one pass over ``xs`` for each of
    ``fns``, in us; the functions take turns within each round, so that the machine's
    drift falls on all of them alike."""
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for fn, out in zip(fns, samples):
            sync(DEVICE)
            start = time.perf_counter_ns()
            for x in xs:
                fn(x)
            sync(DEVICE)
            out.append((time.perf_counter_ns() - start) / len(xs) / 1e3)
    return [statistics.median(s) for s in samples]


def measure(runtime: str, n: int, rounds: int) -> tuple:
    """(eager us, runtime us) per call on a cycle through n cached shapes."""
    agspeed.reset()
    torch._dynamo.reset()
    xs = inputs_for(n)
    if runtime == "agspeed":
        fn = agspeed.optimize(work, backend="eager", dynamic=False)
    else:
        fn = torch.compile(work, backend="eager", dynamic=False)
    with agspeed.config.override(recompile_limit=max(n + 8, 8), cache_size_limit=max(n + 8, 64)):
        for x in xs:  # one capture per shape
            fn(x)
        if runtime == "agspeed":
            entries = _C.code_cache(work.__code__)["entries"]
            assert len(entries) == n, f"{len(entries)} entries for {n} shapes"
        eager_us, runtime_us = timed_cycle([work, fn], xs, rounds)
    return eager_us, runtime_us


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", default="1,10,100,1000")
    parser.add_argument("--dynamo-max", type=int, default=100)
    add_device_args(parser)
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    args.out = default_out(args, "dispatch")
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.quick:
        sizes = [s for s in sizes if s <= 10] or [1]
    rounds = 3 if args.quick else 15
    torch.set_num_threads(1)
    limits = ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
              "accumulated_recompile_limit")
    for name in limits:
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(sizes) + 8)
    for runtime in ("agspeed", "dynamo"):   # warm up, so the first row is not cold
        measure(runtime, sizes[0], 1)
    rows = {}
    for n in sizes:
        eager_us, agspeed_us = measure("agspeed", n, rounds)
        row = {"eager_us": eager_us, "agspeed_us": agspeed_us,
               "agspeed_overhead_us": agspeed_us - eager_us,
               "dynamo_us": None, "dynamo_overhead_us": None}
        if n <= args.dynamo_max:
            eager2_us, dynamo_us = measure("dynamo", n, rounds)
            row["dynamo_us"] = dynamo_us
            row["dynamo_overhead_us"] = dynamo_us - eager2_us
        rows[n] = row
    base = rows[sizes[0]]
    print(f"dispatch among cached shapes ({DEVICE}) on {machine(DEVICE)}, torch {torch.__version__}")
    print(f"  {'shapes':>7s} {'eager':>8s} {'agspeed':>8s} {'+eager':>8s} {'x first':>8s} "
          f"{'dynamo':>8s} {'+eager':>8s} {'x first':>8s}")
    for n, r in rows.items():
        r["agspeed_vs_first"] = r["agspeed_us"] / base["agspeed_us"]
        dyn = r["dynamo_us"]
        r["dynamo_vs_first"] = dyn / base["dynamo_us"] if dyn and base["dynamo_us"] else None
        dyn_text = (f"{dyn:8.1f} {r['dynamo_overhead_us']:8.1f} {r['dynamo_vs_first']:8.2f}"
                    if dyn else f"{'-':>8s} {'-':>8s} {'-':>8s}")
        print(f"  {n:7d} {r['eager_us']:8.1f} {r['agspeed_us']:8.1f} "
              f"{r['agspeed_overhead_us']:8.1f} {r['agspeed_vs_first']:8.2f} {dyn_text}")
    data = {"benchmark": "dispatch", "machine": machine(DEVICE), "device": DEVICE,
            "torch": torch.__version__,
            "quick": args.quick, "rows": {str(n): r for n, r in rows.items()}}
    save(data, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
