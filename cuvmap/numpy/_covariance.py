"""Covariance and correlation matrices, as ``jax.numpy`` names them: ``cov`` and
``corrcoef``. Both center the variables and contract them with one matrix product, so
they differentiate, batch and stage under ``jit`` as the products do."""
import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.numpy._common import ndim, shape
from cuvmap.numpy._complex import conj, imag, real
from cuvmap.numpy._creation import asarray, full
from cuvmap.numpy._creation import promote_inexact as _inexact
from cuvmap.numpy._elementwise import astype, clip
from cuvmap.numpy._products import matmul
from cuvmap.numpy._reductions import sum
from cuvmap.numpy._shapes import concatenate, diagonal, reshape, squeeze, transpose
from cuvmap.core.bfloat16 import kind_of




def _check_dtype(name, dtype):
    if dtype is not None and kind_of(np.dtype(dtype)) not in "fc":
        raise ValueError(f"{name}: dtype must be a floating or complex dtype, got {np.dtype(dtype)}")


def _as_rows(x):
    return reshape(x, (1,) + shape(x)) if ndim(x) < 2 else x


def _weights(w, n, name, what):
    w = asarray(w)
    if ndim(w) != 1:
        raise ShapeError(f"cov: {what} must be 1-D, got shape {shape(w)}")
    if shape(w)[0] != n:
        raise ShapeError(f"cov: {what} has {shape(w)[0]} entries for {n} observations")
    return w


def cov(m, y=None, rowvar=True, bias=False, ddof=None, fweights=None, aweights=None, dtype=None):
    """``jnp.cov``: the covariance matrix of the variables in the rows of ``m`` (columns
    with ``rowvar=False``; ``y`` adds variables): ``C = (X − x̄)(X − x̄)ᴴ / f`` with the
    (weighted) means ``x̄`` and ``f = N − ddof`` (``ddof`` default 1, 0 with ``bias``);
    with weights ``w = fweights · aweights``, ``x̄ = Σ w x / Σ w`` and ``f = Σ w − ddof ·
    Σ w·aweights / Σ w``, as NumPy. Weights are taken in absolute value (as JAX; NumPy
    raises on negative ones). A single variable gives a scalar."""
    _check_dtype("cov", dtype)
    if y is not None:
        m, y = _inexact(m, y)
        if ndim(y) > 2:
            raise ShapeError(f"cov: y has more than 2 dims (shape {shape(y)})")
    else:
        (m,) = _inexact(m)
    if ndim(m) > 2:
        raise ShapeError(f"cov: m has more than 2 dims (shape {shape(m)})")
    x = _as_rows(m)
    if not rowvar and ndim(m) != 1:
        x = transpose(x)
    if shape(x)[0] == 0:
        return reshape(asarray(np.zeros((0,), dtype=core.dtype_of(x))), (0, 0))
    if y is not None:
        y = _as_rows(y)
        if not rowvar and shape(y)[0] != 1:
            y = transpose(y)
        x = concatenate((x, y), axis=0)
    n_vars, n_obs = shape(x)
    if n_obs == 0:
        return full(() if n_vars == 1 else (n_vars, n_vars), np.nan, dtype=core.dtype_of(x))
    if ddof is None:
        ddof = 0 if bias else 1
    w = None
    if fweights is not None:
        fweights = _weights(fweights, n_obs, "cov", "fweights")
        if kind_of(core.dtype_of(fweights)) not in "iu":
            raise TypeError(f"cov: fweights must be integers, got {core.dtype_of(fweights)}")
        w = ew.abs(fweights)
    if aweights is not None:
        aweights = ew.abs(_weights(aweights, n_obs, "cov", "aweights"))
        w = aweights if w is None else ew.mul(w, aweights)
    if dtype is not None:
        x = astype(x, dtype)
    if w is not None:
        w = astype(w, np.finfo(core.dtype_of(x)).dtype)  # the real dtype of x's
        w_sum = sum(w)
        mean = ew.div(sum(ew.mul(x, reshape(w, (1, n_obs))), axis=1, keepdims=True), w_sum)
    else:
        mean = ew.div(sum(x, axis=1, keepdims=True), n_obs)
    if w is None:
        f = n_obs - ddof
    elif ddof == 0:
        f = w_sum
    elif aweights is None:
        f = ew.sub(w_sum, ddof)
    else:
        f = ew.sub(w_sum, ew.div(ew.mul(ddof, sum(ew.mul(w, astype(aweights, core.dtype_of(w))))), w_sum))
    centered = ew.sub(x, mean)
    weighted = centered if w is None else ew.mul(centered, reshape(w, (1, n_obs)))
    c = ew.div(matmul(centered, conj(transpose(weighted))), f)
    return squeeze(c)


def corrcoef(x, y=None, rowvar=True, dtype=None):
    """``jnp.corrcoef``: the Pearson correlation coefficients ``R_ij = C_ij / √(C_ii C_jj)``
    of :func:`cov`'s matrix ``C``, real (and imaginary) parts clipped to ``[−1, 1]``. A
    single variable gives ``C / C`` (1, or NaN for a constant one)."""
    _check_dtype("corrcoef", dtype)
    c = cov(x, y, rowvar, dtype=dtype)
    if ndim(c) == 0:
        return ew.div(c, c)
    stddev = astype(ew.sqrt(real(diagonal(c))), core.dtype_of(c))
    n = shape(stddev)[0]
    c = ew.div(ew.div(c, reshape(stddev, (n, 1))), reshape(stddev, (1, n)))
    if np.dtype(core.dtype_of(c)).kind == "c":
        return ew.complex(clip(real(c), -1, 1), clip(imag(c), -1, 1))
    return clip(c, -1, 1)
