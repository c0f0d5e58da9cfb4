"""``jax.scipy``'s functions on cuvmap's primitives: :mod:`cuvmap.scipy.special`,
:mod:`cuvmap.scipy.stats` (``norm``) and :mod:`cuvmap.scipy.linalg` (triangular and
Cholesky solves, the LU factorization, the matrix exponential)."""
from cuvmap.scipy import linalg, special, stats  # noqa: F401
