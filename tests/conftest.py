"""Shared test set-up.

Markers:
  torch  the test needs PyTorch.  Where torch is absent it is skipped, unless
         AGSPEED_REQUIRE_TORCH=1 (the 3.11 CI run), where a missing torch fails.
         The torch-free runs (3.12, 3.13) deselect these with -m "not torch".

  cxx_exceptions  the test makes libtorch throw a C++ exception (a shape error, a
         data-dependent op, TorchScript's and dynamo's internal checks).  AddressSanitizer's
         __cxa_throw interceptor aborts on those even without agspeed loaded, so
         scripts/asan.sh deselects them; every other run includes them.

Every test starts from a clean runtime: caches, counters and records reset, config
re-read from the environment.

The layout mirrors the source tree: tests/csrc/, tests/guards/, tests/backends/ and
tests/agspeed/ hold the tests of the file they are named after (tests/guards/test_memo.py
for guards/memo.c), tests/models/ whole models end to end, tests/benchmarks/ the
benchmark scripts, tests/training/ whole training loops (AMP, checkpoints, DDP, FSDP).
Test modules are named uniquely across the tree and import shared
helpers by module name (``from test_zoo import ZOO``, ``from _logs import logged``): this
file puts tests/ and each of its directories on ``sys.path``.

The session's knowledge base is a temporary directory (never the user's cache), shared by
all tests so that inductor's compiled artifacts are reused across them.  The autotuner's
default candidate list is ``eager`` alone, so ``optimize(model)`` in tests about capture
does not tune (and compile) every graph; tests of the autotuner and the backends name
their candidates or backend.  Both are environment defaults: a run may set them.
"""

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
for _dir in [_HERE] + sorted(os.path.join(_HERE, d) for d in os.listdir(_HERE)
                             if os.path.isdir(os.path.join(_HERE, d)) and d[0] not in "._"):
    if _dir not in sys.path:
        sys.path.insert(0, _dir)

if "AGSPEED_CACHE_DIR" not in os.environ:
    # made by the process that collects (pytest-xdist's workers inherit it), removed
    # when that process exits
    os.environ["AGSPEED_CACHE_DIR"] = tempfile.mkdtemp(prefix="agspeed-tests-")
    atexit.register(shutil.rmtree, os.environ["AGSPEED_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("AGSPEED_AUTOTUNE_CANDIDATES", "eager")

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def pytest_configure(config):
    config.addinivalue_line("markers", "torch: the test needs PyTorch")
    config.addinivalue_line(
        "markers", "cxx_exceptions: libtorch throws a C++ exception (not run under ASan)")


def pytest_collection_modifyitems(config, items):
    if HAVE_TORCH:
        return
    if os.environ.get("AGSPEED_REQUIRE_TORCH") == "1":
        return  # let the tests fail on import: torch was required
    skip = pytest.mark.skip(reason="PyTorch is not installed")
    for item in items:
        if "torch" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def clean_runtime():
    import agspeed

    agspeed.reset()
    agspeed.config.reload()
    yield
    agspeed.config.reload()
    agspeed.reset()
