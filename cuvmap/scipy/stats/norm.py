"""The normal distribution ``N(loc, scale²)``, as ``jax.scipy.stats.norm``: ``logpdf``,
``pdf``, ``cdf``, ``logcdf``, ``sf``, ``logsf``, ``ppf``, ``isf``. Every function takes
``loc=0`` and ``scale=1`` (arrays broadcast) and is differentiable in all its arguments.

With ``z = (x − loc) / scale``: ``logpdf = −z²/2 − log(scale) − ½ log 2π``;
``cdf = Φ(z)`` (:func:`cuvmap.scipy.special.ndtr`); ``logcdf = log Φ(z)``
(:func:`~cuvmap.scipy.special.log_ndtr`, accurate in the far tail); ``sf = Φ(−z)``;
``ppf(q) = loc + scale · Φ⁻¹(q)`` (:func:`~cuvmap.scipy.special.ndtri`).
"""
import math

from cuvmap import numpy as cnp
from cuvmap.scipy import special
from cuvmap.scipy._util import promote_inexact

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _standardize(x, loc, scale):
    x, loc, scale = promote_inexact(x, loc, scale)
    return (x - loc) / scale


def logpdf(x, loc=0, scale=1):
    """``log φ((x − loc)/scale) − log(scale)``. JAX: ``jax.scipy.stats.norm.logpdf``."""
    z = _standardize(x, loc, scale)
    return -0.5 * z * z - cnp.log(promote_inexact(scale)) - _HALF_LOG_2PI


def pdf(x, loc=0, scale=1):
    """The density ``exp(logpdf(x, loc, scale))``. JAX: ``jax.scipy.stats.norm.pdf``."""
    return cnp.exp(logpdf(x, loc, scale))


def cdf(x, loc=0, scale=1):
    """``Φ((x − loc)/scale)``. JAX: ``jax.scipy.stats.norm.cdf``."""
    return special.ndtr(_standardize(x, loc, scale))


def logcdf(x, loc=0, scale=1):
    """``log Φ((x − loc)/scale)``, accurate far into the lower tail. JAX:
    ``jax.scipy.stats.norm.logcdf``."""
    return special.log_ndtr(_standardize(x, loc, scale))


def sf(x, loc=0, scale=1):
    """The survival function ``1 − cdf = Φ(−(x − loc)/scale)``. JAX: ``jax.scipy.stats.norm.sf``."""
    return special.ndtr(-_standardize(x, loc, scale))


def logsf(x, loc=0, scale=1):
    """``log sf(x, loc, scale)``. JAX: ``jax.scipy.stats.norm.logsf``."""
    return special.log_ndtr(-_standardize(x, loc, scale))


def ppf(q, loc=0, scale=1):
    """The quantile function ``loc + scale · Φ⁻¹(q)``. JAX: ``jax.scipy.stats.norm.ppf``."""
    q = promote_inexact(q)
    return loc + scale * special.ndtri(q)


def isf(q, loc=0, scale=1):
    """The inverse survival function ``loc − scale · Φ⁻¹(q)``. JAX: ``jax.scipy.stats.norm.isf``."""
    q = promote_inexact(q)
    return loc - scale * special.ndtri(q)
