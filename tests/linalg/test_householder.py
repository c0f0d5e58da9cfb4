"""Householder reductions in LAPACK's packed form (cuvmap/lax/linalg_householder.py) and
their SciPy front ends (cuvmap/scipy/linalg_reductions.py): ``householder_product``
against the product of the reflectors written from their definition, ``hessenberg`` and
``tridiagonal`` by their identities (A = Q H Qᴴ, the eigenvalues kept, LAPACK's sign of
β in closed form, the unread triangle untouched), ``qr_multiply`` against NumPy's QR;
vmap, jit, and the refusal to differentiate (as JAX)."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.lax import linalg as lax_linalg
from cuvmap.scipy import linalg as sla

from linalg_references import LINALG_DTYPES as DTYPES
from linalg_references import adjoint as _adjoint
from linalg_references import random_matrix as _matrix


def _tol(dtype):
    return 1e-4 if np.finfo(dtype).eps > 1e-10 else 1e-11


def _reflector_product(a, taus):
    """``H_0 ⋯ H_{k-1}`` (first n columns), ``H_i = I − τ_i v_i v_iᴴ``, one matrix at a time."""
    m, n = a.shape
    q = np.eye(m, dtype=a.dtype)
    for i, tau in enumerate(taus):
        v = np.zeros(m, dtype=a.dtype)
        v[i] = 1
        v[i + 1:] = a[i + 1:, i]
        q = q @ (np.eye(m, dtype=a.dtype) - tau * np.outer(v, np.conj(v)))
    return q[:, :n]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k", [((1, 1), 1), ((3, 4, 4), 2), ((10, 5), 5), ((10, 5), 3), ((6, 6), 0)])
def test_householder_product_is_the_product_of_the_reflectors(shape, k, dtype):
    rng = np.random.default_rng(0)
    a, taus = _matrix(rng, shape, dtype), _matrix(rng, shape[:-2] + (k,), dtype)
    got = lax_linalg.householder_product(a, taus)
    flat_a = a.reshape((-1,) + shape[-2:])
    flat_t = taus.reshape(flat_a.shape[0], k)
    want = np.stack([_reflector_product(x, t) for x, t in zip(flat_a, flat_t)]).reshape(shape)
    np.testing.assert_allclose(got, want, atol=_tol(dtype) * 10)
    np.testing.assert_allclose(cv.jit(lax_linalg.householder_product)(a, taus), got, atol=_tol(dtype))


def test_householder_product_checks_its_shapes():
    with pytest.raises(ShapeError, match="householder_product: a must be"):
        lax_linalg.householder_product(np.ones((2, 3)), np.ones(1))
    with pytest.raises(ShapeError, match="householder_product: taus must be"):
        lax_linalg.householder_product(np.ones((4, 3)), np.ones(4))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (2, 4, 4), (10, 10)])
def test_hessenberg_reduces_by_a_unitary_similarity(shape, dtype):
    a = _matrix(np.random.default_rng(1), shape, dtype)
    h, q = sla.hessenberg(a, calc_q=True)
    assert h.dtype == q.dtype == dtype
    np.testing.assert_array_equal(np.tril(h, -2), 0)
    n = shape[-1]
    np.testing.assert_allclose(q @ h @ _adjoint(q), a, atol=_tol(dtype) * 10)
    np.testing.assert_allclose(q @ _adjoint(q), np.broadcast_to(np.eye(n), a.shape), atol=_tol(dtype))
    np.testing.assert_allclose(sla.hessenberg(a), h)
    # LAPACK's reflector: the first column becomes (a00, β, 0, ...), β = −sign(re a10) ‖a[1:, 0]‖
    if n > 2:
        beta = -np.sign(a[..., 1, 0].real) * np.linalg.norm(a[..., 1:, 0], axis=-1)
        np.testing.assert_allclose(h[..., 1, 0], beta, rtol=_tol(dtype))
        # the packed reflectors (below the subdiagonal) and taus give Q (bordered by 1)
        packed, taus = lax_linalg.hessenberg(a)
        assert taus.shape == shape[:-2] + (n - 1,)
        flat_p, flat_t = packed.reshape((-1, n, n)), taus.reshape(-1, n - 1)
        for p, t, qq in zip(flat_p, flat_t, q.reshape((-1, n, n))):
            np.testing.assert_allclose(qq[1:, 1:], _reflector_product(p[1:, :-1], t), atol=_tol(dtype))


def test_hessenberg_under_vmap_jit_and_its_refusal_to_differentiate():
    a = np.random.default_rng(2).standard_normal((3, 5, 5))
    h = sla.hessenberg(a)
    np.testing.assert_allclose(cv.vmap(sla.hessenberg)(a), h, atol=1e-14)
    np.testing.assert_allclose(cv.jit(lambda x: sla.hessenberg(x, calc_q=True)[1])(a),
                               sla.hessenberg(a, calc_q=True)[1], atol=1e-14)
    assert sla.hessenberg(np.zeros((0, 0))).shape == (0, 0)
    with pytest.raises(NotImplementedError, match="hessenberg has no derivative rule"):
        cv.grad(lambda x: cnp.sum(sla.hessenberg(x)))(a[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (2, 2, 2), (4, 4), (2, 7, 7)])
def test_tridiagonal_keeps_the_spectrum_of_the_triangle_read(shape, lower, dtype):
    a = _matrix(np.random.default_rng(3), shape, dtype)
    packed, d, e, taus = lax_linalg.tridiagonal(a, lower=lower)
    n = shape[-1]
    real = np.finfo(dtype).dtype
    assert d.dtype == e.dtype == real and packed.dtype == taus.dtype == dtype
    assert d.shape == shape[:-1] and e.shape == taus.shape == shape[:-2] + (n - 1,)
    half, strict = (np.tril(a), np.tril(a, -1)) if lower else (np.triu(a), np.triu(a, 1))
    herm = half + _adjoint(strict)
    herm = herm - 1j * np.imag(np.diagonal(herm, 0, -2, -1))[..., None] * np.eye(n) if herm.dtype.kind == "c" else herm
    i = np.arange(n - 1)
    t = d[..., :, None] * np.eye(n)
    t[..., i + 1, i] = e
    t[..., i, i + 1] = e
    np.testing.assert_allclose(np.linalg.eigvalsh(t), np.linalg.eigvalsh(herm.astype(np.complex128)),
                               atol=_tol(dtype) * 10)
    # the other triangle is untouched, the diagonal holds d, the first off-diagonal e
    other = np.triu(a, 1) if lower else np.tril(a, -1)
    np.testing.assert_array_equal(np.triu(packed, 1) if lower else np.tril(packed, -1), other)
    np.testing.assert_allclose(np.diagonal(packed, 0, -2, -1), d)
    np.testing.assert_allclose(np.diagonal(packed, -1 if lower else 1, -2, -1), e)
    if n > 2 and lower:  # LAPACK's β of the first column
        beta = -np.sign(a[..., 1, 0].real) * np.linalg.norm(a[..., 1:, 0], axis=-1)
        np.testing.assert_allclose(e[..., 0], beta, rtol=_tol(dtype))


def test_tridiagonal_under_vmap_and_jit():
    a = np.random.default_rng(4).standard_normal((3, 6, 6))
    want = lax_linalg.tridiagonal(a, lower=False)
    for got in (cv.vmap(lambda x: lax_linalg.tridiagonal(x, lower=False))(a),
                cv.jit(lambda x: lax_linalg.tridiagonal(x, lower=False))(a)):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-14)
    with pytest.raises(NotImplementedError, match="tridiagonal has no derivative rule"):
        cv.grad(lambda x: cnp.sum(lax_linalg.tridiagonal(x)[1]))(a[0])


@pytest.mark.parametrize("shape", [(4, 3), (4, 4), (6, 4), (3, 6, 4)])
@pytest.mark.parametrize("mode", ["left", "right"])
def test_qr_multiply_multiplies_by_the_reduced_q(shape, mode):
    rng = np.random.default_rng(5)
    m, n = shape[-2:]
    k = min(m, n)
    a = rng.standard_normal(shape)
    c = rng.standard_normal(shape[:-2] + ((k, 2) if mode == "left" else (2, m)))
    out, r = sla.qr_multiply(a, c, mode=mode)
    q, r_ref = np.linalg.qr(a)
    np.testing.assert_allclose(out, q @ c if mode == "left" else c @ q, atol=1e-12)
    np.testing.assert_allclose(r, r_ref, atol=1e-12)
    vector = rng.standard_normal(k if mode == "left" else m)
    out, _ = sla.qr_multiply(a[..., :, :] if len(shape) == 2 else a[0], vector, mode=mode)
    assert out.ndim == 1
    with pytest.raises(NotImplementedError, match="pivoting"):
        sla.qr_multiply(a, c, mode=mode, pivoting=True)
    with pytest.raises(ValueError, match="mode must be"):
        sla.qr_multiply(a, c, mode="up")


def test_reductions_keep_their_results_on_the_operands_device(backend):
    """On the GPU (the strict CuPy stand-in without one) every result stays on the device
    and equals the CPU's."""
    from cuvmap import backend as cv_backend
    rng = np.random.default_rng(6)
    a, taus, c = rng.standard_normal((2, 5, 5)), rng.standard_normal((2, 3)), rng.standard_normal((2, 2, 5))
    put = (lambda x: cv.device_put(x, "gpu")) if backend == "gpu" else (lambda x: x)
    cases = [
        (lambda m: sla.hessenberg(m(a), calc_q=True)),
        (lambda m: lax_linalg.householder_product(m(a), m(taus))),
        (lambda m: lax_linalg.tridiagonal(m(a), lower=False)),
        (lambda m: sla.qr_multiply(m(a), m(c))),
    ]
    for case in cases:
        got, want = case(put), case(lambda x: x)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for g, w in zip(got, want):
            if backend == "gpu":
                assert cv_backend.is_cupy_array(g)
                g = cv.device_put(g, "cpu")
            np.testing.assert_allclose(g, w, atol=1e-12)
