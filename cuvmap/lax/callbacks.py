"""Host callbacks inside transformed functions: ``debug_callback_p``, the primitive of
``cuvmap.debug.callback`` and ``cuvmap.debug.print``, and ``pure_callback_p``, the
primitive of :func:`pure_callback` (NOTE [pure callbacks]).

NOTE [debug callbacks]
``debug.callback(fn, *args)`` calls ``fn`` with the concrete values of ``args`` every time
the function runs, whatever the transforms around it (as ``jax.debug.callback``):

- eagerly, at once;
- under ``jit``, on every call of the jitted function, never while it traces: the
  primitive is ``effectful`` (a fact of :class:`cuvmap.core.Primitive`), so the staged
  program keeps its equation in place although nothing reads its result (no dead-code
  elimination, common subexpressions or constant folding touch it);
- under ``grad``, ``jvp`` and the other derivatives, with the primal values (it is not
  differentiable: the derivative transforms pass it through);
- under ``vmap``, once per example, in order (JAX's default, "sequential"): the batching
  rule calls it on each example's slice of the batched operands — a Python loop over the
  batch, which a debugging aid may pay.

Its result is a token (a boolean 0-d array) that nothing needs; the user-facing functions
drop it. The operands are the array leaves of ``args``; everything else in them (strings,
None, Python objects) travels in the ``callback`` parameter.
"""
import numpy as np

from cuvmap import api_util, backend, core, tree
from cuvmap.core import CuvmapError, MissingRuleError, Primitive, ShapedArray
from cuvmap.lax import indexing, shape as lax_shape
from cuvmap.transforms import batching, ir
from cuvmap.transforms.call import CallPrimitive

# ---------------------------------------------------------------------------------------
# Declaration
# ---------------------------------------------------------------------------------------


def _token_shape_rule(*operands, callback):
    return ShapedArray((), np.dtype(np.bool_))


def _debug_callback_impl(*operands, callback):
    callback(operands)
    return np.zeros((), np.bool_)


# host_sync: the callback runs in Python on every run, so a program with it is never
# captured as a CUDA graph (a replay would skip it)
debug_callback_p = Primitive("debug_callback", differentiable=False, effectful=True, host_sync=True,
                             impl=_debug_callback_impl, shape_rule=_token_shape_rule)


# ---------------------------------------------------------------------------------------
# Public wrapper
# ---------------------------------------------------------------------------------------


class HostCallback:
    """The ``callback`` parameter: ``fn`` and the structure of its arguments (and, for a
    pure callback, of its result: ``out_tree``). Called with the operands (the array
    leaves), it rebuilds ``fn``'s arguments around them, calls it and returns its result.
    Hashable by identity (one call site, one parameter)."""

    __slots__ = ("fn", "treedef", "operand_at", "static_leaves", "out_tree")

    def __init__(self, fn, treedef, operand_at, static_leaves, out_tree=None):
        self.fn = fn
        self.treedef = treedef
        self.operand_at = operand_at
        self.static_leaves = static_leaves
        self.out_tree = out_tree

    @property
    def name(self):
        return api_util.fun_name(self.fn)

    __name__ = name  # how a program's text shows it

    def __call__(self, operands):
        leaves = list(self.static_leaves)
        for i, value in zip(self.operand_at, operands):
            leaves[i] = value
        args, kwargs = tree.unflatten(self.treedef, leaves)
        return self.fn(*args, **kwargs)

    def __repr__(self):
        return f"<{getattr(self.fn, '__name__', type(self.fn).__name__)}>"


def debug_callback(fn, args, kwargs):
    """Binds :data:`debug_callback_p` for ``fn(*args, **kwargs)`` (NOTE [debug callbacks])."""
    leaves, treedef = tree.flatten((tuple(args), dict(kwargs)))
    operand_at = tuple(i for i, x in enumerate(leaves) if core.is_value(x))
    static_leaves = tuple(None if i in operand_at else x for i, x in enumerate(leaves))
    callback = HostCallback(fn, treedef, operand_at, static_leaves)
    debug_callback_p.bind(*(leaves[i] for i in operand_at), callback=callback)


# ---------------------------------------------------------------------------------------
# Batching rule (no derivative rules: not differentiable, passed through)
# ---------------------------------------------------------------------------------------


def _example(x, d, i):
    """Example ``i`` of ``x`` batched along ``d``."""
    return lax_shape.squeeze(indexing.slice_in_dim(x, i, i + 1, d), (d,))


def _debug_callback_batch(axis_size, vals, dims, *, callback):
    """One call per example, in order (JAX's "sequential"), each with that example's slice
    of the batched operands."""
    for i in range(axis_size):
        example = [v if d is batching.not_mapped else _example(v, d, i) for v, d in zip(vals, dims)]
        debug_callback_p.bind(*example, callback=callback)
    return np.zeros((), np.bool_), batching.not_mapped


batching.primitive_batchers[debug_callback_p] = _debug_callback_batch


# ---------------------------------------------------------------------------------------
# pure_callback
# ---------------------------------------------------------------------------------------

# NOTE [pure callbacks]
# ``pure_callback(fn, result_shape_dtypes, *args)`` calls a Python function of arrays (a
# SciPy routine, a simulator) from inside transformed code, as ``jax.pure_callback``: it
# states the shapes and dtypes of ``fn``'s results, so staging needs no call, and ``fn``
# runs with the concrete operands (NumPy or CuPy arrays, as they are) whenever the program
# runs. ``fn`` must be a pure function: a program may drop a call whose results nobody
# reads and merge two equal ones (nothing keeps it as it keeps a debug callback). Its
# results are checked against the declared shapes and dtypes and put on the operands'
# device. The rules:
#
# - vmap: ``vmap_method`` says how a batch reaches ``fn`` (JAX's choices): "sequential",
#   one call per example, in order, results stacked; "expand_dims", one call with every
#   batched operand's batch dim moved to the front and a dim of size 1 there in the
#   unbatched ones; "broadcast_all", one call with every operand broadcast to the batch at
#   the front. In the last two ``fn`` must return its results with the batch at the front.
#   Without ``vmap_method`` vmap raises, as in JAX: only the user knows whether ``fn``
#   handles a batch. Nested vmaps apply their methods one after the other (with
#   "expand_dims", the outer batch dim is in front of the inner one).
# - jvp, grad, linearize: cuvmap cannot know the derivative of a Python function, so they
#   raise, naming custom_jvp and custom_vjp: the derivative goes in a rule of a custom
#   function around the call (the rule may call pure_callback too).
# - jit: one equation, ``pure_callback[callback=<fn> ...]``, whose callback runs on every
#   run of the program (host_sync: never captured as a CUDA graph).


class CallbackError(CuvmapError, ValueError):
    """A pure callback returned results other than the shapes, dtypes and structure its
    ``result_shape_dtypes`` declared."""


VMAP_METHODS = ("sequential", "expand_dims", "broadcast_all")


class PureCallbackPrimitive(CallPrimitive):
    """``pure_callback[callback result_avals vmap_method]``: calls ``callback`` on the
    operands; one result per aval of ``result_avals`` (NOTE [pure callbacks])."""

    __slots__ = ()
    what = "a pure_callback"
    host_sync = True  # the callback runs in Python on every run: no CUDA graph replay

    def run(self, *args, callback, result_avals, vmap_method):
        """Eval: calls the callback and checks its results."""
        return _checked_results(callback, callback(args), result_avals, _device_of(args, result_avals))

    def out_avals(self, params):
        return list(params["result_avals"])

    def batch(self, axis, vals, dims, params):
        """vmap: as ``vmap_method`` says (NOTE [pure callbacks])."""
        method, size = params["vmap_method"], axis.size
        if method is None:
            raise MissingRuleError(
                f"vmap of pure_callback({params['callback'].name}) needs a vmap_method: pass "
                "vmap_method='sequential' (one call per example) or 'expand_dims' / 'broadcast_all' (one call "
                "on the whole batch, which the callback must handle)")
        if method == "sequential":
            return _sequential(self, size, vals, dims, params), [0] * len(params["result_avals"])
        if method == "expand_dims":
            vals = [lax_shape.expand_dims(v, (0,)) if d is batching.not_mapped else batching.move_bdim(v, d, 0)
                    for v, d in zip(vals, dims)]
        else:  # "broadcast_all"
            vals = [batching.bdim_at_front(v, d, size) for v, d in zip(vals, dims)]
        avals = tuple(ShapedArray((size,) + a.shape, a.dtype, False, a.device) for a in params["result_avals"])
        outs = self.bind(*vals, **dict(params, result_avals=avals))
        return outs, [0] * len(outs)

    def jvp(self, primals, tangents, params):
        raise _no_derivative(params, "jvp")

    def vjp(self, primals, needs_ct, params):
        raise _no_derivative(params, "grad/vjp")

    def partial_eval(self, trace, args, params):
        raise _no_derivative(params, "linearize")

    def dce(self, params, used_outputs):
        return None  # one call computes every result


pure_callback_p = PureCallbackPrimitive("pure_callback")


def pure_callback(callback, result_shape_dtypes, *args, vmap_method=None, **kwargs):
    """Calls ``callback(*args, **kwargs)``, a pure Python function of arrays, from inside
    transformed code (``jax.pure_callback``; NOTE [pure callbacks]).

    Args:
      callback: a pure function; it gets the array leaves of ``args`` and ``kwargs`` as
        NumPy or CuPy arrays (as the operands are) and returns arrays, or Python numbers,
        of the declared shapes and dtypes, in the structure of ``result_shape_dtypes``.
      result_shape_dtypes: a pytree of :class:`~cuvmap.ShapeDtypeStruct` (or anything
        with ``shape`` and ``dtype``) describing the results.
      args, kwargs: pytrees of arrays and Python numbers.
      vmap_method: how ``vmap`` calls it: ``"sequential"``, ``"expand_dims"`` or
        ``"broadcast_all"`` (as in JAX); None: ``vmap`` raises.
    Returns:
      the results on the operands' device, in the structure of ``result_shape_dtypes``.

    Differentiating through it raises; put it inside a :func:`cuvmap.custom_jvp` or
    :func:`cuvmap.custom_vjp` function whose rule gives the derivative. Example::

        def host_sinc(x):
            return np.sinc(x)                  # any NumPy/SciPy code

        y = cv.vmap(lambda x: cv.pure_callback(host_sinc, cv.ShapeDtypeStruct(x.shape, x.dtype), x,
                                               vmap_method="expand_dims"))(xs)
    """
    if not callable(callback):
        raise TypeError(f"pure_callback: callback must be callable, got {type(callback).__name__}")
    if vmap_method is not None and vmap_method not in VMAP_METHODS:
        raise ValueError(f"pure_callback: vmap_method must be one of {', '.join(map(repr, VMAP_METHODS))} or None, "
                         f"got {vmap_method!r}")
    name = api_util.fun_name(callback)
    out_paths, out_leaves, out_tree = tree.flatten_with_path(result_shape_dtypes)
    result_avals = []
    for path, leaf in zip(out_paths, out_leaves):
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            raise TypeError(f"pure_callback({name}): result_shape_dtypes{tree.keystr(path)} is a "
                            f"{type(leaf).__name__}; give a cv.ShapeDtypeStruct(shape, dtype) (or an array) per result")
        device = getattr(leaf, "device", None)
        device = device if isinstance(device, str) and device.startswith("gpu") else None
        result_avals.append(ShapedArray(tuple(leaf.shape), leaf.dtype, False, device))
    paths, leaves, treedef = tree.flatten_with_path((tuple(args), dict(kwargs)))
    for path, leaf in zip(paths, leaves):
        if not core.is_value(leaf):
            raise TypeError(f"pure_callback({name}): {api_util.describe_arg(callback, path)} is a "
                            f"{type(leaf).__name__}; its arguments are arrays, Python numbers or pytrees of them "
                            "(bind other values into the callback with functools.partial)")
    host = HostCallback(callback, treedef, tuple(range(len(leaves))), (None,) * len(leaves), out_tree)
    outs = pure_callback_p.bind(*leaves, callback=host, result_avals=tuple(result_avals), vmap_method=vmap_method)
    return tree.unflatten(out_tree, outs)


def _device_of(args, result_avals):
    """Where the results go: the operands' device, else the one declared, else the CPU."""
    for x in args:
        device = backend.device_of(x)
        if device is not None:
            return device
    return next((a.device for a in result_avals if a.device), "cpu")


def _to_device(x, device):
    if device == "cpu":
        return x.get() if backend.is_cupy_array(x) else np.asarray(x)
    cp = backend.xp_for("gpu")
    with cp.cuda.Device(int(device.split(":")[1])):
        return cp.asarray(x)


def _checked_results(callback, result, result_avals, device):
    """The callback's results as arrays on ``device``; :class:`CallbackError` unless they
    have the declared structure, shapes and dtypes."""
    paths, leaves, out_tree = tree.flatten_with_path(result)
    if out_tree != callback.out_tree:
        raise CallbackError(f"pure_callback({callback.name}) returned {tree.describe(result)} (structure "
                            f"{out_tree}), but result_shape_dtypes has the structure {callback.out_tree}")
    outs = []
    for path, leaf, aval in zip(paths, leaves, result_avals):
        x = _to_device(leaf, device)
        if tuple(x.shape) != aval.shape or x.dtype != aval.dtype:
            raise CallbackError(
                f"pure_callback({callback.name}) returned {ir.pp_aval(ShapedArray(x.shape, x.dtype))} as result"
                f"{tree.keystr(path)}, but result_shape_dtypes declares {ir.pp_aval(aval)}")
        outs.append(x)
    return outs


def _sequential(primitive, size, vals, dims, params):
    """vmap_method="sequential": one bind per example, in order, the results stacked."""
    per_example = []
    for i in range(size):
        example = [v if d is batching.not_mapped else _example(v, d, i) for v, d in zip(vals, dims)]
        per_example.append(primitive.bind(*example, **params))
    outs = []
    for j, aval in enumerate(params["result_avals"]):
        if size == 0:
            witness = next(v for v, d in zip(vals, dims) if d is not batching.not_mapped)
            zero = core.full_like_concrete(witness, 0, shape=(), dtype=aval.dtype)
            outs.append(lax_shape.broadcast_in_dim(zero, (0,) + aval.shape, ()))
        else:
            outs.append(lax_shape.concatenate([lax_shape.expand_dims(r[j], (0,)) for r in per_example], 0))
    return outs


def _no_derivative(params, transform):
    return MissingRuleError(
        f"{transform} cannot differentiate through pure_callback({params['callback'].name}): the derivative of a "
        "Python callback is unknown. Wrap the function that calls pure_callback in cv.custom_jvp or "
        "cv.custom_vjp and give its derivative there (the rule may call pure_callback too)")
