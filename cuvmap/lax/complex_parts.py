"""``real`` and ``conj``: the two complex-number primitives the norms of complex arrays need
(``cuvmap.numpy.linalg.norm``: ``|z|² = real(z · conj(z))``), with JAX's rules.

``real(z)`` is ℝ-linear: its JVP is ``real(ż)`` and its transpose (JAX's ``real_p``
transpose) turns a real cotangent ``c`` into the complex cotangent ``c + 0i``.
``conj(z)`` is ℝ-linear too: its JVP is ``conj(ż)`` and its transpose ``conj(c)``.
With these transposes and ``mul``'s ``c · y`` (no conjugation), the gradient of a real
``f(z)``, ``z = x + iy``, comes out as ``∂f/∂x − i ∂f/∂y``: JAX's convention (for
``|z|²``: ``2 conj(z)``). On real operands both are the identity.
"""
import numpy as np

from cuvmap.core import Primitive, ShapedArray
from cuvmap.lax.elementwise import convert_element_type
from cuvmap.transforms import batching, vjp

real_p = Primitive("real")
conj_p = Primitive("conj")


def _real_dtype(dtype):
    return np.empty(0, dtype).real.dtype


def real(x):
    """The real part (JAX's ``lax.real``), of a real dtype; real operands pass unchanged."""
    return real_p.bind(x)


def conj(x):
    """The complex conjugate (JAX's ``lax.conj``); real operands pass unchanged."""
    return conj_p.bind(x)


def _real_shape_rule(x):
    return ShapedArray(x.shape, _real_dtype(x.dtype))


def _real_impl(x):
    return x.real.copy() if x.dtype.kind == "c" else x


def _conj_impl(x):
    return x.conj() if x.dtype.kind == "c" else x


def _real_transpose(ct, x):
    """A real cotangent ``c`` as the complex ``c + 0i`` (for a complex operand)."""
    if x.dtype.kind != "c":
        return ct
    return convert_element_type(ct, x.dtype)


real_p.impl = _real_impl
real_p.shape_rule = _real_shape_rule
conj_p.impl = _conj_impl
conj_p.shape_rule = lambda x: ShapedArray(x.shape, x.dtype)
batching.defunary(real_p, conj_p)
vjp.deflinear(real_p, _real_transpose)
vjp.deflinear(conj_p, lambda ct, x: conj(ct))

__all__ = ["conj", "conj_p", "real", "real_p"]
