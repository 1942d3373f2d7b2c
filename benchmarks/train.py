"""Training step time: eager, torch.compile and agspeed on the zoo and transformers models.

A step is the forward with the loss (the model and its loss are one module, see
benchmarks/_models.py), the backward and an AdamW step, under each precision:

  fp32   plain float32;
  bf16   torch.autocast to bfloat16 (on the CPU and on CUDA);
  fp16   on CUDA only: torch.autocast to float16 with a GradScaler.

Runtimes, each wrapping its own deep copy of the same initial weights, with its own
optimizer, all seeing the same batches in the same order:

  eager              plain PyTorch;
  compile            torch.compile(model) (mode default, Inductor);
  compile_max        torch.compile(model, mode="max-autotune-no-cudagraphs");
  compile_ro         on CUDA only: torch.compile(model, mode="reduce-overhead");
  agspeed            agspeed.optimize(model) (backend "auto", the autotuner; --backend).

Two things are measured, apart:

Steady step time.  In this one process, for each model and precision, every runtime is
prepared and takes WARM steps on its own (compiling, tuning), then the runtimes take turns,
one step each per round, the order rotating by one place every round, for --rounds
rounds; reported is each runtime's median step.  Ratios are of medians, to eager's, and
agspeed's also to the best of eager and the torch.compile modes.  The JSON adds each
runtime's median over rounds of its step over eager's step in the same round, which holds
better where the machine's speed drifts.  Every step's loss is compared with eager's at
the same step (dropout is off, so the runtimes compute the same thing): agspeed's must
agree within a relative tolerance (FP32 1e-3, reduced precision 5e-3) or the run fails
(exit status 1, as when agspeed fails in a warm-up process; the report is written still).
agspeed's counters tell whether it captured anything inside the timed rounds (it should
not), and ``agspeed.explain`` reports each model's graphs and graph breaks.  This process
compiles with Inductor's compile_threads = 1: compile worker processes, started in the
background, would take the CPU during timed steps.

Warm-up time.  Measured in separate processes (`train.py --warmup-worker MODEL PRECISION
RUNTIME`, one JSON line), so that nothing cached in memory helps, for:

  agspeed_first   agspeed with a new, empty cache directory (AGSPEED_CACHE_DIR; Inductor's
                  TORCHINDUCTOR_CACHE_DIR is put inside it too, so that no cache outside
                  it is warm);
  agspeed_second  agspeed again with that same directory: what it learnt is reused;
  compile_cold    torch.compile (default mode) with a new, empty TORCHINDUCTOR_CACHE_DIR;
  compile_warm    with --compile-second-run: torch.compile again with that directory.

A worker builds the model and batches, then takes WARM + STEADY steps, the clock of the
first step starting before the model is wrapped (optimize() or torch.compile()).  Its
warm-up is what the first WARM steps took beyond the median of the STEADY steps after
them, step by step: the sum over those steps of max(step - median, 0), the time spent
beyond what they would have cost in the steady state (a step faster than the median
counts zero, so that noise cannot make a warm-up negative).  WARM is 10 (3 with --quick):
on a small machine Inductor's compile workers still take CPU for a few steps after the
first.  The steady process then reuses the warm-up runs' cache directories (agspeed's for
agspeed, torch.compile's first run's for the torch.compile modes), which shortens its
preparation and changes nothing that is timed; with --no-warmup agspeed uses its
configured cache directory (AGSPEED_CACHE_DIR or its default).

Targets, per model and precision: agspeed's steady step at most 1.05x the best of eager
and the torch.compile modes; its warm-up at most 1.5x torch.compile's cold warm-up on a
first run and 0.3x on a second run.  Across models: agspeed's geometric-mean speedup over
eager at least torch.compile's (default mode).

    python benchmarks/train.py [--models mlp,gpt,...] [--precisions fp32,bf16] [--rounds N]
        [--threads N] [--quick] [--no-compile] [--no-warmup] [--backend auto]
        [--device cpu|cuda] [--out FILE] [--plot FILE]

Results go to benchmarks/results/train[_cuda].json, the plot of steady step ratios to
docs/train[_cuda].svg (beside --out when --out is given).  The transformers models are
skipped, with a note, where transformers cannot be imported.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import torch  # noqa: E402

import agspeed  # noqa: E402
from agspeed.backends import _confirm  # noqa: E402
import _models  # noqa: E402
from _report import add_device_args, default_out, machine, save, sync  # noqa: E402
from plot import Svg, _nice_max, y_grid  # noqa: E402

LABELS = {"eager": "eager", "compile": "torch.compile",
          "compile_max": "torch.compile max-autotune-no-cudagraphs",
          "compile_ro": "torch.compile reduce-overhead", "agspeed": "agspeed"}
SHORT = {"eager": "eager", "compile": "compile", "compile_max": "c-max",
         "compile_ro": "c-ro", "agspeed": "agspeed"}
COLORS = {"eager": "#7f7f7f", "compile": "#d62728", "compile_max": "#ff9896",
          "compile_ro": "#9467bd", "agspeed": "#1f77b4"}
MODES = {"compile": None, "compile_max": "max-autotune-no-cudagraphs",
         "compile_ro": "reduce-overhead"}
WARMUP_RUNS = ("agspeed_first", "agspeed_second", "compile_cold", "compile_warm")
LOSS_RTOL = {"fp32": 1e-3, "bf16": 5e-3, "fp16": 5e-3}
LOSS_ATOL = 1e-5
LR = 1e-3
TARGET_STEADY = 1.05       # agspeed steady <= this x min(eager, torch.compile modes)
TARGET_FIRST = 1.5         # agspeed first-run warm-up <= this x torch.compile's (cold)
TARGET_SECOND = 0.3        # agspeed second-run warm-up <= this x torch.compile's (cold)


# --- one training step ------------------------------------------------------------------


def autocast(precision: str, device: str):
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if precision == "fp32":
        return torch.autocast(kind, enabled=False)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(kind, dtype=dtype)


class Trainer:
    """One runtime's model, optimizer and (fp16) GradScaler; ``step`` times one step."""

    def __init__(self, runtime: str, model, precision: str, device: str, backend: str):
        self.runtime, self.precision, self.device = runtime, precision, device
        self.prepared = 0   # steps taken before the timed rounds
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
        self.losses: list[float] = []
        self.times: list[float] = []
        start = time.perf_counter()
        if runtime == "eager":
            self.fn = model
        elif runtime == "agspeed":
            self.fn = agspeed.optimize(model, backend=backend)
        else:
            self.fn = torch.compile(model, mode=MODES[runtime])
        self.wrap_s = time.perf_counter() - start

    def step(self, batch: tuple) -> float:
        """One training step on ``batch``; its time in seconds (kept in ``times``)."""
        sync(self.device)
        start = time.perf_counter()
        if self.runtime == "compile_ro":
            torch.compiler.cudagraph_mark_step_begin()
        with autocast(self.precision, self.device):
            loss = self.fn(*batch)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(loss.item())   # also waits for the device
        elapsed = time.perf_counter() - start
        self.times.append(elapsed)
        return elapsed


def runtimes_for(args) -> list[str]:
    names = ["eager"]
    if not args.no_compile:
        names += ["compile", "compile_max"]
        if args.device.startswith("cuda"):
            names.append("compile_ro")
    names.append("agspeed")
    if args.runtimes:
        wanted = set(args.runtimes.split(",")) | {"eager", "agspeed"}
        names = [n for n in names if n in wanted]
    return names


# --- warm-up, in a process of its own ---------------------------------------------------


def warmup_worker(args) -> int:
    """``--warmup-worker MODEL PRECISION RUNTIME``: one cold start, as one JSON line."""
    name, precision, runtime = args.warmup_worker
    warm, steady = args.warm_steps, args.steady_steps
    model = _models.build(name, args.size).to(args.device)
    data = _models.batches(name, args.size, warm + steady, args.device)
    before = agspeed.counters()
    # the first step's clock starts before the model is wrapped: wrapping is warm-up too
    trainer = Trainer(runtime, model, precision, args.device, args.backend)
    for batch in data:
        trainer.step(batch)
    times = trainer.times
    times[0] += trainer.wrap_s
    median = statistics.median(times[warm:])
    after = agspeed.counters()
    print("WARMUP " + json.dumps({
        "model": name, "precision": precision, "runtime": runtime,
        "warmup_s": sum(max(t - median, 0.0) for t in times[:warm]),
        "first_step_s": times[0],
        "steady_ms": median * 1e3, "step_ms": [t * 1e3 for t in times],
        "agspeed_misses": after["cache_misses"] - before["cache_misses"]}), flush=True)
    return 0


def _files_in(path: str) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def run_worker(args, name: str, precision: str, runtime: str, cache: dict) -> dict:
    """Start a warm-up worker with the cache directories in ``cache`` and read its line."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env.update(cache)
    cmd = [sys.executable, os.path.abspath(__file__), "--warmup-worker", name, precision,
           runtime, "--device", args.device, "--threads", str(args.threads),
           "--backend", args.backend]
    if args.quick:
        cmd.append("--quick")
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=args.worker_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.worker_timeout} s"}
    wall = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("WARMUP ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    result = json.loads(lines[-1][len("WARMUP "):])
    result["process_s"] = wall
    return result


def measure_warmup(args, name: str, precision: str, root: str, runtimes: list[str]) -> tuple:
    """The warm-up runs of one model and precision; and the cache directories they left
    (agspeed's, and Inductor's of torch.compile's first run)."""
    ag_dir = os.path.join(root, f"{name}-{precision}-agspeed")
    tc_dir = os.path.join(root, f"{name}-{precision}-inductor")
    ag_cache = {"AGSPEED_CACHE_DIR": ag_dir,
                "TORCHINDUCTOR_CACHE_DIR": os.path.join(ag_dir, "inductor"),
                "TRITON_CACHE_DIR": os.path.join(ag_dir, "triton")}
    tc_cache = {"TORCHINDUCTOR_CACHE_DIR": tc_dir,
                "TRITON_CACHE_DIR": os.path.join(tc_dir, "triton"),
                "AGSPEED_CACHE_DIR": os.path.join(root, "unused-agspeed")}
    runs = {}
    runs["agspeed_first"] = run_worker(args, name, precision, "agspeed", ag_cache)
    runs["agspeed_first"]["cache_files"] = _files_in(ag_dir)
    runs["agspeed_second"] = run_worker(args, name, precision, "agspeed", ag_cache)
    if "compile" in runtimes:
        runs["compile_cold"] = run_worker(args, name, precision, "compile", tc_cache)
        if args.compile_second_run:
            runs["compile_warm"] = run_worker(args, name, precision, "compile", tc_cache)
    for run, r in runs.items():
        if "error" in r:
            print(f"  note: warm-up run {run} of {name} {precision} failed: {r['error']}")
    return runs, {"agspeed": ag_dir, "inductor": tc_dir if "compile" in runtimes else None}


# --- steady state, all runtimes in this process -----------------------------------------


def explain(base, batch: tuple, precision: str, device: str) -> dict:
    """agspeed's graphs and graph breaks for one forward of a copy of the model."""
    try:
        with autocast(precision, device):
            out = agspeed.explain(copy.deepcopy(base), *batch)
    except Exception as e:   # a report, not a measurement: never stop the run for it
        return {"error": f"{type(e).__name__}: {e}"}
    reasons: dict[str, int] = {}
    for r in out.break_reasons:
        key = f"{r.reason} ({r.detail})"
        reasons[key] = reasons.get(key, 0) + 1
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:5]
    return {"graphs": out.graph_count, "breaks": out.graph_break_count,
            "top_break_reasons": [f"{n}x {k}" for k, n in top]}


def losses_agree(got: list[float], want: list[float], precision: str) -> tuple[bool, float]:
    """Whether two loss sequences agree step by step, and their largest relative gap."""
    rtol = LOSS_RTOL[precision]
    gap = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, want)), default=0.0)
    ok = len(got) == len(want) and all(
        math.isclose(a, b, rel_tol=rtol, abs_tol=LOSS_ATOL) for a, b in zip(got, want))
    return ok, gap


def run_rounds(args, base, data: list, precision: str, runtimes: list[str]) -> tuple:
    """Prepare each runtime (WARM steps on its own, and for agspeed until the checks of its
    choices on the loop's steps end; the others then take those steps too), then time
    ``--rounds`` rounds in turns.
    Returns the trainers, each one's preparation time, and agspeed's cache misses in the
    timed rounds."""
    warm_data, round_data = data[:args.warm_steps], data[args.warm_steps:]
    checks_data = warm_data * 3   # the steps agspeed's checks may take, in order
    trainers, prepare_s = {}, {}
    for rt in runtimes:
        start = time.perf_counter()
        trainers[rt] = Trainer(rt, copy.deepcopy(base), precision, args.device, args.backend)
        for batch in warm_data:
            trainers[rt].step(batch)
        # agspeed's warm-up ends when its choices are checked on the loop's own steps
        for batch in checks_data:
            if not _confirm.hooked():
                break
            trainers[rt].step(batch)
        prepare_s[rt] = time.perf_counter() - start
    # every runtime takes the steps agspeed's checks took, on the same batches, so that
    # all have trained alike when the rounds begin and their losses stay comparable
    prepared = max(len(tr.times) for tr in trainers.values())
    for tr in trainers.values():
        for batch in checks_data[len(tr.times) - len(warm_data):prepared - len(warm_data)]:
            tr.step(batch)
        tr.prepared = prepared
    before = agspeed.counters()
    for r, batch in enumerate(round_data):
        shift = r % len(runtimes)   # each runtime in each place of the order in turn
        for rt in runtimes[shift:] + runtimes[:shift]:
            trainers[rt].step(batch)
    misses = agspeed.counters()["cache_misses"] - before["cache_misses"]
    return trainers, prepare_s, misses


def measure_steady(args, name: str, precision: str, runtimes: list[str],
                   caches: dict) -> dict:
    base = _models.build(name, args.size).to(args.device)
    data = _models.batches(name, args.size, args.warm_steps + args.rounds, args.device)
    graphs = explain(base, data[0], precision, args.device)
    torch._dynamo.reset()
    agspeed.reset()
    # agspeed reads its cache directory when it tunes: the warm-up runs' one, if any;
    # Inductor reads TORCHINDUCTOR_CACHE_DIR whenever it looks for a cached artifact
    scope = (agspeed.config.override(cache_dir=caches["agspeed"]) if caches.get("agspeed")
             else contextlib.nullcontext())
    inductor_before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if caches.get("inductor"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = caches["inductor"]
    try:
        with scope:
            trainers, prepare_s, misses = run_rounds(args, base, data, precision, runtimes)
    finally:
        if inductor_before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_before
    eager = trainers["eager"]
    from agspeed.backends import autotune

    # which backend the autotuner chose for each graph, and the speedup it measured
    decisions = [{"graph": d.graph, "choice": d.choice, "speedup": round(d.speedup, 3),
                  "source": d.source} for d in autotune.decisions()]
    out = {"graphs": graphs, "runtimes": {}, "agspeed_misses_in_rounds": misses,
           "agspeed_decisions": decisions}
    for rt, tr in trainers.items():
        timed = tr.times[tr.prepared:]
        agree, gap = losses_agree(tr.losses, eager.losses, precision)
        out["runtimes"][rt] = {"median_ms": statistics.median(timed) * 1e3,
                               "min_ms": min(timed) * 1e3, "prepare_s": prepare_s[rt],
                               "losses_match": agree, "loss_max_rel_gap": gap,
                               "step_ms": [t * 1e3 for t in timed], "losses": tr.losses}
    med = {rt: r["median_ms"] for rt, r in out["runtimes"].items()}
    eager_steps = out["runtimes"]["eager"]["step_ms"]
    for rt, r in out["runtimes"].items():
        r["vs_eager"] = med[rt] / med["eager"]
        # the same, paired by round: steps of one round are close in time, so this one
        # holds better where the machine's speed drifts
        r["vs_eager_paired"] = statistics.median(
            a / b for a, b in zip(r["step_ms"], eager_steps))
    best = min(v for rt, v in med.items() if rt != "agspeed")
    out["best_other"] = min((rt for rt in med if rt != "agspeed"), key=med.get)
    out["agspeed_vs_best"] = med["agspeed"] / best
    del trainers, eager
    gc.collect()
    torch._dynamo.reset()
    agspeed.reset()
    return out


# --- summary ----------------------------------------------------------------------------


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def targets(case: dict) -> dict:
    """Each target of one model and precision: True (met), False, or None (not measured)."""
    out = {"steady": case["steady"]["agspeed_vs_best"] <= TARGET_STEADY,
           "first_run": None, "second_run": None}
    w = case.get("warmup", {})
    cold = w.get("compile_cold", {}).get("warmup_s")
    if cold and cold > 0:
        first = w.get("agspeed_first", {}).get("warmup_s")
        second = w.get("agspeed_second", {}).get("warmup_s")
        if first is not None:
            out["first_run"] = first <= TARGET_FIRST * cold
        if second is not None:
            out["second_run"] = second <= TARGET_SECOND * cold
    return out


def _yes(value) -> str:
    return "-" if value is None else ("met" if value else "NOT MET")


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_steady(cases: dict, runtimes: list[str]) -> None:
    print("  steady step, median ms (ratio to eager)")
    head = "".join(f" {SHORT[rt]:>16s}" for rt in runtimes)
    print(f"  {'model':9s} {'prec':4s}{head} {'ag/best':>8s} {'loss':>6s} "
          f"{'graphs':>6s} {'breaks':>6s}")
    for case in cases.values():
        s = case["steady"]
        runs = s["runtimes"]
        cells = "".join(f" {runs[rt]['median_ms']:8.2f} ({runs[rt]['vs_eager']:4.2f})"
                        for rt in runtimes)
        g = s["graphs"]
        print(f"  {case['model']:9s} {case['precision']:4s}{cells} {s['agspeed_vs_best']:8.2f} "
              f"{'ok' if s['runtimes']['agspeed']['losses_match'] else 'DIFFER':>6s} "
              f"{_num(g.get('graphs'), 'd'):>6s} {_num(g.get('breaks'), 'd'):>6s}")


def print_warmup(cases: dict) -> None:
    print("  warm-up, s (beyond the steady steps)   ag first / compile cold, "
          "ag second / compile cold")
    print(f"  {'model':9s} {'prec':4s} {'ag first':>9s} {'ag second':>9s} {'c cold':>9s} "
          f"{'c warm':>9s} {'first/c':>8s} {'second/c':>8s}")
    for case in cases.values():
        w = case.get("warmup")
        if not w:
            continue
        s = {run: w.get(run, {}).get("warmup_s") for run in WARMUP_RUNS}
        cold = s["compile_cold"]
        first = s["agspeed_first"] / cold if cold and s["agspeed_first"] is not None else None
        second = (s["agspeed_second"] / cold if cold and s["agspeed_second"] is not None
                  else None)
        print(f"  {case['model']:9s} {case['precision']:4s} "
              + " ".join(f"{_num(s[run], '9.2f'):>9s}" for run in WARMUP_RUNS)
              + f" {_num(first, '8.2f'):>8s} {_num(second, '8.2f'):>8s}")


def plot(data: dict, runtimes: list[str], path: str) -> None:
    """Grouped bars: each runtime's steady step as a ratio to eager, per model and
    precision, with a line at 1 (eager)."""
    keys = list(data["cases"])
    w, h, left, top, bottom, legend_w = max(560, 90 * len(keys) + 300), 380, 60, 56, 60, 250
    svg = Svg(w, h)
    svg.text(w / 2, 22, f"Training step time relative to eager ({data['device']}); "
             "lower is faster", size=14, anchor="middle")
    svg.text(w / 2, 38, data["machine"] + f", torch {data['torch']}", size=10,
             anchor="middle", fill="#555")
    ratios = [data["cases"][k]["steady"]["runtimes"][rt]["vs_eager"]
              for k in keys for rt in runtimes]
    hi = _nice_max(max(ratios + [1.0]) * 1.05)
    plot_h, plot_w = h - top - bottom, w - left - legend_w

    def y_of(v: float) -> float:
        return top + plot_h * (1 - v / hi)

    y_grid(svg, left, plot_w, y_of, hi, "x")
    group = plot_w / len(keys)
    bar = group * 0.8 / len(runtimes)
    for i, key in enumerate(keys):
        x0 = left + group * i + group * 0.1
        for j, rt in enumerate(runtimes):
            y = y_of(data["cases"][key]["steady"]["runtimes"][rt]["vs_eager"])
            svg.add("rect", x=f"{x0 + bar * j:.1f}", y=f"{y:.1f}", width=f"{bar - 1:.1f}",
                    height=f"{top + plot_h - y:.1f}", fill=COLORS[rt])
        case = data["cases"][key]
        svg.text(left + group * (i + 0.5), top + plot_h + 16, case["model"], size=11,
                 anchor="middle")
        svg.text(left + group * (i + 0.5), top + plot_h + 30, case["precision"], size=10,
                 anchor="middle", fill="#555")
    svg.add("line", x1=left, x2=left + plot_w, y1=f"{y_of(1):.1f}", y2=f"{y_of(1):.1f}",
            stroke="#333", stroke_dasharray="4 3")
    for i, rt in enumerate(runtimes):
        y = top + 10 + 16 * i
        svg.add("rect", x=left + plot_w + 20, y=y - 9, width=10, height=10, fill=COLORS[rt])
        svg.text(left + plot_w + 35, y, LABELS[rt], size=11)
    g = data["geomean_speedup"]["all"]
    if g.get("agspeed") is not None:
        text = f"geomean speedup over eager: agspeed {g['agspeed']:.2f}x"
        if g.get("compile") is not None:
            text += f", torch.compile {g['compile']:.2f}x"
        svg.text(left, h - 12, text, size=11)
    svg.save(path)


# --- main ---------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None,
                        help=f"comma list among {', '.join(_models.SPECS)} (default: all; "
                        "--quick: mlp)")
    parser.add_argument("--precisions", default="fp32,bf16",
                        help="comma list among fp32, bf16 and (CUDA) fp16")
    parser.add_argument("--rounds", type=int, default=None,
                        help="timed rounds of the steady state (default 20; --quick 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--backend", default="auto", help="agspeed's backend")
    parser.add_argument("--quick", action="store_true",
                        help="tiny models, one model, few steps: a smoke run")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave the torch.compile runtimes out")
    parser.add_argument("--runtimes", default=None,
                        help="comma list of the torch.compile runtimes to include (compile, "
                        "compile_max, compile_ro; eager and agspeed always run)")
    parser.add_argument("--no-warmup", action="store_true",
                        help="leave the warm-up processes out")
    parser.add_argument("--compile-second-run", action="store_true",
                        help="also time torch.compile's warm-up with its caches warm")
    parser.add_argument("--worker-timeout", type=int, default=1800,
                        help="seconds one warm-up process may take")
    parser.add_argument("--plot", default=None, help="SVG of the steady ratios (default: "
                        "docs/train[_cuda].svg, or beside --out when --out is given)")
    parser.add_argument("--warmup-worker", nargs=3, metavar=("MODEL", "PRECISION", "RUNTIME"),
                        help=argparse.SUPPRESS)
    add_device_args(parser)
    args = parser.parse_args(argv)
    args.size = "quick" if args.quick else "full"
    args.warm_steps, args.steady_steps = (3, 3) if args.quick else (10, 10)
    if args.rounds is None:
        args.rounds = 3 if args.quick else 20
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    precisions = [p for p in args.precisions.split(",") if p]
    for p in precisions:
        if p not in LOSS_RTOL:
            parser.error(f"unknown precision {p!r}; precisions are fp32, bf16, fp16")
        if p == "fp16" and not args.device.startswith("cuda"):
            parser.error("fp16 (with a GradScaler) is for --device cuda")
    args.precision_list = precisions
    default_models = "mlp" if args.quick else ",".join(_models.SPECS)
    args.model_list = [m for m in (args.models or default_models).split(",") if m]
    unknown = sorted(set(args.model_list) - set(_models.SPECS))
    if unknown:
        parser.error(f"unknown models {unknown}; models are {', '.join(_models.SPECS)}")
    return parser, args


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.warmup_worker:
        return warmup_worker(args)
    out_path = default_out(args, "train")
    suffix = "" if args.device == "cpu" else "_" + args.device.split(":")[0]
    plot_path = args.plot or (os.path.splitext(out_path)[0] + ".svg" if args.out
                              else os.path.join(ROOT, "docs", f"train{suffix}.svg"))
    notes = []
    names = args.model_list
    if not _models.have_transformers():
        hf = [n for n in names if _models.SPECS[n].family == "transformers"]
        if hf:
            notes.append(f"transformers is not importable: skipped {', '.join(hf)}")
            print(f"  note: {notes[-1]}")
        names = [n for n in names if n not in hf]
    else:
        import transformers

        transformers.logging.set_verbosity_error()
    if not names:
        print("  nothing left to measure")
        return 0
    # no compile worker processes in this one: started in the background after the first
    # compile, they take the CPU for seconds, inside whatever is timed then
    import torch._inductor.config as inductor_config

    if not args.device.startswith("cuda"):  # on a GPU host the CPU is not what is timed
        inductor_config.compile_threads = 1
    # and max-autotune's tables of candidate kernels stay out of the report
    inductor_config.autotune_num_choices_displayed = 0
    inductor_config.max_autotune_report_choices_stats = False
    runtimes = runtimes_for(args)
    print(f"training step benchmark ({args.device}, {args.threads} threads, "
          f"{'quick' if args.quick else 'full'} sizes) on {machine(args.device)}, "
          f"torch {torch.__version__}; runtimes: {', '.join(runtimes)}; agspeed backend "
          f"{agspeed.config.backend or args.backend!r}", flush=True)
    load_before = _load()
    cases: dict[str, dict] = {}
    root = tempfile.mkdtemp(prefix="agspeed-train-")
    start = time.perf_counter()
    try:
        for name in names:
            for precision in args.precision_list:
                key = f"{name}/{precision}"
                case_start = time.perf_counter()
                case = {"model": name, "precision": precision,
                        "about": _models.SPECS[name].about}
                caches: dict = {}
                if not args.no_warmup:
                    case["warmup"], caches = measure_warmup(args, name, precision, root,
                                                            runtimes)
                case["steady"] = measure_steady(args, name, precision, runtimes, caches)
                case["targets"] = targets(case)
                cases[key] = case
                s = case["steady"]
                print(f"  {key}: " + ", ".join(
                    f"{SHORT[rt]} {s['runtimes'][rt]['median_ms']:.2f} ms"
                    for rt in runtimes) + f" ({time.perf_counter() - case_start:.0f} s)"
                    + "".join(f"; {d['choice']} {d['speedup']:.2f}x"
                              for d in s.get("agspeed_decisions", [])[:3]),
                    flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    total_s = time.perf_counter() - start
    load_after = _load()

    speedups: dict[str, dict] = {}
    for group in ["all"] + args.precision_list:
        chosen = [c for c in cases.values() if group in ("all", c["precision"])]
        speedups[group] = {rt: geomean([1 / c["steady"]["runtimes"][rt]["vs_eager"]
                                        for c in chosen])
                           for rt in runtimes if rt != "eager"}
    g = speedups["all"]
    geomean_target = g["agspeed"] >= g["compile"] if "compile" in g else None
    print_steady(cases, runtimes)
    if not args.no_warmup:
        print_warmup(cases)
    print("  geomean speedup over eager: " + "; ".join(
        f"{group}: " + ", ".join(f"{SHORT[rt]} {v:.2f}x" for rt, v in sp.items())
        for group, sp in speedups.items()))
    print(f"  targets: agspeed steady <= {TARGET_STEADY}x best, first-run warm-up <= "
          f"{TARGET_FIRST}x torch.compile's, second-run <= {TARGET_SECOND}x")
    for key, case in cases.items():
        t = case["targets"]
        print(f"  {key:15s} steady {_yes(t['steady']):8s} first run {_yes(t['first_run']):8s}"
              f" second run {_yes(t['second_run'])}")
    print(f"  geomean speedup agspeed >= torch.compile: {_yes(geomean_target)}")
    bad = [k for k, c in cases.items()
           if not c["steady"]["runtimes"]["agspeed"]["losses_match"]]
    missed = [k for k, c in cases.items() if c["steady"]["agspeed_misses_in_rounds"]]
    if missed:
        print(f"  note: agspeed compiled inside the timed rounds of {', '.join(missed)}")
    for n in notes:
        print(f"  note: {n}")
    print(f"  total {total_s:.0f} s; load average (1, 5, 15 min) at the start {load_before}, "
          f"at the end {load_after}, on {os.cpu_count()} cores")

    data = {"benchmark": "train", "machine": machine(args.device), "device": args.device,
            "device_name": (torch.cuda.get_device_name(args.device)
                            if args.device.startswith("cuda") else machine("cpu")),
            "torch": torch.__version__,
            "transformers": _transformers_version(),
            "agspeed_backend": agspeed.config.backend or args.backend,
            "threads": args.threads, "quick": args.quick, "rounds": args.rounds,
            "warm_steps": args.warm_steps, "steady_steps": args.steady_steps,
            "warmup_definition": f"time of the first {args.warm_steps} steps (wrapping "
            f"included) minus {args.warm_steps} x the median of the {args.steady_steps} "
            "steps after them, in a new process",
            "loss_rtol": LOSS_RTOL, "runtimes": runtimes,
            "targets": {"steady_vs_best": TARGET_STEADY, "first_run_vs_compile": TARGET_FIRST,
                        "second_run_vs_compile": TARGET_SECOND,
                        "geomean_agspeed_ge_compile": geomean_target},
            "geomean_speedup": speedups, "notes": notes, "total_s": total_s,
            "load_average": {"start": load_before, "end": load_after},
            "cases": cases}
    save(data, out_path)
    os.makedirs(os.path.dirname(os.path.abspath(plot_path)), exist_ok=True)
    plot(data, runtimes, plot_path)
    if bad:
        print(f"  agspeed's losses differ from eager's for: {', '.join(bad)}")
    # a warm-up process in which agspeed failed is a failure of agspeed, as wrong losses are
    crashed = [f"{k} {run}" for k, c in cases.items()
               for run, r in c.get("warmup", {}).items()
               if run.startswith("agspeed") and "error" in r]
    if crashed:
        print(f"  agspeed failed in the warm-up runs: {', '.join(crashed)}")
    return 1 if bad or crashed else 0


def _load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: other work on the machine skews timings."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _transformers_version() -> str | None:
    try:
        import transformers
    except Exception:
        return None
    return transformers.__version__


if __name__ == "__main__":
    raise SystemExit(main())
