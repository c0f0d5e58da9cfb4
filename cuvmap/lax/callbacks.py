"""Host callbacks inside transformed functions: ``debug_callback_p``, the primitive of
``cuvmap.debug.callback`` and ``cuvmap.debug.print``.

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

from cuvmap import core, tree
from cuvmap.core import Primitive, ShapedArray
from cuvmap.lax import indexing, shape as lax_shape
from cuvmap.transforms import batching

# ---------------------------------------------------------------------------------------
# Declaration
# ---------------------------------------------------------------------------------------


def _token_shape_rule(*operands, callback):
    return ShapedArray((), np.dtype(np.bool_))


def _debug_callback_impl(*operands, callback):
    callback(operands)
    return np.zeros((), np.bool_)


debug_callback_p = Primitive("debug_callback", differentiable=False, effectful=True,
                             impl=_debug_callback_impl, shape_rule=_token_shape_rule)


# ---------------------------------------------------------------------------------------
# Public wrapper
# ---------------------------------------------------------------------------------------


class HostCallback:
    """The ``callback`` parameter: ``fn`` and the structure of its arguments. Called with
    the operands (the array leaves), it rebuilds ``fn``'s arguments around them and calls
    it. Hashable by identity (one call site, one parameter)."""

    __slots__ = ("fn", "treedef", "operand_at", "static_leaves")

    def __init__(self, fn, treedef, operand_at, static_leaves):
        self.fn = fn
        self.treedef = treedef
        self.operand_at = operand_at
        self.static_leaves = static_leaves

    def __call__(self, operands):
        leaves = list(self.static_leaves)
        for i, value in zip(self.operand_at, operands):
            leaves[i] = value
        args, kwargs = tree.unflatten(self.treedef, leaves)
        self.fn(*args, **kwargs)

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
