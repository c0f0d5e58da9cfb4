"""The scatters of ``lax``: ``scatter``, ``scatter_add``, ``scatter_mul``, ``scatter_min``,
``scatter_max`` (XLA's Scatter with JAX's dimension numbers and modes) and
``scatter_apply``.

With ``dimension_numbers = ScatterDimensionNumbers(update_window_dims,
inserted_window_dims, scatter_dims_to_operand_dims, operand_batching_dims,
scatter_indices_batching_dims)`` and ``indices`` of shape ``batch_shape + (K,)``, each
element of ``updates`` at a position with scatter part ``G`` (the dims not in
``update_window_dims``, which match ``batch_shape``) and window part ``W`` targets

    start[scatter_dims_to_operand_dims[k]] = indices[G, k]
    start[operand_batching_dims[i]] = G[scatter_indices_batching_dims[i]]
    out[start + W] = combine(out[start + W], updates[G, W])

(``W`` is 0 on inserted and batching dims), where ``combine`` replaces, adds,
multiplies, or takes the minimum or maximum; several updates of one element all
combine (for ``scatter``, the last in row-major order of ``updates`` wins, on every
backend). ``mode``: ``clip`` clamps each start so that the window lies in bounds;
``fill``/``drop``, ``promise_in_bounds`` and the default ``None`` drop a window that
would leave the operand.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.control_flow import while_loop
from cuvmap.lax.reduction import reduce_max
from cuvmap.lax.slicing_gather import (
    GatherScatterMode, ScatterDimensionNumbers, as_indices, check_index_structure,
    frame_index_arrays, gather_dnums_of_scatter, gather_p, one_window, scatter_dnums_of_gather, transpose_mode,
    window_operand_dims, zeros_of,
)
from cuvmap.transforms import batching, complex_rules, jvp, vjp
from cuvmap.transforms.batching import bdim_at_front, not_mapped
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# declarations and public wrappers
# ---------------------------------------------------------------------------------------

scatter_p = Primitive("scatter")
scatter_add_p = Primitive("scatter_add")
scatter_mul_p = Primitive("scatter_mul", host_sync=True)  # CuPy: the repeat count read on the host (_multiply_at)
scatter_min_p = Primitive("scatter_min")
scatter_max_p = Primitive("scatter_max")


def _bind(primitive, operand, scatter_indices, updates, dimension_numbers, indices_are_sorted, unique_indices,
          mode):
    if not isinstance(dimension_numbers, ScatterDimensionNumbers):
        raise TypeError(f"{primitive.name}: dimension_numbers must be a ScatterDimensionNumbers, got "
                        f"{type(dimension_numbers).__name__}")
    if not isinstance(updates, core.Tracer) and not hasattr(updates, "dtype"):
        updates = np.asarray(updates, dtype=core.dtype_of(operand))  # a Python number or list
    if core.dtype_of(updates) != core.dtype_of(operand):
        raise TypeError(f"{primitive.name}: updates of dtype {core.dtype_of(updates)} do not match the operand's "
                        f"{core.dtype_of(operand)} (lax's scatters need the same dtype)")
    dnums = ScatterDimensionNumbers(*(tuple(int(d) for d in f) for f in dimension_numbers))
    return primitive.bind(operand, as_indices(scatter_indices), updates, dimension_numbers=dnums,
                          indices_are_sorted=bool(indices_are_sorted), unique_indices=bool(unique_indices),
                          mode=GatherScatterMode.from_any(mode))


def scatter(operand, scatter_indices, updates, dimension_numbers, *, indices_are_sorted=False,
            unique_indices=False, mode=None):
    """``jax.lax.scatter``: ``operand`` with the elements that ``updates`` target replaced
    (module docstring; of several updates of one element the last in row-major order
    wins). Differentiable in ``operand`` (zero where written) and ``updates`` (each
    winning update receives its element's cotangent)."""
    return _bind(scatter_p, operand, scatter_indices, updates, dimension_numbers, indices_are_sorted,
                 unique_indices, mode)


def scatter_add(operand, scatter_indices, updates, dimension_numbers, *, indices_are_sorted=False,
                unique_indices=False, mode=None):
    """``jax.lax.scatter_add``: ``out = operand``, then ``out[start + W] += updates[G, W]``
    for every update (repeated targets accumulate). Linear in ``operand`` and
    ``updates``: the transpose of :func:`cuvmap.lax.gather`."""
    return _bind(scatter_add_p, operand, scatter_indices, updates, dimension_numbers, indices_are_sorted,
                 unique_indices, mode)


def scatter_mul(operand, scatter_indices, updates, dimension_numbers, *, indices_are_sorted=False,
                unique_indices=False, mode=None):
    """``jax.lax.scatter_mul``: ``out[start + W] *= updates[G, W]`` for every update. Its
    derivative in ``operand`` is the scatter_mul of the tangent; in ``updates`` JAX's
    rule ``operand · scatter_add(0, indices, t)``, which holds for ``unique_indices=True``
    only (otherwise it raises NotImplementedError, as JAX)."""
    return _bind(scatter_mul_p, operand, scatter_indices, updates, dimension_numbers, indices_are_sorted,
                 unique_indices, mode)


def scatter_min(operand, scatter_indices, updates, dimension_numbers, *, indices_are_sorted=False,
                unique_indices=False, mode=None):
    """``jax.lax.scatter_min``: ``out[start + W] = min(out[start + W], updates[G, W])``. The
    derivative goes to the values equal to the result, shared evenly between ties (the
    operand's value and the updates that reach it), as JAX's."""
    return _bind(scatter_min_p, operand, scatter_indices, updates, dimension_numbers, indices_are_sorted,
                 unique_indices, mode)


def scatter_max(operand, scatter_indices, updates, dimension_numbers, *, indices_are_sorted=False,
                unique_indices=False, mode=None):
    """``jax.lax.scatter_max``: ``out[start + W] = max(out[start + W], updates[G, W])``;
    derivatives as :func:`scatter_min`."""
    return _bind(scatter_max_p, operand, scatter_indices, updates, dimension_numbers, indices_are_sorted,
                 unique_indices, mode)


def scatter_apply(operand, scatter_indices, func, dimension_numbers, *, update_shape=(), indices_are_sorted=False,
                  unique_indices=False, mode=None):
    """``jax.lax.scatter_apply``: ``operand`` with ``func`` (an elementwise unary function)
    applied to each targeted element, once per update that targets it (JAX's duplicate
    semantics). ``update_shape`` is the shape the updates would have. Computed as a count
    of targets per element (a scatter_add of ones) and a loop that applies ``func``
    where the count exceeds the step (forward-mode differentiable); with
    ``unique_indices=True`` one select of ``func(operand)``, differentiable in both modes
    (JAX differentiates neither)."""
    dnums = ScatterDimensionNumbers(*(tuple(int(d) for d in f) for f in dimension_numbers))
    ones = np.ones(tuple(update_shape), np.int32)
    counts = scatter_add(zeros_of(operand, core.shape_of(operand), np.int32), scatter_indices, ones, dnums,
                         indices_are_sorted=indices_are_sorted, unique_indices=unique_indices, mode=mode)
    if unique_indices:  # each element at most once: one step, differentiable in both modes
        return ew.select(ew.gt(counts, np.int32(0)), func(operand), operand)
    steps = reduce_max(counts)

    def body(state):
        step, x = state
        return ew.add(step, np.int32(1)), ew.select(ew.gt(counts, step), func(x), x)

    return while_loop(lambda state: ew.lt(state[0], steps), body, (np.int32(0), operand))[1]


# ---------------------------------------------------------------------------------------
# shape rule
# ---------------------------------------------------------------------------------------


def window_sizes(operand_shape, updates_shape, dnums):
    """The window's size along each operand dim: 1 on inserted and batching dims, the
    matching updates dim on the others."""
    windows = window_operand_dims(len(operand_shape), dnums.inserted_window_dims, dnums.operand_batching_dims)
    return tuple(updates_shape[dnums.update_window_dims[windows.index(d)]] if d in windows else 1
                 for d in range(len(operand_shape)))


def _scatter_shape_rule_for(name):
    def rule(operand, indices, updates, *, dimension_numbers, indices_are_sorted, unique_indices, mode):
        d = dimension_numbers
        if kind_of(indices.dtype) not in "iu":
            raise ShapeError(f"{name}: indices must be integers, got {indices.dtype}")
        if updates.dtype != operand.dtype:
            raise ShapeError(f"{name}: updates of dtype {updates.dtype} do not match the operand's {operand.dtype}")
        check_index_structure(name, operand.shape, indices.shape, d.inserted_window_dims, "inserted_window_dims",
                              d.scatter_dims_to_operand_dims, d.operand_batching_dims,
                              d.scatter_indices_batching_dims)
        windows = window_operand_dims(operand.ndim, d.inserted_window_dims, d.operand_batching_dims)
        batch_shape = tuple(indices.shape[:-1])
        if updates.ndim != len(batch_shape) + len(d.update_window_dims) or len(d.update_window_dims) != len(windows):
            raise ShapeError(f"{name}: updates of shape {updates.shape} must have the indices' batch dims "
                             f"{batch_shape} and one window dim per operand dim {windows} "
                             f"(update_window_dims {d.update_window_dims})")
        if list(d.update_window_dims) != sorted(set(d.update_window_dims)) or any(
                not 0 <= p < updates.ndim for p in d.update_window_dims):
            raise ShapeError(f"{name}: update_window_dims {d.update_window_dims} must be sorted dims of the "
                             f"updates {updates.shape}")
        scatter_dims = tuple(updates.shape[p] for p in range(updates.ndim) if p not in d.update_window_dims)
        if scatter_dims != batch_shape:
            raise ShapeError(f"{name}: the updates' scatter dims {scatter_dims} must equal the indices' batch dims "
                             f"{batch_shape}")
        for od, p in zip(windows, d.update_window_dims):
            if updates.shape[p] > operand.shape[od]:
                raise ShapeError(f"{name}: the window of the updates {updates.shape} exceeds the operand "
                                 f"{operand.shape} along operand dim {od}")
        return ShapedArray(operand.shape, operand.dtype, operand.weak_type)

    return rule


# ---------------------------------------------------------------------------------------
# impl
# ---------------------------------------------------------------------------------------


def _last_of_each_target(xp, linear, vals):
    """The targets and values of the last update of each target (row-major order)."""
    order = xp.argsort(linear, kind="stable")
    targets, vals = linear[order], vals[order]
    last = xp.ones(targets.shape, dtype=bool)
    last[:-1] = targets[:-1] != targets[1:]
    return targets[last], vals[last]


def _multiply_at(xp, flat, linear, vals):
    """``flat[linear] *= vals`` with repeats: NumPy's ``multiply.at``; on CuPy, which has
    no scatter-multiply, the updates are sorted by target and applied in rounds, round
    ``r`` applying each target's ``r``-th update (as many rounds as the most repeated
    target has updates, one when the targets are unique)."""
    if xp is np:
        np.multiply.at(flat, linear, vals)
        return
    order = xp.argsort(linear, kind="stable")
    targets, vals = linear[order], vals[order]
    n = targets.shape[0]
    position = xp.arange(n)
    first = xp.ones(n, dtype=bool)
    first[1:] = targets[1:] != targets[:-1]
    group = xp.cumsum(first) - 1
    rank = position - position[first][group]  # the place of each update among its target's
    for r in range(int(rank.max()) + 1):
        chosen = rank == r
        flat[targets[chosen]] *= vals[chosen]


def _combine(kind, xp, flat, linear, vals, unique):
    if kind == "replace":
        if not unique:
            linear, vals = _last_of_each_target(xp, linear, vals)
        flat[linear] = vals
    elif kind == "mul":
        _multiply_at(xp, flat, linear, vals)
    elif xp is np:
        {"add": np.add, "min": np.minimum, "max": np.maximum}[kind].at(flat, linear, vals)
    else:  # CuPy: cupyx's scatter_add/min/max are the long-standing spellings of ufunc.at
        import cupyx

        {"add": cupyx.scatter_add, "min": cupyx.scatter_min, "max": cupyx.scatter_max}[kind](flat, linear, vals)


def _combine_window(kind, target, vals):
    """One window (a view of the output) combined with its updates in place."""
    if kind == "replace":
        target[...] = vals
    else:
        {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}[kind](target, vals, out=target)


def _scatter_impl_for(kind):
    def impl(operand, indices, updates, *, dimension_numbers, indices_are_sorted, unique_indices, mode):
        d = dimension_numbers
        operand, indices, updates = core.as_array(operand), core.as_array(indices), core.as_array(updates)
        xp = backend.xp_of(operand, indices, updates)
        out = xp.array(operand, copy=True, order="C")
        if out.size == 0 or updates.size == 0:
            return out
        drop = GatherScatterMode.CLIP if mode is GatherScatterMode.CLIP else GatherScatterMode.FILL_OR_DROP
        sizes = window_sizes(operand.shape, updates.shape, d)
        if xp is np and indices.ndim == 1 and not d.operand_batching_dims:
            window = one_window(operand.shape, indices, d.scatter_dims_to_operand_dims, sizes, drop)
            if window is not None:
                _combine_window(kind, out[window] if window else out, updates.reshape(sizes))  # 0-d: out itself
            return out
        arrays, mask = frame_index_arrays(xp, operand.shape, xp.asarray(indices), updates.ndim, d.update_window_dims,
                                          sizes, d.scatter_dims_to_operand_dims, d.operand_batching_dims,
                                          d.scatter_indices_batching_dims, d.inserted_window_dims, drop)
        strides = np.cumprod((1,) + operand.shape[:0:-1])[::-1]
        linear = arrays[0] * int(strides[0])
        for a, s in zip(arrays[1:], strides[1:]):
            linear = linear + a * int(s)
        linear = xp.broadcast_to(linear, updates.shape).reshape(-1)
        vals = xp.ascontiguousarray(updates).reshape(-1)
        if mask is not None:
            keep = xp.broadcast_to(mask, updates.shape).reshape(-1)
            linear, vals = linear[keep], vals[keep]
        if linear.size:
            _combine(kind, xp, out.reshape(-1), linear, vals, unique_indices)
        return out

    return impl


for _p, _kind in ((scatter_p, "replace"), (scatter_add_p, "add"), (scatter_mul_p, "mul"), (scatter_min_p, "min"),
                  (scatter_max_p, "max")):
    _p.impl = _scatter_impl_for(_kind)
    _p.shape_rule = _scatter_shape_rule_for(_p.name)


# ---------------------------------------------------------------------------------------
# batching rule (one for the family)
# ---------------------------------------------------------------------------------------


def _add_one(dims):
    return tuple(d + 1 for d in dims)


def _scatter_batcher(primitive):
    def rule(axis_size, vals, dims, *, dimension_numbers, indices_are_sorted, unique_indices, mode):
        """JAX's ``_scatter_batching_rule``: the operand and updates get the vmap dim at the
        front (broadcast where unbatched); with unbatched indices it is a window dim of
        full size, with batched indices a pair of batching dims."""
        operand, indices, updates = vals
        d_op, d_idx, d_up = dims
        d = dimension_numbers
        operand = bdim_at_front(operand, d_op, axis_size)
        updates = bdim_at_front(updates, d_up, axis_size)
        if d_idx is not_mapped:
            dnums = ScatterDimensionNumbers(
                update_window_dims=(0,) + _add_one(d.update_window_dims),
                inserted_window_dims=_add_one(d.inserted_window_dims),
                scatter_dims_to_operand_dims=_add_one(d.scatter_dims_to_operand_dims),
                operand_batching_dims=_add_one(d.operand_batching_dims),
                scatter_indices_batching_dims=d.scatter_indices_batching_dims)
        else:
            indices = bdim_at_front(indices, d_idx, axis_size)
            dnums = ScatterDimensionNumbers(
                update_window_dims=_add_one(d.update_window_dims),
                inserted_window_dims=_add_one(d.inserted_window_dims),
                scatter_dims_to_operand_dims=_add_one(d.scatter_dims_to_operand_dims),
                operand_batching_dims=(0,) + _add_one(d.operand_batching_dims),
                scatter_indices_batching_dims=(0,) + _add_one(d.scatter_indices_batching_dims))
        return primitive.bind(operand, indices, updates, dimension_numbers=dnums,
                              indices_are_sorted=indices_are_sorted, unique_indices=unique_indices, mode=mode), 0

    return rule


for _p in (scatter_p, scatter_add_p, scatter_mul_p, scatter_min_p, scatter_max_p):
    batching.primitive_batchers[_p] = _scatter_batcher(_p)


# ---------------------------------------------------------------------------------------
# derivative helpers: the gather that reads what a scatter writes
# ---------------------------------------------------------------------------------------


def _gather_updates(x, indices, updates_shape, operand_shape, dimension_numbers, indices_are_sorted,
                    unique_indices, mode, fill_value=0):
    """``x`` (operand-shaped) read at the updates' targets: the updates-shaped gather
    that a scatter with these parameters transposes to. Dropped updates read
    ``fill_value``; clipped ones their clamped target."""
    gmode = transpose_mode(mode, "scatter")
    return gather_p.bind(x, indices, dimension_numbers=gather_dnums_of_scatter(dimension_numbers),
                         slice_sizes=window_sizes(operand_shape, updates_shape, dimension_numbers),
                         unique_indices=unique_indices, indices_are_sorted=indices_are_sorted, mode=gmode,
                         fill_value=fill_value if gmode is GatherScatterMode.FILL_OR_DROP else None)


def _zeros_like_aval(like, aval):
    return zeros_of(like, core.shape_of(aval), core.dtype_of(aval))


def _as_float(pred, like):
    return ew.convert_element_type(pred, core.dtype_of(like))


# ---------------------------------------------------------------------------------------
# gather's transpose
# ---------------------------------------------------------------------------------------

# NOTE [gather's transpose lives with the scatters]
# gather transposes to scatter_add and scatter_add to gather. The gather module cannot
# import this one (this one reads gathers in its rules, and the modules would form an
# import cycle), so gather's VJP rule is registered here, next to scatter_add's.


def _gather_vjp(ct, out, operand, indices, *, dimension_numbers, slice_sizes, unique_indices, indices_are_sorted,
                mode, fill_value):
    zeros = zeros_of(ct, core.shape_of(operand), core.dtype_of(ct))
    return scatter_add_p.bind(zeros, indices, ct, dimension_numbers=scatter_dnums_of_gather(dimension_numbers),
                              indices_are_sorted=indices_are_sorted, unique_indices=unique_indices,
                              mode=transpose_mode(mode, "gather"))


vjp.defvjp(gather_p, _gather_vjp, None, reads=(1,))


# ---------------------------------------------------------------------------------------
# scatter_add: JVP and transpose
# ---------------------------------------------------------------------------------------


def _scatter_add_jvp_updates(t, out, operand, indices, updates, **params):
    return scatter_add_p.bind(_zeros_like_aval(t, operand), indices, t, **params)


def _scatter_add_vjp_updates(ct, out, operand, indices, updates, **params):
    return _gather_updates(ct, indices, core.shape_of(updates), core.shape_of(operand), **params)


jvp.defjvp(scatter_add_p, lambda t, out, operand, indices, updates, **params: t, None, _scatter_add_jvp_updates)
vjp.defvjp(scatter_add_p, lambda ct, out, operand, indices, updates, **params: ct, None, _scatter_add_vjp_updates,
           reads=(1,))


# ---------------------------------------------------------------------------------------
# scatter: JVP and VJP
# ---------------------------------------------------------------------------------------

# NOTE [which update of a scatter wins]
# The impl lets the last of several updates of one element win, in row-major order of
# the updates, on NumPy and CuPy alike (a stable sort by target), so the derivative rules
# can tell the winners: t_out = scatter(t_operand, indices, t_updates) (the tangent of a
# winner lands where its value did), the operand's cotangent is the cotangent with the
# written elements zeroed (a scatter of zeros), and an update's cotangent is its target's
# when it won, 0 otherwise. The winners come from scattering the ids 1..N of the updates
# and gathering them back (JAX's own trick); under vmap the order within each example
# is kept, so the batched scatter picks the same winners.


def _scatter_jvp_operand(t, out, operand, indices, updates, **params):
    return scatter_p.bind(t, indices, _zeros_like_aval(t, updates), **params)


def _scatter_jvp_updates(t, out, operand, indices, updates, **params):
    return scatter_p.bind(_zeros_like_aval(t, operand), indices, t, **params)


def _scatter_winners(like, operand, indices, updates, params):
    """1 where an update won its element (NOTE [which update of a scatter wins]), else 0
    (dropped updates included), in ``like``'s dtype."""
    shape = core.shape_of(updates)
    ids = backend.xp_of(like).arange(1, int(np.prod(shape, dtype=np.int64)) + 1, dtype=np.int64).reshape(shape)
    written = scatter_p.bind(zeros_of(like, core.shape_of(operand), np.int64), indices, ids, **params)
    read = _gather_updates(written, indices, shape, core.shape_of(operand), **params)
    return _as_float(ew.eq(read, ids), like)


def _scatter_vjp_operand(ct, out, operand, indices, updates, **params):
    return scatter_p.bind(ct, indices, _zeros_like_aval(ct, updates), **params)


def _scatter_vjp_updates(ct, out, operand, indices, updates, **params):
    got = _gather_updates(ct, indices, core.shape_of(updates), core.shape_of(operand), **params)
    if params["unique_indices"]:
        return got
    return ew.mul(got, _scatter_winners(ct, operand, indices, updates, params))


jvp.defjvp(scatter_p, _scatter_jvp_operand, None, _scatter_jvp_updates)
vjp.defvjp(scatter_p, _scatter_vjp_operand, None, _scatter_vjp_updates, reads=(1,))


# ---------------------------------------------------------------------------------------
# scatter_mul: JVP and VJP (JAX's rules)
# ---------------------------------------------------------------------------------------


def _require_unique(params):
    if not params["unique_indices"]:
        raise NotImplementedError("scatter_mul gradients are only implemented if `unique_indices=True`")


def _scatter_mul_jvp_operand(t, out, operand, indices, updates, **params):
    return scatter_mul_p.bind(t, indices, updates, **params)


def _scatter_mul_jvp_updates(t, out, operand, indices, updates, **params):
    _require_unique(params)
    return ew.mul(operand, scatter_add_p.bind(_zeros_like_aval(t, operand), indices, t, **params))


def _scatter_mul_vjp_operand(ct, out, operand, indices, updates, **params):
    return scatter_mul_p.bind(ct, indices, updates, **params)


def _scatter_mul_vjp_updates(ct, out, operand, indices, updates, **params):
    _require_unique(params)
    return _gather_updates(ew.mul(ct, operand), indices, core.shape_of(updates), core.shape_of(operand), **params)


jvp.defjvp(scatter_mul_p, _scatter_mul_jvp_operand, None, _scatter_mul_jvp_updates)
vjp.defvjp(scatter_mul_p, _scatter_mul_vjp_operand, None, _scatter_mul_vjp_updates, reads=(0, 1, 2))


# ---------------------------------------------------------------------------------------
# scatter_min / scatter_max: JVP and VJP
# ---------------------------------------------------------------------------------------

# NOTE [the derivative of an extremal scatter]
# out[e] = min (or max) of operand[e] and the updates that reach e. As JAX's
# _scatter_extremal_jvp, the derivative goes to every value equal to out[e], shared
# evenly: with win_x = [operand == out], win_u = [u == out[target(u)]] and
# count[e] = win_x[e] + Σ_{u → e} win_u (never 0: some value is the extremum),
#     t_out = (win_x · t_operand + scatter_add(0, indices, win_u · t_updates)) / count
# and its transpose ct_operand = win_x · ct / count, ct_u = win_u · gather(ct / count).
# A dropped update reads NaN where out[target] is gathered, so it never wins.


def _extremal_weights(out, operand, indices, updates, params):
    won_at = _gather_updates(out, indices, core.shape_of(updates), core.shape_of(operand), fill_value=np.nan,
                             **params)
    win_u = _as_float(ew.eq(updates, won_at), out)
    win_x = _as_float(ew.eq(operand, out), out)
    count = ew.add(win_x, scatter_add_p.bind(_zeros_like_aval(out, operand), indices, win_u, **params))
    return win_x, win_u, count


def _extremal_rules(primitive):
    def jvp_operand(t, out, operand, indices, updates, **params):
        win_x, _, count = _extremal_weights(out, operand, indices, updates, params)
        return ew.div(ew.mul(win_x, t), count)

    def jvp_updates(t, out, operand, indices, updates, **params):
        _, win_u, count = _extremal_weights(out, operand, indices, updates, params)
        return ew.div(scatter_add_p.bind(_zeros_like_aval(t, operand), indices, ew.mul(win_u, t), **params), count)

    def vjp_operand(ct, out, operand, indices, updates, **params):
        win_x, _, count = _extremal_weights(out, operand, indices, updates, params)
        return ew.div(ew.mul(win_x, ct), count)

    def vjp_updates(ct, out, operand, indices, updates, **params):
        _, win_u, count = _extremal_weights(out, operand, indices, updates, params)
        share = _gather_updates(ew.div(ct, count), indices, core.shape_of(updates), core.shape_of(operand), **params)
        return ew.mul(win_u, share)

    jvp.defjvp(primitive, jvp_operand, None, jvp_updates)
    vjp.defvjp(primitive, vjp_operand, None, vjp_updates, reads=(0, 1, 2, "out"))


_extremal_rules(scatter_min_p)
_extremal_rules(scatter_max_p)

# gather, scatter_add (its transpose) and scatter are linear in the operand and the updates
# (selections with real 0/1 weights): their rules serve complex values unchanged, no conjugate
# (NOTE [complex convention]); scatter_mul, scatter_min and scatter_max have no complex rules.
complex_rules.defcomplex(gather_p, scatter_add_p, scatter_p)
