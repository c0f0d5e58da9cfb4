"""The pooling family against independent references.

- max/avg pooling in 1, 2 and 3 spatial dims, with strides and padding, against naive
  loops over every output element (float64), through ``cuvmap.lax`` and ``cuvmap.nn``
  (batched and unbatched inputs);
- gradients against naive loops, including ties (the first maximum of a window gets the
  gradient, as in torch) and NaNs; forward and reverse mode adjoint to each other;
- derivatives to second order against finite differences, vmap of grad against a loop;
- bad inputs; CuPy against NumPy on a GPU (skipped without one).

(The generic checks of every primitive — vmap for every ``in_axes``, shape rules — come
from the op table rows in ``op_table.py``.)
"""
import itertools

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax, nn
from cuvmap.core import ShapeError
from cuvmap.test_util import check_batching, check_grads


# ---------------------------------------------------------------------------------------
# Naive references: a loop over every output element and every window position
# ---------------------------------------------------------------------------------------


def _out_size(shape, k, s, p):
    return tuple((n + 2 * pi - ki) // si + 1 for n, ki, si, pi in zip(shape, k, s, p))


def _window_positions(y, k, s, p):
    """The input positions of window ``y`` in row-major tap order (outside ones included)."""
    for t in itertools.product(*map(range, k)):
        yield tuple(yi * si - pi + ti for yi, si, pi, ti in zip(y, s, p, t))


def _inside(i, shape):
    return all(0 <= a < n for a, n in zip(i, shape))


def naive_max_pool(x, k, s, p):
    """``(out, sel)``: the window maxima (padding = −inf) and the position of the first one."""
    sp = x.shape[2:]
    out_sp = _out_size(sp, k, s, p)
    out = np.empty(x.shape[:2] + out_sp)
    sel = {}
    for n, c in np.ndindex(*x.shape[:2]):
        for y in np.ndindex(*out_sp):
            best, where = -np.inf, None
            for i in _window_positions(y, k, s, p):
                v = x[(n, c) + i] if _inside(i, sp) else -np.inf
                if where is None or v > best or (np.isnan(v) and not np.isnan(best)):
                    best, where = v, i
            out[(n, c) + y] = best
            sel[(n, c) + y] = where
    return out, sel


def naive_avg_pool(x, k, s, p, count_include_pad):
    sp = x.shape[2:]
    out_sp = _out_size(sp, k, s, p)
    out = np.empty(x.shape[:2] + out_sp)
    for n, c in np.ndindex(*x.shape[:2]):
        for y in np.ndindex(*out_sp):
            vals = [x[(n, c) + i] for i in _window_positions(y, k, s, p) if _inside(i, sp)]
            out[(n, c) + y] = sum(vals) / (np.prod(k) if count_include_pad else len(vals))
    return out


def naive_max_pool_grad(x, g, k, s, p):
    """∂⟨max_pool(x), g⟩/∂x: each g[y] goes to the selected (first maximal) position."""
    _, sel = naive_max_pool(x, k, s, p)
    dx = np.zeros_like(x)
    for pos, i in sel.items():
        if _inside(i, x.shape[2:]):
            dx[pos[:2] + i] += g[pos]
    return dx


def naive_avg_pool_grad(x, g, k, s, p, count_include_pad):
    sp = x.shape[2:]
    dx = np.zeros_like(x)
    for pos in np.ndindex(*g.shape):
        inside = [i for i in _window_positions(pos[2:], k, s, p) if _inside(i, sp)]
        d = np.prod(k) if count_include_pad else len(inside)
        for i in inside:
            dx[pos[:2] + i] += g[pos] / d
    return dx


# (name, x shape, kernel, stride, padding)
GEOMETRIES = [
    ("1d", (2, 3, 9), (3,), (2,), (1,)),
    ("1d_stride1", (1, 2, 6), (2,), (1,), (0,)),
    ("2d", (2, 3, 7, 6), (3, 2), (2, 2), (1, 1)),
    ("2d_overlap", (1, 2, 5, 5), (3, 3), (1, 1), (1, 0)),
    ("2d_disjoint", (2, 2, 6, 4), (2, 2), (2, 2), (0, 0)),
    # disjoint windows that leave positions out (stride > window; a remainder), and padded
    ("2d_gaps", (2, 2, 7, 5), (2, 2), (3, 2), (0, 0)),
    ("2d_disjoint_padded", (1, 2, 6, 6), (2, 2), (2, 2), (1, 1)),
    ("3d", (1, 2, 5, 4, 6), (3, 2, 2), (2, 1, 2), (1, 1, 0)),
]
GEO_IDS = [g[0] for g in GEOMETRIES]


def _put(x, backend):
    return cv.device_put(x, "gpu") if backend == "gpu" else x


def _np(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


# ---------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,shape,k,s,p", GEOMETRIES, ids=GEO_IDS)
def test_max_pool_matches_naive(name, shape, k, s, p, backend):
    x = np.random.default_rng(0).standard_normal(shape)
    want, _ = naive_max_pool(x, k, s, p)
    got = lax.max_pool(_put(x, backend), k, s, p)
    np.testing.assert_array_equal(_np(got), want)
    # nn: batched and unbatched (a tuple kernel tells the spatial rank)
    np.testing.assert_array_equal(_np(nn.max_pool(_put(x, backend), k, s, p)), want)
    np.testing.assert_array_equal(_np(nn.max_pool(_put(x[0], backend), k, s, p)), want[0])


@pytest.mark.parametrize("include", [True, False], ids=["include_pad", "exclude_pad"])
@pytest.mark.parametrize("name,shape,k,s,p", GEOMETRIES, ids=GEO_IDS)
def test_avg_pool_matches_naive(name, shape, k, s, p, include, backend):
    x = np.random.default_rng(1).standard_normal(shape)
    want = naive_avg_pool(x, k, s, p, include)
    got = lax.avg_pool(_put(x, backend), k, s, p, count_include_pad=include)
    np.testing.assert_allclose(_np(got), want, rtol=1e-12, atol=1e-12)
    got_nn = nn.avg_pool(_put(x[0], backend), k, s, p, count_include_pad=include)
    np.testing.assert_allclose(_np(got_nn), want[0], rtol=1e-12, atol=1e-12)


def test_float32_stays_float32():
    x = np.random.default_rng(2).standard_normal((2, 3, 6, 6)).astype(np.float32)
    for include in (True, False):
        out = lax.avg_pool(x, 3, 2, 1, include)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, naive_avg_pool(x.astype(np.float64), (3, 3), (2, 2), (1, 1), include),
                                   rtol=1e-5, atol=1e-6)
    assert lax.max_pool(x, 2).dtype == np.float32
    g = cv.grad(lambda x: lax.max_pool(x, 3, 2, 1).sum())(x)
    assert g.dtype == np.float32


def test_stride_defaults_to_kernel_and_nn_names():
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 6))
    np.testing.assert_array_equal(lax.max_pool(x, 2), lax.max_pool(x, 2, 2))
    np.testing.assert_array_equal(nn.max_pool2d(x, 2), naive_max_pool(x, (2, 2), (2, 2), (0, 0))[0])
    np.testing.assert_array_equal(nn.max_pool(x, 2, spatial_dims=2), nn.max_pool2d(x, 2))
    np.testing.assert_array_equal(nn.max_pool2d(x[0], 2), nn.max_pool2d(x, 2)[0])
    np.testing.assert_allclose(nn.avg_pool1d(x[0, 0], 2), nn.avg_pool(x[0], 2, spatial_dims=1)[0])
    np.testing.assert_allclose(nn.avg_pool2d(x, 2, 1, 1), nn.avg_pool(x, (2, 2), 1, 1))
    # an int kernel is read from the rank where it has one reading: (C, L) and (N, C, D, H, W)
    np.testing.assert_array_equal(nn.max_pool(x[0, 0], 2), nn.max_pool1d(x[0, 0], 2))
    x3 = np.random.default_rng(4).standard_normal((2, 4, 4, 4))
    np.testing.assert_array_equal(nn.max_pool3d(x3, 2), nn.max_pool(x3[None], 2)[0])
    np.testing.assert_allclose(nn.avg_pool3d(x3, 2), nn.avg_pool(x3[None], 2)[0])


def test_nan_propagates():
    x = np.random.default_rng(5).standard_normal((1, 1, 4, 4))
    x[0, 0, 1, 2] = np.nan
    out = lax.max_pool(x, 2)
    assert np.isnan(out[0, 0, 0, 1]) and np.isfinite(out[0, 0, 0, 0])
    g = cv.grad(lambda x: lax.max_pool(x, 2)[0, 0, 0, 1])(x)
    assert g[0, 0, 1, 2] == 1 and g.sum() == 1


# ---------------------------------------------------------------------------------------
# Derivatives
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,shape,k,s,p", GEOMETRIES, ids=GEO_IDS)
def test_max_pool_grad_with_ties_matches_naive(name, shape, k, s, p, backend):
    """Small integers: many ties. The gradient of each window goes to its first maximum
    (torch's rule), summed where windows overlap."""
    rng = np.random.default_rng(6)
    x = rng.integers(-1, 2, size=shape).astype(np.float64)
    out_shape = (shape[0], shape[1]) + _out_size(shape[2:], k, s, p)
    g = rng.standard_normal(out_shape)
    _, pullback = cv.vjp(lambda x: lax.max_pool(x, k, s, p), _put(x, backend))
    (dx,) = pullback(_put(g, backend))
    np.testing.assert_allclose(_np(dx), naive_max_pool_grad(x, g, k, s, p), rtol=1e-12, atol=1e-12)
    # forward mode selects the same positions: ⟨jvp(t), g⟩ = ⟨t, vjp(g)⟩ even with ties
    t = rng.standard_normal(shape)
    _, t_out = cv.jvp(lambda x: lax.max_pool(x, k, s, p), (_put(x, backend),), (_put(t, backend),))
    np.testing.assert_allclose(np.sum(_np(t_out) * g), np.sum(t * _np(dx)), rtol=1e-12)


def test_tie_goes_to_first_in_row_major_order():
    x = np.zeros((1, 1, 2, 2))
    x[0, 0, 0, 1] = x[0, 0, 1, 0] = 1.0  # two maxima; (0, 1) comes first in row-major order
    g = cv.grad(lambda x: lax.max_pool(x, 2).sum())(x)
    np.testing.assert_array_equal(g[0, 0], [[0, 1], [0, 0]])


@pytest.mark.parametrize("include", [True, False], ids=["include_pad", "exclude_pad"])
@pytest.mark.parametrize("name,shape,k,s,p", GEOMETRIES, ids=GEO_IDS)
def test_avg_pool_grad_matches_naive(name, shape, k, s, p, include, backend):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape)
    out_shape = (shape[0], shape[1]) + _out_size(shape[2:], k, s, p)
    g = rng.standard_normal(out_shape)
    _, pullback = cv.vjp(lambda x: lax.avg_pool(x, k, s, p, include), _put(x, backend))
    (dx,) = pullback(_put(g, backend))
    np.testing.assert_allclose(_np(dx), naive_avg_pool_grad(x, g, k, s, p, include), rtol=1e-12, atol=1e-12)


def _distinct(rng, shape):
    """Values at least 0.1 apart: no ties, and finite differences stay inside one selection."""
    n = int(np.prod(shape))
    return (rng.permutation(n).reshape(shape) - n / 2) * 0.1


@pytest.mark.parametrize("name,shape,k,s,p", [GEOMETRIES[0], GEOMETRIES[3], GEOMETRIES[5]],
                         ids=[GEO_IDS[0], GEO_IDS[3], GEO_IDS[5]])
def test_second_order_finite_differences(name, shape, k, s, p):
    """Through a nonlinearity after the pool, so the second derivative is not zero: the
    Hessian-vector products run max_pool_gather/scatter and avg_pool_transpose under jvp/vjp."""
    rng = np.random.default_rng(8)
    x = _distinct(rng, shape)

    def f(x):
        return cv.numpy.sum(cv.numpy.sin(lax.max_pool(x, k, s, p)) + lax.avg_pool(x * x, k, s, p, False) ** 2)

    check_grads(f, (x,), order=2, atol=1e-6, rtol=1e-6)


def test_vmap_of_grad_matches_loop():
    rng = np.random.default_rng(9)
    xs = _distinct(rng, (4, 1, 3, 6, 6))
    w = rng.standard_normal((1, 3, 6, 6))

    def loss(w, x):
        h = lax.max_pool(cv.numpy.tanh(x * w), 2, 1, 1)
        return cv.numpy.sum(lax.avg_pool(h, 3, 2, 1, False) ** 2)

    check_batching(cv.grad(loss), (w, xs), in_axes=(None, 0), atol=1e-12, rtol=1e-12)
    check_batching(cv.grad(loss, argnums=1), (w, xs), in_axes=(None, 0), atol=1e-12, rtol=1e-12)
    # per-example weights too (the model-ensembling case)
    ws = rng.standard_normal((4, 1, 3, 6, 6))
    check_batching(cv.grad(loss), (ws, xs), in_axes=(0, 0), atol=1e-12, rtol=1e-12)


def _spy_impls(monkeypatch):
    """Records max_pool's outputs and the operands the gather and the scatter get."""
    import importlib

    pl = importlib.import_module("cuvmap.lax.pooling")
    seen = {"max_pool": [], "max_pool_gather": [], "max_pool_scatter": []}
    for prim in (pl.max_pool_p, pl.max_pool_gather_p, pl.max_pool_scatter_p):
        def spy(*args, _real=prim.impl, _name=prim.name, **params):
            out = _real(*args, **params)
            seen[_name].append(out if _name == "max_pool" else args)
            return out

        monkeypatch.setattr(prim, "impl", spy)
    return seen


def test_the_backward_pass_reads_the_forward_maxima(monkeypatch):
    """NOTE [the maxima as a residual]: grad's backward pass hands max_pool's own output to
    the scatter (the same array, no second max_pool), and so do forward mode and vmap(grad)."""
    seen = _spy_impls(monkeypatch)
    rng = np.random.default_rng(11)
    x = _distinct(rng, (2, 3, 6, 6))
    f = lambda x: cv.numpy.sum(cv.numpy.sin(lax.max_pool(x, 2)))  # noqa: E731
    g = cv.grad(f)(x)
    assert len(seen["max_pool"]) == 1 and len(seen["max_pool_scatter"]) == 1
    assert seen["max_pool_scatter"][0][2] is seen["max_pool"][0]
    ys, sel = naive_max_pool(x, (2, 2), (2, 2), (0, 0))
    want = np.zeros_like(x)
    for pos, i in sel.items():
        want[pos[:2] + i] += np.cos(ys[pos])
    np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-12)
    # forward mode: the gather gets the primal output
    for v in seen.values():
        del v[:]
    cv.jvp(f, (x,), (np.ones_like(x),))
    assert len(seen["max_pool"]) == 1 and seen["max_pool_gather"][0][2] is seen["max_pool"][0]
    # vmap(grad): one max_pool of the folded batch, its output the scatter's maxima
    for v in seen.values():
        del v[:]
    cv.vmap(cv.grad(f))(x[:, None])
    assert len(seen["max_pool"]) == 1 and len(seen["max_pool_scatter"]) == 1
    np.testing.assert_array_equal(seen["max_pool_scatter"][0][2], seen["max_pool"][0])


def test_gather_and_scatter_select_the_first_tap_equal_to_the_maxima():
    """With maxima that are not the windows' maxima, the selection is the first tap equal to
    them, and a window without one gathers 0 and scatters nothing (the module docstring)."""
    x = np.array([[[[1.0, 2.0], [2.0, 3.0]]]])
    t = np.array([[[[10.0, 20.0], [30.0, 40.0]]]])
    p = dict(window=(2, 2), stride=(2, 2), padding=(0, 0))
    for m, picked, where in ((3.0, 40.0, (1, 1)), (2.0, 20.0, (0, 1)), (5.0, 0.0, None), (np.nan, 0.0, None)):
        mm = np.full((1, 1, 1, 1), m)
        assert lax.max_pool_gather(t, x, mm, **p)[0, 0, 0, 0] == picked
        dx = lax.max_pool_scatter(np.full((1, 1, 1, 1), 7.0), x, mm, **p)
        want = np.zeros_like(x)
        if where is not None:
            want[(0, 0) + where] = 7.0
        np.testing.assert_array_equal(dx, want)
    xn = np.array([[[[1.0, np.nan], [np.nan, 3.0]]]])     # a NaN maximum selects the first NaN
    np.testing.assert_array_equal(lax.max_pool_scatter(np.ones((1, 1, 1, 1)), xn, **p), [[[[0, 1], [0, 0]]]])
    with pytest.raises(ShapeError, match=r"window maxima of shape \(1, 1, 2, 2\) must have the pooled shape "
                                         r"\(1, 1, 1, 1\)"):
        lax.max_pool_scatter(np.ones((1, 1, 1, 1)), x, x, **p)


def test_hessian_of_max_pool_composite():
    """hessian = jacfwd(jacrev): vmap of the jvp of the scatter. A quadratic after the pool:
    H = Pᵀ·2·P with P the selection matrix, built here by hand."""
    rng = np.random.default_rng(10)
    x = _distinct(rng, (1, 1, 3, 4))
    h = cv.hessian(lambda x: cv.numpy.sum(lax.max_pool(x, 2, 1, 0) ** 2))(x)
    _, sel = naive_max_pool(x, (2, 2), (1, 1), (0, 0))
    P = np.zeros((len(sel), x.size))
    for row, (pos, i) in enumerate(sorted(sel.items())):
        P[row, np.ravel_multi_index((0, 0) + i, x.shape)] = 1
    np.testing.assert_allclose(np.reshape(h, (x.size, x.size)), 2 * P.T @ P, atol=1e-12)


# ---------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------


def test_errors():
    x = np.zeros((2, 3, 6, 6))
    with pytest.raises(ShapeError, match="half the window"):
        lax.max_pool(x, 2, 1, 2)
    with pytest.raises(ShapeError, match="larger than the padded input"):
        lax.avg_pool(x, 8)
    with pytest.raises(ShapeError, match="one entry per spatial dim"):
        lax.max_pool(x, (2, 2, 2))
    with pytest.raises(ShapeError, match="floating point"):
        lax.max_pool(x.astype(np.int64), 2)
    with pytest.raises(ShapeError, match="1, 2 or 3 spatial dims"):
        lax.max_pool(np.zeros((2, 3)), ())
    with pytest.raises(ShapeError, match="spatial dims"):
        nn.max_pool(np.zeros((3, 6)), 2, spatial_dims=2)
    # the error names the op and the shapes under a transform too
    with pytest.raises(ShapeError, match="max_pool"):
        cv.vmap(lambda x: lax.max_pool(x, 2, 1, 2))(np.zeros((2,) + x.shape))


# ---------------------------------------------------------------------------------------
# GPU: CuPy against NumPy, derivatives and vmap included (skipped without a device)
# ---------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_matches_cpu_under_transforms():
    if not cv.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    rng = np.random.default_rng(11)
    xs = _distinct(rng, (3, 2, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((2, 4, 1, 1)).astype(np.float32)

    def loss(w, x):  # the two pools have different shapes ((2, 4, 4, 4) and (2, 4, 8, 7)): summed apart
        return (cv.numpy.sum(cv.numpy.sin(lax.max_pool(x * w, (3, 2), 2, 1)))
                + cv.numpy.sum(lax.avg_pool(x * w, 2, 1, 1, False)))

    f = cv.vmap(cv.grad(loss), in_axes=(None, 0))
    cpu = f(w, xs)
    gpu = f(cv.device_put(w, "gpu"), cv.device_put(xs, "gpu"))
    assert type(gpu).__module__.startswith("cupy")
    np.testing.assert_allclose(gpu.get(), cpu, rtol=1e-5, atol=1e-5)
