"""One rank of a two-process DDP run (gloo), started by test_ddp.py.

    python ddp_worker.py RANK WORLD INIT_FILE SCENARIO_JSON OUT_JSON

Trains the scenario's model with eager DDP and with agspeed (in the scenario's wrapping
order) from the same weights on the same per-rank batches, and writes what the test
checks: the largest parameter difference from eager DDP, a digest of the parameters (the
ranks must agree), the DDP cuts agspeed made and the compiled pieces in the backward.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import agspeed  # noqa: E402
from _train import Net, max_diff  # noqa: E402


class WithUnused(Net):
    """A Net whose ``spare`` layer takes part only on some steps."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.spare = nn.Linear(16, 5)

    def forward(self, x, y=None, use_spare=False):
        out = super().forward(x, y)
        if use_spare:
            out = out + self.spare(x).mean()
        return out


def batches(rank, n, batch=8, last=None, sizes=None, first=None):
    """``n`` batches for ``rank``; the first one of ``first`` rows and the last one of
    ``last`` rows when given, or of the ``sizes`` given in turn."""
    g = torch.Generator().manual_seed(100 + rank)
    sizes = [sizes[k % len(sizes)] for k in range(n)] if sizes else \
        [first or batch] + [batch] * (n - 2) + [last or batch]
    return [(torch.randn(b, 16, generator=g), torch.randint(0, 5, (b,), generator=g))
            for b in sizes]


def wrap(model, s, optimized):
    kwargs = {"bucket_cap_mb": s.get("bucket_cap_mb", 0.01),
              "find_unused_parameters": s.get("unused", False),
              "static_graph": s.get("static_graph", False)}
    if not optimized:
        return nn.parallel.DistributedDataParallel(model, **kwargs)
    opt = {"backend": s["backend"]}
    if s.get("candidates"):
        opt["candidates"] = s["candidates"]
    if s["order"] == "outer":
        return agspeed.optimize(nn.parallel.DistributedDataParallel(model, **kwargs), **opt)
    return nn.parallel.DistributedDataParallel(agspeed.optimize(model, **opt), **kwargs)


def pieces_in_backward(loss):
    """The compiled graphs' nodes in ``loss``'s autograd graph."""
    seen, todo, found = set(), [loss.grad_fn], 0
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        name = type(fn).__name__
        if name in ("CompiledFunctionBackward", "CppFunction"):
            found += 1
        todo.extend(f for f, _ in fn.next_functions)
    return found


def train(model, data, s):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    accumulate = s.get("accumulate", 1)
    pieces = []
    for step in range(0, len(data), accumulate):
        opt.zero_grad(set_to_none=True)
        micro = data[step:step + accumulate]
        for k, (x, y) in enumerate(micro):
            kwargs = {"use_spare": step % 2 == 0} if s.get("unused") else {}
            last = k == len(micro) - 1
            if last:
                loss = model(x, y, **kwargs) / len(micro)
            else:
                with model.no_sync():
                    loss = model(x, y, **kwargs) / len(micro)
            pieces.append(pieces_in_backward(loss))
            if last:
                loss.backward()
            else:
                with model.no_sync():
                    loss.backward()
        opt.step()
    return pieces


def main():
    rank, world = int(sys.argv[1]), int(sys.argv[2])
    init, scenario, out = sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank,
                            world_size=world)
    s = scenario
    make = WithUnused if s.get("unused") else Net
    torch.manual_seed(0)
    eager_model = make(depth=s.get("depth", 3))
    torch.manual_seed(0)
    model = make(depth=s.get("depth", 3))
    data = batches(rank, s.get("steps", 8), last=s.get("last_batch", {}).get(str(rank)),
                   sizes=s.get("sizes"), first=s.get("first_batch", {}).get(str(rank)))

    torch.manual_seed(1)
    train(wrap(eager_model, s, False), data, s)
    torch.manual_seed(1)
    pieces = train(wrap(model, s, True), data, s)

    digest = float(sum(p.detach().double().sum() * (k + 1)
                       for k, p in enumerate(model.parameters())))
    from agspeed._ddp import splits

    result = {
        "max_diff": max_diff(list(eager_model.parameters()), list(model.parameters())),
        "digest": digest,
        "splits": [[s.graph, s.pieces, {str(k): v for k, v in s.candidates.items()},
                    s.source] for s in splits()],
        "pieces": pieces,
        "graph_calls": agspeed.counters()["graph_calls"],
    }
    dist.barrier()
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
