"""Reductions over more elements than a float dtype counts exactly (issue 34 item 11):
float16 stops counting at 2048 and overflows past 65504, so that a mean, variance or
log-sum-exp accumulated in float16 is NaN, inf or 0. Each accumulates in float32 and rounds
back (NOTE [half precision accumulates in float32]), eagerly, under jit, under vmap and
in its gradient. The inputs alternate two values ``a, b`` so that the closed forms are
exact: mean (a+b)/2, variance ((a−b)/2)², logsumexp log(n/2·(eᵃ+eᵇ)).

float64's largest consecutive integer (2⁵³) is beyond any array this test can hold, so
float64 rows use the float32 sizes; float32's rows (past 2²⁴ = 16,777,216) are slow."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp

A, B = 1.0, 3.0
SIZES = {np.float16: [2049, 70000, 100000], np.float32: [2 ** 24 + 2], np.float64: [2 ** 24 + 2]}
RTOL = {np.float16: 2e-3, np.float32: 1e-6, np.float64: 1e-12}

# name, function, closed form of the value for n elements alternating A, B
REDUCTIONS = [
    ("mean", cnp.mean, lambda n: (A + B) / 2),
    ("var", cnp.var, lambda n: ((A - B) / 2) ** 2),
    ("std", cnp.std, lambda n: abs(A - B) / 2),
    ("var_ddof1", lambda x: cnp.var(x, ddof=1), lambda n: ((A - B) / 2) ** 2 * n / (n - 1)),
    ("logsumexp", cnp.logsumexp, lambda n: np.log(n / 2 * (np.exp(A) + np.exp(B)))),
    ("max", cnp.max, lambda n: B),
    ("min", cnp.min, lambda n: A),
]


def alternating(n, dtype):
    x = np.full(n, A, dtype)
    x[1::2] = B
    return x


def cases():
    for dtype, sizes in SIZES.items():
        for n in sizes:
            for name, fn, closed in REDUCTIONS:
                if n % 2:  # the closed forms above are for even n
                    continue
                marks = [pytest.mark.slow] if n > 10 ** 6 else []
                yield pytest.param(dtype, n, fn, closed, id=f"{name}-{np.dtype(dtype).name}-{n}", marks=marks)


@pytest.mark.parametrize("dtype, n, fn, closed", list(cases()))
def test_reductions_past_the_dtypes_count(dtype, n, fn, closed):
    x = alternating(n, dtype)
    want = closed(n)
    for how, f in (("eager", fn), ("jit", cv.jit(fn))):
        got = f(x)
        assert np.dtype(got.dtype) == np.dtype(dtype), how
        np.testing.assert_allclose(float(got), want, rtol=RTOL[dtype], err_msg=how)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_per_axis_means_and_their_vmap_past_the_count(dtype):
    n = 100000 if dtype == np.float16 else 2 ** 12
    x = np.stack([alternating(n, dtype), alternating(n, dtype)[::-1].copy()])
    for got in (cnp.mean(x, axis=1), cv.jit(lambda x: cnp.mean(x, axis=1))(x), cv.vmap(cnp.mean)(x)):
        np.testing.assert_allclose(np.asarray(got, np.float64), [2.0, 2.0], rtol=RTOL[dtype])


def test_the_gradient_of_a_float16_mean_is_one_over_the_count():
    n = 70000
    x = alternating(n, np.float16)
    for g in (cv.grad(cnp.mean)(x), cv.jit(cv.grad(cnp.mean))(x)):
        assert g.dtype == np.float16
        np.testing.assert_allclose(np.asarray(g, np.float64), 1 / n, rtol=2e-2)   # a float16 subnormal, not 0
    # var's gradient: 2(x − mean)/n = ±1/n
    g = cv.grad(cnp.var)(x)
    np.testing.assert_allclose(np.asarray(g, np.float64)[:4], [-2 / n, 2 / n, -2 / n, 2 / n], rtol=2e-2)


def test_a_float16_sum_that_fits_is_not_lost():
    """70,000 × 1/64 = 1093.75 fits float16 (rounded to 1094), as NumPy's pairwise sum and JAX's float32 accumulation give."""
    x = np.full(70000, 1 / 64, np.float16)
    for got in (cnp.sum(x), cv.jit(cnp.sum)(x)):
        assert got.dtype == np.float16 and float(got) == pytest.approx(1093.75, rel=1e-3)
