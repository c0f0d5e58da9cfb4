#!/usr/bin/env bash
# cuvmap's checks on a machine with an NVIDIA GPU, sized for a device lent for 15 minutes
# (start-up included) and 10 minutes a command:
#   bash tools/gpu_checks.sh [tests]   the first check, ONE call of at most 7 minutes: the
#                                      GPU preflight, the smoke test with the device-side
#                                      bounds check and again with the host-side one
#                                      (CUVMAP_DEVICE_BOUNDS_CHECK=0), the gpu-marked tests
#   bash tools/gpu_checks.sh bench     a second, optional call: the benchmarks and the main job
# Every step runs under `timeout` (its limit below), and the whole script under
# `timeout ${GPU_CHECKS_LIMIT:-540}` (it starts itself under it), below the 600 s a command
# may run. What comes back is written as it goes: $OUT/summary_<part>.txt (a timestamp and
# the outcome of every step, appended at once) and $OUT/logs/<step>.txt (each step's output,
# written while it runs); on exit, however the script ends (a failure, its own time limit,
# a TERM), a trap writes $OUT/gpu_<part>.tar.gz: the summary, the logs and the JSON results.
# At most 8 files come back from a device call: the tests part writes at most 7, the bench part 8.
# The per-test time limit is pytest-timeout's (GPU_CHECKS_TEST_TIMEOUT seconds); where the
# image lacks it (or optree, or hypothesis), run tools/gpu_wheels.sh first: its wheels
# travel in .whl/ (name it in the device call's carry) and are installed into /tmp/site.
#   GPU_CHECKS_TESTS          what pytest runs (default: tests)
#   GPU_CHECKS_WORKERS        pytest-xdist workers (default: 8)
#   GPU_CHECKS_TEST_TIMEOUT   seconds per test (default: 120)
#   GPU_CHECKS_LIMIT          seconds for the whole script (default: 540)
#   CUVMAP_STRICT_CUPY        0 on a GPU (the default here); 1 runs it all on the strict
#                             CuPy stand-in of tests/strict_cupy (how CI checks this script)
set -uo pipefail
part="${1:-tests}"
case "$part" in tests|bench) ;; *) echo "usage: bash tools/gpu_checks.sh [tests|bench]" >&2; exit 2 ;; esac

# the whole script under timeout: this process starts itself again as timeout's child
if [ -z "${GPU_CHECKS_TIMED:-}" ]; then
    export GPU_CHECKS_TIMED=1
    exec timeout --kill-after=15 "${GPU_CHECKS_LIMIT:-540}" bash "$0" "$@"
fi

OUT="${OUT:-gpu-results}"
mkdir -p "$OUT/logs"
WORK="$(mktemp -d)"   # the JSON results (they travel in the archive)
SUMMARY="$OUT/summary_$part.txt"
ARCHIVE="$OUT/gpu_$part.tar.gz"
: > "$SUMMARY"
failed=()
current=""       # the process group of the step running now
current_name=""

note() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$SUMMARY"; }

finish() {
    local status=$?
    trap - EXIT
    trap '' TERM INT   # (a late TERM must not cut the summary or the archive: see stopped)
    if [ "${#failed[@]}" -gt 0 ]; then
        for f in "${failed[@]}"; do note "!! FAILED: $f"; done
        [ "$status" -eq 0 ] && status=1
    elif [ "$status" -eq 0 ]; then
        note "gpu_checks $part: all steps passed"
    fi
    tar -czf "$ARCHIVE" -C "$OUT" "summary_$part.txt" logs -C "$WORK" . 2>/dev/null \
        || tar -czf "$ARCHIVE" -C "$OUT" "summary_$part.txt" logs
    rm -rf "$WORK"
    exit "$status"
}

stopped() {   # TERM from the script's own timeout (or the caller): stop the step, keep what came
    # Further TERMs are ignored, not reset to the default: timeout signals the script and
    # then its whole process group, and on a loaded machine the second signal can arrive
    # while this trap runs, killing the date and tee of the note below (its line lost) or
    # the script before its archive. Ignored signals stay ignored in the trap's children.
    trap '' TERM INT
    if [ -n "$current" ]; then
        kill -TERM -- "-$current" 2>/dev/null
        failed+=("$current_name (stopped: the script's time limit of ${GPU_CHECKS_LIMIT:-540}s was reached)")
    fi
    note "stopped by a signal during ${current_name:-no step}: the steps after it did not run"
    exit 124
}
trap finish EXIT
trap stopped TERM INT

# step NAME SECONDS COMMAND...: COMMAND under `timeout SECONDS`, its output into
# $OUT/logs/NAME.txt as it runs; its exit status is noted and returned
step() {
    local name=$1 limit=$2; shift 2
    note "start $name (limit ${limit}s)"
    local t0=$SECONDS status
    # (timeout makes its own process group: the trap stops the whole step by it)
    timeout --kill-after=10 "$limit" "$@" > "$OUT/logs/$name.txt" 2>&1 &
    current=$!
    current_name=$name
    wait "$current"
    status=$?
    current=""
    note "end $name: exit status $status after $((SECONDS - t0))s"
    [ "$status" -eq 0 ] || failed+=("$name (exit status $status$([ "$status" -eq 124 ] && echo ", timed out"))")
    return "$status"
}

if ls .whl/*.whl >/dev/null 2>&1; then
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl > "$OUT/logs/wheels.txt" 2>&1; then
        export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    else
        note "the wheels of .whl/ did not install here (another Python?): see logs/wheels.txt"
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    fi
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 CUVMAP_STRICT_CUPY="${CUVMAP_STRICT_CUPY:-0}" NCCL_SOCKET_IFNAME=lo MPLBACKEND=Agg

# the first step stops everything at once when cuvmap cannot import there
if ! python3 -c "import optree" 2>/dev/null; then
    note "optree is missing on this machine: run 'bash tools/gpu_wheels.sh' on a machine with a registry,"
    note "so that .whl/ travels with the working tree, then run this script again"
    exit 3
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
note "CUVMAP_STRICT_CUPY=$CUVMAP_STRICT_CUPY (1: the strict CPU stand-in, not a GPU)"

if [ "$part" = tests ]; then
    step preflight 45 python3 tools/gpu_smoke.py --preflight
    tee -a "$SUMMARY" < "$OUT/logs/preflight.txt"
    # the smoke test both ways: the bounds check on the device (pinned mapped memory), then on
    # the host, in case the device's sandbox refuses mapped pinned memory
    step smoke_device_check 60 python3 tools/gpu_smoke.py
    tail -3 "$OUT/logs/smoke_device_check.txt" | tee -a "$SUMMARY"
    step smoke_host_check 60 env CUVMAP_DEVICE_BOUNDS_CHECK=0 python3 tools/gpu_smoke.py
    tail -3 "$OUT/logs/smoke_host_check.txt" | tee -a "$SUMMARY"
    args=(-rfEs -m gpu -p no:cacheprovider)   # (setup.cfg's addopts: -q)
    python3 -c "import xdist" 2>/dev/null && args+=(-n "${GPU_CHECKS_WORKERS:-8}")
    if python3 -c "import pytest_timeout" 2>/dev/null; then
        args+=(--timeout="${GPU_CHECKS_TEST_TIMEOUT:-120}")
        note "per-test time limit: ${GPU_CHECKS_TEST_TIMEOUT:-120}s (pytest-timeout)"
    else
        note "!! pytest-timeout is missing: no per-test time limit (bash tools/gpu_wheels.sh brings it in .whl/)"
    fi
    # shellcheck disable=SC2086 - GPU_CHECKS_TESTS may name several paths
    step gpu_tests 240 python3 -m pytest "${args[@]}" ${GPU_CHECKS_TESTS:-tests}
    # the failures, every skip with its reason, and pytest's summary line
    { grep -E '^(FAILED|ERROR) ' "$OUT/logs/gpu_tests.txt" | head -60
      grep -E '^SKIPPED ' "$OUT/logs/gpu_tests.txt"
      tail -1 "$OUT/logs/gpu_tests.txt"; } | tee -a "$SUMMARY"
else
    step bench_conv 100 python3 -m benchmarks conv --device gpu --json "$WORK/bench_conv_gpu.json"
    step per_example 90 python3 -m benchmarks per_example --device gpu --batch 32 128 --no-plot \
        --json "$WORK/per_example_gpu.json"
    step dp 90 python3 -m benchmarks dp --device gpu --batch 32 128 --no-plot --json "$WORK/dp_gpu.json"
    # jit on the GPU: fused kernels and graph replay, then graphs off, then both off (one step)
    step dispatch 120 bash -c 'for setting in "" "CUVMAP_JIT_CUDA_GRAPHS=0" \
            "CUVMAP_JIT_GPU_FUSION=0 CUVMAP_JIT_CUDA_GRAPHS=0"; do
        tag=$(echo "${setting:-default}" | tr " =" "__"); echo "## $tag"
        env $setting python3 -m benchmarks dispatch --device gpu --no-plot --json "$0/dispatch_gpu_$tag.json" \
            || exit 1; done' "$WORK"
    # the main job on the GPU, with an accuracy floor
    step main_job 60 python3 examples/dp_sgd_digits.py --device gpu
    python3 - "$OUT/logs/main_job.txt" <<'PY' | tee -a "$SUMMARY"
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"test accuracy ([0-9.]+)", text)
acc = float(m.group(1)) if m else 0.0
print(f"main job test accuracy {acc:.3f} (floor 0.85)")
sys.exit(0 if acc >= 0.85 else 1)
PY
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("main job accuracy floor")
fi
