"""Two answers that were wrong without raising, found by JAX's own tests: ``isclose`` of
integers applies the tolerances (NumPy's and JAX's rule; cuvmap compared them exactly), and
``round`` with more decimals than the float holds returns the value itself (NumPy's scaling
by ``10**decimals`` overflows to NaN; JAX returns the value). Eagerly and under jit."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp

CLOSE = [  # (a, b, rtol, atol, expected)
    (6, 10, 0.5, 0.0, True),
    (6, 10, 0.1, 0.0, False),
    ([6, 7], [10, 10], 0.0, 3.0, [False, True]),
    (np.int8(3), np.int8(3), 0.0, 0.0, True),
    (np.arange(4), np.arange(4) + 1, 0.0, 1.0, [True] * 4),
    (np.uint8(250), 255, 0.01, 0.0, False),
    (2**53, 2**53 + 1, 0.0, 0.0, True),  # (compared as float64, as NumPy does)
]


@pytest.mark.parametrize("a,b,rtol,atol,expected", CLOSE)
def test_isclose_of_integers_applies_the_tolerances(a, b, rtol, atol, expected):
    want = np.isclose(a, b, rtol=rtol, atol=atol)
    assert np.array_equal(want, expected)
    assert np.array_equal(cnp.isclose(a, b, rtol=rtol, atol=atol), want)
    assert np.array_equal(cv.jit(lambda a, b: cnp.isclose(a, b, rtol=rtol, atol=atol))(np.asarray(a), np.asarray(b)),
                          want)
    assert bool(cnp.allclose(a, b, rtol=rtol, atol=atol)) == bool(np.all(want))


VALUES = np.array([7.354473, -1.5, 0.0, 1e300, -2.5e-300, np.inf, -np.inf, np.nan])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize("decimals", [400, 1000, 10**6])
def test_round_with_more_decimals_than_the_float_holds_is_the_value(decimals, dtype):
    x = VALUES.astype(dtype) if dtype != np.complex128 else VALUES + 1j * VALUES[::-1]
    np.testing.assert_array_equal(cnp.round(x, decimals), x)
    np.testing.assert_array_equal(cv.jit(lambda x: cnp.round(x, decimals))(x), x)


def _complex(re, im):
    """``re + i·im`` with infinite parts kept as they are (``1j * inf`` would give a NaN)."""
    z = np.empty(re.shape, np.complex128)
    z.real, z.imag = re, im
    return z


@pytest.mark.parametrize("decimals", [-2, 0, 1, 3, 20])
def test_round_within_the_floats_precision_is_numpys(decimals):
    x = np.array([7.354473, -1.5, 2.5, 1234.5678, 1e300, np.inf, np.nan])
    with np.errstate(over="ignore"):
        numpys = np.round(x, decimals)
    want = np.where(np.isfinite(numpys), numpys, x)  # (1e300 at 20 decimals: NumPy's scaling overflows to inf)
    np.testing.assert_array_equal(cnp.round(x, decimals), want)
    np.testing.assert_array_equal(cv.jit(lambda x: cnp.round(x, decimals))(x), want)
    z, want_z = _complex(x, x[::-1]), _complex(want, want[::-1])  # each part rounded on its own, as NumPy
    np.testing.assert_array_equal(cnp.round(z, decimals), want_z)
    np.testing.assert_array_equal(cv.jit(lambda z: cnp.round(z, decimals))(z), want_z)
    assert np.all(cv.grad(lambda x: cnp.sum(cnp.round(x, decimals)))(x[:4]) == 0)
