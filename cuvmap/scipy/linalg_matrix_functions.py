"""``scipy.linalg``'s Schur-based functions as ``jax.scipy.linalg`` has them: ``schur``,
``rsf2csf``, ``sqrtm``, ``funm`` and ``solve_sylvester``. Each takes
stacks of matrices and is a composite of :mod:`cuvmap.numpy` functions over
:func:`cuvmap.lax.linalg_schur.schur` (loops over the matrix size only, each step a
whole-stack operation), so it vmaps and jits; ``schur`` has no derivative, as in JAX, but
``solve_sylvester`` is the Sylvester primitive (NOTE [the Sylvester solve as a primitive])
and ``sqrtm`` carries autograd's rule (NOTE [sqrtm differentiated by a Sylvester equation]).
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapeError
from cuvmap.lax.linalg_schur import schur as lax_schur
from cuvmap.lax.linalg_sylvester import sylvester as lax_sylvester
from cuvmap.numpy import linalg as np_linalg
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementary import isinf
from cuvmap.numpy._elementwise import abs, astype, maximum, minimum, sqrt, where
from cuvmap.numpy._products import matmul
from cuvmap.numpy._reductions import any, min
from cuvmap.numpy._shapes import broadcast_to, concatenate, diagonal, swapaxes
from cuvmap.core.bfloat16 import kind_of
from cuvmap.transforms.custom_derivatives import custom_jvp

__all__ = ["funm", "rsf2csf", "schur", "solve_sylvester", "sqrtm"]


def _inexact(x, name):
    x = x if isinstance(x, core.Tracer) or hasattr(x, "dtype") else asarray(x)
    return x if core.is_float(x) else astype(x, np.float64)


def _square(a, name, arg="a"):
    a = _inexact(a, name)
    s = core.shape_of(a)
    if len(s) < 2 or s[-1] != s[-2]:
        raise ShapeError(f"{name}: {arg} must be a square matrix or a stack of them (..., n, n), got shape {s}")
    return a


def _complex(x):
    dtype = core.dtype_of(x)
    return x if kind_of(dtype) == "c" else astype(x, np.result_type(dtype, np.complex64))


def _adjoint(x):
    return swapaxes(x, -1, -2).conj()


def _lead(*xs):
    """The broadcast leading (batch) dims of stacks of matrices."""
    return tuple(np.broadcast_shapes(*(core.shape_of(x)[:-2] for x in xs)))


def _on(like, array):
    """A NumPy constant on the device of ``like`` (an array or a tracer)."""
    return backend.xp_of(like).asarray(array)


def _offset_mask(like, n, k):
    """The constant mask of the ``k``-th superdiagonal of an ``n × n`` matrix."""
    return _on(like, np.eye(n, k=k, dtype=bool))


def _diag_embed(d):
    n = core.shape_of(d)[-1]
    return d[..., :, None] * _on(d, np.eye(n, dtype=core.dtype_of(d)))


# ---------------------------------------------------------------------------------------
# schur, rsf2csf
# ---------------------------------------------------------------------------------------


def schur(a, output="real"):
    """``scipy.linalg.schur`` (JAX's ``jax.scipy.linalg.schur``): ``(T, Z)`` with
    ``a = Z T Zᴴ``, ``Z`` unitary, ``T`` upper triangular (``output='complex'``, or a
    complex ``a``) or quasi-upper-triangular with 2×2 blocks for complex eigenvalue pairs
    (``output='real'`` of a real ``a``). No derivative (as JAX). The eigenvalues come in
    LAPACK geev's order: NOTE [Schur vectors from eigenvectors] in
    ``cuvmap/lax/linalg_schur.py``."""
    if output not in ("real", "complex"):
        raise ValueError(f"schur: output must be 'real' or 'complex', got {output!r}")
    a = _square(a, "schur")
    if output == "complex":
        a = _complex(a)
    return lax_schur(a)


def _rotation(n, m, g00, g01, g10, g11, dtype):
    """The identity ``n × n`` with the block ``[[g00, g01], [g10, g11]]`` at rows and
    columns ``m-1, m`` (entries of shape ``(...)``)."""
    rest = np.eye(n, dtype=dtype)
    rest[m - 1:m + 1, m - 1:m + 1] = 0
    out = _on(g00, rest)
    for (i, j), g in zip(((m - 1, m - 1), (m - 1, m), (m, m - 1), (m, m)), (g00, g01, g10, g11)):
        out = out + g[..., None, None] * _on(g, _at(n, i, j).astype(dtype))
    return out


def _at(n, i, j):
    mask = np.zeros((n, n), dtype=bool)
    mask[i, j] = True
    return mask


def rsf2csf(T, Z, check_finite=True):  # noqa: N803 - SciPy's names
    """``scipy.linalg.rsf2csf`` (JAX's ``jax.scipy.linalg.rsf2csf``): the complex Schur
    form ``(T', Z')`` of a real Schur form ``(T, Z)``: for ``m = n-1, ..., 1`` where
    ``|T[m, m-1]| > eps (|T[m-1, m-1]| + |T[m, m]|)`` a Givens rotation
    ``G = [[c̄, s], [-s, c]]``, ``(c, s) = (μ, T[m, m-1]) / ‖(μ, T[m, m-1])‖`` with
    ``μ`` the first eigenvalue of the 2×2 block minus ``T[m, m]``, is applied to rows
    ``m-1, m`` of ``T`` (columns ``≥ m-1``), to its columns (rows ``≤ m``) and to
    ``Z``'s columns; then ``T[m, m-1] = 0``. Batch dims of ``T`` and ``Z`` broadcast."""
    t = _complex(_square(T, "rsf2csf", "T"))
    z = _complex(_square(Z, "rsf2csf", "Z"))
    n = core.shape_of(t)[-1]
    if core.shape_of(z)[-1] != n:
        raise ShapeError(f"rsf2csf: T {core.shape_of(t)} and Z {core.shape_of(z)} must have one matrix size")
    dtype = np.result_type(core.dtype_of(t), core.dtype_of(z))
    lead = _lead(t, z)
    t = broadcast_to(astype(t, dtype), lead + (n, n))
    z = broadcast_to(astype(z, dtype), lead + (n, n))
    eps = np.finfo(dtype).eps
    cols_from = _on(t, np.arange(n)[None, :])
    rows_to = _on(t, np.arange(n)[:, None])
    for m in range(n - 1, 0, -1):
        block = t[..., m - 1:m + 1, m - 1:m + 1]
        mu = np_linalg.eigvals(block)[..., 0] - t[..., m, m]
        sub = t[..., m, m - 1]
        r = sqrt(abs(mu) ** 2 + abs(sub) ** 2)
        rotate = abs(sub) > eps * (abs(t[..., m - 1, m - 1]) + abs(t[..., m, m]))
        r = astype(where(rotate, r, 1), dtype)
        c, s = where(rotate, mu / r, 1), where(rotate, sub / r, 0)
        g = _rotation(n, m, c.conj(), s, -s, c, dtype)
        t = where(cols_from >= m - 1, matmul(g, t), t)
        t = where(rows_to < m + 1, matmul(t, _adjoint(g)), t)
        z = matmul(z, _adjoint(g))
        t = where(_on(t, _at(n, m, m - 1)), 0, t)
    return t, z


# ---------------------------------------------------------------------------------------
# sqrtm, funm
# ---------------------------------------------------------------------------------------


def _sqrtm_triu(t):
    """The upper triangular square root ``U`` (``U² = T``) of upper triangular ``T``
    (Björck and Hammarling), one superdiagonal at a time: with ``U`` known on the
    diagonals below offset ``k``, ``(U U)[i, i+k]`` is the sum over the known entries,
    and ``U[i, i+k] = (T[i, i+k] − (U U)[i, i+k]) / (U[i, i] + U[i+k, i+k])``, 0 where
    the numerator is 0 (JAX's rule for zero eigenvalues)."""
    n = core.shape_of(t)[-1]
    d = sqrt(diagonal(t, 0, -2, -1))
    u = _diag_embed(d)
    denominator = d[..., :, None] + d[..., None, :]
    for k in range(1, n):
        mask = _offset_mask(t, n, k)
        numerator = t - matmul(u, u)
        value = where(numerator == 0, 0, numerator / where(mask & (numerator != 0), denominator, 1))
        u = u + where(mask, value, 0)
    return u


def sqrtm(A, blocksize=1):  # noqa: N803 - SciPy's name
    """``scipy.linalg.sqrtm`` (JAX's ``jax.scipy.linalg.sqrtm``): the principal square
    root ``X`` (``X² = A``) of each square matrix of a stack, by the complex Schur method
    (``A = Z T Zᴴ``, ``X = Z √T Zᴴ``, ``√T`` by Björck and Hammarling's recurrence);
    complex, as JAX's. Differentiable by autograd's rule, ``dX = solve_sylvester(X, X, dA)``
    (NOTE [sqrtm differentiated by a Sylvester equation]; JAX's has no derivative).
    ``blocksize > 1`` raises (JAX's too)."""
    if blocksize > 1:
        raise NotImplementedError("sqrtm: blocksize > 1 (the blocked algorithm) is not implemented (as in JAX)")
    return _sqrtm(_square(A, "sqrtm", "A"))


# NOTE [sqrtm differentiated by a Sylvester equation]
# schur has no derivative rule (neither has JAX's), so sqrtm carries its own (autograd's):
# X = sqrtm(A) satisfies X X = A, so X dX + dX X = dA and dX = solve_sylvester(X, X, dA), the
# Sylvester primitive (NOTE [the Sylvester solve as a primitive]), whose rules give every
# higher order and every composition of modes. It exists where no two eigenvalues of X add
# to 0: for the principal root, where A has no zero eigenvalue (NaN otherwise).
@custom_jvp
def _sqrtm(a):
    t, z = lax_schur(_complex(a))
    return matmul(matmul(z, _sqrtm_triu(t)), _adjoint(z))


@_sqrtm.defjvp
def _sqrtm_jvp(primals, tangents):
    (a,), (da,) = primals, tangents
    x = _sqrtm(a)
    return x, solve_sylvester(x, x, da)


def _parlett(f, t):
    """Golub and Van Loan's algorithm 11.1.1 (Parlett's recurrence) for ``F = f(T)``,
    ``T`` upper triangular, one superdiagonal at a time: with ``F`` known below offset
    ``k``, ``F[i, j] = (T F − F T)[i, j] / (T[j, j] − T[i, i])`` (left undivided where
    the eigenvalues coincide, as SciPy and JAX). Also the smallest ``|T[j, j] − T[i, i]|``
    (and ``|T[0, 0]|``)."""
    n = core.shape_of(t)[-1]
    d = diagonal(t, 0, -2, -1)
    gap = d[..., None, :] - d[..., :, None]  # T[j, j] − T[i, i]
    min_gap = abs(t[..., 0, 0])
    for k in range(1, n):
        mask = _offset_mask(t, n, k)
        s = matmul(t, f) - matmul(f, t)
        safe = where(mask & (gap != 0), gap, 1)
        f = f + where(mask, s / safe, 0)
        min_gap = minimum(min_gap, min(where(mask, abs(gap), np.inf), axis=(-2, -1)))
    return f, min_gap


def funm(A, func, disp=True):  # noqa: N803 - SciPy's name
    """``scipy.linalg.funm`` (JAX's ``jax.scipy.linalg.funm``): ``f(A)`` for the scalar
    function ``func`` (applied to an array of eigenvalues) by the Schur–Parlett method:
    ``A = Z T Zᴴ`` (complex Schur form; of a real ``A``, its real Schur form through
    :func:`rsf2csf`, as JAX), ``f(T)`` by Parlett's recurrence, ``Z f(T) Zᴴ``;
    complex, as JAX's. Needs distinct eigenvalues (where two coincide the result is
    inaccurate, as SciPy's). ``disp=False`` returns ``(F, err)`` with SciPy's error
    estimate ``min(1, max(eps, eps / min_gap · ‖triu(T, 1)‖₁))``."""
    a = _square(A, "funm", "A")
    # real Schur form, then complex (as JAX and SciPy): a real eigenvalue keeps a zero
    # imaginary part, so ``func``'s branch cut sees the sign SciPy's does
    t, z = rsf2csf(*lax_schur(a)) if kind_of(core.dtype_of(a)) != "c" else lax_schur(a)
    f = _diag_embed(astype(func(diagonal(t, 0, -2, -1)), core.dtype_of(t)))
    f, min_gap = _parlett(f, t)
    f = matmul(matmul(z, f), _adjoint(z))
    if disp:
        return f
    eps = np.finfo(core.dtype_of(f)).eps
    min_gap = where(min_gap == 0, eps, min_gap)
    strict = where(_on(t, np.triu(np.ones(core.shape_of(t)[-2:], dtype=bool), 1)), t, 0)
    norm1 = np_linalg.norm(strict, 1, axis=(-2, -1))
    err = where(any(isinf(f), axis=(-2, -1)), np.inf, minimum(1, maximum(eps, eps / min_gap * norm1)))
    return f, err


# ---------------------------------------------------------------------------------------
# solve_sylvester
# ---------------------------------------------------------------------------------------


def solve_sylvester(A, B, C, *, method="schur", tol=1e-8):  # noqa: N803 - SciPy's names
    """``scipy.linalg.solve_sylvester`` (JAX's ``jax.scipy.linalg.solve_sylvester``):
    ``X`` with ``A X + X B = C`` for stacks ``A`` ``(..., m, m)``, ``B`` ``(..., n, n)``,
    ``C`` ``(..., m, n)`` (batch dims broadcast). ``method='schur'``: Bartels–Stewart,
    ``A = U R Uᴴ``, ``Bᴴ = V S Vᴴ`` (complex Schur forms), ``R Y + Y Sᴴ = Uᴴ C V`` by
    back substitution over the columns, ``X = U Y Vᴴ``; ``method='eigen'``:
    ``A = P diag(a) P⁻¹``, ``B = Q diag(b) Q⁻¹``, ``X = P ((P⁻¹ C Q) / (a_i + b_j)) Q⁻¹``.
    Real for real ``C``. NaN where some ``|a_i + b_j| < tol`` (no unique solution, as
    JAX). Differentiable in ``A``, ``B`` and ``C``, to any order: the Schur method is the
    primitive :func:`cuvmap.lax.linalg_sylvester.sylvester` with the rule
    ``A dX + dX B = dC − dA X − X dB`` (autograd's; JAX's Schur method has none), the eigen
    method a composite over ``eig``."""
    if method not in ("schur", "eigen"):
        raise ValueError(f'solve_sylvester: unrecognized method {method!r}; the two valid methods are "schur" '
                         'and "eigen"')
    a, b = _square(A, "solve_sylvester", "A"), _square(B, "solve_sylvester", "B")
    c = _inexact(C, "solve_sylvester")
    m, n = core.shape_of(c)[-2:] if len(core.shape_of(c)) >= 2 else (None, None)
    if m is None or core.shape_of(a)[-1] != m or core.shape_of(b)[-1] != n:
        raise ShapeError(f"solve_sylvester: incompatible shapes A {core.shape_of(a)}, B {core.shape_of(b)}, "
                         f"C {core.shape_of(c)} (needs (..., m, m), (..., n, n), (..., m, n))")
    dtype = np.result_type(core.dtype_of(a), core.dtype_of(b), core.dtype_of(c))
    lead = _lead(a, b, c)
    a = broadcast_to(astype(a, dtype), lead + (m, m))
    b = broadcast_to(astype(b, dtype), lead + (n, n))
    c = broadcast_to(astype(c, dtype), lead + (m, n))
    if method == "schur":
        return lax_sylvester(a, b, c, tol=tol)
    wa, pa = np_linalg.eig(a)
    wb, pb = np_linalg.eig(b)
    f = np_linalg.solve(pa, matmul(_complex(c), pb))
    x = matmul(f / (wa[..., :, None] + wb[..., None, :]), np_linalg.inv(pb))
    x = matmul(pa, x)
    if kind_of(np.dtype(dtype)) != "c":
        x = x.real
    wa, wb = np_linalg.eigvals(a), np_linalg.eigvals(b)
    singular = any(abs(wa[..., :, None] + wb[..., None, :]) < tol, axis=(-2, -1))
    return where(singular[..., None, None], np.nan, x)
