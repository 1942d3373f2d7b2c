"""Environment variables and config knobs.  Torch-free.

Each test sets variables with monkeypatch and calls agspeed.config.reload(); the
autouse fixture in conftest.py re-reads the real environment afterwards.
"""

import logging
import os
import subprocess
import sys
import warnings

import pytest

import agspeed
from agspeed import _C, config, log


def reload_recording_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config.reload()
    return [w for w in caught if issubclass(w.category, agspeed.ConfigWarning)]


@pytest.fixture(autouse=True)
def fresh_warned_set():
    config._warned.clear()
    yield
    config._warned.clear()


def add(a, b):
    return a + b


def test_disable_makes_optimize_a_pass_through_and_stops_existing_regions(monkeypatch):
    asked = []
    region = _C.Region(add, lambda code, f_locals, *frame: asked.append(1) or
                       _C.CacheEntry(_C.ACTION_RUN_EAGER))
    monkeypatch.setenv("AGSPEED_DISABLE", "1")
    config.reload()
    assert config.disable is True and not _C.is_enabled()
    assert agspeed.optimize(add) is add
    assert region(1, 2) == 3 and asked == []
    monkeypatch.delenv("AGSPEED_DISABLE")
    config.reload()
    assert _C.is_enabled()
    assert region(1, 2) == 3 and asked == [1]


@pytest.mark.parametrize("text,expected", [("true", True), ("ON", True), ("0", False),
                                           ("no", False), ("", False)])
def test_disable_accepts_usual_spellings(monkeypatch, text, expected):
    monkeypatch.setenv("AGSPEED_DISABLE", text)
    assert reload_recording_warnings() == []
    assert config.disable is expected


def test_malformed_disable_warns_and_keeps_the_default(monkeypatch):
    monkeypatch.setenv("AGSPEED_DISABLE", "maybe")
    caught = reload_recording_warnings()
    assert len(caught) == 1 and "AGSPEED_DISABLE='maybe'" in str(caught[0].message)
    assert config.disable is False and _C.is_enabled()


def test_log_topics_and_all(monkeypatch):
    monkeypatch.setenv("AGSPEED_LOG", "frames, Recompiles")
    config.reload()
    assert log.enabled("frames") and log.enabled("recompiles") and not log.enabled("guards")
    assert config.log == {"frames", "recompiles"}
    monkeypatch.setenv("AGSPEED_LOG", "all")
    config.reload()
    assert all(log.enabled(t) for t in log.TOPICS)
    for topic in ("frames", "guards", "recompiles", "graphs", "graph_breaks", "autotune"):
        assert topic in log.TOPICS
    monkeypatch.delenv("AGSPEED_LOG")
    config.reload()
    assert not any(log.enabled(t) for t in log.TOPICS)


def test_unknown_log_topic_warns_once_and_keeps_the_others(monkeypatch):
    monkeypatch.setenv("AGSPEED_LOG", "frames,bogus")
    first = reload_recording_warnings()
    assert len(first) == 1 and "bogus" in str(first[0].message)
    assert log.enabled("frames")
    assert reload_recording_warnings() == []  # the same mistake is not repeated


@pytest.fixture
def frames_log():
    """The records the agspeed.frames logger emits during a test."""
    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Collect()
    logger = logging.getLogger("agspeed.frames")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_frames_topic_logs_each_decision(monkeypatch, frames_log):
    monkeypatch.setenv("AGSPEED_LOG", "frames")
    config.reload()

    def logged_function(x):
        return x

    agspeed.optimize(logged_function)(1)
    messages = [r.getMessage() for r in frames_log]
    assert any("logged_function" in m and "run eager" in m and "x=int" in m for m in messages)


def test_frames_topic_off_logs_nothing(frames_log):
    agspeed.optimize(lambda: add(1, 2))()
    assert frames_log == []


def test_backend_override(monkeypatch):
    seen = []

    def body():
        seen.append(_C.current_context().backend_name)

    monkeypatch.setenv("AGSPEED_BACKEND", "eager")
    config.reload()
    assert config.backend == "eager"
    agspeed.optimize(body, backend="auto")()
    assert seen == ["eager"]


def test_unknown_backend_in_env_warns_and_is_ignored(monkeypatch):
    monkeypatch.setenv("AGSPEED_BACKEND", "nope")
    caught = reload_recording_warnings()
    assert len(caught) == 1 and "nope" in str(caught[0].message)
    assert config.backend is None


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("AGSPEED_CACHE_DIR", str(tmp_path / "kb"))
    config.reload()
    assert config.cache_dir == str(tmp_path / "kb")
    monkeypatch.setenv("AGSPEED_CACHE_DIR", "/tmp/x")
    config.reload()
    assert config.cache_dir == "/tmp/x"
    monkeypatch.delenv("AGSPEED_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    config.reload()
    # the user's cache directory as platformdirs gives it (XDG on Linux)
    assert config.cache_dir == str(tmp_path / "xdg" / "agspeed")


@pytest.mark.parametrize("text", ["", "  "])
def test_empty_cache_dir_warns_and_keeps_the_default(monkeypatch, text):
    monkeypatch.setenv("AGSPEED_CACHE_DIR", text)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    caught = reload_recording_warnings()
    assert len(caught) == 1 and "AGSPEED_CACHE_DIR" in str(caught[0].message)
    assert os.path.basename(config.cache_dir) == "agspeed"


@pytest.mark.parametrize("text", ["abc", "0", "-3"])
def test_malformed_recompile_limit_warns(monkeypatch, text):
    monkeypatch.setenv("AGSPEED_RECOMPILE_LIMIT", text)
    assert len(reload_recording_warnings()) == 1
    assert config.recompile_limit == 8


def test_recompile_limit(monkeypatch):
    monkeypatch.setenv("AGSPEED_RECOMPILE_LIMIT", "3")
    config.reload()
    assert config.recompile_limit == 3


def test_override_scope_restores():
    assert not log.enabled("frames")
    with config.override(log="frames", recompile_limit=2):
        assert log.enabled("frames") and config.recompile_limit == 2
    assert not log.enabled("frames") and config.recompile_limit == 8
    with pytest.raises(KeyError):
        with config.override(log=["graphs"]):
            assert log.enabled("graphs")
            raise KeyError("inside")
    assert not log.enabled("graphs")


def test_set_validates_names_and_types():
    with pytest.raises(TypeError, match="nope"):
        config.set(nope=1)
    with pytest.raises(TypeError, match="recompile_limit"):
        config.set(recompile_limit=True)
    with pytest.raises(ValueError):
        config.set(recompile_limit=0)
    with pytest.raises(ValueError, match="no backend"):
        config.set(backend="nope")
    config.set(disable=True)
    assert not _C.is_enabled()
    config.set(disable="off")  # strings parse as in the environment
    assert _C.is_enabled()
    with pytest.raises(AttributeError):
        config.not_a_knob


def test_set_rejects_an_unknown_log_topic():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", agspeed.ConfigWarning)
        with pytest.raises(ValueError, match="bogus"):
            config.set(log="frames,bogus")
    assert not log.enabled("frames")  # nothing was applied


def test_set_rejects_an_empty_cache_dir():
    before = config.cache_dir
    with pytest.raises(ValueError, match="empty"):
        config.set(cache_dir="")
    assert config.cache_dir == before


def test_set_log_names_the_bad_topics_and_the_valid_ones():
    with warnings.catch_warnings():
        warnings.simplefilter("error", agspeed.ConfigWarning)  # it raises instead of warning
        with pytest.raises(ValueError) as info:
            config.set(log=["frames", " Bogus", "nope"])
    message = str(info.value)
    assert "'bogus'" in message and "'nope'" in message and "graph_breaks" in message
    with pytest.raises(TypeError, match="topic names"):
        config.set(log=["frames", 3])
    config.set(log=("all",))
    assert all(log.enabled(t) for t in log.TOPICS)


def test_set_cache_dir_is_expanded_and_made_absolute(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    config.set(cache_dir="~/kb")
    assert config.cache_dir == str(tmp_path / "kb")
    monkeypatch.chdir(tmp_path)
    with config.override(cache_dir="relative"):
        assert config.cache_dir == str(tmp_path / "relative")
    with pytest.raises(ValueError, match="empty"):
        config.set(cache_dir="  ")
    assert config.cache_dir == str(tmp_path / "kb")


def run_python(code, **env):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AGSPEED_")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True,
                          text=True, timeout=120)


def test_disable_read_at_import_and_torch_not_imported():
    done = run_python(
        "import sys, agspeed\n"
        "f = lambda x: x\n"
        "assert agspeed.optimize(f) is f\n"
        "assert 'torch' not in sys.modules, 'importing agspeed imported torch'\n"
        "print('ok')\n",
        AGSPEED_DISABLE="1",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_log_env_at_import_prints_to_stderr():
    done = run_python(
        "import agspeed\n"
        "def traced_here(x):\n    return x\n"
        "agspeed.optimize(traced_here)(1)\n",
        AGSPEED_LOG="frames,unknown_topic",
    )
    assert done.returncode == 0, done.stderr
    assert "[agspeed.frames] traced_here (<string>:2)" in done.stderr
    assert "unknown_topic" in done.stderr  # the warning


def test_autotune_candidates_from_python_and_the_environment(monkeypatch):
    config.set(autotune_candidates="inductor, eager,inductor")
    assert config.autotune_candidates == ("inductor", "eager")
    config.set(autotune_candidates=["jit"])
    assert config.autotune_candidates == ("jit",)
    with pytest.raises(ValueError, match="no backend named 'nope'; known"):
        config.set(autotune_candidates="eager,nope")
    monkeypatch.setenv("AGSPEED_AUTOTUNE_CANDIDATES", "")
    config.reload()
    assert config.autotune_candidates is None
