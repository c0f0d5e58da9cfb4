"""``scipy.linalg``'s special matrices, as ``jax.scipy.linalg`` has them: the structured
matrices built from vectors (``toeplitz``, ``hankel``, ``circulant``, ``leslie``,
``companion``, ``fiedler``, ``fiedler_companion``, ``convolution_matrix``,
``block_diag``) and the constant ones of a size (``hilbert``, ``invhilbert``,
``pascal``, ``invpascal``, ``helmert``, ``hadamard``, ``dft``).

A matrix built from vectors takes stacks of them (``(..., n)`` in, ``(..., n, m)`` out, the
leading dims broadcast, as JAX's ``jnp.vectorize`` signatures) and is a gather of its
vectors' entries at a fixed table of positions (NOTE [a structured matrix is one gather]),
so it is differentiable, batchable and jittable through ``take``. The constant matrices
are computed once on the host from exact integer tables and have the dtype
``cuvmap.config.default_float`` (JAX's default float; ``dft``: its complex counterpart).

    from cuvmap.scipy import linalg as sla
    t = sla.toeplitz(c, r)        # t[i, j] = c[i - j] (i >= j), r[j - i] (i < j)
"""
import math
import operator

import numpy as np

from cuvmap import config, core
from cuvmap import numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.scipy._util import promote_inexact
from cuvmap.core.bfloat16 import kind_of

__all__ = ["block_diag", "circulant", "companion", "convolution_matrix", "dft", "fiedler", "fiedler_companion",
           "hadamard", "hankel", "helmert", "hilbert", "invhilbert", "invpascal", "leslie", "pascal", "toeplitz"]


# NOTE [a structured matrix is one gather]
# Each structured matrix is M[..., i, j] = v[..., idx[i, j]] where mask[i, j], else 0, for one
# vector v made by concatenating (or negating) the inputs along their last dim and a table
# (idx, mask) that depends only on the sizes: toeplitz reads v = [c reversed, r[1:]] at
# n - 1 - i + j, hankel v = [c, r[1:]] at i + j, circulant c at (i - j) mod n. So the
# matrix is one ``take`` along the last dim (its derivative scatters the cotangent back
# onto v; vmap folds into the leading dims) and one ``where``: no loop over entries or
# over the stack, and every entry an input can reach is exactly one of its values.


def _as_vector_stack(x):
    """``x`` as an array of at least one dim (a scalar becomes ``(1,)``, as JAX's
    ``atleast_1d``)."""
    x = cnp.asarray(x)
    return cnp.atleast_1d(x) if cnp.ndim(x) == 0 else x


def _common_stack(xs, name):
    """The operands broadcast to common leading dims (each keeps its last dim) and cast to
    their common dtype: JAX's ``jnp.vectorize`` over signatures ``(n),(m)->...``."""
    dtype = cnp.result_type(*xs)
    try:
        lead = ew.broadcast_shapes(*(cnp.shape(x)[:-1] for x in xs))
    except ShapeError:
        shapes = " and ".join(str(cnp.shape(x)) for x in xs)
        raise ShapeError(f"{name}: the leading dims of {shapes} do not broadcast (each operand is a stack of "
                         "vectors along its last dim)") from None
    return [cnp.broadcast_to(x if core.dtype_of(x) == dtype else cnp.astype(x, dtype), lead + cnp.shape(x)[-1:])
            for x in xs], lead, dtype


def _gather_matrix(v, idx, mask=None):
    """``M[..., i, j] = v[..., idx[i, j]]`` where ``mask`` (else 0) (NOTE [a structured
    matrix is one gather])."""
    out = cnp.take(v, np.asarray(idx, dtype=np.int64), axis=-1)
    if mask is None:
        return out
    return cnp.where(np.asarray(mask), out, cnp.zeros((), dtype=core.dtype_of(v)))


def _grid(rows, cols):
    return np.arange(rows)[:, None], np.arange(cols)[None, :]


def _empty(lead, rows, cols, dtype):
    return cnp.zeros(tuple(lead) + (rows, cols), dtype=dtype)


def toeplitz(c, r=None):
    """``scipy.linalg.toeplitz`` (JAX's ``jax.scipy.linalg.toeplitz``): the matrix with
    constant diagonals ``T[i, j] = c[i − j]`` for ``i ≥ j`` and ``r[j − i]`` for ``i < j``
    (``r[0]`` is ignored), of shape ``(..., n, m)`` for ``c`` ``(..., n)`` and ``r``
    ``(..., m)`` (leading dims broadcast; a scalar counts as length 1). ``r`` defaults to
    ``conj(c)``, which makes ``T`` Hermitian when ``c[0]`` is real. Linear in ``c`` and
    ``r``: differentiable and batchable (NOTE [a structured matrix is one gather])."""
    c = _as_vector_stack(c)
    r = cnp.conj(c) if r is None else _as_vector_stack(r)
    (c, r), lead, dtype = _common_stack([c, r], "toeplitz")
    n, m = cnp.shape(c)[-1], cnp.shape(r)[-1]
    if n == 0 or m == 0:
        return _empty(lead, n, m, dtype)
    v = cnp.concatenate([cnp.flip(c, -1), r[..., 1:]], axis=-1)
    i, j = _grid(n, m)
    return _gather_matrix(v, n - 1 - i + j)


def hankel(c, r=None):
    """``scipy.linalg.hankel`` (JAX's ``jax.scipy.linalg.hankel``): the matrix with constant
    anti-diagonals ``H[i, j] = v[i + j]``, ``v = concatenate([c, r[1:]])`` (first column
    ``c`` ``(..., n)``, last row ``r`` ``(..., m)``, ``r[0]`` ignored, ``r`` default zeros);
    shape ``(..., n, m)``, leading dims broadcast. Linear in ``c`` and ``r``."""
    c = cnp.asarray(c)
    r = cnp.zeros_like(c) if r is None else cnp.asarray(r)
    if cnp.ndim(c) == 0:
        raise ValueError("hankel: c must be at least 1-dimensional, got a scalar.")
    if cnp.ndim(r) == 0:
        raise ValueError("hankel: r must be at least 1-dimensional, got a scalar.")
    (c, r), lead, dtype = _common_stack([c, r], "hankel")
    n, m = cnp.shape(c)[-1], cnp.shape(r)[-1]
    if n == 0 or m == 0:
        return _empty(lead, n, m, dtype)
    v = cnp.concatenate([c, r[..., 1:]], axis=-1)
    i, j = _grid(n, m)
    return _gather_matrix(v, i + j)


def circulant(c):
    """``scipy.linalg.circulant`` (JAX's ``jax.scipy.linalg.circulant``): the matrix whose
    columns are the cyclic shifts of ``c``: ``C[i, j] = c[(i − j) mod n]``; ``(..., n)`` in,
    ``(..., n, n)`` out. Linear in ``c``."""
    c = _as_vector_stack(c)
    n = cnp.shape(c)[-1]
    if n == 0:
        return _empty(cnp.shape(c)[:-1], 0, 0, core.dtype_of(c))
    i, j = _grid(n, n)
    return _gather_matrix(c, (i - j) % n)


def leslie(f, s):
    """``scipy.linalg.leslie`` (JAX's ``jax.scipy.linalg.leslie``): the Leslie matrix of
    fecundities ``f`` ``(..., n)`` (its first row, ``n ≥ 2``) and survival rates ``s``
    ``(..., n − 1)`` (its first subdiagonal), zero elsewhere. Linear in ``f`` and ``s``."""
    f, s = _as_vector_stack(f), _as_vector_stack(s)
    n = cnp.shape(f)[-1]
    if n < 2:
        raise ValueError(f"leslie: The length of f along the last axis must be at least 2; got shape {cnp.shape(f)}.")
    if cnp.shape(s)[-1] != n - 1:
        raise ValueError("leslie: Incorrect lengths for f and s. The length of s along the last axis must be one "
                         f"less than the length of f; got f shape {cnp.shape(f)} and s shape {cnp.shape(s)}.")
    (f, s), _, _ = _common_stack([f, s], "leslie")
    v = cnp.concatenate([f, s], axis=-1)  # f at 0..n-1, s at n..2n-2
    i, j = _grid(n, n)
    first_row = i == 0
    idx = np.where(first_row, j, n + np.maximum(i - 1, 0))
    return _gather_matrix(v, idx, first_row | (j == i - 1))


def companion(a):
    """``scipy.linalg.companion`` (JAX's ``jax.scipy.linalg.companion``): for the polynomial
    coefficients ``a = [a₀, …, a_{n−1}]`` (``(..., n)``, ``n ≥ 2``, highest power first),
    the ``(n − 1) × (n − 1)`` matrix with first row ``−a[1:] / a₀`` and ones on the first
    subdiagonal; its eigenvalues are the polynomial's roots. Integer inputs become floats.
    As in JAX, ``a₀ = 0`` is not checked (inf or NaN entries). Differentiable in ``a``."""
    a = _as_vector_stack(promote_inexact(a))
    n = cnp.shape(a)[-1]
    if n < 2:
        raise ValueError(f"companion: The length of `a` along the last axis must be at least 2; got shape {cnp.shape(a)}.")
    first_row = ew.neg(ew.div(a[..., 1:], a[..., :1]))
    one = cnp.ones(cnp.shape(a)[:-1] + (1,), dtype=core.dtype_of(first_row))
    v = cnp.concatenate([first_row, one], axis=-1)  # -a[k]/a0 at k - 1, the one at n - 1
    i, j = _grid(n - 1, n - 1)
    top = i == 0
    return _gather_matrix(v, np.where(top, j, n - 1), top | (j == i - 1))


def fiedler(a):
    """``scipy.linalg.fiedler`` (JAX's ``jax.scipy.linalg.fiedler``): the symmetric matrix
    ``F[i, j] = |a_i − a_j|`` of ``a`` ``(..., n)`` (zero diagonal). Differentiable where
    the entries of ``a`` differ (``|x|``'s derivative at 0 is 0, as JAX's)."""
    a = _as_vector_stack(a)
    return cnp.abs(ew.sub(cnp.expand_dims(a, -1), cnp.expand_dims(a, -2)))


def fiedler_companion(a):
    """``scipy.linalg.fiedler_companion`` (JAX's): for the polynomial coefficients ``a``
    ``(..., n + 1)`` (highest power first, ``a₀ ≠ 0`` not checked), the pentadiagonal
    ``n × n`` matrix of Fiedler (2003) whose eigenvalues are the polynomial's roots. With
    ``b = a / a₀``: ``C[0, 0] = −b₁``, ``C[1, 0] = 1``; for even ``i``: ``C[i, i+1] =
    −b_{i+2}``, ``C[i, i+2] = 1`` and (``i ≥ 2``) ``C[i, i−1] = −b_{i+1}``; for odd ``i ≥ 3``:
    ``C[i, i−2] = 1``; zero elsewhere. ``n = 0`` gives ``(..., 0, 0)``. Differentiable."""
    a = _as_vector_stack(promote_inexact(a))
    if cnp.shape(a)[-1] == 0:
        raise ValueError("fiedler_companion requires the last axis of 'a' to have nonzero length, but got an array "
                         f"of shape {cnp.shape(a)}.")
    n = cnp.shape(a)[-1] - 1
    if n == 0:
        return _empty(cnp.shape(a)[:-1], 0, 0, core.dtype_of(a))
    minus_b = ew.neg(ew.div(a, a[..., :1]))
    one = cnp.ones(cnp.shape(a)[:-1] + (1,), dtype=core.dtype_of(minus_b))
    v = cnp.concatenate([minus_b, one], axis=-1)  # -b_k at k, the one at n + 1
    i, j = _grid(n, n)
    even, odd = i % 2 == 0, i % 2 == 1
    ONE = n + 1  # noqa: N806 - the index of the one in v
    entries = [  # (where, index into v)
        ((i == 0) & (j == 0), 1),
        ((i == 1) & (j == 0), ONE),
        (even & (j == i + 1), i + 2),
        (even & (j == i + 2), ONE),
        (even & (i >= 2) & (j == i - 1), i + 1),
        (odd & (i >= 3) & (j == i - 2), ONE),
    ]
    idx = np.zeros((n, n), dtype=np.int64)
    mask = np.zeros((n, n), dtype=bool)
    for where_, index in entries:
        idx = np.where(where_, np.minimum(index, n + 1), idx)
        mask |= where_
    return _gather_matrix(v, idx, mask)


def convolution_matrix(a, n, mode="full"):
    """``scipy.linalg.convolution_matrix`` (JAX's): the Toeplitz matrix ``A`` ``(..., k,
    n)`` with ``A @ v = numpy.convolve(a, v, mode)`` for ``a`` ``(..., m)`` and ``v`` of
    length ``n``: ``A[i, j] = a[i + t − j]`` where ``0 ≤ i + t − j < m``, else 0, with ``k,
    t = m + n − 1, 0`` (``'full'``), ``max(m, n), (min(m, n) − 1) // 2`` (``'same'``) and
    ``max(m, n) − min(m, n) + 1, min(m, n) − 1`` (``'valid'``). Linear in ``a``."""
    n = operator.index(n)
    if n <= 0:
        raise ValueError(f"convolution_matrix: n must be a positive integer; got {n}.")
    a = cnp.asarray(a)
    if cnp.ndim(a) == 0:
        raise ValueError("convolution_matrix: a must be at least 1-dimensional, got a scalar.")
    m = cnp.shape(a)[-1]
    if m < 1:
        raise ValueError(f"convolution_matrix: len(a) must be at least 1; got shape {cnp.shape(a)}.")
    if mode not in ("full", "valid", "same"):
        raise ValueError(f"convolution_matrix: mode must be one of 'full', 'valid', 'same'; got {mode!r}.")
    rows, offset = {"full": (m + n - 1, 0), "same": (max(m, n), (min(m, n) - 1) // 2),
                    "valid": (max(m, n) - min(m, n) + 1, min(m, n) - 1)}[mode]
    i, j = _grid(rows, n)
    k = i + offset - j
    inside = (k >= 0) & (k < m)
    return _gather_matrix(a, np.clip(k, 0, m - 1), inside)


def block_diag(*arrs):
    """``scipy.linalg.block_diag`` (JAX's): the block diagonal matrix of the arguments, each
    taken as 2-d (a scalar as ``(1, 1)``, a vector ``(n,)`` as one row ``(1, n)``), in their
    common dtype; no argument gives a ``(1, 0)`` array, as SciPy. Linear in each block."""
    if not arrs:
        arrs = (cnp.zeros((1, 0)),)
    blocks = []
    for k, x in enumerate(arrs):
        x = cnp.asarray(x)
        if cnp.ndim(x) > 2:
            raise ShapeError(f"block_diag: argument {k} has {cnp.ndim(x)} dims (shape {cnp.shape(x)}); "
                             "arguments must have at most 2")
        blocks.append(cnp.reshape(x, (1, 1)) if cnp.ndim(x) == 0 else cnp.reshape(x, (1, -1)) if cnp.ndim(x) == 1 else x)
    dtype = cnp.result_type(*blocks)
    total = sum(cnp.shape(b)[1] for b in blocks)
    rows, left = [], 0
    for b in blocks:
        right = total - left - cnp.shape(b)[1]
        rows.append(cnp.pad(cnp.astype(b, dtype), ((0, 0), (left, right))))
        left += cnp.shape(b)[1]
    return cnp.concatenate(rows, axis=0)


# ---------------------------------------------------------------------------------------
# Constant matrices of a size
# ---------------------------------------------------------------------------------------


def _binomials(size):
    """``B[i, j] = C(i, j)`` (0 for ``j > i``) for ``0 ≤ i, j < size`` as float64, by
    Pascal's rule row by row: exact while below 2⁵³."""
    table = np.zeros((size, size))
    if size:
        table[:, 0] = 1.0
    for row in range(1, size):
        table[row, 1:] = table[row - 1, 1:] + table[row - 1, :-1]
    return table


def _size(n, name):
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"{name}: n must be a nonnegative integer; got {n}.")
    return n


def _constant(values, dtype=None):
    return cnp.asarray(np.asarray(values).astype(config.default_float if dtype is None else dtype))


def hilbert(n):
    """``scipy.linalg.hilbert`` (JAX's): ``H[i, j] = 1 / (i + j + 1)``, ``(n, n)``, in
    ``cuvmap.config.default_float``."""
    n = _size(n, "hilbert")
    i, j = _grid(n, n)
    return _constant(1.0 / (i + j + 1.0))


def invhilbert(n):
    """``scipy.linalg.invhilbert`` (JAX's; ``exact=True`` is not offered): the inverse of
    the Hilbert matrix, ``(−1)^{i+j} (i + j + 1) C(n + i, n − j − 1) C(n + j, n − i − 1)
    C(i + j, i)²``, from exact binomials (its entries outgrow float32 near ``n = 14`` and
    float64 near ``n = 24``)."""
    n = _size(n, "invhilbert")
    binom = _binomials(2 * n + 1)
    i, j = _grid(n, n)
    sign = np.where((i + j) % 2 == 0, 1.0, -1.0)
    return _constant(sign * (i + j + 1.0) * binom[n + i, n - j - 1] * binom[n + j, n - i - 1] * binom[i + j, i] ** 2)


def _kind(kind, name):
    kind = "symmetric" if kind is None else kind
    if kind not in ("symmetric", "lower", "upper"):
        raise ValueError(f"{name}: Expected kind to be one of: ['symmetric', 'lower', 'upper']; got {kind!r}")
    return kind


def pascal(n, kind=None):
    """``scipy.linalg.pascal`` (JAX's): the Pascal matrix, ``kind`` ``'symmetric'`` (the
    default; ``P[i, j] = C(i + j, i)``), ``'lower'`` (``L[i, j] = C(i, j)``) or ``'upper'``
    (``Lᵀ``); ``P = L Lᵀ``. Exact binomials (JAX's come from ``lgamma``), rounded once to
    ``cuvmap.config.default_float``."""
    kind = _kind(kind, "pascal")
    n = _size(n, "pascal")
    if kind == "symmetric":
        binom = _binomials(2 * n)
        i, j = _grid(n, n)
        return _constant(binom[i + j, i])
    lower = _binomials(n)
    return _constant(lower if kind == "lower" else lower.T)


def invpascal(n, kind=None):
    """``scipy.linalg.invpascal`` (JAX's; ``exact=True`` is not offered): the inverse of
    :func:`pascal`: ``L⁻¹[i, j] = (−1)^{i−j} C(i, j)``, ``U⁻¹ = (L⁻¹)ᵀ`` and, for the
    symmetric ``P = L Lᵀ``, ``P⁻¹ = (L⁻¹)ᵀ L⁻¹``, computed exactly in integers."""
    kind = _kind(kind, "invpascal")
    n = _size(n, "invpascal")
    i, j = _grid(n, n)
    lower_inv = np.where((i - j) % 2 == 0, 1, -1) * _binomials(n).astype(np.int64)
    if kind == "lower":
        return _constant(lower_inv)
    if kind == "upper":
        return _constant(lower_inv.T)
    return _constant(lower_inv.T @ lower_inv)


def helmert(n, full=False):
    """``scipy.linalg.helmert`` (JAX's): the ``(n − 1, n)`` matrix of orthonormal contrasts,
    row ``k − 1`` = ``(1, …, 1, −k, 0, …, 0) / √(k (k + 1))`` (``k`` ones); ``full=True``
    puts the row ``1/√n`` on top (an ``n × n`` orthogonal matrix)."""
    n = operator.index(n)
    if n < 1:
        raise ValueError(f"helmert: n must be a positive integer; got {n}.")
    i, j = _grid(n - 1, n)
    k = i + 1.0
    norm = np.sqrt(k * (k + 1.0))
    h = np.where(j <= i, 1.0 / norm, np.where(j == i + 1, -k / norm, 0.0))
    if full:
        h = np.concatenate([np.full((1, n), 1.0 / math.sqrt(n)), h], axis=0)
    return _constant(h)


def hadamard(n, dtype=int):
    """``scipy.linalg.hadamard`` (JAX's): the Sylvester Hadamard matrix of order ``n`` (a
    power of 2), ``H[i, j] = (−1)^{popcount(i & j)}``, so ``H Hᵀ = n I``; in ``dtype``
    (default ``int``, NumPy's int64)."""
    n = operator.index(n)
    if n < 1 or n & (n - 1):
        raise ValueError(f"hadamard: n must be a positive power of 2; got {n}.")
    i, j = _grid(n, n)
    bits = i & j
    parity = np.zeros_like(bits)
    while bits.any():
        parity ^= bits & 1
        bits = bits >> 1
    return _constant(1 - 2 * parity, np.dtype(dtype))


def dft(n, scale=None, *, dtype=None):
    """``scipy.linalg.dft`` (JAX's): the discrete Fourier transform matrix ``W[i, j] =
    ω^{ij}``, ``ω = exp(−2πi / n)`` (so ``W @ x = fft(x)``), scaled by ``1/√n``
    (``scale='sqrtn'``, unitary) or ``1/n`` (``'n'``). The exponent is reduced mod ``n``
    before the exponential, so each entry is accurate to rounding. ``dtype``: a complex
    dtype (default: the complex dtype of ``cuvmap.config.default_float``)."""
    if scale is not None and scale not in ("sqrtn", "n"):
        raise ValueError(f"dft: scale must be None, 'sqrtn', or 'n'; got {scale!r}.")
    if dtype is None:
        dtype = np.result_type(config.default_float, np.complex64)
    else:
        dtype = np.dtype(dtype)
        if kind_of(dtype) != "c":
            raise ValueError(f"dft: dtype must be a complex floating-point type; got {dtype}.")
    n = _size(n, "dft")
    i, j = _grid(n, n)
    w = np.exp(-2j * np.pi * ((i * j) % max(n, 1)) / max(n, 1))
    if scale == "sqrtn":
        w = w / math.sqrt(n)
    elif scale == "n":
        w = w / n
    return _constant(w, dtype)
