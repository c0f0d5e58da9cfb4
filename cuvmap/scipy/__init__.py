"""SciPy-named functions on arrays and tracers, as ``jax.scipy`` has them:
:mod:`cuvmap.scipy.linalg` (triangular and Cholesky solves, the LU factorization, the
matrix exponential).
"""
from cuvmap.scipy import linalg  # noqa: F401
