"""NumPy-named functions that work on arrays and on tracers alike (like ``jax.numpy``).

Every function here is a composite of :mod:`cuvmap.lax` primitives and adds no primitive
of its own, so it is transformable by construction. Arrays stay plain ``numpy.ndarray``
or ``cupy.ndarray``. This module also gives tracers their operators and methods
(``+ - * / ** @``, comparisons, ``& | ^ ~ << >>``, indexing, ``.T``, ``.reshape``,
``.sum``, ...), and holds ``cuvmap.numpy.linalg`` (``norm``, ``vector_norm``,
``matrix_norm``, ``svd``, ``svdvals``).
"""
import builtins
import collections
import sys
import types

import numpy as np

from cuvmap import backend, core
from cuvmap import lax
from cuvmap.core import ShapeError, Tracer
from cuvmap.lax import cumulative as lax_cumulative
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import linalg as lax_linalg
from cuvmap.lax import reduction as lax_reduction
from cuvmap.lax import shape as lax_shape
from cuvmap.lax import sorting as lax_sorting

# dtypes and constants, re-exported for convenience
float32 = np.float32
float64 = np.float64
int32 = np.int32
int64 = np.int64
bool_ = np.bool_
pi = np.pi
inf = np.inf
newaxis = None

shape = core.shape_of


def ndim(x):
    return len(core.shape_of(x))


def size(x):
    return int(np.prod(core.shape_of(x), dtype=np.int64))


def _axes(x, axis, name=None):
    """Normalizes ``axis`` (None, int or tuple, negatives allowed) to a sorted tuple;
    errors name the function ``name``."""
    n = ndim(x)
    if axis is None:
        return tuple(range(n))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    out = []
    for a in axis:
        if not -n <= a < n:
            prefix = f"{name}: " if name else ""
            raise ShapeError(f"{prefix}axis {a} is out of range for an array of shape {shape(x)}")
        out.append(int(a) % n)
    return tuple(sorted(out))


def _axis(x, axis, name=None):
    return _axes(x, axis, name)[0]


# ---------------------------------------------------------------------------------------
# Creation
# ---------------------------------------------------------------------------------------


def _holds_tracer(x):
    if isinstance(x, Tracer):
        return True
    return isinstance(x, (list, tuple)) and builtins.any(_holds_tracer(e) for e in x)


def asarray(x, dtype=None):
    """Tracers pass through; nested lists and tuples that hold tracers are stacked into one
    (as ``jnp.asarray([t.sum(), t.mean()])``); anything else becomes a NumPy array (or
    stays a CuPy one). No copy is made when none is needed."""
    if isinstance(x, Tracer):
        return x if dtype is None else astype(x, dtype)
    if isinstance(x, (list, tuple)) and _holds_tracer(x):
        if not x:
            return np.asarray(x, dtype=dtype)
        out = stack([asarray(e) for e in x])
        return out if dtype is None else astype(out, dtype)
    if backend.is_cupy_array(x):
        return x if dtype is None else x.astype(dtype)
    return np.asarray(x, dtype=dtype)


def array(x, dtype=None):
    """Like :func:`asarray`, but a concrete array is always copied (as ``numpy.array``)."""
    if isinstance(x, Tracer) or (isinstance(x, (list, tuple)) and _holds_tracer(x)):
        return asarray(x, dtype)
    if backend.is_cupy_array(x):
        return x.astype(x.dtype if dtype is None else dtype, copy=True)
    return np.array(x, dtype=dtype)


def zeros_like(x, dtype=None):
    """Zeros with ``x``'s (logical) shape, dtype and backend: a constant, not a tracer."""
    return core.full_like_concrete(x, 0, dtype=dtype)


def ones_like(x, dtype=None):
    return core.full_like_concrete(x, 1, dtype=dtype)


def full_like(x, fill_value, dtype=None):
    return core.full_like_concrete(x, fill_value, dtype=dtype)


def _creation_module(like):
    """Creation functions have no array operand to decide the device: ``like`` (an array
    or tracer) picks NumPy or CuPy, as NumPy's ``like=`` does; the default is the CPU."""
    return np if like is None else backend.xp_of(like)


def zeros(shape, dtype=np.float64, like=None):
    return _creation_module(like).zeros(shape, dtype=dtype)


def ones(shape, dtype=np.float64, like=None):
    return _creation_module(like).ones(shape, dtype=dtype)


def full(shape, fill_value, dtype=None, like=None):
    return _creation_module(like).full(shape, fill_value, dtype=dtype)


def arange(*args, dtype=None, like=None):
    return _creation_module(like).arange(*args, dtype=dtype)


def eye(n, m=None, dtype=np.float64, like=None):
    return _creation_module(like).eye(n, m, dtype=dtype)


# ---------------------------------------------------------------------------------------
# Elementwise
# ---------------------------------------------------------------------------------------

add = ew.add
subtract = ew.sub
multiply = ew.mul
divide = true_divide = ew.div
floor_divide = ew.floor_divide
remainder = mod = ew.remainder
negative = ew.neg
exp = ew.exp
log = ew.log
log1p = ew.log1p
expm1 = ew.expm1
sqrt = ew.sqrt
tanh = ew.tanh
sin = ew.sin
cos = ew.cos
sinh = ew.sinh
cosh = ew.cosh
arctan = ew.atan
arctan2 = ew.atan2
arcsinh = ew.asinh
log2 = ew.log2
log10 = ew.log10
erf = ew.erf
floor = ew.floor
ceil = ew.ceil
abs = absolute = ew.abs  # noqa: A001
sign = ew.sign
maximum = ew.max
minimum = ew.min
equal = ew.eq
not_equal = ew.ne
less = ew.lt
less_equal = ew.le
greater = ew.gt
greater_equal = ew.ge
stop_gradient = ew.stop_gradient


def power(x, y):
    """``x ** y``; a Python int exponent uses ``integer_pow`` (exact, differentiable at 0)."""
    if isinstance(y, (int, np.integer)) and not isinstance(y, bool):
        return ew.integer_pow(x, int(y))
    return ew.pow(x, y)


def square(x):
    return ew.integer_pow(x, 2)


def reciprocal(x):
    return ew.div(1, x)


def sigmoid(x):
    return ew.logistic(x)


def where(condition, x, y):
    """``x`` where ``condition`` holds, else ``y`` (all three broadcast)."""
    return ew.select(condition, x, y)


def round(x, decimals=0):  # noqa: A001
    """Rounds to ``decimals`` decimal places, halves to even; integers stay as they are.
    Piecewise constant: its derivative is zero."""
    return ew.round(x, decimals)


around = round


def clip(x, a_min=None, a_max=None, *, min=None, max=None):  # noqa: A002 - NumPy's names
    """``minimum(maximum(x, a_min), a_max)``, broadcasting all three; the bounds may be
    arrays or traced values (NumPy 2's keywords ``min``/``max`` work too). As in JAX the
    derivative flows to ``x`` inside the bounds and to the bound that clips outside,
    shared evenly where ``x`` equals a bound; ``a_min > a_max`` gives ``a_max``."""
    if min is not None:
        if a_min is not None:
            raise TypeError("clip: give min or a_min, not both")
        a_min = min
    if max is not None:
        if a_max is not None:
            raise TypeError("clip: give max or a_max, not both")
        a_max = max
    if a_min is not None:
        x = ew.max(x, a_min)
    if a_max is not None:
        x = ew.min(x, a_max)
    return x


def astype(x, dtype):
    dtype = np.dtype(dtype)
    if core.dtype_of(x) == dtype and not isinstance(x, (int, float, bool)):
        return x
    return ew.convert_element_type(x, dtype)


# ---------------------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------------------


def _keep(out, x, axes, keepdims):
    if not keepdims:
        return out
    return lax_shape.reshape(out, tuple(1 if i in axes else s for i, s in enumerate(shape(x))))


def sum(x, axis=None, keepdims=False, dtype=None):  # noqa: A001
    axes = _axes(x, axis, "sum")
    if core.dtype_of(x) == np.bool_:
        x = astype(x, np.int64)
    out = _keep(lax_reduction.reduce_sum(x, axes), x, axes, keepdims)
    return out if dtype is None else astype(out, dtype)


def mean(x, axis=None, keepdims=False):
    axes = _axes(x, axis, "mean")
    count = int(np.prod([shape(x)[a] for a in axes], dtype=np.int64))
    if not core.is_float(x):
        x = astype(x, np.float64)
    return ew.div(sum(x, axes, keepdims), count)


def var(x, axis=None, keepdims=False, ddof=0):
    axes = _axes(x, axis, "var")
    count = int(np.prod([shape(x)[a] for a in axes], dtype=np.int64))
    centered = ew.sub(x, mean(x, axes, keepdims=True))
    return ew.div(sum(square(centered), axes, keepdims), count - ddof)


def std(x, axis=None, keepdims=False, ddof=0):
    return ew.sqrt(var(x, axis, keepdims, ddof))


def max(x, axis=None, keepdims=False):  # noqa: A001
    axes = _axes(x, axis, "max")
    return _keep(lax_reduction.reduce_max(x, axes), x, axes, keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001
    axes = _axes(x, axis, "min")
    return _keep(lax_reduction.reduce_min(x, axes), x, axes, keepdims)


amax, amin = max, min


def argmax(x, axis=None):
    if axis is None:
        return lax_reduction.argmax(ravel(x), 0)
    return lax_reduction.argmax(x, _axis(x, axis, "argmax"))


def argmin(x, axis=None):
    if axis is None:
        return lax_reduction.argmin(ravel(x), 0)
    return lax_reduction.argmin(x, _axis(x, axis, "argmin"))


def logsumexp(x, axis=None, keepdims=False):
    """``log(sum(exp(x)))`` computed stably by shifting with the (constant) maximum."""
    axes = _axes(x, axis, "logsumexp")
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


def prod(x, axis=None, keepdims=False, dtype=None):
    """The product over ``axis``; booleans multiply as int64. Computed as a tree of pairwise
    products (the tree JAX's ``reduce_prod`` differentiates), so its derivative — the
    product of the other elements — is exact where ``x`` has zeros, with no division."""
    axes = _axes(x, axis, "prod")
    if dtype is not None:
        x = astype(x, dtype)
    elif core.dtype_of(x) == np.bool_:
        x = astype(x, np.int64)
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


def any(x, axis=None, keepdims=False):  # noqa: A001
    """Whether any element over ``axis`` is nonzero (a boolean; no derivative)."""
    axes = _axes(x, axis, "any")
    out = ew.gt(lax_reduction.reduce_sum(ew.ne(x, 0), axes), 0)
    return _keep(out, x, axes, keepdims)


def all(x, axis=None, keepdims=False):  # noqa: A001
    """Whether every element over ``axis`` is nonzero (NaN counts as nonzero); a boolean."""
    axes = _axes(x, axis, "all")
    out = ew.eq(lax_reduction.reduce_sum(ew.eq(x, 0), axes), 0)
    return _keep(out, x, axes, keepdims)


def _flattened(x, axis, name):
    """``(x, axis)``, flattened to one dim for ``axis=None`` as NumPy's cumulative functions do."""
    if axis is None:
        return ravel(x), 0
    return x, _axis(x, axis, name)


def cumsum(x, axis=None, dtype=None):
    """Running sums along ``axis`` (``None``: of the flattened array); booleans count in
    int64, other dtypes keep theirs unless ``dtype`` is given."""
    x, axis = _flattened(x, axis, "cumsum")
    if dtype is not None:
        x = astype(x, dtype)
    return lax_cumulative.cumsum(x, axis)


def cumprod(x, axis=None, dtype=None):
    """Running products along ``axis`` (``None``: of the flattened array); the derivative is
    exact where ``x`` has zeros (NOTE [cumprod's derivatives without division])."""
    x, axis = _flattened(x, axis, "cumprod")
    if dtype is not None:
        x = astype(x, dtype)
    return lax_cumulative.cumprod(x, axis)


def _check_sort_args(name, kind, order):
    if order is not None:
        raise NotImplementedError(f"{name}: order= (fields of structured arrays) is not supported")
    if kind not in (None, "stable", "mergesort", "quicksort", "heapsort"):
        raise ValueError(f"{name}: unknown kind {kind!r}")


def sort(x, axis=-1, *, kind=None, order=None, stable=True, descending=False):
    """``x`` sorted along ``axis`` (``None``: flattened), NaNs last. Always stable (``kind``
    and ``stable`` are accepted for compatibility); ``descending`` reverses the order. The
    derivative follows the sorting permutation (see ``cuvmap/lax/sorting.py``)."""
    _check_sort_args("sort", kind, order)
    x, axis = _flattened(x, axis, "sort")
    out = lax_sorting.sort(x, axis)
    return flip(out, axis) if descending else out


def argsort(x, axis=-1, *, kind=None, order=None, stable=True, descending=False):
    """The int64 indices that sort ``x`` along ``axis`` (``None``: flattened). Stable, also
    with ``descending=True``: equal elements keep their order, as in JAX."""
    _check_sort_args("argsort", kind, order)
    x, axis = _flattened(x, axis, "argsort")
    if not descending:
        return lax_sorting.argsort(x, axis)
    # sorting the reversed array ascending and reversing the result keeps ties in their
    # original order; indices into the reversed array i are n − 1 − i in x
    n = shape(x)[axis]
    idx = lax_sorting.argsort(flip(x, axis), axis)
    return flip(ew.sub(n - 1, idx), axis)


# ---------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------


def reshape(x, *newshape):
    """``x.reshape(newshape)``; one entry may be -1."""
    if len(newshape) == 1 and isinstance(newshape[0], (tuple, list)):
        newshape = tuple(newshape[0])
    newshape = tuple(int(s) for s in newshape)
    total = size(x)
    if newshape.count(-1) > 1:
        raise ShapeError(f"reshape: more than one -1 in {newshape}")
    if -1 in newshape:
        known = int(np.prod([s for s in newshape if s != -1], dtype=np.int64))
        if known == 0 or total % known:
            raise ShapeError(f"reshape: cannot reshape {shape(x)} ({total} elements) to {newshape}")
        newshape = tuple(total // known if s == -1 else s for s in newshape)
    return lax_shape.reshape(x, newshape)


def ravel(x):
    return reshape(x, (-1,))


def transpose(x, axes=None):
    if axes is None:
        axes = tuple(range(ndim(x)))[::-1]
    n = ndim(x)
    return lax_shape.transpose(x, tuple(int(a) % n for a in axes))


def swapaxes(x, axis1, axis2):
    n = ndim(x)
    perm = list(range(n))
    a, b = int(axis1) % n, int(axis2) % n
    perm[a], perm[b] = perm[b], perm[a]
    return lax_shape.transpose(x, tuple(perm))


def moveaxis(x, source, destination):
    n = ndim(x)
    src = [int(s) % n for s in np.atleast_1d(source)]
    dst = [int(d) % n for d in np.atleast_1d(destination)]
    order = [i for i in range(n) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return lax_shape.transpose(x, tuple(order))


def expand_dims(x, axis):
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    n = ndim(x) + len(axes)
    return lax_shape.expand_dims(x, tuple(sorted(int(a) % n for a in axes)))


def squeeze(x, axis=None):
    if axis is None:
        axes = tuple(i for i, s in enumerate(shape(x)) if s == 1)
    else:
        axes = _axes(x, axis, "squeeze")
    return lax_shape.squeeze(x, axes)


def broadcast_to(x, shape_):
    return lax_shape.broadcast_to(x, tuple(shape_))


def broadcast_arrays(*xs):
    target = ew.broadcast_shapes(*(shape(x) for x in xs))
    return [broadcast_to(x, target) for x in xs]


def atleast_1d(x):
    return reshape(x, (1,)) if ndim(x) == 0 else x


def concatenate(xs, axis=0):
    xs = [x for x in xs]
    return lax_shape.concatenate(xs, _axis(xs[0], axis, "concatenate"))


def stack(xs, axis=0):
    xs = list(xs)
    n = ndim(xs[0]) + 1
    axis = int(axis) % n
    return lax_shape.concatenate([lax_shape.expand_dims(x, (axis,)) for x in xs], axis)


def _static_ints(value, name, what):
    """``value`` as a NumPy int array; traced values and non-integers raise TypeError."""
    if _holds_tracer(value):
        raise TypeError(f"{name}: {what} must be static (ints), not a traced value")
    arr = np.asarray(value)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: {what} must be integers, got {value!r}")
    return arr.astype(np.int64)


_PAD_MODES = ("constant", "edge", "wrap", "reflect", "symmetric")


def _pad_indices(n, lo, hi, mode):
    """The source index of each position of an axis of size ``n`` padded by ``(lo, hi)``:
    NumPy's ``edge``, ``wrap``, ``reflect`` (mirror without the edge) and ``symmetric``
    (mirror with the edge), periodically for pads wider than the axis."""
    i = np.arange(-lo, n + hi)
    if mode == "edge":
        return np.clip(i, 0, n - 1)
    if mode == "wrap":
        return i % n
    if mode == "reflect":
        if n == 1:
            return np.zeros_like(i)
        m = i % (2 * n - 2)
        return np.where(m < n, m, 2 * n - 2 - m)
    m = i % (2 * n)  # symmetric
    return np.where(m < n, m, 2 * n - 1 - m)


def pad(x, pad_width, mode="constant", constant_values=0, reflect_type="even"):
    """``numpy.pad``: ``pad_width`` is an int, a ``(low, high)`` pair or one pair per dim;
    ``mode`` is ``'constant'`` (with the scalar ``constant_values``), ``'edge'``,
    ``'wrap'``, ``'reflect'`` or ``'symmetric'``. The non-constant modes gather each padded
    axis once with a fixed index vector, so their derivative sums the cotangents of the
    copies into the elements they copy."""
    n = ndim(x)
    widths = _static_ints(pad_width, "pad", "pad_width")
    try:
        pw = np.broadcast_to(widths, (n, 2))
    except ValueError:
        raise ShapeError(f"pad: pad_width {pad_width!r} must be an int, a (low, high) pair or {n} pairs "
                         f"for an array of shape {shape(x)}") from None
    if (pw < 0).any():
        raise ShapeError(f"pad: pad_width {pad_width!r} has negative entries")
    if mode not in _PAD_MODES:
        raise NotImplementedError(f"pad: mode {mode!r} is not supported; use one of {', '.join(_PAD_MODES)}")
    if mode == "constant":
        if _holds_tracer(constant_values):
            raise TypeError("pad: constant_values must be a static scalar, not a traced value")
        if np.ndim(constant_values):
            raise NotImplementedError("pad: constant_values must be one scalar (per-side values are not supported)")
        return lax_shape.pad(x, tuple((int(lo), int(hi)) for lo, hi in pw), constant_values)
    if reflect_type != "even":
        raise NotImplementedError(f"pad: reflect_type {reflect_type!r} is not supported, only 'even'")
    xp = backend.xp_of(x)
    for axis, (lo, hi) in enumerate(pw):
        if lo == 0 and hi == 0:
            continue
        size = shape(x)[axis]
        if size == 0:
            raise ShapeError(f"pad: cannot extend the empty axis {axis} of shape {shape(x)} with mode {mode!r} "
                             "(only 'constant' can pad an empty axis)")
        idx = xp.asarray(_pad_indices(size, int(lo), int(hi), mode))
        x = lax_indexing.take(x, idx, axis)
    return x


def flip(x, axis=None):
    """``x`` reversed along ``axis`` (an int, a tuple, or ``None`` for every axis)."""
    axes = _axes(x, axis, "flip")
    if not axes:
        return x
    s = shape(x)
    slices = [(0, n, 1) for n in s]
    for a in axes:
        slices[a] = lax_indexing.normalize_slice(builtins.slice(None, None, -1), s[a])
    return lax_indexing.slice(x, slices)


def fliplr(x):
    if ndim(x) < 2:
        raise ShapeError(f"fliplr: the array must have at least 2 dims, got shape {shape(x)}")
    return flip(x, 1)


def flipud(x):
    if ndim(x) < 1:
        raise ShapeError("flipud: the array must have at least 1 dim, got a 0-d array")
    return flip(x, 0)


def roll(x, shift, axis=None):
    """Elements shifted by ``shift`` places along ``axis`` (wrapping around); ``None``
    rolls the flattened array. ``shift`` and ``axis`` may be tuples (broadcast against
    each other; shifts of one axis add up). Shifts are static ints."""
    if axis is None:
        return reshape(roll(ravel(x), shift, 0), shape(x))
    shifts = _static_ints(shift, "roll", "shift")
    axes_ = _static_ints(axis, "roll", "axis")
    try:
        shifts, axes_ = np.broadcast_arrays(np.atleast_1d(shifts), np.atleast_1d(axes_))
    except ValueError:
        raise ShapeError(f"roll: shift {shift!r} and axis {axis!r} must have the same length") from None
    if shifts.ndim > 1:
        raise ShapeError(f"roll: shift {shift!r} and axis {axis!r} must be ints or 1-d sequences")
    total = {}
    for sh, ax in zip(shifts.tolist(), axes_.tolist()):
        a = _axis(x, ax, "roll")
        total[a] = total.get(a, 0) + sh
    for a, sh in sorted(total.items()):
        n = shape(x)[a]
        if n == 0 or sh % n == 0:
            continue
        k = sh % n
        x = lax_shape.concatenate(
            [lax_indexing.slice_in_dim(x, n - k, n, a), lax_indexing.slice_in_dim(x, 0, n - k, a)], a)
    return x


def _split(name, x, indices_or_sections, axis, equal):
    axis = _axis(x, axis, name)
    n = shape(x)[axis]
    spec = _static_ints(indices_or_sections, name, "indices_or_sections")
    if spec.ndim == 0:
        k = int(spec)
        if k <= 0:
            raise ShapeError(f"{name}: the number of sections must be positive, got {k}")
        if equal and n % k:
            raise ShapeError(f"{name}: axis {axis} of size {n} (shape {shape(x)}) does not divide into {k} equal "
                             "sections; array_split allows unequal ones")
        q, r = divmod(n, k)
        bounds = np.concatenate([[0], np.cumsum([q + 1] * r + [q] * (k - r))]).tolist()
    else:
        if spec.ndim != 1:
            raise ShapeError(f"{name}: indices_or_sections must be an int or a 1-d sequence of ints")
        bounds = [0] + spec.tolist() + [n]
    return [lax_indexing.slice_in_dim(x, lo, hi, axis) for lo, hi in zip(bounds[:-1], bounds[1:])]


def split(x, indices_or_sections, axis=0):
    """``numpy.split``: a list of pieces along ``axis``; an int ``k`` asks for ``k`` equal
    pieces (an error when the size is not a multiple of ``k``), a sequence of indices
    gives the split points (as slice bounds: negative ones count from the end)."""
    return _split("split", x, indices_or_sections, axis, equal=True)


def array_split(x, indices_or_sections, axis=0):
    """``numpy.array_split``: as :func:`split`, but ``k`` pieces need not be equal (the first
    ``n % k`` are one longer)."""
    return _split("array_split", x, indices_or_sections, axis, equal=False)


def _zero_of(x):
    return False if core.dtype_of(x) == np.bool_ else 0


def _tri_mask(x, k, name):
    s = shape(x)
    if len(s) < 2:
        raise ShapeError(f"{name}: the array must have at least 2 dims, got shape {s}")
    return backend.xp_of(x).tri(s[-2], s[-1], k, dtype=bool)


def tril(m, k=0):
    """``m`` with the elements above diagonal ``k`` of its last two dims zeroed."""
    return ew.select(_tri_mask(m, int(k), "tril"), m, _zero_of(m))


def triu(m, k=0):
    """``m`` with the elements below diagonal ``k`` of its last two dims zeroed."""
    return ew.select(_tri_mask(m, int(k) - 1, "triu"), _zero_of(m), m)


def diagonal(a, offset=0, axis1=0, axis2=1):
    """The diagonal ``offset`` of the dims ``axis1`` (rows) and ``axis2`` (columns), as
    the last dim of the result (``numpy.diagonal``); one strided slice of the flattened
    pair, so its derivative is a strided scatter."""
    s = shape(a)
    if len(s) < 2:
        raise ShapeError(f"diagonal: the array must have at least 2 dims, got shape {s}")
    a1, a2 = _axis(a, axis1, "diagonal"), _axis(a, axis2, "diagonal")
    if a1 == a2:
        raise ShapeError(f"diagonal: axis1 and axis2 must be different dims, both are {a1} (shape {s})")
    rest = tuple(i for i in range(len(s)) if i not in (a1, a2))
    lead = tuple(s[i] for i in rest)
    r, c = s[a1], s[a2]
    k = int(offset)
    if k >= 0:
        length, start = builtins.max(0, builtins.min(r, c - k)), k
    else:
        length, start = builtins.max(0, builtins.min(r + k, c)), -k * c
    flat = lax_shape.reshape(lax_shape.transpose(a, rest + (a1, a2)), lead + (r * c,))
    if length == 0:
        return lax_indexing.slice_in_dim(flat, 0, 0, len(lead))
    return lax_indexing.slice_in_dim(flat, start, start + (length - 1) * (c + 1) + 1, len(lead), c + 1)


def diag(v, k=0):
    """``numpy.diag``: of a 1-d ``v``, the square matrix with ``v`` on diagonal ``k``; of a
    2-d ``v``, its diagonal ``k``."""
    s = shape(v)
    k = int(k)
    if len(s) == 2:
        return diagonal(v, k)
    if len(s) != 1:
        raise ShapeError(f"diag: the input must be 1-d or 2-d, got shape {s}")
    size = s[0] + builtins.abs(k)
    padded = lax_shape.pad(v, ((0, builtins.abs(k)),), _zero_of(v))
    # row i holds v[i] (k >= 0: at column i + k), or column j holds v[j] (k < 0: at row j - k)
    spread = lax_shape.broadcast_in_dim(padded, (size, size), (0,) if k >= 0 else (1,))
    mask = backend.xp_of(v).eye(size, size, k, dtype=bool)
    return ew.select(mask, spread, _zero_of(v))


def trace(a, offset=0, axis1=0, axis2=1, dtype=None):
    """The sum of :func:`diagonal` ``offset``."""
    return sum(diagonal(a, offset, axis1, axis2), axis=-1, dtype=dtype)


# ---------------------------------------------------------------------------------------
# Indexing
# ---------------------------------------------------------------------------------------


def take(x, indices, axis=None):
    if axis is None:
        return lax_indexing.take(ravel(x), indices, 0)
    return lax_indexing.take(x, indices, _axis(x, axis, "take"))


def take_along_axis(x, indices, axis):
    """``out[..., j, ...] = x[..., indices[..., j, ...], ...]`` along ``axis`` (NumPy's
    semantics; ``indices`` broadcasts against ``x`` on the other dims). Implemented as one
    ``take`` on the flattened array with offset indices."""
    axis = _axis(x, axis, "take_along_axis")
    x_shape = shape(x)
    idx_shape = shape(indices)
    if len(idx_shape) != len(x_shape):
        raise ShapeError(f"take_along_axis: indices of shape {idx_shape} must have the rank of {x_shape}")
    for i, (a, b) in enumerate(zip(x_shape, idx_shape)):
        if i != axis and a != b and a != 1 and b != 1:
            raise ShapeError(
                f"take_along_axis: indices of shape {idx_shape} do not broadcast against the array of shape "
                f"{x_shape} outside axis {axis} (dim {i}: {b} vs {a})"
            )
    other = tuple(
        builtins.max(a, b) if i != axis else None for i, (a, b) in enumerate(zip(x_shape, idx_shape))
    )
    x_target = tuple(x_shape[axis] if i == axis else other[i] for i in range(len(x_shape)))
    idx_target = tuple(idx_shape[axis] if i == axis else other[i] for i in range(len(x_shape)))
    x = broadcast_to(x, x_target)
    indices = broadcast_to(indices, idx_target)
    x_last = moveaxis(x, axis, -1)
    idx_last = moveaxis(indices, axis, -1)
    n = x_target[axis]
    rows = int(np.prod(shape(x_last)[:-1], dtype=np.int64))
    k = idx_target[axis]
    flat_x = reshape(x_last, (rows * n,))
    idx2 = reshape(idx_last, (rows, k))
    idx2 = lax_indexing.check_index_bounds(idx2, n, "take_along_axis", axis)
    idx2 = ew.select(ew.lt(idx2, 0), ew.add(idx2, n), idx2)
    offsets = reshape(ew.mul(lax_indexing.iota(rows, core.dtype_of(indices), like=indices), n), (rows, 1))
    flat = lax_indexing.take(flat_x, ew.add(idx2, offsets), 0)
    out = reshape(flat, shape(idx_last))
    return moveaxis(out, -1, axis)


def _is_int_scalar(i):
    return isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_))


def _is_index_array(i):
    return isinstance(i, (Tracer, np.ndarray, list)) or backend.is_cupy_array(i)


def getitem(x, index):
    """``x[index]`` with NumPy semantics for: ints, slices (any step), ``None``,
    ``Ellipsis`` and integer arrays (several broadcast together, placed as NumPy places
    advanced indices). Boolean masks are not supported (their result shape depends on
    the data)."""
    if not isinstance(index, tuple):
        index = (index,)
    x_shape = shape(x)
    n = len(x_shape)
    index = [np.asarray(i) if isinstance(i, list) else i for i in index]
    for i in index:
        dt = getattr(i, "dtype", None)
        if (dt is not None and np.dtype(dt) == np.bool_) or isinstance(i, bool):
            raise IndexError("boolean mask indexing is not supported on traced values (the result shape would depend on the data); use cuvmap.numpy.where")
        if dt is not None and np.dtype(dt).kind not in "iu":
            raise IndexError(f"arrays used as indices must be integers, got {np.dtype(dt)}")
        if not (i is None or i is Ellipsis or isinstance(i, builtins.slice) or _is_int_scalar(i) or _is_index_array(i)):
            raise IndexError(f"unsupported index {i!r} of type {type(i).__name__}")
    n_real = builtins.sum(1 for i in index if i is not None and i is not Ellipsis)
    if n_real > n:
        raise IndexError(f"too many indices ({n_real}) for an array of shape {x_shape}")
    if builtins.sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis")
    if Ellipsis in [i for i in index if not _is_index_array(i)]:
        pos = next(k for k, i in enumerate(index) if i is Ellipsis)
        index = index[:pos] + [builtins.slice(None)] * (n - n_real) + index[pos + 1:]
    else:
        index = index + [builtins.slice(None)] * (n - n_real)

    has_array = builtins.any(_is_index_array(i) for i in index)
    # basic slicing of every dim indexed by a slice or (without arrays) an int
    slices = []
    int_dims = []
    new_axes = []
    advanced = []  # (dim, index) for arrays and, with arrays present, ints
    dim = 0
    out_pos = 0
    for i in index:
        if i is None:
            new_axes.append(out_pos)
            out_pos += 1
            continue
        size_d = x_shape[dim]
        if isinstance(i, builtins.slice):
            slices.append(lax_indexing.normalize_slice(i, size_d))
            out_pos += 1
        elif _is_int_scalar(i):
            if not -size_d <= i < size_d:
                raise IndexError(f"index {i} is out of bounds for axis {dim} with size {size_d}")
            if has_array:
                slices.append((0, size_d, 1))
                advanced.append((dim, int(i) % size_d))
            else:
                slices.append((int(i) % size_d, int(i) % size_d + 1, 1))
                int_dims.append(dim)
        else:
            slices.append((0, size_d, 1))
            advanced.append((dim, i))
            out_pos += 1
        dim += 1
    if has_array and new_axes:
        raise IndexError("combining None (newaxis) with integer-array indexing is not supported; index in two steps")
    if builtins.any(s != (0, x_shape[d], 1) for d, s in enumerate(slices)):
        x = lax_indexing.slice(x, slices)
    if int_dims:
        x = lax_shape.squeeze(x, tuple(int_dims))
    if new_axes:
        x = lax_shape.expand_dims(x, tuple(new_axes))
    if has_array:
        x = _advanced_index(x, advanced)
    return x


def _advanced_index(x, advanced):
    """Integer-array indexing of the dims in ``advanced``, NumPy placement: in place when
    the indexed dims are adjacent, first otherwise. The indexed dims are merged into one
    and gathered with one ``take`` of the row-major linear index."""
    dims = [d for d, _ in advanced]
    x_shape = shape(x)
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    if len(advanced) == 1:
        d, idx = advanced[0]
        return lax_indexing.take(x, idx if not isinstance(idx, int) else np.asarray(idx), d)
    if not adjacent:
        rest = [i for i in range(len(x_shape)) if i not in dims]
        x = lax_shape.transpose(x, tuple(dims + rest))
        x_shape = shape(x)
        dims = list(range(len(dims)))
    p = dims[0]
    sizes = [x_shape[d] for d in dims]
    merged = int(np.prod(sizes, dtype=np.int64))
    x = lax_shape.reshape(x, x_shape[:p] + (merged,) + x_shape[p + len(dims):])
    linear = None
    stride = 1
    for (dim, idx), n_d in reversed(list(zip(advanced, sizes))):
        if isinstance(idx, int):
            term = idx * stride
        else:
            idx = lax_indexing.check_index_bounds(idx, n_d, "indexing", dim)
            idx = ew.select(ew.lt(idx, 0), ew.add(idx, n_d), idx)
            term = ew.mul(idx, stride) if stride != 1 else idx
        linear = term if linear is None else ew.add(linear, term)
        stride *= n_d
    if isinstance(linear, int):
        linear = np.asarray(linear)
    return lax_indexing.take(x, linear, p)


# ---------------------------------------------------------------------------------------
# Linear algebra
# ---------------------------------------------------------------------------------------


def _batched_input_hint(ka, kb):
    """A hint for the commonest cause of a contracting-dim mismatch in per-example code: a
    batch passed where one example was expected (``(32·6272,)`` against ``(6272, 10)``)."""
    big, small = builtins.max(ka, kb), builtins.min(ka, kb)
    if small > 0 and big % small == 0 and big > small:
        which = "first" if ka > kb else "second"
        return (
            f"; the {which} operand's dim is {big // small}× the other's: if it holds a batch of {big // small} "
            "examples where the function expects one (a flatten or reshape(-1) over the batch), map the "
            "function over the batch with cuvmap.vmap instead"
        )
    return ""


def matmul(a, b):
    """NumPy's ``matmul``: 1-d operands are vectors, leading dims broadcast as batches."""
    na, nb = ndim(a), ndim(b)
    if na == 0 or nb == 0:
        raise ShapeError(f"matmul: operands must have at least one dim, got {shape(a)} and {shape(b)}")
    ka, kb = shape(a)[-1], shape(b)[-1 if nb == 1 else -2]
    if ka != kb:
        raise ShapeError(
            f"matmul: contracting dims do not match for shapes {shape(a)} and {shape(b)} ({ka} vs {kb})"
            + _batched_input_hint(ka, kb)
        )
    if nb == 1:
        return lax.dot_general(a, b, (((na - 1,), (0,)), ((), ())))
    if na == 1:
        return lax.dot_general(a, b, (((0,), (nb - 2,)), ((), ())))
    if nb == 2:
        return lax.dot_general(a, b, (((na - 1,), (0,)), ((), ())))
    if na == 2:
        out = lax.dot_general(a, b, (((1,), (nb - 2,)), ((), ())))  # (m, *batch, n)
        return moveaxis(out, 0, -2)
    batch = ew.broadcast_shapes(shape(a)[:-2], shape(b)[:-2])
    a = broadcast_to(a, batch + shape(a)[-2:])
    b = broadcast_to(b, batch + shape(b)[-2:])
    nbatch = len(batch)
    bd = tuple(range(nbatch))
    return lax.dot_general(a, b, (((nbatch + 1,), (nbatch,)), (bd, bd)))


def dot(a, b):
    """NumPy's ``dot``: sum over the last dim of ``a`` and the second-to-last of ``b``."""
    na, nb = ndim(a), ndim(b)
    if na == 0 or nb == 0:
        return ew.mul(a, b)
    return lax.dot_general(a, b, (((na - 1,), (builtins.max(nb - 2, 0),)), ((), ())))


def vdot(a, b):
    return sum(ew.mul(ravel(a), ravel(b)))


def inner(a, b):
    return lax.dot_general(a, b, (((ndim(a) - 1,), (ndim(b) - 1,)), ((), ())))


def outer(a, b):
    return lax.dot_general(ravel(a), ravel(b), (((), ()), ((), ())))


def tensordot(a, b, axes=2):
    if isinstance(axes, (int, np.integer)):
        ca = tuple(range(ndim(a) - axes, ndim(a)))
        cb = tuple(range(axes))
    else:
        ca, cb = axes
        ca = (ca,) if isinstance(ca, (int, np.integer)) else tuple(ca)
        cb = (cb,) if isinstance(cb, (int, np.integer)) else tuple(cb)
        ca = tuple(int(i) % ndim(a) for i in ca)
        cb = tuple(int(i) % ndim(b) for i in cb)
    return lax.dot_general(a, b, ((ca, cb), ((), ())))


def cross(a, b, axisa=-1, axisb=-1, axisc=-1, axis=None):
    """``numpy.cross``: the cross product of 3-vectors along ``axisa``/``axisb`` (leading dims
    broadcast), written to ``axisc`` of the result; a 2-vector counts as having z = 0, and
    two 2-vectors give the z component alone (as NumPy and JAX do)."""
    if axis is not None:
        axisa = axisb = axisc = axis
    a = moveaxis(a, _axis(a, axisa, "cross"), -1)
    b = moveaxis(b, _axis(b, axisb, "cross"), -1)
    na, nb = shape(a)[-1], shape(b)[-1]
    if na not in (2, 3) or nb not in (2, 3):
        raise ShapeError(f"cross: the vectors must have 2 or 3 components, got {na} and {nb} "
                         f"(shapes {shape(a)} and {shape(b)} with the vector axis last)")
    ac = [getitem(a, (Ellipsis, i)) for i in range(na)]
    bc = [getitem(b, (Ellipsis, i)) for i in range(nb)]

    def minus(p, q):
        """p − q where a missing (None) factor product is 0."""
        if p is None:
            return ew.neg(q)
        return p if q is None else ew.sub(p, q)

    def times(i, j):
        return None if i >= na or j >= nb else ew.mul(ac[i], bc[j])

    z = minus(times(0, 1), times(1, 0))
    if na == 2 and nb == 2:
        return z
    out = stack(broadcast_arrays(minus(times(1, 2), times(2, 1)), minus(times(2, 0), times(0, 2)), z), axis=-1)
    return moveaxis(out, -1, _axis(out, axisc, "cross"))


# NOTE [einsum's contraction order]
# ``einsum`` with n operands becomes n − 1 pairwise contractions, each one ``dot_general``
# (plus ``reduce_sum`` for labels only one operand has, ``diagonal`` for a label repeated
# within an operand, a final ``transpose``), so every transform handles it through those
# primitives. The pairs are chosen greedily (opt_einsum's greedy strategy, simplified): at
# each step the pair whose intermediate result is smallest, ties broken by the memory the
# step frees, then by position. A chain ``ij,jk,kl->il`` with a thin last matrix thus
# contracts ``jk,kl`` first. Labels are kept in an intermediate only while the output or
# another remaining operand still needs them; a label whose size is 1 in some operands and
# n in others broadcasts (NumPy's rule), the size-1 dims being squeezed away first.


def _einsum_labels(spec, rank, ellipsis_rank, i, subscripts):
    """Operand ``i``'s labels: its letters, with ``...`` replaced by the ellipsis labels
    ``("...", k)`` aligned to the right, as broadcasting aligns dims."""
    if "." in spec.replace("...", ""):
        raise ShapeError(f"einsum: {subscripts!r}: '.' may only appear as '...'")
    letters = spec.replace("...", "")
    bad = [c for c in letters if not c.isalpha()]
    if bad:
        raise ShapeError(f"einsum: {subscripts!r}: subscripts must be letters, got {bad[0]!r}")
    if "..." not in spec:
        if len(spec) != rank:
            raise ShapeError(f"einsum: subscripts {spec!r} name {len(spec)} dims, but operand {i} has shape of rank {rank}")
        return list(spec)
    n_ell = rank - len(letters)
    if n_ell < 0 or spec.count("...") > 1:
        raise ShapeError(f"einsum: subscripts {spec!r} do not fit operand {i} of rank {rank}")
    head, tail = spec.split("...")
    return list(head) + [("...", ellipsis_rank - n_ell + k) for k in range(n_ell)] + list(tail)


def _einsum_parse(subscripts, operands):
    spec = subscripts.replace(" ", "")
    if spec.count("->") > 1:
        raise ShapeError(f"einsum: {subscripts!r} has more than one '->'")
    lhs, out_spec = spec.split("->") if "->" in spec else (spec, None)
    in_specs = lhs.split(",")
    if len(in_specs) != len(operands):
        raise ShapeError(f"einsum: {subscripts!r} names {len(in_specs)} operands, but {len(operands)} were given")
    ranks = [ndim(x) for x in operands]
    ellipsis_rank = builtins.max(
        [r - len(sp.replace("...", "")) for sp, r in zip(in_specs, ranks) if "..." in sp], default=0)
    labels = [_einsum_labels(sp, r, ellipsis_rank, i, subscripts) for i, (sp, r) in enumerate(zip(in_specs, ranks))]
    ellipsis = [("...", k) for k in range(ellipsis_rank)]
    if out_spec is None:
        counts = {}
        for ls in labels:
            for c in ls:
                counts[c] = counts.get(c, 0) + 1
        out = ellipsis + sorted(c for c, k in counts.items() if k == 1 and isinstance(c, str))
    else:
        if "." in out_spec.replace("...", "") or out_spec.count("...") > 1:
            raise ShapeError(f"einsum: {subscripts!r}: bad output subscripts {out_spec!r}")
        if ellipsis_rank and "..." not in out_spec:
            raise ShapeError(f"einsum: {subscripts!r}: the operands have dims under '...', so the output "
                             "subscripts need '...' too (as in NumPy)")
        head, _, tail = out_spec.partition("...")
        out = list(head) + (ellipsis if "..." in out_spec else []) + list(tail)
        seen = {c for ls in labels for c in ls}
        for c in out:
            if out.count(c) > 1:
                raise ShapeError(f"einsum: {subscripts!r}: output subscript {c!r} appears more than once")
            if c not in seen:
                raise ShapeError(f"einsum: {subscripts!r}: output subscript {c!r} names no dim of the operands")
    return labels, out


def _einsum_sizes(operands, labels, subscripts):
    """Each label's size, and the operands with their size-1 broadcast dims squeezed."""
    sizes = {}
    for i, (x, ls) in enumerate(zip(operands, labels)):
        for c, n in zip(ls, shape(x)):
            if n != 1:
                prev = sizes.setdefault(c, (n, i))
                if prev[0] != n:
                    name = "..." if isinstance(c, tuple) else repr(c)
                    raise ShapeError(
                        f"einsum: {subscripts!r}: subscript {name} has size {prev[0]} in operand {prev[1]} "
                        f"(shape {shape(operands[prev[1]])}) but size {n} in operand {i} (shape {shape(x)})")
    sizes = {c: n for c, (n, _) in sizes.items()}
    new_ops, new_labels = [], []
    for x, ls in zip(operands, labels):
        drop = tuple(d for d, (c, n) in enumerate(zip(ls, shape(x))) if n == 1 and sizes.get(c, 1) != 1)
        if drop:
            x = lax_shape.squeeze(x, drop)
            ls = [c for d, c in enumerate(ls) if d not in drop]
        for c in ls:
            sizes.setdefault(c, 1)
        new_ops.append(x)
        new_labels.append(ls)
    return sizes, new_ops, new_labels


def _einsum_sum_unneeded(x, ls, needed):
    axes = tuple(d for d, c in enumerate(ls) if c not in needed)
    if axes:
        x = lax_reduction.reduce_sum(x, axes)
        ls = [c for c in ls if c in needed]
    return x, ls


def _einsum_contract(x, lx, y, ly, needed):
    """One pairwise step: ``dot_general`` over the shared labels that nothing else needs,
    with the shared labels still needed as batch dims."""
    x, lx = _einsum_sum_unneeded(x, lx, set(ly) | needed)
    y, ly = _einsum_sum_unneeded(y, ly, set(lx) | needed)
    batch = [c for c in lx if c in ly and c in needed]
    contract = [c for c in lx if c in ly and c not in needed]
    dn = ((tuple(lx.index(c) for c in contract), tuple(ly.index(c) for c in contract)),
          (tuple(lx.index(c) for c in batch), tuple(ly.index(c) for c in batch)))
    out = lax.dot_general(x, y, dn)
    return out, batch + [c for c in lx if c not in ly] + [c for c in ly if c not in lx]


def einsum(subscripts, *operands, optimize=True):
    """``numpy.einsum`` with any number of operands: explicit (``'ij,jk->ik'``) or implicit
    output, ``...`` (broadcast as NumPy does), labels repeated within an operand
    (diagonals: ``'ii->i'``, traces) and size-1 broadcasting. The operands are contracted
    pairwise in a greedy order (NOTE [einsum's contraction order]); ``optimize`` is
    accepted for compatibility and the order is always greedy.

    Example: ``einsum('bi,ij,bj->b', x, A, y)`` is the batch of bilinear forms xᵀAy.
    """
    if not operands:
        raise ShapeError("einsum: needs at least one operand")
    labels, out = _einsum_parse(subscripts, operands)
    sizes, ops, labels = _einsum_sizes(operands, labels, subscripts)
    # diagonals of labels repeated within an operand
    for i, (x, ls) in enumerate(zip(ops, labels)):
        while len(set(ls)) != len(ls):
            c = next(c for c in ls if ls.count(c) > 1)
            p = ls.index(c)
            q = ls.index(c, p + 1)
            x = diagonal(x, 0, p, q)
            ls = [l for d, l in enumerate(ls) if d not in (p, q)] + [c]
        ops[i], labels[i] = x, ls
    out_set = set(out)
    # labels that only one operand has and the output lacks are summed first
    for i in range(len(ops)):
        others = out_set.union(*(labels[j] for j in range(len(ops)) if j != i))
        ops[i], labels[i] = _einsum_sum_unneeded(ops[i], labels[i], others)

    def size_of(ls):
        return int(np.prod([sizes[c] for c in ls], dtype=np.int64))

    while len(ops) > 1:
        best = None
        for i in range(len(ops)):
            for j in range(i + 1, len(ops)):
                needed = out_set.union(*(labels[m] for m in range(len(ops)) if m not in (i, j)))
                result = [c for c in dict.fromkeys(labels[i] + labels[j]) if c in needed]
                size = size_of(result)
                key = (size, size - size_of(labels[i]) - size_of(labels[j]), i, j)
                if best is None or key < best[0]:
                    best = (key, i, j, needed)
        _, i, j, needed = best
        z, lz = _einsum_contract(ops[i], labels[i], ops[j], labels[j], needed)
        ops = [o for m, o in enumerate(ops) if m not in (i, j)] + [z]
        labels = [ls for m, ls in enumerate(labels) if m not in (i, j)] + [lz]
    (x,), (ls,) = ops, labels
    x, ls = _einsum_sum_unneeded(x, ls, out_set)
    return lax_shape.transpose(x, tuple(ls.index(c) for c in out))


# ---------------------------------------------------------------------------------------
# cuvmap.numpy.linalg
# ---------------------------------------------------------------------------------------


SVDResult = collections.namedtuple("SVDResult", ["U", "S", "Vh"])


def _as_inexact(x):
    """Integers and booleans as float64 (NumPy's linalg and JAX promote them)."""
    return x if core.is_float(x) else astype(x, np.float64)


def svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    """``numpy.linalg.svd``: ``a = U @ diag(S) @ Vh`` for each matrix of a stack ``(..., m, n)``.

    Returns ``SVDResult(U, S, Vh)`` (a named tuple, as NumPy 2's) or, with
    ``compute_uv=False``, ``S`` alone (descending). ``hermitian=True`` is accepted and
    computes the general SVD (also a valid SVD of a Hermitian matrix). Derivatives:
    NOTE [svd's derivatives] in ``cuvmap/lax/linalg.py``: those of the singular values are
    defined where they are distinct; those of ``U`` and ``Vh`` are undefined for repeated
    singular values (they come out inf or NaN) and raise for ``full_matrices=True`` of a
    non-square matrix (use ``full_matrices=False``).
    """
    a = _as_inexact(a)
    if ndim(a) < 2:
        raise ShapeError(f"svd: the array must have at least 2 dims (a stack of matrices), got shape {shape(a)}")
    if not compute_uv:
        return lax_linalg.svd(a, compute_uv=False)
    return SVDResult(*lax_linalg.svd(a, full_matrices=full_matrices))


_svd = svd  # for the functions below: ``svd`` itself leaves the top-level namespace


def svdvals(x):
    """``numpy.linalg.svdvals``: the singular values of each matrix of a stack, descending."""
    return _svd(x, compute_uv=False)


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
            return ew.sqrt(sum(square(x), axes, keepdims))
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


_norm = norm


def _is_number(ord):  # noqa: A002
    return isinstance(ord, (int, float, np.number)) and not isinstance(ord, (bool, np.bool_))


def _vector_norm(x, ord, axes, keepdims):  # noqa: A002
    if ord is None or (_is_number(ord) and ord == 2):
        return ew.sqrt(sum(square(x), axes, keepdims))
    if not _is_number(ord):
        raise ShapeError(f"norm: invalid ord {ord!r} for a vector norm (None, inf, -inf, 0 or a number)")
    if ord == np.inf:
        return max(ew.abs(x), axes, keepdims)
    if ord == -np.inf:
        return min(ew.abs(x), axes, keepdims)
    if ord == 0:
        return sum(astype(ew.ne(x, 0), core.dtype_of(x)), axes, keepdims)
    if ord == 1:
        return sum(ew.abs(x), axes, keepdims)
    return ew.pow(sum(ew.pow(ew.abs(x), float(ord)), axes, keepdims), 1.0 / float(ord))


def _matrix_norm(x, ord, axes, keepdims):  # noqa: A002
    rows, cols = axes
    if ord is None or (isinstance(ord, str) and ord == "fro"):
        return ew.sqrt(sum(square(x), axes, keepdims))
    if (isinstance(ord, str) and ord == "nuc") or (_is_number(ord) and ord in (2, -2)):
        # the singular values of the matrices in the (rows, cols) dims
        rest = tuple(i for i in range(ndim(x)) if i not in axes)
        s = lax_linalg.svd(lax_shape.transpose(x, rest + (rows, cols)), compute_uv=False)
        if isinstance(ord, str):
            out = sum(s, -1)
        else:
            out = max(s, -1) if ord == 2 else min(s, -1)
        return lax_shape.expand_dims(out, tuple(sorted(axes))) if keepdims else out
    if not _is_number(ord) or ord not in (1, -1, np.inf, -np.inf):
        raise ShapeError(f"norm: invalid ord {ord!r} for a matrix norm (None, 'fro', 'nuc', 1, -1, 2, -2, inf or -inf)")
    # 1: the largest column sum of |x|; inf: the largest row sum
    summed, over = (rows, cols) if ord in (1, -1) else (cols, rows)
    sums = sum(ew.abs(x), summed, keepdims=True)
    out = max(sums, over, keepdims=True) if ord > 0 else min(sums, over, keepdims=True)
    return out if keepdims else squeeze(out, axes)


def matrix_norm(x, /, *, keepdims=False, ord="fro"):  # noqa: A002 - NumPy's name
    """``numpy.linalg.matrix_norm``: :func:`norm` of the matrices in the last two dims."""
    return _norm(x, ord, (-2, -1), keepdims)


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


linalg = types.ModuleType("cuvmap.numpy.linalg", "``numpy.linalg``'s functions on arrays and tracers: ``norm``, "
                          "``vector_norm``, ``matrix_norm``, ``svd`` and ``svdvals``.")
linalg.norm = norm
linalg.vector_norm = vector_norm
linalg.matrix_norm = matrix_norm
linalg.svd = svd
linalg.svdvals = svdvals
linalg.SVDResult = SVDResult
sys.modules[linalg.__name__] = linalg
del norm, vector_norm, matrix_norm, svd, svdvals


# ---------------------------------------------------------------------------------------
# Bitwise and logical functions
# ---------------------------------------------------------------------------------------

# NOTE [bitwise operators on traced values]
# ``& | ^ ~ << >>`` on traced values, and the functions below, run the primitives of
# ``cuvmap/lax/bitwise.py`` with NumPy's semantics: integers and booleans only (a float
# operand raises TypeError, as in NumPy and JAX), NumPy's promotion with weakly typed
# Python ints (``uint8_tracer & 0xF0`` stays uint8), ``>>`` arithmetic on signed integers
# and logical on unsigned ones, and shifts by the bit width or more give 0 (or -1 for a
# negative signed ``x >> k``), as NumPy's do. Their results are integers or booleans and
# carry no derivative (the primitives are ``differentiable=False``): a float function
# that computes an integer mask or index with them on the side differentiates as usual.


def _dtype_operand(x):
    """A Python int or bool as itself (weakly typed, NEP 50), else the dtype."""
    return x if type(x) in (int, bool) else core.dtype_of(x)


def _check_integer_operands(name, xs, kinds="biu", what="integers or booleans"):
    dtypes = [core.dtype_of(x) for x in xs]
    if builtins.any(d.kind not in kinds for d in dtypes):
        raise TypeError(f"{name}: operands must be {what}, got " + " and ".join(str(d) for d in dtypes))


def _bitwise_binary(name, fn):
    def op(x, y):
        _check_integer_operands(name, (x, y))
        return fn(x, y)

    op.__name__ = name
    op.__doc__ = f"``numpy.{name}`` on integers and booleans (NOTE [bitwise operators on traced values])."
    return op


bitwise_and = _bitwise_binary("bitwise_and", lax.bitwise_and)
bitwise_or = _bitwise_binary("bitwise_or", lax.bitwise_or)
bitwise_xor = _bitwise_binary("bitwise_xor", lax.bitwise_xor)


def bitwise_not(x):
    """``~x``: the bits of an integer flipped, the negation of a boolean."""
    _check_integer_operands("bitwise_not", (x,))
    return lax.bitwise_not(x)


invert = bitwise_invert = bitwise_not


def _shift_operands(name, x, y):
    """``(x, y)`` in their common integer dtype (NumPy's promotion; two booleans shift as
    int8, as NumPy's loop does); TypeError for floats or for dtypes with no common integer
    dtype (int64 and uint64)."""
    _check_integer_operands(name, (x, y))
    dtype = np.result_type(_dtype_operand(x), _dtype_operand(y))
    if dtype == np.bool_:
        dtype = np.dtype(np.int8)
    if dtype.kind not in "iu":
        raise TypeError(f"{name}: {core.dtype_of(x)} and {core.dtype_of(y)} have no common integer dtype "
                        f"(NumPy promotes them to {dtype}); cast one of them")

    def cast(v, shifted):
        if type(v) in (int, bool):
            # a Python amount stays weakly typed; a Python int to shift takes the dtype
            # (as a NumPy scalar, which CuPy accepts beside its arrays)
            return dtype.type(v) if shifted else int(v)
        return v if core.dtype_of(v) == dtype else ew.convert_element_type(v, dtype)

    return cast(x, True), cast(y, False), dtype


def left_shift(x, y):
    """``x << y`` (``numpy.left_shift``): 0 where ``y`` is the bit width or more."""
    x, y, _ = _shift_operands("left_shift", x, y)
    return lax.shift_left(x, y)


def right_shift(x, y):
    """``x >> y`` (``numpy.right_shift``): arithmetic (the sign bit fills in) for signed
    integers, logical (zeros fill in) for unsigned ones."""
    x, y, dtype = _shift_operands("right_shift", x, y)
    if dtype.kind == "i":
        return lax.shift_right_arithmetic(x, y)
    return lax.shift_right_logical(x, y)


bitwise_left_shift, bitwise_right_shift = left_shift, right_shift


def _is_bool(x):
    return core.dtype_of(x) == np.bool_


def logical_not(x):
    """``not x`` elementwise (a boolean); nonzero counts as True."""
    return ew.eq(x, False) if _is_bool(x) else ew.eq(x, 0)


def logical_and(x, y):
    """``x and y`` elementwise (a boolean); nonzero counts as True."""
    return ew.select(ew.ne(x, 0), ew.ne(y, 0), False)


def logical_or(x, y):
    """``x or y`` elementwise (a boolean); nonzero counts as True."""
    return ew.select(ew.ne(x, 0), True, ew.ne(y, 0))


def logical_xor(x, y):
    """Exactly one of ``x`` and ``y`` nonzero, elementwise (a boolean)."""
    return ew.ne(ew.ne(x, 0), ew.ne(y, 0))


def _operator(symbol, fn, reflected=False):
    """The tracer method of operator ``symbol``: ``fn`` with errors that name the operator."""
    name = fn.__name__

    def method(self, other):
        x, y = (other, self) if reflected else (self, other)
        try:
            return fn(x, y)
        except TypeError as err:
            raise TypeError(str(err).replace(f"{name}:", f"{name} (operator {symbol}):", 1)) from None

    return method


def _invert_operator(self):
    try:
        return bitwise_not(self)
    except TypeError as err:
        raise TypeError(str(err).replace("bitwise_not:", "bitwise_not (operator ~):", 1)) from None


# ---------------------------------------------------------------------------------------
# Tracer operators and methods
# ---------------------------------------------------------------------------------------


def _swap(f):
    return lambda self, other: f(other, self)


def _tracer_reshape(self, *shape_, order="C", copy=None):
    if order != "C":
        raise NotImplementedError(f"reshape: only order='C' is supported on traced values, got {order!r}")
    return reshape(self, *shape_)


def _tracer_transpose(self, *axes):
    if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
        axes = axes[0]
    return transpose(self, tuple(axes) if axes else None)


def _no_out(name, out):
    if out is not None:
        raise TypeError(f"{name}: out= is not supported on traced values (they are immutable)")


# NOTE [NumPy functions on tracers]: ``np.sum(tracer)``, ``np.mean``, ``np.max``, ``np.argmax``
# ... call the method of the same name with NumPy's signature (``axis, dtype, out``), so the
# methods take those arguments; NumPy's ufuncs (``np.sin(tracer)``) raise a
# ConcretizationError instead (see NOTE [binary operators with arrays] in core.py).


def _tracer_sum(self, axis=None, dtype=None, out=None, keepdims=False):
    _no_out("sum", out)
    return sum(self, axis, keepdims, dtype)


def _tracer_mean(self, axis=None, dtype=None, out=None, keepdims=False):
    _no_out("mean", out)
    out_ = mean(self, axis, keepdims)
    return out_ if dtype is None else astype(out_, dtype)


def _tracer_var(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    _no_out("var", out)
    out_ = var(self, axis, keepdims, ddof)
    return out_ if dtype is None else astype(out_, dtype)


def _tracer_std(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    _no_out("std", out)
    out_ = std(self, axis, keepdims, ddof)
    return out_ if dtype is None else astype(out_, dtype)


def _tracer_extremum(fn):
    def method(self, axis=None, out=None, keepdims=False):
        _no_out(fn.__name__, out)
        return fn(self, axis, keepdims)

    return method


def _tracer_arg(fn):
    def method(self, axis=None, out=None):
        _no_out(fn.__name__, out)
        return fn(self, axis)

    return method


def _tracer_clip(self, min=None, max=None, out=None):  # noqa: A002 - NumPy's names
    _no_out("clip", out)
    return clip(self, min, max)


def _tracer_prod(self, axis=None, dtype=None, out=None, keepdims=False):
    _no_out("prod", out)
    return prod(self, axis, keepdims, dtype)


def _tracer_cumulative(fn):
    def method(self, axis=None, dtype=None, out=None):
        _no_out(fn.__name__, out)
        return fn(self, axis, dtype)

    return method


def _tracer_any_all(fn):
    def method(self, axis=None, out=None, keepdims=False):
        _no_out(fn.__name__, out)
        return fn(self, axis, keepdims)

    return method


def _tracer_round(self, decimals=0, out=None):
    _no_out("round", out)
    return round(self, decimals)


def _tracer_argsort(self, axis=-1, kind=None, order=None):
    return argsort(self, axis, kind=kind, order=order)


def _tracer_trace(self, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    _no_out("trace", out)
    return trace(self, offset, axis1, axis2, dtype)


def _is_bool(x):
    return core.dtype_of(x) == np.bool_


def _setitem(self, index, value):
    raise TypeError(
        "traced values are immutable: item assignment is not supported; build the result with "
        "cuvmap.numpy.where, concatenate or pad"
    )


_TRACER_METHODS = {
    "__add__": add, "__radd__": _swap(add),
    "__sub__": subtract, "__rsub__": _swap(subtract),
    "__mul__": multiply, "__rmul__": _swap(multiply),
    "__truediv__": divide, "__rtruediv__": _swap(divide),
    "__floordiv__": floor_divide, "__rfloordiv__": _swap(floor_divide),
    "__mod__": remainder, "__rmod__": _swap(remainder),
    "__divmod__": lambda self, other: (floor_divide(self, other), remainder(self, other)),
    "__rdivmod__": lambda self, other: (floor_divide(other, self), remainder(other, self)),
    "__pow__": power, "__rpow__": _swap(ew.pow),
    "__matmul__": matmul, "__rmatmul__": _swap(matmul),
    "__neg__": negative, "__pos__": lambda self: self, "__abs__": abs,
    "__lt__": less, "__le__": less_equal, "__gt__": greater, "__ge__": greater_equal,
    "__eq__": equal, "__ne__": not_equal,
    "__getitem__": getitem, "__setitem__": _setitem,
    "reshape": _tracer_reshape, "transpose": _tracer_transpose,
    "__and__": _operator("&", bitwise_and), "__rand__": _operator("&", bitwise_and, True),
    "__or__": _operator("|", bitwise_or), "__ror__": _operator("|", bitwise_or, True),
    "__xor__": _operator("^", bitwise_xor), "__rxor__": _operator("^", bitwise_xor, True),
    "__lshift__": _operator("<<", left_shift), "__rlshift__": _operator("<<", left_shift, True),
    "__rshift__": _operator(">>", right_shift), "__rrshift__": _operator(">>", right_shift, True),
    "__invert__": _invert_operator,
    "sum": _tracer_sum, "mean": _tracer_mean, "var": _tracer_var, "std": _tracer_std,
    "max": _tracer_extremum(max), "min": _tracer_extremum(min),
    "argmax": _tracer_arg(argmax), "argmin": _tracer_arg(argmin), "astype": astype, "ravel": ravel,
    "squeeze": squeeze, "clip": _tracer_clip, "dot": dot, "swapaxes": swapaxes,
    "prod": _tracer_prod, "cumsum": _tracer_cumulative(cumsum), "cumprod": _tracer_cumulative(cumprod),
    "any": _tracer_any_all(any), "all": _tracer_any_all(all), "round": _tracer_round,
    "argsort": _tracer_argsort, "diagonal": diagonal, "trace": _tracer_trace,
    "__round__": lambda self, ndigits=None: round(self, 0 if ndigits is None else ndigits),
}
for _name, _fn in _TRACER_METHODS.items():
    setattr(Tracer, _name, _fn)
Tracer.__hash__ = object.__hash__
Tracer.T = property(lambda self: transpose(self))
Tracer.mT = property(lambda self: swapaxes(self, -1, -2))
