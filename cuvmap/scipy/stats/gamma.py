"""The gamma distribution with shape ``a`` (location ``loc``, scale ``scale``), as
``jax.scipy.stats.gamma``: with ``y = (x − loc)/scale``,
``logpdf = (a − 1) log y − y − lgamma(a) − log(scale)`` for ``y > 0`` (``−inf`` below 0),
``cdf = P(a, y)`` (:func:`cuvmap.scipy.special.gammainc`), ``sf = Q(a, y)``. The densities are
differentiable in every argument; ``cdf``/``sf`` in ``x``, ``loc``, ``scale`` and, to first
order, ``a``.
"""
import numpy as np

from cuvmap import numpy as cnp
from cuvmap.scipy import special
from cuvmap.scipy._util import promote_inexact
from cuvmap.scipy.stats._common import log_scale, standardize


def logpdf(x, a, loc=0, scale=1):
    """The log density (module's formula). JAX: ``jax.scipy.stats.gamma.logpdf``."""
    y, scale = standardize(x, loc, scale)
    a = promote_inexact(a)
    inside = y > 0
    safe = cnp.where(inside, y, 1.0)
    value = special.xlogy(a - 1, safe) - safe - special.gammaln(a) - log_scale(scale)
    at_zero = cnp.where(a < 1, np.inf, cnp.where(a == 1, -log_scale(scale), -np.inf))
    return cnp.where(inside, value, cnp.where(y == 0, at_zero, -np.inf))


def pdf(x, a, loc=0, scale=1):
    """``exp(logpdf(x, a, loc, scale))``. JAX: ``jax.scipy.stats.gamma.pdf``."""
    return cnp.exp(logpdf(x, a, loc, scale))


def cdf(x, a, loc=0, scale=1):
    """``P(a, y)``, 0 for ``y ≤ 0``. JAX: ``jax.scipy.stats.gamma.cdf``."""
    y, _ = standardize(x, loc, scale)
    return special.gammainc(promote_inexact(a), cnp.maximum(y, 0.0))


def logcdf(x, a, loc=0, scale=1):
    """``log cdf(x, a, loc, scale)``. JAX: ``jax.scipy.stats.gamma.logcdf``."""
    return cnp.log(cdf(x, a, loc, scale))


def sf(x, a, loc=0, scale=1):
    """The survival function ``Q(a, y)``. JAX: ``jax.scipy.stats.gamma.sf``."""
    y, _ = standardize(x, loc, scale)
    return special.gammaincc(promote_inexact(a), cnp.maximum(y, 0.0))


def logsf(x, a, loc=0, scale=1):
    """``log sf(x, a, loc, scale)``. JAX: ``jax.scipy.stats.gamma.logsf``."""
    return cnp.log(sf(x, a, loc, scale))
