"""``lax.reduce_window`` and ``reduce_window_sum/max/min`` (cuvmap/lax/windowed.py) against
a direct loop reference (tests/lax/window_reference.py): window sizes, strides, padding
names and pairs, base and window dilation, non-identity init values, a variadic reducer;
the max_pool route against the tap fold; derivatives to second order (float64, both
modes); vmap against a loop; jit."""
import itertools

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax
from cuvmap.core import ShapeError
from cuvmap.lax import windowed
from cuvmap.test_util import check_batching, check_grads

from window_reference import reduce_window_reference

# (shape, window, strides, padding, base_dilation, window_dilation)
GEOMETRIES = [
    ((4, 6), (2, 1), (1, 1), "VALID", None, None),
    ((4, 6), (1, 2), (2, 1), "SAME", (2, 3), None),
    ((4, 6), (2, 2), (1, 2), [(0, 3), (1, 2)], None, (1, 2)),
    ((4, 6), (3, 2), (2, 2), "SAME_LOWER", None, None),
    ((3, 2, 4, 6), (1, 1, 2, 1), (1, 2, 2, 1), "SAME", (2, 1, 3, 2), (1, 2, 2, 1)),
    ((3, 2, 4, 6), (2, 1, 2, 1), (1, 1, 1, 1), [(0, 1), (1, 0), (2, 3), (0, 2)], None, None),
    ((2, 3, 6, 5), (1, 1, 3, 3), (1, 1, 2, 2), [(0, 0), (0, 0), (1, 1), (1, 1)], None, None),  # max_pool's shape
    ((5, 7), (2, 3), (1, 1), [(-1, 1), (2, -2)], None, None),  # negative padding crops
    ((7,), (3,), (2,), "VALID", (2,), (2,)),
]
GEO_IDS = [f"{g[0]}-w{g[1]}-s{g[2]}-{g[3] if isinstance(g[3], str) else 'pairs'}-b{g[4]}-d{g[5]}" for g in GEOMETRIES]
# (name, reducer, init, NumPy binary op)
MONOIDS = [
    ("add", lax.add, 0.0, np.add),
    ("max", lax.max, -np.inf, np.maximum),
    ("min", lax.min, np.inf, np.minimum),
    ("mul", lax.mul, 1.0, np.multiply),
    ("add-init-2", lax.add, 2.0, np.add),
    ("max-init-0", cnp.maximum, 0.0, np.maximum),
]
MONOID_IDS = [m[0] for m in MONOIDS]


def _pads(shape, geometry):
    _, window, strides, padding, _, wdil = geometry
    if isinstance(padding, str):
        wdil = wdil or (1,) * len(shape)
        return lax.padtype_to_pads(shape, [1 + d * (k - 1) for k, d in zip(window, wdil)], strides, padding)
    return padding


def _ones(value, n):
    return value or (1,) * n


@pytest.mark.parametrize("name,op,init,np_op", MONOIDS, ids=MONOID_IDS)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=GEO_IDS)
def test_value_against_loops(geometry, name, op, init, np_op):
    shape, window, strides, padding, base, wdil = geometry
    x = np.random.default_rng(0).standard_normal(shape)
    got = lax.reduce_window(x, init, op, window, strides, padding, base, wdil)
    ref = reduce_window_reference(x, init, np_op, window, strides, _pads(shape, geometry), _ones(base, len(shape)),
                                  _ones(wdil, len(shape)))
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-12)


@pytest.mark.parametrize("form,init,np_op", [(lax.reduce_window_sum, 0.0, np.add),
                                              (lax.reduce_window_max, -np.inf, np.maximum),
                                              (lax.reduce_window_min, np.inf, np.minimum)],
                         ids=["sum", "max", "min"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=GEO_IDS)
def test_monoid_forms(geometry, form, init, np_op):
    shape, window, strides, padding, base, wdil = geometry
    x = np.random.default_rng(1).standard_normal(shape)
    ref = reduce_window_reference(x, init, np_op, window, strides, _pads(shape, geometry), _ones(base, len(shape)),
                                  _ones(wdil, len(shape)))
    np.testing.assert_allclose(form(x, window, strides, padding, base, wdil), ref, rtol=1e-12)


def test_integers():
    x = np.random.default_rng(2).integers(-9, 9, (4, 6)).astype(np.int32)
    got = lax.reduce_window(x, np.int32(np.iinfo(np.int32).min), lax.max, (2, 2), (1, 1), "SAME")
    assert got.dtype == np.int32
    ref = reduce_window_reference(x, np.iinfo(np.int32).min, np.maximum, (2, 2), (1, 1),
                                  lax.padtype_to_pads((4, 6), (2, 2), (1, 1), "SAME"), (1, 1), (1, 1))
    np.testing.assert_array_equal(got, ref)


def test_the_max_pool_route_is_taken_and_agrees():
    shape, window, strides, padding, base, wdil = GEOMETRIES[6]
    geometry = windowed._window_geometry(shape, window, strides, padding, base, wdil)
    x = np.random.default_rng(3).standard_normal(shape)
    assert windowed._as_max_pool(x, geometry) is not None
    fold = windowed._fold_taps(lambda a, b: [np.maximum(a[0], b[0])], [x], [-np.inf], geometry, start_with_init=False)
    np.testing.assert_array_equal(lax.reduce_window(x, -np.inf, lax.max, window, strides, padding), fold[0])


def test_variadic_argmax_pooling():
    """A (value, index) reducer: the index of each window's first maximum."""
    rng = np.random.default_rng(4)
    v = rng.standard_normal(8)
    idx = np.arange(8)

    def op(a, b):
        keep = a[0] >= b[0]
        return cnp.where(keep, a[0], b[0]), cnp.where(keep, a[1], b[1])

    m, i = lax.reduce_window((v, idx), (-np.inf, np.int64(-1)), op, (2,), (2,), "VALID")
    np.testing.assert_array_equal(i, 2 * np.arange(4) + v.reshape(4, 2).argmax(1))
    np.testing.assert_allclose(m, v.reshape(4, 2).max(1))


@pytest.mark.parametrize("name,op,init,np_op", MONOIDS, ids=MONOID_IDS)
@pytest.mark.parametrize("geometry", [GEOMETRIES[i] for i in (1, 2, 4, 6, 7)], ids=[GEO_IDS[i] for i in (1, 2, 4, 6, 7)])
def test_grads_both_modes(geometry, name, op, init, np_op):
    shape, window, strides, padding, base, wdil = geometry
    x = np.random.default_rng(5).standard_normal(shape)

    def f(x):  # a window of holes only is ±inf, a constant: left out (finite differences give NaN there)
        out = lax.reduce_window(x, init, op, window, strides, padding, base, wdil)
        return cnp.where(cnp.abs(out) < np.inf, out, 0.0)

    check_grads(f, (x,), order=2)


@pytest.mark.parametrize("name,op,init,np_op", MONOIDS[:3], ids=MONOID_IDS[:3])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=GEO_IDS)
def test_vmap_against_loop(geometry, name, op, init, np_op):
    shape, window, strides, padding, base, wdil = geometry
    rng = np.random.default_rng(6)
    for axis in range(len(shape) + 1):
        x = np.moveaxis(rng.standard_normal((3,) + shape), 0, axis)
        check_batching(lambda x: lax.reduce_window(x, init, op, window, strides, padding, base, wdil), (x,),
                       in_axes=axis, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("geometry", GEOMETRIES[:3] + GEOMETRIES[6:7], ids=GEO_IDS[:3] + GEO_IDS[6:7])
def test_jit(geometry):
    shape, window, strides, padding, base, wdil = geometry
    x = np.random.default_rng(7).standard_normal(shape)
    for op, init in [(lax.add, 0.0), (lax.max, -np.inf)]:
        f = lambda x: lax.reduce_window(x, init, op, window, strides, padding, base, wdil)  # noqa: E731
        np.testing.assert_allclose(cv.jit(f)(x), f(x), rtol=1e-12)
        np.testing.assert_allclose(cv.jit(cv.grad(lambda x: f(x).sum()))(x), cv.grad(lambda x: f(x).sum())(x),
                                   rtol=1e-12)


def test_errors():
    with pytest.raises(ShapeError, match="reduce_window: window_dimensions"):
        lax.reduce_window(np.ones((3, 4)), 0.0, lax.add, (2,), (1, 1), "VALID")
    with pytest.raises(ShapeError, match="reduce_window: padding"):
        lax.reduce_window(np.ones((3, 4)), 0.0, lax.add, (2, 2), (1, 1), [(1, 1)])
    with pytest.raises(ShapeError, match="padtype_to_pads"):
        lax.reduce_window(np.ones((3, 4)), 0.0, lax.add, (2, 2), (1, 1), "FULL")
