"""Control flow (the package cuvmap/lax/control_flow/) beyond the op table's generic tests (rows
``cond_*``, ``switch_*``, ``scan_*``, ``fori_loop_*``, ``map``, ``while_*`` in
tests/op_table.py: impl against Python loops and branches, vmap for every in_axes at batch
sizes 3, 1 and 0, derivatives against finite differences, jit both ways): the errors, one
trace per call, program sizes independent of the length, memory, the compositions with
jit/vmap/grad, checkpoint and custom derivatives, a batched predicate's guarded
gradients, and a property test of random scan bodies against the unrolled loop.
References: Python loops and branches over the same function, finite differences, closed
forms."""
import re
import threading
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import given, settings

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax
from cuvmap.lax import control_flow
from cuvmap.lax.control_flow import ControlFlowError
from cuvmap.test_util import check_grads
from cuvmap.transforms import ir

from random_programs import program_fun, programs


def _rng(seed=0):
    return np.random.default_rng(seed)


def _close(a, b, tol=1e-12):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------
# A small RNN: scan against the unrolled loop
# ---------------------------------------------------------------------------------------

H = 4


def _params(seed=0, dtype=np.float64):
    rng = _rng(seed)
    return {"w": (rng.standard_normal((H, H)) * 0.4).astype(dtype), "u": (rng.standard_normal((3, H)) * 0.5).astype(dtype)}


def _cell(params, h, x):
    return cnp.tanh(h @ params["w"] + x @ params["u"])


def _rnn_scan(params, xs):
    h, hs = lax.scan(lambda h, x: (_cell(params, h, x), h), cnp.zeros(H, dtype=xs.dtype), xs)
    return cnp.sum(h * h) + 0.1 * cnp.sum(hs)


def _rnn_unrolled(params, xs):
    h = cnp.zeros(H, dtype=xs.dtype)
    total = 0.0
    for t in range(xs.shape[0]):
        total = total + cnp.sum(h)
        h = _cell(params, h, xs[t])
    return cnp.sum(h * h) + 0.1 * total


def _xs(n=6, seed=1, dtype=np.float64, batch=None):
    shape = (n, 3) if batch is None else (batch, n, 3)
    return _rng(seed).standard_normal(shape).astype(dtype)


COMPOSITIONS = {
    "grad": lambda f: cv.grad(f),
    "jit(grad)": lambda f: cv.jit(cv.grad(f)),
    "grad(jit)": lambda f: cv.grad(cv.jit(f)),
    "jit(vmap(grad))": lambda f: cv.jit(cv.vmap(cv.grad(f), in_axes=(None, 0))),
    "vmap(jit(grad))": lambda f: cv.vmap(cv.jit(cv.grad(f)), in_axes=(None, 0)),
    "vmap(grad)": lambda f: cv.vmap(cv.grad(f), in_axes=(None, 0)),
    "grad(vmap)": lambda f: cv.grad(lambda p, xs: cnp.sum(cv.vmap(f, in_axes=(None, 0))(p, xs))),
}


@pytest.mark.parametrize("name", list(COMPOSITIONS))
def test_per_example_gradients_of_a_scan_equal_the_unrolled_loop(name):
    batched = name != "grad" and name != "jit(grad)" and name != "grad(jit)"
    xs = _xs(batch=5 if batched else None)
    params = _params()
    got = COMPOSITIONS[name](_rnn_scan)(params, xs)
    want = COMPOSITIONS[name](_rnn_unrolled)(params, xs)
    for k in params:
        _close(got[k], want[k], 1e-12)


def test_scan_derivatives_match_finite_differences_to_second_order():
    check_grads(lambda w, xs: _rnn_scan({"w": w, "u": _params()["u"]}, xs), (_params()["w"], _xs()), order=2)


def test_hessian_and_jacobians_of_a_scan():
    params, xs = _params(), _xs(n=3)
    f = lambda w: _rnn_scan(dict(params, w=w), xs)
    g = lambda w: _rnn_unrolled(dict(params, w=w), xs)
    _close(cv.hessian(f)(params["w"]), cv.hessian(g)(params["w"]), 1e-11)
    h = lambda w: lax.scan(lambda c, x: (cnp.sin(c * x) + c, c), w[0], w)[1]
    _close(cv.jacfwd(h)(np.linspace(0.1, 1, 4)), cv.jacrev(h)(np.linspace(0.1, 1, 4)), 1e-12)


def test_linearize_of_a_scan_computes_the_primal_once():
    params, xs = _params(), _xs()
    f = lambda w: _rnn_scan(dict(params, w=w), xs)
    t = _rng(3).standard_normal((H, H))
    y, f_jvp = cv.linearize(f, params["w"])
    want_y, want_t = cv.jvp(lambda w: _rnn_unrolled(dict(params, w=w), xs), (params["w"],), (t,))
    _close(y, want_y)
    _close(f_jvp(t), want_t)
    _close(cv.vmap(f_jvp)(np.stack([t, 2 * t])), np.stack([want_t, 2 * want_t]))


def test_float32_stays_float32():
    params, xs = _params(dtype=np.float32), _xs(dtype=np.float32)
    g = cv.jit(cv.grad(_rnn_scan))(params, xs)
    assert g["w"].dtype == np.float32
    _close(g["w"], cv.grad(_rnn_unrolled)(params, xs)["w"], 1e-5)
    carry, _ = lax.scan(lambda c, x: (c + cnp.sum(x), None), 0.0, np.ones((3, 2), np.float32))  # a weak 0.0
    assert carry.dtype == np.float32 and carry.shape == () and carry == 6


# ---------------------------------------------------------------------------------------
# Staging: one trace, one equation, sizes independent of the length
# ---------------------------------------------------------------------------------------


def test_a_scan_body_is_traced_once_whatever_the_length():
    calls = []

    def step(c, x):
        calls.append(1)
        return c * 0.5 + x, c

    for n in (3, 300):
        calls.clear()
        lax.scan(step, 0.0, np.ones(n))
        assert len(calls) == 2, len(calls)  # one trace, and one more for the weak 0.0 carry
        calls.clear()
        lax.scan(step, np.float64(0.0), np.ones(n))
        assert len(calls) == 1
    sizes = [len(cv.make_jaxpr(lambda xs: cv.grad(lambda xs: cnp.sum(lax.scan(step, xs[0], xs)[1]))(xs))(np.ones(n))
                 .jaxpr.eqns) for n in (3, 300)]
    assert sizes[0] == sizes[1], sizes


def test_a_jitted_function_with_control_flow_traces_once_per_signature():
    f = cv.jit(lambda x, n: lax.fori_loop(0, n, lambda i, x: x * 1.5, x) + lax.cond(x[0] > 0, cnp.sin, cnp.cos, x))
    for _ in range(3):
        f(np.ones(3), 4)
        f(-np.ones(3), np.int64(2))
    assert f.trace_count == 2  # (a Python int and an int64 array are different signatures)
    _close(f(np.ones(3), 4), np.ones(3) * 1.5 ** 4 + np.sin(1.0))


def test_program_text_shows_one_equation_per_control_flow_call():
    """Each control-flow call is one equation whose programs print in full under it, their
    variable names continuing the outer program's (NOTE [the text form of a program])."""
    x = np.ones(3)
    text = str(cv.make_jaxpr(lambda x: lax.scan(lambda c, x: (c + x, c * 2), 0.0 * x[0], x))(x))
    assert text.count(" = scan[\n") == 1, text
    for line in ("      length=3\n", "      num_carry=1\n", "      program={ lambda ; ", "          ",
                 " = add ", " = mul ", "        in (", "      reverse=False\n", "    ] "):
        assert line in text, (line, text)
    text = str(cv.make_jaxpr(lambda x: lax.cond(x[0] > 0, cnp.sin, cnp.cos, x))(x))
    assert "cond[\n      branches=(\n        { lambda ; " in text and " = cos " in text and " = sin " in text, text
    text = str(cv.make_jaxpr(lambda x: lax.while_loop(lambda c: c[0] < 3.0, lambda c: c + 1.0, x))(x))
    assert "while[\n      cond_nconsts=0\n      cond_program={ lambda ; " in text and " = lt " in text, text
    assert "      body_program={ lambda ; " in text and " = add " in text, text
    names = re.findall(r"\b([a-z]+):", text)
    assert len(names) == len(set(names)), text  # one name per variable across the nested programs


def test_dce_drops_dead_outputs_and_the_carries_only_they_need():
    def f(x):
        (a, b, c), ys = lax.scan(lambda c, x: ((c[0] + x, c[1] * 2.0, c[2] + c[1]), (c[0] * x, cnp.sin(x))),
                                 (0.0 * x[0], 1.0 + 0 * x[0], 0.0 * x[0]), x)
        return a, ys[0]

    program = ir.optimize(cv.make_jaxpr(f)(np.ones(4)))
    (eqn,) = [e for e in program.jaxpr.eqns if e.primitive.name == "scan"]
    assert eqn.params["num_carry"] == 1 and len(eqn.outs) == 2   # b and c feed nothing returned
    assert "sin" not in str(eqn.params["program"])
    # ys[0] = (the sum of the x's so far) * x
    _close(cv.jit(f)(np.arange(4.0))[1], np.array([0.0, 0.0, 2.0, 9.0]))


def test_the_optimizer_looks_inside_bodies_and_branches():
    """CSE inside a body, DCE of a cond's dead output and of a while loop's dead carry."""
    def f(x):
        c, ys = lax.scan(lambda c, x: (c + cnp.sin(x) * cnp.sin(x), c), 0.0 * x[0], x)
        return c

    (scan,) = [e for e in ir.optimize(cv.make_jaxpr(f)(np.ones(3))).jaxpr.eqns if e.primitive.name == "scan"]
    body = scan.params["program"].jaxpr
    assert [e.primitive.name for e in body.eqns].count("sin") == 1
    assert len(scan.outs) == 1  # the ys nobody reads are gone
    g = lambda x: lax.cond(x[0] > 0, lambda x: (cnp.exp(x), cnp.cos(x)), lambda x: (x, x * 2.0), x)[1]
    (cond,) = [e for e in ir.optimize(cv.make_jaxpr(g)(np.ones(3))).jaxpr.eqns if e.primitive.name == "cond"]
    assert len(cond.outs) == 1 and "exp" not in str(cond.params["branches"][1])
    _close(cv.jit(g)(np.ones(3)), np.cos(np.ones(3)))
    h = lambda x: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0, cnp.sin(c[2])), (0, x, x))[1]
    (loop,) = [e for e in ir.optimize(cv.make_jaxpr(h)(np.ones(2))).jaxpr.eqns if e.primitive.name == "while"]
    assert len(loop.outs) == 2 and "sin" not in str(loop.params["body_program"])  # the counter stays: the predicate reads it
    _close(cv.jit(h)(np.ones(2)), np.full(2, 8.0))


# ---------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------


def _peak(fn):
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return out, peak - before


def test_a_long_jitted_scan_allocates_its_ys_not_one_buffer_per_step():
    n, width = 10_000, 64
    f = cv.jit(lambda c, xs: lax.scan(lambda c, x: (cnp.tanh(c + x) * 0.5, cnp.sum(c)), c, xs))
    c, xs = np.zeros(width), np.zeros((n, width))
    f(c, xs)  # traced and planned
    _, peak = _peak(lambda: f(c, xs))
    ys_bytes = n * 8
    assert peak < ys_bytes + 64 * width * 8, f"peak {peak} bytes for {ys_bytes} bytes of ys"


def test_grad_of_a_long_scan_keeps_the_stacked_residuals_only():
    width = 256
    w = np.eye(width) * 0.5
    f = lambda w, xs: cnp.sum(lax.scan(lambda c, x: (cnp.tanh(c @ w + x), None), xs[0], xs)[0])
    peaks = {}
    for n in (200, 400):
        xs = np.zeros((n, width)) + 0.01
        _, peaks[n] = _peak(lambda: cv.grad(f)(w, xs))
    per_step = (peaks[400] - peaks[200]) / 200
    # a step saves the tanh's output and the carry it read (two rows), plus the xs and the
    # gradient's own stacked slices: a few rows per step, not a tape of Python entries
    assert per_step < 6 * width * 8, f"{per_step:.0f} bytes per step"


# ---------------------------------------------------------------------------------------
# Batched predicates
# ---------------------------------------------------------------------------------------


def _sqrt_or_zero(x):
    return lax.cond(cnp.min(x) > 0, lambda x: cnp.sqrt(x), lambda x: x * 0.0, x)


def _mixed_batch():
    x = np.abs(_rng(4).standard_normal((6, 3))) + 0.1
    x[::2, 0] *= -1  # these examples take the zero branch, whose sqrt would be nan
    return x


def test_a_batched_predicate_keeps_the_untaken_branch_out_of_the_gradient():
    x = _mixed_batch()
    want = np.where(x.min(axis=1, keepdims=True) > 0, 0.5 / np.sqrt(np.abs(x)), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        got_outer = cv.grad(lambda x: cnp.sum(cv.vmap(_sqrt_or_zero)(x)))(x)
        got_inner = cv.vmap(cv.grad(lambda x: cnp.sum(_sqrt_or_zero(x))))(x)
    _close(got_outer, want)
    _close(got_inner, want)


def test_without_the_guard_the_untaken_branch_would_leak_nan(monkeypatch):
    """The reference for the test above: the guard is what keeps the gradient finite."""
    monkeypatch.setattr(control_flow.conditionals, "_guard", lambda x, taken: x)
    with np.errstate(invalid="ignore", divide="ignore"):
        g = cv.grad(lambda x: cnp.sum(cv.vmap(_sqrt_or_zero)(x)))(_mixed_batch())
    assert np.isnan(g).any()


def _sqrt_or_neg_log(x):
    return lax.cond(x > 0, lambda x: cnp.sqrt(x), lambda x: -cnp.log(-x), x)


_X = np.array([1.0, -2.0, 4.0, -0.5])
_VALUE = np.where(_X > 0, np.sqrt(np.abs(_X)), -np.log(np.abs(_X)))  # the branch taken, in closed form
_D1 = np.where(_X > 0, 0.5 / np.sqrt(np.abs(_X)), -1.0 / _X)
_D2 = np.where(_X > 0, -0.25 * np.abs(_X) ** -1.5, 1.0 / _X ** 2)
_F = _sqrt_or_neg_log
_QUIET_ROWS = [  # (id, function of _X, reference)
    ("vmap", cv.vmap(_F), _VALUE),
    ("jit(vmap)", cv.jit(cv.vmap(_F)), _VALUE),
    ("vmap(grad)", cv.vmap(cv.grad(_F)), _D1),
    ("jit(vmap(grad))", cv.jit(cv.vmap(cv.grad(_F))), _D1),
    ("grad(vmap)", cv.grad(lambda x: cnp.sum(cv.vmap(_F)(x))), _D1),
    ("vmap(jvp)", cv.vmap(lambda x: cv.jvp(_F, (x,), (1.0,))[1]), _D1),
    ("vmap(hessian)", cv.vmap(cv.hessian(_F)), _D2),
    ("vmap(vmap)", lambda x: cv.vmap(cv.vmap(_F))(np.stack([x, x[::-1]]))[1], _VALUE[::-1]),
    ("vmap(linearize)", cv.vmap(lambda x: cv.linearize(_F, x)[1](1.0)), _D1),
]


@pytest.mark.parametrize("f, want", [r[1:] for r in _QUIET_ROWS], ids=[r[0] for r in _QUIET_ROWS])
def test_a_batched_predicate_prints_no_warning_for_the_untaken_branch(f, want):
    """The examples that take the other branch give sqrt and log NaN (and their
    derivatives inf or NaN); select drops them, so nothing may warn about them, as in JAX
    (NOTE [a batched predicate])."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any RuntimeWarning fails
        got = f(_X)
    _close(got, want)
    assert np.geterr()["invalid"] == "warn"  # the errstate stays inside the batched cond


def test_only_a_batched_predicate_makes_a_quiet_cond_and_warnings_elsewhere_stay():
    """An unbatched cond runs one branch and pays nothing (a plain cond); a batched one is
    one quiet_cond; a NaN outside the cond still warns."""
    batched = str(cv.make_jaxpr(cv.vmap(_F))(_X))
    assert "quiet_cond[" in batched and " cond[" not in batched
    unbatched = str(cv.make_jaxpr(cv.vmap(lambda x, p: lax.cond(p > 0, cnp.sqrt, cnp.exp, x), in_axes=(0, None)))(
        _X, 1.0))
    assert "quiet_cond" not in unbatched and "cond[" in unbatched
    with pytest.warns(RuntimeWarning, match="invalid value"):
        cv.vmap(lambda x: cnp.sqrt(_F(x) - 10.0))(_X)


def test_a_batched_predicate_is_a_quiet_cond_on_the_cpu_and_inline_on_the_gpu(backend):
    """CuPy never warns, so on the GPU the branches and selects join the program around
    them (where jit's fusion sees them); the values are the same either way."""
    x = cv.device_put(_X, backend)
    text = str(cv.make_jaxpr(cv.vmap(cv.grad(_F)))(x))
    assert ("quiet_cond[" in text) == (backend == "cpu"), text
    _close(cv.device_put(cv.jit(cv.vmap(cv.grad(_F)))(x), "cpu"), _D1)


def test_a_batched_while_freezes_each_example_at_its_own_count():
    x = np.array([0.5, 3.0, 20.0, 1.0])
    out, tangent = cv.vmap(lambda x: cv.jvp(lambda x: lax.while_loop(lambda c: c < 10.0, lambda c: c * 2.0, x),
                                            (x,), (1.0,)))(x)
    counts = np.array([5, 2, 0, 4])
    _close(out, x * 2.0 ** counts)
    _close(tangent, 2.0 ** counts)


# ---------------------------------------------------------------------------------------
# Compositions with checkpoint and custom derivatives
# ---------------------------------------------------------------------------------------


@cv.custom_jvp
def _soft_clip(x):
    return cnp.tanh(x)


@_soft_clip.defjvp
def _soft_clip_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _soft_clip(x), t * 0.25  # a deliberately wrong rule: only it can give 0.25


def test_a_custom_rule_inside_a_scan_body_is_used_by_every_mode():
    f = lambda x: cnp.sum(lax.scan(lambda c, x: (c + _soft_clip(x), None), 0.0 * x[0], x)[0])
    x = np.linspace(-1, 1, 5)
    for g in (cv.grad(f), cv.jit(cv.grad(f)), cv.grad(cv.jit(f))):
        _close(g(x), np.full(5, 0.25))
    _close(cv.jvp(f, (x,), (np.ones(5),))[1], 1.25)


def test_a_checkpointed_scan_body_recomputes_and_agrees():
    body = cv.checkpoint(lambda c, x: (cnp.sin(c) * x + c, cnp.cos(c)))
    f = lambda x: cnp.sum(lax.scan(body, x[0], x)[1])
    g = lambda x: cnp.sum(lax.scan(lambda c, x: (cnp.sin(c) * x + c, cnp.cos(c)), x[0], x)[1])
    x = np.linspace(0.1, 1, 6)
    _close(cv.grad(f)(x), cv.grad(g)(x))
    _close(cv.jit(cv.grad(f))(x), cv.grad(g)(x))
    _close(cv.grad(cv.checkpoint(g))(x), cv.grad(g)(x))


def test_control_flow_inside_a_cond_branch_and_a_scan_inside_a_scan():
    def inner(c, x):
        return lax.cond(x > 0, lambda c: c * x, lambda c: c - x, c), c

    def outer(c, xs):
        c, ys = lax.scan(inner, c, xs)
        return c, cnp.sum(ys)

    f = lambda c, xss: lax.scan(outer, c, xss)
    xss = _rng(5).standard_normal((3, 4))

    def ref(c, xss):
        ys = []
        for xs in xss:
            s = 0.0
            for x in xs:
                s += c
                c = c * x if x > 0 else c - x
            ys.append(s)
        return c, np.array(ys)

    got, want = f(1.5, xss), ref(1.5, xss)
    _close(got[0], want[0])
    _close(got[1], want[1])
    check_grads(lambda c, xss: f(c, xss)[1], (np.float64(1.5), xss), order=1)


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, match", [
    (lambda: lax.cond(True, lambda x: x, lambda x: (x, x), 1.0),
     r"cond\(<lambda>, <lambda>\): true_fun \(<lambda>\) returns structure .* but false_fun"),
    (lambda: lax.cond(True, lambda x: x, lambda x: x[:2], np.ones(3)),
     r"true_fun \(<lambda>\) returns output as float64\[3\], but false_fun \(<lambda>\) returns float64\[2\]"),
    (lambda: lax.switch(0, [lambda x: x, lambda x: {"a": x}], 1.0), r"switch\(<lambda>, <lambda>\): branch 1 \(<lambda>\)"),
    (lambda: lax.cond(np.ones(2) > 0, lambda x: x, lambda x: x, 1.0), r"pred must be a scalar \(a boolean or a number\), got bool\[2\]"),
    (lambda: lax.scan(lambda c, x: (c[:1], x), np.ones(2), np.ones((3, 2))),
     r"scan\(<lambda>\): f returned the carry as float64\[1\], but the carry entering it is float64\[2\]"),
    (lambda: lax.scan(lambda c, x: ({"a": c["a"].astype(np.float32)}, x), {"a": np.ones(2)}, np.ones(3)),
     r"returned the carry\['a'\] as float32\[2\], but the carry entering it is float64\[2\]"),
    (lambda: lax.scan(lambda c, x: c, 0.0, np.ones(3)), r"f must return a pair \(carry, y\)"),
    (lambda: lax.scan(lambda c, x: ((c, c), x), 0.0, np.ones(3)), r"f returned a carry of structure"),
    (lambda: lax.scan(lambda c, x: (c, x), 0.0, (np.ones(3), np.ones(4))), r"xs\[1\] has 4 entries .* xs\[0\] has 3"),
    (lambda: lax.scan(lambda c, x: (c, x), 0.0, None), r"xs is None .* length must be given"),
    (lambda: lax.scan(lambda c, x: (c, x), 0.0, np.ones(3), length=4), r"xs has 3 entries .* but length 4"),
    (lambda: lax.while_loop(lambda c: c, lambda c: c + 1.0, 0.0), r"cond_fun must return a boolean scalar, got float64\[\]"),
    (lambda: lax.while_loop(lambda c: c < 3, lambda c: (c, c), 0), r"body_fun returned structure"),
    (lambda: lax.scan(lambda c, x: (c, x), "a", np.ones(3)), r"init is a str"),
    (lambda: lax.switch(1.5, [lambda x: x], 1.0), r"Index type must be an integer, got float64\[\]"),
])
def test_bad_control_flow_gets_an_error_naming_the_function_and_the_leaf(call, match):
    with pytest.raises(ControlFlowError, match=match):
        call()


_STAGED = r"(staged|have no values|has none).*use cuvmap.numpy.where to choose per element, or lax.cond"


@pytest.mark.parametrize("call, match", [
    (lambda: lax.scan(lambda c, x: (c if c > 0 else -c, x), 1.0, np.ones(3)),
     r"scan\(<lambda>\): the truth value .* that depends on the carry: the body of a scan"),
    (lambda: lax.scan(lambda c, x: ({"a": c["a"] * float(x)}, x), {"a": 1.0}, np.ones(3)),
     r"scan\(<lambda>\): float\(\) of a traced value .* that depends on xs: the body of a scan"),
    (lambda: cv.jit(lambda xs: lax.scan(lambda c, x: (c + 1.0 if x > 0 else c, x), 0.0, xs))(np.ones(3)),
     r"scan\(<lambda>\): the truth value .* that depends on xs: the body of a scan"),
    (lambda: lax.fori_loop(0, 3, lambda i, x: x if x > 0 else -x, 1.0),
     r"scan\(<lambda>\): the truth value .* that depends on the carry\[1\]: the body of a scan \(fori_loop"),
    (lambda: lax.while_loop(lambda c: c < 3 if c else False, lambda c: c + 1, 1),
     r"while_loop\(<lambda>, <lambda>\): the truth value .* the loop's value: cond_fun and body_fun of a while_loop"),
    (lambda: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + int(c[1]), c[1]), (0, 1)),
     r"int\(\) of a traced value .* that depends on the loop's value\[1\]: cond_fun and body_fun"),
    (lambda: lax.cond(True, lambda x, y: x if y > 0 else -x, lambda x, y: x, 1.0, 2.0),
     r"cond\(<lambda>, <lambda>\): the truth value .* that depends on operand 1: the branches of a cond"),
    (lambda: cv.vmap(lambda x: lax.switch(0, [lambda x: x if x.sum() > 0 else x], x))(np.ones((2, 3))),
     r"switch\(<lambda>\): the truth value .*: the branches of a cond \(or switch\)"),
], ids=["scan if", "scan float", "scan in jit", "fori_loop", "while cond_fun", "while int", "cond", "switch in vmap"])
def test_python_control_flow_in_a_staged_body_names_the_stager(call, match):
    """A Python if (or float(), int()) on a value of a scan, while_loop or cond body says
    that the body is staged and what to use instead; not the advice for jit's arguments
    (static_argnums), which the user did not write (NOTE [who staged a value])."""
    with pytest.raises(cv.ConcretizationError) as info:
        call()
    message = str(info.value)
    assert re.search(match, message), message
    assert re.search(_STAGED, message), message
    assert "static_arg" not in message and "under jit" not in message, message


def test_reverse_mode_of_a_while_loop_raises_and_points_to_scan():
    f = lambda x: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1]
    with pytest.raises(ControlFlowError, match=r"grad\(<lambda>\): Reverse-mode .* while_loop .* scan, or fori_loop"):
        cv.grad(f)(1.0)
    _close(cv.jvp(f, (1.0,), (1.0,))[1], 8.0)  # forward mode works
    # fori_loop with Python int bounds is a scan: reverse mode works
    _close(cv.grad(lambda x: lax.fori_loop(0, 3, lambda i, x: x * 2.0, x))(1.0), 8.0)


# ---------------------------------------------------------------------------------------
# Results, threads
# ---------------------------------------------------------------------------------------


def test_results_never_alias_the_inputs():
    c = np.ones(3)
    out, ys = lax.scan(lambda c, x: (c, x), c, np.ones((2, 3)))
    out += 1
    assert np.all(c == 1)
    x = np.ones(2)
    y = lax.cond(True, lambda x: x, lambda x: x * 2.0, x)
    y += 1
    assert np.all(x == 1)


def test_scans_in_two_threads_at_once():
    results, errors = {}, []

    def work(k):
        try:
            xs = _xs(seed=k, batch=3)
            results[k] = cv.vmap(cv.grad(_rnn_scan), in_axes=(None, 0))(_params(), xs)["w"]
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in range(2):
        _close(results[k], cv.vmap(cv.grad(_rnn_unrolled), in_axes=(None, 0))(_params(), _xs(seed=k, batch=3))["w"])


# ---------------------------------------------------------------------------------------
# A property test: random scan bodies against the unrolled loop
# ---------------------------------------------------------------------------------------

UNARY = [cnp.sin, cnp.tanh, lambda v: v * 0.5, lambda v: -v]
BINARY = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b, lambda a, b: a * 0.3 + b]


@settings(max_examples=40, deadline=None)
@given(spec=programs(len(UNARY), len(BINARY), num_inputs=2, max_steps=8))
def test_random_scan_bodies_equal_the_unrolled_loop(spec):
    body = program_fun(spec, UNARY, BINARY)

    def step(c, x):
        values = body(c, x)
        return cnp.tanh(values[0]), values[-1]

    def scanned(c, xs):
        c, ys = lax.scan(step, c, xs)
        return cnp.sum(c) + cnp.sum(ys * ys)

    def unrolled(c, xs):
        total = 0.0
        for t in range(xs.shape[0]):
            c, y = step(c, xs[t])
            total = total + cnp.sum(y * y)
        return cnp.sum(c) + total

    rng = _rng(7)
    c, xs = rng.standard_normal(3), rng.standard_normal((4, 3))
    _close(scanned(c, xs), unrolled(c, xs), 1e-12)
    for a, b in zip(cv.grad(scanned, argnums=(0, 1))(c, xs), cv.grad(unrolled, argnums=(0, 1))(c, xs)):
        _close(a, b, 1e-12)
    cs = rng.standard_normal((2, 3))
    _close(cv.vmap(cv.grad(scanned), in_axes=(0, None))(cs, xs), cv.vmap(cv.grad(unrolled), in_axes=(0, None))(cs, xs))


# ---------------------------------------------------------------------------------------
# while_loop(max_steps=): reverse mode through a bounded loop (NOTE [a bounded while loop])
# ---------------------------------------------------------------------------------------

def _newton_sqrt(a):
    return lax.while_loop(lambda x: cnp.abs(x * x - a) > 1e-12, lambda x: (x + a / x) / 2, a, max_steps=60)


def _fixed_point(a):  # x = a cos(x), to a tolerance
    def body(c):
        x, _ = c
        return a * cnp.cos(x), x
    return lax.while_loop(lambda c: cnp.abs(c[0] - c[1]) > 1e-13, body, (a, a + 1.0), max_steps=500)[0]


def _ode(k):  # dy/dt = -k y by Euler steps of dt = 0.01 until t >= 1
    def body(c):
        t, y = c
        return t + 0.01, y - 0.01 * k * y
    return lax.while_loop(lambda c: c[0] < 1.0 - 1e-9, body, (0.0, 1.0 + 0.0 * k), max_steps=1000)[1]


def _capped(a):  # the predicate never fails: max_steps decides
    return lax.while_loop(lambda x: x > -1.0, lambda x: cnp.sin(x) * 0.9 + a, a, max_steps=37)


def _python_loop(cond_fun, body_fun, val, max_steps):
    """The same loop in Python: under grad its values are concrete, so Python control flow runs."""
    for _ in range(max_steps):
        if not bool(cond_fun(val)):
            break
        val = body_fun(val)
    return val


# name: (the bounded loop, the same iterations as a Python loop, the point)
BOUNDED_WHILE = {
    "newton": (_newton_sqrt, lambda a: _python_loop(lambda x: cnp.abs(x * x - a) > 1e-12,
                                                    lambda x: (x + a / x) / 2, a, 60), 2.0),
    "fixed point": (_fixed_point, lambda a: _python_loop(lambda c: cnp.abs(c[0] - c[1]) > 1e-13,
                                                         lambda c: (a * cnp.cos(c[0]), c[0]), (a, a + 1.0), 500)[0], 0.7),
    "ode with a tolerance": (_ode, lambda k: _python_loop(lambda c: c[0] < 1.0 - 1e-9,
                                                          lambda c: (c[0] + 0.01, c[1] - 0.01 * k * c[1]),
                                                          (0.0, 1.0 + 0.0 * k), 1000)[1], 1.3),
    "capped by max_steps": (_capped, lambda a: _python_loop(lambda x: x > -1.0, lambda x: cnp.sin(x) * 0.9 + a,
                                                            a, 37), 0.3),
}


@pytest.mark.parametrize("name", BOUNDED_WHILE)
@pytest.mark.parametrize("transform", ["eager", "jit"])
def test_grad_of_a_bounded_while_loop_is_the_python_loops(name, transform):
    loop, reference, x = BOUNDED_WHILE[name]
    run = (lambda f: f) if transform == "eager" else cv.jit
    np.testing.assert_allclose(run(loop)(x), reference(x), rtol=1e-13)
    np.testing.assert_allclose(run(cv.grad(loop))(x), cv.grad(reference)(x), rtol=1e-10, atol=1e-12)


def test_a_bounded_while_loop_under_vmap_stops_each_example_at_its_count():
    a = np.array([2.0, 9.0, 1e6, 0.25])
    np.testing.assert_allclose(cv.vmap(_newton_sqrt)(a), np.sqrt(a), rtol=1e-14)
    want = [float(cv.grad(BOUNDED_WHILE["newton"][1])(v)) for v in a]
    np.testing.assert_allclose(cv.vmap(cv.grad(_newton_sqrt))(a), want, rtol=1e-10)
    np.testing.assert_allclose(want, 0.5 / np.sqrt(a), rtol=1e-8)


@pytest.mark.slow
def test_a_bounded_while_loop_keeps_about_two_root_n_carries():
    """N = 2,500 steps of a 32 KB carry: reverse mode over all of them would keep 80 MB;
    the checkpointed loop keeps ~2√N = 100 carries (3.2 MB) and the body's own."""
    w = np.linspace(0.5, 1.0, 4000)

    def f(x):
        y = lax.while_loop(lambda v: cnp.sum(v) > -1e300, lambda v: cnp.sin(v) * w + 0.01, x, max_steps=2500)
        return cnp.sum(y)

    x = np.linspace(0, 1, 4000)
    cv.grad(f)(x)  # the first call stages and plans
    tracemalloc.start()
    cv.grad(f)(x)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3 * 2 * 50 * w.nbytes, peak / 1e6


@pytest.mark.parametrize("max_steps, message", [(-1, "max_steps must be a non-negative Python int"),
                                                 (2.5, "max_steps must be a non-negative Python int")])
def test_bounded_while_loop_errors(max_steps, message):
    with pytest.raises(ControlFlowError, match=message):
        lax.while_loop(lambda x: x < 3, lambda x: x + 1, 0, max_steps=max_steps)


def test_an_unbounded_while_loop_names_max_steps_in_its_reverse_mode_error():
    with pytest.raises(ControlFlowError, match=r"while_loop\(cond_fun, body_fun, init_val, max_steps=N\)"):
        cv.grad(lambda a: lax.while_loop(lambda x: x < 10, lambda x: x * 2, a))(1.0)
    assert lax.while_loop(lambda x: x < 10, lambda x: x * 2, 1.0, max_steps=0) == 1.0
