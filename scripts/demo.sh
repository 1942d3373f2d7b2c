#!/usr/bin/env bash
# The README's demo command: set up Python 3.11 with torch==2.13.0 and run the demo,
# a short training run eager vs optimized.  Arguments go to scripts/demo.py.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
ags_venv 3.11 .venv 1
exec "$AGS_ROOT/.venv/bin/python" "$AGS_ROOT/scripts/demo.py" "$@"
