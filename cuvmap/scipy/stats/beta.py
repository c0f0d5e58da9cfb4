"""The beta distribution with shapes ``a``, ``b`` (location ``loc``, scale ``scale``), as
``jax.scipy.stats.beta``: with ``y = (x − loc)/scale``,
``logpdf = (a − 1) log y + (b − 1) log1p(−y) − log B(a, b) − log(scale)`` on ``0 < y < 1``
(``−inf`` outside), ``cdf = I_y(a, b)`` (:func:`cuvmap.scipy.special.betainc`, clipped to
``[0, 1]``), ``sf = I_{1−y}(b, a)``. The densities are differentiable in every argument;
the distribution functions in ``x``, ``loc`` and ``scale`` (``betainc`` has no derivative
in ``a``, ``b``, as in JAX).
"""
import numpy as np

from cuvmap import numpy as cnp
from cuvmap.scipy import special
from cuvmap.scipy._util import promote_inexact
from cuvmap.scipy.stats._common import log_scale, standardize


def logpdf(x, a, b, loc=0, scale=1):
    """The log density (module's formula). JAX: ``jax.scipy.stats.beta.logpdf``."""
    y, scale = standardize(x, loc, scale)
    a, b = promote_inexact(a, b)
    inside = (y > 0) & (y < 1)
    safe = cnp.where(inside, y, 0.5)
    value = special.xlogy(a - 1, safe) + special.xlog1py(b - 1, -safe) - special.betaln(a, b) - log_scale(scale)
    return cnp.where(inside, value, -np.inf)


def pdf(x, a, b, loc=0, scale=1):
    """``exp(logpdf(x, a, b, loc, scale))``. JAX: ``jax.scipy.stats.beta.pdf``."""
    return cnp.exp(logpdf(x, a, b, loc, scale))


def cdf(x, a, b, loc=0, scale=1):
    """``I_y(a, b)`` with ``y`` clipped to ``[0, 1]``. JAX: ``jax.scipy.stats.beta.cdf``."""
    y, _ = standardize(x, loc, scale)
    a, b = promote_inexact(a, b)
    return special.betainc(a, b, cnp.clip(y, 0.0, 1.0))


def logcdf(x, a, b, loc=0, scale=1):
    """``log cdf(x, a, b, loc, scale)``. JAX: ``jax.scipy.stats.beta.logcdf``."""
    return cnp.log(cdf(x, a, b, loc, scale))


def sf(x, a, b, loc=0, scale=1):
    """The survival function ``I_{1−y}(b, a)``. JAX: ``jax.scipy.stats.beta.sf``."""
    y, _ = standardize(x, loc, scale)
    a, b = promote_inexact(a, b)
    return special.betainc(b, a, cnp.clip(1 - y, 0.0, 1.0))


def logsf(x, a, b, loc=0, scale=1):
    """``log sf(x, a, b, loc, scale)``. JAX: ``jax.scipy.stats.beta.logsf``."""
    return cnp.log(sf(x, a, b, loc, scale))
