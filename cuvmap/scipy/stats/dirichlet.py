"""The Dirichlet distribution with concentrations ``alpha`` (``(K,)``), as
``jax.scipy.stats.dirichlet``: for ``x`` of shape ``(K, ...)`` (or ``(K − 1, ...)``, the last
coordinate then ``1 − Σ x``), ``logpdf = Σ_i (αᵢ − 1) log xᵢ − (Σ_i lgamma(αᵢ) − lgamma(Σ αᵢ))``
where ``x`` is on the simplex (every ``xᵢ > 0`` and ``|Σ xᵢ − 1| < 1e-6``), ``−inf`` elsewhere.
Differentiable in ``x`` and ``alpha``.
"""
import numpy as np

from cuvmap import numpy as cnp
from cuvmap.scipy import special
from cuvmap.scipy._util import promote_inexact


def logpdf(x, alpha):
    """The log density (module's formula). JAX: ``jax.scipy.stats.dirichlet.logpdf``."""
    x, alpha = promote_inexact(x, alpha)
    if cnp.ndim(alpha) != 1:
        raise ValueError(f"dirichlet.logpdf: alpha must be one-dimensional, got shape {cnp.shape(alpha)}")
    k = cnp.shape(alpha)[0]
    if cnp.ndim(x) == 0 or cnp.shape(x)[0] not in (k, k - 1):
        raise ValueError(f"dirichlet.logpdf: x must have shape ({k}, ...) or ({k - 1}, ...) to match alpha's "
                         f"shape ({k},), got shape {cnp.shape(x)}")
    if cnp.shape(x)[0] != k:
        x = cnp.concatenate([x, 1 - cnp.sum(x, axis=0, keepdims=True)], axis=0)
    normalizer = cnp.sum(special.gammaln(alpha)) - special.gammaln(cnp.sum(alpha))
    a = cnp.reshape(alpha, (k,) + (1,) * (cnp.ndim(x) - 1))
    on_simplex = cnp.all(x > 0, axis=0) & (cnp.abs(cnp.sum(x, axis=0) - 1) < 1e-6)
    safe = cnp.where(x > 0, x, 1.0)
    return cnp.where(on_simplex, cnp.sum(special.xlogy(a - 1, safe), axis=0) - normalizer, -np.inf)


def pdf(x, alpha):
    """``exp(logpdf(x, alpha))``. JAX: ``jax.scipy.stats.dirichlet.pdf``."""
    return cnp.exp(logpdf(x, alpha))
