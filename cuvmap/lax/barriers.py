"""``optimization_barrier``: the identity on a pytree, kept as equations of the staged
program (``jax.lax.optimization_barrier``).

Each leaf goes through :data:`optimization_barrier_p`, the identity with every rule: its
batching rule maps it elementwise, its JVP applies it to the tangent and its transpose to
the cotangent, so the barrier stays in derived programs too. In JAX it stops XLA from
moving computations across it (rematerialisation uses it to keep a recomputation after
the values it waits for); cuvmap's staged programs are run in the order they were traced,
and the primitive is never a member of a fused kernel, so the barrier keeps the values
on each side apart as JAX's does. Values are never changed.
"""
from cuvmap import core, tree
from cuvmap.core import Primitive, ShapedArray
from cuvmap.transforms import batching, complex_rules, vjp

# ---------------------------------------------------------------------------------------
# optimization_barrier
# ---------------------------------------------------------------------------------------

optimization_barrier_p = Primitive("optimization_barrier")


def optimization_barrier(operand):
    """``operand`` (an array or a pytree of arrays) unchanged, each leaf behind a barrier
    equation (JAX's ``jax.lax.optimization_barrier``): ``optimization_barrier(x) = x``,
    with derivative the identity (``d/dx = I``) and ``vmap`` mapping it leaf by leaf.

    Example::

        a, b = cuvmap.lax.optimization_barrier((cnp.sin(x), y))
    """
    return tree.map_preserving(lambda leaf: optimization_barrier_p.bind(leaf) if core.is_value(leaf) else leaf,
                               operand)


def _optimization_barrier_shape_rule(x):
    return ShapedArray(x.shape, x.dtype, x.weak_type, x.device)


def _optimization_barrier_impl(x):
    return x


optimization_barrier_p.shape_rule = _optimization_barrier_shape_rule
optimization_barrier_p.impl = _optimization_barrier_impl

# batching: elementwise; JVP: the barrier of the tangent; transpose: the barrier of the cotangent
batching.defunary(optimization_barrier_p)
vjp.deflinear(optimization_barrier_p, lambda ct, x: optimization_barrier_p.bind(ct))
complex_rules.defcomplex(optimization_barrier_p)  # the identity: linear, no conjugate
