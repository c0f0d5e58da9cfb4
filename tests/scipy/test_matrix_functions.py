"""The Schur decomposition and the functions built on it (cuvmap/lax/linalg_schur.py,
cuvmap/scipy/linalg_matrix_functions.py), without SciPy: Z T Zᴴ = A with Z unitary and T
(quasi-)triangular, X² = A, f(A) against the eigendecomposition V f(Λ) V⁻¹ and against
``expm``, A X + X B = C, rsf2csf's result against its definition, expm_frechet against
finite differences; vmap, jit, and the refusals to differentiate (as JAX)."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap.lax import linalg as lax_linalg
from cuvmap.scipy import linalg as sla

from linalg_references import LINALG_DTYPES as DTYPES
from linalg_references import adjoint as _adjoint
from linalg_references import random_matrix as _matrix


def _eps(dtype):
    return np.finfo(dtype).eps


def _assert_quasi_triangular(t, real):
    n = t.shape[-1]
    np.testing.assert_array_equal(np.tril(t, -2), 0)
    sub = np.diagonal(t, -1, -2, -1)
    if not real:
        np.testing.assert_array_equal(sub, 0)
        return
    # a nonzero subdiagonal entry opens a 2×2 block of a complex pair: never two in a row
    assert not np.any((sub[..., 1:] != 0) & (sub[..., :-1] != 0))
    for idx in zip(*np.nonzero(sub)):
        *lead, i = idx
        block = t[tuple(lead)][i:i + 2, i:i + 2]
        assert np.iscomplex(np.linalg.eigvals(block)).all(), n


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (4, 4), (3, 15, 15),
                                   pytest.param((100, 100), marks=pytest.mark.slow)])
def test_schur_reconstructs_with_a_unitary_z_and_a_triangular_t(shape, dtype):
    a = _matrix(np.random.default_rng(0), shape, dtype)
    t, z = lax_linalg.schur(a)
    assert t.dtype == z.dtype == dtype
    n = shape[-1]
    np.testing.assert_allclose(z @ t @ _adjoint(z), a, atol=600 * _eps(dtype) * np.abs(a).max())
    np.testing.assert_allclose(z @ _adjoint(z), np.broadcast_to(np.eye(n), a.shape), atol=100 * _eps(dtype))
    _assert_quasi_triangular(t, np.dtype(dtype).kind == "f")
    # the diagonal (blocks) carry the eigenvalues
    np.testing.assert_allclose(np.sort_complex(np.linalg.eigvals(t).ravel()),
                               np.sort_complex(np.linalg.eigvals(a).ravel()), atol=1e-3 if n > 50 else 1e-4)


def test_schur_of_a_defective_matrix_is_still_triangular():
    jordan = np.array([[2.0, 1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 0.0, 2.0]])
    m = np.random.default_rng(1).standard_normal((3, 3))
    a = m @ jordan @ np.linalg.inv(m)
    for x in (a, a.astype(np.complex128)):
        t, z = sla.schur(x, output="complex")
        np.testing.assert_allclose(z @ t @ _adjoint(z), a, atol=1e-12)
        np.testing.assert_array_equal(np.tril(t, -1), 0)
    t, z = sla.schur(np.eye(3))
    np.testing.assert_allclose(t, np.eye(3))


def test_schur_of_non_finite_matrices_is_nan_and_vmap_jit_agree():
    a = np.random.default_rng(2).standard_normal((4, 5, 5))
    a[1, 0, 0] = np.nan
    t, z = lax_linalg.schur(a)
    assert np.all(np.isnan(t[1])) and np.all(np.isnan(z[1])) and not np.any(np.isnan(t[0]))
    tv, zv = cv.vmap(lax_linalg.schur)(a)
    np.testing.assert_array_equal(tv, t)
    tj = cv.jit(lambda x: lax_linalg.schur(x, compute_schur_vectors=False))(a)
    np.testing.assert_array_equal(tj, t)


def test_schur_has_no_derivative_as_in_jax():
    a = np.random.default_rng(3).standard_normal((3, 3))
    with pytest.raises(NotImplementedError, match="schur has no derivative rule"):
        cv.grad(lambda x: cnp.sum(lax_linalg.schur(x)[0]))(a)
    with pytest.raises(NotImplementedError, match="schur has no derivative rule"):
        cv.jvp(lambda x: sla.funm(x, cnp.exp), (a,), (a,))  # (sqrtm and solve_sylvester carry their own rules)
    with pytest.raises(ValueError, match="output must be 'real' or 'complex'"):
        sla.schur(a, output="other")


def test_rsf2csf_gives_a_triangular_form_of_the_same_matrix():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 8, 8))
    t, z = sla.schur(a)
    assert np.any(np.diagonal(t, -1, -2, -1) != 0)  # complex pairs are present
    tc, zc = sla.rsf2csf(t, z)
    np.testing.assert_array_equal(np.tril(tc, -1), 0)
    np.testing.assert_allclose(zc @ tc @ _adjoint(zc), a, atol=1e-12)
    np.testing.assert_allclose(zc @ _adjoint(zc), np.broadcast_to(np.eye(8), a.shape), atol=1e-13)
    # a triangular T is left alone; Z broadcasts against a stack of T
    tri = np.triu(rng.standard_normal((2, 4, 4)))
    tc, zc = sla.rsf2csf(tri, np.eye(4))
    np.testing.assert_allclose(tc, tri, atol=0)
    assert zc.shape == (2, 4, 4) and tc.dtype == np.complex128


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (2, 15, 15), pytest.param((50, 50), marks=pytest.mark.slow)])
def test_sqrtm_squares_back(shape, dtype):
    a = _matrix(np.random.default_rng(5), shape, dtype)
    x = sla.sqrtm(a)
    tol = 2e-3 if _eps(dtype) > 1e-10 else 1e-9
    np.testing.assert_allclose(x @ x, a, atol=tol * np.abs(a).max())


def test_sqrtm_of_a_positive_definite_matrix_is_the_symmetric_root_and_of_diagonals_elementwise():
    m = np.random.default_rng(6).standard_normal((6, 6))
    spd = m @ m.T + np.eye(6)
    w, v = np.linalg.eigh(spd)
    np.testing.assert_allclose(sla.sqrtm(spd), (v * np.sqrt(w)) @ v.T, atol=1e-12)
    for diag, want in [([1, 0, 0], [1, 0, 0]), ([0, 4, 0], [0, 2, 0]), ([0, 0, 9, 0, 0, 4], [0, 0, 3, 0, 0, 2])]:
        np.testing.assert_allclose(sla.sqrtm(np.diag(np.array(diag, np.float32))), np.diag(want), atol=1e-6)
    with pytest.raises(NotImplementedError, match="blocksize"):
        sla.sqrtm(spd, blocksize=2)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_funm_matches_the_eigendecomposition_and_expm(dtype):
    a = _matrix(np.random.default_rng(7), (2, 6, 6), dtype)
    w, v = np.linalg.eig(a)
    f = lambda x: x ** 3 - 2 * x  # noqa: E731 - a polynomial: f(A) = A³ − 2A exactly
    np.testing.assert_allclose(sla.funm(a, f), a @ a @ a - 2 * a, atol=1e-10)
    np.testing.assert_allclose(sla.funm(a, cnp.exp), (v * np.exp(w)[..., None, :]) @ np.linalg.inv(v), atol=1e-10)
    np.testing.assert_allclose(sla.funm(a, cnp.exp), sla.expm(a), atol=1e-10)
    fa, err = sla.funm(a, cnp.exp, disp=False)
    assert err.shape == (2,) and np.all(err < 1e-10)


@pytest.mark.parametrize("method", ["schur", "eigen"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_sylvester_solves_ax_plus_xb(method, dtype):
    rng = np.random.default_rng(8)
    a, b, c = _matrix(rng, (2, 4, 4), dtype), _matrix(rng, (5, 5), dtype), _matrix(rng, (3, 1, 4, 5), dtype)
    x = sla.solve_sylvester(a, b, c, method=method)
    assert x.shape == (3, 2, 4, 5) and x.dtype == dtype
    tol = 1e-3 if _eps(dtype) > 1e-10 else 1e-10
    np.testing.assert_allclose(a @ x + x @ b, np.broadcast_to(c, x.shape), atol=tol)


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")  # the singular divisions, then NaN
@pytest.mark.parametrize("method", ["schur", "eigen"])
def test_solve_sylvester_without_a_unique_solution_is_nan(method):
    rng = np.random.default_rng(9)
    p = rng.standard_normal((4, 4)) + 4 * np.eye(4)
    lam = rng.standard_normal(4)
    a = p @ np.diag(lam) @ np.linalg.inv(p)
    b = p @ np.diag(-lam) @ np.linalg.inv(p)
    x = sla.solve_sylvester(a, b, rng.standard_normal((4, 4)), method=method, tol=1e-5)
    assert np.all(np.isnan(x))
    with pytest.raises(ValueError, match="unrecognized method"):
        sla.solve_sylvester(a, b, a, method="other")


def test_solve_sylvester_under_vmap_and_jit_and_its_eigen_gradient():
    rng = np.random.default_rng(10)
    a, b, c = rng.standard_normal((3, 3, 3)), rng.standard_normal((3, 2, 2)), rng.standard_normal((3, 3, 2))
    want = sla.solve_sylvester(a, b, c)
    np.testing.assert_allclose(cv.vmap(sla.solve_sylvester)(a, b, c), want, atol=1e-12)
    np.testing.assert_allclose(cv.jit(sla.solve_sylvester)(a, b, c), want, atol=1e-12)
    # the eigen method is differentiable: the gradient in C is the solution of the adjoint equation
    ct = rng.standard_normal((3, 2))
    g = cv.grad(lambda c: cnp.sum(sla.solve_sylvester(a[0], b[0], c, method="eigen") * ct))(c[0])
    np.testing.assert_allclose(g, sla.solve_sylvester(a[0].T, b[0].T, ct), atol=1e-10)


def test_expm_frechet_is_the_directional_derivative_of_expm():
    rng = np.random.default_rng(11)
    a, e = 0.5 * rng.standard_normal((2, 4, 4)), rng.standard_normal((2, 4, 4))
    expm_a, frechet = sla.expm_frechet(a, e)
    np.testing.assert_allclose(expm_a, sla.expm(a), rtol=1e-13)
    _, tangent = cv.jvp(sla.expm, (a,), (e,))
    np.testing.assert_allclose(frechet, tangent, atol=1e-12)
    h = 1e-6
    fd = (sla.expm(a + h * e) - sla.expm(a - h * e)) / (2 * h)
    np.testing.assert_allclose(frechet, fd, atol=1e-7)
    np.testing.assert_allclose(sla.expm_frechet(a, e, compute_expm=False), frechet)


def test_every_function_keeps_its_results_on_the_operands_device(backend):
    """On the GPU (the strict CuPy stand-in without one) the constants meet the operands on
    their device and the results stay there; the values equal the CPU's."""
    from cuvmap import backend as cv_backend
    rng = np.random.default_rng(12)
    a, b, c = rng.standard_normal((2, 4, 4)), rng.standard_normal((2, 3, 3)), rng.standard_normal((2, 4, 3))
    put = (lambda x: cv.device_put(x, "gpu")) if backend == "gpu" else (lambda x: x)
    t, z = sla.schur(a)
    calls = {
        "schur": lambda: sla.schur(put(a)),
        "rsf2csf": lambda: sla.rsf2csf(put(t), put(z)),
        "sqrtm": lambda: sla.sqrtm(put(a)),
        "funm": lambda: sla.funm(put(a), cnp.exp),
        "solve_sylvester": lambda: sla.solve_sylvester(put(a), put(b), put(c)),
        "solve_sylvester_eigen": lambda: sla.solve_sylvester(put(a), put(b), put(c), method="eigen"),
        "expm_frechet": lambda: sla.expm_frechet(put(a), put(a)),
    }
    for name, call in calls.items():
        got = call()
        got = got if isinstance(got, tuple) else (got,)
        if backend == "gpu":
            assert all(cv_backend.is_cupy_array(g) for g in got), name
        want = {"schur": lambda: sla.schur(a), "rsf2csf": lambda: sla.rsf2csf(t, z), "sqrtm": lambda: sla.sqrtm(a),
                "funm": lambda: sla.funm(a, cnp.exp), "solve_sylvester": lambda: sla.solve_sylvester(a, b, c),
                "solve_sylvester_eigen": lambda: sla.solve_sylvester(a, b, c, method="eigen"),
                "expm_frechet": lambda: sla.expm_frechet(a, a)}[name]()
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want):
            np.testing.assert_allclose(cv.device_put(g, "cpu") if backend == "gpu" else g, w, atol=1e-10)
