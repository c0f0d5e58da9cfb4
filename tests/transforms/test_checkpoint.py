"""``checkpoint`` (``remat``): the same values and derivatives as the function itself, with
the tape holding the region's inputs instead of its intermediates, and the forward pass
recomputed in the backward pass.

References: the unchekpointed function (a different path through the interpreters: no
call primitive, no staged program), central finite differences in float64
(``check_grads``), per-example loops for ``vmap``; counts of primitive impl calls for the
recomputation, and tracemalloc for what the tape holds.
"""
import tracemalloc

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import checkpoint, checkpoint_policies, tree
from cuvmap.lax import elementwise, linalg
from cuvmap.test_util import check_grads


def _rng(seed=0):
    return np.random.default_rng(seed)


def _assert_tree_close(a, b, atol=1e-12, rtol=1e-12):
    la, ta = tree.flatten(a)
    lb, tb = tree.flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), atol=atol, rtol=rtol)


def _chain(x):
    for i in range(6):
        x = cnp.tanh(x) * 1.5 if i % 2 else cnp.sin(x) + x
    return x


def _mlp(params, x):
    h = cnp.tanh(x @ params["w1"] + params["b1"])
    return cnp.sum((h @ params["w2"]) ** 2)


_W = _rng(9).standard_normal(3)


def _closure(x):
    return cnp.exp(x * _W) / (1.0 + cnp.sum(x ** 2))


def _pytree(x, y):
    return {"prod": x * y, "pair": (cnp.sin(x) * cnp.cos(y), cnp.sum(x) * y)}


# name -> (f, args, loss from f's output to a scalar); args are float64
CASES = {
    "chain": (_chain, (np.linspace(-1, 1, 5),), lambda o: cnp.sum(o ** 2)),
    "mlp": (_mlp, ({"w1": _rng(1).standard_normal((4, 5)), "b1": _rng(2).standard_normal(5),
                    "w2": _rng(3).standard_normal((5, 2))}, _rng(4).standard_normal((3, 4))), lambda o: o),
    "closure over an array": (_closure, (np.linspace(0.1, 0.5, 3),), lambda o: cnp.sum(cnp.sin(o))),
    "pytree in and out": (_pytree, (np.linspace(0.1, 1, 4), np.linspace(1, 2, 4)),
                          lambda o: cnp.sum(o["prod"]) + cnp.sum(o["pair"][0] * o["pair"][1])),
    "broadcasting": (lambda a, b: cnp.exp(a * b) - a, (_rng(5).standard_normal((3, 1)), _rng(6).standard_normal((1, 4))),
                     lambda o: cnp.sum(o * o)),
}

VARIANTS = {
    "default": {},
    "everything_saveable": {"policy": checkpoint_policies.everything_saveable},
    "nothing_saveable": {"policy": checkpoint_policies.nothing_saveable},
    "dots_saveable": {"policy": checkpoint_policies.dots_saveable},
    "prevent_cse=False": {"prevent_cse": False},
}


def _losses(name, variant):
    f, args, loss = CASES[name]
    fc = checkpoint(f, **VARIANTS[variant])
    return (lambda *a: loss(f(*a))), (lambda *a: loss(fc(*a))), f, fc, args


def _argnums(args):
    return tuple(range(len(args)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_are_unchanged(name, variant):
    plain, ckpt, f, fc, args = _losses(name, variant)
    _assert_tree_close(fc(*args), f(*args), atol=0, rtol=0)
    nums = _argnums(args)
    _assert_tree_close(cv.grad(ckpt, argnums=nums)(*args), cv.grad(plain, argnums=nums)(*args))
    check_grads(fc, args, order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("variant", ["default", "dots_saveable", "prevent_cse=False"])
@pytest.mark.parametrize("name", CASES)
def test_composes_with_jit_vmap_jvp_and_grad_of_grad(name, variant):
    plain, ckpt, f, fc, args = _losses(name, variant)
    nums = _argnums(args)
    want = cv.grad(plain, argnums=nums)(*args)
    _assert_tree_close(cv.jit(cv.grad(ckpt, argnums=nums))(*args), want)
    _assert_tree_close(cv.grad(cv.jit(ckpt), argnums=nums)(*args), want)
    _assert_tree_close(cv.jvp(fc, args, args)[1], cv.jvp(f, args, args)[1])
    # grad of a Hessian-vector product (second order through the backward region)
    v = tree.map(lambda a: np.cos(a), args)

    def hvp(loss):
        return lambda *a: sum(cnp.sum(g * w) for g, w in zip(tree.leaves(cv.grad(loss, argnums=nums)(*a)), tree.leaves(v)))

    _assert_tree_close(cv.grad(hvp(ckpt), argnums=nums)(*args), cv.grad(hvp(plain), argnums=nums)(*args), atol=1e-10, rtol=1e-10)
    # per-example gradients: vmap over a batch of the last argument, against a loop
    batch = [tree.map(lambda a, k=k: a * (1 + 0.1 * k), args[-1]) for k in range(3)]
    stacked = tree.map(lambda *ls: np.stack(ls), *batch)
    in_axes = (None,) * (len(args) - 1) + (0,)
    got = cv.vmap(cv.grad(ckpt, argnums=nums), in_axes=in_axes)(*args[:-1], stacked)
    loop = [cv.grad(plain, argnums=nums)(*args[:-1], b) for b in batch]
    _assert_tree_close(got, tree.map(lambda *ls: np.stack(ls), *loop))
    # grad of vmap
    vsum = lambda loss: (lambda *a: cnp.sum(cv.vmap(loss, in_axes=in_axes)(*a[:-1], a[-1])))
    _assert_tree_close(cv.grad(vsum(ckpt), argnums=nums)(*args[:-1], stacked),
                       cv.grad(vsum(plain), argnums=nums)(*args[:-1], stacked))


@pytest.fixture
def impl_counts(monkeypatch):
    """Counts the impl calls of sin, tanh and dot_general."""
    counts = {}
    for prim in (elementwise.sin_p, elementwise.tanh_p, linalg.dot_general_p):
        original = prim.impl

        def counted(*args, _original=original, _name=prim.name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(prim, "impl", counted)
    return counts


def _two_layer(w, w2, x):
    return cnp.sum(cnp.tanh(x @ w) @ w2)


def _run_counted(counts, fn, *args):
    counts.clear()
    out = fn(*args)
    return out, dict(counts)


@pytest.mark.parametrize("policy, dots, tanhs", [
    # forward: 2 dots, 1 tanh. backward: 4 dots (two per product), no tanh (its rule reads tanh's output)
    ("plain", 6, 1),
    (None, 7, 2),                                            # recomputes tanh(x @ w): one more dot, one more tanh
    (checkpoint_policies.nothing_saveable, 7, 2),
    (checkpoint_policies.dots_saveable, 6, 2),               # keeps x @ w, recomputes the tanh
    (checkpoint_policies.dots_with_no_batch_dims_saveable, 6, 2),
    (checkpoint_policies.everything_saveable, 6, 1),         # keeps everything: no recomputation
])
def test_the_backward_pass_recomputes_what_the_policy_does_not_save(impl_counts, policy, dots, tanhs):
    rng = _rng(12)
    w, w2, x = rng.standard_normal((4, 3)), rng.standard_normal((3, 2)), rng.standard_normal((5, 4))
    f = _two_layer if policy == "plain" else checkpoint(_two_layer, policy=policy)
    g, counts = _run_counted(impl_counts, cv.grad(f, argnums=(0, 1, 2)), w, w2, x)
    assert counts == {"dot_general": dots, "tanh": tanhs}
    _assert_tree_close(g, cv.grad(_two_layer, argnums=(0, 1, 2))(w, w2, x))


def test_a_policy_is_asked_about_each_equation():
    seen = []

    def keep_sin(prim, *avals, **params):
        seen.append((prim.name, tuple(a.shape for a in avals)))
        return prim is elementwise.sin_p

    f = lambda x: cnp.sum(cnp.exp(cnp.sin(x) * 2.0))
    x = np.linspace(0, 1, 3)
    np.testing.assert_allclose(cv.grad(checkpoint(f, policy=keep_sin))(x), cv.grad(f)(x), rtol=1e-12)
    assert ("sin", ((3,),)) in seen


def test_the_dot_policies_ask_the_primitive_what_kind_it_is():
    """``dots_saveable`` keeps what a primitive of kind ``"dot"`` computes, whoever defines
    it; ``dots_with_no_batch_dims_saveable`` only such products without batch dims."""
    from cuvmap.core import Primitive, ShapedArray

    matmul_p = Primitive("probe_matmul", kind="dot")
    other_p = Primitive("probe_other")
    a = ShapedArray((2, 3), np.float64)
    plain, batched = (((1,), (0,)), ((), ())), (((2,), (1,)), ((0,), (0,)))
    assert checkpoint_policies.dots_saveable(matmul_p, a, a, dimension_numbers=plain)
    assert not checkpoint_policies.dots_saveable(other_p, a)
    assert checkpoint_policies.dots_saveable(linalg.dot_general_p, a, a, dimension_numbers=plain)
    assert checkpoint_policies.dots_with_no_batch_dims_saveable(matmul_p, a, a, dimension_numbers=plain)
    assert not checkpoint_policies.dots_with_no_batch_dims_saveable(matmul_p, a, a, dimension_numbers=batched)
    assert not checkpoint_policies.dots_with_no_batch_dims_saveable(other_p, a)


# ---------------------------------------------------------------------------------------
# Memory: what the tape holds (NOTE [what the tape keeps])
# ---------------------------------------------------------------------------------------

N_OPS, SEGMENT = 256, 16   # √n segments of √n steps


def _segment(x):
    for i in range(SEGMENT):
        x = cnp.tanh(x) if i % 2 else cnp.sin(x)
    return x


def _long_chain(x):
    for _ in range(N_OPS // SEGMENT):
        x = _segment(x)
    return cnp.sum(x)


_ckpt_segment = checkpoint(_segment)


def _long_chain_checkpointed(x):
    for _ in range(N_OPS // SEGMENT):
        x = _ckpt_segment(x)
    return cnp.sum(x)


def _traced(fn):
    """``(result, bytes still held, peak bytes)`` of ``fn()`` under tracemalloc."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = fn()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, held - before, peak - before


X_LONG = np.linspace(-1, 1, 100_000)   # 800 kB


def test_the_tape_holds_the_inputs_of_a_checkpointed_region_not_its_intermediates():
    (_, pull_plain), held_plain, _ = _traced(lambda: cv.vjp(lambda x: _segment(_segment(x)), X_LONG))
    (out, pull_ckpt), held_ckpt, _ = _traced(lambda: cv.vjp(checkpoint(lambda x: _segment(_segment(x))), X_LONG))
    nbytes = X_LONG.nbytes
    assert held_plain > 2 * SEGMENT * 0.4 * nbytes   # one residual per sin/tanh pair at least
    assert held_ckpt < 2.5 * nbytes, f"{held_ckpt / nbytes:.1f} arrays held"   # the output (and small things)
    ct = np.cos(X_LONG)
    np.testing.assert_allclose(pull_ckpt(ct)[0], pull_plain(ct)[0], rtol=1e-12, atol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["eager", "jit(grad)", "grad(jit)"])
def test_checkpointed_segments_bound_the_peak_memory_of_a_long_chain(how):
    """256 nonlinear steps on 800 kB arrays: the gradient without checkpoint holds a
    residual per step (sin's operand is tanh's output, so about 128 arrays); with 16
    checkpointed segments it holds the 16 segment inputs and one segment's intermediates."""
    wrap = {"eager": lambda f: cv.grad(f), "jit(grad)": lambda f: cv.jit(cv.grad(f)),
            "grad(jit)": lambda f: cv.grad(cv.jit(f))}[how]
    g_plain, _, peak_plain = _traced(lambda: wrap(_long_chain)(X_LONG))
    g_ckpt, _, peak_ckpt = _traced(lambda: wrap(_long_chain_checkpointed)(X_LONG))
    np.testing.assert_allclose(g_ckpt, g_plain, rtol=1e-12, atol=1e-14)
    nbytes = X_LONG.nbytes
    assert peak_plain > 100 * nbytes
    assert peak_ckpt < peak_plain / 3.5, f"peaks: {peak_ckpt / nbytes:.0f} vs {peak_plain / nbytes:.0f} arrays"


@pytest.mark.slow
def test_eager_segments_stay_below_a_fifth_of_the_plain_peak():
    """The brief's bound for the eager gradient of tanh/sin chains: < 1/5 of the peak."""
    x = X_LONG

    def all_tanh(n):
        def seg(y):
            for _ in range(n):
                y = cnp.tanh(y)
            return y
        return seg

    plain = lambda x: cnp.sum(all_tanh(200)(x))
    seg = checkpoint(all_tanh(10))

    def ckpt(x):
        for _ in range(20):
            x = seg(x)
        return cnp.sum(x)

    g_plain, _, peak_plain = _traced(lambda: cv.grad(plain)(x))
    g_ckpt, _, peak_ckpt = _traced(lambda: cv.grad(ckpt)(x))
    np.testing.assert_allclose(g_ckpt, g_plain, rtol=1e-12, atol=1e-14)
    assert peak_ckpt < peak_plain / 5, f"peaks: {peak_ckpt / x.nbytes:.0f} vs {peak_plain / x.nbytes:.0f} arrays"


# ---------------------------------------------------------------------------------------
# Staged programs, linearize, arguments
# ---------------------------------------------------------------------------------------


def _names(program):
    return [e.primitive.name for e in program.jaxpr.eqns]


def test_a_region_is_one_equation_of_a_staged_program():
    f = lambda x: cnp.sum(cnp.sin(cnp.sin(x)))
    x = np.linspace(0, 1, 3)
    names = _names(cv.make_jaxpr(cv.grad(checkpoint(f)))(x))
    assert names.count("checkpoint") == 2 and "sin" not in names   # the forward part and the backward part
    inlined = _names(cv.make_jaxpr(cv.grad(checkpoint(f, prevent_cse=False)))(x))
    assert "checkpoint" not in inlined and "sin" in inlined
    # the optimized program of jit(value_and_grad(checkpoint(f))) keeps the recomputation
    # apart from the forward computation (CSE cannot merge them)
    jaxpr = cv.make_jaxpr(cv.value_and_grad(checkpoint(f)))(x)
    from cuvmap.transforms import ir
    assert _names(ir.optimize(jaxpr)).count("checkpoint") == 2
    merged = _names(ir.optimize(cv.make_jaxpr(cv.value_and_grad(checkpoint(f, prevent_cse=False)))(x)))
    assert merged.count("sin") == 2, merged   # sin(x), sin(sin(x)) once each: the recomputation merged
    assert "checkpoint[" in str(jaxpr)


def test_linearize_of_a_checkpointed_function_recomputes_instead_of_keeping(impl_counts):
    f = lambda x: cnp.sin(cnp.sin(x)) * x
    x, t = np.linspace(0, 1, 4), np.linspace(1, 2, 4)
    want = cv.jvp(f, (x,), (t,))
    (y, f_jvp), counts = _run_counted(impl_counts, lambda: cv.linearize(checkpoint(f), x))
    np.testing.assert_allclose(y, want[0], rtol=1e-12)
    assert counts["sin"] == 2
    out, counts = _run_counted(impl_counts, f_jvp, t)
    np.testing.assert_allclose(out, want[1], rtol=1e-12)
    assert counts.get("sin", 0) >= 1   # the region's residuals come from its inputs again
    (_, plain_jvp), _ = _run_counted(impl_counts, lambda: cv.linearize(f, x))
    _, counts = _run_counted(impl_counts, plain_jvp, t)
    assert counts.get("sin", 0) == 0


def test_nested_regions_and_closures_over_traced_values():
    inner = checkpoint(lambda y: cnp.sin(y) * cnp.cos(y))
    outer = checkpoint(lambda y: inner(y * 2.0) + inner(y))
    x = np.linspace(0, 1, 5)
    ref = lambda y: cnp.sin(2 * y) * cnp.cos(2 * y) + cnp.sin(y) * cnp.cos(y)
    np.testing.assert_allclose(cv.grad(lambda y: cnp.sum(outer(y)))(x), cv.grad(lambda y: cnp.sum(ref(y)))(x), rtol=1e-12)
    check_grads(outer, (x,), order=2)
    # a region closing over the differentiated argument: its cotangent reaches w
    w = np.linspace(1, 2, 5)
    g = cv.grad(lambda w: cnp.sum(checkpoint(lambda y: cnp.sin(y * w))(x)))(w)
    np.testing.assert_allclose(g, np.cos(x * w) * x, rtol=1e-12)


def test_static_argnums_integer_inputs_and_outputs():
    def f(x, n, idx):
        for _ in range(n):
            x = cnp.sin(x)
        return x[idx], cnp.argmax(x)

    fc = checkpoint(f, static_argnums=(1,))
    x, idx = np.linspace(0, 1, 4), np.array([3, 0])
    val, arg = fc(x, 3, idx)
    np.testing.assert_allclose(val, np.sin(np.sin(np.sin(x)))[idx])
    assert arg == 3
    g = cv.grad(lambda x: cnp.sum(fc(x, 2, idx)[0]))(x)
    np.testing.assert_allclose(g, cv.grad(lambda x: cnp.sum(f(x, 2, idx)[0]))(x), rtol=1e-12)


def test_remat_is_checkpoint_and_decorator_form():
    assert cv.remat is cv.checkpoint

    @cv.checkpoint
    def f(x):
        return cnp.sin(x) ** 2

    @cv.remat(policy=checkpoint_policies.dots_saveable)
    def h(x):
        return cnp.sin(x) ** 2

    x = np.linspace(0, 1, 3)
    np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(f(x)))(x), np.sin(2 * x), rtol=1e-12)
    np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(h(x)))(x), np.sin(2 * x), rtol=1e-12)


def test_errors():
    with pytest.raises(cv.TransformError, match=r"checkpoint\(f\): policy must be None or a function"):
        def f(x):
            return x
        checkpoint(f, policy="dots")
    with pytest.raises(TypeError, match="prevent_cse must be a bool or tuple of bools"):
        checkpoint(lambda x: x, prevent_cse=None)
    with pytest.raises(cv.TransformError, match=r"prevent_cse \(True, False\) must be a bool or a pytree prefix"):
        checkpoint(lambda x: x, prevent_cse=(True, False))(1.0)
    with pytest.raises(TypeError, match="checkpoint"):
        checkpoint(3)

    def branchy(x):
        return x if cnp.sum(x) > 0 else -x

    with pytest.raises(cv.ConcretizationError, match=r"checkpoint\(branchy\)"):
        cv.grad(lambda x: cnp.sum(checkpoint(branchy)(x)))(np.ones(2))


def test_checkpoint_on_each_backend(backend):
    """grad, vmap(grad) and jit(grad) of a checkpointed function on the arrays of
    ``backend`` (CuPy on the GPU: the regions' programs run on the device)."""
    f = lambda w, x: cnp.sum(cnp.tanh(x @ w) ** 2)
    fc = checkpoint(f)
    rng = _rng(30)
    w, xs = rng.standard_normal((4, 3)), rng.standard_normal((5, 2, 4))
    on = (lambda a: cv.device_put(a, "gpu")) if backend == "gpu" else (lambda a: a)
    back = lambda t: cv.device_put(t, "cpu")
    wd, xd = on(w), on(xs)
    _assert_tree_close(back(cv.grad(fc)(wd, xd[0])), cv.grad(f)(w, xs[0]))
    _assert_tree_close(back(cv.vmap(cv.grad(fc), in_axes=(None, 0))(wd, xd)),
                       np.stack([cv.grad(f)(w, x) for x in xs]))
    _assert_tree_close(back(cv.jit(cv.grad(fc))(wd, xd[0])), cv.grad(f)(w, xs[0]))
    _assert_tree_close(back(cv.grad(cv.jit(fc))(wd, xd[0])), cv.grad(f)(w, xs[0]))


def test_a_program_with_regions_plans_with_elementwise_fusion():
    """The GPU's fusion pass (run on the CPU with each group's reference as its kernel)
    fuses the elementwise chains around the regions and leaves the regions' equations be."""
    from cuvmap.transforms import executor, ir

    f = lambda x: cnp.sum(cnp.sin(cnp.exp(x) * 2.0 + 1.0))
    loss = lambda f: (lambda x: cnp.sum(cnp.tanh(f(x) * x) * 3.0))
    x = np.linspace(0, 1, 8)
    program = ir.optimize(cv.make_jaxpr(cv.value_and_grad(loss(checkpoint(f))))(x))
    assert "checkpoint" in _names(program)
    p = executor.plan(program, fuse=True, fused_callable=lambda g: g.reference, graphs=False)
    assert any(s.kind == executor.FUSED for s in p.steps)
    _assert_tree_close(tuple(executor.execute(p, [x])), cv.value_and_grad(loss(f))(x))


# A sine whose custom gradient is twice the true one: a result that uses the rule differs
# from one that differentiates the body.
@cv.custom_vjp
def _doubled_grad_sin(x):
    return cnp.sin(x)


_doubled_grad_sin.defvjp(lambda x: (cnp.sin(x), cnp.cos(x)), lambda r, g: (2.0 * r * g,))


# A square whose custom JVP is 1.5 times the true one.
@cv.custom_jvp
def _steep_square(x):
    return x * x


@_steep_square.defjvp
def _steep_square_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _steep_square(x), 3.0 * x * t


def test_a_program_with_a_region_and_a_custom_vjp_call_prints_and_runs():
    """Both kinds of equation with several results (NOTE [an equation with several results]
    in cuvmap/transforms/ir.py) in one program: it prints each as one equation, plans
    each as a MULTI step, and runs eagerly, jitted and under grad (closed forms, with the
    custom rule's doubled derivative of sin)."""
    import re

    from cuvmap.transforms import executor, ir

    region = checkpoint(lambda y: (cnp.tanh(y), cnp.sum(y * y)))

    def f(x):
        a, s = region(x)
        return cnp.sum(_doubled_grad_sin(a)) * s

    text = str(cv.make_jaxpr(f)(np.linspace(0.1, 1, 3, dtype=np.float32)))
    assert re.search(r"\n    \w+:f32\[3\] \w+:f32\[\] = checkpoint\[\n      program=\{ lambda ; \w+:f32\[3\]\. let\n"
                     r"(.*\n)*?      policy=None\n      prevent_cse=True\n    \] \w+\n", text), text
    assert re.search(r"\n    \w+:f32\[3\] = custom_vjp_call\[fun=", text), text
    x = np.linspace(0.1, 1, 3)
    t, s = np.tanh(x), np.sum(x * x)
    want = np.sum(np.sin(t)) * s
    want_grad = 2.0 * np.cos(t) * (1 - t * t) * s + np.sum(np.sin(t)) * 2 * x
    for run in (f, cv.jit(f)):
        np.testing.assert_allclose(run(x), want, rtol=1e-12)
    for g in (cv.grad(f), cv.jit(cv.grad(f)), cv.grad(cv.jit(f))):
        np.testing.assert_allclose(g(x), want_grad, rtol=1e-12)
    program = ir.optimize(cv.make_jaxpr(f)(x))
    p = executor.plan(program, graphs=False)
    multi = [s for s in p.steps if s.kind == executor.MULTI]
    assert [len(s.out) for s in multi] == [2, 1], p.steps
    np.testing.assert_allclose(executor.execute(p, [x])[0], want, rtol=1e-12)
    # DCE drops the region's dead result and the equations only it needed (the tanh); the
    # program still runs
    second = ir.optimize(cv.make_jaxpr(lambda x: region(x)[1])(x))
    assert [len(e.outs) for e in second.jaxpr.eqns] == [1]
    assert "tanh" not in str(second.jaxpr.eqns[0].params["program"])
    np.testing.assert_allclose(cv.jit(lambda x: region(x)[1])(x), s, rtol=1e-12)
    # a dead custom call stays whole (its rules compute every output)
    custom = ir.optimize(cv.make_jaxpr(lambda x: _doubled_grad_sin(x) * 0.0)(x))
    assert [e.primitive.name for e in custom.jaxpr.eqns] == ["custom_vjp_call", "mul"]


def test_custom_calls_inside_a_region():
    """A region whose program holds a custom-derivative call: partial evaluation of the
    region (grad, linearize, with each policy) splits the call's equation as a whole and
    the custom rule is used (closed forms)."""
    x, t = np.linspace(0.1, 1, 4), np.linspace(1, 2, 4)
    u = np.sin(x) ** 2
    # d/dx tanh(steep(sin x)) * x with the rule's 3 sin(x) cos(x) for d steep(sin x)/dx
    dfdx = (1 - np.tanh(u) ** 2) * 3 * np.sin(x) * np.cos(x) * x + np.tanh(u)
    g = lambda x: cnp.tanh(_steep_square(cnp.sin(x))) * x
    h = lambda x: cnp.sum(cnp.tanh(_doubled_grad_sin(x)) * x)
    dhdx = (1 - np.tanh(np.sin(x)) ** 2) * 2 * np.cos(x) * x + np.tanh(np.sin(x))
    for variant in ("default", "everything_saveable", "dots_saveable"):
        gc = checkpoint(g, **VARIANTS[variant])
        y, g_jvp = cv.linearize(gc, x)
        np.testing.assert_allclose(y, np.tanh(u) * x, rtol=1e-12)
        np.testing.assert_allclose(g_jvp(t), dfdx * t, rtol=1e-12)
        np.testing.assert_allclose(cv.jvp(gc, (x,), (t,))[1], dfdx * t, rtol=1e-12)
        for grad in (cv.grad(lambda x: cnp.sum(gc(x))), cv.jit(cv.grad(lambda x: cnp.sum(gc(x))))):
            np.testing.assert_allclose(grad(x), dfdx, rtol=1e-12)
        hc = checkpoint(h, **VARIANTS[variant])
        for grad in (cv.grad(hc), cv.jit(cv.grad(hc)), cv.grad(cv.jit(hc))):
            np.testing.assert_allclose(grad(x), dhdx, rtol=1e-12)


# name: (a jitted function whose checkpointed region closes over the jit's arguments, its
# arguments, the value of the same function run eagerly)
CLOSING_OVER_JIT_ARGUMENTS = {
    "closure": (lambda a: cv.checkpoint(lambda x: x * a)(2.0), (3.0,)),
    "closure and argument": (lambda a, b: cv.checkpoint(lambda x: cnp.sin(x) * a)(b), (3.0, 2.0)),
    "grad": (cv.grad(lambda a: cv.checkpoint(lambda x: x * a * a)(2.0)), (3.0,)),
    "vmap": (cv.vmap(lambda a: cv.checkpoint(lambda x: x * a)(2.0)), (np.arange(3.0),)),
}


@pytest.mark.parametrize("name", CLOSING_OVER_JIT_ARGUMENTS)
def test_a_checkpointed_function_closing_over_a_jits_arguments(name):
    """The region's program holds the jit's tracers as constants: they become its operands
    (a plan run later holding a tracer raised ConcretizationError)."""
    f, args = CLOSING_OVER_JIT_ARGUMENTS[name]
    np.testing.assert_allclose(cv.jit(f)(*args), f(*args), rtol=1e-15)


def test_a_replaced_impl_is_what_staged_programs_call_next():
    """Primitive.def_impl (JAX's): a linearized or jitted function planned before the impl
    changed calls the new impl on its next run (the plans are made again), and
    rematerialization recomputes sin once while the linear map applies cos twice."""
    from cuvmap import lax

    g = checkpoint(lambda x: (lax.sin(lax.sin(x)), 3.0))
    _, f_lin = cv.linearize(lambda x: g(x)[0], 2.0)
    jitted = cv.jit(lambda x: lax.sin(x))
    jitted(1.0)
    calls = {"sin": 0, "cos": 0}
    sin_impl, cos_impl = lax.sin_p.impl, lax.cos_p.impl

    def counting(name, impl):
        def run(x, **params):
            calls[name] += 1
            return impl(x, **params)
        return run

    try:
        lax.sin_p.def_impl(counting("sin", sin_impl))
        lax.cos_p.def_impl(counting("cos", cos_impl))
        np.testing.assert_allclose(f_lin(3.0), np.cos(np.sin(2.0)) * np.cos(2.0) * 3.0, rtol=1e-12)
        assert calls == {"sin": 1, "cos": 2}
        jitted(1.0)
        assert calls["sin"] == 2
    finally:
        lax.sin_p.def_impl(sin_impl)
        lax.cos_p.def_impl(cos_impl)
