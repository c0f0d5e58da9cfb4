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


def rvs(alpha, size=None, random_state=None):
    """Draws from the Dirichlet distribution on the host, as SciPy: shape ``size + (K,)``
    (``(1, K)`` for ``size=None``, SciPy's default of one draw), from NumPy's
    ``Generator.dirichlet``/``RandomState.dirichlet``; ``random_state``: ``None`` (NumPy's
    global ``RandomState``, as SciPy), an int seed, a ``numpy.random.Generator`` or
    ``RandomState``. A concrete ``alpha`` only (sampling is not a transform; under
    :func:`~cuvmap.jit` or :func:`~cuvmap.vmap` draw with ``cuvmap.random``'s keys).
    SciPy/autograd: ``scipy.stats.dirichlet.rvs`` (JAX's ``dirichlet`` has none)."""
    try:
        a = np.asarray(alpha, dtype=np.float64)
    except Exception as e:  # a tracer: its value is not known here
        raise TypeError(f"dirichlet.rvs: alpha must be a concrete array (sampling happens on the host), got "
                        f"{type(alpha).__name__}") from e
    if a.ndim != 1:
        raise ValueError(f"dirichlet.rvs: alpha must be one-dimensional, got shape {a.shape}")
    if random_state is None:
        gen = np.random.mtrand._rand
    elif isinstance(random_state, (int, np.integer)):
        gen = np.random.RandomState(int(random_state))
    else:
        gen = random_state
    shape = 1 if size is None else size
    return gen.dirichlet(a, size=shape)
