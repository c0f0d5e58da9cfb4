"""``jacrev(f, allow_int=True)`` (JAX's): integer and boolean inputs are accepted and their
blocks of the Jacobian are float0 zeros of shape ``out.shape + in.shape`` (as ``grad``'s
``allow_int`` gives); without it they raise, naming the argument and the dtype; ``jacfwd``
has no ``allow_int`` (JAX's neither: its tangents would be float0)."""
import numpy as np
import pytest

import cuvmap as cv
from cuvmap import dtypes
from cuvmap import TransformError


def test_integer_and_boolean_inputs_get_float0_blocks():
    x, n = np.array([1.0, 2.0, 3.0]), np.arange(3)
    jx, jn = cv.jacrev(lambda x, n: x * n, argnums=(0, 1), allow_int=True)(x, n)
    np.testing.assert_array_equal(jx, np.diag(n.astype(float)))
    assert jn.dtype == dtypes.float0 and jn.shape == (3, 3)
    # pytrees, a boolean leaf, an output of another shape
    j = cv.jacrev(lambda d: (d["a"] * d["b"]).sum(), allow_int=True)({"a": np.ones(2), "b": np.array([True, False])})
    np.testing.assert_array_equal(j["a"], [1.0, 0.0])
    assert j["b"].dtype == dtypes.float0 and j["b"].shape == (2,)
    # under jit, and with has_aux
    jn, aux = cv.jit(cv.jacrev(lambda x, n: (x * n, n.sum()), argnums=1, has_aux=True, allow_int=True))(x, n)
    assert jn.dtype == dtypes.float0 and jn.shape == (3, 3) and int(aux) == 3


def test_integer_inputs_raise_without_allow_int():
    with pytest.raises(TransformError, match=r"jacrev.*argument 1 \(n\) has dtype int64.*allow_int=True"):
        cv.jacrev(lambda x, n: x * n, argnums=1)(np.ones(3), np.arange(3))
