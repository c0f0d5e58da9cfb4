"""The decompositions of complex matrices under NOTE [complex convention]
(cuvmap/transforms/complex_rules.py), in complex128: svd, eigh, qr, cholesky, slogdet and
pinv (NOTE [svd of complex matrices] in cuvmap/lax/linalg.py, NOTE [complex
decompositions] in cuvmap/lax/linalg_decompositions.py, NOTE [slogdet of complex
matrices] in cuvmap/lax/linalg_solve.py).

A table of cases, each a function of a complex matrix whose value does not depend on the
phases the decomposition is free to choose (the singular values, U S Vᴴ, projectors,
|u_iᴴ A v_i|, ...), is checked against NumPy, against finite differences along complex
directions in both modes (cuvmap.test_util.check_grads: the VJP as the transpose of the
JVP under ⟨u, v⟩ = re Σ u·v), under vmap and under jit. The raw outputs (whose phases
LAPACK picks) are checked for the exact transpose identity ⟨vjp(ct), t⟩ = re⟨ct, jvp(t)⟩,
and their JVPs against finite differences in JAX's phase gauge. Then closed forms
(gradients of real functions against Wirtinger differences, holomorphic compositions),
the derivatives at repeated singular values and eigenvalues, and jacrev's allow_int.
"""
from dataclasses import dataclass

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax
from cuvmap import numpy as cnp
from cuvmap.lax import linalg_solve
from cuvmap.scipy import linalg as sla
from cuvmap.test_util import check_batching, check_grads, wirtinger_derivatives

la = cnp.linalg


def _complex(seed, *shape):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def _hermitian_pd(seed, n, *lead):
    a = _complex(seed, *lead, n, n)
    return a @ np.conj(np.swapaxes(a, -1, -2)) + n * np.eye(n)


def _hermitian(seed, n):
    """A Hermitian matrix with well separated eigenvalues."""
    q, _ = np.linalg.qr(_complex(seed, n, n))
    return (q * np.arange(1.0, n + 1) * 1.5) @ np.conj(q.T)


def _mH(x):
    return cnp.conj(cnp.swapaxes(x, -1, -2))


def _svd_reduced(a):
    return la.svd(a, full_matrices=False)


def _svd_reconstruction(a):
    u, s, vh = _svd_reduced(a)
    return (u * s[..., None, :]) @ vh


def _svd_projectors(a):
    """u_1 u_1ᴴ and v_1 v_1ᴴ: invariant under the common phase of u_1 and v_1."""
    u, _, vh = _svd_reduced(a)
    return u[..., :, :1] @ _mH(u[..., :, :1]), _mH(vh[..., :1, :]) @ vh[..., :1, :]


def _svd_matched(a):
    """|u_iᴴ A v_i| (= s_i) computed from the vectors."""
    u, _, vh = _svd_reduced(a)
    return cnp.abs(cnp.sum(cnp.conj(u) * (a @ _mH(vh)), -2))


def _eigh_function(a):
    """V diag(exp(w/4)) Vᴴ: a matrix function, invariant under the phases of the v_i."""
    w, v = la.eigh(a)
    return (v * cnp.exp(w / 4)[..., None, :]) @ _mH(v)


def _eigh_matched(a):
    w, v = la.eigh(a)
    return cnp.abs(cnp.sum(cnp.conj(v) * (a @ v), -2))


def _qr_product(a):
    q, r = la.qr(a)
    return q @ r


def _numpy_eigh_function(a):
    w, v = np.linalg.eigh((a + np.conj(np.swapaxes(a, -1, -2))) / 2)
    return (v * np.exp(w / 4)[..., None, :]) @ np.conj(np.swapaxes(v, -1, -2))


@dataclass(frozen=True)
class Case:
    """A function ``fun`` of one complex matrix (cuvmap) whose value is independent of the
    decomposition's phase choices, ``ref`` (NumPy, None: only derivatives checked), the
    input and whether second derivatives are checked too."""

    name: str
    fun: object
    ref: object
    make: object
    order: int = 1


CASES = [
    Case("svdvals", la.svdvals, lambda a: np.linalg.svd(a, compute_uv=False), lambda: _complex(0, 4, 3), 2),
    Case("svd_s", lambda a: _svd_reduced(a)[1], lambda a: np.linalg.svd(a, compute_uv=False),
         lambda: _complex(1, 3, 5), 2),
    Case("svd_reconstruction_square", _svd_reconstruction, lambda a: a, lambda: _complex(2, 3, 3), 2),
    Case("svd_reconstruction_tall", _svd_reconstruction, lambda a: a, lambda: _complex(3, 5, 3)),
    Case("svd_reconstruction_wide_stacked", _svd_reconstruction, lambda a: a, lambda: _complex(4, 2, 2, 4)),
    Case("svd_projectors", _svd_projectors, None, lambda: _complex(5, 4, 3)),
    Case("svd_matched", _svd_matched, lambda a: np.linalg.svd(a, compute_uv=False), lambda: _complex(6, 3, 4)),
    Case("norm_2", lambda a: la.norm(a, 2), lambda a: np.linalg.norm(a, 2), lambda: _complex(7, 3, 3)),
    Case("norm_nuc", lambda a: la.norm(a, "nuc"), lambda a: np.linalg.norm(a, "nuc"), lambda: _complex(8, 3, 4)),
    Case("cond", la.cond, np.linalg.cond, lambda: _complex(9, 3, 3)),
    Case("eigvalsh", la.eigvalsh, lambda a: np.linalg.eigvalsh((a + np.conj(a.T)) / 2),
         lambda: _hermitian(10, 4), 2),
    Case("eigh_function", _eigh_function, _numpy_eigh_function, lambda: _hermitian(11, 4)),
    Case("eigh_matched", _eigh_matched, lambda a: np.linalg.eigvalsh(a), lambda: _hermitian(12, 3)),
    Case("eigh_upper_triangle", lambda a: la.eigh(a, UPLO="U", symmetrize_input=False)[0],
         lambda a: np.linalg.eigvalsh(a, UPLO="U"), lambda: _hermitian(13, 3)),
    Case("qr_r", lambda a: la.qr(a).R, lambda a: np.linalg.qr(a).R, lambda: _complex(14, 4, 3), 2),
    Case("qr_q", lambda a: la.qr(a).Q, lambda a: np.linalg.qr(a).Q, lambda: _complex(15, 4, 3)),
    Case("qr_wide", lambda a: la.qr(a), lambda a: tuple(np.linalg.qr(a)), lambda: _complex(16, 3, 5)),
    Case("qr_complete_tall", lambda a: la.qr(a, mode="complete"), lambda a: tuple(np.linalg.qr(a, mode="complete")),
         lambda: _complex(24, 4, 2), 2),
    Case("qr_product_stacked", _qr_product, lambda a: a, lambda: _complex(17, 2, 3, 3)),
    Case("cholesky", la.cholesky, np.linalg.cholesky, lambda: _hermitian_pd(18, 3), 2),
    Case("cholesky_upper", lambda a: la.cholesky(a, upper=True),
         lambda a: np.conj(np.linalg.cholesky(a).T), lambda: _hermitian_pd(19, 3)),
    Case("slogdet", lambda a: tuple(la.slogdet(a)), lambda a: tuple(np.linalg.slogdet(a)),
         lambda: _complex(20, 3, 3), 2),
    Case("pinv_tall", la.pinv, np.linalg.pinv, lambda: _complex(21, 4, 2), 2),
    Case("pinv_wide_stacked", la.pinv, np.linalg.pinv, lambda: _complex(22, 2, 2, 3)),
    Case("lstsq", lambda a: la.lstsq(a, _complex(0, 4))[0], lambda a: np.linalg.lstsq(a, _complex(0, 4))[0],
         lambda: _complex(23, 4, 3)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_values_derivatives_vmap_and_jit(case):
    a = case.make()
    out = case.fun(a)
    if case.ref is not None:
        for got, want in zip(cv.tree.leaves(out), cv.tree.leaves(case.ref(a))):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    check_grads(case.fun, (a,), order=case.order, atol=1e-5, rtol=1e-5)
    for got, want in zip(cv.tree.leaves(cv.jit(case.fun)(a)), cv.tree.leaves(out)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    stack = np.stack([a, a + 0.1 * _complex(99, *a.shape)])
    check_batching(case.fun, (stack,), atol=1e-10, rtol=1e-10)


def _transpose_identity(f, a, seed=0):
    """⟨vjp(ct), t⟩ = re⟨ct, jvp(t)⟩ for random complex t and ct (real ct on real outputs)."""
    rng = np.random.default_rng(seed)

    def like(x):
        x = np.asarray(x)
        r = rng.standard_normal(x.shape)
        return r + 1j * rng.standard_normal(x.shape) if np.iscomplexobj(x) else r

    t = like(a)
    out, t_out = cv.jvp(f, (a,), (t,))
    ct = cv.tree.map(like, out)
    (ct_a,) = cv.vjp(f, a)[1](ct)
    lhs = np.real(np.sum(np.asarray(ct_a) * t))
    rhs = sum(np.real(np.sum(np.asarray(c) * np.asarray(d))) for c, d in zip(cv.tree.leaves(ct), cv.tree.leaves(t_out)))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name,f,make", [
    ("svd_square", _svd_reduced, lambda: _complex(30, 3, 3)),
    ("svd_tall", _svd_reduced, lambda: _complex(31, 5, 3)),
    ("svd_wide", _svd_reduced, lambda: _complex(32, 3, 5)),
    ("svd_values", la.svdvals, lambda: _complex(33, 3, 4)),
    ("eigh_lower", lambda a: lax.eigh(a, symmetrize_input=False), lambda: _hermitian(34, 4)),
    ("eigh_upper", lambda a: lax.eigh(a, lower=False, symmetrize_input=False), lambda: _hermitian(35, 4)),
    ("eigh_symmetrized", lax.eigh, lambda: _complex(36, 3, 3)),
    ("qr_tall", lambda a: lax.qr(a, full_matrices=False), lambda: _complex(37, 5, 3)),
    ("qr_wide_full", lambda a: lax.qr(a, full_matrices=True), lambda: _complex(38, 3, 5)),
    ("qr_tall_full", lambda a: lax.qr(a, full_matrices=True), lambda: _complex(43, 5, 2)),
    ("cholesky", lax.cholesky, lambda: _hermitian_pd(39, 4)),
    ("cholesky_lower_triangle", lambda a: lax.cholesky(a, symmetrize_input=False), lambda: _hermitian_pd(40, 3)),
    ("slogdet", linalg_solve.slogdet, lambda: _complex(41, 3, 3)),
    ("pinv", la.pinv, lambda: _complex(42, 3, 4)),
])
def test_vjp_is_the_transpose_of_the_jvp(name, f, make):
    _transpose_identity(f, make())


def _aligned(vectors, reference):
    """Each column of ``vectors`` times the phase that makes its product with the column
    of ``reference`` real and positive (and the phases applied)."""
    phase = np.sum(np.conj(reference) * vectors, axis=-2)
    phase = phase / np.abs(phase)
    return vectors / phase[..., None, :], phase


@pytest.mark.parametrize("shape", [(3, 3), (5, 3), (3, 5)])
def test_svd_jvp_is_jaxs_phase_gauge(shape):
    """JAX's gauge puts the phase change of each pair (u_i, v_i) into u_i:
    diag(Vᴴ dV) = 0. Finite differences of LAPACK's vectors, each pair turned by the
    phase that keeps v_i's overlap with the unperturbed v_i real, see exactly that."""
    a, t, eps = _complex(50, *shape), _complex(51, *shape), 1e-6
    u0, _, vh0 = np.linalg.svd(a, full_matrices=False)

    def gauged(x):
        u, s, vh = np.linalg.svd(x, full_matrices=False)
        v, phase = _aligned(np.conj(vh.T), np.conj(vh0.T))
        return u / phase[None, :], s, np.conj(v.T)

    fd = [(p - m) / (2 * eps) for p, m in zip(gauged(a + eps * t), gauged(a - eps * t))]
    _, tangents = cv.jvp(_svd_reduced, (a,), (t,))
    for got, want in zip(tangents, fd):
        np.testing.assert_allclose(got, want, atol=1e-6)
    # the whole phase change is in U: diag(Vᴴ dV) = 0
    dvh = np.asarray(tangents[2])
    np.testing.assert_allclose(np.diag(vh0 @ np.conj(dvh.T)), 0, atol=1e-12)


def test_eigh_jvp_is_jaxs_phase_gauge():
    """diag(Vᴴ dV) = 0 (JAX's eigh_jvp_rule): finite differences of the eigenvectors
    turned to keep each one's overlap with the unperturbed one real."""
    a, eps = _hermitian(52, 4), 1e-6
    t = _complex(53, 4, 4)
    t = (t + np.conj(t.T)) / 2
    _, v0 = np.linalg.eigh(a)

    def gauged(x):
        w, v = np.linalg.eigh(x)
        return w, _aligned(v, v0)[0]

    fd = [(p - m) / (2 * eps) for p, m in zip(gauged(a + eps * t), gauged(a - eps * t))]
    _, (dw, dv) = cv.jvp(la.eigh, (a,), (t,))
    np.testing.assert_allclose(dw, fd[0], atol=1e-6)
    np.testing.assert_allclose(dv, fd[1], atol=1e-6)
    np.testing.assert_allclose(np.diag(np.conj(v0.T) @ np.asarray(dv)), 0, atol=1e-12)


def test_grads_of_real_functions_are_jaxs():
    """grad of a real f of complex A is ∂f/∂x − i ∂f/∂y: Σ s is conj(U Vᴴ), log|det A| is
    A⁻ᵀ, Σ w of a Hermitian matrix (symmetrized) is the identity; each against Wirtinger
    differences too."""
    a = _complex(60, 3, 3)
    u, _, vh = np.linalg.svd(a)
    g = cv.grad(lambda x: cnp.sum(la.svdvals(x)))(a)
    np.testing.assert_allclose(g, np.conj(u @ vh), rtol=1e-10)
    np.testing.assert_allclose(cv.grad(lambda x: la.slogdet(x).logabsdet)(a), np.linalg.inv(a).T, rtol=1e-10)
    np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(la.eigvalsh(x)))(a), np.eye(3), atol=1e-12)

    def largest_singular_value(x):
        return cnp.sum(_svd_reduced(x)[1][..., 0])

    def by_entry(x):  # the same, as an elementwise function of one entry of a
        out = np.empty(x.shape)
        for i in np.ndindex(x.shape):
            b = a.copy()
            b[1, 2] = x[i]
            out[i] = np.linalg.svd(b, compute_uv=False)[0]
        return out

    d_dz, d_dzbar = wirtinger_derivatives(by_entry, a[1, 2:3])
    np.testing.assert_allclose(cv.grad(largest_singular_value)(a)[1, 2], 2 * d_dz[0], rtol=1e-6)
    np.testing.assert_allclose(d_dzbar, np.conj(d_dz), rtol=1e-6)  # (a real f)


def test_holomorphic_compositions():
    """det = sign·exp(logabsdet) is holomorphic through the complex sign's rule (grad with
    holomorphic=True: det(A)·A⁻ᵀ); Q R and pinv of an invertible matrix (= inv) are too."""
    a = _complex(61, 3, 3)

    def det_from_slogdet(x):
        sign, logabsdet = la.slogdet(x)
        return sign * cnp.exp(logabsdet)

    g = cv.grad(det_from_slogdet, holomorphic=True)(a)
    np.testing.assert_allclose(g, np.linalg.det(a) * np.linalg.inv(a).T, rtol=1e-10)
    jac = cv.jacfwd(_qr_product, holomorphic=True)(a)
    np.testing.assert_allclose(jac, np.eye(9).reshape(3, 3, 3, 3), atol=1e-12)
    inv = np.linalg.inv(a)
    jac = cv.jacrev(la.pinv, holomorphic=True)(a)
    np.testing.assert_allclose(jac, -np.einsum("ik,lj->ijkl", inv, inv), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_pinv_derivative_at_repeated_singular_values(dtype):
    """JAX's testPinvGradIssue2792: the derivative through the SVD is NaN at the identity
    (all singular values equal); pinv's own rule gives d(pinv) = −dA there, and for a
    rank-deficient matrix it is right along directions that keep the rank."""
    eye = np.eye(2, dtype=dtype)
    holomorphic = dtype == np.complex128  # (pinv = inv near the identity)
    for jac in (cv.jacrev(la.pinv, holomorphic=holomorphic), cv.jacfwd(la.pinv, holomorphic=holomorphic)):
        np.testing.assert_allclose(jac(eye), -np.eye(4).reshape(2, 2, 2, 2), atol=1e-12)

    def f(p):
        return la.pinv(cnp.array([[0.0, 0.0], [-p, 1.0]]) / (1 + p ** 2))

    np.testing.assert_allclose(cv.jacrev(f)(2.0), [[0.0, -1.0], [0.0, 0.0]], atol=1e-12)
    b, c = _complex(62, 4, 2), _complex(63, 2, 3)
    a, t = b @ c, _complex(64, 4, 2) @ c  # rank 2, and a direction that keeps the row space
    eps = 1e-6
    fd = (np.linalg.pinv(a + eps * t) - np.linalg.pinv(a - eps * t)) / (2 * eps)
    np.testing.assert_allclose(cv.jvp(la.pinv, (a,), (t,))[1], fd, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_zero_vector_cotangents_at_repeated_values(dtype):
    """JAX's testIssue669: grad of Σ eigenvalues at the identity is the identity (the
    eigenvectors' zero cotangent times the infinite gap is no NaN), and so for Σ s
    through the whole SVD."""
    eye = np.eye(3, dtype=dtype)
    f = lambda x: cnp.real(cnp.sum(la.eigh(x)[0]))  # noqa: E731
    np.testing.assert_allclose(cv.jit(cv.grad(cv.jit(f)))(eye), np.eye(3), atol=1e-12)
    g = lambda x: cnp.sum(la.svd(x)[1])  # noqa: E731
    np.testing.assert_allclose(cv.grad(g)(eye), np.eye(3), atol=1e-12)
    h = lambda x: cnp.sum(_svd_reduced(x)[1])  # noqa: E731
    np.testing.assert_allclose(cv.grad(h)(np.eye(4, 2, dtype=dtype)), np.eye(4, 2), atol=1e-12)


@pytest.mark.parametrize("left_side,transpose_a", [(True, True), (True, False), (False, True), (False, False)])
def test_triangular_solve_conjugate_a(left_side, transpose_a):
    """JAX's conjugate_a: op(a) = conj(a), or aᴴ with transpose_a; derivatives through conj."""
    a = np.tril(_complex(80, 3, 3)) + 3 * np.eye(3)
    b = _complex(81, 3, 2) if left_side else _complex(81, 2, 3)

    def f(a, b):
        return lax.linalg.triangular_solve(a, b, left_side=left_side, lower=True, transpose_a=transpose_a,
                                           conjugate_a=True)

    op = np.conj(a).T if transpose_a else np.conj(a)
    x = f(a, b)
    np.testing.assert_allclose(op @ x if left_side else x @ op, b, atol=1e-12)
    check_grads(f, (a, b), order=1)


@pytest.mark.parametrize("lower", [True, False])
def test_scipy_cho_factor_and_cho_solve_of_hermitian_matrices(lower):
    """a = c cᴴ (lower) or cᴴ c: the factor and the solve against SciPy's closed forms
    (checked with NumPy: c from numpy.linalg.cholesky), derivatives by finite differences."""
    h, b = _hermitian_pd(90, 3), _complex(91, 3, 2)
    c, is_lower = sla.cho_factor(h, lower=lower)
    low = np.linalg.cholesky(h)
    np.testing.assert_allclose(c, low if lower else np.conj(low.T), atol=1e-12)
    assert is_lower == lower
    np.testing.assert_allclose(sla.cho_solve((c, lower), b), np.linalg.solve(h, b), atol=1e-12)
    check_grads(lambda h, b: sla.cho_solve(sla.cho_factor(h, lower=lower), b), (h, b), order=1)


@pytest.mark.parametrize("trans", [0, 1, 2, "C"])
def test_scipy_solves_with_trans(trans):
    """op(a) = a, aᵀ or aᴴ (2, 'C') in solve_triangular and lu_solve."""
    a, b = _complex(92, 3, 3) + 3 * np.eye(3), _complex(93, 3, 2)
    op = {0: a, 1: a.T, 2: np.conj(a.T), "C": np.conj(a.T)}[trans]
    t = np.triu(a)
    op_t = {0: t, 1: t.T, 2: np.conj(t.T), "C": np.conj(t.T)}[trans]
    np.testing.assert_allclose(sla.solve_triangular(t, b, trans=trans), np.linalg.solve(op_t, b), atol=1e-12)
    np.testing.assert_allclose(sla.lu_solve(sla.lu_factor(a), b, trans=trans), np.linalg.solve(op, b), atol=1e-12)
    check_grads(lambda a, b: sla.lu_solve(sla.lu_factor(a), b, trans=trans), (a, b), order=1)
    check_grads(lambda t, b: sla.solve_triangular(t, b, trans=trans), (t, b), order=1)


@pytest.mark.parametrize("left_side", [True, False])
def test_triangular_solve_of_a_vector(left_side):
    """b (..., n) is one column (left side) or one row, as JAX's."""
    a, b = np.tril(_complex(94, 2, 4, 4)) + 3 * np.eye(4), _complex(95, 2, 4)

    def f(a, b):
        return lax.linalg.triangular_solve(a, b, left_side=left_side, lower=True, transpose_a=True, conjugate_a=True)

    x = f(a, b)
    op = np.conj(np.swapaxes(a, -1, -2))
    got = np.einsum("bij,bj->bi", op, x) if left_side else np.einsum("bj,bji->bi", x, op)
    np.testing.assert_allclose(got, b, atol=1e-12)
    check_grads(f, (a, b), order=1)


@pytest.mark.parametrize("shape", [(0, 2), (2, 0), (0, 0)])
@pytest.mark.parametrize("ord_", [1, 2, np.inf, "fro", "nuc"])
def test_norms_of_empty_matrices_are_zero(shape, ord_):
    """JAX's: a norm of no entries is 0 (NumPy's max raises for some)."""
    assert float(la.matrix_norm(np.zeros(shape, np.complex64), ord=ord_)) == 0
    if shape[0] == 0:
        assert float(la.vector_norm(np.zeros(0, np.complex64), ord=ord_ if ord_ in (1, 2, np.inf) else 2)) == 0


@pytest.mark.parametrize("a_shape,b_shape", [((0, 3), (0,)), ((3, 0), (3,)), ((3, 1), (3, 0))])
def test_lstsq_of_empty_systems_matches_numpy(a_shape, b_shape):
    a, b = _complex(96, *a_shape), _complex(97, *b_shape)
    for got, want in zip(la.lstsq(a, b, numpy_resid=True), np.linalg.lstsq(a, b)):
        assert np.shape(got) == np.shape(want)
        np.testing.assert_allclose(got, want)
