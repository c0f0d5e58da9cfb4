#!/usr/bin/env bash
# Runs cuvmap's GPU tests and benchmarks in one go on a machine with an NVIDIA GPU.
#   bash tools/gpu_checks.sh            (writes logs to $OUT, or to ./gpu-results)
# Wheels missing there (e.g. optree) can be put in .whl/ beforehand; they are installed
# into /tmp/site first. CuPy and the nvidia-cudnn wheel must already be importable.
#
# Every step runs, and the script exits non-zero when any failed: a cuDNN that did not
# load (the banner names load_error()), failing or erroring GPU tests (pytest's own exit
# status), or a benchmark that crashed. Every skipped test is listed with its reason.
#   GPU_CHECKS_TESTS    what pytest runs (default: tests)
#   GPU_CHECKS_BENCH=0  skips the benchmarks
set -uo pipefail
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
# the tests run on the real CuPy here, never on the strict CPU stand-in (tests/strict_cupy)
export CUVMAP_STRICT_CUPY=0
failed=()

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/device.txt"
python3 -c "import sys, cuvmap.cuda.device as d; sys.exit(d.preflight())" 2>&1 | tee -a "$OUT/device.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("cuDNN unavailable (see the banner above and $OUT/device.txt)")

python3 -m pytest -rfEs -m gpu -p no:cacheprovider ${GPU_CHECKS_TESTS:-tests} > "$OUT/gpu_tests.txt" 2>&1
status=$?
# the failures, then every skip with its reason, then pytest's summary line
grep -E '^(FAILED|ERROR) ' "$OUT/gpu_tests.txt" | head -40
grep -E '^SKIPPED ' "$OUT/gpu_tests.txt"
tail -1 "$OUT/gpu_tests.txt"
[ "$status" -eq 0 ] || failed+=("GPU tests (pytest exit status $status; $OUT/gpu_tests.txt)")

if [ "${GPU_CHECKS_BENCH:-1}" != 0 ]; then
    python3 -m benchmarks.bench_conv --device gpu --json "$OUT/bench_conv_gpu.json" 2>&1 | tee "$OUT/bench_conv_gpu.md" | tail -60
    status=${PIPESTATUS[0]}
    [ "$status" -eq 0 ] || failed+=("benchmarks.bench_conv (exit status $status)")
    python3 -m benchmarks per_example --device gpu --batch 32 128 --json "$OUT/per_example_gpu.json" 2>&1 \
        | tee "$OUT/per_example_gpu.md" | tail -40
    status=${PIPESTATUS[0]}
    [ "$status" -eq 0 ] || failed+=("benchmarks per_example (exit status $status)")
    python3 -m benchmarks dp --device gpu --batch 32 128 512 --json "$OUT/dp_gpu.json" 2>&1 \
        | tee "$OUT/dp_gpu.md" | tail -45
    status=${PIPESTATUS[0]}
    [ "$status" -eq 0 ] || failed+=("benchmarks dp (exit status $status)")
    # jit on the GPU: fused kernels and graph replay, then each switched off (the jit rows
    # of the three tables, side by side, say what fusion and graphs gain)
    for setting in "" "CUVMAP_JIT_CUDA_GRAPHS=0" "CUVMAP_JIT_GPU_FUSION=0 CUVMAP_JIT_CUDA_GRAPHS=0"; do
        tag=$(echo "${setting:-default}" | tr ' =' '__')
        echo "## dispatch on the GPU, ${setting:-fusion and graphs on}"
        env $setting python3 -m benchmarks dispatch --device gpu --json "$OUT/dispatch_gpu_$tag.json" 2>&1 \
            | tee "$OUT/dispatch_gpu_$tag.md" | grep -E '^\| (cupy|jit)'
        status=${PIPESTATUS[0]}
        [ "$status" -eq 0 ] || failed+=("benchmarks dispatch --device gpu with ${setting:-defaults} (exit status $status)")
    done
fi

if [ "${#failed[@]}" -gt 0 ]; then
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    for f in "${failed[@]}"; do echo "!! FAILED: $f"; done
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    exit 1
fi
echo "gpu_checks: all steps passed"
