"""Value checks in captured code: a model whose forward validates its tensors.

A VAE built on ``torch.distributions`` with argument validation on (``validate_args=True``
on each distribution, as torch's default has it): every ``Normal`` and ``Bernoulli`` made
checks its parameters' values (``if not valid.all(): raise ValueError(...)``), and
``log_prob`` checks its sample.  One training step (forward, backward, SGD) per runtime,
each on its own copy of the weights: eager; agspeed as it is (the checks assumed to pass
and tested after the graph: one graph); agspeed with ``assume_branches=False`` (a graph
break at each check, as before); torch.compile (Inductor; Dynamo breaks at the checks
too).  After warm-up steps the runtimes take turns for ``--rounds`` rounds of ``--steps``
steps; the table gives the median step, its ratio to eager's, the graphs and breaks
``agspeed.explain`` counts, and how far the weights moved from eager's.

    python benchmarks/checks.py [--batch 64] [--hidden 256] [--rounds 15] [--steps 5]
                                [--threads 1] [--compile-backend inductor]
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
from _report import (add_device_args, add_turn_args, default_out, machine,  # noqa: E402
                     save, sync)

D = torch.distributions


class VAE(torch.nn.Module):
    def __init__(self, features: int, hidden: int, latent: int) -> None:
        super().__init__()
        nn = torch.nn
        self.enc = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 2 * latent))
        self.dec = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(),
                                 nn.Linear(hidden, features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu, log_std = self.enc(x).chunk(2, -1)
        q = D.Normal(mu, log_std.exp(), validate_args=True)
        z = q.rsample()
        recon = D.Bernoulli(logits=self.dec(z), validate_args=True).log_prob(x).sum(-1)
        prior = D.Normal(torch.zeros_like(mu), torch.ones_like(mu), validate_args=True)
        return (D.kl_divergence(q, prior).sum(-1) - recon).mean()


def _step(model, opt):
    def step(x):
        loss = model(x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--latent", type=int, default=16)
    add_turn_args(parser, steps=5)
    add_device_args(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = VAE(args.features, args.hidden, args.latent).to(args.device)
    batches = [(torch.rand(args.batch, args.features, device=args.device) > 0.5).float()
               for _ in range(8)]
    runs = {}
    for runtime in ("eager", "agspeed", "agspeed, checks break", "torch.compile"):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        explained = None
        if runtime.startswith("agspeed"):
            with agspeed.config.override(assume_branches=runtime == "agspeed"):
                explained = agspeed.explain(copy.deepcopy(base), batches[0])
            forward = agspeed.optimize(model)
        elif runtime == "torch.compile":
            forward = torch.compile(model, backend=args.compile_backend)
        else:
            forward = model
        step = _step(forward, opt)
        start = time.perf_counter()
        with agspeed.config.override(assume_branches=runtime == "agspeed"):
            for i in range(args.warmup):
                torch.manual_seed(i)
                step(batches[i % len(batches)])
        sync(args.device)
        runs[runtime] = dict(model=model, step=step, times=[], explained=explained,
                             warmup_s=time.perf_counter() - start)
    for r in range(args.rounds):
        for runtime, run in runs.items():
            sync(args.device)
            start = time.perf_counter()
            for i in range(args.steps):
                torch.manual_seed(1000 * r + i)   # the same draws for every runtime
                run["step"](batches[(r + i) % len(batches)])
            sync(args.device)
            run["times"].append((time.perf_counter() - start) / args.steps)
    eager = runs["eager"]["model"]
    results = {}
    for runtime, run in runs.items():
        drift = max((a - b).abs().max().item()
                    for a, b in zip(eager.parameters(), run["model"].parameters()))
        e = run["explained"]
        results[runtime] = dict(median_ms=statistics.median(run["times"]) * 1e3,
                                warmup_s=run["warmup_s"], max_param_diff=drift,
                                graphs=e.graph_count if e else None,
                                breaks=e.graph_break_count if e else None)
    ref = results["eager"]["median_ms"]
    print(f"VAE {args.features}-{args.hidden}-{args.latent}, batch {args.batch}, "
          f"{args.device}, {args.threads} thread(s)")
    print(f"{'runtime':22s} {'step ms':>8s} {'/ eager':>8s} {'graphs':>7s} {'breaks':>7s} "
          f"{'weights vs eager':>17s}")
    for runtime, r in results.items():
        r["ratio_to_eager"] = r["median_ms"] / ref
        graphs = "-" if r["graphs"] is None else str(r["graphs"])
        breaks = "-" if r["breaks"] is None else str(r["breaks"])
        print(f"{runtime:22s} {r['median_ms']:8.3f} {r['ratio_to_eager']:8.2f} "
              f"{graphs:>7s} {breaks:>7s} {r['max_param_diff']:17.1e}")
    save(dict(machine=machine(args.device), batch=args.batch, features=args.features,
              hidden=args.hidden, latent=args.latent, threads=args.threads,
              rounds=args.rounds, steps=args.steps, results=results),
         default_out(args, "checks"))


if __name__ == "__main__":
    main()
