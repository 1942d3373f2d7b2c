#!/usr/bin/env bash
# The README's test command: set up and run the whole test suite.
#   Python 3.11 (.venv, with torch==2.13.0): every test; a missing torch fails.
#   Python 3.12 and 3.13 (.venv-3.12, .venv-3.13, no torch): the torch-free tests.
# A missing 3.12/3.13 warns, or fails when CI or AGSPEED_REQUIRE_ALL_PYTHONS=1 is set.
# Each run spreads its test files over ags_workers processes (AGSPEED_TEST_WORKERS=1: one
# process, no xdist).  Extra arguments go to every pytest run.  Exits non-zero if any run
# failed or ran nothing (pytest's exit status 5).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
cd "$AGS_ROOT"

require_all=0
if [ -n "${CI:-}" ] || [ "${AGSPEED_REQUIRE_ALL_PYTHONS:-0}" = 1 ]; then require_all=1; fi

summary=()
failed=0

run_suite() {  # VERSION VENV TORCH [pytest args...]
    local version="$1" venv="$2" torch="$3"; shift 3
    if ! ags_find_python "$version" >/dev/null; then
        if [ "$require_all" = 1 ]; then
            echo "error: no Python $version interpreter (python$version on PATH or under" \
                "\$(pyenv root)/versions), required because CI or AGSPEED_REQUIRE_ALL_PYTHONS=1" >&2
            summary+=("Python $version: FAILED (interpreter not found)"); failed=1
        else
            echo "warning: no Python $version interpreter: skipping its run" >&2
            summary+=("Python $version: not run (interpreter not found)")
        fi
        return 0
    fi
    if ! ags_venv "$version" "$venv" "$torch"; then
        summary+=("Python $version: FAILED (set-up)"); failed=1; return 0
    fi
    local rc=0
    echo "== pytest on Python $version ==" >&2
    "$AGS_ROOT/$venv/bin/python" -m pytest tests -q -ra $(ags_xdist_args) "$@" || rc=$?
    if [ "$rc" = 0 ]; then
        summary+=("Python $version: passed")
    else
        summary+=("Python $version: FAILED (pytest exit status $rc)"); failed=1
    fi
}

AGSPEED_REQUIRE_TORCH=1 run_suite 3.11 .venv 1 "$@"
run_suite 3.12 .venv-3.12 0 -m "not torch" "$@"
run_suite 3.13 .venv-3.13 0 -m "not torch" "$@"

echo "== summary ==" >&2
printf '  %s\n' "${summary[@]}" >&2
exit "$failed"
