#!/usr/bin/env bash
# Build agspeed and run the GPU checks on a machine with CUDA and torch but no network:
# the CUDA tests, the full test suite, the demo on CUDA and the CUDA benchmarks (stages
# below).  xxHash comes from the Debian packages in .deb/ (apt-get download
# libxxhash-dev libxxhash0), unpacked under /tmp/xx.  Logs and results go to $OUT
# (default: gpu-out/).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT" /tmp/xx
PY=${PY:-python3}
for f in .deb/*.deb; do dpkg -x "$f" /tmp/xx; done
export XXHASH_PREFIX=/tmp/xx/usr
ln -sf /tmp/xx/usr/lib/x86_64-linux-gnu/libxxhash.so.0 /tmp/xx/usr/lib/libxxhash.so
export LD_LIBRARY_PATH=/tmp/xx/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export LIBRARY_PATH=/tmp/xx/usr/lib/x86_64-linux-gnu:${LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
"$PY" -c "import torch,sys; print(sys.version, torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
# a complete package (agspeed, agspeed.guards, agspeed.backends, _C) outside the tree,
# imported through PYTHONPATH; tests run from /tmp so the source folder cannot shadow it
"$PY" setup.py -q build --build-base /tmp/agsbuild --build-lib /tmp/agslib >"$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/agslib
ROOT=$PWD
# each stage stops after GPU_STAGE_TIMEOUT seconds (default 600; GPU_TIMEOUT_<stage> for
# one stage, GPU_TIMEOUT_kernels=120 say); the test stages spread
# over GPU_WORKERS pytest-xdist processes where xdist is installed (default 8)
LIMIT=${GPU_STAGE_TIMEOUT:-600}
XDIST=()
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n "${GPU_WORKERS:-8}")
# stages, in order (GPU_STAGES picks some): kernels (the nvrtc kernels and models on the
# GPU), cuda (the other CUDA tests; GPU_CUDA_K narrows them, a pytest -k expression),
# suite (every test),
# demo (scripts/demo.py on CUDA, with DEMO_ARGS), bench (guard and dispatch benchmarks),
# nvrtc (benchmarks/nvrtc.py: the fused kernels' bandwidth and graphs, with NVRTC_ARGS:
# --parts bandwidth,memory say), train (benchmarks/train.py on CUDA, with TRAIN_ARGS),
# cpu (the guard benchmark on this host's CPU)
STAGES=${GPU_STAGES:-kernels cuda suite demo bench nvrtc cpu}
[ "${GPU_QUICK:-0}" = 1 ] && STAGES="kernels cuda"
rc=0
for stage in $STAGES; do
    echo "== $stage =="
    v=GPU_TIMEOUT_$stage
    lim=${!v:-$LIMIT}
    case $stage in
    kernels) (cd /tmp && timeout "$lim" "$PY" -m pytest -q -rfE --tb=short -p no:cacheprovider \
              "$ROOT/tests/backends/test_nvrtc_cuda.py") 2>&1 | tee "$OUT/test_nvrtc.log" \
              | tail -15 || rc=1 ;;
    cuda) (cd /tmp && timeout "$lim" "$PY" -m pytest -q -rfE --tb=short -p no:cacheprovider \
              "${XDIST[@]}" "$ROOT/tests/backends/test_cuda.py" "$ROOT/tests/training" \
              -k "${GPU_CUDA_K:-cuda}") 2>&1 | tee "$OUT/test_cuda.log" | tail -15 || rc=1 ;;
    suite) (cd /tmp && timeout "$lim" "$PY" -m pytest -q -rfE --tb=short -p no:cacheprovider \
              "${XDIST[@]}" "$ROOT/tests") 2>&1 | tee "$OUT/tests.log" | tail -15 || rc=1 ;;
    # shellcheck disable=SC2086
    demo) timeout "$lim" "$PY" scripts/demo.py --device cuda ${DEMO_ARGS:-} 2>&1 \
              | tee "$OUT/demo.log" | tail -30 || rc=1 ;;
    bench) "$PY" benchmarks/hit_scaling.py --device cuda --out "$OUT/hit_scaling_cuda.json" 2>&1 | tail -12 || rc=1
           "$PY" benchmarks/dispatch.py --device cuda --out "$OUT/dispatch_cuda.json" 2>&1 | tail -10 || rc=1 ;;
    train) # shellcheck disable=SC2086
           timeout "$lim" "$PY" benchmarks/train.py --device cuda --out "$OUT/train_cuda.json" ${TRAIN_ARGS:-} 2>&1 \
              | tee "$OUT/train.log" | tail -40 || rc=1 ;;
    # shellcheck disable=SC2086
    nvrtc) timeout "$lim" "$PY" benchmarks/nvrtc.py --device cuda --out "$OUT/nvrtc_cuda.json" \
              ${NVRTC_ARGS:-} 2>&1 \
              | tee "$OUT/nvrtc.log" | tail -25 || rc=1 ;;
    # Python 3.12 here, so the guard's structure memo runs on watchers
    cpu) "$PY" benchmarks/hit_scaling.py --out "$OUT/hit_scaling_py312.json" 2>&1 | tail -12 || rc=1 ;;
    *) echo "unknown stage $stage"; rc=1 ;;
    esac
done
exit $rc
