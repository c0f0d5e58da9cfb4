"""lax.all_to_all over several named axes (NOTE [all_to_all over several names]) against a
loop over the members: member m = (i, j) gets from every member c the slice m of c's
split axis, stacked (tiled: concatenated) along concat_axis, the members i-major."""
import itertools

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax
from cuvmap.test_util import check_grads


def _reference(xs, split_axis, concat_axis, tiled):
    """xs: (n_i, n_j, *shape), one operand per member."""
    ni, nj = xs.shape[:2]
    n = ni * nj
    members = [xs[i, j] for i, j in itertools.product(range(ni), range(nj))]
    out = np.empty((ni, nj), dtype=object)
    for m, (i, j) in enumerate(itertools.product(range(ni), range(nj))):
        if tiled:
            pieces = [np.split(x, n, axis=split_axis)[m] for x in members]
            out[i, j] = np.concatenate(pieces, axis=concat_axis)
        else:
            pieces = [np.take(x, m, axis=split_axis) for x in members]
            out[i, j] = np.stack(pieces, axis=concat_axis)
    return np.stack([np.stack(list(row)) for row in out])


def _mapped(f):
    g = cv.vmap(f, axis_name="j")
    return cv.vmap(g, axis_name="i")


@pytest.mark.parametrize("split_axis, concat_axis", [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (2, 1), (-1, 0)])
@pytest.mark.parametrize("tiled", [False, True])
def test_two_names_match_the_member_loop(split_axis, concat_axis, tiled):
    ni, nj = 2, 3
    shape = [2, 3, 4]
    s = split_axis % 3
    shape[s] = ni * nj * (2 if tiled else 1)
    xs = np.random.default_rng(0).standard_normal((ni, nj, *shape))
    f = _mapped(lambda x: lax.all_to_all(x, ("i", "j"), split_axis, concat_axis, tiled=tiled))
    np.testing.assert_array_equal(f(xs), _reference(xs, s, concat_axis, tiled))
    np.testing.assert_array_equal(cv.jit(f)(xs), _reference(xs, s, concat_axis, tiled))


def test_derivative_is_the_exchange_back():
    xs = np.random.default_rng(1).standard_normal((2, 2, 4, 3))
    f = _mapped(lambda x: lax.all_to_all(x, ("i", "j"), 0, 1))
    check_grads(lambda v: f(v) * np.arange(1.0, 49.0).reshape(2, 2, 3, 4), (xs,))


def test_size_mismatch_raises():
    f = _mapped(lambda x: lax.all_to_all(x, ("i", "j"), 0, 0))
    with pytest.raises(cv.ShapeError, match="number of members 4"):
        f(np.zeros((2, 2, 3, 5)))
