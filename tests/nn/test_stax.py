"""The stax combinators beyond ``Serial`` (FanOut, FanInSum, FanInConcat, parallel,
Identity, Residual), Dropout from explicit keys, Embedding, dot-product attention and
MultiHeadAttention, the default-dtype setting and the dtype-mismatch errors.

References: NumPy formulas written out here from the params (``x + f(x)``, concatenations,
``weight[ids]`` and ``np.add.at``, attention as a loop over examples and heads with a
NumPy softmax), per-example Python loops for ``vmap``, finite differences for gradients.
"""
import math

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import nn, random
from cuvmap.core import ShapeError
from cuvmap.nn import layers as L
from cuvmap.test_util import check_grads


def _rand(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


def _dense(p, x):
    return x @ p["weight"] + p["bias"]


# ---------------------------------------------------------------------------------------
# Combinators
# ---------------------------------------------------------------------------------------


def test_residual_is_x_plus_the_branch():
    init, apply = L.Residual(L.Dense(5), L.Tanh, L.Dense(5))
    out_shape, params = init(0, (-1, 5), dtype=np.float64)
    assert out_shape == (-1, 5)
    assert params[0] == () and params[2] == () and params[1][1] == ()  # FanOut, FanInSum, Identity
    branch = params[1][0]
    x = _rand(1, 3, 5)
    want = x + _dense(branch[2], np.tanh(_dense(branch[0], x)))
    np.testing.assert_allclose(apply(params, x), want, rtol=1e-13)
    np.testing.assert_allclose(apply(params, x[0]), want[0], rtol=1e-13)


def test_fan_out_parallel_fan_in():
    init, apply = L.Serial(L.FanOut(3), L.parallel(L.Dense(2), L.Identity, L.Dense(4)), L.FanInConcat(-1))
    out_shape, params = init(0, (7, 3), dtype=np.float64)
    assert out_shape == (7, 9)
    x = _rand(2, 7, 3)
    branches = params[1]
    want = np.concatenate([_dense(branches[0], x), x, _dense(branches[2], x)], axis=-1)
    np.testing.assert_allclose(apply(params, x), want, rtol=1e-13)
    # parallel alone maps a list to a list
    p_init, p_apply = L.parallel(L.Dense(2), L.Relu)
    shapes, p_params = p_init(0, [(-1, 3), (-1, 4)], dtype=np.float64)
    assert shapes == [(-1, 2), (-1, 4)]
    a, b = _rand(3, 2, 3), _rand(4, 2, 4)
    ya, yb = p_apply(p_params, [a, b])
    np.testing.assert_allclose(ya, _dense(p_params[0], a), rtol=1e-13)
    np.testing.assert_array_equal(yb, np.maximum(b, 0))
    assert L.Parallel is L.parallel
    # FanInSum adds
    s_init, s_apply = L.Serial(L.FanOut(2), L.parallel(L.Tanh, L.Sigmoid), L.FanInSum)
    np.testing.assert_allclose(s_apply(s_init(0, (2, 3))[1], a), np.tanh(a) + 1 / (1 + np.exp(-a)), rtol=1e-13)


def test_fan_in_concat_along_channels_on_a_batch_and_one_example():
    init, apply = L.Serial(L.FanOut(2), L.parallel(L.Conv(3, 1), L.Identity), L.FanInConcat(1))
    out_shape, params = init(0, (-1, 2, 4, 4), dtype=np.float64)
    assert out_shape == (-1, 5, 4, 4)
    x = _rand(5, 2, 2, 4, 4)
    w, b = params[1][0]["weight"], params[1][0]["bias"]
    conv = np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x) + b[:, None, None]
    want = np.concatenate([conv, x], axis=1)
    np.testing.assert_allclose(apply(params, x), want, rtol=1e-12)
    np.testing.assert_allclose(apply(params, x[1]), want[1], rtol=1e-12)  # axis 1 of a batch is axis 0 here


def test_combinator_errors():
    with pytest.raises(ShapeError, match=r"Residual: .* \(-1, 4\) to \(-1, 3\).*project the skip branch"):
        L.Residual(L.Dense(3)).init(0, (-1, 4))
    with pytest.raises(ShapeError, match="FanInSum: the inputs' shapes differ"):
        L.Serial(L.FanOut(2), L.parallel(L.Dense(3), L.Identity), L.FanInSum).init(0, (-1, 4))
    with pytest.raises(ShapeError, match="batch dim"):
        L.Serial(L.FanOut(2), L.FanInConcat(0)).init(0, (-1, 4))
    with pytest.raises(ShapeError, match="agree except along axis"):
        L.Serial(L.FanOut(2), L.parallel(L.Flatten, L.Identity), L.FanInConcat(1)).init(0, (-1, 2, 3))
    with pytest.raises(ShapeError, match="2 shapes.*FanOut"):
        L.parallel(L.Relu, L.Relu).init(0, (-1, 4))
    init, apply = L.parallel(L.Relu, L.Relu)
    with pytest.raises(ShapeError, match="sequence of 2 inputs"):
        apply(init(0, [(1,), (1,)])[1], np.zeros(3))
    with pytest.raises(ShapeError, match="list of inputs"):
        L.FanInSum.apply((), np.zeros(3))


def test_a_resnet_per_example_gradients_match_a_loop():
    init, apply = L.Serial(
        L.Conv(4, 3, padding=1), L.Relu,
        L.Residual(L.Conv(4, 3, padding=1), L.GroupNorm(2), L.Relu, L.Dropout(0.3), L.Conv(4, 3, padding=1)),
        L.MaxPool(2), L.Flatten, L.Dropout(0.2), L.Dense(3), L.LogSoftmax)
    _, params = init(0, (-1, 2, 6, 6), dtype=np.float64)
    xs, ys = _rand(6, 5, 2, 6, 6), np.array([0, 2, 1, 1, 0])
    keys = random.split(random.key(3), 5)

    def loss(p, x, y, k):
        return -apply(p, x, rng=k)[y]

    per_example = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0, 0))(params, xs, ys, keys)
    for i in range(5):
        g = cv.grad(loss)(params, xs[i], ys[i], keys[i])
        for a, b in zip(cv.tree.leaves(per_example), cv.tree.leaves(g)):
            np.testing.assert_allclose(a[i], b, rtol=1e-10, atol=1e-12)
    # and the batched apply with one key for the batch, in eval mode, equals per-example eval
    ev = apply(params, xs, mode="eval")
    np.testing.assert_allclose(ev[2], apply(params, xs[2], mode="eval"), rtol=1e-12)


# ---------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------


def test_dropout_train_and_eval():
    x = np.abs(_rand(7, 400, 50)) + 1.0
    key = random.key(0)
    init, apply = L.Dropout(0.25)
    _, params = init(0, x.shape)
    y = apply(params, x, rng=key)
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / 0.75, rtol=1e-15)
    assert abs(1 - kept.mean() - 0.25) < 5 * math.sqrt(0.25 * 0.75 / x.size)
    np.testing.assert_array_equal(kept, random.bernoulli(key, np.float32(0.75), x.shape))  # the documented mask
    np.testing.assert_array_equal(apply(params, x, rng=key), y)  # a key gives one mask
    assert not np.array_equal(apply(params, x, rng=random.key(1)) != 0, kept)
    np.testing.assert_array_equal(apply(params, x.astype(np.float32), rng=key) != 0, kept)  # whatever the dtype
    np.testing.assert_array_equal(apply(params, x, mode="eval"), x)
    np.testing.assert_array_equal(L.Dropout(0.25, mode="eval").apply((), x), x)
    np.testing.assert_array_equal(L.Dropout(0.25, mode="eval").apply((), x, rng=key, mode="train"), y)
    np.testing.assert_array_equal(L.Dropout(0.0).apply((), x), x)
    np.testing.assert_array_equal(L.Dropout(1.0).apply((), x, rng=key), np.zeros_like(x))
    with pytest.raises(ValueError, match="rng=key"):
        apply(params, x)
    with pytest.raises(ValueError, match="probability of dropping"):
        L.Dropout(1.5)
    with pytest.raises(ValueError, match="'train' or 'eval'"):
        L.Dropout(0.5, mode="test")


def test_init_takes_a_key_as_stax_does():
    a = L.Dense(3).init(random.key(1), (-1, 4))[1]["weight"]
    np.testing.assert_array_equal(a, L.Dense(3).init(random.key(1), (-1, 4))[1]["weight"])
    assert not np.array_equal(a, L.Dense(3).init(random.key(2), (-1, 4))[1]["weight"])
    _, params = L.Serial(L.Dense(3), L.Dropout(0.5)).init(random.key(1), (-1, 4))
    np.testing.assert_array_equal(params[0]["weight"], a)


def test_dropout_under_vmap_has_one_mask_per_example_and_matches_a_loop():
    xs = np.ones((6, 40))
    keys = random.split(random.key(5), 6)
    apply = L.Dropout(0.5).apply
    ys = cv.vmap(lambda x, k: apply((), x, rng=k))(xs, keys)
    for i in range(6):
        np.testing.assert_array_equal(ys[i], apply((), xs[i], rng=keys[i]))
    masks = {tuple(row) for row in (ys != 0).tolist()}
    assert len(masks) == 6
    # one key for the whole batch (in_axes None): the same mask for every example
    same = cv.vmap(lambda x, k: apply((), x, rng=k), in_axes=(0, None))(xs, keys[0])
    assert len({tuple(row) for row in (same != 0).tolist()}) == 1
    # the gradient is the mask over the keep probability
    w = _rand(8, 40)
    g = cv.vmap(cv.grad(lambda x, k: cnp.sum(w * apply((), x, rng=k))))(xs, keys)
    np.testing.assert_array_equal(g, w * (ys != 0) / 0.5)


def test_serial_splits_the_key_among_its_layers_and_filters_keywords():
    d1, d2 = L.Dropout(0.5), L.Dropout(0.5)
    double = (lambda rng, shape, dtype=None: (tuple(shape), ()), lambda params, x: x * 2.0)  # no **kwargs
    init, apply = L.Serial(d1, double, d2)
    _, params = init(0, (-1, 30))
    x = np.ones((4, 30))
    key = random.key(9)
    k = random.split(key, 3)
    want = d2.apply((), d1.apply((), x, rng=k[0]) * 2.0, rng=k[2])
    np.testing.assert_array_equal(apply(params, x, rng=key), want)
    np.testing.assert_array_equal(apply(params, x, mode="eval"), x * 2.0)
    with pytest.raises(ValueError, match="needs a key"):
        apply(params, x)


# ---------------------------------------------------------------------------------------
# Embedding
# ---------------------------------------------------------------------------------------


def test_embedding_lookup_gradient_and_init():
    init, apply = L.Embedding(10, 4)
    out_shape, params = init(0, (-1, 7), dtype=np.float64)
    assert out_shape == (-1, 7, 4) and params["weight"].shape == (10, 4)
    ids = np.array([[1, 3, 3, 9, 0, 1, 1], [2, 2, 2, 2, 5, 6, 7]])
    np.testing.assert_array_equal(apply(params, ids), params["weight"][ids])
    np.testing.assert_array_equal(apply(params, ids[0]), params["weight"][ids[0]])
    ct = _rand(9, 2, 7, 4)
    g = cv.grad(lambda p: cnp.sum(apply(p, ids) * ct))(params)
    want = np.zeros((10, 4))
    np.add.at(want, ids, ct)
    np.testing.assert_allclose(g["weight"], want, rtol=1e-14)
    per_example = cv.vmap(cv.grad(lambda p, i, c: cnp.sum(apply(p, i) * c)), in_axes=(None, 0, 0))(params, ids, ct)
    for n in range(2):
        w = np.zeros((10, 4))
        np.add.at(w, ids[n], ct[n])
        np.testing.assert_allclose(per_example["weight"][n], w, rtol=1e-14)
    big = L.Embedding(500, 200).init(1, (1, 1))[1]["weight"]
    assert big.dtype == np.float32
    assert abs(big.mean()) < 5 / math.sqrt(big.size) and abs(big.std() - 1) < 0.01
    with pytest.raises(ShapeError, match=r"ids must be integers.*astype"):
        apply(params, ids.astype(np.float64))


# ---------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def ref_attention(q, k, v, bias=None, mask=None, scale=None, is_causal=False):
    """A loop over examples and heads: q (B, T, N, H), k and v (B, S, K, H)."""
    b_, t, n, h = q.shape
    s, kh = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(h) if scale is None else scale
    out = np.zeros_like(q)
    for b in range(b_):
        for head in range(n):
            kv = head // (n // kh)
            logits = scale * q[b, :, head] @ k[b, :, kv].T
            if bias is not None:
                logits = logits + np.broadcast_to(bias, (b_, n, t, s))[b, head]
            keep = np.ones((t, s), bool)
            if mask is not None:
                keep &= np.broadcast_to(mask, (b_, n, t, s))[b, head]
            if is_causal:
                keep &= np.tril(np.ones((t, s), bool))
            logits = np.where(keep, logits, -0.7 * np.finfo(q.dtype).max)
            out[b, :, head] = _softmax(logits) @ v[b, :, kv]
    return out


ATTENTION_CASES = [
    ("plain", dict(), (2, 5, 3, 4), (2, 6, 3, 4)),
    ("grouped_query", dict(), (2, 4, 4, 3), (2, 5, 2, 3)),
    ("causal", dict(is_causal=True), (1, 5, 2, 3), (1, 5, 2, 3)),
    ("mask_bias_scale", dict(mask=np.random.default_rng(0).random((2, 1, 4, 6)) < 0.7,
                             bias=np.random.default_rng(1).standard_normal((3, 4, 6)), scale=0.3),
     (2, 4, 3, 2), (2, 6, 3, 2)),
    ("causal_and_mask", dict(is_causal=True, mask=np.random.default_rng(2).random((4, 4)) < 0.8),
     (2, 4, 2, 3), (2, 4, 1, 3)),
]


@pytest.mark.parametrize("kw, q_shape, kv_shape", [c[1:] for c in ATTENTION_CASES], ids=[c[0] for c in ATTENTION_CASES])
def test_dot_product_attention_matches_a_loop(kw, q_shape, kv_shape):
    q, k, v = _rand(10, *q_shape), _rand(11, *kv_shape), _rand(12, *kv_shape)
    want = ref_attention(q, k, v, **kw)
    np.testing.assert_allclose(nn.dot_product_attention(q, k, v, **kw), want, rtol=1e-12, atol=1e-13)
    # one example at a time (rank 3, JAX's unbatched layout), and vmap over examples
    per_kw = {name: (val[0] if name in ("mask", "bias") and np.ndim(val) == 4 else val) for name, val in kw.items()}
    np.testing.assert_allclose(nn.dot_product_attention(q[0], k[0], v[0], **per_kw), want[0], rtol=1e-12, atol=1e-13)
    if all(np.ndim(val) < 4 for name, val in kw.items() if name in ("mask", "bias")):
        got = cv.vmap(lambda a, b, c: nn.dot_product_attention(a, b, c, **kw))(q, k, v)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def test_fully_masked_queries_attend_uniformly_and_gradients():
    q, k, v = _rand(13, 3, 2, 2), _rand(14, 4, 2, 2), _rand(15, 4, 2, 2)
    mask = np.ones((3, 4), bool)
    mask[1] = False
    out = nn.dot_product_attention(q, k, v, mask=mask)
    np.testing.assert_allclose(out[1], v.mean(0), rtol=1e-12)
    assert np.all(np.isfinite(out))
    check_grads(lambda a, b, c: nn.dot_product_attention(a, b, c, mask=mask, is_causal=True), (q, k, v), order=2,
                atol=1e-6, rtol=1e-6)


def test_dot_product_attention_errors():
    a = np.zeros((2, 3, 4))
    with pytest.raises(ShapeError, match="one shape"):
        nn.dot_product_attention(a, a, np.zeros((2, 3, 5)))
    with pytest.raises(ShapeError, match="must divide"):
        nn.dot_product_attention(np.zeros((2, 3, 4)), np.zeros((2, 2, 4)), np.zeros((2, 2, 4)))
    with pytest.raises(ShapeError, match="one size H"):
        nn.dot_product_attention(a, np.zeros((2, 3, 5)), np.zeros((2, 3, 5)))
    with pytest.raises(ShapeError, match="boolean"):
        nn.dot_product_attention(a, a, a, mask=np.ones((2, 2)))
    with pytest.raises(ShapeError, match="one dtype"):
        nn.dot_product_attention(a, a, a.astype(np.float32))


def ref_mha(params, xq, xkv, num_heads, mask=None, is_causal=False):
    def proj(p, x):
        return x @ p["weight"] + p["bias"]

    q, k, v = proj(params["query"], xq), proj(params["key"], xkv), proj(params["value"], xkv)
    f = q.shape[-1]
    split = lambda y: y.reshape(y.shape[:-1] + (num_heads, f // num_heads))  # noqa: E731
    att = ref_attention(split(q), split(k), split(v), mask=mask, is_causal=is_causal)
    return proj(params["out"], att.reshape(att.shape[:-2] + (f,)))


def test_multi_head_attention_self_and_cross():
    init, apply = L.MultiHeadAttention(2, qkv_features=6, out_features=3, is_causal=True)
    out_shape, params = init(0, (-1, 5, 4), dtype=np.float64)
    assert out_shape == (-1, 5, 3)
    x = _rand(16, 3, 5, 4)
    want = ref_mha(params, x, x, 2, is_causal=True)
    np.testing.assert_allclose(apply(params, x), want, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(cv.vmap(apply, in_axes=(None, 0))(params, x), want, rtol=1e-12, atol=1e-13)
    # cross-attention with a key padding mask, one mask per example
    c_init, c_apply = L.MultiHeadAttention(3)
    shape, c_params = c_init(0, ((-1, 4, 6), (-1, 7, 5)), dtype=np.float64)
    assert shape == (-1, 4, 6) and c_params["key"]["weight"].shape == (5, 6)
    xq, xkv = _rand(17, 2, 4, 6), _rand(18, 2, 7, 5)
    pad = np.arange(7)[None, :] < np.array([[5], [7]])  # example 0 has 5 keys, example 1 has 7
    mask = pad[:, None, None, :]
    want = ref_mha(c_params, xq, xkv, 3, mask=mask)
    np.testing.assert_allclose(c_apply(c_params, (xq, xkv), mask=mask), want, rtol=1e-12, atol=1e-13)
    per_example = cv.vmap(lambda a, b, m: c_apply(c_params, (a, b), mask=m[None, None, :]))(xq, xkv, pad)
    np.testing.assert_allclose(per_example, want, rtol=1e-12, atol=1e-13)
    # keys beyond the padding do not matter
    xkv2 = xkv.copy()
    xkv2[0, 5:] = 100.0
    np.testing.assert_allclose(c_apply(c_params, (xq, xkv2), mask=mask)[0], want[0], rtol=1e-12, atol=1e-13)
    with pytest.raises(ShapeError, match="divisible by num_heads"):
        L.MultiHeadAttention(4).init(0, (-1, 3, 6))


def test_multi_head_attention_per_example_gradients_match_a_loop():
    init, apply = L.Serial(L.MultiHeadAttention(2), L.Flatten, L.Dense(2), L.LogSoftmax)
    _, params = init(0, (-1, 3, 4), dtype=np.float64)
    xs, ys = _rand(19, 4, 3, 4), np.array([1, 0, 0, 1])
    loss = lambda p, x, y: -apply(p, x)[y]  # noqa: E731
    per_example = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
    for i in range(4):
        for a, b in zip(cv.tree.leaves(per_example), cv.tree.leaves(cv.grad(loss)(params, xs[i], ys[i]))):
            np.testing.assert_allclose(a[i], b, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------
# The default dtype and dtype mismatches
# ---------------------------------------------------------------------------------------

INIT_CASES = [
    ("dense", lambda: L.Dense(3), (-1, 4)),
    ("conv", lambda: L.Conv(2, 3), (-1, 1, 5, 5)),
    ("layer_norm", lambda: L.LayerNorm(4), (-1, 4)),
    ("group_norm", lambda: L.GroupNorm(1), (-1, 2, 3)),
    ("embedding", lambda: L.Embedding(5, 3), (-1, 2)),
    ("mha", lambda: L.MultiHeadAttention(1), (-1, 2, 4)),
    ("residual", lambda: L.Residual(L.Dense(4)), (-1, 4)),
]


@pytest.mark.parametrize("make, shape", [c[1:] for c in INIT_CASES], ids=[c[0] for c in INIT_CASES])
def test_init_dtype_follows_the_config(make, shape):
    def dtypes(params):
        return {leaf.dtype for leaf in cv.tree.leaves(params)}

    assert dtypes(make().init(0, shape)[1]) == {np.dtype(np.float32)}
    with cv.config.override(default_float="float64"):
        assert dtypes(make().init(0, shape)[1]) == {np.dtype(np.float64)}
        assert dtypes(make().init(0, shape, dtype=np.float32)[1]) == {np.dtype(np.float32)}
    assert dtypes(make().init(0, shape, dtype=np.float64)[1]) == {np.dtype(np.float64)}


MISMATCH_CASES = [
    ("Dense", lambda: L.Dense(3), (-1, 4), (2, 4)),
    ("Conv", lambda: L.Conv(2, 3), (-1, 1, 5, 5), (2, 1, 5, 5)),
    ("ConvTranspose", lambda: L.ConvTranspose(2, 3), (-1, 1, 5, 5), (1, 5, 5)),
    ("LayerNorm", lambda: L.LayerNorm(4), (-1, 4), (2, 4)),
    ("GroupNorm", lambda: L.GroupNorm(1), (-1, 2, 3), (2, 2, 3)),
    ("MultiHeadAttention", lambda: L.MultiHeadAttention(1), (-1, 2, 4), (2, 4)),
]


@pytest.mark.parametrize("name, make, shape, x_shape", MISMATCH_CASES, ids=[c[0] for c in MISMATCH_CASES])
def test_dtype_mismatch_raises_with_the_fix(name, make, shape, x_shape):
    init, apply = make()
    _, params = init(0, shape)  # float32
    x = np.ones(x_shape)  # float64
    fragments = [name, "input has dtype float64", "parameters have dtype float32", r"x.astype\(np.float32\)",
                 r"dtype=np.float64", "default_float"]
    with pytest.raises(ShapeError) as err:
        apply(params, x)
    for f in fragments:
        assert __import__("re").search(f, str(err.value)), (f, str(err.value))
    with pytest.raises(ShapeError, match="input has dtype float64"):
        cv.vmap(apply, in_axes=(None, 0))(params, x[None])
    assert apply(params, x.astype(np.float32)).dtype == np.float32


def test_integer_data_into_a_dense_layer_says_to_cast():
    _, params = L.Dense(2).init(0, (-1, 3))
    with pytest.raises(ShapeError, match=r"int64 .*float32; cast the input \(x.astype\(np.float32\)\)$"):
        L.Dense(2).apply(params, np.ones((2, 3), np.int64))
