"""The GPU path's own logic: the cuDNN binding's checks and settings, the algorithm choice
over cuDNN's perf records, operand alignment, device errors, ``check_batching``'s device
consistency and ``tools/gpu_checks.sh``.

What needs no device runs everywhere, on the real functions with NumPy arrays or with perf
records filled in as cuDNN fills them; nothing stands in for a GPU. The tests marked
``gpu`` need CuPy, a CUDA device and (most) a loadable cuDNN, and skip otherwise, with the
reason, so that ``tools/gpu_checks.sh`` lists them. Convolution results are checked
against the naive float64 loops of tests/test_conv.py.
"""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import backend, core
from cuvmap.cuda import cudnn
from cuvmap.cuda import device as cuda_device
from cuvmap.test_util import check_batching

from test_conv import naive_backward_weight, naive_conv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_gpu = pytest.mark.skipif(not backend.gpu_available(), reason="no CUDA device visible to CuPy")


def _needs_cudnn():
    if not cudnn.available():
        pytest.skip(f"cuDNN not loadable: {cudnn.load_error()}")


def _perfs(*records):
    """``AlgoPerf`` records as cuDNN fills them: ``(algo, status, memory, mathType)``."""
    perfs = (cudnn.AlgoPerf * len(records))()
    for p, (algo, status, memory, math) in zip(perfs, records):
        p.algo, p.status, p.memory, p.mathType, p.time = algo, status, memory, math, 0.1 * algo
    return perfs[:len(records)]


MiB = 2**20
FAILED = 3000   # CUDNN_STATUS_NOT_SUPPORTED in cuDNN 9's numbering: anything but success


# ---------------------------------------------------------------------------------------
# check_batching keeps every leaf on its own device
# ---------------------------------------------------------------------------------------


def _recording(seen):
    def f(x, p, w):
        if not any(isinstance(a, core.Tracer) for a in (x, p["a"], p["b"], w)):   # the loop's calls
            seen.append((x, p, w))
        return x * p["a"] + (p["b"] * w).sum()

    return f


def test_check_batching_gives_the_loop_the_arrays_it_was_given():
    """Mapped leaves reach the loop as arrays of their own kind — a 0-d example included,
    not as a NumPy scalar — and unmapped leaves as the very objects given."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal(3)                   # each example is 0-d
    p = {"a": rng.standard_normal((3, 2)), "b": rng.standard_normal((4,))}
    w = rng.standard_normal(4)
    seen = []
    check_batching(_recording(seen), (xs, p, w), in_axes=(0, None, None))
    assert len(seen) == 3
    for b, (x, q, w_seen) in enumerate(seen):
        assert type(x) is np.ndarray and x.shape == () and x == xs[b]
        assert q is p and w_seen is w
    seen.clear()
    check_batching(_recording(seen), (xs[:0], {"a": p["a"][:0], "b": np.zeros((0, 4))}, w), in_axes=(0, 0, None))
    ((x, q, w_seen),) = seen                      # size 0: one all-zeros example for the template
    assert type(x) is type(q["a"]) is type(q["b"]) is np.ndarray and w_seen is w
    assert x.shape == () and q["a"].shape == (2,) and q["b"].shape == (4,)


def test_check_batching_with_an_unmapped_output():
    xs, w = np.arange(6.0).reshape(3, 2), np.arange(4.0)
    check_batching(lambda x, w: (x * 2, w + 1), (xs, w), in_axes=(0, None), out_axes=(0, None))


# ---------------------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------------------

@needs_gpu
@pytest.mark.gpu
def test_check_batching_keeps_every_leaf_on_the_gpu():
    """On the GPU the loop computes on the GPU: mapped examples are CuPy arrays, unmapped
    leaves the CuPy arrays given (the old check_batching gave NumPy examples beside CuPy
    unmapped leaves, and the ops failed on the mix)."""
    import cupy

    rng = np.random.default_rng(6)
    xs = cupy.asarray(rng.standard_normal(3))
    p = {"a": cupy.asarray(rng.standard_normal((3, 2))), "b": cupy.asarray(rng.standard_normal(4))}
    w = cupy.asarray(rng.standard_normal(4))
    seen = []
    check_batching(_recording(seen), (xs, p, w), in_axes=(0, None, None))
    assert len(seen) == 3
    for x, q, w_seen in seen:
        assert type(x) is cupy.ndarray and x.shape == () and q is p and w_seen is w
    seen.clear()
    pm = {"a": p["a"], "b": cupy.asarray(rng.standard_normal((3, 4)))}
    check_batching(_recording(seen), (xs, pm, w), in_axes=(0, 0, None))
    assert len(seen) == 3
    for x, q, w_seen in seen:
        assert all(type(a) is cupy.ndarray for a in (x, q["a"], q["b"])) and w_seen is w
