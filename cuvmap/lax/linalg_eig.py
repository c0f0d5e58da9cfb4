"""The eigendecomposition of a general (non-symmetric) square matrix: ``eig`` (JAX's
``lax.linalg.eig``), one primitive with one packed complex output (NOTE [eig's one
output]), LAPACK's ``geev`` through NumPy as impl, and JAX's derivative rule with its
transpose (NOTE [eig's derivatives]). The NumPy front ends (``eig``, ``eigvals``) are in
``cuvmap/numpy/linalg_eig.py``.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.elementwise.complex_numbers import complex as make_complex, conj, imag, real
from cuvmap.lax.elementwise.comparisons import convert_element_type
from cuvmap.lax.indexing import iota, slice_in_dim
from cuvmap.lax.linalg_common import INEXACT, _col, _mm, _mT, _row, batch_front, check_matrix, diagonal, eye_like
from cuvmap.lax.linalg_solve import solve
from cuvmap.lax.reduction import argmax, reduce_sum
from cuvmap.lax.shape import concatenate, squeeze
from cuvmap.transforms import batching, complex_rules, jvp, vjp
from cuvmap.core.bfloat16 import kind_of


# =======================================================================================
# eig
# =======================================================================================

# NOTE [eig's one output]
# ``eig_p(x, compute_left_eigenvectors, compute_right_eigenvectors, enable_eigvec_derivs)``
# returns one complex array ``(..., n, 1 + n·L + n·R)`` (L, R: whether the left and the
# right eigenvectors were asked for): the eigenvalues w in column 0, then the left
# eigenvectors VL (columns, ``VLᴴ A = diag(w) VLᴴ``), then the right ones VR
# (``A VR = VR diag(w)``). The wrapper slices them apart (NOTE [svd's one output] in
# linalg.py). The dtype is the complex one of x's precision, for real x too (as JAX).
# Each eigenvector has unit 2-norm and its largest-magnitude component real (LAPACK's
# geev normalisation, which the derivative rule differentiates through). The impl runs
# in double precision (float32 and complex64 operands are upcast, the results cast
# back), and a matrix with a NaN or an infinity gives NaN everywhere (as JAX, where NumPy
# would raise). The left eigenvectors are the columns of VR⁻ᴴ, normalised as above.

# NOTE [eig's derivatives]
# Nondegenerate perturbation theory (JAX's eig_jvp_rule): with P = VR⁻¹ dA VR,
#   dw = diag(P),
#   U  = VR (F ∘ P),   F_ij = 1 / (w_j − w_i) off the diagonal, 0 on it,
#   dVR = U + VR diag(c),   c_j = −re(v_jᴴ u_j) − i·im(U_{k_j j}) / re(V_{k_j j}),
# k_j the row of the largest |V_ij| of column j: c_j keeps the unit norm and the real
# largest component of each column (c is real-linear, not complex-linear, in dA). The
# left eigenvectors are the right ones of Aᴴ (eigenvalues conj(w)): dVL is the same rule
# with conj(w), VL and dAᴴ. The rule holds only where the eigenvalues are distinct and no
# column has two components tied for the largest magnitude, which cannot be checked on
# traced values: as in JAX the eigenvector derivatives raise unless
# ``enable_eigvec_derivs=True``; the eigenvalues alone are always differentiable. The
# VJP is the transpose of this rule under NOTE [complex convention]
# (cuvmap/transforms/complex_rules.py), step by step:
#   P̄ = diag(w̄) + F ∘ (VRᵀ Ū),   Ā = VR⁻ᵀ P̄ VRᵀ,
#   Ū = dV̄R + conj(VR) diag(s̄) + M diag(m̄),   c̄ = Σ_i VR_ij dV̄R_ij,
#   s̄ = −re(c̄),   m̄ = i·(−im(c̄)) / re(V_{k_j j}),   M the indicator of the rows k_j,
# and the left part adds conj(Ḡᵀ), Ḡ its Ā for Aᴴ.

eig_p = Primitive("eig", owns_output=True, capturable=False)


def eig(x, *, compute_left_eigenvectors=True, compute_right_eigenvectors=True, enable_eigvec_derivs=False,
        implementation=None, use_magma=None):
    """The eigendecomposition of each square matrix of a stack ``x`` ``(..., n, n)``
    (JAX's ``lax.linalg.eig``): the list ``[w, vl, vr]`` with ``vl`` and ``vr`` present
    where asked for, ``A vr = vr diag(w)`` and ``vlᴴ A = diag(w) vlᴴ``, all complex.
    Each eigenvector has unit norm and its largest component real (LAPACK's ``geev``);
    the eigenvalues come in LAPACK's order. A matrix with a NaN or an infinity gives NaN.
    Derivatives: NOTE [eig's derivatives] (those of the eigenvectors need
    ``enable_eigvec_derivs=True``, as in JAX). ``implementation`` and ``use_magma``
    are accepted for JAX's signature; the CPU runs LAPACK through NumPy, the GPU
    ``cupy.linalg.eig`` where the installed CuPy has it, else LAPACK on the host (as
    JAX's default GPU implementation does)."""
    check_matrix("eig", core.get_aval(x), square=True, dtypes=INEXACT)  # (eager calls skip shape rules)
    left, right = bool(compute_left_eigenvectors), bool(compute_right_eigenvectors)
    packed = eig_p.bind(x, compute_left_eigenvectors=left, compute_right_eigenvectors=right,
                        enable_eigvec_derivs=bool(enable_eigvec_derivs))
    w, vl, vr = _eig_parts(packed, core.shape_of(x)[-1], left, right)
    return [w] + ([vl] if left else []) + ([vr] if right else [])


def _eig_parts(packed, n, left, right):
    """``(w, vl, vr)`` from the packed output (None for a part not computed)."""
    axis = len(core.shape_of(packed)) - 1
    w = squeeze(slice_in_dim(packed, 0, 1, axis), (axis,))
    vl = slice_in_dim(packed, 1, 1 + n, axis) if left else None
    start = 1 + n * left
    vr = slice_in_dim(packed, start, start + n, axis) if right else None
    return w, vl, vr


def _complex_dtype(dtype):
    return np.result_type(dtype, np.complex64)


def _eig_shape_rule(x, *, compute_left_eigenvectors, compute_right_eigenvectors, enable_eigvec_derivs):
    check_matrix("eig", x, square=True, dtypes=INEXACT)
    n = x.shape[-1]
    cols = 1 + n * compute_left_eigenvectors + n * compute_right_eigenvectors
    return ShapedArray(x.shape[:-1] + (cols,), _complex_dtype(x.dtype))


def _largest_component_real(xp, v):
    """Each column of ``v`` scaled to unit norm with its largest-magnitude component real
    and positive."""
    v = v / xp.linalg.norm(v, axis=-2, keepdims=True)
    k = xp.argmax(xp.abs(v), axis=-2)[..., None, :]
    top = xp.take_along_axis(v, k, axis=-2)
    return v * (xp.conj(top) / xp.abs(top))


def _geev(xp, a):
    """``(w, vr)`` of a stack of complex128 or float64 matrices, complex128."""
    w, vr = xp.linalg.eig(a)
    return w.astype(np.complex128, copy=False), vr.astype(np.complex128, copy=False)


def on_host_without_geev(impl):
    """``impl`` run on the host for a CuPy operand where the installed CuPy has no
    ``cupy.linalg.eig``: as JAX's default GPU ``eig``, which calls LAPACK on the host;
    the result goes back to the device."""
    def run(x, **params):
        xp = backend.xp_of(x)
        if xp is np or hasattr(xp.linalg, "eig"):
            return impl(x, **params)
        return xp.asarray(impl(xp.asnumpy(x), **params))
    return run


def _eig_impl(x, *, compute_left_eigenvectors, compute_right_eigenvectors, enable_eigvec_derivs):
    xp = backend.xp_of(x)
    n = x.shape[-1]
    out_dtype = _complex_dtype(x.dtype)
    cols = 1 + n * compute_left_eigenvectors + n * compute_right_eigenvectors
    if n == 0 or x.size == 0:
        return xp.zeros(x.shape[:-1] + (cols,), dtype=out_dtype)
    work_dtype = np.complex128 if kind_of(x.dtype) == "c" else np.float64
    finite = xp.all(xp.isfinite(x), axis=(-2, -1))
    a = xp.where(finite[..., None, None], x, 0).astype(work_dtype)
    w, vr = _geev(xp, a)
    parts = [w[..., None]]
    if compute_left_eigenvectors:
        try:
            vr_inv = xp.linalg.inv(vr)
        except np.linalg.LinAlgError:  # a defective matrix: its eigenvectors are dependent
            vr_inv = xp.linalg.pinv(vr)
        parts.append(_largest_component_real(xp, xp.conj(xp.swapaxes(vr_inv, -1, -2))))
    if compute_right_eigenvectors:
        parts.append(vr)
    out = xp.concatenate(parts, axis=-1)
    out = xp.where(finite[..., None, None], out, np.nan)
    return out.astype(out_dtype)


def _eig_batch(axis_size, vals, dims, **params):
    (x,) = batch_front(axis_size, vals, dims)
    return eig_p.bind(x, **params), 0


def _refuse_eigvec_derivs(left, right, enable):
    if (left or right) and not enable:
        raise NotImplementedError(
            "eig: derivatives of non-symmetric eigenvectors are only valid where the eigenvalues are distinct and "
            "no eigenvector has two components tied for the largest magnitude, which cannot be checked on traced "
            "values; pass enable_eigvec_derivs=True to lax.linalg.eig to opt in (as JAX), or differentiate the "
            "eigenvalues alone (compute_left_eigenvectors=False, compute_right_eigenvectors=False, or eigvals)")


def _right_vectors(out, x, params):
    """``(w, vl, vr)`` of ``x``: from ``out``, binding the decomposition again with the
    right eigenvectors where ``out`` lacks them (as JAX's rule does). That bind enables
    their derivatives: the eigenvalues' derivatives read them only through
    ``diag(V⁻¹ dA V)``, which no rescaling of V's columns changes, so their higher
    derivatives hold whatever the gauge (JAX's rule raises there instead)."""
    n = core.shape_of(x)[-1]
    left, right = params["compute_left_eigenvectors"], params["compute_right_eigenvectors"]
    if not right:
        out = eig_p.bind(x, **dict(params, compute_right_eigenvectors=True, enable_eigvec_derivs=True))
    return _eig_parts(out, n, left, True)


def _gap_inverse(w):
    """``F_ij = 1 / (w_j − w_i)`` off the diagonal, 0 on it."""
    eye = eye_like(w, core.shape_of(w)[-1])
    return ew.sub(ew.div(1, ew.add(eye, ew.sub(_row(w), _col(w)))), eye)


def _largest_mask(v):
    """The indicator ``M_ij = [i = k_j]``, ``k_j`` the row of the largest ``|v_ij|`` of
    column ``j`` (a constant to every transform), in ``v``'s dtype."""
    nd = len(core.shape_of(v))
    k = argmax(ew.abs(v), nd - 2, np.int32)
    rows = iota(core.shape_of(v)[-2], np.int32, like=v)
    return convert_element_type(ew.eq(_col(rows), _row(k)), core.dtype_of(v))


def _sum_rows(x):
    return reduce_sum(x, (len(core.shape_of(x)) - 2,))


def _vectors_jvp(w, v, p):
    """``dV`` from ``P = V⁻¹ dA V`` (NOTE [eig's derivatives])."""
    u = _mm(v, ew.mul(_gap_inverse(w), p))
    mask = _largest_mask(v)
    c = make_complex(ew.neg(real(_sum_rows(ew.mul(conj(v), u)))),
                     ew.div(ew.neg(imag(_sum_rows(ew.mul(mask, u)))), real(_sum_rows(ew.mul(mask, v)))))
    return ew.add(u, ew.mul(v, _row(c)))


def _vectors_vjp(w, v, ct_v):
    """``P̄`` from ``dV̄`` (the transpose of :func:`_vectors_jvp`)."""
    mask = _largest_mask(v)
    c_ct = _sum_rows(ew.mul(v, ct_v))
    re_ct, im_ct = real(c_ct), ew.neg(imag(c_ct))  # the transpose of complex(re, im)
    zero = ew.mul(re_ct, 0)
    s_ct = make_complex(ew.neg(re_ct), zero)
    m_ct = make_complex(zero, ew.div(im_ct, real(_sum_rows(ew.mul(mask, v)))))
    u_ct = ew.add(ct_v, ew.add(ew.mul(conj(v), _row(s_ct)), ew.mul(mask, _row(m_ct))))
    return ew.mul(_gap_inverse(w), _mm(_mT(v), u_ct))


def _adjoint(x):
    return conj(_mT(x))


def _eig_jvp(t, out, x, **params):
    left, right = params["compute_left_eigenvectors"], params["compute_right_eigenvectors"]
    _refuse_eigvec_derivs(left, right, params["enable_eigvec_derivs"])
    w, vl, vr = _right_vectors(out, x, params)
    da = convert_element_type(t, core.dtype_of(vr))
    p = _mm(solve(vr, da), vr)
    axis = len(core.shape_of(vr)) - 1
    pieces = [_col(diagonal(p))]
    if left:
        p_left = _mm(solve(vl, _adjoint(da)), vl)
        pieces.append(_vectors_jvp(conj(w), vl, p_left))
    if right:
        pieces.append(_vectors_jvp(w, vr, p))
    return concatenate(pieces, axis)


def _eig_vjp(ct, out, x, **params):
    left, right = params["compute_left_eigenvectors"], params["compute_right_eigenvectors"]
    _refuse_eigvec_derivs(left, right, params["enable_eigvec_derivs"])
    n = core.shape_of(x)[-1]
    ct_w, ct_vl, ct_vr = _eig_parts(ct, n, left, right)
    w, vl, vr = _right_vectors(out, x, params)
    p_ct = ew.mul(_row(ct_w), eye_like(vr))
    if right:
        p_ct = ew.add(p_ct, _vectors_vjp(w, vr, ct_vr))
    a_ct = _mm(solve(_mT(vr), p_ct), _mT(vr))  # VR⁻ᵀ P̄ VRᵀ
    if left:
        g = _mm(solve(_mT(vl), _vectors_vjp(conj(w), vl, ct_vl)), _mT(vl))
        a_ct = ew.add(a_ct, _adjoint(g))
    return a_ct


eig_p.impl = on_host_without_geev(_eig_impl)
eig_p.shape_rule = _eig_shape_rule
batching.primitive_batchers[eig_p] = _eig_batch
jvp.defjvp(eig_p, _eig_jvp)
vjp.defvjp(eig_p, _eig_vjp, reads=(0, "out"))
# the rules are the real-linear forms of NOTE [complex convention], with JAX's pairing
complex_rules.defcomplex(eig_p)


def check_square(name, x):
    """Raises a ShapeError naming ``name`` unless ``x`` is a stack of square matrices."""
    shape = core.shape_of(x)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ShapeError(f"{name}: the operand must be a square matrix or a stack of them (..., n, n), got shape {shape}")
