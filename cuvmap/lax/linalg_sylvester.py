"""The Sylvester equation ``A X + X B = C`` as a primitive, ``sylvester`` (the Bartels–Stewart
method of ``scipy.linalg.solve_sylvester``), so that it has derivative rules of its own. NOTE [the Sylvester solve as a primitive].
"""
import numpy as np

from cuvmap import backend
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.linalg import _mm, _mT
from cuvmap.lax.linalg_common import INEXACT, batch_front, check_matrix
from cuvmap.lax.linalg_schur import schur_arrays
from cuvmap.transforms import batching, complex_rules, jvp, vjp

# NOTE [the Sylvester solve as a primitive]
# ``solve_sylvester`` goes through the Schur decomposition, which has no derivative (JAX's
# has none either). As a primitive with rules, X = S⁻¹(C), S(X) = A X + X B, differentiates
# like ``solve``: dX = S⁻¹(dC − dA X − X dB) (JVP: three more solves with the same A, B); the
# transpose of S under the pairing ⟨U, V⟩ = Σ U∘V (plain transposes for complex operands,
# JAX's convention) is Sᵀ(Y) = Aᵀ Y + Y Bᵀ, so the cotangents are C̄ = sylvester(Aᵀ, Bᵀ, X̄),
# Ā = −C̄ Xᵀ, B̄ = −Xᵀ C̄. Every rule is again this primitive, so every order and every
# composition of modes exists (forward-over-reverse included, which a composite over
# ``schur`` cannot give). The impl: complex Schur forms A = U R Uᴴ and Bᴴ = V S Vᴴ
# (:func:`cuvmap.lax.linalg_schur.schur_arrays`), R Y + Y Sᴴ = Uᴴ C V by columns (last
# first, each a triangular system), X = U Y Vᴴ (real for real operands); on the host for
# CuPy operands; NaN where some |aᵢ + bⱼ| < tol (no unique solution, as JAX) or where the
# Schur form fails its check.
sylvester_p = Primitive("sylvester", owns_output=True, capturable=False)


def sylvester(a, b, c, *, tol=1e-8):
    """``X`` with ``A X + X B = C`` for stacks ``a`` ``(..., m, m)``, ``b`` ``(..., n, n)``,
    ``c`` ``(..., m, n)`` of the same leading dims and one dtype (NOTE [the Sylvester solve as
    a primitive]). Differentiable in all three, to any order. SciPy/JAX:
    ``scipy.linalg.solve_sylvester(method='schur')``."""
    return sylvester_p.bind(a, b, c, tol=float(tol))


def _shape_rule(a, b, c, *, tol):
    for x, square in ((a, True), (b, True), (c, False)):
        check_matrix("sylvester", x, square=square, dtypes=INEXACT)
    m, n = a.shape[-1], b.shape[-1]
    if not (a.shape[:-2] == b.shape[:-2] == c.shape[:-2]) or c.shape[-2:] != (m, n):
        raise ShapeError(f"sylvester: a {a.shape}, b {b.shape}, c {c.shape} must be (..., m, m), (..., n, n), "
                         f"(..., m, n) with the same leading dims")
    if not a.dtype == b.dtype == c.dtype:
        raise ShapeError(f"sylvester: a, b, c must have one dtype, got {a.dtype}, {b.dtype}, {c.dtype}")
    return ShapedArray(c.shape, c.dtype)


def _solve_arrays(a, b, c, tol):
    """The Bartels–Stewart solve of NumPy arrays (float64/complex128 work)."""
    m, n = a.shape[-1], b.shape[-1]
    finite = np.all(np.isfinite(a), axis=(-2, -1)) & np.all(np.isfinite(b), axis=(-2, -1)) \
        & np.all(np.isfinite(c), axis=(-2, -1))
    work = lambda x: np.where(np.all(np.isfinite(x), axis=(-2, -1))[..., None, None], x, 0).astype(np.complex128)  # noqa: E731
    r, u, dropped_a = schur_arrays(np, work(a))
    s, v, dropped_b = schur_arrays(np, np.conj(np.swapaxes(work(b), -1, -2)))
    lower = np.conj(np.swapaxes(s, -1, -2))  # Sᴴ: lower triangular
    f = np.conj(np.swapaxes(u, -1, -2)) @ c.astype(np.complex128) @ v
    y = np.zeros(f.shape, np.complex128)
    eye = np.eye(m, dtype=np.complex128)
    with np.errstate(divide="ignore", invalid="ignore"):
        for j in range(n - 1, -1, -1):
            rhs = f[..., :, j] - np.einsum("...ik,...k->...i", y[..., :, j + 1:], lower[..., j + 1:, j])
            system = r + lower[..., j, j][..., None, None] * eye
            try:
                y[..., :, j] = np.linalg.solve(system, rhs[..., None])[..., 0]
            except np.linalg.LinAlgError:  # an exactly singular system: NaN below
                y[..., :, j] = np.nan
    x = u @ y @ np.conj(np.swapaxes(v, -1, -2))
    wa = np.diagonal(r, axis1=-2, axis2=-1)
    wb = np.conj(np.diagonal(s, axis1=-2, axis2=-1))
    near = np.any(np.abs(wa[..., :, None] + wb[..., None, :]) < tol, axis=(-2, -1))
    limit = 100 * max(m, n, 1) * np.finfo(np.float64).eps
    ok = finite & ~near & (dropped_a <= limit) & (dropped_b <= limit)
    return np.where(ok[..., None, None], x, np.nan)


def _impl(a, b, c, *, tol):
    xp = backend.xp_of(a, b, c)
    host = [x if xp is np else xp.asnumpy(x) for x in (a, b, c)]
    dtype = c.dtype
    if min(host[0].shape[-1], host[1].shape[-1]) == 0 or host[2].size == 0:
        return xp.zeros(c.shape, dtype)
    x = _solve_arrays(*host, tol)
    x = x if np.dtype(dtype).kind == "c" else x.real
    out = x.astype(dtype)
    return out if xp is np else xp.asarray(out)


def _batch(axis_size, vals, dims, **params):
    return sylvester(*batch_front(axis_size, vals, dims), **params), 0


def _jvp_a(t, out, a, b, c, **params):
    return sylvester(a, b, ew.neg(_mm(t, out)), **params)


def _jvp_b(t, out, a, b, c, **params):
    return sylvester(a, b, ew.neg(_mm(out, t)), **params)


def _jvp_c(t, out, a, b, c, **params):
    return sylvester(a, b, t, **params)


def _vjp_c(ct, out, a, b, c, **params):
    return sylvester(_mT(a), _mT(b), ct, **params)


def _vjp_a(ct, out, a, b, c, **params):
    return ew.neg(_mm(_vjp_c(ct, out, a, b, c, **params), _mT(out)))


def _vjp_b(ct, out, a, b, c, **params):
    return ew.neg(_mm(_mT(out), _vjp_c(ct, out, a, b, c, **params)))


sylvester_p.impl = _impl
sylvester_p.shape_rule = _shape_rule
batching.primitive_batchers[sylvester_p] = _batch
jvp.defjvp(sylvester_p, _jvp_a, _jvp_b, _jvp_c)
vjp.defvjp(sylvester_p, _vjp_a, _vjp_b, _vjp_c)
# holomorphic in a, b and c: the rules above hold for complex operands with plain transposes
# (NOTE [complex convention], cuvmap/transforms/complex_rules.py)
complex_rules.defcomplex(sylvester_p)
