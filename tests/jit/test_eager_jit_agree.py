"""Staging keeps what eager computes (issue 33): every row of the op table, in every dtype
it runs in, gives the same value and the same dtype eagerly and under ``jit``; and the
cases that once differed (a traced integer exponent's ``n == 0`` guard, a weak value
computed from an integer array) agree with their closed forms both ways.
"""
import numpy as np
import pytest

import cuvmap as cv
from cuvmap import numpy as cnp
from op_table import ALL_ROWS, NESTED_SAMPLE

# -m "not slow" checks the nested sample's rows (every family) in their first dtype; the full
# suite every row in every dtype
CASES = [pytest.param(r, d, id=f"{r.name}-{d.name}",
                      marks=() if d == r.dtypes[0] and r.name in NESTED_SAMPLE else (pytest.mark.slow,))
         for r in ALL_ROWS for d in r.dtypes]


def _assert_agree(got, want, dtype, name):
    got_leaves, got_tree = cv.tree.flatten(got)
    want_leaves, want_tree = cv.tree.flatten(want)
    assert got_tree == want_tree, name
    for g, w in zip(got_leaves, want_leaves):
        g, w = np.asarray(g), np.asarray(w)
        assert (g.shape, g.dtype) == (w.shape, w.dtype), f"{name}: jit gives {g.dtype}{list(g.shape)}, " \
                                                         f"eager {w.dtype}{list(w.shape)}"
        if w.dtype.kind in "fc":
            tol = 1e-5 if w.dtype == np.float32 else 1e-12
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


@pytest.mark.parametrize("row,dtype", CASES)
def test_every_row_agrees_eagerly_and_under_jit_in_every_dtype(row, dtype):
    args = row.make_args(dtype)
    _assert_agree(cv.jit(row.fun)(*args), row.fun(*args), dtype, row.name)


@pytest.mark.parametrize("x, n, want", [(0.0, 0, 0.0), (0.0, 1, 1.0), (0.0, 2, 0.0), (2.0, 3, 12.0), (2.0, -1, -0.25),
                                        (3.0, 0, 0.0)])
def test_a_traced_integer_exponent_keeps_the_zero_guard(x, n, want):
    """d/dx x**n = n·x**(n−1), and 0 for n == 0 (x**0 is 1 everywhere, 0 included)."""
    power = lambda x, n: x ** n
    for g in (cv.grad(power), cv.grad(cv.jit(power)), cv.jit(cv.grad(power))):
        assert float(g(x, n)) == want
    # vmap over the exponent, staged
    xs, ns = np.array([0.0, 0.0, 2.0]), np.array([0, 2, 3])
    np.testing.assert_array_equal(cv.vmap(cv.grad(cv.jit(power)))(xs, ns), [0.0, 0.0, 12.0])


def test_a_value_from_an_integer_array_and_a_python_number_is_weak():
    """JAX's lattice: int32 + 1.5 is a weak float, which a float32 operand then decides."""
    a, f = np.array([1, 2, 3], np.int32), np.array([0.5, 1.0, 2.0], np.float32)
    fn = lambda a, f: cnp.multiply(cnp.add(a, 1.5), f)
    want = (np.array([1, 2, 3]) + 1.5) * np.array([0.5, 1.0, 2.0])
    for out in (fn(a, f), cv.jit(fn)(a, f)):
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, want, rtol=1e-7)
    weak = cnp.add(a, 1.5)
    assert isinstance(weak, cv.core.WeakArray) and weak.dtype == np.float64
    assert cv.eval_shape(lambda a: cnp.add(a, 1.5), a) == cv.ShapeDtypeStruct((3,), np.float64, weak_type=True)
    # the strong kinds stay strong: a weak float meeting float32 or a weak int meeting int32
    assert cv.eval_shape(lambda f: cnp.add(f, 1.5), f) == cv.ShapeDtypeStruct((3,), np.float32)
    assert cv.eval_shape(lambda a: cnp.add(a, 2), a) == cv.ShapeDtypeStruct((3,), np.int32)
    # NumPy's operators on a weak array follow the same rule (NOTE [eager weak arrays]):
    # a strong operand decides (a plain result), weak with Python numbers stays weak
    for out in (weak * f, f * weak, weak + f, np.multiply(weak, f), cnp.add(a, 1.5) * f):
        assert type(out) is np.ndarray and out.dtype == np.float32
    np.testing.assert_allclose(weak * f, want, rtol=1e-7)
    assert type(weak * 2) is cv.core.WeakArray and (weak * 2).dtype == np.float64
    assert (weak * 2 * f).dtype == np.float32 and np.sin(weak).dtype == np.float64
    assert (weak * np.ones(3, np.float16)).dtype == np.float16
    assert (weak * np.ones(3, np.int8)).dtype == np.float64      # a weak float over a strong int: the float
    assert (weak * np.ones(3, np.complex64)).dtype == np.complex64
    assert type(weak > f) is np.ndarray and (weak > f).dtype == np.bool_
    assert type(np.sum(weak)) is not cv.core.WeakArray
    assert (weak * [1.0, 2.0, 3.0]).dtype == np.float64  # a list is NumPy's strong float64
    with pytest.raises(cv.errors.ConcretizationError):  # a NumPy ufunc of a traced value, as before
        cv.jit(lambda f: np.multiply(weak, f))(f)
    # as JAX: the expression of the issue, staged and eager through cuvmap's functions
    assert cv.eval_shape(lambda a, f: (cnp.add(a, 1.5)) * f, a, f) == cv.ShapeDtypeStruct((3,), np.float32)
    # the weak array as an input: of jit, vmap and grad
    assert cv.jit(lambda w, f: w * f)(weak, f).dtype == np.float32
    assert cv.vmap(lambda w, f: w * f)(weak, f).dtype == np.float32
    np.testing.assert_allclose(cv.grad(lambda f: cnp.sum(weak * f))(f), np.array([2.5, 3.5, 4.5]), rtol=1e-7)


def test_a_float32_carry_of_a_checkpointed_scan_body_stays_float32_under_grad():
    """A Python-number input to grad is weak: ``d0 * r`` with float32 ``r`` is float32, so
    the carry keeps its dtype (JAX's RematTest symbolic-zeros case). R_k = R_0·(1 + 0.001·d0)^k."""
    r0 = np.array([1.0, 2.0], np.float32)

    def final(d0, remat):
        def move(r, _):
            return r + 0.001 * (d0 * r), cnp.zeros(1)
        body = cv.checkpoint(move) if remat else move
        r, _ = cv.lax.scan(body, r0, cnp.arange(2))
        return r[1]

    for remat in (False, True):
        g = cv.grad(final)(5.0, remat)
        want = 2.0 * 2 * 0.001 * (1 + 0.005)
        np.testing.assert_allclose(float(g), want, rtol=1e-5)
        assert final(5.0, remat).dtype == np.float32
        np.testing.assert_allclose(float(cv.jit(cv.grad(final), static_argnums=1)(5.0, remat)), want, rtol=1e-5)
