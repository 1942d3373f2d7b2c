"""FSDP2 through agspeed: a model sharded with ``fully_shard`` per block, two gloo
processes launched by torchrun (fsdp_worker.py), trained eagerly and through agspeed.

FSDP's hooks gather each block's parameters before its forward and reduce its gradients
after its backward; they run eager, and each block's forward is captured between them.
The root's forward, which calls the blocks in a loop, is captured around those calls.
"""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from _ranks import HERE, needs_gloo, worker_env  # noqa: E402

pytestmark = needs_gloo
_WORKER = os.path.join(HERE, "fsdp_worker.py")


def torchrun(tmp_path, scenario):
    env = worker_env(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         _WORKER, json.dumps(scenario), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def close(a, b, tol):
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return float((a - b).abs().max()) <= tol


@pytest.mark.parametrize("order,backend", [("after", "jit"), ("before", "jit"),
                                           ("after", "inductor")])
def test_fully_shard_per_block_trains_as_eager_fsdp(tmp_path, order, backend):
    results = torchrun(tmp_path, {"order": order, "backend": backend, "steps": 6})
    for r in results:
        assert r["torchrun"] and r["world"] == 2
        assert close(r["losses"], r["eager_losses"], 1e-5), (r["losses"], r["eager_losses"])
        for got, want in zip(r["params"], r["eager_params"]):
            assert close(got, want, 1e-5)
        # the three blocks' forwards ran as compiled graphs on every step, and the
        # root's: before its loop over the blocks and after it (the head and the loss)
        assert r["counters"]["graph_calls"] >= (3 + 2) * 6, r["counters"]["graph_calls"]
    assert results[0]["params"] == results[1]["params"]  # the full model, on both ranks


def test_gradient_accumulation_without_sync(tmp_path):
    results = torchrun(tmp_path, {"order": "after", "backend": "jit", "steps": 6,
                                  "accumulate": 3})
    for r in results:
        assert close(r["losses"], r["eager_losses"], 1e-5)
        for got, want in zip(r["params"], r["eager_params"]):
            assert close(got, want, 1e-5)
