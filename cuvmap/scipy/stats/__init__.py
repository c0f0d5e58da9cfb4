"""``jax.scipy.stats``'s distributions: :mod:`~cuvmap.scipy.stats.norm`,
:mod:`~cuvmap.scipy.stats.t`, :mod:`~cuvmap.scipy.stats.chi2`, :mod:`~cuvmap.scipy.stats.gamma`,
:mod:`~cuvmap.scipy.stats.beta`, :mod:`~cuvmap.scipy.stats.poisson`,
:mod:`~cuvmap.scipy.stats.multivariate_normal` and :mod:`~cuvmap.scipy.stats.dirichlet`."""
from cuvmap.scipy.stats import beta, chi2, dirichlet, gamma, multivariate_normal, norm, poisson, t  # noqa: F401
