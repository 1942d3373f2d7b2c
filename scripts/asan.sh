#!/usr/bin/env bash
# Builds agspeed._C with AddressSanitizer (AGSPEED_DEBUG=1: -O0 -g, asserts on) into
# .venv-asan (with torch==2.13.0) and runs the tests against it with libasan preloaded,
# all but those marked cxx_exceptions (see tests/conftest.py) and the suites whose time
# goes to torch's compilers and to worker processes rather than to agspeed's C: the
# inductor and autotuner tests, the nvrtc backend's graph tests (AOTAutograd, and g++
# building each kernel for the host; the C they reach, describe.c and codegen.c, runs
# here through every kernel family of tests/backends/test_nvrtc_codegen.py and
# test_nvrtc_columns.py), the training loops (AMP on every backend, DDP and FSDP
# ranks) and the benchmark smoke runs.  Their frames go through the same hook, guards
# and interpreter that tests/csrc, tests/guards, tests/agspeed and tests/models drive
# here; scripts/test.sh runs them all on the normal build.
# The in-place build it leaves behind is the debug one: scripts/test.sh rebuilds.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$AGS_ROOT"
AGSPEED_DEBUG=1 ags_venv 3.11 .venv-asan 1
echo "== pytest on Python 3.11 under AddressSanitizer ==" >&2
LD_PRELOAD="$(gcc -print-file-name=libasan.so)" \
ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" \
    "$AGS_ROOT/.venv-asan/bin/python" -m pytest tests -q -ra $(ags_xdist_args) \
    -m "not cxx_exceptions" \
    --ignore=tests/training --ignore=tests/benchmarks \
    --ignore=tests/backends/test_inductor.py --ignore=tests/backends/test_autotune.py \
    --ignore=tests/backends/test_nvrtc_backend.py \
    -p no:cacheprovider "$@"
