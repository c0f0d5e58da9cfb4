"""The Schur decomposition of a square matrix: ``schur`` (JAX's ``lax.linalg.schur``), one
primitive with one packed output, built from LAPACK's ``geev`` through NumPy (NumPy has
no ``gees``: NOTE [Schur vectors from eigenvectors]). As in JAX it has no derivative
rule: differentiating it raises, naming it. The SciPy front ends (``schur``, ``sqrtm``,
``funm``, ``rsf2csf``, ``solve_sylvester``) are in
``cuvmap/scipy/linalg_matrix_functions.py``.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray
from cuvmap.lax.indexing import slice_in_dim
from cuvmap.lax.linalg_common import INEXACT, batch_front, check_matrix
from cuvmap.lax.linalg_eig import on_host_without_geev
from cuvmap.transforms import batching, complex_rules, jvp, vjp
from cuvmap.core.bfloat16 import kind_of


# =======================================================================================
# schur
# =======================================================================================

# NOTE [Schur vectors from eigenvectors]
# A = Z T Zᴴ with Z unitary and T upper triangular (complex A), or Z orthogonal and T
# quasi-upper-triangular with 2×2 blocks for the complex-conjugate eigenvalue pairs
# (real A: the real Schur form). NumPy exposes LAPACK's geev but not gees, so the impl
# builds the Schur vectors from the eigenvectors: LAPACK's geev computes them as the
# back-transformed eigenvectors of its own Schur form, so the span of the first k of
# them is (to rounding) the invariant subspace of the first k eigenvalues, and the QR
# factorisation W = Z R of the eigenvector matrix W (real A: a real eigenvector, or the
# real and imaginary parts of the first vector of a conjugate pair) gives an orthonormal
# Z whose leading columns span those subspaces, defective eigenvalues included. Then
# T = Zᴴ A Z, whose part below the (block) triangle is rounding noise and is set to 0.
# The work runs in double precision (float32 and complex64 operands are upcast and the
# results cast back). Measured on normal random matrices n ≤ 200 and on a similar
# Jordan block, the discarded part is below 5·eps₆₄·‖A‖_F; the impl checks it, and a
# matrix whose discarded part exceeds 100·n·eps₆₄·‖A‖_F (or with a NaN or an infinity)
# gives NaN everywhere rather than a T that is not triangular. The eigenvalues on T's
# diagonal come in geev's order; T and Z are unique only up to that order and the
# phase of each column of Z, so they need not equal SciPy's (gees) entry by entry.

schur_p = Primitive("schur", owns_output=True, capturable=False)


def schur(x, *, compute_schur_vectors=True, sort_eig_vals=False, select_callable=None):
    """The Schur decomposition ``x = Q T Qᴴ`` of each square matrix of a stack (JAX's
    ``lax.linalg.schur``): ``(T, Q)``, or ``T`` alone with
    ``compute_schur_vectors=False``. ``Q`` is unitary (orthogonal for real ``x``); ``T`` is
    upper triangular for complex ``x`` and quasi-upper-triangular (2×2 blocks for complex
    eigenvalue pairs) for real ``x``. NOTE [Schur vectors from eigenvectors]. As in JAX,
    ``sort_eig_vals`` and ``select_callable`` are unused, and there is no derivative."""
    if sort_eig_vals or select_callable is not None:
        raise NotImplementedError("schur: sort_eig_vals and select_callable are not supported (JAX ignores them)")
    check_matrix("schur", core.get_aval(x), square=True, dtypes=INEXACT)  # (eager calls skip shape rules)
    packed = schur_p.bind(x, compute_schur_vectors=bool(compute_schur_vectors))
    if not compute_schur_vectors:
        return packed
    n = core.shape_of(x)[-1]
    axis = len(core.shape_of(packed)) - 1
    return slice_in_dim(packed, 0, n, axis), slice_in_dim(packed, n, 2 * n, axis)


def _schur_shape_rule(x, *, compute_schur_vectors):
    check_matrix("schur", x, square=True, dtypes=INEXACT)
    n = x.shape[-1]
    return ShapedArray(x.shape[:-1] + (2 * n if compute_schur_vectors else n,), x.dtype)


def _real_basis(xp, w, v):
    """The real eigenvector matrix of NOTE [Schur vectors from eigenvectors], and the mask
    of the columns that start a conjugate pair."""
    first = w.imag > 0  # geev puts a pair's eigenvalue with positive imaginary part first
    basis = v.real.copy()
    basis[..., :, 1:] = xp.where(first[..., None, :-1], v[..., :, :-1].imag, basis[..., :, 1:])
    return basis, first


def schur_arrays(xp, a):
    """``(T, Z)`` of a stack of float64 or complex128 matrices (every matrix finite), and
    the relative size of the discarded part below the (block) triangle."""
    n = a.shape[-1]
    w, v = xp.linalg.eig(a)
    triangle = xp.asarray(np.triu(np.ones((n, n), dtype=bool)))
    if kind_of(a.dtype) == "c":
        basis, keep = v, triangle
    else:
        basis, first = _real_basis(xp, w, v.astype(np.complex128))
        sub = xp.zeros(a.shape, dtype=bool)
        idx = np.arange(n - 1)
        sub[..., idx + 1, idx] = first[..., :-1]
        keep = triangle | sub
    z, _ = xp.linalg.qr(basis)
    t = xp.conj(xp.swapaxes(z, -1, -2)) @ a @ z
    dropped = xp.linalg.norm(xp.where(keep, 0, t), axis=(-2, -1))
    scale = xp.linalg.norm(a, axis=(-2, -1))
    return xp.where(keep, t, 0), z, dropped / xp.where(scale > 0, scale, 1)


def _schur_impl(x, *, compute_schur_vectors):
    xp = backend.xp_of(x)
    n = x.shape[-1]
    cols = 2 * n if compute_schur_vectors else n
    if n == 0 or x.size == 0:
        return xp.zeros(x.shape[:-1] + (cols,), dtype=x.dtype)
    work_dtype = np.complex128 if kind_of(x.dtype) == "c" else np.float64
    finite = xp.all(xp.isfinite(x), axis=(-2, -1))
    a = xp.where(finite[..., None, None], x, 0).astype(work_dtype)
    t, z, dropped = schur_arrays(xp, a)
    ok = finite & (dropped <= 100 * n * np.finfo(np.float64).eps)
    out = xp.concatenate([t, z], axis=-1) if compute_schur_vectors else t
    out = xp.where(ok[..., None, None], out, np.nan)
    return out.astype(x.dtype)


def _schur_batch(axis_size, vals, dims, **params):
    (x,) = batch_front(axis_size, vals, dims)
    return schur_p.bind(x, **params), 0


def _schur_no_derivative(*args, **params):
    raise NotImplementedError(
        "schur has no derivative rule (JAX's lax.linalg.schur has none either); differentiate a function of the "
        "matrix that does not go through the Schur decomposition (eig's eigenvalues, expm, ...)")


schur_p.impl = on_host_without_geev(_schur_impl)  # (JAX's schur is CPU-only)
schur_p.shape_rule = _schur_shape_rule
batching.primitive_batchers[schur_p] = _schur_batch
jvp.defjvp(schur_p, _schur_no_derivative)
vjp.defvjp(schur_p, _schur_no_derivative)
# its rules raise for every dtype, naming schur: registered so that complex operands get that message too
complex_rules.defcomplex(schur_p)
