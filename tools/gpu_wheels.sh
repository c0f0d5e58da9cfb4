#!/usr/bin/env bash
# Downloads here, into .whl/, the wheels that the GPU machine lacks, for its Python 3.12
# on manylinux x86-64: nothing installs from a registry there. .whl/ is ignored by git, so
# name it to the device tool's carry (carry=[".whl"]; 64 MiB in all with the tree). The GPU machine's image has
# CuPy 14 (cupy-cuda13x), nvidia-cudnn-cu13, NCCL, pytest, pytest-xdist, torch and JAX;
# it has lacked optree (a run-time dependency of cuvmap), the test-only hypothesis and
# pytest-timeout (tools/gpu_checks.sh's per-test time limit): their wheels travel here.
#   bash tools/gpu_wheels.sh            then run tools/gpu_checks.sh there
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download --quiet --dest .whl --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    optree hypothesis pytest-timeout
ls -l .whl
du -sh .whl
