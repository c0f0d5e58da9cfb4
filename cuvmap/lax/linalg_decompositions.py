"""Decompositions of stacks of real or complex matrices: ``cholesky``, ``eigh`` and ``qr``,
each one primitive with one (packed) output (NOTE [svd's one output] in ``linalg.py``), the
vendor library's batched call as impl, and JAX's derivative rules. Shared helpers:
``linalg_common.py``.

Complex matrices (NOTE [complex decompositions]): each rule is JAX's, with ᴴ where the
real rule has ᵀ (and, for qr, JAX's phase term); each VJP is written as the adjoint under
the Hermitian pairing ``re Σ conj(u)·v`` (the textbook form) and turned into JAX's
transpose by :func:`linalg_common.adjoint_to_jax`.
"""
import math

import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.indexing import slice_in_dim
from cuvmap.lax.linalg_common import (
    _col, _mH, _mm, _mT, _row, adjoint_to_jax, batch_front, check_matrix, conj, diagonal, eye_like, herm,
    imag_diagonal, is_complex, tril, triu, zero_safe_mul,
)
from cuvmap.lax.linalg_solve import solve, triangular_solve_left
from cuvmap.lax.shape import concatenate, expand_dims, reshape, squeeze
from cuvmap.transforms import batching, complex_rules, jvp, vjp

# NOTE [complex decompositions]
# For complex operands the decompositions are those of Hermitian (cholesky, eigh) or
# general (qr) matrices: A = L Lᴴ, H = V diag(w) Vᴴ with real w, A = Q R with unitary Q.
# Their JVPs are JAX's rules with ᴴ for ᵀ: cholesky symmetrizes with (A + Aᴴ)/2 and its
# Φ(L⁻¹ dS L⁻ᴴ) has a real diagonal; eigh's dw = re(diag(Vᴴ dH V)) and dV = V (F ∘ Vᴴ dH V)
# (diag(Vᴴ dV) = 0: JAX's phase gauge of the eigenvectors); qr's Ω gets JAX's phase term
# i·im(diag(Qᴴ dA R⁻¹)) (so diag(R) stays real). Eigenvectors and the columns of Q are
# defined up to a phase each: functions invariant under the phases (w, V diag(f(w)) Vᴴ,
# |v_iᴴ A v_i|, Q R) are what finite differences see. The VJPs are the transposes under
# ⟨u, v⟩ = re Σ u·v (NOTE [complex convention]), from the Hermitian adjoints.


# =======================================================================================
# cholesky
# =======================================================================================

# NOTE [cholesky's derivatives]
# The primitive factors the symmetric part S = (A + Aᵀ)/2 of its operand, A = L Lᵀ with L
# lower triangular (JAX's symmetrize_input=True; the wrappers build the matrix from one
# triangle where asked to read only that one). With Φ(X) = tril(X) − diag(X)/2 (JAX's
# cholesky_jvp_rule):
#   dL = L Φ(L⁻¹ dS L⁻ᵀ),   dS = (dA + dAᵀ)/2,
# and the VJP is its transpose: Ā = sym(L⁻ᵀ Φ(Lᵀ L̄) L⁻¹), sym(X) = (X + Xᵀ)/2 (complex
# matrices: ᴴ for ᵀ, NOTE [complex decompositions]). A matrix that is not positive definite
# has no factor: the impl gives NaN there (as JAX), never an exception.

cholesky_p = Primitive("cholesky", owns_output=True, capturable=False)


def cholesky(x, *, symmetrize_input=True):
    """The lower Cholesky factor ``L`` of the symmetric part ``(x + xᵀ)/2`` of each matrix of
    a stack, ``(x + xᵀ)/2 = L Lᵀ`` (JAX's ``lax.linalg.cholesky``); with
    ``symmetrize_input=False``, of the symmetric matrix with ``x``'s lower triangle. NaN for
    a matrix that is not positive definite. Complex ``x``: ``(x + xᴴ)/2 = L Lᴴ`` (NOTE
    [complex decompositions]). NOTE [cholesky's derivatives]."""
    if not symmetrize_input:
        x = ew.add(tril(x), _mH(tril(x, -1)))
    return cholesky_p.bind(x)


def _cholesky_shape_rule(x):
    check_matrix("cholesky", x, square=True)
    return x


def _cholesky_impl(x):
    xp = backend.xp_of(x)
    s = (x + xp.conj(xp.swapaxes(x, -1, -2))) * 0.5
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
    s_dot = herm(t)
    tmp = triangular_solve_left(out, s_dot, lower=True)  # L⁻¹ dS
    inner = _mH(triangular_solve_left(out, _mH(tmp), lower=True))  # L⁻¹ dS L⁻ᴴ
    return _mm(out, _phi(inner))


def _cholesky_adjoint(ct, out, x):
    """The adjoint of :func:`_cholesky_jvp` under the Hermitian pairing: herm(L⁻ᴴ Φ(Lᴴ L̄) L⁻¹)."""
    g = _phi(_mm(_mH(out), ct))
    out_c = conj(out)  # (L̄⁻ᵀ = L⁻ᴴ)
    tmp = triangular_solve_left(out_c, g, lower=True, transpose_a=True)  # L⁻ᴴ G
    inner = _mH(triangular_solve_left(out_c, _mH(tmp), lower=True, transpose_a=True))  # L⁻ᴴ G L⁻¹
    return herm(inner)


_cholesky_vjp = adjoint_to_jax(_cholesky_adjoint)


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
    each real symmetric or complex Hermitian matrix of a stack (JAX's ``lax.linalg.eigh``;
    ``w`` real). ``symmetrize_input`` decomposes ``(x + xᴴ)/2``; else only the ``lower``
    (else upper) triangle is read (NOTE [complex decompositions]).
    NOTE [eigh's derivatives]: the derivative of ``v`` is undefined (inf/NaN) where
    eigenvalues repeat. The eigenvalues always come sorted; ``subset_by_index`` must be
    None or the whole range."""
    n_all = core.shape_of(x)[-1]
    if subset_by_index is not None and tuple(subset_by_index) != (0, n_all):
        raise ShapeError(f"eigh: subset_by_index={subset_by_index!r} is not supported (only the whole range)")
    if symmetrize_input:
        x = herm(x)
    n = core.shape_of(x)[-1]
    return _eigh_parts(eigh_p.bind(x, lower=bool(lower)), n)


def _eigh_shape_rule(x, *, lower):
    check_matrix("eigh", x, square=True)
    return ShapedArray(x.shape[:-1] + (x.shape[-1] + 1,), x.dtype)


def _eigh_impl(x, *, lower):
    xp = backend.xp_of(x)
    w, v = xp.linalg.eigh(x, UPLO="L" if lower else "U")
    return xp.concatenate([v, w[..., None].astype(x.dtype)], axis=-1).astype(x.dtype, copy=False)


def _eigh_batch(axis_size, vals, dims, *, lower):
    (x,) = batch_front(axis_size, vals, dims)
    return eigh_p.bind(x, lower=lower), 0


def _real_diagonal(t):
    """``re(diag(t))`` as a diagonal matrix of ``t``'s dtype."""
    d = ew.mul(t, eye_like(t))
    return ew.mul(ew.add(d, conj(d)), 0.5) if is_complex(t) else d


def _from_triangle(t, lower):
    """The Hermitian (real: symmetric) matrix with ``t``'s strict ``lower`` (else upper)
    triangle and the real part of its diagonal (LAPACK reads no more)."""
    strict = tril(t, -1) if lower else triu(t, 1)
    return ew.add(ew.add(strict, _mH(strict)), _real_diagonal(t))


def _fold_onto_triangle(g, lower):
    """The adjoint of :func:`_from_triangle` under the Hermitian pairing (for real ``g`` its
    transpose)."""
    both = ew.add(g, _mH(g))
    strict = tril(both, -1) if lower else triu(both, 1)
    return ew.add(strict, _real_diagonal(g))


def _eigh_parts(out, n):
    """``(v, w)`` from the packed output, ``w`` real."""
    axis = len(core.shape_of(out)) - 1
    w = squeeze(slice_in_dim(out, n, n + 1, axis), (axis,))
    return slice_in_dim(out, 0, n, axis), (ew.real(w) if is_complex(w) else w)


def _eigh_jvp(t, out, x, *, lower):
    n = core.shape_of(x)[-1]
    v, w = _eigh_parts(out, n)
    t_dot = _mm(_mm(_mH(v), _from_triangle(t, lower)), v)
    dw = diagonal(t_dot)
    dw = ew.convert_element_type(ew.real(dw), core.dtype_of(v)) if is_complex(dw) else dw
    dw = expand_dims(dw, (len(core.shape_of(w)),))
    dv = _mm(v, ew.mul(_gap_inverse(w), t_dot))
    return concatenate([dv, dw], len(core.shape_of(out)) - 1)


def _gap_inverse(w):
    """``F_ij = 1 / (w_j − w_i)`` off the diagonal, 0 on it."""
    n = core.shape_of(w)[-1]
    eye = backend.xp_of(w).eye(n, dtype=bool)
    gap = ew.sub(_row(w), _col(w))
    return ew.select(eye, ew.mul(gap, 0), ew.div(1, ew.select(eye, ew.add(ew.mul(gap, 0), 1), gap)))


def _eigh_adjoint(ct, out, x, *, lower):
    """The adjoint of :func:`_eigh_jvp` under the Hermitian pairing:
    V (diag(w̄) + F ∘ (Vᴴ V̄)) Vᴴ folded onto the triangle read."""
    n = core.shape_of(x)[-1]
    v, w = _eigh_parts(out, n)
    ct_v, ct_w = _eigh_parts(ct, n)  # (re of the eigenvalues' slot)
    middle = ew.add(ew.mul(_row(ct_w), eye_like(w, n)),
                    zero_safe_mul(_gap_inverse(w), _mm(_mH(v), ct_v)))
    return _fold_onto_triangle(_mm(_mm(v, middle), _mH(v)), lower)


_eigh_vjp = adjoint_to_jax(_eigh_adjoint)


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
# For m ≥ n and the reduced decomposition (JAX's qr_jvp_rule), with X = dA R⁻¹,
# B = Qᴴ X and Ω = tril(B, −1) − tril(B, −1)ᴴ + i·im(diag(B)) (the last term, JAX's
# correction for complex matrices, is 0 for real ones):
#   dQ = Q (Ω − B) + X,   dR = (B − Ω) R.
# The VJP is its transpose: the Hermitian adjoint (with M = Qᴴ Q̄ − R̄ Rᴴ,
# B̄ = tril(M − Mᴴ, −1) + i·im(diag(M)) − M, X̄ = Q̄ + Q B̄ and Ā = X̄ R⁻ᴴ) through
# adjoint_to_jax. A wide matrix (m < n, JAX's rule too) splits as A = [A₁ A₂] = Q [R₁ R₂]
# with A₁ square: dQ and dR₁ are those of A₁ = Q R₁, and dR₂ = dQᴴ A₂ + Qᴴ dA₂. The full
# decomposition of a tall matrix (p = m − n more columns of Q) differentiates LAPACK's
# Householder completion as JAX does (arXiv:2409.13374, eqs. 32-33): with
# Z = Q_pn (Q_nn − I)⁻¹ (Q_mn = [Q_nn; Q_pn], the first n columns of Q, and Q_mp the rest),
#   dQ_mp = dQ_mn Zᴴ − (Q_mn + Q_mp Z) (dQ_pn − Z dQ_nn)ᴴ,   dR = [dR_nn; 0];
# its adjoint adds Q̄_mp Z − [−Zᴴ Y; Y] to Q̄_mn, Y = Q̄_mpᴴ (Q_mn + Q_mp Z). Each column of
# Q and row of R is defined up to a common sign (complex: phase): LAPACK's choice is
# differentiable where R's diagonal has no zero.

qr_p = Primitive("qr", owns_output=True, capturable=False)


def _qr_sizes(shape, full_matrices):
    m, n = shape[-2:]
    k = min(m, n)
    return m, n, (m if full_matrices else k)


def qr(x, *, pivoting=False, full_matrices=True, use_magma=None):
    """``(q, r)`` with ``x = q @ r``, ``q`` orthonormal (complex: unitary) columns and ``r``
    upper triangular, for each real or complex matrix of a stack (JAX's
    ``lax.linalg.qr``). NOTE [qr's derivatives]."""
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
    check_matrix("qr", x)
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


def _thin_qr_jvp(q, r, t):
    """``(dq, dr)`` of ``x = q r`` with ``r`` square (NOTE [qr's derivatives])."""
    x_ = _mT(triangular_solve_left(r, _mT(t), lower=False, transpose_a=True))  # dA R⁻¹
    b = _mm(_mH(q), x_)
    low = tril(b, -1)
    omega = ew.add(ew.sub(low, _mH(low)), imag_diagonal(b))
    dq = ew.add(_mm(q, ew.sub(omega, b)), x_)
    dr = _mm(ew.sub(b, omega), r)
    return dq, dr


def _thin_qr_adjoint(q, r, ct_q, ct_r):
    """The Hermitian adjoint of :func:`_thin_qr_jvp`."""
    mm = ew.sub(_mm(_mH(q), ct_q), _mm(ct_r, _mH(r)))
    b_bar = ew.sub(ew.add(tril(ew.sub(mm, _mH(mm)), -1), imag_diagonal(mm)), mm)
    x_bar = ew.add(ct_q, _mm(q, b_bar))
    return _mH(triangular_solve_left(r, _mH(x_bar), lower=False))  # X̄ R⁻ᴴ


def _last_cols(a, start, stop):
    nd = len(core.shape_of(a))
    return slice_in_dim(a, start, stop, nd - 1)


def _rows(a, start, stop):
    nd = len(core.shape_of(a))
    return slice_in_dim(a, start, stop, nd - 2)


def _completion(q, n):
    """``(q_mn, z, c)`` for the Householder completion of a tall full QR (NOTE [qr's
    derivatives]): ``z = Q_pn (Q_nn − I)⁻¹`` and ``c = Q_mn + Q_mp z``."""
    m = core.shape_of(q)[-1]
    q_mn, q_mp = _last_cols(q, 0, n), _last_cols(q, n, m)
    q_nn, q_pn = _rows(q_mn, 0, n), _rows(q_mn, n, m)
    z = _mH(solve(_mH(ew.sub(q_nn, eye_like(q_nn))), _mH(q_pn)))
    return q_mn, z, ew.add(q_mn, _mm(q_mp, z))


def _qr_jvp(t, out, x, *, full_matrices):
    shape = core.shape_of(x)
    m, n, p = _qr_sizes(shape, full_matrices)
    q, r = _qr_unpack(out, shape, m, n, p)
    if m > n and full_matrices:
        if n == 0:  # (q is the identity: no derivative)
            return ew.mul(out, 0)
        q_mn, z, c = _completion(q, n)
        dq_mn, dr_nn = _thin_qr_jvp(q_mn, _rows(r, 0, n), t)
        d_low = ew.sub(_rows(dq_mn, n, m), _mm(z, _rows(dq_mn, 0, n)))  # dQ_pn − z dQ_nn
        dq_mp = ew.sub(_mm(dq_mn, _mH(z)), _mm(c, _mH(d_low)))
        nd = len(shape)
        return _qr_pack(concatenate([dq_mn, dq_mp], nd - 1), concatenate([dr_nn, ew.mul(_rows(r, n, m), 0)], nd - 2))
    if m >= n:
        return _qr_pack(*_thin_qr_jvp(q, r, t))
    dq, dr1 = _thin_qr_jvp(q, _last_cols(r, 0, m), _last_cols(t, 0, m))
    dr2 = ew.add(_mm(_mH(dq), _last_cols(x, m, n)), _mm(_mH(q), _last_cols(t, m, n)))
    return _qr_pack(dq, concatenate([dr1, dr2], len(shape) - 1))


def _qr_adjoint(ct, out, x, *, full_matrices):
    shape = core.shape_of(x)
    m, n, p = _qr_sizes(shape, full_matrices)
    q, r = _qr_unpack(out, shape, m, n, p)
    ct_q, ct_r = _qr_unpack(ct, shape, m, n, p)
    if m > n and full_matrices:
        if n == 0:
            return ew.mul(x, 0)
        q_mn, z, c = _completion(q, n)
        ct_mn, ct_mp = _last_cols(ct_q, 0, n), _last_cols(ct_q, n, m)
        y = _mm(_mH(ct_mp), c)  # the adjoint of dQ_mp's second term, on dQ_pn − z dQ_nn
        back = concatenate([ew.neg(_mm(_mH(z), y)), y], len(shape) - 2)
        ct_mn = ew.sub(ew.add(ct_mn, _mm(ct_mp, z)), back)
        return _thin_qr_adjoint(q_mn, _rows(r, 0, n), ct_mn, _rows(ct_r, 0, n))
    if m >= n:
        return _thin_qr_adjoint(q, r, ct_q, ct_r)
    ct_r2 = _last_cols(ct_r, m, n)
    ct_q = ew.add(ct_q, _mm(_last_cols(x, m, n), _mH(ct_r2)))  # the adjoint of dq ↦ dqᴴ A₂
    ct_x1 = _thin_qr_adjoint(q, _last_cols(r, 0, m), ct_q, _last_cols(ct_r, 0, m))
    return concatenate([ct_x1, _mm(q, ct_r2)], len(shape) - 1)


_qr_vjp = adjoint_to_jax(_qr_adjoint)


qr_p.impl = _qr_impl
qr_p.shape_rule = _qr_shape_rule
batching.primitive_batchers[qr_p] = _qr_batch
jvp.defjvp(qr_p, _qr_jvp)
vjp.defvjp(qr_p, _qr_vjp, reads=(0, "out"))  # (x: the wide case reads A₂)

__all__ = ["cholesky", "cholesky_p", "eigh", "eigh_p", "qr", "qr_p"]

complex_rules.defcomplex(cholesky_p, eigh_p, qr_p)  # NOTE [complex decompositions]
