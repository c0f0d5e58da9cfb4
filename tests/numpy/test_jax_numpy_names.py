"""The jax.numpy names of issue 32 item 5 that are not array functions of operands (the
dtype helpers, the index tricks, traced ``k`` of ``eye``/``tri``, methods on tracers, the
data-dependent functions without ``size=``). The array functions are rows of
``tests/jax_numpy_rows.py``."""
import numpy as np
import pytest

import cuvmap as cv
from cuvmap import numpy as cnp
from cuvmap.core import ConcretizationError


def test_dtype_helpers_answer_as_numpy_and_read_tracers():
    assert cnp.finfo(np.float32).eps == np.finfo(np.float32).eps
    assert cnp.iinfo(np.int8).max == 127
    assert cnp.issubdtype(np.float32, cnp.floating) and not cnp.issubdtype(np.int32, cnp.inexact)
    assert cnp.result_type(np.ones(2, np.float32), 2.0) == np.float32  # a Python float is weak
    assert cnp.promote_types(np.int32, np.float32) == np.float64
    assert cnp.can_cast(np.int32, np.float64) and not cnp.can_cast(np.float64, np.int32)
    assert cnp.dtype("float32") == np.float32 and cnp.isdtype(np.float32, "real floating")
    seen = []
    cv.jit(lambda x: seen.append((cnp.dtype(x), cnp.finfo(x).bits, cnp.result_type(x, 1))) or x)(np.ones(2, np.float32))
    assert seen == [(np.float32, 32, np.float32)]


def test_eye_and_tri_with_a_traced_k():
    for k in (-2, 0, 1, 3):
        assert np.array_equal(cv.jit(lambda k: cnp.eye(3, M=4, k=k))(np.array(k)), np.eye(3, 4, k))
        assert np.array_equal(cv.jit(lambda k: cnp.tri(3, 4, k=k))(np.array(k)), np.tri(3, 4, k))
    ks = np.array([0, -1, 2])
    assert np.array_equal(cv.vmap(lambda k: cnp.tri(3, k=k))(ks), np.stack([np.tri(3, k=int(k)) for k in ks]))


def test_index_helpers_are_numpys():
    for got, want in [(cnp.tril_indices(4, -1, 5), np.tril_indices(4, -1, 5)),
                      (cnp.triu_indices_from(np.ones((3, 4)), 1), np.triu_indices_from(np.ones((3, 4)), 1)),
                      (cnp.diag_indices_from(np.ones((3, 3, 3))), np.diag_indices_from(np.ones((3, 3, 3)))),
                      (cnp.indices((2, 3)), np.indices((2, 3)))]:
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert cnp.isscalar(1.0) and cnp.isscalar(np.ones(())) and not cnp.isscalar(np.ones(2))


def test_data_dependent_functions_need_size_under_a_transform():
    x = np.array([0.0, 2.0, 0.0, 3.0])
    assert [np.array_equal(a, b) for a, b in zip(cnp.nonzero(x), np.nonzero(x))] == [True]
    assert np.array_equal(cnp.unique(np.array([3, 1, 3])), [1, 3])
    for fn in (lambda x: cnp.nonzero(x), lambda x: cnp.unique(x), lambda x: cnp.where(x),
               lambda x: cnp.argwhere(x), lambda x: cnp.compress(x > 0, x)):
        with pytest.raises(ConcretizationError, match="size="):
            cv.jit(fn)(x)
    with pytest.raises(ConcretizationError, match="total_repeat_length"):
        cv.jit(lambda r: cnp.repeat(x, r))(np.array([1, 0, 2, 1]))


def test_tracer_methods():
    x = np.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]])
    out = cv.jit(lambda x: (x.sort(1), x.ptp(0), x.nonzero(size=6)[1], x.flatten()))(x)
    assert np.array_equal(out[0], np.sort(x, 1)) and np.array_equal(out[1], np.ptp(x, 0))
    assert np.array_equal(out[2], np.nonzero(x)[1].tolist() + [0]) and np.array_equal(out[3], x.ravel())
    with pytest.raises(ConcretizationError, match="item"):
        cv.jit(lambda x: x.item())(np.ones(()))
    assert cv.jit(lambda x: x.nbytes + x.itemsize)(np.ones((2, 3))) == 48 + 8


def test_put_along_axis_refuses_in_place():
    with pytest.raises(ValueError, match="inplace=False"):
        cnp.put_along_axis(np.zeros(3), np.array([0]), 1.0, 0)


def test_logaddexp_sinc_derivatives_at_their_special_points():
    # logaddexp at a tie: first derivative 1/2 each, second 1/4 (NOTE [logaddexp as a shifted log-sum])
    assert cv.grad(lambda t: cnp.logaddexp(t, 0.4))(0.4) == pytest.approx(0.5)
    assert cv.grad(cv.grad(lambda t: cnp.logaddexp(t, 0.4)))(0.4) == pytest.approx(0.25)
    # sinc at 0: value 1, derivative 0, second derivative −π²/3 (NOTE [sinc near zero])
    assert cnp.sinc(0.0) == 1.0
    assert cv.grad(cnp.sinc)(0.0) == 0.0
    assert cv.grad(cv.grad(cnp.sinc))(0.0) == pytest.approx(-np.pi ** 2 / 3, rel=1e-9)
    # a zero variance has a zero derivative, not NaN
    assert cv.grad(lambda x: cnp.std(x))(3.5) == 0.0
