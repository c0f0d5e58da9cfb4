"""Tridiagonal systems: ``tridiagonal_solve`` (JAX's ``lax.linalg.tridiagonal_solve``), one
primitive whose impl is LAPACK's ``gtsv`` algorithm (Gaussian elimination with partial
pivoting) written over whole stacks at once: one vectorised step per row of the system
(NOTE [a tridiagonal solve in one sweep]), JAX's JVP and the cotangents of all four
operands.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.indexing import slice_in_dim
from cuvmap.lax.linalg_common import INEXACT, batch_front
from cuvmap.lax.reduction import reduce_sum
from cuvmap.lax.shape import concatenate, expand_dims
from cuvmap.transforms import batching, complex_rules, jvp, vjp


# =======================================================================================
# tridiagonal_solve
# =======================================================================================

# NOTE [a tridiagonal solve in one sweep]
# ``tridiagonal_solve(dl, d, du, b)`` solves A X = B for the tridiagonal A with
# ``A[i, i-1] = dl[i]``, ``A[i, i] = d[i]``, ``A[i, i+1] = du[i]`` (``dl[0]`` and
# ``du[m-1]`` are ignored), stacks ``(..., m)`` and ``b`` ``(..., m, k)``. The impl is
# LAPACK's gtsv/gttrf: at step i the rows i and i+1 are swapped where
# ``|A[i+1, i]| > |A[i, i]|`` (partial pivoting, which fills one more superdiagonal), row
# i+1 loses its multiple of row i, and the right-hand sides follow; then back
# substitution with the three diagonals of U. Each step is a handful of whole-stack
# array operations (a loop over the m rows, as LAPACK's, never over the systems or the
# right-hand sides). A system with an exactly zero pivot is singular: its solution is
# NaN (as JAX's gtsv path). With ``perturb_singular=True`` a pivot smaller than
# tol = eps · max |U| (eps of the dtype; eps itself where U is zero) is replaced by tol
# (keeping its phase), so a singular system gives a large finite solution (JAX's
# perturbed solver, for inverse iteration).

# NOTE [tridiagonal_solve's derivatives]
# X = A⁻¹ B is linear in B and, as in JAX, dX = A⁻¹ (dB − dA X) with dA the tridiagonal
# matrix of the tangents (dl, d, du). With G = A⁻ᵀ X̄ (a solve with the transposed
# tridiagonal: dlᵀ[i] = du[i-1], duᵀ[i] = dl[i+1]):
#   B̄ = G,   d̄[i] = −Σ_k G[i,k] X[i,k],   d̄l[i] = −Σ_k G[i,k] X[i-1,k] (0 at i = 0),
#   d̄u[i] = −Σ_k G[i,k] X[i+1,k] (0 at i = m-1),
# with no conjugation (JAX's pairing: NOTE [complex convention]).

tridiagonal_solve_p = Primitive("tridiagonal_solve", owns_output=True, capturable=False)


def tridiagonal_solve(dl, d, du, b, *, perturb_singular=False):
    """``X`` with ``A X = b`` for the tridiagonal matrices ``A`` of the diagonals ``dl``
    (``A[i, i-1] = dl[i]``), ``d`` and ``du`` (``A[i, i+1] = du[i]``), stacks ``(..., m)``,
    and ``b`` ``(..., m, k)`` (JAX's ``lax.linalg.tridiagonal_solve``). Gaussian
    elimination with partial pivoting (LAPACK's gtsv); a singular system gives NaN, or
    with ``perturb_singular=True`` a large finite solution (tiny pivots perturbed by
    ``eps · max|U|``). NOTE [a tridiagonal solve in one sweep], NOTE
    [tridiagonal_solve's derivatives]."""
    _check_operands(*(core.shape_of(v) for v in (dl, d, du, b)), *(core.dtype_of(v) for v in (dl, d, du, b)))
    return tridiagonal_solve_p.bind(dl, d, du, b, perturb_singular=bool(perturb_singular))


def _check_operands(dl_shape, d_shape, du_shape, b_shape, *dtypes):
    if not (tuple(dl_shape) == tuple(d_shape) == tuple(du_shape)):
        raise ShapeError(f"tridiagonal_solve: dl, d and du must have one shape (..., m), got {dl_shape}, {d_shape} "
                         f"and {du_shape}")
    if len(d_shape) < 1 or len(b_shape) != len(d_shape) + 1 or tuple(b_shape[:-1]) != tuple(d_shape):
        raise ShapeError(f"tridiagonal_solve: b must be (..., m, k) with (..., m) the diagonals' shape {d_shape}, "
                         f"got {b_shape}")
    if len(set(dtypes)) != 1 or dtypes[0] not in INEXACT:
        raise ShapeError("tridiagonal_solve: dl, d, du and b must have one float or complex dtype, got "
                         + ", ".join(str(t) for t in dtypes))


def _tridiagonal_solve_shape_rule(dl, d, du, b, *, perturb_singular):
    _check_operands(dl.shape, d.shape, du.shape, b.shape, dl.dtype, d.dtype, du.dtype, b.dtype)
    return b


def _tridiagonal_solve_impl(dl, d, du, b, *, perturb_singular):
    xp = backend.xp_of(dl, d, du, b)
    m = d.shape[-1]
    if m == 0 or b.size == 0:
        return xp.zeros(b.shape, dtype=b.dtype)
    diag = d.copy()
    sub = dl[..., 1:].copy()  # A[i+1, i]; after the sweep, the multipliers
    sup = du[..., :-1].copy()  # U[i, i+1]
    sup2 = xp.zeros(d.shape[:-1] + (max(m - 2, 0),), dtype=d.dtype)  # U[i, i+2], filled by pivoting
    x = b.copy()
    for i in range(m - 1):
        swap = xp.abs(diag[..., i]) < xp.abs(sub[..., i])
        keep = ~swap
        # no swap: row i+1 -= f · row i, f = A[i+1, i] / A[i, i] (0 where the pivot is 0)
        safe = xp.where(keep & (diag[..., i] != 0), diag[..., i], 1)
        f_keep = xp.where(keep & (diag[..., i] != 0), sub[..., i] / safe, 0)
        # swap: the rows trade places, then row i+1 -= f · the new row i
        safe_sub = xp.where(swap, sub[..., i], 1)
        f_swap = xp.where(swap, diag[..., i] / safe_sub, 0)
        d_next = diag[..., i + 1].copy()
        sup_i = sup[..., i].copy()
        new_d_next = xp.where(swap, sup_i - f_swap * d_next, d_next - f_keep * sup_i)
        diag[..., i] = xp.where(swap, sub[..., i], diag[..., i])
        sup[..., i] = xp.where(swap, d_next, sup_i)
        diag[..., i + 1] = new_d_next
        if i < m - 2:
            sup_next = sup[..., i + 1].copy()
            sup2[..., i] = xp.where(swap, sup_next, 0)
            sup[..., i + 1] = xp.where(swap, -f_swap * sup_next, sup_next)
        xi, xn = x[..., i, :].copy(), x[..., i + 1, :].copy()
        sw = swap[..., None]
        x[..., i, :] = xp.where(sw, xn, xi)
        x[..., i + 1, :] = xp.where(sw, xi - f_swap[..., None] * xn, xn - f_keep[..., None] * xi)
    singular = (diag == 0).any(axis=-1)
    if perturb_singular:
        scale = xp.maximum(xp.max(xp.abs(diag), axis=-1),
                           xp.maximum(_abs_max(xp, sup), _abs_max(xp, sup2)))
        eps = np.finfo(d.dtype).eps
        tol = xp.where(scale > 0, eps * scale, eps).astype(scale.dtype)[..., None]
        mag = xp.abs(diag)
        phase = xp.where(mag > 0, diag / xp.where(mag > 0, mag, 1), 1)
        diag = xp.where(mag < tol, phase * tol, diag)
    safe_diag = xp.where(diag == 0, 1, diag)
    x[..., m - 1, :] = x[..., m - 1, :] / safe_diag[..., m - 1, None]
    if m > 1:
        x[..., m - 2, :] = (x[..., m - 2, :] - sup[..., m - 2, None] * x[..., m - 1, :]) / safe_diag[..., m - 2, None]
    for i in range(m - 3, -1, -1):
        x[..., i, :] = (x[..., i, :] - sup[..., i, None] * x[..., i + 1, :]
                        - sup2[..., i, None] * x[..., i + 2, :]) / safe_diag[..., i, None]
    if not perturb_singular:
        x = xp.where(singular[..., None, None], np.nan, x)
    return x.astype(b.dtype, copy=False)


def _abs_max(xp, v):
    if v.shape[-1] == 0:
        return xp.zeros(v.shape[:-1], dtype=np.finfo(v.dtype).dtype)
    return xp.max(xp.abs(v), axis=-1)


def _tridiagonal_solve_batch(axis_size, vals, dims, *, perturb_singular):
    return tridiagonal_solve(*batch_front(axis_size, vals, dims), perturb_singular=perturb_singular), 0


def _shift_down(v):
    """``v[i-1]`` at row ``i`` (0 at row 0) along the second-to-last axis."""
    axis = len(core.shape_of(v)) - 2
    n = core.shape_of(v)[axis]
    zero = ew.mul(slice_in_dim(v, 0, 1, axis), 0)
    return concatenate([zero, slice_in_dim(v, 0, n - 1, axis)], axis)


def _shift_up(v):
    """``v[i+1]`` at row ``i`` (0 at the last row) along the second-to-last axis."""
    axis = len(core.shape_of(v)) - 2
    n = core.shape_of(v)[axis]
    zero = ew.mul(slice_in_dim(v, 0, 1, axis), 0)
    return concatenate([slice_in_dim(v, 1, n, axis), zero], axis)


def _col(v):
    return expand_dims(v, (len(core.shape_of(v)),))


def _tridiagonal_product(dl, d, du, x):
    """``A x`` for the tridiagonal ``A`` of ``(dl, d, du)`` (``dl[0]``, ``du[m-1]`` unused:
    the shifts bring zeros there)."""
    lower = ew.mul(_col(dl), _shift_down(x))
    upper = ew.mul(_col(du), _shift_up(x))
    return ew.add(ew.add(ew.mul(_col(d), x), lower), upper)


def _tridiagonal_solve_jvp_dl(t, out, dl, d, du, b, *, perturb_singular):
    rhs = ew.neg(_tridiagonal_product(t, ew.mul(d, 0), ew.mul(du, 0), out))
    return tridiagonal_solve(dl, d, du, rhs, perturb_singular=perturb_singular)


def _tridiagonal_solve_jvp_d(t, out, dl, d, du, b, *, perturb_singular):
    return tridiagonal_solve(dl, d, du, ew.neg(ew.mul(_col(t), out)), perturb_singular=perturb_singular)


def _tridiagonal_solve_jvp_du(t, out, dl, d, du, b, *, perturb_singular):
    rhs = ew.neg(_tridiagonal_product(ew.mul(dl, 0), ew.mul(d, 0), t, out))
    return tridiagonal_solve(dl, d, du, rhs, perturb_singular=perturb_singular)


def _tridiagonal_solve_jvp_b(t, out, dl, d, du, b, *, perturb_singular):
    return tridiagonal_solve(dl, d, du, t, perturb_singular=perturb_singular)


def _transposed_diagonals(dl, du):
    """``(dlᵀ, duᵀ)`` of Aᵀ: ``dlᵀ[i] = du[i-1]``, ``duᵀ[i] = dl[i+1]``."""
    axis = len(core.shape_of(dl)) - 1
    m = core.shape_of(dl)[-1]
    zero_du = ew.mul(slice_in_dim(du, 0, 1, axis), 0)
    zero_dl = ew.mul(slice_in_dim(dl, 0, 1, axis), 0)
    return (concatenate([zero_du, slice_in_dim(du, 0, m - 1, axis)], axis),
            concatenate([slice_in_dim(dl, 1, m, axis), zero_dl], axis))


def _cotangent_rhs(ct, dl, d, du, perturb_singular):
    """``G = A⁻ᵀ X̄``."""
    dl_t, du_t = _transposed_diagonals(dl, du)
    return tridiagonal_solve(dl_t, d, du_t, ct, perturb_singular=perturb_singular)


def _sum_rhs(x):
    return reduce_sum(x, (len(core.shape_of(x)) - 1,))


def _tridiagonal_solve_vjp_b(ct, out, dl, d, du, b, *, perturb_singular):
    return _cotangent_rhs(ct, dl, d, du, perturb_singular)


def _tridiagonal_solve_vjp_d(ct, out, dl, d, du, b, *, perturb_singular):
    g = _cotangent_rhs(ct, dl, d, du, perturb_singular)
    return ew.neg(_sum_rhs(ew.mul(g, out)))


def _tridiagonal_solve_vjp_dl(ct, out, dl, d, du, b, *, perturb_singular):
    g = _cotangent_rhs(ct, dl, d, du, perturb_singular)
    return ew.neg(_sum_rhs(ew.mul(g, _shift_down(out))))


def _tridiagonal_solve_vjp_du(ct, out, dl, d, du, b, *, perturb_singular):
    g = _cotangent_rhs(ct, dl, d, du, perturb_singular)
    return ew.neg(_sum_rhs(ew.mul(g, _shift_up(out))))


tridiagonal_solve_p.impl = _tridiagonal_solve_impl
tridiagonal_solve_p.shape_rule = _tridiagonal_solve_shape_rule
batching.primitive_batchers[tridiagonal_solve_p] = _tridiagonal_solve_batch
jvp.defjvp(tridiagonal_solve_p, _tridiagonal_solve_jvp_dl, _tridiagonal_solve_jvp_d, _tridiagonal_solve_jvp_du,
           _tridiagonal_solve_jvp_b)
vjp.defvjp(tridiagonal_solve_p, _tridiagonal_solve_vjp_dl, _tridiagonal_solve_vjp_d, _tridiagonal_solve_vjp_du,
           _tridiagonal_solve_vjp_b)
# complex-linear in b and holomorphic in the diagonals: the real rules serve unchanged
complex_rules.defcomplex(tridiagonal_solve_p)
