"""The knowledge base: records on disk, shared by processes, robust to bad files.

The subprocess tests run a small training script twice against one cache directory: a
second process must answer from the knowledge base without tuning, and a process killed
in the middle of tuning must leave the next one tuning only the candidates it had not
measured.
"""

import json
import logging
import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest

import agspeed
from agspeed.backends import knowledge

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")

ENV = {"agspeed": "x", "torch": "y", "python": "z", "cpu": "c", "threads": 2}
OK = {"status": "ok", "median_s": 0.002, "ratio": 1.5, "low": 1.4, "compile_s": 1.0}


@pytest.fixture
def kb(tmp_path):
    with agspeed.config.override(cache_dir=str(tmp_path / "kb")):
        yield tmp_path / "kb"
    knowledge._warned.clear()


def test_a_record_round_trips(kb):
    knowledge.record("k1", ENV, {"graph": "f (a.py:1)"}, "eager", dict(OK, ratio=1.0))
    knowledge.record("k1", ENV, {"graph": "f (a.py:1)"}, "inductor", OK)
    knowledge.record("k1", ENV, {}, "jit", {"status": "failed", "reason": "no"})
    knowledge.choose("k1", ENV, {}, "inductor")
    rec = knowledge.load("k1", ENV)
    assert rec["choice"] == "inductor" and rec["graph"] == "f (a.py:1)"
    assert rec["candidates"]["inductor"] == OK
    assert rec["candidates"]["jit"]["status"] == "failed"
    assert agspeed.cache.info()["graphs"] == 1
    assert agspeed.cache.info()["choices"] == {"inductor": 1}


def test_a_new_measurement_drops_the_old_choice(kb):
    knowledge.record("k1", ENV, {}, "inductor", OK)
    knowledge.choose("k1", ENV, {}, "inductor")
    knowledge.record("k1", ENV, {}, "jit", OK)
    assert knowledge.load("k1", ENV)["choice"] is None  # decided again over all


def test_only_a_measured_candidate_can_be_chosen(kb):
    knowledge.record("k1", ENV, {}, "jit", {"status": "wrong", "reason": "differs"})
    with pytest.raises(ValueError):
        knowledge.choose("k1", ENV, {}, "jit")
    with pytest.raises(ValueError):
        knowledge.record("k1", ENV, {}, "jit", {"status": "ok"})  # no timing


@pytest.mark.parametrize("content", [
    b"",                                    # empty
    b'{"format": 1, "key": "k1", "candid',  # truncated
    b"\x00\xff garbage \x80",               # not text
    b"[1, 2, 3]",                           # JSON, not a record
    b'{"format": 99, "key": "k1"}',         # another format
])
def test_a_bad_file_is_ignored_with_one_warning_and_rewritten(kb, content, caplog):
    path = kb / "tuning" / "k1.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="agspeed"):
        assert knowledge.load("k1", ENV) is None
        assert knowledge.load("k1", ENV) is None
        assert knowledge.records() == []
    assert sum("ignored" in r.getMessage() for r in caplog.records) == 1
    knowledge.record("k1", ENV, {}, "inductor", OK)  # the next measurement rewrites it
    assert knowledge.load("k1", ENV)["candidates"]["inductor"] == OK


def test_a_foreign_record_is_not_taken_for_an_answer(kb):
    knowledge.record("k1", ENV, {}, "inductor", OK)
    knowledge.choose("k1", ENV, {}, "inductor")
    assert knowledge.load("k1", dict(ENV, torch="other")) is None
    # a record copied under another key's name
    os.replace(kb / "tuning" / "k1.json", kb / "tuning" / "k2.json")
    assert knowledge.load("k2", ENV) is None


def test_a_choice_that_was_not_measured_ok_makes_the_file_unusable(kb):
    path = kb / "tuning" / "k1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": 1, "key": "k1", "env": ENV, "choice": "jit",
                                "candidates": {"jit": {"status": "wrong", "reason": "x"}}}))
    assert knowledge.load("k1", ENV) is None


def _writer(cache_dir, name, count):
    with agspeed.config.override(cache_dir=cache_dir):
        for k in range(count):
            knowledge.record("shared", ENV, {}, f"{name}{k % 3}", dict(OK, ratio=1.0 + k))


def test_two_processes_writing_one_record_keep_both(kb):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(kb), name, 30)) for name in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    rec = knowledge.load("shared", ENV)
    assert set(rec["candidates"]) == {"a0", "a1", "a2", "b0", "b1", "b2"}
    leftovers = [n for n in os.listdir(kb / "tuning") if n.startswith(".tmp")]
    assert leftovers == []


def test_graph_keys_differ_by_shape_dtype_and_state():
    import torch.fx

    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 3))
    env = dict(ENV)
    a = knowledge.graph_key(gm, [torch.randn(2, 4)], env)
    assert a == knowledge.graph_key(gm, [torch.randn(2, 4)], env)  # values do not matter
    assert a != knowledge.graph_key(gm, [torch.randn(3, 4)], env)
    assert a != knowledge.graph_key(gm, [torch.randn(2, 4, dtype=torch.float64)], env)
    assert a != knowledge.graph_key(gm, [torch.randn(2, 4, requires_grad=True)], env)
    assert a != knowledge.graph_key(gm, [torch.randn(2, 4)], dict(env, torch="2.0"))
    with torch.no_grad():
        assert a != knowledge.graph_key(gm, [torch.randn(2, 4)], env)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert a != knowledge.graph_key(gm, [torch.randn(2, 4)], env)


def test_clear_removes_only_agspeeds_own_folders(kb):
    knowledge.record("k1", ENV, {}, "inductor", OK)
    knowledge.artifact_dir("inductor")
    (kb / "inductor" / "blob").write_bytes(b"x" * 100)
    (kb / "someone_elses.txt").write_text("keep me")
    assert agspeed.cache.clear() >= 100
    assert sorted(os.listdir(kb)) == ["someone_elses.txt"]
    assert agspeed.cache.info()["graphs"] == 0


def _cli(*args, cache):
    env = dict(os.environ, AGSPEED_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "agspeed.cache", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_command_line_lists_shows_and_clears(kb):
    knowledge.record("abc123", ENV, {"graph": "forward (m.py:3)"}, "inductor", OK)
    knowledge.choose("abc123", ENV, {}, "inductor")
    listed = _cli("list", cache=kb)
    assert listed.returncode == 0
    assert "abc123" in listed.stdout and "inductor 1.50x" in listed.stdout
    assert "forward (m.py:3)" in listed.stdout
    shown = _cli("show", "abc", cache=kb)
    assert shown.returncode == 0 and json.loads(shown.stdout)["choice"] == "inductor"
    assert _cli("show", "zzz", cache=kb).returncode == 1
    info = _cli(cache=kb)
    assert info.returncode == 0 and "graphs: 1" in info.stdout
    cleared = _cli("clear", cache=kb)
    assert cleared.returncode == 0 and not (kb / "tuning").exists()


# -- across processes -------------------------------------------------------------------

SCRIPT = textwrap.dedent('''
    import os, sys, time, torch, torch.nn as nn
    import agspeed

    def fast(gm, example_inputs):
        return lambda x, scale: (x * scale,)

    def doomed(gm, example_inputs):
        if os.environ.get("KILL_IN_TUNING") == "1":
            os._exit(17)          # the process dies in the middle of tuning
        return lambda x, scale: (x * scale,)

    agspeed.register_backend("t_fast", fast)
    agspeed.register_backend("t_doomed", doomed)

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(8))

        def forward(self, x):
            y = x * self.scale
            for _ in range(300):
                y = y * 1.0
            return y

    model = agspeed.optimize(Chain(), candidates=("t_fast", "t_doomed"))
    x = torch.randn(4, 8)
    for _ in range(3):
        model(x).sum().backward()
    print("done")
''')


def _run_script(tmp_path, cache, **env):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    full = dict(os.environ, AGSPEED_CACHE_DIR=str(cache), AGSPEED_LOG="autotune",
                AGSPEED_PROGRESS="0", **env)
    full.pop("AGSPEED_AUTOTUNE_CANDIDATES", None)
    return subprocess.run([sys.executable, str(script)], env=full, capture_output=True,
                          text=True, timeout=300)


def test_a_second_process_does_not_tune(tmp_path):
    cache = tmp_path / "kb"
    first = _run_script(tmp_path, cache)
    assert first.returncode == 0, first.stderr
    assert "tuned t_fast, t_doomed" in first.stderr
    second = _run_script(tmp_path, cache)
    assert second.returncode == 0, second.stderr
    assert "knowledge base says t_" in second.stderr and "not tuning again" in second.stderr
    assert "tuned" not in second.stderr.replace("tuned 20", "")


def test_a_process_killed_while_tuning_leaves_the_rest_to_the_next(tmp_path):
    cache = tmp_path / "kb"
    killed = _run_script(tmp_path, cache, KILL_IN_TUNING="1")
    assert killed.returncode == 17 and "done" not in killed.stdout
    (rec,) = [json.loads(p.read_text()) for p in (cache / "tuning").glob("*.json")]
    assert set(rec["candidates"]) == {"t_fast"} and rec["choice"] is None
    resumed = _run_script(tmp_path, cache)
    assert resumed.returncode == 0, resumed.stderr
    assert "tuned t_doomed in" in resumed.stderr  # t_fast was not measured again
    (rec,) = [json.loads(p.read_text()) for p in (cache / "tuning").glob("*.json")]
    assert set(rec["candidates"]) == {"eager", "t_fast", "t_doomed"}
    assert rec["choice"] in ("t_fast", "t_doomed")
