"""``jax.scipy``'s functions on cuvmap's primitives: :mod:`cuvmap.scipy.special`,
:mod:`cuvmap.scipy.stats` (``norm``, ``t``, ``chi2``, ``gamma``, ``beta``, ``poisson``,
``multivariate_normal``, ``dirichlet``), :mod:`cuvmap.scipy.signal` (the convolutions) and
:mod:`cuvmap.scipy.linalg` (triangular and Cholesky solves, the LU factorization, the matrix
exponential)."""
from cuvmap.scipy import linalg, signal, special, stats  # noqa: F401
