"""The oneDNN binding (cuvmap/cpu/onednn.py): loading, batch buckets, the bounded plan
cache, threads. Every result is checked against the naive float64 loops of
tests/lax/test_conv.py or against the im2col kernels, never against oneDNN itself.

The kernels' agreement with the loops over every configuration, and every batching case
on oneDNN, are in tests/lax/test_conv.py (the ``onednn`` parametrisations).
"""
import json
import os
import subprocess
import sys
import threading
import tracemalloc

import numpy as np
import pytest

from cuvmap.cpu import onednn, openmp
from cuvmap.lax import conv_strategy
from cuvmap.lru import LRU
from cuvmap.lax import conv_gemm

from conv_references import CONFIGS, make_operands, naive_backward_weight, naive_conv, reference_conv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/this file

needs_onednn = pytest.mark.skipif(not onednn.available(), reason=f"oneDNN not loadable: {onednn.load_error()}")


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------

_SUBPROCESS = r"""
import json, sys
import numpy as np
import cuvmap
from cuvmap import lax
from cuvmap.cpu import onednn
rng = np.random.default_rng(0)
x = rng.standard_normal((3, 4, 7, 6)).astype(np.float32)
w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
out = lax.conv(x, w, stride=(2, 1), padding=1, groups=2)
np.save(sys.argv[1], out)
print(json.dumps(dict(available=onednn.available(), error=onednn.load_error(), describe=onednn.describe())))
"""


@pytest.mark.slow
@pytest.mark.parametrize("library", ["/nonexistent/libdnnl.so.3", pytest.param("libm.so.6", marks=pytest.mark.slow)],
                         ids=["missing", "not-onednn"])  # a fresh interpreter each: the second is slow
def test_a_bad_library_gives_a_clear_load_error_and_the_numpy_kernels(library, tmp_path):
    path = tmp_path / "out.npy"
    env = dict(os.environ, CUVMAP_ONEDNN_LIBRARY=library, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", _SUBPROCESS, str(path)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["available"] is False
    assert library in info["error"]
    assert ("cannot open" in info["error"] or "No such file" in info["error"]) if library.startswith("/") \
        else "not oneDNN 3" in info["error"]
    assert info["describe"].startswith("oneDNN unavailable: ")
    got = np.load(path)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    # unchanged: exactly what the im2col kernels give here, and right
    np.testing.assert_array_equal(got, conv_gemm.forward(x, w, (2, 1), (1, 1), (1, 1), 2))
    _close(got, naive_conv(x.astype(np.float64), w.astype(np.float64), (2, 1), (1, 1), (1, 1), 2))


@needs_onednn
def test_version_and_description():
    assert onednn.version().startswith("3.")
    assert onednn.describe().startswith(f"oneDNN {onednn.version()}")
    assert onednn.supports(np.float32) and not onednn.supports(np.float64)


@needs_onednn
def test_float64_is_refused_with_a_clear_error():
    x = np.ones((1, 1, 4, 4))
    with pytest.raises(onednn.OnednnError, match="operands of dtype float64; oneDNN runs float32 only"):
        onednn.forward(x, np.ones((1, 1, 2, 2)), (1, 1), (0, 0), (1, 1), 1)


# ---------------------------------------------------------------------------------------
# Batch buckets (NOTE [batch buckets])
# ---------------------------------------------------------------------------------------


def test_binary_pieces_and_buckets():
    assert onednn._binary_pieces(37) == [(0, 32), (32, 4), (36, 1)]
    assert onednn._binary_pieces(64) == [(0, 64)]
    assert onednn._binary_pieces(0) == []
    assert [conv_strategy.bucket(n) for n in (0, 1, 2, 3, 37, 64, 65)] == [1, 1, 2, 4, 64, 64, 128]
    # the groups are split only with one example
    assert [(s.start, s.stop, g0, gg) for s, g0, gg in onednn._pieces(5, 3)] == [(0, 4, 0, 3), (4, 5, 0, 3)]
    assert [(s.start, s.stop, g0, gg) for s, g0, gg in onednn._pieces(1, 6)] == [(0, 1, 0, 4), (0, 1, 4, 2)]


def _check_odd_batch(seed):
    """oneDNN's forward and both gradients of a batch of 37 (float32) against the naive
    loops and the im2col kernel (float64)."""
    rng = np.random.default_rng(seed)
    stride, padding, dilation = (1, 2), (1, 0), (1, 1)
    x = rng.standard_normal((37, 2, 6, 7))
    w = rng.standard_normal((3, 2, 3, 3))
    y = naive_conv(x, w, stride, padding, dilation, 1)
    g = rng.standard_normal(y.shape)
    f32 = lambda a: a.astype(np.float32)  # noqa: E731
    _close(onednn.forward(f32(x), f32(w), stride, padding, dilation, 1), y)
    _close(onednn.backward_weight(f32(g), f32(x), w.shape, stride, padding, dilation, 1),
           naive_backward_weight(g, x, w.shape, stride, padding, dilation, 1))
    _close(onednn.backward_input(f32(g), f32(w), x.shape, stride, padding, dilation, 1),
           conv_gemm.backward_input(g, w, x.shape, stride, padding, dilation, 1))


@needs_onednn
def test_odd_batch_sizes_run_as_power_of_two_pieces(monkeypatch):
    """N = 37 (forward, both gradients) and groups = 13 with N = 1 (the per-example weight
    gradient's layout) against the loops; the plans made are for power-of-two sizes only."""
    monkeypatch.setattr(onednn, "_plans", LRU(onednn.CACHE_SIZE))
    monkeypatch.setitem(openmp._settings, "threading", "openmp")     # the pieces of one call, unsplit
    _check_odd_batch(seed=1)
    # one example, 13 groups of 2 → 3 channels
    rng = np.random.default_rng(1)
    stride, padding, dilation = (1, 2), (1, 0), (1, 1)
    f32 = lambda a: a.astype(np.float32)  # noqa: E731
    xg = rng.standard_normal((1, 26, 6, 7))
    wg = rng.standard_normal((39, 2, 3, 3))
    yg = naive_conv(xg, wg, stride, padding, dilation, 13)
    gg = rng.standard_normal(yg.shape)
    _close(onednn.forward(f32(xg), f32(wg), stride, padding, dilation, 13), yg)
    _close(onednn.backward_weight(f32(gg), f32(xg), wg.shape, stride, padding, dilation, 13),
           naive_backward_weight(gg, xg, wg.shape, stride, padding, dilation, 13))
    layouts = [dict(key[2]) for key in onednn._plans]      # {name: (shape, strides)}
    assert {ops["x"][0][0] for ops in layouts} == {1, 4, 32}   # 37 = 32 + 4 + 1
    grouped = {ops["w"][0][0] for ops in layouts if len(ops["w"][0]) == 5}   # (G, Og, Cg, kh, kw)
    assert grouped == {8, 4}                                  # 13 = 8 + 4 + 1 (one group: ungrouped)


@needs_onednn
def test_bias_inside_the_forward_and_strided_views():
    rng = np.random.default_rng(2)
    x, w, b, params = make_operands(CONFIGS[5], rng)
    p = params
    want = reference_conv(x, w, b, params)
    got = onednn.forward(x.astype(np.float32), w.astype(np.float32), p["stride"], p["padding"], p["dilation"],
                         p["groups"], bias=b.astype(np.float32))
    _close(got, want)
    # a non-contiguous input (every other channel of a wider array) is read in place
    wide = np.zeros((x.shape[0], 2 * x.shape[1]) + x.shape[2:], np.float32)
    wide[:, ::2] = x
    view = wide[:, ::2]
    assert onednn._readable(view) is view
    _close(onednn.forward(view, w.astype(np.float32), p["stride"], p["padding"], p["dilation"], p["groups"]),
           reference_conv(x, w, None, params))
    # a reversed view is copied
    assert onednn._readable(x[:, :, ::-1].astype(np.float32)[:, :, ::-1]) is not None


# ---------------------------------------------------------------------------------------
# Beside another OpenMP user (NOTE [oneDNN beside another OpenMP user])
# ---------------------------------------------------------------------------------------

_MODE_PROBE = r"""
import ctypes, json, sys
if sys.argv[1] == "libgomp-first":
    ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)     # as torch's import does
from cuvmap.cpu import onednn
from cuvmap.cpu import openmp
print(json.dumps(dict(available=onednn.available(), mode=onednn.threading_mode(), describe=onednn.describe(),
                      spins=str(openmp.spin_seconds_in_force()))))
"""


@needs_onednn
# a fresh interpreter each: the first case by default, the others slow
@pytest.mark.slow
@pytest.mark.parametrize("order, env, mode, spins", [
    # torch's libgomp first: cuvmap joins its team, whose workers spin (libgomp's default)
    ("libgomp-first", {}, "openmp", str(openmp.DEFAULT_SPIN_SECONDS)),
    # the user's policy is the one in force
    pytest.param("libgomp-first", {"OMP_WAIT_POLICY": "ACTIVE"}, "openmp", "inf", marks=pytest.mark.slow),
    pytest.param("libgomp-first", {"GOMP_SPINCOUNT": "0"}, "openmp", "0.0", marks=pytest.mark.slow),
    pytest.param("libgomp-first", {"CUVMAP_ONEDNN_THREADING": "threads"}, "threads",
                 str(openmp.DEFAULT_SPIN_SECONDS), marks=pytest.mark.slow),
    # cuvmap loads libgomp itself, PASSIVE: nothing spins
    pytest.param("cuvmap-first", {}, "openmp", "0.0", marks=pytest.mark.slow),
    pytest.param("cuvmap-first", {"CUVMAP_ONEDNN_THREADING": "threads"}, "threads", "0.0", marks=pytest.mark.slow),
], ids=["libgomp-first", "user-policy", "user-spincount", "forced-threads", "cuvmap-first", "cuvmap-first-threads"])
def test_the_threading_mode_follows_who_loaded_openmp(order, env, mode, spins):
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "CUVMAP_ONEDNN_THREADING")}
    proc = subprocess.run([sys.executable, "-c", _MODE_PROBE, order], env=dict(base, PYTHONPATH=ROOT, **env),
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["available"] and info["mode"] == mode and info["spins"] == spins, info
    assert ("cuvmap's threads" in info["describe"]) == (mode == "threads"), info["describe"]


@needs_onednn
def test_the_threads_mode_splits_each_call_over_cuvmaps_threads(monkeypatch):
    """In the "threads" mode the examples (or, with one example, the groups) are split in
    one chunk per OpenMP thread of the caller, run on cuvmap's threads with OpenMP
    single-threaded; the results equal the loops', the weight gradient sums its chunks, and
    the calling thread's OpenMP thread count is left as it was."""
    monkeypatch.setitem(openmp._settings, "threading", "threads")
    get, set_ = onednn.openmp_functions()
    before = get()
    set_(2)                                   # two chunks, on any machine
    ran = []
    real = onednn._run_serial

    def spy(passes, dtype, pieces, *rest, **kw):
        for op, *_ in passes:
            ran.append((op, threading.current_thread().name, get(),
                        [(p[0].start, p[0].stop, p[1], p[2]) for p in pieces]))
        return real(passes, dtype, pieces, *rest, **kw)

    monkeypatch.setattr(onednn, "_run_serial", spy)
    try:
        _check_odd_batch(seed=5)
        rng = np.random.default_rng(5)
        stride, padding, dilation = (1, 2), (1, 0), (1, 1)
        f32 = lambda a: a.astype(np.float32)  # noqa: E731
        xg = rng.standard_normal((1, 26, 6, 7))
        wg = rng.standard_normal((39, 2, 3, 3))
        gg = rng.standard_normal(naive_conv(xg, wg, stride, padding, dilation, 13).shape)
        _close(onednn.backward_weight(f32(gg), f32(xg), wg.shape, stride, padding, dilation, 13),
               naive_backward_weight(gg, xg, wg.shape, stride, padding, dilation, 13))
        assert get() == 2
    finally:
        set_(before)
    assert all(name.startswith("cuvmap-onednn") and threads == 1 for _, name, threads, _ in ran), ran
    by_op = {}
    for op, _, _, pieces in ran:
        by_op.setdefault(op, []).append(pieces)
    # 37 examples: 18 + 19, each in power-of-two pieces; 13 groups of one example: 6 + 7
    halves = sorted([[(0, 16, 0, 1), (16, 18, 0, 1)], [(18, 34, 0, 1), (34, 36, 0, 1), (36, 37, 0, 1)]])
    assert sorted(by_op["forward"]) == halves and sorted(by_op["backward_input"]) == halves
    assert sorted(by_op["backward_weight"][:2]) == halves
    assert sorted(by_op["backward_weight"][2:]) == [[(0, 1, 0, 4), (0, 1, 4, 2)], [(0, 1, 6, 4), (0, 1, 10, 2),
                                                                                 (0, 1, 12, 1)]]


# ---------------------------------------------------------------------------------------
# The plan cache: bounded, nothing leaked
# ---------------------------------------------------------------------------------------


def _rss_mib():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


@needs_onednn
def test_cached_plans_name_each_plans_op_shapes_and_implementation():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    onednn.forward(x, w, (1, 1), (0, 0), (1, 1), 1)
    mine = [(op, shapes, d) for op, shapes, d in onednn.cached_plans()
            if op == "forward" and shapes["x"] == (2, 3, 9, 9) and shapes["y"] == (2, 5, 7, 7)]
    assert mine, onednn.cached_plans()
    assert all(shapes["w"][-2:] == (3, 3) and "reorders of" in d for _, shapes, d in mine), mine


@pytest.mark.slow
@needs_onednn
def test_the_plan_cache_is_bounded_and_leaks_nothing(monkeypatch):
    """Many shapes through an LRU of 8 plans: the cache stays at its bound, evicted plans
    are freed (oneDNN's own primitive cache is off), and neither the process's memory nor
    Python's allocations grow with the number of shapes."""
    monkeypatch.setattr(onednn, "_plans", LRU(8))
    monkeypatch.setitem(openmp._settings, "threading", "openmp")     # one plan per shape
    rng = np.random.default_rng(3)

    def run(i):
        c, o, hw = 1 + i % 5, 2 + (i // 5) % 7, 6 + (i // 35) % 12
        x = rng.standard_normal((2, c, hw, hw)).astype(np.float32)
        w = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
        _close(onednn.forward(x, w, (1, 1), (1, 1), (1, 1), 1),   # against the im2col kernels, fast enough here
               conv_gemm.forward(x.astype(np.float64), w.astype(np.float64), (1, 1), (1, 1), (1, 1), 1))
        assert onednn.cache_info()["size"] <= 8

    for i in range(40):   # warm: the arena and the allocator reach their working size
        run(i)
    before = onednn.cache_info()
    rss0 = _rss_mib()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    for i in range(40, 340):
        run(i)
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    info = onednn.cache_info()
    assert info["size"] == 8 and info["created"] - before["created"] == 300
    assert info["evicted"] - before["evicted"] == 300
    # a leak of ~20 KiB a plan (oneDNN's own cache keeping them) would be 6 MiB here
    assert _rss_mib() - rss0 < 2.0, f"RSS grew {_rss_mib() - rss0:.1f} MiB over 300 evicted plans"
    assert grown < 256 * 1024, f"Python allocations grew {grown} bytes"


# ---------------------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------------------


@needs_onednn
def test_two_threads_running_convolutions_at_once():
    """Two threads, each its own stream and arena, running the same primitives (one
    shape) and different ones concurrently: every result equals the loops'."""
    rng = np.random.default_rng(4)
    cases = []
    for cfg in (CONFIGS[3], CONFIGS[5]):
        x, w, b, params = make_operands(cfg, rng)
        p = params
        cases.append(((x.astype(np.float32), w.astype(np.float32), p["stride"], p["padding"], p["dilation"],
                       p["groups"]), reference_conv(x, w, None, params)))
    errors = []
    barrier = threading.Barrier(2)

    def worker(order):
        try:
            barrier.wait()
            for _ in range(30):
                for i in order:
                    args, want = cases[i]
                    _close(onednn.forward(*args), want)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(order,)) for order in ((0, 1), (1, 0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
