"""oneDNN's matmul for the GEMMs of a process whose OpenMP team spins (NOTE [GEMMs on the
spinning team] in cuvmap/cpu/onednn_matmul.py): its products against NumPy's, its bits
on one thread or two and per row, which products take it, and the decision per process."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import cuvmap as cv
from cuvmap.cpu import onednn, onednn_matmul, openmp
from cuvmap.cpu.threads import MIN_PARALLEL_MNK

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_onednn = pytest.mark.skipif(not onednn.available(), reason=f"oneDNN not loadable: {onednn.load_error()}")


@pytest.fixture
def team():
    """This process's GEMMs on oneDNN's matmul, for the test only."""
    previous = onednn_matmul.set_team_gemms(True)
    yield
    onednn_matmul.set_team_gemms(previous)


def _operands(rng, m, k, n, a_t, b_t):
    a = rng.standard_normal((k, m) if a_t else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if b_t else (k, n)).astype(np.float32)
    return (a.T if a_t else a), (b.T if b_t else b)


# (m, k, n): the benchmark CNN's dense layer and its two gradients, square, skinny, odd
SHAPES = [(128, 12800, 10), (128, 10, 12800), (10, 128, 12800), (256, 256, 256), (37, 1000, 3), (1, 4096, 129)]


@needs_onednn
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["ab", "aTb", "abT", "aTbT"])
@pytest.mark.parametrize("m,k,n", SHAPES, ids=str)
def test_matmul_matches_numpy_in_every_layout(m, k, n, a_t, b_t):
    rng = np.random.default_rng(m * 7 + k + n)
    a, b = _operands(rng, m, k, n, a_t, b_t)
    assert onednn_matmul.usable(a, b)
    got = onednn_matmul.matmul(a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert got.dtype == np.float32 and got.flags.c_contiguous and got.shape == (m, n)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


@needs_onednn
@pytest.mark.parametrize("m,k,n", SHAPES[:3], ids=str)
def test_matmul_bits_do_not_depend_on_threads_or_rows(m, k, n):
    """The same bits on one OpenMP thread or two, and a row's bits whatever the rows beside
    it: the choice of threads (the busy-machine rule) and of batch never shows."""
    rng = np.random.default_rng(3)
    a, b = _operands(rng, m, k, n, False, False)
    get, set_ = openmp.functions()
    two = onednn_matmul.matmul(a, b)
    if get is not None:
        before = get()
        set_(1)
        try:
            one = onednn_matmul.matmul(a, b)
        finally:
            set_(before)
        np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(onednn_matmul.matmul(a[:1], b), two[:1])
    np.testing.assert_array_equal(onednn_matmul.matmul(a[3:], b), two[3:])


def test_which_products_take_onednn(team, monkeypatch):
    """float32 matrices from MIN_PARALLEL_MNK multiply-adds; float64, small products and
    stride-0 views stay on NumPy."""
    calls = []
    monkeypatch.setattr(onednn_matmul, "matmul", lambda a, b: calls.append(a.shape) or a @ b)
    rng = np.random.default_rng(4)
    big = (rng.standard_normal((128, 12800)).astype(np.float32), rng.standard_normal((12800, 10)).astype(np.float32))
    assert 128 * 12800 * 10 >= MIN_PARALLEL_MNK
    onednn_matmul.product(*big)
    assert calls == [(128, 12800)]
    onednn_matmul.product(big[0].astype(np.float64), big[1].astype(np.float64))
    onednn_matmul.product(big[0][:2, :100], big[1][:100])
    onednn_matmul.product(np.broadcast_to(big[0][:1], (128, 12800)), big[1])
    assert calls == [(128, 12800)]
    onednn_matmul.set_team_gemms(False)
    onednn_matmul.product(*big)
    assert calls == [(128, 12800)]


@needs_onednn
def test_a_staged_program_gives_the_eager_bits_on_the_team(team):
    """dot_general's layouts (plain, transposed, the loop's prepared operand) all take the
    same kernel, so jit and eager agree bit for bit and call 1 equals call 2."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4096, 10)).astype(np.float32)
    x = rng.standard_normal((64, 4096)).astype(np.float32)

    def loss(w, x):
        return cv.numpy.sum(cv.numpy.tanh(x @ w) ** 2)

    eager = cv.grad(loss)(w, x)
    jitted = cv.jit(cv.grad(loss))
    first, second = jitted(w, x), jitted(w, x)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(eager))
    np.testing.assert_array_equal(np.asarray(second), np.asarray(first))
    want = x.T.astype(np.float64) @ (2 * np.tanh(x @ w) * (1 - np.tanh(x @ w) ** 2)).astype(np.float64)
    np.testing.assert_allclose(np.asarray(eager), want, rtol=1e-3, atol=1e-3)


_DECISION_PROBE = r"""
import ctypes, json, sys
if sys.argv[1] == "libgomp-first":
    ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)     # as torch's import does
import numpy as np
import cuvmap as cv
from cuvmap.cpu import onednn_matmul
a = np.random.default_rng(0).standard_normal((128, 12800)).astype(np.float32)
b = np.random.default_rng(1).standard_normal((12800, 10)).astype(np.float32)
got = np.asarray(cv.numpy.matmul(a, b))
err = float(np.abs(got - a.astype(np.float64) @ b.astype(np.float64)).max())
print(json.dumps(dict(team=onednn_matmul.team_gemms(), err=err)))
"""


@needs_onednn
@pytest.mark.slow
@pytest.mark.parametrize("order,team", [("libgomp-first", True), ("cuvmap-first", False)])
def test_the_decision_follows_who_loaded_openmp(order, team):
    """A process where another library loaded GNU OpenMP first runs its GEMMs on oneDNN's
    matmul from its first one; a process where cuvmap loads it (PASSIVE) keeps OpenBLAS."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                                                            "CUVMAP_ONEDNN_THREADING")}
    proc = subprocess.run([sys.executable, "-c", _DECISION_PROBE, order], env=dict(env, PYTHONPATH=ROOT),
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["team"] is team and info["err"] < 1e-2, info


# ---------------------------------------------------------------------------------------
# Stacks of outer products (NOTE [outer products on the team])
# ---------------------------------------------------------------------------------------

def _with_omp_threads(n, fn):
    get, set_ = openmp.functions()
    if get is None:
        return fn()
    before = get()
    set_(n)
    try:
        return fn()
    finally:
        set_(before)


# (B, n, m): the benchmark CNN's dense gradient at batch 32, odd sizes, one example, and
# operands that are views (a transposed stack, every other row)
OUTER_CASES = {
    "cnn-dense": (lambda r: (r.standard_normal((32, 10)), r.standard_normal((32, 12800)))),
    "odd": (lambda r: (r.standard_normal((37, 3)), r.standard_normal((37, 20011)))),
    "one-example": (lambda r: (r.standard_normal((1, 700)), r.standard_normal((1, 3001)))),
    "transposed": (lambda r: (r.standard_normal((16, 40)).T, r.standard_normal((5000, 40)).T)),
    "every-other-row": (lambda r: (r.standard_normal((64, 9))[::2], r.standard_normal((64, 8000))[::2])),
}


@needs_onednn
@pytest.mark.parametrize("case", sorted(OUTER_CASES))
def test_outer_is_numpys_product_bit_for_bit_on_one_thread_or_two(case):
    rng = np.random.default_rng(len(case))
    a, b = (v.astype(np.float32) for v in OUTER_CASES[case](rng))
    assert onednn_matmul.outer_usable(a, b), (a.shape, b.shape)
    want = a[:, :, None] * b[:, None, :]
    for threads in (2, 1):
        got = _with_omp_threads(threads, lambda: onednn_matmul.outer(a, b))
        assert got.dtype == np.float32 and got.flags.c_contiguous and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(onednn_matmul.outer(a[1:], b[1:]), want[1:])


@needs_onednn
def test_a_batch_size_met_once_runs_on_power_of_two_primitives():
    """NOTE [outer products on the team]: each batch size from 1 to 63 met once runs on the
    primitives of its binary digits (six sizes, made once), each piece writing its slice;
    a size met again gets its own primitive; the bits are NumPy's every time."""
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((63, 10)).astype(np.float32), rng.standard_normal((63, 40001)).astype(np.float32)

    def sizes():
        return {key[1][0][0] for key in list(onednn_matmul._primitives._data)
                if key[0] == "outer" and key[2][0][2] == b.shape[1]}

    for batch in range(1, 64):
        np.testing.assert_array_equal(onednn_matmul.outer(a[:batch], b[:batch]),
                                      a[:batch, :, None] * b[:batch, None, :])
    assert sizes() == {1, 2, 4, 8, 16, 32}
    for batch in (37, 37):
        np.testing.assert_array_equal(onednn_matmul.outer(a[:batch], b[:batch]),
                                      a[:batch, :, None] * b[:batch, None, :])
    assert sizes() == {1, 2, 4, 8, 16, 32, 37}


def test_which_stacks_take_the_outer_product():
    """float32 results from OUTER_MIN_ELEMENTS elements with positive strides; float64,
    small results, broadcast (stride-0) operands and unequal batches stay on NumPy."""
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((32, 10)).astype(np.float32), rng.standard_normal((32, 12800)).astype(np.float32)
    assert 32 * 10 * 12800 >= onednn_matmul.OUTER_MIN_ELEMENTS
    assert onednn_matmul.outer_usable(a, b) is onednn.available()
    assert not onednn_matmul.outer_usable(a.astype(np.float64), b.astype(np.float64))
    assert not onednn_matmul.outer_usable(a[:2], b[:2, :1000])
    assert not onednn_matmul.outer_usable(np.broadcast_to(a[:1], a.shape), b)
    assert not onednn_matmul.outer_usable(a[:16], b)


@pytest.mark.parametrize("n_first", [True, False], ids=["n<m", "n>m"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_per_example_dense_gradients_are_exact_outer_products(dtype, n_first, monkeypatch):
    """vmap(grad) of a loss linear in a dense layer's output, sum(c · (x @ w)), has the
    per-example weight gradients x ⊗ c exactly (one product per element): oneDNN's outer
    product for a large float32 stack, NumPy's otherwise (counted), in either order of
    the dims, and the loop of grad agrees."""
    calls = []
    real = onednn_matmul.outer
    monkeypatch.setattr(onednn_matmul, "outer", lambda a, b: calls.append(a.shape) or real(a, b))
    rng = np.random.default_rng(7)
    d_in, d_out = (12800, 10) if n_first else (10, 12800)
    w = rng.standard_normal((d_in, d_out)).astype(dtype)
    c = rng.standard_normal(d_out).astype(dtype)
    xs = rng.standard_normal((24, d_in)).astype(dtype)

    def loss(w, x):
        return cv.numpy.sum(c * (x @ w))

    per_example = np.asarray(cv.vmap(cv.grad(loss), in_axes=(None, 0))(w, xs))
    assert per_example.shape == (24, d_in, d_out) and per_example.dtype == dtype
    np.testing.assert_array_equal(per_example, xs[:, :, None] * c[None, None, :])
    expected = 1 if dtype == np.float32 and onednn.available() else 0
    assert len(calls) == expected, calls
    np.testing.assert_array_equal(np.stack([np.asarray(cv.grad(loss)(w, x)) for x in xs[:3]]), per_example[:3])
