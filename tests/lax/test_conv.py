"""The conv family against independent references.

- impls against a naive direct convolution written with explicit loops in float64;
- every batching case of functorch's BatchRulesConvolution.cpp (see CASES below), with the
  vmap dim at 0, 1, -1 or absent on each operand, batch sizes 1 and 3, against a loop;
- per-example gradients of a two-conv network against a loop of ``grad``;
- derivatives to second order against finite differences;
- the bad-input errors; cuDNN and CuPy GEMM against the CPU on a GPU (skipped without).

The impl and batching tests run on the im2col kernels (float64 and float32) and on
oneDNN's (float32; oneDNN has no float64): see the ``cpu_kernels`` and ``batch_kernels``
fixtures. tests/cpu/test_onednn.py has the binding's own tests.
"""
import functools
import importlib
import itertools
import warnings

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import backend, lax, nn
from cuvmap.lax import conv_strategy
from cuvmap.lax import convolution as conv_mod
from cuvmap.measured_choices import MeasuredChoices
from cuvmap.test_util import check_batching, check_grads

from conv_references import (CONFIG_IDS, CONFIGS, make_operands, naive_backward_weight, naive_conv,
                             naive_conv_transpose, reference_conv)


# ---------------------------------------------------------------------------------------
# Impls against the naive loops
# ---------------------------------------------------------------------------------------


# Each im2col kernel has two column layouts and runs in blocks when its columns are large
# (NOTE [column layouts] and NOTE [cache blocking] in cuvmap/lax/conv_gemm.py). The impl
# tests run every layout, in one piece and in the smallest blocks (one example, or one
# group when there is a single example), in float64 and float32; and oneDNN's kernels in
# float32, forced, with a vendor-error fallback turned into a failure.
KERNEL_SETTINGS = [("auto", None), ("channel", None), ("pixel", None), ("channel", 1), ("pixel", 1), ("onednn", None)]
KERNEL_IDS = [f"{layout}-{'blocks' if block else 'one-piece'}" if layout != "onednn" else "onednn"
              for layout, block in KERNEL_SETTINGS]


def _force_onednn(monkeypatch):
    """Forces the oneDNN kernels (skips without the library); a fallback to the im2col
    kernels becomes an error."""
    from cuvmap.cpu import onednn

    if not onednn.available():
        pytest.skip(f"oneDNN not loadable: {onednn.load_error()}")
    monkeypatch.setattr(conv_strategy, "_strategy", ["onednn"])

    def no_fallback(key, name, err, op, args):
        raise AssertionError(f"oneDNN {op} failed on {[tuple(a.shape) for a in args[:2]]}: {err!r}")

    monkeypatch.setattr(conv_strategy, "_fall_back", no_fallback)


@pytest.fixture(params=KERNEL_SETTINGS, ids=KERNEL_IDS)
def cpu_kernels(request, monkeypatch):
    """``(layout, block_bytes)``; the kernels run forced (``"unfold"`` or ``"onednn"``)."""
    layout, block_bytes = request.param
    if layout == "onednn":
        _force_onednn(monkeypatch)
        return request.param
    monkeypatch.setattr(conv_strategy, "_strategy", ["unfold"])
    gemm = importlib.import_module("cuvmap.lax.conv_gemm")
    monkeypatch.setattr(gemm, "COLUMN_LAYOUT", layout)
    if block_bytes is not None:
        monkeypatch.setattr(gemm, "BLOCK_BYTES", block_bytes)
    return request.param


def _kernel_dtypes(cpu_kernels):
    return [np.float32] if cpu_kernels[0] == "onednn" else [np.float64, np.float32]


def _assert_close_to_reference(got, want, dtype):
    """float64 to 1e-10; float32 to ~100 ulp of the largest value."""
    assert got.dtype == dtype
    if dtype == np.float64:
        np.testing.assert_allclose(got, want, atol=1e-10)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


@functools.cache
def _forward_case(i):
    """CONFIGS[i]'s operands and its naive loops' outputs (with and without the bias),
    computed once for the six kernel settings."""
    x, w, b, params = make_operands(CONFIGS[i], np.random.default_rng(0))
    return x, w, b, params, reference_conv(x, w, b, params), reference_conv(x, w, None, params)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
def test_conv_impl_matches_naive_loops(cfg, cpu_kernels):
    x, w, b, params, want, want_no_bias = _forward_case(CONFIGS.index(cfg))
    for dtype in _kernel_dtypes(cpu_kernels):
        xd, wd, bd = (a.astype(dtype) for a in (x, w, b))
        _assert_close_to_reference(lax.conv(xd, wd, bd, **params), want, dtype)
        _assert_close_to_reference(lax.conv(xd, wd, **params), want_no_bias, dtype)


@functools.cache
def _backward_case(i):
    """CONFIGS[i]'s operands, a cotangent and the naive loops' input and weight gradients:
    for a regular conv the weight gradient is ``naive_backward_weight`` and the input
    gradient is the naive transposed conv; for a transposed conv the input gradient is the
    naive regular conv and the weight gradient is ``naive_backward_weight`` with the roles
    of input and grad_output swapped. Computed once for the six kernel settings."""
    rng = np.random.default_rng(1)
    x, w, _, params = make_operands(CONFIGS[i], rng)
    out = reference_conv(x, w, None, params)
    g = rng.standard_normal(out.shape)
    p = params
    if p["transposed"]:
        # the regular conv of g; with output_padding >= stride it has positions past the input
        want_gx = naive_conv(g, w, p["stride"], p["padding"], p["dilation"], p["groups"])
        want_gx = want_gx[(slice(None), slice(None)) + tuple(slice(0, s) for s in x.shape[2:])]
        want_gw = naive_backward_weight(x, g, w.shape, p["stride"], p["padding"], p["dilation"], p["groups"])
    else:
        op = tuple(s - ((s + 2 * pp - d * (k - 1) - 1) // st * st + d * (k - 1) + 1 - 2 * pp)
                   for s, k, st, pp, d in zip(x.shape[2:], w.shape[2:], p["stride"], p["padding"], p["dilation"]))
        want_gx = naive_conv_transpose(g, w, p["stride"], p["padding"], p["dilation"], op, p["groups"])
        want_gw = naive_backward_weight(g, x, w.shape, p["stride"], p["padding"], p["dilation"], p["groups"])
    return x, w, g, params, want_gx, want_gw


@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
def test_backward_impls_match_naive_loops(cfg, cpu_kernels):
    """Both backward primitives against loops (``_backward_case``)."""
    x, w, g, params, want_gx, want_gw = _backward_case(CONFIGS.index(cfg))
    for dtype in _kernel_dtypes(cpu_kernels):
        gd, wd, xd = (a.astype(dtype) for a in (g, w, x))
        _assert_close_to_reference(lax.conv_backward_input(gd, wd, x.shape, **params), want_gx, dtype)
        _assert_close_to_reference(lax.conv_backward_weight(gd, xd, w.shape, **params), want_gw, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtypes_are_preserved(dtype):
    rng = np.random.default_rng(2)
    x, w, b, params = make_operands(CONFIGS[3], rng, dtype)
    out = lax.conv(x, w, b, **params)
    assert out.dtype == dtype
    np.testing.assert_allclose(out, reference_conv(x.astype(np.float64), w.astype(np.float64),
                                                   b.astype(np.float64), params),
                               rtol=1e-4 if dtype == np.float32 else 1e-10, atol=1e-4 if dtype == np.float32 else 1e-10)
    g = cv.grad(lambda w: cnp.sum(lax.conv(x, w, b, **params) ** 2))(w)
    assert g.dtype == dtype


# ---------------------------------------------------------------------------------------
# Batching: every case of functorch's BatchRulesConvolution.cpp, the vmap dim anywhere or absent, against a loop
# ---------------------------------------------------------------------------------------

# The batching configurations: regular and transposed, groups 1 and 2.
BATCH_CONFIGS = [CONFIGS[3], CONFIGS[4], CONFIGS[7], CONFIGS[8]]
BATCH_IDS = ["regular-g1", "regular-g2", "transposed-g1", "transposed-g2"]
AXES = [0, 1, -1, None]


def _batched(a, axis, size, rng):
    """``size`` perturbed copies of ``a`` stacked along ``axis`` (None: ``a`` itself)."""
    if axis is None:
        return a
    stacked = (a + 0.1 * rng.standard_normal((size,) + a.shape)).astype(a.dtype)
    return np.moveaxis(stacked, 0, axis)


@pytest.fixture(params=["unfold-float64", "onednn-float32"])
def batch_kernels(request, monkeypatch):
    """``(dtype, tolerances)`` of the batching tests: the im2col kernels in float64, or
    oneDNN's in float32 (the vmapped call and the loop both on them)."""
    if request.param.startswith("onednn"):
        _force_onednn(monkeypatch)
        return np.float32, dict(atol=1e-4, rtol=1e-5)
    monkeypatch.setattr(conv_strategy, "_strategy", ["unfold"])
    return np.float64, dict(atol=1e-10, rtol=1e-10)


# -m "not slow": every configuration at batch size 3, the empty batch and batch size 1 on
# the first; the full suite every configuration at every size.
SIZED_BATCH_CASES = [
    pytest.param(cfg, size, id=f"{cfg_id}-{size}",
                 marks=() if size == 3 or cfg is BATCH_CONFIGS[0] else (pytest.mark.slow,))
    for cfg, cfg_id in zip(BATCH_CONFIGS, BATCH_IDS) for size in (0, 1, 3)
]


# Case of functorch's file -> the in_axes combinations of the tests below that exercise it:
#   conv: lhs only (x, None), rhs only groups==1 / groups>1 regular and transposed (None, w),
#         both (x, w), bias batched or beside a batched weight (3rd axis not None / w batched)
#   conv_backward_input: grad_output and weight, grad_output only, weight only (g==1, g>1,
#         regular and transposed); input only (the input is not an operand: see
#         test_backward_input_with_only_the_input_batched)
#   conv_backward_weight: grad_output and input (per-example gradients), grad_output only,
#         input only, each with groups 1 and 2, regular and transposed
#   all three batched (model ensembling): test_model_ensembling_all_three_batched
@pytest.mark.parametrize("cfg,size", SIZED_BATCH_CASES)
def test_conv_batching_all_cases(cfg, size, batch_kernels):
    rng = np.random.default_rng(3)
    x, w, b, params = make_operands(cfg, rng, batch_kernels[0])

    def f(x, w, b):
        return lax.conv(x, w, b, **params)

    for ax_x, ax_w, ax_b in itertools.product(AXES, AXES, [0, None]):
        if (ax_x, ax_w, ax_b) == (None, None, None):
            continue
        args = (_batched(x, ax_x, size, rng), _batched(w, ax_w, size, rng), _batched(b, ax_b, size, rng))
        check_batching(f, args, in_axes=(ax_x, ax_w, ax_b), **batch_kernels[1])
    # without a bias operand
    for ax_x, ax_w in itertools.product(AXES, AXES):
        if (ax_x, ax_w) == (None, None):
            continue
        args = (_batched(x, ax_x, size, rng), _batched(w, ax_w, size, rng))
        check_batching(lambda x, w: lax.conv(x, w, **params), args, in_axes=(ax_x, ax_w), **batch_kernels[1])


@pytest.mark.parametrize("cfg,size", SIZED_BATCH_CASES)
def test_conv_backward_input_batching_all_cases(cfg, size, batch_kernels):
    rng = np.random.default_rng(4)
    x, w, _, params = make_operands(cfg, rng, batch_kernels[0])
    g = rng.standard_normal(lax.conv(x, w, **params).shape).astype(x.dtype)

    def f(g, w):
        return lax.conv_backward_input(g, w, x.shape, **params)

    for ax_g, ax_w in itertools.product(AXES, AXES):
        if (ax_g, ax_w) == (None, None):
            continue
        args = (_batched(g, ax_g, size, rng), _batched(w, ax_w, size, rng))
        check_batching(f, args, in_axes=(ax_g, ax_w), **batch_kernels[1])


@pytest.mark.parametrize("cfg,size", SIZED_BATCH_CASES)
def test_conv_backward_weight_batching_all_cases(cfg, size, batch_kernels):
    rng = np.random.default_rng(5)
    x, w, _, params = make_operands(cfg, rng, batch_kernels[0])
    g = rng.standard_normal(lax.conv(x, w, **params).shape).astype(x.dtype)

    def f(g, x):
        return lax.conv_backward_weight(g, x, w.shape, **params)

    for ax_g, ax_x in itertools.product(AXES, AXES):
        if (ax_g, ax_x) == (None, None):
            continue
        args = (_batched(g, ax_g, size, rng), _batched(x, ax_x, size, rng))
        check_batching(f, args, in_axes=(ax_g, ax_x), **batch_kernels[1])


@pytest.mark.parametrize("cfg", BATCH_CONFIGS, ids=BATCH_IDS)
def test_backward_input_with_only_the_input_batched(cfg, batch_kernels):
    """The 'input only' case of functorch's BatchRulesConvolution.cpp: the input gradient
    does not depend on the input, so ``vmap`` over the input alone gives an unbatched
    result, broadcast to the batch."""
    rng = np.random.default_rng(6)
    x, w, _, params = make_operands(cfg, rng, batch_kernels[0])
    xs = _batched(x, 0, 3, rng)

    def input_grad(x):
        return cv.grad(lambda x: cnp.sum(lax.conv(x, w, **params) * 0.5))(x)

    check_batching(input_grad, (xs,), in_axes=0, **batch_kernels[1])


@pytest.mark.parametrize("cfg", BATCH_CONFIGS, ids=BATCH_IDS)
def test_backward_weight_with_only_the_weight_batched(cfg, batch_kernels):
    """The 'weight only' case of the weight gradient in functorch's BatchRulesConvolution.cpp:
    for a loss linear in the conv output, grad_output and the input do not depend on the
    weight, so the weight gradient is unbatched under ``vmap`` over the weight, and
    broadcast to the batch."""
    rng = np.random.default_rng(16)
    x, w, _, params = make_operands(cfg, rng, batch_kernels[0])
    ws = _batched(w, 0, 3, rng)

    def weight_grad(w):
        return cv.grad(lambda w: cnp.sum(lax.conv(x, w, **params) * 0.5))(w)

    check_batching(weight_grad, (ws,), in_axes=0, **batch_kernels[1])


@pytest.mark.parametrize("cfg", BATCH_CONFIGS, ids=BATCH_IDS)
def test_model_ensembling_all_three_batched(cfg, batch_kernels):
    """Input, weight and grad_output all batched: one model per example (ensembling);
    both gradients of each member against a loop."""
    rng = np.random.default_rng(7)
    x, w, b, params = make_operands(cfg, rng, batch_kernels[0])
    xs, ws, bs = (_batched(a, 0, 3, rng) for a in (x, w, b))

    def member_grads(x, w, b):
        return cv.grad(lambda x, w, b: cnp.sum(cnp.tanh(lax.conv(x, w, b, **params))), argnums=(0, 1, 2))(x, w, b)

    check_batching(member_grads, (xs, ws, bs), in_axes=(0, 0, 0), **batch_kernels[1])
    check_batching(member_grads, (np.moveaxis(xs, 0, -1), ws, np.moveaxis(bs, 0, -1)), in_axes=(-1, 0, -1),
                   **batch_kernels[1])


def test_vmap_of_vmap(batch_kernels):
    rng = np.random.default_rng(8)
    x, w, b, params = make_operands(CONFIGS[4], rng, batch_kernels[0])
    xs = np.stack([_batched(x, 0, 3, rng) for _ in range(2)], axis=1)  # (3, 2, N, C, ...)
    ws = _batched(w, 0, 2, rng)
    f = cv.vmap(cv.vmap(lambda x, w: lax.conv(x, w, b, **params), in_axes=(0, None)), in_axes=(1, 0))
    got = f(xs, ws)
    want = np.stack([np.stack([reference_conv(xs[i, j].astype(np.float64), ws[j].astype(np.float64),
                                              b.astype(np.float64), params) for i in range(3)]) for j in range(2)])
    _assert_close_to_reference(got, want, batch_kernels[0])


# ---------------------------------------------------------------------------------------
# Per-example gradients of a two-conv network; derivatives to second order
# ---------------------------------------------------------------------------------------


def _two_conv_params(rng, dtype=np.float64):
    return {
        "w1": rng.standard_normal((4, 1, 3, 3)).astype(dtype) * 0.5, "b1": rng.standard_normal(4).astype(dtype) * 0.1,
        "w2": rng.standard_normal((6, 2, 3, 3)).astype(dtype) * 0.3, "b2": rng.standard_normal(6).astype(dtype) * 0.1,
        "w3": rng.standard_normal((6 * 3 * 3, 5)).astype(dtype) * 0.2,
    }


def _two_conv_loss(params, x, y):
    """x: one example (1, 8, 8); y: its integer label."""
    h = cnp.tanh(nn.conv(x[None], params["w1"], params["b1"], padding=1))
    h = cnp.tanh(nn.conv(h, params["w2"], params["b2"], stride=2, groups=2))
    logits = h.reshape(-1) @ params["w3"]
    return nn.cross_entropy(logits[None], y[None])


def test_per_example_gradients_of_a_two_conv_network(batch_kernels):
    dtype, tol = batch_kernels
    rng = np.random.default_rng(9)
    params = _two_conv_params(rng, dtype)
    xs = rng.standard_normal((5, 1, 8, 8)).astype(dtype)
    ys = rng.integers(0, 5, 5)
    per_example = cv.vmap(cv.grad(_two_conv_loss), in_axes=(None, 0, 0))(params, xs, ys)
    for i in range(5):
        single = cv.grad(_two_conv_loss)(params, xs[i], ys[i])
        for k in params:
            np.testing.assert_allclose(per_example[k][i], single[k], atol=1e-12 if dtype == np.float64 else tol["atol"])


@pytest.mark.parametrize("cfg", [CONFIGS[1], CONFIGS[4], CONFIGS[7], CONFIGS[8]],
                         ids=["1d-g2", "2d-d2-g2", "1d-transposed", "2d-transposed-g2"])
def test_conv_derivatives_to_second_order(cfg):
    rng = np.random.default_rng(10)
    x, w, b, params = make_operands(cfg, rng)
    check_grads(lambda x, w, b: lax.conv(x, w, b, **params), (x, w, b), order=2, atol=1e-6, rtol=1e-6)
    g = rng.standard_normal(lax.conv(x, w, **params).shape)
    check_grads(lambda g, w: lax.conv_backward_input(g, w, x.shape, **params), (g, w), order=2, atol=1e-6, rtol=1e-6)
    check_grads(lambda g, x: lax.conv_backward_weight(g, x, w.shape, **params), (g, x), order=2, atol=1e-6, rtol=1e-6)


def test_hessian_vector_product_of_a_cnn_loss():
    """grad of ⟨grad(loss)(w), v⟩ (an HVP) against central differences of the gradient."""
    rng = np.random.default_rng(11)
    params = _two_conv_params(rng)
    x = rng.standard_normal((1, 8, 8))
    y = np.array(2)
    v = {k: rng.standard_normal(a.shape) for k, a in params.items()}

    def g(p):
        return cv.grad(_two_conv_loss)(p, x, y)

    hvp = cv.grad(lambda p: sum(cnp.sum(a * v[k]) for k, a in g(p).items()))(params)
    eps = 1e-5
    plus = g({k: a + eps * v[k] for k, a in params.items()})
    minus = g({k: a - eps * v[k] for k, a in params.items()})
    for k in params:
        np.testing.assert_allclose(hvp[k], (plus[k] - minus[k]) / (2 * eps), atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# nn wrappers (torch.nn.functional conventions)
# ---------------------------------------------------------------------------------------


def test_nn_conv_padding_modes_and_unbatched_input():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 3, 7, 6))
    w = rng.standard_normal((4, 3, 4, 3))
    same = nn.conv(x, w, padding="same")
    assert same.shape == (2, 4, 7, 6)
    # 'same' with an even kernel pads one more at the end, as torch does
    xp = np.pad(x, ((0, 0), (0, 0), (1, 2), (1, 1)))
    np.testing.assert_allclose(same, naive_conv(xp, w, (1, 1), (0, 0), (1, 1), 1), atol=1e-10)
    np.testing.assert_allclose(nn.conv(x, w, padding="valid"), naive_conv(x, w, (1, 1), (0, 0), (1, 1), 1), atol=1e-10)
    np.testing.assert_allclose(nn.conv(x[0], w, stride=(2, 1))[None], nn.conv(x[:1], w, stride=(2, 1)), atol=1e-12)
    wt = rng.standard_normal((3, 2, 3, 3))
    out = nn.conv_transpose(x, wt, stride=2, padding=1, output_padding=1)
    assert out.shape == (2, 2, 14, 12)
    np.testing.assert_allclose(nn.conv_transpose(x[1], wt, stride=2)[None], nn.conv_transpose(x[1:], wt, stride=2), atol=1e-12)


# ---------------------------------------------------------------------------------------
# Bad input: clear errors naming the op and the shapes
# ---------------------------------------------------------------------------------------

BAD_INPUTS = [
    ("channels not divisible by groups", lambda: lax.conv(np.ones((1, 3, 5, 5)), np.ones((4, 1, 3, 3)), groups=2),
     r"conv.*input channels 3 are not divisible by groups 2"),
    ("weight/input rank mismatch", lambda: lax.conv(np.ones((1, 3, 5, 5)), np.ones((4, 3, 3))),
     r"conv.*weight of shape \(4, 3, 3\) must have the rank of the input \(1, 3, 5, 5\)"),
    ("kernel larger than the padded input", lambda: lax.conv(np.ones((1, 1, 3, 3)), np.ones((1, 1, 5, 5)), padding=0),
     r"conv.*kernel of extent 5 .* larger than the padded input"),
    ("negative padding", lambda: lax.conv(np.ones((1, 1, 5, 5)), np.ones((1, 1, 3, 3)), padding=-1),
     r"conv.*negative padding \(-1, -1\)"),
    ("output_padding too large", lambda: nn.conv_transpose(np.ones((1, 1, 5, 5)), np.ones((1, 1, 3, 3)), stride=2,
                                                          output_padding=2),
     r"conv.*output_padding \(2, 2\) must be smaller than either stride \(2, 2\) or dilation"),
    ("dtype mismatch", lambda: lax.conv(np.ones((1, 1, 5, 5), np.float32), np.ones((1, 1, 3, 3))),
     r"conv.*operands must share one dtype, got float32, float64"),
    ("bias of the wrong size", lambda: lax.conv(np.ones((1, 1, 5, 5)), np.ones((2, 1, 3, 3)), np.ones(3)),
     r"conv.*bias of shape \(3,\) must be \(2,\)"),
    ("input channels mismatch", lambda: nn.conv(np.ones((2, 3, 5, 5)), np.ones((4, 2, 3, 3))),
     r"conv.*weight expects 2 input channels"),
]


@pytest.mark.parametrize("name,call,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_errors(name, call, message):
    with pytest.raises(cv.ShapeError, match=message):
        call()


def test_bad_input_under_vmap_names_logical_shapes():
    f = cv.vmap(lambda x, w: lax.conv(x, w, groups=2), in_axes=(0, None))
    with pytest.raises(cv.ShapeError, match=r"^vmap\(<lambda>.*conv\(float64\[1, 3, 5, 5\], float64\[4, 1, 3, 3\]"):
        f(np.ones((2, 1, 3, 5, 5)), np.ones((4, 1, 3, 3)))


# ---------------------------------------------------------------------------------------
# GPU: cuDNN and the CuPy GEMM path against the CPU (skipped without a device)
# ---------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not backend.gpu_available(), reason="no CUDA device visible to CuPy")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["cudnn", "unfold"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
def test_gpu_kernels_match_cpu(cfg, dtype, kernels):
    import cupy

    from cuvmap.cuda import cudnn

    if kernels == "cudnn" and not cudnn.available():
        pytest.skip(f"cuDNN not loadable: {cudnn.load_error()}")
    rng = np.random.default_rng(13)
    x, w, b, params = make_operands(cfg, rng)
    out = reference_conv(x, w, b, params)
    g = rng.standard_normal(out.shape)
    tol = {np.float16: 5e-2, np.float32: 1e-4, np.float64: 1e-10}[dtype]
    dev = lambda a: cupy.asarray(a.astype(dtype))  # noqa: E731
    previous = conv_mod.set_strategy("cudnn" if kernels == "cudnn" else "unfold")
    try:
        got = lax.conv(dev(x), dev(w), dev(b), **params)
        gx = lax.conv_backward_input(dev(g), dev(w), x.shape, **params)
        gw = lax.conv_backward_weight(dev(g), dev(x), w.shape, **params)
    finally:
        conv_mod.set_strategy(previous)
    want_gx = lax.conv_backward_input(g, w, x.shape, **params)
    want_gw = lax.conv_backward_weight(g, x, w.shape, **params)
    for a, e in ((got, out), (gx, want_gx), (gw, want_gw)):
        assert isinstance(a, cupy.ndarray) and a.dtype == dtype
        np.testing.assert_allclose(cupy.asnumpy(a).astype(np.float64), e, rtol=tol, atol=tol * max(1.0, np.abs(e).max()))


@gpu
@pytest.mark.gpu
def test_gpu_per_example_gradients_match_cpu():
    rng = np.random.default_rng(14)
    params = _two_conv_params(rng, np.float32)
    xs = rng.standard_normal((4, 1, 8, 8)).astype(np.float32)
    ys = rng.integers(0, 5, 4)
    f = cv.vmap(cv.grad(_two_conv_loss), in_axes=(None, 0, 0))
    cpu = f(params, xs, ys)
    gpu_result = f(cv.device_put(params, "gpu"), cv.device_put(xs, "gpu"), cv.device_put(ys, "gpu"))
    for k in params:
        np.testing.assert_allclose(cv.device_put(gpu_result[k], "cpu"), cpu[k], rtol=1e-4, atol=1e-5)


def _check_auto_strategy_measures_and_caches(monkeypatch, device, vendor, put, get):
    """Under "auto" a fresh key times both kernels once and returns the faster's result; a
    later call of the key — and another batch size in its bucket — times nothing; the
    vendor's and the unfold kernels' outputs agree with the naive loops and each other.
    A vendor failure fails the test (no silent fallback to unfold), and every result stays
    on the operands' device."""
    monkeypatch.setattr(conv_strategy, "_strategy", ["auto"])
    monkeypatch.setattr(conv_strategy, "_measured", MeasuredChoices())
    monkeypatch.setattr(conv_strategy, "_failed", MeasuredChoices())
    timed = []
    real_time_kernel = conv_strategy._time_kernel

    def spy(module, op, *rest):
        timed.append((module.__name__.rsplit(".", 1)[-1], op))
        return real_time_kernel(module, op, *rest)

    monkeypatch.setattr(conv_strategy, "_time_kernel", spy)
    monkeypatch.setattr(conv_strategy, "CLOSE", 0.0)   # one pass (the second: its own test below)
    vendor_module = conv_strategy._vendor_for(device, np.dtype(np.float32))[1]
    vendor_calls = []
    _spy_kernels(monkeypatch, vendor_module, vendor_calls, vendor)
    rng = np.random.default_rng(15)
    _, w, _, params = make_operands(CONFIGS[4], rng)
    xs = {n: rng.standard_normal((n, 4, 7, 7)) for n in (3, 4, 5)}
    w32 = put(w.astype(np.float32))

    def conv(n):
        x = put(xs[n].astype(np.float32))
        out = lax.conv(x, w32, **params)
        assert type(out) is type(x), f"the result left the {device}: {type(out).__name__}"
        out = get(out)
        np.testing.assert_allclose(out, reference_conv(xs[n], w, None, params), rtol=1e-4, atol=1e-4)
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error", conv_mod.VendorKernelWarning)
        conv(3)
        # one timing per candidate: the vendor's layouts (oneDNN's blocked and channels-last,
        # NOTE [activation layouts]; cuDNN's one) and unfold
        candidates = conv_strategy._vendor_candidates(vendor, vendor_module)
        assert list(candidates)[0] == vendor and len(candidates) == (2 if device == "cpu" else 1)
        per_key = len(candidates) + 1
        assert sorted(timed) == [("conv_gemm", "forward")] + [(vendor, "forward")] * len(candidates)
        assert vendor_calls                                          # the vendor's kernel ran
        ((key, (choice, times)),) = conv_mod.measured_choices().items()
        assert key[:2] == ("forward", device) and key[3] == 4        # N = 3 in the bucket of 4
        assert set(times) == set(candidates) | {"unfold"} and all(t > 0 for t in times.values())
        assert choice == min(times, key=times.get)
        conv(3)
        conv(4)                                                      # the same bucket: reused
        assert len(timed) == per_key and len(conv_mod.measured_choices()) == 1
        conv(5)                                                      # bucket 8: measured anew
        assert len(timed) == 2 * per_key and len(conv_mod.measured_choices()) == 2
        # both kernels, forced, against the loops and each other
        monkeypatch.setattr(conv_strategy, "_strategy", [vendor])
        del vendor_calls[:]
        by_vendor = conv(5)
        assert vendor_calls == [(vendor, "forward")]
        monkeypatch.setattr(conv_strategy, "_strategy", ["unfold"])
        by_unfold = conv(5)
        assert vendor_calls == [(vendor, "forward")]
    np.testing.assert_allclose(by_vendor, by_unfold, rtol=1e-5, atol=1e-5)
    assert len(timed) == 2 * per_key


@gpu
@pytest.mark.gpu
def test_gpu_auto_strategy_measures_and_caches(monkeypatch):
    import cupy

    from cuvmap.cuda import cudnn

    if not cudnn.available():
        pytest.skip(f"cuDNN not loadable: {cudnn.load_error()}")
    _check_auto_strategy_measures_and_caches(monkeypatch, "gpu", "cudnn", cupy.asarray, cupy.asnumpy)


def test_cpu_auto_strategy_measures_and_caches(monkeypatch):
    from cuvmap.cpu import onednn

    if not onednn.available():
        pytest.skip(f"oneDNN not loadable: {onednn.load_error()}")
    _check_auto_strategy_measures_and_caches(monkeypatch, "cpu", "onednn", lambda a: a, np.asarray)


def test_strategy_override_is_validated(monkeypatch):
    with pytest.raises(ValueError, match="conv strategy must be one of auto, unfold, onednn, onednn:channels_last, cudnn; "
                                         "set_strategy's argument is 'fastest'"):
        conv_mod.set_strategy("fastest")
    previous = conv_mod.set_strategy("unfold")
    assert conv_mod.get_strategy() == "unfold"
    conv_mod.set_strategy(previous)
    # the environment variable: read at the first convolution, rejected there
    monkeypatch.setattr(conv_strategy, "_strategy", [None])
    monkeypatch.setenv("CUVMAP_CONV_STRATEGY", "onednn")
    assert conv_mod.get_strategy() == "onednn"
    monkeypatch.setattr(conv_strategy, "_strategy", [None])
    monkeypatch.setenv("CUVMAP_CONV_STRATEGY", "fast")
    with pytest.raises(ValueError, match="one of auto, unfold, onednn, onednn:channels_last, cudnn; CUVMAP_CONV_STRATEGY is 'fast'"):
        lax.conv(np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2)))


def _spy_kernels(monkeypatch, module, calls, name):
    for op in ("forward", "backward_input", "backward_weight"):
        real = getattr(module, op)

        def spy(*args, _real=real, _op=op, **kwargs):
            calls.append((name, _op))
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, op, spy)


@pytest.mark.parametrize("strategy, dtype, expected", [
    ("unfold", np.float32, "conv_gemm"),
    ("onednn", np.float32, "onednn"),
    ("onednn", np.float64, "conv_gemm"),   # oneDNN has no float64 convolution
    ("cudnn", np.float32, "conv_gemm"),    # a GPU strategy: NumPy arrays run the im2col kernels
    ("auto", np.float64, "conv_gemm"),
])
def test_forced_strategies_are_honoured(monkeypatch, strategy, dtype, expected):
    from cuvmap.cpu import onednn
    from cuvmap.lax import conv_gemm

    if expected == "onednn" and not onednn.available():
        pytest.skip(f"oneDNN not loadable: {onednn.load_error()}")
    calls = []
    _spy_kernels(monkeypatch, onednn, calls, "onednn")
    _spy_kernels(monkeypatch, conv_gemm, calls, "conv_gemm")
    monkeypatch.setattr(conv_strategy, "_strategy", [strategy])
    rng = np.random.default_rng(17)
    x, w, b, params = make_operands(CONFIGS[3], rng)
    with warnings.catch_warnings():
        warnings.simplefilter("error", conv_mod.VendorKernelWarning)
        out = lax.conv(x.astype(dtype), w.astype(dtype), b.astype(dtype), **params)
        gw = cv.grad(lambda w: cnp.sum(lax.conv(x.astype(dtype), w, **params) ** 2))(w.astype(dtype))
    _assert_close_to_reference(out, reference_conv(x, w, b, params), dtype)
    assert gw.dtype == dtype
    assert calls and {name for name, _ in calls} == {expected}


class _RaisingKernels:
    """A vendor module whose every kernel fails."""

    __name__ = "raising_stub"

    def _fail(self, *args, **kwargs):
        raise RuntimeError("stub vendor failure")

    forward = backward_input = backward_weight = _fail


@pytest.mark.parametrize("strategy", ["auto", "onednn"])
def test_a_failing_vendor_kernel_falls_back_with_one_warning(monkeypatch, strategy):
    monkeypatch.setattr(conv_strategy, "_strategy", [strategy])
    monkeypatch.setattr(conv_strategy, "_measured", MeasuredChoices())
    monkeypatch.setattr(conv_strategy, "_failed", MeasuredChoices())
    monkeypatch.setattr(conv_strategy, "_vendor_for", lambda device, dtype: ("onednn", _RaisingKernels()))
    rng = np.random.default_rng(18)
    x, w, b, params = make_operands(CONFIGS[4], rng)
    x32, w32, b32 = (a.astype(np.float32) for a in (x, w, b))
    with pytest.warns(conv_mod.VendorKernelWarning, match=r"conv forward .*onednn failed \(RuntimeError: stub "
                                                          r"vendor failure\); the unfold kernels") as record:
        out = lax.conv(x32, w32, b32, **params)
    assert len(record) == 1
    _assert_close_to_reference(out, reference_conv(x, w, b, params), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", conv_mod.VendorKernelWarning)   # once per key
        _assert_close_to_reference(lax.conv(x32, w32, b32, **params), reference_conv(x, w, b, params), np.float32)
    with pytest.warns(conv_mod.VendorKernelWarning) as record:         # the backward ops: a warning each
        cv.grad(lambda x, w: cnp.sum(lax.conv(x, w, **params)), argnums=(0, 1))(x32, w32)
    assert sorted(str(r.message).split()[1] for r in record) == ["backward_input", "backward_weight"]
    if strategy == "auto":
        assert {c[0] for c in conv_mod.measured_choices().values()} == {"unfold"}


class _StandInKernels:
    """A vendor module whose kernels are the unfold ones (what they compute is beside the
    point: the timer below is a stand-in)."""

    __name__ = "stand_in_vendor"

    def __init__(self):
        from cuvmap.lax import conv_gemm

        self.forward, self.backward_input = conv_gemm.forward, conv_gemm.backward_input
        self.backward_weight = conv_gemm.backward_weight


def _auto_with_a_stand_in_vendor(monkeypatch):
    """The "auto" strategy with fresh tables and a stand-in vendor named "onednn" (returned)."""
    monkeypatch.setattr(conv_strategy, "_strategy", ["auto"])
    monkeypatch.setattr(conv_strategy, "_measured", MeasuredChoices())
    monkeypatch.setattr(conv_strategy, "_failed", MeasuredChoices())
    vendor = _StandInKernels()
    monkeypatch.setattr(conv_strategy, "_vendor_for", lambda device, dtype: ("onednn", vendor))
    return vendor


def test_two_threads_meeting_a_new_key_measure_it_once(monkeypatch):
    """NOTE [measuring once per key]: two threads start the same new convolution together
    (a barrier); the stand-in timer counts its calls and holds the first caller until a
    second one arrives (or a timeout), so two measurements would overlap. The key is timed
    once — one vendor and one unfold timing — and both threads get the reference result."""
    import threading

    vendor = _auto_with_a_stand_in_vendor(monkeypatch)
    timed = []
    inside = threading.Barrier(2)

    def counting_timer(module, op, args, bias, device, layout=None, warm_up=True):
        timed.append("onednn" if module is vendor else "unfold")
        try:
            inside.wait(timeout=1.0)      # a second measurement would meet the first here
        except threading.BrokenBarrierError:
            pass
        out = conv_strategy._call(module, op, args, bias, layout)
        return (1.0 if module is vendor else 2.0), out

    monkeypatch.setattr(conv_strategy, "_time_kernel", counting_timer)
    rng = np.random.default_rng(19)
    x, w, _, params = make_operands(CONFIGS[4], rng)
    want = reference_conv(x, w, None, params)
    start = threading.Barrier(2)
    results, errors = [], []

    def worker():
        try:
            start.wait(timeout=10)
            results.append(lax.conv(x, w, **params))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert sorted(timed) == ["onednn", "unfold"], f"the key was timed {len(timed) // 2} times: {timed}"
    ((_, (choice, times)),) = conv_mod.measured_choices().items()
    assert choice == "onednn" and times == {"onednn": 1.0, "unfold": 2.0}
    assert len(results) == 2
    for out in results:
        np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-10)
    assert not conv_strategy._measured.in_flight()


@pytest.mark.parametrize("first, second, timed_again, chosen", [
    ({"onednn": 1.0, "unfold": 1.2}, {"onednn": 1.1, "unfold": 0.9}, ["unfold", "onednn"], "unfold"),
    ({"onednn": 1.0, "unfold": 1.2}, {"onednn": 0.8, "unfold": 1.3}, ["unfold", "onednn"], "onednn"),
    ({"onednn": 1.0, "unfold": 2.0}, {}, [], "onednn"),                  # far behind: one pass
], ids=["close-unfold-wins-again", "close-vendor-keeps-it", "far-apart"])
def test_close_candidates_are_timed_again_in_reverse_order(monkeypatch, first, second, timed_again, chosen):
    """NOTE [timing close candidates twice]: on the CPU, candidates within CLOSE of the
    fastest are timed a second time, last first, and each keeps its faster time."""
    vendor = _auto_with_a_stand_in_vendor(monkeypatch)
    calls = []

    def timer(module, op, args, bias, device, layout=None, warm_up=True):
        name = "onednn" if module is vendor else "unfold"
        again = name in calls
        assert warm_up is not again, "the second pass skips the warm-up call, the first makes it"
        ms = (second if again else first)[name]
        calls.append(name)
        return ms, conv_strategy._call(module, op, args, bias, layout)

    monkeypatch.setattr(conv_strategy, "_time_kernel", timer)
    x, w, _, params = make_operands(CONFIGS[4], np.random.default_rng(21))
    np.testing.assert_allclose(lax.conv(x, w, **params), reference_conv(x, w, None, params), rtol=1e-10, atol=1e-10)
    assert calls == ["onednn", "unfold"] + timed_again
    ((_, (choice, times)),) = conv_mod.measured_choices().items()
    assert choice == chosen
    assert times == {k: min(v, second.get(k, v)) for k, v in first.items()}


def test_a_failed_measurement_lets_the_next_caller_measure(monkeypatch):
    """A measurement that raises (here a MemoryError from the stand-in timer) records no
    choice and leaves no claim behind: the next call measures the key."""
    vendor = _auto_with_a_stand_in_vendor(monkeypatch)
    calls = []

    def timer(module, op, args, bias, device, layout=None, warm_up=True):
        calls.append(module is vendor)
        if len(calls) == 2:
            raise MemoryError("stand-in: no memory for the unfold columns")
        return 1.0, conv_strategy._call(module, op, args, bias, layout)

    monkeypatch.setattr(conv_strategy, "_time_kernel", timer)
    x, w, _, params = make_operands(CONFIGS[4], np.random.default_rng(20))
    with pytest.raises(MemoryError):
        lax.conv(x, w, **params)
    assert not conv_mod.measured_choices() and not conv_strategy._measured.in_flight()
    np.testing.assert_allclose(lax.conv(x, w, **params), reference_conv(x, w, None, params), rtol=1e-10,
                               atol=1e-10)
    # the failed measurement (vendor, unfold raising), then the next caller's: vendor,
    # unfold, and both again in reverse order, their times being equal (NOTE [timing close
    # candidates twice])
    assert calls == [True, False, True, False, False, True] and len(conv_mod.measured_choices()) == 1


def test_deterministic_times_nothing_and_runs_the_vendor(monkeypatch):
    """Under cv.config.deterministic (NOTE [reproducible runs]) "auto" times no kernel: each
    key runs the vendor's kernels where they can run the operands, whatever any timing would
    say, so the same program gives the same bits; float64 on the CPU stays on unfold."""
    monkeypatch.setattr(conv_strategy, "_strategy", ["auto"])
    monkeypatch.setattr(conv_strategy, "_measured", MeasuredChoices())
    monkeypatch.setattr(conv_strategy, "_failed", MeasuredChoices())
    ran = []
    vendor = _StandInKernels()
    vendor.forward = lambda *args: (ran.append("vendor"), conv_mod.conv_gemm.forward(*args))[1]
    monkeypatch.setattr(conv_strategy, "_vendor_for", lambda device, dtype: ("onednn", vendor))

    def no_timing(*args):
        raise AssertionError("a kernel was timed under deterministic")

    monkeypatch.setattr(conv_strategy, "_time_kernel", no_timing)
    x, w, _, params = make_operands(CONFIGS[4], np.random.default_rng(21))
    with cv.config.override(deterministic=True):
        assert cv.config.deterministic
        outs = [lax.conv(x, w, **params) for _ in range(2)]
    assert ran == ["vendor", "vendor"] and not conv_mod.measured_choices()
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], reference_conv(x, w, None, params), rtol=1e-10, atol=1e-10)
    assert not cv.config.deterministic
    with pytest.raises(ValueError, match="deterministic must be True or False"):
        cv.config.update("deterministic", "sometimes")


def test_zero_size_operands_reach_no_kernel(monkeypatch):
    """An empty batch gives the empty result, and an empty weight gradient's zeros,
    without calling any kernel."""
    from cuvmap.lax import conv_gemm

    monkeypatch.setattr(conv_strategy, "_vendor_for", lambda device, dtype: ("onednn", _RaisingKernels()))
    for op in ("forward", "backward_input", "backward_weight"):
        monkeypatch.setattr(conv_gemm, op, _RaisingKernels()._fail)
    params = conv_mod.conv_params(2, stride=2, padding=1, groups=2)
    for dtype in (np.float32, np.float64):
        x = np.zeros((0, 4, 7, 7), dtype)
        w = np.ones((6, 2, 3, 3), dtype)
        out = lax.conv(x, w, np.ones(6, dtype), **params)
        assert out.shape == (0, 6, 4, 4) and out.dtype == dtype
        gx = lax.conv_backward_input(out, w, x.shape, **params)
        gw = lax.conv_backward_weight(out, x, w.shape, **params)
        assert gx.shape == x.shape and gw.shape == w.shape and gw.dtype == dtype and not gw.any()


@pytest.mark.parametrize("cfg", CONFIGS[10:], ids=CONFIG_IDS[10:])
def test_transposed_conv_hands_the_kernel_consistent_shapes(cfg, monkeypatch):
    """output_padding ≥ stride: the transposed conv pads its input to the regular conv's
    extent before the backward-data kernel (NOTE [output_padding in the transposed
    backward]), whose grad_output must be what the regular conv of its input_shape gives —
    cuDNN and oneDNN reject anything else."""
    from cuvmap.lax import conv_gemm
    from cuvmap.window import output_spatial

    real = conv_gemm.backward_input
    seen = []

    def strict_backward_input(g, w, input_shape, stride, padding, dilation, groups):
        expected = output_spatial(input_shape[2:], w.shape[2:], stride, padding, dilation)
        assert tuple(g.shape[2:]) == expected, f"grad_output {g.shape} for input {input_shape}"
        seen.append(tuple(g.shape))
        return real(g, w, input_shape, stride, padding, dilation, groups)

    monkeypatch.setattr(conv_gemm, "backward_input", strict_backward_input)
    monkeypatch.setattr(conv_strategy, "_strategy", ["unfold"])
    rng = np.random.default_rng(19)
    x, w, b, params = make_operands(cfg, rng)
    _assert_close_to_reference(lax.conv(x, w, b, **params), reference_conv(x, w, b, params), np.float64)
    assert seen and seen[0][2:] != x.shape[2:]   # the input was padded


def test_conv_module_has_all_rules():
    from cuvmap.transforms import batching, jvp, vjp

    for p in (conv_mod.conv_p, conv_mod.conv_backward_input_p, conv_mod.conv_backward_weight_p):
        assert p in batching.primitive_batchers and p in jvp.primitive_jvps and p in vjp.primitive_vjps


@pytest.mark.parametrize("cg, out_sp, og, pixel", [
    (16, (20, 20), 32, True),     # the benchmark CNN's conv2: runs of 80 against 20 values
    (1, (24, 24), 16, False),     # its conv1: runs of 5 against 24
    (16, (20, 20), 1024, False),  # 32 weights folded into the output channels: Og ≥ K·Cg
    (16, (20, 20), None, True),   # a weight gradient transposes no (N, O, out) operand
])
def test_auto_column_layout(cg, out_sp, og, pixel):
    """NOTE [column layouts]: the longer contiguous runs win, unless pixel-major would
    transpose an operand larger than the columns."""
    gemm = importlib.import_module("cuvmap.lax.conv_gemm")
    assert gemm._pixel_major(np, cg, (5, 5), (1, 1), (1, 1), out_sp, og) is pixel


def test_column_layout_setting_is_validated(monkeypatch):
    gemm = importlib.import_module("cuvmap.lax.conv_gemm")
    monkeypatch.setattr(gemm, "COLUMN_LAYOUT", "pixels")
    with pytest.raises(ValueError, match="COLUMN_LAYOUT must be 'auto', 'channel' or 'pixel', got 'pixels'"):
        gemm.forward(np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2)), (1, 1), (0, 0), (1, 1), 1)


def test_the_family_is_a_module_and_conv_a_function():
    """The convolution family lives in ``cuvmap/lax/convolution.py`` (JAX's module name);
    ``lax.conv`` is a function, not a module: JAX's front end (cuvmap/lax/conv_general.py),
    which passes aten-form calls to the family's ``conv``."""
    import importlib.util
    import types

    from cuvmap.lax import conv_general

    assert conv_mod.__name__ == "cuvmap.lax.convolution"
    assert lax.conv is conv_general.conv and not isinstance(lax.conv, types.ModuleType)
    x, w = np.ones((1, 1, 4, 4)), np.ones((2, 1, 3, 3))
    np.testing.assert_array_equal(lax.conv(x, w, padding=1), conv_mod.conv(x, w, padding=1))
    assert importlib.util.find_spec("cuvmap.lax.conv") is None
