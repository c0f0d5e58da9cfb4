"""Functions of shapes and layouts: ``reshape``, ``transpose``, ``moveaxis``,
``broadcast_to``, ``concatenate``, ``stack``, ``split``, ``flip``, ``roll``, ``tril``,
``triu``, ``diag``, ``diagonal``, and the index vectors of ``pad``'s gathered modes
(``pad`` itself: ``cuvmap/numpy/_pad_modes.py``)."""
import builtins

import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import shape as lax_shape
from cuvmap.numpy._common import _axes, _axis, _holds_tracer, ndim, shape, size
from cuvmap.core.bfloat16 import kind_of


def reshape(a, shape=None, order="C", *, newshape=None, copy=None):  # noqa: A002 - jax.numpy's name
    """``jnp.reshape``: ``a`` with the same entries in a new ``shape`` (an int or a tuple;
    one entry may be -1), read and written in row-major (``order='C'``) or column-major
    (``'F'``: the reverse of the dims' order) order. ``newshape`` is NumPy's older name."""
    if newshape is not None:
        if shape is not None:
            raise TypeError("reshape: give shape or newshape, not both")
        shape = newshape
    if shape is None:
        raise TypeError("reshape: missing the new shape")
    if order not in ("C", "F", "A"):
        raise ValueError(f"reshape: order must be 'C', 'F' or 'A', got {order!r}")
    newshape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if order == "F":
        reversed_x = transpose(a)
        out = reshape(reversed_x, newshape[::-1])
        return transpose(out)
    total = size(a)
    if newshape.count(-1) > 1:
        raise ShapeError(f"reshape: more than one -1 in {newshape}")
    if -1 in newshape:
        known = int(np.prod([s for s in newshape if s != -1], dtype=np.int64))
        if known == 0 or total % known:
            raise ShapeError(f"reshape: cannot reshape {core.shape_of(a)} ({total} elements) to {newshape}")
        newshape = tuple(total // known if s == -1 else s for s in newshape)
    return lax_shape.reshape(a, newshape)


def ravel(a, order="C"):
    """``jnp.ravel``: the entries of ``a`` as one dim, in row-major order (``'F'``: column-major).
    A Python number becomes a weakly typed array first, as ``jnp.ravel(1)`` is in JAX."""
    if type(a) in (int, float, complex):
        a = np.asarray(a).view(core.WeakArray)  # (cnp.asarray of a Python number: _creation imports this module)
    return reshape(a, (-1,), order)


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


def moveaxis(a, source, destination):
    n = ndim(a)
    src = [int(s) % n for s in np.atleast_1d(source)]
    dst = [int(d) % n for d in np.atleast_1d(destination)]
    order = [i for i in range(n) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return lax_shape.transpose(a, tuple(order))


def expand_dims(x, axis):
    """``jnp.expand_dims``: ``x`` with dims of size 1 inserted at the positions ``axis`` (an
    int or a tuple) of the result."""
    axes = _static_axes(axis)
    n = ndim(x) + len(axes)
    for a in axes:
        if not -n <= a < n:
            raise ShapeError(f"expand_dims: axis {a} is out of range for a result with {n} dims")
    normalized = tuple(sorted(int(a) % n for a in axes))
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"expand_dims: repeated axis in {axis!r}")
    return lax_shape.expand_dims(x, normalized)


def _static_axes(axis):
    """An ``axis`` argument (an int, a 0-d or 1-d array of ints, a sequence) as a tuple of ints."""
    if isinstance(axis, (int, np.integer)):
        return (int(axis),)
    if hasattr(axis, "ndim") and not hasattr(axis, "_main"):
        return tuple(int(a) for a in np.atleast_1d(np.asarray(axis)))
    return tuple(int(a) for a in axis)


def squeeze(x, axis=None):
    if axis is None:
        axes = tuple(i for i, s in enumerate(shape(x)) if s == 1)
    else:
        axes = _axes(x, _static_axes(axis), "squeeze")
        for a in axes:
            if shape(x)[a] != 1:
                raise ValueError(f"squeeze: cannot select an axis to squeeze out which has size not equal to one "
                                 f"(axis {a} of shape {shape(x)})")
    return lax_shape.squeeze(x, axes)


def broadcast_to(x, shape_):
    """``jnp.broadcast_to``: ``x`` broadcast to ``shape_`` (an int or a tuple)."""
    if isinstance(shape_, (int, np.integer)):
        shape_ = (int(shape_),)
    return lax_shape.broadcast_to(x, tuple(int(s) for s in shape_))


def broadcast_arrays(*xs):
    target = ew.broadcast_shapes(*(shape(x) for x in xs))
    return [broadcast_to(x, target) for x in xs]


def atleast_1d(x):
    return reshape(x, (1,)) if ndim(x) == 0 else x


def _join_operands(xs, dtype, name):
    """The operands of a join as arrays or tracers of one dtype: Python scalars and lists
    become arrays (on the device of the others), and the dtypes promote as NumPy's do
    (or become ``dtype``)."""
    xs = list(xs)
    if not xs:
        raise ValueError(f"{name}: need at least one array to join")
    xp = backend.xp_of(*[x for x in xs if hasattr(x, "shape")])
    xs = [x if hasattr(x, "shape") and hasattr(x, "dtype") else xp.asarray(x) for x in xs]
    target = np.dtype(dtype) if dtype is not None else np.result_type(*(core.dtype_of(x) for x in xs))
    return [x if core.dtype_of(x) == target else ew.convert_element_type(x, target) for x in xs]


def concatenate(arrays, axis=0, dtype=None):
    """``jnp.concatenate``: the arrays joined along ``axis`` (flattened first for
    ``axis=None``), in their promoted dtype or ``dtype``."""
    arrays = _join_operands(arrays, dtype, "concatenate")
    if axis is None:
        arrays = [ravel(x) for x in arrays]
        axis = 0
    return lax_shape.concatenate(arrays, _axis(arrays[0], axis, "concatenate"))


def stack(arrays, axis=0, out=None, dtype=None):
    """``jnp.stack``: the arrays (of one shape) joined along a new dim ``axis``."""
    if out is not None:
        raise NotImplementedError("stack: out= is not supported")
    arrays = _join_operands(arrays, dtype, "stack")
    n = ndim(arrays[0]) + 1
    if not -n <= int(axis) < n:
        raise ShapeError(f"stack: axis {axis} is out of range for {n} dims")
    axis = int(axis) % n
    return lax_shape.concatenate([lax_shape.expand_dims(x, (axis,)) for x in arrays], axis)


def _known(value):
    """``value`` with each derivative tracer replaced by the primal it carries (known under
    eager ``grad``/``jvp``, as JAX's concrete tracers), in lists and tuples too."""
    if isinstance(value, (list, tuple)):
        return type(value)(_known(v) for v in value)
    while isinstance(value, core.PrimalTracer):
        value = value._concrete_value()
    return value


def _static_ints(value, name, what):
    """``value`` as a NumPy int array; traced values and non-integers raise TypeError."""
    if _holds_tracer(value):
        raise TypeError(f"{name}: {what} must be static (ints), not a traced value (Abstract tracer value "
                        "encountered where concrete value is expected.)")
    arr = np.asarray(value)
    if arr.size and kind_of(arr.dtype) not in "iu":
        raise TypeError(f"{name}: {what} must be integers, got {value!r}")
    return arr.astype(np.int64)


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


def flip(m, axis=None):
    """``m`` reversed along ``axis`` (an int, a tuple, or ``None`` for every axis)."""
    axes = _axes(m, axis, "flip")
    if not axes:
        return m
    s = shape(m)
    slices = [(0, n, 1) for n in s]
    for a in axes:
        slices[a] = lax_indexing.normalize_slice(builtins.slice(None, None, -1), s[a])
    return lax_indexing.slice(m, slices)


def fliplr(m):
    if ndim(m) < 2:
        raise ShapeError(f"fliplr: the array must have at least 2 dims, got shape {shape(m)}")
    return flip(m, 1)


def flipud(m):
    if ndim(m) < 1:
        raise ShapeError("flipud: the array must have at least 1 dim, got a 0-d array")
    return flip(m, 0)


def roll(x, shift, axis=None):
    """Elements shifted by ``shift`` places along ``axis`` (wrapping around); ``None``
    rolls the flattened array. ``shift`` and ``axis`` may be tuples (broadcast against
    each other; shifts of one axis add up). Static shifts join two slices; a traced shift
    gathers with the indices ``(i − shift) mod n``."""
    if axis is None:
        return reshape(roll(ravel(x), shift, 0), shape(x))
    if _holds_tracer(shift) or backend.is_cupy_array(shift):  # a value on the device: gather, no host copy
        return _roll_traced(x, shift, axis)
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


def _roll_traced(x, shift, axis):
    axes_ = np.atleast_1d(_static_ints(axis, "roll", "axis"))
    if isinstance(shift, (list, tuple)):
        shifts = list(shift)
    elif ndim(shift) == 0:
        shifts = [shift] * len(axes_)
    else:
        shifts = [lax_indexing.slice_in_dim(shift, i, i + 1, 0) for i in range(shape(shift)[0])]
        shifts = [lax_shape.reshape(s, ()) for s in shifts]
    if len(shifts) == 1 and len(axes_) > 1:
        shifts = shifts * len(axes_)
    if len(axes_) == 1 and len(shifts) > 1:  # broadcast against one axis: the shifts add up (NumPy's)
        axes_ = np.repeat(axes_, len(shifts))
    if len(shifts) != len(axes_):
        raise ShapeError(f"roll: shift and axis {axis!r} must have the same length")
    for sh, ax in zip(shifts, axes_.tolist()):
        a = _axis(x, ax, "roll")
        n = shape(x)[a]
        if n == 0:
            continue
        index = ew.remainder(ew.sub(lax_indexing.iota(n, like=x), ew.convert_element_type(sh, np.int64)
                                    if hasattr(sh, "dtype") else int(sh)), n)
        x = lax_indexing.take(x, index, a)
    return x


def _split(name, x, indices_or_sections, axis, equal):
    axis = _axis(x, axis, name)
    n = shape(x)[axis]
    spec = _known(indices_or_sections)
    if not _holds_tracer(spec) and np.ndim(spec) == 0 and float(spec) == int(spec):
        spec = int(spec)  # a whole number of sections given as a float (JAX converts it to int64)
    spec = _static_ints(spec, name, "indices_or_sections")
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


def split(ary, indices_or_sections, axis=0):
    """``numpy.split``: a list of pieces along ``axis``; an int ``k`` asks for ``k`` equal
    pieces (an error when the size is not a multiple of ``k``), a sequence of indices
    gives the split points (as slice bounds: negative ones count from the end)."""
    return _split("split", ary, indices_or_sections, axis, equal=True)


def array_split(ary, indices_or_sections, axis=0):
    """``numpy.array_split``: as :func:`split`, but ``k`` pieces need not be equal (the first
    ``n % k`` are one longer)."""
    return _split("array_split", ary, indices_or_sections, axis, equal=False)


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
        raise ShapeError(f"diagonal: axis1 and axis2 can not be same: both are dim {a1} (shape {s})")
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
