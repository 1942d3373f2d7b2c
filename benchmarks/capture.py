"""Capture latency and cache-hit overhead for the model zoo, agspeed next to torch.compile.

For each model of tests/models/test_zoo.py (backend "eager" on both sides, so only the runtime
is measured, not a compiler):

  capture_ms     a cold first call: ``optimize(model)`` (or ``torch.compile``) and the first
                 call until its result is back, after resetting both runtimes; median over
                 rounds, with the eager forward's time for scale.
  hit_overhead   per call on a cache hit, and minus a plain eager call of the same model
                 on the same small input (eval mode, no_grad), in microseconds; the cases
                 are interleaved within each round and the median is taken per case.
                 Negative: faster than eager (the graph skips nn.Module.__call__).
  train_step     one forward+backward step, optimized vs eager, for the MLP and the GPT.

Ratios are agspeed / torch.compile: below 1 means agspeed costs less.  Before measuring,
``agspeed.explain`` checks that each model is one graph with no break, and the report says
so, so that a silent fall back to eager cannot pass for a fast capture.  The measured calls
are checked too: every timed cold call must have been a capture of one graph (agspeed's
frame records, Dynamo's graph counter), and the timed hit rounds must have been cache hits
only (agspeed's counters: no miss; Dynamo: no new graph).  The "verified" section of the
JSON holds these counts, and the exit status is 1 if any check failed.

    python benchmarks/capture.py [--quick] [--models mlp,gpt] [--out benchmarks/results/capture.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "models"))

import torch  # noqa: E402

from torch._dynamo.utils import counters as dynamo_counters  # noqa: E402

import agspeed  # noqa: E402
from _report import machine, save  # noqa: E402
from agspeed._runtime import frame_records  # noqa: E402
from test_zoo import ZOO  # noqa: E402


def fresh(name: str, seed: int = 0):
    torch.manual_seed(seed)
    cls, make_inputs = ZOO[name]
    model = cls().eval()
    return model, make_inputs()


def reset_all() -> None:
    agspeed.reset()
    torch._dynamo.reset()


def dynamo_graphs() -> int:
    """Graphs Dynamo has made in this process (its reset does not clear the counter)."""
    return dynamo_counters["stats"]["unique_graphs"]


def first_call_ms(name: str, runtime: str) -> tuple[float, bool]:
    """The cold first call's time, and whether it was a capture of exactly one graph."""
    model, inputs = fresh(name)
    reset_all()
    graphs_before = dynamo_graphs()
    with torch.no_grad():
        start = time.perf_counter()
        if runtime == "agspeed":
            fast = agspeed.optimize(model, backend="eager")
        else:
            fast = torch.compile(model, backend="eager")
        fast(*inputs)
        elapsed = (time.perf_counter() - start) * 1e3
    if runtime == "agspeed":
        one_graph = [r.decision for r in frame_records()] == ["captured"]
    else:
        one_graph = dynamo_graphs() - graphs_before == 1
    return elapsed, one_graph


def eager_ms(name: str, calls: int = 20) -> float:
    model, inputs = fresh(name)
    with torch.no_grad():
        model(*inputs)
        start = time.perf_counter()
        for _ in range(calls):
            model(*inputs)
        return (time.perf_counter() - start) * 1e3 / calls


def per_call_us(fn, inputs, calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn(*inputs)
    return (time.perf_counter_ns() - start) / calls / 1e3


def checked(name: str) -> dict:
    model, inputs = fresh(name)
    agspeed.reset()
    with torch.no_grad():
        out = agspeed.explain(model, *inputs)
    return {"graphs": out.graph_count, "breaks": out.graph_break_count,
            "one_graph": out.graph_count == 1 and out.graph_break_count == 0}


def capture_latency(names: list[str], rounds: int) -> dict:
    samples = {n: {"agspeed": [], "dynamo": []} for n in names}
    captured = {n: {"agspeed": 0, "dynamo": 0} for n in names}
    for r in range(rounds):
        for name in names:
            order = ("agspeed", "dynamo") if r % 2 == 0 else ("dynamo", "agspeed")
            for runtime in order:
                ms, one_graph = first_call_ms(name, runtime)
                samples[name][runtime].append(ms)
                captured[name][runtime] += one_graph
    out = {}
    for name in names:
        a = statistics.median(samples[name]["agspeed"])
        d = statistics.median(samples[name]["dynamo"])
        out[name] = {"agspeed_ms": a, "dynamo_ms": d, "ratio": a / d,
                     "eager_forward_ms": eager_ms(name), "rounds": rounds,
                     "agspeed_one_graph_rounds": captured[name]["agspeed"],
                     "dynamo_one_graph_rounds": captured[name]["dynamo"]}
    return out


def hits_only(rounds_fn) -> dict:
    """Run ``rounds_fn`` and count agspeed's hits and misses and Dynamo's new graphs in it."""
    before, graphs_before = agspeed.counters(), dynamo_graphs()
    rounds_fn()
    after = agspeed.counters()
    return {"agspeed_hits": after["cache_hits"] - before["cache_hits"],
            "agspeed_misses": after["cache_misses"] - before["cache_misses"],
            "dynamo_new_graphs": dynamo_graphs() - graphs_before}


def hit_overhead(names: list[str], rounds: int, calls: int) -> dict:
    out = {}
    reset_all()
    for name in names:
        model, inputs = fresh(name)
        fns = {
            "eager": model,
            "agspeed": agspeed.optimize(model, backend="eager"),
            "dynamo": torch.compile(model, backend="eager"),
        }
        samples: dict[str, list[float]] = {k: [] for k in fns}
        with torch.no_grad():
            for fn in fns.values():  # warm-up: captured, compiled, cached
                for _ in range(3):
                    fn(*inputs)
            keys = list(fns)

            def timed_rounds():
                for r in range(rounds):
                    shift = r % len(keys)
                    for k in keys[shift:] + keys[:shift]:
                        samples[k].append(per_call_us(fns[k], inputs, calls))

            counts = hits_only(timed_rounds)
        med = {k: statistics.median(v) for k, v in samples.items()}
        a, d = med["agspeed"] - med["eager"], med["dynamo"] - med["eager"]
        out[name] = {"eager_us": med["eager"], "agspeed_us": med["agspeed"],
                     "dynamo_us": med["dynamo"], "agspeed_overhead_us": a,
                     "dynamo_overhead_us": d,
                     # of overheads only where both are costs; of call times always
                     "ratio": a / d if a > 0 and d > 0 else None,
                     "time_ratio": med["agspeed"] / med["dynamo"], "calls": rounds * calls,
                     **counts}
    return out


def train_step(names: list[str], rounds: int, steps: int) -> dict:
    out = {}
    reset_all()
    for name in names:
        model, inputs = fresh(name)
        model.train()
        fns = {"eager": model, "agspeed": agspeed.optimize(model, backend="eager"),
               "dynamo": torch.compile(model, backend="eager")}

        def step(fn):
            result = fn(*inputs)
            outs = result if isinstance(result, tuple) else (result,)
            sum(o.float().sum() for o in outs).backward()

        samples: dict[str, list[float]] = {k: [] for k in fns}
        for fn in fns.values():
            for _ in range(3):
                step(fn)
        keys = list(fns)

        def timed_rounds():
            for r in range(rounds):
                shift = r % len(keys)
                for k in keys[shift:] + keys[:shift]:
                    start = time.perf_counter_ns()
                    for _ in range(steps):
                        step(fns[k])
                    samples[k].append((time.perf_counter_ns() - start) / steps / 1e3)

        counts = hits_only(timed_rounds)
        model.zero_grad(set_to_none=True)
        med = {k: statistics.median(v) for k, v in samples.items()}
        out[name] = {f"{k}_us": v for k, v in med.items()}
        out[name]["agspeed_vs_eager"] = med["agspeed"] / med["eager"]
        out[name]["dynamo_vs_eager"] = med["dynamo"] / med["eager"]
        out[name].update(calls=rounds * steps, **counts)
    return out


def verify(data: dict) -> dict:
    """Per model, whether every measured agspeed and Dynamo call was what it claims to be."""
    out = {}
    for name, check in data["captured"].items():
        cap = data["capture_latency"][name]
        ok = {"explain_one_graph": check["one_graph"],
              "cold_calls_captured": cap["agspeed_one_graph_rounds"] == cap["rounds"]
              and cap["dynamo_one_graph_rounds"] == cap["rounds"]}
        for section in ("hit_overhead", "train_step"):
            if name in data[section]:
                r = data[section][name]
                ok[f"{section}_hits_only"] = (r["agspeed_misses"] == 0
                                              and r["agspeed_hits"] == r["calls"]
                                              and r["dynamo_new_graphs"] == 0)
        out[name] = ok
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds: a smoke run")
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "capture.json"))
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = set(names) - set(ZOO)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; the zoo has {sorted(ZOO)}")
    torch.set_num_threads(1)  # steadier on a small shared machine; both sides alike
    rounds, calls = (1, 5) if args.quick else (7, 200)
    cap_rounds = 1 if args.quick else 5
    train_names = [n for n in ("mlp", "gpt") if n in names]

    checks = {n: checked(n) for n in names}
    for runtime in ("agspeed", "dynamo"):  # one-time start-up costs (imports) stay out
        first_call_ms(names[0], runtime)
    data = {
        "benchmark": "capture",
        "machine": machine(),
        "torch": torch.__version__,
        "quick": args.quick,
        "captured": checks,
        "capture_latency": capture_latency(names, cap_rounds),
        "hit_overhead": hit_overhead(names, rounds, calls),
        "train_step": train_step(train_names, rounds, max(calls // 10, 2)),
    }
    data["verified"] = verify(data)
    print(f"capture benchmark on {data['machine']}, torch {data['torch']}")
    print(f"  {'model':8s} {'graphs':>6s} {'breaks':>6s}  measured calls as claimed")
    for n, c in checks.items():
        bad = [k for k, ok in data["verified"][n].items() if not ok]
        print(f"  {n:8s} {c['graphs']:6d} {c['breaks']:6d}  "
              f"{'yes' if not bad else 'NO: ' + ', '.join(bad)}")
    print(f"  cold capture, ms    {'agspeed':>9s} {'dynamo':>9s} {'ratio':>6s} {'eager fwd':>9s}")
    for n, r in data["capture_latency"].items():
        print(f"  {n:18s}  {r['agspeed_ms']:9.1f} {r['dynamo_ms']:9.1f} {r['ratio']:6.2f} "
              f"{r['eager_forward_ms']:9.2f}")
    print(f"  cache hit, us/call  {'eager':>9s} {'agspeed':>9s} {'dynamo':>9s} "
          f"{'ag-eager':>9s} {'dyn-eager':>9s} {'ag/dyn':>6s}")
    for n, r in data["hit_overhead"].items():
        print(f"  {n:18s}  {r['eager_us']:9.1f} {r['agspeed_us']:9.1f} {r['dynamo_us']:9.1f} "
              f"{r['agspeed_overhead_us']:9.1f} {r['dynamo_overhead_us']:9.1f} "
              f"{r['time_ratio']:6.2f}")
    print(f"  train step, us      {'eager':>9s} {'agspeed':>9s} {'dynamo':>9s}")
    for n, r in data["train_step"].items():
        print(f"  {n:18s}  {r['eager_us']:9.1f} {r['agspeed_us']:9.1f} {r['dynamo_us']:9.1f}")
    save(data, args.out)
    return 0 if all(all(v.values()) for v in data["verified"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
