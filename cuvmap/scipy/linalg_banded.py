"""``scipy.linalg.solve_banded`` (autograd has it; JAX's ``scipy.linalg`` has not)."""
import numpy as np

from cuvmap import backend
from cuvmap import numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.numpy import linalg as np_linalg
from cuvmap.scipy._util import promote_inexact


def solve_banded(l_and_u, ab, b, overwrite_ab=False, overwrite_b=False, check_finite=True):
    """``x`` with ``A x = b`` for the banded ``A`` given in LAPACK's diagonal ordered form:
    ``ab[u + i − j, j] = A[i, j]`` for ``−u ≤ i − j ≤ l`` (``ab`` of shape
    ``(l + u + 1, n)``; its entries outside the band are not read), ``b`` ``(n,)`` or
    ``(n, k)``. ``A`` is gathered from ``ab`` (static indices) and solved densely by
    :func:`cuvmap.numpy.linalg.solve` (LU with partial pivoting), so ``O(n²)`` memory and
    ``O(n³)`` work where LAPACK's ``gbsv`` takes ``O(n(l+u))``; it is differentiable in ``ab``
    (gradients land on the band entries only) and ``b``, batchable and jittable.
    ``overwrite_*`` and ``check_finite`` are accepted and ignored. SciPy/autograd:
    ``scipy.linalg.solve_banded``."""
    lower, upper = (int(v) for v in l_and_u)
    ab, b = promote_inexact(cnp.asarray(ab), cnp.asarray(b))
    if cnp.ndim(ab) != 2 or cnp.shape(ab)[0] != lower + upper + 1:
        raise ShapeError(f"solve_banded: ab must have shape (l + u + 1, n) = ({lower + upper + 1}, n) for "
                         f"(l, u) = ({lower}, {upper}), got {cnp.shape(ab)}")
    n = cnp.shape(ab)[1]
    if cnp.ndim(b) not in (1, 2) or cnp.shape(b)[0] != n:
        raise ShapeError(f"solve_banded: b must have shape ({n},) or ({n}, k), got {cnp.shape(b)}")
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    row = upper + i - j
    band = (row >= 0) & (row <= lower + upper)
    flat = np.where(band, row * n + j, 0).astype(np.int64)
    xp = backend.xp_of(ab)
    dense = cnp.where(xp.asarray(band), cnp.take(cnp.reshape(ab, (-1,)), xp.asarray(flat)), 0.0)
    return np_linalg.solve(dense, b)
