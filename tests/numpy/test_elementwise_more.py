"""The special values and errors of the jax.numpy names of ``cuvmap/numpy/_float_bits.py``,
``_elementwise_more.py`` and ``_array_api_names.py`` (NaN, ±∞, −0.0, subnormals, the ends
of the float range, integer corner cases), the derivatives JAX defines where the generic
rows cannot reach (at ties, at zero, through NaN), ``size(a, axis)`` and the products'
``preferred_element_type``. Values, grads, vmap and jit on ordinary inputs are rows of
``tests/elementwise_more_rows.py``."""
import numpy as np
import pytest

import cuvmap as cv
from cuvmap import numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.test_util import check_grads

FLOATS = (np.float16, np.float32, np.float64)


def _specials(dtype):
    info = np.finfo(dtype)
    return np.array([0.0, -0.0, 1.0, -1.5, 3.0, 0.75, 1e-3, info.max, info.min, info.smallest_normal,
                     info.smallest_subnormal, -3 * info.smallest_subnormal, info.smallest_normal * 0.75,
                     np.inf, -np.inf, np.nan], dtype)


def _same(got, want):
    """Equal values, NaN where NaN, the same sign bits (−0.0 is not 0.0), the same dtype."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert np.array_equal(got, want, equal_nan=got.dtype.kind in "fc"), (got, want)
    if got.dtype.kind == "f":
        assert np.array_equal(np.signbit(got), np.signbit(want)), (got, want)


@pytest.mark.parametrize("dtype", FLOATS)
def test_frexp_signbit_modf_at_special_values(dtype):
    x = _specials(dtype)
    m, e = cnp.frexp(x)
    want_m, want_e = np.frexp(x)
    _same(m, want_m)
    _same(e, np.where(np.isfinite(x), want_e, 0).astype(np.int32))  # NumPy's e at ±∞ is platform-defined
    _same(cnp.signbit(x), np.signbit(x))
    _same(cnp.signbit(-np.abs(x)), np.signbit(-np.abs(x)))  # −NaN has its sign bit set
    for got, want in zip(cnp.modf(x), np.modf(x)):
        _same(got, want)
    _same(cnp.trunc(x), np.trunc(x))
    _same(cnp.rint(x * 2.5), np.rint(x * 2.5))


@pytest.mark.parametrize("dtype", FLOATS)
def test_ldexp_is_correctly_rounded_over_the_whole_range(dtype):
    """Subnormal results, overflow to ±∞, large exponents of every integer dtype."""
    rng = np.random.default_rng(0)
    x = _specials(dtype)
    for n in (rng.integers(-2500, 2500, x.shape), rng.integers(-40, 40, x.shape), np.full(x.shape, 2 ** 40),
              np.full(x.shape, -(2 ** 40))):
        with np.errstate(all="ignore"):
            _same(cnp.ldexp(x, n.astype(np.int64)), np.ldexp(x, n.astype(np.int64)).astype(dtype))
    for n in (np.int8(-100), np.uint16(60000), np.int32(-5), 7, -3):
        with np.errstate(all="ignore"):
            _same(cnp.ldexp(x, n), np.ldexp(x, n).astype(dtype))
    info = np.finfo(dtype)
    span = int(np.log2(float(info.max)) - np.log2(float(info.tiny))) - 1
    _same(cnp.ldexp(np.array([info.tiny, info.max], dtype), np.array([span, -span])),
          np.ldexp(np.array([info.tiny, info.max], dtype), np.array([span, -span])))


def test_ldexp_and_frexp_derivatives():
    n = np.array([3, -2, 0, 40])
    check_grads(lambda x: cnp.ldexp(x, n), (np.array([1.3, -0.4, 0.2, 7.0]),), order=2)
    check_grads(lambda x: cnp.frexp(x)[0], (np.array([1.3, -0.4, 0.2, 7.0]),), order=2)
    x = np.array([1.3, -0.4, 5e-310, 7.0])  # a subnormal among them: the derivative 2^n stays finite
    assert np.array_equal(cv.grad(lambda x: cnp.ldexp(x, n).sum())(x), 2.0 ** n)
    assert np.array_equal(cv.grad(lambda x: cnp.frexp(x)[0].sum())(x), 2.0 ** -np.frexp(x)[1])
    assert cv.grad(lambda x: cnp.frexp(x)[0])(0.0) == 1.0  # m = x at 0, as JAX's rule


def test_ldexp_refuses_a_float_exponent_and_complex_mantissas():
    with pytest.raises(ValueError, match="ldexp"):
        cnp.ldexp(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="ldexp"):
        cnp.ldexp(np.ones(3, np.complex64), 2)


def test_fmax_fmin_ignore_nan_and_pass_the_gradient_to_the_chosen_operand():
    x = np.array([1.0, np.nan, np.nan, 2.0, -np.inf, 3.0])
    y = np.array([np.nan, 1.0, np.nan, 2.0, np.nan, -1.0])
    _same(cnp.fmax(x, y), np.fmax(x, y))
    _same(cnp.fmin(x, y), np.fmin(x, y))
    gx, gy = cv.grad(lambda x, y: cnp.fmax(x, y).sum(), argnums=(0, 1))(x, y)
    # JAX's choice: x1 where x1 > x2 or x2 is NaN (both NaN: x1), else x2 (ties: x2)
    assert np.array_equal(gx, [1, 0, 1, 0, 1, 1]) and np.array_equal(gy, [0, 1, 0, 1, 0, 0])
    gx, gy = cv.grad(lambda x, y: cnp.fmin(x, y).sum(), argnums=(0, 1))(x, y)
    assert np.array_equal(gx, [1, 0, 1, 0, 1, 0]) and np.array_equal(gy, [0, 1, 0, 1, 0, 1])


def test_hypot_does_not_overflow_and_is_infinite_beside_nan():
    x = np.array([1e200, 3.0, 0.0, np.inf, np.nan, -np.inf, 1e-200])
    y = np.array([1e200, -4.0, 0.0, np.nan, np.inf, 1.0, 1e-200])
    np.testing.assert_allclose(cnp.hypot(x, y), np.hypot(x, y), rtol=1e-15)
    np.testing.assert_allclose(cv.grad(lambda x, y: cnp.hypot(x, y), argnums=(0, 1))(3.0, -4.0), (0.6, -0.8))
    assert cv.grad(cnp.hypot)(0.0, 0.0) == 0.0  # at the origin: 0, as JAX
    # |x1| = |x2|: hypot is smooth there, and so are its derivatives (NOTE [hypot scaled by a constant])
    check_grads(cnp.hypot, (np.array([2.0, -1.0, 3.0]), np.array([2.0, 1.0, -3.0])), order=3)
    np.testing.assert_allclose(cv.hessian(lambda x: cnp.hypot(x, 2.0))(2.0), 4 / np.hypot(2.0, 2.0) ** 3)
    with pytest.raises(ValueError, match="complex"):
        cnp.hypot(np.ones(2, np.complex64), 1.0)


def test_fmod_and_divmod_keep_the_signs_numpy_gives():
    x = np.array([-7.5, 7.5, -0.0, 0.0, -6.0, 6.0, -1e-20, np.inf, 5.0, 5.0, -5.0])
    y = np.array([2.0, -2.0, 3.0, -3.0, 3.0, -3.0, 1.0, 1.0, np.inf, 0.0, -np.inf])
    with np.errstate(all="ignore"):
        _same(cnp.fmod(x, y), np.fmod(x, y))  # −1e-20 stays −1e-20 (fmod computed as ±remainder(|x1|, |x2|))
        for got, want in zip(cnp.divmod(x, y), np.divmod(x, y)):
            _same(got, want)
    a = np.array([-7, 7, -7, 7, 0, 5, -128, -128, 12], np.int8)
    b = np.array([2, -2, -2, 2, 3, 0, -1, 3, 0], np.int8)
    with np.errstate(all="ignore"):
        _same(cnp.fmod(a, b), np.fmod(a, b))
    _same(cnp.fmod(np.array([7, 9], np.uint8), np.array([3, 0], np.uint8)), np.array([1, 0], np.uint8))
    gx, gy = cv.grad(lambda x, y: cnp.fmod(x, y), argnums=(0, 1))(-7.5, 2.0)
    assert (gx, gy) == (1.0, 3.0)  # −trunc(x/y) in y


def test_copysign_nextafter_heaviside_nan_to_num():
    x = np.array([1.5, -2.0, 0.0, np.nan, np.inf])
    y = np.array([-0.0, 0.0, -1.0, -np.nan, 3.0])
    _same(cnp.copysign(x, y), np.copysign(x, y))
    _same(cnp.nextafter(x, y), np.nextafter(x, y))
    _same(cnp.heaviside(np.array([-1.0, 0.0, 2.0, np.nan]), 0.5), np.heaviside(np.array([-1.0, 0.0, 2.0, np.nan]), 0.5))
    assert cv.grad(lambda h: cnp.heaviside(0.0, h))(0.25) == 1.0
    z = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    _same(cnp.nan_to_num(z), np.nan_to_num(z))
    _same(cnp.nan_to_num(z, nan=-1.0, posinf=9.0, neginf=-9.0), np.nan_to_num(z, nan=-1.0, posinf=9.0, neginf=-9.0))
    c = np.array([complex(np.nan, np.inf), complex(1.0, -np.inf)], np.complex64)
    _same(cnp.nan_to_num(c), np.nan_to_num(c))
    _same(cnp.nan_to_num(np.array([1, 2])), np.array([1, 2]))
    assert np.array_equal(cv.grad(lambda z: cnp.nan_to_num(z).sum())(np.array([np.nan, 2.0, np.inf])), [0, 1, 0])


def test_integer_functions():
    rng = np.random.default_rng(1)
    for dtype in (np.int8, np.int32, np.int64, np.uint8, np.uint32):
        info = np.iinfo(dtype)
        a = rng.integers(max(info.min, -1000), min(info.max, 1000), (5, 6), endpoint=True).astype(dtype)
        b = rng.integers(max(info.min, -60), 60, (6,), endpoint=True).astype(dtype)
        a[0, :2] = 0
        b[:1] = 0
        with np.errstate(all="ignore"):
            _same(cnp.gcd(a, b), np.gcd(a, b))
            _same(cnp.lcm(a, b), np.lcm(a, b))
        bits = rng.integers(info.min, info.max, (7,), dtype=dtype, endpoint=True)
        _same(cnp.bitwise_count(bits), np.bitwise_count(bits))
    _same(cnp.bitwise_count(np.array([True, False])), np.bitwise_count(np.array([True, False])))
    a, b = np.array([[12, 18], [0, 7]]), np.array([8, 21])
    assert np.array_equal(cv.jit(cnp.gcd)(a, b), np.gcd(a, b))
    assert np.array_equal(cv.vmap(cnp.lcm, in_axes=(0, None))(a, b), np.lcm(a, b))
    with pytest.raises(ValueError, match="gcd"):
        cnp.gcd(np.ones(2), np.ones(2))
    with pytest.raises(TypeError, match="bitwise_count"):
        cnp.bitwise_count(np.ones(2))


def test_int_operands_of_the_float_functions_become_float64():
    i = np.array([1, -2, 3])
    for f in (cnp.fabs, cnp.rint, lambda x: cnp.modf(x)[0], lambda x: cnp.frexp(x)[0], lambda x: cnp.ldexp(x, 2),
              lambda x: cnp.float_power(x, 2), lambda x: cnp.hypot(x, 1), lambda x: cnp.copysign(x, -1)):
        assert f(i).dtype == np.float64
    assert cnp.float_power(np.ones(2, np.float32), 2).dtype == np.float32  # as JAX (NumPy: float64)
    assert cnp.trunc(i).dtype == i.dtype and cnp.fmax(i, 2).dtype == i.dtype
    with pytest.raises(TypeError, match="complex"):
        cnp.fabs(np.ones(2, np.complex64))


def test_size_along_axes():
    x = np.zeros((2, 3, 4))
    assert cnp.size(x) == 24 and cnp.size(x, 1) == 3 and cnp.size(x, -1) == 4 and cnp.size(x, (0, 2)) == 8
    assert cnp.size(x, ()) == 1
    assert cv.jit(lambda x: x * cnp.size(x, axis=(1, -1)))(x).shape == x.shape
    with pytest.raises(ValueError, match="repeated axis"):
        cnp.size(x, (1, -2))
    with pytest.raises(ShapeError, match="out of range"):
        cnp.size(x, 3)


def test_array_api_names():
    x = np.arange(24.0).reshape(2, 3, 4)
    assert np.array_equal(cnp.permute_dims(x, (-1, 0, 1)), np.transpose(x, (2, 0, 1)))
    with pytest.raises(ValueError, match="permutation"):
        cnp.permute_dims(x, (0, 0, 1))
    assert np.array_equal(cnp.matrix_transpose(x), np.swapaxes(x, -1, -2))
    with pytest.raises(ValueError, match="two dims"):
        cnp.matrix_transpose(np.ones(3))
    assert np.array_equal(cnp.concat([x, x], axis=None), np.concatenate([x, x], axis=None))
    c = cnp.copy(x)
    assert c is not x and np.array_equal(c, x)
    z = np.array([1 + 2j, 3 - 1j])
    m = np.array([[1j, 2], [3, 4 - 1j]])
    np.testing.assert_allclose(cnp.vecdot(z, z), np.vdot(z, z))
    np.testing.assert_allclose(cnp.vecmat(z, m), np.conj(z) @ m)
    np.testing.assert_allclose(cnp.matvec(m, z), m @ z)
    with pytest.raises(ShapeError, match="vecdot"):
        cnp.vecdot(np.ones(3), np.ones(4))
    assert cnp.float0 is cv.float0 and cnp.pow is cnp.power
    assert cnp.broadcast_shapes((6, 7), (5, 6, 1), 7, np.array([5, 1, 7])) == (5, 6, 7)
    assert cnp.broadcast_shapes([1], [0, 1]) == (0, 1) and cnp.broadcast_shapes() == ()
    with pytest.raises(ValueError, match="do not broadcast"):
        cnp.broadcast_shapes((3, 4), (0,))
    with pytest.raises(TypeError, match="non-negative"):
        cv.lax.broadcast_shapes((-1,))


def test_products_preferred_element_type_sets_the_result_dtype():
    i8 = np.array([100, 100, 100], np.int8)
    f16 = np.full(3, 1000.0, np.float16)
    for f in (cnp.dot, cnp.matmul, cnp.inner, cnp.vdot, cnp.vecdot, lambda a, b, **k: cnp.tensordot(a, b, 1, **k),
              lambda a, b, **k: cnp.einsum("i,i", a, b, **k)):
        out = f(i8, i8, preferred_element_type=np.int32)
        assert out.dtype == np.int32 and out == 30000  # accumulated in int32 (int8 wraps)
        out = f(f16, f16, preferred_element_type=np.float32)
        assert out.dtype == np.float32 and out == 3e6  # accumulated in float32 (float16 overflows)
        assert f(i8.astype(np.int32), i8, precision=cv.lax.Precision.HIGHEST).dtype == np.int32
    with pytest.raises(ValueError, match="precision"):
        cnp.dot(i8, i8, precision="bogus")


def test_complex_logaddexp_is_on_the_principal_branch():
    """NumPy's log(exp(x1) + exp(x2)): the imaginary part in (−π, π] (the shifted form
    carried the shift's imaginary part; JAX's tests found values 2π off)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(40) * 3 + 1j * rng.standard_normal(40) * 3
    y = rng.standard_normal(40) * 3 + 1j * rng.standard_normal(40) * 3
    np.testing.assert_allclose(cnp.logaddexp(x, y), np.log(np.exp(x) + np.exp(y)), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cnp.logaddexp2(x, y), np.log2(2 ** x + 2 ** y), rtol=1e-12, atol=1e-12)
    check_grads(cnp.logaddexp, (x[:4], y[:4]), order=2)
