"""``lax.linalg.tridiagonal_solve`` (cuvmap/lax/linalg_tridiagonal.py): the residual
``A X − B`` against the dense tridiagonal matrix, systems that need row interchanges
(closed-form solutions), singular systems (NaN, or large finite values with
``perturb_singular``), derivatives against finite differences in both modes, vmap and
jit."""
import numpy as np
import pytest

import cuvmap as cv
from cuvmap.core import ShapeError
from cuvmap.lax import linalg as lax_linalg
from cuvmap.test_util import check_grads
from linalg_references import tridiagonal_matrix as _dense

solve = lax_linalg.tridiagonal_solve


def _operands(rng, shape, dtype, k):
    def draw(s):
        x = rng.standard_normal(s)
        if np.dtype(dtype).kind == "c":
            x = x + 1j * rng.standard_normal(s)
        return x.astype(dtype)
    d = (1.0 + np.abs(draw(shape))).astype(dtype)
    return draw(shape), d, draw(shape), draw(shape + (k,))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("shape", [(1,), (2,), (3,), (3, 2), (3, 4), (2, 3, 7), (40,)])
@pytest.mark.parametrize("perturb_singular", [False, True])
def test_solution_has_a_small_residual(shape, dtype, perturb_singular):
    dl, d, du, b = _operands(np.random.default_rng(0), shape, dtype, 2)
    x = solve(dl, d, du, b, perturb_singular=perturb_singular)
    assert x.dtype == dtype and x.shape == b.shape
    tol = 1e-3 if np.finfo(dtype).eps > 1e-10 else 1e-10
    np.testing.assert_allclose(_dense(dl, d, du) @ x, b, atol=tol * max(1, np.abs(x).max()))


@pytest.mark.parametrize("perturb_singular", [False, True])
def test_systems_that_need_row_interchanges(perturb_singular):
    f32 = np.float32
    cases = [
        ([0.0, 2.0, -2.0, 3.0], [1.0, 4.0, 1.0, -1.0], [2.0, -1.0, 1.0, 0.0], [1.0, 2.0, 3.0, 4.0],
         [8.0, -3.5, 0.0, -4.0]),
        ([0.0, 1.0, -6.0, 1.0], [1.0, -1.0, 2.0, 1.0], [2.0, 1.0, -1.0, 0.0], [1.0, 2.0, -1.0, -2.0],
         [5.0, -2.0, -5.0, 3.0]),
        ([0.0, 3.0], [0.0, 0.0], [2.0, 0.0], [4.0, 9.0], [3.0, 2.0]),  # a zero diagonal
    ]
    for dl, d, du, b, want in cases:
        x = solve(np.array(dl, f32), np.array(d, f32), np.array(du, f32), np.array(b, f32)[:, None],
                  perturb_singular=perturb_singular)
        np.testing.assert_allclose(x[:, 0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dl,d,du,b", [
    ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]),
    ([0.0, 1.0], [1.0, 3.0], [3.0, 0.0], [1.0, 4.0]),
])
def test_singular_systems_give_nan_or_large_finite_values(dl, d, du, b):
    args = [np.array(v, np.float32) for v in (dl, d, du)] + [np.array(b, np.float32)[:, None]]
    assert np.all(np.isnan(solve(*args)))
    x = solve(*args, perturb_singular=True)
    assert np.all(np.isfinite(x)) and np.all(np.abs(x) > 1e6)


def test_the_ignored_corners_are_ignored():
    size = 10
    dl, d, du = np.linspace(-1, 1, size), np.linspace(1, 2, size), np.linspace(1, -1, size)
    b = np.linspace(0.1, -0.1, size)[:, None]
    dlz, duz = dl.copy(), du.copy()
    dlz[0] = duz[-1] = 0
    np.testing.assert_array_equal(solve(dl, d, du, b), solve(dlz, d, duz, b))


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("shape", [(3,), (2, 4)])
def test_derivatives_of_every_operand_match_finite_differences(shape, dtype):
    args = _operands(np.random.default_rng(1), shape, dtype, 2)
    check_grads(solve, args, order=2, modes=("fwd", "rev"), atol=1e-5, rtol=1e-5)


def test_vjp_of_b_solves_the_transposed_system():
    dl, d, du, b = _operands(np.random.default_rng(2), (5,), np.float64, 1)
    ct = np.random.default_rng(3).standard_normal((5, 1))
    _, pullback = cv.vjp(lambda b: solve(dl, d, du, b), b)
    np.testing.assert_allclose(pullback(ct)[0], np.linalg.solve(_dense(dl, d, du).T, ct), rtol=1e-12)


def test_vmap_over_each_operand_matches_a_loop_and_jit_matches_eager():
    dl, d, du, b = _operands(np.random.default_rng(4), (6, 5), np.float64, 3)
    np.testing.assert_allclose(cv.vmap(solve)(dl, d, du, b), solve(dl, d, du, b), rtol=1e-14)
    x = cv.vmap(solve, in_axes=(None, None, None, 0))(dl[0], d[0], du[0], b)
    for i in range(6):
        np.testing.assert_allclose(x[i], solve(dl[0], d[0], du[0], b[i]), rtol=1e-14)
    b2 = np.random.default_rng(5).standard_normal((5, 1, 6))
    x = cv.vmap(solve, in_axes=(0, None, None, 2), out_axes=2)(dl, d[0], du[0], b2)
    for i in range(6):
        np.testing.assert_allclose(x[..., i], solve(dl[i], d[0], du[0], b2[..., i]), rtol=1e-14)
    np.testing.assert_allclose(cv.jit(solve)(dl, d, du, b), solve(dl, d, du, b), rtol=1e-14)


def test_bad_operands_name_the_function_and_shapes():
    with pytest.raises(ShapeError, match="tridiagonal_solve: dl, d and du"):
        solve(np.ones(3), np.ones(4), np.ones(3), np.ones((3, 1)))
    with pytest.raises(ShapeError, match=r"tridiagonal_solve: b must be \(..., m, k\)"):
        solve(np.ones(3), np.ones(3), np.ones(3), np.ones(3))
    with pytest.raises(ShapeError, match="one float or complex dtype"):
        solve(np.ones(3), np.ones(3, np.float32), np.ones(3), np.ones((3, 1)))
