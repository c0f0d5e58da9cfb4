"""Channels-last activations in a planned CPU program (NOTE [channels-last activations in
a plan] in cuvmap/transforms/executor/layouts.py, NOTE [channels-last results] in
cuvmap/cpu/onednn.py).

Each row is a program and the values its plan lays out channels-last, counted by the
primitive that computes them. Every planned program is run with the layouts and with
them off, and the two agree bit for bit; the float32 ones on oneDNN also skip the reorders
the layouts exist to skip.
"""
import collections
import contextlib

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax, nn
from cuvmap.cpu import onednn
from cuvmap.cpu import threads as cpu_threads
from cuvmap.lru import LRU
from cuvmap.lax import conv_strategy
from cuvmap.transforms import executor, ir
from cuvmap.transforms.executor import layouts, merges

needs_onednn = pytest.mark.skipif(not onednn.available(), reason=f"oneDNN not loadable: {onednn.load_error()}")


def _conv_relu_conv(x, w1, w2):
    return lax.conv(nn.relu(lax.conv(x, w1)), w2).sum()


def _relu_returned(x, w1, w2):
    return nn.relu(lax.conv(x, w1))


def _relu_reshaped(x, w1, w2):
    h = nn.relu(lax.conv(x, w1))
    return (h.reshape(h.shape[0], -1) ** 2).sum()


def _argument_joins(x, w1, w2):
    y = lax.conv(x, w1)
    z = cv.numpy.broadcast_to(x[:, :, 2:-2, 2:-2], y.shape)   # y's shape, not a convolution's result
    return lax.conv(y + z, w2).sum()


def _conv_into_conv(x, w1, w2):
    return lax.conv(lax.conv(x, w1), w2).sum()


def _reduction_reads_it(x, w1, w2):
    h = nn.relu(lax.conv(x, w1))
    return lax.conv(h, w2).sum() + h.sum()


def _channel_scale(x, w1, w2):
    y = lax.conv(x, w1)
    scale = cv.numpy.arange(1.0, y.shape[1] + 1.0, dtype=y.dtype)
    return lax.conv(y * scale[None, :, None, None], w2).sum()   # a broadcast operand joins nothing


def _transposed_first(x, w1, w2):
    y = lax.conv(x, w1.transpose(1, 0, 2, 3), transposed=True)   # (N, 16, 16, 16)
    return lax.conv(nn.relu(y), w2).sum()


def _cnn_loss(params, x):
    h = nn.relu(lax.conv(x, params["w1"], params["b1"]))
    h = nn.relu(lax.conv(h, params["w2"], params["b2"]))
    logits = h.reshape(h.shape[0], -1) @ params["w3"]
    return (logits ** 2).mean()


def _grad_of_cnn(x, w1, w2):
    params = {"w1": w1, "b1": cv.numpy.zeros(w1.shape[0], w1.dtype), "w2": w2,
              "b2": cv.numpy.zeros(w2.shape[0], w2.dtype),
              "w3": cv.numpy.ones((w2.shape[0] * 12 * 12, 3), w2.dtype) * 0.01}
    return cv.grad(_cnn_loss)(params, x)


def _grad_of_conv_relu_conv(x, w1, w2):
    return cv.grad(_conv_relu_conv, argnums=(1, 2))(x, w1, w2)


# name, function, dtype -> the channels-last values, counted by the primitive computing them
ROWS = [
    ("conv, relu, conv", _conv_relu_conv, np.float32, {"conv": 1, "le": 1, "select": 1}),
    ("relu returned: never", _relu_returned, np.float32, {}),
    ("relu reshaped: never", _relu_reshaped, np.float32, {}),
    ("an operand of another layout joins", _argument_joins, np.float32, {}),
    ("conv into conv", _conv_into_conv, np.float32, {"conv": 1}),
    ("a reduction reads it", _reduction_reads_it, np.float32, {}),
    ("a broadcast operand joins nothing", _channel_scale, np.float32, {"conv": 1, "mul": 1}),
    ("a transposed conv writes C order", _transposed_first, np.float32, {}),
    ("float64: oneDNN's dtype only", _conv_relu_conv, np.float64, {}),
    # relu's mask, its select and the select of its gradient, the first conv's output and
    # the input gradient the second conv's merged backward computes
    ("grad of a CNN", _grad_of_cnn, np.float32, {"conv": 1, "le": 1, "select": 2, "conv_backward": 1}),
    ("grad of conv, relu, conv (no input gradient asked of the first)", _grad_of_conv_relu_conv, np.float32,
     {"conv": 1, "le": 1, "select": 2, "conv_backward": 1}),
]


def _args(dtype, batch=4):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 1, 20, 20)).astype(dtype)
    w1 = rng.standard_normal((16, 1, 5, 5)).astype(dtype) * 0.3
    w2 = rng.standard_normal((8, 16, 5, 5)).astype(dtype) * 0.1
    return x, w1, w2


def _program(f, args):
    closed = ir.optimize(cv.make_jaxpr(f)(*args))
    return closed, merges.merge(closed.jaxpr.eqns)


@contextlib.contextmanager
def _layouts_off():
    saved = layouts.channels_last
    layouts.channels_last = lambda eqns, outvars: layouts.ChannelsLast({}, frozenset())
    try:
        yield
    finally:
        layouts.channels_last = saved


def _leaves(tree):
    return cv.tree.leaves(tree) if not isinstance(tree, np.ndarray) else [tree]


@pytest.mark.parametrize("strategy", [pytest.param("onednn", marks=needs_onednn), "unfold"])
@pytest.mark.parametrize("name, f, dtype, counted", ROWS, ids=[r[0] for r in ROWS])
def test_which_values_a_plan_lays_out_channels_last(name, f, dtype, counted, strategy):
    args = _args(dtype)
    closed, eqns = _program(f, args)
    laid_out = layouts.channels_last(eqns, closed.jaxpr.outvars)
    producers = {v: e.primitive.name for e in eqns for v in e.outs}
    assert dict(collections.Counter(producers[v] for v in laid_out.values)) == counted
    assert {eqns[k].primitive.name for k in laid_out.writes} <= {"conv", "conv_backward", "conv_backward_input"}
    # (the busy-machine rule off: another process's load could change a convolution's
    # thread count, and with it a weight gradient's rounding, between the two calls)
    previous, adaptive = conv_strategy.set_strategy(strategy), cpu_threads.set_adaptive(False)
    try:
        got = cv.jit(f)(*args)
        with _layouts_off():
            want = cv.jit(f)(*args)
    finally:
        conv_strategy.set_strategy(previous)
        cpu_threads.set_adaptive(adaptive)
    for g, u in zip(_leaves(got), _leaves(want)):
        assert g.dtype == u.dtype and g.flags.c_contiguous   # what a plan returns is C order
        np.testing.assert_array_equal(g, u)


@needs_onednn
@pytest.mark.parametrize("batch", [1, 5, 32])
def test_the_reorders_are_skipped_and_the_gradients_are_the_loops(monkeypatch, batch):
    """On oneDNN the first layer's activations (16 channels) pass between the convolutions
    with no reorder, forward and backward; the gradients are those of a loop of grad over
    the examples, summed (float32 tolerance: other batch pieces sum in another order)."""
    previous = conv_strategy.set_strategy("onednn")
    try:
        x, w1, w2 = _args(np.float32, batch)
        loop = [cv.grad(_conv_relu_conv, argnums=(1, 2))(x[i:i + 1], w1, w2) for i in range(batch)]
        monkeypatch.setattr(onednn, "_plans", LRU(onednn.CACHE_SIZE))   # the plan's convolutions alone
        got = cv.jit(_grad_of_conv_relu_conv)(x, w1, w2)
    finally:
        conv_strategy.set_strategy(previous)
    for g, parts in zip(got, zip(*loop)):
        want = np.sum(parts, axis=0)
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    reordered = collections.defaultdict(set)
    for op, shapes, description in onednn.cached_plans():   # (each batch piece's: NOTE [batch buckets])
        reordered[op, shapes["x"][1]] |= set(description.split("reorders of")[1].replace(",", " ").split())
    assert {op for op, _ in reordered} == {"forward", "backward_input", "backward_weight"}
    assert "y" not in reordered["forward", 1]            # the first conv writes channels-last
    assert "x" not in reordered["forward", 16]           # the second reads it in place
    assert "x" not in reordered["backward_weight", 16]   # ... and so does its weight gradient
    assert "x" not in reordered["backward_input", 16]    # its input gradient is written channels-last
    assert "y" not in reordered["backward_weight", 1]    # and read in place by the first's weight gradient
