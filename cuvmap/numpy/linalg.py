"""``numpy.linalg``'s functions on arrays and tracers, as ``jax.numpy.linalg`` has them:
``det``, ``slogdet``, ``solve``, ``inv``, ``cholesky``, ``eigh``, ``eigvalsh``, ``qr``,
``svd``, ``svdvals``, ``pinv``, ``lstsq``, ``matrix_power``, ``matrix_rank``, ``cond``,
``multi_dot``, ``tensorsolve``, ``tensorinv``, ``norm`` (every ``ord`` of NumPy's),
``vector_norm`` and ``matrix_norm``. The primitives beneath are in ``cuvmap/lax/linalg*.py``:
each stack of matrices goes to one batched vendor call (``numpy.linalg`` on the CPU,
``cupy.linalg`` on the GPU).

    from cuvmap.numpy import linalg      # or cuvmap.numpy.linalg, cnp.linalg
    linalg.norm(x, ord="nuc")

Complex inputs (NOTE [complex derivatives follow JAX]): every function takes them, with
JAX's derivative rules (the decompositions: NOTE [svd of complex matrices] in
``cuvmap/lax/linalg.py``, NOTE [complex decompositions] in
``cuvmap/lax/linalg_decompositions.py``, NOTE [slogdet of complex matrices] in
``cuvmap/lax/linalg_solve.py``).
"""
import builtins
import collections
import functools
import math

import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapeError
from cuvmap.lax.elementwise import complex_numbers as complex_parts  # real, conj
from cuvmap.lax import elementwise as ew
from cuvmap.lax import linalg as lax_linalg
from cuvmap.lax import linalg_common as lax_common
from cuvmap.lax import linalg_decompositions as lax_decomp
from cuvmap.lax import linalg_solve as lax_solve
from cuvmap.lax import shape as lax_shape
from cuvmap.lax.linalg_common import tril
from cuvmap.numpy._common import _axes, _axis, ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype, square, where
from cuvmap.numpy import _products, _reductions, _shapes
from cuvmap.numpy._products import matmul
from cuvmap.numpy._reductions import _keep, max, min, sum
from cuvmap.numpy._shapes import broadcast_to, moveaxis, squeeze, swapaxes
from cuvmap.transforms.custom_derivatives import custom_jvp
from cuvmap.numpy._linalg_eig import EigResult, eig, eigvals  # noqa: F401  (issue 32: general eigenproblems)
from cuvmap.core.bfloat16 import kind_of


__all__ = [
    "EighResult", "QRResult", "SVDResult", "SlogdetResult", "cholesky", "cond", "det", "eigh", "eigvalsh", "inv",
    "lstsq", "matrix_norm", "matrix_power", "matrix_rank", "multi_dot", "norm", "pinv", "qr", "slogdet", "solve",
    "svd", "svdvals", "tensorinv", "tensorsolve", "vector_norm",
    "cross", "diagonal", "matmul", "matrix_transpose", "outer", "tensordot", "trace", "vecdot",
    "EigResult", "eig", "eigvals",
]

SVDResult = collections.namedtuple("SVDResult", ["U", "S", "Vh"])
EighResult = collections.namedtuple("EighResult", ["eigenvalues", "eigenvectors"])
QRResult = collections.namedtuple("QRResult", ["Q", "R"])
SlogdetResult = collections.namedtuple("SlogdetResult", ["sign", "logabsdet"])

# NOTE [complex derivatives follow JAX]
# For a complex input z = x + iy, a JVP is the tangent of the output along ż (complex-linear
# in ż where the function is holomorphic: det, solve, inv, lu, triangular_solve, the
# products), and a VJP is the transpose of that map under the bilinear pairing Σ aᵢbᵢ, with
# no conjugation beyond what the JVP holds: the cotangent of det is c · adj(A)ᵀ, not its
# conjugate. So ``grad`` of a real-valued f is ∂f/∂x − i ∂f/∂y (JAX's convention; PyTorch's
# is its conjugate): for ‖z‖₂, conj(z)/‖z‖. The norms of complex arrays use
# |z|² = real(z · conj(z)) (``cuvmap/lax/elementwise/complex_numbers.py``) and never return a complex
# number. The decompositions (slogdet, cholesky, eigh, qr, svd, and pinv, lstsq and the
# singular-value norms through them) are not holomorphic: their rules are JAX's real-linear
# ones (with ᴴ where the real rules have ᵀ, and JAX's phase terms), and their VJPs the
# transposes under the same pairing.


def _as_inexact(x):
    """Integers and booleans as float64 (NumPy's linalg and JAX promote them); lists and
    scalars become arrays."""
    if not isinstance(x, core.Tracer) and not hasattr(x, "dtype"):
        x = asarray(x)  # (a list may hold traced values: they are stacked)
    return x if core.is_float(x) else astype(x, np.float64)


def _is_complex(x):
    return kind_of(core.dtype_of(x)) == "c"


def _eye(x, n):
    return backend.xp_of(x).eye(n, dtype=core.dtype_of(x))


def _square_stack(x, name):
    x = _as_inexact(x)
    s = shape(x)
    if len(s) < 2 or s[-1] != s[-2]:
        raise ShapeError(f"{name}: the array must be a square matrix or a stack of them (..., n, n), got shape {s}")
    return x


# ---------------------------------------------------------------------------------------
# NumPy 2's array-API names in numpy.linalg (the products of cuvmap.numpy, on the last axes)
# ---------------------------------------------------------------------------------------


def matrix_transpose(x, /):
    """``numpy.linalg.matrix_transpose``: the last two dims swapped."""
    return swapaxes(x, -1, -2)


def diagonal(x, /, *, offset=0):
    """``numpy.linalg.diagonal``: the ``offset`` diagonal of each matrix (the last two dims)."""
    return _shapes.diagonal(x, offset, -2, -1)


def trace(x, /, *, offset=0, dtype=None):
    """``numpy.linalg.trace``: the sum of the ``offset`` diagonal of each matrix."""
    out = _reductions.trace(x, offset, -2, -1)
    return out if dtype is None else astype(out, dtype)


def outer(x1, x2, /):
    """``numpy.linalg.outer``: ``x1[:, None] * x2[None, :]`` of two vectors."""
    if ndim(x1) != 1 or ndim(x2) != 1:
        raise ShapeError(f"outer: both operands must be vectors, got shapes {shape(x1)} and {shape(x2)}")
    return _products.outer(x1, x2)


def cross(x1, x2, /, *, axis=-1):
    """``numpy.linalg.cross``: the cross product of 3-vectors along ``axis``."""
    return _products.cross(x1, x2, axis=axis)


def tensordot(x1, x2, /, *, axes=2, precision=None, preferred_element_type=None):
    """``numpy.linalg.tensordot``: :func:`cuvmap.numpy.tensordot`."""
    return _products.tensordot(x1, x2, axes, precision=precision, preferred_element_type=preferred_element_type)


def vecdot(x1, x2, /, *, axis=-1, precision=None, preferred_element_type=None):
    """``numpy.linalg.vecdot``: ``Σ conj(x1) · x2`` along ``axis`` of each operand (NumPy's
    gufunc: ``axis`` counts in each operand's own dims, before the others broadcast);
    ``precision`` is checked and changes nothing, ``preferred_element_type`` is the
    result's dtype."""
    if precision is not None or preferred_element_type is not None:
        out = vecdot(x1, x2, axis=axis)
        _products.lax_jax_shapes._check_precision(precision, "vecdot")
        return out if preferred_element_type is None else astype(out, preferred_element_type)
    x1, x2 = asarray(x1), asarray(x2)
    x1 = complex_parts.conj(x1) if _is_complex(x1) else x1
    x1 = moveaxis(x1, _axis(x1, axis, "vecdot"), -1)
    x2 = moveaxis(x2, _axis(x2, axis, "vecdot"), -1)
    product = ew.mul(x1, x2)
    return sum(product, -1, dtype=core.dtype_of(product))  # int8 stays int8 (NumPy's, JAX's), not sum's int64


# ---------------------------------------------------------------------------------------
# Determinants, solves, inverses
# ---------------------------------------------------------------------------------------


def det(a):
    """``numpy.linalg.det`` (JAX's ``jnp.linalg.det``): the determinant of each square matrix
    of a stack ``(..., n, n)``. Its derivative is ``tr(adj(a) da)``, with the adjugate
    computed at any rank, so ``grad(det)`` of a singular matrix is its cofactor matrix
    (NOTE [det's derivative through the adjugate] in ``cuvmap/lax/linalg_solve.py``).
    Complex matrices: holomorphic (NOTE [complex derivatives follow JAX])."""
    return lax_solve.det(_square_stack(a, "det"))


def slogdet(a, *, method=None):
    """``numpy.linalg.slogdet`` (JAX's ``jnp.linalg.slogdet``): ``SlogdetResult(sign,
    logabsdet)`` with ``det(a) = sign · exp(logabsdet)``, computed without overflow.
    ``d logabsdet = re tr(a⁻¹ da)``; a real sign has no derivative, a complex one
    ``i·im(tr(a⁻¹ da))·sign`` (JAX's rule). ``method`` (JAX's): ``None``
    or ``'lu'`` (the pivoted LU: ``Σ log|U_ii|``) or ``'qr'`` (``a = Q R``: ``Σ log|R_ii|``,
    the sign ``det(Q) · Π sign(R_ii)``); the same values up to rounding."""
    a = _square_stack(a, "slogdet")
    if method is None or method == "lu":
        return SlogdetResult(*lax_solve.slogdet(a))
    if method != "qr":
        raise ValueError(f"slogdet: Unknown slogdet method {method!r}. Supported methods are 'lu' (None) and 'qr'.")
    q, r = lax_decomp.qr(a, full_matrices=False)
    diag_r = diagonal(r)
    sign = ew.mul(ew.sign(lax_solve.det(ew.stop_gradient(q))), _reductions.prod(ew.sign(ew.stop_gradient(diag_r)), -1))
    return SlogdetResult(sign, sum(ew.log(ew.abs(diag_r)), -1))


def solve(a, b):
    """``numpy.linalg.solve`` (JAX's ``jnp.linalg.solve``): ``x`` with ``a @ x = b``.

    ``a`` ``(..., n, n)``; ``b`` a vector ``(n,)`` (then ``x`` is one) or a stack of
    matrices ``(..., n, k)`` whose leading dims broadcast with ``a``'s (NumPy 2's rule).
    ``dx = a⁻¹ (db − da x)``; a singular ``a`` gives inf or NaN, as in JAX.
    """
    a = _square_stack(a, "solve")
    b = _as_inexact(b)
    n = shape(a)[-1]
    if ndim(b) == 1:
        if shape(b)[0] != n:
            raise ShapeError(f"solve: b {shape(b)} does not match a {shape(a)}")
        lead = shape(a)[:-2]
        bb = broadcast_to(lax_shape.expand_dims(b, (1,)), lead + (n, 1))
        return squeeze(lax_solve.solve(_promote_to(a, b), _promote_to(bb, a)), (ndim(a) - 1,))
    if ndim(b) < 2 or shape(b)[-2] != n:
        raise ShapeError(f"solve: b {shape(b)} must be (n,) or (..., n, k) for a {shape(a)}")
    lead = ew.broadcast_shapes(shape(a)[:-2], shape(b)[:-2])
    a2 = broadcast_to(a, lead + shape(a)[-2:])
    b2 = broadcast_to(b, lead + shape(b)[-2:])
    return lax_solve.solve(_promote_to(a2, b2), _promote_to(b2, a2))


def _promote_to(x, other):
    dtype = np.result_type(core.dtype_of(x), core.dtype_of(other))
    return x if core.dtype_of(x) == dtype else astype(x, dtype)


def inv(a):
    """``numpy.linalg.inv``: the inverse of each square matrix of a stack (a solve against
    the identity); ``d(a⁻¹) = −a⁻¹ da a⁻¹``."""
    a = _square_stack(a, "inv")
    n = shape(a)[-1]
    return lax_solve.solve(a, broadcast_to(_eye(a, n), shape(a)))


def tensorsolve(a, b, axes=None):
    """``numpy.linalg.tensorsolve``: ``x`` with ``tensordot(a, x, x.ndim) = b``; ``axes``:
    the dims of ``a`` moved to its end first. One :func:`solve` of the flattened system."""
    a, b = _as_inexact(a), _as_inexact(b)
    if axes is not None:
        axes = [_axis(a, ax, "tensorsolve") for ax in axes]
        a = moveaxis(a, axes, list(range(ndim(a) - len(axes), ndim(a))))
    bshape = shape(b)
    xshape = shape(a)[len(bshape):]
    rows, cols = math.prod(bshape), math.prod(xshape)
    if rows != cols:
        raise ShapeError(f"tensorsolve: a {shape(a)} is not square for b {bshape} ({rows} vs {cols})")
    x = solve(lax_shape.reshape(a, (rows, cols)), lax_shape.reshape(b, (rows,)))
    return lax_shape.reshape(x, xshape)


def tensorinv(a, ind=2):
    """``numpy.linalg.tensorinv``: the inverse of ``a`` seen as a map from its last dims to
    its first ``ind`` dims; one :func:`inv` of the flattened matrix."""
    a = _as_inexact(a)
    if ind <= 0:
        raise ShapeError(f"tensorinv: ind must be a positive integer, got {ind}")
    out_shape, in_shape = shape(a)[:ind], shape(a)[ind:]
    rows, cols = math.prod(out_shape), math.prod(in_shape)
    if rows != cols:
        raise ShapeError(f"tensorinv: a {shape(a)} with ind={ind} is not square ({rows} vs {cols})")
    return lax_shape.reshape(inv(lax_shape.reshape(a, (rows, cols))), in_shape + out_shape)


def matrix_power(a, n):
    """``numpy.linalg.matrix_power``: ``a`` to the integer power ``n`` by repeated squaring
    (``n = 0``: the identity; ``n < 0``: powers of :func:`inv`). Integer and boolean
    matrices keep their dtype (a boolean product is the or of ands), as NumPy's."""
    a = _square_stack(a, "matrix_power") if not (hasattr(a, "dtype") and kind_of(core.dtype_of(a)) in "iub") else a
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"matrix_power: the exponent must be an integer, got {n!r}")
    n = int(n)
    if n == 0:
        return broadcast_to(_eye(a, shape(a)[-1]), shape(a))
    if n < 0:
        a, n = inv(a), -n
    result, power = None, a
    while n:
        if n & 1:
            result = power if result is None else matmul(result, power)
        n >>= 1
        if n:
            power = matmul(power, power)
    return result


def multi_dot(arrays, *, precision=None):
    """``numpy.linalg.multi_dot``: the product of a chain of matrices (the first may be a
    vector, and the last) in the order of fewest multiplications (dynamic programming over
    the chain, as NumPy). ``precision`` (JAX's) is accepted and ignored."""
    arrays = [_as_inexact(a) for a in arrays]
    if len(arrays) < 2:
        raise ShapeError(f"multi_dot: needs at least two arrays, got {len(arrays)}")
    first_vec, last_vec = ndim(arrays[0]) == 1, ndim(arrays[-1]) == 1
    if first_vec:
        arrays[0] = lax_shape.expand_dims(arrays[0], (0,))
    if last_vec:
        arrays[-1] = lax_shape.expand_dims(arrays[-1], (1,))
    dims = [shape(a)[0] for a in arrays] + [shape(arrays[-1])[1]]
    k = len(arrays)
    cost = [[0] * k for _ in range(k)]
    split = [[0] * k for _ in range(k)]
    for length in range(1, k):
        for i in range(k - length):
            j = i + length
            cost[i][j] = math.inf
            for m in range(i, j):
                c = cost[i][m] + cost[m + 1][j] + dims[i] * dims[m + 1] * dims[j + 1]
                if c < cost[i][j]:
                    cost[i][j], split[i][j] = c, m

    def product(i, j):
        if i == j:
            return arrays[i]
        return matmul(product(i, split[i][j]), product(split[i][j] + 1, j))

    out = product(0, k - 1)
    if first_vec:
        out = squeeze(out, (0,))
    if last_vec:
        out = squeeze(out, (ndim(out) - 1,))
    return out


# ---------------------------------------------------------------------------------------
# Decompositions
# ---------------------------------------------------------------------------------------


def cholesky(a, *, upper=False, symmetrize_input=True):
    """``numpy.linalg.cholesky`` (JAX's ``jnp.linalg.cholesky``): ``L`` lower triangular with
    ``a = L Lᴴ`` (``upper=True``: ``U = Lᴴ``, ``a = Uᴴ U``), for each real symmetric or
    complex Hermitian positive definite matrix of a stack. ``symmetrize_input`` (JAX's
    default) factors ``(a + aᴴ)/2``; else only the lower triangle is read (NumPy's behaviour). NaN where a
    matrix is not positive definite, as in JAX (NumPy raises). Derivatives: NOTE
    [cholesky's derivatives] in ``cuvmap/lax/linalg_decompositions.py``."""
    a = _square_stack(a, "cholesky")
    if not symmetrize_input:
        a = _from_lower(a)
    factor = lax_decomp.cholesky(a)
    return lax_common._mH(factor) if upper else factor


def _from_lower(a):
    """The Hermitian (real: symmetric) matrix with ``a``'s lower triangle."""
    return ew.add(tril(a), lax_common._mH(tril(a, -1)))


def eigh(a, UPLO=None, symmetrize_input=True):  # noqa: N803 - NumPy's name
    """``numpy.linalg.eigh`` (JAX's ``jnp.linalg.eigh``): ``EighResult(eigenvalues,
    eigenvectors)``, ascending (real) eigenvalues and the orthonormal eigenvectors (columns)
    of each real symmetric or complex Hermitian matrix of a stack. ``symmetrize_input``
    (JAX's default) decomposes ``(a + aᴴ)/2``; else only the ``UPLO`` (``'L'``, the default,
    or ``'U'``) triangle is read. Complex: NOTE [complex decompositions].

    Derivatives (NOTE [eigh's derivatives] in ``cuvmap/lax/linalg_decompositions.py``):
    ``dw_i = v_iᵀ da v_i``; ``dv = V (F ∘ Vᵀ da V)`` with ``F_ij = 1/(w_j − w_i)``, which is
    undefined (inf/NaN) where eigenvalues repeat: only functions invariant under rotations
    within an eigenspace have derivatives there.
    """
    a = _square_stack(a, "eigh")
    uplo = "L" if UPLO is None else UPLO
    if uplo not in ("L", "U"):
        raise ValueError(f"eigh: UPLO must be 'L' or 'U', got {UPLO!r}")
    v, w = lax_decomp.eigh(a, lower=uplo == "L", symmetrize_input=symmetrize_input)
    return EighResult(w, v)


def eigvalsh(a, UPLO="L", *, symmetrize_input=True):  # noqa: N803 - NumPy's name
    """``numpy.linalg.eigvalsh``: the ascending eigenvalues of each real symmetric matrix
    (:func:`eigh`'s; their derivative ``v_iᵀ da v_i`` exists where they are simple)."""
    return eigh(a, UPLO, symmetrize_input).eigenvalues


def qr(a, mode="reduced"):
    """``numpy.linalg.qr`` (JAX's ``jnp.linalg.qr``): ``QRResult(Q, R)``, ``a = Q R``, for
    each real or complex matrix of a stack ``(..., m, n)``. ``mode``: ``'reduced'`` (``Q`` ``(m, k)``,
    ``R`` ``(k, n)``, ``k = min(m, n)``), ``'complete'`` (``Q`` ``(m, m)``) or ``'r'``
    (``R`` alone). Derivatives (NOTE [qr's derivatives]): JAX's, for every shape and mode
    (the ``'complete'`` form of a tall matrix differentiates LAPACK's Householder
    completion, as JAX)."""
    a = _as_inexact(a)
    if ndim(a) < 2:
        raise ShapeError(f"qr: the array must have at least 2 dims, got shape {shape(a)}")
    if mode not in ("reduced", "complete", "r", "full"):  # 'full': NumPy's deprecated name of 'reduced'
        raise ValueError(f"qr: mode must be 'reduced', 'complete', 'r' or 'full', got {mode!r}")
    q, r = lax_decomp.qr(a, full_matrices=mode == "complete")
    return r if mode == "r" else QRResult(q, r)


def svd(a, full_matrices=True, compute_uv=True, hermitian=False, subset_by_index=None):
    """``numpy.linalg.svd``: ``a = U @ diag(S) @ Vh`` for each matrix of a stack ``(..., m, n)``.

    Returns ``SVDResult(U, S, Vh)`` (a named tuple, as NumPy 2's) or, with
    ``compute_uv=False``, ``S`` alone (descending). ``hermitian=True`` is accepted and
    computes the general SVD (also a valid SVD of a Hermitian matrix). Derivatives:
    NOTE [svd's derivatives] in ``cuvmap/lax/linalg.py``: those of the singular values are
    defined where they are distinct; those of ``U`` and ``Vh`` are undefined for repeated
    singular values (they come out inf or NaN) and raise for ``full_matrices=True`` of a
    non-square matrix (use ``full_matrices=False``). Complex matrices: NOTE [svd of
    complex matrices] (``S`` real).
    ``subset_by_index`` (JAX's ``(start, end)``): the triplets ``start..end − 1`` only
    (:func:`cuvmap.lax.linalg.svd`).
    """
    a = _as_inexact(a)
    if ndim(a) < 2:
        raise ShapeError(f"svd: the array must have at least 2 dims (a stack of matrices), got shape {shape(a)}")
    if not compute_uv:
        return lax_linalg.svd(a, full_matrices=False, compute_uv=False, subset_by_index=subset_by_index)
    return SVDResult(*lax_linalg.svd(a, full_matrices=full_matrices, subset_by_index=subset_by_index))


def svdvals(x):
    """``numpy.linalg.svdvals``: the singular values of each matrix of a stack, descending."""
    return svd(x, compute_uv=False)


def _default_rtol(a):
    m, n = shape(a)[-2:]
    return float(np.finfo(core.dtype_of(a)).eps) * builtins.max(m, n)


def pinv(a, rtol=None, hermitian=False, *, rcond=None):
    """``numpy.linalg.pinv`` (JAX's ``jnp.linalg.pinv``): the Moore-Penrose pseudo-inverse
    ``V diag(1/s) Uᴴ`` of each real or complex matrix, singular values at most
    ``rtol · max(s)`` dropped (``rtol`` default ``10 · max(m, n) · eps``, JAX's; ``rcond``
    is NumPy's older name: only one of the two may be given). ``hermitian=True``
    decomposes ``(a + aᴴ)/2``, as JAX.

    Derivative (JAX's ``_pinv_jvp``, a custom JVP; Golub and Pereyra 1973): with
    ``P = pinv(a)``, ``dP = −P da P + P Pᴴ daᴴ (I − a P) + (I − P a) daᴴ Pᴴ P``, which
    holds where the rank is locally constant, repeated singular values included (the
    derivative through the SVD would be NaN there: NOTE [svd's derivatives])."""
    a = _as_inexact(a)
    if ndim(a) < 2:
        raise ShapeError(f"pinv: the array must have at least 2 dims, got shape {shape(a)}")
    if rcond is not None:
        if rtol is not None:
            raise ValueError("pinv: only one of rtol and rcond may be specified.")  # (JAX's words)
        rtol = rcond
    return _pinv(a, rtol, bool(hermitian))


@functools.partial(custom_jvp, nondiff_argnums=(1, 2))
def _pinv(a, rtol, hermitian):
    m, n = shape(a)[-2:]
    if m == 0 or n == 0:  # (an empty (..., n, m) result, on a's device)
        return ew.mul(lax_common._mH(a), 0)
    if hermitian:
        a = lax_common.herm(a)
    if rtol is None:
        rtol = 10.0 * builtins.max(m, n) * float(np.finfo(core.dtype_of(a)).eps)
    u, s, vh = lax_linalg.svd(a, full_matrices=False)
    rtol = asarray(rtol)
    cutoff = ew.mul(ew.stop_gradient(max(s, -1, keepdims=True)), lax_shape.expand_dims(rtol, (ndim(rtol),)))
    keep = ew.gt(s, cutoff)
    s_inv = where(keep, ew.div(1, where(keep, s, 1)), 0)
    s_inv = astype(s_inv, core.dtype_of(a)) if _is_complex(a) else s_inv
    return matmul(ew.mul(lax_common._mH(vh), lax_shape.expand_dims(s_inv, (ndim(s_inv) - 1,))), lax_common._mH(u))


@_pinv.defjvp
def _pinv_jvp(rtol, hermitian, primals, tangents):
    """JAX's ``_pinv_jvp`` (the formula in :func:`pinv`'s docstring)."""
    (a,), (a_dot,) = primals, tangents
    p = _pinv(a, rtol, hermitian)
    if hermitian:
        a, a_dot = lax_common.herm(a), lax_common.herm(a_dot)
    m, n = shape(a)[-2:]
    mH = lax_common._mH
    if m >= n:  # (the products in the order of the smaller intermediates)
        s = matmul(matmul(p, mH(p)), mH(a_dot))
        t = matmul(matmul(mH(a_dot), mH(p)), p)
        p_dot = ew.add(ew.sub(ew.add(ew.sub(s, matmul(matmul(s, a), p)), t), matmul(matmul(p, a), t)),
                       ew.neg(matmul(matmul(p, a_dot), p)))
    else:
        s = matmul(p, matmul(mH(p), mH(a_dot)))
        t = matmul(mH(a_dot), matmul(mH(p), p))
        p_dot = ew.add(ew.sub(ew.add(ew.sub(s, matmul(s, matmul(a, p))), t), matmul(p, matmul(a, t))),
                       ew.neg(matmul(p, matmul(a_dot, p))))
    return p, p_dot


def lstsq(a, b, rcond=None, *, numpy_resid=False):
    """``numpy.linalg.lstsq`` (JAX's ``jnp.linalg.lstsq``): ``(x, residuals, rank, s)`` for
    the least-squares solution ``x = pinv(a) @ b`` of ``a`` ``(m, n)`` and ``b`` ``(m,)`` or
    ``(m, k)``; singular values at most ``rcond · max(s)`` count as zero (``rcond`` default
    ``eps · max(m, n)``, JAX's). ``residuals``: the squared 2-norms of ``b − a x`` per
    column (shape ``(k,)``, or ``(1,)`` for a vector ``b``); with ``numpy_resid=True`` an
    empty array unless ``rank == n < m`` (NumPy's rule: needs a concrete ``a``), else
    (JAX's default) always computed. ``rank`` is an int32 array, ``s`` the singular values.
    Differentiable in ``a`` and ``b`` through the SVD."""
    a, b = _as_inexact(a), _as_inexact(b)
    if ndim(a) != 2 or ndim(b) not in (1, 2) or shape(b)[0] != shape(a)[0]:
        raise ShapeError(f"lstsq: a must be (m, n) and b (m,) or (m, k), got {shape(a)} and {shape(b)}")
    m, n = shape(a)
    s = lax_linalg.svd(a, compute_uv=False)
    rtol = _default_rtol(a) if rcond is None or rcond < 0 else rcond
    x = matmul(pinv(a, rtol=rtol), b)
    rank = sum(astype(ew.gt(ew.stop_gradient(s), ew.mul(ew.stop_gradient(_max_or_zero(s, (0,), False)), rtol)),
                      np.int32))
    resid = sum(_abs_squared(ew.sub(matmul(a, x), b)), 0)
    if numpy_resid and not (int(rank) == n and m > n):
        resid = np.zeros((0,), dtype=core.dtype_of(a))
    elif ndim(b) == 1:
        resid = lax_shape.expand_dims(resid, (0,))
    return x, resid, rank, s


def matrix_rank(M, rtol=None, *, hermitian=False, tol=None):  # noqa: N803 - NumPy's name
    """``numpy.linalg.matrix_rank`` (JAX's ``jnp.linalg.matrix_rank``): the number of
    singular values above ``rtol · max(s)`` (``rtol`` default ``eps · max(m, n)``) per
    matrix; a vector's rank is 1 unless it is zero. ``tol`` is JAX's alias of ``rtol``
    (relative, as JAX's; NumPy's ``tol`` is an absolute threshold); giving both raises.
    ``hermitian`` is accepted (the singular values are computed as for any matrix; for a
    Hermitian one they are its eigenvalues' absolute values). An integer result, with no
    derivative."""
    if tol is not None:
        if rtol is not None:
            raise ValueError("matrix_rank: only one of tol or rtol may be specified.")
        rtol, tol = tol, None
    M = _as_inexact(M)
    if ndim(M) < 2:
        return astype(ew.ne(max(ew.abs(M) if ndim(M) else ew.abs(M)), 0), np.int32)
    if 0 in shape(M)[-2:]:  # no singular values
        return backend.xp_of(M).zeros(shape(M)[:-2], dtype=np.int32)
    s = ew.stop_gradient(lax_linalg.svd(M, compute_uv=False))
    rtol = _default_rtol(M) if rtol is None else rtol
    rtol = lax_shape.expand_dims(rtol, (ndim(rtol),)) if ndim(rtol) else rtol  # one per matrix of the stack
    return sum(astype(ew.gt(s, ew.mul(max(s, -1, keepdims=True), rtol)), np.int32), -1)


def cond(x, p=None):
    """``numpy.linalg.cond``: the condition number ``‖x‖ · ‖x⁻¹‖`` in the norm ``p``
    (``None``/2: ``s_max / s_min`` from the singular values; -2: ``s_min / s_max``; the
    others through :func:`norm` and :func:`inv`)."""
    x = _as_inexact(x)
    if p is None or p in (2, -2):
        s = lax_linalg.svd(x, compute_uv=False)
        big, small = max(s, -1), min(s, -1)
        return ew.div(small, big) if p == -2 else ew.div(big, small)
    return ew.mul(norm(x, p, (-2, -1)), norm(inv(x), p, (-2, -1)))


# ---------------------------------------------------------------------------------------
# Norms
# ---------------------------------------------------------------------------------------


def _abs_squared(x):
    """``|x|²``, real: ``x²`` for a real ``x``, ``real(x · conj(x))`` for a complex one."""
    if _is_complex(x):
        return complex_parts.real(ew.mul(x, complex_parts.conj(x)))
    return square(x)


def _abs(x):
    """``|x|``, real (for a complex ``x`` through ``|x|²``: NOTE [complex derivatives
    follow JAX])."""
    if _is_complex(x):
        return ew.sqrt(_abs_squared(x))
    return ew.abs(x)


def _max_or_zero(x, axes, keepdims):
    """``max`` over ``axes``, 0 where they hold no entries (a norm of nothing is 0, as
    JAX's; NumPy's max raises there)."""
    if builtins.any(shape(x)[a] == 0 for a in axes):
        return sum(ew.mul(x, 0), axes, keepdims)
    return max(x, axes, keepdims)


def _real_dtype(x):
    return np.empty(0, core.dtype_of(x)).real.dtype


def norm(x, ord=None, axis=None, keepdims=False):  # noqa: A002 - NumPy's name
    """``numpy.linalg.norm``.

    Vector norms (``axis`` an int, or ``None`` for a 1-d array): ``ord`` ``None``/2 (the
    Euclidean norm), 1, ``inf``, ``-inf``, 0 (the count of nonzeros) or any other number
    ``p``, negative ones included (``(Σ|x|ᵖ)^(1/p)``). Matrix norms (``axis`` a pair, or
    ``None`` for a 2-d array): ``None``/``'fro'`` (Frobenius), 1 / -1 (the largest /
    smallest column sum of ``|x|``), ``inf`` / ``-inf`` (the same of the rows), 2 / -2 (the
    largest / smallest singular value) and ``'nuc'`` (their sum). ``axis=None`` with
    ``ord=None`` is the 2-norm of all elements.

    Derivatives follow JAX's: ord 1 and ``inf`` have the subgradient 0 at ``x = 0``; the
    2-norm and the Frobenius norm, ``sqrt(Σ x²)``, have none there and give NaN, as in
    JAX (write ``sqrt(sum(x * x) + eps)`` or the double-``where`` trick where zero inputs
    occur); the singular-value norms differentiate through the SVD (NOTE [svd's
    derivatives]): 2 and -2 where their singular value is simple, ``'nuc'`` where no
    singular value is zero.
    """
    x = _as_inexact(x)
    nd = ndim(x)
    if axis is None:
        if ord is None:
            axes = tuple(range(nd))
            return ew.sqrt(sum(_abs_squared(x), axes, keepdims))
        if nd not in (1, 2):
            raise ShapeError(f"norm: ord={ord!r} needs axis for an array of shape {shape(x)} (or a 1-d or 2-d array)")
        axes = tuple(range(nd))
    elif isinstance(axis, (int, np.integer)):
        axes = (_axis(x, axis, "norm"),)
    else:
        axes = tuple(_axis(x, a, "norm") for a in axis)
        if len(axes) not in (1, 2) or len(set(axes)) != len(axes):
            raise ShapeError(f"norm: axis must be an int or a pair of different ints, got {axis!r}")
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    return _matrix_norm(x, ord, axes, keepdims)


def _is_number(ord):  # noqa: A002
    return isinstance(ord, (int, float, np.number)) and not isinstance(ord, (bool, np.bool_))


def _vector_norm(x, ord, axes, keepdims):  # noqa: A002
    if ord is None or (_is_number(ord) and ord == 2):
        return ew.sqrt(sum(_abs_squared(x), axes, keepdims))
    if not _is_number(ord):
        raise ShapeError(f"norm: Invalid order {ord!r} for vector norm. (None, inf, -inf, 0 or a number)")
    if ord == np.inf:
        return _max_or_zero(_abs(x), axes, keepdims)
    if ord == -np.inf:
        return min(_abs(x), axes, keepdims)
    if ord == 0:
        return sum(astype(ew.ne(x, 0), _real_dtype(x)), axes, keepdims)
    if ord == 1:
        return sum(_abs(x), axes, keepdims)
    return ew.pow(sum(ew.pow(_abs(x), float(ord)), axes, keepdims), 1.0 / float(ord))


def _matrix_norm(x, ord, axes, keepdims):  # noqa: A002
    rows, cols = axes
    if ord is None or (isinstance(ord, str) and ord == "fro"):
        return ew.sqrt(sum(_abs_squared(x), axes, keepdims))
    if (isinstance(ord, str) and ord == "nuc") or (_is_number(ord) and ord in (2, -2)):
        # the singular values of the matrices in the (rows, cols) dims
        rest = tuple(i for i in range(ndim(x)) if i not in axes)
        s = lax_linalg.svd(lax_shape.transpose(x, rest + (rows, cols)), compute_uv=False)
        if isinstance(ord, str):
            out = sum(s, -1)
        else:
            out = _max_or_zero(s, (ndim(s) - 1,), False) if ord == 2 else min(s, -1)
        return lax_shape.expand_dims(out, tuple(sorted(axes))) if keepdims else out
    if not _is_number(ord) or ord not in (1, -1, np.inf, -np.inf):
        raise ShapeError(f"norm: invalid ord {ord!r} for a matrix norm (None, 'fro', 'nuc', 1, -1, 2, -2, inf or -inf)")
    # 1: the largest column sum of |x|; inf: the largest row sum
    summed, over = (rows, cols) if ord in (1, -1) else (cols, rows)
    sums = sum(_abs(x), summed, keepdims=True)
    out = _max_or_zero(sums, (over,), True) if ord > 0 else min(sums, over, keepdims=True)
    return out if keepdims else squeeze(out, axes)


def matrix_norm(x, /, *, keepdims=False, ord="fro"):  # noqa: A002 - NumPy's name
    """``numpy.linalg.matrix_norm``: :func:`norm` of the matrices in the last two dims."""
    return norm(x, ord, (-2, -1), keepdims)


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):  # noqa: A002 - NumPy's name
    """``numpy.linalg.vector_norm``: the vector norm ``ord`` (as in :func:`norm`) over
    ``axis``: an int, a tuple (those dims taken as one vector) or ``None`` (all of them)."""
    x = _as_inexact(x)
    axes = _axes(x, axis, "vector_norm")
    if len(axes) == 1:
        return _vector_norm(x, ord, axes, keepdims)
    rest = tuple(i for i in range(ndim(x)) if i not in axes)
    n = int(np.prod([shape(x)[i] for i in axes], dtype=np.int64))
    flat = lax_shape.reshape(lax_shape.transpose(x, rest + axes), tuple(shape(x)[i] for i in rest) + (n,))
    out = _vector_norm(flat, ord, (len(rest),), False)
    return _keep(out, x, axes, keepdims)
