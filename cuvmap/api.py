"""The user-facing transforms: ``vmap``, ``grad``, ``value_and_grad``, ``vjp``, ``jvp``,
``jacfwd``, ``jacrev``, ``hessian``, ``stop_gradient``, and ``block_until_ready`` (JAX's
``jax.block_until_ready``, in its API module too).

Each entry point checks its arguments, pushes its interpreter (:mod:`cuvmap.transforms`)
for the duration of the call and turns the results back into arrays; what they share
(flattening, ``in_axes``/``argnums`` checks, error text) is in :mod:`cuvmap.api_util`, and
``jit``/``make_jaxpr`` are in :mod:`cuvmap.jit_api`. Every error raised while a transformed
function runs starts with the transform and the function, e.g.
``vmap(loss, in_axes=(None, 0, 0)): argument 2 (ys) has size 10 along axis 0, ...``.
"""
import functools

import numpy as np

from cuvmap import api_util, backend, core, holomorphic as complex_checks, tree
from cuvmap import memory_budget as memory_budget_mod
from cuvmap.memory_budget import vmap_combine
from cuvmap.api_util import TransformError
from cuvmap.core import Tracer, new_main
from cuvmap.cuda import device_errors
from cuvmap import dtypes
from cuvmap.dtypes import zeros_float0 as float0_zeros
from cuvmap.lax import elementwise, indexing, shape as lax_shape
from cuvmap.transforms import batching, vjp as vjp_mod
from cuvmap.transforms.jvp import JVPTrace, JVPTracer
from cuvmap.transforms.vjp import Tape, VJPTrace, VJPTracer
# ---------------------------------------------------------------------------------------
# vmap
# ---------------------------------------------------------------------------------------


def vmap(f, in_axes=0, out_axes=0, axis_size=None, chunk_size=None, axis_name=None, memory_budget=None):
    """Vectorizing map: ``vmap(f)(xs)[b] == f(xs[b])``, computed with batched primitives.

    Args:
      f: the function to map; its arguments and results are pytrees of arrays.
      in_axes: for each positional argument, the axis to map over (an int, negative ints
        count from the end) or ``None`` to broadcast it; an int or ``None`` applies to all,
        a tuple gives one entry per positional argument, and each entry may be a pytree
        prefix of its argument. Keyword arguments are always mapped over axis 0 (as in JAX).
      out_axes: where the mapped axis goes in each output (int, ``None`` for outputs that
        do not depend on the mapped inputs, or a pytree prefix of the outputs).
      axis_size: the size of the mapped axis; required only when nothing is mapped. A
        size of 0 is allowed: the results are empty arrays of the right shapes.
      chunk_size: when set, maps ``chunk_size`` examples at a time and concatenates the
        results (identical results, bounded memory). Not with ``axis_name``: a collective
        needs every example of its axis at once. ``"auto"``: the largest chunk whose
        planned memory fits ``memory_budget`` (:mod:`cuvmap.memory_budget`): ``f`` is then
        staged as under ``jit``, once per argument signature, and the chunks run its
        planned program.
      memory_budget: what the call may allocate, its results included: an int of bytes,
        or a float in (0, 1], that fraction of the memory free on the operands' device
        (``chunk_size="auto"`` without it: half the free memory). Setting it implies
        ``chunk_size="auto"``; raises :class:`~cuvmap.memory_budget.MemoryBudgetError`
        when even one example at a time does not fit.
      axis_name: a name for the mapped axis (a string), which collectives inside ``f``
        act along (``cuvmap.lax.psum(x, "i")`` sums over the examples, ``axis_index("i")``
        is the example's index; :mod:`cuvmap.lax.parallel`). Nested vmaps with different
        names map a product of axes; an inner name shadows an outer one.
    Returns:
      the vectorized function.

    Example::

        per_example = vmap(grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
        centred = vmap(lambda x: x - lax.pmean(x, "i"), axis_name="i")(xs)
    """
    api_util.check_callable(f, "vmap")
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    fname = api_util.fun_name(f)
    spec = f"in_axes={in_axes!r}" if in_axes != 0 else ""
    if out_axes != 0:
        spec += (", " if spec else "") + f"out_axes={out_axes!r}"
    if axis_name is not None:
        spec += (", " if spec else "") + f"axis_name={axis_name!r}"
    where = f"vmap({fname}{', ' + spec if spec else ''})"
    try:  # JAX checks the specs when vmap is applied, not when the function is called
        api_util.check_in_axes_form(in_axes)
        api_util.check_axes_spec(in_axes, "vmap in_axes")
        api_util.check_axes_spec(out_axes, "vmap out_axes")
    except TransformError as err:
        err.where = where
        raise
    if axis_size is not None and (not api_util.is_int(axis_size) or axis_size < 0):
        raise TransformError(f"{where}: axis_size must be a non-negative int, got {axis_size!r}")
    chunk_size = memory_budget_mod.check_chunk_spec(chunk_size, memory_budget, where)
    if axis_name is not None:
        try:
            hash(axis_name)
        except TypeError:
            raise TransformError(f"{where}: axis_name must be hashable (a string), got {axis_name!r}") from None
        if isinstance(axis_name, tuple):
            raise TransformError(f"{where}: axis_name names one axis (a string), got the tuple {axis_name!r}; "
                                 "nest one vmap per name")
        if chunk_size is not None:
            raise TransformError(
                f"{where}: chunk_size={chunk_size} cannot be combined with axis_name: the collectives over "
                f"{axis_name!r} need every example of the axis at once, and a chunked vmap maps "
                f"{chunk_size} at a time; drop chunk_size (or axis_name)")
    vmapped = _vmap(f, in_axes, out_axes, axis_size, chunk_size, where, axis_name=axis_name,
                    memory_budget=memory_budget)
    vmapped.__doc__ = (f"Vectorized version of {fname}. Takes similar arguments as {fname} but with additional array "
                       f"axes over which {fname} is mapped." +
                       (f"\n\nOriginal documentation:\n\n{f.__doc__}" if getattr(f, "__doc__", None) else ""))
    return vmapped


def _vmap(f, in_axes, out_axes, axis_size, chunk_size, where, name=None, axis_name=None, memory_budget=None,
          chunked=None, key_extra=None):
    """:func:`vmap` named ``where`` (other transforms use it internally under their name).
    ``chunk_size="auto"`` maps in chunks chosen by ``memory_budget``, with the
    :class:`~cuvmap.memory_budget.ChunkedMap` ``chunked`` when given (the Jacobians keep one
    per transformed function, whose programs serve one call only: their functions close
    over the call's values) and ``key_extra`` added to its cache key."""
    if chunked is None and chunk_size == memory_budget_mod.AUTO:
        chunked = memory_budget_mod.ChunkedMap(where, vmap_combine(out_axes))

    flat_axes = {}  # the leaves' in_axes per argument structure (in_axes is fixed here)

    @api_util.with_context(where, f, name)
    def vmapped(*args, **kwargs):
        api_util.check_axes_spec(in_axes, "in_axes")
        api_util.check_axes_spec(out_axes, "out_axes")
        paths, leaves, treedef = tree.flatten_with_path((args, kwargs))
        axes = flat_axes.get(treedef)
        if axes is None:
            axes = api_util.flat_in_axes(f, in_axes, args, kwargs)
            if len(flat_axes) >= 16:
                flat_axes.clear()
            flat_axes[treedef] = axes
        axes = list(axes)
        axes, size = api_util.check_mapped_sizes(f, paths, leaves, axes, axis_size, (args, kwargs))
        if chunked is not None:
            return _vmap_budgeted(f, where, chunked, leaves, treedef, axes, size, out_axes, memory_budget, key_extra)
        if chunk_size is None or size <= chunk_size:
            return batching.vmap_flat(f, where, leaves, treedef, axes, size, out_axes, axis_name)
        return _vmap_chunked(f, where, leaves, treedef, axes, size, out_axes, chunk_size)

    if chunked is not None:
        @api_util.with_context(where, f, name)
        def memory_plan(*args, **kwargs):
            """The :class:`~cuvmap.memory_budget.ChunkPlan` a call with these arguments
            follows: its chunk, budget and planned peak (nothing runs)."""
            paths, leaves, treedef = tree.flatten_with_path((args, kwargs))
            axes = api_util.flat_in_axes(f, in_axes, args, kwargs)
            axes, size = api_util.check_mapped_sizes(f, paths, leaves, axes, axis_size)
            return chunked.plan(_vmap_body(f, where, treedef, axes, out_axes), leaves, axes, size,
                                memory_budget_mod.AUTO, memory_budget, key=(treedef, repr(out_axes), key_extra))

        vmapped.memory_plan = memory_plan
    return vmapped


def _vmap_body(f, where, treedef, axes, out_axes):
    """The body of a budgeted vmap: ``b`` examples of the flat arguments to flat outputs."""

    def body(b, chunk_leaves):
        return tree.flatten(batching.vmap_flat(f, where, chunk_leaves, treedef, axes, b, out_axes))

    return body


def _vmap_budgeted(f, where, chunked, leaves, treedef, axes, size, out_axes, memory_budget, key_extra=None):
    """``vmap`` in chunks chosen by the memory budget (:mod:`cuvmap.memory_budget`)."""
    outs, out_tree = chunked(_vmap_body(f, where, treedef, axes, out_axes), leaves, axes, size, memory_budget_mod.AUTO,
                             memory_budget, key=(treedef, repr(out_axes), key_extra))
    return tree.unflatten(out_tree, api_util.unaliased([api_util.to_array_result(o) for o in outs],
                                                       [x for x in leaves if not isinstance(x, memory_budget_mod.Generated)]))


def _vmap_chunked(f, where, leaves, treedef, axes, size, out_axes, chunk_size):
    chunks = []
    for start in range(0, size, chunk_size):
        stop = min(start + chunk_size, size)
        sliced = [
            x if a is None else indexing.slice_in_dim(x, start, stop, a) for x, a in zip(leaves, axes)
        ]
        chunks.append(batching.vmap_flat(f, where, sliced, treedef, axes, stop - start, out_axes))
    first = chunks[0]
    out_axes_flat = tree.broadcast_prefix(out_axes, first, api_util.is_axis)
    per_chunk = [tree.leaves(c) for c in chunks]
    joined = []
    for j, oa in enumerate(out_axes_flat):
        if oa is None:
            joined.append(per_chunk[0][j])
            continue
        axis = oa % len(core.shape_of(per_chunk[0][j]))
        joined.append(api_util.to_array_result(lax_shape.concatenate([pc[j] for pc in per_chunk], axis)))
    return tree.unflatten(tree.structure(first), joined)

# ---------------------------------------------------------------------------------------
# Reverse mode: vjp, grad, value_and_grad
# ---------------------------------------------------------------------------------------


def _vjp(f, primals, has_aux, where, describe):
    """Traces ``f(*primals)`` on a tape. Returns ``(out, vjp_fun, aux)``."""
    paths, leaves, treedef = tree.flatten_with_path(primals)
    tape = Tape()
    with new_main(VJPTrace, tape, name=where) as main:
        inputs = []
        input_nodes = []
        for path, x in zip(paths, leaves):
            if not core.is_value(x):
                raise TransformError(
                    f"{describe(path)} is a {type(x).__name__}; inputs must be arrays, scalars or pytrees of them"
                )
            dtypes.check_supported(x, lambda: describe(path), where)
            if core.is_float(x):
                node = tape.new_input()
                inputs.append(VJPTracer(main, x, node))
                input_nodes.append(node)
            else:
                inputs.append(x)
                input_nodes.append(None)
        out = f(*tree.unflatten(treedef, inputs))
        out, aux = api_util.split_aux(f, out, has_aux)
    out_leaves, out_tree = tree.flatten(out)
    api_util.check_outputs(f, out_leaves, out)
    out_primals = []
    out_nodes = []
    for leaf in out_leaves:
        if main.owns(leaf):
            out_primals.append(leaf.primal)
            out_nodes.append(leaf.node)
        else:
            out_primals.append(leaf)
            out_nodes.append(None)
    if has_aux:
        aux = tree.map_preserving(lambda a: api_util.aux_result(a.primal if main.owns(a) else a), aux)
    out_value = tree.unflatten(out_tree, api_util.unaliased([api_util.to_array_result(v) for v in out_primals], leaves))

    def vjp_fun(ct, *more):
        if more:
            raise api_util.InputTypeError(
                f"The function returned by `jax.vjp` applied to {api_util.fun_name(f)} was called with "
                f"{1 + len(more)} arguments, but functions returned by `jax.vjp` must be called with a single "
                "argument corresponding to the single value returned by the function being differentiated (even if "
                "that returned value is a tuple or other container): call it with one tuple, "
                "vjp_fun((ct1, ct2)), not vjp_fun(ct1, ct2)")
        ct_leaves, ct_tree = tree.flatten(ct)
        if ct_tree != out_tree:
            raise TransformError(
                f"the cotangent has structure {ct_tree}, but the output has structure {out_tree} (unexpected tree "
                "structure of the argument to the VJP function)"
            )
        seeds = []
        for i, (c, p, node) in enumerate(zip(ct_leaves, out_primals, out_nodes)):
            if core.shape_of(c) != core.shape_of(p) or (node is not None and not _tangent_dtype_ok(p, c)):
                raise TransformError(
                    f"cotangent leaf {i} has type {api_util.aval_str(c)}, but the output leaf has type "
                    f"{api_util.aval_str(p)} (unexpected JAX type (e.g. shape/dtype) for argument to VJP function)"
                )
            if node is not None:
                seeds.append((node, c))
        in_cts = vjp_mod.backward_pass(tape, seeds)
        results = []
        for x, node in zip(leaves, input_nodes):
            ct_x = None if node is None else in_cts[node]
            if ct_x is None:
                ct_x = _zero_tangent(x)
            results.append(api_util.to_array_result(ct_x))
        return tree.unflatten(treedef, api_util.unaliased(results, ct_leaves + leaves))

    return out_value, vjp_fun, aux


def _zero_tangent(x):
    """The zero tangent or cotangent of ``x``: zeros of its dtype for a float or complex
    ``x``, JAX's ``float0`` zeros of its shape for an integer or boolean one (nothing flows
    through an integer: the tangent space is trivial, as ``grad(allow_int=True)`` says)."""
    if core.is_float(x):
        return core.full_like_concrete(x, 0)
    return float0_zeros(core.shape_of(x))


def vjp(f, *primals, has_aux=False):
    """Reverse mode: ``(f(*primals), vjp_fun)`` with ``vjp_fun(ct) = ctᵀ·∂f(*primals)``.

    Args:
      f: a function of pytrees of arrays.
      *primals: the point of linearization.
      has_aux: ``f`` returns ``(output, aux)``; aux is returned as a third value, not
        differentiated.
    Returns:
      ``(out, vjp_fun)`` or ``(out, vjp_fun, aux)``; ``vjp_fun(ct)`` returns a tuple with
      one cotangent per primal (``float0`` zeros for integer and boolean inputs, as JAX's).

    Example::

        y, pullback = vjp(jnp_fn, x)
        (x_bar,) = pullback(ones_like(y))
    """
    api_util.check_callable(f, "vjp")
    where = f"vjp({api_util.fun_name(f)})"

    @api_util.with_context(where, f)
    def run():
        return _vjp(f, primals, has_aux, where, lambda path: f"primal {path[0]}{tree.keystr(path[1:])}")

    out, vjp_fun, aux = run()
    wrapped = api_util.with_context(where, f)(vjp_fun)
    return (out, wrapped, aux) if has_aux else (out, wrapped)


def value_and_grad(f, argnums=0, has_aux=False, holomorphic=False, allow_int=False, reduce_axes=()):
    """``(f(*args), ∇f(*args))`` for a scalar-valued ``f``.

    Args:
      f: returns a float scalar (or ``(scalar, aux)`` with ``has_aux``).
      argnums: an int or tuple of ints: the positional arguments to differentiate.
      has_aux: see :func:`vjp`.
      holomorphic: ``f`` is holomorphic, with complex inputs and a complex output; the
        result is its complex derivative ``f'(z)``. Without it, a complex output raises
        TypeError, and complex inputs of a real ``f`` get ``∂f/∂x − i ∂f/∂y``, JAX's
        convention (NOTE [complex convention] in cuvmap/transforms/complex_rules.py).
      allow_int: also accept integer and boolean leaves among the differentiated
        arguments; their gradient is zero, an array of JAX's ``float0`` dtype
        (:data:`cuvmap.dtypes.float0`) of their shape, as in JAX.
      reduce_axes: JAX's removed option; anything but ``()`` raises
        ``NotImplementedError`` with JAX's message.
    Returns:
      a function returning ``(value, grad)`` or ``((value, aux), grad)``; ``grad`` has the
      structure of the chosen argument (a tuple of them for tuple ``argnums``).
    """
    _check_reduce_axes(reduce_axes)
    return _value_and_grad(f, argnums, has_aux, "value_and_grad", holomorphic, allow_int)


def grad(f, argnums=0, has_aux=False, holomorphic=False, allow_int=False, reduce_axes=()):
    """The gradient of a scalar-valued ``f`` with respect to ``argnums``. For complex
    inputs of a real ``f``: ``∂f/∂x − i ∂f/∂y`` (JAX's convention); ``holomorphic=True``
    for a complex ``f`` of complex inputs: ``f'(z)``; ``allow_int``, ``reduce_axes``: as
    for :func:`value_and_grad`.

    Example::

        g = grad(lambda w, x: ((x @ w) ** 2).sum())(w, x)    # g.shape == w.shape
    """
    _check_reduce_axes(reduce_axes)
    vg = _value_and_grad(f, argnums, has_aux, "grad", holomorphic, allow_int)

    @functools.wraps(vg)
    def grad_f(*args, **kwargs):
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    grad_f.__wrapped__ = f  # (functools.wraps pointed it at vg)
    return grad_f


def _check_reduce_axes(reduce_axes):
    if reduce_axes:  # JAX's message since it removed the option
        raise NotImplementedError("reduce_axes argument to grad is deprecated")


def _value_and_grad(f, argnums, has_aux, transform, holomorphic=False, allow_int=False):
    api_util.check_callable(f, transform)
    where = f"{transform}({api_util.fun_name(f)})"

    @api_util.with_context(where, f)
    def vg(*args, **kwargs):
        single, nums = api_util.normalize_argnums(f, argnums, len(args))
        api_util.check_float_inputs(f, args, nums, transform, allow_int=allow_int)
        complex_checks.check_inputs(f, args, nums, holomorphic, transform)
        dyn = tuple(args[i] for i in nums)
        f_dyn = api_util.dyn_function(f, args, kwargs, nums)
        out, vjp_fun, aux = _vjp(
            f_dyn, dyn, has_aux, where, lambda path: api_util.describe_arg(f, (0, nums[path[0]]) + tuple(path[1:]))
        )
        out_leaves, out_tree = tree.flatten(out)
        if out_tree.num_nodes != 1 or len(out_leaves) != 1 or core.shape_of(out_leaves[0]) != ():
            if out_tree.num_nodes == 1 and len(out_leaves) == 1:
                got = f"shape {api_util.shape_str(out_leaves[0])}"
            else:
                shapes = ", ".join(api_util.shape_str(o) for o in out_leaves)
                got = f"a {type(out).__name__} of {len(out_leaves)} array(s)" + (f" of shapes {shapes}" if shapes else "")
            raise api_util.GradOutputError(
                f"{api_util.fun_name(f)} must return a scalar (shape ()), got {got}; use vjp or jacrev for "
                "non-scalar outputs" + (", or has_aux=True to return auxiliary data" if not has_aux else "")
            )
        if not core.is_float(out_leaves[0]):
            raise api_util.GradOutputError(
                f"{api_util.fun_name(f)} returned a value of dtype {core.dtype_of(out_leaves[0])}; grad needs a "
                "floating-point output"
            )
        complex_checks.check_outputs(out_leaves[0], holomorphic, transform)
        ct = core.full_like_concrete(out_leaves[0], 1)
        grads = vjp_fun(ct)
        if allow_int:
            grads = tree.map_preserving(
                lambda x, gx: gx if core.is_float(x) else float0_zeros(core.shape_of(x)), dyn, tuple(grads))
        g = grads[0] if single else tuple(grads)
        value = tree.unflatten(out_tree, api_util.unaliased([api_util.to_array_result(v) for v in out_leaves], tree.leaves(args)))
        return ((value, aux) if has_aux else value), g

    return vg

# ---------------------------------------------------------------------------------------
# Forward mode: jvp
# ---------------------------------------------------------------------------------------


def jvp(f, primals, tangents, has_aux=False):
    """Forward mode: ``(f(*primals), ∂f(*primals)·tangents)``.

    Args:
      f: a function of pytrees of arrays.
      primals: a tuple (or list) of arguments.
      tangents: a tuple of the same structure, leaf shapes and (floating) dtypes.
    Returns:
      ``(primal_out, tangent_out)`` (and ``aux`` with ``has_aux``).

    Example::

        y, y_dot = jvp(cnp.sin, (x,), (ones_like(x),))     # y_dot == cos(x)
    """
    api_util.check_callable(f, "jvp")
    where = f"jvp({api_util.fun_name(f)})"
    return api_util.with_context(where, f)(_jvp)(f, primals, tangents, has_aux, where)


def _tangent_dtype_ok(p, t):
    """A floating-point primal's tangent has the primal's dtype; a Python scalar on either
    side is weakly typed and adopts the other's (floating) dtype."""
    if not core.is_float(t):
        return False
    if type(p) is float or type(t) is float:
        return True
    return core.dtype_of(t) == core.dtype_of(p)


def _jvp(f, primals, tangents, has_aux, where):
    """:func:`jvp` with its trace named ``where`` (jacfwd uses it under its own name)."""
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise api_util.InputTypeError(
            "primals and tangents must be tuples (or lists) of arguments, got "
            f"{type(primals).__name__} and {type(tangents).__name__} (primal and tangent arguments to jax.jvp must "
            f"be tuples or lists; found {type(primals).__name__} and {type(tangents).__name__}.)"
        )
    p_paths, p_leaves, p_tree = tree.flatten_with_path(tuple(primals))
    t_leaves, t_tree = tree.flatten(tuple(tangents))
    if p_tree != t_tree or type(primals) is not type(tangents):
        raise api_util.InputTypeError(
            f"tangents have structure {tree.structure(tangents)}, but primals have structure "
            f"{tree.structure(primals)} (primal and tangent arguments to jax.jvp must have the same tree structure)")
    for path, p, t in zip(p_paths, p_leaves, t_leaves):
        what = f"tangent {path[0]}{tree.keystr(path[1:])}"
        dtypes.check_supported(p, f"primal {path[0]}{tree.keystr(path[1:])}", where)
        if core.is_float(p) and not _tangent_dtype_ok(p, t):
            raise api_util.InputTypeError(
                f"{what} has dtype {core.dtype_of(t)}, but its primal has dtype {core.dtype_of(p)}; "
                "a tangent must have its primal's dtype (as in JAX): cast it with .astype (primal and tangent "
                "arguments to jax.jvp do not match; dtypes must be equal)"
            )
        if core.shape_of(p) != core.shape_of(t):
            raise TransformError(f"{what} has shape {api_util.shape_str(t)}, but its primal has shape "
                                 f"{api_util.shape_str(p)} (jvp called with different primal and tangent shapes)")
    with new_main(JVPTrace, name=where) as main:
        traced = [JVPTracer(main, p, t) if core.is_float(p) else p for p, t in zip(p_leaves, t_leaves)]
        out = f(*tree.unflatten(p_tree, traced))
        out, aux = api_util.split_aux(f, out, has_aux)
    out_leaves, out_tree = tree.flatten(out)
    api_util.check_outputs(f, out_leaves, out)
    out_p, out_t = [], []
    for leaf in out_leaves:
        if main.owns(leaf):
            out_p.append(leaf.primal)
            out_t.append(leaf.tangent if leaf.tangent is not None else _zero_tangent(leaf.primal))
        else:
            out_p.append(leaf)
            out_t.append(_zero_tangent(leaf))
    fresh = api_util.unaliased([api_util.to_array_result(v) for v in out_p + out_t], p_leaves + t_leaves)
    result = (tree.unflatten(out_tree, fresh[:len(out_p)]), tree.unflatten(out_tree, fresh[len(out_p):]))
    if has_aux:
        aux = tree.map_preserving(lambda a: api_util.aux_result(a.primal if main.owns(a) else a), aux)
        return result + (aux,)
    return result

# ---------------------------------------------------------------------------------------
# Jacobians
# ---------------------------------------------------------------------------------------


def _std_basis(leaves):
    """The identity, split into one ``(N, *shape)`` block per leaf (N = total size): the
    blocks of :func:`_generated_basis` made whole."""
    generated, sizes = _generated_basis(leaves)
    return [g.make(0, g.shape[0]) for g in generated], sizes


def _generated_basis(leaves):
    """The identity, split into one block per leaf (see :func:`_std_basis`), made per chunk:
    one :class:`~cuvmap.memory_budget.Generated` input per leaf, whose rows ``start:stop``
    are those of the identity's block."""
    sizes = [int(np.prod(core.shape_of(x), dtype=np.int64)) for x in leaves]
    total = sum(sizes)
    blocks = []
    offset = 0
    for x, n in zip(leaves, sizes):
        xp = backend.xp_of(x)
        dtype = core.dtype_of(x) if core.is_float(x) else np.float64
        shape = tuple(core.shape_of(x))

        def make(start, stop, xp=xp, dtype=dtype, shape=shape, offset=offset, n=n):
            rows = xp.zeros((stop - start, n), dtype=dtype)
            first, last = max(start, offset), min(stop, offset + n)
            if first < last:
                rows[np.arange(first - start, last - start), np.arange(first - offset, last - offset)] = 1
            return rows.reshape((stop - start,) + shape)

        device = x.aval.device if isinstance(x, Tracer) else core.get_aval(x).device
        blocks.append(memory_budget_mod.Generated((total,) + shape, dtype, device, make))
        offset += n
    return blocks, sizes


def _jacobian_chunks(where, chunk_size, memory_budget, out_axes):
    """A Jacobian's chunk spec and, for ``"auto"``, its ChunkedMap (kept by the transformed
    function, so that the choice is made once per signature; its programs serve one call:
    the pushed-forward or pulled-back function closes over the call's values)."""
    spec = memory_budget_mod.check_chunk_spec(chunk_size, memory_budget, where)
    if spec != memory_budget_mod.AUTO:
        return spec, None
    return spec, memory_budget_mod.ChunkedMap(where, vmap_combine(out_axes), cache_programs=False)


def _signature(args, kwargs):
    """A cache key of a call's arguments: structure and avals (values of other leaves)."""
    leaves, treedef = tree.flatten((args, kwargs))
    return (treedef,) + tuple(core.get_aval(x) if core.is_value(x) else repr(x) for x in leaves)


def _differentiated_args(f, args, kwargs, argnums, where, holomorphic, transform, allow_int=False):
    """For the jacobians: ``(single, argnums, dyn, f_dyn)`` with ``dyn`` the arguments to
    differentiate (checked to be floating point, or integer or boolean with ``allow_int``,
    and complex or not as ``transform`` and ``holomorphic`` need) and ``f_dyn(*dyn)``
    calling ``f``."""
    single, nums = api_util.normalize_argnums(f, argnums, len(args))
    api_util.check_float_inputs(f, args, nums, where.split("(", 1)[0], allow_int=allow_int)
    complex_checks.check_inputs(f, args, nums, holomorphic, transform)
    dyn = tuple(args[i] for i in nums)
    return single, nums, dyn, api_util.dyn_function(f, args, kwargs, nums)


def jacfwd(f, argnums=0, has_aux=False, holomorphic=False, chunk_size=None, memory_budget=None):
    """The Jacobian of ``f`` by forward mode (``vmap`` of ``jvp`` over the input basis).

    Returns a function giving, for each output leaf, a pytree like the differentiated
    argument(s) whose leaves have shape ``out.shape + in.shape``. ``chunk_size`` and
    ``memory_budget`` chunk the map over the basis as :func:`vmap`'s do (torch.func's
    ``chunk_size``; with ``"auto"`` the basis is made chunk by chunk, never whole).
    Inputs must be real unless ``holomorphic=True``, which needs complex inputs and
    outputs and gives ``f'(z)`` (JAX's rules: :mod:`cuvmap.holomorphic`).
    """
    api_util.check_callable(f, "jacfwd")
    return _jacfwd(f, argnums, has_aux, f"jacfwd({api_util.fun_name(f)})", chunk_size=chunk_size,
                   memory_budget=memory_budget, holomorphic=holomorphic)


def _jacfwd(f, argnums, has_aux, where, name=None, chunk_size=None, memory_budget=None, holomorphic=False):
    """:func:`jacfwd` whose errors and traces are named ``where``."""
    # aux is computed from the primals only, so it is unbatched (out_axes None)
    out_axes = (-1, None) if has_aux else -1
    spec, chunked = _jacobian_chunks(where, chunk_size, memory_budget, out_axes)

    @api_util.with_context(where, f, name)
    def jac(*args, **kwargs):
        single, nums, dyn, f_dyn = _differentiated_args(f, args, kwargs, argnums, where, holomorphic, "jacfwd")
        in_leaves, in_tree = tree.flatten(dyn)
        basis, sizes = (_generated_basis if chunked is not None else _std_basis)(in_leaves)

        def pushfwd(*basis_leaves):
            res = _jvp(f_dyn, dyn, tree.unflatten(in_tree, list(basis_leaves)), has_aux, where)
            return res[1:] if has_aux else res[1]

        pushed = _vmap(pushfwd, 0, out_axes, None, spec, where, memory_budget=memory_budget, chunked=chunked,
                       key_extra=_signature(args, kwargs) if chunked is not None else None)(*basis)
        aux = None
        if has_aux:
            pushed, aux = pushed
        complex_checks.check_outputs(pushed, holomorphic, "jacfwd")
        out_leaves, out_tree = tree.flatten(pushed)
        jac_leaves = []
        for o in out_leaves:
            out_shape = core.shape_of(o)[:-1]
            per_input = []
            offset = 0
            for x, n in zip(in_leaves, sizes):
                piece = indexing.slice_in_dim(o, offset, offset + n, len(out_shape))
                per_input.append(lax_shape.reshape(piece, out_shape + tuple(core.shape_of(x))))
                offset += n
            sub = tree.unflatten(in_tree, per_input)
            jac_leaves.append(sub[0] if single else sub)
        result = tree.unflatten(out_tree, jac_leaves)
        return (result, aux) if has_aux else result

    return jac


def jacrev(f, argnums=0, has_aux=False, holomorphic=False, allow_int=False, chunk_size=None, memory_budget=None):
    """The Jacobian of ``f`` by reverse mode (``vmap`` of the VJP over the output basis).

    Same output structure as :func:`jacfwd`: for each output leaf, a pytree like the
    differentiated argument(s) with leaves of shape ``out.shape + in.shape``.
    ``chunk_size`` and ``memory_budget`` chunk the map over the basis as :func:`vmap`'s
    do (the budget covers the pullbacks and the Jacobian, not the forward pass's
    residuals, which exist before the map starts). Outputs must be real unless
    ``holomorphic=True``, which needs complex inputs and outputs and gives ``f'(z)``
    (JAX's rules: :mod:`cuvmap.holomorphic`). ``allow_int`` (JAX's): integer and boolean
    inputs are accepted, and their blocks of the Jacobian are ``float0`` zeros of shape
    ``out.shape + in.shape``, as :func:`grad`'s ``allow_int`` gives.
    """
    api_util.check_callable(f, "jacrev")
    return _jacrev(f, argnums, has_aux, f"jacrev({api_util.fun_name(f)})", chunk_size=chunk_size,
                   memory_budget=memory_budget, holomorphic=holomorphic, allow_int=allow_int)


def _jacrev(f, argnums, has_aux, where, name=None, chunk_size=None, memory_budget=None, holomorphic=False,
            allow_int=False):
    """:func:`jacrev` whose errors and traces are named ``where``."""
    spec, chunked = _jacobian_chunks(where, chunk_size, memory_budget, 0)

    @api_util.with_context(where, f, name)
    def jac(*args, **kwargs):
        single, nums, dyn, f_dyn = _differentiated_args(f, args, kwargs, argnums, where, holomorphic, "jacrev",
                                                        allow_int)
        out, vjp_fun, aux = _vjp(
            f_dyn, dyn, has_aux, where, lambda path: api_util.describe_arg(f, (0, nums[path[0]]) + tuple(path[1:]))
        )
        out_leaves, out_tree = tree.flatten(out)
        for o in out_leaves:
            if not core.is_float(o):
                raise TransformError(f"output of dtype {core.dtype_of(o)}: jacrev needs floating-point outputs")
        complex_checks.check_outputs(out_leaves, holomorphic, "jacrev")
        basis, sizes = (_generated_basis if chunked is not None else _std_basis)(out_leaves)
        cts = _vmap(lambda *b: vjp_fun(tree.unflatten(out_tree, list(b))), 0, 0, None, spec, where,
                    memory_budget=memory_budget, chunked=chunked,
                    key_extra=_signature(args, kwargs) if chunked is not None else None)(*basis)
        ct_leaves, ct_tree = tree.flatten(cts)
        jac_leaves = []
        offset = 0
        for o, n in zip(out_leaves, sizes):
            out_shape = core.shape_of(o)
            per_input = []
            for c, x in zip(ct_leaves, tree.leaves(dyn)):
                if not core.is_float(x):  # (allow_int: a float0 zero block, as grad's)
                    per_input.append(float0_zeros(out_shape + tuple(core.shape_of(x))))
                    continue
                # (no copy of the Jacobian where a leaf is all of it and keeps its shape: the
                # memory budget counts one copy)
                whole = n == core.shape_of(c)[0]
                piece = c if whole else indexing.slice_in_dim(c, offset, offset + n, 0)
                shape = out_shape + core.shape_of(c)[1:]
                per_input.append(piece if core.shape_of(piece) == shape else lax_shape.reshape(piece, shape))
            sub = tree.unflatten(ct_tree, per_input)
            jac_leaves.append(sub[0] if single else sub)
            offset += n
        result = tree.unflatten(out_tree, jac_leaves)
        return (result, aux) if has_aux else result

    return jac


def hessian(f, argnums=0, has_aux=False, holomorphic=False, chunk_size=None, memory_budget=None):
    """``jacfwd(jacrev(f))``: the matrix of second derivatives of a scalar ``f``
    (shape ``in.shape + in.shape`` for one array argument). ``chunk_size`` and
    ``memory_budget`` chunk the outer map (jacfwd's, over the input basis), each chunk
    running the whole inner jacrev. ``holomorphic=True``: ``f''(z)`` of a holomorphic
    ``f`` of complex inputs (JAX's ``hessian(f, holomorphic=True)``)."""
    api_util.check_callable(f, "hessian")
    where = f"hessian({api_util.fun_name(f)})"
    inner = _jacrev(f, argnums, has_aux, where, name=api_util.fun_name(f), holomorphic=holomorphic)
    hess = _jacfwd(inner, argnums, has_aux, where, chunk_size=chunk_size, memory_budget=memory_budget,
                   holomorphic=holomorphic)
    hess.__wrapped__ = f  # (the outer wrapper's was the inner jacrev)
    return hess


def stop_gradient(x):
    """Treats every leaf of ``x`` as a constant for the derivative transforms."""
    return tree.map_preserving(elementwise.stop_gradient, x)


def block_until_ready(x):
    """Waits until the GPU has computed every CuPy leaf of the pytree ``x`` (it synchronises
    the current device), raises the IndexError a bounds check on the GPU has found since
    the last report (NOTE [device-side bounds checks] in cuvmap/cuda/device_errors.py), and
    returns ``x``. NumPy leaves are ready already; on the CPU it only returns ``x``
    (``jax.block_until_ready``).

    Example::

        loss = cuvmap.block_until_ready(step(params, x, y))
    """
    if any(backend.is_cupy_array(leaf) for leaf in tree.leaves(x)):
        device_errors.check()
    return x
