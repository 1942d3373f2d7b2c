"""Two-process DDP training: eager DDP, torch.compile of the DDP module, and agspeed.

Started with torchrun by this script itself (``--nproc N``, gloo on the CPU, nccl on
CUDA), each process one rank with ``--threads`` threads.  For each model and precision,
every runtime wraps its own copy of the same weights in DDP with the same bucket cap:

  eager     DDP(model);
  compile   torch.compile(DDP(model)): Dynamo cuts the graph at DDP's buckets (its
            DDPOptimizer) and Inductor compiles each piece;
  agspeed   agspeed.optimize(DDP(model)): the autotuner compiles, the DDP cut is measured
            on the first steps (``agspeed._ddp``).

Each runtime first takes --warm steps on its own (compiling, tuning, and for agspeed the
measurement of its cuts: after it, ``agspeed._ddp.splits()`` says which cut each graph
got).  Then the runtimes take turns for --rounds rounds, each turn three timed calls:

  step      forward, backward (the allreduce with it), AdamW step, zero_grad;
  synced    forward and backward only, gradients reduced, then dropped;
  local     the same under ``no_sync()``: no communication at all.

The exposed allreduce time is the median synced call minus the median local call: what
communication adds to the backward once overlap has hidden what it can.  Reported are rank
0's medians (the ranks run in lockstep: each backward waits for the slowest), and every
step's loss is compared with eager's at the same step.

Targets: agspeed's step at most torch.compile's, and its exposed allreduce at most eager
DDP's.

    python benchmarks/ddp.py [--models mlp,gpt,...] [--precisions fp32,bf16] [--nproc 2]
        [--bucket-cap-mb 1] [--rounds N] [--warm N] [--quick] [--device cpu|cuda]

Results go to benchmarks/results/ddp[_cuda].json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from train import autocast  # noqa: E402  (the single-process benchmark's precisions)

RUNTIMES = ("eager", "compile", "agspeed")
LOSS_RTOL = {"fp32": 1e-3, "bf16": 1e-2, "fp16": 1e-2}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mlp,resnet,encoder,gpt")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--bucket-cap-mb", type=float, default=1.0,
                   help="DDP's bucket cap for every runtime (torch.compile needs at least 1)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 15)")
    p.add_argument("--warm", type=int, default=None,
                   help="untimed steps per runtime first (default 40)")
    p.add_argument("--backend", default="auto", help="agspeed's backend")
    p.add_argument("--quick", action="store_true", help="tiny models, few steps")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.size = "quick" if args.quick else "full"
    args.rounds = args.rounds or (3 if args.quick else 15)
    args.warm = args.warm if args.warm is not None else (24 if args.quick else 40)
    return args


# --- in each rank ---------------------------------------------------------------------


class Runner:
    """One runtime's DDP model and optimizer on this rank."""

    def __init__(self, runtime, model, args, device):
        import agspeed
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids, bucket_cap_mb=args.bucket_cap_mb)
        self.ddp = ddp
        if runtime == "eager":
            self.fn = ddp
        elif runtime == "compile":
            self.fn = torch.compile(ddp)
        else:
            self.fn = agspeed.optimize(ddp, backend=args.backend)
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.scaler = None
        self.device, self.precision = device, args.precision
        self.losses, self.times = [], {"step": [], "synced": [], "local": []}

    def _clock(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _forward_backward(self, batch):
        with autocast(self.precision, str(self.device)):
            loss = self.fn(*batch)
        loss.backward()
        return loss

    def step(self, batch, timed=True):
        start = self._clock()
        loss = self._forward_backward(batch)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.losses.append(loss.item())
        if timed:
            self.times["step"].append(self._clock() - start)

    def synced(self, batch):
        start = self._clock()
        self._forward_backward(batch)
        self.times["synced"].append(self._clock() - start)
        self.opt.zero_grad(set_to_none=True)

    def local(self, batch):
        start = self._clock()
        with self.ddp.no_sync():
            self._forward_backward(batch)
        self.times["local"].append(self._clock() - start)
        self.opt.zero_grad(set_to_none=True)


def measure(name, precision, args, device, rank):
    import _models
    import agspeed
    from agspeed import _ddp
    from agspeed.backends import autotune

    args.precision = precision
    data = _models.batches(name, args.size, 8, str(device), seed=10 + rank)
    runners = {}
    prepare = {}
    for runtime in RUNTIMES:
        agspeed.reset()
        model = _models.build(name, args.size).to(device)
        start = time.perf_counter()
        r = runners[runtime] = Runner(runtime, model, args, device)
        for k in range(args.warm):
            r.step(data[k % len(data)], timed=False)
        prepare[runtime] = time.perf_counter() - start
        if runtime == "agspeed":
            splits = [s._asdict() for s in _ddp.splits()]
            decisions = [d._asdict() for d in autotune.decisions()]
        r.losses.clear()
    captures = agspeed.counters().get("captures", None)
    for k in range(args.rounds):
        order = RUNTIMES[k % 3:] + RUNTIMES[:k % 3]
        batch = data[k % len(data)]
        for runtime in order:
            r = runners[runtime]
            r.step(batch)
            r.synced(batch)
            r.local(batch)
    recaptured = agspeed.counters().get("captures", None) != captures
    out = {}
    for runtime, r in runners.items():
        med = {k: statistics.median(v) for k, v in r.times.items()}
        out[runtime] = {"step_s": med["step"], "synced_s": med["synced"],
                        "local_s": med["local"],
                        "exposed_s": max(med["synced"] - med["local"], 0.0),
                        "prepare_s": prepare[runtime], "losses": r.losses}
    eager = out["eager"]["losses"]

    def drift(runtime: str) -> float:   # the worst step's relative distance from eager's
        return max(abs(a - b) / max(abs(b), 1e-6)
                   for a, b in zip(out[runtime]["losses"], eager))

    worst = drift("agspeed")
    return {"runtimes": out, "splits": splits, "decisions": decisions,
            "loss_rel_diff": worst, "losses_agree": worst <= LOSS_RTOL[precision],
            "compile_loss_rel_diff": drift("compile"), "captured_while_timed": recaptured}


def worker(args) -> int:
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    rank = int(os.environ["RANK"])
    if args.device.startswith("cuda"):
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1
    results = {}
    for name in args.models.split(","):
        for precision in args.precisions.split(","):
            results[f"{name}/{precision}"] = measure(name, precision, args, device, rank)
            if rank == 0:
                show(f"{name}/{precision}", results[f"{name}/{precision}"])
    if rank == 0:
        with open(os.environ["AGSPEED_DDP_BENCH_OUT"], "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()
    return 0


def show(case, res):
    rt = res["runtimes"]
    line = "  ".join(f"{k} {v['step_s'] * 1e3:7.2f} ms (exposed {v['exposed_s'] * 1e3:5.2f})"
                     for k, v in rt.items())
    cuts = ", ".join(f"{s['pieces']} pieces ({s['source']})" for s in res["splits"]) or "none"
    print(f"{case:16s} {line}  cut: {cuts}  losses {'ok' if res['losses_agree'] else 'DIFFER'}"
          f" (agspeed {res['loss_rel_diff']:.1e}, torch.compile "
          f"{res['compile_loss_rel_diff']:.1e} from eager's)",
          flush=True)


# --- the launcher ---------------------------------------------------------------------


def targets(res) -> dict:
    rt = res["runtimes"]
    return {"step_vs_compile": rt["agspeed"]["step_s"] / rt["compile"]["step_s"],
            "step_vs_eager": rt["agspeed"]["step_s"] / rt["eager"]["step_s"],
            "exposed_vs_eager": (rt["agspeed"]["exposed_s"] / rt["eager"]["exposed_s"]
                                 if rt["eager"]["exposed_s"] > 0 else None)}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    from _report import default_out, machine, save

    import tempfile

    tmp = tempfile.mkdtemp(prefix="agspeed-ddp-")
    env = dict(os.environ, AGSPEED_DDP_BENCH_OUT=os.path.join(tmp, "out.json"),
               OMP_NUM_THREADS=str(args.threads), AGSPEED_PROGRESS="0")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={args.nproc}", os.path.abspath(__file__), "--worker",
           *[a for a in (argv if argv is not None else sys.argv[1:])]]
    print(f"ddp: {args.nproc} processes x {args.threads} threads, {args.device}, "
          f"bucket cap {args.bucket_cap_mb} MB")
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        print(f"ddp: the ranks failed (exit {rc})")
        return rc
    with open(env["AGSPEED_DDP_BENCH_OUT"]) as f:
        results = json.load(f)
    ok = True
    for case, res in results.items():
        res["targets"] = targets(res)
        for rt in res["runtimes"].values():
            rt.pop("losses")
        ok &= res["losses_agree"]
    print("\ncase             agspeed/compile step  agspeed/eager step  "
          "exposed allreduce agspeed/eager (ms)")
    for case, res in results.items():
        t, rt = res["targets"], res["runtimes"]
        print(f"{case:16s} {t['step_vs_compile']:20.2f}x {t['step_vs_eager']:18.2f}x  "
              f"{rt['agspeed']['exposed_s'] * 1e3:7.2f} / {rt['eager']['exposed_s'] * 1e3:.2f}")
    data = {"machine": machine(args.device), "torch": torch.__version__,
            "nproc": args.nproc, "threads": args.threads, "bucket_cap_mb": args.bucket_cap_mb,
            "rounds": args.rounds, "warm": args.warm, "size": args.size, "cases": results}
    save(data, default_out(args, "ddp"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
