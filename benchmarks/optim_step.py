"""An optimizer's ``step()`` captured: eager next to agspeed and torch.compile.

The parameters of a zoo model, their gradients from one backward, and one optimizer per
runtime over its own copy of them (same state): eager's ``opt.step()``,
``agspeed.optimize(opt.step)`` (the autotuner picks the step graph's backend) and
``torch.compile(opt.step)`` (Inductor).  After warm-up steps (capture, tuning,
compiling), the three take turns for ``--rounds`` rounds of ``--steps`` steps each;
the table gives the median step, the ratio to eager's, and how far the parameters moved
apart from eager's (the captured steps compute their step-count corrections as tensors,
as torch.compile does).  agspeed runs first, in a process where torch.compile has not
yet patched torch's optimizers.

With ``--scheduler onecycle`` each optimizer is driven by a ``OneCycleLR`` stepped
after every step, which moves ``lr`` and the momentum (Adam's ``betas[0]``) on every
step: floats of the optimizer's state that a capture must not take as constants.  The
table then also gives agspeed's recompiles of the step.

    python benchmarks/optim_step.py [--model gpt] [--size full|quick] [--optimizers Adam,SGD]
                                    [--rounds 15] [--steps 10] [--threads 1]
                                    [--scheduler none|onecycle]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import agspeed  # noqa: E402
from _models import build  # noqa: E402
from _report import (add_device_args, add_turn_args, default_out, machine,  # noqa: E402
                     save, sync)

_OPTIONS = {"SGD": dict(lr=0.01, momentum=0.9), "Adam": dict(lr=1e-3),
            "AdamW": dict(lr=1e-3, weight_decay=0.01), "RMSprop": dict(lr=1e-3),
            "Adagrad": dict(lr=1e-2)}


def _setup(model, name, device):
    torch.manual_seed(0)   # the same gradients for every runtime
    twin = copy.deepcopy(model).to(device)
    for p in twin.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    return twin, getattr(torch.optim, name)(twin.parameters(), **_OPTIONS[name])


def _time(step, n, device):
    sync(device)
    start = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return (time.perf_counter() - start) / n


def _scheduler(opt, name, args):
    """The OneCycleLR of ``--scheduler onecycle`` (made before the step is taken: it
    wraps ``opt.step`` to count its calls), or None."""
    if args.scheduler == "none":
        return None
    total = args.warmup + args.rounds * args.steps + 1
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=_OPTIONS[name]["lr"] * 10,
                                               total_steps=total)


def _scheduled(step, sched):
    """``step`` followed by the scheduler's step, or ``step`` alone."""
    if sched is None:
        return step

    def stepped():
        step()
        sched.step()

    return stepped


def run_one(model, name, args):
    runs = {}
    for runtime in ("eager", "agspeed", "torch.compile"):
        twin, opt = _setup(model, name, args.device)
        sched = _scheduler(opt, name, args)
        start = time.perf_counter()
        if runtime == "agspeed":
            agspeed.reset()
            step = agspeed.optimize(opt.step)
        elif runtime == "torch.compile":
            step = torch.compile(opt.step, backend=args.compile_backend)
        else:
            step = opt.step
        step = _scheduled(step, sched)
        for _ in range(args.warmup):
            step()
        sync(args.device)
        runs[runtime] = dict(model=twin, step=step, warmup_s=time.perf_counter() - start,
                             times=[])
    for _ in range(args.rounds):
        for runtime, r in runs.items():
            r["times"].append(_time(r["step"], args.steps, args.device))
    eager = runs["eager"]["model"]
    recompiles = sum(r.count for r in agspeed.recompiles() if r.function.startswith("step"))
    out = {}
    for runtime, r in runs.items():
        drift = max((a - b).abs().max().item() for a, b in
                    zip(eager.parameters(), r["model"].parameters()))
        out[runtime] = dict(median_ms=statistics.median(r["times"]) * 1e3,
                            warmup_s=r["warmup_s"], max_param_diff=drift)
    base = out["eager"]["median_ms"]
    for r in out.values():
        r["ratio_to_eager"] = r["median_ms"] / base
    out["agspeed"]["step_recompiles"] = recompiles
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt")
    parser.add_argument("--size", default="full", choices=("full", "quick"))
    parser.add_argument("--optimizers", default="SGD,Adam,AdamW,RMSprop,Adagrad")
    parser.add_argument("--scheduler", default="none", choices=("none", "onecycle"))
    add_turn_args(parser, steps=10)
    add_device_args(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build(args.model, args.size)
    count = sum(p.numel() for p in model.parameters())
    results = {}
    print(f"{args.model} ({count / 1e6:.2f}M parameters in "
          f"{len(list(model.parameters()))} tensors), {args.device}")
    print(f"{'optimizer':9s} {'eager ms':>9s} {'agspeed':>9s} {'ratio':>6s} "
          f"{'compile':>9s} {'ratio':>6s} {'agspeed drift':>13s} {'compile drift':>13s} "
          f"{'recompiles':>10s}")
    for name in args.optimizers.split(","):
        r = results[name] = run_one(model, name, args)
        a, c, e = r["agspeed"], r["torch.compile"], r["eager"]
        print(f"{name:9s} {e['median_ms']:9.3f} {a['median_ms']:9.3f} "
              f"{a['ratio_to_eager']:6.2f} {c['median_ms']:9.3f} {c['ratio_to_eager']:6.2f} "
              f"{a['max_param_diff']:13.1e} {c['max_param_diff']:13.1e} "
              f"{a['step_recompiles']:10d}")
    save(dict(machine=machine(args.device), model=args.model, size=args.size,
              parameters=count, threads=args.threads, rounds=args.rounds,
              steps=args.steps, scheduler=args.scheduler, results=results),
         default_out(args, "optim_step" if args.scheduler == "none"
                     else f"optim_step_{args.scheduler}"))


if __name__ == "__main__":
    main()
