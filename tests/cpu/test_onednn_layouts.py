"""The activations' layouts of oneDNN's plans (NOTE [activation layouts] in
cuvmap/cpu/onednn.py): every op in every layout against the naive float64 loops, the merged
backward pass with its passes in different layouts, user arrays already channels-last, and
how the ``auto`` strategy's measured layout reaches the one-pass backward.
"""
import numpy as np
import pytest

from cuvmap.cpu import onednn, openmp
from cuvmap.lax import conv_gemm, conv_strategy
from cuvmap.lru import LRU
from cuvmap.measured_choices import MeasuredChoices

from conv_references import CONFIGS, make_operands, naive_backward_weight, naive_conv

needs_onednn = pytest.mark.skipif(not onednn.available(), reason=f"oneDNN not loadable: {onednn.load_error()}")
REGULAR = [c for c in CONFIGS if not c[11]]     # transposed convolutions reach oneDNN as regular ones


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def _operands(cfg, n, seed):
    rng = np.random.default_rng(seed)
    x, w, b, params = make_operands(cfg, rng)
    x = np.concatenate([x] * (-(-n // x.shape[0])))[:n] + rng.standard_normal((n,) + x.shape[1:])
    conv = (params["stride"], params["padding"], params["dilation"], params["groups"])
    g = rng.standard_normal(naive_conv(x, w, *conv).shape)
    return x, w, b, g, conv


def _run_or_refused(fn, layout):
    """``fn()``, or None where oneDNN refused the channels-last plan (only its reference
    kernels could run it); the blocked layout is never refused."""
    try:
        return fn()
    except onednn.OnednnError as err:
        assert layout == "channels_last" and "reference" in str(err), err
        return None


@needs_onednn
@pytest.mark.parametrize("layout", onednn.LAYOUTS)
@pytest.mark.parametrize("cfg", REGULAR, ids=[c[0] for c in REGULAR])
def test_each_op_in_each_layout_against_the_loops(cfg, layout, monkeypatch):
    """Forward (with its bias), backward-data and backward-weights at the config's batch
    and at 5 (pieces of 4 and 1), float32 against float64 loops."""
    monkeypatch.setitem(openmp._settings, "threading", "openmp")
    f32 = lambda a: a.astype(np.float32)  # noqa: E731
    ran = 0
    for n in (cfg[2], 5):
        x, w, b, g, conv = _operands(cfg, n, seed=n)
        want = naive_conv(x, w, *conv) + b.reshape((1, -1) + (1,) * (x.ndim - 2))
        got = _run_or_refused(lambda: onednn.forward(f32(x), f32(w), *conv, bias=f32(b), layout=layout), layout)
        if got is not None:
            _close(got, want)
            ran += 1
        got = _run_or_refused(lambda: onednn.backward_input(f32(g), f32(w), x.shape, *conv, layout=layout), layout)
        if got is not None:
            _close(got, conv_gemm.backward_input(g, w, x.shape, *conv))
            ran += 1
        got = _run_or_refused(lambda: onednn.backward_weight(f32(g), f32(x), w.shape, *conv, layout=layout), layout)
        if got is not None:
            _close(got, naive_backward_weight(g, x, w.shape, *conv))
            ran += 1
    if layout == "blocked" or (cfg[1] == 2 and cfg[10] == 1):
        assert ran == 6, f"{layout}: {6 - ran} of 6 calls refused"   # the 2-d ungrouped ones: never refused


@needs_onednn
@pytest.mark.parametrize("threading_mode", ["openmp", "threads"])
@pytest.mark.parametrize("layouts", [
    {"backward_input": "blocked", "backward_weight": "channels_last"},
    {"backward_input": "channels_last", "backward_weight": "blocked"},
    {"backward_input": "channels_last", "backward_weight": "channels_last"},
], ids=["blocked-cl", "cl-blocked", "cl-cl"])
def test_the_merged_backward_with_passes_in_different_layouts(layouts, threading_mode, monkeypatch):
    """One pass over ``g`` whose two primitives read it in different layouts: each reorders
    it for itself (the shared reorder is keyed on the layout), batch 37 in pieces, and in
    the threads mode on cuvmap's threads; against the loops."""
    monkeypatch.setitem(openmp._settings, "threading", threading_mode)
    cfg = next(c for c in REGULAR if c[0] == "2d-s2-p1")
    x, w, b, g, conv = _operands(cfg, 37, seed=3)
    f32 = lambda a: a.astype(np.float32)  # noqa: E731
    stride, padding, dilation, groups = conv
    dx, dw, db = onednn.backward(f32(g), x=f32(x), w=f32(w), input_shape=x.shape, weight_shape=w.shape, bias=True,
                                 stride=stride, padding=padding, dilation=dilation, groups=groups, layouts=layouts)
    _close(dx, conv_gemm.backward_input(g, w, x.shape, *conv))
    _close(dw, naive_backward_weight(g, x, w.shape, *conv))
    _close(db, g.sum(axis=(0, 2, 3)))


@needs_onednn
@pytest.mark.parametrize("channels, blocked_reorders_x", [(16, False), (32, True)])
def test_a_channels_last_array_is_read_in_place_and_the_layout_keys_the_plan(monkeypatch, channels, blocked_reorders_x):
    """An input that is already channels-last (a transposed NHWC array) needs no reorder in
    a channels-last plan; a blocked plan reorders it unless its blocks hold every channel
    (``nChw16c`` with 16 channels is the same memory: NOTE [channels-last results]); the
    two are separate plans."""
    monkeypatch.setattr(onednn, "_plans", LRU(onednn.CACHE_SIZE))
    rng = np.random.default_rng(4)
    nhwc = rng.standard_normal((4, 9, 9, channels)).astype(np.float32)
    x = nhwc.transpose(0, 3, 1, 2)                      # (4, C, 9, 9), channels innermost
    w = rng.standard_normal((8, channels, 3, 3)).astype(np.float32)
    conv = ((1, 1), (1, 1), (1, 1), 1)
    want = naive_conv(x.astype(np.float64), w.astype(np.float64), *conv)
    _close(onednn.forward(x, w, *conv, layout="channels_last"), want)
    _close(onednn.forward(x, w, *conv, layout="blocked"), want)
    descriptions = [desc for _, _, desc in onednn.cached_plans()]
    assert len(descriptions) == 2
    (cl,) = [d for d in descriptions if "(channels_last)" in d]
    (blocked,) = [d for d in descriptions if "(channels_last)" not in d]
    assert "reorders of" in cl and " x" not in cl.split("reorders of")[1]
    assert (" x" in blocked.split("reorders of")[1]) == blocked_reorders_x
    with pytest.raises(ValueError, match="layout must be one of blocked, channels_last, not 'nchw'"):
        onednn.forward(x, w, *conv, layout="nchw")


@needs_onednn
def test_the_measured_layouts_reach_the_one_pass_backward(monkeypatch):
    """``auto`` keeps a layout per key; a backward whose two keys chose oneDNN in different
    layouts runs as one pass with those layouts, and its results are the separate calls'."""
    monkeypatch.setattr(conv_strategy, "_strategy", ["auto"])
    monkeypatch.setattr(conv_strategy, "_measured", MeasuredChoices())
    monkeypatch.setattr(conv_strategy, "_failed", MeasuredChoices())
    cfg = next(c for c in REGULAR if c[0] == "2d")
    x, w, b, g, conv = _operands(cfg, 8, seed=5)
    x, w, g = (a.astype(np.float32) for a in (x, w, g))
    chosen = {"backward_input": "onednn", "backward_weight": "onednn:channels_last"}
    for op, args in (("backward_input", (g, w, x.shape) + conv), ("backward_weight", (g, x, w.shape) + conv)):
        conv_strategy._measured.record(conv_strategy._strategy_key(op, "cpu", args), (chosen[op], {}))
    seen = []
    real = onednn.backward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("layouts"))
        return real(*args, **kwargs)

    monkeypatch.setattr(onednn, "backward", spy)
    stride, padding, dilation, groups = conv
    dx, dw, db = conv_strategy.run_backward(g, x=x, w=w, input_shape=x.shape, weight_shape=w.shape, bias=True,
                                            bias_sum=lambda a: a.sum(axis=(0, 2, 3)), stride=stride,
                                            padding=padding, dilation=dilation, groups=groups)
    assert seen == [{"backward_weight": "channels_last"}]
    x64, w64, g64 = (a.astype(np.float64) for a in (x, w, g))
    _close(dx, conv_gemm.backward_input(g64, w64, x.shape, *conv))
    _close(dw, naive_backward_weight(g64, x64, w.shape, *conv))
    _close(db, g64.sum(axis=(0, 2, 3)))


@needs_onednn
def test_a_channels_last_plan_on_reference_kernels_is_refused_and_not_timed(monkeypatch):
    """Where oneDNN could run the channels-last layout only on its reference kernels (made
    to happen here by a stand-in ``impl``), the plan raises OnednnError, and ``auto``
    times and keeps the other candidates, without a warning."""
    import warnings

    from cuvmap.cpu import libdnnl

    monkeypatch.setattr(onednn, "_plans", LRU(onednn.CACHE_SIZE))


@needs_onednn
def test_the_forced_channels_last_strategy_runs_every_op_channels_last(monkeypatch):
    """``set_strategy("onednn:channels_last")`` (or the environment variable) runs each op on
    oneDNN's channels-last plans, eagerly and in a jitted gradient (its one-pass backward
    takes both gradients channels-last), with the loops' results."""
    import cuvmap as cv
    from cuvmap import lax, nn

    monkeypatch.setattr(conv_strategy, "_strategy", [None])
    monkeypatch.setenv("CUVMAP_CONV_STRATEGY", "onednn:channels_last")
    assert conv_strategy.get_strategy() == "onednn:channels_last"
    monkeypatch.setattr(conv_strategy, "_failed", MeasuredChoices())
    seen = []
    for op in ("forward", "backward_input", "backward_weight", "backward"):
        real = getattr(onednn, op)

        def spy(*args, _real=real, _op=op, **kwargs):
            seen.append((_op, kwargs.get("layout", kwargs.get("layouts"))))
            return _real(*args, **kwargs)

        monkeypatch.setattr(onednn, op, spy)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 3, 9, 9)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    conv = ((1, 1), (1, 1), (1, 1), 1)
    x64, w64, b64 = (a.astype(np.float64) for a in (x, w, b))
    _close(np.asarray(lax.conv(x, w, stride=1, padding=1)), naive_conv(x64, w64, *conv))
    assert seen == [("forward", "channels_last")]

    def loss(w, b, x):
        return (nn.conv(x, w, b, padding=1) ** 2).sum() / 2

    y = naive_conv(x64, w64, *conv) + b64.reshape(1, -1, 1, 1)
    want_w = naive_backward_weight(y, x64, w.shape, *conv)
    for f in (cv.grad(loss, argnums=(0, 1)), cv.jit(cv.grad(loss, argnums=(0, 1)))):
        del seen[:]
        gw, gb = f(w, b, x)
        _close(np.asarray(gw), want_w)
        _close(np.asarray(gb), y.sum(axis=(0, 2, 3)))
        assert seen and all(layout in ("channels_last", {"backward_weight": "channels_last"}) for _, layout in seen), seen
    assert ("backward", {"backward_weight": "channels_last"}) in seen    # jit: the one-pass backward
