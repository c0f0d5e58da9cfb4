"""The jax.numpy manipulation, indexing, placing and window names of issue 32 that the
op-table rows (``tests/numpy_manipulation_rows.py``) do not cover: functions without
array operands (windows, ``broadcast_shapes``, ``mask_indices``), integer-valued ones
(``packbits``, ``unpackbits``, ``ix_``, ``argpartition`` of ints), concrete-only ones
(``trim_zeros``, ``choose(mode='raise')``), the index tricks and the errors. References
are NumPy's functions."""
import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax
from cuvmap import numpy as cnp
from cuvmap.core import ConcretizationError, ShapeError

WINDOWS = ("bartlett", "blackman", "hamming", "hanning")


@pytest.mark.parametrize("name", WINDOWS)
@pytest.mark.parametrize("M", [0, 1, 2, 5, 8])
def test_windows_match_numpy(name, M):  # noqa: N803 - NumPy's name
    with cv.config.override(default_float="float64"):
        got = getattr(cnp, name)(M)
    want = getattr(np, name)(M)
    assert got.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    got32 = getattr(cnp, name)(M)  # the default float: float32, as JAX's without x64
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("M", [0, 1, 2, 7])
@pytest.mark.parametrize("beta", [0.0, 1.5, 8.0])
def test_kaiser_matches_numpy_and_stages(M, beta):  # noqa: N803 - NumPy's name
    want = np.kaiser(M, beta)
    np.testing.assert_allclose(cnp.kaiser(M, np.float64(beta)), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cv.jit(lambda b: cnp.kaiser(M, b))(np.float64(beta)), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cnp.kaiser(M, beta), want, rtol=1e-5, atol=1e-6)


def test_window_size_must_be_static():
    with pytest.raises(ConcretizationError, match="M must be a static int"):
        cv.jit(cnp.hanning)(np.int64(4))


def test_broadcast_shapes():
    assert cnp.broadcast_shapes((2, 1), (3,), ()) == np.broadcast_shapes((2, 1), (3,), ()) == (2, 3)
    assert cnp.broadcast_shapes(3, (1,)) == (3,) and cnp.broadcast_shapes() == ()
    assert lax.broadcast_shapes((1, 4), (3, 1)) == (3, 4)
    with pytest.raises(ValueError, match="Incompatible shapes"):
        cnp.broadcast_shapes((3, 4), (0,))
    with pytest.raises(ValueError, match=r"\(3, 4\), \(0,\) do not broadcast"):
        lax.broadcast_shapes((3, 4), (0,))


def test_index_tricks_are_numpys():
    assert cnp.s_[1:2:20] == np.s_[1:2:20] and cnp.s_[::-1, 3] == np.s_[::-1, 3]
    assert cnp.index_exp[:] == np.index_exp[:] and cnp.index_exp[2] == (2,)


def test_ix_is_an_open_mesh():
    rows, cols = np.array([0, 2]), np.array([3, 1, 0])
    got = cnp.ix_(rows, cols)
    want = np.ix_(rows, cols)
    assert all(g.shape == w.shape and np.array_equal(g, w) for g, w in zip(got, want))
    x = np.arange(20.0).reshape(4, 5)
    assert np.array_equal(cv.jit(lambda x, r, c: x[cnp.ix_(r, c)])(x, rows, cols), x[np.ix_(rows, cols)])
    empty = cnp.ix_(np.array([], np.float32), rows)[0]
    assert empty.shape == (0, 1) and empty.dtype == np.intp
    with pytest.raises(NotImplementedError, match="boolean"):
        cnp.ix_(np.array([True, False]))
    with pytest.raises(ShapeError, match="1-d"):
        cnp.ix_(np.ones((2, 2), int))


@pytest.mark.parametrize("trim", ["f", "b", "fb", "BF"])
def test_trim_zeros_matches_numpy(trim):
    x = np.array([0, 0, 3, 0, 2, 0, 0], np.int32)
    assert np.array_equal(cnp.trim_zeros(x, trim), np.trim_zeros(x, trim))
    assert cnp.trim_zeros(np.zeros(4), trim).shape == (0,)
    m = np.array([[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 2, 0]])
    for axis, rows, cols in [(None, (1, 3), (1, 3)), (0, (1, 3), (0, 4)), (-1, (0, 3), (1, 3))]:
        lo_r, lo_c = (0, 0) if "f" not in trim.lower() else (rows[0], cols[0])
        hi_r, hi_c = (3, 4) if "b" not in trim.lower() else (rows[1], cols[1])
        assert np.array_equal(cnp.trim_zeros(m, trim, axis=axis), m[lo_r:hi_r, lo_c:hi_c]), (trim, axis)
    assert cnp.trim_zeros(np.array(3), trim) == 3


def test_trim_zeros_without_f_or_b_is_the_input():  # JAX's answer; NumPy raises
    assert np.array_equal(cnp.trim_zeros(np.array([0, 1, 0]), "x"), [0, 1, 0])


def test_trim_zeros_needs_concrete_values():
    with pytest.raises(ConcretizationError, match="trim_zeros"):
        cv.jit(cnp.trim_zeros)(np.array([0.0, 1.0]))


@pytest.mark.parametrize("bitorder", ["big", "little"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_packbits_unpackbits_match_numpy(bitorder, axis):
    bits = np.random.default_rng(0).integers(0, 3, size=(3, 11)).astype(np.int32)  # 2 counts as a true bit
    packed = cnp.packbits(bits, axis, bitorder)
    want = np.packbits(bits != 0, axis, bitorder=bitorder)
    assert packed.dtype == np.uint8 and np.array_equal(packed, want)
    assert np.array_equal(cnp.packbits(bits != 0, axis, bitorder), want)
    for count in (None, 0, 5, -3, 40):
        got = cnp.unpackbits(want, axis, count, bitorder)
        assert got.dtype == np.uint8 and np.array_equal(got, np.unpackbits(want, axis, count, bitorder=bitorder))
    # vmap and jit of the pair give the same bytes and bits
    staged = cv.jit(lambda b: cnp.unpackbits(cnp.packbits(b, -1, bitorder), -1, 11, bitorder))(bits)
    assert np.array_equal(staged, bits != 0)
    mapped = cv.vmap(lambda b: cnp.packbits(b, bitorder=bitorder))(bits)
    assert np.array_equal(mapped, np.stack([np.packbits(b != 0, bitorder=bitorder) for b in bits]))


def test_packbits_refuses_floats_and_unpackbits_non_bytes():
    with pytest.raises(TypeError, match="integer or boolean"):
        cnp.packbits(np.ones(3))
    with pytest.raises(TypeError, match="uint8"):
        cnp.unpackbits(np.ones(3, np.int32))
    with pytest.raises(ValueError, match="bitorder"):
        cnp.packbits(np.ones(3, np.int32), bitorder="middle")


@pytest.mark.parametrize("func,k", [("triu", 0), ("triu", 1), ("tril", -1), ("tril", 2)])
def test_mask_indices(func, k):
    got = cnp.mask_indices(4, getattr(cnp, func), k)
    want = np.mask_indices(4, getattr(np, func), k)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    size = len(want[0]) + 2
    staged = cv.jit(lambda: cnp.mask_indices(4, getattr(cnp, func), k, size=size))()
    assert all(np.array_equal(s[:-2], w) for s, w in zip(staged, want))


def test_choose_raise_mode_checks_concrete_indices():
    choices = [np.arange(4.0), np.arange(4.0) * 10]
    assert np.array_equal(cnp.choose(np.array([0, 1, 1, 0]), choices), np.choose(np.array([0, 1, 1, 0]), choices))
    with pytest.raises(ValueError, match="^invalid entry in choice array"):
        cnp.choose(np.array([0, 2, 1, 0]), choices)
    with pytest.raises(ConcretizationError, match="mode='wrap'"):
        cv.jit(lambda a: cnp.choose(a, choices))(np.array([0, 1, 1, 0]))
    with pytest.raises(TypeError, match="integer"):
        cnp.choose(np.array([0.0, 1.0]), choices)


@pytest.mark.parametrize("kth", [0, 3, -1, (1, 4)])
def test_partition_and_argpartition_of_integers(kth):
    x = np.array([[5, 1, 4, 1, 9, 2], [3, 3, 0, 7, 2, 8]], np.int32)
    p = cnp.partition(x, kth, axis=1)
    idx = cnp.argpartition(x, kth, axis=1)
    assert p.dtype == x.dtype and idx.shape == x.shape
    for k in np.atleast_1d(kth) % x.shape[1]:
        pivot = np.sort(x, 1)[:, k]
        for got in (p, np.take_along_axis(x, idx, 1)):
            assert np.array_equal(got[:, k], pivot)
            assert (got[:, :k] <= pivot[:, None]).all() and (got[:, k + 1:] >= pivot[:, None]).all()
    assert np.array_equal(np.sort(idx, 1), np.tile(np.arange(6), (2, 1)))
    with pytest.raises(ShapeError, match="out of bounds"):
        cnp.partition(x, 6, axis=1)
    with pytest.raises(ConcretizationError, match="static"):
        cv.jit(lambda k: cnp.partition(x, k))(np.int64(1))


def test_partition_puts_nans_last():
    x = np.array([np.nan, 1.0, -2.0, np.nan, 0.5])
    p = cnp.partition(x, 2)
    assert np.array_equal(p[:3], [-2.0, 0.5, 1.0]) and np.isnan(p[3:]).all()


def test_inplace_updates_are_refused():
    x = np.zeros((3, 3))
    for call in (lambda: cnp.place(x, x > 0, 1.0), lambda: cnp.put(x, [0], 1.0),
                 lambda: cnp.fill_diagonal(x, 1.0)):
        with pytest.raises(ValueError, match="inplace=False"):
            call()
    with pytest.raises(NotImplementedError, match="wrap=True"):
        cnp.fill_diagonal(x, 1.0, wrap=True, inplace=False)
    with pytest.raises(NotImplementedError, match="raise"):
        cnp.put(x, [0], 1.0, mode="raise", inplace=False)
    with pytest.raises(ShapeError, match="one length"):
        cnp.fill_diagonal(np.zeros((2, 3, 3)), 1.0, inplace=False)
    with pytest.raises(ShapeError, match="same size"):
        cnp.place(x, np.ones(4, bool), 1.0, inplace=False)


def test_put_drops_out_of_range_indices_by_default():
    x = np.zeros(5)
    assert np.array_equal(cnp.put(x, np.array([0, 9, -1, -7]), [1.0, 2.0], inplace=False), [1.0, 0, 0, 0, 1.0])
    assert np.array_equal(cnp.put(x, np.array([9]), 3.0, mode="clip", inplace=False), [0, 0, 0, 0, 3.0])
    assert np.array_equal(cnp.put(x, np.array([7]), 3.0, mode="wrap", inplace=False), [0, 0, 3.0, 0, 0])


def test_shape_errors_name_the_function():
    with pytest.raises(ShapeError, match="rot90 requires its first argument to have ndim at least two"):
        cnp.rot90(np.ones(3))
    with pytest.raises(ValueError, match="rot90: the axes must be different"):
        cnp.rot90(np.ones((2, 2)), axes=(1, -1))
    with pytest.raises(ShapeError, match="vsplit: the array must have at least 2 dims"):
        cnp.vsplit(np.ones(4), 2)
    with pytest.raises(ShapeError, match="dsplit"):
        cnp.dsplit(np.ones((2, 2)), 2)
    with pytest.raises(ShapeError, match="does not divide"):
        cnp.hsplit(np.ones((2, 3)), 2)
    with pytest.raises(ShapeError, match="rollaxis: start=4"):
        cnp.rollaxis(np.ones((2, 3)), 0, 4)
    with pytest.raises(TypeError, match="tuple"):
        cnp.block([(np.ones(2), np.ones(2))])
    with pytest.raises(ValueError, match="different depths"):
        cnp.block([np.ones(2), [np.ones(2)]])
    with pytest.raises(ValueError, match="same length"):
        cnp.select([np.ones(2) > 0], [np.ones(2), np.ones(2)])
    with pytest.raises(ValueError, match="either 1 or 2 functions"):
        cnp.piecewise(np.ones(2), [np.ones(2) > 0], [1.0, 2.0, 3.0])
    with pytest.raises(ShapeError, match="add up to 4"):
        lax.split(np.ones(4), [1, 2])
    with pytest.raises(ShapeError, match="one entry per dim"):
        lax.tile(np.ones((2, 2)), (2,))
    with pytest.raises(ValueError, match="non-negative"):
        cnp.resize(np.ones(2), (-1, 2))


def test_resize_of_an_empty_array_is_zeros():
    assert np.array_equal(cnp.resize(np.ones(0), (2, 3)), np.zeros((2, 3)))
    assert cnp.resize(np.ones(4), 0).shape == (0,)


def test_insert_under_jit_with_traced_indices_and_values():
    x = np.arange(6.0).reshape(2, 3)
    f = cv.jit(lambda x, i, v: cnp.insert(x, i, v, axis=1))
    i, v = np.array([3, 0, 3]), np.array([10.0, 20.0, 30.0])
    assert np.array_equal(f(x, i, v), np.insert(x, i, v, axis=1))
    assert np.array_equal(cnp.insert(x, -1, [[7.0], [8.0]], axis=1), np.insert(x, -1, [[7.0], [8.0]], axis=1))
    with pytest.raises(TypeError, match="integers"):
        cnp.insert(x, np.array([0.5]), 1.0)
