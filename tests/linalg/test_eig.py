"""General (non-symmetric) eigenproblems: ``lax.linalg.eig``, ``numpy.linalg.eig`` and
``eigvals`` (cuvmap/lax/linalg_eig.py). Values by the defining identities
``A vr = vr diag(w)`` and ``Aᴴ vl = vl diag(w̄)``, derivatives against finite differences
(both modes, float64 and complex128, second order), vmap against a loop, jit against eager,
and JAX's refusals and NaN conventions."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.lax import linalg as lax_linalg
from cuvmap.test_util import check_grads

from linalg_references import LINALG_DTYPES as DTYPES
from linalg_references import adjoint as _adjoint
from linalg_references import random_matrix as _matrix


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 4), (2, 6, 6), (30, 30), (0, 0), (1, 1)])
def test_eig_satisfies_both_eigenvalue_equations(shape, dtype):
    a = _matrix(np.random.default_rng(0), shape, dtype)
    w, vl, vr = lax_linalg.eig(a)
    complex_dtype = np.result_type(dtype, np.complex64)
    assert w.dtype == vl.dtype == vr.dtype == complex_dtype
    assert w.shape == shape[:-1] and vr.shape == shape
    tol = 100 * (shape[-1] + 1) * np.finfo(dtype).eps * max(1.0, np.abs(a).max(initial=0))
    np.testing.assert_allclose(a @ vr, vr * w[..., None, :], atol=tol)
    np.testing.assert_allclose(_adjoint(a) @ vl, vl * np.conj(w)[..., None, :], atol=tol)
    # geev's normalisation: unit columns, the largest component real
    if shape[-1]:
        for v in (vl, vr):
            np.testing.assert_allclose(np.linalg.norm(v, axis=-2), 1, rtol=1e-4)
            top = np.take_along_axis(v, np.argmax(np.abs(v), axis=-2)[..., None, :], -2)
            np.testing.assert_allclose(top.imag, 0, atol=1e-5)


def test_eigenvalues_of_a_rotation_and_a_triangle_are_their_closed_forms():
    theta = 0.3
    rotation = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    w = np.sort_complex(cnp.linalg.eigvals(rotation))
    np.testing.assert_allclose(w, [np.exp(-1j * theta), np.exp(1j * theta)], rtol=1e-14)
    triangle = np.array([[1.0, 5.0, -2.0], [0.0, 3.0, 7.0], [0.0, 0.0, -4.0]])
    np.testing.assert_allclose(np.sort_complex(cnp.linalg.eigvals(triangle)), [-4, 1, 3], atol=1e-13)


def test_numpy_eig_is_a_named_pair_of_complex_arrays_as_jax():
    a = np.array([[2.0, 1.0], [0.0, 3.0]])  # real eigenvalues: NumPy would return float64
    result = cnp.linalg.eig(a)
    assert result.eigenvalues is result[0] and result.eigenvectors is result[1]
    assert result.eigenvalues.dtype == np.complex128
    np.testing.assert_allclose(np.sort(result.eigenvalues.real), [2, 3])
    np.testing.assert_allclose(cnp.linalg.eigvals(a), result.eigenvalues, rtol=1e-14)
    np.testing.assert_allclose(cnp.linalg.eigvals([[1, 2], [3, 4]]), np.linalg.eigvals([[1.0, 2], [3, 4]]))


@pytest.mark.parametrize("left,right", [(False, False), (True, False), (False, True), (True, True)])
def test_non_finite_matrices_give_nan_not_an_exception(left, right):
    a = np.full((2, 3, 3), np.nan)
    a[1] = np.eye(3)
    out = lax_linalg.eig(a, compute_left_eigenvectors=left, compute_right_eigenvectors=right)
    assert len(out) == 1 + left + right
    for part in out:
        assert np.all(np.isnan(part[0])) and not np.any(np.isnan(part[1]))
    assert np.all(np.isnan(cnp.linalg.eigvals(np.array([[np.inf]]))))


def test_eigvals_gradient_is_diag_of_v_inverse_da_v():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 4))
    da = rng.standard_normal((4, 4))
    w, v = np.linalg.eig(a)
    want = np.diagonal(np.linalg.solve(v, da @ v))
    _, got = cv.jvp(cnp.linalg.eigvals, (a,), (da,))
    np.testing.assert_allclose(got, want, rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_eigvals_derivatives_match_finite_differences(dtype):
    a = _matrix(np.random.default_rng(2), (2, 4, 4), dtype)
    check_grads(cnp.linalg.eigvals, (a,), order=2, modes=("fwd", "rev"), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("left,right", [(False, True), (True, False), (True, True)])
def test_eigenvector_derivatives_of_complex_matrices_match_finite_differences(left, right):
    a = _matrix(np.random.default_rng(3), (4, 4), np.complex128)

    def f(x):
        return lax_linalg.eig(x, compute_left_eigenvectors=left, compute_right_eigenvectors=right,
                              enable_eigvec_derivs=True)

    check_grads(f, (a,), order=2, modes=("fwd", "rev"), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("left,right", [(False, True), (True, False), (True, True)])
def test_eigenvector_derivatives_of_real_matrices_match_finite_differences(left, right):
    a = np.random.default_rng(4).standard_normal((5, 5))

    def f(x):
        out = lax_linalg.eig(x, compute_left_eigenvectors=left, compute_right_eigenvectors=right,
                             enable_eigvec_derivs=True)
        return [out[0]] + [v * v for v in out[1:]]  # v·v: free of geev's sign for a real eigenvector

    # second differences of eigenvectors (gaps ~0.5 here) carry ~1e-5 of truncation error
    check_grads(f, (a,), order=2, modes=("fwd", "rev"), atol=1e-4, rtol=1e-4)


def test_eigenvector_derivatives_need_the_opt_in_as_in_jax():
    a = np.random.default_rng(5).standard_normal((3, 3))
    with pytest.raises(NotImplementedError, match="enable_eigvec_derivs=True"):
        cv.jvp(lambda x: cnp.linalg.eig(x).eigenvectors, (a,), (a,))
    with pytest.raises(NotImplementedError, match="eig: derivatives of non-symmetric eigenvectors"):
        cv.grad(lambda x: cnp.real(cnp.sum(lax_linalg.eig(x)[0])))(a)


def test_vmap_of_eig_matches_a_loop_and_jit_matches_eager():
    a = np.random.default_rng(6).standard_normal((5, 4, 4))
    ws, vs = cv.vmap(cnp.linalg.eig)(a)
    for i in range(5):
        w, v = cnp.linalg.eig(a[i])
        np.testing.assert_allclose(ws[i], w, rtol=1e-12)
        np.testing.assert_allclose(vs[i], v, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(cv.jit(cnp.linalg.eigvals)(a), cnp.linalg.eigvals(a), rtol=1e-14)
    # vmap of the gradient of a real function of the eigenvalues
    grads = cv.vmap(cv.grad(lambda x: cnp.sum(cnp.abs(cnp.linalg.eigvals(x)) ** 2)))(a)
    for i in range(5):
        one = cv.grad(lambda x: cnp.sum(cnp.abs(cnp.linalg.eigvals(x)) ** 2))(a[i])
        np.testing.assert_allclose(grads[i], one, rtol=1e-10)


def test_bad_operands_name_eig():
    with pytest.raises(Exception, match="eig"):
        cnp.linalg.eig(np.ones((2, 3)))
    with pytest.raises(Exception, match="eigvals"):
        cnp.linalg.eigvals(np.ones(3))


@pytest.mark.parametrize("name", ["eig", "schur", "hessenberg", "tridiagonal"])
def test_lax_decompositions_refuse_bad_operands_naming_themselves(name):
    f = getattr(lax_linalg, name)
    for x, what in [(np.ones((2, 3)), "square"), (np.ones(3), "at least 2 dims"), (np.ones((2, 2), np.int32), "int32")]:
        with pytest.raises(ShapeError, match=f"{name}: .*{what}"):
            f(x)
