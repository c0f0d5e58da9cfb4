"""cuvmap.scipy.linalg.solve_banded: the solution against the dense matrix built by loops from
LAPACK's diagonal ordered form, derivatives in ab and b against finite differences in both
modes, vmap over each argument, jit, float32. Rows are data: (l, u, n, right-hand side)."""
import numpy as np
import pytest

import cuvmap as cv
from cuvmap.core import ShapeError
from cuvmap.scipy import linalg
from cuvmap.test_util import check_batching, check_grads

ROWS = [(1, 1, 5, ()), (2, 1, 6, (2,)), (0, 2, 4, ()), (0, 0, 3, (3,)), (3, 0, 5, ())]
RNG = np.random.default_rng(5)


def _dense(l, u, ab):
    n = ab.shape[1]
    a = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if -u <= i - j <= l:
                a[i, j] = ab[u + i - j, j]
    return a


@pytest.mark.parametrize("l,u,n,k", ROWS)
def test_solve_banded(l, u, n, k):
    ab = RNG.standard_normal((l + u + 1, n))
    ab[u] += 4.0  # a dominant diagonal: well conditioned
    b = RNG.standard_normal((n,) + k)
    x = linalg.solve_banded((l, u), ab, b)
    np.testing.assert_allclose(_dense(l, u, ab) @ x, b, rtol=1e-12, atol=1e-12)
    f = lambda ab, b: linalg.solve_banded((l, u), ab, b)  # noqa: E731
    check_grads(f, (ab, b), order=2, modes=("fwd", "rev"))
    stacked = (np.stack([ab, ab * 1.1]), np.stack([b, -b]))
    for axes in ((0, 0), (0, None), (None, 0)):
        check_batching(f, tuple(s if ax == 0 else v for s, v, ax in zip(stacked, (ab, b), axes)), in_axes=axes,
                       atol=1e-12, rtol=1e-12)
    np.testing.assert_allclose(cv.jit(f)(ab, b), x, rtol=1e-14)
    x32 = f(ab.astype(np.float32), b.astype(np.float32))
    assert x32.dtype == np.float32
    np.testing.assert_allclose(x32, x, rtol=1e-4, atol=1e-5)


def test_solve_banded_reads_only_the_band_and_checks_shapes():
    ab = RNG.standard_normal((3, 4))
    ab[1] += 4.0
    b = RNG.standard_normal(4)
    moved = ab.copy()
    moved[0, 0] = moved[2, 3] = 1e9  # outside the band: not read
    np.testing.assert_array_equal(linalg.solve_banded((1, 1), moved, b), linalg.solve_banded((1, 1), ab, b))
    g = cv.grad(lambda ab: linalg.solve_banded((1, 1), ab, b).sum())(ab)
    assert g[0, 0] == 0 and g[2, 3] == 0
    with pytest.raises(ShapeError, match="l \\+ u \\+ 1"):
        linalg.solve_banded((1, 2), ab, b)
    with pytest.raises(ShapeError, match="b must have shape"):
        linalg.solve_banded((1, 1), ab, b[:3])
