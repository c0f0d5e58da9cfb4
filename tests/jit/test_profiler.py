"""``cuvmap.profiler.time_by_scope``: time per named scope (NOTE [time per scope] in
cuvmap/profiler.py).

References: which steps a scope holds is read from the staged program's text (the
equations printed with ``# [scope]``); the times are checked by orders of magnitude only
(a scope of three 300x300 products against one of a three-element add), which no machine
noise reverses."""
import re

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax
from cuvmap.api_util import TransformError

RNG = np.random.default_rng(0)
W = RNG.standard_normal((300, 300))
X = RNG.standard_normal((300, 300))
V = RNG.standard_normal(3)


def heavy_and_light(w, x, v):
    with cv.named_scope("heavy"):
        h = x @ w
        h = h @ w
        h = cnp.tanh(h @ w)
    with cv.named_scope("light"):
        u = v + 1.0
    return cnp.sum(h) + cnp.sum(u)


def nested(w, x):
    with cv.named_scope("outer"):
        with cv.named_scope("inner"):
            h = cnp.tanh(x @ w)
        with cv.named_scope("other"):
            h = h * 2.0
    return cnp.sum(h)


def nested_both_ways(w, x):
    """Both inner scopes with forward steps a gradient keeps and backward steps."""
    with cv.named_scope("outer"):
        with cv.named_scope("inner"):
            h = cnp.tanh(x @ w)
        with cv.named_scope("other"):
            h = cnp.sin(h) * h
    return cnp.sum(h)


def scopes_in_text(f, *args):
    """{scope: number of equations} from the optimized program's text."""
    text = cv.jit(f).lower(*args).as_text()
    counts = {}
    for line in text.splitlines():
        m = re.search(r"# \[(.*)\]$", line)
        key = m.group(1) if m else None
        if " = " in line and key is not None:
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_the_time_goes_to_the_scope_that_spends_it():
    times = cv.profiler.time_by_scope(heavy_and_light, W, X, V, rounds=5)
    assert set(times.seconds) == {"heavy", "light", "(no scope)"}
    assert times.seconds["heavy"] > 20 * times.seconds["light"], times
    assert all(t >= 0 for t in times.seconds.values())
    assert times.rounds == 5 and times.total > 0 and times.call > 0


def test_the_steps_of_a_scope_are_its_equations():
    """Unfused on the CPU: a step per equation, counted for the scope it was staged in;
    the backward pass's for transpose(<scope>)."""
    f = cv.grad(nested)
    times = cv.profiler.time_by_scope(f, W[:8, :8], X[:4, :8], rounds=2, warmup=0)
    want = scopes_in_text(f, W[:8, :8], X[:4, :8])
    got = {k: n for k, n in times.steps.items() if k != "(no scope)"}
    assert got == want, (got, want)
    assert {"outer/inner", "transpose(outer/inner)"} <= set(got)


def test_depth_sums_nested_scopes_into_the_outer_one():
    times = cv.profiler.time_by_scope(nested, W[:8, :8], X[:4, :8], rounds=3)
    table = times.table(depth=1)
    row = next(line for line in table.splitlines() if line.startswith("| outer |"))
    steps = int(row.split("|")[2])
    assert steps == times.steps["outer/inner"] + times.steps["outer/other"]
    assert "| outer/inner |" in str(times) and "(the untimed call)" in str(times)


@pytest.mark.parametrize("stack, depth, want", [
    ((), 1, ("(no scope)", False)),
    (("outer", "inner"), 1, ("outer", False)),
    (("transpose(outer/inner)",), 1, ("outer", True)),
    (("transpose(outer/inner)",), 2, ("outer/inner", True)),
    (("transpose(outer/inner)",), None, ("outer/inner", True)),
    (("outer", "transpose(inner)"), 1, ("outer", True)),  # a backward pass started inside outer
    (("outer", "transpose(inner/deep)"), 2, ("outer/inner", True)),
    (("transpose(outer/transpose(inner))",), 2, ("outer/inner", True)),  # a second-order pass
    (("transpose(f(x)/y)",), 1, ("f(x)", True)),  # parentheses in a name
])
def test_a_backward_stack_folds_into_the_path_of_its_scope(stack, depth, want):
    assert cv.profiler._fold_key(stack, depth) == want


@pytest.mark.parametrize("depth, rows", [
    (1, {"outer": ("outer/inner", "outer/other")}),
    (2, {"outer/inner": ("outer/inner",), "outer/other": ("outer/other",)}),
    (None, {"outer/inner": ("outer/inner",), "outer/other": ("outer/other",)}),
])
def test_each_scope_row_holds_its_backward_at_every_depth(depth, rows):
    """grad(nested_both_ways): the forward steps of outer/inner and outer/other and their
    backward, transpose(outer/inner) and transpose(outer/other), fold into the scope's row."""
    times = cv.profiler.time_by_scope(cv.grad(nested_both_ways), W[:8, :8], X[:4, :8], rounds=3)
    assert {"outer/inner", "outer/other", "transpose(outer/inner)", "transpose(outer/other)"} <= set(times.steps)
    folded = times.by_scope(depth)
    assert not any("transpose" in k for k in folded), folded
    for row, stacks in rows.items():
        fwd, bwd = folded[row]
        assert fwd > 0 and bwd > 0, (row, folded)
    _, steps = times._fold(depth)
    for row, stacks in rows.items():
        assert steps[row] == sum(times.steps.get(s, 0) + times.steps.get(f"transpose({s})", 0) for s in stacks)
    if depth is not None:
        table = times.table(depth=depth)
        assert "| scope | steps | forward ms | backward ms | ms | share |" in table
        for row in rows:
            line = next(line for line in table.splitlines() if line.startswith(f"| {row} |"))
            assert int(line.split("|")[2]) == steps[row]
        assert "transpose(" not in table


def test_a_loop_counts_as_one_step_of_its_scope():
    def rnn(w, xs):
        with cv.named_scope("rnn"):
            h, _ = lax.scan(lambda h, x: (cnp.tanh(h @ w + x), None), cnp.zeros(8), xs)
        return cnp.sum(h)

    times = cv.profiler.time_by_scope(rnn, W[:8, :8], X[:5, :8], rounds=2)
    assert times.steps["rnn"] >= 1 and times.seconds["rnn"] > 0


def test_static_arguments_and_jitted_functions():
    f = cv.jit(lambda x, n: x * n, static_argnums=1)
    times = cv.profiler.time_by_scope(lambda x, n: f(x, n), V, 3, static_argnums=1, rounds=2)
    assert sum(times.steps.values()) >= 1


@pytest.mark.parametrize("args, kwargs, message", [
    ((cv.ShapeDtypeStruct((3,), np.float64),), {}, "argument 0 (x) is a ShapeDtypeStruct"),
    ((V,), {"rounds": 0}, "rounds must be >= 1"),
])
def test_errors_name_the_function_and_the_argument(args, kwargs, message):
    with pytest.raises((TransformError, ValueError), match=re.escape(message)) as info:
        cv.profiler.time_by_scope(lambda x: x * 2, *args, **kwargs)
    assert "time_by_scope(<lambda>)" in str(info.value)


def test_under_a_transform_it_refuses():
    def inside(x):
        cv.profiler.time_by_scope(lambda y: y * 2, x)
        return x

    with pytest.raises(TransformError, match="outside every transform"):
        cv.vmap(inside)(np.ones((2, 3)))


@pytest.mark.gpu
@pytest.mark.skipif(not cv.gpu_available(), reason="no CUDA device visible to CuPy")
def test_on_the_gpu_fused_steps_count_for_the_scope_their_equations_share():
    import cupy

    def f(w, x):
        with cv.named_scope("layer"):
            with cv.named_scope("inner"):
                h = cnp.tanh(x @ w)
            with cv.named_scope("other"):
                h = h * 2.0 + 1.0
        return cnp.sum(h)

    w, x = cupy.asarray(W[:8, :8]), cupy.asarray(X[:4, :8])
    times = cv.profiler.time_by_scope(f, w, x, rounds=2)
    assert set(times.seconds) <= {"layer", "layer/inner", "layer/other", "(no scope)"}
    assert any(k.startswith("layer") for k in times.seconds) and times.call > 0
