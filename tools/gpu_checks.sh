#!/usr/bin/env bash
# cuvmap's checks on a machine with an NVIDIA GPU, in two parts that each fit a
# 10-minute command (about 6 minutes each on an H200 with cold caches):
#   bash tools/gpu_checks.sh tests      the gpu-marked tests (pytest-xdist, -n 8)
#   bash tools/gpu_checks.sh bench      the benchmarks and the main job on the GPU
# Each part writes at most 3 files into $OUT (default ./gpu-results): summary.txt (a
# timestamp and the outcome of every step), and one tarball of the step logs.
# First run tools/gpu_wheels.sh here: wheels the GPU machine lacks (optree) travel in .whl/
# and are installed into /tmp/site. CuPy and the nvidia-cudnn wheel must be importable.
# Every step runs under `timeout`; the script exits non-zero when any step failed.
#   GPU_CHECKS_TESTS      what pytest runs (default: tests)
#   GPU_CHECKS_WORKERS    pytest-xdist workers (default: 8)
set -uo pipefail
part="${1:-}"
case "$part" in tests|bench) ;; *) echo "usage: bash tools/gpu_checks.sh tests|bench" >&2; exit 2 ;; esac
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
LOGS="$(mktemp -d)"
SUMMARY="$OUT/summary_$part.txt"
: > "$SUMMARY"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 CUVMAP_STRICT_CUPY=0 NCCL_SOCKET_IFNAME=lo MPLBACKEND=Agg
failed=()

note() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$SUMMARY"; }

# step NAME SECONDS COMMAND...: runs COMMAND under timeout into $LOGS/NAME.txt
step() {
    local name=$1 limit=$2; shift 2
    note "start $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" > "$LOGS/$name.txt" 2>&1
    local status=$?
    note "end $name: exit status $status after $((SECONDS - t0))s"
    [ "$status" -eq 0 ] || failed+=("$name (exit status $status$([ "$status" -eq 124 ] && echo ", timed out"))")
    return $status
}

# the first step stops everything at once when cuvmap cannot import there
if ! python3 -c "import optree" 2>/dev/null; then
    note "optree is missing on this machine: run 'bash tools/gpu_wheels.sh' on a machine with a registry,"
    note "so that .whl/ travels with the working tree, then run this script again"
    exit 3
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
step preflight 120 python3 -c "import sys, cuvmap.cuda.device as d; sys.exit(d.preflight())"
tee -a "$SUMMARY" < "$LOGS/preflight.txt"

if [ "$part" = tests ]; then
    workers=()
    python3 -c "import xdist" 2>/dev/null && workers=(-n "${GPU_CHECKS_WORKERS:-8}")
    step gpu_tests 330 python3 -m pytest -q -rfEs -m gpu -p no:cacheprovider "${workers[@]}" ${GPU_CHECKS_TESTS:-tests}
    # the failures, every skip with its reason, and pytest's summary line
    { grep -E '^(FAILED|ERROR) ' "$LOGS/gpu_tests.txt" | head -60
      grep -E '^SKIPPED ' "$LOGS/gpu_tests.txt"
      tail -1 "$LOGS/gpu_tests.txt"; } | tee -a "$SUMMARY"
else
    step bench_conv 100 python3 -m benchmarks conv --device gpu --json "$LOGS/bench_conv_gpu.json"
    step per_example 90 python3 -m benchmarks per_example --device gpu --batch 32 128 --no-plot \
        --json "$LOGS/per_example_gpu.json"
    step dp 90 python3 -m benchmarks dp --device gpu --batch 32 128 --no-plot --json "$LOGS/dp_gpu.json"
    # jit on the GPU: fused kernels and graph replay, then graphs off, then both off
    for setting in "" "CUVMAP_JIT_CUDA_GRAPHS=0" "CUVMAP_JIT_GPU_FUSION=0 CUVMAP_JIT_CUDA_GRAPHS=0"; do
        tag=$(echo "${setting:-default}" | tr ' =' '__')
        step "dispatch_$tag" 40 env $setting python3 -m benchmarks dispatch --device gpu --no-plot \
            --json "$LOGS/dispatch_gpu_$tag.json"
    done
    # the main job on the GPU, with an accuracy floor
    step main_job 60 python3 examples/dp_sgd_digits.py --device gpu
    python3 - "$LOGS/main_job.txt" <<'PY' | tee -a "$SUMMARY"
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"test accuracy ([0-9.]+)", text)
acc = float(m.group(1)) if m else 0.0
print(f"main job test accuracy {acc:.3f} (floor 0.85)")
sys.exit(0 if acc >= 0.85 else 1)
PY
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("main job accuracy floor")
    for f in "$LOGS"/*.txt; do { echo "## $(basename "$f")"; tail -25 "$f"; } >> "$SUMMARY"; done
fi

tar -czf "$OUT/gpu_$part.tar.gz" -C "$LOGS" .
if [ "${#failed[@]}" -gt 0 ]; then
    for f in "${failed[@]}"; do note "!! FAILED: $f"; done
    exit 1
fi
note "gpu_checks $part: all steps passed"
