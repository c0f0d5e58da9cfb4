"""Polynomial coefficient arithmetic, as ``jax.numpy`` names it: ``polyadd``, ``polysub``,
``polymul``, ``polydiv``, ``polyder``, ``polyint``, ``poly``, ``polyfit``, ``vander`` and
``roots``.

Coefficients come highest degree first (NumPy's ``poly1d`` order). Every function is a
composite of pads, slices, products and :func:`cuvmap.numpy.convolve`, with the static
integer factors of derivatives and integrals computed on the host, so they differentiate,
batch and stage under ``jit``. The two options that need the coefficients' values
(``trim_leading_zeros=True`` of ``polymul`` and ``polydiv``) need concrete arrays, as in
JAX."""
import builtins
import operator

import numpy as np

from cuvmap import backend, core
from cuvmap.core import PrimalTracer, ShapeError, Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import shape as lax_shape
from cuvmap.lax import sorting as lax_sorting
from cuvmap.numpy import linalg
from cuvmap.numpy._common import ndim, shape
from cuvmap.numpy._complex import conj
from cuvmap.numpy._creation import asarray, ones, zeros
from cuvmap.numpy._creation import promote_inexact as _inexact
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._polynomials import convolve
from cuvmap.numpy._products import matmul
from cuvmap.numpy._reductions import cumprod, sum
from cuvmap.numpy._shapes import broadcast_to, concatenate, flip, reshape




def _promoted(*xs):
    xs = [asarray(x) for x in xs]
    dtype = np.result_type(*[core.dtype_of(x) for x in xs])
    return [astype(x, dtype) for x in xs]


def _static_order(m, name):
    if isinstance(m, Tracer):
        raise core.ConcretizationError(f"{name}: the order m must be a static int, not a traced value")
    return operator.index(m)


def _host(x, name, what):
    if isinstance(x, Tracer):
        raise core.ConcretizationError(
            f"{name}: {what} needs concrete coefficients (their values decide the output shape); "
            "pass trim_leading_zeros=False under jit, vmap or grad")
    return x.get() if backend.is_cupy_array(x) else np.asarray(x)


def _leading_dim(x, name):
    if ndim(x) == 0:
        raise ShapeError(f"{name}: the coefficients must be an array of at least one dim, got a scalar")
    return shape(x)[0]


def polyadd(a1, a2):
    """``jnp.polyadd``: the coefficients of ``a1(x) + a2(x)``: the shorter array (along
    its first dim) is added into the trailing entries of the longer one (which keeps its
    shape; the shorter broadcasts against its other dims), in the promoted dtype."""
    a1, a2 = _promoted(a1, a2)
    n1, n2 = _leading_dim(a1, "polyadd"), _leading_dim(a2, "polyadd")
    longer, shorter = (a1, a2) if n2 <= n1 else (a2, a1)
    n_long, n_short = shape(longer)[0], shape(shorter)[0]
    if ndim(shorter) > ndim(longer):
        raise ShapeError(f"polyadd: coefficients of shape {shape(shorter)} do not broadcast into {shape(longer)}")
    shorter = broadcast_to(shorter, (n_short,) + shape(longer)[1:])
    pads = ((n_long - n_short, 0),) + ((0, 0),) * (ndim(longer) - 1)
    return ew.add(longer, lax_shape.pad(shorter, pads, 0))


def polysub(a1, a2):
    """``jnp.polysub``: the coefficients of ``a1(x) − a2(x)`` (:func:`polyadd` of ``−a2``)."""
    a1, a2 = _promoted(a1, a2)
    return polyadd(a1, ew.neg(a2))


def _trim_leading(x, tol, name):
    """``x`` without its leading entries of magnitude below ``tol`` (at most zero for
    ``tol=0``); all of them small gives an empty array."""
    values = np.abs(_host(x, name, "trim_leading_zeros=True"))
    small = values <= tol if tol == 0 else values < tol
    nonzero = np.flatnonzero(~small)
    start = int(nonzero[0]) if nonzero.size else shape(x)[0]
    return lax_indexing.slice_in_dim(x, start, shape(x)[0], 0)


def polymul(a1, a2, *, trim_leading_zeros=False):
    """``jnp.polymul``: the coefficients of ``a1(x) · a2(x)``, the full convolution
    ``out[k] = Σ_j a1[j] · a2[k − j]`` of the 1-D coefficient arrays, in a floating dtype.
    ``trim_leading_zeros=True`` first strips the leading zeros of each operand (NumPy's
    result length; concrete operands only)."""
    a1, a2 = _inexact(a1, a2)
    if ndim(a1) != 1 or ndim(a2) != 1:
        raise ShapeError(f"polymul: the coefficients must be 1-D, got shapes {shape(a1)} and {shape(a2)}")
    if trim_leading_zeros and (shape(a1)[0] > 1 or shape(a2)[0] > 1):
        a1, a2 = _trim_leading(a1, 0, "polymul"), _trim_leading(a2, 0, "polymul")
    if shape(a1)[0] == 0:
        a1 = zeros((1,), dtype=core.dtype_of(a2), like=a2)
    if shape(a2)[0] == 0:
        a2 = zeros((1,), dtype=core.dtype_of(a1), like=a1)
    return convolve(a1, a2, mode="full")


def polydiv(u, v, *, trim_leading_zeros=False):
    """``jnp.polydiv``: ``(q, r)`` with ``u(x) = q(x) · v(x) + r(x)``, by long division:
    for ``k = 0 … m − n`` the quotient entry ``q[k] = u_k[k] / v[0]`` and ``u_{k+1} =
    u_k − q[k] · v`` shifted to ``k``. ``r`` keeps ``u``'s length (its leading entries are
    the cancelled, numerically small ones) unless ``trim_leading_zeros=True`` strips those
    of magnitude below ``√eps`` (NumPy's length; concrete operands only)."""
    u, v = _inexact(u, v)
    if ndim(u) != 1 or ndim(v) != 1:
        raise ShapeError(f"polydiv: the coefficients must be 1-D, got shapes {shape(u)} and {shape(v)}")
    m, n = shape(u)[0] - 1, shape(v)[0] - 1
    if n < 0:
        raise ShapeError("polydiv: the divisor v must not be empty")
    scale = ew.div(1, reshape(lax_indexing.slice_in_dim(v, 0, 1, 0), ()))
    quotient = []
    for k in range(m - n + 1):
        d = ew.mul(scale, reshape(lax_indexing.slice_in_dim(u, k, k + 1, 0), ()))
        quotient.append(reshape(d, (1,)))
        u = ew.sub(u, lax_shape.pad(ew.mul(d, v), ((k, m - n - k),), 0))
    if quotient:
        q = concatenate(quotient)
    else:
        q = zeros((1,), dtype=core.dtype_of(u), like=u)
    if trim_leading_zeros:
        u = _trim_leading(u, float(np.sqrt(np.finfo(core.dtype_of(u)).eps)), "polydiv")
    return q, u


def polyder(p, m=1):
    """``jnp.polyder``: the coefficients of the ``m``-th derivative: entry ``i`` of
    ``p[:n−m]`` times the falling factorial ``(n−1−i)(n−2−i)…(n−m−i)`` of its power, in a
    floating dtype (``m`` static)."""
    m = _static_order(m, "polyder")
    (p,) = _inexact(p)
    if ndim(p) != 1:
        raise ShapeError(f"polyder: p must be 1-D, got shape {shape(p)}")
    if m < 0:
        raise ValueError(f"polyder: the order m must be non-negative, got {m}")
    if m == 0:
        return p
    n = shape(p)[0]
    powers = np.arange(n - 1, m - 1, -1)
    factor = np.prod(powers[None, :] - np.arange(m)[:, None], axis=0) if powers.size else powers
    kept = lax_indexing.slice_in_dim(p, 0, builtins.max(n - m, 0), 0)
    return ew.mul(kept, backend.xp_of(p).asarray(factor.astype(core.dtype_of(p))))


def polyint(p, m=1, k=None):
    """``jnp.polyint``: the coefficients of the ``m``-th antiderivative: ``p``'s entry of
    power ``j`` divided by ``(j+1)(j+2)…(j+m)``, followed by the ``m`` integration
    constants ``k`` (a scalar, one value or ``m`` values; default 0), each divided by its
    own factorial factor as NumPy's repeated integration gives, in a floating dtype
    (``m`` static)."""
    m = _static_order(m, "polyint")
    if m < 0:
        raise ValueError(f"polyint: the order m must be non-negative, got {m}")
    p, k = _inexact(p, 0 if k is None else k)
    if ndim(p) != 1:
        raise ShapeError(f"polyint: p must be 1-D, got shape {shape(p)}")
    if ndim(k) == 0:
        k = reshape(k, (1,))
    if ndim(k) != 1 or shape(k)[0] not in (1, m):
        if not (m == 0 and shape(k)[0] in (0, 1)):
            raise ValueError(f"polyint: k must be a scalar or a 1-D array of length 1 or m={m}, got shape {shape(k)}")
    if m == 0:
        return p
    if shape(k)[0] == 1:
        k = broadcast_to(k, (m,))
    total = shape(p)[0] + m
    grid = np.arange(total)[None, :] - np.arange(m)[:, None]
    divisor = np.prod(np.maximum(1, grid), axis=0)[::-1]
    return ew.div(concatenate((p, k)), backend.xp_of(p).asarray(divisor.astype(core.dtype_of(p))))


def poly(seq_of_zeros):
    """``jnp.poly``: the monic polynomial with the given roots, ``Π_k (x − z_k)``, as
    coefficients: the convolution of the factors ``[1, −z_k]``, in a floating dtype (a
    scalar counts as one root; no roots gives ``1``). Of a non-empty square matrix, the
    characteristic polynomial: the roots are its eigenvalues (``linalg.eigvals``, complex,
    as in JAX)."""
    (z,) = _inexact(seq_of_zeros)
    if ndim(z) == 0:
        z = reshape(z, (1,))
    if ndim(z) == 2 and shape(z)[0] == shape(z)[1] and shape(z)[0] != 0:
        z = linalg.eigvals(z)
    if ndim(z) != 1:
        raise ShapeError(f"poly: the roots must be 1-D or a non-empty square matrix, got shape {shape(z)}")
    dtype = core.dtype_of(z)
    if shape(z)[0] == 0:
        return ones((), dtype=dtype, like=z)
    a = ones((1,), dtype=dtype, like=z)
    one = ones((1,), dtype=dtype, like=z)
    for i in range(shape(z)[0]):
        factor = concatenate((one, ew.neg(lax_indexing.slice_in_dim(z, i, i + 1, 0))))
        a = convolve(a, factor, mode="full")
    return a


def vander(x, N=None, increasing=False):  # noqa: N803 - jax.numpy's name
    """``jnp.vander``: the Vandermonde matrix of the 1-D ``x``, ``out[i, j] =
    x[i]^(N−1−j)`` (``x[i]^j`` with ``increasing``), ``N`` columns (default ``len(x)``).
    The powers are running products of ``x`` (``cumprod``), so the derivative is exact
    also at ``x = 0``."""
    x = asarray(x)
    if ndim(x) != 1:
        raise ShapeError(f"vander: x must be 1-D, got shape {shape(x)}")
    n = shape(x)[0]
    N = n if N is None else _static_order(N, "vander")  # noqa: N806
    if N < 0:
        raise ValueError(f"vander: N must be non-negative, got {N}")
    if N == 0:
        return zeros((n, 0), dtype=core.dtype_of(x), like=x)
    first = ones((n, 1), dtype=core.dtype_of(x), like=x)
    factors = concatenate((first, broadcast_to(reshape(x, (n, 1)), (n, N - 1))), axis=1)
    powers = cumprod(factors, axis=1, dtype=core.dtype_of(x))
    return powers if increasing else flip(powers, 1)


def polyfit(x, y, deg, rcond=None, full=False, w=None, cov=False):
    """``jnp.polyfit``: the least-squares polynomial of degree ``deg`` through ``(x, y)``:
    ``p = argmin Σ_i (w_i (y_i − p(x_i)))²``, solved with :func:`cuvmap.numpy.linalg.lstsq`
    on the Vandermonde matrix with unit-norm columns (NumPy's scaling; ``rcond`` default
    ``len(x) · eps``). ``y`` may be ``(M, K)`` for ``K`` fits. ``full=True`` returns
    ``(p, residuals, rank, singular_values, rcond)``; ``cov=True`` also the coefficients'
    covariance, scaled by ``residuals / (M − deg − 1)`` (``cov='unscaled'``: not scaled)."""
    deg = _static_order(deg, "polyfit")
    if deg < 0:
        raise ValueError(f"polyfit: deg must be non-negative, got {deg}")
    x, y = _inexact(x, y)
    order = deg + 1
    if ndim(x) != 1:
        raise ShapeError(f"polyfit: x must be 1-D, got shape {shape(x)}")
    if shape(x)[0] == 0:
        raise ShapeError("polyfit: x must not be empty")
    if ndim(y) not in (1, 2) or shape(y)[0] != shape(x)[0]:
        raise ShapeError(f"polyfit: y must be (M,) or (M, K) with M = len(x) = {shape(x)[0]}, got {shape(y)}")
    if rcond is None:
        rcond = shape(x)[0] * float(np.finfo(core.dtype_of(x)).eps)
    lhs = vander(x, order)
    rhs = y
    if w is not None:
        (w,) = _promoted(w)
        w = astype(w, core.dtype_of(x))
        if ndim(w) != 1 or shape(w)[0] != shape(y)[0]:
            raise ShapeError(f"polyfit: w must be 1-D of length {shape(y)[0]}, got shape {shape(w)}")
        lhs = ew.mul(lhs, reshape(w, (shape(w)[0], 1)))
        rhs = ew.mul(rhs, reshape(w, (shape(w)[0], 1)) if ndim(rhs) == 2 else w)
    scale = ew.sqrt(sum(ew.mul(lhs, lhs), axis=0))
    lhs = ew.div(lhs, reshape(scale, (1, order)))
    c, resids, rank, s = linalg.lstsq(lhs, rhs, rcond)
    c = ew.div(c, reshape(scale, (order, 1)) if ndim(c) == 2 else scale)
    if full:
        return c, resids, rank, s, asarray(rcond)
    if not cov:
        return c
    base = linalg.inv(matmul(conj(lax_shape.transpose(lhs, (1, 0))), lhs))  # (lhsᴴ lhs)⁻¹
    base = ew.div(base, ew.mul(reshape(scale, (order, 1)), reshape(scale, (1, order))))
    if cov == "unscaled":
        fac = asarray(np.asarray(1.0, dtype=core.dtype_of(x)))
    else:
        if shape(x)[0] <= order:
            raise ValueError("polyfit: the number of data points must exceed order to scale the covariance matrix")
        fac = ew.div(resids, shape(x)[0] - order)
    if ndim(y) == 1:
        return c, ew.mul(base, reshape(fac, ()) if ndim(fac) else fac)
    fac = reshape(fac, (1, 1, builtins.max(1, int(np.prod(shape(fac), dtype=np.int64)))))
    return c, ew.mul(reshape(base, (order, order, 1)), fac)



def roots(p, *, strip_zeros=True):
    """``jnp.roots``: the roots of the polynomial with coefficients ``p`` (1-D, highest
    degree first), the eigenvalues of its companion matrix ``C`` (first row ``−p[1:]/p[0]``,
    ones below the diagonal), complex, in LAPACK's order; differentiable where the roots
    are simple. With ``strip_zeros=True`` leading zeros of ``p`` are dropped first, which
    needs a concrete ``p`` (as JAX); ``strip_zeros=False`` works on traced values: the ``k``
    leading zeros are moved to the end, the zero roots this adds sorted last and the last
    ``k`` roots set to NaN (JAX's convention)."""
    (p,) = _inexact(p)
    if ndim(p) == 0:
        p = reshape(p, (1,))
    if ndim(p) != 1:
        raise ShapeError(f"roots: the coefficients must be 1-D, got shape {shape(p)}")
    n = shape(p)[0]
    complex_dtype = np.result_type(core.dtype_of(p), np.complex64)
    if n < 2:
        return zeros((0,), dtype=complex_dtype, like=p)
    if strip_zeros:
        host = _known_value(p)
        nonzero = np.flatnonzero(host != 0)
        first = int(nonzero[0]) if nonzero.size else n
        return _companion_roots(lax_indexing.slice_in_dim(p, first, n, 0), complex_dtype)
    is_zero = ew.eq(p, 0)
    leading = sum(cumprod(astype(is_zero, np.int64)))                 # the number of leading zeros
    p = ew.select(ew.eq(leading, n), ew.add(ew.mul(p, 0.0), 1.0), p)  # all zero: no LAPACK NaNs
    rolled = lax_indexing.take(p, ew.remainder(ew.add(lax_indexing.iota(n, like=p), leading), n), 0)
    r = _companion_roots(rolled, complex_dtype)
    _, r = lax_sorting.sort((astype(ew.eq(r, 0), np.int64), r), 0, num_keys=1)
    keep = ew.lt(lax_indexing.iota(n - 1, like=p), ew.sub(n - 1, leading))
    return ew.select(keep, r, ew.add(ew.mul(r, 0.0), complex(np.nan, np.nan)))


def _known_value(p):
    """``p``'s values on the host: of a concrete array, or of the primal a derivative
    tracer carries (known under eager ``grad``, as in JAX); otherwise a ConcretizationError."""
    value = p
    while isinstance(value, PrimalTracer):
        value = value._concrete_value()
    if isinstance(value, Tracer):
        raise core.ConcretizationError(
            "roots: strip_zeros=True needs concrete coefficients (it drops the leading zeros); under jit or "
            "vmap pass strip_zeros=False (leading zeros then give NaN roots)")
    return value.get() if hasattr(value, "get") else np.asarray(value)


def _companion_roots(p, complex_dtype):
    """The eigenvalues of the companion matrix of the 1-D ``p`` (``p[0] ≠ 0``)."""
    m = shape(p)[0] - 1
    if m < 1:
        return zeros((0,), dtype=complex_dtype, like=p)
    lead = lax_indexing.slice_in_dim(p, 0, 1, 0)
    first_row = reshape(ew.neg(ew.div(lax_indexing.slice_in_dim(p, 1, m + 1, 0), lead)), (1, m))
    below = backend.device_put(np.eye(m - 1, m, dtype=core.dtype_of(p)), backend.backend_name(p))
    companion = concatenate((first_row, below), 0) if m > 1 else first_row
    return astype(linalg.eigvals(companion), complex_dtype)
