"""The training benchmark keeps working: a quick run (tiny MLP, no torch.compile) measures
agspeed's warm-up in processes of its own and the steady step next to eager, writes its
JSON and plot, and finds agspeed's losses equal to eager's."""

import json
import os
import subprocess
import sys
import xml.dom.minidom

import pytest

pytestmark = pytest.mark.torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_train_benchmark_quick_run(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "train.json"
    env = {**os.environ, "AGSPEED_CACHE_DIR": str(tmp_path / "agspeed-cache")}
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "train.py"), "--quick",
         "--no-compile", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["benchmark"] == "train" and data["quick"] is True
    assert data["device"] == "cpu" and data["device_name"] and data["machine"]
    assert data["runtimes"] == ["eager", "agspeed"]
    assert set(data["cases"]) == {"mlp/fp32", "mlp/bf16"}
    for case in data["cases"].values():
        steady = case["steady"]
        for name in ("eager", "agspeed"):
            run = steady["runtimes"][name]
            assert run["median_ms"] > 0 and len(run["step_ms"]) == data["rounds"]
            assert run["losses_match"], run
        assert steady["runtimes"]["eager"]["vs_eager"] == 1.0
        assert steady["agspeed_vs_best"] > 0
        # the tiny MLP is one graph for agspeed, and the timed rounds compiled nothing
        assert steady["graphs"] == {"graphs": 1, "breaks": 0, "top_break_reasons": []}
        assert steady["agspeed_misses_in_rounds"] == 0
        # warm-up: two agspeed processes, the second with the first's cache directory
        warmup = case["warmup"]
        assert set(warmup) == {"agspeed_first", "agspeed_second"}
        for run in warmup.values():
            assert "error" not in run, run
            assert run["first_step_s"] > 0 and run["steady_ms"] > 0
            assert len(run["step_ms"]) == data["warm_steps"] + data["steady_steps"]
        # no torch.compile: its targets are not measured, agspeed's steady one is
        assert case["targets"]["first_run"] is None
        assert case["targets"]["steady"] in (True, False)
    assert data["geomean_speedup"]["all"]["agspeed"] > 0
    assert "steady step, median ms" in proc.stdout and "warm-up, s" in proc.stdout
    svg = xml.dom.minidom.parse(str(tmp_path / "train.svg"))
    labels = [t.firstChild.data for t in svg.getElementsByTagName("text") if t.firstChild]
    assert "agspeed" in labels and "eager" in labels and "mlp" in labels


def test_train_benchmark_refuses_unknown_models_and_precisions():
    pytest.importorskip("torch")
    script = os.path.join(ROOT, "benchmarks", "train.py")
    proc = subprocess.run([sys.executable, script, "--quick", "--models", "nothing"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown models" in proc.stderr
    proc = subprocess.run([sys.executable, script, "--quick", "--precisions", "fp16"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--device cuda" in proc.stderr
