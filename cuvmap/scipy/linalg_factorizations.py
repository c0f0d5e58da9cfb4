"""``scipy.linalg``'s spellings of the QR and singular value decompositions, as
``jax.scipy.linalg`` has them: ``qr`` (SciPy's ``mode`` names and tuple results), ``svd``
(SciPy's keyword arguments) and ``polar`` (the polar decomposition, from the SVD). Thin
wrappers of :func:`cuvmap.numpy.linalg.qr` and :func:`cuvmap.numpy.linalg.svd`: they take
stacks ``(..., m, n)`` and have those functions' derivatives and batching rules.

    from cuvmap.scipy import linalg as sla
    q, r = sla.qr(a, mode="economic")
    u, p = sla.polar(a)           # a = u @ p, p positive semidefinite
"""
import numpy as np

from cuvmap import backend, core
from cuvmap import numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.elementwise import complex_numbers as complex_parts  # conj
from cuvmap.scipy._util import promote_inexact
from cuvmap.core.bfloat16 import kind_of

__all__ = ["polar", "qr", "svd"]


def _matrix_stack(a, name):
    a = promote_inexact(cnp.asarray(a))
    if cnp.ndim(a) < 2:
        raise ShapeError(f"{name}: a must be a matrix or a stack of them (..., m, n), got shape {cnp.shape(a)}")
    return a


def _hermitian_transpose(x):
    x = cnp.swapaxes(x, -1, -2)
    return complex_parts.conj(x) if kind_of(core.dtype_of(x)) == "c" else x


# NOTE [column pivots as LAPACK's geqp3 chooses them]
# The column-pivoted QR A[:, P] = Q R (LAPACK's geqp3, SciPy's qr(pivoting=True)) is, in exact
# arithmetic, the plain Householder QR of the permuted matrix: pivoting only chooses the
# order. So P is computed first, without derivative, and then Q, R = qr(A[:, P]), whose
# derivatives are the QR's. geqp3's step k swaps column k with the column j ≥ k whose part
# below row k is longest; that part's norm is the norm of the column's residual after
# projecting out the columns already chosen, so the steps run a Gram-Schmidt on the
# columns of A: pick j = argmax of the residual norms at positions ≥ k (the first of
# equal ones, as LAPACK's idamax), swap positions k and j (in P and in the residuals),
# take the unit vector of the residual at k out of the later ones. min(m, n) steps of
# batched array operations (each one for the whole stack), traceable under jit and vmap.


def _column_pivots(a):
    """geqp3's column permutation of each matrix of ``a`` (NOTE [column pivots as LAPACK's
    geqp3 chooses them]), int32 ``(..., n)``."""
    a = ew.stop_gradient(a)
    m, n = cnp.shape(a)[-2:]
    lead = cnp.shape(a)[:-2]
    positions = backend.xp_of(a).arange(n)  # on a's device (NumPy or CuPy)
    perm = cnp.broadcast_to(positions, lead + (n,))
    residual = a
    for k in range(min(m, n)):
        norms = cnp.sum(ew.mul(residual, residual), axis=-2)
        norms = cnp.where(positions >= k, norms, -1.0)
        j = cnp.expand_dims(cnp.argmax(norms, axis=-1), -1)
        swap = cnp.where(positions == k, j, cnp.where(positions == j, k, positions))  # (..., n)
        perm = cnp.take_along_axis(perm, swap, axis=-1)
        residual = cnp.take_along_axis(residual, cnp.expand_dims(swap, -2), axis=-1)
        column = residual[..., :, k:k + 1]
        length = cnp.sqrt(cnp.sum(ew.mul(column, column), axis=-2, keepdims=True))
        unit = cnp.where(length > 0, ew.div(column, cnp.where(length > 0, length, 1.0)), 0.0)
        residual = ew.sub(residual, ew.mul(unit, cnp.sum(ew.mul(unit, residual), axis=-2, keepdims=True)))
    return cnp.astype(perm, np.int32)


def qr(a, overwrite_a=False, lwork=None, mode="full", pivoting=False, check_finite=True):
    """``scipy.linalg.qr`` (JAX's ``jax.scipy.linalg.qr``): ``a = Q R`` with ``Q``
    orthonormal and ``R`` upper triangular, for each matrix of a stack ``(..., m, n)``.
    ``mode``: ``'full'`` (``Q`` ``(m, m)``, ``R`` ``(m, n)``), ``'economic'`` (``Q`` ``(m,
    k)``, ``R`` ``(k, n)``, ``k = min(m, n)``) or ``'r'`` (the one-tuple ``(R,)``, ``R``
    ``(m, n)``). Returns the tuple ``(Q, R)`` (SciPy's and JAX's); with ``pivoting=True``,
    the column-pivoted (rank-revealing) QR ``a[..., :, P] = Q R`` as LAPACK's ``geqp3``
    (``|R_kk|`` non-increasing), returned as ``(Q, R, P)`` (``(R, P)`` for ``'r'``), ``P``
    int32 ``(..., n)`` (NOTE [column pivots as LAPACK's geqp3 chooses them]); ``P`` has no
    derivative. ``overwrite_a``,
    ``lwork`` and ``check_finite`` are accepted and ignored, as in JAX. Derivatives: those
    of :func:`cuvmap.numpy.linalg.qr` (``m ≥ n`` with ``'economic'``, or square matrices;
    ``'r'`` also for ``m > n``: its extra rows are zeros)."""
    if mode not in ("full", "r", "economic"):
        raise ValueError(f"qr: Unsupported QR decomposition mode {mode!r} (expected 'full', 'r' or 'economic')")
    a = _matrix_stack(a, "qr")
    pivots = ()
    if pivoting:
        perm = _column_pivots(a)
        a = cnp.take_along_axis(a, cnp.expand_dims(perm, -2), axis=-1)
        pivots = (perm,)
    if mode == "r":
        m, n = cnp.shape(a)[-2:]
        r = cnp.linalg.qr(a, mode="r")
        if m > n:  # SciPy's R is (m, n): the rows below the reduced R are zeros
            widths = [(0, 0)] * (cnp.ndim(r) - 2) + [(0, m - n), (0, 0)]
            r = cnp.pad(r, widths)
        return (r, *pivots)
    q, r = cnp.linalg.qr(a, mode="complete" if mode == "full" else "reduced")
    return (q, r, *pivots)


def svd(a, full_matrices=True, compute_uv=True, overwrite_a=False, check_finite=True, lapack_driver="gesdd"):
    """``scipy.linalg.svd`` (JAX's ``jax.scipy.linalg.svd``): ``a = U diag(s) Vh`` for each
    matrix of a stack: the tuple ``(U, s, Vh)``, or ``s`` (descending) with
    ``compute_uv=False``; :func:`cuvmap.numpy.linalg.svd` with SciPy's arguments.
    ``lapack_driver`` must be ``'gesdd'`` or ``'gesvd'`` (both give the same decomposition
    up to rounding; cuvmap uses its own driver); ``overwrite_a`` and ``check_finite`` are
    ignored, as in JAX."""
    if lapack_driver not in ("gesdd", "gesvd"):
        raise ValueError(f"svd: lapack_driver must be 'gesdd' or 'gesvd', got {lapack_driver!r}")
    a = _matrix_stack(a, "svd")
    if not compute_uv:
        return cnp.linalg.svd(a, full_matrices=full_matrices, compute_uv=False)
    u, s, vh = cnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


def polar(a, side="right", *, method="qdwh", eps=None, max_iterations=None):
    """``scipy.linalg.polar`` (JAX's ``jax.scipy.linalg.polar``): ``a = u p`` (``side=
    'right'``, ``p`` ``(n, n)``) or ``a = p u`` (``'left'``, ``p`` ``(m, m)``) for each
    matrix ``a`` ``(..., m, n)``, with ``u`` ``(m, n)`` of orthonormal columns (rows when
    ``n > m``) and ``p`` Hermitian positive semidefinite. From the reduced SVD ``a = U S
    Vh``: ``u = U Vh``, ``p = Vh^H S Vh`` (right) or ``U S U^H`` (left); unique where ``a``
    has full rank. ``method`` ``'svd'`` or ``'qdwh'`` (JAX's default, an iteration that
    converges to the same factors) both compute through the SVD here, for every shape and
    side; ``eps`` and ``max_iterations`` (QDWH's) are accepted and unused. Derivatives:
    those of the SVD (defined where the singular values are distinct)."""
    if side not in ("right", "left"):
        raise ValueError(f"polar: The argument `side` must be either 'right' or 'left', got {side!r}")
    if method not in ("qdwh", "svd"):
        raise ValueError(f"polar: Unknown polar decomposition method {method!r} (expected 'qdwh' or 'svd')")
    a = _matrix_stack(a, "polar")
    u_svd, s, vh = cnp.linalg.svd(a, full_matrices=False)
    s = cnp.astype(s, core.dtype_of(u_svd))
    unitary = cnp.matmul(u_svd, vh)
    if side == "right":
        posdef = cnp.matmul(ew.mul(_hermitian_transpose(vh), cnp.expand_dims(s, -2)), vh)
    else:
        posdef = cnp.matmul(ew.mul(u_svd, cnp.expand_dims(s, -2)), _hermitian_transpose(u_svd))
    return unitary, posdef
