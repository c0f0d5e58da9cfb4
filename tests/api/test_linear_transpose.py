"""linear_transpose (issue 32): the transpose of a linear function against the explicit
matrix transpose, the adjoint identity, and the refusal of functions that are not linear."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax

RNG = np.random.default_rng(7)


def test_matrix_product_transposes_to_the_transposed_matrix():
    a = RNG.standard_normal((4, 3))
    f_t = cv.linear_transpose(lambda x: a @ x, np.zeros(3))
    for _ in range(3):
        ct = RNG.standard_normal(4)
        (got,) = f_t(ct)
        np.testing.assert_allclose(got, a.T @ ct, rtol=1e-14)


def _jacobian(f, n):
    """The matrix of a linear map of R^n, column by column."""
    return np.stack([np.ravel(f(np.eye(n)[i])) for i in range(n)], axis=1)


@pytest.mark.parametrize("name, f, n", [
    ("slices and pads", lambda x: cnp.concatenate([x[1:4] * 2.0, cnp.pad(x[:2], (1, 1)), -x[::-1]]), 6),
    ("sum and broadcast", lambda x: cnp.sum(x) - x * 0.5 + cnp.cumsum(x), 5),
    ("reshape and transpose", lambda x: (x.reshape(2, 3).T @ np.arange(6.0).reshape(2, 3)).ravel(), 6),
    ("where with a zero", lambda x: cnp.where(np.arange(4) % 2 == 0, x, 0.0) / 3.0, 4),
    ("jit and checkpoint inside", lambda x: cv.jit(lambda v: cv.checkpoint(lambda w: cnp.tanh(1.0) * w)(v))(x), 3),
    ("a convolution", lambda x: lax.conv(x.reshape(1, 1, 5), np.array([[[1.0, -2.0, 0.5]]])).ravel(), 5),
])
def test_transpose_is_the_transposed_jacobian(name, f, n):
    m = _jacobian(f, n)
    f_t = cv.linear_transpose(f, np.zeros(n))
    cts = RNG.standard_normal((3, m.shape[0]))
    for ct in cts:
        (got,) = f_t(ct.reshape(np.shape(f(np.zeros(n)))))
        np.testing.assert_allclose(got, m.T @ ct, rtol=1e-12, atol=1e-12, err_msg=name)


def test_pytrees_shape_dtype_structs_and_the_adjoint_identity():
    a = RNG.standard_normal((2, 3))

    def f(x, y):
        return {"u": a @ x["v"] + 2.0 * y, "w": x["v"][0] - x["s"]}

    primals = ({"v": cv.ShapeDtypeStruct((3,), np.float64), "s": np.zeros(())}, np.zeros(2))
    f_t = cv.linear_transpose(f, *primals)
    x = ({"v": RNG.standard_normal(3), "s": np.array(RNG.standard_normal())}, RNG.standard_normal(2))
    ct = {"u": RNG.standard_normal(2), "w": np.array(RNG.standard_normal())}
    ct_x = f_t(ct)
    fx = f(*x)
    lhs = sum(np.vdot(a_, b_) for a_, b_ in zip(cv.tree.leaves(ct_x), cv.tree.leaves(x)))
    rhs = sum(np.vdot(a_, b_) for a_, b_ in zip(cv.tree.leaves(ct), cv.tree.leaves(fx)))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-12)  # <f_T(ct), x> = <ct, f(x)>
    np.testing.assert_allclose(ct_x[0]["v"], a.T @ ct["u"] + np.eye(3)[0] * ct["w"], rtol=1e-14)
    np.testing.assert_allclose(ct_x[0]["s"], -ct["w"])
    np.testing.assert_allclose(ct_x[1], 2.0 * ct["u"])


def test_complex_and_zero_outputs():
    (got,) = cv.linear_transpose(lambda z: (1 + 2j) * z, 1j)(3 + 4j)
    assert complex(got) == (1 + 2j) * (3 + 4j)  # JAX's transpose: no conjugation
    (got,) = cv.linear_transpose(lambda x: x[0], [1.0, 2.0])(3.0)
    assert [float(v) for v in got] == [3.0, 0.0]
    (got,) = cv.linear_transpose(lambda x: (x, np.zeros(2)), np.zeros(2))((np.ones(2), np.ones(2)))
    np.testing.assert_array_equal(got, np.ones(2))
    # an unused comparison of the argument does not make the function non-linear
    cv.linear_transpose(lambda x: cv.jit(lambda v: (2 * v, v > 0))(x)[0], 1.0)(1.0)


@pytest.mark.parametrize("f, why", [
    (lambda x: x * x, "product of two values"),
    (lambda x: x + 1.0, "affine"),
    (lambda x: cnp.sin(x), "sin is not a linear primitive"),
    (lambda x: cnp.where(x > 0, x, 0.0), "gt is not a linear primitive"),  # relu
    (lambda x: cnp.pad(x, (1, 1), constant_values=1.0), "affine"),
    (lambda x: (x, np.ones(2)), "not zero"),
    (lambda x: 1.0 / x, "division by a value"),
])
def test_functions_that_are_not_linear_raise(f, why):
    with pytest.raises(TypeError, match=why):
        cv.linear_transpose(f, np.zeros(2))


def test_argument_and_cotangent_errors():
    with pytest.raises(TypeError, match="linear_transpose only supports float or complex arguments"):
        cv.linear_transpose(lambda x: 2.0 * x, 1)
    with pytest.raises(TypeError, match="cotangent tree does not match"):
        cv.linear_transpose(lambda x: [x, x], 1.0)(1.0)
    with pytest.raises(TypeError, match="cotangent type does not match"):
        cv.linear_transpose(lambda x: cnp.stack([x, x]), 1.0)(1.0)
    with pytest.raises(TypeError, match="cotangent type does not match"):
        cv.linear_transpose(lambda x: 1j * x, 1.0)(1.0)
    with pytest.raises(TypeError, match="cotangent type does not match"):
        cv.linear_transpose(lambda x: x, 1.0)(1j)
