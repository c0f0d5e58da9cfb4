"""``numpy.linalg.eig`` and ``eigvals`` as ``jax.numpy.linalg`` has them (complex results
for every input, as JAX), over :func:`cuvmap.lax.linalg_eig.eig`."""
import collections

import numpy as np

from cuvmap import core
from cuvmap.lax.linalg_eig import check_square, eig as lax_eig
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype

EigResult = collections.namedtuple("EigResult", ["eigenvalues", "eigenvectors"])


def _as_inexact(x):
    """Integers and booleans as float64 (as JAX promotes them); lists become arrays."""
    if not isinstance(x, core.Tracer) and not hasattr(x, "dtype"):
        x = asarray(x)
    return x if core.is_float(x) else astype(x, np.float64)


def eig(a):
    """``numpy.linalg.eig`` (JAX's ``jnp.linalg.eig``): ``EigResult(eigenvalues,
    eigenvectors)`` of each square matrix of a stack, ``a v = v diag(w)``, both complex
    (JAX's; NumPy returns real arrays where every eigenvalue is real). Each eigenvector
    (column) has unit norm and its largest component real. Differentiating the
    eigenvectors raises, as in JAX (``lax.linalg.eig(..., enable_eigvec_derivs=True)``
    opts in: NOTE [eig's derivatives] in ``cuvmap/lax/linalg_eig.py``)."""
    a = _as_inexact(a)
    check_square("eig", a)
    w, v = lax_eig(a, compute_left_eigenvectors=False, compute_right_eigenvectors=True)
    return EigResult(w, v)


def eigvals(a):
    """``numpy.linalg.eigvals`` (JAX's ``jnp.linalg.eigvals``): the complex eigenvalues of
    each square matrix of a stack, in LAPACK's order; differentiable,
    ``dw = diag(V⁻¹ dA V)`` (V the right eigenvectors; distinct eigenvalues)."""
    a = _as_inexact(a)
    check_square("eigvals", a)
    (w,) = lax_eig(a, compute_left_eigenvectors=False, compute_right_eigenvectors=False)
    return w
