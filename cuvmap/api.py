"""The user-facing transforms: ``vmap``, ``grad``, ``value_and_grad``, ``vjp``, ``jvp``,
``jacfwd``, ``jacrev``, ``hessian``.

This module holds the pytree handling (flattening arguments, ``in_axes``/``out_axes``
prefixes, ``argnums``) and the error text; the interpreters live in
:mod:`cuvmap.transforms`. Every error raised while a transformed function runs starts
with the transform and the function, e.g.
``vmap(loss, in_axes=(None, 0, 0)): argument 2 (ys) has size 10 along axis 0, ...``.
"""
import functools
import inspect

import numpy as np

from cuvmap import backend, core, tree
from cuvmap.core import CuvmapError, Tracer, new_main
from cuvmap.transforms import batching, vjp as vjp_mod
from cuvmap.transforms.batching import BatchTrace, BatchTracer
from cuvmap.transforms.jvp import JVPTrace, JVPTracer
from cuvmap.transforms.vjp import Tape, VJPTrace, VJPTracer


class TransformError(CuvmapError, ValueError):
    """Bad arguments to a transform (axes, argnums, shapes of inputs or cotangents)."""


# ---------------------------------------------------------------------------------------
# Naming: functions, arguments by pytree path, error prefixes
# ---------------------------------------------------------------------------------------


def _fun_name(f):
    while isinstance(f, functools.partial):
        f = f.func
    return getattr(f, "__name__", None) or type(f).__name__


def _param_names(f):
    try:
        params = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):
        return []
    names = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            break
    return names


def _describe_arg(f, path):
    """``argument 2 (ys)['w1']`` for the leaf at ``path`` of ``(args, kwargs)``."""
    if not path:
        return "the arguments"
    if path == (0,):
        return "the positional arguments"
    if path == (1,):
        return "the keyword arguments"
    if path[0] == 0 and len(path) > 1:
        i = path[1]
        names = _param_names(f)
        name = f" ({names[i]})" if i < len(names) else ""
        return f"argument {i}{name}{tree.keystr(path[2:])}"
    if path[0] == 1 and len(path) > 1:
        return f"keyword argument {path[1]}{tree.keystr(path[2:])}"
    return tree.keystr(path)


def split_aux(f, out, has_aux):
    """``(output, aux)`` of ``f``'s result ``out``: the pair ``f`` returns with
    ``has_aux=True`` (checked), else ``(out, None)``."""
    if not has_aux:
        return out, None
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise TransformError(
            f"with has_aux=True, {_fun_name(f)} must return a pair (output, aux), got {tree.describe(out)}"
        )
    return out[0], out[1]


def _shape_str(x):
    return str(tuple(core.shape_of(x)))


def _with_context(where, f, name=None):
    """Decorator: CuvmapErrors raised inside get ``where`` as their prefix (the innermost
    transform names itself first). The wrapper is named ``name`` (default ``where``), so
    that ``vmap(grad(loss))`` reads as such in messages."""

    def wrap(impl):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            try:
                return impl(*args, **kwargs)
            except CuvmapError as err:
                if err.where is None:
                    err.where = where
                raise

        wrapper.__name__ = name or where
        wrapper.__qualname__ = name or where
        return wrapper

    return wrap


def _is_axis(x):
    return x is None or _is_int(x)


def _check_callable(f, transform):
    if not callable(f):
        raise TypeError(f"{transform}({f!r}): the function to transform must be callable, got an object of type {type(f).__name__}")


def _prefix_error(spec_name, spec, what, err, describe):
    """The TransformError for an ``in_axes``/``out_axes`` that is not a prefix of ``what``."""
    return TransformError(
        f"{spec_name} {spec!r} is not a pytree prefix of the {what}: at {describe(err.path)}, "
        f"{spec_name} has {err.reason}"
    )


def _describe_out(path):
    return f"output {tree.keystr(path)}" if path else "the output"


def _aux_result(x):
    """Aux values come back as given, except that NumPy scalars become 0-d arrays."""
    return _to_array_result(x) if isinstance(x, (np.generic, np.ndarray)) else x


def _check_axes_spec(spec, what):
    for leaf in tree.leaves(spec, is_leaf=lambda x: x is None):
        if not _is_axis(leaf):
            raise TransformError(f"{what} must be ints or None (or a pytree of them), got {leaf!r}")


def _is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _to_array_result(x):
    """Results at the top level are arrays, never Python or NumPy scalars."""
    if isinstance(x, Tracer):
        return x
    if backend.is_cupy_array(x):
        # a broadcast view (an unbatched output of vmap) would alias in-place writes
        return x.copy() if 0 in x.strides and x.size > 1 else x
    if isinstance(x, np.ndarray):
        return x if x.flags.writeable else x.copy()
    return np.asarray(x)


# NOTE [results never alias inputs]
# NumPy and CuPy arrays are mutable, so a result that shares memory with an argument (or
# with another result) would let an in-place update of one silently change the other:
# ``vmap(lambda x: x)(xs)`` would return ``xs`` itself, and the two gradients of
# ``x + y`` the same array. JAX never has the problem (its arrays are immutable); here the
# transforms copy any result whose memory is owned by an argument or an earlier result.
# The check compares the arrays that own the memory (``.base``), so it costs a set lookup
# per leaf, not a pairwise overlap test.


def _memory_owner(x):
    while getattr(x, "base", None) is not None:
        x = x.base
    return x


def _unaliased(results, inputs):
    """``results`` (a list of leaves) with copies of those that share memory with a leaf of
    ``inputs`` or with an earlier result (NOTE [results never alias inputs])."""
    owners = {id(_memory_owner(x)) for x in inputs if hasattr(x, "base")}
    out = []
    for r in results:
        if hasattr(r, "base") and not isinstance(r, Tracer):
            owner = id(_memory_owner(r))
            if owner in owners:
                r = r.copy()
                owner = id(r)
            owners.add(owner)
        out.append(r)
    return out


# ---------------------------------------------------------------------------------------
# vmap
# ---------------------------------------------------------------------------------------


def vmap(f, in_axes=0, out_axes=0, axis_size=None, chunk_size=None):
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
        results (identical results, bounded memory).
    Returns:
      the vectorized function.

    Example::

        per_example = vmap(grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
    """
    _check_callable(f, "vmap")
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    fname = _fun_name(f)
    spec = f"in_axes={in_axes!r}" if in_axes != 0 else ""
    if out_axes != 0:
        spec += (", " if spec else "") + f"out_axes={out_axes!r}"
    where = f"vmap({fname}{', ' + spec if spec else ''})"
    if axis_size is not None and (not _is_int(axis_size) or axis_size < 0):
        raise TransformError(f"{where}: axis_size must be a non-negative int, got {axis_size!r}")
    if chunk_size is not None and (not _is_int(chunk_size) or chunk_size < 1):
        raise TransformError(f"{where}: chunk_size must be a positive int, got {chunk_size!r}")
    return _vmap(f, in_axes, out_axes, axis_size, chunk_size, where)


def _vmap(f, in_axes, out_axes, axis_size, chunk_size, where, name=None):
    """:func:`vmap` named ``where`` (other transforms use it internally under their name)."""

    @_with_context(where, f, name)
    def vmapped(*args, **kwargs):
        _check_axes_spec(in_axes, "in_axes")
        _check_axes_spec(out_axes, "out_axes")
        paths, leaves, treedef = tree.flatten_with_path((args, kwargs))
        axes = _flat_in_axes(f, in_axes, args, kwargs)
        axes, size = _check_mapped_sizes(f, paths, leaves, axes, axis_size)
        if chunk_size is None or size <= chunk_size:
            return _vmap_once(f, where, leaves, treedef, axes, size, out_axes)
        return _vmap_chunked(f, where, leaves, treedef, axes, size, out_axes, chunk_size)

    return vmapped


def _flat_in_axes(f, in_axes, args, kwargs):
    if isinstance(in_axes, tuple):
        if len(in_axes) != len(args):
            raise TransformError(
                f"in_axes has {len(in_axes)} entries but {_fun_name(f)} was called with "
                f"{len(args)} positional arguments; give one entry per positional argument"
            )
        prefix = (in_axes, {k: 0 for k in kwargs})
    elif _is_axis(in_axes):
        prefix = (tuple(in_axes for _ in args), {k: 0 for k in kwargs})
    else:
        raise TransformError(
            f"in_axes must be an int, None or a tuple with one entry per positional argument, got {in_axes!r}"
        )
    try:
        return tree.broadcast_prefix(prefix, (args, kwargs), _is_axis)
    except tree.PrefixError as err:
        raise _prefix_error("in_axes", in_axes, "arguments", err, lambda path: _describe_arg(f, path)) from None


def _check_mapped_sizes(f, paths, leaves, axes, axis_size):
    normalized = []
    mapped = []
    for path, leaf, axis in zip(paths, leaves, axes):
        if axis is None:
            normalized.append(None)
            continue
        if not (isinstance(leaf, Tracer) or hasattr(leaf, "shape")):
            raise TransformError(
                f"{_describe_arg(f, path)} is a {type(leaf).__name__}, which has no axis {axis} to map over; "
                "pass an array or give it in_axes None"
            )
        shape = tuple(leaf.shape)
        if not -len(shape) <= axis < len(shape):
            raise TransformError(
                f"in_axes {axis} is out of range for {_describe_arg(f, path)} of shape {shape} "
                f"(rank {len(shape)})"
            )
        axis = axis % len(shape)
        normalized.append(axis)
        mapped.append((path, shape, axis))
    sizes = {shape[axis] for _, shape, axis in mapped}
    ref_size = axis_size if axis_size is not None else (mapped[0][1][mapped[0][2]] if mapped else None)
    bad = next(((p, s, a) for p, s, a in mapped if s[a] != ref_size), None)
    if bad is not None:
        path, shape, axis = bad
        head = f"{_describe_arg(f, path)} has size {shape[axis]} along axis {axis} (shape {shape}), but "
        if axis_size is not None:
            head += f"axis_size is {axis_size}"
        else:
            r_path, r_shape, r_axis = mapped[0]
            head += f"{_describe_arg(f, r_path)} has size {r_shape[r_axis]} along axis {r_axis} (shape {r_shape})"
        tail = ""
        if len(mapped) > 2:
            tail = "; the mapped arguments are " + ", ".join(
                f"{_describe_arg(f, p)} (shape {s}, axis {a})" for p, s, a in mapped
            )
        raise TransformError(f"{head}; mapped arguments must all have the same size along their mapped axes{tail}")
    if not mapped:
        if axis_size is None:
            raise TransformError(
                "nothing is mapped (every in_axes entry is None or the arguments have no leaves) "
                "and no axis_size was given"
            )
        return normalized, int(axis_size)
    return normalized, sizes.pop()


def _vmap_once(f, where, leaves, treedef, axes, size, out_axes):
    with new_main(BatchTrace, size, name=where) as main:
        traced = [x if a is None else BatchTracer(main, x, a) for x, a in zip(leaves, axes)]
        args, kwargs = tree.unflatten(treedef, traced)
        out = f(*args, **kwargs)
    out_paths, out_leaves, out_tree = tree.flatten_with_path(out)
    try:
        out_axes_flat = tree.broadcast_prefix(out_axes, out, _is_axis)
    except tree.PrefixError as err:
        raise _prefix_error("out_axes", out_axes, "outputs", err, _describe_out) from None
    results = []
    for path, leaf, oa in zip(out_paths, out_leaves, out_axes_flat):
        batched = type(leaf) is BatchTracer and leaf._main is main
        if batched:
            if oa is None:
                raise TransformError(
                    f"out_axes is None for {_describe_out(path)} of shape {leaf.shape}, but it "
                    "depends on the mapped inputs (it is batched); give it an axis"
                )
            ndim = len(leaf.val.shape)
            value = batching.move_bdim(leaf.val, leaf.bdim, _normalize_out_axis(oa, ndim, path, leaf.shape))
        elif oa is None:
            value = leaf
        else:
            from cuvmap.lax import shape as lax_shape

            shape = core.shape_of(leaf)
            axis = _normalize_out_axis(oa, len(shape) + 1, path, shape)
            out_shape = shape[:axis] + (size,) + shape[axis:]
            kept = tuple(i for i in range(len(out_shape)) if i != axis)
            value = lax_shape.broadcast_in_dim(leaf, out_shape, kept)
        results.append(_to_array_result(value))
    return tree.unflatten(out_tree, _unaliased(results, leaves))


def _normalize_out_axis(axis, ndim, path, logical_shape):
    if not -ndim <= axis < ndim:
        raise TransformError(
            f"out_axes {axis} is out of range for {_describe_out(path)} of "
            f"shape {tuple(logical_shape)} (rank {ndim - 1} plus the mapped axis)"
        )
    return axis % ndim


def _vmap_chunked(f, where, leaves, treedef, axes, size, out_axes, chunk_size):
    from cuvmap.lax import indexing, shape as lax_shape

    chunks = []
    for start in range(0, size, chunk_size):
        stop = min(start + chunk_size, size)
        sliced = [
            x if a is None else indexing.slice_in_dim(x, start, stop, a) for x, a in zip(leaves, axes)
        ]
        chunks.append(_vmap_once(f, where, sliced, treedef, axes, stop - start, out_axes))
    first = chunks[0]
    out_axes_flat = tree.broadcast_prefix(out_axes, first, _is_axis)
    per_chunk = [tree.leaves(c) for c in chunks]
    joined = []
    for j, oa in enumerate(out_axes_flat):
        if oa is None:
            joined.append(per_chunk[0][j])
            continue
        axis = oa % len(core.shape_of(per_chunk[0][j]))
        joined.append(_to_array_result(lax_shape.concatenate([pc[j] for pc in per_chunk], axis)))
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
            if not (isinstance(x, Tracer) or hasattr(x, "shape") or type(x) in (int, float, bool)):
                raise TransformError(
                    f"{describe(path)} is a {type(x).__name__}; inputs must be arrays, scalars or pytrees of them"
                )
            if core.is_float(x):
                node = tape.num_inputs
                tape.num_inputs += 1
                inputs.append(VJPTracer(main, x, node))
                input_nodes.append(node)
            else:
                inputs.append(x)
                input_nodes.append(None)
        out = f(*tree.unflatten(treedef, inputs))
        out, aux = split_aux(f, out, has_aux)
    out_leaves, out_tree = tree.flatten(out)
    out_primals = []
    out_nodes = []
    for leaf in out_leaves:
        if type(leaf) is VJPTracer and leaf._main is main:
            out_primals.append(leaf.primal)
            out_nodes.append(leaf.node)
        else:
            out_primals.append(leaf)
            out_nodes.append(None)
    if has_aux:
        aux = tree.map(lambda a: _aux_result(a.primal if type(a) is VJPTracer and a._main is main else a), aux)
    out_value = tree.unflatten(out_tree, _unaliased([_to_array_result(v) for v in out_primals], leaves))

    def vjp_fun(ct):
        ct_leaves, ct_tree = tree.flatten(ct)
        if ct_tree != out_tree:
            raise TransformError(
                f"the cotangent has structure {ct_tree}, but the output has structure {out_tree}"
            )
        seeds = []
        for i, (c, p, node) in enumerate(zip(ct_leaves, out_primals, out_nodes)):
            if core.shape_of(c) != core.shape_of(p):
                raise TransformError(
                    f"cotangent leaf {i} has shape {_shape_str(c)}, but the output leaf has shape {_shape_str(p)}"
                )
            if node is not None:
                seeds.append((node, c))
        in_cts = vjp_mod.backward_pass(tape, seeds)
        results = []
        for x, node in zip(leaves, input_nodes):
            ct_x = None if node is None else in_cts[node]
            if ct_x is None:
                ct_x = core.full_like_concrete(x, 0)
            results.append(_to_array_result(ct_x))
        return tree.unflatten(treedef, _unaliased(results, ct_leaves + leaves))

    return out_value, vjp_fun, aux


def vjp(f, *primals, has_aux=False):
    """Reverse mode: ``(f(*primals), vjp_fun)`` with ``vjp_fun(ct) = ctᵀ·∂f(*primals)``.

    Args:
      f: a function of pytrees of arrays.
      *primals: the point of linearization.
      has_aux: ``f`` returns ``(output, aux)``; aux is returned as a third value, not
        differentiated.
    Returns:
      ``(out, vjp_fun)`` or ``(out, vjp_fun, aux)``; ``vjp_fun(ct)`` returns a tuple with
      one cotangent per primal (zeros for integer inputs).

    Example::

        y, pullback = vjp(jnp_fn, x)
        (x_bar,) = pullback(ones_like(y))
    """
    _check_callable(f, "vjp")
    where = f"vjp({_fun_name(f)})"

    @_with_context(where, f)
    def run():
        return _vjp(f, primals, has_aux, where, lambda path: f"primal {path[0]}{tree.keystr(path[1:])}")

    out, vjp_fun, aux = run()
    wrapped = _with_context(where, f)(vjp_fun)
    return (out, wrapped, aux) if has_aux else (out, wrapped)


def _normalize_argnums(f, argnums, nargs):
    single = isinstance(argnums, (int, np.integer))
    nums = (argnums,) if single else tuple(argnums) if isinstance(argnums, (tuple, list)) else None
    if nums is None or any(not isinstance(a, (int, np.integer)) or isinstance(a, bool) for a in nums):
        raise TransformError(f"argnums must be an int or a tuple of ints, got {argnums!r}")
    if not nums:
        raise TransformError("argnums is empty")
    out = []
    for a in nums:
        if not -nargs <= a < nargs:
            raise TransformError(
                f"argnums {argnums!r} is out of range: {_fun_name(f)} was called with {nargs} positional argument"
                + ("s" if nargs != 1 else "")
            )
        out.append(int(a) % nargs)
    return single, tuple(out)


def _dyn_function(f, args, kwargs, argnums):
    def f_dyn(*dyn):
        full = list(args)
        for i, d in zip(argnums, dyn):
            full[i] = d
        return f(*full, **kwargs)

    f_dyn.__name__ = f_dyn.__qualname__ = _fun_name(f)
    return f_dyn


def _check_float_inputs(f, args, argnums, transform):
    for i in argnums:
        paths, leaves, _ = tree.flatten_with_path(args[i])
        for path, x in zip(paths, leaves):
            if not (isinstance(x, Tracer) or hasattr(x, "shape") or type(x) in (int, float, bool)):
                raise TransformError(
                    f"{_describe_arg(f, (0, i) + tuple(path))} is a {type(x).__name__}; "
                    f"{transform} differentiates arrays, scalars or pytrees of them"
                )
            if not core.is_float(x):
                raise TransformError(
                    f"{_describe_arg(f, (0, i) + tuple(path))} has dtype {core.dtype_of(x)}; {transform} "
                    "differentiates with respect to floating-point inputs only (cast it, or leave it out of argnums)"
                )


def value_and_grad(f, argnums=0, has_aux=False):
    """``(f(*args), ∇f(*args))`` for a scalar-valued ``f``.

    Args:
      f: returns a float scalar (or ``(scalar, aux)`` with ``has_aux``).
      argnums: an int or tuple of ints: the positional arguments to differentiate.
      has_aux: see :func:`vjp`.
    Returns:
      a function returning ``(value, grad)`` or ``((value, aux), grad)``; ``grad`` has the
      structure of the chosen argument (a tuple of them for tuple ``argnums``).
    """
    return _value_and_grad(f, argnums, has_aux, "value_and_grad")


def grad(f, argnums=0, has_aux=False):
    """The gradient of a scalar-valued ``f`` with respect to ``argnums``.

    Example::

        g = grad(lambda w, x: ((x @ w) ** 2).sum())(w, x)    # g.shape == w.shape
    """
    vg = _value_and_grad(f, argnums, has_aux, "grad")

    @functools.wraps(vg)
    def grad_f(*args, **kwargs):
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return grad_f


def _value_and_grad(f, argnums, has_aux, transform):
    _check_callable(f, transform)
    where = f"{transform}({_fun_name(f)})"

    @_with_context(where, f)
    def vg(*args, **kwargs):
        single, nums = _normalize_argnums(f, argnums, len(args))
        _check_float_inputs(f, args, nums, transform)
        dyn = tuple(args[i] for i in nums)
        f_dyn = _dyn_function(f, args, kwargs, nums)
        out, vjp_fun, aux = _vjp(
            f_dyn, dyn, has_aux, where, lambda path: _describe_arg(f, (0, nums[path[0]]) + tuple(path[1:]))
        )
        out_leaves, out_tree = tree.flatten(out)
        if out_tree.num_nodes != 1 or len(out_leaves) != 1 or core.shape_of(out_leaves[0]) != ():
            if out_tree.num_nodes == 1 and len(out_leaves) == 1:
                got = f"shape {_shape_str(out_leaves[0])}"
            else:
                shapes = ", ".join(_shape_str(o) for o in out_leaves)
                got = f"a {type(out).__name__} of {len(out_leaves)} array(s)" + (f" of shapes {shapes}" if shapes else "")
            raise TransformError(
                f"{_fun_name(f)} must return a scalar (shape ()), got {got}; use vjp or jacrev for "
                "non-scalar outputs" + (", or has_aux=True to return auxiliary data" if not has_aux else "")
            )
        if not core.is_float(out_leaves[0]):
            raise TransformError(
                f"{_fun_name(f)} returned a value of dtype {core.dtype_of(out_leaves[0])}; grad needs a "
                "floating-point output"
            )
        ct = core.full_like_concrete(out_leaves[0], 1)
        grads = vjp_fun(ct)
        g = grads[0] if single else tuple(grads)
        value = tree.unflatten(out_tree, _unaliased([_to_array_result(v) for v in out_leaves], tree.leaves(args)))
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
    _check_callable(f, "jvp")
    where = f"jvp({_fun_name(f)})"
    return _with_context(where, f)(_jvp)(f, primals, tangents, has_aux, where)


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
        raise TransformError(
            "primals and tangents must be tuples (or lists) of arguments, got "
            f"{type(primals).__name__} and {type(tangents).__name__}"
        )
    p_paths, p_leaves, p_tree = tree.flatten_with_path(tuple(primals))
    t_leaves, t_tree = tree.flatten(tuple(tangents))
    if p_tree != t_tree:
        raise TransformError(f"tangents have structure {t_tree}, but primals have structure {p_tree}")
    for path, p, t in zip(p_paths, p_leaves, t_leaves):
        what = f"tangent {path[0]}{tree.keystr(path[1:])}"
        if core.shape_of(p) != core.shape_of(t):
            raise TransformError(f"{what} has shape {_shape_str(t)}, but its primal has shape {_shape_str(p)}")
        if core.is_float(p) and not _tangent_dtype_ok(p, t):
            raise TransformError(
                f"{what} has dtype {core.dtype_of(t)}, but its primal has dtype {core.dtype_of(p)}; "
                "a tangent must have its primal's dtype (as in JAX): cast it with .astype"
            )
    with new_main(JVPTrace, name=where) as main:
        traced = [JVPTracer(main, p, t) if core.is_float(p) else p for p, t in zip(p_leaves, t_leaves)]
        out = f(*tree.unflatten(p_tree, traced))
        out, aux = split_aux(f, out, has_aux)
    out_leaves, out_tree = tree.flatten(out)
    out_p, out_t = [], []
    for leaf in out_leaves:
        if type(leaf) is JVPTracer and leaf._main is main:
            out_p.append(leaf.primal)
            out_t.append(leaf.tangent if leaf.tangent is not None else core.full_like_concrete(leaf.primal, 0))
        else:
            out_p.append(leaf)
            out_t.append(core.full_like_concrete(leaf, 0))
    fresh = _unaliased([_to_array_result(v) for v in out_p + out_t], p_leaves + t_leaves)
    result = (tree.unflatten(out_tree, fresh[:len(out_p)]), tree.unflatten(out_tree, fresh[len(out_p):]))
    if has_aux:
        aux = tree.map(lambda a: _aux_result(a.primal if type(a) is JVPTracer and a._main is main else a), aux)
        return result + (aux,)
    return result


# ---------------------------------------------------------------------------------------
# Jacobians
# ---------------------------------------------------------------------------------------


def _std_basis(leaves):
    """The identity, split into one ``(N, *shape)`` block per leaf (N = total size)."""
    sizes = [int(np.prod(core.shape_of(x), dtype=np.int64)) for x in leaves]
    total = sum(sizes)
    blocks = []
    offset = 0
    for x, n in zip(leaves, sizes):
        xp = backend.xp_of(x)
        block = xp.zeros((total, n), dtype=core.dtype_of(x) if core.is_float(x) else np.float64)
        block[offset:offset + n, :] = xp.eye(n, dtype=block.dtype)
        blocks.append(block.reshape((total,) + tuple(core.shape_of(x))))
        offset += n
    return blocks, sizes


def _differentiated_args(f, args, kwargs, argnums, where):
    """For the jacobians: ``(single, argnums, dyn, f_dyn)`` with ``dyn`` the arguments to
    differentiate (checked to be floating point) and ``f_dyn(*dyn)`` calling ``f``."""
    single, nums = _normalize_argnums(f, argnums, len(args))
    _check_float_inputs(f, args, nums, where.split("(", 1)[0])
    dyn = tuple(args[i] for i in nums)
    return single, nums, dyn, _dyn_function(f, args, kwargs, nums)


def jacfwd(f, argnums=0, has_aux=False):
    """The Jacobian of ``f`` by forward mode (``vmap`` of ``jvp`` over the input basis).

    Returns a function giving, for each output leaf, a pytree like the differentiated
    argument(s) whose leaves have shape ``out.shape + in.shape``.
    """
    _check_callable(f, "jacfwd")
    return _jacfwd(f, argnums, has_aux, f"jacfwd({_fun_name(f)})")


def _jacfwd(f, argnums, has_aux, where, name=None):
    """:func:`jacfwd` whose errors and traces are named ``where``."""

    @_with_context(where, f, name)
    def jac(*args, **kwargs):
        from cuvmap.lax import indexing, shape as lax_shape

        single, nums, dyn, f_dyn = _differentiated_args(f, args, kwargs, argnums, where)
        in_leaves, in_tree = tree.flatten(dyn)
        basis, sizes = _std_basis(in_leaves)

        def pushfwd(*basis_leaves):
            res = _jvp(f_dyn, dyn, tree.unflatten(in_tree, list(basis_leaves)), has_aux, where)
            return res[1:] if has_aux else res[1]

        # aux is computed from the primals only, so it is unbatched (out_axes None)
        pushed = _vmap(pushfwd, 0, (-1, None) if has_aux else -1, None, None, where)(*basis)
        aux = None
        if has_aux:
            pushed, aux = pushed
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


def jacrev(f, argnums=0, has_aux=False):
    """The Jacobian of ``f`` by reverse mode (``vmap`` of the VJP over the output basis).

    Same output structure as :func:`jacfwd`: for each output leaf, a pytree like the
    differentiated argument(s) with leaves of shape ``out.shape + in.shape``.
    """
    _check_callable(f, "jacrev")
    return _jacrev(f, argnums, has_aux, f"jacrev({_fun_name(f)})")


def _jacrev(f, argnums, has_aux, where, name=None):
    """:func:`jacrev` whose errors and traces are named ``where``."""

    @_with_context(where, f, name)
    def jac(*args, **kwargs):
        from cuvmap.lax import indexing, shape as lax_shape

        single, nums, dyn, f_dyn = _differentiated_args(f, args, kwargs, argnums, where)
        out, vjp_fun, aux = _vjp(
            f_dyn, dyn, has_aux, where, lambda path: _describe_arg(f, (0, nums[path[0]]) + tuple(path[1:]))
        )
        out_leaves, out_tree = tree.flatten(out)
        for o in out_leaves:
            if not core.is_float(o):
                raise TransformError(f"output of dtype {core.dtype_of(o)}: jacrev needs floating-point outputs")
        basis, sizes = _std_basis(out_leaves)
        cts = _vmap(lambda *b: vjp_fun(tree.unflatten(out_tree, list(b))), 0, 0, None, None, where)(*basis)
        ct_leaves, ct_tree = tree.flatten(cts)
        jac_leaves = []
        offset = 0
        for o, n in zip(out_leaves, sizes):
            out_shape = core.shape_of(o)
            per_input = []
            for c in ct_leaves:
                piece = indexing.slice_in_dim(c, offset, offset + n, 0)
                per_input.append(lax_shape.reshape(piece, out_shape + core.shape_of(c)[1:]))
            sub = tree.unflatten(ct_tree, per_input)
            jac_leaves.append(sub[0] if single else sub)
            offset += n
        result = tree.unflatten(out_tree, jac_leaves)
        return (result, aux) if has_aux else result

    return jac


def hessian(f, argnums=0):
    """``jacfwd(jacrev(f))``: the matrix of second derivatives of a scalar ``f``
    (shape ``in.shape + in.shape`` for one array argument)."""
    _check_callable(f, "hessian")
    where = f"hessian({_fun_name(f)})"
    return _jacfwd(_jacrev(f, argnums, False, where, name=_fun_name(f)), argnums, False, where)


def stop_gradient(x):
    """Treats every leaf of ``x`` as a constant for the derivative transforms."""
    from cuvmap.lax import elementwise

    return tree.map(elementwise.stop_gradient, x)


# ---------------------------------------------------------------------------------------
# Staging: jit, make_jaxpr
# ---------------------------------------------------------------------------------------


class RetraceWarning(UserWarning):
    """A jitted function was traced again and again (new shapes, dtypes or static values
    on most calls), so it pays tracing far more often than it runs a cached program."""


# A jitted function warns (once) when it has been traced this many times; None: never.
JIT_RETRACE_WARNING = 20


def _normalize_static(f, static_argnums, static_argnames, donate_argnums, where):
    def ints(value, what):
        value = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
        if any(not _is_int(v) for v in value):
            raise TransformError(f"{where}: {what} must be an int or a tuple of ints, got {value!r}")
        return tuple(int(v) for v in value)

    static_argnums = ints(static_argnums, "static_argnums")
    donate_argnums = ints(donate_argnums, "donate_argnums")
    static_argnames = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    if any(not isinstance(n, str) for n in static_argnames):
        raise TransformError(f"{where}: static_argnames must be a str or a tuple of str, got {static_argnames!r}")
    # as in JAX, a name given in static_argnames is static positionally too, and vice versa
    names = _param_names(f)
    nums = set(static_argnums) | {names.index(n) for n in static_argnames if n in names}
    argnames = set(static_argnames) | {names[i] for i in static_argnums if 0 <= i < len(names)}
    return nums, argnames, set(donate_argnums)


def _static_key(f, where, statics):
    """The static values as a hashable key; a clear error for unhashable ones."""
    for what, value in statics:
        try:
            hash(value)
        except TypeError:
            raise TransformError(
                f"static {what} is a {type(value).__name__} ({value!r}), which is not "
                "hashable: jit caches its programs by the static values; pass a tuple (or another "
                "hashable value), or make it a traced argument"
            ) from None
    return tuple((what, type(value), value) for what, value in statics)


def _leaf_aval(f, path, leaf, where):
    if isinstance(leaf, Tracer):
        return leaf.aval
    if type(leaf) in core._PY_SCALAR_DTYPES:
        return core.get_aval(leaf)
    if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
        raise TransformError(
            f"{_describe_arg(f, path)} is a {type(leaf).__name__}, which jit cannot trace; "
            "pass arrays, Python numbers or pytrees of them, or mark it static with "
            "static_argnums/static_argnames"
        )
    if isinstance(leaf, np.generic):
        leaf = np.asarray(leaf)
    return core.get_aval(leaf)


class _Staged:
    """A cache entry of a jitted function: the program, the output structure, and the
    executor's plans (made on the first eager run, with the donated arguments; one per
    combination of the jit settings)."""

    __slots__ = ("program", "out_tree", "plans", "donated")

    def __init__(self, program, out_tree, donated):
        self.program = program
        self.out_tree = out_tree
        self.plans = {}
        self.donated = donated


def _stage(f, where, args, kwargs, static_nums, static_names):
    """Splits the arguments into static and traced ones. Returns ``(key, leaves, paths,
    avals, rebuild)``: the cache key, the traced leaves with their paths (in the user's
    numbering of positional arguments) and avals, and ``rebuild(traced_leaves)``, which
    gives ``f``'s arguments back."""
    # as in JAX, a static position beyond the positional arguments given is ignored (the
    # argument may come by keyword, with static_argnames, or take its default)
    nums = {i % len(args) for i in static_nums if -len(args) <= i < len(args)}
    statics = [(f"argument {i}", args[i]) for i in sorted(nums)]
    statics += [(f"keyword argument {k}", kwargs[k]) for k in sorted(kwargs) if k in static_names]
    key_static = _static_key(f, where, statics)
    dyn_args = tuple(a for i, a in enumerate(args) if i not in nums)
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_names}
    paths, leaves, treedef = tree.flatten_with_path((dyn_args, dyn_kwargs))
    # paths in the user's numbering of positional arguments
    dyn_positions = [i for i in range(len(args)) if i not in nums]
    user_paths = [(0, dyn_positions[p[1]]) + tuple(p[2:]) if p[0] == 0 else p for p in paths]
    avals = [_leaf_aval(f, p, x, where) for p, x in zip(user_paths, leaves)]

    def rebuild(traced):
        d_args, d_kwargs = tree.unflatten(treedef, list(traced))
        it = iter(d_args)
        full = [args[i] if i in nums else next(it) for i in range(len(args))]
        full_kwargs = dict(d_kwargs)
        full_kwargs.update({k: v for k, v in kwargs.items() if k in static_names})
        return full, full_kwargs

    key = (treedef, tuple(avals), key_static)
    return key, leaves, user_paths, avals, rebuild


def _trace_program(f, where, leaves, paths, avals, rebuild):
    """Stages ``f`` on ``avals``. Returns ``(ClosedJaxpr, out_tree)``."""
    from cuvmap.transforms import staging

    out_tree_box = []

    def flat_fun(*traced):
        full, full_kwargs = rebuild(traced)
        out = f(*full, **full_kwargs)
        out_paths, out_leaves, out_tree = tree.flatten_with_path(out)
        for path, leaf in zip(out_paths, out_leaves):
            if not (isinstance(leaf, Tracer) or hasattr(leaf, "shape") or type(leaf) in core._PY_SCALAR_DTYPES):
                raise TransformError(
                    f"{_describe_out(path)} of {_fun_name(f)} is a {type(leaf).__name__}; a jitted "
                    "function returns arrays, Python numbers or pytrees of them"
                )
        out_tree_box.append(out_tree)
        return out_leaves

    origins = [_describe_arg(f, p) for p in paths]
    closed = staging.trace_to_jaxpr(flat_fun, avals, name=where, origins=origins)
    return closed, out_tree_box[0]


def make_jaxpr(f, static_argnums=(), static_argnames=()):
    """The program ``jit`` would stage for ``f``: ``make_jaxpr(f)(*args)`` returns a
    :class:`~cuvmap.transforms.ir.ClosedJaxpr`, which prints in a text form close to
    JAX's, e.g. for ``make_jaxpr(cv.grad(lambda x: cnp.sin(x) * 2.0))(1.0)``::

        { lambda ; a:~f64[]. let
            b:f64[] = sin a
            c:f64[] = mul b 2.0
            ...
          in (e,) }

    (``~`` marks a weakly typed value: a Python scalar argument.)
    """
    _check_callable(f, "make_jaxpr")
    where = f"make_jaxpr({_fun_name(f)})"
    static_nums, static_names, _ = _normalize_static(f, static_argnums, static_argnames, (), where)

    @_with_context(where, f)
    def make(*args, **kwargs):
        _, leaves, paths, avals, rebuild = _stage(f, where, args, kwargs, static_nums, static_names)
        closed, _ = _trace_program(f, where, leaves, paths, avals, rebuild)
        return closed

    return make


def jit(f=None, static_argnums=(), static_argnames=(), donate_argnums=()):
    """Stages ``f`` into a program on its first call and runs that program afterwards.

    The first call with given argument structure, shapes, dtypes, weak types (Python
    scalars), devices and static values traces ``f`` on abstract values into a program
    (see :func:`make_jaxpr`), which is optimized (common subexpressions, constant folding,
    dead code) and planned (NOTE [buffer planning] in :mod:`cuvmap.transforms.executor`);
    later calls that match run the plan without tracing. ``jit`` composes with every
    transform in every order: ``vmap(jit(f))``, ``grad(jit(f))`` and ``jit(vmap(grad(f)))``
    stage programs of their own.

    Args:
      f: the function; its arguments and results are pytrees of arrays and Python numbers.
      static_argnums, static_argnames: arguments that are not traced but passed to ``f``
        as they are (Python configuration values: sizes, flags, strings); they must be
        hashable, and each new value traces again.
      donate_argnums: positional arguments whose buffers the program may overwrite (the
        caller must not use them afterwards).
    Returns:
      the jitted function; ``.trace_count`` says how many times it has traced.

    As in JAX, Python side effects (``print``, appending to a list) run while tracing
    only, not on the calls that reuse the program; Python control flow on traced values
    raises :class:`~cuvmap.core.ConcretizationError` (make the value static, or use
    ``cuvmap.numpy.where``). Arrays the function closes over are captured as constants of
    the program when it is traced. Used as ``@jit`` or ``@jit(static_argnums=...)``.
    """
    if f is None:
        return lambda g: jit(g, static_argnums, static_argnames, donate_argnums)
    _check_callable(f, "jit")
    where = f"jit({_fun_name(f)})"
    static_nums, static_names, donated_nums = _normalize_static(
        f, static_argnums, static_argnames, donate_argnums, where)
    cache = {}
    fast = {}  # NOTE [jit's fast path]
    no_statics = not static_nums and not static_names

    @_with_context(where, f)
    def jitted(*args, **kwargs):
        from cuvmap.transforms import executor, ir, staging

        if no_statics:
            leaves, treedef = tree.flatten((args, kwargs))
            signature = _fast_signature(leaves)
            entry = fast.get((treedef, signature)) if signature is not None else None
            if entry is not None and core._state.staging_main is None:
                outs = executor.execute(executor.plan_for(entry.plans, entry.program, entry.donated), leaves)
                return tree.unflatten(entry.out_tree, _unaliased([_to_array_result(o) for o in outs], leaves))
        key, leaves, paths, avals, rebuild = _stage(f, where, args, kwargs, static_nums, static_names)
        entry = cache.get(key)
        if entry is None:
            closed, out_tree = _trace_program(f, where, leaves, paths, avals, rebuild)
            program = ir.optimize(closed)
            donated = tuple(i for i, p in enumerate(paths) if p[0] == 0 and p[1] in donated_nums)
            entry = _Staged(program, out_tree, donated)
            jitted.trace_count += 1
            if not any(isinstance(c, Tracer) for c in program.consts):
                cache[key] = entry  # a program holding tracers of this call's transforms is for this call only
                if no_statics:
                    signature = _fast_signature(leaves)
                    if signature is not None:
                        fast[(key[0], signature)] = entry
            _warn_retraces(jitted, where)
        program = entry.program
        eager = core._state.staging_main is None and not any(isinstance(x, Tracer) for x in leaves) \
            and not any(isinstance(c, Tracer) for c in program.consts)
        if eager:
            outs = executor.execute(executor.plan_for(entry.plans, program, entry.donated), leaves)
        else:
            outs = staging.call(program, leaves)
        results = _unaliased([_to_array_result(o) for o in outs], leaves)
        return tree.unflatten(entry.out_tree, results)

    def clear_cache():
        cache.clear()
        fast.clear()

    jitted.trace_count = 0
    jitted.clear_cache = clear_cache
    return jitted


# NOTE [jit's fast path]
# A call of a jitted function that finds its program should cost little more than the
# program. The full lookup builds the arguments' avals and paths (for error messages) on
# every call; when the function has no static arguments and every argument leaf is a NumPy
# array or a Python number, the leaves' (shape, dtype) and scalar types determine the
# avals (NumPy arrays live on the CPU; Python numbers are weakly typed), so a second
# dictionary keyed by the pytree structure and that signature finds the entry directly.
# Anything else (CuPy arrays, whose device counts; tracers; NumPy scalars) takes the full
# lookup, which also fills the fast dictionary.


def _fast_signature(leaves):
    """The leaves' signature for NOTE [jit's fast path], or None when a leaf needs the full
    lookup."""
    signature = []
    for x in leaves:
        t = type(x)
        if t is np.ndarray:
            signature.append((x.shape, x.dtype))
        elif t in core._PY_SCALAR_DTYPES:
            signature.append(t)
        else:
            return None
    return tuple(signature)


def _warn_retraces(jitted, where):
    import warnings

    limit = JIT_RETRACE_WARNING
    if limit is not None and jitted.trace_count == limit:
        warnings.warn(
            f"{where} has been traced {limit} times: each new argument shape, dtype or static "
            "value traces it again (a batch size that changes every call, a Python number that "
            "should be an array); see its .trace_count",
            RetraceWarning, stacklevel=3,
        )
