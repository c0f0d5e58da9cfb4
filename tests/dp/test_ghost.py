"""cuvmap.dp.clipped_grad: ghost clipping and book-keeping (cuvmap/dp/ghost/).

Independent references: the vmap(grad) path (``dp.clipped_sum`` of ``vmap(grad(loss))``,
which materialises every per-example gradient), and for one network a Python loop of
``grad`` over the examples. Every network of the table runs with each layer forced to the
ghost norm and to the explicit per-example gradient, and with the cost model, in float64
to 1e-10, for batches of 0, 1 and an odd size, with and without a mask.
"""
import threading
import tracemalloc

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import backend as cv_backend
from cuvmap import dp, lax, nn, tree
from cuvmap.dp import ghost

RTOL = 1e-10


# ---------------------------------------------------------------------------------------
# The networks: (params, loss of one example, one batch of examples)
# ---------------------------------------------------------------------------------------


def _normal(rng, *shape):
    return rng.standard_normal(shape)


def _readout(h, r):
    """A scalar from any activation: a fixed nonlinear readout."""
    return cnp.sum(cnp.tanh(h) * r)


def _mlp(rng):
    params = {"w1": _normal(rng, 5, 7), "b1": _normal(rng, 7), "w2": _normal(rng, 7, 3)}

    def loss(p, x, y):
        h = cnp.tanh(x @ p["w1"] + p["b1"])
        return nn.cross_entropy((h @ p["w2"])[None], y[None])

    return params, loss, lambda rng, b: (_normal(rng, b, 5) * 2, rng.integers(0, 3, b))


def _sequence_dense(rng):
    """A dense layer over positions (T = 4), W used as torch's Linear (x @ W.T), a per-head
    weight with a dot batch dim, and a weight on the left (W @ x)."""
    params = {"w": _normal(rng, 6, 5), "heads": _normal(rng, 2, 3, 4), "left": _normal(rng, 3, 4)}
    r = _normal(rng, 2, 4, 4)

    def loss(p, x):
        h = cnp.tanh(x @ p["w"].T)                                 # (4, 6)
        h = cnp.reshape(h[:, :6], (4, 2, 3))                       # (T, heads, 3)
        z = cnp.einsum("thd,hde->hte", h, p["heads"])              # (2, 4, 4)
        q = cnp.einsum("ij,htj->hti", p["left"], cnp.tanh(z))      # left @ ...: (2, 4, 3)
        return _readout(z, r) + cnp.sum(cnp.sin(q))

    return params, loss, lambda rng, b: (_normal(rng, b, 4, 5),)


def _conv_net(conv_kwargs, nd, cin, cout, kernel, spatial, transposed=False, per_example_n=None):
    """One convolution (any case of BatchRulesConvolution.cpp) with a bias, a readout."""

    def make(rng):
        groups = conv_kwargs.get("groups", 1)
        kernel_t = (kernel,) * nd if isinstance(kernel, int) else kernel
        w_shape = (cin, cout // groups) + kernel_t if transposed else (cout, cin // groups) + kernel_t
        params = {"w": _normal(rng, *w_shape) * 0.5, "b": _normal(rng, cout)}
        x_shape = ((per_example_n,) if per_example_n else ()) + (cin,) + (spatial,) * nd
        op = nn.conv_transpose if transposed else nn.conv
        probe = op(np.zeros(x_shape), params["w"], params["b"], **conv_kwargs)
        r = _normal(rng, *probe.shape)

        def loss(p, x):
            return _readout(op(x, p["w"], p["b"], **conv_kwargs), r)

        return params, loss, lambda rng, b: (_normal(rng, b, *x_shape),)

    return make


def _embedding(rng):
    """An embedding (repeated and negative ids), a table gathered along axis 1, a dense head."""
    params = {"table": _normal(rng, 5, 3), "cols": _normal(rng, 4, 6), "head": _normal(rng, 3, 2)}

    def loss(p, ids):
        e = cnp.take(p["table"], ids, axis=0)                     # (L, 3)
        c = cnp.take(p["cols"], cnp.abs(ids) % 6, axis=1)          # (4, L)
        return cnp.sum(cnp.tanh(e @ p["head"])) + cnp.sum(cnp.sin(c))

    return params, loss, lambda rng, b: (rng.integers(-5, 5, (b, 6)),)


def _embedding_gather(rng):
    """An embedding as JAX spells it with lax.gather (a take of rows, clamped indices,
    some out of range), in the take layout along axis 0 and axis 1."""
    params = {"table": _normal(rng, 5, 3), "cols": _normal(rng, 4, 6)}
    rows = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
    cols = lax.GatherDimensionNumbers(offset_dims=(0,), collapsed_slice_dims=(1,), start_index_map=(1,))

    def loss(p, ids):
        e = lax.gather(p["table"], ids[:, None], rows, (1, 3))                 # (L, 3)
        c = lax.gather(p["cols"], ids[:, None], cols, (4, 1), mode="clip")      # (4, L)
        return cnp.sum(cnp.tanh(e)) + cnp.sum(cnp.sin(c) * c)

    return params, loss, lambda rng, b: (rng.integers(-2, 8, (b, 6)),)


def _tied(rng):
    """Tied weights: the embedding table is also the output projection (cross terms)."""
    params = {"emb": _normal(rng, 6, 4), "mix": _normal(rng, 4, 4)}

    def loss(p, ids, y):
        h = cnp.tanh(cnp.take(p["emb"], ids, axis=0) @ p["mix"])   # (L, 4)
        logits = h @ p["emb"].T                                     # (L, 6)
        return nn.cross_entropy(logits, y)

    return params, loss, lambda rng, b: (rng.integers(0, 6, (b, 3)), rng.integers(0, 6, (b, 3)))


def _used_twice_and_scaled(rng):
    """A square weight used by two layers, a scale (a non-linear use), a reshaped weight,
    a parameter the loss does not use."""
    params = {"w": _normal(rng, 4, 4), "scale": np.array(0.7), "flat": _normal(rng, 12), "unused": _normal(rng, 3)}

    def loss(p, x):
        h = cnp.tanh(x @ p["w"])
        h = cnp.tanh(h @ p["w"]) * p["scale"]
        return cnp.sum(cnp.sin(h @ cnp.reshape(p["flat"], (4, 3)))) + cnp.exp(p["scale"])

    return params, loss, lambda rng, b: (_normal(rng, b, 4),)


def _biases(rng):
    """Biases: two stacked on one layer (the layer and both share one cotangent), one on a
    layer whose output is also used elsewhere, one broadcast along positions, a (1, p) one."""
    params = {"w": _normal(rng, 4, 5), "b1": _normal(rng, 5), "b2": _normal(rng, 5),
              "v": _normal(rng, 5, 3), "c": _normal(rng, 3), "u": _normal(rng, 4, 2), "d": _normal(rng, 1, 2)}

    def loss(p, x):
        h = cnp.tanh(x @ p["w"] + p["b1"] + p["b2"])             # x: (T=3, 4)
        y = h @ p["v"]
        z = cnp.tanh(y + p["c"]) * y                              # y also used beside its bias
        return cnp.sum(z) + cnp.sum(cnp.sin(x @ p["u"] + p["d"]))

    return params, loss, lambda rng, b: (_normal(rng, b, 3, 4),)


def _norms(rng):
    """LayerNorm's and GroupNorm's scale and shift (the Scale and Bias rules) around a dense
    layer and a convolution."""
    params = {"w": _normal(rng, 5, 6), "ln_w": _normal(rng, 6), "ln_b": _normal(rng, 6),
              "k": _normal(rng, 4, 3, 3, 3) * 0.5, "gn_w": _normal(rng, 4), "gn_b": _normal(rng, 4)}
    r = _normal(rng, 4, 4, 4)

    def loss(p, x, img):
        h = nn.layer_norm(cnp.tanh(x @ p["w"]), 6, p["ln_w"], p["ln_b"])          # x: (T=2, 5)
        c = nn.group_norm(nn.conv(img, p["k"], padding=1), 2, p["gn_w"], p["gn_b"], spatial_dims=2)
        return cnp.sum(cnp.sin(h)) + _readout(c, r)

    return params, loss, lambda rng, b: (_normal(rng, b, 2, 5), _normal(rng, b, 3, 4, 4))


def _cnn(rng):
    """The main job's network: conv, relu, pool, conv, relu, pool, dense."""
    from cuvmap.nn import layers

    model = layers.Serial(layers.Conv(3, 3, padding=1), layers.Relu, layers.MaxPool(2),
                          layers.Conv(4, 3, padding=1), layers.Relu, layers.MaxPool(2),
                          layers.Flatten, layers.Dense(3))
    _, params = model.init(rng, (-1, 1, 8, 8), dtype=np.float64)

    def loss(p, x, y):
        return nn.cross_entropy(model.apply(p, x)[None], y[None])

    return params, loss, lambda rng, b: (_normal(rng, b, 1, 8, 8), rng.integers(0, 3, b))


NETWORKS = {
    "mlp": _mlp,
    "sequence_dense": _sequence_dense,
    "conv2d": _conv_net({}, 2, 2, 4, 3, 6),
    "conv2d_groups_stride_padding": _conv_net(dict(groups=2, stride=2, padding=1), 2, 4, 6, 3, 7),
    "conv2d_dilation": _conv_net(dict(dilation=2, padding=2), 2, 2, 3, 3, 6),
    "conv2d_rectangular": _conv_net(dict(stride=(2, 1), padding=(0, 1)), 2, 2, 3, (2, 3), 6),
    "conv1d_groups": _conv_net(dict(groups=3, stride=2), 1, 3, 6, 3, 9),
    "conv3d": _conv_net(dict(padding=1), 3, 2, 2, 2, 3),
    "conv2d_n2": _conv_net(dict(padding=1), 2, 2, 3, 3, 4, per_example_n=2),
    "conv_transpose2d": _conv_net(dict(stride=2, padding=1, output_padding=1, groups=2), 2, 4, 2, 3, 4,
                                  transposed=True),
    "conv_transpose1d_dilation": _conv_net(dict(dilation=2, stride=3), 1, 2, 3, 3, 5, transposed=True),
    "conv_transpose3d": _conv_net(dict(stride=2), 3, 2, 2, 2, 2, transposed=True),
    "conv_transpose_output_padding_past_stride": _conv_net(dict(stride=1, dilation=3, output_padding=2), 1, 2, 2,
                                                           3, 5, transposed=True),
    "embedding": _embedding,
    "embedding_gather": _embedding_gather,
    "tied_weights": _tied,
    "used_twice_and_scaled": _used_twice_and_scaled,
    "biases": _biases,
    "norms": _norms,
    "cnn": _cnn,
}


# how each parameter is differentiated with method="ghost" (NOTE [ghost clipping]); with
# method="per_example" every "ghost" becomes "per_example"
GHOST_METHODS = {
    "mlp": {"w1": "ghost", "b1": "per_example", "w2": "ghost"},        # b1: a bias added with +
    "sequence_dense": {"w": "ghost", "heads": "ghost", "left": "ghost"},
    "embedding": {"table": "ghost", "cols": "ghost", "head": "ghost"},
    "embedding_gather": {"table": "ghost", "cols": "ghost"},
    "tied_weights": {"emb": "per_example, 2 uses", "mix": "ghost"},
    "used_twice_and_scaled": {"w": "per_example, 2 uses", "scale": "vmap", "flat": "ghost", "unused": "unused"},
    "biases": {"w": "ghost", "b1": "per_example", "b2": "per_example", "v": "ghost", "c": "per_example",
               "u": "ghost", "d": "per_example"},
    # the scales of layer_norm and group_norm: the Scale rule, from their own taps
    "norms": {"w": "ghost", "ln_w": "per_example", "ln_b": "per_example", "k": "ghost", "gn_w": "per_example",
              "gn_b": "per_example"},
}
GHOST_METHODS.update({name: {"w": "ghost", "b": "per_example"} for name in NETWORKS if name.startswith("conv")})


def _reference(loss, params, batch, max_norm, mask=None):
    """The vmap(grad) path: every per-example gradient, then clipped_sum."""
    per_example = cv.vmap(cv.grad(loss), in_axes=(None,) + (0,) * len(batch))(params, *batch)
    return dp.clipped_sum(per_example, max_norm, mask=mask, return_norms=True)


def _assert_matches(got, want, rtol=RTOL, atol_scale=1e-12):
    summed, norms = got
    want_summed, want_norms = want
    np.testing.assert_allclose(np.asarray(norms), np.asarray(want_norms), rtol=rtol, atol=atol_scale)
    assert tree.structure(summed) == tree.structure(want_summed)
    for a, b in zip(tree.leaves(summed), tree.leaves(want_summed)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype
        scale = max(1.0, float(np.abs(b).max(initial=0)))
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol_scale * scale)


# -m "not slow": the ghost path on every network, the per-example and auto paths on the
# first; the full suite every network on every path.
@pytest.mark.parametrize("name,method", [
    pytest.param(name, method, id=f"{name}-{method}",
                 marks=() if method == "ghost" or name == next(iter(NETWORKS)) else (pytest.mark.slow,))
    for name in NETWORKS for method in ("ghost", "per_example", "auto")
])
def test_matches_the_vmap_grad_path(name, method):
    rng = np.random.default_rng(sum(map(ord, name)))
    params, loss, make_batch = NETWORKS[name](rng)
    for size, masked in ((0, False), (1, False), (5, False), (7, True)):
        batch = make_batch(rng, size)
        mask = (np.arange(size) % 3 != 1) if masked else None
        max_norm = 1.0
        want = _reference(loss, params, batch, max_norm, mask)
        if size:
            # a bound at the median norm: some examples are clipped, some are not
            max_norm = float(np.median(np.asarray(want[1])))
            want = _reference(loss, params, batch, max_norm, mask)
        got = dp.clipped_grad(loss, max_norm, method=method)(*(params,) + batch, mask=mask)
        assert isinstance(got, dp.ClippedGradient)
        _assert_matches(got, want)


@pytest.mark.parametrize("name", list(GHOST_METHODS))
def test_each_parameter_takes_the_expected_path(name):
    rng = np.random.default_rng(0)
    params, loss, make_batch = NETWORKS[name](rng)
    batch = make_batch(rng, 3)
    expected = GHOST_METHODS[name]
    assert dp.clipped_grad(loss, 1.0, method="ghost").methods(params, *batch) == expected
    explicit = {k: "per_example" if v == "ghost" else v for k, v in expected.items()}
    assert dp.clipped_grad(loss, 1.0, method="per_example").methods(params, *batch) == explicit


def test_auto_takes_ghost_for_dense_and_per_example_for_early_convs():
    rng = np.random.default_rng(0)
    params, loss, make_batch = NETWORKS["cnn"](rng)
    methods = dp.clipped_grad(loss, 1.0).methods(params, *make_batch(rng, 4))
    assert methods[0]["weight"] == "per_example"      # 64 positions, 9·3 numbers: T² ≫ d·p
    assert methods[-1]["weight"] == "ghost"           # dense, T = 1


def test_matches_a_loop_of_grad():
    """Against the plainest reference: grad of each example, clipped and summed in NumPy."""
    rng = np.random.default_rng(3)
    params, loss, make_batch = NETWORKS["cnn"](rng)
    xs, ys = make_batch(rng, 5)
    grads = [cv.grad(loss)(params, xs[i], ys[i]) for i in range(5)]
    norms = np.array([np.sqrt(sum(np.sum(np.asarray(g) ** 2) for g in tree.leaves(gr))) for gr in grads])
    max_norm = float(np.median(norms))
    want = tree.map(lambda *gs: sum(g * min(1.0, max_norm / (n + 1e-6)) for g, n in zip(gs, norms)), *grads)
    got = dp.clipped_grad(loss, max_norm)(params, xs, ys)
    _assert_matches(got, (want, norms))


@pytest.mark.parametrize("name", ["cnn", "embedding", "tied_weights", "sequence_dense"])
def test_under_jit_and_with_padding(name):
    """jit gives the eager values; a batch padded to a bucket with its mask gives the
    unpadded batch's clipped sum and norms (NOTE [padding Poisson batches])."""
    rng = np.random.default_rng(4)
    params, loss, make_batch = NETWORKS[name](rng)
    batch = make_batch(rng, 5)
    clipped = dp.clipped_grad(loss, 0.5)
    eager = clipped(params, *batch)
    padded, mask = dp.pad_batch(batch, 8)
    jitted = cv.jit(lambda p, b, m: clipped(p, *b, mask=m))
    got = jitted(params, padded, mask)
    _assert_matches((got.summed, got.norms[:5]), eager)
    np.testing.assert_allclose(got.norms[5:], eager.norms[0], rtol=RTOL)   # the padding repeats example 0
    again = jitted(params, dp.pad_batch(make_batch(rng, 6), 8)[0], mask)
    assert jitted.trace_count == 1 and again.norms.shape == (8,)


def _float32_cnn(seed, size):
    """The CNN's parameters and a batch in float32, and the vmap(grad) path's clipped sum."""
    rng = np.random.default_rng(seed)
    params, loss, make_batch = NETWORKS["cnn"](rng)
    params = tree.map(lambda p: p.astype(np.float32), params)
    xs, ys = make_batch(rng, size)
    xs = xs.astype(np.float32)
    return params, loss, xs, ys, _reference(loss, params, (xs, ys), 1.0)


def test_float32_and_the_choice_per_layer():
    params, loss, xs, ys, want = _float32_cnn(5, 9)
    for method in ("ghost", "per_example", "auto"):
        got = dp.clipped_grad(loss, 1.0, method=method)(params, xs, ys)
        assert got.norms.dtype == np.float32
        assert all(a.dtype == np.float32 for a in tree.leaves(got.summed))
        _assert_matches(got, want, rtol=2e-5, atol_scale=1e-6)


def test_has_aux_and_argnums():
    rng = np.random.default_rng(6)
    params, loss, make_batch = NETWORKS["mlp"](rng)
    xs, ys = make_batch(rng, 4)

    def with_aux(p, x, y):
        value = loss(p, x, y)
        return value, {"loss": value, "twice": 2 * x}

    (got, aux) = dp.clipped_grad(with_aux, 1.0, has_aux=True)(params, xs, ys)
    _assert_matches(got, _reference(loss, params, (xs, ys), 1.0))
    np.testing.assert_allclose(aux["loss"], cv.vmap(loss, in_axes=(None, 0, 0))(params, xs, ys), rtol=1e-14)
    np.testing.assert_allclose(aux["twice"], 2 * xs, rtol=0)

    def split(w1, rest, x, y):
        return loss(dict(rest, w1=w1), x, y)

    rest = {k: v for k, v in params.items() if k != "w1"}
    got = dp.clipped_grad(split, 1.0, argnums=(0, 1))(params["w1"], rest, xs, ys)
    want_summed, want_norms = _reference(loss, params, (xs, ys), 1.0)
    np.testing.assert_allclose(got.norms, want_norms, rtol=RTOL)
    np.testing.assert_allclose(got.summed[0], want_summed["w1"], rtol=RTOL)
    np.testing.assert_allclose(got.summed[1]["w2"], want_summed["w2"], rtol=RTOL)


def test_private_gradient_takes_it():
    rng = np.random.default_rng(7)
    params, loss, make_batch = NETWORKS["cnn"](rng)
    xs, ys = make_batch(rng, 6)
    (px, py), mask = dp.pad_batch((xs, ys), 8)
    z = dp.standard_normal_like(params, np.random.default_rng(8))
    per_example = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(params, px, py)
    want, want_norms = dp.private_gradient(per_example, 1.0, 1.3, noise=z, mask=mask, return_norms=True,
                                           normalize_by="batch_size")
    clipped = dp.clipped_grad(loss, 1.0)(params, px, py, mask=mask)
    got, norms = dp.private_gradient(clipped, 1.0, 1.3, noise=z, mask=mask, return_norms=True,
                                     normalize_by="batch_size")
    _assert_matches((got, norms), (want, want_norms))
    got = dp.private_gradient(clipped, 1.0, 1.3, noise=z, expected_batch_size=6.0)
    want = dp.private_gradient(per_example, 1.0, 1.3, noise=z, mask=mask, expected_batch_size=6.0)
    _assert_matches((got, norms), (want, want_norms))
    with pytest.raises(ValueError, match=r"mask has shape \(6,\).*8 per-example norms"):
        dp.private_gradient(clipped, 1.0, 1.3, noise=z, mask=mask[:6], expected_batch_size=6.0)


def _wide_dense(rng):
    params = {"w": rng.standard_normal((512, 256)) * 0.05, "v": rng.standard_normal((256, 10)) * 0.1}

    def loss(p, x, y):
        return nn.cross_entropy((cnp.tanh(x @ p["w"]) @ p["v"])[None], y[None])

    return params, loss, lambda b: (rng.standard_normal((b, 512)), rng.integers(0, 10, b)), params["w"]


def _wide_conv(rng):
    params = {"w": rng.standard_normal((64, 64, 3, 3)) * 0.05, "v": rng.standard_normal((64 * 16, 10)) * 0.1}

    def loss(p, x, y):
        h = cnp.tanh(nn.conv(x, p["w"], padding=1))
        return nn.cross_entropy((cnp.reshape(h, (-1,)) @ p["v"])[None], y[None])

    return params, loss, lambda b: (rng.standard_normal((b, 64, 4, 4)), rng.integers(0, 10, b)), params["w"]


@pytest.mark.parametrize("make", [_wide_dense, pytest.param(_wide_conv, marks=pytest.mark.slow)])
def test_the_ghost_path_never_forms_a_per_example_weight_gradient(make):
    """Peak memory of the ghost path (tracemalloc, which counts NumPy's buffers) stays far
    below one per-example gradient of the wide weight, which the explicit path writes."""
    params, loss, make_batch, weight = make(np.random.default_rng(9))
    b = 32
    batch = make_batch(b)
    per_example_bytes = b * weight.nbytes
    peaks = {}
    for method in ("ghost", "per_example"):
        clipped = dp.clipped_grad(loss, 1.0, method=method)
        clipped(params, *batch)
        tracemalloc.start()
        clipped(params, *batch)
        peaks[method] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks["ghost"] < per_example_bytes / 2, peaks
    assert peaks["per_example"] > per_example_bytes, peaks


def test_auto_times_the_close_layers():
    """A conv layer whose estimates are close is timed once per shape and batch bucket."""
    ghost.clear_measured_choices()
    rng = np.random.default_rng(10)
    params, loss, make_batch = NETWORKS["cnn"](rng)    # its second conv is a close call
    clipped = dp.clipped_grad(loss, 1.0)
    clipped(params, *make_batch(rng, 5))
    choices = ghost.measured_choices()
    assert choices and all(c in ("ghost", "per_example") and set(t) == {"ghost", "per_example"}
                           for c, t in choices.values())
    clipped(params, *make_batch(rng, 6))             # the same bucket (8): nothing new to time
    assert ghost.measured_choices() == choices


def test_two_threads():
    rng = np.random.default_rng(11)
    params, loss, make_batch = NETWORKS["cnn"](rng)
    batches = [make_batch(rng, 4), make_batch(rng, 5)]
    want = [_reference(loss, params, b, 1.0) for b in batches]
    results = [None, None]

    def work(i):
        clipped = dp.clipped_grad(loss, 1.0)
        for _ in range(3):
            results[i] = clipped(params, *batches[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, w in zip(results, want):
        _assert_matches(got, w)


def test_on_backend(backend):
    """NumPy (cpu) and CuPy (gpu) arrays alike; the gpu variant skips without a device."""
    params, loss, xs, ys, want = _float32_cnn(12, 6)
    p, x, y = cv.device_put(params, backend), cv.device_put(xs, backend), cv.device_put(ys, backend)
    for fn in (dp.clipped_grad(loss, 1.0), cv.jit(dp.clipped_grad(loss, 1.0))):
        got = fn(p, x, y)
        assert cv_backend.backend_name(got.norms) == backend
        assert all(cv_backend.backend_name(leaf) == backend for leaf in tree.leaves(got.summed))
        _assert_matches(cv.device_put(tuple(got), "cpu"), want, rtol=2e-5, atol_scale=1e-6)


def test_the_loss_is_traced_once_per_example_shape():
    rng = np.random.default_rng(15)
    params, loss, make_batch = NETWORKS["mlp"](rng)
    traces = []

    def counted(p, x, y):
        traces.append(1)
        return loss(p, x, y)

    clipped = dp.clipped_grad(counted, 1.0)
    for size in (3, 5, 0, 5):
        batch = make_batch(rng, size)
        _assert_matches(clipped(params, *batch), _reference(loss, params, batch, 1.0))
    assert len(traces) == 1
    wider = {"w1": np.ones((6, 7)), "b1": params["b1"], "w2": params["w2"]}
    clipped(wider, rng.standard_normal((4, 6)), rng.integers(0, 3, 4))
    assert len(traces) == 2


def test_no_parameter_reaches_the_loss():
    rng = np.random.default_rng(14)
    xs = rng.standard_normal((3, 2))

    def loss(p, x):
        return cnp.sum(cnp.sin(x))

    got = dp.clipped_grad(loss, 1.0)({"a": np.ones((2, 2))}, xs)
    np.testing.assert_array_equal(got.norms, np.zeros(3))
    np.testing.assert_array_equal(got.summed["a"], np.zeros((2, 2)))
    got = dp.clipped_grad(loss, 1.0)({}, xs)
    assert got.summed == {} and got.norms.shape == (3,)


def test_errors():
    rng = np.random.default_rng(13)
    params, loss, make_batch = NETWORKS["mlp"](rng)
    xs, ys = make_batch(rng, 4)
    clipped = dp.clipped_grad(loss, 1.0)
    with pytest.raises(cv.TransformError, match=r"clipped_grad\(loss\): argument 2 \(y\) has size 3 along axis 0"):
        clipped(params, xs, ys[:3])
    with pytest.raises(cv.TransformError, match=r"clipped_grad\(loss\): mask has shape \(3,\), but the batch has 4"):
        clipped(params, xs, ys, mask=np.ones(3))
    with pytest.raises(cv.TransformError, match="must return a float scalar per example"):
        dp.clipped_grad(lambda p, x: x @ p["w1"], 1.0)(params, xs)
    with pytest.raises(cv.TransformError, match="max_norm must be positive"):
        dp.clipped_grad(loss, 0.0)
    with pytest.raises(cv.TransformError, match="method must be one of"):
        dp.clipped_grad(loss, 1.0, method="fast")
    with pytest.raises(cv.TransformError, match="no batch argument"):
        dp.clipped_grad(lambda p: cnp.sum(p["w1"]), 1.0)(params)
    with pytest.raises(cv.TransformError, match=r"argument 0 \(p\)\['y'\] has dtype int64"):
        dp.clipped_grad(lambda p, x: cnp.sum(x), 1.0)({"y": np.ones(2, np.int64)}, xs)


# ---------------------------------------------------------------------------------------
# Overflow, non-finite examples, in_axes, messages (issue 24)
# ---------------------------------------------------------------------------------------


def _saturated_dense(rng):
    """float32 inputs of 1e19 and more into a dense layer and a saturated tanh: that
    layer's cotangent is exactly 0, so its per-example gradient is 0, while ‖a‖² overflows."""
    params = {"w": (np.abs(rng.standard_normal((4, 3))) + 0.1).astype(np.float32),
              "v": rng.standard_normal((3, 2)).astype(np.float32)}

    def loss(p, x):
        return cnp.sum(cnp.tanh(x @ p["w"]) @ p["v"])

    xs = rng.standard_normal((5, 4)).astype(np.float32)
    xs[1], xs[3] = 1e19, 3e19
    return params, loss, (xs,)


def _saturated_conv(rng):
    params = {"w": (np.abs(rng.standard_normal((2, 1, 3, 3))) + 0.1).astype(np.float32)}
    r = rng.standard_normal((2, 5, 5)).astype(np.float32)

    def loss(p, x):
        return cnp.sum(cnp.tanh(nn.conv(x, p["w"], padding=1)) * r)

    xs = rng.standard_normal((4, 1, 5, 5)).astype(np.float32)
    xs[2] = 2e19
    return params, loss, (xs,)


@pytest.mark.parametrize("make", [_saturated_dense, _saturated_conv])
def test_ghost_norms_do_not_overflow_where_the_per_example_norm_does_not(make):
    params, loss, batch = make(np.random.default_rng(30))
    want = _reference(loss, params, batch, 1.0)
    assert np.isfinite(want[1]).all()
    for method in ("ghost", "auto"):
        got = dp.clipped_grad(loss, 1.0, method=method)(params, *batch)
        assert np.isfinite(got.norms).all(), (method, got.norms)
        _assert_matches(got, want, rtol=2e-5, atol_scale=1e-6)


def _with_a_bad_example(rng, bad):
    params, loss, make_batch = NETWORKS["norms"](rng)
    xs, imgs = make_batch(rng, 6)
    xs[2, 0, 1] = bad
    return params, loss, (xs, imgs)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")   # the bad example's own arithmetic
@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("method", ["ghost", "per_example"])
def test_nan_safe_drops_the_non_finite_examples(method, bad):
    """An example with a NaN or an infinity: by default the sum is NaN (as in Opacus); with
    nan_safe=True it contributes zero: the sum is the other examples' (the vmap(grad) path
    on the batch without it), its norm is reported as computed, num_dropped counts it."""
    params, loss, batch = _with_a_bad_example(np.random.default_rng(31), bad)
    keep = np.arange(6) != 2
    want_summed, want_norms = _reference(loss, params, tuple(b[keep] for b in batch), 1.0)
    plain = dp.clipped_grad(loss, 1.0, method=method)(params, *batch)
    assert not np.isfinite(plain.summed["w"]).all() and int(plain.num_dropped()) == 1
    safe = dp.clipped_grad(loss, 1.0, method=method, nan_safe=True)(params, *batch)
    assert not np.isfinite(safe.norms[2])
    _assert_matches((safe.summed, safe.norms[keep]), (want_summed, want_norms))
    assert int(safe.num_dropped()) == 1 and int(safe.num_dropped(mask=keep)) == 0
    masked = dp.clipped_grad(loss, 1.0, method=method, nan_safe=True)(params, *batch, mask=keep)
    _assert_matches((masked.summed, masked.norms[keep]), (want_summed, want_norms))
    # the vmap(grad) path offers the same option
    per_example = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(params, *batch)
    ref = dp.clipped_sum(per_example, 1.0, nan_safe=True).summed
    for k in want_summed:
        np.testing.assert_allclose(ref[k], want_summed[k], rtol=RTOL, atol=1e-12)


def test_in_axes_for_shared_arguments():
    """in_axes None: a frozen weight passed positionally and a Python-int label are shared
    by every example (not batched, not differentiated); a batch along axis 1."""
    rng = np.random.default_rng(32)
    params, loss, make_batch = NETWORKS["mlp"](rng)
    xs, _ = make_batch(rng, 5)
    frozen = rng.standard_normal((5, 5))

    def with_frozen(p, x, f, y):
        return loss(p, x @ f, cnp.asarray(y))

    def per_example_loss(p, x):
        return with_frozen(p, x, frozen, 2)

    want = _reference(per_example_loss, params, (xs,), 1.0)
    clipped = dp.clipped_grad(with_frozen, 1.0, in_axes=(None, 0, None, None))
    _assert_matches(clipped(params, xs, frozen, 2), want)
    _assert_matches(dp.clipped_grad(with_frozen, 1.0, in_axes=[None, 1, None, None])(params, xs.T, frozen, 2), want)
    assert clipped.methods(params, xs, frozen, 2) == {"w1": "ghost", "b1": "per_example", "w2": "ghost"}


def test_messages_for_a_misplaced_bound_or_label():
    rng = np.random.default_rng(33)
    params, loss, make_batch = NETWORKS["mlp"](rng)
    xs, ys = make_batch(rng, 4)
    with pytest.raises(cv.TransformError, match=r"clipped_grad\(loss\): max_norm must be a positive number \(the "
                                                r"clipping bound C\), got an array of shape \(2,\); clipped_grad"):
        dp.clipped_grad(loss, np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"clipped_sum: max_norm must be a positive number"):
        dp.clipped_sum({"w": np.ones((2, 3))}, np.array([1.0, 2.0]))
    np.testing.assert_allclose(dp.clipped_grad(loss, np.float32(1.0))(params, xs, ys).norms,
                               dp.clipped_grad(loss, 1.0)(params, xs, ys).norms, rtol=0)
    with pytest.raises(cv.TransformError, match=r"argument 2 \(y\) is a int, which has no axis 0 to take the "
                                                r"examples from: .*give it in_axes None \(in_axes=\(None, 0, None\)\)"):
        dp.clipped_grad(loss, 1.0)(params, xs, 2)
    with pytest.raises(cv.TransformError, match=r"argument 0 \(p\) is differentiated \(argnums\), so its in_axes "
                                                r"entry must be None"):
        dp.clipped_grad(loss, 1.0, in_axes=(0, 0, 0))(params, xs, ys)
    with pytest.raises(cv.TransformError, match="no batch argument"):
        dp.clipped_grad(loss, 1.0, in_axes=None)(params, xs, ys)


def test_deterministic_takes_the_cost_model_and_times_nothing(monkeypatch):
    """Under cv.config.deterministic ghost's auto method is the cost model's estimate alone
    (NOTE [reproducible runs]): no layer is timed, and two runs give the same bits."""
    from cuvmap.dp.ghost import choice

    def no_timing(*args):
        raise AssertionError("a layer was timed under deterministic")

    monkeypatch.setattr(choice, "_time_both", no_timing)
    ghost.clear_measured_choices()
    params, loss, xs, ys, want = _float32_cnn(34, 6)
    with cv.config.override(deterministic=True):
        methods = dp.clipped_grad(loss, 1.0).methods(params, xs, ys)
        first = dp.clipped_grad(loss, 1.0)(params, xs, ys)
        second = dp.clipped_grad(loss, 1.0)(params, xs, ys)
    assert not ghost.measured_choices()
    assert methods[0]["weight"] == "per_example" and methods[-1]["weight"] == "ghost"
    for a, b in zip(tree.leaves(first), tree.leaves(second)):
        np.testing.assert_array_equal(a, b)
    _assert_matches(first, want, rtol=2e-5, atol_scale=1e-6)
