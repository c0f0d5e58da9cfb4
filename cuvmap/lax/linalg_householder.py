"""Householder reductions in LAPACK's packed form: ``householder_product`` (LAPACK's
orgqr/ungqr, a composite), ``hessenberg`` (gehrd) and ``tridiagonal`` (sytrd/hetrd), JAX's
``lax.linalg`` names. NumPy exposes none of these LAPACK routines, so the impls are
LAPACK's unblocked algorithms (gehd2, sytd2/hetd2) written over whole stacks: one
vectorised step per column, never a loop over the matrices (NOTE [Householder reflectors
as LAPACK writes them]). As in JAX, ``hessenberg`` and ``tridiagonal`` have no derivative
(their rules raise, naming them).
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.elementwise.complex_numbers import conj
from cuvmap.lax.indexing import slice_in_dim
from cuvmap.lax.linalg_common import INEXACT, _col, _mm, _row, batch_front, check_matrix
from cuvmap.lax.shape import squeeze
from cuvmap.transforms import batching, complex_rules, jvp, vjp
from cuvmap.core.bfloat16 import kind_of

# NOTE [Householder reflectors as LAPACK writes them]
# An elementary reflector H = I − τ v vᴴ with v = (1, x) (larfg) maps (α, x) to (β, 0),
# Hᴴ (α, x) = (β, 0), with β = −sign(re α) ‖(α, x)‖ (real), τ = (β − α)/β, and x stored
# scaled by 1/(α − β); where x = 0 and α is real, τ = 0 (H = I). gehd2 reduces A to
# Hessenberg form column by column: the reflector of column i zeroes A[i+2:, i], and A
# becomes H_iᴴ A H_i (the reflector's vector kept below the subdiagonal, its τ in taus).
# sytd2/hetd2 do the same for a Hermitian matrix of which one triangle is read: the
# lower form reduces column i below the diagonal (A₂₂ ← A₂₂ − v wᴴ − w vᴴ,
# w = τ A₂₂ v − ½ τ (τ vᴴ A₂₂ v) v), the upper form column i+1 above the diagonal from
# the last column back; the unread triangle keeps its input values. These are LAPACK's
# unblocked algorithms, so the results equal LAPACK's to rounding; each step is a few
# whole-stack array operations.


def _larfg(xp, alpha, x):
    """``(beta, tau, v_tail)`` of the reflectors of a stack: ``alpha`` ``(B,)``, ``x``
    ``(B, k)`` (LAPACK's larfg, NOTE [Householder reflectors as LAPACK writes them])."""
    xnorm = xp.sqrt((xp.abs(x) ** 2).sum(axis=-1)) if x.shape[-1] else xp.zeros(alpha.shape, dtype=xp.abs(alpha).dtype)
    identity = (xnorm == 0) & (alpha.imag == 0 if kind_of(alpha.dtype) == "c" else True)
    norm = xp.sqrt(xp.abs(alpha) ** 2 + xnorm ** 2)
    beta = xp.where(alpha.real >= 0, -norm, norm)
    safe_beta = xp.where(identity, 1, beta)
    tau = xp.where(identity, 0, (safe_beta - alpha) / safe_beta).astype(alpha.dtype)
    scale = xp.where(identity, 1, 1 / xp.where(identity, 1, alpha - beta))
    return xp.where(identity, alpha.real, beta), tau, x * scale[..., None]


# =======================================================================================
# householder_product
# =======================================================================================


def householder_product(a, taus):
    """The first ``n`` columns of ``Q = H_0 H_1 ⋯ H_{k-1}``, ``H_i = I − τ_i v_i v_iᴴ`` with
    ``v_i = (0, …, 0, 1, a[i+1:, i])`` (JAX's ``lax.linalg.householder_product``,
    LAPACK's orgqr/ungqr), for ``a`` ``(..., m, n)`` (``m ≥ n``) and ``taus`` ``(..., k)``
    (``k ≤ n``). A composite of products and selections: differentiable and batchable."""
    a_shape, t_shape = core.shape_of(a), core.shape_of(taus)
    if len(a_shape) < 2 or a_shape[-2] < a_shape[-1]:
        raise ShapeError(f"householder_product: a must be (..., m, n) with m >= n, got {a_shape}")
    if len(t_shape) != len(a_shape) - 1 or t_shape[:-1] != a_shape[:-2] or t_shape[-1] > a_shape[-1]:
        raise ShapeError(f"householder_product: taus must be (..., k) with k <= n for a {a_shape}, got {t_shape}")
    if core.dtype_of(a) not in INEXACT or core.dtype_of(taus) != core.dtype_of(a):
        raise ShapeError(f"householder_product: a and taus must have one float or complex dtype, got "
                         f"{core.dtype_of(a)} and {core.dtype_of(taus)}")
    m, n = a_shape[-2:]
    xp = backend.xp_of(a)
    dtype = core.dtype_of(a)
    q = ew.add(ew.mul(a, 0), xp.asarray(np.eye(m, n, dtype=dtype)))
    rows = np.arange(m)
    axis = len(a_shape) - 1
    for i in range(t_shape[-1] - 1, -1, -1):
        column = squeeze(slice_in_dim(a, i, i + 1, axis), (axis,))
        below = xp.asarray(rows > i)
        unit = xp.asarray((rows == i).astype(dtype))
        v = ew.add(ew.select(below, column, ew.mul(column, 0)), unit)
        tau = squeeze(slice_in_dim(taus, i, i + 1, axis - 1), (axis - 1,))
        vq = _mm(_row(conj(v) if kind_of(np.dtype(dtype)) == "c" else v), q)  # vᴴ Q: (..., 1, n)
        q = ew.sub(q, ew.mul(_col(_col(tau)), _mm(_col(v), vq)))
    return q


# =======================================================================================
# hessenberg
# =======================================================================================

hessenberg_p = Primitive("hessenberg", owns_output=True, capturable=False)


def hessenberg(a):
    """``(a', taus)``: the reduction ``A = Q H Qᴴ`` of each square matrix to upper
    Hessenberg form (JAX's ``lax.linalg.hessenberg``, LAPACK's gehrd): ``H`` is the upper
    triangle and first subdiagonal of ``a'``, the reflectors' vectors are below it and
    ``taus`` ``(..., n-1)`` holds their factors (``Q`` =
    ``householder_product(a'[..., 1:, :-1], taus)`` bordered by 1). NOTE [Householder
    reflectors as LAPACK writes them]. No derivative (as JAX)."""
    check_matrix("hessenberg", core.get_aval(a), square=True, dtypes=INEXACT)  # (eager calls skip shape rules)
    n = core.shape_of(a)[-1]
    packed = hessenberg_p.bind(a)
    axis = len(core.shape_of(packed)) - 2
    taus = squeeze(slice_in_dim(packed, n, n + 1, axis), (axis,))
    return slice_in_dim(packed, 0, n, axis), slice_in_dim(taus, 0, max(n - 1, 0), axis)


def _hessenberg_shape_rule(a):
    check_matrix("hessenberg", a, square=True, dtypes=INEXACT)
    return ShapedArray(a.shape[:-2] + (a.shape[-2] + 1, a.shape[-1]), a.dtype)


def _hessenberg_impl(a):
    xp = backend.xp_of(a)
    lead, n = a.shape[:-2], a.shape[-1]
    work = a.reshape((-1, n, n)).copy()
    taus = xp.zeros((work.shape[0], n), dtype=a.dtype)
    for i in range(n - 1):  # the last reflector (no x) is not the identity where alpha is complex
        beta, tau, tail = _larfg(xp, work[:, i + 1, i], work[:, i + 2:, i])
        v = xp.concatenate([xp.ones((work.shape[0], 1), dtype=a.dtype), tail], axis=-1)  # rows i+1:
        # from the right: A[:, i+1:] ← A[:, i+1:] (I − τ v vᴴ)
        av = (work[:, :, i + 1:] @ v[..., None])[..., 0]
        work[:, :, i + 1:] -= (tau[:, None] * av)[..., None] * xp.conj(v)[:, None, :]
        # from the left: A[i+1:, i+1:] ← (I − τ̄ v vᴴ) A[i+1:, i+1:]
        va = (xp.conj(v)[:, None, :] @ work[:, i + 1:, i + 1:])[:, 0, :]
        work[:, i + 1:, i + 1:] -= (xp.conj(tau)[:, None] * v)[..., None] * va[:, None, :]
        work[:, i + 1, i] = beta
        work[:, i + 2:, i] = tail
        taus[:, i] = tau
    out = xp.concatenate([work, taus[:, None, :]], axis=1)
    return out.reshape(lead + (n + 1, n))


def _hessenberg_batch(axis_size, vals, dims):
    (a,) = batch_front(axis_size, vals, dims)
    return hessenberg_p.bind(a), 0


def _no_derivative(name):
    def rule(*args, **params):
        raise NotImplementedError(
            f"{name} has no derivative rule (JAX's lax.linalg.{name} has none either); differentiate a function "
            "that does not go through the reduction")
    return rule


hessenberg_p.impl = _hessenberg_impl
hessenberg_p.shape_rule = _hessenberg_shape_rule
batching.primitive_batchers[hessenberg_p] = _hessenberg_batch
jvp.defjvp(hessenberg_p, _no_derivative("hessenberg"))
vjp.defvjp(hessenberg_p, _no_derivative("hessenberg"))


# =======================================================================================
# tridiagonal
# =======================================================================================

tridiagonal_p = Primitive("tridiagonal", owns_output=True, capturable=False)


def tridiagonal(a, *, lower=True):
    """``(a', d, e, taus)``: the reduction ``A = Q T Qᴴ`` of each Hermitian matrix (read
    from its ``lower``, else upper, triangle) to real symmetric tridiagonal ``T`` (JAX's
    ``lax.linalg.tridiagonal``, LAPACK's sytrd/hetrd): ``d`` ``(..., n)`` its diagonal,
    ``e`` ``(..., n-1)`` its off-diagonal (both real), ``taus`` ``(..., n-1)`` the
    reflectors' factors, ``a'`` the packed reflectors (the other triangle as given).
    NOTE [Householder reflectors as LAPACK writes them]. No derivative (as JAX)."""
    _tridiagonal_shape_rule(core.get_aval(a), lower=lower)  # (eager calls skip shape rules)
    n = core.shape_of(a)[-1]
    packed = tridiagonal_p.bind(a, lower=bool(lower))
    axis = len(core.shape_of(packed)) - 2
    row = lambda r: squeeze(slice_in_dim(packed, r, r + 1, axis), (axis,))  # noqa: E731
    last = axis
    d = ew.convert_element_type(row(n), _real(core.dtype_of(a)))
    e = slice_in_dim(ew.convert_element_type(row(n + 1), _real(core.dtype_of(a))), 0, n - 1, last)
    return slice_in_dim(packed, 0, n, axis), d, e, slice_in_dim(row(n + 2), 0, n - 1, last)


def _real(dtype):
    return np.finfo(dtype).dtype


def _tridiagonal_shape_rule(a, *, lower):
    check_matrix("tridiagonal", a, square=True, dtypes=INEXACT)
    if a.shape[-1] == 0:
        raise ShapeError(f"tridiagonal: the operand must be non-empty square matrices, got shape {a.shape}")
    return ShapedArray(a.shape[:-2] + (a.shape[-2] + 3, a.shape[-1]), a.dtype)


def _tridiagonal_impl(a, *, lower):
    xp = backend.xp_of(a)
    lead, n = a.shape[:-2], a.shape[-1]
    given = a.reshape((-1, n, n))
    batch = given.shape[0]
    idx = np.arange(n)
    # the Hermitian matrix of the triangle read, its diagonal real (hetd2)
    tri = np.tril(np.ones((n, n), dtype=bool)) if lower else np.triu(np.ones((n, n), dtype=bool))
    half = xp.where(xp.asarray(tri), given, 0)
    work = half + xp.conj(xp.swapaxes(xp.where(xp.asarray(tri & ~np.eye(n, dtype=bool)), given, 0), -1, -2))
    work[:, idx, idx] = work[:, idx, idx].real
    packed = given.copy()
    d = xp.zeros((batch, n), dtype=a.dtype)
    e = xp.zeros((batch, n), dtype=a.dtype)
    taus = xp.zeros((batch, n), dtype=a.dtype)
    steps = range(n - 1) if lower else range(n - 2, -1, -1)
    for i in steps:
        if lower:  # column i below the diagonal: alpha = A[i+1, i], x = A[i+2:, i]
            beta, tau, tail = _larfg(xp, work[:, i + 1, i], work[:, i + 2:, i])
            v = xp.concatenate([xp.ones((batch, 1), dtype=a.dtype), tail], axis=-1)
            block = slice(i + 1, n)
        else:  # column i+1 above the diagonal: alpha = A[i, i+1], x = A[:i, i+1]
            beta, tau, tail = _larfg(xp, work[:, i, i + 1], work[:, :i, i + 1])
            v = xp.concatenate([tail, xp.ones((batch, 1), dtype=a.dtype)], axis=-1)
            block = slice(0, i + 1)
        sub = work[:, block, block]
        x = tau[:, None] * (sub @ v[..., None])[..., 0]
        alpha = -0.5 * tau * (xp.conj(x) * v).sum(axis=-1)
        w = x + alpha[:, None] * v
        work[:, block, block] = sub - v[:, :, None] * xp.conj(w)[:, None, :] - w[:, :, None] * xp.conj(v)[:, None, :]
        if lower:
            work[:, i + 1, i] = beta
            packed[:, i + 1, i] = beta
            packed[:, i + 2:, i] = tail
            d[:, i] = work[:, i, i].real
        else:
            work[:, i, i + 1] = beta
            packed[:, i, i + 1] = beta
            packed[:, :i, i + 1] = tail
            d[:, i + 1] = work[:, i + 1, i + 1].real
        e[:, i] = beta
        taus[:, i] = tau
    last = n - 1 if lower else 0
    d[:, last] = work[:, last, last].real
    packed[:, idx, idx] = d
    out = xp.concatenate([packed, d[:, None, :], e[:, None, :], taus[:, None, :]], axis=1)
    return out.reshape(lead + (n + 3, n))


def _tridiagonal_batch(axis_size, vals, dims, *, lower):
    (a,) = batch_front(axis_size, vals, dims)
    return tridiagonal_p.bind(a, lower=lower), 0


tridiagonal_p.impl = _tridiagonal_impl
tridiagonal_p.shape_rule = _tridiagonal_shape_rule
batching.primitive_batchers[tridiagonal_p] = _tridiagonal_batch
jvp.defjvp(tridiagonal_p, _no_derivative("tridiagonal"))
vjp.defvjp(tridiagonal_p, _no_derivative("tridiagonal"))
# their rules raise for every dtype, naming them: registered so that complex operands get that message too
complex_rules.defcomplex(hessenberg_p, tridiagonal_p)
