"""Batching: the interpreter behind ``vmap``.

``vmap(f)(xs)[b] == f(xs[b])`` for every ``b``. A batched value is a ``BatchTracer(val,
bdim)``: ``val`` is the physical array, which holds every example, and ``bdim`` is the
axis of ``val`` that indexes examples. The tracer's logical shape (what ``f`` sees) is
``val.shape`` without ``bdim``. Values not owned by this transform are unbatched
(``not_mapped``).

A batching rule ``rule(axis_size, vals, dims, **params) -> (out, out_dim)`` computes the
batched output of a primitive from the size of the mapped axis, the physical operands and
their batch dims with one call of primitives (never a loop over examples). The axis size
comes from the transform, as in JAX, rather than from the operands' shapes: a batch of
size 0 has no example to measure a folded dim by, and its results must still have the
right logical shapes (``vmap(f)`` over a ``(0, ...)`` input returns empty arrays).

The helpers below, in the spirit of functorch's ``BatchRulesHelper.h``, move batch dims
to the front, pad operands to a common logical rank, fold a batch dim into another dim
(:func:`fold_bdim_into`, functorch's ``reshape_dim_into``) and split it back out
(:func:`split_bdim_out_of`, its ``reshape_dim_outof``), and define the rules of whole
families (elementwise with broadcasting, reductions) at once.
"""
from contextlib import contextmanager

from cuvmap import api_util, backend, core, tree
from cuvmap.core import MissingRuleError, Trace, Tracer
from cuvmap.transforms import ir, staging

not_mapped = None

primitive_batchers = {}
# rules of primitives that act along named axes (collectives, cuvmap/lax/parallel.py):
# ``rule(axis, vals, dims, **params)`` gets the transform's AxisData (size and name)
axis_primitive_batchers = {}


class AxisData:
    """What a ``vmap`` maps over: the axis ``size``, its ``name`` (``None`` unless given
    as ``vmap(..., axis_name=...)``: NOTE [named axes] in :mod:`cuvmap.core`) and the
    ``device`` of its mapped operands (``"cpu"`` or ``"gpu"``: where values made from the
    axis alone, as ``axis_index``, live). The ``global_data`` of a batching transform's
    main."""

    __slots__ = ("size", "name", "device")

    def __init__(self, size, name=None, device="cpu"):
        self.size = size
        self.name = name
        self.device = device

    def __repr__(self):
        return f"AxisData(size={self.size}, name={self.name!r})"


@contextmanager
def new_batch_main(axis, name):
    """Pushes a batching transform mapping ``axis`` (an :class:`AxisData`) for the block,
    with its name bound to it when it has one (NOTE [named axes] in :mod:`cuvmap.core`)."""
    with core.new_main(BatchTrace, axis, name=name) as main:
        if axis.name is None:
            yield main
        else:
            with core.extend_axis_env(core.AxisFrame(axis.name, axis.size, main)):
                yield main


class BatchTracer(Tracer):
    __slots__ = ("val", "bdim")

    def __init__(self, main, val, bdim):
        self._main = main
        self.val = val
        self.bdim = bdim

    @property
    def shape(self):
        s = self.val.shape
        d = self.bdim
        return s[:d] + s[d + 1:]

    @property
    def dtype(self):
        return self.val.dtype

    @property
    def aval(self):
        """The example's aval: weakly typed where the batched value is (a WeakArray, or a
        weak traced value), as JAX's batching keeps weak types."""
        val = self.val
        weak = type(val) is core.WeakArray or (isinstance(val, Tracer) and val.aval.weak_type)
        return core.ShapedArray(self.shape, self.dtype, weak_type=weak, device=backend.device_of(self))

    def _concrete_value(self):
        return self.val

    def _concretization_error(self, what):
        return core.ConcretizationError(
            f"{what} of a batched value (shape {self.shape}) depends on the example; use "
            "cuvmap.numpy.where instead of Python control flow, and cuvmap.numpy functions "
            "instead of Python numbers",
            where=self._main.name,
        )


class BatchTrace(Trace):
    __slots__ = ()

    def unwrap(self, args):
        """The physical operands and their batch dims (``not_mapped`` for values this
        transform does not own)."""
        main = self.main
        vals = []
        dims = []
        for x in args:
            if type(x) is BatchTracer and x._main is main:  # main.owns(x), inlined: every bind
                vals.append(x.val)
                dims.append(x.bdim)
            else:
                vals.append(x)
                dims.append(not_mapped)
        return vals, dims

    def process_primitive(self, primitive, args, params):
        main = self.main
        vals, dims = self.unwrap(args)
        rule = primitive_batchers.get(primitive)
        if rule is not None:
            out, out_dim = rule(main.global_data.size, vals, dims, **params)
        else:
            rule = axis_primitive_batchers.get(primitive)
            if rule is None:
                raise MissingRuleError(f"primitive {primitive.name} has no batching rule (needed by vmap)")
            out, out_dim = rule(main.global_data, vals, dims, **params)
        if primitive.multiple_results:   # (JAX's form: a list of results and a list of their dims)
            return [o if d is not_mapped else BatchTracer(main, o, d) for o, d in zip(out, out_dim)]
        if out_dim is not_mapped:
            return out
        return BatchTracer(main, out, out_dim)

    def process_call(self, primitive, args, params):
        """A call primitive under vmap: its ``batch`` method (NOTE [call primitives] in
        :mod:`cuvmap.transforms.call`)."""
        main = self.main
        vals, dims = self.unwrap(args)
        outs, out_dims = primitive.batch(main.global_data, vals, dims, params)
        return [o if d is not_mapped else BatchTracer(main, o, d) for o, d in zip(outs, out_dims)]


def vmap_flat(f, where, leaves, treedef, axes, size, out_axes, axis_name=None):
    """vmap's flat core: ``f(*args, **kwargs)`` for ``(args, kwargs) = unflatten(treedef,
    leaves)`` under a batching transform named ``where`` that maps ``size`` examples along
    ``axes`` (one per leaf: an axis, or None for a leaf every example shares), and the
    results with their batch dim moved to ``out_axes`` (a pytree prefix of the outputs;
    None: the same for every example). :func:`cuvmap.vmap` checks its arguments and calls
    it; ``lax.map`` in chunks calls it on each chunk."""
    import cuvmap.lax.shape as lax_shape  # a rule helper's primitive (the broadcast): lax imports this module

    device = next((backend.backend_name(x) for x, a in zip(leaves, axes) if a is not None), "cpu")
    with new_batch_main(AxisData(size, axis_name, device), where) as main:
        traced = [x if a is None else BatchTracer(main, x, a) for x, a in zip(leaves, axes)]
        args, kwargs = tree.unflatten(treedef, traced)
        out = f(*args, **kwargs)
    out_paths, out_leaves, out_tree = tree.flatten_with_path(out)
    try:
        out_axes_flat = tree.broadcast_prefix(out_axes, out, api_util.is_axis)
    except tree.PrefixError as err:
        api_util.check_outputs(f, out_leaves, out, "batched function")
        raise api_util.prefix_error("out_axes", out_axes, "outputs", err, api_util.describe_out) from None
    # the outputs vmap stacks must be arrays; what passes through unmapped (out_axes None,
    # as jacfwd's has_aux) is returned as it is
    api_util.check_outputs(f, [x if oa is not None or main.owns(x) else 0 for x, oa in zip(out_leaves, out_axes_flat)],
                           out, "batched function")
    results = []
    for path, leaf, oa in zip(out_paths, out_leaves, out_axes_flat):
        batched = main.owns(leaf)
        if batched:
            if oa is None:
                named = f"; vmap has mapped output (axis_name={axis_name}) but out_axes is None" if axis_name else ""
                raise api_util.TransformError(
                    f"out_axes is None for {api_util.describe_out(path)} of shape {leaf.shape}, but it "
                    "depends on the mapped inputs (it is batched); give it an axis (at vmap out_axes"
                    f"{tree.keystr(path)}, got axis spec None but output was batched on axis {leaf.bdim}{named})"
                )
            ndim = len(leaf.val.shape)
            value = move_bdim(leaf.val, leaf.bdim, api_util.normalize_out_axis(oa, ndim, path, leaf.shape))
        elif oa is None:
            value = leaf
        else:
            shape = core.shape_of(leaf)
            axis = api_util.normalize_out_axis(oa, len(shape) + 1, path, shape)
            out_shape = shape[:axis] + (size,) + shape[axis:]
            kept = tuple(i for i in range(len(out_shape)) if i != axis)
            value = lax_shape.broadcast_in_dim(leaf, out_shape, kept)
        results.append(api_util.to_array_result(value))
    return tree.unflatten(out_tree, api_util.unaliased(results, leaves))


def batch_jaxpr(closed, axis, dims, in_avals, instantiate=None):
    """The program of ``vmap`` of ``closed`` (over its constants and arguments) for batch
    dims ``dims`` of physical operands with ``in_avals``, mapping ``axis`` (an
    :class:`AxisData`): ``vmap(eval_jaxpr)`` staged. Returns ``(ClosedJaxpr, out_dims)``,
    cached on ``closed``.

    ``instantiate`` (one bool per output, JAX's name): when given, every batched output
    comes out with its batch dim at 0, and the unbatched outputs marked are broadcast to
    batched ones (control flow's bodies need a fixed layout for their carries)."""
    instantiate = None if instantiate is None else tuple(instantiate)
    key = ("batch", axis.size, axis.name, tuple(dims), tuple(in_avals), instantiate)
    hit = closed.derived.get(key)
    if hit is not None:
        return hit
    flat = ir.consts_as_inputs(closed)
    out_dims = []

    def batched(*vals):
        with new_batch_main(axis, "vmap") as main:
            ins = [v if d is not_mapped else BatchTracer(main, v, d) for v, d in zip(vals, dims)]
            outs = ir.eval_jaxpr(flat, [], ins)
        results = []
        for i, o in enumerate(outs):
            if main.owns(o):
                val, dim = o.val, o.bdim
                if instantiate is not None:
                    val, dim = move_bdim(val, dim, 0), 0
            elif instantiate is not None and instantiate[i]:
                val, dim = bdim_at_front(o, not_mapped, axis.size), 0
            else:
                val, dim = o, not_mapped
            results.append(val)
            out_dims.append(dim)
        return results

    program = ir.optimize(staging.trace_to_jaxpr(batched, in_avals, name="vmap(jit)"))
    closed.derived[key] = (program, tuple(out_dims))
    return closed.derived[key]


# ---------------------------------------------------------------------------------------
# Helpers (cf. functorch's BatchRulesHelper.h)
# ---------------------------------------------------------------------------------------


def move_bdim(x, bdim, dst=0):
    """Moves the batch dim of ``x`` from ``bdim`` to ``dst`` (a physical axis)."""
    import cuvmap.lax.shape as lax_shape  # a rule helper's primitives: lax imports this module

    if bdim == dst:
        return x
    ndim = len(x.shape)
    perm = [i for i in range(ndim) if i != bdim]
    perm.insert(dst, bdim)
    return lax_shape.transpose(x, tuple(perm))


def bdim_at_front(x, bdim, size):
    """``x`` with its batch dim at axis 0, broadcasting an unbatched ``x`` to ``size``."""
    import cuvmap.lax.shape as lax_shape  # a rule helper's primitives: lax imports this module

    if bdim is not_mapped:
        s = core.shape_of(x)
        return lax_shape.broadcast_in_dim(x, (size,) + s, tuple(range(1, len(s) + 1)))
    return move_bdim(x, bdim, 0)


def pad_to_logical_rank(x, logical_rank, rank):
    """For ``x`` with its batch dim at 0 and logical rank ``logical_rank``: inserts size-1
    dims after the batch dim so that NumPy broadcasting against rank-``rank`` operands
    aligns the logical dims (functorch's ``maybe_pad_to_logical_rank``)."""
    import cuvmap.lax.shape as lax_shape  # a rule helper's primitives: lax imports this module

    if logical_rank >= rank:
        return x
    s = x.shape
    return lax_shape.reshape(x, (s[0],) + (1,) * (rank - logical_rank) + tuple(s[1:]))


def fold_bdim_into(x, bdim, dst):
    """Merges the batch dim of ``x`` into physical axis ``dst`` (of ``x`` without the batch
    dim), the batch index varying slowest: ``(..., B, n, ...) -> (..., B*n, ...)``."""
    import cuvmap.lax.shape as lax_shape  # a rule helper's primitives: lax imports this module

    s = tuple(x.shape)
    rest = s[:bdim] + s[bdim + 1:]
    crossed = rest[min(bdim, dst):max(bdim, dst)]  # the dims the batch dim moves across
    if crossed.count(1) == len(crossed):
        # only size-1 dims (a per-example operand of one image, ``(B, 1, C, H, W)``):
        # moving the batch dim keeps the elements' order, so one reshape does both steps,
        # one bind instead of a transpose and a reshape
        return lax_shape.reshape(x, rest[:dst] + (s[bdim] * rest[dst],) + rest[dst + 1:])
    x = move_bdim(x, bdim, dst)
    s = tuple(x.shape)
    return lax_shape.reshape(x, s[:dst] + (s[dst] * s[dst + 1],) + s[dst + 2:])


def split_bdim_out_of(x, axis, size, rest):
    """Inverse of :func:`fold_bdim_into`: splits axis ``axis`` of size ``size*rest`` into
    ``(size, rest)``; the batch dim is then at ``axis``. The caller gives ``rest`` (the
    logical size of that dim): an empty batch could not reveal it."""
    import cuvmap.lax.shape as lax_shape  # a rule helper's primitives: lax imports this module

    s = tuple(x.shape)
    return lax_shape.reshape(x, s[:axis] + (size, rest) + s[axis + 1:])


def empty_batch(primitive, vals, dims, params):
    """The batched output of ``primitive`` over a batch of size 0: an empty array of the
    logical output shape (from the shape rule) with the batch dim at 0. For rules whose
    folding would multiply a count by the batch size (a grouped convolution with
    ``groups * B`` groups), where ``B = 0`` is no valid operand; there is nothing to
    compute. The result is a constant to the transforms below, as an empty array is."""
    avals = [core.get_aval(v) if d is not_mapped else _logical_aval(v, d) for v, d in zip(vals, dims)]
    aval = primitive.shape_rule(*avals, **params)
    xp = backend.xp_of(*[v for v in vals if hasattr(v, "shape")])
    return xp.zeros((0,) + tuple(aval.shape), dtype=aval.dtype), 0


def _logical_aval(v, d):
    s = tuple(v.shape)
    return core.ShapedArray(s[:d] + s[d + 1:], v.dtype)


def physical_axis(logical_axis, bdim):
    """The physical axis of logical axis ``logical_axis`` of a value batched at ``bdim``."""
    return logical_axis + 1 if logical_axis >= bdim else logical_axis


# ---------------------------------------------------------------------------------------
# Family rules
# ---------------------------------------------------------------------------------------


def broadcasting_batcher(primitive):
    """The batching rule of an elementwise primitive with NumPy broadcasting.

    Fast path: when every batched operand has the same bdim and full logical rank, and
    every unbatched operand is short enough to broadcast against the dims right of it,
    the operands go through as they are. Otherwise batch dims move to the front and
    batched operands are padded to the common logical rank.
    """

    def rule(axis_size, vals, dims, **params):
        first = None
        ndim = -1
        fast = True
        for v, d in zip(vals, dims):
            if d is not not_mapped:
                n = len(v.shape)
                if first is None:
                    first, ndim = d, n
                elif d != first or n != ndim:
                    fast = False
                    break
        if fast:
            room = ndim - 1 - first  # logical dims to the right of the batch dim
            for v, d in zip(vals, dims):
                if d is not_mapped and len(core.shape_of(v)) > room:
                    fast = False
                    break
            if fast:
                return primitive.bind(*vals, **params), first
        ranks = [len(core.shape_of(v)) - (d is not not_mapped) for v, d in zip(vals, dims)]
        rank = max(ranks)
        new_vals = []
        for v, d, r in zip(vals, dims, ranks):
            if d is not_mapped:
                new_vals.append(v)
            else:
                new_vals.append(pad_to_logical_rank(move_bdim(v, d, 0), r, rank))
        return primitive.bind(*new_vals, **params), 0

    return rule


def defbroadcasting(*primitives):
    for p in primitives:
        primitive_batchers[p] = broadcasting_batcher(p)


def unary_batcher(primitive):
    """Elementwise unary primitives: the batch dim stays where it is."""

    def rule(axis_size, vals, dims, **params):
        (x,), (d,) = vals, dims
        return primitive.bind(x, **params), d

    return rule


def defunary(*primitives):
    for p in primitives:
        primitive_batchers[p] = unary_batcher(p)


def reduction_batcher(primitive):
    """Reductions over ``axes`` (a tuple of logical axes): shift the axes past the batch
    dim; the output's batch dim moves left by the number of reduced axes before it."""

    def rule(axis_size, vals, dims, *, axes, **params):
        (x,), (d,) = vals, dims
        phys = tuple(physical_axis(a, d) for a in axes)
        out_dim = d - sum(1 for a in phys if a < d)
        return primitive.bind(x, axes=phys, **params), out_dim

    return rule


def defreduction(*primitives):
    for p in primitives:
        primitive_batchers[p] = reduction_batcher(p)
