"""Bitwise primitives on integers (and booleans): ``bitwise_and``, ``bitwise_or``,
``bitwise_xor``, ``bitwise_not``, ``shift_left``, ``shift_right_logical``,
``shift_right_arithmetic`` and ``bitcast_convert_type``, with ``jax.lax``'s names and
semantics. ``cuvmap.numpy``'s ``bitwise_and`` ... ``right_shift`` and the operators
``& | ^ ~ << >>`` of traced values are built on them.

They are what a counter-based random number generator is written with (NOTE [threefry
with array ops] in ``prng.py``): turning random bits into floats takes a logical shift,
an or with the bits of 1.0 and a bitcast. Binary ones follow NumPy broadcasting with
weakly typed Python ints (NEP 50: ``uint32_array >> 9`` stays uint32); the impls are NumPy
ufuncs, which dispatch to CuPy's through ``__array_ufunc__``.

Shifts are defined for every amount, as XLA defines them: shifting by the bit width or
more gives 0 (C, and CUDA's ``>>``, leave it undefined). ``shift_right_logical`` fills
with zeros on signed integers too (it shifts the unsigned bit pattern);
``shift_right_arithmetic`` fills with copies of the top (sign) bit, on unsigned integers
too (it shifts the signed bit pattern), and an amount of the bit width or more (or a
negative one) fills every bit with it: −1 or 0, as XLA and NumPy's ``>>`` on signed
integers give.

None of them carries a derivative (``differentiable=False``): their operands and results
are integers, except ``bitcast_convert_type`` to a float, whose result is a new bit
pattern, not a function of a real variable; transforms of derivatives pass them through
as constants.
"""
import numpy as np

from cuvmap import core
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax.elementwise.common import _naryop_shape_rule
from cuvmap.transforms import batching
from cuvmap.core import bfloat16
from cuvmap.core.bfloat16 import kind_of

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


# ---------------------------------------------------------------------------------------
# Shape rules
# ---------------------------------------------------------------------------------------


def _check_kinds(avals, kinds, what):
    for a in avals:
        if kind_of(a.dtype) not in kinds:
            raise ShapeError(f"operands must be {what}, got " + ", ".join(str(a.dtype) for a in avals))


def _logical_shape_rule(*avals):
    _check_kinds(avals, "biu", "integers or booleans")
    return _naryop_shape_rule(*avals)


def _shift_shape_rule(x, s):
    _check_kinds((x, s), "iu", "integers")
    out = _naryop_shape_rule(x, s)
    if out.dtype != x.dtype and not x.weak_type:
        raise ShapeError(f"the shift amount's dtype {s.dtype} would promote the shifted {x.dtype} to {out.dtype}; "
                         f"cast the amount to {x.dtype}")
    return out


def _bitcast_shape_rule(x, *, new_dtype):
    if x.dtype.itemsize != new_dtype.itemsize:
        raise ShapeError(f"bitcast from {x.dtype} to {new_dtype} needs dtypes of one size "
                         f"({x.dtype.itemsize} and {new_dtype.itemsize} bytes)")
    if kind_of(x.dtype) not in "biuf" or kind_of(new_dtype) not in "biuf":
        raise ShapeError(f"bitcast between {x.dtype} and {new_dtype}: only booleans, integers and floats")
    return ShapedArray(x.shape, new_dtype)


# ---------------------------------------------------------------------------------------
# Impls
# ---------------------------------------------------------------------------------------


def _bits(x):
    return core.dtype_of(x).itemsize * 8


def _shift_impl(shift):
    """A shift that gives 0 for amounts of the bit width or more (and for negative ones)."""

    def impl(x, s):
        x = core.as_array(x)
        width = _bits(x)
        if type(s) is int and 0 <= s < width:
            return shift(x, x.dtype.type(s))
        s = core.as_array(s)
        in_range = (s >= 0) & (s < width)
        safe = np.where(in_range, s, 0).astype(x.dtype, copy=False)
        return np.where(in_range, shift(x, safe), x.dtype.type(0))

    return impl


def _shift_right_logical(x, s):
    if kind_of(x.dtype) == "u":
        return np.right_shift(x, s)
    u = _UINT[x.dtype.itemsize]
    return np.right_shift(x.view(u), s.astype(u, copy=False)).view(x.dtype)


def _shift_right_arithmetic_impl(x, s):
    """``x >> s`` filling with the sign bit; amounts out of ``[0, width)`` shift by
    ``width - 1`` (every bit becomes the sign bit)."""
    x = core.as_array(x)
    width = _bits(x)
    if type(s) is int and 0 <= s < width:
        s = x.dtype.type(s)
    else:
        s = core.as_array(s)
        s = np.where((s >= 0) & (s < width), s, width - 1).astype(x.dtype, copy=False)
    if kind_of(x.dtype) == "i":
        return np.right_shift(x, s)
    signed = _INT[x.dtype.itemsize]
    return np.right_shift(x.view(signed), s.astype(signed, copy=False)).view(x.dtype)


def _bitcast_impl(x, *, new_dtype):
    x = core.as_array(x)
    if x.ndim == 0:
        return x.reshape(1).view(new_dtype).reshape(())
    return x.view(new_dtype)


# ---------------------------------------------------------------------------------------
# Declarations
# ---------------------------------------------------------------------------------------

bitwise_and_p = Primitive("bitwise_and", False, impl=np.bitwise_and, shape_rule=_logical_shape_rule)
bitwise_or_p = Primitive("bitwise_or", False, impl=np.bitwise_or, shape_rule=_logical_shape_rule)
bitwise_xor_p = Primitive("bitwise_xor", False, impl=np.bitwise_xor, shape_rule=_logical_shape_rule)
bitwise_not_p = Primitive("bitwise_not", False, impl=np.invert, shape_rule=_logical_shape_rule)
shift_left_p = Primitive("shift_left", False, impl=_shift_impl(np.left_shift), shape_rule=_shift_shape_rule)
shift_right_logical_p = Primitive("shift_right_logical", False, impl=_shift_impl(_shift_right_logical),
                                  shape_rule=_shift_shape_rule)
shift_right_arithmetic_p = Primitive("shift_right_arithmetic", False, impl=_shift_right_arithmetic_impl,
                                     shape_rule=_shift_shape_rule)
bitcast_convert_type_p = Primitive("bitcast_convert_type", False, impl=_bitcast_impl, shape_rule=_bitcast_shape_rule,
                                   layout=lambda strided, *_: (False, strided[0]))  # a view


# ---------------------------------------------------------------------------------------
# Public wrappers
# ---------------------------------------------------------------------------------------


def bitwise_and(x, y):
    """``x & y``, elementwise with broadcasting."""
    return bitwise_and_p.bind(x, y)


def bitwise_or(x, y):
    """``x | y``."""
    return bitwise_or_p.bind(x, y)


def bitwise_xor(x, y):
    """``x ^ y``."""
    return bitwise_xor_p.bind(x, y)


def bitwise_not(x):
    """``~x`` (logical not for booleans)."""
    return bitwise_not_p.bind(x)


def shift_left(x, y):
    """``x << y`` in ``x``'s dtype; 0 where ``y`` is at least the bit width."""
    return shift_left_p.bind(x, y)


def shift_right_logical(x, y):
    """``x >> y`` filling with zeros (also for signed ``x``); 0 where ``y`` is at least the
    bit width."""
    return shift_right_logical_p.bind(x, y)


def shift_right_arithmetic(x, y):
    """``x >> y`` filling with copies of the sign (top) bit, as NumPy's ``>>`` on signed
    integers; every bit is the sign bit where ``y`` is at least the bit width."""
    return shift_right_arithmetic_p.bind(x, y)


def bitcast_convert_type(operand, new_dtype):
    """The bits of ``operand`` read as ``new_dtype``, a dtype of the same size
    (``uint32 -> float32``, ``float64 -> uint64``, ...)."""
    return bitcast_convert_type_p.bind(operand, new_dtype=np.dtype(new_dtype))


# ---------------------------------------------------------------------------------------
# Batching rules (no derivative rules: NOTE in the module docstring)
# ---------------------------------------------------------------------------------------

batching.defbroadcasting(bitwise_and_p, bitwise_or_p, bitwise_xor_p, shift_left_p, shift_right_logical_p,
                         shift_right_arithmetic_p)
batching.defunary(bitwise_not_p, bitcast_convert_type_p)

# a bitcast reads its operand's bits: bfloat16 ones as they are (NOTE [bfloat16 computes in
# float32] in cuvmap/core/bfloat16.py)
bfloat16.computes_natively(bitcast_convert_type_p)
