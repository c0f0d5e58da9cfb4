"""``numpy.linalg``'s functions on arrays and tracers: ``norm`` (every ``ord`` of
NumPy's, 2, -2 and ``'nuc'`` through the singular values), ``vector_norm``,
``matrix_norm``, ``svd`` and ``svdvals``.

    from cuvmap.numpy import linalg      # or cuvmap.numpy.linalg, cnp.linalg
    linalg.norm(x, ord="nuc")
"""
import collections

import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax import linalg as lax_linalg
from cuvmap.lax import shape as lax_shape
from cuvmap.numpy._common import _axes, _axis, ndim, shape
from cuvmap.numpy._elementwise import astype, square
from cuvmap.numpy._reductions import _keep, max, min, sum
from cuvmap.numpy._shapes import squeeze


__all__ = ["SVDResult", "matrix_norm", "norm", "svd", "svdvals", "vector_norm"]

SVDResult = collections.namedtuple("SVDResult", ["U", "S", "Vh"])


def _as_inexact(x):
    """Integers and booleans as float64 (NumPy's linalg and JAX promote them)."""
    return x if core.is_float(x) else astype(x, np.float64)


def svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    """``numpy.linalg.svd``: ``a = U @ diag(S) @ Vh`` for each matrix of a stack ``(..., m, n)``.

    Returns ``SVDResult(U, S, Vh)`` (a named tuple, as NumPy 2's) or, with
    ``compute_uv=False``, ``S`` alone (descending). ``hermitian=True`` is accepted and
    computes the general SVD (also a valid SVD of a Hermitian matrix). Derivatives:
    NOTE [svd's derivatives] in ``cuvmap/lax/linalg.py``: those of the singular values are
    defined where they are distinct; those of ``U`` and ``Vh`` are undefined for repeated
    singular values (they come out inf or NaN) and raise for ``full_matrices=True`` of a
    non-square matrix (use ``full_matrices=False``).
    """
    a = _as_inexact(a)
    if ndim(a) < 2:
        raise ShapeError(f"svd: the array must have at least 2 dims (a stack of matrices), got shape {shape(a)}")
    if not compute_uv:
        return lax_linalg.svd(a, compute_uv=False)
    return SVDResult(*lax_linalg.svd(a, full_matrices=full_matrices))


def svdvals(x):
    """``numpy.linalg.svdvals``: the singular values of each matrix of a stack, descending."""
    return svd(x, compute_uv=False)


def norm(x, ord=None, axis=None, keepdims=False):  # noqa: A002 - NumPy's name
    """``numpy.linalg.norm``.

    Vector norms (``axis`` an int, or ``None`` for a 1-d array): ``ord`` ``None``/2 (the
    Euclidean norm), 1, ``inf``, ``-inf``, 0 (the count of nonzeros) or any other number
    ``p``, negative ones included (``(Σ|x|ᵖ)^(1/p)``). Matrix norms (``axis`` a pair, or
    ``None`` for a 2-d array): ``None``/``'fro'`` (Frobenius), 1 / -1 (the largest /
    smallest column sum of ``|x|``), ``inf`` / ``-inf`` (the same of the rows), 2 / -2 (the
    largest / smallest singular value) and ``'nuc'`` (their sum). ``axis=None`` with
    ``ord=None`` is the 2-norm of all elements.

    Derivatives follow JAX's: ord 1 and ``inf`` have the subgradient 0 at ``x = 0``; the
    2-norm and the Frobenius norm, ``sqrt(Σ x²)``, have none there and give NaN, as in
    JAX (write ``sqrt(sum(x * x) + eps)`` or the double-``where`` trick where zero inputs
    occur); the singular-value norms differentiate through the SVD (NOTE [svd's
    derivatives]): 2 and -2 where their singular value is simple, ``'nuc'`` where no
    singular value is zero.
    """
    x = _as_inexact(x)
    nd = ndim(x)
    if axis is None:
        if ord is None:
            axes = tuple(range(nd))
            return ew.sqrt(sum(square(x), axes, keepdims))
        if nd not in (1, 2):
            raise ShapeError(f"norm: ord={ord!r} needs axis for an array of shape {shape(x)} (or a 1-d or 2-d array)")
        axes = tuple(range(nd))
    elif isinstance(axis, (int, np.integer)):
        axes = (_axis(x, axis, "norm"),)
    else:
        axes = tuple(_axis(x, a, "norm") for a in axis)
        if len(axes) not in (1, 2) or len(set(axes)) != len(axes):
            raise ShapeError(f"norm: axis must be an int or a pair of different ints, got {axis!r}")
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    return _matrix_norm(x, ord, axes, keepdims)


def _is_number(ord):  # noqa: A002
    return isinstance(ord, (int, float, np.number)) and not isinstance(ord, (bool, np.bool_))


def _vector_norm(x, ord, axes, keepdims):  # noqa: A002
    if ord is None or (_is_number(ord) and ord == 2):
        return ew.sqrt(sum(square(x), axes, keepdims))
    if not _is_number(ord):
        raise ShapeError(f"norm: invalid ord {ord!r} for a vector norm (None, inf, -inf, 0 or a number)")
    if ord == np.inf:
        return max(ew.abs(x), axes, keepdims)
    if ord == -np.inf:
        return min(ew.abs(x), axes, keepdims)
    if ord == 0:
        return sum(astype(ew.ne(x, 0), core.dtype_of(x)), axes, keepdims)
    if ord == 1:
        return sum(ew.abs(x), axes, keepdims)
    return ew.pow(sum(ew.pow(ew.abs(x), float(ord)), axes, keepdims), 1.0 / float(ord))


def _matrix_norm(x, ord, axes, keepdims):  # noqa: A002
    rows, cols = axes
    if ord is None or (isinstance(ord, str) and ord == "fro"):
        return ew.sqrt(sum(square(x), axes, keepdims))
    if (isinstance(ord, str) and ord == "nuc") or (_is_number(ord) and ord in (2, -2)):
        # the singular values of the matrices in the (rows, cols) dims
        rest = tuple(i for i in range(ndim(x)) if i not in axes)
        s = lax_linalg.svd(lax_shape.transpose(x, rest + (rows, cols)), compute_uv=False)
        if isinstance(ord, str):
            out = sum(s, -1)
        else:
            out = max(s, -1) if ord == 2 else min(s, -1)
        return lax_shape.expand_dims(out, tuple(sorted(axes))) if keepdims else out
    if not _is_number(ord) or ord not in (1, -1, np.inf, -np.inf):
        raise ShapeError(f"norm: invalid ord {ord!r} for a matrix norm (None, 'fro', 'nuc', 1, -1, 2, -2, inf or -inf)")
    # 1: the largest column sum of |x|; inf: the largest row sum
    summed, over = (rows, cols) if ord in (1, -1) else (cols, rows)
    sums = sum(ew.abs(x), summed, keepdims=True)
    out = max(sums, over, keepdims=True) if ord > 0 else min(sums, over, keepdims=True)
    return out if keepdims else squeeze(out, axes)


def matrix_norm(x, /, *, keepdims=False, ord="fro"):  # noqa: A002 - NumPy's name
    """``numpy.linalg.matrix_norm``: :func:`norm` of the matrices in the last two dims."""
    return norm(x, ord, (-2, -1), keepdims)


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):  # noqa: A002 - NumPy's name
    """``numpy.linalg.vector_norm``: the vector norm ``ord`` (as in :func:`norm`) over
    ``axis``: an int, a tuple (those dims taken as one vector) or ``None`` (all of them)."""
    x = _as_inexact(x)
    axes = _axes(x, axis, "vector_norm")
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    rest = tuple(i for i in range(ndim(x)) if i not in axes)
    n = int(np.prod([shape(x)[i] for i in axes], dtype=np.int64))
    flat = lax_shape.reshape(lax_shape.transpose(x, rest + axes), tuple(shape(x)[i] for i in rest) + (n,))
    out = _vector_norm(flat, ord, (len(rest),), False)
    return _keep(out, x, axes, keepdims)
