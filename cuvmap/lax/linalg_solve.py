"""Linear systems and determinants of stacks of square matrices: ``solve``,
``triangular_solve``, ``lu`` (with ``lu_pivots_to_permutation``), ``det`` (with
``adjugate``, its derivative) and ``slogdet``. Shared helpers: ``linalg_common.py``.

Real and complex dtypes are accepted by all. These functions are holomorphic (but for
``slogdet``'s two parts, NOTE [slogdet of complex matrices]), so their JVPs are
complex-linear in the tangent and their VJPs are the plain transposes (no conjugation:
JAX's convention, NOTE [complex derivatives follow JAX], stated once for the
linear-algebra family in ``cuvmap/numpy/linalg.py``).
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.indexing import slice_in_dim
from cuvmap.lax.linalg_common import (
    _mm, _mT, batch_front, check_matrix, eye_like, is_complex, scalar_times, trace, tril, triu,
)
from cuvmap.lax.reduction import reduce_sum
from cuvmap.lax.shape import broadcast_to, concatenate, expand_dims, squeeze
from cuvmap.transforms import batching, complex_rules, jvp, vjp
from cuvmap.core.bfloat16 import kind_of


# =======================================================================================
# solve: x = a⁻¹ b
# =======================================================================================

solve_p = Primitive("solve", owns_output=True, capturable=False)


def solve(a, b):
    """``x`` with ``a @ x = b`` for stacks ``a`` ``(..., n, n)``, ``b`` ``(..., n, k)`` of
    the same leading dims (LU with partial pivoting: LAPACK's gesv, cuSOLVER's getrf/getrs).

    Derivatives: ``dx = a⁻¹ (db − da x)``; the cotangents are ``b̄ = a⁻ᵀ x̄`` and
    ``ā = −b̄ xᵀ`` (plain transposes for complex operands, JAX's convention). A singular
    ``a`` gives inf or NaN, as in JAX, instead of an exception.
    """
    return solve_p.bind(a, b)


def _solve_shape_rule(a, b):
    check_matrix("solve", a, square=True)
    check_matrix("solve", b)
    if a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"solve: a {a.shape} and b {b.shape} must be (..., n, n) and (..., n, k)")
    return ShapedArray(b.shape, np.result_type(a.dtype, b.dtype))


def _solve_impl(a, b):
    xp = backend.xp_of(a, b)
    dtype = np.result_type(a.dtype, b.dtype)
    a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
    try:
        return xp.linalg.solve(a, b)
    except np.linalg.LinAlgError:  # an exactly singular matrix: the LU's inf and NaN, as JAX
        packed = _lu_impl(a)
        return _lu_solve_arrays(packed, b)


def _solve_batch(axis_size, vals, dims):
    return solve(*batch_front(axis_size, vals, dims)), 0


def _solve_jvp_a(t, out, a, b):
    return ew.neg(solve(a, _mm(t, out)))


def _solve_jvp_b(t, out, a, b):
    return solve(a, t)


def _solve_vjp_b(ct, out, a, b):
    return solve(_mT(a), ct)


def _solve_vjp_a(ct, out, a, b):
    return ew.neg(_mm(solve(_mT(a), ct), _mT(out)))


solve_p.impl = _solve_impl
solve_p.shape_rule = _solve_shape_rule
batching.primitive_batchers[solve_p] = _solve_batch
jvp.defjvp(solve_p, _solve_jvp_a, _solve_jvp_b)
vjp.defvjp(solve_p, _solve_vjp_a, _solve_vjp_b)


# =======================================================================================
# triangular_solve: x = op(a)⁻¹ b for a triangular a
# =======================================================================================

triangular_solve_p = Primitive("triangular_solve", owns_output=True, capturable=False)


def triangular_solve(a, b, *, left_side=False, lower=False, transpose_a=False, conjugate_a=False,
                     unit_diagonal=False):
    """JAX's ``lax.linalg.triangular_solve``: ``x`` with ``op(a) @ x = b`` (``left_side``) or
    ``x @ op(a) = b``, ``op(a)`` = ``a``, or ``aᵀ`` with ``transpose_a``, reading only the
    ``lower`` (else upper) triangle of ``a`` (ones on its diagonal with ``unit_diagonal``).
    ``a`` ``(..., n, n)``; ``b`` ``(..., n, k)`` (left side) or ``(..., k, n)``, or a
    vector ``(..., n)`` (one column or row).
    ``conjugate_a`` solves with ``conj(a)`` (``aᴴ`` with ``transpose_a``; nothing changes for
    a real ``a``), differentiable through ``conj``. The right-side solve is the transpose of
    the left-side one: :func:`triangular_solve_left`."""
    if conjugate_a and is_complex(a):
        a = ew.conj(a)
    nd = len(core.shape_of(b))
    if nd == len(core.shape_of(a)) - 1:  # a vector b (..., n), as JAX: a column (left) or a row
        axis = nd if left_side else nd - 1
        x = triangular_solve(a, expand_dims(b, (axis,)), left_side=left_side, lower=lower, transpose_a=transpose_a,
                             unit_diagonal=unit_diagonal)
        return squeeze(x, (axis,))
    if left_side:
        return triangular_solve_left(a, b, lower=lower, transpose_a=transpose_a, unit_diagonal=unit_diagonal)
    # x op(a) = b  <=>  op(a)ᵀ xᵀ = bᵀ
    return _mT(triangular_solve_left(a, _mT(b), lower=lower, transpose_a=not transpose_a, unit_diagonal=unit_diagonal))


def triangular_solve_left(a, b, *, lower=True, transpose_a=False, unit_diagonal=False):
    """``x`` with ``op(a) @ x = b``, ``op(a) = aᵀ`` if ``transpose_a`` else ``a``, where only
    the ``lower`` (else upper) triangle of ``a`` is read and, with ``unit_diagonal``, its
    diagonal is taken as ones. ``a`` ``(..., n, n)``, ``b`` ``(..., n, k)``.

    This is JAX's ``lax.linalg.triangular_solve`` with ``left_side=True`` and
    ``conjugate_a=False`` (:func:`triangular_solve` transposes for the right side). Derivatives: ``dx = op(a)⁻¹ (db − op(da) x)`` with ``da`` masked to the
    triangle read; ``b̄ = op(a)⁻ᵀ x̄``, ``ā = −mask(op⁻¹(b̄ xᵀ))``.
    """
    return triangular_solve_p.bind(a, b, lower=bool(lower), transpose_a=bool(transpose_a),
                                   unit_diagonal=bool(unit_diagonal))


def _triangular_solve_shape_rule(a, b, *, lower, transpose_a, unit_diagonal):
    check_matrix("triangular_solve", a, square=True)
    check_matrix("triangular_solve", b)
    if a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"triangular_solve: a {a.shape} and b {b.shape} must be (..., n, n) and (..., n, k)")
    return ShapedArray(b.shape, np.result_type(a.dtype, b.dtype))


def _triangle_array(a, lower, unit_diagonal):
    """The triangle of the concrete ``a`` that the solve reads, as a full matrix."""
    xp = backend.xp_of(a)
    m = xp.tril(a) if lower else xp.triu(a)
    if unit_diagonal:
        n = a.shape[-1]
        m = m.copy()
        m[..., np.arange(n), np.arange(n)] = 1
    return m


def _substitute(m, b, lower):
    """Forward (``lower``) or back substitution, one row at a time over the whole stack:
    the path for exactly singular triangles (a zero on the diagonal), where LAPACK's solve
    raises and JAX's gives inf and NaN."""
    xp = backend.xp_of(m)
    n = m.shape[-1]
    x = xp.zeros(b.shape, dtype=np.result_type(m.dtype, b.dtype))
    order = range(n) if lower else range(n - 1, -1, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in order:
            acc = b[..., i, :] - xp.matmul(m[..., i, None, :], x)[..., 0, :]
            x[..., i, :] = acc / m[..., i, i, None]
    return x


def _triangular_solve_impl(a, b, *, lower, transpose_a, unit_diagonal):
    xp = backend.xp_of(a, b)
    dtype = np.result_type(a.dtype, b.dtype)
    m = _triangle_array(a.astype(dtype, copy=False), lower, unit_diagonal)
    if transpose_a:
        m, lower = xp.swapaxes(m, -1, -2), not lower
    try:
        return xp.linalg.solve(m, b.astype(dtype, copy=False))
    except np.linalg.LinAlgError:
        return _substitute(m, b.astype(dtype, copy=False), lower)


def _triangular_solve_batch(axis_size, vals, dims, **params):
    return triangular_solve_left(*batch_front(axis_size, vals, dims), **params), 0


def _mask_triangle(x, lower, unit_diagonal):
    """``x`` masked to the triangle a triangular solve reads (strict with a unit diagonal)."""
    k = (-1 if lower else 1) if unit_diagonal else 0
    return tril(x, k) if lower else triu(x, k)


def _op(x, transpose_a):
    return _mT(x) if transpose_a else x


def _triangular_solve_jvp_a(t, out, a, b, *, lower, transpose_a, unit_diagonal):
    dm = _op(_mask_triangle(t, lower, unit_diagonal), transpose_a)
    return ew.neg(triangular_solve_left(a, _mm(dm, out), lower=lower, transpose_a=transpose_a,
                                   unit_diagonal=unit_diagonal))


def _triangular_solve_jvp_b(t, out, a, b, **params):
    return triangular_solve_left(a, t, **params)


def _triangular_solve_vjp_b(ct, out, a, b, *, lower, transpose_a, unit_diagonal):
    return triangular_solve_left(a, ct, lower=lower, transpose_a=not transpose_a, unit_diagonal=unit_diagonal)


def _triangular_solve_vjp_a(ct, out, a, b, *, lower, transpose_a, unit_diagonal):
    ct_b = triangular_solve_left(a, ct, lower=lower, transpose_a=not transpose_a, unit_diagonal=unit_diagonal)
    ct_op = ew.neg(_mm(ct_b, _mT(out)))
    return _mask_triangle(_op(ct_op, transpose_a), lower, unit_diagonal)


triangular_solve_p.impl = _triangular_solve_impl
triangular_solve_p.shape_rule = _triangular_solve_shape_rule
batching.primitive_batchers[triangular_solve_p] = _triangular_solve_batch
jvp.defjvp(triangular_solve_p, _triangular_solve_jvp_a, _triangular_solve_jvp_b)
vjp.defvjp(triangular_solve_p, _triangular_solve_vjp_a, _triangular_solve_vjp_b)


# =======================================================================================
# lu: P a = L U with partial pivoting
# =======================================================================================

# NOTE [lu's packed output]
# ``lu_p(a)`` for square ``a`` ``(..., n, n)`` returns ``(..., n, n + 2)``: the first n
# columns hold L (strictly below the diagonal; its unit diagonal implied) and U (on and
# above it), as LAPACK's getrf does; column n holds the pivots (row i was swapped with row
# pivots[i], 0-based, in order) and column n + 1 the permutation (``(P a)[i] =
# a[perm[i]]``), both as numbers of a's dtype (exact below 2²⁴ in float32). One
# decomposition serves the three outputs (a primitive has one output: NOTE [svd's one
# output]). NumPy exposes no getrf, so the impl is a right-looking elimination written in
# the array module: one step per column, each step vectorized over the whole stack (n
# Python steps, never one per matrix), on NumPy or CuPy alike.
#
# Derivatives (square a, JAX's lu_jvp_rule): with X = L⁻¹ P da U⁻¹,
#   dL = L tril(X, −1),   dU = triu(X) U,
# and the pivots and permutation carry none. The VJP is its transpose: for cotangents
# L̄, Ū of the packed factor, X̄ = tril(Lᵀ L̄, −1) + triu(Ū Uᵀ) and ā = Pᵀ L⁻ᵀ X̄ U⁻ᵀ. A
# singular a (a zero on U's diagonal) has no derivative (inf or NaN), as in JAX.

lu_p = Primitive("lu", owns_output=True, capturable=False)


def lu(a):
    """``(lu, pivots, permutation)`` of each square matrix of a stack (JAX's
    ``lax.linalg.lu``): ``P a = L U`` with ``L`` unit lower triangular (below the diagonal
    of ``lu``), ``U`` upper triangular (on and above it), ``pivots`` LAPACK's row
    interchanges (0-based, int32) and ``permutation`` (int32) the rows of ``a`` in the
    order of ``P a``. NOTE [lu's packed output]."""
    n = core.shape_of(a)[-1]
    packed = lu_p.bind(a)
    axis = len(core.shape_of(a)) - 1
    lu_ = slice_in_dim(packed, 0, n, axis)
    pivots = ew.convert_element_type(_real_part_index(slice_in_dim(packed, n, n + 1, axis)), np.int32)
    perm = ew.convert_element_type(_real_part_index(slice_in_dim(packed, n + 1, n + 2, axis)), np.int32)
    return lu_, _squeeze_last(pivots), _squeeze_last(perm)


def _real_part_index(x):
    """The index columns of a complex LU hold real numbers: their real part (the
    conversion to int32 of a stopped gradient: they carry no derivative)."""
    x = ew.stop_gradient(x)
    if kind_of(core.dtype_of(x)) == "c":
        return lu_index_real_p.bind(x)
    return x


def _squeeze_last(x):
    return squeeze(x, (len(core.shape_of(x)) - 1,))


def _lu_shape_rule(a):
    check_matrix("lu", a, square=True)
    n = a.shape[-1]
    return ShapedArray(a.shape[:-1] + (n + 2,), a.dtype)


def _lu_impl(a):
    xp = backend.xp_of(a)
    *lead, n, _ = a.shape
    count = int(np.prod(lead, dtype=np.int64))
    lu_ = a.reshape(count, n, n).copy()
    perm = xp.broadcast_to(xp.arange(n), (count, n)).copy()
    pivots = xp.zeros((count, n), dtype=np.int64)
    rows = xp.arange(count)
    with np.errstate(divide="ignore", invalid="ignore"):
        for j in range(n):
            p = j + xp.argmax(xp.abs(lu_[:, j:, j]), axis=1)
            pivots[:, j] = p
            row_j, row_p = lu_[rows, j].copy(), lu_[rows, p].copy()
            lu_[rows, j], lu_[rows, p] = row_p, row_j
            perm_j, perm_p = perm[rows, j].copy(), perm[rows, p].copy()
            perm[rows, j], perm[rows, p] = perm_p, perm_j
            pivot = lu_[:, j, j]
            column = lu_[:, j + 1:, j]
            # a zero pivot means a zero column below it (LAPACK leaves it unscaled)
            factors = xp.where((pivot != 0)[:, None], column / xp.where(pivot != 0, pivot, 1)[:, None], column)
            lu_[:, j + 1:, j] = factors
            lu_[:, j + 1:, j + 1:] -= factors[:, :, None] * lu_[:, j, None, j + 1:]
    out = xp.concatenate([lu_, pivots[..., None].astype(a.dtype), perm[..., None].astype(a.dtype)], axis=-1)
    return out.reshape(tuple(lead) + (n, n + 2))


def _lu_solve_arrays(packed, b):
    """``a⁻¹ b`` from the packed LU of ``a`` (concrete arrays): the impls' path for
    singular matrices."""
    xp = backend.xp_of(packed)
    n = packed.shape[-1] - 2
    lu_ = packed[..., :n]
    perm = packed[..., n + 1].real.astype(np.int64)
    pb = xp.take_along_axis(b, perm[..., None], axis=-2)
    y = _substitute(_triangle_array(lu_, True, True), pb, True)
    return _substitute(xp.triu(lu_), y, False)


def _lu_batch(axis_size, vals, dims):
    (a,) = batch_front(axis_size, vals, dims)
    return lu_p.bind(a), 0


def _lu_factors(out, n):
    """``(lu, L, U, P)`` from the packed output (P the permutation matrix, a constant)."""
    axis = len(core.shape_of(out)) - 1
    lu_ = slice_in_dim(out, 0, n, axis)
    perm = ew.stop_gradient(slice_in_dim(out, n + 1, n + 2, axis))  # (..., n, 1)
    if kind_of(core.dtype_of(perm)) == "c":
        perm = lu_index_real_p.bind(perm)
    cols = backend.xp_of(out).arange(n).astype(core.dtype_of(perm))
    p_mat = ew.convert_element_type(ew.eq(perm, cols), core.dtype_of(out))  # P[i, perm[i]] = 1
    l_mat = ew.add(tril(lu_, -1), eye_like(lu_))
    return lu_, l_mat, triu(lu_), p_mat


def _pad_index_columns(x):
    """A tangent of the factor, with zero tangents for the two index columns."""
    nd = len(core.shape_of(x))
    zero_column = ew.mul(slice_in_dim(x, 0, 1, nd - 1), 0)  # (a 1×1 matrix has one column to copy)
    return concatenate([x, zero_column, zero_column], nd - 1)


def _lu_jvp(t, out, a):
    n = core.shape_of(a)[-1]
    lu_, l_mat, u_mat, p_mat = _lu_factors(out, n)
    y = triangular_solve_left(lu_, _mm(p_mat, t), lower=True, unit_diagonal=True)  # L⁻¹ P da
    x = _mT(triangular_solve_left(lu_, _mT(y), lower=False, transpose_a=True))  # (U⁻ᵀ yᵀ)ᵀ = y U⁻¹
    d_lu = ew.add(_mm(l_mat, tril(x, -1)), _mm(triu(x), u_mat))
    return _pad_index_columns(d_lu)


def _lu_vjp(ct, out, a):
    n = core.shape_of(a)[-1]
    lu_, l_mat, u_mat, p_mat = _lu_factors(out, n)
    c = slice_in_dim(ct, 0, n, len(core.shape_of(ct)) - 1)
    x_bar = ew.add(tril(_mm(_mT(l_mat), tril(c, -1)), -1), triu(_mm(triu(c), _mT(u_mat))))
    y = triangular_solve_left(lu_, x_bar, lower=True, transpose_a=True, unit_diagonal=True)  # L⁻ᵀ X̄
    z = _mT(triangular_solve_left(lu_, _mT(y), lower=False))  # y U⁻ᵀ
    return _mm(_mT(p_mat), z)


lu_p.impl = _lu_impl
lu_p.shape_rule = _lu_shape_rule
batching.primitive_batchers[lu_p] = _lu_batch
jvp.defjvp(lu_p, _lu_jvp)
vjp.defvjp(lu_p, _lu_vjp, reads=("out",))


# The real part of the (real-valued) index columns of a complex LU: no derivative.
lu_index_real_p = Primitive("lu_index_real", differentiable=False)
lu_index_real_p.impl = lambda x: x.real.copy()
lu_index_real_p.shape_rule = lambda x: ShapedArray(x.shape, np.empty(0, x.dtype).real.dtype)
batching.defunary(lu_index_real_p)


# =======================================================================================
# lu_pivots_to_permutation
# =======================================================================================

lu_pivots_to_permutation_p = Primitive("lu_pivots_to_permutation", differentiable=False)


def lu_pivots_to_permutation(pivots, permutation_size):
    """The permutation that LAPACK's row interchanges ``pivots`` ``(..., k)`` (0-based)
    apply to ``range(permutation_size)`` (JAX's ``lax.linalg.lu_pivots_to_permutation``),
    int32."""
    return lu_pivots_to_permutation_p.bind(pivots, permutation_size=int(permutation_size))


def _pivots_shape_rule(pivots, *, permutation_size):
    if pivots.ndim < 1 or kind_of(pivots.dtype) not in "iu":
        raise ShapeError(f"lu_pivots_to_permutation: pivots must be integers with at least 1 dim, got {pivots}")
    if pivots.shape[-1] > permutation_size:
        raise ShapeError(f"lu_pivots_to_permutation: {pivots.shape[-1]} pivots for a permutation of "
                         f"size {permutation_size}")
    return ShapedArray(pivots.shape[:-1] + (permutation_size,), np.dtype(np.int32))


def _pivots_impl(pivots, *, permutation_size):
    xp = backend.xp_of(pivots)
    lead = pivots.shape[:-1]
    flat = pivots.reshape(-1, pivots.shape[-1]).astype(np.int64)
    count = flat.shape[0]
    perm = xp.broadcast_to(xp.arange(permutation_size), (count, permutation_size)).copy()
    rows = xp.arange(count)
    for j in range(flat.shape[1]):  # one step per interchange, over the whole stack
        p = flat[:, j]
        perm_j, perm_p = perm[rows, j].copy(), perm[rows, p].copy()
        perm[rows, j], perm[rows, p] = perm_p, perm_j
    return perm.reshape(lead + (permutation_size,)).astype(np.int32)


def _pivots_batch(axis_size, vals, dims, *, permutation_size):
    (p,) = batch_front(axis_size, vals, dims)
    return lu_pivots_to_permutation(p, permutation_size), 0


lu_pivots_to_permutation_p.impl = _pivots_impl
lu_pivots_to_permutation_p.shape_rule = _pivots_shape_rule
batching.primitive_batchers[lu_pivots_to_permutation_p] = _pivots_batch


# =======================================================================================
# det and adjugate
# =======================================================================================

# NOTE [det's derivative through the adjugate]
# d det(A) = tr(adj(A) dA), with adj(A) the adjugate (the transposed cofactor matrix,
# det(A) A⁻¹ where A is invertible). The adjugate is a polynomial in A's entries, defined
# for singular matrices too: the gradient of det at a matrix of rank n − 1 is its nonzero
# cofactor matrix, where the form det(A) A⁻ᵀ gives NaN. ``adjugate_p`` computes it from the
# SVD A = U Σ Vᴴ: adj(A) = det(U) det(Vᴴ) V adj(Σ) Uᴴ, adj(Σ) = diag(Π_{j≠i} σ_j) (products
# of the other singular values, no division), so its value is right at any rank (JAX's
# cofactor solve reaches the same values through the LU). Its own derivative (for the
# second derivatives of det) is d adj = (tr(adj dA) adj − adj dA adj) / det(A), defined where
# A is invertible: second derivatives of det at a singular matrix are NaN.

det_p = Primitive("det", owns_output=True, capturable=False)


def det(a):
    """The determinant of each square matrix of a stack ``(..., n, n)`` (LU: LAPACK's getrf).
    Derivative: ``tr(adj(a) da)`` (NOTE [det's derivative through the adjugate]): defined at
    singular matrices too. Complex matrices: holomorphic, JAX's convention."""
    return det_p.bind(a)


def _det_shape_rule(a):
    check_matrix("det", a, square=True)
    return ShapedArray(a.shape[:-2], a.dtype)


def _det_impl(a):
    return backend.xp_of(a).asarray(backend.xp_of(a).linalg.det(a), dtype=a.dtype)


def _det_batch(axis_size, vals, dims):
    (a,) = batch_front(axis_size, vals, dims)
    return det(a), 0


def _det_jvp(t, out, a):
    return trace(_mm(adjugate(a), t))


def _det_vjp(ct, out, a):
    return scalar_times(ct, _mT(adjugate(a)))


det_p.impl = _det_impl
det_p.shape_rule = _det_shape_rule
batching.primitive_batchers[det_p] = _det_batch
jvp.defjvp(det_p, _det_jvp)
vjp.defvjp(det_p, _det_vjp, reads=(0,))


adjugate_p = Primitive("adjugate", owns_output=True, capturable=False)


def adjugate(a):
    """The adjugate ``adj(a)`` (``det(a) a⁻¹`` where ``a`` is invertible; defined at every
    rank) of each square matrix of a stack: NOTE [det's derivative through the adjugate]."""
    return adjugate_p.bind(a)


def _adjugate_shape_rule(a):
    check_matrix("adjugate", a, square=True)
    return a


def _adjugate_impl(a):
    xp = backend.xp_of(a)
    u, s, vh = xp.linalg.svd(a)
    ones = xp.ones_like(s[..., :1])
    left = xp.cumprod(xp.concatenate([ones, s[..., :-1]], axis=-1), axis=-1)
    right = xp.flip(xp.cumprod(xp.concatenate([ones, xp.flip(s, -1)[..., :-1]], axis=-1), axis=-1), -1)
    others = (left * right).astype(a.dtype)
    sign = xp.linalg.det(u) * xp.linalg.det(vh)
    v = xp.conj(xp.swapaxes(vh, -1, -2))
    uh = xp.conj(xp.swapaxes(u, -1, -2))
    return (sign[..., None, None] * ((v * others[..., None, :]) @ uh)).astype(a.dtype)


def _adjugate_batch(axis_size, vals, dims):
    (a,) = batch_front(axis_size, vals, dims)
    return adjugate(a), 0


def _adjugate_jvp(t, out, a):
    d = det(a)
    first = scalar_times(trace(_mm(out, t)), out)
    return scalar_times(ew.div(1, d), ew.sub(first, _mm(_mm(out, t), out)))


def _adjugate_vjp(ct, out, a):
    d = det(a)
    adj_t = _mT(out)
    first = scalar_times(reduce_sum(ew.mul(ct, out), (len(core.shape_of(a)) - 2, len(core.shape_of(a)) - 1)), adj_t)
    return scalar_times(ew.div(1, d), ew.sub(first, _mm(_mm(adj_t, ct), adj_t)))


adjugate_p.impl = _adjugate_impl
adjugate_p.shape_rule = _adjugate_shape_rule
batching.primitive_batchers[adjugate_p] = _adjugate_batch
jvp.defjvp(adjugate_p, _adjugate_jvp)
vjp.defvjp(adjugate_p, _adjugate_vjp)


# =======================================================================================
# slogdet: (sign, log|det|), packed along a last axis of 2
# =======================================================================================

# NOTE [slogdet of complex matrices]
# ``slogdet_p`` packs (sign, log|det|) along a last axis of 2, in the operand's dtype. With
# τ = tr(A⁻¹ dA) = d log det(A) (JAX's _slogdet_jvp):
#   d logabsdet = re(τ),   d sign = i·im(τ)·sign
# (sign = det/|det| is e^{iθ} with dθ = im(τ); for a real matrix τ is real and the sign
# is constant). The VJP is the transpose under ⟨u, v⟩ = re Σ u·v: for cotangents
# (c_sign, c_log), ȳ = re(c_log) + i·im(c_sign·sign) and Ā = ȳ·A⁻ᵀ.

slogdet_p = Primitive("slogdet", owns_output=True, capturable=False)


def slogdet(a):
    """``(sign, logabsdet)`` of each square matrix of a stack: ``det(a) = sign ·
    exp(logabsdet)`` without overflow; ``logabsdet`` real, ``sign`` ±1 (real ``a``) or a
    complex number of modulus 1. Derivatives (JAX's): ``d logabsdet = re tr(a⁻¹ da)``;
    a real sign has none, a complex one ``i·im(tr(a⁻¹ da))·sign`` (NOTE [slogdet of
    complex matrices])."""
    out = slogdet_p.bind(a)
    axis = len(core.shape_of(out)) - 1
    sign = squeeze(slice_in_dim(out, 0, 1, axis), (axis,))
    logabsdet = squeeze(slice_in_dim(out, 1, 2, axis), (axis,))
    if is_complex(out):
        return sign, ew.real(logabsdet)
    return ew.stop_gradient(sign), logabsdet


def _slogdet_shape_rule(a):
    check_matrix("slogdet", a, square=True)
    return ShapedArray(a.shape[:-2] + (2,), a.dtype)


def _slogdet_impl(a):
    xp = backend.xp_of(a)
    sign, logabsdet = xp.linalg.slogdet(a)
    return xp.stack([sign, logabsdet.astype(a.dtype)], axis=-1).astype(a.dtype)


def _slogdet_batch(axis_size, vals, dims):
    (a,) = batch_front(axis_size, vals, dims)
    return slogdet_p.bind(a), 0


def _slogdet_jvp(t, out, a):
    tau = trace(solve(a, t))
    nd = len(core.shape_of(tau))
    if is_complex(tau):
        sign = squeeze(slice_in_dim(out, 0, 1, nd), (nd,))
        re_tau = ew.convert_element_type(ew.real(tau), core.dtype_of(tau))
        d_sign, d_log = ew.mul(ew.sub(tau, re_tau), sign), re_tau
    else:
        d_sign, d_log = ew.mul(tau, 0), tau
    return concatenate([expand_dims(d_sign, (nd,)), expand_dims(d_log, (nd,))], nd)


def _slogdet_vjp(ct, out, a):
    n = core.shape_of(a)[-1]
    axis = len(core.shape_of(ct)) - 1
    c = squeeze(slice_in_dim(ct, 1, 2, axis), (axis,))
    if is_complex(ct):
        c_sign = ew.mul(squeeze(slice_in_dim(ct, 0, 1, axis), (axis,)), squeeze(slice_in_dim(out, 0, 1, axis), (axis,)))
        # ȳ = re(c_log) + i·im(c_sign·sign)
        c = ew.complex(ew.real(c), ew.imag(c_sign))
    eye = broadcast_to(eye_like(a, n), core.shape_of(a))
    return scalar_times(c, solve(_mT(a), eye))


slogdet_p.impl = _slogdet_impl
slogdet_p.shape_rule = _slogdet_shape_rule
batching.primitive_batchers[slogdet_p] = _slogdet_batch
jvp.defjvp(slogdet_p, _slogdet_jvp)
vjp.defvjp(slogdet_p, _slogdet_vjp, reads=(0, "out"))

__all__ = [
    "adjugate", "adjugate_p", "det", "det_p", "lu", "lu_p", "lu_pivots_to_permutation", "lu_pivots_to_permutation_p",
    "slogdet", "slogdet_p", "solve", "solve_p", "triangular_solve", "triangular_solve_left", "triangular_solve_p",
]


# the rules above follow NOTE [complex convention] (cuvmap/transforms/complex_rules.py) for
# complex matrices: holomorphic in the matrix, transposes without a conjugate
complex_rules.defcomplex(solve_p, triangular_solve_p, lu_p, lu_index_real_p, lu_pivots_to_permutation_p, det_p,
                         adjugate_p)
complex_rules.defcomplex(slogdet_p)  # NOTE [slogdet of complex matrices]
