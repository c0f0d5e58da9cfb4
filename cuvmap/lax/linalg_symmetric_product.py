"""JAX's ``jax.lax.linalg.symmetric_product`` (issue 32): ``α·A·Aᵀ + β·C`` for batches of
matrices, composed of ``dot_general`` and elementwise primitives, so its derivatives and
batching rule are theirs.
"""
import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.jax_shapes import dot_general
from cuvmap.lax.shape import transpose


def symmetric_product(a_matrix, c_matrix, *, alpha=1., beta=0., symmetrize_output=False):
    """The symmetric product ``α·A·Aᵀ + β·C`` of ``A`` (``[..., m, n]``) and a symmetric
    ``C`` (``[..., m, m]``), JAX's ``jax.lax.linalg.symmetric_product``:

        out[..., i, k] = α Σ_j A[..., i, j] A[..., k, j] + β C[..., i, k]

    JAX guarantees only the lower triangle (a backend may leave the upper one unset);
    cuvmap computes the whole matrix. With ``symmetrize_output=True`` the upper triangle is
    the transpose of the lower one, ``tril(out) + tril(out, −1)ᵀ``, so a non-symmetric
    ``C`` gives a symmetric result, as in JAX. Derivatives (in ``A`` and ``C``) are those
    of the product and the sums."""
    sa, sc = tuple(core.shape_of(a_matrix)), tuple(core.shape_of(c_matrix))
    if len(sa) < 2 or sc != sa[:-1] + (sa[-2],):
        raise ShapeError(f"symmetric_product: a_matrix must have shape [..., m, n] and c_matrix [..., m, m], "
                         f"got {sa} and {sc}")
    nd = len(sa)
    batch = tuple(range(nd - 2))
    dims = (((nd - 1,), (nd - 1,)), (batch, batch))
    out = ew.add(ew.mul(alpha, dot_general(a_matrix, a_matrix, dims)), ew.mul(beta, c_matrix))
    if symmetrize_output:
        m = sa[-2]
        lower = np.tri(m, dtype=bool)
        zero = ew.mul(out, 0)
        perm = (*batch, nd - 1, nd - 2)
        strictly_lower = ew.select(np.tri(m, k=-1, dtype=bool), out, zero)
        out = ew.add(ew.select(lower, out, zero), transpose(strictly_lower, perm))
    return out
