"""cuvmap.scipy.linalg's special matrices and its qr, svd and polar: values against loops
over the defining formula (or a defining property: the companion matrices' eigenvalues are
the polynomial's roots, the convolution matrix times v is numpy.convolve), stacks against
a loop over their matrices, vmap, jit, and derivatives against finite differences in both
modes (float64). SciPy is not a test dependency: every reference is written here."""
import math

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.scipy import linalg as sla
from cuvmap.test_util import check_batching, check_grads


def _rng(seed=0):
    return np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def _float64_constants():
    with cv.config.override(default_float="float64"):
        yield


# ---------------------------------------------------------------------------------------
# References: the defining formulas, entry by entry
# ---------------------------------------------------------------------------------------


def _toeplitz_ref(c, r):
    return np.array([[c[i - j] if i >= j else r[j - i] for j in range(len(r))] for i in range(len(c))])


def _hankel_ref(c, r):
    v = list(c) + list(r[1:])
    return np.array([[v[i + j] for j in range(len(r))] for i in range(len(c))])


def _circulant_ref(c):
    n = len(c)
    return np.array([[c[(i - j) % n] for j in range(n)] for i in range(n)])


def _leslie_ref(f, s):
    n = len(f)
    out = np.zeros((n, n), dtype=np.result_type(f, s))
    out[0] = f
    for i in range(1, n):
        out[i, i - 1] = s[i - 1]
    return out


def _companion_ref(a):
    n = len(a) - 1
    out = np.zeros((n, n))
    out[0] = -np.asarray(a[1:]) / a[0]
    for i in range(1, n):
        out[i, i - 1] = 1.0
    return out


def _stacked(ref, *xs):
    """``ref`` applied to each vector of the stacks ``xs`` (leading dims broadcast)."""
    lead = np.broadcast_shapes(*(x.shape[:-1] for x in xs))
    xs = [np.broadcast_to(x, lead + x.shape[-1:]) for x in xs]
    outs = [ref(*(x[idx] for x in xs)) for idx in np.ndindex(*lead)]
    return np.stack(outs).reshape(lead + outs[0].shape)


def _binom(n, k):
    return math.comb(n, k) if 0 <= k <= n else 0


# ---------------------------------------------------------------------------------------
# Structured matrices of vectors
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cshape, rshape", [((4,), (6,)), ((5,), (2,)), ((2, 3), (4,)), ((3,), (2, 1, 5)),
                                            ((1,), (1,))])
def test_toeplitz_and_hankel_match_their_formulas(cshape, rshape):
    rng = _rng(1)
    c, r = rng.standard_normal(cshape), rng.standard_normal(rshape)
    np.testing.assert_allclose(sla.toeplitz(c, r), _stacked(_toeplitz_ref, c, r), rtol=0, atol=0)
    np.testing.assert_allclose(sla.hankel(c, r), _stacked(_hankel_ref, c, r), rtol=0, atol=0)


def test_toeplitz_defaults_to_a_hermitian_matrix_and_hankel_to_zeros():
    c = np.array([1.0, 2 + 3j, 4 - 1j])
    want = np.array([[1, 2 - 3j, 4 + 1j], [2 + 3j, 1, 2 - 3j], [4 - 1j, 2 + 3j, 1]])  # SciPy's documented example
    np.testing.assert_array_equal(sla.toeplitz(c), want)
    np.testing.assert_array_equal(sla.hankel(np.array([1.0, 2, 3])), [[1, 2, 3], [2, 3, 0], [3, 0, 0]])
    np.testing.assert_array_equal(sla.toeplitz(2.0), [[2.0]])  # a scalar is a vector of one
    assert np.asarray(sla.toeplitz(np.arange(3, dtype=np.int8))).dtype == np.int8
    assert sla.toeplitz(np.ones((2, 3)), np.ones((2, 0))).shape == (2, 3, 0)
    with pytest.raises(ShapeError, match=r"toeplitz: the leading dims of \(2, 3\) and \(4, 2\)"):
        sla.toeplitz(np.ones((2, 3)), np.ones((4, 2)))


def test_circulant_leslie_companion_fiedler_match_their_formulas():
    rng = _rng(2)
    c = rng.standard_normal((2, 5))
    np.testing.assert_array_equal(sla.circulant(c), _stacked(_circulant_ref, c))
    assert sla.circulant(np.zeros((3, 0))).shape == (3, 0, 0)
    f, s = rng.standard_normal((3, 4)), rng.standard_normal((4, 3)[1:])
    np.testing.assert_array_equal(sla.leslie(f, s), _stacked(_leslie_ref, f, s))
    a = rng.standard_normal((2, 6))
    np.testing.assert_allclose(sla.companion(a), _stacked(_companion_ref, a), rtol=1e-15)
    x = rng.standard_normal((3, 5))
    np.testing.assert_array_equal(sla.fiedler(x), np.abs(x[:, :, None] - x[:, None, :]))
    assert np.asarray(sla.companion(np.array([1, -3, 2]))).dtype.kind == "f"  # integers become floats


def _polynomial_of(matrix):
    """The monic characteristic polynomial's coefficients, from the eigenvalues."""
    return np.real(np.poly(np.linalg.eigvals(matrix)))


@pytest.mark.parametrize("size", [2, 3, 4, 5, 6, 9])
def test_companion_matrices_have_the_polynomials_roots_as_eigenvalues(size):
    roots = np.arange(1.0, size)  # the polynomial (x - 1)(x - 2)...: distinct real roots
    a = 2.5 * np.poly(roots)
    for build in (sla.companion, sla.fiedler_companion):
        m = np.asarray(build(a))
        assert m.shape == (size - 1, size - 1)
        np.testing.assert_allclose(_polynomial_of(m), a / a[0], rtol=1e-8, atol=1e-8)


def test_fiedler_companion_is_pentadiagonal_with_fiedlers_pattern():
    a = np.array([1.0, -16.0, 86.0, -176.0, 105.0])  # JAX's documented example
    np.testing.assert_array_equal(sla.fiedler_companion(a),
                                  [[16, -86, 1, 0], [1, 0, 0, 0], [0, 176, 0, -105], [0, 1, 0, 0]])
    assert sla.fiedler_companion(np.ones((3, 1))).shape == (3, 0, 0)
    np.testing.assert_array_equal(sla.fiedler_companion(np.array([2.0, -6.0])), [[3.0]])
    m = np.asarray(sla.fiedler_companion(np.arange(1.0, 10.0)))
    assert not np.any(np.triu(m, 3)) and not np.any(np.tril(m, -3))


@pytest.mark.parametrize("mode", ["full", "same", "valid"])
@pytest.mark.parametrize("m, n", [(1, 1), (1, 4), (3, 5), (5, 3), (4, 4), (2, 7)])
def test_convolution_matrix_times_v_is_numpys_convolve(m, n, mode):
    rng = _rng(3)
    a, v = rng.standard_normal(m), rng.standard_normal(n)
    got = np.asarray(sla.convolution_matrix(a, n, mode))
    np.testing.assert_allclose(got @ v, np.convolve(a, v, mode), rtol=1e-12, atol=1e-12)
    stack = rng.standard_normal((2, 3, m))
    np.testing.assert_array_equal(sla.convolution_matrix(stack, n, mode),
                                  _stacked(lambda x: np.asarray(sla.convolution_matrix(x, n, mode)), stack))


def test_block_diag_places_each_block_on_the_diagonal():
    rng = _rng(4)
    a, b = np.ones((3, 4)), rng.standard_normal((5, 2))
    got = np.asarray(sla.block_diag(a, 5, b, [1.0, 2.0]))
    want = np.zeros((3 + 1 + 5 + 1, 4 + 1 + 2 + 2))
    want[:3, :4], want[3, 4], want[4:9, 5:7], want[9, 7:9] = a, 5, b, [1, 2]
    np.testing.assert_array_equal(got, want)
    assert sla.block_diag().shape == (1, 0)
    with pytest.raises(ShapeError, match="block_diag: argument 0 has 3 dims"):
        sla.block_diag(np.ones((2, 2, 2)))


# ---------------------------------------------------------------------------------------
# Derivatives, vmap and jit of the structured matrices
# ---------------------------------------------------------------------------------------


def _structured_rows():
    rng = _rng(5)
    vec = lambda *s: rng.standard_normal(s)  # noqa: E731
    spread = np.array([0.3, -1.2, 2.0, 0.9])  # distinct entries: |a_i - a_j| is differentiable
    return [
        ("toeplitz", lambda c, r: sla.toeplitz(c, r), (vec(4), vec(3))),
        ("toeplitz_hermitian", lambda c: sla.toeplitz(c), (vec(4) + 1j * vec(4),)),
        ("hankel", lambda c, r: sla.hankel(c, r), (vec(3), vec(5))),
        ("circulant", sla.circulant, (vec(5),)),
        ("leslie", sla.leslie, (vec(4), vec(3))),
        ("companion", sla.companion, (np.array([1.5, -0.3, 2.0, 0.7]),)),
        ("fiedler", sla.fiedler, (spread,)),
        ("fiedler_companion", sla.fiedler_companion, (np.array([1.5, -0.3, 2.0, 0.7, -1.1, 0.4]),)),
        ("convolution_matrix", lambda a: sla.convolution_matrix(a, 5, "same"), (vec(3),)),
        ("block_diag", lambda a, b: sla.block_diag(a, b), (vec(2, 3), vec(1, 2))),
    ]


@pytest.mark.parametrize("name, fn, args", _structured_rows(), ids=[r[0] for r in _structured_rows()])
def test_structured_matrices_have_derivatives_vmap_and_jit(name, fn, args):
    check_grads(fn, args, order=2)
    np.testing.assert_array_equal(cv.jit(fn)(*args), fn(*args))
    check_batching(fn, tuple(np.stack([x, 1.5 * x + 0.25, -x]) for x in args))


def test_structured_matrices_refuse_bad_sizes_with_scipys_messages():
    with pytest.raises(ValueError, match="length of f along the last axis"):
        sla.leslie(np.array([1.0]), np.array([]))
    with pytest.raises(ValueError, match="Incorrect lengths for f and s"):
        sla.leslie(np.array([1.0, 2.0, 3.0]), np.array([0.5]))
    with pytest.raises(ValueError, match="length of `a` along the last axis"):
        sla.companion(np.zeros((3, 1)))
    with pytest.raises(ValueError, match="nonzero"):
        sla.fiedler_companion(np.ones((3, 0)))
    with pytest.raises(ValueError, match="must be at least 1-dimensional"):
        sla.hankel(np.float64(1.0))
    for bad, match in [(dict(n=0), "n must be a positive integer"), (dict(n=3, mode="bad"), "mode must be one of")]:
        with pytest.raises(ValueError, match=match):
            sla.convolution_matrix(np.ones(3), **bad)
    with pytest.raises(ValueError, match=r"len\(a\) must be at least 1"):
        sla.convolution_matrix(np.zeros((2, 0)), 3)
    with pytest.raises(ValueError, match="must be at least 1-dimensional"):
        sla.convolution_matrix(np.float64(5.0), 3)


# ---------------------------------------------------------------------------------------
# Constant matrices of a size
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 5, 9])
def test_hilbert_pascal_and_their_inverses_are_exact(n):
    hilbert = np.array([[1.0 / (i + j + 1) for j in range(n)] for i in range(n)]).reshape(n, n)
    np.testing.assert_allclose(sla.hilbert(n), hilbert, rtol=1e-15)
    inv_h = [[(-1) ** (i + j) * (i + j + 1) * _binom(n + i, n - j - 1) * _binom(n + j, n - i - 1) * _binom(i + j, i) ** 2
              for j in range(n)] for i in range(n)]
    np.testing.assert_array_equal(sla.invhilbert(n), np.array(inv_h, dtype=float).reshape(n, n))
    if n:
        np.testing.assert_allclose(np.asarray(sla.invhilbert(n)) @ hilbert, np.eye(n), atol=1e-6 * 10 ** n)
    lower = np.array([[_binom(i, j) for j in range(n)] for i in range(n)], dtype=float).reshape(n, n)
    sym = np.array([[_binom(i + j, i) for j in range(n)] for i in range(n)], dtype=float).reshape(n, n)
    for kind, want in [(None, sym), ("symmetric", sym), ("lower", lower), ("upper", lower.T)]:
        p = np.asarray(sla.pascal(n, kind))
        np.testing.assert_array_equal(p, want)
        np.testing.assert_array_equal(np.asarray(sla.invpascal(n, kind)) @ p, np.eye(n))  # exact integers
    assert np.asarray(sla.hilbert(3)).dtype == np.float64
    with cv.config.override(default_float="float32"):
        assert np.asarray(sla.pascal(3)).dtype == np.float32  # JAX's default float


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_helmert_rows_are_orthonormal_contrasts(n):
    h = np.asarray(sla.helmert(n))
    assert h.shape == (n - 1, n)
    np.testing.assert_allclose(h @ h.T, np.eye(n - 1), atol=1e-14)
    np.testing.assert_allclose(h.sum(1), 0, atol=1e-14)  # contrasts
    for k in range(1, n):  # row k-1: k equal positive entries, then -k times that, then zeros
        want = np.array([1.0] * k + [-k] + [0.0] * (n - k - 1)) / np.sqrt(k * (k + 1))
        np.testing.assert_allclose(h[k - 1], want, rtol=1e-15)
    full = np.asarray(sla.helmert(n, full=True))
    np.testing.assert_allclose(full @ full.T, np.eye(n), atol=1e-14)
    np.testing.assert_allclose(full[0], np.full(n, 1 / np.sqrt(n)), rtol=1e-15)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_hadamard_is_sylvesters(n):
    h = np.asarray(sla.hadamard(n))
    want = np.array([[(-1) ** bin(i & j).count("1") for j in range(n)] for i in range(n)])
    np.testing.assert_array_equal(h, want)
    np.testing.assert_array_equal(h @ h.T, n * np.eye(n))
    assert np.asarray(sla.hadamard(n, np.int8)).dtype == np.int8
    assert np.asarray(sla.hadamard(n, np.float32)).dtype == np.float32


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("scale", [None, "sqrtn", "n"])
def test_dft_matrix_applies_the_dft(n, scale):
    w = np.asarray(sla.dft(n, scale))
    assert w.shape == (n, n) and w.dtype == np.complex128
    factor = {None: 1.0, "sqrtn": 1 / math.sqrt(max(n, 1)), "n": 1 / max(n, 1)}[scale]
    want = np.array([[np.exp(-2j * np.pi * i * j / n) for j in range(n)] for i in range(n)]).reshape(n, n)
    np.testing.assert_allclose(w, factor * want, atol=1e-13)
    if n:
        x = _rng(6).standard_normal(n)
        np.testing.assert_allclose(w @ x, factor * np.fft.fft(x), atol=1e-12)
    assert np.asarray(sla.dft(4, dtype=np.complex64)).dtype == np.complex64


def test_constant_matrices_refuse_bad_arguments():
    for n in (0, -1, 3, 6):
        with pytest.raises(ValueError, match="positive power of 2"):
            sla.hadamard(n)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        sla.helmert(0)
    with pytest.raises(ValueError, match="scale must be"):
        sla.dft(4, scale="bad")
    with pytest.raises(ValueError, match="dtype must be a complex"):
        sla.dft(4, dtype=np.float32)
    for fn in (sla.pascal, sla.invpascal):
        with pytest.raises(ValueError, match="Expected kind to be one of"):
            fn(3, kind="bad")


def test_constant_matrices_under_jit():
    for fn in (lambda: sla.hilbert(4), lambda: sla.invpascal(5), lambda: sla.dft(8, "sqrtn"),
               lambda: sla.hadamard(4), lambda: sla.helmert(4, full=True)):
        np.testing.assert_array_equal(cv.jit(fn)(), fn())


# ---------------------------------------------------------------------------------------
# qr, svd, polar
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 3), (3, 3), (3, 4), (2, 5, 3)])
def test_scipy_qr_modes(shape):
    a = _rng(7).standard_normal(shape)
    m, n = shape[-2:]
    k = min(m, n)
    q, r = sla.qr(a)
    assert q.shape[-2:] == (m, m) and r.shape[-2:] == (m, n)
    np.testing.assert_allclose(q @ r, a, atol=1e-13)
    np.testing.assert_allclose(np.swapaxes(q, -1, -2) @ q, np.broadcast_to(np.eye(m), q.shape), atol=1e-13)
    assert not np.any(np.tril(r, -1))
    qe, re = sla.qr(a, mode="economic")
    assert qe.shape[-2:] == (m, k) and re.shape[-2:] == (k, n)
    np.testing.assert_allclose(qe @ re, a, atol=1e-13)
    (r_only,) = sla.qr(a, mode="r")
    np.testing.assert_allclose(r_only, r, atol=1e-13)  # SciPy's 'r' is the full (m, n) R
    with pytest.raises(ValueError, match="Unsupported QR decomposition mode"):
        sla.qr(a, mode="raw")


def _geqp3_pivots(a):
    """LAPACK's geqp3 pivots, by its definition: Householder steps on a copy, each first
    swapping in the column whose part below the diagonal is longest."""
    r = np.array(a, dtype=float)
    m, n = r.shape
    perm = np.arange(n)
    for k in range(min(m, n)):
        j = k + int(np.argmax(np.linalg.norm(r[k:, k:], axis=0)))
        r[:, [k, j]], perm[[k, j]] = r[:, [j, k]], perm[[j, k]]
        v = r[k:, k].copy()
        v[0] += np.copysign(np.linalg.norm(v), v[0])
        if np.linalg.norm(v) > 0:
            r[k:, :] -= np.outer(2 * v / (v @ v), v @ r[k:, :])
    return perm


@pytest.mark.parametrize("shape", [(4, 3), (3, 3), (3, 5), (6, 2)])
@pytest.mark.parametrize("mode", ["full", "economic", "r"])
def test_scipy_qr_with_pivoting_is_geqp3s(shape, mode):
    rng = _rng(11)
    a = rng.standard_normal(shape)
    *factors, perm = sla.qr(a, mode=mode, pivoting=True)
    np.testing.assert_array_equal(perm, _geqp3_pivots(a))
    assert np.asarray(perm).dtype == np.int32
    r = factors[-1]
    assert np.all(np.diff(np.abs(np.diagonal(r))) <= 1e-12)  # |R_kk| non-increasing
    if mode != "r":
        np.testing.assert_allclose(factors[0] @ r, a[:, perm], atol=1e-13)
    stack = rng.standard_normal((3,) + shape)
    got = cv.vmap(lambda x: sla.qr(x, mode=mode, pivoting=True))(stack)
    jitted = cv.jit(lambda x: sla.qr(x, mode=mode, pivoting=True))(stack)
    for i in range(3):
        for g, j, w in zip(got, jitted, sla.qr(stack[i], mode=mode, pivoting=True)):
            np.testing.assert_allclose(g[i], w, atol=1e-13)
            np.testing.assert_allclose(j[i], w, atol=1e-13)


def test_scipy_qr_with_pivoting_differentiates_through_the_qr():
    a = _rng(12).standard_normal((5, 3))

    def identity(x):  # (Q R)[:, argsort(P)] is x itself
        q, r, p = sla.qr(x, mode="economic", pivoting=True)
        return cnp.take(cnp.matmul(q, r), cnp.argsort(p), axis=1)

    check_grads(identity, (a,), order=1)
    check_grads(lambda x: sla.qr(x, mode="economic", pivoting=True)[1], (a,), order=1)


def test_scipy_qr_and_svd_derivatives_vmap_jit():
    rng = _rng(8)
    a = rng.standard_normal((4, 3))
    check_grads(lambda x: sla.qr(x, mode="economic"), (a,), order=1)
    check_grads(lambda x: sla.qr(x, mode="r")[0], (a,), order=1)
    check_grads(lambda x: sla.svd(x, compute_uv=False), (a,), order=1)
    check_batching(lambda x: sla.qr(x, mode="economic"), (rng.standard_normal((3, 4, 3)),))
    u, s, vh = sla.svd(a, full_matrices=False)
    np.testing.assert_allclose((u * s) @ vh, a, atol=1e-13)
    np.testing.assert_allclose(cv.jit(lambda x: sla.svd(x, compute_uv=False))(a), np.linalg.svd(a)[1], rtol=1e-13)
    with pytest.raises(ValueError, match="lapack_driver"):
        sla.svd(a, lapack_driver="bogus")


@pytest.mark.parametrize("shape, side", [((4, 4), "right"), ((5, 3), "right"), ((3, 5), "left"), ((3, 5), "right"),
                                         ((2, 4, 3), "left")])
def test_polar_factors(shape, side):
    a = _rng(9).standard_normal(shape)
    u, p = sla.polar(a, side=side)
    np.testing.assert_allclose(u @ p if side == "right" else p @ u, a, atol=1e-12)
    np.testing.assert_allclose(p, np.swapaxes(p, -1, -2), atol=1e-12)
    assert np.all(np.linalg.eigvalsh(p) > -1e-12)  # positive semidefinite
    m, n = shape[-2:]
    gram = np.swapaxes(u, -1, -2) @ u if m >= n else u @ np.swapaxes(u, -1, -2)
    np.testing.assert_allclose(gram, np.broadcast_to(np.eye(min(m, n)), gram.shape), atol=1e-12)
    # the factor p of a = u p is the square root of aᵀa: p² = aᵀa (right), a aᵀ (left)
    at = np.swapaxes(a, -1, -2)
    np.testing.assert_allclose(p @ p, at @ a if side == "right" else a @ at, atol=1e-11)


def test_polar_derivatives_vmap_jit():
    a = np.array([[2.0, 0.3, -0.5], [0.1, 1.2, 0.4], [-0.3, 0.2, 0.7]])  # distinct singular values
    check_grads(lambda x: sla.polar(x), (a,), order=1)
    check_batching(lambda x: sla.polar(x, side="left"), (_rng(10).standard_normal((3, 3, 3)),))
    got = cv.jit(sla.polar)(a)
    for x, y in zip(got, sla.polar(a)):
        np.testing.assert_allclose(x, y, rtol=1e-13, atol=1e-14)
    with pytest.raises(ValueError, match="side"):
        sla.polar(a, side="up")
    with pytest.raises(ValueError, match="method"):
        sla.polar(a, method="newton")


@pytest.mark.gpu
@pytest.mark.skipif(not cv.backend.gpu_available(), reason="needs CuPy and a CUDA device")
def test_structured_matrices_of_device_arrays_stay_on_the_device():
    for name, fn, args in _structured_rows():
        device_args = tuple(cv.device_put(x, "gpu") for x in args)
        got = fn(*device_args)
        assert cv.backend.is_cupy_array(got), name
        np.testing.assert_allclose(cv.device_put(got, "cpu"), fn(*args), rtol=1e-12, atol=1e-14, err_msg=name)
        if name in ("toeplitz", "circulant", "convolution_matrix"):
            g = cv.grad(lambda *xs: cnp.sum(cnp.abs(fn(*xs)) ** 2))(*device_args)
            want = cv.grad(lambda *xs: cnp.sum(cnp.abs(fn(*xs)) ** 2))(*args)
            np.testing.assert_allclose(cv.device_put(g, "cpu"), want, rtol=1e-12, err_msg=name)
    a = cv.device_put(_rng(13).standard_normal((4, 3)), "gpu")
    *_, perm = sla.qr(a, mode="economic", pivoting=True)
    np.testing.assert_array_equal(cv.device_put(perm, "cpu"), _geqp3_pivots(cv.device_put(a, "cpu")))
