"""Reductions over axes: ``sum``, ``mean``, ``var``, ``std``, ``max``, ``min``,
``prod`` (exact derivatives at zeros), ``any``, ``all``, ``argmax``, ``argmin``,
``logsumexp``, ``cumsum``, ``cumprod``, ``sort``, ``argsort`` and ``trace``."""
import builtins

import numpy as np

from cuvmap import core
from cuvmap.lax import cumulative as lax_cumulative
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import reduction as lax_reduction
from cuvmap.lax import shape as lax_shape
from cuvmap.lax import sorting as lax_sorting
from cuvmap.numpy._common import _axes, _axis, ndim, shape
from cuvmap.numpy._elementwise import astype, square, stop_gradient, where
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._shapes import broadcast_to, diagonal, flip, ravel
from cuvmap.core.bfloat16 import kind_of


def _keep(out, x, axes, keepdims):
    if not keepdims:
        return out
    return lax_shape.reshape(out, tuple(1 if i in axes else s for i, s in enumerate(shape(x))))


def _accumulate_in(x, dtype):
    """``x`` in the dtype NumPy accumulates ``sum``, ``prod``, ``cumsum`` and ``cumprod``
    in: ``dtype`` when given, else booleans and signed integers narrower than the
    platform integer in ``np.int_`` (int64), unsigned ones in ``np.uint``; floats and
    complex numbers keep theirs (as NumPy and JAX with 64-bit types)."""
    if dtype is not None:
        return astype(x, dtype)
    dt = np.dtype(core.dtype_of(x))
    if dt == np.bool_ or (kind_of(dt) == "i" and dt.itemsize < np.dtype(np.int_).itemsize):
        return astype(x, np.int_)
    if kind_of(dt) == "u" and dt.itemsize < np.dtype(np.uint).itemsize:
        return astype(x, np.uint)
    return x


# NOTE [reductions' positional arguments]
# The reductions take jax.numpy's signatures (``sum(a, axis, dtype, out, keepdims, ...)``,
# ``max(a, axis, out, keepdims, ...)``). Before they did, cuvmap's took ``keepdims`` third
# (``sum(x, axes, keepdims)``), and callers of that form remain (cuvmap.numpy.linalg calls
# ``sum``, ``max`` and ``min`` so). A
# bool in the third place is never a dtype or an ``out`` array, so ``_legacy_keepdims``
# reads it as ``keepdims``: both forms give the same answer, and no NumPy/JAX call changes
# meaning.


def _legacy_keepdims(third, keepdims):
    if isinstance(third, (bool, np.bool_)):
        return None, bool(third)
    return third, keepdims


def _no_out(name, out):
    if out is not None:
        raise NotImplementedError(f"{name}: out= is not supported (arrays are immutable)")


def _masked(x, where_, fill):
    """``x`` with the entries outside the mask ``where_`` replaced by ``fill``."""
    return x if where_ is None else where(where_, x, fill)


def sum(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None,  # noqa: A001
        promote_integers=True):
    """``jnp.sum``: the sum over ``axis`` (an int, a tuple or ``None``: all), accumulated in
    NumPy's dtype (:func:`_accumulate_in`) or ``dtype``; ``initial`` is added, and entries
    outside the mask ``where`` count as 0."""
    dtype, keepdims = _legacy_keepdims(dtype, keepdims)
    _no_out("sum", out)
    a = asarray(a)
    axes = _axes(a, axis, "sum")
    a = _masked(_accumulate_in(a, dtype), where, 0)
    total = _keep(lax_reduction.reduce_sum(a, axes), a, axes, keepdims)
    return total if initial is None else ew.add(total, initial)


# NOTE [half precision accumulates in float32]
# A float16 count or sum overflows past 65504 and stops counting at 2048 (its largest
# consecutive integer), so that the mean of 70,000 float16 ones would be inf/inf = NaN and
# a gradient 1/count flush to 0. NumPy and JAX (``_upcast_f16``) accumulate means and
# variances of float16 in float32 and round the result back, and so does cuvmap: the casts
# are primitives, so ``jit`` (and the fused GPU kernels) and the derivatives see the
# float32 accumulation too. (A float16 ``sum`` keeps NumPy's float16 pairwise sum: its
# result is float16 either way.)
def _upcast_half(x):
    """``(x in float32, float16)`` for a float16 ``x``, else ``(x, None)``."""
    if np.dtype(core.dtype_of(x)) == np.float16:
        return astype(x, np.float32), np.float16
    return x, None


def _round_back(out, dtype):
    return out if dtype is None else astype(out, dtype)


def _count(x, axes, keepdims, where_):
    """The number of entries reduced over ``axes`` (those inside ``where_``)."""
    if where_ is None:
        return int(np.prod([shape(x)[a] for a in axes], dtype=np.int64))
    mask = lax_shape.broadcast_to(where_, shape(x)) if shape(where_) != shape(x) else where_
    return sum(astype(mask, core.dtype_of(x)), axes, keepdims=keepdims)


def mean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=None):
    """``jnp.mean``: the sum over ``axis`` divided by the number of entries (those inside
    the mask ``where``); integers are averaged in float64, or in ``dtype``; float16 is
    accumulated in float32 (NOTE [half precision accumulates in float32])."""
    _no_out("mean", out)
    a = asarray(a)
    axes = _axes(a, axis, "mean")
    if dtype is not None:
        a = astype(a, dtype)
    elif not core.is_float(a):
        a = astype(a, np.float64)
    a, half = _upcast_half(a)
    return _round_back(ew.div(sum(a, axes, keepdims=keepdims, where=where), _count(a, axes, keepdims, where)), half)


_mean = mean   # var and std take a parameter named mean (JAX's)


def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None, correction=None, mean=None):
    """``jnp.var``: ``Σ (a − mean)² / (N − ddof)`` over ``axis`` (``correction`` is the
    array API's name for ``ddof``); entries outside the mask ``where`` are left out;
    ``mean`` (with the reduced dims kept, as NumPy takes it) replaces the computed mean."""
    _no_out("var", out)
    if correction is not None:
        ddof = correction
    a = asarray(a)
    axes = _axes(a, axis, "var")
    if dtype is not None:
        a = astype(a, dtype)
    elif not core.is_float(a):
        a = astype(a, np.float64)
    a, half = _upcast_half(a)   # NOTE [half precision accumulates in float32]
    center = _mean(a, axes, keepdims=True, where=where) if mean is None else astype(asarray(mean), core.dtype_of(a))
    centered = ew.sub(a, center)
    if kind_of(core.dtype_of(centered)) == "c":  # |a − mean|², real (numpy.var of complex numbers)
        squared = ew.real(ew.mul(ew.conj(centered), centered))
    else:
        squared = square(centered)
    count = _count(a, axes, keepdims, where)
    dof = count - ddof if isinstance(count, int) else ew.sub(count, ddof)
    return _round_back(ew.div(sum(squared, axes, keepdims=keepdims, where=where), dof), half)


def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None, correction=None, mean=None):
    """``jnp.std``: ``sqrt(var(a))``. Where the variance is zero (a constant slice) the
    derivative is 0 (a subgradient), not the NaN of sqrt's ``1/(2·0)`` times a zero
    derivative, as autograd's ``std``."""
    v = var(a, axis, dtype, out, ddof, keepdims, where=where, correction=correction, mean=mean)
    positive = ew.gt(v, 0)
    return ew.select(positive, ew.sqrt(ew.select(positive, v, 1)), ew.mul(v, 0))


def _extremum(name, reduce, fill, combine):
    def fn(x, axis=None, out=None, keepdims=False, initial=None, where=None):
        out, keepdims = _legacy_keepdims(out, keepdims)
        _no_out(name, out)
        x = asarray(x)
        axes = _axes(x, axis, name)
        if where is not None:
            if initial is None:
                raise ValueError(f"{name}: reducing with where= needs initial= (a slice may be empty)")
            x = _masked(x, where, initial)
        if initial is None and _any_empty(x, axes):
            raise ValueError(f"{name}: zero-size array to reduction operation {name} which has no identity")
        if _any_empty(x, axes):  # every slice is empty: the result is initial
            out_shape = tuple(1 if a in axes else n for a, n in enumerate(shape(x)) if keepdims or a not in axes)
            return broadcast_to(astype(asarray(initial), core.dtype_of(x)), out_shape)
        result = _keep(reduce(x, axes), x, axes, keepdims)
        return result if initial is None else combine(result, initial)
    fn.__name__ = name
    fn.__doc__ = (f"``jnp.{name}``: the {'largest' if name == 'max' else 'smallest'} entry over ``axis`` "
                  f"(compared with ``initial`` when given; entries outside the mask ``where`` are "
                  f"``initial``). The derivative goes to the extreme entries, shared at ties.")
    return fn


def _any_empty(x, axes):
    return builtins.any(shape(x)[a] == 0 for a in axes)


max = _extremum("max", lax_reduction.reduce_max, None, ew.max)  # noqa: A001
min = _extremum("min", lax_reduction.reduce_min, None, ew.min)  # noqa: A001
amax, amin = max, min


def _arg(name, reduce):
    def fn(x, axis=None, out=None, keepdims=None):
        _no_out(name, out)
        x = asarray(x)
        if axis is None:
            index = reduce(ravel(x), 0)
            return lax_shape.reshape(index, (1,) * ndim(x)) if keepdims else index
        a = _axis(x, axis, name)
        index = reduce(x, a)
        return lax_shape.expand_dims(index, (a,)) if keepdims else index
    fn.__name__ = name
    fn.__doc__ = (f"``jnp.{name}``: the int64 index of the {'largest' if name == 'argmax' else 'smallest'} "
                  f"entry along ``axis`` (of the flattened array for ``None``); the first at ties.")
    return fn


argmax = _arg("argmax", lax_reduction.argmax)
argmin = _arg("argmin", lax_reduction.argmin)


def logsumexp(x, axis=None, keepdims=False):
    """``log(sum(exp(x)))`` computed stably by shifting with the (constant) maximum; float16
    accumulated in float32 (NOTE [half precision accumulates in float32])."""
    axes = _axes(x, axis, "logsumexp")
    x, half = _upcast_half(x)
    if half is not None:
        return _round_back(logsumexp(x, axes, keepdims), half)
    m = stop_gradient(max(x, axes, keepdims=True))
    m = where(ew.eq(ew.abs(m), np.inf), 0.0, m)
    out = ew.add(ew.log(sum(ew.exp(ew.sub(x, m)), axes, keepdims=True)), m)
    return out if keepdims else lax_shape.reshape(out, tuple(s for i, s in enumerate(shape(x)) if i not in axes))


def _pairwise_product(y):
    """The product along the last axis of ``y`` as a tree of pairwise products: ⌈log₂ n⌉
    rounds of one multiplication each (an odd length is padded with a 1)."""
    nd = ndim(y)
    n = shape(y)[-1]
    while n > 1:
        if n % 2:
            y = lax_shape.pad(y, ((0, 0),) * (nd - 1) + ((0, 1),), 1)
            n += 1
        y = ew.mul(lax_indexing.slice_in_dim(y, 0, n, nd - 1, 2), lax_indexing.slice_in_dim(y, 1, n, nd - 1, 2))
        n //= 2
    return y


def prod(x, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None, promote_integers=True):
    """``jnp.prod``: the product over ``axis``, in NumPy's dtype (:func:`_accumulate_in`);
    ``initial`` multiplies it and entries outside the mask ``where`` count as 1. Computed as a tree of pairwise
    products (the tree JAX's ``reduce_prod`` differentiates), so its derivative — the
    product of the other elements — is exact where ``x`` has zeros, with no division."""
    _no_out("prod", out)
    x = asarray(x)
    axes = _axes(x, axis, "prod")
    x = _masked(_accumulate_in(x, dtype), where, 1)
    if initial is not None:
        return ew.mul(prod(x, axes, keepdims=keepdims), initial)
    s = shape(x)
    kept = tuple(i for i in range(len(s)) if i not in axes)
    out_shape = tuple(s[i] for i in kept)
    n = int(np.prod([s[a] for a in axes], dtype=np.int64))
    if n == 0:
        out = core.full_like_concrete(x, 1, shape=out_shape)
    else:
        y = lax_shape.reshape(lax_shape.transpose(x, kept + axes), out_shape + (n,))
        out = lax_shape.reshape(_pairwise_product(y), out_shape)
    return _keep(out, x, axes, keepdims)


def any(x, axis=None, out=None, keepdims=False, *, where=None):  # noqa: A001
    """``jnp.any``: whether any element over ``axis`` (inside the mask ``where``) is nonzero
    (a boolean; no derivative)."""
    _no_out("any", out)
    x = _masked(asarray(x), where, 0)
    axes = _axes(x, axis, "any")
    out = ew.gt(lax_reduction.reduce_sum(ew.ne(x, 0), axes), 0)
    return _keep(out, x, axes, keepdims)


def all(a, axis=None, out=None, keepdims=False, *, where=None):  # noqa: A001
    """``jnp.all``: whether every element over ``axis`` (inside the mask ``where``) is
    nonzero (NaN counts as nonzero); a boolean."""
    _no_out("all", out)
    a = _masked(asarray(a), where, 1)
    axes = _axes(a, axis, "all")
    out = ew.eq(lax_reduction.reduce_sum(ew.eq(a, 0), axes), 0)
    return _keep(out, a, axes, keepdims)


def _flattened(a, axis, name):
    """``(a, axis)``, flattened to one dim for ``axis=None`` as NumPy's cumulative functions do."""
    a = asarray(a)
    if axis is None:
        return ravel(a), 0
    return a, _axis(a, axis, name)


def cumsum(a, axis=None, dtype=None, out=None):
    """Running sums along ``axis`` (``None``: of the flattened array), in NumPy's dtype
    (:func:`_accumulate_in`)."""
    _no_out("cumsum", out)
    a, axis = _flattened(a, axis, "cumsum")
    a = _accumulate_in(a, dtype)
    return lax_cumulative.cumsum(a, axis)


def cumprod(a, axis=None, dtype=None, out=None):
    """Running products along ``axis`` (``None``: of the flattened array); the derivative is
    exact where ``a`` has zeros (NOTE [cumprod's derivatives without division]); in
    NumPy's dtype (:func:`_accumulate_in`)."""
    _no_out("cumprod", out)
    a, axis = _flattened(a, axis, "cumprod")
    a = _accumulate_in(a, dtype)
    return lax_cumulative.cumprod(a, axis)


def _check_sort_args(name, kind, order):
    if order is not None:
        raise NotImplementedError(f"{name}: order= (fields of structured arrays) is not supported")
    if kind not in (None, "stable", "mergesort", "quicksort", "heapsort"):
        raise ValueError(f"{name}: unknown kind {kind!r}")


def sort(a, axis=-1, *, kind=None, order=None, stable=True, descending=False):
    """``a`` sorted along ``axis`` (``None``: flattened), NaNs last. Always stable (``kind``
    and ``stable`` are accepted for compatibility); ``descending`` reverses the order. The
    derivative follows the sorting permutation (see ``cuvmap/lax/sorting.py``)."""
    _check_sort_args("sort", kind, order)
    a, axis = _flattened(a, axis, "sort")
    out = lax_sorting.sort(a, axis)
    return flip(out, axis) if descending else out


def argsort(a, axis=-1, *, kind=None, order=None, stable=True, descending=False, dtype=None):
    """The indices that sort ``a`` along ``axis`` (``None``: flattened), int64 or the
    integer ``dtype``. Stable, also with ``descending=True``: equal elements keep their
    order, as in JAX."""
    _check_sort_args("argsort", kind, order)
    if dtype is not None and kind_of(np.dtype(dtype)) not in "iu":
        raise ValueError(f"argsort: dtype must be an integer dtype, got {np.dtype(dtype)}")
    a, axis = _flattened(a, axis, "argsort")
    if not descending:
        idx = lax_sorting.argsort(a, axis)
    else:
        # sorting the reversed array ascending and reversing the result keeps ties in their
        # original order; indices into the reversed array i are n − 1 − i in a
        n = shape(a)[axis]
        idx = flip(ew.sub(n - 1, lax_sorting.argsort(flip(a, axis), axis)), axis)
    return idx if dtype is None else astype(idx, dtype)


def trace(a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    """The sum of :func:`diagonal` ``offset``. JAX: ``jax.numpy.trace`` (``out`` refused)."""
    _no_out("trace", out)
    return sum(diagonal(a, offset, axis1, axis2), axis=-1, dtype=dtype)
