"""The coverage benchmark keeps working: a run on one zoo model in both modes writes its
JSON and markdown, with agspeed's and Dynamo's graph counts, both first-call times and
agspeed's results checked against eager."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "coverage.py")


def test_coverage_benchmark_on_one_model(tmp_path):
    pytest.importorskip("torch")
    out, md = tmp_path / "coverage.json", tmp_path / "coverage.md"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--models", "mlp", "--rounds", "1", "--out", str(out),
         "--md", str(md)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["benchmark"] == "coverage" and data["modes"] == ["eval", "train"]
    versions = data["versions"]
    assert versions["machine"] and versions["python"] and versions["torch"]
    assert set(data["models"]) == {"mlp"}
    for mode in ("eval", "train"):
        row = data["models"]["mlp"][mode]
        # the zoo's MLP is one graph for both runtimes, and agspeed computes what eager does
        assert {k: row["agspeed"][k] for k in ("graphs", "breaks", "reasons")} == {
            "graphs": 1, "breaks": 0, "reasons": []}
        assert (row["dynamo"]["graphs"], row["dynamo"]["breaks"]) == (1, 0)
        assert row["agspeed"]["capture_ms"] > 0 and row["dynamo"]["capture_ms"] > 0
        assert row["equal"] is True and row["equal_detail"] == ""
    assert data["summary"]["cases"] == 2 and data["summary"]["agspeed_one_graph"] == 2
    ratios = data["summary"]["capture_ratios"]
    assert ratios["transformers"] == [] and len(ratios["zoo"]) == 2
    assert all(r == pytest.approx(data["models"]["mlp"][m]["dynamo"]["capture_ms"] /
                                  data["models"]["mlp"][m]["agspeed"]["capture_ms"])
               for r, m in zip(ratios["zoo"], ("eval", "train")))
    table = md.read_text()
    assert f"Machine: {versions['machine']}" in table
    assert "| mlp | eval | 1 / 0 | 1 / 0 |" in table and "| mlp | train | 1 / 0 | 1 / 0 |" in table
    assert "Capture time, Dynamo's over agspeed's, on the zoo cases" in table
    assert "on the transformers cases" not in table   # none measured in this run
    assert "agspeed one graph on 2 of 2" in proc.stdout


def test_coverage_benchmark_refuses_unknown_models_and_modes():
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, SCRIPT, "--models", "nothing"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown models" in proc.stderr
    proc = subprocess.run([sys.executable, SCRIPT, "--modes", "infer"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown modes" in proc.stderr
