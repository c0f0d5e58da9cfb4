"""The chi-squared distribution with ``df`` degrees of freedom (location ``loc``, scale
``scale``), as ``jax.scipy.stats.chi2``: with ``y = (x − loc)/scale``,
``logpdf = (df/2 − 1) log y − y/2 − (df/2) log 2 − lgamma(df/2) − log(scale)`` for ``y > 0``
(``−inf`` for ``y < 0``), ``cdf = P(df/2, y/2)`` (:func:`cuvmap.scipy.special.gammainc`),
``sf = Q(df/2, y/2)``. The densities are differentiable in every argument; the distribution
functions in ``x``, ``loc`` and ``scale`` (``gammainc``'s derivative in ``a`` is
``igamma_grad_a``, first order only).
"""
import math

import numpy as np

from cuvmap import numpy as cnp
from cuvmap.scipy import special
from cuvmap.scipy._util import promote_inexact
from cuvmap.scipy.stats._common import log_scale, standardize


def logpdf(x, df, loc=0, scale=1):
    """The log density (module's formula). JAX: ``jax.scipy.stats.chi2.logpdf``."""
    y, scale = standardize(x, loc, scale)
    df = promote_inexact(df)
    k = 0.5 * df
    inside = y > 0
    safe = cnp.where(inside, y, 1.0)
    value = special.xlogy(k - 1, safe) - 0.5 * safe - k * math.log(2) - special.gammaln(k) - log_scale(scale)
    at_zero = cnp.where(k < 1, np.inf, cnp.where(k == 1, -math.log(2) - log_scale(scale), -np.inf))
    return cnp.where(inside, value, cnp.where(y == 0, at_zero, -np.inf))


def pdf(x, df, loc=0, scale=1):
    """``exp(logpdf(x, df, loc, scale))``. JAX: ``jax.scipy.stats.chi2.pdf``."""
    return cnp.exp(logpdf(x, df, loc, scale))


def cdf(x, df, loc=0, scale=1):
    """``P(df/2, y/2)``, 0 for ``y ≤ 0``. JAX: ``jax.scipy.stats.chi2.cdf``."""
    y, _ = standardize(x, loc, scale)
    df = promote_inexact(df)
    return special.gammainc(0.5 * df, cnp.maximum(0.5 * y, 0.0))


def logcdf(x, df, loc=0, scale=1):
    """``log cdf(x, df, loc, scale)``. JAX: ``jax.scipy.stats.chi2.logcdf``."""
    return cnp.log(cdf(x, df, loc, scale))


def sf(x, df, loc=0, scale=1):
    """The survival function ``Q(df/2, y/2)`` (accurate where small). JAX:
    ``jax.scipy.stats.chi2.sf``."""
    y, _ = standardize(x, loc, scale)
    df = promote_inexact(df)
    return special.gammaincc(0.5 * df, cnp.maximum(0.5 * y, 0.0))


def logsf(x, df, loc=0, scale=1):
    """``log sf(x, df, loc, scale)``. JAX: ``jax.scipy.stats.chi2.logsf``."""
    return cnp.log(sf(x, df, loc, scale))
