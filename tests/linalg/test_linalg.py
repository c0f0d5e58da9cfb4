"""Linear algebra beyond the op table (``tests/op_table.py`` checks every function's value
against NumPy, vmap over each argument, both derivative modes and jit): complex inputs by
JAX's convention against Wirtinger finite differences in complex128 (NOTE [complex
derivatives follow JAX] in cuvmap/numpy/linalg.py), the determinant's gradient at singular
matrices, and NumPy's conventions for shapes and results."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.scipy import linalg as sla

la = cnp.linalg
EPS = 1e-6


def _rng(seed=0):
    return np.random.default_rng(seed)


def _complex(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def _wirtinger_grad(f, z):
    """``∂f/∂x − i ∂f/∂y`` of a real-valued ``f`` by central differences (JAX's ``grad``)."""
    g = np.zeros_like(z)
    for idx in np.ndindex(z.shape):
        e = np.zeros_like(z)
        e[idx] = EPS
        dx = (f(z + e) - f(z - e)) / (2 * EPS)
        dy = (f(z + 1j * e) - f(z - 1j * e)) / (2 * EPS)
        g[idx] = dx - 1j * dy
    return g


def test_grad_of_complex_vector_norm_is_jaxs():
    z = np.array([0.5 + 1.5j, -0.1 + 0.8j])
    got = cv.grad(lambda z: la.norm(z))(z)
    np.testing.assert_allclose(got, [0.28171808 - 0.84515425j, -0.05634362 - 0.45074894j], rtol=1e-7)
    np.testing.assert_allclose(got, np.conj(z) / np.linalg.norm(z), rtol=1e-12)


@pytest.mark.parametrize("ord_, axis", [(None, None), (2, 0), (1, 0), (np.inf, 0), (-np.inf, 0), (3, 0),
                                         (-1, 0), ("fro", (0, 1)), (1, (0, 1)), (np.inf, (1, 0)), (-1, (0, 1))])
def test_complex_norms_are_real_with_wirtinger_gradients(ord_, axis):
    z = _complex(_rng(1), 3, 4)

    def f(z):
        return la.norm(z, ord_, axis)

    def total(z):
        return cnp.sum(f(z))

    want = np.linalg.norm(z, ord_, axis)
    got = f(z)
    assert np.asarray(got).dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12)
    ref = _wirtinger_grad(lambda z: float(np.sum(np.linalg.norm(z, ord_, axis))), z)
    np.testing.assert_allclose(cv.grad(total)(z), ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(cv.jit(cv.grad(total))(z), ref, rtol=1e-6, atol=1e-7)
    # forward mode: the JVP along a complex tangent is the real directional derivative
    t = _complex(_rng(2), 3, 4)
    _, tangent = cv.jvp(total, (z,), (t,))
    fd = (np.sum(np.linalg.norm(z + EPS * t, ord_, axis)) - np.sum(np.linalg.norm(z - EPS * t, ord_, axis))) / (2 * EPS)
    np.testing.assert_allclose(tangent, fd, rtol=1e-6)


B = np.array([1.0 - 0.5j, 0.25 + 2j, -1.5j])
HOLOMORPHIC = [
    ("det", lambda a: la.det(a), lambda a: np.linalg.det(a)),
    ("inv", lambda a: la.inv(a), lambda a: np.linalg.inv(a)),
    ("solve", lambda a: la.solve(a, B), lambda a: np.linalg.solve(a, B)),
    ("matrix_power", lambda a: la.matrix_power(a, 3), lambda a: np.linalg.matrix_power(a, 3)),
    ("lu_solve", lambda a: sla.lu_solve(sla.lu_factor(a), B), lambda a: np.linalg.solve(a, B)),
    ("solve_triangular", lambda a: sla.solve_triangular(a, B, lower=True), lambda a: np.linalg.solve(np.tril(a), B)),
]


@pytest.mark.parametrize("name,f,ref", HOLOMORPHIC, ids=[h[0] for h in HOLOMORPHIC])
def test_holomorphic_functions_of_complex_matrices(name, f, ref):
    """Value, the JVP (complex-linear: a complex-step difference) and the VJP (its plain
    transpose: ``Σ ct · J t = Σ vjp(ct) · t``, no conjugation) in complex128."""
    rng = _rng(3)
    a = _complex(rng, 3, 3) + 3 * np.eye(3)
    np.testing.assert_allclose(f(a), ref(a), rtol=1e-11, atol=1e-12)
    t = _complex(rng, 3, 3)
    _, tangent = cv.jvp(f, (a,), (t,))
    fd = (ref(a + EPS * t) - ref(a - EPS * t)) / (2 * EPS)
    np.testing.assert_allclose(tangent, fd, rtol=1e-6, atol=1e-7)
    out, pullback = cv.vjp(f, a)
    ct = _complex(rng, *np.shape(out))
    (ct_a,) = pullback(ct)
    np.testing.assert_allclose(np.sum(ct_a * t), np.sum(ct * np.asarray(tangent)), rtol=1e-10)
    # vmap over a stack of complex matrices
    stack = np.stack([a, a.T + 1j * np.eye(3)])
    np.testing.assert_allclose(cv.vmap(f)(stack), np.stack([ref(m) for m in stack]), rtol=1e-10, atol=1e-12)


def test_grad_of_abs_det_of_complex_matrix_matches_wirtinger():
    a = _complex(_rng(4), 3, 3)

    def f(a):
        d = la.det(a)
        return la.norm(cnp.reshape(d, (1,)))

    ref = _wirtinger_grad(lambda a: abs(np.linalg.det(a)), a)
    np.testing.assert_allclose(cv.grad(f)(a), ref, rtol=1e-6, atol=1e-8)


def test_grad_of_det_at_singular_matrices_is_the_cofactor_matrix():
    """Rank n − 1: the gradient is the (nonzero) cofactor matrix, where det(a) a⁻ᵀ is NaN;
    rank n − 2: zero."""
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    cof = np.array([[np.linalg.det(np.delete(np.delete(a, i, 0), j, 1)) * (-1) ** (i + j) for j in range(3)]
                    for i in range(3)])
    np.testing.assert_allclose(cv.grad(la.det)(a), cof, atol=1e-12)
    np.testing.assert_allclose(cv.jacfwd(la.det)(a), cof, atol=1e-12)
    rank1 = np.outer([1.0, 2.0, 3.0], [1.0, -1.0, 2.0])
    np.testing.assert_allclose(cv.grad(la.det)(rank1), np.zeros((3, 3)), atol=1e-12)


def test_hessian_of_det_matches_finite_differences():
    a = _rng(6).standard_normal((3, 3)) + 2 * np.eye(3)
    h = cv.hessian(la.det)(a)
    g = lambda a: np.linalg.det(a) * np.linalg.inv(a).T  # noqa: E731
    for idx in [(0, 0), (1, 2), (2, 1)]:
        e = np.zeros((3, 3))
        e[idx] = EPS
        np.testing.assert_allclose(h[..., idx[0], idx[1]], (g(a + e) - g(a - e)) / (2 * EPS), atol=1e-6)


def test_singular_solve_gives_inf_or_nan_as_jax():
    a = np.ones((2, 2))
    out = la.solve(a, np.ones(2))
    assert not np.all(np.isfinite(out))
    assert not np.all(np.isfinite(sla.solve_triangular(np.zeros((2, 2)), np.ones(2))))


def test_cholesky_of_an_indefinite_matrix_is_nan_in_its_slot_only():
    good = np.eye(2) * 4
    bad = -np.eye(2)
    out = la.cholesky(np.stack([good, bad]))
    np.testing.assert_allclose(out[0], 2 * np.eye(2))
    assert np.all(np.isnan(out[1]))


def test_results_are_numpys_named_tuples():
    a = _rng(7).standard_normal((3, 3))
    s = a @ a.T + np.eye(3)
    assert la.eigh(s)._fields == ("eigenvalues", "eigenvectors")
    assert la.qr(a)._fields == ("Q", "R")
    assert la.slogdet(a)._fields == ("sign", "logabsdet")
    assert la.svd(a)._fields == ("U", "S", "Vh")


def test_lu_factor_matches_the_definition():
    a = np.array([[1.0, 2.0, 0.5], [4.0, 1.0, 3.0], [2.0, 7.0, 1.0]])
    lu, piv = sla.lu_factor(a)
    assert np.asarray(piv).dtype == np.int32
    np.testing.assert_array_equal(piv, [1, 2, 2])  # LAPACK's interchanges for this matrix
    p, l_mat, u = sla.lu(a)
    np.testing.assert_allclose(p @ l_mat @ u, a, atol=1e-14)
    np.testing.assert_allclose(np.tril(lu, -1) + np.eye(3), l_mat)


def test_expm_jit_and_grad_match_finite_differences():
    a = 2.0 * _rng(8).standard_normal((3, 3))

    def ref(a):
        w, v = np.linalg.eig(a)
        return ((v * np.exp(w)) @ np.linalg.inv(v)).real

    np.testing.assert_allclose(cv.jit(sla.expm)(a), ref(a), rtol=1e-10, atol=1e-10)
    f = lambda a: cnp.sum(sla.expm(a) ** 2)  # noqa: E731
    g = cv.grad(f)(a)
    np.testing.assert_allclose(cv.jit(cv.grad(f))(a), g, rtol=1e-10)
    e = np.zeros((3, 3))
    e[1, 0] = EPS
    fd = (np.sum(ref(a + e) ** 2) - np.sum(ref(a - e) ** 2)) / (2 * EPS)
    np.testing.assert_allclose(g[1, 0], fd, rtol=1e-6)


def test_refusals_name_the_function_and_shapes():
    with pytest.raises(ShapeError, match="solve"):
        la.solve(np.eye(3), np.ones(4))
    with pytest.raises(ShapeError, match="det"):
        la.det(np.ones((2, 3)))
    with pytest.raises(TypeError, match="matrix_power"):
        la.matrix_power(np.eye(2), 1.5)


@pytest.mark.parametrize("assume_a,lower", [("gen", False), ("sym", False), ("sym", True), ("pos", True),
                                            ("her", False)])
def test_scipy_solve_reads_the_triangle_assume_a_names(assume_a, lower):
    rng = _rng(9)
    a = _complex(rng, 3, 3) + 3 * np.eye(3)
    b = _complex(rng, 3)
    if assume_a == "gen":
        full = a
    else:
        half = np.tril(a, -1) if lower else np.triu(a, 1)
        mirrored = (half.conj() if assume_a in ("her", "pos") else half).T
        diag = np.diag(a.diagonal().real if assume_a in ("her", "pos") else a.diagonal())
        full = half + mirrored + diag
    np.testing.assert_allclose(sla.solve(a, b, lower=lower, assume_a=assume_a), np.linalg.solve(full, b), rtol=1e-12)
    # the derivative in the real part of a, with the same mirroring
    ar = a.real
    g = cv.grad(lambda m: cnp.sum(sla.solve(m, b.real, lower=lower, assume_a=assume_a)))(ar)
    # an entry in the triangle not read gets no gradient
    unread = (2, 0) if (assume_a != "gen" and not lower) else ((0, 2) if assume_a != "gen" else None)
    if unread is not None:
        assert g[unread] == 0


def test_norm_of_a_list_of_traced_values():
    f = lambda x, y: la.norm([x, y])  # noqa: E731
    np.testing.assert_allclose(cv.grad(f, argnums=(0, 1))(3.0, 4.0), (0.6, 0.8), rtol=1e-12)


@pytest.mark.parametrize("shapes, axis", [(((2, 3, 4), (3, 4)), -1), (((2, 2, 2), (2, 2)), 0)])
def test_vecdot_counts_axis_in_each_operands_own_dims(shapes, axis):
    """NumPy's vecdot is a gufunc: ``axis`` names a dim of each operand before the others
    broadcast (was a wrong number for operands of different ranks with axis=0)."""
    rng = np.random.default_rng(3)
    x1, x2 = (rng.normal(size=s) + 1j * rng.normal(size=s) for s in shapes)
    np.testing.assert_allclose(cnp.linalg.vecdot(x1, x2, axis=axis), np.linalg.vecdot(x1, x2, axis=axis), rtol=1e-12)
    np.testing.assert_allclose(cnp.linalg.vecdot(x1.real, x2.real, axis=axis),
                               np.linalg.vecdot(x1.real, x2.real, axis=axis), rtol=1e-12)
