"""NumPy-named functions that work on arrays and on tracers alike (like ``jax.numpy``).

Every function here is a composite of :mod:`cuvmap.lax` primitives and adds no primitive
of its own, so it is transformable by construction. Arrays stay plain ``numpy.ndarray``
or ``cupy.ndarray``. This module also gives tracers their operators and methods
(``+ - * / ** @``, comparisons, indexing, ``.T``, ``.reshape``, ``.sum``, ...).
"""
import builtins

import numpy as np

from cuvmap import backend, core
from cuvmap import lax
from cuvmap.core import ShapeError, Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import reduction as lax_reduction
from cuvmap.lax import shape as lax_shape

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


def _axes(x, axis):
    """Normalizes ``axis`` (None, int or tuple, negatives allowed) to a sorted tuple."""
    n = ndim(x)
    if axis is None:
        return tuple(range(n))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    out = []
    for a in axis:
        if not -n <= a < n:
            raise ShapeError(f"axis {a} is out of range for an array of shape {shape(x)}")
        out.append(int(a) % n)
    return tuple(sorted(out))


def _axis(x, axis):
    return _axes(x, axis)[0]


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


def clip(x, a_min=None, a_max=None):
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
    axes = _axes(x, axis)
    if core.dtype_of(x) == np.bool_:
        x = astype(x, np.int64)
    out = _keep(lax_reduction.reduce_sum(x, axes), x, axes, keepdims)
    return out if dtype is None else astype(out, dtype)


def mean(x, axis=None, keepdims=False):
    axes = _axes(x, axis)
    count = int(np.prod([shape(x)[a] for a in axes], dtype=np.int64))
    if not core.is_float(x):
        x = astype(x, np.float64)
    return ew.div(sum(x, axes, keepdims), count)


def var(x, axis=None, keepdims=False, ddof=0):
    axes = _axes(x, axis)
    count = int(np.prod([shape(x)[a] for a in axes], dtype=np.int64))
    centered = ew.sub(x, mean(x, axes, keepdims=True))
    return ew.div(sum(square(centered), axes, keepdims), count - ddof)


def std(x, axis=None, keepdims=False, ddof=0):
    return ew.sqrt(var(x, axis, keepdims, ddof))


def max(x, axis=None, keepdims=False):  # noqa: A001
    axes = _axes(x, axis)
    return _keep(lax_reduction.reduce_max(x, axes), x, axes, keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001
    axes = _axes(x, axis)
    return _keep(lax_reduction.reduce_min(x, axes), x, axes, keepdims)


amax, amin = max, min


def argmax(x, axis=None):
    if axis is None:
        return lax_reduction.argmax(ravel(x), 0)
    return lax_reduction.argmax(x, _axis(x, axis))


def argmin(x, axis=None):
    if axis is None:
        return lax_reduction.argmin(ravel(x), 0)
    return lax_reduction.argmin(x, _axis(x, axis))


def logsumexp(x, axis=None, keepdims=False):
    """``log(sum(exp(x)))`` computed stably by shifting with the (constant) maximum."""
    axes = _axes(x, axis)
    m = stop_gradient(max(x, axes, keepdims=True))
    m = where(ew.eq(ew.abs(m), np.inf), 0.0, m)
    out = ew.add(ew.log(sum(ew.exp(ew.sub(x, m)), axes, keepdims=True)), m)
    return out if keepdims else lax_shape.reshape(out, tuple(s for i, s in enumerate(shape(x)) if i not in axes))


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
        axes = _axes(x, axis)
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
    return lax_shape.concatenate(xs, _axis(xs[0], axis))


def stack(xs, axis=0):
    xs = list(xs)
    n = ndim(xs[0]) + 1
    axis = int(axis) % n
    return lax_shape.concatenate([lax_shape.expand_dims(x, (axis,)) for x in xs], axis)


def pad(x, pad_width, constant_values=0):
    """Constant padding (``numpy.pad`` with ``mode='constant'``)."""
    n = ndim(x)
    pw = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (n, 2))
    return lax_shape.pad(x, tuple((int(lo), int(hi)) for lo, hi in pw), constant_values)


# ---------------------------------------------------------------------------------------
# Indexing
# ---------------------------------------------------------------------------------------


def take(x, indices, axis=None):
    if axis is None:
        return lax_indexing.take(ravel(x), indices, 0)
    return lax_indexing.take(x, indices, _axis(x, axis))


def take_along_axis(x, indices, axis):
    """``out[..., j, ...] = x[..., indices[..., j, ...], ...]`` along ``axis`` (NumPy's
    semantics; ``indices`` broadcasts against ``x`` on the other dims). Implemented as one
    ``take`` on the flattened array with offset indices."""
    axis = _axis(x, axis)
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


def einsum(subscripts, *operands):
    """``numpy.einsum`` for one or two operands, explicit (``'ij,jk->ik'``) or implicit
    output; letters shared by both operands and the output are batch dims, shared letters
    missing from the output are contracted, others are summed away first. Repeated
    letters within one operand (diagonals) and ``...`` are not supported."""
    subscripts = subscripts.replace(" ", "")
    if "..." in subscripts:
        raise NotImplementedError("einsum: ellipsis ('...') is not supported")
    if "->" in subscripts:
        ins, out = subscripts.split("->")
    else:
        ins = subscripts
        letters = ins.replace(",", "")
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    in_specs = ins.split(",")
    if len(in_specs) != len(operands) or len(operands) not in (1, 2):
        raise ShapeError(f"einsum: {subscripts!r} needs {len(in_specs)} operands; one or two are supported")
    for spec, op in zip(in_specs, operands):
        if len(spec) != ndim(op):
            raise ShapeError(f"einsum: subscripts {spec!r} do not match an operand of shape {shape(op)}")
        if len(set(spec)) != len(spec):
            raise NotImplementedError(f"einsum: repeated subscripts within one operand ({spec!r}) are not supported")
    if len(operands) == 1:
        (spec,), (x,) = in_specs, operands
        summed = tuple(i for i, c in enumerate(spec) if c not in out)
        x = sum(x, summed) if summed else x
        kept = [c for c in spec if c in out]
        return transpose(x, tuple(kept.index(c) for c in out))
    (sa, sb), (a, b) = in_specs, operands

    def sum_private(x, spec, other):
        private = tuple(i for i, c in enumerate(spec) if c not in other and c not in out)
        if private:
            x = sum(x, private)
            spec = "".join(c for i, c in enumerate(spec) if i not in private)
        return x, spec

    a, sa = sum_private(a, sa, sb)
    b, sb = sum_private(b, sb, sa)
    batch = [c for c in sa if c in sb and c in out]
    contract = [c for c in sa if c in sb and c not in out]
    dn = (
        (tuple(sa.index(c) for c in contract), tuple(sb.index(c) for c in contract)),
        (tuple(sa.index(c) for c in batch), tuple(sb.index(c) for c in batch)),
    )
    result = lax.dot_general(a, b, dn)
    result_spec = batch + [c for c in sa if c not in sb] + [c for c in sb if c not in sa]
    return transpose(result, tuple(result_spec.index(c) for c in out))


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


def _is_bool(x):
    return core.dtype_of(x) == np.bool_


def logical_not(x):
    """``~x`` for booleans; nonzero counts as True."""
    return ew.eq(x, False) if _is_bool(x) else ew.eq(x, 0)


def logical_and(x, y):
    return ew.select(ew.ne(x, 0), ew.ne(y, 0), False)


def logical_or(x, y):
    return ew.select(ew.ne(x, 0), True, ew.ne(y, 0))


def logical_xor(x, y):
    return ew.ne(ew.ne(x, 0), ew.ne(y, 0))


def _boolean_op(name, fn):
    """``&``, ``|``, ``^`` on boolean tracers (there are no integer bitwise primitives)."""

    def op(x, y):
        if not (_is_bool(x) and _is_bool(y)):
            raise TypeError(
                f"operator {name} is supported on boolean traced values only, got {core.dtype_of(x)} "
                f"and {core.dtype_of(y)}; use cuvmap.numpy.logical_* for truth values"
            )
        return fn(x, y)

    return op


def _invert(x):
    if not _is_bool(x):
        raise TypeError(f"operator ~ is supported on boolean traced values only, got {core.dtype_of(x)}")
    return logical_not(x)


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
    "__and__": _boolean_op("&", logical_and), "__rand__": _swap(_boolean_op("&", logical_and)),
    "__or__": _boolean_op("|", logical_or), "__ror__": _swap(_boolean_op("|", logical_or)),
    "__xor__": _boolean_op("^", logical_xor), "__rxor__": _swap(_boolean_op("^", logical_xor)),
    "__invert__": _invert,
    "sum": _tracer_sum, "mean": _tracer_mean, "var": _tracer_var, "std": _tracer_std,
    "max": _tracer_extremum(max), "min": _tracer_extremum(min),
    "argmax": _tracer_arg(argmax), "argmin": _tracer_arg(argmin), "astype": astype, "ravel": ravel,
    "squeeze": squeeze, "clip": _tracer_clip, "dot": dot, "swapaxes": swapaxes,
}
for _name, _fn in _TRACER_METHODS.items():
    setattr(Tracer, _name, _fn)
Tracer.__hash__ = object.__hash__
Tracer.T = property(lambda self: transpose(self))
Tracer.mT = property(lambda self: swapaxes(self, -1, -2))
