"""What the elementwise families share: their shape rules (NumPy's broadcasting and NEP 50
promotion), the constructor of an elementwise primitive (:func:`_nary`) and the C
expressions that fused kernels compute (NOTE [fused expressions]).
"""
import builtins

import numpy as np

from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.core.bfloat16 import kind_of, result_type
from cuvmap.transforms.fusion import CExpression


def _dtype_operand(aval):
    """What ``np.result_type`` needs to apply NEP 50: a Python scalar for weak avals."""
    if aval.weak_type:
        return {"b": False, "i": 0, "u": 0, "f": 0.0, "c": 0j}[kind_of(aval.dtype)]
    return aval.dtype


def broadcast_shapes(*shapes):
    """The shape that ``shapes`` broadcast to under NumPy's rules (dims aligned at the end, a
    1 stretches); a :class:`~cuvmap.core.ShapeError` (a ValueError) when they do not.
    JAX: ``jax.lax.broadcast_shapes``; a shape that is not a sequence of non-negative ints
    raises TypeError, as there."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except (TypeError, ValueError):
        _check_shapes(shapes)
        raise ShapeError(
            "shapes " + ", ".join(str(tuple(s)) for s in shapes) + " do not broadcast"
        ) from None


def _check_shapes(shapes):
    """JAX's TypeErrors for what is not a shape (met only after NumPy refused the shapes)."""
    for shape in shapes:
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
            raise TypeError(f"broadcast_shapes: Shapes must be 1D sequences of integers, got {shape!r}")
        if any(isinstance(d, (int, np.integer)) and d < 0 for d in shape):
            raise TypeError(f"broadcast_shapes: Only non-negative indices are allowed in a shape, got {tuple(shape)}")


# NOTE [weak types of mixed operands]
# JAX's promotion lattice has a weak type per kind (``i*``, ``f*``, ``c*``: a Python
# number's) below every strong dtype of that kind, and every integer dtype below ``f*``.
# So a weak operand of a higher kind than every strong operand lifts the result to its
# kind and the result stays weak: ``int32_array + 1.5`` is a weak float (NEP 50 gives
# float64, cuvmap's default float, as JAX's x64 mode does), and ``(int32_array + 1.5) *
# float32_array`` is float32 — the weak value takes the strong dtype, as a Python number
# would. A weak complex over a strong float gives the strong complex of its precision
# (``float32_array * 1j`` is complex64), as in JAX. Only integer and boolean strong
# operands leave the result weak.
def _naryop_shape_rule(*avals, **params):
    """NumPy's broadcasting and promotion, a weakly typed operand taking the others' dtype
    (NEP 50); operands all weakly typed promote their dtypes and stay weak (JAX's
    ``weak f32 + 1`` is a weak float32); a weak operand of a higher kind than the strong
    integer or boolean ones gives a weak result (NOTE [weak types of mixed operands])."""
    shape = broadcast_shapes(*(a.shape for a in avals))
    if all(a.weak_type for a in avals):
        # JAX's lattice: a weak float over a weak int, then the widest of that kind
        top = builtins.max("biufc".index(kind_of(a.dtype)) for a in avals)
        dtype = result_type(*(a.dtype for a in avals if "biufc".index(kind_of(a.dtype)) == top))
        return ShapedArray(shape, dtype, weak_type=True)
    dtype = result_type(*(_dtype_operand(a) for a in avals))
    return ShapedArray(shape, dtype, weak_type=_weak_lifts(avals))


def _weak_lifts(avals):
    """Whether a weak operand lifts the strong ones' kind and the result stays weak (NOTE
    [weak types of mixed operands])."""
    kinds = "biufc"
    strong = builtins.max(kinds.index(kind_of(a.dtype)) for a in avals if not a.weak_type)
    weak = builtins.max((kinds.index(kind_of(a.dtype)) for a in avals if a.weak_type), default=-1)
    return weak > strong and kinds[strong] in "biu"


def _div_shape_rule(x, y):
    """True division: integer and boolean operands give float64 (NumPy's ``true_divide``)."""
    out = _naryop_shape_rule(x, y)
    if kind_of(out.dtype) not in "fc":
        out.dtype = np.dtype(np.float64)
    return out


def _float_dtype(dtype):
    """The float dtype of a transcendental function of ``dtype``: NumPy's ufunc rule, the
    smallest float that holds the integers exactly (bool, (u)int8 -> float16, (u)int16 ->
    float32, wider -> float64; a weak Python int -> float64)."""
    dtype = np.dtype(dtype)
    return dtype if kind_of(dtype) in "fc" else np.promote_types(dtype, np.float16)


def _float_unary_shape_rule(x, **params):
    return ShapedArray(x.shape, _float_dtype(x.dtype), weak_type=x.weak_type)


def _same_shape_rule(x, **params):
    return ShapedArray(x.shape, x.dtype, weak_type=x.weak_type)


def _comparison_shape_rule(*avals, **params):
    return ShapedArray(broadcast_shapes(*(a.shape for a in avals)), np.bool_)


def _nary(name, impl, shape_rule=_naryop_shape_rule, differentiable=True, **facts):
    """An elementwise primitive. A ufunc impl is its own writer into a buffer (``out=``),
    so the jit executor may write its results into buffers it owns (``impl_into``:
    :class:`~cuvmap.core.Primitive`); ``facts`` are the other attributes (``fused``)."""
    if isinstance(impl, np.ufunc):
        facts.setdefault("impl_into", impl)
    if facts.get("impl_into") is not None:
        facts.setdefault("owns_output", True)
    return Primitive(name, differentiable=differentiable, impl=impl, shape_rule=shape_rule, **facts)


# NOTE [fused expressions]
# The C expression of each fusible primitive (fused=, a CExpression) is the formula its
# impl computes through CuPy's ufuncs, so a fused program gives the unfused bits (NOTE
# [fused kernels round as the unfused ones] in cuvmap/cuda/kernels.py): rsqrt is a
# reciprocal of sqrt as the impl, integer_pow's square is a product as the impl, and
# max/min are CuPy's maximum/minimum: CUDA's max/min (fmax/fmin for floats, so
# max(-0.0, +0.0) is +0.0 in either order, as CuPy's and unlike a comparison) except that
# a NaN operand gives a NaN (the sum of the operands: a NaN, its payload aside).
# Float64 powers other than squares run unfused (CExpression.unfused: _float64_pow).
# logistic is left out (its impl goes through logaddexp), and so are erf_inv, round,
# sign, floor_divide and remainder: without a C expression they run unfused.
def _float64_pow(dtype, **params):
    """CUDA's double ``pow`` compiled with --fmad=false (as the fused kernels are) can differ
    in the last bit from CuPy's own power kernel, compiled with contraction: a float64 power
    stays unfused (NOTE [fused kernels round as the unfused ones] in cuvmap/cuda/kernels.py)."""
    return dtype == np.float64


def _c_float(template):
    """An expression computed in floating point only: an integer operand is not fused."""
    return CExpression(template, float_only=True)


def _comparison_operands_dtype(*avals):
    """The dtype a comparison computes in: its operands' common dtype (weak literals take
    the array's)."""
    return _naryop_shape_rule(*avals).dtype


def _c_comparison(operator):
    return CExpression("({0} %s {1})" % operator, comparison_dtype=_comparison_operands_dtype)
