"""DDP through agspeed: two gloo processes on this machine (ddp_worker.py), each training
eagerly under DDP and through agspeed from the same weights on the same batches.

Every test checks that both ranks end with the same parameters (DDP kept them in step)
and that those equal eager DDP's; the cut tests check that the compiled graph's backward
is in pieces (so gradients reach DDP's buckets while the backward still runs), that the
cut is measured and chosen identically on both ranks, and that a second run takes it
from the knowledge base.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from _ranks import HERE, needs_gloo, worker_env  # noqa: E402

pytestmark = needs_gloo
_WORKER = os.path.join(HERE, "ddp_worker.py")


def run(tmp_path, scenario, caches=None, tune_steps=1, tag="run", wait=60, **env):
    """Both ranks of ``scenario``; their results.  ``caches``: each rank's cache dir."""
    work = tmp_path / tag
    work.mkdir()
    caches = caches or [str(tmp_path / "cache")] * 2
    extra = {k: str(v) for k, v in env.items()}
    procs = []
    for rank in range(2):
        env = worker_env(caches[rank], AGSPEED_DDP_TUNE_STEPS=str(tune_steps),
                         AGSPEED_DDP_WAIT=str(wait), **extra)
        out = open(work / f"log{rank}", "w")
        procs.append((subprocess.Popen(
            [sys.executable, _WORKER, str(rank), "2", str(work / "init"),
             json.dumps(scenario), str(work / f"out{rank}.json")],
            env=env, stdout=out, stderr=subprocess.STDOUT), out))
    for proc, out in procs:
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            for p, _ in procs:
                p.kill()
            raise
        finally:
            out.close()
    results = []
    for rank, (proc, _) in enumerate(procs):
        log = (work / f"log{rank}").read_text()
        assert proc.returncode == 0, f"rank {rank} failed:\n{log[-4000:]}"
        results.append(json.loads((work / f"out{rank}.json").read_text()))
        results[-1]["log"] = log
    return results


def check_equal(results, tol=1e-5):
    """Both ranks equal eager DDP's parameters and each other's."""
    for r in results:
        assert r["max_diff"] <= tol, r
    assert results[0]["digest"] == results[1]["digest"]
    for r in results:
        assert "Traceback" not in r["log"], r["log"]


@pytest.mark.parametrize("order", ["outer", "inner"])
def test_both_wrapping_orders_cut_measure_and_remember(tmp_path, order):
    scenario = {"order": order, "backend": "jit", "steps": 16}
    results = run(tmp_path, scenario)
    check_equal(results)
    first, second = results
    # the first steps try the cuts, most pieces (DDP's bucket rule) first
    assert first["pieces"][0] >= 3, first["pieces"]
    assert first["pieces"] == second["pieces"]
    assert len(first["splits"]) == 1
    graph, chosen, candidates, source = first["splits"][0]
    assert source == "tuned"
    assert first["splits"] == second["splits"]  # one choice, on both ranks
    assert len(candidates) >= 3 and str(chosen) in candidates
    assert {int(n) for n in candidates} >= {1, first["pieces"][0]}
    # after the choice every step runs the chosen cut
    tail = first["pieces"][-2:]
    assert tail == [chosen, chosen] or (chosen == 1 and set(tail) <= {0, 1}), first["pieces"]

    again = run(tmp_path, dict(scenario, steps=4), tag="again")
    check_equal(again)
    assert again[0]["splits"] == [[graph, chosen, {}, "knowledge base"]]
    assert again[0]["splits"] == again[1]["splits"]


def test_ranks_agree_when_their_knowledge_bases_differ(tmp_path):
    caches = [str(tmp_path / "cache0"), str(tmp_path / "cache1")]
    scenario = {"order": "outer", "backend": "jit", "steps": 16}
    run(tmp_path, scenario, caches=caches)
    # rank 0 forgets; rank 1 remembers: rank 0's answer (measure again) holds for both
    shutil.rmtree(caches[0])
    results = run(tmp_path, scenario, caches=caches, tag="again")
    check_equal(results)
    assert [r["splits"][0][3] for r in results] == ["tuned", "tuned"]
    assert results[0]["pieces"] == results[1]["pieces"]


@pytest.mark.cxx_exceptions  # the store's wait times out by raising through libtorch
def test_a_graph_only_one_rank_compiles_delays_it_without_hanging(tmp_path):
    # rank 1's last batch is smaller: it alone compiles a graph for it, waits for rank
    # 0's word on the cut, which never comes, and goes on
    results = run(tmp_path, {"order": "outer", "backend": "jit", "steps": 4,
                             "last_batch": {"1": 5}}, tune_steps=0, wait=3)
    check_equal(results)
    assert "rank 0 did not say how to cut this graph" in results[1]["log"]
    assert "did not say" not in results[0]["log"]


@pytest.mark.cxx_exceptions  # rank 1's first graph waits for word that never comes
def test_ranks_whose_turns_start_at_different_steps_agree_without_waiting(tmp_path):
    # rank 1's first batch is smaller: it compiles the main graph one step after rank 0,
    # so its turns run a step behind; each decides once both have posted, without
    # blocking (a blocking wait would stall the other rank's allreduce until ddp_wait)
    results = run(tmp_path, {"order": "outer", "backend": "jit", "steps": 18,
                             "first_batch": {"1": 5}}, wait=3)
    check_equal(results)
    tuned = [[c for c in r["splits"] if c[3] == "tuned"] for r in results]
    assert len(tuned[0]) == 1 and tuned[0] == tuned[1], tuned
    for r in results:
        assert "did not report their DDP step times" not in r["log"], r["log"]
    chosen = tuned[0][0][1]
    assert results[0]["pieces"][-1] == results[1]["pieces"][-1] == \
        (chosen if chosen > 1 else results[0]["pieces"][-1])


def test_no_sync_and_gradient_accumulation(tmp_path):
    # three micro-batches per step, the first two under no_sync
    results = run(tmp_path, {"order": "outer", "backend": "jit", "steps": 12,
                             "accumulate": 3}, tune_steps=0)
    check_equal(results)
    assert results[0]["splits"][0][3] == "bucket rule"
    assert min(results[0]["pieces"][3:]) >= 2


def test_find_unused_parameters(tmp_path):
    # a layer used on every other step only
    results = run(tmp_path, {"order": "inner", "backend": "jit", "steps": 8,
                             "unused": True}, tune_steps=0)
    check_equal(results)
    assert results[0]["graph_calls"] == 8


def test_static_graph(tmp_path):
    results = run(tmp_path, {"order": "outer", "backend": "jit", "steps": 8,
                             "static_graph": True})
    check_equal(results)


def test_inductor_pieces(tmp_path):
    results = run(tmp_path, {"order": "inner", "backend": "inductor", "steps": 4,
                             "depth": 2}, tune_steps=0)
    check_equal(results, tol=1e-5)
    assert results[0]["pieces"][0] >= 2


def test_a_graph_with_symbolic_sizes_is_cut_too(tmp_path):
    # batches of changing sizes: the second size makes the batch dimension symbolic,
    # and the pieces pass it to each other
    results = run(tmp_path, {"order": "outer", "backend": "inductor", "steps": 5,
                             "depth": 2, "sizes": [8, 6, 7, 5, 4]}, tune_steps=0,
                  AGSPEED_DYNAMIC_AFTER=2)
    check_equal(results)
    cuts = results[0]["splits"]
    assert [c[3] for c in cuts] == ["bucket rule", "bucket rule"]
    assert all(c[1] >= 2 for c in cuts)
    assert min(results[0]["pieces"][1:]) >= 2


def test_autotuner_tunes_each_piece(tmp_path):
    results = run(tmp_path, {"order": "outer", "backend": "auto", "candidates": ["jit"],
                             "steps": 4}, tune_steps=0)
    check_equal(results)
    assert results[0]["splits"][0][1] >= 2


def test_eager_backend_is_not_cut(tmp_path):
    # op by op, gradients become ready one by one already
    results = run(tmp_path, {"order": "outer", "backend": "eager", "steps": 4})
    check_equal(results, tol=0.0)
    assert results[0]["splits"] == []
    assert results[0]["pieces"] == [0, 0, 0, 0]


def test_a_cut_graph_keeps_neither_the_model_nor_ddp_alive(tmp_path):
    # one rank in this process: the cut entry holds no DDP (its turns are timed by the
    # optimizer step hook, which holds the graph weakly), and
    # the compiled pieces hold no parameter
    import gc
    import weakref

    import torch.distributed as dist

    import agspeed
    from _train import Net

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0,
                            world_size=1)
    try:
        with agspeed.config.override(cache_dir=str(tmp_path / "cache"), ddp_tune_steps=1):
            model = Net(depth=3)
            ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
            fast = agspeed.optimize(ddp, backend="jit")
            for _ in range(3):
                x, y = torch.randn(8, 16), torch.randint(0, 5, (8,))
                fast(x, y).backward()
            assert agspeed.counters()["graph_calls"] == 3
            refs = [weakref.ref(o) for o in (model, ddp, next(model.parameters()))]
            del model, ddp, fast, x, y
            gc.collect()
            assert [r() is None for r in refs] == [True] * 3
    finally:
        agspeed.reset()
        dist.destroy_process_group()


def test_a_graph_compiled_before_ddp_wraps_the_model_is_cut_under_it(tmp_path):
    # a warm-up step before wrapping compiles the graph uncut; DDP is not in the guard,
    # so the same entry serves the DDP steps: it cuts itself on its first call under DDP
    import torch.distributed as dist

    import agspeed
    from _train import Net
    from agspeed._ddp import splits
    from ddp_worker import pieces_in_backward

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0,
                            world_size=1)
    try:
        with agspeed.config.override(cache_dir=str(tmp_path / "cache"), ddp_tune_steps=0):
            torch.manual_seed(0)
            model, reference = Net(depth=3), Net(depth=3)
            reference.load_state_dict(model.state_dict())
            fast = agspeed.optimize(model, backend="jit")
            data = [(torch.randn(8, 16), torch.randint(0, 5, (8,))) for _ in range(4)]
            pieces = []
            for net, wrapped in ((reference, False), (fast, True)):
                opt = torch.optim.SGD(net.parameters(), lr=0.05)
                loss = net(*data[0])  # the warm-up step, outside DDP
                if wrapped:
                    pieces.append(pieces_in_backward(loss))
                loss.backward()
                opt.step()
                opt.zero_grad()
                ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.01)
                for x, y in data[1:]:
                    loss = ddp(x, y)
                    if wrapped:
                        pieces.append(pieces_in_backward(loss))
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
            assert agspeed.counters()["graph_calls"] == 4
            assert pieces[0] <= 1 and min(pieces[1:]) >= 2, pieces
            assert [s.source for s in splits()] == ["bucket rule"]
            for a, b in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(a, b)
            # the entry remembers the DDP module it cut for weakly
            import gc
            import weakref

            ref = weakref.ref(ddp)
            del ddp, loss
            gc.collect()
            assert ref() is None
    finally:
        agspeed.reset()
        dist.destroy_process_group()
