"""``cuvmap.test_util.check_grads`` takes JAX's tolerance forms (``jax.test_util.check_grads``):
``None`` for the per-dtype gradient tolerances and a ``{dtype: tol}`` dict over them; a
wrong derivative still fails under each form."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap.test_util import GRADIENT_TOLERANCE, check_grads


@cv.custom_jvp
def _sin_with_a_wrong_derivative(x):
    return cnp.sin(x)


@_sin_with_a_wrong_derivative.defjvp
def _wrong(primals, tangents):
    (x,), (t,) = primals, tangents
    return cnp.sin(x), 1.01 * cnp.cos(x) * t  # 1 % off


FORMS = [  # (atol, rtol, eps)
    (None, None, None),
    ({np.float32: 5e-2}, {np.float32: 5e-2}, 1e-3),
    ({np.float64: 1e-6}, None, None),
    (1e-6, 1e-6, 1e-5),
]


# float32 inputs with the forms that give a float32 tolerance (a float64 number would not
# hold float32 finite differences), float64 with every form
CASES = [(np.float64, *form) for form in FORMS] + [(np.float32, *form) for form in FORMS[:2]]


@pytest.mark.parametrize("dtype,atol,rtol,eps", CASES)
def test_each_tolerance_form_passes_a_right_derivative(dtype, atol, rtol, eps):
    x = np.array([0.3, -1.2, 2.0], dtype)
    if dtype == np.float32 and eps is None:
        eps = 1e-2  # (float32's finite differences want a larger step)
    check_grads(lambda x: cnp.tanh(x) * x, (x,), order=2 if dtype == np.float64 else 1, atol=atol, rtol=rtol,
                eps=eps)


@pytest.mark.parametrize("atol,rtol,eps", FORMS)
def test_each_tolerance_form_fails_a_wrong_derivative(atol, rtol, eps):
    x = np.array([0.3, -1.2, 2.0])
    with pytest.raises(AssertionError, match="order 1 forward mode"):
        check_grads(_sin_with_a_wrong_derivative, (x,), order=1, modes=("fwd",), atol=atol, rtol=rtol, eps=eps)


def test_the_largest_tolerance_of_the_dtypes_checked_applies():
    from cuvmap.test_util import _tolerance

    assert _tolerance(None, {np.dtype(np.float64)}) == GRADIENT_TOLERANCE[np.dtype(np.float64)] == 1e-5
    assert _tolerance(None, {np.dtype(np.float32), np.dtype(np.float64)}) == 2e-3
    assert _tolerance({np.float64: 1e-9}, {np.dtype(np.float64)}) == 1e-9
    assert _tolerance({np.float64: 1e-9}, {np.dtype(np.int64)}) == 1e-5  # no inexact dtype: float64's
    assert _tolerance(0.5, {np.dtype(np.float32)}) == 0.5
