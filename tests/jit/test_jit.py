"""jit and make_jaxpr: staged programs equal eager evaluation, under every transform.

- every op-table row: ``jit(f)`` equals ``f``, and ``vmap``, ``grad`` and ``jvp`` nest with
  ``jit`` in both orders with the eager results;
- the cache: what traces again (shapes, dtypes, weak types, static values, structures);
- the user's side: static arguments, control flow on traced values, side effects,
  escaped tracers, closures, values made from nothing;
- the planner: outputs that alias, views, broadcasting, donated arguments, buffer reuse
  across calls, threads, and a property test of planned against unplanned execution;
- the examples' workloads (per-example gradients of the benchmark CNN, a DP-SGD step, an
  ensemble, jacobians) jitted against eager.
"""
import os
import pathlib
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
from hypothesis import given, settings

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import core, dp, lax, nn
from cuvmap.core import ConcretizationError, EscapedTracerError
from cuvmap.transforms import executor, ir

from op_table import ALL_ROWS, F64, NESTED_SAMPLE, closed_over_nondiff, weighted_sum
from random_programs import program_fun, programs


def assert_same(got, want, rtol=1e-12, atol=1e-12):
    got_leaves, got_tree = cv.tree.flatten(got)
    want_leaves, want_tree = cv.tree.flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind in "fc":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)


# ---------------------------------------------------------------------------------------
# Every op-table row
# ---------------------------------------------------------------------------------------

ROWS = [pytest.param(r, id=r.name) for r in ALL_ROWS]
DIFF_ROWS = [pytest.param(r, id=r.name) for r in ALL_ROWS
             if r.differentiable and r.diff_argnums and F64 in r.dtypes]
REV_ROWS = [p for p in DIFF_ROWS if "rev" in p.values[0].modes]


def _nested_sample_by_default(params):
    """The nestings with jit check every row in the full suite; -m "not slow" takes the op
    table's nested sample (NESTED_SAMPLE: rows of every family), the others are marked slow."""
    return [p if p.values[0].name in NESTED_SAMPLE else pytest.param(*p.values, id=p.id, marks=pytest.mark.slow)
            for p in params]


def _vmap_axes(row):
    return tuple(None if a.is_pyscalar else 0 for a in row.args)


def _batched_args(row, size=3):
    shapes = [a.shape if a.is_pyscalar else (size,) + tuple(a.shape) for a in row.args]
    return row.make_args(row.vmap_dtype, shapes, seed=4)


# every row in the full suite; -m "not slow" takes the nested sample (test_eager_jit_agree.py
# runs every row once under jit there)
@pytest.mark.parametrize("row", _nested_sample_by_default(ROWS))
def test_jit_equals_eager(row):
    args = row.make_args(row.vmap_dtype)
    jf = cv.jit(row.fun)
    assert_same(jf(*args), row.fun(*args))
    assert_same(jf(*args), row.fun(*args))  # the cached program, with its pooled buffers
    assert jf.trace_count == 1


def _on(backend, args):
    return tuple(cv.device_put(a, "gpu") if backend == "gpu" and isinstance(a, np.ndarray) else a for a in args)


def _to_host(tree_):
    return cv.device_put(tree_, "cpu")


# On the GPU (tools/gpu_checks.sh runs the gpu variants): the planned executor on CuPy
# arrays, its pool and in-place writes, and grad/vmap through jit, against eager CuPy.
GPU_SAMPLE = [pytest.param(r, id=r.name) for r in ALL_ROWS if r.name in set(NESTED_SAMPLE) and r.args]


@pytest.mark.parametrize("row", GPU_SAMPLE)
def test_jit_on_each_backend(row, backend, monkeypatch):
    monkeypatch.setattr(executor.buffers, "MIN_REUSE_BYTES", 0)
    args = _on(backend, row.make_args(row.vmap_dtype))
    jf = cv.jit(row.fun)
    want = _to_host(row.fun(*args))
    assert_same(_to_host(jf(*args)), want, 1e-6, 1e-6)
    assert_same(_to_host(jf(*args)), want, 1e-6, 1e-6)
    xs = _on(backend, _batched_args(row))
    axes = _vmap_axes(row)
    assert_same(_to_host(cv.vmap(cv.jit(row.fun), in_axes=axes)(*xs)),
                _to_host(cv.vmap(row.fun, in_axes=axes)(*xs)), 1e-6, 1e-6)


@pytest.mark.parametrize("row", _nested_sample_by_default([pytest.param(r, id=r.name) for r in ALL_ROWS if r.args]))
def test_vmap_and_jit_nest_both_ways(row):
    args = _batched_args(row)
    axes = _vmap_axes(row)
    want = cv.vmap(row.fun, in_axes=axes)(*args)
    assert_same(cv.vmap(cv.jit(row.fun), in_axes=axes)(*args), want)
    assert_same(cv.jit(cv.vmap(row.fun, in_axes=axes))(*args), want)


@pytest.mark.parametrize("row", _nested_sample_by_default(REV_ROWS))
def test_grad_and_jit_nest_both_ways(row):
    args = row.make_args(F64)
    weights = np.random.default_rng(row.seed("w")).standard_normal(np.shape(row.fun(*args)))
    f, diff = closed_over_nondiff(row, args, fun=weighted_sum(row.fun, weights))
    argnums = tuple(range(len(diff)))
    want = cv.grad(f, argnums=argnums)(*diff)
    assert_same(cv.grad(cv.jit(f), argnums=argnums)(*diff), want, 1e-10, 1e-10)
    assert_same(cv.jit(cv.grad(f, argnums=argnums))(*diff), want, 1e-10, 1e-10)


@pytest.mark.parametrize("row", _nested_sample_by_default(DIFF_ROWS))
def test_jvp_and_jit_nest_both_ways(row):
    args = row.make_args(F64)
    f, diff = closed_over_nondiff(row, args)
    rng = np.random.default_rng(row.seed("t"))
    tangents = tuple(rng.standard_normal(np.shape(d)).astype(np.asarray(d).dtype) if hasattr(d, "dtype")
                     else float(rng.standard_normal()) for d in diff)
    want = cv.jvp(f, diff, tangents)
    assert_same(cv.jvp(cv.jit(f), diff, tangents), want, 1e-10, 1e-10)
    assert_same(cv.jit(lambda *p: cv.jvp(f, p, tangents))(*diff), want, 1e-10, 1e-10)


# ---------------------------------------------------------------------------------------
# Compositions
# ---------------------------------------------------------------------------------------


def _f(x, y):
    return cnp.sum(cnp.sin(x) * y + cnp.exp(-x * x))


COMPOSITIONS = {
    "jit(vmap(grad))": lambda f: cv.jit(cv.vmap(cv.grad(f), in_axes=(0, None))),
    "vmap(jit(grad))": lambda f: cv.vmap(cv.jit(cv.grad(f)), in_axes=(0, None)),
    "vmap(grad(jit))": lambda f: cv.vmap(cv.grad(cv.jit(f)), in_axes=(0, None)),
    "jit(jit(vmap(grad)))": lambda f: cv.jit(cv.jit(cv.vmap(cv.grad(f), in_axes=(0, None)))),
}


@pytest.mark.parametrize("name", list(COMPOSITIONS))
def test_compositions_of_jit(name):
    xs = np.random.default_rng(0).standard_normal((4, 5))
    y = np.linspace(0.5, 1.5, 5)
    want = cv.vmap(cv.grad(_f), in_axes=(0, None))(xs, y)
    assert_same(COMPOSITIONS[name](_f)(xs, y), want, 1e-12, 1e-12)


def test_higher_order_derivatives_through_jit():
    f = lambda x: cnp.sum(cnp.sin(x) * x ** 3)  # noqa: E731
    x = np.linspace(-1, 1, 4)
    assert_same(cv.grad(lambda x: cnp.sum(cv.grad(cv.jit(f))(x)))(x),
                cv.grad(lambda x: cnp.sum(cv.grad(f)(x)))(x), 1e-12, 1e-12)
    assert_same(cv.jacrev(cv.jit(cnp.tanh))(x), cv.jacrev(cnp.tanh)(x))
    assert_same(cv.hessian(cv.jit(f))(x), cv.hessian(f)(x), 1e-12, 1e-12)
    assert_same(cv.jit(cv.hessian(f))(x), cv.hessian(f)(x), 1e-12, 1e-12)


def test_jit_inside_a_function_that_is_vmapped_and_differentiated():
    inner = cv.jit(lambda w, x: cnp.tanh(x @ w))

    def loss(w, x):
        return cnp.sum(inner(w, x) ** 2)

    w = np.random.default_rng(1).standard_normal((3, 2))
    xs = np.random.default_rng(2).standard_normal((5, 3))
    want = np.stack([cv.grad(loss)(w, x) for x in xs])
    assert_same(cv.vmap(cv.grad(loss), in_axes=(None, 0))(w, xs), want, 1e-12, 1e-12)


def test_a_transformed_jit_stages_its_derived_programs_once(monkeypatch):
    from cuvmap.transforms import staging

    traced = []
    original = staging.trace_to_jaxpr
    monkeypatch.setattr(staging, "trace_to_jaxpr", lambda *a, **k: traced.append(k.get("name")) or original(*a, **k))
    f = cv.jit(lambda x: cnp.sum(cnp.sin(x)))
    g = cv.grad(f)
    x = np.arange(3.0)
    g(x)
    g(x + 1)
    vg = cv.vmap(g)
    vg(np.ones((2, 3)))
    vg(np.zeros((2, 3)))
    assert f.trace_count == 1
    # f itself, its forward/backward pair, and (under vmap) the batched forward and backward
    assert traced.count("vjp(jit)") == 1 and traced.count("vmap(jit)") == 2, traced


def test_jit_under_grad_runs_staged_programs_not_eager_ops(monkeypatch):
    """grad(jit(f)) runs the forward and backward programs through the executor: no
    primitive of f is bound eagerly."""
    calls = []
    original = executor.execute
    monkeypatch.setattr(executor.planner, "execute", lambda p, args: calls.append(p) or original(p, args))
    f = cv.jit(lambda x: cnp.sum(cnp.sin(x) * cnp.cos(x)))
    x = np.linspace(0, 1, 5)
    g = cv.grad(f)(x)
    np.testing.assert_allclose(g, np.cos(2 * x), rtol=1e-12)
    assert len(calls) == 2  # the forward program, then the backward program


# ---------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------


def test_the_fast_lookup_tells_arguments_apart():
    """NOTE [jit's fast path]: a strong float64 array, a weak Python float, a NumPy scalar,
    a float32 array and a pytree of them each find their own program."""
    jf = cv.jit(lambda x, y=1.0: x * 2 + y)
    cases = [((np.ones(3),), np.float64, (3,)), ((2.0,), np.float64, ()), ((np.float32(2.0),), np.float32, ()),
             ((np.ones(3, np.float32),), np.float32, (3,)), ((np.ones(3, np.float32), 1.5), np.float32, (3,)),
             ((np.ones(3, np.float32), np.ones(3)), np.float64, (3,)), ((3,), np.float64, ()),
             ((3, 4), np.int64, ())]
    for _ in range(2):  # the second round finds every program by the fast lookup
        for args, dtype, shape in cases:
            out = jf(*args)
            want = np.asarray(args[0]) * 2 + (np.asarray(args[1]) if len(args) > 1 else 1.0)
            assert out.dtype == dtype and out.shape == shape, (args, out.dtype)
            np.testing.assert_array_equal(out, want)
    assert jf.trace_count == len(cases)
    jf.clear_cache()
    jf(np.ones(3))
    assert jf.trace_count == len(cases) + 1


def test_trace_counts():
    traces = []

    def f(x, n=1):
        traces.append(1)
        return x * n

    jf = cv.jit(f, static_argnames="n")
    x32 = np.ones(3, np.float32)
    jf(x32)
    jf(x32 + 1)
    assert jf.trace_count == 1
    jf(np.ones(4, np.float32))  # shape
    assert jf.trace_count == 2
    jf(np.ones(3, np.float64))  # dtype
    assert jf.trace_count == 3
    jf(x32, n=2)  # static value
    jf(x32, n=2)
    assert jf.trace_count == 4
    jf(2.0)  # a weak Python float
    jf(np.float64(2.0))  # a strong 0-d array: not the same program
    assert jf.trace_count == 6
    assert len(traces) == 6


def test_weak_types_are_part_of_the_key():
    jf = cv.jit(lambda s, x: s * x)
    x = np.ones(2, np.float32)
    assert jf(2.0, x).dtype == np.float32  # weak: x's dtype
    assert jf(np.float64(2.0), x).dtype == np.float64  # strong: promotes
    assert jf(2.0, x).dtype == np.float32


def test_pytree_structures_are_part_of_the_key():
    jf = cv.jit(lambda p: sum(cv.tree.leaves(p)))
    jf({"a": np.ones(2)})
    jf({"a": np.ones(2), "b": np.ones(2)})
    jf([np.ones(2)])
    assert jf.trace_count == 3


def test_unhashable_static_argument_is_a_clear_error():
    jf = cv.jit(lambda x, sizes: x * len(sizes), static_argnums=1)
    with pytest.raises(cv.TransformError, match=r"jit\(<lambda>\): static argument 1 is a list .*hashable.*tuple"):
        jf(np.ones(2), [1, 2])
    np.testing.assert_array_equal(jf(np.ones(2), (1, 2)), [2.0, 2.0])


def test_retrace_warning():
    jf = cv.jit(lambda x: x + 1)
    with pytest.warns(cv.RetraceWarning, match="traced 20 times"):
        for n in range(1, 22):
            jf(np.ones(n))
    assert jf.trace_count == 21


def test_keyword_arguments_and_pytrees_in_and_out():
    def f(params, x, *, scale):
        return {"y": params["w"] @ x * scale, "aux": (x.sum(), params["b"])}

    jf = cv.jit(f)
    params = {"w": np.eye(3), "b": np.arange(2.0)}
    x = np.arange(3.0)
    assert_same(jf(params, x, scale=2.0), f(params, x, scale=2.0))


# ---------------------------------------------------------------------------------------
# The user's side
# ---------------------------------------------------------------------------------------


def test_control_flow_on_traced_values_names_the_argument():
    def f(x, flag):
        return x * 2 if flag > 0 else x

    with pytest.raises(ConcretizationError, match=r"argument 1 \(flag\).*static_argnums.*cuvmap.numpy.where"):
        cv.jit(f)(np.ones(2), 1.0)
    np.testing.assert_array_equal(cv.jit(f, static_argnums=1)(np.ones(2), 1.0), [2.0, 2.0])
    # eager grad keeps allowing it
    assert cv.grad(lambda x: x * 2 if x > 0 else x)(1.0) == 2.0


def test_grad_inside_jit_also_refuses_control_flow_on_traced_values():
    f = cv.jit(cv.grad(lambda x: x * 2 if x > 0 else x))
    with pytest.raises(ConcretizationError, match="argument 0"):
        f(1.0)


def test_print_runs_at_trace_time_only(capsys):
    @cv.jit
    def f(x):
        print("tracing", x.shape)
        return x + 1

    f(np.ones(2))
    f(np.ones(2))
    assert capsys.readouterr().out == "tracing (2,)\n"


def test_decorator_with_arguments():
    @cv.jit(static_argnums=(1,))
    def f(x, n):
        return x ** n

    np.testing.assert_array_equal(f(np.full(2, 3.0), 2), [9.0, 9.0])


def test_escaped_tracer_is_a_clear_error():
    leaked = []

    @cv.jit
    def f(x):
        leaked.append(x * 2)
        return x

    f(np.ones(2))
    with pytest.raises(EscapedTracerError, match="escaped"):
        cnp.sin(leaked[0])


def test_closures_over_arrays_are_constants_of_the_program():
    w = np.arange(3.0)
    jf = cv.jit(lambda x: x * w)
    np.testing.assert_array_equal(jf(np.ones(3)), w)


def test_closure_over_an_outer_tracer():
    xs = np.arange(4.0)
    got = cv.vmap(lambda x: cv.jit(lambda y: x * y + cnp.sin(x))(2.0))(xs)
    np.testing.assert_allclose(got, xs * 2 + np.sin(xs))
    g = cv.grad(lambda x: cv.jit(lambda y: x * y)(3.0))(1.5)
    assert float(g) == 3.0


def test_values_made_from_nothing_are_staged():
    def f(x):
        return x + lax.iota(3, np.float64) + cnp.zeros(3)

    closed = cv.make_jaxpr(f)(np.ones(3))
    assert "iota" in str(closed)
    np.testing.assert_array_equal(cv.jit(f)(np.ones(3)), [1.0, 2.0, 3.0])


def test_make_jaxpr_text():
    text = str(cv.make_jaxpr(lambda x, y: cnp.sin(x) * y)(np.ones(3, np.float32), 2.0))
    assert text.splitlines()[0] == "{ lambda ; a:f32[3] b:~f64[]. let"
    assert "c:f32[3] = sin a" in text
    assert "d:f32[3] = mul c b" in text
    assert text.rstrip().endswith("in (d,) }")


def test_out_of_bounds_indices_raise_when_the_program_runs():
    jf = cv.jit(lambda x, i: x[i])
    x = np.arange(4.0)
    assert float(jf(x, np.array(2))) == 2.0
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        jf(x, np.array([9]))


def test_results_never_alias_inputs_or_each_other():
    jf = cv.jit(lambda x: (x, x, cnp.reshape(x, (2, 2))))
    x = np.arange(4.0)
    a, b, c = jf(x)
    a[0] = 100.0
    assert x[0] == 0.0 and b[0] == 0.0 and c[0, 0] == 0.0


def test_passes():
    def f(x):
        a = cnp.sin(x)
        b = cnp.sin(x)  # common subexpression
        unused = cnp.exp(x)  # noqa: F841 - dead code
        c = cnp.ones(3) * 2.0  # constant
        return a + b + c

    closed = cv.make_jaxpr(f)(np.ones(3))
    optimized = ir.optimize(closed)
    names = [e.primitive.name for e in optimized.jaxpr.eqns]
    assert names.count("sin") == 1 and "exp" not in names and "broadcast_in_dim" not in names
    np.testing.assert_allclose(cv.jit(f)(np.ones(3)), 2 * np.sin(1.0) + 2.0)


# ---------------------------------------------------------------------------------------
# The planner
# ---------------------------------------------------------------------------------------


@pytest.fixture
def reuse_everything(monkeypatch):
    """Buffer reuse also for the small arrays of these tests."""
    monkeypatch.setattr(executor.buffers, "MIN_REUSE_BYTES", 0)


def _plan(f, *args):
    return executor.plan(ir.optimize(cv.make_jaxpr(f)(*args)))


def test_elementwise_chains_write_in_place(reuse_everything):
    def chain(x):
        for _ in range(5):
            x = cnp.sin(x) + 1.0
        return x

    x = np.linspace(0, 1, 8)
    p = _plan(chain, x)
    kinds = [s.kind for s in p.steps]
    assert kinds[0] == executor.POOLED  # the first result: the input is the caller's
    assert kinds[1:].count(executor.IN_PLACE) == len(kinds) - 1
    before = x.copy()
    assert_same(cv.jit(chain)(x), chain(x))
    np.testing.assert_array_equal(x, before)


def _probe_double(name, **facts):
    """A primitive defined outside cuvmap's families: 2x, with the given facts."""
    p = core.Primitive(name, **facts)
    p.impl = lambda x: np.multiply(x, 2.0)
    p.shape_rule = lambda x: core.ShapedArray(x.shape, x.dtype)
    return p


def test_the_planner_knows_primitives_by_their_facts():
    """Where a result goes depends on its primitive's attributes, not on its name: with a
    writer (``impl_into``) it is written over a dead operand's buffer and may be written
    over in turn; with ``owns_output`` its operand's buffer goes back to the pool at
    once; with neither it is taken for a view of its operand, whose buffer lives on."""
    x = np.linspace(0, 1, 4096)
    writing = _probe_double("probe_writing", impl_into=lambda x, out: np.multiply(x, 2.0, out=out))
    owning = _probe_double("probe_owning", owns_output=True)
    plain = _probe_double("probe_plain")
    plans = {p.name: _plan(lambda x: cnp.sin(p.bind(cnp.exp(x))), x) for p in (writing, owning, plain)}
    kinds = {name: [s.kind for s in p.steps] for name, p in plans.items()}
    assert kinds["probe_writing"] == [executor.POOLED, executor.IN_PLACE, executor.IN_PLACE]
    assert kinds["probe_owning"] == kinds["probe_plain"] == [executor.POOLED, executor.PLAIN, executor.POOLED]
    exp_buffer = plans["probe_owning"].steps[0].out
    assert [r for r, _ in plans["probe_owning"].steps[1].release] == [exp_buffer]  # free after the probe
    assert [r for r, _ in plans["probe_plain"].steps[2].release] == [exp_buffer]  # free after its reader, sin
    for p in plans.values():
        for _ in range(2):
            np.testing.assert_array_equal(p.program([x])[0], np.sin(2.0 * np.exp(x)))


def test_views_are_not_overwritten_while_alive(reuse_everything):
    def f(x):
        a = cnp.exp(x)
        v = cnp.reshape(a, (2, 4))  # a view of a's buffer
        b = cnp.sin(a)  # may not write into a: v is used later
        return b, v * 2.0

    x = np.linspace(0, 1, 8)
    assert_same(cv.jit(f)(x), f(x))
    jf = cv.jit(f)
    jf(x)
    assert_same(jf(x), f(x))


def test_broadcasting_outputs_do_not_reuse_smaller_inputs(reuse_everything):
    def f(x, y):
        a = cnp.exp(x)  # (4,)
        return cnp.sin(a + y)  # (3, 4): a's buffer is too small

    x, y = np.linspace(0, 1, 4), np.ones((3, 4))
    assert_same(cv.jit(f)(x, y), f(x, y))


def test_outputs_used_twice_and_returned_intermediates(reuse_everything):
    def f(x):
        a = cnp.sin(x)
        b = cnp.cos(a)
        return a, b, a + b, a

    x = np.linspace(0, 1, 6)
    jf = cv.jit(f)
    for _ in range(3):
        out = jf(x)
        assert_same(out, f(x))
        assert not np.shares_memory(out[0], out[3])


def test_donated_arguments_may_be_written_and_others_never(reuse_everything):
    def f(x, y):
        return cnp.exp(x) * 2.0 + y

    x, y = np.linspace(0, 1, 8), np.ones(8)
    want = f(x, y)
    y_before = y.copy()
    jf = cv.jit(f, donate_argnums=(0,))
    assert_same(jf(x.copy(), y), want)
    np.testing.assert_array_equal(y, y_before)
    p = _plan(f, x, y)
    assert all(s.aux not in p.in_slots for s in p.steps if s.kind == executor.IN_PLACE)
    pd = executor.plan(ir.optimize(cv.make_jaxpr(f)(x, y)), donated=(0,))
    assert any(s.kind == executor.IN_PLACE and s.aux == pd.in_slots[0] for s in pd.steps)


def test_steady_state_calls_reuse_pooled_buffers():
    """A long chain on 1 MB arrays holds about two arrays at a time, and later calls take
    their intermediates from the pool."""
    import tracemalloc

    def chain(x, y):
        for _ in range(10):
            x = cnp.tanh(x * y) + y
        return cnp.sum(x)

    x, y = np.linspace(0, 1, 1 << 17), np.full(1 << 17, 0.5)
    jf = cv.jit(chain)
    jf(x, y)
    tracemalloc.start()
    jf(x, y)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    np.testing.assert_allclose(jf(x, y), chain(x, y), rtol=1e-12)
    assert peak < 2.5 * x.nbytes, f"peak {peak / 1e6:.1f} MB for 1 MB arrays"


def test_select_results_come_from_the_pool():
    """select has no ufunc, but its impl_into writes into the plan's buffers: after a first
    call, its results (relu's) come from the pool, and equal np.where's bits."""
    def f(x):
        h = nn.relu(x)  # x is the caller's: the result goes to a pooled buffer
        return cnp.where(h > 0.5, h, -x) + h  # written over -x's buffer

    from cuvmap.lax.elementwise import select_into

    x = np.linspace(-1, 1, 1 << 12)
    p = _plan(f, x)
    writers = [k for k, s in enumerate(p.steps) if s.writer is select_into]
    assert len(writers) == 2
    written = []
    for k in writers:  # count the buffers select_into gets
        p.program.__globals__[f"w{k}"] = lambda *a, out: written.append(out) or select_into(*a, out=out)
    h = np.where(x > 0, x, 0)
    want = np.where(h > 0.5, h, -x) + h
    for _ in range(3):
        np.testing.assert_array_equal(p.program([x])[0], want)
    assert len(written) == 6


@pytest.mark.parametrize("n", [511, 512, 4096])
def test_a_ufunc_result_keeps_numpys_dtype_whatever_its_size(n):
    """NumPy's sqrt of uint8 is float16: a buffer of the aval's float64 must not decide."""
    x = np.arange(n, dtype=np.uint8)
    jf = cv.jit(lambda x: cnp.sqrt(x) + 0.0)
    for _ in range(2):
        got = jf(x)
        assert got.dtype == (cnp.sqrt(x) + 0.0).dtype == np.float16
        np.testing.assert_array_equal(got, np.sqrt(x))


def test_returned_constants_are_the_callers_to_write():
    g = cv.jit(cv.grad(lambda x, y: cnp.sum(x * 2.0), argnums=(0, 1)))
    w = np.arange(3.0)
    h = cv.jit(lambda x: (x + 1, cnp.zeros_like(x), w))
    a, _ = g(np.ones(3), np.ones(3))
    a += 7
    z, z2, w_out = h(np.ones(3))[1], h(np.ones(3))[1], h(np.ones(3))[2]
    z += 1
    w_out += 1
    np.testing.assert_array_equal(g(np.ones(3), np.ones(3))[0], np.full(3, 2.0))
    np.testing.assert_array_equal(z2, np.zeros(3))
    np.testing.assert_array_equal(h(np.ones(3))[1], np.zeros(3))
    np.testing.assert_array_equal(w, np.arange(3.0))


def test_cse_keeps_the_sign_of_zero_literals():
    x = np.ones(3)
    pos, neg = cv.jit(lambda x: (x * 0.0, x * -0.0))(x)
    np.testing.assert_array_equal(np.signbit(pos), [False] * 3)
    np.testing.assert_array_equal(np.signbit(neg), [True] * 3)


def test_jitted_function_in_several_threads():
    jf = cv.jit(lambda x: cnp.sum(cnp.tanh(x) * 2.0 + cnp.sin(x)))
    xs = [np.linspace(0, i, 1 << 12) for i in range(8)]
    want = [jf(x) for x in xs]
    results = [None] * 8

    def work(i):
        for _ in range(20):
            results[i] = jf(xs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r, w in zip(results, want):
        np.testing.assert_array_equal(r, w)


# A random program: each step applies an op to earlier values (elementwise, reductions
# that keep the rank, reshapes and transposes that are views), and the outputs are a few
# of the values. Planned execution (twice, so pooled buffers are reused) must equal eager.
UNARY = [cnp.sin, cnp.exp, cnp.tanh, lambda a: -a, lambda a: a * 2.0, cnp.abs,
         lambda a: cnp.where(a > 0.1, a, 0.0), lambda a: cnp.where(a < 0, a * 2.0, a),  # select_into
         lambda a: cnp.sum(a, axis=0, keepdims=True) + a, lambda a: a.T.T, lambda a: a.reshape(-1).reshape(a.shape)]
BINARY = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b, cnp.maximum]


@settings(max_examples=60, deadline=None)
@given(spec=programs(len(UNARY), len(BINARY), num_inputs=1, max_steps=12))
def test_planned_execution_equals_eager(spec):
    executor.buffers.MIN_REUSE_BYTES, saved = 0, executor.buffers.MIN_REUSE_BYTES
    try:
        f = program_fun(spec, UNARY, BINARY)
        x = np.linspace(-1, 1, 12).reshape(3, 4)
        before = x.copy()
        jf = cv.jit(f)
        with np.errstate(all="ignore"):  # exp of exp overflows to inf: the same inf both ways
            want = f(x)
            assert_same(jf(x), want)
            assert_same(jf(x), want)
        np.testing.assert_array_equal(x, before)
    finally:
        executor.buffers.MIN_REUSE_BYTES = saved


# ---------------------------------------------------------------------------------------
# The examples' workloads
# ---------------------------------------------------------------------------------------


def _cnn_params(rng):
    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    return {"conv1": {"w": he((4, 1, 3, 3), 9), "b": np.zeros(4, np.float32)},
            "conv2": {"w": he((8, 4, 3, 3), 36), "b": np.zeros(8, np.float32)},
            "dense": {"w": he((8 * 4 * 4, 10), 128), "b": np.zeros(10, np.float32)}}


def _cnn_loss(params, x, y):
    """The benchmark CNN (smaller): one example (1, 16, 16)."""
    h = nn.relu(nn.conv(x, params["conv1"]["w"], params["conv1"]["b"], stride=2, padding=1))
    h = nn.relu(nn.conv(h, params["conv2"]["w"], params["conv2"]["b"], stride=2, padding=1))
    logits = h.reshape(-1) @ params["dense"]["w"] + params["dense"]["b"]
    return nn.cross_entropy(logits[None], y[None])


def test_per_example_gradients_and_dp_step_jitted():
    rng = np.random.default_rng(0)
    params = _cnn_params(rng)
    xs = rng.standard_normal((6, 1, 16, 16)).astype(np.float32)
    ys = rng.integers(0, 10, 6)
    pe = cv.vmap(cv.grad(_cnn_loss), in_axes=(None, 0, 0))
    want = pe(params, xs, ys)
    assert_same(cv.jit(pe)(params, xs, ys), want, 1e-5, 1e-6)

    def step(params, xs, ys):
        g = dp.clip_per_example(pe(params, xs, ys), 1.0)
        return cv.tree.map(lambda p, gi: p - 0.1 * cnp.sum(gi, axis=0), params, g)

    assert_same(cv.jit(step)(params, xs, ys), step(params, xs, ys), 1e-5, 1e-6)
    # an empty batch
    assert_same(cv.jit(pe)(params, xs[:0], ys[:0]), pe(params, xs[:0], ys[:0]))


def test_ensemble_jitted():
    rng = np.random.default_rng(1)
    members = [_cnn_params(rng) for _ in range(3)]
    stacked = cv.tree.map(lambda *leaves: np.stack(leaves), *members)
    xs = rng.standard_normal((3, 4, 1, 16, 16)).astype(np.float32)
    ys = rng.integers(0, 10, (3, 4))
    batch_loss = lambda p, x, y: cnp.mean(cv.vmap(_cnn_loss, in_axes=(None, 0, 0))(p, x, y))  # noqa: E731
    ens = cv.vmap(cv.value_and_grad(batch_loss))
    assert_same(cv.jit(ens)(stacked, xs, ys), ens(stacked, xs, ys), 1e-5, 1e-6)


def test_jacobians_jitted():
    rng = np.random.default_rng(2)
    p = {"W1": rng.standard_normal((5, 4)), "b1": rng.standard_normal(5), "W2": rng.standard_normal((3, 5))}

    def f(x):
        return p["W2"] @ cnp.tanh(p["W1"] @ x + p["b1"])

    x = rng.standard_normal(4)
    assert_same(cv.jit(cv.jacrev(f))(x), cv.jacrev(f)(x))
    assert_same(cv.jit(cv.jacfwd(f))(x), cv.jacfwd(f)(x))
    assert_same(cv.jit(cv.hessian(lambda x: cnp.sum(f(x) ** 2)))(x), cv.hessian(lambda x: cnp.sum(f(x) ** 2))(x))
    xs = rng.standard_normal((5, 4))
    assert_same(cv.vmap(cv.jit(cv.jacrev(f)))(xs), cv.vmap(cv.jacrev(f))(xs))


FLOAT_FUNCTIONS = [("sqrt", cnp.sqrt, np.sqrt), ("exp", cnp.exp, np.exp), ("log1p", cnp.log1p, np.log1p),
                   ("tanh", cnp.tanh, np.tanh), ("sin", cnp.sin, np.sin), ("arctan", cnp.arctan, np.arctan),
                   ("erf", cnp.erf, np.sqrt)]  # (erf: NumPy has none; its dtype follows sqrt's rule)


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64])
@pytest.mark.parametrize("name,f,ref", FLOAT_FUNCTIONS, ids=[n for n, _, _ in FLOAT_FUNCTIONS])
def test_the_staged_dtype_of_a_float_function_of_integers_is_numpys(name, f, ref, dtype):
    """The aval, the eager result and the jitted result all have NumPy's dtype (sqrt of
    uint8 is float16): a program's avals must not claim float64 where the impl gives less."""
    x = (np.arange(8) % 2).astype(dtype)
    want = ref(x).dtype
    assert cv.make_jaxpr(f)(x).out_avals[0].dtype == want
    assert f(x).dtype == want
    assert cv.jit(f)(x).dtype == want


# ---------------------------------------------------------------------------------------
# What a jitted function keeps (NOTE [what a jitted function keeps] in cuvmap/jit_api.py)
# ---------------------------------------------------------------------------------------

def _elementwise_chain(x):
    y = cnp.sin(x) * 2.0 + 1.0
    z = cnp.exp(-y) * y
    return cnp.sum(z * z + y)


def _reference_chain(x):
    y = np.sin(x) * 2.0 + 1.0
    z = np.exp(-y) * y
    return np.sum(z * z + y)


def test_only_the_most_recent_signatures_keep_their_buffers():
    jf = cv.jit(_elementwise_chain)
    shapes = [(n * 4096,) for n in range(1, 11)]
    with cv.config.override(jit_pool_signatures=3):
        for shape in shapes:
            x = np.linspace(0, 1, shape[0])
            for _ in range(2):
                np.testing.assert_allclose(jf(x), _reference_chain(x), rtol=1e-12)
        kept = jf.kept_pools()
        assert kept["signatures"] == 3 and kept["bytes"] > 0 and kept["dropped_bytes"] > 0
        # an evicted signature runs its kept program again (no trace) and refills its pool
        x = np.linspace(0, 1, shapes[0][0])
        np.testing.assert_allclose(jf(x), _reference_chain(x), rtol=1e-12)
        assert jf.trace_count == len(shapes) and jf.kept_pools()["signatures"] == 3
    jf.clear_cache()
    assert jf.kept_pools()["signatures"] == jf.kept_pools()["bytes"] == 0


def test_the_byte_limit_keeps_at_least_the_signature_just_called():
    jf = cv.jit(_elementwise_chain)
    with cv.config.override(jit_pool_bytes=0):
        for n in (4096, 8192, 16384):
            jf(np.ones(n))
        kept = jf.kept_pools()
    assert kept["signatures"] == 1 and kept["bytes"] > 0


@pytest.mark.parametrize("name, value", [("jit_pool_signatures", -1), ("jit_pool_bytes", "lots"), ("jit_pool_bytes", 1.5)])
def test_pool_settings_are_checked(name, value):
    with pytest.raises(ValueError, match=f"cuvmap.config: {name} must be a non-negative int"):
        cv.config.update(name, value)


# 60 signatures of up to 4 MB: without the bound the pools hold ~0.5 GB; with 16 MiB
# allowed, the process grows by little more than one signature's buffers, and clearing the
# cache gives the memory back to the system (malloc_trim).
STREAM_OF_SHAPES = r"""
import numpy as np
import cuvmap as cv
import cuvmap.numpy as cnp

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

@cv.jit
def f(x):
    y = cnp.sin(x) * 2.0 + 1.0
    z = cnp.exp(-y) * y
    return cnp.sum(z * z + y)

cv.config.update("jit_pool_bytes", 16 << 20)
f(np.ones(8))
start = rss_mb()
for i in range(1, 61):
    x = np.ones(i * 8192)
    f(x); f(x)
after = rss_mb()
f.clear_cache()
print(start, after, rss_mb(), f.kept_pools()["bytes"])
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_stream_of_shapes_keeps_bounded_memory():
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", STREAM_OF_SHAPES], capture_output=True, text=True, env=env,
                         timeout=300, check=True).stdout
    start, after, cleared, kept = (float(v) for v in out.split())
    assert kept == 0
    assert after - start < 60, (start, after)       # unbounded: ~500 MB
    assert cleared - start < 30, (start, cleared)


def test_threads_entering_together_trace_each_signature_once():
    traces = []

    def loss(w, x):
        traces.append(x.shape)
        return cnp.sum(cnp.tanh(x @ w) ** 2)

    jf = cv.jit(cv.grad(loss))
    shapes = [(n, 3) for n in range(1, 7)]
    barrier = threading.Barrier(4)
    results, errors = {}, []
    w = np.linspace(-1, 1, 6).reshape(3, 2)

    def worker(t):
        try:
            for shape in shapes:
                barrier.wait()
                x = np.full(shape, 0.1 * (t + 1))
                results[t, shape] = jf(w, x)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    with warnings.catch_warnings():
        warnings.simplefilter("error", cv.RetraceWarning)
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors
    assert jf.trace_count == len(shapes) and len(traces) == len(shapes)
    for (t, shape), g in results.items():
        np.testing.assert_allclose(g, cv.grad(loss)(w, np.full(shape, 0.1 * (t + 1))), rtol=1e-12)


def test_the_retrace_warning_counts_signatures_not_calls():
    jf = cv.jit(lambda x: x + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", cv.RetraceWarning)
        for _ in range(3):
            for n in range(1, 20):
                jf(np.ones(n))
    assert jf.trace_count == 19
