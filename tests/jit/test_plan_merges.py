"""Equations merged for the plan (NOTE [equations merged for the plan]): a convolution's
input, weight and bias gradients of one output gradient run as one ``conv_backward``
step (NOTE [a convolution's gradients merged for the plan]), and oneDNN computes them in
one pass (NOTE [one backward pass over the output gradient]).

Each case is a row: a loss over ``conv(x, w, b)``, the arguments differentiated, and the
parts the plan's merged step must hold. The jitted gradient is checked against the plan
with the merge rules off (bit for bit where the same kernels run, the bias sum to float32
rounding on oneDNN) and against the naive float64 loops of tests/conv_references.py.
"""
import contextlib

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax
from cuvmap.cpu import onednn, openmp
from cuvmap.cpu import threads as cpu_threads
from cuvmap.lax import conv_gemm, conv_strategy, convolution, convolution_merged, reduction
from cuvmap.transforms import executor, ir
from cuvmap.transforms.executor import merges

from conv_references import naive_backward_weight

needs_onednn = pytest.mark.skipif(not onednn.available(), reason=f"oneDNN not loadable: {onednn.load_error()}")

# name, x shape, w shape, conv params, with bias, argnums -> the merged step's parts (None: no merged step)
CASES = [
    ("x, w and b", (4, 3, 9, 8), (6, 3, 3, 3), {}, True, (0, 1, 2), ("input", "weight", "bias")),
    ("w and b (x constant)", (4, 3, 9, 8), (6, 3, 3, 3), {}, True, (1, 2), ("weight", "bias")),
    ("x and w, no bias", (4, 3, 9, 8), (6, 3, 3, 3), {}, False, (0, 1), ("input", "weight")),
    ("x and b: no weight gradient", (4, 3, 9, 8), (6, 3, 3, 3), {}, True, (0, 2), None),
    ("x alone", (4, 3, 9, 8), (6, 3, 3, 3), {}, True, (0,), None),
    ("strided, padded, dilated, grouped", (5, 4, 11, 10), (6, 2, 3, 2),
     dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2), True, (0, 1, 2), ("input", "weight", "bias")),
    ("odd batch: 37 = 32 + 4 + 1 pieces", (37, 2, 7, 6), (3, 2, 3, 3), {}, True, (0, 1, 2),
     ("input", "weight", "bias")),
    ("1-d", (3, 2, 12), (4, 2, 5), dict(padding=2), True, (0, 1, 2), ("input", "weight", "bias")),
    ("transposed: never merged", (4, 3, 6, 5), (3, 5, 3, 3), dict(transposed=True, stride=2), True, (0, 1, 2),
     None),
    ("empty batch", (0, 3, 9, 8), (6, 3, 3, 3), {}, True, (0, 1, 2), ("input", "weight", "bias")),
]


def _loss(x, w, b, params):
    y = lax.conv(x, w, b, **params)
    return (cv.numpy.sin(y) * y).sum()


def _args(xs, ws, params, bias, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    out_channels = ws[1] * params.get("groups", 1) if params.get("transposed") else ws[0]
    b = rng.standard_normal(out_channels).astype(dtype) if bias else None
    return x, w, b


def _planned(f, *args):
    """The plan ``jit`` makes of ``f`` on ``args``."""
    return executor.plan(ir.optimize(cv.make_jaxpr(f)(*args)), graphs=False)


def _merged_steps(plan):
    return [s for s in plan.steps if s.impl is convolution_merged.conv_backward_p.impl]


@contextlib.contextmanager
def _rules_off():
    saved = list(merges._rules)
    merges._rules.clear()
    try:
        yield
    finally:
        merges._rules.extend(saved)


def _parts(step):
    p = step.params
    return tuple(name for name, on in (("input", p["input_shape"] is not None),
                                       ("weight", p["weight_shape"] is not None), ("bias", p["bias"])) if on)


@pytest.mark.parametrize("strategy, dtype", [
    pytest.param("onednn", np.float32, marks=needs_onednn), ("unfold", np.float32), ("auto", np.float64)])
@pytest.mark.parametrize("name, xs, ws, params, bias, argnums, parts", CASES, ids=[c[0] for c in CASES])
def test_a_convolutions_gradients_run_as_one_step(name, xs, ws, params, bias, argnums, parts, strategy, dtype):
    previous = conv_strategy.set_strategy(strategy)
    try:
        x, w, b = _args(xs, ws, params, bias, dtype)
        argnums = tuple(a for a in argnums if a < 2 or bias)

        def loss(x, w, b):
            return _loss(x, w, b, params)

        grad = cv.grad(loss, argnums=argnums)
        plan = _planned(grad, x, w, b)
        merged = _merged_steps(plan)
        assert [_parts(s) for s in merged] == ([parts] if parts else []), plan.steps
        got = cv.jit(grad)(x, w, b)
        with _rules_off():
            unmerged_plan = _planned(grad, x, w, b)
            assert not _merged_steps(unmerged_plan)
            want = unmerged_plan.program([x, w] + ([b] if bias else []))
        for i, (g, u) in enumerate(zip(got, want)):
            assert g.shape == u.shape and g.dtype == u.dtype
            bias_on_onednn = strategy == "onednn" and argnums[i] == 2 and parts and "bias" in parts
            if bias_on_onednn:   # summed in oneDNN's order
                np.testing.assert_allclose(g, u, rtol=2e-5, atol=2e-5 * max(1.0, float(np.abs(u).max(initial=0))))
            else:
                np.testing.assert_array_equal(g, u)
        if not params.get("transposed") and xs[0]:
            # and against the float64 loops: the weight gradient of <conv(x, w) + b, g>
            y = lax.conv(x.astype(np.float64), w.astype(np.float64), None if b is None else b.astype(np.float64),
                         **params)
            gy = np.cos(np.asarray(y)) * np.asarray(y) + np.sin(np.asarray(y))
            conv = {k: v for k, v in convolution.conv_params(len(xs) - 2, **params).items()
                    if k in ("stride", "padding", "dilation", "groups")}
            if 0 in argnums:   # (im2col in float64: the input gradient's adjoint identity, tests/lax/test_conv.py)
                want_x = conv_gemm.backward_input(gy, w.astype(np.float64), xs, conv["stride"], conv["padding"],
                                                  conv["dilation"], conv["groups"])
                tol = 1e-4 if dtype == np.float32 else 1e-10
                np.testing.assert_allclose(got[argnums.index(0)], want_x, rtol=tol, atol=tol * np.abs(want_x).max())
            if 1 in argnums:
                want_w = naive_backward_weight(gy, x.astype(np.float64), ws, conv["stride"], conv["padding"],
                                               conv["dilation"], conv["groups"])
                tol = 1e-4 if dtype == np.float32 else 1e-10
                np.testing.assert_allclose(got[argnums.index(1)], want_w, rtol=tol, atol=tol * np.abs(want_w).max())
            if 2 in argnums:
                want_b = gy.sum(axis=(0,) + tuple(range(2, gy.ndim)))
                tol = 1e-4 if dtype == np.float32 else 1e-10
                np.testing.assert_allclose(got[argnums.index(2)], want_b, rtol=tol, atol=tol * np.abs(want_b).max())
    finally:
        conv_strategy.set_strategy(previous)


@needs_onednn
@pytest.mark.parametrize("mode", ["openmp", "threads"])
@pytest.mark.parametrize("n, groups, asked", [
    (37, 1, ("input", "weight", "bias")),    # example pieces: the weight and bias sums accumulate
    (37, 1, ("input", "weight")),
    (8, 1, ("weight", "bias")),
    (1, 13, ("input", "weight", "bias")),    # one example, group pieces (the per-example layout)
    (6, 2, ("input", "bias", "weight")),
])
def test_onednn_backward_in_one_pass(monkeypatch, mode, n, groups, asked):
    """oneDNN's one-pass backward (one reorder of g shared by the pieces' two primitives,
    the bias summed by backward-weights) against the loops, in both threading modes; the
    arenas an output writes through never pass for a reorder of an input (the weight is
    the input of backward-data and the output of backward-weights, piece after piece)."""
    monkeypatch.setitem(openmp._settings, "threading", mode)
    get, set_ = onednn.openmp_functions()
    before = get()
    set_(2)
    try:
        rng = np.random.default_rng(n + groups)
        stride, padding, dilation = (1, 2), (1, 0), (1, 1)
        x = rng.standard_normal((n, 2 * groups, 6, 7))
        w = rng.standard_normal((3 * groups, 2, 3, 3))
        y = conv_gemm.forward(x, w, stride, padding, dilation, groups)
        g = rng.standard_normal(y.shape)
        f32 = lambda a: a.astype(np.float32)  # noqa: E731
        dx, dw, db = onednn.backward(
            f32(g), x=f32(x) if "weight" in asked else None, w=f32(w) if "input" in asked else None,
            input_shape=x.shape, weight_shape=w.shape, bias="bias" in asked, stride=stride, padding=padding,
            dilation=dilation, groups=groups)
    finally:
        set_(before)
    close = lambda got, want: np.testing.assert_allclose(  # noqa: E731
        got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    assert (dx is not None, dw is not None, db is not None) == ("input" in asked, "weight" in asked, "bias" in asked)
    if dx is not None:
        close(dx, conv_gemm.backward_input(g, w, x.shape, stride, padding, dilation, groups))
    if dw is not None:
        close(dw, naive_backward_weight(g, x, w.shape, stride, padding, dilation, groups))
    if db is not None:
        close(db, g.sum(axis=(0, 2, 3)))


@needs_onednn
def test_the_first_call_gives_what_later_calls_give(monkeypatch):
    """Under "auto" the first call measures each kernel (NOTE [conv strategy]) and then
    runs the one-pass kernel as later calls do: the bias gradient of call 1 is call 2's, bit
    for bit. The busy-machine rule is off (NOTE [threads under a busy machine]): another
    process's load may narrow a convolution to one thread between the two calls, and
    backward-weights sums its examples' shares per thread, to float32 rounding."""
    monkeypatch.setattr(conv_strategy, "_measured", conv_strategy.MeasuredChoices("conv"))
    previous = conv_strategy.set_strategy("auto")
    adaptive = cpu_threads.set_adaptive(False)
    try:
        x, w, b = _args((64, 16, 12, 12), (32, 16, 5, 5), {}, True, np.float32, seed=3)
        f = cv.jit(cv.grad(lambda x, w, b: _loss(x, w, b, {}), argnums=(0, 1, 2)))
        first, second = f(x, w, b), f(x, w, b)
        for a, c in zip(first, second):
            np.testing.assert_array_equal(a, c)
    finally:
        conv_strategy.set_strategy(previous)
        cpu_threads.set_adaptive(adaptive)


def test_a_merge_waits_for_its_operands_and_never_passes_a_reader():
    """The merged equation takes its group's first place when its operands are defined by
    then, else the place after the last definition; a group whose results are read before
    any such place stays apart."""
    from cuvmap.core import ShapedArray

    def var(shape=(2, 3, 4, 4)):
        return ir.Var(ShapedArray(shape, np.dtype(np.float32)))

    conv = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1)
    g, x, w0 = var(), var(), var((3, 3, 1, 1))

    def bw_weight(xv):
        return ir.JaxprEqn(convolution.conv_backward_weight_p, [g, xv], [var((3, 3, 1, 1))],
                           dict(conv, weight_shape=(3, 3, 1, 1)))

    def bias_sum():
        return ir.JaxprEqn(reduction.reduce_sum_p, [g], [var((3,))], dict(axes=(0, 2, 3)))

    from cuvmap.lax.elementwise import neg_p
    late_x = var()
    s = bias_sum()
    make_x = ir.JaxprEqn(neg_p, [x], [late_x], {})
    bw = bw_weight(late_x)
    # the sum comes first; the weight gradient's input is defined after it: the merged step goes after that
    out = merges.merge([s, make_x, bw])
    assert [e.primitive for e in out] == [neg_p, convolution_merged.conv_backward_p]
    assert out[1].outs == [bw.outs[0], s.outs[0]]
    # ... unless the sum's result is read in between: no merge
    s2, make_x2, bw2 = bias_sum(), ir.JaxprEqn(neg_p, [x], [late_x], {}), bw_weight(late_x)
    reader = ir.JaxprEqn(neg_p, [s2.outs[0]], [var((3,))], {})
    kept = [s2, reader, make_x2, bw2]
    assert merges.merge(kept) is kept


@needs_onednn
def test_a_failing_one_pass_kernel_warns_once_and_each_gradient_runs_on_its_own(monkeypatch):
    """A vendor error in the one-pass kernel: a VendorKernelWarning once, the gradients from
    the separate kernels (checked against the float64 loop), and no second try."""
    monkeypatch.setattr(conv_strategy, "_failed", conv_strategy.MeasuredChoices())
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("diff_bias unsupported here")

    monkeypatch.setattr(onednn, "backward", failing)
    previous = conv_strategy.set_strategy("onednn")
    try:
        x, w, b = _args((4, 3, 9, 8), (6, 3, 3, 3), {}, True, np.float32, seed=4)
        f = cv.jit(cv.grad(lambda x, w, b: _loss(x, w, b, {}), argnums=(1, 2)))
        with pytest.warns(conv_strategy.VendorKernelWarning, match="one-pass kernel failed"):
            dw, db = f(x, w, b)
        dw2, db2 = f(x, w, b)
    finally:
        conv_strategy.set_strategy(previous)
    assert len(calls) == 1
    y = np.asarray(lax.conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)))
    gy = np.cos(y) * y + np.sin(y)
    want_w = naive_backward_weight(gy, x.astype(np.float64), w.shape, (1, 1), (0, 0), (1, 1), 1)
    np.testing.assert_allclose(dw, want_w, rtol=1e-4, atol=1e-4 * np.abs(want_w).max())
    np.testing.assert_allclose(db, gy.sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-4 * np.abs(gy.sum(axis=(0, 2, 3))).max())
    np.testing.assert_array_equal(dw, dw2)
    np.testing.assert_array_equal(db, db2)
