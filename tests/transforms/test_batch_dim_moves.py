"""vmap's helpers that move and fold a batch dim (cuvmap/transforms/batching.py), and the
axis orders the shape and product rules work out in Python (lax.shape.argsort_ints):
each against NumPy's own moveaxis, reshape and argsort."""
import itertools

import numpy as np
import pytest

import cuvmap as cv
from cuvmap.lax import shape as lax_shape
from cuvmap.transforms import batching

# shapes with size-1 dims in every position (fold_bdim_into folds with one reshape when the
# batch dim crosses only those) and without
SHAPES = [(3, 1, 4, 5), (1, 3, 1, 1, 2), (2, 1, 1, 3), (3, 4, 1, 2), (1, 1, 1, 1), (2, 3, 4), (0, 1, 3)]


def _fold_reference(x, bdim, dst):
    x = np.moveaxis(x, bdim, dst)
    s = x.shape
    return x.reshape(s[:dst] + (s[dst] * s[dst + 1],) + s[dst + 2:])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fold_bdim_into_is_moveaxis_then_merge(shape):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    for bdim, dst in itertools.product(range(len(shape)), range(len(shape) - 1)):
        got = batching.fold_bdim_into(x, bdim, dst)
        expected = _fold_reference(x, bdim, dst)
        assert got.shape == expected.shape, (bdim, dst)
        np.testing.assert_array_equal(got, expected)


def test_fold_across_size_one_dims_binds_one_reshape():
    x = np.ones((8, 1, 3, 4), np.float32)
    jaxpr = cv.make_jaxpr(lambda x: batching.fold_bdim_into(x, 0, 1))(x)
    assert [e.primitive.name for e in jaxpr.jaxpr.eqns] == ["reshape"]


SEQUENCES = [(), (0,), (1, 0), (2, 0, 1), (0, 2, 1, 3), (3, 1, 4, 0, 2), (5, 2, 7)]


@pytest.mark.parametrize("values", SEQUENCES, ids=str)
def test_argsort_ints_is_numpys_argsort(values):
    got = lax_shape.argsort_ints(values)
    assert got == tuple(int(i) for i in np.argsort(np.asarray(values, dtype=int)))
    assert all(type(i) is int for i in got)
