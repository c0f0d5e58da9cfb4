"""The JAX arguments of cuvmap.numpy.linalg and cuvmap.lax.linalg functions beyond NumPy's:
``svd(..., algorithm=, subset_by_index=)``, ``slogdet(..., method=)``,
``matrix_rank(..., hermitian=, tol=)``, ``pinv(..., rcond=)``, ``qr(mode='full')``.
Values against NumPy, derivatives against finite differences (float64)."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.lax as lax
import cuvmap.numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.test_util import check_batching, check_grads

la = cnp.linalg


def _rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("algorithm", [None, *lax.linalg.SvdAlgorithm, "QR", "divide_and_conquer"])
def test_svd_algorithm_is_checked_and_gives_the_svd(algorithm):
    a = _rng(1).standard_normal((2, 5, 3))
    u, s, vh = lax.linalg.svd(a, full_matrices=False, algorithm=algorithm)
    np.testing.assert_allclose((u * s[..., None, :]) @ vh, a, atol=1e-13)
    np.testing.assert_allclose(lax.linalg.svd(a, compute_uv=False, algorithm=algorithm), np.linalg.svd(a)[1],
                               rtol=1e-13)


def test_svd_refuses_an_unknown_algorithm():
    with pytest.raises(TypeError, match="svd: algorithm must be None or one of SvdAlgorithm.DEFAULT"):
        lax.linalg.svd(np.eye(3), algorithm="lanczos")


@pytest.mark.parametrize("subset", [(0, 3), (1, 3), (0, 1), (2, 2)])
def test_svd_subset_by_index_slices_the_triplets(subset):
    a = _rng(2).standard_normal((4, 3))
    start, end = subset
    u, s, vh = np.linalg.svd(a, full_matrices=False)
    got_s = la.svd(a, compute_uv=False, subset_by_index=subset)
    np.testing.assert_allclose(got_s, s[start:end], rtol=1e-13)
    gu, gs, gvh = la.svd(a, full_matrices=False, subset_by_index=subset)
    np.testing.assert_allclose(gs, s[start:end], rtol=1e-13)
    # each triplet is defined up to a common sign: compare u_i v_iᵀ
    np.testing.assert_allclose(np.einsum("ik,kj->kij", gu, gvh), np.einsum("ik,kj->kij", u, vh)[start:end],
                               atol=1e-13)
    check_grads(lambda x: la.svd(x, compute_uv=False, subset_by_index=subset), (a,), order=1)
    check_batching(lambda x: la.svd(x, compute_uv=False, subset_by_index=subset), (_rng(3).standard_normal((3, 4, 3)),))


def test_svd_subset_by_index_refusals():
    a = np.ones((4, 3))
    with pytest.raises(ValueError, match="full_matrices and subset_by_index cannot both be set"):
        la.svd(a, subset_by_index=(0, 2))
    with pytest.raises(ShapeError, match=r"svd: subset_by_index \(1, 4\) is out of range"):
        la.svd(a, full_matrices=False, subset_by_index=(1, 4))
    assert la.svd(a, subset_by_index=(0, 3)).U.shape == (4, 4)  # the whole range is no subset


@pytest.mark.parametrize("method", [None, "lu", "qr"])
@pytest.mark.parametrize("shape", [(0, 0), (1, 1), (3, 3), (2, 4, 4)])
def test_slogdet_methods_agree_with_numpy(method, shape):
    a = _rng(4).standard_normal(shape)
    sign, logabsdet = la.slogdet(a, method=method)
    want_sign, want_log = np.linalg.slogdet(a)
    np.testing.assert_array_equal(sign, want_sign)
    np.testing.assert_allclose(logabsdet, want_log, rtol=1e-12, atol=1e-13)


def test_slogdet_qr_derivatives_vmap_jit_and_refusal():
    a = _rng(5).standard_normal((3, 4, 4))
    check_grads(lambda x: la.slogdet(x, method="qr").logabsdet, (a,), order=2)
    check_batching(lambda x: la.slogdet(x, method="qr"), (a,))
    np.testing.assert_allclose(cv.jit(lambda x: la.slogdet(x, method="qr"))(a)[1], np.linalg.slogdet(a)[1],
                               rtol=1e-12)
    with pytest.raises(ValueError, match="Unknown slogdet method 'cholesky'"):
        la.slogdet(a, method="cholesky")


def test_matrix_rank_tol_is_jaxs_alias_of_rtol_and_hermitian_is_accepted():
    rng = _rng(6)
    low = rng.standard_normal((6, 2)) @ rng.standard_normal((2, 6))  # rank 2
    sym = low + low.T  # rank at most 4
    assert int(la.matrix_rank(low)) == 2
    assert int(la.matrix_rank(sym, hermitian=True)) == np.linalg.matrix_rank(sym, hermitian=True)
    s = np.linalg.svd(low, compute_uv=False)
    rtol = 0.5 * s[1] / s[0]  # keeps two values relative to the largest
    assert int(la.matrix_rank(low, rtol=rtol)) == int(la.matrix_rank(low, tol=rtol)) == 2
    assert int(la.matrix_rank(low, tol=1.5 * s[1] / s[0])) == 1
    np.testing.assert_array_equal(la.matrix_rank(np.stack([low, np.eye(6)]), rtol=np.array([1e-8, 0.5])), [2, 6])
    np.testing.assert_array_equal(la.matrix_rank(np.zeros((2, 0, 3))), [0, 0])
    with pytest.raises(ValueError, match="matrix_rank: only one of tol or rtol may be specified."):
        la.matrix_rank(low, rtol=1e-2, tol=1e-2)


def test_pinv_rcond_and_rtol_and_empty_matrices():
    x = np.ones((3, 3))
    np.testing.assert_array_equal(la.pinv(x, rcond=1e-2), la.pinv(x, rtol=1e-2))
    with pytest.raises(ValueError, match="pinv: only one of rtol and rcond may be specified."):
        la.pinv(x, rcond=1e-2, rtol=1e-2)
    for shape in [(3, 0, 2), (0, 4), (2, 0)]:
        got = la.pinv(np.zeros(shape))
        assert got.shape == np.linalg.pinv(np.zeros(shape)).shape


def test_numpy_qr_full_is_reduced():
    a = _rng(7).standard_normal((5, 3))
    q, r = la.qr(a, mode="full")
    want_q, want_r = np.linalg.qr(a, mode="reduced")
    np.testing.assert_allclose(q, want_q, atol=1e-13)
    np.testing.assert_allclose(r, want_r, atol=1e-13)


@pytest.mark.parametrize("shape", [(0, 2), (2, 0), (0, 0)])
@pytest.mark.parametrize("ord_", [1, 2, np.inf, "fro", "nuc"])
def test_norms_of_empty_matrices_are_zero(shape, ord_):
    assert float(la.matrix_norm(np.zeros(shape), ord=ord_)) == 0.0
    assert float(la.norm(np.zeros(shape), ord_)) == 0.0


@pytest.mark.parametrize("ord_", [1, 2, np.inf])
def test_norms_of_empty_vectors_are_zero(ord_):
    assert float(la.vector_norm(np.zeros(0), ord=ord_)) == 0.0


def test_max_and_min_of_empty_slices_are_initial():
    np.testing.assert_array_equal(cnp.max(np.zeros((2, 0)), 1, keepdims=True, initial=0.5), [[0.5], [0.5]])
    np.testing.assert_array_equal(cnp.min(np.zeros((0, 0, 3)), (0, 1), initial=5.0), [5.0, 5.0, 5.0])
    np.testing.assert_array_equal(cv.vmap(lambda x: cnp.max(x, initial=-1.0))(np.zeros((3, 0))), [-1.0] * 3)
    np.testing.assert_array_equal(cv.jit(lambda x: cnp.max(x, 1, initial=-1.0))(np.zeros((3, 0))), [-1.0] * 3)
    with pytest.raises(ValueError, match="zero-size array"):
        cnp.max(np.zeros((2, 0)), 1)


def test_lstsq_of_empty_matrices():
    for a_shape, b_shape in [((0, 3), (0,)), ((3, 0), (3,)), ((4, 0), (4, 2))]:
        x, _, rank, s = la.lstsq(np.zeros(a_shape), np.zeros(b_shape))
        want = np.linalg.lstsq(np.zeros(a_shape), np.zeros(b_shape), rcond=None)
        np.testing.assert_array_equal(x, want[0])
        assert int(rank) == 0 and np.shape(s) == (0,)


def test_matrix_power_of_booleans_stays_boolean():
    m = np.array([[True, True], [False, True]])
    for n in (0, 1, 2, 3):
        got = la.matrix_power(m, n)
        np.testing.assert_array_equal(got, np.linalg.matrix_power(m, n))
        assert np.asarray(got).dtype == np.bool_


def test_triangular_and_cholesky_solves_take_one_matrix_b_beside_a_stack():
    from cuvmap.scipy import linalg as sla

    rng = _rng(8)
    a = np.triu(rng.standard_normal((3, 4, 4))) + 4 * np.eye(4)
    b = rng.standard_normal((4, 2))  # one (n, k) matrix, not a stack of 4-vectors
    x = sla.solve_triangular(a, b)
    assert x.shape == (3, 4, 2)
    np.testing.assert_allclose(a @ x, np.broadcast_to(b, (3, 4, 2)), atol=1e-12)
    x = sla.cho_solve((a, False), b)
    np.testing.assert_allclose(np.swapaxes(a, -1, -2) @ a @ x, np.broadcast_to(b, (3, 4, 2)), atol=1e-12)
    v = rng.standard_normal((3, 4))  # a stack of vectors: one dim fewer than a, last dim n
    x = sla.solve_triangular(a, v)
    np.testing.assert_allclose(np.einsum("bij,bj->bi", a, x), v, atol=1e-12)


def test_vector_norm_refusal_has_jaxs_message():
    with pytest.raises(ValueError, match="Invalid order 'inf' for vector norm."):
        la.norm(np.array([1.0, 2.0, 3.0]), ord="inf")


def test_lu_of_a_one_by_one_matrix_has_derivatives():
    from cuvmap.scipy import linalg as sla

    a = np.array([[1.7]])
    check_grads(sla.lu, (a,), order=2)
    check_grads(lambda x: sla.lu_factor(x)[0], (a,), order=2)


@pytest.mark.parametrize("left_side", [True, False])
@pytest.mark.parametrize("transpose_a", [True, False])
def test_lax_triangular_solve_takes_a_vector_b(left_side, transpose_a):
    rng = _rng(9)
    a = np.tril(rng.standard_normal((4, 4))) + 5 * np.eye(4)
    b = rng.standard_normal(4)

    def f(a, b):
        return lax.linalg.triangular_solve(a, b, left_side=left_side, lower=True, transpose_a=transpose_a)

    x = f(a, b)
    op = a.T if transpose_a else a
    assert x.shape == (4,)
    np.testing.assert_allclose(op @ x if left_side else x @ op, b, atol=1e-12)
    check_grads(f, (a, b), order=1)
    check_batching(f, (np.stack([a, 2 * a, a + np.eye(4)]), rng.standard_normal((3, 4))))
