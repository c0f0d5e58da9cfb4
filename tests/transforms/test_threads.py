"""Transforms in several threads (NOTE [one stack per thread] in ``cuvmap/core/tracers.py``).

- deterministic: two threads interleaved with events at the moments that broke a
  process-global stack (another thread's transform returning while this one is open);
- a tracer used in another thread raises a clear error;
- stress: many threads running nested grad/vmap/jvp, against single-threaded results.
"""
import sys
import threading

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap.core import CrossThreadTracerError

TIMEOUT = 10


def run_threads(*targets):
    """Runs each target in its own thread; returns their results, re-raising errors."""
    results = [None] * len(targets)
    errors = []

    def wrap(i, target):
        try:
            results[i] = target()
        except BaseException as err:  # noqa: BLE001 - reported to the test below
            errors.append(err)

    threads = [threading.Thread(target=wrap, args=(i, t)) for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive(), "a thread did not finish (deadlock?)"
    if errors:
        raise errors[0]
    return results


def test_nested_grad_while_another_threads_transform_returns():
    # B enters a grad, then A enters its outer grad, then B's grad returns, then A runs its
    # inner grad. With one global stack, B's return popped A's main and A's inner grad got
    # the outer one's level: d/dx [x · d/dy (x·y)] = d/dx x² came out 0 instead of 6.
    b_in, a_in, b_done = threading.Event(), threading.Event(), threading.Event()

    def b_loss(x):
        b_in.set()
        assert a_in.wait(TIMEOUT)
        return x * 2.0

    def thread_b():
        out = cv.grad(b_loss)(1.0)
        b_done.set()
        return out

    def a_outer(x):
        a_in.set()
        assert b_done.wait(TIMEOUT)
        return x * cv.grad(lambda y: x * y)(1.0)

    def thread_a():
        assert b_in.wait(TIMEOUT)
        return cv.grad(a_outer)(3.0)

    got_a, got_b = run_threads(thread_a, thread_b)
    assert float(got_a) == 6.0
    assert float(got_b) == 2.0


def test_vmap_inside_grad_while_another_thread_nests_and_returns():
    # the same interleaving with vmap and jvp: A's vmap(grad) must keep its levels apart
    # while B opens and closes a jvp in between
    a_in, b_done = threading.Event(), threading.Event()
    xs = np.linspace(0.5, 2.0, 4)

    def a_fun(x):
        a_in.set()
        assert b_done.wait(TIMEOUT)
        return x * cv.grad(lambda y: x * y ** 2)(x)   # x · 2x² = 2x³

    def thread_a():
        return cv.vmap(cv.grad(a_fun))(xs)

    def thread_b():
        assert a_in.wait(TIMEOUT)
        out = cv.jvp(cnp.sin, (1.0,), (1.0,))
        b_done.set()
        return out

    got_a, (_, tangent) = run_threads(thread_a, thread_b)
    np.testing.assert_allclose(got_a, 6 * xs ** 2, rtol=1e-12)
    np.testing.assert_allclose(tangent, np.cos(1.0), rtol=1e-12)


def test_a_tracer_used_in_another_thread_raises():
    seen = []

    def loss(x):
        def other():
            return x * 2.0

        with pytest.raises(CrossThreadTracerError, match="another thread"):
            run_threads(other)
        seen.append(True)
        return x * 3.0

    assert float(cv.grad(loss)(1.0)) == 3.0
    assert seen == [True]


def test_a_batch_tracer_used_in_another_thread_raises():
    def f(x):
        with pytest.raises(CrossThreadTracerError, match=r"vmap\(f\)"):
            run_threads(lambda: cnp.sin(x))
        return x

    cv.vmap(f)(np.ones(3))


def _workload(seed):
    """Nested grad, vmap and jvp of a small function: a result to compare across threads."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((3, 2))
    xs = rng.standard_normal((5, 3))

    def loss(w, x):
        return cnp.sum(cnp.tanh(x @ w) ** 2)

    per_example = cv.vmap(cv.grad(loss), in_axes=(None, 0))(w, xs)
    hvp = cv.jvp(lambda w: cv.grad(loss)(w, xs[0]), (w,), (np.ones_like(w),))[1]
    second = cv.grad(lambda x: cv.grad(lambda y: cnp.sin(x * y))(x))(0.7)
    return per_example, hvp, second


def test_many_threads_agree_with_one():
    seeds = list(range(8))
    want = [_workload(s) for s in seeds]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # switch threads as often as possible
    try:
        for _ in range(3):
            got = run_threads(*[lambda s=s: _workload(s) for s in seeds])
            for g, w in zip(got, want):
                for a, b in zip(g, w):
                    np.testing.assert_array_equal(a, b)
    finally:
        sys.setswitchinterval(old)
