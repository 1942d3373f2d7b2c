"""The knowledge base: what agspeed learned about this machine, on disk.

It is the one owner of ``config.cache_dir``.  Below it:

    tuning/<key>.json        one record per graph: each candidate backend's measurement
                             and the choice (the autotuner writes them, one at a time),
                             and what the program's own steps said of a training
                             graph's choice ("loop", ``backends._confirm``)
    tuning/<key>.json.lock   its lock (filelock), shared by processes and threads
    inductor/                inductor's compiled artifacts (``artifact_dir("inductor")``)

A record's key is a hash of the graph (its code, which names every operation and
constant, and the metadata of each input: type, dtype, shape, strides, device,
requires_grad), of the state the graph runs in (grad mode, autocast per device type) and
of the environment (``environment()``: device names, thread count, torch, Python and
agspeed versions).  So a change of any of them never reuses a stale answer: it is
another key.  The environment is stored in the record too, and a record whose stored
key or environment differ from what it was looked up by is foreign and ignored.

Writes are atomic (a temporary file in the same directory, then ``os.replace``) and done
under the record's lock, reading the record again inside it, so two processes measuring
different candidates of one graph both keep theirs.  Each measurement is written as it
completes: a tuning run interrupted by a crash or Ctrl-C leaves the candidates it
finished, and the next run measures only the others.

A file that cannot be read as a record (truncated, garbage, another format) is ignored
with one warning per file and rewritten by the next measurement; it never raises and is
never taken for an answer.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import threading
from typing import Any, Iterator

__all__ = ["FORMAT", "root", "artifact_dir", "environment", "graph_key", "load", "record",
           "choose", "confirm", "confirmed", "records", "info", "clear"]

FORMAT = 1
_log = logging.getLogger("agspeed")
_TUNING = "tuning"
_warned: set[str] = set()
_warned_lock = threading.Lock()


def root() -> str:
    """The cache directory (``config.cache_dir``)."""
    from agspeed import config

    return config.cache_dir


def artifact_dir(name: str) -> str:
    """A directory under the cache directory for a backend's compiled artifacts."""
    path = os.path.join(root(), name)
    os.makedirs(path, exist_ok=True)
    return path


def _tuning_dir() -> str:
    return os.path.join(root(), _TUNING)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device_types: Any = ("cpu",)) -> dict:
    """What a measurement depends on besides the graph: versions and devices."""
    import torch

    import agspeed

    env = {
        "agspeed": agspeed.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": _cpu_name(),
        "threads": torch.get_num_threads(),
    }
    if "cuda" in device_types and torch.cuda.is_available():
        index = torch.cuda.current_device()
        env["cuda"] = torch.cuda.get_device_name(index)
        env["cuda_version"] = torch.version.cuda
    return env


def _describe_input(value: Any) -> list:
    import torch
    import torch.fx

    if isinstance(value, torch.Tensor):
        return [type(value).__name__, str(value.dtype), [str(d) for d in value.shape],
                [str(s) for s in value.stride()], value.device.type, value.requires_grad]
    if isinstance(value, torch.fx.GraphModule):  # a checkpointed region: its code
        return [type(value).__name__, value.code]
    return [type(value).__name__, repr(value)]


def _state(device_types: Any) -> list:
    """The thread state a graph's meaning depends on: grad mode and autocast."""
    import torch

    from agspeed.backends._protocol import autocast_state

    state: list = [torch.is_grad_enabled()]
    for device, enabled, dtype in autocast_state(set(device_types) | {"cpu"}):
        state += [device, enabled] if dtype is None else [device, enabled, str(dtype)]
    return state


def graph_key(gm: Any, inputs: list, env: dict) -> str:
    """The stable key of ``gm`` run on inputs like ``inputs`` in environment ``env``.

    ``inputs`` are the placeholders' values.  A dynamic graph is described by its
    placeholders' fake values instead, whose symbolic sizes print as symbols, so every
    size of it shares one key.
    """
    from agspeed.backends._protocol import is_dynamic, placeholder_values

    if is_dynamic(gm):
        inputs = placeholder_values(gm)
    devices = {t.device.type for t in inputs if hasattr(t, "device")}
    consts = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target, None)
            consts.append([node.target, _describe_input(value)])
    payload = json.dumps({
        "format": FORMAT,
        "code": gm.code,
        "inputs": [_describe_input(v) for v in inputs],
        "consts": consts,
        "state": _state(devices),
        "env": env,
    }, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _path(key: str) -> str:
    return os.path.join(_tuning_dir(), f"{key}.json")


def _warn_once(path: str, why: str) -> None:
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    _log.warning("agspeed: knowledge base file %s ignored (%s); it will be rewritten", path,
                 why)


def _valid_measurement(m: Any) -> bool:
    if not isinstance(m, dict) or m.get("status") not in ("ok", "wrong", "failed"):
        return False
    if m["status"] == "ok":
        return all(isinstance(m.get(k), (int, float)) for k in ("median_s", "ratio"))
    return isinstance(m.get("reason"), str)


def _read(path: str, key: str | None, env: dict | None) -> dict | None:
    """The record at ``path``, or None when absent or unusable (warned once)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        _warn_once(path, "not text: corrupt")
        return None
    except OSError as exc:
        _warn_once(path, f"cannot be read: {exc}")
        return None
    try:
        rec = json.loads(text)
    except ValueError:
        _warn_once(path, "not valid JSON: truncated or corrupt")
        return None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        _warn_once(path, "not a knowledge base record of this format")
        return None
    cands = rec.get("candidates")
    if not isinstance(cands, dict) or not all(_valid_measurement(m) for m in cands.values()):
        _warn_once(path, "malformed measurements")
        return None
    choice = rec.get("choice")
    if choice is not None and (not isinstance(choice, str) or choice not in cands
                               or cands[choice]["status"] != "ok"):
        _warn_once(path, "its choice is not a measured candidate")
        return None
    if key is not None and (rec.get("key") != key or rec.get("env") != env):
        _warn_once(path, "made for another graph or environment")
        return None
    return rec


def load(key: str, env: dict) -> dict | None:
    """The record of ``key``, or None (absent, unusable or foreign)."""
    return _read(_path(key), key, env)


def _lock(path: str) -> Any:
    from filelock import FileLock

    return FileLock(path + ".lock", timeout=60)


def _write(path: str, rec: dict) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(rec, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _update(key: str, env: dict, meta: dict, change: Any) -> dict:
    """Apply ``change(record)`` to the record of ``key`` under its lock; returns it."""
    path = _path(key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with _lock(path):
        rec = _read(path, key, env) or {"format": FORMAT, "key": key, "env": env,
                                        "candidates": {}, "choice": None}
        rec.update(meta)
        change(rec)
        rec["updated"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds")
        _write(path, rec)
    return rec


def record(key: str, env: dict, meta: dict, name: str, measurement: dict) -> dict:
    """Store one candidate's measurement of the graph ``key`` (as soon as it is made)."""
    if not _valid_measurement(measurement):
        raise ValueError(f"not a measurement: {measurement!r}")

    def change(rec: dict) -> None:
        rec["candidates"][name] = measurement
        rec["choice"] = None  # a choice is made over the complete set, by choose()
        rec.pop("loop", None)  # and checked on the program's steps again

    return _update(key, env, meta, change)


def choose(key: str, env: dict, meta: dict, name: str) -> dict:
    """Store the choice for ``key`` (a candidate measured ok)."""

    def change(rec: dict) -> None:
        if rec["candidates"].get(name, {}).get("status") != "ok":
            raise ValueError(f"{name!r} was not measured ok for this graph")
        rec["choice"] = name

    return _update(key, env, meta, change)


def confirm(key: str, env: dict, meta: dict, name: str, verdict: dict) -> dict:
    """Store what the program's own steps said of the candidate ``name`` for ``key``
    (``backends._confirm``): kept, and the choice from then on, or eager."""

    def change(rec: dict) -> None:
        rec["loop"] = {"candidate": name, **verdict}
        rec["judged"] = sorted({*rec.get("judged", ()), name})   # each judged once
        if verdict["kept"] and rec["candidates"].get(name, {}).get("status") == "ok":
            rec["choice"] = name
        elif not verdict["kept"] and \
                rec["candidates"].get("eager", {}).get("status") == "ok":
            rec["choice"] = "eager"

    return _update(key, env, meta, change)


def confirmed(rec: dict) -> bool:
    """Whether the program's steps checked ``rec``'s choice (and kept it)."""
    loop = rec.get("loop")
    return isinstance(loop, dict) and loop.get("candidate") == rec.get("choice") and \
        loop.get("kept") is True


def _files() -> Iterator[str]:
    directory = _tuning_dir()
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(".json") and not name.startswith("."):
            yield os.path.join(directory, name)


def records() -> list[dict]:
    """Every readable record (unusable files are warned about and left out)."""
    out = []
    for path in _files():
        rec = _read(path, None, None)
        if rec is not None:
            out.append(rec)
    return out


def _size(path: str) -> int:
    total = 0
    for base, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(base, name))
            except OSError:
                pass
    return total


def info() -> dict:
    """Where the cache is, how many graphs it knows, and what it holds on disk."""
    recs = records()
    return {
        "cache_dir": root(),
        "graphs": len(recs),
        "decided": sum(1 for r in recs if r.get("choice")),
        "choices": {name: sum(1 for r in recs if r.get("choice") == name)
                    for name in sorted({r["choice"] for r in recs if r.get("choice")})},
        "bytes": _size(root()) if os.path.isdir(root()) else 0,
    }


def clear() -> int:
    """Remove everything agspeed keeps in the cache directory; returns the bytes freed.

    Only agspeed's own subdirectories are removed: the cache directory may have been
    pointed at a folder that holds other things too.
    """
    freed = 0
    for sub in (_TUNING, "inductor"):
        path = os.path.join(root(), sub)
        if os.path.isdir(path):
            freed += _size(path)
            shutil.rmtree(path, ignore_errors=True)
    with _warned_lock:
        _warned.clear()
    return freed
