"""Rows for the generic op tests (``tests/lax/test_ops.py``, ``tests/jit/test_jit.py``)
of the ``jax.numpy`` names of issue 32 item 5: each function of :mod:`cuvmap.numpy`
against NumPy (value), finite differences (``grad`` forward and reverse, float64),
a loop (``vmap`` over each operand) and ``jit``. ``op_table.COMPOSITE_ROWS`` includes
them. References are NumPy's functions, or closed forms where NumPy has none."""
import warnings

import numpy as np

from cuvmap import numpy as cnp

_NAN_FREE_COLUMN = np.arange(5) > 0  # column 0 never becomes NaN: no all-NaN slice


def _quietly(f, *args):
    """``f(*args)`` with its DeprecationWarning (NumPy 2's for its deprecated aliases) checked
    and kept out of the log."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(*args)
    assert any(w.category is DeprecationWarning for w in caught), caught
    return out


def _with_nans(lib, x, m):
    """``x`` with NaN where the mask ``m`` holds (never in column 0)."""
    return lib.where(lib.logical_and(m, _NAN_FREE_COLUMN), np.nan, x)


def _nan_reductions(lib, x, m):
    y = _with_nans(lib, x, m)
    return lib.stack([lib.nansum(y, 1), lib.nanprod(y, 1), lib.nanmax(y, 1), lib.nanmin(y, 1),
                      lib.nanmean(y, 1), lib.nanvar(y, 1), lib.nanstd(y, 1)])


def _nan_reductions_keepdims(lib, x, m):
    y = _with_nans(lib, x, m)
    return (lib.nansum(y, 1, keepdims=True) + lib.nanmean(y, keepdims=True)
            + lib.nanmax(y, (0, 1), keepdims=True) + lib.nanvar(y, 1, keepdims=True))


def _float_tests(lib, x):
    y = lib.where(x > 1, np.nan, lib.where(x < -1, np.inf, x))
    return lib.stack([lib.isnan(y), lib.isinf(y), lib.isfinite(y)])


def _close(lib, x, y):
    return lib.stack([lib.isclose(x, y, atol=0.05), lib.isclose(x, x + 1e-9),
                      lib.isclose(x, y, rtol=0.5, atol=0) & lib.allclose(x, x)])


def _repeat_traced_ref(x, r):
    out = np.repeat(x, np.abs(r))[:7]
    return np.concatenate([out, np.repeat(x[-1:], 7 - len(out))])


def _unique_ref(x, size):
    values, index, inverse, counts = np.unique(x, True, True, True)
    k = len(values)
    pad = size - k
    values = np.concatenate([values, np.full(pad, values[0])])[:size]
    index = np.concatenate([index, np.zeros(pad, np.int64)])[:size]
    counts = np.concatenate([counts, np.zeros(pad, np.int64)])[:size]
    return values, index, inverse, counts


def _put_along_axis_ref(arr, idx, val, axis):
    out = arr.copy()
    np.put_along_axis(out, idx, val, axis)
    return out


def _sorted(lib, x):
    return lib.sort(x)


def _histogram_ref(x):
    h1, e1 = np.histogram(x, bins=4)
    h2, _ = np.histogram(x, bins=3, range=(-1.0, 1.0))
    return np.concatenate([h1, h2, e1 * 100]).astype(x.dtype)


def _histogram(x):
    h1, e1 = cnp.histogram(x, bins=4)
    h2, _ = cnp.histogram(x, bins=3, range=(-1.0, 1.0))
    return cnp.concatenate([h1, h2, cnp.stop_gradient(e1) * 100], dtype=cnp.dtype(x))


def _r_c(lib, a, b):
    return lib.concatenate([lib.r_[a, 0.5, b[0]], lib.ravel(lib.c_[a, a]), lib.ravel(lib.r_["0,2,0", a, a])])


def _search(lib, a, v):
    s = lib.sort(a)
    out = lib.stack([lib.searchsorted(s, v), lib.searchsorted(s, v, side="right"), lib.digitize(v, s),
                     lib.digitize(v, s, right=True), lib.digitize(v, s[::-1])])
    return out if lib is not np else out.astype(np.int32)  # JAX's index dtype: int32


SEARCH_METHODS = ("scan", "scan_unrolled", "sort", "compare_all")


def _search_methods(lib, a, v):
    """Every ``method`` of ``searchsorted`` (NumPy has one) on queries with ties, NaNs and
    ``-0.0``, ``a`` given through ``sorter``, and ``digitize`` with empty bins."""
    a = lib.where(a > 0.5, lib.nan, lib.where(lib.abs(a) < 0.2, -0.0, a))
    v = lib.concatenate([lib.ravel(v), a[:3], lib.asarray([lib.nan, 0.0, -0.0], a.dtype)])
    order = lib.argsort(a)
    if lib is np:
        one = [np.searchsorted(a, v, side=side, sorter=order) for side in ("left", "right")]
        return np.concatenate(one * len(SEARCH_METHODS) + [np.digitize(v, a[:0])]).astype(np.int32)
    return lib.concatenate([lib.searchsorted(a, v, side=side, sorter=order, method=m)
                            for m in SEARCH_METHODS for side in ("left", "right")] + [lib.digitize(v, a[:0])])


def _complex_parts(lib, ar, ai, vr, vi):
    """``correlate`` (which conjugates ``v``) and ``convolve`` of complex operands, each
    length order and mode, as real and imaginary parts."""
    a, v = ar + 1j * ai, vr + 1j * vi
    outs = [f(x, y, mode) for f in (lib.correlate, lib.convolve) for x, y in ((a, v), (v, a), (a, vr))
            for mode in ("full", "same", "valid")]
    out = lib.concatenate(outs)
    return lib.concatenate([lib.real(out), lib.imag(out)]).astype(ar.dtype)


def _interp_complex(lib, x, xp, fr, fi):
    """``interp`` with complex ``fp`` (x and xp stay real), with and without ``period``."""
    xp = lib.sort(xp)
    out = lib.concatenate([lib.interp(x, xp, fr + 1j * fi), lib.interp(x, xp, fr + 1j * fi, period=1.7)])
    return lib.concatenate([lib.real(out), lib.imag(out)]).astype(x.dtype)


def _pad_with_sums(vector, pad_width, axis, kwargs):
    """A callable ``pad`` mode, JAX's protocol (returns the vector): both pads take the
    interior's sum times ``scale``."""
    lo, hi = pad_width
    n = vector.shape[0]
    total = vector[lo:n - hi].sum() * kwargs.get("scale", 1.0)
    return vector.at[:lo].set(total).at[n - hi:].set(total)


def _pad_with_sums_ref(vector, pad_width, axis, kwargs):
    """NumPy's protocol for the same mode: writes into ``vector``."""
    lo, hi = pad_width
    n = vector.shape[0]
    vector[:lo] = vector[n - hi:] = vector[lo:n - hi].sum() * kwargs.get("scale", 1.0)


def _nonzero_sized(x):
    m = x > 0
    rows, cols = cnp.nonzero(m, size=7, fill_value=-1)
    w_rows, _ = cnp.where(m, size=3)
    return cnp.concatenate([rows, cols, w_rows, cnp.flatnonzero(m, size=4), cnp.ravel(cnp.argwhere(m, size=2))])


def _nonzero_sized_ref(x):
    m = x > 0
    rows, cols = np.nonzero(m)

    def fit(v, n, fill):
        return np.concatenate([v, np.full(max(n - len(v), 0), fill)])[:n]

    flat = np.flatnonzero(m)
    return np.concatenate([fit(rows, 7, -1), fit(cols, 7, -1), fit(rows, 3, 0), fit(flat, 4, 0),
                           np.ravel(np.stack([fit(rows, 2, 0), fit(cols, 2, 0)], -1))])


def _compress_ref(c, a, size, fill):
    kept = np.compress(c, a, axis=1)
    pad = np.full((a.shape[0], size - kept.shape[1]), fill, a.dtype)
    return np.concatenate([kept, pad], 1)[:, :size]


def rows():
    """The rows of the ``jax.numpy`` functions of issue 32 item 5."""
    # op_table builds its COMPOSITE_ROWS from this function (a documented cycle: imported here)
    from op_table import F64, I64, NUMERIC, A, I, P, Row

    return [
        # elementwise composites
        Row("logaddexp", cnp.logaddexp, np.logaddexp, [A(3, 4), A(4)]),
        Row("logaddexp_ties", lambda x: cnp.logaddexp(x, x) + cnp.logaddexp2(x, x * 1.0),
            lambda x: np.logaddexp(x, x) + np.logaddexp2(x, x), [A(3)]),
        Row("logaddexp2", cnp.logaddexp2, np.logaddexp2, [A(3, 1), A(4)]),
        Row("sinc", cnp.sinc, np.sinc, [A(3, 4)]),
        Row("sinc_integers_and_zero", lambda x: cnp.sinc(x * 0.5), lambda x: np.sinc(x * 0.5), [A(3, 4, domain="ints")]),
        Row("isnan_isinf_isfinite", lambda x: _float_tests(cnp, x), lambda x: _float_tests(np, x),
            [A(3, 4, domain="grid0")], differentiable=False),
        Row("isclose_allclose", lambda x, y: _close(cnp, x, y), lambda x, y: _close(np, x, y),
            [A(3, 4), A(4)], differentiable=False, dtypes=(F64,)),
        # ranges
        Row("linspace", lambda a, b: cnp.linspace(a, b, 5, axis=1), lambda a, b: np.linspace(a, b, 5, axis=1),
            [A(2), A(2)], tol32=(1e-5, 1e-5)),
        Row("linspace_no_endpoint_step", lambda a, b: cnp.linspace(a, b, 4, endpoint=False, retstep=True)[0] * 2
            + cnp.linspace(a, b, 4, endpoint=False, retstep=True)[1],
            lambda a, b: np.linspace(a, b, 4, endpoint=False) * 2 + (b - a) / 4, [A(), A()], tol32=(1e-5, 1e-5)),
        Row("logspace", lambda a, b: cnp.logspace(a, b, 4, base=2.0), lambda a, b: np.logspace(a, b, 4, base=2.0),
            [A(3, domain="unit"), A(3, domain="unit")], tol32=(1e-5, 1e-5)),
        Row("geomspace", lambda a, b: cnp.geomspace(a, b, 5), lambda a, b: np.geomspace(a, b, 5).astype(a.dtype),
            [A(domain="positive"), A(domain="positive")], tol32=(1e-5, 1e-5)),
        Row("meshgrid", lambda x, y: sum(k * g for k, g in enumerate(cnp.meshgrid(x, y), 1))
            + sum(k * g for k, g in enumerate(cnp.meshgrid(x, y, indexing="ij"), 1)).T,
            lambda x, y: sum(k * g for k, g in enumerate(np.meshgrid(x, y), 1))
            + sum(k * g for k, g in enumerate(np.meshgrid(x, y, indexing="ij"), 1)).T, [A(3), A(4)]),
        # joining, repeating, removing
        Row("stacking", lambda a, b: cnp.concatenate([cnp.ravel(cnp.vstack([a, b])), cnp.ravel(cnp.hstack([a[0], b[0]])),
                                                       cnp.ravel(cnp.dstack([b, b])), cnp.ravel(cnp.column_stack([a[0], b[1]]))]),
            lambda a, b: np.concatenate([np.ravel(np.vstack([a, b])), np.ravel(np.hstack([a[0], b[0]])),
                                         np.ravel(np.dstack([b, b])), np.ravel(np.column_stack([a[0], b[1]]))]),
            [A(1, 3), A(2, 3)], dtypes=NUMERIC),
        Row("row_stack_deprecated_alias", lambda a, b: _quietly(cnp.row_stack, [a, b[0]]),
            lambda a, b: np.vstack([a, b[0]]), [A(1, 3), A(2, 3)], dtypes=NUMERIC),
        Row("append", lambda a, b: cnp.concatenate([cnp.append(a, b), cnp.ravel(cnp.append(a, b[:1], axis=0))]),
            lambda a, b: np.concatenate([np.append(a, b), np.ravel(np.append(a, b[:1], axis=0))]), [A(1, 3), A(2, 3)], dtypes=NUMERIC),
        Row("repeat", lambda x: cnp.concatenate([cnp.ravel(cnp.repeat(x, 2, axis=1)), cnp.repeat(x, 3),
                                                  cnp.ravel(cnp.repeat(x, [1, 0, 2], axis=0))]),
            lambda x: np.concatenate([np.ravel(np.repeat(x, 2, axis=1)), np.repeat(x, 3),
                                      np.ravel(np.repeat(x, [1, 0, 2], axis=0))]), [A(3, 2)], dtypes=NUMERIC),
        Row("repeat_traced_counts", lambda x, r: cnp.repeat(x, cnp.abs(r), total_repeat_length=7), _repeat_traced_ref,
            [A(4), I((4,), 3)]),
        Row("tile", lambda x: cnp.ravel(cnp.tile(x, (2, 1, 2))) + cnp.ravel(cnp.tile(x, 4))[:1],
            lambda x: np.ravel(np.tile(x, (2, 1, 2))) + np.ravel(np.tile(x, 4))[:1], [A(2, 3)], dtypes=NUMERIC),
        Row("delete_traced_unique_indices", lambda x, p: cnp.delete(x, cnp.argsort(p)[:2] - 2, axis=1, assume_unique_indices=True),
            lambda x, p: np.delete(x, np.argsort(p)[:2] - 2, axis=1), [A(3, 4), A(4, domain="distinct")]),
        Row("interp_complex_fp", lambda x, xp, fr, fi: _interp_complex(cnp, x, xp, fr, fi),
            lambda x, xp, fr, fi: _interp_complex(np, x, xp, fr, fi), [A(7, domain="distinct"), A(5, domain="distinct"), A(5), A(5)]),
        Row("pad_callable_mode", lambda x: cnp.pad(x, ((1, 2), (0, 1)), _pad_with_sums, scale=0.5),
            lambda x: np.pad(x, ((1, 2), (0, 1)), _pad_with_sums_ref, scale=0.5), [A(3, 4)]),
        Row("delete", lambda x: cnp.ravel(cnp.delete(x, [0, -1], axis=1)) * 2 + cnp.delete(x, slice(1, None))[0],
            lambda x: np.ravel(np.delete(x, [0, -1], axis=1)) * 2 + np.delete(x, slice(1, None))[0], [A(3, 4)],
            dtypes=NUMERIC),
        Row("diff", lambda x, p: cnp.ravel(cnp.diff(x, 2, axis=1, prepend=p)) + cnp.ravel(cnp.diff(x, axis=0, append=1.5))[0],
            lambda x, p: np.ravel(np.diff(x, 2, axis=1, prepend=p)) + np.ravel(np.diff(x, axis=0, append=1.5))[0],
            [A(3, 4), A(3, 1)]),
        Row("ediff1d", lambda x, b: cnp.ediff1d(x, to_begin=b, to_end=-1.0),
            lambda x, b: np.ediff1d(x, to_begin=b, to_end=-1.0), [A(2, 3), A(2)]),
        # Python scalars are weakly typed (JAX's and NEP 50's rule): a float32 result stays float32
        Row("r_c_", lambda a, b: _r_c(cnp, a, b), lambda a, b: _r_c(np, a, b).astype(a.dtype), [A(3), A(2)]),
        # products and signals
        Row("kron", cnp.kron, np.kron, [A(2, 3), A(2, 2)], dtypes=NUMERIC),
        Row("kron_ranks", cnp.kron, np.kron, [A(3), A(2, 1, 2)]),
        Row("convolve_modes", lambda a, v: cnp.concatenate([cnp.convolve(a, v), cnp.convolve(a, v, "same"),
                                                            cnp.convolve(v, a, "valid")]),
            lambda a, v: np.concatenate([np.convolve(a, v), np.convolve(a, v, "same"), np.convolve(v, a, "valid")]),
            [A(5), A(3)]),
        Row("correlate_modes", lambda a, v: cnp.concatenate([cnp.correlate(a, v), cnp.correlate(a, v, "full"),
                                                             cnp.correlate(v, a, "same")]),
            lambda a, v: np.concatenate([np.correlate(a, v), np.correlate(a, v, "full"), np.correlate(v, a, "same")]),
            [A(6), A(4)]),
        Row("correlate_convolve_complex", lambda ar, ai, vr, vi: _complex_parts(cnp, ar, ai, vr, vi),
            lambda ar, ai, vr, vi: _complex_parts(np, ar, ai, vr, vi), [A(5), A(5), A(3), A(3)]),
        Row("polyval", cnp.polyval, np.polyval, [A(4), A(2, 3)]),
        Row("einsum_sublists", lambda a, b: cnp.einsum(a, [0, 1], b, [1, 2], [2, 0]),
            lambda a, b: np.einsum(a, [0, 1], b, [1, 2], [2, 0]), [A(2, 3), A(3, 4)]),
        Row("tensordot_scalar_inner_scalar", lambda x: cnp.tensordot(x, 2.0, axes=0) + cnp.inner(1.5, x),
            lambda x: (np.tensordot(x, 2.0, axes=0) + np.inner(1.5, x)).astype(x.dtype), [A(3)]),
        Row("mean_std_of_list", lambda x: cnp.stack([cnp.mean([x[0], x[1] + 2]), cnp.std([x[0], x[1] * 2]),
                                                     cnp.var([x[1], x[2]], ddof=1)]),
            lambda x: np.stack([np.mean([x[0], x[1] + 2]), np.std([x[0], x[1] * 2]), np.var([x[1], x[2]], ddof=1)]),
            [A(3)]),
        # reductions with jax.numpy's keywords
        Row("reductions_where_initial", lambda x, m: cnp.stack([cnp.sum(x, 1, where=m), cnp.mean(x, 1, where=m | (x == cnp.max(x, 1, keepdims=True))),
                                                                 cnp.max(x, 1, initial=0.5), cnp.prod(x, 1, where=m),
                                                                 cnp.var(x, 1, where=m | (x >= cnp.min(x, 1, keepdims=True)))]),
            lambda x, m: np.stack([np.sum(x, 1, where=m), np.mean(x, 1, where=m | (x == np.max(x, 1, keepdims=True))),
                                   np.max(x, 1, initial=0.5), np.prod(x, 1, where=m),
                                   np.var(x, 1, where=m | (x >= np.min(x, 1, keepdims=True)))]),
            [A(3, 4, domain="distinct"), P(3, 4)]),
        Row("std_constant_slice", lambda x: cnp.std(x * 0 + x[0], 0) + cnp.std(x), lambda x: np.std(x * 0 + x[0], 0)
            + np.std(x), [A(3)]),
        Row("reshape_order_f_roll_traced", lambda x, s: cnp.ravel(cnp.reshape(x, (4, 3), order="F")) + cnp.ravel(cnp.roll(x, s, 1)),
            lambda x, s: np.ravel(np.reshape(x, (4, 3), order="F")) + np.ravel(np.roll(x, int(s), 1)), [A(3, 4), I((), 4)]),
        Row("concatenate_axis_none_dtype", lambda a, b: cnp.concatenate([a, b], axis=None, dtype=np.float64),
            lambda a, b: np.concatenate([a, b], axis=None, dtype=np.float64), [A(2, 2), A(3)]),
        # methods whose NumPy namesakes agree (the rows also run on plain arrays)
        Row("tracer_methods", lambda x: cnp.concatenate([x.flatten(), x.repeat(2, 1).ravel(), x.take([2, 0], 1).ravel()]),
            lambda x: np.concatenate([x.flatten(), x.repeat(2, 1).ravel(), x.take([2, 0], 1).ravel()]),
            [A(2, 3, domain="distinct")]),
        # NaN-ignoring reductions, order statistics
        Row("nan_reductions", lambda x, m: _nan_reductions(cnp, x, m), lambda x, m: _nan_reductions(np, x, m),
            [A(3, 5, domain="distinct"), P(3, 5)], tol32=(1e-5, 1e-5)),
        Row("nan_reductions_keepdims", lambda x, m: _nan_reductions_keepdims(cnp, x, m),
            lambda x, m: _nan_reductions_keepdims(np, x, m), [A(3, 5, domain="distinct"), P(3, 5)], tol32=(1e-5, 1e-5)),
        Row("nanargmax_nanargmin", lambda x, m: cnp.stack([cnp.nanargmax(_with_nans(cnp, x, m), 1),
                                                           cnp.nanargmin(_with_nans(cnp, x, m), 1)]),
            lambda x, m: np.stack([np.nanargmax(_with_nans(np, x, m), 1), np.nanargmin(_with_nans(np, x, m), 1)]),
            [A(3, 5, domain="distinct"), P(3, 5)], differentiable=False),
        Row("quantile_methods", lambda x: cnp.stack([cnp.quantile(x, [0.1, 0.5, 0.95], axis=1, method=m)
                                                     for m in ("linear", "lower", "higher", "midpoint", "nearest")]).astype(x.dtype),
            lambda x: np.stack([np.quantile(x, np.asarray([0.1, 0.5, 0.95], x.dtype), axis=1, method=m)
                                for m in ("linear", "lower", "higher", "midpoint", "nearest")]).astype(x.dtype),
            [A(3, 6, domain="distinct")]),
        Row("quantile_traced_q", lambda x, q: cnp.quantile(x, cnp.abs(q), axis=(0, 1), keepdims=True),
            lambda x, q: np.quantile(x, np.abs(q), axis=(0, 1), keepdims=True), [A(2, 4, 3, domain="distinct"), A(3, domain="unit")]),
        Row("median_percentile", lambda x: cnp.median(x, 0) + cnp.percentile(x, 30.0, axis=0) + cnp.median(x),
            lambda x: np.median(x, 0) + np.percentile(x, 30.0, axis=0) + np.median(x), [A(4, 3, domain="distinct")]),
        Row("histogram", _histogram, _histogram_ref, [A(12)], differentiable=False),
        # searching, selecting
        Row("searchsorted_digitize", lambda a, v: _search(cnp, a, v), lambda a, v: _search(np, a, v),
            [A(6, domain="distinct"), A(2, 3, domain="distinct")], differentiable=False),
        Row("searchsorted_methods", lambda a, v: _search_methods(cnp, a, v), lambda a, v: _search_methods(np, a, v),
            [A(7), A(2, 3)], differentiable=False),
        Row("interp", lambda x, xp, fp: cnp.interp(x, cnp.sort(xp), fp) + cnp.interp(x, cnp.sort(xp), fp, left=-5.0, right=5.0),
            lambda x, xp, fp: (np.interp(x, np.sort(xp), fp) + np.interp(x, np.sort(xp), fp, left=-5.0, right=5.0)).astype(x.dtype),
            [A(7, domain="distinct"), A(5, domain="distinct"), A(5)]),
        Row("interp_period", lambda x, fp: cnp.interp(x, np.array([0.0, 0.7, 1.5, 2.2]), fp, period=2.5),
            lambda x, fp: np.interp(x, np.array([0.0, 0.7, 1.5, 2.2]), fp, period=2.5), [A(6, domain="distinct"), A(4)]),
        Row("nonzero_where_argwhere_sized", _nonzero_sized, _nonzero_sized_ref, [A(3, 4)], differentiable=False),
        Row("compress_extract_sized", lambda c, a: cnp.concatenate([cnp.ravel(cnp.compress(c, a, axis=1, size=3, fill_value=9)),
                                                                    cnp.extract(a > 0, a, size=5)]),
            lambda c, a: np.concatenate([np.ravel(_compress_ref(c, a, 3, 9)),
                                         np.concatenate([np.extract(a > 0, a), np.zeros(12, a.dtype)])[:5]]),
            [P(4), A(2, 4)]),
        Row("unique_sized", lambda x: cnp.concatenate([cnp.ravel(cnp.astype(v, np.float64)) for v in cnp.unique(x, True, True, True, size=8)]),
            lambda x: np.concatenate([np.asarray(v, np.float64).ravel() for v in _unique_ref(x.ravel(), 8)]),
            [A(2, 5, domain="ints")], differentiable=False, dtypes=(I64,)),
        Row("unique_values_differentiable", lambda x: cnp.unique(x, size=4, fill_value=0.0) * 2,
            lambda x: np.concatenate([np.unique(x), np.zeros(4, x.dtype)])[:4] * 2, [A(3, domain="distinct")]),
        Row("put_along_axis", lambda a, i, v: cnp.put_along_axis(a, i, v, 1, inplace=False),
            lambda a, i, v: _put_along_axis_ref(a, i, v, 1), [A(3, 4), I((3, 2), 4), A(3, 2)]),
        Row("put_along_axis_repeated_index", lambda a, v: cnp.put_along_axis(a, np.array([[1, 1, -3]]), v, 1, inplace=False),
            lambda a, v: _put_along_axis_ref(a, np.array([[1, 1, -3]]), v, 1), [A(2, 4), A(2, 3)]),
        Row("index_helpers", lambda i: cnp.concatenate([cnp.stack(cnp.unravel_index(i, (3, 4))).ravel(),
                                                        cnp.ravel_multi_index((i, i), (12, 12), mode="wrap"),
                                                        cnp.count_nonzero(i > 0, axis=0, keepdims=True)]),
            lambda i: np.concatenate([np.stack(np.unravel_index(i % 12, (3, 4))).ravel(),
                                      np.ravel_multi_index((i % 12, i % 12), (12, 12)),
                                      np.count_nonzero(i > 0, axis=0, keepdims=True)]),
            [I((5,), 12)], differentiable=False, dtypes=(F64,)),
    ]

