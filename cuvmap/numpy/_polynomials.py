"""Polynomials and 1-D signals, as ``jax.numpy`` names them: ``polyval``, ``convolve``,
``correlate``, ``kron`` and the coefficient arithmetic of issue 32 (``polyadd``,
``polysub``, ``polymul``, ``polydiv``, ``polyder``, ``polyint``, ``poly``, ``polyfit``,
``vander``; in :mod:`cuvmap.numpy._polynomial_arithmetic`). Convolutions gather the sliding windows of the (padded)
signal with one static ``take`` and contract them with the kernel in one
``dot_general``, so they differentiate and batch as those do and accept integers too."""
import builtins

import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import linalg as lax_linalg
from cuvmap.lax import shape as lax_shape
from cuvmap.numpy._common import ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._shapes import flip, reshape
from cuvmap.core.bfloat16 import kind_of


def polyval(p, x, *, unroll=16):
    """``jnp.polyval``: the polynomial with coefficients ``p`` (highest degree first, 1-D)
    at ``x``: ``p[0]·x^(n−1) + … + p[n−1]``, by Horner's rule. ``unroll`` is accepted for
    JAX's signature (the static loop over the coefficients is always unrolled)."""
    p, x = asarray(p), asarray(x)
    if ndim(p) != 1:
        raise ShapeError(f"polyval: p must be 1-D, got shape {shape(p)}")
    n = shape(p)[0]
    dtype = np.result_type(core.dtype_of(p), core.dtype_of(x))
    p, x = astype(p, dtype), astype(x, dtype)
    y = ew.mul(x, 0)
    for i in range(n):
        y = ew.add(ew.mul(y, x), reshape(lax_indexing.slice_in_dim(p, i, i + 1, 0), ()))
    return y


def _check_1d(name, a, v):
    if ndim(a) != 1 or ndim(v) != 1:
        raise ShapeError(f"{name}: a and v must be 1-D, got shapes {shape(a)} and {shape(v)}")
    if shape(a)[0] == 0 or shape(v)[0] == 0:
        raise ValueError(f"{name}: a and v must not be empty")


def _full_correlation(a, v, mode, name):
    """``out[k] = Σ_j a[k + j − (m − 1)] · v[j]`` (``a`` zero-padded): NumPy's
    ``correlate(a, v, 'full')`` for real operands, cut to ``mode``'s length."""
    n, m = shape(a)[0], shape(v)[0]
    if mode == "full":
        lo, length = 0, n + m - 1
    elif mode == "same":
        length = builtins.max(n, m)
        lo = (n + m - 1 - length) // 2
    elif mode == "valid":
        length = builtins.max(n, m) - builtins.min(n, m) + 1
        lo = builtins.min(n, m) - 1
    else:
        raise ValueError(f"{name}: mode must be 'full', 'same' or 'valid', got {mode!r}")
    padded = lax_shape.pad(a, ((m - 1, m - 1),), 0)
    windows = (np.arange(lo, lo + length)[:, None] + np.arange(m)[None, :]).astype(np.int64)
    gathered = lax_indexing.take(padded, backend.xp_of(a).asarray(windows), 0)  # (length, m)
    return lax_linalg.dot_general(gathered, v, (((1,), (0,)), ((), ())))


def _operands(a, v, inexact=False):
    """The operands in their promoted dtype; ``inexact``: integers and booleans become
    float64, as JAX's ``convolve`` and ``correlate`` compute in floats (with 64-bit types)."""
    a, v = asarray(a), asarray(v)
    dtype = np.result_type(core.dtype_of(a), core.dtype_of(v))
    if inexact and kind_of(dtype) not in "fc":
        dtype = np.dtype(np.float64)
    return astype(a, dtype), astype(v, dtype)


def convolve(a, v, mode="full", *, precision=None, preferred_element_type=None):
    """``jnp.convolve``: the discrete linear convolution of the 1-D ``a`` and ``v``,
    ``out[k] = Σ_j a[j] · v[k − j]``, in a floating dtype (integers promote, as in JAX); ``mode`` keeps all ``n + m − 1`` outputs
    (``'full'``), the middle ``max(n, m)`` (``'same'``) or those where the two overlap
    fully (``'valid'``). With ``preferred_element_type`` the operands keep their common
    dtype (integers stay exact) and the result has that dtype, as in JAX."""
    a, v = _operands(a, v, inexact=preferred_element_type is None)
    _check_1d("convolve", a, v)
    if shape(v)[0] > shape(a)[0]:
        a, v = v, a
    out = _full_correlation(a, flip(v, 0), mode, "convolve")
    return out if preferred_element_type is None else astype(out, preferred_element_type)


def correlate(a, v, mode="valid", *, precision=None, preferred_element_type=None):
    """``jnp.correlate``: the cross-correlation of the 1-D ``a`` and ``v``,
    ``out[k] = Σ_n a[n + k] · v[n]`` over the overlap (``mode`` as in :func:`convolve`;
    NumPy's default ``'valid'``); ``preferred_element_type`` as in :func:`convolve`."""
    a, v = _operands(a, v, inexact=preferred_element_type is None)
    _check_1d("correlate", a, v)
    if np.dtype(core.dtype_of(v)).kind == "c":
        # NumPy conjugates v; without a conj here a complex v would give a wrong number
        raise NotImplementedError("correlate: complex operands are not supported (NumPy's correlate conjugates v)")
    if shape(v)[0] > shape(a)[0]:
        # correlate(a, v) is correlate(v, a) reversed
        out = flip(_full_correlation(v, a, mode, "correlate"), 0)
    else:
        out = _full_correlation(a, v, mode, "correlate")
    return out if preferred_element_type is None else astype(out, preferred_element_type)


def kron(a, b):
    """``jnp.kron``: the Kronecker product: the block array whose block ``i`` is
    ``a[i] · b`` (dims padded with leading 1s to a common rank; result shape
    ``a.shape[k] · b.shape[k]`` per dim)."""
    a, b = _operands(a, b)
    d = builtins.max(ndim(a), ndim(b))
    sa = (1,) * (d - ndim(a)) + shape(a)
    sb = (1,) * (d - ndim(b)) + shape(b)
    a = reshape(a, tuple(v for s in sa for v in (s, 1)))
    b = reshape(b, tuple(v for s in sb for v in (1, s)))
    return reshape(ew.mul(a, b), tuple(x * y for x, y in zip(sa, sb)))
