"""``reduce_window`` — JAX's ``lax.reduce_window`` — and its monoid forms
``reduce_window_sum``, ``reduce_window_max``, ``reduce_window_min``.

Over every dim of the operand a window of ``k`` taps slides with stride ``s`` and window
dilation ``d`` over the operand dilated by ``b`` (``b − 1`` holes between neighbours) and
padded by ``(low, high)`` (negative entries crop); holes and padding hold ``init``::

    out[y] = init ⊕ x̃[y·s + t_1·d] ⊕ x̃[y·s + t_2·d] ⊕ ...         (taps t in row-major order)

with ``out = ⌊(P − d(k − 1) − 1) / s⌋ + 1`` positions per dim for a padded, dilated extent
``P`` (none when the window does not fit). The taps are folded in row-major order from
``init`` (a left fold, so a reducer that is only associative, or a variadic one such as a
(value, index) argmax, is well defined); each tap is one strided ``slice`` of the padded
operand, so the loop runs over the ``Π k`` taps, never over elements, and everything is
primitives: ``grad`` (both modes), ``vmap`` and ``jit`` apply. A max over windows that
pooling covers (NOTE [reduce_window_max on max_pool]) runs as ``max_pool``.
"""
import itertools

import numpy as np

from cuvmap import core, tree
from cuvmap.core import ShapeError
from cuvmap.lax.conv_general import padtype_to_pads
from cuvmap.lax.indexing import slice_p
from cuvmap.lax.pooling import max_pool
from cuvmap.lax.reducers import fill_scalar, flat_operands, identify_monoid, is_identity, monoid_binary, monoid_identity
from cuvmap.lax.shape import expand_dims, pad_p, reshape

# NOTE [reduce_window_max on max_pool]
# max_pool (cuvmap/lax/pooling.py) is a windowed max over the trailing 1-3 dims of an
# N C S... array with symmetric padding of at most k // 2 and no dilation, with its own
# derivative primitives (the gradient to the first maximum of each window, as XLA's
# select-and-scatter, and the maxima reused as a residual). A reduce_window max from the
# identity whose leading dims have window 1, stride 1 and no padding, and whose other dims
# fit those conditions, is that: the leading dims are merged into N (C = 1) and the pooling
# primitive runs; anything else runs as the tap fold.


def _dims_tuple(value, ndim, name, default=1):
    if value is None:
        return (default,) * ndim
    value = tuple(int(v) for v in value)
    if len(value) != ndim:
        raise ShapeError(f"reduce_window: {name} {value} must have one entry per dim of the operand ({ndim})")
    if any(v < 1 for v in value):
        raise ShapeError(f"reduce_window: {name} {value} must be positive")
    return value


def _scalar_param(value, dtype):
    """``value`` as a hashable Python scalar of ``dtype`` (a static parameter of ``pad``)."""
    if isinstance(value, core.Tracer):
        raise ShapeError(
            "reduce_window: padding and base dilation fill with init_value, which must then be concrete, "
            "got a traced init_value"
        )
    return np.asarray(core.as_array(value)).astype(dtype).item()


def _dilate_fill(x, dilation, fill):
    """``x`` with ``b − 1`` copies of ``fill`` between neighbours along each dim."""
    for axis, b in enumerate(dilation):
        shape = core.shape_of(x)
        n = shape[axis]
        if b == 1 or n == 0:
            continue
        pads = [(0, 0)] * (len(shape) + 1)
        pads[axis + 1] = (0, b - 1)
        y = pad_p.bind(expand_dims(x, (axis + 1,)), pads=tuple(pads), value=fill)
        y = reshape(y, shape[:axis] + (n * b,) + shape[axis + 1:])
        slices = [(0, s, 1) for s in core.shape_of(y)]
        slices[axis] = (0, (n - 1) * b + 1, 1)
        x = slice_p.bind(y, slices=tuple(slices))
    return x


def _pad_or_crop_fill(x, pairs, fill):
    shape = core.shape_of(x)
    slices = [(max(0, -lo), n - max(0, -hi), 1) for n, (lo, hi) in zip(shape, pairs)]
    if any(stop < start for start, stop, _ in slices):
        raise ShapeError(f"reduce_window: padding {tuple(pairs)} crops away a whole dim of {tuple(shape)}")
    if any((start, stop) != (0, n) for (start, stop, _), n in zip(slices, shape)):
        x = slice_p.bind(x, slices=tuple(slices))
    grow = tuple((max(0, lo), max(0, hi)) for lo, hi in pairs)
    if any(lo or hi for lo, hi in grow):
        x = pad_p.bind(x, pads=grow, value=fill)
    return x


def _window_geometry(shape, window_dimensions, window_strides, padding, base_dilation, window_dilation):
    ndim = len(shape)
    window = _dims_tuple(window_dimensions, ndim, "window_dimensions")
    strides = _dims_tuple(window_strides, ndim, "window_strides")
    base = _dims_tuple(base_dilation, ndim, "base_dilation")
    wdil = _dims_tuple(window_dilation, ndim, "window_dilation")
    if isinstance(padding, str):
        dilated_window = [1 + d * (k - 1) for k, d in zip(window, wdil)]
        pairs = [tuple(p) for p in padtype_to_pads(shape, dilated_window, strides, padding)]
    else:
        try:
            pairs = [(int(lo), int(hi)) for lo, hi in padding]
        except (TypeError, ValueError):
            raise ShapeError(f"reduce_window: padding {padding!r} must be 'SAME', 'SAME_LOWER', 'VALID' or pairs") from None
        if len(pairs) != ndim:
            raise ShapeError(f"reduce_window: padding {padding!r} must have one (low, high) pair per dim ({ndim})")
    return window, strides, pairs, base, wdil


def reduce_window(operand, init_value, computation, window_dimensions, window_strides=None, padding="VALID",
                  base_dilation=None, window_dilation=None):
    """JAX's ``lax.reduce_window`` (the module docstring states the math).

    Args:
      operand: an array or a pytree of arrays of one shape.
      init_value: a scalar per operand, in ``operand``'s structure; it fills the padding and
        the holes of ``base_dilation`` and starts the fold.
      computation: ``(acc, x) -> acc`` on pytrees like ``operand``, vectorized; the monoids
        (add, max, min, ...) are recognised (cuvmap/lax/reducers.py).
      window_dimensions, window_strides, base_dilation, window_dilation: one int per dim
        (``None``: 1).
      padding: ``"VALID"``, ``"SAME"``, ``"SAME_LOWER"`` (for the operand's shape and the
        dilated window) or one ``(low, high)`` pair per dim.
    Returns:
      a pytree like ``operand``.
    """
    leaves, treedef, init_leaves, shape = flat_operands("reduce_window", operand, init_value, "init_value", "operand")
    geometry = _window_geometry(shape, window_dimensions, window_strides, padding, base_dilation, window_dilation)
    if len(leaves) == 1 and treedef == tree.structure(leaves[0]):
        name = identify_monoid(computation, core.dtype_of(leaves[0]))
        if name is not None:
            return _monoid_window(name, leaves[0], init_leaves[0], geometry)

    def combine(a, b):
        out = computation(tree.unflatten(treedef, a), tree.unflatten(treedef, b))
        out_leaves, out_def = tree.flatten(out)
        if out_def != treedef:
            raise ShapeError(f"reduce_window: the reducer must return the structure of operand {treedef}, got {out_def}")
        return out_leaves

    return tree.unflatten(treedef, _fold_taps(combine, leaves, init_leaves, geometry, start_with_init=True))


def _fold_taps(combine, leaves, init_leaves, geometry, start_with_init):
    window, strides, pairs, base, wdil = geometry
    padded = []
    for x, v in zip(leaves, init_leaves):
        needs_fill = any(b > 1 for b in base) or any(lo > 0 or hi > 0 for lo, hi in pairs)
        fill = _scalar_param(v, core.dtype_of(x)) if needs_fill else 0
        padded.append(_pad_or_crop_fill(_dilate_fill(x, base, fill), pairs, fill))
    extent = core.shape_of(padded[0])
    out_shape = tuple(max(0, (p - d * (k - 1) - 1) // s + 1) if p >= d * (k - 1) + 1 else 0
                      for p, k, s, d in zip(extent, window, strides, wdil))
    inits = [fill_scalar(v, out_shape, x) for v, x in zip(init_leaves, leaves)]
    if 0 in out_shape:
        return inits
    acc = inits if start_with_init else None
    for tap in itertools.product(*map(range, window)):
        slices = tuple((t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(tap, wdil, out_shape, strides))
        taken = [slice_p.bind(x, slices=slices) for x in padded]
        acc = taken if acc is None else combine(acc, taken)
    return acc


def _monoid_window(name, x, init, geometry):
    dtype = core.dtype_of(x)
    identity = is_identity(name, init, dtype)
    if name == "max" and identity:
        pooled = _as_max_pool(x, geometry)
        if pooled is not None:
            return pooled
    op = monoid_binary(name)
    (out,) = _fold_taps(lambda a, b: [op(a[0], b[0])], [x], [init], geometry, start_with_init=not identity)
    return out


def _as_max_pool(x, geometry):
    """``max_pool`` of ``x`` when the window fits it (NOTE [reduce_window_max on
    max_pool]), else None."""
    window, strides, pairs, base, wdil = geometry
    shape = core.shape_of(x)
    if not np.issubdtype(core.dtype_of(x), np.floating) or any(b != 1 for b in base) or any(d != 1 for d in wdil):
        return None
    active = [i for i in range(len(shape)) if window[i] != 1 or strides[i] != 1 or pairs[i] != (0, 0)]
    first = active[0] if active else len(shape)
    nd = len(shape) - first
    if not 1 <= nd <= 3 or 0 in shape:
        return None
    tail = range(first, len(shape))
    if any(pairs[i][0] != pairs[i][1] or pairs[i][0] > window[i] // 2 for i in tail):
        return None
    if any(shape[i] + 2 * pairs[i][0] < window[i] for i in tail):
        return None
    lead = int(np.prod(shape[:first], dtype=np.int64))
    y = reshape(x, (lead, 1) + tuple(shape[first:]))
    out = max_pool(y, tuple(window[first:]), tuple(strides[first:]), tuple(pairs[i][0] for i in tail))
    return reshape(out, tuple(shape[:first]) + tuple(core.shape_of(out)[2:]))


def _monoid_form(name):
    def form(operand, window_dimensions, window_strides=None, padding="VALID", base_dilation=None,
             window_dilation=None):
        dtype = core.dtype_of(operand)
        init = monoid_identity(name, dtype)
        geometry = _window_geometry(core.shape_of(operand), window_dimensions, window_strides, padding, base_dilation,
                                    window_dilation)
        return _monoid_window(name, operand, init, geometry)

    return form


def reduce_window_sum(operand, window_dimensions, window_strides=None, padding="VALID", base_dilation=None,
                      window_dilation=None):
    """The windowed sum, ``reduce_window(operand, 0, lax.add, ...)`` (JAX's internal
    ``_reduce_window_sum``): ``out[y] = Σ_t x̃[y·s + t·d]`` with zeros in padding and holes."""
    return _monoid_form("add")(operand, window_dimensions, window_strides, padding, base_dilation, window_dilation)


def reduce_window_max(operand, window_dimensions, window_strides=None, padding="VALID", base_dilation=None,
                      window_dilation=None):
    """The windowed max, ``reduce_window(operand, −∞, lax.max, ...)`` (JAX's internal
    ``_reduce_window_max``): ``out[y] = max_t x̃[y·s + t·d]``, −∞ (the dtype's least value)
    in padding and holes; runs as ``max_pool`` where that fits."""
    return _monoid_form("max")(operand, window_dimensions, window_strides, padding, base_dilation, window_dilation)


def reduce_window_min(operand, window_dimensions, window_strides=None, padding="VALID", base_dilation=None,
                      window_dilation=None):
    """The windowed min, ``reduce_window(operand, +∞, lax.min, ...)`` (JAX's internal
    ``_reduce_window_min``): ``out[y] = min_t x̃[y·s + t·d]``, +∞ in padding and holes."""
    return _monoid_form("min")(operand, window_dimensions, window_strides, padding, base_dilation, window_dilation)
