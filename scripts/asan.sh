#!/usr/bin/env bash
# Builds agspeed._C with AddressSanitizer (AGSPEED_DEBUG=1: -O0 -g, asserts on) into
# .venv-asan and runs the torch-free tests against it with libasan preloaded.
# The in-place build it leaves behind is the debug one: scripts/test.sh rebuilds.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$AGS_ROOT"
AGSPEED_DEBUG=1 ags_venv 3.11 .venv-asan 0
echo "== pytest on Python 3.11 under AddressSanitizer ==" >&2
LD_PRELOAD="$(gcc -print-file-name=libasan.so)" \
ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" \
    "$AGS_ROOT/.venv-asan/bin/python" -m pytest tests -q -ra -m "not torch" -p no:cacheprovider "$@"
