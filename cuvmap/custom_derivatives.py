"""``cuvmap.custom_derivatives``: the names of ``jax.custom_derivatives`` in one module.

Re-exports only: :func:`custom_jvp`, :func:`custom_vjp` and the call primitives live in
:mod:`cuvmap.transforms.custom_derivatives`, :class:`SymbolicZero`,
:class:`CustomVJPPrimal`, :func:`zero_from_primal` and
:func:`custom_vjp_primal_tree_values` in :mod:`cuvmap.transforms.symbolic_zeros`, and
:func:`custom_gradient` and :func:`closure_convert` in
:mod:`cuvmap.transforms.custom_gradient`.
"""
from cuvmap.transforms.custom_derivatives import (  # noqa: F401
    CustomDerivativeError, custom_jvp, custom_jvp_call_p, custom_vjp, custom_vjp_call_p,
)
from cuvmap.transforms.custom_gradient import closure_convert, custom_gradient  # noqa: F401
from cuvmap.transforms.symbolic_zeros import (  # noqa: F401
    CustomVJPPrimal, SymbolicZero, custom_vjp_primal_tree_values, zero_from_primal,
)

__all__ = [  # (the call primitives are importable too, as in JAX, but are internals: not listed)
    "CustomDerivativeError", "CustomVJPPrimal", "SymbolicZero", "closure_convert", "custom_gradient", "custom_jvp",
    "custom_vjp", "custom_vjp_primal_tree_values", "zero_from_primal",
]
