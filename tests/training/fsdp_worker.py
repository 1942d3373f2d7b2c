"""One rank of a two-process FSDP2 run, started by test_fsdp.py through torchrun.

    torchrun --standalone --nproc_per_node 2 fsdp_worker.py SCENARIO_JSON OUT_DIR

Trains a model sharded with ``fully_shard`` per block (and at the root) eagerly and
through agspeed (optimized before or after sharding, as the scenario says) from the same
weights on the same per-rank batches, and writes the losses, the full parameters at the
end and agspeed's counters to ``OUT_DIR/rank<R>.json``.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import agspeed  # noqa: E402
from _train import Net  # noqa: E402


def shard(model):
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def build(s, optimized):
    torch.manual_seed(0)
    model = Net(depth=3)
    if not optimized:
        return shard(model)
    if s["order"] == "before":  # optimize, then shard the optimized module
        return shard(agspeed.optimize(model, backend=s["backend"]))
    return agspeed.optimize(shard(model), backend=s["backend"])


def train(model, data, accumulate):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(0, len(data), accumulate):
        for k, (x, y) in enumerate(data[step:step + accumulate]):
            if hasattr(model, "set_requires_gradient_sync"):
                model.set_requires_gradient_sync(k == accumulate - 1)
            loss = model(x, y) / accumulate
            loss.backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses


def full_parameters(model):
    return [p.full_tensor().tolist() if hasattr(p, "full_tensor") else p.tolist()
            for p in model.parameters()]


def main():
    s, out = json.loads(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun's environment
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(100 + rank)
    data = [(torch.randn(8, 16, generator=g), torch.randint(0, 5, (8,), generator=g))
            for _ in range(s.get("steps", 6))]
    accumulate = s.get("accumulate", 1)
    eager = build(s, False)
    torch.manual_seed(1)
    want = train(eager, data, accumulate)
    model = build(s, True)
    torch.manual_seed(1)
    got = train(model, data, accumulate)
    result = {"rank": rank, "world": dist.get_world_size(),
              "torchrun": "TORCHELASTIC_RUN_ID" in os.environ,
              "eager_losses": want, "losses": got,
              "eager_params": full_parameters(eager), "params": full_parameters(model),
              "counters": agspeed.counters()}
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
