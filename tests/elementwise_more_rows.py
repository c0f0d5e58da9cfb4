"""Rows for the generic op tests (``tests/lax/test_ops.py``, ``tests/jit/test_jit.py``) of
the ``jax.numpy`` elementwise and array-API names of ``cuvmap/numpy/_float_bits.py``,
``_elementwise_more.py`` and ``_array_api_names.py``: each against NumPy (value), finite
differences (``grad`` forward and reverse, float64, where differentiable), a loop
(``vmap`` over each operand) and ``jit``. ``op_table.COMPOSITE_ROWS`` includes them. The
special values (NaN, ±∞, −0.0, subnormals, overflow) are checked in
``tests/numpy/test_elementwise_more.py``."""
import numpy as np

from cuvmap import numpy as cnp


def _nan_inf(lib, x):
    """NaN above 1, −∞ below −1, +∞ between 0.45 and 0.55 (x never within 0.1 of ±1 in
    the domains used)."""
    return lib.where(x > 1, np.nan, lib.where(x < -1, -np.inf, lib.where(abs(x - 0.5) < 0.05, np.inf, x)))


def _np_vecmat(x, y):
    return np.squeeze(np.matmul(np.conj(x)[..., None, :], y), -2)


def _np_vecdot(x, y, axis):
    return np.sum(np.conj(np.moveaxis(x, axis, -1)) * np.moveaxis(y, axis, -1), -1)


def rows():
    """The rows of the elementwise and array-API ``jax.numpy`` names."""
    # op_table builds its COMPOSITE_ROWS from this function (a documented cycle: imported here)
    from op_table import F32, F64, I32, I64, NUMERIC, A, Row

    INTS = (I64, I32, np.dtype(np.int8), np.dtype(np.uint8))
    return [
        # sign, magnitude, exponent
        Row("copysign", cnp.copysign, np.copysign, [A(3, 4, domain="nonzero"), A(4, domain="nonzero")]),
        Row("fabs", cnp.fabs, np.fabs, [A(3, 4, domain="nonzero")]),
        Row("signbit", cnp.signbit, np.signbit, [A(3, 4, domain="ints")], dtypes=NUMERIC, differentiable=False),
        Row("frexp_mantissa", lambda x: cnp.frexp(3 * x)[0], lambda x: np.frexp(3 * x)[0],
            [A(3, 4, domain="grid_half")]),  # |3x| stays 0.2 away from the powers of two
        Row("frexp_exponent", lambda x: cnp.frexp(x)[1], lambda x: np.frexp(x)[1].astype(np.int32),
            [A(3, 4)], differentiable=False),
        Row("ldexp", cnp.ldexp, lambda x, n: np.ldexp(x, n), [A(3, 4), A(4, dtype=I32)]),
        Row("ldexp_int64_exponent", cnp.ldexp, lambda x, n: np.ldexp(x, n), [A(3, 1), A(3, 4, dtype=I64)]),
        Row("modf", lambda x: cnp.stack(cnp.modf(x)), lambda x: np.stack(np.modf(x)), [A(3, 4, domain="grid_half")]),
        Row("trunc", cnp.trunc, np.trunc, [A(3, 4, domain="grid_half")], dtypes=NUMERIC, differentiable=False),
        Row("rint", cnp.rint, np.rint, [A(3, 4, domain="grid0")], differentiable=False),
        Row("nextafter_numpy", cnp.nextafter, np.nextafter, [A(3, 4), A(4)], differentiable=False),
        Row("nan_to_num", lambda x: cnp.nan_to_num(_nan_inf(cnp, x)), lambda x: np.nan_to_num(_nan_inf(np, x)),
            [A(3, 4, domain="grid_half")]),
        Row("nan_to_num_values", lambda x, v: cnp.nan_to_num(_nan_inf(cnp, x), nan=v, posinf=7.0, neginf=-9.0),
            lambda x, v: np.nan_to_num(_nan_inf(np, x), nan=v, posinf=7.0, neginf=-9.0),
            [A(3, 4, domain="grid_half"), A()], diff_argnums=(0,)),
        # two-operand functions
        Row("hypot", cnp.hypot, np.hypot, [A(3, 4), A(4)]),
        Row("fmax", cnp.fmax, np.fmax, [A(3, 4, domain="grid0"), A(4, domain="grid_half")], dtypes=NUMERIC),
        Row("fmin", cnp.fmin, np.fmin, [A(3, 4, domain="grid0"), A(4, domain="grid_half")], dtypes=NUMERIC),
        Row("fmod", cnp.fmod, np.fmod, [A(3, 4, domain="grid_half"), A(4, domain="divisor")]),
        Row("fmod_ints", cnp.fmod, np.fmod, [A(3, 4), A(4, domain="nonzero")], dtypes=INTS, differentiable=False),
        Row("divmod", lambda x, y: cnp.stack(cnp.divmod(x, y)), lambda x, y: np.stack(np.divmod(x, y)),
            [A(3, 4, domain="grid_half"), A(4, domain="divisor")], dtypes=NUMERIC),
        Row("float_power", cnp.float_power, lambda x, y: np.float_power(x, y).astype(x.dtype),
            [A(3, 4, domain="positive"), A(4)], tol32=(1e-5, 1e-5)),
        Row("heaviside", cnp.heaviside, np.heaviside, [A(3, 4, domain="nonzero"), A(4)]),
        Row("positive", cnp.positive, np.positive, [A(3, 4)], dtypes=NUMERIC),
        # integer functions: integer results, no derivative
        Row("gcd_lcm", lambda x, y: cnp.stack([cnp.gcd(x, y), cnp.lcm(x, y)]),
            lambda x, y: np.stack([np.gcd(x, y), np.lcm(x, y)]), [A(3, 4, domain="distinct"), A(4, domain="grid0")],
            dtypes=(I64, I32), differentiable=False),
        Row("bitwise_count", cnp.bitwise_count, np.bitwise_count, [A(3, 4, domain="bits")], dtypes=INTS,
            differentiable=False),
        # the array-API names
        Row("array_api_aliases", lambda x: cnp.stack([cnp.asin(x), cnp.acos(x), cnp.atan(x), cnp.atan2(x, 0.5),
                                                      cnp.asinh(x), cnp.atanh(x), cnp.acosh(2 + x), cnp.pow(x, 3)]),
            lambda x: np.stack([np.arcsin(x), np.arccos(x), np.arctan(x), np.arctan2(x, 0.5), np.arcsinh(x),
                                np.arctanh(x), np.arccosh(2 + x), x ** 3]), [A(3, 4, domain="unit")]),
        Row("concat", lambda x, y: cnp.concat([x, y], axis=1), lambda x, y: np.concatenate([x, y], axis=1),
            [A(3, 4), A(3, 2)], dtypes=NUMERIC),
        Row("permute_dims", lambda x: cnp.permute_dims(x, (-1, 0, 1)), lambda x: np.transpose(x, (2, 0, 1)),
            [A(2, 3, 4)], dtypes=NUMERIC),
        Row("matrix_transpose", cnp.matrix_transpose, lambda x: np.swapaxes(x, -1, -2), [A(2, 3, 4)], dtypes=NUMERIC),
        Row("copy", cnp.copy, np.copy, [A(3, 4)], dtypes=NUMERIC),
        Row("vecdot", cnp.vecdot, lambda x, y: _np_vecdot(x, y, -1), [A(2, 1, 4), A(3, 4)], dtypes=NUMERIC),
        Row("vecdot_axis0", lambda x, y: cnp.vecdot(x, y, axis=0), lambda x, y: _np_vecdot(x, y, 0),
            [A(4, 3), A(4, 3)]),
        Row("matvec", cnp.matvec, lambda x, y: np.squeeze(x @ y[..., None], -1), [A(2, 3, 4), A(4)], dtypes=NUMERIC),
        Row("vecmat", cnp.vecmat, _np_vecmat, [A(3), A(2, 3, 4)], dtypes=NUMERIC),
        Row("products_preferred_float64", lambda x, y: cnp.stack([
            cnp.dot(x, y, preferred_element_type=np.float64), cnp.matmul(x, y, preferred_element_type=np.float64),
            cnp.inner(x, y, preferred_element_type=np.float64),
            cnp.tensordot(x, y, 1, precision="highest", preferred_element_type=np.float64),
            cnp.vdot(x, y, preferred_element_type=np.float64),
            cnp.vecdot(x, y, preferred_element_type=np.float64),
            cnp.einsum("i,i", x, y, preferred_element_type=np.float64)]),
            lambda x, y: np.full(7, np.dot(x.astype(np.float64), y.astype(np.float64))),
            [A(4), A(4)], dtypes=(F32, F64, I64)),
    ]
