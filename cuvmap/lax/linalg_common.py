"""Helpers the linear-algebra primitives share (``linalg_solve.py``, ``linalg_decompositions.py``):
batched matrix products and transposes written with ``dot_general`` and ``transpose`` (so
that the derivative rules built from them are differentiable and batchable in turn),
triangle masks, traces, the batching rule that moves every vmap dim to the front, and the
dtype checks.

Every primitive of these files takes stacks of matrices ``(..., m, n)`` and calls the
vendor library's batched routine once for the whole stack (``numpy.linalg`` on the CPU,
``cupy.linalg`` on the GPU): never a Python loop per matrix. Their batching rules move
the vmap dim of each operand to the front (broadcasting an unmapped operand) and bind the
primitive again on the larger stack.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapeError
from cuvmap.errors import ShapeTypeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.elementwise import complex_numbers
from cuvmap.lax.linalg import _col, _mm, _mT, _row  # noqa: F401 - re-exported for the linalg files
from cuvmap.lax.reduction import reduce_sum
from cuvmap.transforms.batching import bdim_at_front
from cuvmap.core.bfloat16 import kind_of

REAL = (np.dtype(np.float32), np.dtype(np.float64))
INEXACT = REAL + (np.dtype(np.complex64), np.dtype(np.complex128))


def check_matrix(name, x, square=False, dtypes=INEXACT):
    """Raises a ShapeError naming ``name`` unless ``x`` (an aval) is a stack of matrices of
    one of ``dtypes``."""
    if x.ndim < 2:
        raise ShapeError(f"{name}: the operand must be a matrix or a stack of them (at least 2 dims), got shape {x.shape}")
    if square and x.shape[-1] != x.shape[-2]:
        raise ShapeError(f"{name}: the operand must be square matrices, got shape {x.shape}")
    if x.dtype not in dtypes:
        kinds = "float32 or float64" if dtypes == REAL else "float32, float64, complex64 or complex128"
        # JAX's TypeError and its phrase (LAPACK and cuSOLVER have no float16 or bfloat16)
        raise ShapeTypeError(f"{name}: {name} does not accept dtype {x.dtype.name}: the operand must be {kinds}")


def batch_front(axis_size, vals, dims):
    """Every operand with its vmap dim at axis 0 (an unmapped one broadcast)."""
    return [bdim_at_front(v, d, axis_size) for v, d in zip(vals, dims)]


def tri_mask(x, lower, k=0):
    """A constant boolean mask ``(n, m)`` of ``x``'s last two dims: ``tril(ones, k)``
    (``lower``) or ``triu(ones, k)``, on ``x``'s device."""
    xp = backend.xp_of(x)
    n, m = core.shape_of(x)[-2:]
    ones = np.ones((n, m), dtype=bool)
    mask = np.tril(ones, k) if lower else np.triu(ones, k)
    return xp.asarray(mask)


def tril(x, k=0):
    return ew.select(tri_mask(x, True, k), x, ew.mul(x, 0))


def triu(x, k=0):
    return ew.select(tri_mask(x, False, k), x, ew.mul(x, 0))


def eye_like(x, n=None):
    """The identity ``(n, n)`` in ``x``'s dtype, on its device (``n``: ``x``'s last dim)."""
    n = core.shape_of(x)[-1] if n is None else n
    return backend.xp_of(x).eye(n, dtype=core.dtype_of(x))


def diagonal(x):
    """The diagonal of each matrix: ``(..., n)``."""
    nd = len(core.shape_of(x))
    return reduce_sum(ew.mul(x, eye_like(x)), (nd - 1,))


def trace(x):
    nd = len(core.shape_of(x))
    return reduce_sum(ew.mul(x, eye_like(x)), (nd - 2, nd - 1))


def scalar_times(c, x):
    """``c[..., None, None] * x``: a scalar per matrix."""
    return ew.mul(_col(_col(c)), x)


def sym(x):
    """``(x + xᵀ) / 2``."""
    return ew.mul(ew.add(x, _mT(x)), 0.5)


def is_complex(x):
    return kind_of(core.dtype_of(x)) == "c"


def conj(x):
    """``conj(x)`` of a complex ``x``; a real ``x`` as it is (``lax.conj`` would make it
    complex)."""
    return complex_numbers.conj(x) if is_complex(x) else x


def _mH(x):
    """The conjugate transpose ``xᴴ`` of each matrix (``xᵀ`` for a real ``x``)."""
    return conj(_mT(x))


def herm(x):
    """``(x + xᴴ)/2``: the Hermitian part (the symmetric part of a real ``x``)."""
    return ew.mul(ew.add(x, _mH(x)), 0.5)


def imag_diagonal(x):
    """``i·im(x_ii)`` on the diagonal, 0 off it (0 for a real ``x``): the phase term of the
    complex rules of qr."""
    if not is_complex(x):
        return ew.mul(x, 0)
    d = ew.mul(x, eye_like(x))
    return ew.mul(ew.sub(d, complex_numbers.conj(d)), 0.5)  # (d − conj d)/2 = i·im(d)


def adjoint_to_jax(adjoint):
    """JAX's VJP rule from ``adjoint``, the adjoint of a JVP rule under the Hermitian
    pairing ``re Σ conj(u)·v`` (the textbook form, with ᴴ where the real rule has ᵀ): the
    rule ``ct ↦ conj(adjoint(conj(ct)))`` is the transpose under ``re Σ u·v``, NOTE [complex
    convention] (for real values the two maps are the same)."""
    def rule(ct, *args, **params):
        return conj(adjoint(conj(ct), *args, **params))
    rule.__name__ = rule.__qualname__ = adjoint.__name__.replace("adjoint", "vjp")
    return rule


def zero_safe_mul(f, x):
    """``f ∘ x`` with 0 wherever ``x`` is 0, also where ``f`` is infinite: the VJP rules'
    stand-in for JAX's symbolic zeros (a zero cotangent of the eigenvectors or singular
    vectors contributes nothing, even where an eigenvalue repeats)."""
    return ew.select(ew.eq(x, 0), ew.mul(x, 0), ew.mul(f, x))
