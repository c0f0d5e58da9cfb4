"""Symbolic zeros for custom derivative rules (JAX's ``jax.custom_derivatives.SymbolicZero``,
``CustomVJPPrimal``, ``zero_from_primal``).

A rule defined with ``symbolic_zeros=True`` (``defjvp(rule, symbolic_zeros=True)``,
``defvjp(fwd, bwd, symbolic_zeros=True)``) is told which tangents and cotangents are zero
without being given arrays of zeros (NOTE [symbolic zeros in custom rules]).
"""
import numpy as np

from cuvmap import core, tree


# NOTE [symbolic zeros in custom rules]
# Inside the transforms a zero tangent or cotangent is ``None`` (NOTE [call primitives] in
# call.py): nothing is computed for an input that is not differentiated. A custom rule
# normally sees arrays of zeros there. With ``symbolic_zeros=True`` it sees a
# ``SymbolicZero`` instead: an object with the zero's shape and dtype (``.shape``,
# ``.dtype``, ``.aval``) and no value, so the rule can skip the work for it (``x_dot *
# y + x * y_dot`` without the term of a zero ``y_dot``). A JVP rule may return a
# ``SymbolicZero`` (or ``None``) for an output tangent that is zero; a ``bwd`` may return
# one (or ``None``) for a zero input cotangent. ``fwd`` gets each argument leaf as a
# ``CustomVJPPrimal(value, perturbed)``: ``perturbed`` says whether the cotangent of that
# leaf is wanted. Which tangents are zero depends on the transform (``grad`` with respect
# to ``x`` only: ``y``'s tangent is zero), never on values.
class SymbolicZero:
    """A tangent or cotangent known to be zero: its aval (shape and dtype), no value
    (``jax.custom_derivatives.SymbolicZero``). ``.shape``, ``.dtype``, ``.ndim``,
    ``.size`` are the aval's; :meth:`instantiate` makes the array of zeros."""

    __slots__ = ("aval",)

    def __init__(self, aval):
        self.aval = aval

    shape = property(lambda self: self.aval.shape)
    dtype = property(lambda self: self.aval.dtype)
    weak_type = property(lambda self: self.aval.weak_type)
    ndim = property(lambda self: len(self.aval.shape))
    size = property(lambda self: int(np.prod(self.aval.shape, dtype=np.int64)))

    def __repr__(self):
        return f"SymbolicZero({self.aval})"

    @staticmethod
    def from_primal_value(value):
        """The zero tangent of ``value``: its shape and dtype."""
        return SymbolicZero(tangent_aval(value))

    def instantiate(self):
        """The zeros themselves, an array of the aval's shape and dtype."""
        return core.zeros_like_aval(self.aval)


def tangent_aval(value):
    """The aval of ``value``'s tangent: its shape and dtype (integer values keep theirs:
    cuvmap gives them zero tangents of their own dtype), never weakly typed."""
    aval = core.get_aval(value)
    return core.ShapedArray(aval.shape, aval.dtype, False, aval.device)


def zero_from_primal(value, symbolic_zeros=False):
    """The zero tangent of each leaf of the pytree ``value``: a :class:`SymbolicZero`
    with ``symbolic_zeros=True``, else an array of zeros
    (``jax.custom_derivatives.zero_from_primal``)."""
    if symbolic_zeros:
        return tree.map_preserving(SymbolicZero.from_primal_value, value)
    return tree.map_preserving(lambda x: core.zeros_like_aval(tangent_aval(x)), value)


def is_zero(x):
    """Whether ``x`` is a zero that a rule returned symbolically (``None`` or a
    :class:`SymbolicZero`)."""
    return x is None or type(x) is SymbolicZero


def instantiate(x, like):
    """``x``, or zeros of ``like``'s shape and dtype if ``x`` is a symbolic zero."""
    if x is None:
        return core.zeros_like_aval(tangent_aval(like))
    if type(x) is SymbolicZero:
        return x.instantiate()
    return x


class CustomVJPPrimal:
    """An argument leaf as the ``fwd`` rule of ``defvjp(..., symbolic_zeros=True)`` sees
    it: ``value`` the primal, ``perturbed`` whether its cotangent is wanted
    (``jax.custom_derivatives.CustomVJPPrimal``)."""

    __slots__ = ("value", "perturbed")

    def __init__(self, value, perturbed):
        self.value = value
        self.perturbed = perturbed

    def __repr__(self):
        return f"CustomVJPPrimal(value={self.value!r}, perturbed={self.perturbed})"


def custom_vjp_primal_tree_values(pytree):
    """The values of a pytree of :class:`CustomVJPPrimal` leaves (what ``fwd`` got with
    ``symbolic_zeros=True``) as the pytree of the plain arguments
    (``jax.custom_derivatives.custom_vjp_primal_tree_values``)."""
    def value(leaf):
        if type(leaf) is not CustomVJPPrimal:
            raise TypeError(f"custom_vjp_primal_tree_values: expected CustomVJPPrimal leaves, got a "
                            f"{type(leaf).__name__}")
        return leaf.value

    return tree.map_preserving(value, pytree)
