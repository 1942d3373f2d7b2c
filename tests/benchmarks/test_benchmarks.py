"""The benchmark scripts keep working: a quick run of the capture benchmark on one model
writes its figures and confirms that model was captured as one graph."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_capture_benchmark_quick_run(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "capture.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "capture.py"), "--quick",
         "--models", "mlp", "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["benchmark"] == "capture" and data["quick"] is True
    assert data["captured"] == {"mlp": {"graphs": 1, "breaks": 0, "one_graph": True}}
    for section in ("capture_latency", "hit_overhead", "train_step"):
        assert set(data[section]) == {"mlp"}
    latency = data["capture_latency"]["mlp"]
    assert latency["agspeed_ms"] > 0 and latency["dynamo_ms"] > 0
    assert "cold capture" in proc.stdout and "cache hit" in proc.stdout
    assert data["hit_overhead"]["mlp"]["time_ratio"] > 0
    # the measured calls themselves: cold calls were captures, hit rounds were hits only
    assert data["verified"] == {"mlp": {"explain_one_graph": True, "cold_calls_captured": True,
                                        "hit_overhead_hits_only": True,
                                        "train_step_hits_only": True}}
    hits = data["hit_overhead"]["mlp"]
    assert hits["agspeed_misses"] == 0 and hits["agspeed_hits"] == hits["calls"] > 0
    assert "measured calls as claimed" in proc.stdout


def test_capture_benchmark_reports_a_fallback_to_eager(tmp_path):
    """With the runtime switched off nothing is captured: the report says so and the run
    fails, so eager timings cannot pass for agspeed's."""
    pytest.importorskip("torch")
    out = tmp_path / "capture.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "capture.py"), "--quick",
         "--models", "mlp", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "AGSPEED_DISABLE": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verified = json.loads(out.read_text())["verified"]["mlp"]
    assert not any(verified.values())
    assert "NO: explain_one_graph" in proc.stdout


def test_capture_benchmark_refuses_unknown_models():
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "capture.py"), "--quick",
         "--models", "nothing"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown models" in proc.stderr


def test_dispatch_benchmark_quick_run(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "dispatch.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "dispatch.py"), "--quick",
         "--sizes", "1,4", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"1", "4"}
    assert all(r["agspeed_us"] > 0 and r["dynamo_us"] > 0 for r in rows.values())
    for r in rows.values():   # the overheads are the same run's differences
        assert r["agspeed_overhead_us"] == pytest.approx(r["agspeed_us"] - r["eager_us"])
        assert r["dynamo_overhead_us"] is not None


def test_hit_scaling_benchmark_quick_run(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "hit_scaling.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "hit_scaling.py"), "--quick",
         "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert set(data["cases"]) == {"inputs_1", "inputs_4", "inputs_16", "layers_1",
                                  "layers_100"}
    assert all(r["agspeed_guard_us"] > 0 for r in data["cases"].values())
    assert data["summary"]["guard_100_vs_1_layers"] > 0
    for r in data["cases"].values():   # both runtimes measured again with a no-op graph
        assert r["agspeed_runtime_us"] > 0 and r["dynamo_runtime_us"] > 0
        assert r["runtime_vs_dynamo"] == pytest.approx(
            r["agspeed_runtime_us"] / r["dynamo_runtime_us"])
    assert data["summary"]["runtime_100_vs_1_layers"] > 0


def test_dynamic_benchmark_quick_run(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "dynamic.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "dynamic.py"), "--quick",
         "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = json.loads(out.read_text())["runtimes"]
    assert set(runs) == {"eager", "agspeed", "agspeed static", "dynamo", "dynamo static"}
    assert all(r["losses_match"] for r in runs.values())
    # the model is captured, and the varying length does not compile per length
    assert 1 <= runs["agspeed"]["graphs"] < runs["agspeed static"]["graphs"]


def test_decode_benchmark_quick_run(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "decode.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "decode.py"), "--quick",
         "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = json.loads(out.read_text())["runtimes"]
    assert set(runs) == {"eager", "agspeed", "agspeed static", "dynamo", "dynamo static"}
    assert all(r["tokens_match"] for r in runs.values())
    # the prompt, the first step, then one graph for every later position
    assert runs["agspeed"]["graphs"] == 3 < runs["agspeed static"]["graphs"]


def test_plot_writes_svg_from_the_results(tmp_path):
    import xml.dom.minidom

    subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "plot.py"), "--out-dir",
         str(tmp_path), "--suffix", "_t"], check=True, capture_output=True, text=True)
    lines = xml.dom.minidom.parse(str(tmp_path / "dispatch_t.svg"))
    assert lines.documentElement.tagName == "svg"
    assert lines.getElementsByTagName("polyline").length >= 2   # agspeed, eager, dynamo
    bars = xml.dom.minidom.parse(str(tmp_path / "hit_scaling_t.svg"))
    labels = [t.firstChild.data for t in bars.getElementsByTagName("text") if t.firstChild]
    assert "layers 100" in labels and "agspeed guard alone" in labels
    assert "agspeed runtime (no-op graph)" in labels
    assert bars.getElementsByTagName("rect").length > 5 * 4


def test_nvrtc_benchmark_needs_a_gpu():
    pytest.importorskip("torch")
    script = os.path.join(ROOT, "benchmarks", "nvrtc.py")
    proc = subprocess.run([sys.executable, script, "--quick"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "--device cuda" in proc.stderr


def test_nvrtc_benchmarks_compile_part_runs_without_a_gpu(tmp_path):
    """Its one part that needs no GPU: every kernel of the zoo's graphs compiled to a
    cubin from an empty cache, the seconds each graph's kernels took to make."""
    pytest.importorskip("torch")
    script = os.path.join(ROOT, "benchmarks", "nvrtc.py")
    out = tmp_path / "compile.json"
    proc = subprocess.run([sys.executable, script, "--parts", "compile", "--quick",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["arch"] == "sm_90"
    rows = {r["model"]: r for r in data["compile"]}
    assert set(rows) == {"mlp", "resnet", "encoder", "gpt"}
    for r in rows.values():
        # a forward and a backward graph, each with kernels compiled (none from a cache)
        assert r["kernels"] > 0 and len(r["graph_kernels_s"]) == 2, r
        assert 0 < r["sources"] <= r["kernels"], r
        assert r["nvrtc_compile_s_summed"] > 0
    # the CNN's blocks repeat their groups: one source serves several of them
    assert rows["resnet"]["sources"] < rows["resnet"]["kernels"]


@pytest.mark.parametrize("scheduler", ["none", "onecycle"])
def test_optim_step_benchmark_quick_run(tmp_path, scheduler):
    out = tmp_path / "optim.json"
    env = dict(os.environ, AGSPEED_AUTOTUNE_CANDIDATES="eager",
               AGSPEED_CACHE_DIR=str(tmp_path / "kb"))
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "optim_step.py"), "--model", "mlp", "--size", "quick",
         "--optimizers", "SGD,Adam", "--warmup", "2", "--steps", "1", "--rounds", "6",
         "--compile-backend", "eager", "--scheduler", scheduler, "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["scheduler"] == scheduler
    for name in ("SGD", "Adam"):
        runs = data["results"][name]
        assert set(runs) == {"eager", "agspeed", "torch.compile"}
        assert runs["eager"]["max_param_diff"] == 0.0
        assert runs["agspeed"]["max_param_diff"] < 1e-4
        assert all(r["median_ms"] > 0 for r in runs.values())
    if scheduler == "onecycle":
        # eight steps, Adam's lr and betas[0] new at each: symbols after three values (SGD
        # branches on its momentum, which stays a constant: a capture per value)
        assert data["results"]["Adam"]["agspeed"]["step_recompiles"] <= 3


def test_checks_benchmark_quick_run(tmp_path):
    out = tmp_path / "checks.json"
    env = dict(os.environ, AGSPEED_AUTOTUNE_CANDIDATES="eager",
               AGSPEED_CACHE_DIR=str(tmp_path / "kb"))
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "checks.py"), "--batch", "8",
         "--hidden", "16", "--warmup", "2", "--steps", "1", "--rounds", "2",
         "--compile-backend", "eager", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(out.read_text())["results"]
    assert set(runs) == {"eager", "agspeed", "agspeed, checks break", "torch.compile"}
    assert (runs["agspeed"]["graphs"], runs["agspeed"]["breaks"]) == (1, 0)
    assert runs["agspeed, checks break"]["breaks"] > 0
    assert all(r["max_param_diff"] < 1e-4 for r in runs.values())
    assert all(r["median_ms"] > 0 for r in runs.values())
