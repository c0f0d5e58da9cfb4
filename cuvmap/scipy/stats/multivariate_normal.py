"""The multivariate normal distribution ``N(mean, cov)``, as
``jax.scipy.stats.multivariate_normal`` (``logpdf``, ``pdf``), with ``allow_singular`` and
autograd's ``entropy`` besides.

For ``d``-dimensional ``x`` (``(..., d)``; ``mean`` ``(d,)`` or broadcastable, ``cov``
``(d, d)`` or a stack of them, or a scalar variance), with ``L`` the lower Cholesky factor of
``cov`` and ``y = L⁻¹ (x − mean)``:
``logpdf = −½ |y|² − (d/2) log 2π − Σ log diag L``. ``allow_singular=True`` (SciPy's
meaning; JAX refuses it) takes the eigendecomposition ``cov = U diag(s) Uᵀ`` instead and the
density on the support: eigenvalues below ``1e6 · eps · max s`` (float64; ``1e3 · eps`` for
float32) are dropped, ``r`` is the number kept, and
``logpdf = −½ (r log 2π + Σ_kept log s + Σ_kept (uᵢᵀ(x − mean))² / sᵢ)``.
Differentiable in ``x``, ``mean`` and ``cov`` (through the Cholesky factor, whose rule reads
the lower triangle; singular covariances: in ``x`` and ``mean``).
"""
import math

import numpy as np

from cuvmap import core
from cuvmap import numpy as cnp
from cuvmap.scipy import linalg as sla
from cuvmap.scipy._util import promote_inexact

_LOG_2PI = math.log(2 * math.pi)


def _check(name, mean, cov):
    d = cnp.shape(mean)[-1]
    if cnp.ndim(cov) < 2 or cnp.shape(cov)[-2:] != (d, d):
        raise ValueError(f"multivariate_normal.{name}: cov must have shape (..., {d}, {d}) to match mean's last "
                         f"dimension {d}, got shape {cnp.shape(cov)}")
    return d


def logpdf(x, mean, cov, allow_singular=None):
    """The log density of ``N(mean, cov)`` at ``x`` (module's formulas). ``allow_singular``:
    ``None``/``False``: ``cov`` must be positive definite (else NaN, as JAX); ``True``: the
    density on the support of a singular ``cov``, as SciPy. JAX:
    ``jax.scipy.stats.multivariate_normal.logpdf``."""
    x, mean, cov = promote_inexact(x, mean, cov)
    if cnp.ndim(mean) == 0:
        y = x - mean
        return -0.5 * y * y / cov - 0.5 * (_LOG_2PI + cnp.log(cov))
    d = cnp.shape(mean)[-1]
    y = x - mean
    if cnp.ndim(cov) == 0:
        return -0.5 * cnp.sum(y * y, axis=-1) / cov - 0.5 * d * (_LOG_2PI + cnp.log(cov))
    _check("logpdf", mean, cov)
    if allow_singular:
        return _logpdf_singular(y, cov, d)
    lower = sla.cholesky(cov, lower=True)
    batch = np.broadcast_shapes(cnp.shape(y)[:-1], cnp.shape(lower)[:-2])
    z = sla.solve_triangular(cnp.broadcast_to(lower, batch + (d, d)), cnp.broadcast_to(y, batch + (d,))[..., None],
                             lower=True)[..., 0]
    log_det_half = cnp.sum(cnp.log(cnp.diagonal(lower, axis1=-2, axis2=-1)), axis=-1)
    return -0.5 * cnp.sum(z * z, axis=-1) - 0.5 * d * _LOG_2PI - log_det_half


def _logpdf_singular(y, cov, d):
    s, u = sla.eigh(cov)
    eps = np.finfo(core.dtype_of(s)).eps * (1e3 if core.dtype_of(s) == np.float32 else 1e6)
    cutoff = eps * cnp.max(cnp.abs(s), axis=-1, keepdims=True)
    keep = s > cutoff
    safe = cnp.where(keep, s, 1.0)
    rank = cnp.sum(cnp.astype(keep, core.dtype_of(s)), axis=-1)
    log_pdet = cnp.sum(cnp.where(keep, cnp.log(safe), 0.0), axis=-1)
    proj = cnp.einsum("...ji,...j->...i", u, y)  # uᵢᵀ y
    maha = cnp.sum(cnp.where(keep, proj * proj / safe, 0.0), axis=-1)
    return -0.5 * (rank * _LOG_2PI + log_pdet + maha)


def pdf(x, mean, cov, allow_singular=None):
    """``exp(logpdf(x, mean, cov, allow_singular))``. JAX:
    ``jax.scipy.stats.multivariate_normal.pdf``."""
    return cnp.exp(logpdf(x, mean, cov, allow_singular))


def entropy(mean, cov):
    """The differential entropy ``½ d (1 + log 2π) + ½ log det cov`` (independent of
    ``mean``). autograd/SciPy: ``multivariate_normal.entropy`` (JAX has none)."""
    mean, cov = promote_inexact(mean, cov)
    d = _check("entropy", cnp.atleast_1d(mean), cov)
    _, log_det = cnp.linalg.slogdet(cov)
    return 0.5 * d * (1 + _LOG_2PI) + 0.5 * log_det
