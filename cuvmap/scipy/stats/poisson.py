"""The Poisson distribution with mean ``mu`` (location ``loc``), as
``jax.scipy.stats.poisson``: with ``j = k − loc``,
``logpmf = j log mu − mu − lgamma(j + 1)`` for integer ``j ≥ 0`` (``−inf`` elsewhere),
``cdf = Q(⌊j⌋ + 1, mu)`` (:func:`cuvmap.scipy.special.gammaincc`) for ``j ≥ 0`` (0 below).
Differentiable in ``mu``; ``k`` is a count.
"""
import numpy as np

from cuvmap import numpy as cnp
from cuvmap.scipy import special
from cuvmap.scipy._util import promote_inexact


def logpmf(k, mu, loc=0):
    """The log probability mass (module's formula). JAX: ``jax.scipy.stats.poisson.logpmf``."""
    k, mu, loc = promote_inexact(k, mu, loc)
    j = k - loc
    valid = (j >= 0) & (j == cnp.floor(j))
    safe = cnp.where(valid, j, 0.0)
    value = special.xlogy(safe, mu) - mu - special.gammaln(safe + 1)
    return cnp.where(valid, value, -np.inf)


def pmf(k, mu, loc=0):
    """``exp(logpmf(k, mu, loc))``. JAX: ``jax.scipy.stats.poisson.pmf``."""
    return cnp.exp(logpmf(k, mu, loc))


def cdf(k, mu, loc=0):
    """``P(K ≤ k) = Q(⌊k − loc⌋ + 1, mu)``, 0 for ``k < loc``. JAX: ``jax.scipy.stats.poisson.cdf``."""
    k, mu, loc = promote_inexact(k, mu, loc)
    j = cnp.floor(k - loc)
    valid = j >= 0
    return cnp.where(valid, special.gammaincc(cnp.where(valid, j, 0.0) + 1, mu), 0.0)
