# Shared set-up for scripts/*.sh (sourced, not run).  Every step is idempotent: a second
# run finds what the first one made and only rebuilds the extension.
#
# Functions:
#   ags_ensure_xxhash              install Debian's libxxhash-dev if xxhash.h is missing
#   ags_find_python VERSION        print an interpreter for VERSION (3.11, ...) or fail
#   ags_xdist_args                 print pytest's worker-process arguments for a run
#   ags_venv VERSION DIR TORCH     make DIR a venv of VERSION with the test dependencies
#                                  (TORCH=1: also torch==2.13.0, transformers and
#                                  the nvrtc wheel) and agspeed installed
#                                  in editable mode (built for that interpreter)

AGS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
AGS_TORCH_PIN="torch==2.13.0"   # always exact: a loose spec pulls a multi-GB CUDA build
AGS_TRANSFORMERS_PIN="transformers==5.23.0"  # real third-party models (benchmarks/train.py)
# libnvrtc for the fused kernels' tests (NVRTC compiles to PTX without a GPU); CUDA 13.0,
# the GPU machine's driver level, so its PTX loads there too
AGS_NVRTC_PIN="nvidia-cuda-nvrtc==13.0.88"

ags_say() { printf '[agspeed setup] %s\n' "$*" >&2; }

ags_ensure_xxhash() {
    [ -f /usr/include/xxhash.h ] && return 0
    ags_say "installing libxxhash-dev"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q libxxhash-dev >/dev/null
}

ags_find_python() {
    local want="$1" cand
    if cand=$(command -v "python$want" 2>/dev/null) \
        && "$cand" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$want'.split('.'))))" 2>/dev/null; then
        echo "$cand"; return 0
    fi
    if command -v pyenv >/dev/null 2>&1; then
        cand=$(ls -d "$(pyenv root)"/versions/"$want".*/bin/"python$want" 2>/dev/null \
            | sort -V | tail -n 1 || true)
        if [ -n "$cand" ] && [ -x "$cand" ]; then echo "$cand"; return 0; fi
    fi
    return 1
}

# pytest's arguments for a test run: its files spread over worker processes
# (pytest-xdist; a file's tests stay on one worker, in order, so the models and compiled
# artifacts a module shares are made once).  AGSPEED_TEST_WORKERS workers, else one a
# core and at most four (each multi-process training test starts two ranks of its own);
# one means a single process, without xdist.
ags_xdist_args() {
    local n="${AGSPEED_TEST_WORKERS:-}"
    if [ -z "$n" ]; then
        n=$(nproc 2>/dev/null || echo 1)
        [ "$n" -gt 4 ] && n=4
    fi
    [ "$n" -gt 1 ] && echo "-n $n --dist loadfile"
    return 0
}

ags_venv() {
    local version="$1" dir="$AGS_ROOT/$2" torch="$3" py
    py=$(ags_find_python "$version") || { ags_say "no Python $version found"; return 1; }
    if [ -d "$dir" ] && ! "$dir/bin/python" -c "import sys" >/dev/null 2>&1; then
        ags_say "$2 is broken: recreating"; rm -rf "$dir"
    fi
    if [ ! -d "$dir" ]; then
        ags_say "creating $2 with $py"
        "$py" -m venv "$dir"
    fi
    "$dir/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
    "$dir/bin/python" -m pip install -q --disable-pip-version-check pytest pytest-xdist \
        numpy tqdm platformdirs filelock
    if [ "$torch" = 1 ] && ! "$dir/bin/python" -c \
        "import torch, sys; sys.exit(not torch.__version__.startswith('2.13.0'))" >/dev/null 2>&1; then
        ags_say "installing $AGS_TORCH_PIN into $2"
        "$dir/bin/python" -m pip install -q --disable-pip-version-check "$AGS_TORCH_PIN"
    fi
    if [ "$torch" = 1 ] && ! "$dir/bin/python" -c \
        "import transformers, sys; sys.exit(transformers.__version__ != '${AGS_TRANSFORMERS_PIN#*==}')" \
        >/dev/null 2>&1; then
        ags_say "installing $AGS_TRANSFORMERS_PIN into $2"
        # with the torch pin in the same command, so pip cannot swap torch for a CUDA build
        "$dir/bin/python" -m pip install -q --disable-pip-version-check \
            "$AGS_TRANSFORMERS_PIN" "$AGS_TORCH_PIN"
    fi
    if [ "$torch" = 1 ] && ! "$dir/bin/python" -m pip show -q nvidia-cuda-nvrtc \
        >/dev/null 2>&1; then
        ags_say "installing $AGS_NVRTC_PIN into $2"
        "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
            "$AGS_NVRTC_PIN"
    fi
    ags_ensure_xxhash
    ags_say "building agspeed for Python $version${AGSPEED_DEBUG:+ (AGSPEED_DEBUG=$AGSPEED_DEBUG)}"
    # The in-place extension is shared by every editable install of this interpreter
    # version: remove it so a debug build never survives into a normal one, or back.
    local suffix
    suffix=$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
    rm -f "$AGS_ROOT/agspeed/_C$suffix"
    rm -rf "$AGS_ROOT/build"/temp.*-"$("$dir/bin/python" -c 'import sys; print(sys.implementation.cache_tag)')"
    local log="$dir/agspeed-build.log"
    if ! (cd "$AGS_ROOT" && "$dir/bin/python" -m pip install --disable-pip-version-check \
            --no-build-isolation -e .) >"$log" 2>&1; then
        cat "$log" >&2
        ags_say "build failed (log above, kept in $log)"
        return 1
    fi
}
