"""``scipy.linalg``'s Householder-based functions as ``jax.scipy.linalg`` has them:
``hessenberg`` (over :func:`cuvmap.lax.linalg_householder.hessenberg`) and
``qr_multiply`` (over ``cuvmap.numpy.linalg.qr``). Stacks of matrices, vmap and jit."""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapeError
from cuvmap.lax.linalg_householder import hessenberg as lax_hessenberg, householder_product
from cuvmap.numpy import linalg as np_linalg
from cuvmap.numpy._creation import asarray, zeros_like
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._products import matmul
from cuvmap.numpy._shapes import broadcast_to, concatenate, triu

__all__ = ["hessenberg", "qr_multiply"]


def _inexact(x):
    x = x if isinstance(x, core.Tracer) or hasattr(x, "dtype") else asarray(x)
    return x if core.is_float(x) else astype(x, np.float64)


def hessenberg(a, *, calc_q=False, overwrite_a=False, check_finite=True):
    """``scipy.linalg.hessenberg`` (JAX's ``jax.scipy.linalg.hessenberg``): ``H``, or
    ``(H, Q)`` with ``calc_q=True``, where ``A = Q H Qᴴ``, ``Q`` unitary and ``H`` zero below
    the first subdiagonal, for each square matrix of a stack (LAPACK's gehrd and orghr:
    NOTE [Householder reflectors as LAPACK writes them] in
    ``cuvmap/lax/linalg_householder.py``). No derivative (as JAX)."""
    a = _inexact(a)
    s = core.shape_of(a)
    if len(s) < 2 or s[-1] != s[-2]:
        raise ShapeError(f"hessenberg: a must be a square matrix or a stack of them (..., n, n), got shape {s}")
    n = s[-1]
    if n == 0:
        return (zeros_like(a), zeros_like(a)) if calc_q else zeros_like(a)
    packed, taus = lax_hessenberg(a)
    h = triu(packed, -1)
    if not calc_q:
        return h
    q = householder_product(packed[..., 1:, :-1], taus)
    dtype = core.dtype_of(a)
    lead = s[:-2]
    xp = backend.xp_of(q)
    corner = broadcast_to(xp.ones((1, 1), dtype=dtype), lead + (1, 1))
    top = concatenate([corner, broadcast_to(xp.zeros((1, n - 1), dtype=dtype), lead + (1, n - 1))], axis=-1)
    bottom = concatenate([broadcast_to(xp.zeros((n - 1, 1), dtype=dtype), lead + (n - 1, 1)), q], axis=-1)
    return h, concatenate([top, bottom], axis=-2)


def qr_multiply(a, c, mode="right", pivoting=False, conjugate=False, overwrite_a=False, overwrite_c=False):
    """``scipy.linalg.qr_multiply`` (JAX's ``jax.scipy.linalg.qr_multiply``): the reduced
    QR decomposition ``a = Q R`` (``Q`` ``(..., m, k)``, ``k = min(m, n)``) and
    ``(Q c, R)`` (``mode='left'``, ``c`` ``(..., k, p)``) or ``(c Q, R)``
    (``mode='right'``, ``c`` ``(..., p, m)``); ``conjugate=True`` uses ``conj(Q)``. A 1-D
    ``c`` is a column (left) or a row (right) and the result is 1-D. Batch dims broadcast.
    ``pivoting=True`` (column-pivoted QR) is not implemented and raises."""
    if mode not in ("right", "left"):
        raise ValueError(f"qr_multiply: mode must be 'right' or 'left', got {mode!r}")
    if pivoting:
        raise NotImplementedError("qr_multiply: pivoting=True (column-pivoted QR, LAPACK's geqp3) is not implemented")
    a, c = _inexact(a), _inexact(c)
    dtype = np.result_type(core.dtype_of(a), core.dtype_of(c))
    a, c = astype(a, dtype), astype(c, dtype)
    a_shape, c_shape = core.shape_of(a), core.shape_of(c)
    if len(a_shape) < 2:
        raise ShapeError(f"qr_multiply: a must be a matrix or a stack of them (..., m, n), got shape {a_shape}")
    m, n = a_shape[-2:]
    k = min(m, n)
    onedim = len(c_shape) == 1
    if onedim:
        c = c[:, None] if mode == "left" else c[None, :]
        c_shape = core.shape_of(c)
    if mode == "left" and c_shape[-2] != k:
        raise ShapeError(f"qr_multiply: a {a_shape} has Q with {k} columns, but c {c_shape} has {c_shape[-2]} rows")
    if mode == "right" and c_shape[-1] != m:
        raise ShapeError(f"qr_multiply: a {a_shape} has Q with {m} rows, but c {c_shape} has {c_shape[-1]} columns")
    lead = tuple(np.broadcast_shapes(a_shape[:-2], c_shape[:-2]))
    q, r = np_linalg.qr(broadcast_to(a, lead + (m, n)))
    if conjugate:
        q = q.conj()
    c = broadcast_to(c, lead + c_shape[-2:])
    out = matmul(q, c) if mode == "left" else matmul(c, q)
    if onedim:
        out = out[..., :, 0] if mode == "left" else out[..., 0, :]
    return out, r
