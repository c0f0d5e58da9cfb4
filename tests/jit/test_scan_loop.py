"""A scan runs its body as one generated loop (NOTE [a loop runs as generated Python] in
cuvmap/transforms/loop_plans.py), a while loop its predicate and body in one loop: a
scan's results equal, bit for bit, those of the same steps
unrolled into one jitted program (a table of bodies: several carries passed around,
constants and numbers as carries, ys that are carries or xs, integers, reverse, unroll,
lengths 0 and 1); the ys a ufunc computes are written into their rows and a constant
right operand of a product is transposed once; a while loop equals the Python loop
(a table); staging time does not grow with the
length; a step costs about what its NumPy calls cost (a ratio to the same forward and
backward passes written by hand as NumPy loops, measured in the test).
References: the unrolled loop under jit, hand-written NumPy loops."""
import time

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax
from cuvmap.transforms import executor, loop_plans


def _rng(seed=0):
    return np.random.default_rng(seed)


W = _rng(1).standard_normal((4, 4)) * 0.4
U = _rng(2).standard_normal((4, 4)) * 0.4


def _rnn(h, x):
    h = cnp.tanh(h @ W + x @ U)
    return h, h


def _rnn32(h, x):
    h = cnp.tanh(h @ W.astype(np.float32) + x @ U.astype(np.float32))
    return h, h


def _swap(c, x):
    a, b = c
    return (b, a * 0.5 + x), a * b


def _constant_carry(c, x):
    return cnp.asarray(W[0]), cnp.sin(c) * x


def _number_carry(c, x):
    return 2.0 + 0.0 * c, c * x


def _passthrough(c, x):
    return c + x, (c, x)


def _constant_y(c, x):
    return c + x, (np.float64(1.5), c)


def _counter(c, x):
    i, v = c
    return (i + 1, v * x + i), i


def _scalar(c, x):
    return c * 0.9 + cnp.sum(x), c * c


# (name, body, initial carry, xs, scan keywords)
CASES = [
    ("rnn", _rnn, np.zeros((3, 4)), _rng(3).standard_normal((7, 3, 4)), {}),
    ("rnn_float32", _rnn32, np.zeros((3, 4), np.float32), _rng(3).standard_normal((7, 3, 4)).astype(np.float32), {}),
    ("rnn_reverse_unroll_3", _rnn, np.zeros((3, 4)), _rng(4).standard_normal((7, 3, 4)), dict(reverse=True, unroll=3)),
    ("two_carries_swapped", _swap, (np.ones(4), np.zeros(4)), _rng(5).standard_normal((6, 4)), {}),
    ("a_constant_as_carry", _constant_carry, np.ones(4), _rng(6).standard_normal((5, 4)), {}),
    ("a_number_as_carry", _number_carry, np.ones(4), _rng(7).standard_normal((5, 4)), {}),
    ("ys_are_the_carry_and_x", _passthrough, np.zeros(4), _rng(8).standard_normal((5, 4)), dict(reverse=True)),
    ("a_constant_as_y", _constant_y, np.zeros(3), _rng(18).standard_normal((4, 3)), {}),
    ("an_integer_counter", _counter, (np.int64(0), np.ones(4)), _rng(9).standard_normal((5, 4)), {}),
    ("scalar_carry_and_ys", _scalar, np.float64(0.5), _rng(10).standard_normal((6, 3)), dict(unroll=True)),
    ("length_1", _rnn, np.zeros((3, 4)), _rng(11).standard_normal((1, 3, 4)), {}),
    ("length_0", _rnn, np.zeros((3, 4)), np.zeros((0, 3, 4)), {}),
]


def _unrolled(body, init, xs, reverse=False, unroll=1):
    """scan(body, init, xs) as a Python loop (``unroll`` changes nothing)."""
    carry, ys = init, []
    order = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
    for t in order:
        carry, y = body(carry, xs[t])
        ys.append(y)
    if reverse:
        ys = ys[::-1]
    return carry, cv.tree.map(lambda *rows: cnp.stack(rows), *ys)


def _loss(result):
    leaves = [x for x in cv.tree.leaves(result) if np.dtype(x.dtype).kind == "f"]
    return sum(cnp.sum(x * x) for x in leaves)


def _exactly(a, b):
    for x, y in zip(cv.tree.leaves(a), cv.tree.leaves(b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name,body,init,xs,kw", CASES, ids=[c[0] for c in CASES])
def test_a_jitted_scan_equals_the_unrolled_loop_bit_for_bit(name, body, init, xs, kw):
    got = cv.jit(lambda c, xs: lax.scan(body, c, xs, **kw))(init, xs)
    if xs.shape[0] == 0:
        _exactly(got[0], init)
        assert all(y.shape[0] == 0 for y in cv.tree.leaves(got[1]))
        return
    want = cv.jit(lambda c, xs: _unrolled(body, c, xs, **kw))(init, xs)
    _exactly(got, want)
    # and reverse mode: the backward scan against the unrolled program's backward pass
    if name in ("a_constant_as_carry", "a_number_as_carry", "an_integer_counter"):
        argnums = 1
    else:
        argnums = (0, 1)
    g_scan = cv.jit(cv.grad(lambda c, xs: _loss(lax.scan(body, c, xs, **kw)), argnums=argnums))(init, xs)
    g_unrolled = cv.jit(cv.grad(lambda c, xs: _loss(_unrolled(body, c, xs, **kw)), argnums=argnums))(init, xs)
    _exactly(g_scan, g_unrolled)


def test_eager_and_jitted_scans_agree_with_the_unrolled_loop_under_vmap():
    xs = _rng(12).standard_normal((5, 2, 3, 4))
    f = lambda xs: cv.grad(lambda xs: _loss(lax.scan(_rnn, np.zeros((3, 4)), xs)))(xs)
    g = lambda xs: cv.grad(lambda xs: _loss(_unrolled(_rnn, np.zeros((3, 4)), xs)))(xs)
    want = cv.vmap(g, in_axes=1, out_axes=1)(xs)
    np.testing.assert_allclose(cv.vmap(f, in_axes=1, out_axes=1)(xs), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cv.jit(cv.vmap(f, in_axes=1, out_axes=1))(xs), want, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------
# The generated loop
# ---------------------------------------------------------------------------------------


def _loop_sources(f, *args):
    """The sources of the loops that running ``jit(f)(*args)`` compiles."""
    sources = []
    originals = {name: getattr(loop_plans, name) for name in ("_scan_source", "_while_source")}

    def spy(original):
        def generate(*a):
            source, namespace = original(*a)
            sources.append(source)
            return source, namespace
        return generate

    try:
        for name, original in originals.items():
            setattr(loop_plans, name, spy(original))
        cv.jit(f)(*args)
    finally:
        for name, original in originals.items():
            setattr(loop_plans, name, original)
    return sources


def test_the_loop_writes_ufunc_ys_into_their_rows_and_transposes_a_constant_once():
    w = np.asarray(W, np.float32)
    xs = _rng(13).standard_normal((6, 3, 4)).astype(np.float32)

    def loss(w, xs):
        h, _ = lax.scan(lambda h, x: (cnp.tanh(h @ w + x), None), np.zeros((3, 4), np.float32), xs)
        return cnp.sum(h * h)

    forward, backward = _loop_sources(cv.grad(loss), w, xs)
    assert "for i in indices:" in forward and "out=Y0[i]" in forward, forward  # the residual 1 - h²
    assert "Y1[i] = r" in forward  # the carry the backward pass reads: copied into its row
    # ct @ w.T with w a constant of the backward body: transposed once, before the loop
    head, body = backward.split("for i in indices:")
    assert "q" in head and "PR" in head and "PR" not in body, backward


def test_a_scan_in_a_scan_and_a_while_in_a_scan_equal_their_unrolled_loops():
    def inner(scan):
        def body(c, x):
            c2, ys = scan(lambda a, b: (a * 0.5 + b, a), c, x)
            return c2, cnp.sum(ys, axis=0)
        return body

    xs = _rng(14).standard_normal((4, 3, 2))
    _exactly(cv.jit(lambda xs: lax.scan(inner(lax.scan), np.zeros(2), xs))(xs),
             cv.jit(lambda xs: _unrolled(inner(_unrolled), np.zeros(2), xs))(xs))
    halve = lambda c, x: (lax.while_loop(lambda v: cnp.max(v) > 1.0, lambda v: v * 0.5, c + x), c)
    _exactly(cv.jit(lambda xs: lax.scan(halve, np.zeros(2), xs))(xs[:, 0] * 4.0),
             cv.jit(lambda xs: _unrolled(halve, np.zeros(2), xs))(xs[:, 0] * 4.0))


# ---------------------------------------------------------------------------------------
# while_loop: the predicate's and the body's code in one loop
# ---------------------------------------------------------------------------------------

T = np.array([0.5, 2.0, 1.5])

# (name, cond_fun, body_fun, initial value)
WHILE_CASES = [
    ("consts_in_both", lambda v: cnp.max(v) > T[0] * 2.0, lambda v: v * T[1] * 0.25, np.array([4.0, 3.0, 9.0])),
    ("two_carries_swapped", lambda c: c[0] < 40.0, lambda c: (c[1] + 1.0, c[0] * 2.0), (np.float64(1.0), np.float64(0.0))),
    ("no_iteration", lambda v: cnp.sum(v) < 0.0, lambda v: v * 2.0, np.ones(3)),
    ("integer_counter", lambda c: c[0] < 7, lambda c: (c[0] + 1, cnp.sin(c[1]) + c[0]), (0, np.zeros(3))),
]


def _python_while(cond_fun, body_fun, value):
    while bool(cond_fun(value)):
        value = body_fun(value)
    return value


@pytest.mark.parametrize("name,cond_fun,body_fun,init", WHILE_CASES, ids=[c[0] for c in WHILE_CASES])
def test_a_while_loop_equals_the_python_loop_bit_for_bit(name, cond_fun, body_fun, init):
    got = cv.jit(lambda v: lax.while_loop(cond_fun, body_fun, v))(init)
    _exactly(got, cv.tree.map(np.asarray, _python_while(cond_fun, body_fun, init)))


def test_fori_loop_with_a_traced_bound_equals_the_python_loop_under_jit_and_vmap():
    f = lambda n, v: lax.fori_loop(0, n, lambda i, v: v * 0.5 + i, v)
    _exactly(cv.jit(f)(np.int64(5), np.ones(3)), _python_fori(5, np.ones(3)))
    got = cv.jit(cv.vmap(f, in_axes=(0, None)))(np.array([0, 3, 6]), np.ones(3))
    _exactly(got, np.stack([_python_fori(k, np.ones(3)) for k in (0, 3, 6)]))


def _python_fori(n, v):
    for i in range(n):
        v = v * 0.5 + i
    return v


def test_a_while_loop_runs_one_generated_loop():
    (source,) = _loop_sources(lambda v, t: lax.while_loop(lambda v: cnp.max(v) > t, lambda v: v * 0.5, v),
                              np.array([4.0, 3.0]), 1.0)
    assert "while True:" in source and "a_r" in source and "break" in source, source
    assert "program(" not in source  # neither plan's function is called


# ---------------------------------------------------------------------------------------
# Staging time and run time
# ---------------------------------------------------------------------------------------


def _min_seconds(fns, rounds):
    """The least time of each function over ``rounds`` interleaved rounds."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def test_staging_a_scan_takes_the_same_time_whatever_its_length():
    """grad of a scan over 10 and over 100 000 steps stages in about the same time (the
    body is traced once, the length is a number in the params)."""
    w = np.asarray(W)

    def loss(w, xs):
        return cnp.sum(lax.scan(lambda h, x: (cnp.tanh(h @ w + x), h), np.zeros((3, 4)), xs)[1])

    short, long = np.zeros((10, 3, 4)), np.zeros((100_000, 3, 4))
    stage = lambda xs: lambda: cv.make_jaxpr(cv.grad(loss))(w, xs)
    t_short, t_long = _min_seconds([stage(short), stage(long)], rounds=7)
    assert t_long < 2.0 * t_short + 2e-3, (t_short, t_long)


def _numpy_rnn_grad(w, u, h0, xs):
    """The gradient of sum(h_T²) for h_t = tanh(h_{t-1} @ w + x_t @ u) with respect to w
    and u, by hand: a forward loop keeping every h_t, a backward loop."""
    n = xs.shape[0]
    hs = np.empty((n + 1,) + h0.shape, h0.dtype)
    hs[0] = h = h0
    for t in range(n):
        h = np.tanh(h @ w + xs[t] @ u)
        hs[t + 1] = h
    dh, dw, du = 2 * h, np.zeros_like(w), np.zeros_like(u)
    for t in range(n - 1, -1, -1):
        ds = dh * (1 - hs[t + 1] * hs[t + 1])
        dw += hs[t].T @ ds
        du += xs[t].T @ ds
        dh = ds @ w.T
    return dw, du


def _numpy_tiny_grad(a, c0, xs):
    n = xs.shape[0]
    cs = np.empty((n + 1,) + c0.shape, c0.dtype)
    cs[0] = c = c0
    for t in range(n):
        c = np.tanh(c * a + xs[t])
        cs[t + 1] = c
    dc, da = 2 * c, np.zeros_like(a)
    for t in range(n - 1, -1, -1):
        ds = dc * (1 - cs[t + 1] * cs[t + 1])
        da += ds * cs[t]
        dc = ds * a
    return da


def test_a_step_costs_about_what_its_numpy_calls_cost():
    """jit(grad) of a scan against the same forward and backward passes written by hand as
    NumPy loops, interleaved, least of several runs: an RNN cell (GEMMs) and a tiny carry
    (only the interpreter's own work beside a few ufuncs). The targets of
    ``python -m benchmarks control_flow`` are 1.5× JAX and 3× the NumPy loop; the bounds
    here are looser, for a shared machine."""
    rng = _rng(15)
    n = 100  # short runs, many rounds: on a loaded machine the least of them is rarely preempted
    w, u = [(rng.standard_normal((32, 32)) / 6).astype(np.float32) for _ in range(2)]
    h0 = np.zeros((16, 32), np.float32)
    xs = rng.standard_normal((n, 16, 32)).astype(np.float32)

    def rnn_loss(w, u, h0, xs):
        h, _ = lax.scan(lambda h, x: (cnp.tanh(h @ w + x @ u), None), h0, xs)
        return cnp.sum(h * h)

    a = rng.uniform(0.5, 1.0, 8).astype(np.float32)
    c0 = np.zeros(8, np.float32)
    txs = rng.standard_normal((n, 8)).astype(np.float32)

    def tiny_loss(a, c0, xs):
        c, _ = lax.scan(lambda c, x: (cnp.tanh(c * a + x), None), c0, xs)
        return cnp.sum(c * c)

    rnn = cv.jit(cv.grad(rnn_loss, argnums=(0, 1)))
    tiny = cv.jit(cv.grad(tiny_loss))
    # a while loop (fori_loop with a traced bound): its counter and predicate are work of
    # their own, a comparison and an addition per step beside the body's ufuncs
    counted = cv.jit(lambda a, c, n: lax.fori_loop(0, n, lambda i, c: cnp.tanh(c * a + 1.0), c))

    def numpy_counted(a, c, n):
        i = np.int64(0)
        while i < n:
            c = np.tanh(c * a + 1.0)
            i = i + 1
        return c

    np.testing.assert_allclose(counted(a, c0, n), numpy_counted(a, c0, n), rtol=1e-6)
    for got, want in zip(rnn(w, u, h0, xs), _numpy_rnn_grad(w, u, h0, xs)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(tiny(a, c0, txs), _numpy_tiny_grad(a, c0, txs), rtol=1e-4, atol=1e-6)
    times = _min_seconds([lambda: rnn(w, u, h0, xs), lambda: _numpy_rnn_grad(w, u, h0, xs),
                          lambda: tiny(a, c0, txs), lambda: _numpy_tiny_grad(a, c0, txs),
                          lambda: counted(a, c0, n), lambda: numpy_counted(a, c0, n)], rounds=15)
    assert times[0] < 2.5 * times[1], f"RNN: {times[0] / n * 1e6:.1f} µs a step, NumPy {times[1] / n * 1e6:.1f}"
    assert times[2] < 4.0 * times[3], f"tiny carry: {times[2] / n * 1e6:.1f} µs a step, NumPy {times[3] / n * 1e6:.1f}"
    assert times[4] < 4.0 * times[5], f"while: {times[4] / n * 1e6:.1f} µs a step, NumPy {times[5] / n * 1e6:.1f}"


def test_eager_grad_of_a_scan_compiles_its_plans_once():
    """Eager grad stages the body and plans its forward and backward loops at every call;
    their generated code is compiled once (NOTE [generated code is compiled once per
    text] in cuvmap/transforms/executor/codegen.py)."""
    xs = _rng(16).standard_normal((5, 3, 4))
    g = cv.grad(lambda xs: _loss(lax.scan(_rnn, np.zeros((3, 4)), xs)))
    first = g(xs)
    misses = executor.codegen._code_cache.misses
    for _ in range(3):
        np.testing.assert_array_equal(g(xs), first)
    assert executor.codegen._code_cache.misses == misses


def test_the_loop_runs_on_either_device(backend):
    """On the GPU (the strict CuPy stand-in without one) the loop slices, writes rows with
    ``out=`` and transposes its constant as on the CPU: the same results as NumPy."""
    w, u = np.asarray(W, np.float32), np.asarray(U, np.float32)
    h0 = np.zeros((3, 4), np.float32)
    xs = _rng(17).standard_normal((6, 3, 4)).astype(np.float32)

    def loss(w, u, h0, xs):
        h, hs = lax.scan(lambda h, x: (cnp.tanh(h @ w + x @ u), h * 2.0), h0, xs, reverse=True)
        return cnp.sum(h * h) + cnp.sum(hs)

    want = cv.jit(cv.grad(loss, argnums=(0, 1)))(w, u, h0, xs)
    args = [cv.device_put(v, backend) for v in (w, u, h0, xs)]
    got = cv.jit(cv.grad(loss, argnums=(0, 1)))(*args)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(cv.device_put(g, "cpu")), r, rtol=1e-5, atol=1e-6)
