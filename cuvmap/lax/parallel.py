r"""Collectives over named axes: psum, pmean, pmax, pmin, all_gather, psum_scatter,
ppermute, all_to_all, axis_index.

A named axis is a set of *members* ``m = 0 .. n-1`` that run the same function, each on
its own values ``x_m``: the examples of ``vmap(f, axis_name="i")``, or the processes of
``cuvmap.distributed.data_parallel(f, axis_name="batch")`` (NOTE [named axes] in
:mod:`cuvmap.core`). A collective computes, on every member, a function of all members'
values:

- ``psum(x, "i")_m = Σ_c x_c``; ``pmax``/``pmin`` the elementwise extremum over ``c``;
  ``pmean = psum / n``;
- ``all_gather(x, "i", axis=a)_m = stack_c x_c`` along a new axis ``a`` (``tiled``:
  concatenated along ``a``); ``psum_scatter(x, "i", scatter_dimension=d)_m = (Σ_c x_c)[m]``
  along ``d`` (``tiled``: the ``m``-th of ``n`` equal blocks);
- ``ppermute(x, "i", perm)_m = x_s`` for each pair ``(s, m)`` of ``perm``, zeros on a
  member that no pair sends to;
- ``all_to_all(x, "i", split_axis, concat_axis)_m = stack_c (x_c[m] along split_axis)``
  along ``concat_axis``: the mapped axis and the split axis trade places;
- ``axis_index("i")_m = m`` (int32).

Each takes one axis name or a tuple of names (the product axis, the first name major;
``ppermute`` takes one; ``all_to_all`` over several is composed of one exchange per
name: NOTE [all_to_all over several names]). Under ``vmap`` the transform that binds the
name processes the collective even when the operand is not one of its values (``psum``
of an unbatched ``x`` is ``n · x``): the batching rules reduce, stack or gather along the
batch dim, so a collective costs one batched primitive. Across processes the eval impl
calls the group's communicator (:mod:`cuvmap.distributed`); under ``jit`` the staged
equation calls it when the program runs.

Derivatives (JAX's rules). Every collective but ``pmax``/``pmin``/``axis_index`` is linear,
so its JVP applies it to the tangent. Reverse mode differentiates the *sum over members*
of the function's outputs, as ``pmap``/``vmap(grad(f), axis_name=...)`` do in JAX: the
cotangent of ``psum``'s operand is ``psum`` of the cotangents (every member's output
depends on every input), ``all_gather`` and ``psum_scatter`` transpose into each other,
``ppermute`` into the inverse permutation and ``all_to_all`` into the one with the two
axes swapped. ``pmax``'s derivative goes to the members that attain the maximum, split
evenly between ties (as ``reduce_max``'s): ``ṫ = psum(w·t) / psum(w)`` with ``w = [x = pmax(x)]``.
"""
import numpy as np

from cuvmap import backend, core, tree
from cuvmap.core import ShapedArray, ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing
from cuvmap.lax import reduction
from cuvmap.lax import shape as lax_shape
from cuvmap.lax.all_to_all_names import all_to_all_over_names
from cuvmap.lax.collective_operands import map_operands
from cuvmap.lax.process_axes import (CollectivePrimitive, ProcessAxis, across_processes, axis_size,  # noqa: F401
                                     communicator_of, resolve_names)
from cuvmap.transforms import batching, complex_rules, jvp, vjp
from cuvmap.transforms.batching import move_bdim, not_mapped


def _register(primitive, impl, shape_rule, batch, transpose=None):
    """A collective's registration: its impl, shape rule, batching rule and, for a linear
    one, the transpose that is its VJP (its JVP applies it to the tangent)."""
    primitive.impl = impl
    primitive.shape_rule = shape_rule
    batching.axis_primitive_batchers[primitive] = batch
    if transpose is not None:
        vjp.deflinear(primitive, transpose)


def _moveaxis(x, src, dst):
    """``numpy.moveaxis`` on concrete arrays of either backend."""
    return backend.xp_of(x).moveaxis(x, src, dst)


def _check_axis(op, name, value, bound):
    """``value`` as an axis in ``0 .. bound-1`` (negative values count from the end)."""
    if not (isinstance(value, (int, np.integer)) and -bound <= value < bound):
        raise ShapeError(f"{op}: {name}={value!r} must be an int in [{-bound}, {bound})")
    return int(value) % bound


# ---------------------------------------------------------------------------------------
# psum, pmax, pmin
# ---------------------------------------------------------------------------------------

psum_p = CollectivePrimitive("psum", "axes")
pmax_p = CollectivePrimitive("pmax", "axes")
pmin_p = CollectivePrimitive("pmin", "axes")


def _tree_map(fn, x, op, names=None):
    """``fn`` on every operand leaf of ``x`` (:func:`~cuvmap.lax.collective_operands.map_operands`);
    with ``names`` (an elementwise reduction's resolved axes), small leaves reduced across
    processes share one collective (NOTE [buckets])."""
    return map_operands(fn, x, op, names, _bucketed if names is not None and across_processes(names) else None)


# NOTE [buckets]
# An elementwise reduction (psum, pmean, pmax, pmin) of a pytree across processes reduces
# its small leaves together: the leaves of one dtype and device of at most
# _BUCKET_LEAF_BYTES each are flattened and concatenated into buffers of at most
# _BUCKET_BYTES, each buffer is reduced by one collective, and the results are sliced
# back into the leaves' shapes (torch's DDP buckets its gradients the same way). A
# gradient of many small parameters then costs one all-reduce, and one collective check
# (NOTE [the collective check] in cuvmap/distributed/check.py), instead of one per leaf:
# each is a rendezvous of the processes, whose latency, not bandwidth, is what small
# leaves pay. The values are those of leaf-by-leaf reductions (elementwise, so the
# concatenation changes no element's terms). The buffer alone would hide the leaves from
# the check (f64[2] + f64[3] on one process, f64[3] + f64[2] or one f64[5] on another: the
# same buffer, misaligned sums), so the reduction carries the leaves' shapes as the
# parameter `leaves` (only on a bucket: a single leaf's equation is unchanged), and the
# check's digest covers them. The pieces are primitives (reshape,
# concatenate, slice), so jit stages them and grad and vmap see through them; a vmap's
# own axis never buckets (its batching rule reduces in one primitive anyway), nor do
# Python scalars or weakly typed values.
_BUCKET_LEAF_BYTES = 1 << 20
_BUCKET_BYTES = 4 << 20


def _bucketed(fn, leaves):
    """``[fn(leaf) for leaf in leaves]``, the small leaves reduced in buckets, each as
    ``fn(buffer, shapes)`` with the shapes of the leaves it holds (NOTE [buckets])."""
    outs = [None] * len(leaves)
    groups = {}  # (dtype, device) -> [(index, shape, size)]
    for i, leaf in enumerate(leaves):
        if type(leaf) in core._PY_SCALAR_DTYPES:
            continue
        aval = core.get_aval(leaf)
        size = int(np.prod(aval.shape, dtype=np.int64))
        if aval.weak_type or size * aval.dtype.itemsize > _BUCKET_LEAF_BYTES:
            continue
        groups.setdefault((aval.dtype, aval.device), []).append((i, aval.shape, size))
    for (dtype, _), members in groups.items():
        bucket, nbytes = [], 0
        for member in members + [None]:
            if member is not None and nbytes + member[2] * dtype.itemsize <= _BUCKET_BYTES:
                bucket.append(member)
                nbytes += member[2] * dtype.itemsize
                continue
            if len(bucket) > 1:
                flat = lax_shape.concatenate([lax_shape.reshape(leaves[i], (n,)) for i, _, n in bucket], 0)
                out, start = fn(flat, tuple(tuple(int(d) for d in shape) for _, shape, _ in bucket)), 0
                for i, shape, n in bucket:
                    outs[i] = lax_shape.reshape(indexing.slice_in_dim(out, start, start + n, 0), shape)
                    start += n
            bucket, nbytes = ([member], member[2] * dtype.itemsize) if member is not None else ([], 0)
    return [fn(leaf) if out is None else out for leaf, out in zip(leaves, outs)]


def psum(x, axis_name):
    """The sum over the members of the named axis (or axes): ``psum(x, "i")_m = Σ_c x_c``.

    Args:
      x: an array, or a pytree of them (each leaf summed on its own); booleans are summed
        as int64, as ``reduce_sum`` does.
      axis_name: a name bound by ``vmap(..., axis_name=...)`` or
        ``cuvmap.distributed.data_parallel``, or a tuple of names.
    Returns:
      the sum, the same on every member, with ``x``'s structure, shapes and dtypes.

    Example::

        vmap(lambda x: x / psum(x, "i"), axis_name="i")(xs)      # xs / xs.sum(0)
    """
    names = resolve_names(axis_name, "psum")

    def one(leaf, leaves=None):
        if core.dtype_of(leaf) == np.bool_:
            leaf = ew.convert_element_type(leaf, np.int64)
        return _reduce(psum_p, leaf, names, leaves)

    return _tree_map(one, x, "psum", names)


def pmean(x, axis_name):
    """The mean over the members of the named axis (or axes): ``psum(x) / n``; integer
    leaves give float64 (true division).

    Example::

        grads = pmean(grad(loss)(params, x_shard, y_shard), "batch")   # data parallel
    """
    names = resolve_names(axis_name, "pmean")
    # (an axis of no members has no mean to observe: its results are empty)
    n = max(1, int(np.prod([axis_size(a) for a in names], dtype=np.int64)))

    def one(leaf, leaves=None):
        if core.dtype_of(leaf) == np.bool_:
            leaf = ew.convert_element_type(leaf, np.int64)
        return ew.div(_reduce(psum_p, leaf, names, leaves), n)

    return _tree_map(one, x, "pmean", names)


def pmax(x, axis_name):
    """The elementwise maximum over the members of the named axis (or axes). Its
    derivative goes to the members holding the maximum, split evenly between ties."""
    names = resolve_names(axis_name, "pmax")
    return _tree_map(lambda leaf, leaves=None: _reduce(pmax_p, leaf, names, leaves), x, "pmax", names)


def pmin(x, axis_name):
    """The elementwise minimum over the members of the named axis (or axes); derivative as
    :func:`pmax`'s."""
    names = resolve_names(axis_name, "pmin")
    return _tree_map(lambda leaf, leaves=None: _reduce(pmin_p, leaf, names, leaves), x, "pmin", names)


def _reduce(primitive, x, axes, leaves=None):
    """psum/pmax/pmin of ``x`` over ``axes``; ``leaves``: the shapes of the leaves a bucket
    holds (NOTE [buckets]), a parameter only where there is one."""
    return primitive.bind(x, axes=axes) if leaves is None else primitive.bind(x, axes=axes, leaves=leaves)


def _same_shape_rule(x, *, axes, leaves=None):
    return ShapedArray(x.shape, x.dtype, x.weak_type)


def _reducer_impl(name, op):
    """The eval impl of psum/pmax/pmin: an all-reduce (``op``) over each process axis."""

    def impl(x, *, axes, leaves=None):
        x = core.as_array(x)
        bucket = {} if leaves is None else {"leaves": leaves}
        for k, a in enumerate(axes):
            # after the first, the operand is this impl's own result: reduce it in place
            x = communicator_of(a, name).allreduce(x, op, in_place=k > 0, axis_name=a.name, **bucket)
        return x

    return impl


def _reducer_batcher(primitive, reduce, unbatched):
    """The batching rule of psum/pmax/pmin: along the transform's own name, ``reduce`` the
    batch dim (or ``unbatched(x, n)`` for a value every member shares) and bind the rest
    of the names below; a name that is not the transform's passes the batch dim through."""

    def rule(mapped, vals, dims, *, axes, leaves=None):
        (x,), (d,) = vals, dims
        if mapped.name not in axes:
            return _reduce(primitive, x, axes, leaves), d
        rest = tuple(a for a in axes if a != mapped.name)
        out = unbatched(x, mapped.size) if d is not_mapped else reduce(x, (d,))
        if rest:
            out = _reduce(primitive, out, rest, leaves)
        return out, not_mapped

    return rule


def _psum_transpose(ct, x, *, axes, leaves=None):
    return _reduce(psum_p, ct, axes, leaves)


def _extremum_weights(out, x, axes, leaves):
    """``w / psum(w)`` with ``w = [x = out]``: the members' shares of the derivative."""
    hit = ew.convert_element_type(ew.eq(x, out), core.dtype_of(x))
    return ew.div(hit, _reduce(psum_p, hit, axes, leaves))


def _extremum_jvp(t, out, x, *, axes, leaves=None):
    return _reduce(psum_p, ew.mul(_extremum_weights(out, x, axes, leaves), t), axes, leaves)


def _extremum_vjp(ct, out, x, *, axes, leaves=None):
    return ew.mul(_extremum_weights(out, x, axes, leaves), _reduce(psum_p, ct, axes, leaves))


for _p, _op in ((psum_p, "sum"), (pmax_p, "max"), (pmin_p, "min")):
    _p.impl = _reducer_impl(_p.name, _op)
    _p.shape_rule = _same_shape_rule
del _p, _op
batching.axis_primitive_batchers[psum_p] = _reducer_batcher(
    psum_p, reduction.reduce_sum, lambda x, n: ew.mul(x, n))
batching.axis_primitive_batchers[pmax_p] = _reducer_batcher(pmax_p, reduction.reduce_max, lambda x, n: x)
batching.axis_primitive_batchers[pmin_p] = _reducer_batcher(pmin_p, reduction.reduce_min, lambda x, n: x)
vjp.deflinear(psum_p, _psum_transpose)
for _p in (pmax_p, pmin_p):
    jvp.defjvp(_p, _extremum_jvp)
    vjp.defvjp(_p, _extremum_vjp, reads=(0, "out"))
del _p


# ---------------------------------------------------------------------------------------
# all_gather
# ---------------------------------------------------------------------------------------

all_gather_p = CollectivePrimitive("all_gather", "axis_name")


def all_gather(x, axis_name, *, axis=0, tiled=False):
    """Every member's ``x``, stacked along a new axis ``axis`` (``tiled=True``:
    concatenated along the existing ``axis``), on every member.

    With a tuple of names the members are ordered with the first name major (the product
    axis). Its transpose is :func:`psum_scatter`.

    Example::

        vmap(lambda x: all_gather(x, "i"), axis_name="i")(xs)     # xs, on every example
    """
    names = resolve_names(axis_name, "all_gather")

    def one(leaf):
        ndim = len(core.shape_of(leaf))
        a = _check_axis("all_gather", "axis", axis, ndim + (0 if tiled else 1))
        if tiled and ndim == 0:
            raise ShapeError("all_gather: tiled=True needs an operand of rank ≥ 1, got a scalar")
        # one name at a time, the last (minor) first: (n_1, ..., n_k) at a, then merged
        out = leaf
        for name in reversed(names):
            out = all_gather_p.bind(out, axis_name=name, axis=a, axis_size=axis_size(name))
        if len(names) > 1 or tiled:
            shape = tuple(core.shape_of(out))
            k = len(names) + (1 if tiled else 0)
            out = lax_shape.reshape(out, shape[:a] + (int(np.prod(shape[a:a + k], dtype=np.int64)),) + shape[a + k:])
        return out

    return _tree_map(one, x, "all_gather")


# (the primitive stacks along a new axis of one name; the wrapper reshapes for tiled=True
# and for a tuple of names)
def _all_gather_shape_rule(x, *, axis_name, axis, axis_size):
    if not 0 <= axis <= x.ndim:
        raise ShapeError(f"axis {axis} out of range for a new axis of shape {x.shape}")
    return ShapedArray(x.shape[:axis] + (axis_size,) + x.shape[axis:], x.dtype, x.weak_type)


def _all_gather_impl(x, *, axis_name, axis, axis_size):
    return _moveaxis(communicator_of(axis_name, "all_gather").allgather(core.as_array(x), axis_name=axis_name.name), 0, axis)


def _all_gather_batch(mapped, vals, dims, *, axis_name, axis, axis_size):
    (x,), (d,) = vals, dims
    if mapped.name != axis_name:
        x = move_bdim(x, d, 0)
        return all_gather_p.bind(x, axis_name=axis_name, axis=axis + 1, axis_size=axis_size), 0
    _check_size("all_gather", axis_name, axis_size, mapped.size)
    # every member gets the whole batch: the batch dim becomes the gathered axis (unbatched)
    return move_bdim(batching.bdim_at_front(x, d, mapped.size), 0, axis), not_mapped


def _check_size(op, name, staged, size):
    if staged != size:
        raise ShapeError(f"{op} was staged for {staged} members of the axis {name!r}, which has {size} here")


def _all_gather_transpose(ct, x, *, axis_name, axis, axis_size):
    return psum_scatter_p.bind(ct, axis_name=axis_name, scatter_dimension=axis, axis_size=axis_size)


_register(all_gather_p, _all_gather_impl, _all_gather_shape_rule, _all_gather_batch, _all_gather_transpose)


# ---------------------------------------------------------------------------------------
# psum_scatter
# ---------------------------------------------------------------------------------------

psum_scatter_p = CollectivePrimitive("psum_scatter", "axis_name")


def psum_scatter(x, axis_name, *, scatter_dimension=0, tiled=False):
    """The sum over the members, scattered along ``scatter_dimension``: member ``m`` gets
    the ``m``-th slice of ``psum(x)`` (that dim, of size ``n``, is removed), or with
    ``tiled=True`` its ``m``-th of ``n`` equal blocks. The transpose of :func:`all_gather`.

    With a tuple of names the blocks are ordered with the first name major.

    Example::

        vmap(lambda x: psum_scatter(x, "i"), axis_name="i")(xs)   # row m: xs.sum(0)[m]
    """
    names = resolve_names(axis_name, "psum_scatter")
    sizes = [axis_size(a) for a in names]
    total = int(np.prod(sizes, dtype=np.int64))

    def one(leaf):
        shape = tuple(core.shape_of(leaf))
        d = _check_axis("psum_scatter", "scatter_dimension", scatter_dimension, len(shape))
        if (shape[d] % total if tiled else shape[d] != total):
            raise ShapeError(
                f"psum_scatter: the scatter dimension {d} of the operand (shape {shape}) must "
                f"{'be a multiple of' if tiled else 'equal'} the number of members {total} of {axis_name!r}")
        out = leaf
        if len(names) > 1 or tiled:  # (n_1, ..., n_k[, block]) at d, the first name major
            block = (shape[d] // total,) if tiled else ()
            out = lax_shape.reshape(out, shape[:d] + tuple(sizes) + block + shape[d + 1:])
        for name, n in zip(names, sizes):
            out = psum_scatter_p.bind(out, axis_name=name, scatter_dimension=d, axis_size=n)
        return out

    return _tree_map(one, x, "psum_scatter")


# (the primitive scatters one slice per member of one name; the wrapper reshapes for
# tiled=True and for a tuple of names)
def _psum_scatter_shape_rule(x, *, axis_name, scatter_dimension, axis_size):
    d = scatter_dimension
    if not 0 <= d < x.ndim:
        raise ShapeError(f"scatter_dimension {d} out of range for shape {x.shape}")
    if x.shape[d] != axis_size:
        raise ShapeError(f"the scatter dimension of shape {x.shape} must equal the axis size {axis_size}")
    return ShapedArray(x.shape[:d] + x.shape[d + 1:], x.dtype, x.weak_type)


def _psum_scatter_impl(x, *, axis_name, scatter_dimension, axis_size):
    x = _moveaxis(core.as_array(x), scatter_dimension, 0)
    return communicator_of(axis_name, "psum_scatter").reduce_scatter(x, axis_name=axis_name.name)


def _psum_scatter_batch(mapped, vals, dims, *, axis_name, scatter_dimension, axis_size):
    (x,), (d,) = vals, dims
    sd = scatter_dimension
    if mapped.name != axis_name:
        x = move_bdim(x, d, 0)
        return psum_scatter_p.bind(x, axis_name=axis_name, scatter_dimension=sd + 1, axis_size=axis_size), 0
    _check_size("psum_scatter", axis_name, axis_size, mapped.size)
    total = ew.mul(x, mapped.size) if d is not_mapped else reduction.reduce_sum(x, (d,))
    # member m's slice of the sum is its row: the scatter dim becomes the batch dim
    return total, sd


def _psum_scatter_transpose(ct, x, *, axis_name, scatter_dimension, axis_size):
    return all_gather_p.bind(ct, axis_name=axis_name, axis=scatter_dimension, axis_size=axis_size)


_register(psum_scatter_p, _psum_scatter_impl, _psum_scatter_shape_rule, _psum_scatter_batch, _psum_scatter_transpose)


# ---------------------------------------------------------------------------------------
# ppermute
# ---------------------------------------------------------------------------------------

ppermute_p = CollectivePrimitive("ppermute", "axis_name")


def ppermute(x, axis_name, perm):
    """Sends each member's ``x`` along the pairs ``(source, destination)`` of ``perm``:
    member ``m`` gets ``x`` of the source whose pair names ``m`` as its destination, or
    zeros when none does. No two pairs may share a source or a destination. Its transpose
    is the inverse permutation.

    Example::

        shift = [(m, (m + 1) % n) for m in range(n)]
        vmap(lambda x: ppermute(x, "i", shift), axis_name="i")(xs)   # roll(xs, 1, 0)
    """
    (name,) = resolve_names(axis_name, "ppermute", single=True)
    n = axis_size(name)
    try:
        pairs = tuple((int(s), int(t)) for s, t in perm)
    except (TypeError, ValueError):
        raise ShapeError(f"ppermute: perm must be a sequence of (source, destination) pairs, got {perm!r}") from None
    sources, dests = [s for s, _ in pairs], [t for _, t in pairs]
    if any(not 0 <= i < n for i in sources + dests):
        raise ShapeError(f"ppermute: perm {pairs} names a member outside 0..{n - 1} of the axis {axis_name!r}")
    if len(set(sources)) != len(sources) or len(set(dests)) != len(dests):
        raise ShapeError(f"ppermute: perm {pairs} sends from or to one member twice")
    return _tree_map(lambda leaf: ppermute_p.bind(leaf, axis_name=name, perm=pairs), x, "ppermute")


def _ppermute_shape_rule(x, *, axis_name, perm):
    return ShapedArray(x.shape, x.dtype, x.weak_type)


def _ppermute_impl(x, *, axis_name, perm):
    return communicator_of(axis_name, "ppermute").permute(core.as_array(x), perm, axis_name=axis_name.name)


def _ppermute_batch(mapped, vals, dims, *, axis_name, perm):
    (x,), (d,) = vals, dims
    if mapped.name != axis_name:
        return ppermute_p.bind(x, axis_name=axis_name, perm=perm), d
    n = mapped.size
    source = dict((t, s) for s, t in perm)
    if d is not_mapped and len(source) == n:
        return x, not_mapped  # every member receives the value they all share
    x = batching.bdim_at_front(x, d, n)
    # a gather along the batch dim; members that receive nothing read an appended zero row
    idx = np.array([source.get(m, n) for m in range(n)], dtype=np.int64)
    if len(source) < n:
        x = lax_shape.concatenate([x, _zeros_row(x)], 0)
    return indexing.take(x, idx, 0), 0


def _zeros_row(x):
    """A row of zeros shaped like ``x[0:1]`` (a constant: no transform sees it)."""
    return core.full_like_concrete(x, 0, shape=(1,) + tuple(core.shape_of(x))[1:])


def _ppermute_transpose(ct, x, *, axis_name, perm):
    return ppermute_p.bind(ct, axis_name=axis_name, perm=tuple((t, s) for s, t in perm))


_register(ppermute_p, _ppermute_impl, _ppermute_shape_rule, _ppermute_batch, _ppermute_transpose)


# ---------------------------------------------------------------------------------------
# all_to_all
# ---------------------------------------------------------------------------------------

all_to_all_p = CollectivePrimitive("all_to_all", "axis_name")


def all_to_all(x, axis_name, split_axis, concat_axis, *, tiled=False):
    """Trades the named axis for ``split_axis``: member ``m`` gets, from every member
    ``c``, the ``m``-th slice of its ``x`` along ``split_axis`` (whose size must be the
    number of members ``n``; that dim is removed), stacked along a new axis
    ``concat_axis`` of the result. With ``tiled=True`` the split axis is cut into ``n``
    equal blocks, and member ``m``'s blocks are concatenated along ``concat_axis`` (an
    existing axis). Its transpose swaps ``split_axis`` and ``concat_axis``.

    Example::

        vmap(lambda x: all_to_all(x, "i", 0, 0), axis_name="i")(xs)   # xs.swapaxes(0, 1)
    """
    names = resolve_names(axis_name, "all_to_all")
    if len(names) > 1:  # NOTE [all_to_all over several names]
        return all_to_all_over_names(all_to_all, x, names, split_axis, concat_axis, tiled)
    (name,) = names
    n = axis_size(name)

    def one(leaf):
        shape = tuple(core.shape_of(leaf))
        s = _check_axis("all_to_all", "split_axis", split_axis, len(shape))
        c = _check_axis("all_to_all", "concat_axis", concat_axis, len(shape))
        if (shape[s] % n if tiled else shape[s] != n):
            raise ShapeError(f"all_to_all: split_axis {s} of the operand (shape {shape}) must "
                             f"{'be a multiple of' if tiled else 'equal'} the number of members {n} of {axis_name!r}")
        return all_to_all_p.bind(leaf, axis_name=name, split_axis=s, concat_axis=c, axis_size=n, tiled=tiled)

    return _tree_map(one, x, "all_to_all")


def _all_to_all_shape(shape, split_axis, concat_axis, n, tiled):
    shape = list(shape)
    if tiled:
        shape[split_axis] //= n
        shape[concat_axis] *= n
    else:
        del shape[split_axis]
        shape.insert(concat_axis, n)
    return tuple(shape)


def _all_to_all_shape_rule(x, *, axis_name, split_axis, concat_axis, axis_size, tiled):
    if not (0 <= split_axis < x.ndim and 0 <= concat_axis < x.ndim):
        raise ShapeError(f"split_axis {split_axis} or concat_axis {concat_axis} out of range for shape {x.shape}")
    n = x.shape[split_axis]
    if (n % axis_size if tiled else n != axis_size):
        raise ShapeError(f"the split axis of shape {x.shape} must {'divide by' if tiled else 'equal'} "
                         f"the axis size {axis_size}")
    return ShapedArray(_all_to_all_shape(x.shape, split_axis, concat_axis, axis_size, tiled), x.dtype, x.weak_type)


def _from_members(y, concat_axis, tiled):
    """A concrete ``y`` of shape ``(n, *rest)``, indexed by the member each slice came from,
    with that dim moved to ``concat_axis`` (``tiled``: merged into the dim there)."""
    y = _moveaxis(y, 0, concat_axis)
    if tiled:
        s = y.shape
        y = y.reshape(s[:concat_axis] + (s[concat_axis] * s[concat_axis + 1],) + s[concat_axis + 2:])
    return y


def _blocks_first(x, d, n, tiled):
    """A concrete ``x`` with its dim ``d`` as a leading ``(n, ...)`` dim indexed by the
    receiving member (``tiled``: ``d`` cut into ``n`` blocks first)."""
    s = x.shape
    if tiled:
        x = x.reshape(s[:d] + (n, s[d] // n) + s[d + 1:])
    return _moveaxis(x, d, 0)


def _all_to_all_impl(x, *, axis_name, split_axis, concat_axis, axis_size, tiled):
    x = core.as_array(x)
    y = communicator_of(axis_name, "all_to_all").alltoall(_blocks_first(x, split_axis, axis_size, tiled),
                                                 axis_name=axis_name.name)
    return _from_members(y, concat_axis, tiled)


def _all_to_all_batch(mapped, vals, dims, *, axis_name, split_axis, concat_axis, axis_size, tiled):
    (x,), (d,) = vals, dims
    if mapped.name != axis_name:
        x = move_bdim(x, d, 0)
        return all_to_all_p.bind(x, axis_name=axis_name, split_axis=split_axis + 1, concat_axis=concat_axis + 1,
                                 axis_size=axis_size, tiled=tiled), 0
    n = mapped.size
    _check_size("all_to_all", axis_name, axis_size, n)
    x = batching.bdim_at_front(x, d, n)  # (c, *s): c the member a slice comes from
    s = tuple(core.shape_of(x))
    k = 1 + split_axis
    if tiled:
        x = lax_shape.reshape(x, s[:k] + (n, s[k] // n) + s[k + 1:])
    # the split (or block) dim names the receiving member: it becomes the batch dim, the
    # sending member's dim lands at concat_axis
    x = move_bdim(x, k, 0)  # (m, c, *rest)
    y = move_bdim(x, 1, concat_axis + 1)  # (m, *rest with c at concat_axis)
    if tiled:
        t = tuple(core.shape_of(y))
        j = concat_axis + 1
        y = lax_shape.reshape(y, t[:j] + (t[j] * t[j + 1],) + t[j + 2:])
    return y, 0


def _all_to_all_transpose(ct, x, *, axis_name, split_axis, concat_axis, axis_size, tiled):
    return all_to_all_p.bind(ct, axis_name=axis_name, split_axis=concat_axis, concat_axis=split_axis,
                             axis_size=axis_size, tiled=tiled)


_register(all_to_all_p, _all_to_all_impl, _all_to_all_shape_rule, _all_to_all_batch, _all_to_all_transpose)


# ---------------------------------------------------------------------------------------
# axis_index
# ---------------------------------------------------------------------------------------

axis_index_p = CollectivePrimitive("axis_index", "axis_name", differentiable=False)


def axis_index(axis_name, *, like=None):
    """The index of the member along the named axis, an int32 scalar: ``0 .. n-1`` over a
    vmap's examples, the rank in a process group. With a tuple of names, the index along
    the product axis (the first name major). ``like``: an array whose backend the index
    lives on; by default that of the vmap's mapped operands (NumPy for a process axis)."""
    names = resolve_names(axis_name, "axis_index")
    device = backend.backend_name(like) if like is not None else None
    index, stride = None, 1
    for name in reversed(names):
        term = axis_index_p.bind(axis_name=name, device=device)
        if stride != 1:
            term = ew.mul(term, np.int32(stride))
        index = term if index is None else ew.add(index, term)
        stride *= axis_size(name)
    return index


def _axis_index_shape_rule(*, axis_name, device):
    return ShapedArray((), np.int32)


def _axis_index_impl(*, axis_name, device):
    return backend.xp_for(device or "cpu").asarray(communicator_of(axis_name, "axis_index").rank, dtype=np.int32)


def _axis_index_batch(mapped, vals, dims, *, axis_name, device):
    if mapped.name != axis_name:  # (no operand: only the transform of its name processes it)
        return axis_index_p.bind(axis_name=axis_name, device=device), not_mapped
    # device None (no like=): the device of the vmap's own operands
    return indexing.iota_p.bind(size=mapped.size, dtype=np.dtype(np.int32), device=device or mapped.device), 0


_register(axis_index_p, _axis_index_impl, _axis_index_shape_rule, _axis_index_batch)

# linear: their transposes need no conjugate (NOTE [complex convention])
complex_rules.defcomplex(psum_p, all_gather_p, psum_scatter_p, ppermute_p, all_to_all_p)


def collective_primitives():
    """The primitives of this family (the op table's rows reach them through named vmaps:
    their impls need an axis of processes)."""
    return [v for v in globals().values() if isinstance(v, CollectivePrimitive)]
