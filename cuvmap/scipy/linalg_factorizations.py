"""``scipy.linalg``'s spellings of the QR and singular value decompositions, as
``jax.scipy.linalg`` has them: ``qr`` (SciPy's ``mode`` names and tuple results), ``svd``
(SciPy's keyword arguments) and ``polar`` (the polar decomposition, from the SVD). Thin
wrappers of :func:`cuvmap.numpy.linalg.qr` and :func:`cuvmap.numpy.linalg.svd`: they take
stacks ``(..., m, n)`` and have those functions' derivatives and batching rules.

    from cuvmap.scipy import linalg as sla
    q, r = sla.qr(a, mode="economic")
    u, p = sla.polar(a)           # a = u @ p, p positive semidefinite
"""
from cuvmap import core
from cuvmap import numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.elementwise import complex_numbers as complex_parts  # conj
from cuvmap.scipy._util import promote_inexact

__all__ = ["polar", "qr", "svd"]


def _matrix_stack(a, name):
    a = promote_inexact(cnp.asarray(a))
    if cnp.ndim(a) < 2:
        raise ShapeError(f"{name}: a must be a matrix or a stack of them (..., m, n), got shape {cnp.shape(a)}")
    return a


def _hermitian_transpose(x):
    x = cnp.swapaxes(x, -1, -2)
    return complex_parts.conj(x) if core.dtype_of(x).kind == "c" else x


def qr(a, overwrite_a=False, lwork=None, mode="full", pivoting=False, check_finite=True):
    """``scipy.linalg.qr`` (JAX's ``jax.scipy.linalg.qr``): ``a = Q R`` with ``Q``
    orthonormal and ``R`` upper triangular, for each matrix of a stack ``(..., m, n)``.
    ``mode``: ``'full'`` (``Q`` ``(m, m)``, ``R`` ``(m, n)``), ``'economic'`` (``Q`` ``(m,
    k)``, ``R`` ``(k, n)``, ``k = min(m, n)``) or ``'r'`` (the one-tuple ``(R,)``, ``R``
    ``(m, n)``). Returns the tuple ``(Q, R)`` (SciPy's and JAX's). ``pivoting=True`` (the
    column-pivoted, rank-revealing QR) is not implemented and raises. ``overwrite_a``,
    ``lwork`` and ``check_finite`` are accepted and ignored, as in JAX. Derivatives: those
    of :func:`cuvmap.numpy.linalg.qr` (``m ≥ n`` with ``'economic'``, or square matrices;
    ``'r'`` also for ``m > n``: its extra rows are zeros)."""
    if mode not in ("full", "r", "economic"):
        raise ValueError(f"qr: Unsupported QR decomposition mode {mode!r} (expected 'full', 'r' or 'economic')")
    if pivoting:
        raise NotImplementedError("qr: pivoting=True (the column-pivoted QR) is not implemented in cuvmap")
    a = _matrix_stack(a, "qr")
    if mode == "r":
        m, n = cnp.shape(a)[-2:]
        r = cnp.linalg.qr(a, mode="r")
        if m > n:  # SciPy's R is (m, n): the rows below the reduced R are zeros
            widths = [(0, 0)] * (cnp.ndim(r) - 2) + [(0, m - n), (0, 0)]
            r = cnp.pad(r, widths)
        return (r,)
    q, r = cnp.linalg.qr(a, mode="complete" if mode == "full" else "reduced")
    return q, r


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
