"""What the frame hook adds to Python calls, as ratios measured side by side in one run.

A small pure-Python function ``leaf`` is called in a loop by ``drive``.  Each case runs
the same loop and reports the time per ``leaf`` call divided by the plain loop's (no
hook installed), so 1.00 means free:

  plain            no hook anywhere: the reference.
  probe            a do-nothing PEP 523 function (agspeed._C's test probe) forwards every
                   frame to CPython: the floor any frame hook pays, because CPython stops
                   inlining Python-to-Python calls while one is installed.
  cached_eager     inside agspeed.optimize: every ``leaf`` frame hits its cached
                   "run eager" decision (no Python callback).
  skipped          inside agspeed.optimize, a copy of ``leaf`` whose code is marked skip:
                   the fast path.
  other_thread     this thread is outside any optimized call while another thread sits
                   inside one (so the hook is installed): the cost to the rest of a program.
  region_call      calling an optimized trivial function from outside (enter the context,
                   install the hook, one cached frame, leave, remove the hook) vs calling it
                   plainly; per call, not per leaf.

The benchmark needs no torch.  It prints a table, writes JSON (and a PNG plot when
matplotlib is installed) next to the path given by --out.

    python benchmarks/hook_overhead.py [--calls N] [--repeat R] [--out benchmarks/results/hook_overhead.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import agspeed
from agspeed import _C

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import machine, save  # noqa: E402


def leaf(a, b):
    return a + b


def drive(n):
    s = 0
    for i in range(n):
        s = leaf(s, i)
    return s


def leaf_skipped(a, b):
    return a + b


def drive_skipped(n):
    s = 0
    for i in range(n):
        s = leaf_skipped(s, i)
    return s


def trivial(x):
    return x


def ns_per_call(fn, arg, calls) -> float:
    """Time of one run of fn(arg), which makes ``calls`` calls, per call, in ns."""
    start = time.perf_counter_ns()
    fn(arg)
    return (time.perf_counter_ns() - start) / calls


def loop_calls(fn, n):
    for _ in range(n):
        fn(1)


class OtherThreadInside:
    """Holds another thread inside an optimized call, so the hook stays installed."""

    def __enter__(self):
        self.inside, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(
            target=agspeed.optimize(lambda: (self.inside.set(), self.release.wait())))
        self.thread.start()
        self.inside.wait()
        assert _C.hook_installed()

    def __exit__(self, *exc):
        self.release.set()
        self.thread.join()


def run(calls: int, repeat: int) -> dict:
    """Every case once per round, rounds interleaved, median per case.

    This machine's speed drifts by tens of percent over seconds (frequency, neighbours);
    interleaving makes every ratio compare measurements taken at the same time.
    """
    agspeed.reset()
    optimized_drive = agspeed.optimize(drive, backend="eager")
    optimized_skip = agspeed.optimize(drive_skipped, backend="eager")
    optimized_trivial = agspeed.optimize(trivial, backend="eager")
    n_trivial = max(calls // 10, 1000)
    _C.mark_skip(leaf_skipped.__code__)

    def probe():
        _C._probe_install()
        try:
            return ns_per_call(drive, calls, calls)
        finally:
            _C._probe_remove()

    def other_thread():
        with OtherThreadInside():
            return ns_per_call(drive, calls, calls)

    cases = {
        "plain": lambda: ns_per_call(drive, calls, calls),
        "probe": probe,
        "cached_eager": lambda: ns_per_call(optimized_drive, calls, calls),
        "skipped": lambda: ns_per_call(optimized_skip, calls, calls),
        "other_thread": other_thread,
        "trivial_plain": lambda: ns_per_call(lambda k: loop_calls(trivial, k), n_trivial,
                                             n_trivial),
        "trivial_region": lambda: ns_per_call(lambda k: loop_calls(optimized_trivial, k),
                                              n_trivial, n_trivial),
    }
    for case in cases.values():  # warm-up: decisions cached, code specialized
        case()
    assert _C.code_cache(leaf.__code__)["entries"], "leaf should have a cached decision"
    samples: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for round_ in range(repeat):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(cases[name]())
    return {name: statistics.median(values) for name, values in samples.items()}


def report(results: dict, args) -> dict:
    plain = results["plain"]
    rows = [
        ("probe", results["probe"], results["probe"] / plain),
        ("cached_eager", results["cached_eager"], results["cached_eager"] / plain),
        ("skipped", results["skipped"], results["skipped"] / plain),
        ("other_thread", results["other_thread"], results["other_thread"] / plain),
        ("region_call", results["trivial_region"],
         results["trivial_region"] / results["trivial_plain"]),
    ]
    print(f"hook overhead on {machine()}")
    print(f"  plain loop: {plain:.1f} ns per leaf call; plain trivial call: "
          f"{results['trivial_plain']:.1f} ns")
    print(f"  {'case':14s} {'ns/call':>9s} {'ratio':>7s}  (ratio to the same calls with no hook)")
    for name, ns, ratio in rows:
        print(f"  {name:14s} {ns:9.1f} {ratio:7.2f}")
    return {
        "benchmark": "hook_overhead",
        "machine": machine(),
        "python": sys.version.split()[0],
        "calls": args.calls,
        "repeat": args.repeat,
        "ns_per_call": results,
        "ratios": {name: round(ratio, 3) for name, _, ratio in rows},
    }


def plot(data: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names, ratios = zip(*data["ratios"].items())
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(names, ratios)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("time / time without hook")
    ax.set_title(f"agspeed hook overhead (Python {data['python']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "hook_overhead.json"))
    args = parser.parse_args()
    data = report(run(args.calls, args.repeat), args)
    save(data, args.out)
    plot(data, os.path.splitext(args.out)[0] + ".png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
