"""Decompositions of stacks of real matrices: ``cholesky``, ``eigh`` and ``qr``, each one
primitive with one (packed) output (NOTE [svd's one output] in ``linalg.py``), the vendor
library's batched call as impl, and JAX's derivative rules. Shared helpers:
``linalg_common.py``. Complex operands raise (no complex rule here yet).
"""
import math

import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.indexing import slice_in_dim
from cuvmap.lax.linalg_common import (
    REAL, _col, _mm, _mT, _row, batch_front, check_matrix, refuse_complex, diagonal, eye_like, sym, tril, triu,
)
from cuvmap.lax.linalg_solve import triangular_solve_left
from cuvmap.lax.shape import concatenate, expand_dims, reshape, squeeze
from cuvmap.transforms import batching, jvp, vjp


# =======================================================================================
# cholesky
# =======================================================================================

# NOTE [cholesky's derivatives]
# The primitive factors the symmetric part S = (A + Aᵀ)/2 of its operand, A = L Lᵀ with L
# lower triangular (JAX's symmetrize_input=True; the wrappers build the matrix from one
# triangle where asked to read only that one). With Φ(X) = tril(X) − diag(X)/2 (JAX's
# cholesky_jvp_rule):
#   dL = L Φ(L⁻¹ dS L⁻ᵀ),   dS = (dA + dAᵀ)/2,
# and the VJP is its transpose: Ā = sym(L⁻ᵀ Φ(Lᵀ L̄) L⁻¹). A matrix that is not positive
# definite has no factor: the impl gives NaN there (as JAX), never an exception.

cholesky_p = Primitive("cholesky", owns_output=True, capturable=False)


def cholesky(x, *, symmetrize_input=True):
    """The lower Cholesky factor ``L`` of the symmetric part ``(x + xᵀ)/2`` of each matrix of
    a stack, ``(x + xᵀ)/2 = L Lᵀ`` (JAX's ``lax.linalg.cholesky``); with
    ``symmetrize_input=False``, of the symmetric matrix with ``x``'s lower triangle. NaN for
    a matrix that is not positive definite. NOTE [cholesky's derivatives]."""
    refuse_complex("cholesky", x)
    if not symmetrize_input:
        x = ew.add(tril(x), _mT(tril(x, -1)))
    return cholesky_p.bind(x)


def _cholesky_shape_rule(x):
    check_matrix("cholesky", x, square=True, dtypes=REAL)
    return x


def _cholesky_impl(x):
    xp = backend.xp_of(x)
    s = (x + xp.swapaxes(x, -1, -2)) * 0.5
    try:
        out = xp.linalg.cholesky(s)
    except np.linalg.LinAlgError:
        # one matrix of the stack is not positive definite: NaN for those (the others
        # factored alone; this path runs only when LAPACK refused the stack)
        flat = s.reshape((-1,) + s.shape[-2:])
        out = xp.full(flat.shape, np.nan, dtype=x.dtype)
        for i in range(flat.shape[0]):
            try:
                out[i] = xp.linalg.cholesky(flat[i])
            except np.linalg.LinAlgError:
                pass
        out = out.reshape(s.shape)
    return out.astype(x.dtype, copy=False)


def _cholesky_batch(axis_size, vals, dims):
    (x,) = batch_front(axis_size, vals, dims)
    return cholesky(x), 0


def _phi(x):
    return ew.sub(tril(x), ew.mul(ew.mul(x, eye_like(x)), 0.5))


def _cholesky_jvp(t, out, x):
    s_dot = sym(t)
    tmp = triangular_solve_left(out, s_dot, lower=True)  # L⁻¹ dS
    inner = _mT(triangular_solve_left(out, _mT(tmp), lower=True))  # L⁻¹ dS L⁻ᵀ
    return _mm(out, _phi(inner))


def _cholesky_vjp(ct, out, x):
    g = _phi(_mm(_mT(out), ct))
    tmp = triangular_solve_left(out, g, lower=True, transpose_a=True)  # L⁻ᵀ G
    inner = _mT(triangular_solve_left(out, _mT(tmp), lower=True, transpose_a=True))  # L⁻ᵀ G L⁻¹
    return sym(inner)


cholesky_p.impl = _cholesky_impl
cholesky_p.shape_rule = _cholesky_shape_rule
batching.primitive_batchers[cholesky_p] = _cholesky_batch
jvp.defjvp(cholesky_p, _cholesky_jvp)
vjp.defvjp(cholesky_p, _cholesky_vjp, reads=("out",))


# =======================================================================================
# eigh
# =======================================================================================

# NOTE [eigh's derivatives]
# ``eigh_p(x, lower)`` decomposes the symmetric matrix H whose ``lower`` (else upper)
# triangle is that of x: H = V diag(w) Vᵀ, w ascending. It returns ``(..., n, n + 1)``:
# V in the first n columns, w in the last. With Ḣ the tangent of H (built from the same
# triangle of the tangent) and Ṫ = Vᵀ Ḣ V (JAX's eigh_jvp_rule):
#   dw = diag(Ṫ),   dV = V (F ∘ Ṫ),   F_ij = 1 / (w_j − w_i) off the diagonal, 0 on it;
# the VJP is its transpose, H̄ = V (diag(w̄) + F ∘ (Vᵀ V̄)) Vᵀ, folded onto the triangle read.
# The eigenvectors are defined up to sign, and for a repeated eigenvalue only up to a
# rotation within its eigenspace: there F is infinite and dV comes out inf or NaN (the
# derivative does not exist); the eigenvalues and functions invariant under those choices
# (V diag(f(w)) Vᵀ of distinct eigenvalues) are what finite differences see.

eigh_p = Primitive("eigh", owns_output=True, capturable=False)


def eigh(x, *, lower=True, symmetrize_input=True, sort_eigenvalues=True, subset_by_index=None):
    """``(v, w)``: the eigenvectors (columns of ``v``) and ascending eigenvalues ``w`` of
    each real symmetric matrix of a stack (JAX's ``lax.linalg.eigh``). ``symmetrize_input``
    decomposes ``(x + xᵀ)/2``; else only the ``lower`` (else upper) triangle is read.
    NOTE [eigh's derivatives]: the derivative of ``v`` is undefined (inf/NaN) where
    eigenvalues repeat. The eigenvalues always come sorted; ``subset_by_index`` must be
    None or the whole range."""
    refuse_complex("eigh", x)
    n_all = core.shape_of(x)[-1]
    if subset_by_index is not None and tuple(subset_by_index) != (0, n_all):
        raise ShapeError(f"eigh: subset_by_index={subset_by_index!r} is not supported (only the whole range)")
    if symmetrize_input:
        x = sym(x)
    n = core.shape_of(x)[-1]
    packed = eigh_p.bind(x, lower=bool(lower))
    axis = len(core.shape_of(packed)) - 1
    return slice_in_dim(packed, 0, n, axis), squeeze(slice_in_dim(packed, n, n + 1, axis), (axis,))


def _eigh_shape_rule(x, *, lower):
    check_matrix("eigh", x, square=True, dtypes=REAL)
    return ShapedArray(x.shape[:-1] + (x.shape[-1] + 1,), x.dtype)


def _eigh_impl(x, *, lower):
    xp = backend.xp_of(x)
    w, v = xp.linalg.eigh(x, UPLO="L" if lower else "U")
    return xp.concatenate([v, w[..., None]], axis=-1).astype(x.dtype, copy=False)


def _eigh_batch(axis_size, vals, dims, *, lower):
    (x,) = batch_front(axis_size, vals, dims)
    return eigh_p.bind(x, lower=lower), 0


def _from_triangle(t, lower):
    """The symmetric matrix with ``t``'s ``lower`` (else upper) triangle."""
    return ew.add(tril(t), _mT(tril(t, -1))) if lower else ew.add(triu(t), _mT(triu(t, 1)))


def _fold_onto_triangle(g, lower):
    """The transpose of :func:`_from_triangle`."""
    both = ew.add(g, _mT(g))
    diag = ew.mul(g, eye_like(g))
    return ew.sub(tril(both), diag) if lower else ew.sub(triu(both), diag)


def _eigh_parts(out, n):
    axis = len(core.shape_of(out)) - 1
    return slice_in_dim(out, 0, n, axis), squeeze(slice_in_dim(out, n, n + 1, axis), (axis,))


def _eigh_jvp(t, out, x, *, lower):
    n = core.shape_of(x)[-1]
    v, w = _eigh_parts(out, n)
    t_dot = _mm(_mm(_mT(v), _from_triangle(t, lower)), v)
    dw = expand_dims(diagonal(t_dot), (len(core.shape_of(w)),))
    dv = _mm(v, ew.mul(_gap_inverse(w), t_dot))
    return concatenate([dv, dw], len(core.shape_of(out)) - 1)


def _gap_inverse(w):
    """``F_ij = 1 / (w_j − w_i)`` off the diagonal, 0 on it."""
    n = core.shape_of(w)[-1]
    eye = backend.xp_of(w).eye(n, dtype=bool)
    gap = ew.sub(_row(w), _col(w))
    return ew.select(eye, ew.mul(gap, 0), ew.div(1, ew.select(eye, ew.add(ew.mul(gap, 0), 1), gap)))


def _eigh_vjp(ct, out, x, *, lower):
    n = core.shape_of(x)[-1]
    v, w = _eigh_parts(out, n)
    ct_v, ct_w = _eigh_parts(ct, n)
    middle = ew.add(ew.mul(_row(ct_w), eye_like(v)), ew.mul(_gap_inverse(w), _mm(_mT(v), ct_v)))
    return _fold_onto_triangle(_mm(_mm(v, middle), _mT(v)), lower)


eigh_p.impl = _eigh_impl
eigh_p.shape_rule = _eigh_shape_rule
batching.primitive_batchers[eigh_p] = _eigh_batch
jvp.defjvp(eigh_p, _eigh_jvp)
vjp.defvjp(eigh_p, _eigh_vjp, reads=("out",))


# =======================================================================================
# qr
# =======================================================================================

# NOTE [qr's derivatives]
# ``qr_p(x, full_matrices)`` returns Q ``(..., m, p)`` and R ``(..., p, n)`` raveled and
# joined along one last axis, ``m·p + p·n`` (p = m with ``full_matrices``, else k = min(m, n)).
# For m ≥ n and the reduced decomposition (JAX's qr_jvp_rule, real case), with
# X = dA R⁻¹, B = Qᵀ X and Ω = tril(B, −1) − tril(B, −1)ᵀ:
#   dQ = Q (Ω − B) + X,   dR = (B − Ω) R.
# The VJP is its transpose: with M = Qᵀ Q̄ − R̄ Rᵀ, B̄ = tril(M − Mᵀ, −1) − M,
# X̄ = Q̄ + Q B̄ and Ā = X̄ R⁻ᵀ. For m < n, and for the full decomposition of a tall
# matrix (whose extra columns of Q are any orthonormal completion), JAX raises and so do
# these rules. Each column of Q and row of R is defined up to a common sign: LAPACK's
# choice is differentiable where R's diagonal has no zero.

qr_p = Primitive("qr", owns_output=True, capturable=False)


def _qr_sizes(shape, full_matrices):
    m, n = shape[-2:]
    k = min(m, n)
    return m, n, (m if full_matrices else k)


def qr(x, *, pivoting=False, full_matrices=True, use_magma=None):
    """``(q, r)`` with ``x = q @ r``, ``q`` orthonormal columns and ``r`` upper triangular,
    for each real matrix of a stack (JAX's ``lax.linalg.qr``). NOTE [qr's derivatives]."""
    refuse_complex("qr", x)
    if pivoting:
        raise ShapeError("qr: pivoting=True (column-pivoted QR) is not supported")
    shape = core.shape_of(x)
    packed = qr_p.bind(x, full_matrices=bool(full_matrices))
    m, n, p = _qr_sizes(shape, bool(full_matrices))
    return _qr_unpack(packed, shape, m, n, p)


def _qr_unpack(packed, shape, m, n, p):
    lead = tuple(shape[:-2])
    axis = len(lead)
    q = reshape(slice_in_dim(packed, 0, m * p, axis), lead + (m, p))
    r = reshape(slice_in_dim(packed, m * p, m * p + p * n, axis), lead + (p, n))
    return q, r


def _qr_pack(q, r):
    lead = tuple(core.shape_of(q)[:-2])
    flat = [reshape(a, lead + (math.prod(core.shape_of(a)[-2:]),)) for a in (q, r)]
    return concatenate(flat, len(lead))


def _qr_shape_rule(x, *, full_matrices):
    check_matrix("qr", x, dtypes=REAL)
    m, n, p = _qr_sizes(x.shape, full_matrices)
    return ShapedArray(x.shape[:-2] + (m * p + p * n,), x.dtype)


def _qr_impl(x, *, full_matrices):
    xp = backend.xp_of(x)
    q, r = xp.linalg.qr(x, mode="complete" if full_matrices else "reduced")
    lead = x.shape[:-2]
    flat = [a.reshape(lead + (a.shape[-2] * a.shape[-1],)) for a in (q, r)]
    return xp.concatenate(flat, axis=-1).astype(x.dtype, copy=False)


def _qr_batch(axis_size, vals, dims, *, full_matrices):
    (x,) = batch_front(axis_size, vals, dims)
    return qr_p.bind(x, full_matrices=full_matrices), 0


def _qr_check(shape, full_matrices, what):
    m, n = shape[-2:]
    if m < n or (full_matrices and m != n):
        raise ShapeError(
            f"qr: the {what} of the QR decomposition of a {m}×{n} matrix with full_matrices={full_matrices} is "
            "not implemented (as in JAX): it needs m >= n and the reduced decomposition (NOTE [qr's derivatives])")


def _qr_jvp(t, out, x, *, full_matrices):
    shape = core.shape_of(x)
    _qr_check(shape, full_matrices, "derivative")
    m, n, p = _qr_sizes(shape, full_matrices)
    q, r = _qr_unpack(out, shape, m, n, p)
    x_ = _mT(triangular_solve_left(r, _mT(t), lower=False, transpose_a=True))  # dA R⁻¹
    b = _mm(_mT(q), x_)
    low = tril(b, -1)
    omega = ew.sub(low, _mT(low))
    dq = ew.add(_mm(q, ew.sub(omega, b)), x_)
    dr = _mm(ew.sub(b, omega), r)
    return _qr_pack(dq, dr)


def _qr_vjp(ct, out, x, *, full_matrices):
    shape = core.shape_of(x)
    _qr_check(shape, full_matrices, "gradient")
    m, n, p = _qr_sizes(shape, full_matrices)
    q, r = _qr_unpack(out, shape, m, n, p)
    ct_q, ct_r = _qr_unpack(ct, shape, m, n, p)
    mm = ew.sub(_mm(_mT(q), ct_q), _mm(ct_r, _mT(r)))
    b_bar = ew.sub(tril(ew.sub(mm, _mT(mm)), -1), mm)
    x_bar = ew.add(ct_q, _mm(q, b_bar))
    return _mT(triangular_solve_left(r, _mT(x_bar), lower=False))  # X̄ R⁻ᵀ


qr_p.impl = _qr_impl
qr_p.shape_rule = _qr_shape_rule
batching.primitive_batchers[qr_p] = _qr_batch
jvp.defjvp(qr_p, _qr_jvp)
vjp.defvjp(qr_p, _qr_vjp, reads=("out",))

__all__ = ["cholesky", "cholesky_p", "eigh", "eigh_p", "qr", "qr_p"]
