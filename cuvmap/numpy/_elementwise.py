"""Elementwise functions: NumPy's names for the elementwise primitives of
:mod:`cuvmap.lax.elementwise`, and the composites ``power``, ``square``, ``where``,
``clip``, ``round``, ``astype``; the bitwise and logical functions (NOTE [bitwise
operators on traced values])."""
import builtins

import numpy as np

from cuvmap import core, lax
from cuvmap.lax import elementwise as ew
from cuvmap.numpy._common import _is_bool
from cuvmap.core.bfloat16 import kind_of


add = ew.add
subtract = ew.sub
multiply = ew.mul
divide = true_divide = ew.div
floor_divide = ew.floor_divide
remainder = mod = ew.remainder
negative = ew.neg
exp = ew.exp
log = ew.log
log1p = ew.log1p
expm1 = ew.expm1
sqrt = ew.sqrt
tanh = ew.tanh
sin = ew.sin
cos = ew.cos
sinh = ew.sinh
cosh = ew.cosh
arctan = ew.atan
arctan2 = ew.atan2
arcsinh = ew.asinh
log2 = ew.log2
log10 = ew.log10
erf = ew.erf
floor = ew.floor
ceil = ew.ceil
abs = absolute = ew.abs  # noqa: A001
sign = ew.sign
maximum = ew.max
minimum = ew.min
equal = ew.eq
not_equal = ew.ne
less = ew.lt
less_equal = ew.le
greater = ew.gt
greater_equal = ew.ge
stop_gradient = ew.stop_gradient


def power(x1, x2):
    """``x1 ** x2``; a Python int exponent uses ``integer_pow`` (exact, differentiable at 0)."""
    if isinstance(x2, (int, np.integer)) and not isinstance(x2, bool):
        return ew.integer_pow(x1, int(x2))
    return ew.pow(x1, x2)


def square(x):
    return ew.integer_pow(x, 2)


def reciprocal(x):
    return ew.div(1, x)


def sigmoid(x):
    return ew.logistic(x)


def where(condition, x, y):
    """``x`` where ``condition`` holds, else ``y`` (all three broadcast)."""
    return ew.select(condition, x, y)


def round(a, decimals=0, out=None):  # noqa: A001
    """Rounds to ``decimals`` decimal places, halves to even; integers stay as they are, a
    complex number rounds its real and imaginary parts. Where ``|a|·10^decimals`` is beyond
    the dtype's precision ``a`` is returned, not NumPy's NaN (as JAX since its issue
    31689). Piecewise constant: its derivative is zero. ``out`` is refused (arrays are
    immutable)."""
    if out is not None:
        raise NotImplementedError("round: out= is not supported (arrays are immutable)")
    if kind_of(core.dtype_of(a)) == "c":  # each part rounded, as NumPy does (eagerly and staged alike)
        return ew.complex(ew.round_decimals(ew.real(a), decimals), ew.round_decimals(ew.imag(a), decimals))
    return ew.round_decimals(a, decimals)


around = round


def clip(a, a_min=None, a_max=None, *, min=None, max=None):  # noqa: A002 - NumPy's names
    """``minimum(maximum(a, a_min), a_max)``, broadcasting all three; the bounds may be
    arrays or traced values (NumPy 2's keywords ``min``/``max`` work too). As in JAX the
    derivative flows to ``a`` inside the bounds and to the bound that clips outside,
    shared evenly where ``a`` equals a bound; ``a_min > a_max`` gives ``a_max``."""
    if min is not None:
        if a_min is not None:
            raise TypeError("clip: give min or a_min, not both")
        a_min = min
    if max is not None:
        if a_max is not None:
            raise TypeError("clip: give max or a_max, not both")
        a_max = max
    if a_min is not None:
        a = ew.max(a, a_min)
    if a_max is not None:
        a = ew.min(a, a_max)
    return a


def astype(x, dtype, *, copy=False, device=None):
    """``x`` cast to ``dtype`` (JAX's ``jnp.astype``; ``copy`` and ``device`` are accepted:
    values are immutable, and the result stays where ``x`` is)."""
    dtype = np.dtype(dtype)
    if core.dtype_of(x) == dtype and not isinstance(x, (int, float, bool)):
        return x
    return ew.convert_element_type(x, dtype)


# ---------------------------------------------------------------------------------------
# Bitwise and logical functions
# ---------------------------------------------------------------------------------------


# NOTE [bitwise operators on traced values]
# ``& | ^ ~ << >>`` on traced values, and the functions below, run the primitives of
# ``cuvmap/lax/bitwise.py`` with NumPy's semantics: integers and booleans only (a float
# operand raises TypeError, as in NumPy and JAX), NumPy's promotion with weakly typed
# Python ints (``uint8_tracer & 0xF0`` stays uint8), ``>>`` arithmetic on signed integers
# and logical on unsigned ones, and shifts by the bit width or more give 0 (or -1 for a
# negative signed ``x >> k``), as NumPy's do. Their results are integers or booleans and
# carry no derivative (the primitives are ``differentiable=False``): a float function
# that computes an integer mask or index with them on the side differentiates as usual.


def _dtype_operand(x):
    """A Python int or bool as itself (weakly typed, NEP 50), else the dtype."""
    return x if type(x) in (int, bool) else core.dtype_of(x)


def _check_integer_operands(name, xs, kinds="biu", what="integers or booleans"):
    dtypes = [core.dtype_of(x) for x in xs]
    if builtins.any(kind_of(d) not in kinds for d in dtypes):
        raise TypeError(f"{name}: operands must be {what}, got " + " and ".join(str(d) for d in dtypes))


def _bitwise_binary(name, fn):
    def op(x, y):
        _check_integer_operands(name, (x, y))
        return fn(x, y)

    op.__name__ = name
    op.__doc__ = f"``numpy.{name}`` on integers and booleans (NOTE [bitwise operators on traced values])."
    return op


bitwise_and = _bitwise_binary("bitwise_and", lax.bitwise_and)
bitwise_or = _bitwise_binary("bitwise_or", lax.bitwise_or)
bitwise_xor = _bitwise_binary("bitwise_xor", lax.bitwise_xor)


def bitwise_not(x):
    """``~x``: the bits of an integer flipped, the negation of a boolean."""
    _check_integer_operands("bitwise_not", (x,))
    return lax.bitwise_not(x)


invert = bitwise_invert = bitwise_not


def _shift_operands(name, x, y):
    """``(x, y)`` in their common integer dtype (NumPy's promotion; two booleans shift as
    int8, as NumPy's loop does); TypeError for floats or for dtypes with no common integer
    dtype (int64 and uint64)."""
    _check_integer_operands(name, (x, y))
    dtype = np.result_type(_dtype_operand(x), _dtype_operand(y))
    if dtype == np.bool_:
        dtype = np.dtype(np.int8)
    if kind_of(dtype) not in "iu":
        raise TypeError(f"{name}: {core.dtype_of(x)} and {core.dtype_of(y)} have no common integer dtype "
                        f"(NumPy promotes them to {dtype}); cast one of them")

    def cast(v, shifted):
        if type(v) in (int, bool):
            # a Python amount stays weakly typed; a Python int to shift takes the dtype
            # (as a NumPy scalar, which CuPy accepts beside its arrays)
            return dtype.type(v) if shifted else int(v)
        return v if core.dtype_of(v) == dtype else ew.convert_element_type(v, dtype)

    return cast(x, True), cast(y, False), dtype


def left_shift(x, y):
    """``x << y`` (``numpy.left_shift``): 0 where ``y`` is the bit width or more."""
    x, y, _ = _shift_operands("left_shift", x, y)
    return lax.shift_left(x, y)


def right_shift(x, y):
    """``x >> y`` (``numpy.right_shift``): arithmetic (the sign bit fills in) for signed
    integers, logical (zeros fill in) for unsigned ones."""
    x, y, dtype = _shift_operands("right_shift", x, y)
    if kind_of(dtype) == "i":
        return lax.shift_right_arithmetic(x, y)
    return lax.shift_right_logical(x, y)


bitwise_left_shift, bitwise_right_shift = left_shift, right_shift


def logical_not(x):
    """``not x`` elementwise (a boolean); nonzero counts as True."""
    return ew.eq(x, False) if _is_bool(x) else ew.eq(x, 0)


def logical_and(x, y):
    """``x and y`` elementwise (a boolean); nonzero counts as True."""
    return ew.select(ew.ne(x, 0), ew.ne(y, 0), False)


def logical_or(x, y):
    """``x or y`` elementwise (a boolean); nonzero counts as True."""
    return ew.select(ew.ne(x, 0), True, ew.ne(y, 0))


def logical_xor(x, y):
    """Exactly one of ``x`` and ``y`` nonzero, elementwise (a boolean)."""
    return ew.ne(ew.ne(x, 0), ew.ne(y, 0))
