"""``scipy.linalg``'s functions on arrays and tracers, as ``jax.scipy.linalg`` has them:
``solve_triangular``, ``cho_factor``, ``cho_solve``, ``lu_factor``, ``lu_solve``, ``lu``,
``expm``, and ``inv``, ``det``, ``solve`` (those of :mod:`cuvmap.numpy.linalg`). Each
takes stacks of matrices ``(..., n, n)`` (one batched call per stack) and is
differentiable and batchable through the primitives of ``cuvmap/lax/linalg_solve.py`` and
``cuvmap/lax/linalg_decompositions.py``.

    from cuvmap.scipy import linalg as sla
    c = sla.cho_factor(a); x = sla.cho_solve(c, b)
"""
import builtins

import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapeError
from cuvmap.lax.elementwise import complex_numbers as complex_parts  # real, conj
from cuvmap.lax import elementwise as ew
from cuvmap.lax import linalg_decompositions as lax_decomp
from cuvmap.lax import linalg_solve as lax_solve
from cuvmap.lax import shape as lax_shape
from cuvmap.lax.linalg_common import _mH, tril, triu
from cuvmap.numpy import linalg as np_linalg
from cuvmap.numpy._common import ndim, shape
from cuvmap.numpy._elementwise import astype, where
from cuvmap.numpy._indexing import take_along_axis
from cuvmap.numpy._products import matmul
from cuvmap.numpy._reductions import argsort, max, sum
from cuvmap.numpy._shapes import broadcast_to, squeeze, swapaxes
from cuvmap.scipy.linalg_matrix_functions import (  # noqa: F401  (issue 32: the Schur-based functions)
    funm, rsf2csf, schur, solve_sylvester, sqrtm,
)
from cuvmap.scipy.linalg_reductions import hessenberg, qr_multiply  # noqa: F401  (issue 32)
# the special matrices and SciPy's spellings of qr, svd and polar (their own modules)
from cuvmap.scipy.linalg_factorizations import polar, qr, svd
from cuvmap.scipy.linalg_banded import solve_banded  # noqa: F401  (SciPy's/autograd's name)
from cuvmap.scipy.linalg_special_matrices import (
    block_diag, circulant, companion, convolution_matrix, dft, fiedler, fiedler_companion, hadamard, hankel, helmert,
    hilbert, invhilbert, invpascal, leslie, pascal, toeplitz)
from cuvmap.core.bfloat16 import kind_of

__all__ = ["cho_factor", "cho_solve", "det", "expm", "inv", "lu", "lu_factor", "lu_solve", "solve",
           "solve_triangular", "cholesky", "eigh",
           "expm_frechet", "funm", "rsf2csf", "schur", "solve_sylvester", "sqrtm", "hessenberg", "qr_multiply"]

# the special matrices, qr, svd and polar (cuvmap/scipy/linalg_special_matrices.py, linalg_factorizations.py)
__all__ += ["block_diag", "circulant", "companion", "convolution_matrix", "dft", "fiedler", "fiedler_companion",
            "hadamard", "hankel", "helmert", "hilbert", "invhilbert", "invpascal", "leslie", "pascal", "polar", "qr",
            "svd", "toeplitz"]
__all__ += ["solve_banded"]  # SciPy's/autograd's (cuvmap/scipy/linalg_banded.py)


def _mT(x):
    return swapaxes(x, -1, -2)


def _square(a, name):
    a = np_linalg._as_inexact(a)
    s = shape(a)
    if len(s) < 2 or s[-1] != s[-2]:
        raise ShapeError(f"{name}: a must be a square matrix or a stack of them (..., n, n), got shape {s}")
    return a


def _rhs(a, b, name):
    """``b`` as a stack of matrices matching ``a`` (leading dims broadcast), and whether it
    was a (stack of) vector(s): ``b`` ``(n,)``, or ``(..., n)`` with one dim fewer than ``a``
    (JAX's rule: ``b`` ``(n, k)`` beside ``a`` ``(batch, n, n)`` is one matrix when ``k ≠ n``)."""
    b = np_linalg._as_inexact(b)
    n = shape(a)[-1]
    vector = ndim(b) == 1 or (ndim(b) == ndim(a) - 1 and shape(b)[-1] == n)
    if vector:
        b = lax_shape.expand_dims(b, (ndim(b),))
    if ndim(b) < 2 or shape(b)[-2] != n:
        raise ShapeError(f"{name}: b {shape(b)} does not match a {shape(a)} (needs (..., {n}) or (..., {n}, k))")
    lead = ew.broadcast_shapes(shape(a)[:-2], shape(b)[:-2])
    dtype = np.result_type(core.dtype_of(a), core.dtype_of(b))
    a = broadcast_to(a if core.dtype_of(a) == dtype else astype(a, dtype), lead + shape(a)[-2:])
    b = broadcast_to(b if core.dtype_of(b) == dtype else astype(b, dtype), lead + shape(b)[-2:])
    return a, b, vector


def _unvector(x, vector):
    return squeeze(x, (ndim(x) - 1,)) if vector else x


def _transpose_flag(trans, a, name):
    if trans in (0, "N"):
        return False
    if trans in (1, "T"):
        return True
    if trans in (2, "C"):  # (the callers conjugate a complex matrix: _conjugated_for)
        return True
    raise ValueError(f"{name}: trans must be 0, 1, 2, 'N', 'T' or 'C', got {trans!r}")


def _conjugated_for(trans, a):
    """``conj(a)`` where ``trans`` is 2/``'C'`` and ``a`` complex (``op(a) = aᴴ``), else ``a``."""
    return complex_parts.conj(a) if trans in (2, "C") and kind_of(core.dtype_of(a)) == "c" else a


def solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False, overwrite_b=False, debug=None,
                     check_finite=True):
    """``scipy.linalg.solve_triangular`` (JAX's ``jax.scipy.linalg.solve_triangular``):
    ``x`` with ``op(a) x = b``, reading only the ``lower`` (else upper) triangle of ``a``
    (its diagonal taken as ones with ``unit_diagonal``); ``trans`` 0/``'N'``: ``op(a) = a``,
    1/``'T'``: ``aᵀ``, 2/``'C'``: ``aᴴ``. ``b`` ``(..., n)`` or ``(..., n, k)``;
    leading dims broadcast. ``overwrite_b``, ``debug`` and ``check_finite`` are accepted and
    ignored (as in JAX). Derivatives: ``dx = op(a)⁻¹ (db − op(da) x)`` with ``da`` masked to
    the triangle read."""
    a = _square(a, "solve_triangular")
    transpose_a = _transpose_flag(trans, a, "solve_triangular")
    a = _conjugated_for(trans, a)
    a, b, vector = _rhs(a, b, "solve_triangular")
    x = lax_solve.triangular_solve_left(a, b, lower=bool(lower), transpose_a=transpose_a,
                                   unit_diagonal=bool(unit_diagonal))
    return _unvector(x, vector)


def cho_factor(a, lower=False, overwrite_a=False, check_finite=True):
    """``scipy.linalg.cho_factor``: ``(c, lower)`` with ``c`` the Cholesky factor of the
    symmetric (complex: Hermitian) matrix whose ``lower`` (else upper) triangle is ``a``'s:
    ``a = c cᴴ`` for ``lower``, ``a = cᴴ c`` otherwise; the other triangle of ``c`` is zero
    (as in JAX; SciPy leaves whatever was there). NaN where ``a`` is not positive definite."""
    a = _square(a, "cho_factor")
    full = ew.add(tril(a), _mH(tril(a, -1))) if lower else ew.add(triu(a), _mH(triu(a, 1)))
    factor = lax_decomp.cholesky(full)
    return (factor if lower else _mH(factor)), bool(lower)


def cholesky(a, lower=False, overwrite_a=False, check_finite=True):
    """``jax.scipy.linalg.cholesky``: the Cholesky factor of the symmetric (complex:
    Hermitian) matrix whose ``lower`` (else upper) triangle is ``a``'s: lower ``L`` with
    ``a = L Lᴴ``, or, by default, upper ``U`` with ``a = Uᴴ U`` (SciPy's default; the other
    triangle is zero). NaN where the matrix is not positive definite."""
    return cho_factor(a, lower)[0]


def eigh(a, b=None, lower=True, eigvals_only=False, overwrite_a=False, overwrite_b=False, turbo=True,
         eigvals=None, type=1, check_finite=True):  # noqa: A002 - SciPy's name
    """``jax.scipy.linalg.eigh``: ``(w, v)`` with ``a v = v diag(w)``, ``w`` ascending, of the
    symmetric (complex: Hermitian) matrix whose ``lower`` (else upper) triangle is ``a``'s
    (the other triangle is not read, and gets no derivative); ``w`` only with
    ``eigvals_only``. The generalized problem (``b``), ``eigvals`` subsets and ``type`` other
    than 1 raise ``NotImplementedError``, as in JAX."""
    if b is not None or eigvals is not None or type != 1:
        raise NotImplementedError("eigh: only the standard eigenproblem is supported (b=None, eigvals=None, type=1),"
                                  " as in JAX")
    a = _square(a, "eigh")
    full = ew.add(tril(a), _mH(tril(a, -1))) if lower else ew.add(triu(a), _mH(triu(a, 1)))
    w, v = np_linalg.eigh(full, symmetrize_input=False)
    return w if eigvals_only else (w, v)


def cho_solve(c_and_lower, b, overwrite_b=False, check_finite=True):
    """``scipy.linalg.cho_solve``: ``x`` with ``a x = b`` from ``(c, lower) = cho_factor(a)``:
    two triangular solves."""
    c, lower = c_and_lower
    c = _square(c, "cho_solve")
    c, b, vector = _rhs(c, b, "cho_solve")
    c_conj = complex_parts.conj(c) if kind_of(core.dtype_of(c)) == "c" else c  # (solves with cᴴ: conj(c)ᵀ)
    if lower:  # L Lᴴ x = b
        y = lax_solve.triangular_solve_left(c, b, lower=True)
        x = lax_solve.triangular_solve_left(c_conj, y, lower=True, transpose_a=True)
    else:  # Uᴴ U x = b
        y = lax_solve.triangular_solve_left(c_conj, b, lower=False, transpose_a=True)
        x = lax_solve.triangular_solve_left(c, y, lower=False)
    return _unvector(x, vector)


def lu_factor(a, overwrite_a=False, check_finite=True):
    """``scipy.linalg.lu_factor``: ``(lu, piv)``: ``L`` (unit diagonal implied) below the
    diagonal of ``lu`` and ``U`` on and above it, ``piv`` LAPACK's 0-based row interchanges
    (int32). Square matrices (stacks of them). Derivatives: JAX's LU rule (NOTE [lu's
    packed output] in ``cuvmap/lax/linalg_solve.py``)."""
    lu_, pivots, _ = lax_solve.lu(_square(a, "lu_factor"))
    return lu_, pivots


def _permutation_matrix(perm, dtype, like):
    """``P`` with ``P[i, perm[i]] = 1`` (so ``P a`` takes the rows ``a[perm]``)."""
    n = shape(perm)[-1]
    cols = backend.xp_of(like).arange(n)
    return astype(ew.eq(lax_shape.expand_dims(perm, (ndim(perm),)), cols), dtype)


def lu_solve(lu_and_piv, b, trans=0, overwrite_b=False, check_finite=True):
    """``scipy.linalg.lu_solve``: ``x`` with ``op(a) x = b`` from ``(lu, piv) =
    lu_factor(a)``; ``trans`` as in :func:`solve_triangular`."""
    lu_, piv = lu_and_piv
    lu_ = _square(lu_, "lu_solve")
    transpose_a = _transpose_flag(trans, lu_, "lu_solve")
    lu_ = _conjugated_for(trans, lu_)  # (Uᴴ Lᴴ P x = b: the 'T' solves of conj(L U))
    n = shape(lu_)[-1]
    perm = lax_solve.lu_pivots_to_permutation(piv, n)
    lu_, b, vector = _rhs(lu_, b, "lu_solve")
    perm = broadcast_to(perm, shape(b)[:-2] + (n,))
    index = broadcast_to(lax_shape.expand_dims(perm, (ndim(perm),)), shape(b))
    if not transpose_a:  # L U x = P b
        y = lax_solve.triangular_solve_left(lu_, take_along_axis(b, index, -2), lower=True, unit_diagonal=True)
        x = lax_solve.triangular_solve_left(lu_, y, lower=False)
    else:  # Uᵀ Lᵀ P x = b
        z = lax_solve.triangular_solve_left(lu_, b, lower=False, transpose_a=True)
        w = lax_solve.triangular_solve_left(lu_, z, lower=True, transpose_a=True, unit_diagonal=True)
        inverse = broadcast_to(lax_shape.expand_dims(argsort(perm, -1), (ndim(perm),)), shape(b))
        x = take_along_axis(w, inverse, -2)
    return _unvector(x, vector)


def lu(a, permute_l=False, overwrite_a=False, check_finite=True):
    """``scipy.linalg.lu``: ``(p, l, u)`` with ``a = p @ l @ u`` (``p`` a permutation matrix,
    ``l`` unit lower triangular, ``u`` upper triangular), or ``(p @ l, u)`` with
    ``permute_l``. Square matrices (stacks of them)."""
    a = _square(a, "lu")
    lu_, _, perm = lax_solve.lu(a)
    n = shape(a)[-1]
    l_mat = ew.add(tril(lu_, -1), backend.xp_of(a).eye(n, dtype=core.dtype_of(a)))
    u_mat = triu(lu_)
    p = _mT(_permutation_matrix(perm, core.dtype_of(a), a))
    return (matmul(p, l_mat), u_mat) if permute_l else (p, l_mat, u_mat)


# NOTE [expm by scaling and squaring]
# expm(A) = r(A / 2ˢ)^(2ˢ) with r the [13/13] Padé approximant of exp (Higham 2005, "The
# scaling and squaring method for the matrix exponential revisited"): r = (V − U)⁻¹ (V + U)
# with U the odd and V the even part of the numerator polynomial, and s = max(0,
# ⌈log₂(‖A‖₁ / θ₁₃)⌉), θ₁₃ = 5.37, chosen per matrix so that the Padé error is below double
# precision. Everything is a composite of differentiable primitives (products, one solve),
# so the derivative is autodiff through the Padé approximant and the squarings: the
# Fréchet derivative of this approximation, accurate to the same precision. s is a
# piecewise-constant function of A (no derivative); each matrix of a stack (or of a vmap)
# gets its own s by squaring ``where(step < s, X @ X, X)`` as many times as the largest s
# needs (``max_squarings`` under jit, where that is unknown: JAX's bound, 16).

_PADE13 = (64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0, 129060195264000.0,
           10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0, 40840800.0, 960960.0, 16380.0, 182.0, 1.0)
_THETA13 = 5.371920351148152


def _squarings_needed(a, max_squarings):
    """How many squarings the largest matrix of ``a`` needs, where ``a``'s value is known
    (outside jit); ``max_squarings`` otherwise."""
    value = backend.concrete(a)
    # a staged value has no value: its witness is an empty array (NOTE [a staged value has
    # a device but no value] in cuvmap/transforms/staging.py)
    if isinstance(value, core.Tracer) or not hasattr(value, "dtype") or value.size < int(np.prod(shape(a))):
        return max_squarings
    xp = backend.xp_of(value)
    total = float(xp.abs(value).sum())  # bounds every ‖A_i‖₁ of the stack (any vmap layout)
    if not np.isfinite(total):
        return max_squarings
    return int(min(max_squarings, builtins.max(0.0, np.ceil(np.log2(total / _THETA13)) if total > 0 else 0.0)))


def expm(A, *, upper_triangular=False, max_squarings=16):  # noqa: N803 - SciPy's name
    """``scipy.linalg.expm`` (JAX's ``jax.scipy.linalg.expm``): the matrix exponential
    ``Σ Aᵏ/k!`` of each square matrix of a stack, by Padé approximation with scaling and
    squaring (NOTE [expm by scaling and squaring]). Differentiable (autodiff through the
    Padé approximant); ``upper_triangular`` is accepted (no shortcut is taken)."""
    a = _square(A, "expm")
    n = shape(a)[-1]
    eye = broadcast_to(backend.xp_of(a).eye(n, dtype=core.dtype_of(a)), shape(a))
    norm1 = ew.stop_gradient(max(sum(ew.abs(a), -2), -1))  # ‖A‖₁ per matrix
    s = ew.max(ew.ceil(ew.log2(ew.div(ew.max(norm1, 1e-300), _THETA13))), 0)
    scale = lax_shape.expand_dims(ew.pow(2.0, ew.neg(s)), (ndim(s), ndim(s) + 1))
    x = ew.mul(a, astype(scale, core.dtype_of(a)))
    b = _PADE13
    x2 = matmul(x, x)
    x4 = matmul(x2, x2)
    x6 = matmul(x4, x2)
    u_inner = ew.add(matmul(x6, ew.add(ew.add(ew.mul(x6, b[13]), ew.mul(x4, b[11])), ew.mul(x2, b[9]))),
                     ew.add(ew.add(ew.add(ew.mul(x6, b[7]), ew.mul(x4, b[5])), ew.mul(x2, b[3])), ew.mul(eye, b[1])))
    u = matmul(x, u_inner)
    v = ew.add(matmul(x6, ew.add(ew.add(ew.mul(x6, b[12]), ew.mul(x4, b[10])), ew.mul(x2, b[8]))),
               ew.add(ew.add(ew.add(ew.mul(x6, b[6]), ew.mul(x4, b[4])), ew.mul(x2, b[2])), ew.mul(eye, b[0])))
    r = lax_solve.solve(ew.sub(v, u), ew.add(v, u))
    s_mat = lax_shape.expand_dims(s, (ndim(s), ndim(s) + 1))
    for step in range(_squarings_needed(a, max_squarings)):
        r = where(ew.lt(step, s_mat), matmul(r, r), r)
    return r


def expm_frechet(A, E, *, method=None, compute_expm=True):  # noqa: N803 - SciPy's names
    """``scipy.linalg.expm_frechet`` (JAX's ``jax.scipy.linalg.expm_frechet``): the
    Fréchet derivative ``L(A, E) = d/dt expm(A + t E)`` at ``t = 0``, from the block
    identity ``expm([[A, E], [0, A]]) = [[expm(A), L(A, E)], [0, expm(A)]]``; returns
    ``(expm(A), L)``, or ``L`` alone with ``compute_expm=False``. Differentiable (through
    :func:`cuvmap.scipy.linalg.expm`). ``method`` is accepted for SciPy's signature."""
    if method not in (None, "SPS", "blockEnlarge"):
        raise ValueError(f"expm_frechet: unknown method {method!r} (SciPy's are 'SPS' and 'blockEnlarge')")
    a, e = _square(A, "expm_frechet"), _square(E, "expm_frechet")
    if shape(a) != shape(e):
        raise ShapeError(f"expm_frechet: A {shape(a)} and E {shape(e)} must have one shape")
    dtype = np.result_type(core.dtype_of(a), core.dtype_of(e))
    a, e = astype(a, dtype), astype(e, dtype)
    n = shape(a)[-1]
    upper = lax_shape.concatenate([a, e], ndim(a) - 1)
    lower = lax_shape.concatenate([ew.mul(a, 0), a], ndim(a) - 1)
    out = expm(lax_shape.concatenate([upper, lower], ndim(a) - 2))
    frechet = out[..., :n, n:]
    return (out[..., :n, :n], frechet) if compute_expm else frechet


def inv(a, overwrite_a=False, check_finite=True):
    """``scipy.linalg.inv``: :func:`cuvmap.numpy.linalg.inv`."""
    return np_linalg.inv(a)


def det(a, overwrite_a=False, check_finite=True):
    """``scipy.linalg.det``: :func:`cuvmap.numpy.linalg.det`."""
    return np_linalg.det(a)


def solve(a, b, lower=False, overwrite_a=False, overwrite_b=False, check_finite=True, assume_a="gen"):
    """``scipy.linalg.solve``: ``x`` with ``a x = b`` (``b`` ``(n,)`` or ``(n, k)``), by
    :func:`cuvmap.numpy.linalg.solve`. As SciPy, ``assume_a='sym'`` reads only the
    ``lower`` (else upper) triangle of ``a`` and mirrors it, ``'her'`` and ``'pos'`` mirror
    its conjugate; ``'gen'`` reads all of ``a``."""
    kinds = {"gen": "gen", "general": "gen", "sym": "sym", "symmetric": "sym", "her": "her", "hermitian": "her",
             "pos": "her", "positive definite": "her"}
    if assume_a not in kinds:
        raise ValueError(f"solve: assume_a must be one of {sorted(kinds)}, got {assume_a!r}")
    kind = kinds[assume_a]
    if kind != "gen":
        a = _square(a, "solve")
        half = tril(a, -1) if lower else triu(a, 1)
        mirrored = _mT(complex_parts.conj(half) if kind == "her" and kind_of(core.dtype_of(a)) == "c" else half)
        diag = tril(triu(a))
        if kind == "her":
            diag = complex_parts.real(diag) if kind_of(core.dtype_of(a)) == "c" else diag
            diag = astype(diag, core.dtype_of(a))
        a = ew.add(ew.add(half, mirrored), diag)
    return np_linalg.solve(a, b)
