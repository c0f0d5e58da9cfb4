"""Rows for the generic op tests (``tests/lax/test_ops.py``, ``tests/jit/test_jit.py``)
of the ``jax.numpy`` array manipulation, selection, placing and window names of issue 32
(``cuvmap/numpy/_manipulation.py``, ``_selecting.py``, ``_placing.py``, ``_windows.py``)
and of ``lax.split``/``lax.tile``: each against NumPy (value), finite differences
(``grad`` forward and reverse, float64), a loop (``vmap`` over each operand) and ``jit``.
``op_table.COMPOSITE_ROWS`` includes them. The names without array operands or with
integer-only results are tested in ``tests/numpy/test_manipulation.py``."""
import numpy as np

from cuvmap import lax
from cuvmap import numpy as cnp

_ROT90_CASES = [(k, axes) for k in (-1, 0, 1, 2, 3) for axes in ((0, 1), (2, 0), (-1, 1))]


def _rot90(lib, x):
    return lib.concatenate([lib.ravel(lib.rot90(x, k, axes)) for k, axes in _ROT90_CASES])


def _rollaxis(lib, x):
    return lib.concatenate([lib.ravel(lib.rollaxis(x, a, s)) * (i + 1)
                            for i, (a, s) in enumerate([(2, 0), (0, 3), (-1, 1), (1, -3), (0, 1)])])


def _weighted(lib, pieces):
    return lib.concatenate([lib.ravel(p) * (i + 1) for i, p in enumerate(pieces)])


def _splits(lib, x):
    return lib.concatenate([_weighted(lib, lib.vsplit(x, 2)), _weighted(lib, lib.hsplit(x, [1, 3])),
                            _weighted(lib, lib.dsplit(x, 3)), _weighted(lib, lib.hsplit(x[0, 0], 2))])


def _unstack_ref(x, axis):
    return tuple(np.moveaxis(x, axis, 0))


def _insert_ref(x, v):
    return np.concatenate([np.ravel(np.insert(x, [0, 2, 2, -1], v, axis=1)),
                           np.ravel(np.insert(x, 1, v[:, 0], axis=1)),
                           np.insert(x, slice(1, 3), v[0, :2])])


def _insert(x, v):
    return cnp.concatenate([cnp.ravel(cnp.insert(x, [0, 2, 2, -1], v, axis=1)),
                            cnp.ravel(cnp.insert(x, 1, v[:, 0], axis=1)),
                            cnp.insert(x, slice(1, 3), v[0, :2])])


def _select(lib, x, y):
    return lib.select([x > 0.5, x < -0.5, y > 0], [x * y, y, x + 1.0], default=x * x)


def _choose(lib, a, x, y):
    return lib.choose(a, [x, y, x * y], mode="wrap") + lib.choose(a, [y, x, x], mode="clip")


def _piecewise(lib, x):
    return (lib.piecewise(x, [x < -0.5, x > 0.5], [lambda v: v ** 3, lambda v: lib.sin(v), 0.25])
            + lib.piecewise(x, [x < 0, x > -1.0], [lambda v, s: v * s, lambda v, s: v + s], 2.0))


def _sorted_sides(lib, p, kth, axis):
    """The entries of a partition at ``kth``: each side sorted, the pivot between them."""
    n = p.shape[axis]
    before = lib.sort(lib.take(p, np.arange(0, kth), axis=axis), axis=axis)
    pivot = lib.take(p, np.arange(kth, kth + 1), axis=axis)
    after = lib.sort(lib.take(p, np.arange(kth + 1, n), axis=axis), axis=axis)
    return lib.concatenate([before, pivot, after], axis=axis)


def _partition(lib, x):
    return lib.concatenate([lib.ravel(_sorted_sides(lib, lib.partition(x, 2, axis=1), 2, 1)),
                            lib.ravel(_sorted_sides(lib, lib.partition(x, -1, axis=0), 2, 0))])


def _argpartition(lib, x):
    p = lib.take_along_axis(x, lib.argpartition(x, 1, axis=-1), axis=-1)
    q = lib.take_along_axis(x, lib.argpartition(x, -2, axis=0), axis=0)
    return lib.concatenate([lib.ravel(_sorted_sides(lib, p, 1, 1)), lib.ravel(_sorted_sides(lib, q, 1, 0))])


def _place_ref(x, m, v):
    out = x.copy()
    np.place(out, m, v)
    return out


def _put_ref(mode):
    def ref(x, v, i):
        out = x.copy()
        np.put(out, i, v, mode=mode or "raise")
        return out
    return ref


def _fill_diagonal_ref(x, v):
    out = x.copy()
    np.fill_diagonal(out, v)
    return out


def _lax_split_tile(x):
    pieces = lax.split(x, (1, 0, 3), axis=1) + lax.split(x, [2, 1], axis=-3)
    return cnp.concatenate([_weighted(cnp, pieces), cnp.ravel(lax.tile(x, (2, 1, 3)))])


def _lax_split_tile_ref(x):
    pieces = np.split(x, [1, 1], axis=1) + np.split(x, [2], axis=0)
    return np.concatenate([_weighted(np, pieces), np.ravel(np.tile(x, (2, 1, 3)))])


def rows():
    """The rows of the manipulation, selection, placing and window names."""
    # op_table builds its COMPOSITE_ROWS from this function (a documented cycle: imported here)
    from op_table import A, I, P, Row

    return [
        Row("rot90", lambda x: _rot90(cnp, x), lambda x: _rot90(np, x), [A(2, 3, 4)]),
        Row("rollaxis", lambda x: _rollaxis(cnp, x), lambda x: _rollaxis(np, x), [A(2, 3, 4)]),
        Row("apply_over_axes", lambda x: cnp.apply_over_axes(cnp.sum, x, (0, 2)) + cnp.apply_over_axes(cnp.max, x, 1),
            lambda x: np.apply_over_axes(np.sum, x, (0, 2)) + np.apply_over_axes(np.max, x, 1),
            [A(2, 3, 4, domain="distinct")]),
        Row("block", lambda a, b, c: cnp.block([[a, b], [c]]), lambda a, b, c: np.block([[a, b], [c]]),
            [A(2, 2), A(2, 3), A(3, 5)]),
        Row("block_vectors_and_scalars", lambda a, b: cnp.block([[a, b], [b, a]]) + cnp.block([a, b, 1.0])[0],
            lambda a, b: np.block([[a, b], [b, a]]) + np.block([a, b, 1.0])[0], [A(3), A(2)]),
        Row("diagflat", lambda v: cnp.diagflat(v, 1) + cnp.diagflat(v, -1) * 2, lambda v: np.diagflat(v, 1)
            + np.diagflat(v, -1) * 2, [A(2, 2)]),
        Row("resize", lambda x: cnp.concatenate([cnp.ravel(cnp.resize(x, (5, 7))), cnp.resize(x, 4)]),
            lambda x: np.concatenate([np.ravel(np.resize(x, (5, 7))), np.resize(x, 4)]), [A(2, 3)]),
        Row("unstack", lambda x: cnp.stack(cnp.unstack(x, axis=1)[::-1]) + cnp.unstack(x)[1][None],
            lambda x: np.stack(_unstack_ref(x, 1)[::-1]) + _unstack_ref(x, 0)[1][None], [A(3, 3, 2)]),
        Row("vsplit_hsplit_dsplit", lambda x: _splits(cnp, x), lambda x: _splits(np, x), [A(2, 4, 6)]),
        Row("insert", _insert, _insert_ref, [A(3, 4), A(3, 4)]),
        Row("insert_traced_indices", lambda x, i: cnp.insert(x, i, 0.5), lambda x, i: np.insert(x, i, 0.5),
            [A(3, 4), I((3,), 12)]),
        Row("numpy_select", lambda x, y: _select(cnp, x, y), lambda x, y: _select(np, x, y), [A(3, 4), A(4)]),
        Row("choose", lambda a, x, y: _choose(cnp, a, x, y), lambda a, x, y: _choose(np, a, x, y),
            [I((3, 4), 5), A(3, 4), A(4)]),
        Row("piecewise", lambda x: _piecewise(cnp, x), lambda x: _piecewise(np, x), [A(3, 4)]),
        Row("partition", lambda x: _partition(cnp, x), lambda x: _partition(np, x), [A(3, 5, domain="distinct")]),
        Row("argpartition", lambda x: _argpartition(cnp, x), lambda x: _argpartition(np, x),
            [A(4, 3, domain="distinct")]),
        Row("place", lambda x, m, v: cnp.place(x, m, v, inplace=False), _place_ref, [A(3, 4), P(3, 4), A(3)]),
        Row("put", lambda x, v, i: cnp.put(x, i, v, inplace=False), _put_ref(None), [A(3, 4), A(4), I((4,), 12)]),
        Row("put_clip", lambda x, v, i: cnp.put(x, i, v, mode="clip", inplace=False), _put_ref("clip"),
            [A(3, 4), A(3), I((5,), 20)]),
        Row("put_wrap", lambda x, v, i: cnp.put(x, i, v, mode="wrap", inplace=False), _put_ref("wrap"),
            [A(3, 4), A(2), I((5,), 30)]),
        Row("fill_diagonal", lambda x, v: cnp.fill_diagonal(x, v, inplace=False), _fill_diagonal_ref,
            [A(4, 3), A(2)]),
        Row("fill_diagonal_cube", lambda x, v: cnp.fill_diagonal(x, v, inplace=False), _fill_diagonal_ref,
            [A(3, 3, 3), A()]),
        Row("kaiser", lambda b: cnp.kaiser(6, b), lambda b: np.kaiser(6, b).astype(b.dtype),
            [A(domain="positive")], tol32=(1e-5, 1e-5)),
        Row("lax_split_tile", _lax_split_tile, _lax_split_tile_ref, [A(3, 4, 2)]),
    ]
