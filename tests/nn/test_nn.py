"""``cuvmap.nn``: functional ops, stax-style layers and optimizers against independent
references.

- activations, norms and losses against NumPy formulas written out here, derivatives
  against finite differences (float64);
- per-example validity of the norms: the output for one example does not depend on the
  others, and ``vmap`` over examples equals the batched call;
- layers: init shapes, dtypes and torch's init bounds; batched and single-example apply;
  ``vmap(grad)`` of a small CNN built with ``Serial`` against a loop of ``grad``;
- one example against a batch of one, for every nn function (a table whose completeness
  is tested) and every layer; the calls whose rank has two readings (an int pooling
  kernel on ``(C, H, W)``, group norm without ``spatial_dims``) raise and say what to
  write; conv_transpose's string padding raises and names the equivalent ints;
  cross_entropy's label errors speak of labels, under ``vmap`` too;
- optimizers against hand-written update loops, and training a tiny problem;
- GPU variants (CuPy arrays, a CuPy generator for init) skip without a device.
"""
import ast
import math
import re

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import nn
from cuvmap.core import ShapeError
from cuvmap.nn import layers as L
from cuvmap.nn import optim
from cuvmap.test_util import check_batching, check_grads


def _put(x, backend):
    return cv.device_put(x, "gpu") if backend == "gpu" else x


def _np(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _rand(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


# ---------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------


def test_activations_match_formulas(backend):
    x = _rand(0, 3, 5) * 3
    xg = _put(x, backend)
    gelu_tanh = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(_np(nn.gelu(xg, approximate="tanh")), gelu_tanh, rtol=1e-12, atol=1e-12)
    gelu_exact = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    np.testing.assert_allclose(_np(nn.gelu(xg)), gelu_exact, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_np(nn.tanh(xg)), np.tanh(x), rtol=1e-12)
    np.testing.assert_allclose(_np(nn.sigmoid(xg)), 1 / (1 + np.exp(-x)), rtol=1e-12)
    np.testing.assert_allclose(_np(nn.relu(xg)), np.maximum(x, 0))
    p = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    np.testing.assert_allclose(_np(nn.softmax(xg)), p, rtol=1e-12)
    np.testing.assert_allclose(_np(nn.log_softmax(xg, axis=0)), x - np.log(np.exp(x).sum(0)), rtol=1e-12)


def test_gelu_is_exact_by_default_and_tanh_is_close():
    x = np.linspace(-6, 6, 241)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(nn.gelu(x), exact, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(nn.gelu(x, approximate="none"), exact, rtol=1e-13, atol=1e-15)
    assert 1e-5 < np.max(np.abs(nn.gelu(x, approximate="tanh") - exact)) < 1e-3
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        nn.gelu(x, approximate="fast")


def test_activation_grads():
    x = _rand(1, 2, 4)
    check_grads(lambda x: nn.gelu(x) * nn.tanh(x) + nn.sigmoid(x), (x,), order=2)
    check_grads(lambda x: nn.gelu(x, approximate="tanh"), (x,), order=2)
    # d/dx x·Φ(x) = Φ(x) + x·φ(x), a closed form independent of the erf rule
    x = np.linspace(-4, 4, 17)
    phi = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    np.testing.assert_allclose(cv.vmap(cv.grad(nn.gelu))(x), cdf + x * phi, rtol=1e-13, atol=1e-15)



# relu on the values whose handling differs between formulas (NOTE [relu keeps NaN]):
# (input, value, derivative), torch's relu and threshold_backward as the reference
RELU_SPECIAL_VALUES = [
    (np.nan, np.nan, 1.0),       # a NaN stays visible; its cotangent passes (torch's)
    (-0.0, 0.0, 0.0),
    (0.0, 0.0, 0.0),             # the derivative at 0 is 0
    (np.inf, np.inf, 1.0),
    (-np.inf, 0.0, 0.0),
    (1e-40, 1e-40, 1.0),         # a subnormal is positive
    (-1e-40, 0.0, 0.0),
    (2.5, 2.5, 1.0),
    (-2.5, 0.0, 0.0),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("staged", [False, True], ids=["eager", "jit"])
def test_relu_special_values_and_derivative(dtype, staged):
    x = np.array([v for v, _, _ in RELU_SPECIAL_VALUES], dtype)
    want = np.array([y for _, y, _ in RELU_SPECIAL_VALUES], dtype)
    g = np.arange(1, len(x) + 1, dtype=dtype)
    want_grad = g * np.array([d for _, _, d in RELU_SPECIAL_VALUES], dtype)
    relu = cv.jit(nn.relu) if staged else nn.relu
    y = np.asarray(relu(x))
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, want)
    assert not np.signbit(y).any()                     # -0.0 and negatives give +0.0
    y2, pullback = cv.vjp(nn.relu, x)
    vjp = cv.jit(lambda x, g: cv.vjp(nn.relu, x)[1](g)[0]) if staged else (lambda x, g: pullback(g)[0])
    np.testing.assert_array_equal(np.asarray(vjp(x, g)), want_grad)
    np.testing.assert_array_equal(np.asarray(cv.jvp(nn.relu, (x,), (g,))[1]), want_grad)


def test_relu_keeps_a_diverged_network_visible():
    """A NaN weight makes the loss NaN (it used to give a finite loss and zero gradients)."""
    rng = np.random.default_rng(3)
    w1, w2 = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w1[0, 0] = np.nan

    def loss(w1, w2, x):
        return nn.mse(nn.relu(x @ w1) @ w2, np.zeros((5, 2), np.float32))

    assert np.isnan(loss(w1, w2, x))
    for f in (cv.grad(loss, argnums=(0, 1)), cv.jit(cv.grad(loss, argnums=(0, 1)))):
        d1, d2 = f(w1, w2, x)
        assert np.isnan(np.asarray(d1)).any() and np.isnan(np.asarray(d2)).any()


# ---------------------------------------------------------------------------------------
# Norms
# ---------------------------------------------------------------------------------------


def ref_layer_norm(x, k, weight, bias, eps):
    axes = tuple(range(x.ndim - k, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    return y * (1 if weight is None else weight) + (0 if bias is None else bias)


def ref_group_norm(x, g, weight, bias, eps):
    n, c = x.shape[:2]
    out = np.empty_like(x)
    for i in range(n):
        for j in range(g):
            chans = slice(j * c // g, (j + 1) * c // g)
            block = x[i, chans]
            out[i, chans] = (block - block.mean()) / np.sqrt(block.var() + eps)
    shape = (c,) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_formula(affine, backend):
    x = _rand(2, 4, 3, 5)
    w, b = (_rand(3, 3, 5), _rand(4, 3, 5)) if affine else (None, None)
    got = nn.layer_norm(_put(x, backend), (3, 5), _put(w, backend), _put(b, backend), eps=1e-3)
    np.testing.assert_allclose(_np(got), ref_layer_norm(x, 2, w, b, 1e-3), rtol=1e-10, atol=1e-12)
    w1 = _rand(5, 5)
    np.testing.assert_allclose(nn.layer_norm(x, 5, w1), ref_layer_norm(x, 1, w1, None, 1e-5), rtol=1e-10, atol=1e-12)
    with pytest.raises(ShapeError, match="normalized_shape"):
        nn.layer_norm(x, (4, 5))


@pytest.mark.parametrize("shape,groups", [((3, 6, 4, 5), 3), ((2, 4, 7), 1), ((2, 6), 6), ((2, 4, 2, 3, 2), 2)])
def test_group_norm_matches_formula(shape, groups, backend):
    x = _rand(5, *shape) * 2 + 1
    c = shape[1]
    w, b = _rand(6, c), _rand(7, c)
    nd = len(shape) - 2
    want = ref_group_norm(x, groups, w, b, 1e-5)
    got = nn.group_norm(_put(x, backend), groups, _put(w, backend), _put(b, backend), spatial_dims=nd)
    np.testing.assert_allclose(_np(got), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(nn.group_norm(x, groups, spatial_dims=nd), ref_group_norm(x, groups, None, None, 1e-5),
                               rtol=1e-10, atol=1e-12)
    # one example (C, S...) with the same spatial_dims
    got_one = nn.group_norm(_put(x[1], backend), groups, _put(w, backend), _put(b, backend), spatial_dims=nd)
    np.testing.assert_allclose(_np(got_one), want[1], rtol=1e-10, atol=1e-12)


def test_group_norm_errors():
    with pytest.raises(ShapeError, match="divisible"):
        nn.group_norm(np.zeros((2, 6, 3)), 4, spatial_dims=1)
    with pytest.raises(ShapeError, match=r"weight of shape \(4,\) must be \(C,\) = \(6,\)"):
        nn.group_norm(np.zeros((2, 6, 3)), 3, np.ones(4), spatial_dims=1)
    assert nn.group_norm(np.zeros((0, 6, 3)), 3, spatial_dims=1).shape == (0, 6, 3)   # an empty batch
    with pytest.raises(ShapeError, match="spatial_dims must be 0, 1, 2 or 3"):
        nn.group_norm(np.zeros((2, 6, 3)), 3, spatial_dims=4)
    with pytest.raises(ShapeError, match=r"for 2 spatial dims \(from spatial_dims=2\)"):
        nn.group_norm(np.zeros((2, 6)), 3, spatial_dims=2)


def test_norms_are_per_example():
    """The statistics never mix examples: changing the other examples leaves an example's
    output unchanged, and vmap over examples equals the batched call (which is what makes
    per-example gradients of a network with these norms the gradients of per-example losses)."""
    x = _rand(8, 4, 6, 3, 3)
    x2 = x.copy()
    x2[1:] = _rand(9, 3, 6, 3, 3) * 10
    w, b = _rand(10, 6), _rand(11, 6)
    np.testing.assert_allclose(nn.group_norm(x, 3, w, b, spatial_dims=2)[0],
                               nn.group_norm(x2, 3, w, b, spatial_dims=2)[0], rtol=1e-12)
    np.testing.assert_allclose(nn.layer_norm(x, (6, 3, 3))[0], nn.layer_norm(x2, (6, 3, 3))[0], rtol=1e-12)

    def gn_one(x, w, b):             # one example (C, H, W)
        return nn.group_norm(x, 3, w, b, spatial_dims=2)

    check_batching(gn_one, (x, w, b), in_axes=(0, None, None), atol=1e-12, rtol=1e-12)
    np.testing.assert_allclose(cv.vmap(gn_one, in_axes=(0, None, None))(x, w, b),
                               nn.group_norm(x, 3, w, b, spatial_dims=2),
                               rtol=1e-12, atol=1e-12)
    wl = _rand(12, 3, 3)
    check_batching(lambda x, w: nn.layer_norm(x, (6, 3, 3), w), (x, wl), in_axes=(0, None), atol=1e-12, rtol=1e-12)
    np.testing.assert_allclose(cv.vmap(lambda x: nn.layer_norm(x, (3, 3), wl))(x), nn.layer_norm(x, (3, 3), wl),
                               rtol=1e-12, atol=1e-12)


def test_norm_grads():
    x = _rand(13, 2, 4, 3)
    w, b = _rand(14, 4), _rand(15, 4)
    check_grads(lambda x, w, b: nn.group_norm(x, 2, w, b, spatial_dims=1), (x, w, b), order=2, atol=1e-5, rtol=1e-5)
    wl, bl = _rand(16, 3), _rand(17, 3)
    check_grads(lambda x, w, b: nn.layer_norm(x, 3, w, b), (x, wl, bl), order=2, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------


def ref_log_softmax(z):
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def test_cross_entropy_int_and_one_hot_agree(backend):
    logits = _rand(20, 6, 5)
    labels = np.array([0, 4, 2, 2, 1, 3])
    one_hot = np.eye(5)[labels]
    want = -ref_log_softmax(logits)[np.arange(6), labels]
    for reduction, ref in [("mean", want.mean()), ("sum", want.sum()), ("none", want)]:
        a = nn.cross_entropy(_put(logits, backend), _put(labels, backend), reduction=reduction)
        b = nn.cross_entropy(_put(logits, backend), _put(one_hot, backend), reduction=reduction)
        np.testing.assert_allclose(_np(a), ref, rtol=1e-12)
        np.testing.assert_allclose(_np(b), ref, rtol=1e-12)
    ga = cv.grad(nn.cross_entropy)(logits, labels)
    gb = cv.grad(nn.cross_entropy)(logits, one_hot)
    np.testing.assert_allclose(ga, gb, rtol=1e-12, atol=1e-15)
    # the closed form: (softmax − one_hot) / N
    np.testing.assert_allclose(ga, (np.exp(ref_log_softmax(logits)) - one_hot) / 6, rtol=1e-10, atol=1e-14)


def test_cross_entropy_probabilities_and_unbatched():
    logits = _rand(21, 4, 3)
    p = np.random.default_rng(22).dirichlet(np.ones(3), size=4)
    want = -(p * ref_log_softmax(logits)).sum(-1).mean()
    np.testing.assert_allclose(nn.cross_entropy(logits, p), want, rtol=1e-12)
    np.testing.assert_allclose(nn.cross_entropy(logits[1], np.int64(2)), -ref_log_softmax(logits[1])[2], rtol=1e-12)
    check_grads(lambda z, q: nn.cross_entropy(z, q), (logits, p), order=2)
    with pytest.raises(ValueError, match="reduction"):
        nn.cross_entropy(logits, p, reduction="avg")


def test_mse():
    a, b = _rand(23, 3, 4), _rand(24, 3, 4)
    np.testing.assert_allclose(nn.mse(a, b), ((a - b) ** 2).mean(), rtol=1e-12)
    np.testing.assert_allclose(nn.mse(a, b, "sum"), ((a - b) ** 2).sum(), rtol=1e-12)
    np.testing.assert_allclose(nn.mse_loss(a, b, "none"), (a - b) ** 2, rtol=1e-12)
    np.testing.assert_allclose(cv.grad(nn.mse)(a, b), 2 * (a - b) / a.size, rtol=1e-12)


def test_flatten():
    x = _rand(25, 2, 3, 4, 5)
    assert nn.flatten(x).shape == (120,)
    assert nn.flatten(x, 1).shape == (2, 60)
    assert nn.flatten(x, 1, 2).shape == (2, 12, 5)
    assert nn.flatten(x, -2).shape == (2, 3, 20)
    np.testing.assert_array_equal(nn.flatten(x, 1), x.reshape(2, -1))
    assert cv.vmap(nn.flatten)(x).shape == (2, 60)
    with pytest.raises(ShapeError, match="out of range"):
        nn.flatten(x, 4)


# ---------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------

# (layer, input shape with a concrete batch size)
LAYER_CASES = [
    ("dense", lambda: L.Dense(7), (4, 5)),
    ("dense_nobias", lambda: L.Dense(3, bias=False), (4, 2, 5)),
    ("conv1d", lambda: L.Conv(4, 3, stride=2, padding=1), (3, 2, 9)),
    ("conv2d_groups", lambda: L.Conv(4, (3, 2), dilation=(1, 2), groups=2, bias=False), (2, 4, 6, 7)),
    ("conv2d_same", lambda: L.Conv(3, 3, padding="same"), (2, 2, 5, 6)),
    ("conv3d", lambda: L.Conv(2, 2), (2, 1, 3, 4, 3)),
    ("conv_transpose2d", lambda: L.ConvTranspose(3, 3, stride=2, padding=1, output_padding=1), (2, 4, 3, 4)),
    ("conv_transpose1d", lambda: L.ConvTranspose(2, 2, stride=3, groups=2), (2, 4, 5)),
    ("conv_transpose3d", lambda: L.ConvTranspose(2, (2, 1, 2), dilation=2), (1, 2, 3, 2, 3)),
    ("maxpool2d", lambda: L.MaxPool(2), (2, 3, 6, 5)),
    ("maxpool1d", lambda: L.MaxPool(3, 2, 1), (2, 3, 8)),
    ("maxpool3d", lambda: L.MaxPool(2), (2, 2, 4, 4, 2)),
    ("avgpool2d", lambda: L.AvgPool(2, 1, 1), (2, 3, 5, 4)),
    ("avgpool1d", lambda: L.AvgPool(2), (3, 2, 7)),
    ("avgpool3d", lambda: L.AvgPool((2, 2, 1), count_include_pad=False, padding=(1, 0, 0)), (2, 2, 3, 4, 2)),
    ("relu", lambda: L.Relu, (2, 3, 4)),
    ("gelu", lambda: L.Gelu, (2, 3)),
    ("tanh", lambda: L.Tanh, (2, 3)),
    ("sigmoid", lambda: L.Sigmoid, (2, 3)),
    ("log_softmax", lambda: L.LogSoftmax, (3, 4)),
    ("flatten", lambda: L.Flatten, (2, 3, 4, 2)),
    ("layer_norm", lambda: L.LayerNorm((4, 5)), (3, 2, 4, 5)),
    ("group_norm", lambda: L.GroupNorm(2), (3, 4, 5, 2)),
    ("group_norm_1d", lambda: L.GroupNorm(4), (2, 4, 5)),
    ("group_norm_3d", lambda: L.GroupNorm(1), (2, 2, 3, 2, 2)),
    ("group_norm_dense", lambda: L.GroupNorm(3, affine=False), (3, 6)),
    ("serial", lambda: L.Serial(L.Conv(3, 2), L.GroupNorm(3), L.Relu, L.MaxPool(2), L.Flatten, L.Dense(2)),
     (2, 2, 5, 5)),
    ("dropout_eval", lambda: L.Dropout(0.5, mode="eval"), (3, 4)),
    ("identity", lambda: L.Identity, (2, 3)),
    ("fanout_parallel_concat", lambda: L.Serial(L.FanOut(2), L.parallel(L.Dense(4), L.Dense(3)), L.FanInConcat()),
     (3, 5)),
    ("fanin_sum", lambda: L.Serial(L.Dense(4), L.FanOut(3), L.parallel(L.Dense(4), L.Tanh, L.Identity), L.FanInSum),
     (3, 5)),
    ("fanin_concat_channels", lambda: L.Serial(L.Conv(2, 3, padding=1), L.FanOut(2),
                                               L.parallel(L.Conv(3, 1), L.Identity), L.FanInConcat(1)), (2, 2, 5, 5)),
    ("parallel_class_name", lambda: L.Serial(L.FanOut(2), L.Parallel(L.Dense(2), L.Relu), L.FanInConcat(-1)), (2, 4)),
    ("residual_conv", lambda: L.Residual(L.Conv(2, 3, padding=1), L.GroupNorm(1), L.Relu, L.Conv(2, 3, padding=1)),
     (2, 2, 5, 5)),
    ("embedding", lambda: L.Serial(L.elementwise(lambda x: cv.numpy.astype(x > 0, np.int64)), L.Embedding(2, 3)),
     (2, 4)),
    ("multiheadattention", lambda: L.MultiHeadAttention(2), (2, 4, 6)),
    ("multihead_attention_causal_qkv", lambda: L.MultiHeadAttention(3, qkv_features=6, out_features=5, is_causal=True),
     (2, 3, 4)),
]


def test_every_layer_has_a_row():
    public = {name for name, obj in vars(L).items()
              if name[0].isupper() and (isinstance(obj, L.Layer) or (callable(obj) and not isinstance(obj, type)
                                                                      and obj.__module__.startswith(L.__name__)))}
    covered = {name for name in public if any(c[0].replace("_", "").startswith(name.lower()) for c in LAYER_CASES)}
    assert public - covered == set(), f"layers without a row in LAYER_CASES: {sorted(public - covered)}"


@pytest.mark.parametrize("make,shape", [c[1:] for c in LAYER_CASES], ids=[c[0] for c in LAYER_CASES])
def test_layer_shapes_and_single_examples(make, shape, backend):
    init, apply = make()
    rng = np.random.default_rng(30)
    out_shape, params = init(rng, (-1,) + shape[1:], dtype=np.float64)
    assert out_shape[0] == -1
    concrete_shape, _ = init(rng, shape, dtype=np.float64)
    assert concrete_shape[0] == shape[0]
    params = _put(params, backend)
    x = _put(_rand(31, *shape), backend)
    y = apply(params, x)
    assert tuple(y.shape) == tuple(concrete_shape), f"init says {concrete_shape}, apply gives {y.shape}"
    # one example at a time (without the batch dim) equals the batched call, and a batch of one
    for i in range(shape[0]):
        np.testing.assert_allclose(_np(apply(params, x[i])), _np(y[i]), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(_np(apply(params, x[i:i + 1])[0]), _np(y[i]), rtol=1e-12, atol=1e-12)
    # vmap over examples (per-example apply) equals the batched call
    np.testing.assert_allclose(_np(cv.vmap(apply, in_axes=(None, 0))(params, x)), _np(y), rtol=1e-12, atol=1e-12)


def test_layer_init_follows_torch_bounds_and_dtypes():
    rng = np.random.default_rng(32)
    _, p = L.Dense(300).init(rng, (-1, 50))
    assert p["weight"].shape == (50, 300) and p["weight"].dtype == np.float32
    bound = 1 / np.sqrt(50)
    for leaf in (p["weight"], p["bias"]):
        assert np.abs(leaf).max() <= bound and np.abs(leaf).max() > 0.95 * bound
    # uniform on (−b, b): variance b²/3
    assert abs(p["weight"].var() - bound ** 2 / 3) < 0.05 * bound ** 2
    _, pc = L.Conv(64, (3, 2), groups=2).init(rng, (1, 8, 5, 5), dtype=np.float64)
    assert pc["weight"].shape == (64, 4, 3, 2) and pc["weight"].dtype == np.float64
    assert np.abs(pc["weight"]).max() <= 1 / np.sqrt(4 * 6)
    _, pt = L.ConvTranspose(6, 3, groups=3).init(rng, (1, 9, 4, 4))
    assert pt["weight"].shape == (9, 2, 3, 3)
    assert np.abs(pt["weight"]).max() <= 1 / np.sqrt(2 * 9)  # torch's fan_in: weight.shape[1] · Π k
    _, pn = L.LayerNorm(5).init(rng, (2, 5), dtype=np.float64)
    np.testing.assert_array_equal(pn["weight"], np.ones(5))
    np.testing.assert_array_equal(pn["bias"], np.zeros(5))
    # an int seed works as the rng, and is deterministic
    a = L.Dense(3).init(7, (1, 4))[1]["weight"]
    np.testing.assert_array_equal(a, L.Dense(3).init(np.random.default_rng(7), (1, 4))[1]["weight"])
    with pytest.raises(ValueError, match="floating"):
        L.Dense(3).init(rng, (1, 4), dtype=np.int32)


def test_layer_errors():
    for layer in (L.MaxPool(2), L.Flatten, L.GroupNorm(1)):
        _, params = layer.init(0, (-1, 1, 8, 8))
        with pytest.raises(ShapeError, match="rank 3 .one example. or 4 .a batch."):
            layer.apply(params, np.zeros((2, 2, 1, 8, 8), np.float32))
    with pytest.raises(ShapeError, match="divisible"):
        L.Conv(3, 3, groups=2).init(0, (1, 4, 5, 5))
    with pytest.raises(ShapeError, match="kernel_size"):
        L.Conv(3, (3, 3)).init(0, (1, 4, 5))
    with pytest.raises(ValueError, match="params"):
        L.Serial(L.Relu, L.Tanh).apply([()], np.zeros(3))


def small_cnn():
    return L.Serial(
        L.Conv(4, 3, padding=1), L.Relu, L.MaxPool(2), L.Conv(6, 3, stride=1), L.GroupNorm(2), L.Gelu,
        L.Flatten, L.Dense(5), L.LogSoftmax,
    )


def test_serial_cnn_per_example_grads_match_loop():
    init, apply = small_cnn()
    out_shape, params = init(np.random.default_rng(33), (-1, 2, 8, 8), dtype=np.float64)
    assert out_shape == (-1, 5)
    rng = np.random.default_rng(34)
    xs, ys = rng.standard_normal((5, 2, 8, 8)), rng.integers(0, 5, size=5)

    def loss(params, x, y):          # one example: x (2, 8, 8), y a label
        return -apply(params, x)[y]

    per_example = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
    for i in range(5):
        want = cv.grad(loss)(params, xs[i], ys[i])
        assert cv.tree.structure(want) == cv.tree.structure(per_example)
        for got_leaf, want_leaf in zip(cv.tree.leaves(per_example), cv.tree.leaves(want)):
            np.testing.assert_allclose(got_leaf[i], want_leaf, rtol=1e-10, atol=1e-12)
    # the mean of the per-example gradients is the gradient of the batch loss (apply ends
    # in LogSoftmax, and log_softmax of log-probabilities is the identity)
    batch_grad = cv.grad(lambda p: nn.cross_entropy(apply(p, xs), ys))(params)
    for a, b in zip(cv.tree.leaves(batch_grad), cv.tree.leaves(per_example)):
        np.testing.assert_allclose(a, b.mean(0), rtol=1e-10, atol=1e-12)


def test_serial_cnn_grads_match_finite_differences():
    init, apply = L.Serial(L.Conv(2, 3), L.Tanh, L.AvgPool(2, 1, 1, count_include_pad=False), L.MaxPool(2),
                           L.Flatten, L.Dense(3), L.LogSoftmax)
    _, params = init(np.random.default_rng(35), (-1, 1, 6, 6), dtype=np.float64)
    x = _rand(36, 2, 1, 6, 6)
    check_grads(lambda p: apply(p, x)[:, 1], (params,), order=1, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------
# Optimizers: against hand-written loops of the update rules
# ---------------------------------------------------------------------------------------


def _tree_params():
    rng = np.random.default_rng(40)
    return {"a": rng.standard_normal((3, 2)), "b": [rng.standard_normal(4), rng.standard_normal(())]}


def _grads_at(step):
    rng = np.random.default_rng(100 + step)
    return {"a": rng.standard_normal((3, 2)), "b": [rng.standard_normal(4), rng.standard_normal(())]}


def _assert_trees_close(a, b, rtol=1e-12):
    assert cv.tree.structure(a) == cv.tree.structure(b)
    for x, y in zip(cv.tree.leaves(a), cv.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=1e-14)


def _run(opt, params, steps=4):
    state = opt.init(params)
    for t in range(steps):
        params, state = opt.update(_grads_at(t), state, params)
    return params, state


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.0, False, 0.0), (0.9, False, 0.0), (0.9, True, 0.0),
                                                  (0.5, False, 0.1), (0.0, False, 0.01)])
def test_sgd_matches_hand_written(momentum, nesterov, wd):
    lr = 0.1
    params = _tree_params()
    got, state = _run(optim.sgd(lr, momentum=momentum, nesterov=nesterov, weight_decay=wd), params)
    assert state.step == 4
    leaves, treedef = cv.tree.flatten(params)
    want = []
    for i, p in enumerate(leaves):
        p, buf = p.copy(), np.zeros_like(p)
        for t in range(4):
            g = cv.tree.leaves(_grads_at(t))[i] + wd * p
            if momentum:
                buf = momentum * buf + g          # torch: buf = g at the first step, the same from 0
                g = g + momentum * buf if nesterov else buf
            p = p - lr * g
        want.append(p)
    _assert_trees_close(got, cv.tree.unflatten(treedef, want))


def test_sgd_closed_form():
    """Constant gradient g, momentum m: after T steps p = p0 − lr·g·Σ_t (1 − m^{t+1})/(1 − m)."""
    p0, g, lr, m = np.array([1.0, -2.0]), np.array([0.5, 0.25]), 0.1, 0.5
    opt = optim.sgd(lr, momentum=m)
    p, s = p0, opt.init(p0)
    for _ in range(3):
        p, s = opt.update(g, s, p)
    coeff = sum((1 - m ** (t + 1)) / (1 - m) for t in range(3))
    np.testing.assert_allclose(p, p0 - lr * g * coeff, rtol=1e-14)


@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_adam_matches_hand_written(wd):
    lr, b1, b2, eps = 0.01, 0.8, 0.99, 1e-6
    params = _tree_params()
    got, state = _run(optim.adam(lr, b1, b2, eps, weight_decay=wd), params, steps=5)
    assert state.step == 5
    leaves, treedef = cv.tree.flatten(params)
    want = []
    for i, p in enumerate(leaves):
        p, m, v = p.copy(), np.zeros_like(p), np.zeros_like(p)
        for t in range(1, 6):
            g = cv.tree.leaves(_grads_at(t - 1))[i] + wd * p
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            # torch's form: step_size = lr / bc1, denom = sqrt(v) / sqrt(bc2) + eps
            p = p - (lr / (1 - b1 ** t)) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)
        want.append(p)
    _assert_trees_close(got, cv.tree.unflatten(treedef, want), rtol=1e-10)


def test_adam_first_step_is_sign_descent():
    """With m₀ = v₀ = 0 the bias-corrected first step is lr·g/(|g| + eps)."""
    p0, g = np.array([1.0, 2.0, 3.0]), np.array([0.3, -4.0, 1e-3])
    opt = optim.adam(0.1, eps=0.0)
    p, _ = opt.update(g, opt.init(p0), p0)
    np.testing.assert_allclose(p, p0 - 0.1 * np.sign(g), rtol=1e-12)


def test_optimizers_are_pure_and_take_schedules():
    params = _tree_params()
    before = cv.tree.map(np.copy, params)
    opt = optim.sgd(lambda step: 0.1 / (step + 1), momentum=0.9)
    state = opt.init(params)
    p1, s1 = opt.update(_grads_at(0), state, params)
    p1_again, _ = opt.update(_grads_at(0), state, params)
    _assert_trees_close(params, before)            # nothing was modified in place
    _assert_trees_close(p1, p1_again)              # the old state is still valid
    p2, _ = opt.update(_grads_at(1), s1, p1)
    # step 2 used lr = 0.05 with the momentum buffer of step 1
    buf = cv.tree.map(lambda g0, g1: 0.9 * g0 + g1, _grads_at(0), _grads_at(1))
    _assert_trees_close(p2, cv.tree.map(lambda p, b: p - 0.05 * b, p1, buf))
    with pytest.raises(ValueError, match="nesterov"):
        optim.sgd(0.1, nesterov=True)


def test_optimizers_carry_example_rank_nodes_and_float32():
    init, apply = L.Serial(L.Dense(3), L.Relu, L.Flatten)
    _, params = init(0, (-1, 4))
    grads = cv.tree.map(lambda p: p * 0 + 1, params)
    for opt in (optim.sgd(0.1, momentum=0.9), optim.adam(0.1)):
        new, state = opt.update(grads, opt.init(params), params)
        assert cv.tree.structure(new) == cv.tree.structure(params)
        assert all(leaf.dtype == np.float32 for leaf in cv.tree.leaves(new))


@pytest.mark.parametrize("opt", [optim.sgd(0.1, momentum=0.9, nesterov=True), optim.sgd(lambda t: 0.1 / (1 + t)),
                                 optim.adam(0.01, weight_decay=0.1), optim.adam(lambda t: 0.01 * 0.9 ** t)],
                         ids=["sgd_nesterov", "sgd_schedule", "adam", "adam_schedule"])
def test_jitted_optimizer_update_traces_once_and_keeps_float32(opt):
    """NOTE [step count as an array]: the step count is a 0-d int64 array, so jit(update)
    traces once for a whole training loop, and float32 parameters stay float32 (the bias
    corrections and a schedule's rate are cast to them), with the eager update's values."""
    rng = np.random.default_rng(7)
    params = {"w": rng.standard_normal((3, 4)).astype(np.float32), "b": np.zeros(4, np.float32)}
    jitted = cv.jit(opt.update)
    p_jit, s_jit = params, opt.init(params)
    p_eager, s_eager = params, opt.init(params)
    assert s_jit.step.shape == () and s_jit.step.dtype == np.int64
    for t in range(5):
        grads = {"w": rng.standard_normal((3, 4)).astype(np.float32), "b": np.full(4, 0.5, np.float32)}
        p_jit, s_jit = jitted(grads, s_jit, p_jit)
        p_eager, s_eager = opt.update(grads, s_eager, p_eager)
    assert jitted.trace_count == 1 and int(s_jit.step) == int(s_eager.step) == 5
    for a, b in zip(cv.tree.leaves((p_jit, s_jit)), cv.tree.leaves((p_eager, s_eager))):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert all(leaf.dtype == np.float32 for leaf in cv.tree.leaves(p_jit))


@pytest.mark.parametrize("make_opt,steps", [(lambda: optim.sgd(0.5, momentum=0.9), 60),
                                            (lambda: optim.adam(0.3), 100)], ids=["sgd_momentum", "adam"])
def test_optimizers_train_a_tiny_problem(make_opt, steps):
    """Logistic regression on linearly separable data: the loss falls by 10x and every
    training example ends up classified correctly."""
    rng = np.random.default_rng(41)
    xs = rng.standard_normal((64, 2))
    ys = (xs @ np.array([2.0, -1.0]) + 0.5 > 0).astype(np.int64)
    init, apply = L.Serial(L.Dense(2), L.LogSoftmax)
    _, params = init(rng, (-1, 2), dtype=np.float64)

    def loss(params):
        return nn.cross_entropy(apply(params, xs), ys)

    opt = make_opt()
    state = opt.init(params)
    first = loss(params)
    for _ in range(steps):
        params, state = opt.update(cv.grad(loss)(params), state, params)
    assert loss(params) < first / 10
    assert np.all(np.argmax(apply(params, xs), -1) == ys)


def test_dp_sgd_style_step_on_a_cnn():
    """Per-example gradients, clipped to norm 1 each and averaged, then an optimizer step:
    the DP-SGD pattern (without noise) that the per-example norms make valid."""
    init, apply = small_cnn()
    _, params = init(np.random.default_rng(42), (-1, 2, 8, 8), dtype=np.float64)
    rng = np.random.default_rng(43)
    xs, ys = rng.standard_normal((6, 2, 8, 8)), rng.integers(0, 5, size=6)

    def loss(params, x, y):
        return -apply(params, x)[y]

    grads = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
    norms = np.sqrt(sum(np.sum(g.reshape(6, -1) ** 2, axis=1) for g in cv.tree.leaves(grads)))
    scale = np.minimum(1.0, 1.0 / norms)
    clipped = cv.tree.map(lambda g: (g * scale.reshape((6,) + (1,) * (g.ndim - 1))).mean(0), grads)
    clipped_norms_sq = sum(np.sum((g * scale.reshape((6,) + (1,) * (g.ndim - 1))).reshape(6, -1) ** 2, 1)
                           for g in cv.tree.leaves(grads))
    assert np.all(clipped_norms_sq <= 1 + 1e-9)
    opt = optim.sgd(0.1)
    new, _ = opt.update(clipped, opt.init(params), params)
    assert cv.tree.structure(new) == cv.tree.structure(params)


# ---------------------------------------------------------------------------------------
# GPU (skipped without a device)
# ---------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_init_and_training_step():
    if not cv.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    import cupy

    init, apply = small_cnn()
    _, params = init(cupy.random.default_rng(0), (-1, 2, 8, 8))
    assert all(type(leaf).__module__.startswith("cupy") for leaf in cv.tree.leaves(params))
    assert all(leaf.dtype == np.float32 for leaf in cv.tree.leaves(params))
    params_cpu = cv.device_put(params, "cpu")
    rng = np.random.default_rng(44)
    xs, ys = rng.standard_normal((4, 2, 8, 8)).astype(np.float32), rng.integers(0, 5, size=4)

    def loss(params, x, y):
        return -apply(params, x)[y]

    f = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))
    g_gpu = f(params, cv.device_put(xs, "gpu"), cv.device_put(ys, "gpu"))
    g_cpu = f(params_cpu, xs, ys)
    for a, b in zip(cv.tree.leaves(g_gpu), cv.tree.leaves(g_cpu)):
        np.testing.assert_allclose(a.get(), b, rtol=1e-4, atol=1e-5)
    opt = optim.adam(1e-3)
    new, _ = opt.update(cv.tree.map(lambda g: g.mean(0), g_gpu), opt.init(params), params)
    assert all(type(leaf).__module__.startswith("cupy") for leaf in cv.tree.leaves(new))


def test_conv_layer_valid_padding_with_stride_reports_the_applied_shape():
    """init's output shape must be what apply produces (found in review: 'valid' ignored stride)."""
    from cuvmap.nn import layers

    for kw in (dict(stride=2, padding="valid"), dict(stride=(2, 1), padding="valid", dilation=2), dict(padding="same")):
        init, apply = layers.Conv(4, 3, **kw)
        shape, params = init(np.random.default_rng(0), (-1, 1, 9, 8))
        out = apply(params, np.ones((2, 1, 9, 8), np.float32))
        assert shape[1:] == out.shape[1:], kw


# ---------------------------------------------------------------------------------------
# One example against a batch of one: every nn function (NOTE [batch or one example])
# ---------------------------------------------------------------------------------------

_W = np.random.default_rng(50)
_CONV1, _CONV2 = _W.standard_normal((4, 3, 3)), _W.standard_normal((4, 3, 3, 2))
_CONV3 = _W.standard_normal((2, 3, 2, 2, 2))
_CONVT2, _BIAS4 = _W.standard_normal((3, 4, 3, 3)), _W.standard_normal(4)
_GN6, _LN = _W.standard_normal(6), _W.standard_normal((5, 4))


def _ints(k):
    return lambda rng: rng.integers(0, k, size=(), dtype=np.int64)


def _probs(k):
    return lambda rng: rng.dirichlet(np.ones(k))


def _normal(*shape):
    return lambda rng: rng.standard_normal(shape)


# (name, per-example call, batched call, one example's inputs). The batched call takes the
# same inputs with a leading batch dim and returns the per-example results stacked.
PER_EXAMPLE_CASES = [
    ("conv1d", lambda x: nn.conv(x, _CONV1, _BIAS4, padding=1), lambda x: nn.conv(x, _CONV1, _BIAS4, padding=1),
     [_normal(3, 7)]),
    ("conv2d", lambda x: nn.conv(x, _CONV2, stride=(2, 1), padding="valid"),
     lambda x: nn.conv(x, _CONV2, stride=(2, 1), padding="valid"), [_normal(3, 6, 5)]),
    ("conv3d_same", lambda x: nn.conv(x, _CONV3, padding="same"), lambda x: nn.conv(x, _CONV3, padding="same"),
     [_normal(3, 3, 4, 3)]),
    ("conv_transpose", lambda x: nn.conv_transpose(x, _CONVT2, _BIAS4, stride=2, padding=1, output_padding=1),
     lambda x: nn.conv_transpose(x, _CONVT2, _BIAS4, stride=2, padding=1, output_padding=1), [_normal(3, 4, 3)]),
    ("max_pool_tuple", lambda x: nn.max_pool(x, (2, 2)), lambda x: nn.max_pool(x, (2, 2)), [_normal(3, 6, 5)]),
    ("max_pool_spatial_dims", lambda x: nn.max_pool(x, 3, 1, 1, spatial_dims=2),
     lambda x: nn.max_pool(x, 3, 1, 1, spatial_dims=2), [_normal(2, 5, 4)]),
    ("max_pool_1d_int", lambda x: nn.max_pool(x, 2), lambda x: nn.max_pool1d(x, 2), [_normal(3, 8)]),
    ("max_pool_3d_int", lambda x: nn.max_pool3d(x, 2), lambda x: nn.max_pool(x, 2), [_normal(2, 4, 4, 4)]),
    ("max_pool1d", lambda x: nn.max_pool1d(x, 3, 2, 1), lambda x: nn.max_pool1d(x, 3, 2, 1), [_normal(3, 8)]),
    ("max_pool2d", lambda x: nn.max_pool2d(x, 2), lambda x: nn.max_pool2d(x, 2), [_normal(3, 6, 4)]),
    ("max_pool3d", lambda x: nn.max_pool3d(x, (2, 1, 2)), lambda x: nn.max_pool3d(x, (2, 1, 2)),
     [_normal(2, 4, 3, 4)]),
    ("avg_pool", lambda x: nn.avg_pool(x, (3, 2), 1, 1, count_include_pad=False),
     lambda x: nn.avg_pool(x, (3, 2), 1, 1, count_include_pad=False), [_normal(2, 5, 4)]),
    ("avg_pool1d", lambda x: nn.avg_pool1d(x, 2), lambda x: nn.avg_pool1d(x, 2), [_normal(3, 8)]),
    ("avg_pool2d", lambda x: nn.avg_pool2d(x, 2, 1, 1), lambda x: nn.avg_pool2d(x, 2, 1, 1), [_normal(3, 6, 4)]),
    ("avg_pool3d", lambda x: nn.avg_pool3d(x, 2), lambda x: nn.avg_pool3d(x, 2), [_normal(2, 4, 4, 2)]),
    ("relu", nn.relu, nn.relu, [_normal(3, 4)]),
    ("gelu", nn.gelu, nn.gelu, [_normal(3, 4)]),
    ("tanh", nn.tanh, nn.tanh, [_normal(5)]),
    ("sigmoid", nn.sigmoid, nn.sigmoid, [_normal(5)]),
    ("softmax", nn.softmax, nn.softmax, [_normal(2, 5)]),
    ("log_softmax", nn.log_softmax, nn.log_softmax, [_normal(5)]),
    ("layer_norm", lambda x: nn.layer_norm(x, (5, 4), _LN), lambda x: nn.layer_norm(x, (5, 4), _LN),
     [_normal(3, 5, 4)]),
    ("group_norm_2d", lambda x: nn.group_norm(x, 3, _GN6, -_GN6, spatial_dims=2),
     lambda x: nn.group_norm(x, 3, _GN6, -_GN6, spatial_dims=2), [_normal(6, 4, 3)]),
    ("group_norm_0d", lambda x: nn.group_norm(x, 2, spatial_dims=0), lambda x: nn.group_norm(x, 2, spatial_dims=0),
     [_normal(6)]),
    ("group_norm_3d", lambda x: nn.group_norm(x, 2, spatial_dims=3), lambda x: nn.group_norm(x, 2),
     [_normal(6, 2, 3, 2)]),
    ("cross_entropy", nn.cross_entropy, lambda z, y: nn.cross_entropy(z, y, reduction="none"), [_normal(5), _ints(5)]),
    ("cross_entropy_probabilities", nn.cross_entropy, lambda z, p: nn.cross_entropy(z, p, reduction="none"),
     [_normal(5), _probs(5)]),
    ("mse", nn.mse, lambda a, b: nn.mse(a, b, reduction="none").reshape(a.shape[0], -1).mean(-1),
     [_normal(3, 2), _normal(3, 2)]),
    ("flatten", nn.flatten, lambda x: nn.flatten(x, 1), [_normal(3, 2, 4)]),
]
@pytest.mark.parametrize("one,batched,inputs", [c[1:] for c in PER_EXAMPLE_CASES],
                         ids=[c[0] for c in PER_EXAMPLE_CASES])
def test_one_example_equals_a_batch_of_one(one, batched, inputs):
    """The per-example call on one example equals the batched call on a batch of one, and
    ``vmap`` of the per-example call equals the batched call on a batch of three."""
    rng = np.random.default_rng(51)
    example = [make(rng) for make in inputs]
    want = batched(*[np.asarray(a)[None] for a in example])
    got = one(*example)
    assert tuple(got.shape) == tuple(want.shape[1:])
    np.testing.assert_allclose(got, want[0], rtol=1e-12, atol=1e-12)
    batch = [np.stack([make(rng) for _ in range(3)]) for make in inputs]
    np.testing.assert_allclose(cv.vmap(one)(*batch), batched(*batch), rtol=1e-12, atol=1e-12)


def test_every_nn_function_has_a_per_example_row():
    import inspect

    from cuvmap.nn import functional

    public = {name for name, obj in vars(functional).items()
              if inspect.isfunction(obj) and obj.__module__ == functional.__name__ and not name.startswith("_")}
    covered = {c[0] for c in PER_EXAMPLE_CASES} | {"mse_loss", "check_transpose_padding"}
    for name in list(covered):  # a row name may add a suffix to the function's name
        covered |= {n for n in public if name.startswith(n)}
    assert public <= covered, f"nn functions without a row in PER_EXAMPLE_CASES: {sorted(public - covered)}"


# The calls whose rank has two readings raise and say what to write instead.
AMBIGUOUS_CASES = [
    ("max_pool_chw", lambda: nn.max_pool(np.zeros((3, 8, 8)), 2),
     ["ambiguous", r"one example \(C, H, W\)", r"max_pool2d\(x, 2\)", r"max_pool\(x, \(2, 2\)\)",
      r"a batch \(N, C, L\)", r"max_pool1d\(x, 2\)", "spatial_dims"]),
    ("avg_pool_chw", lambda: nn.avg_pool(np.zeros((3, 8, 8)), 2, 1),
     ["ambiguous", r"avg_pool2d\(x, 2\)", r"avg_pool1d\(x, 2\)"]),
    ("max_pool_nchw", lambda: nn.max_pool(np.zeros((2, 3, 8, 8)), 2),
     [r"a batch \(N, C, H, W\)", r"max_pool2d\(x, 2\)", r"one example \(C, D, H, W\)", r"max_pool3d\(x, 2\)"]),
    ("avg_pool_nchw", lambda: nn.avg_pool(np.zeros((2, 3, 8, 8)), 2),
     [r"avg_pool2d\(x, 2\)", r"avg_pool3d\(x, 2\)"]),
    ("max_pool_under_vmap", lambda: cv.vmap(lambda x: nn.max_pool(x, 2))(np.zeros((4, 3, 8, 8))),
     ["vmap", r"shape \(3, 8, 8\) is ambiguous", r"max_pool2d\(x, 2\)"]),
    ("group_norm_chw", lambda: nn.group_norm(np.zeros((6, 8, 8)), 3),
     [r"shape \(6, 8, 8\) may be a batch \(N, C, L\) or one example \(C, H, W\)",
      r"spatial_dims=2 for one example \(C, H, W\)", r"spatial_dims=1 for a batch \(N, C, L\)"]),
    ("group_norm_nchw", lambda: nn.group_norm(np.zeros((2, 6, 8, 8)), 3, np.ones(6)),
     [r"spatial_dims=2 for a batch \(N, C, H, W\)", r"spatial_dims=3 for one example \(C, D, H, W\)"]),
    ("group_norm_nc", lambda: nn.group_norm(np.zeros((2, 6)), 3),
     [r"spatial_dims=0 for a batch \(N, C\)", r"spatial_dims=1 for one example \(C, L\)"]),
    ("group_norm_under_vmap", lambda: cv.vmap(lambda x: nn.group_norm(x, 3))(np.zeros((4, 6, 8, 8))),
     ["vmap", r"spatial_dims=2 for one example \(C, H, W\)"]),
]


@pytest.mark.parametrize("call,fragments", [c[1:] for c in AMBIGUOUS_CASES], ids=[c[0] for c in AMBIGUOUS_CASES])
def test_ambiguous_rank_raises_and_says_what_to_write(call, fragments):
    with pytest.raises(ShapeError) as info:
        call()
    for fragment in fragments:
        assert re.search(fragment, str(info.value)), f"{fragment!r} not in: {info.value}"


POOL_ERROR_CASES = [
    ("kernel_vs_spatial_dims", lambda: nn.max_pool(np.zeros((3, 8, 8)), (2, 2), spatial_dims=1),
     r"max_pool: kernel_size \(2, 2\) has 2 entries, but spatial_dims=1"),
    ("rank_vs_name", lambda: nn.max_pool2d(np.zeros((8, 8)), 2),
     r"max_pool2d: .*one example \(C, H, W\) for 2 spatial dims \(from the name max_pool2d\)"),
    ("rank_1", lambda: nn.avg_pool(np.zeros((8,)), 2), r"\(N, C, S...\) or \(C, S...\) with 1-3 spatial dims"),
    ("kernel_of_4", lambda: nn.max_pool(np.zeros((3, 8)), (2, 2, 2, 2)), "1-3 entries"),
    ("stride_length", lambda: nn.avg_pool2d(np.zeros((3, 8, 8)), 2, stride=(1, 1, 1)),
     r"avg_pool2d: stride \(1, 1, 1\) must have one entry per spatial dim \(2\)"),
    ("spatial_dims_4", lambda: nn.max_pool(np.zeros((3, 8, 8)), 2, spatial_dims=4), "spatial_dims must be 1, 2 or 3"),
]


@pytest.mark.parametrize("call,match", [c[1:] for c in POOL_ERROR_CASES], ids=[c[0] for c in POOL_ERROR_CASES])
def test_pool_errors_name_the_function_and_argument(call, match):
    with pytest.raises(ShapeError, match=match):
        call()


def test_group_norm_layer_on_one_example_under_vmap():
    """GroupNorm's apply passes spatial_dims from init, so a per-example apply under vmap
    normalizes each example's (C, H, W), as the batched call does."""
    init, apply = L.GroupNorm(2)
    _, params = init(0, (-1, 4, 3, 3), dtype=np.float64)
    xs = _rand(52, 5, 4, 3, 3)
    want = ref_group_norm(xs, 2, np.ones(4), np.zeros(4), 1e-5)
    np.testing.assert_allclose(cv.vmap(apply, in_axes=(None, 0))(params, xs), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(apply(params, xs), want, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------
# conv_transpose has no string padding (NOTE [no same padding for conv_transpose])
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel,stride,dilation", [(3, 2, 1), (4, 2, 1), (5, 3, 1), (1, 2, 1), (3, 1, 1),
                                                    (3, 2, 2), ((3, 2), (2, 3), 1)])
def test_conv_transpose_same_raises_with_the_padding_for_input_times_stride(kernel, stride, dilation):
    """The error names padding / output_padding, and with them the output is input·stride."""
    rng = np.random.default_rng(53)
    k = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    w = rng.standard_normal((2, 3) + k)
    x = rng.standard_normal((1, 2, 5, 4))
    for padding in ("same", "valid"):
        with pytest.raises(ShapeError, match=f"conv_transpose: padding='{padding}' is not supported") as info:
            nn.conv_transpose(x, w, stride=stride, dilation=dilation, padding=padding)
    found = re.search(r"pass padding=(.+?), output_padding=(.+?) \(kernel", str(info.value))
    assert found, str(info.value)
    pad, out_pad = (ast.literal_eval(g) for g in found.groups())
    out = nn.conv_transpose(x, w, stride=stride, dilation=dilation, padding=pad, output_padding=out_pad)
    s = stride if isinstance(stride, tuple) else (stride, stride)
    assert out.shape == (1, 3, 5 * s[0], 4 * s[1])
    # the values: the transposed conv with the full output cropped by `padding` at the start
    full = nn.conv_transpose(x, w, stride=stride, dilation=dilation, output_padding=out_pad)
    p = pad if isinstance(pad, tuple) else (pad, pad)
    np.testing.assert_allclose(out, full[:, :, p[0]:p[0] + 5 * s[0], p[1]:p[1] + 4 * s[1]], rtol=1e-12)


def test_conv_transpose_same_without_an_int_equivalent_and_the_layer():
    w = np.zeros((2, 3, 2, 2))   # stride 1, even kernel: input·stride needs an uneven crop
    with pytest.raises(ShapeError, match="not supported") as info:
        nn.conv_transpose(np.zeros((2, 5, 5)), w, padding="same")
    assert "output_padding=" not in str(info.value)
    with pytest.raises(ShapeError,
                       match=r"ConvTranspose: padding='same' is not supported.*padding=1, output_padding=1"):
        L.ConvTranspose(4, 3, stride=2, padding="same").init(0, (-1, 2, 5, 5))


# ---------------------------------------------------------------------------------------
# cross_entropy's labels
# ---------------------------------------------------------------------------------------

_ONE_HOT = np.eye(5, dtype=np.int64)[[0, 1, 2, 3]]
_PER_EXAMPLE_CE = cv.vmap(nn.cross_entropy)   # logits (5,) and labels of one example: logical shapes

# (name, call, fragments of the message)
LABEL_ERROR_CASES = [
    ("float_indices", lambda: nn.cross_entropy(np.zeros((4, 5)), np.zeros(4)),
     ["integer class indices of shape logits.shape[:-1] = (4,)", "got float64 labels of shape (4,)",
      "labels.astype(int)"]),
    ("int_one_hot", lambda: nn.cross_entropy(np.zeros((4, 5)), _ONE_HOT),
     ["got int64 labels of shape (4, 5)", "look one-hot", "labels.argmax(-1)"]),
    ("bool_labels", lambda: nn.cross_entropy(np.zeros((4, 5)), np.zeros(4, bool)), ["got bool labels of shape (4,)"]),
    ("wrong_width", lambda: nn.cross_entropy(np.zeros((4, 5)), np.full((4, 3), 1 / 3)),
     ["float class probabilities of the logits' shape (4, 5)", "got float64 labels of shape (4, 3)"]),
    ("wrong_batch", lambda: nn.cross_entropy(np.zeros((4, 5)), np.zeros(3, np.int64)),
     ["integer class indices of shape logits.shape[:-1] = (4,)", "got int64 labels of shape (3,)"]),
    ("scalar_logits", lambda: nn.cross_entropy(np.zeros(()), np.int64(0)), ["classes on their last axis"]),
    ("vmap_float_indices", lambda: _PER_EXAMPLE_CE(np.zeros((4, 5)), np.zeros(4)),
     ["vmap(cross_entropy)", "logits.shape[:-1] = ()", "got float64 labels of shape ()", "labels.astype(int)"]),
    ("vmap_int_one_hot", lambda: _PER_EXAMPLE_CE(np.zeros((4, 5)), _ONE_HOT),
     ["logits' shape (5,)", "got int64 labels of shape (5,)", "look one-hot"]),
]


@pytest.mark.parametrize("call,fragments", [c[1:] for c in LABEL_ERROR_CASES], ids=[c[0] for c in LABEL_ERROR_CASES])
def test_cross_entropy_label_errors_speak_of_labels(call, fragments):
    with pytest.raises(ShapeError) as info:
        call()
    message = str(info.value)
    assert "take" not in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"


# labels out of [0, K) raise IndexError naming cross_entropy (NOTE [class labels are
# checked]): -1 is a missing label, never the last class (torch raises too)
_LOGITS = np.arange(12.0).reshape(4, 3) / 7
LABEL_BOUNDS_CASES = [
    ("minus_one", lambda: nn.cross_entropy(_LOGITS, np.array([0, -1, 1, 2])), "index -1"),
    ("k", lambda: nn.cross_entropy(_LOGITS, np.array([0, 3, 1, 2])), "index 3"),
    ("minus_k", lambda: nn.cross_entropy(_LOGITS, np.array([0, 1, -3, 2])), "index -3"),
    ("jit", lambda: cv.jit(nn.cross_entropy)(_LOGITS, np.array([0, 1, -1, 2])), "index -1"),
    ("grad", lambda: cv.grad(nn.cross_entropy)(_LOGITS, np.array([-1, 1, 1, 2])), "index -1"),
    ("vmap_grad", lambda: cv.vmap(cv.grad(nn.cross_entropy))(_LOGITS, np.array([0, 1, 1, -1])), "index -1"),
    ("jit_vmap_grad", lambda: cv.jit(cv.vmap(cv.grad(nn.cross_entropy)))(_LOGITS, np.array([0, 9, 1, 1])),
     "index 9"),
]


@pytest.mark.parametrize("call,fragment", [c[1:] for c in LABEL_BOUNDS_CASES], ids=[c[0] for c in LABEL_BOUNDS_CASES])
def test_cross_entropy_labels_outside_the_classes_raise(call, fragment):
    with pytest.raises(IndexError) as info:
        call()
    message = str(info.value)
    assert "cross_entropy" in message and fragment in message and "[0, 3)" in message, message


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_integer_labels_bit_for_bit_and_edges(dtype):
    """The picked logit gives −log_softmax(z)[label] with its rounding; a class masked with
    −inf costs nothing and gets a zero gradient; narrow label dtypes count any K."""
    rng = np.random.default_rng(56)
    logits = rng.standard_normal((7, 300)).astype(dtype)
    labels = rng.integers(0, 300, 7)
    labels[0], labels[1] = 256, 3          # (as uint8: 0 and 3, which 256 and 259 would alias)
    logp = np.asarray(nn.log_softmax(logits))
    want = -logp[np.arange(7), labels]
    got = np.asarray(nn.cross_entropy(logits, labels, reduction="none"))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)
    for narrow in (np.uint16, np.int16, np.int32):
        np.testing.assert_array_equal(np.asarray(nn.cross_entropy(logits, labels.astype(narrow), reduction="none")),
                                      want)
    small = labels % 256   # uint8 labels beside 300 classes: the classes must not wrap to 0..255
    np.testing.assert_array_equal(np.asarray(nn.cross_entropy(logits, small.astype(np.uint8), reduction="none")),
                                  -logp[np.arange(7), small])
    masked = logits.copy()
    masked[:, 5] = -np.inf
    labels[labels == 5] = 6
    loss, g = cv.value_and_grad(nn.cross_entropy)(masked, labels)
    assert np.isfinite(loss) and np.isfinite(np.asarray(g)).all() and not np.asarray(g)[:, 5].any()


@pytest.mark.parametrize("prediction,target", [((4, 1), (4,)), ((4,), (4, 1)), ((3, 2), (2,)), ((2, 3), (3, 2))],
                         ids=str)
def test_mse_shapes_that_differ_raise(prediction, target):
    """torch warns and broadcasts (a (4, 1) prediction against a (4,) target compares all
    pairs); cuvmap raises, eagerly and under vmap (logical shapes)."""
    with pytest.raises(ShapeError, match=re.escape(f"prediction of shape {prediction} and target of shape {target}")):
        nn.mse(np.zeros(prediction), np.zeros(target))
    with pytest.raises(ShapeError, match="mse: prediction of shape"):
        cv.vmap(nn.mse)(np.zeros((5,) + prediction), np.zeros((5,) + target))
    # a scalar on either side is one value for every element
    np.testing.assert_allclose(nn.mse(np.full(prediction, 2.0), 1.0), 1.0)
    np.testing.assert_allclose(nn.mse(3.0, np.full(target, 1.0), "sum"), 4.0 * np.prod(target))


@pytest.mark.parametrize("name,weight,bias", [("weight", (4,), None), ("bias", None, (3,)), ("weight", (2, 5), None),
                                              ("bias", None, (3, 2, 5))], ids=str)
def test_layer_norm_weight_and_bias_have_the_normalized_shape(name, weight, bias):
    """As torch checks: a (2, 5) weight against normalized_shape (5,) would broadcast and
    scale each example by its own row."""
    x = np.ones((2, 5))
    args = [None if s is None else np.ones(s) for s in (weight, bias)]
    with pytest.raises(ShapeError, match=re.escape(f"layer_norm: {name} of shape") + ".*must be normalized_shape"):
        nn.layer_norm(x, (5,), *args)
    # shapes that broadcast into normalized_shape stay (shared along its leading dims)
    np.testing.assert_allclose(nn.layer_norm(np.arange(12.0).reshape(2, 2, 3), (2, 3), np.full((3,), 2.0), np.ones(1)),
                               nn.layer_norm(np.arange(12.0).reshape(2, 2, 3), (2, 3), np.full((2, 3), 2.0),
                                             np.ones((2, 3))))


def test_cross_entropy_per_example_under_vmap_matches_closed_form():
    logits = _rand(54, 6, 4)
    labels = np.array([0, 3, 1, 1, 2, 0])
    p = np.random.default_rng(55).dirichlet(np.ones(4), size=6)
    logp = ref_log_softmax(logits)
    np.testing.assert_allclose(cv.vmap(nn.cross_entropy)(logits, labels), -logp[np.arange(6), labels], rtol=1e-12)
    np.testing.assert_allclose(cv.vmap(nn.cross_entropy)(logits, p), -(p * logp).sum(-1), rtol=1e-12)
    # the gradient of the probability form: softmax − p, per example
    np.testing.assert_allclose(cv.vmap(cv.grad(nn.cross_entropy))(logits, p), np.exp(logp) - p, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("make", [lambda: nn.optim.sgd(0.1, momentum=0.9), lambda: nn.optim.adam(0.1)],
                         ids=["sgd", "adam"])
def test_an_eager_update_keeps_the_step_a_0d_array(make):
    opt = make()
    params = {"w": np.ones(3, np.float32)}
    state = opt.init(params)
    for _ in range(2):
        params, state = opt.update({"w": np.ones(3, np.float32)}, state, params)
        assert type(state.step) is np.ndarray and state.step.shape == () and state.step.dtype == np.int64
    assert int(state.step) == 2
