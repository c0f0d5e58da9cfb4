#!/usr/bin/env bash
# Runs cuvmap's GPU tests and benchmarks in one go on a machine with an NVIDIA GPU.
#   bash tools/gpu_checks.sh            (writes logs to $OUT, or to ./gpu-results)
# Wheels missing there (e.g. optree) can be put in .whl/ beforehand; they are installed
# into /tmp/site first. CuPy and the nvidia-cudnn wheel must already be importable.
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
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import cuvmap.cuda.device as d, cuvmap.cuda.cudnn as c; print(d.describe()); print('cudnn load error:', c.load_error())"
} 2>&1 | tee "$OUT/device.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.txt" | tail -30
python3 -m benchmarks.bench_conv --device gpu --json "$OUT/bench_conv_gpu.json" 2>&1 | tee "$OUT/bench_conv_gpu.md" | tail -60
python3 -m benchmarks per_example --device gpu --batch 32 128 --json "$OUT/per_example_gpu.json" 2>&1 \
    | tee "$OUT/per_example_gpu.md" | tail -40
