"""What the multi-process training tests share: the skip where gloo is missing, and the
environment their worker processes run in."""

import os

import pytest

dist = pytest.importorskip("torch.distributed")

needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch without gloo")

HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(HERE))


def worker_env(cache_dir, **extra):
    """The environment of a rank: this checkout importable, its own cache directory, no
    progress bars, one OpenMP thread per process (two ranks share this machine)."""
    path = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))
    return dict(os.environ, AGSPEED_CACHE_DIR=str(cache_dir), AGSPEED_PROGRESS="0",
                OMP_NUM_THREADS="1", PYTHONPATH=path, **extra)
