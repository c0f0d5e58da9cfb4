"""Collectives over named axes (cuvmap.lax.parallel) in one process.

The op table (``op_table._rows_parallel``) checks each collective under a named vmap
against a closed form, with derivatives against finite differences and an outer unnamed
vmap against a loop. Here: the registry, JAX's semantics (against JAX's own
``vmap(axis_name=...)`` where JAX is installed, and against closed forms and loops
always), jit (staged equations, caches that follow the axis size), nested names, errors,
and ``cuvmap.distributed``'s pieces that need no second process: a job of one, the
collectives' process path on a stand-in communicator (threads), the launcher's
environment and the watchdog.
"""
import ctypes
import re
import sys
import threading
import time
import types

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
import cuvmap.test_util  # noqa: F401 - cv.test_util (run alone, nothing else imports it)
from cuvmap import core, distributed, lax
from cuvmap.distributed import launcher as launch_mod
from cuvmap.distributed import watchdog as watchdog_mod
from cuvmap.lax import parallel
from cuvmap.transforms import batching, jvp as jvp_mod, vjp as vjp_mod


def rand(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("prim", parallel.collective_primitives(), ids=lambda p: p.name)
def test_every_collective_has_its_rules(prim):
    assert not cv.test_util.missing_rules(prim), cv.test_util.missing_rules(prim)
    assert prim in batching.axis_primitive_batchers and prim not in batching.primitive_batchers
    if prim.differentiable:
        assert prim in jvp_mod.primitive_jvps and prim in vjp_mod.primitive_vjps, prim
    assert prim in cv.lax.all_primitives() and prim.host_sync  # (never in a CUDA graph)


def test_collectives_are_exported_from_lax():
    for name in ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute", "all_to_all",
                 "axis_index"):
        assert getattr(cv.lax, name) is getattr(parallel, name)


# ---------------------------------------------------------------------------------------
# Semantics, against closed forms and loops
# ---------------------------------------------------------------------------------------


def test_psum_of_a_shared_value_is_n_times_it():
    xs = rand(5, 3)
    out = cv.vmap(lambda x: lax.psum(2.0, "i") * x, axis_name="i")(xs)
    np.testing.assert_allclose(out, 10.0 * xs)
    # a value of another transform is shared by every example too
    c = rand(3, seed=1)
    np.testing.assert_allclose(cv.vmap(lambda x: lax.psum(c, "i"), axis_name="i")(xs), np.broadcast_to(5 * c, (5, 3)))


def test_reverse_mode_differentiates_the_sum_over_examples():
    """JAX's rule: the transpose of psum is psum, so vmap(grad(f)) is the gradient of the
    sum over the examples of f's outputs with respect to each example's input."""
    xs = rand(4)
    np.testing.assert_allclose(cv.vmap(cv.grad(lambda x: lax.psum(x, "i")), axis_name="i")(xs), np.full(4, 4.0))
    g = cv.vmap(cv.grad(lambda p, x: lax.psum(p * x, "i")), in_axes=(None, 0), axis_name="i")(2.0, xs)
    np.testing.assert_allclose(g, 4 * xs)  # ∂/∂p of Σ_b psum(p x)_b, per example
    g = cv.vmap(cv.grad(lambda x: lax.pmean(x ** 2, "i")), axis_name="i")(xs)
    np.testing.assert_allclose(g, 2 * xs)


def _loss(p, x, y):
    return (cnp.tanh(x @ p["w"] + p["b"]) - y) ** 2


def _params():
    return {"w": rand(3, seed=2), "b": np.asarray(0.3)}


def test_the_mean_gradient_of_data_parallel_training():
    """pmean of per-example gradients (data parallelism's all-reduce, here over a vmap's
    examples) is the gradient of the mean loss, on every example."""
    p, xs, ys = _params(), rand(6, 3, seed=3), rand(6, seed=4)

    def step(p, x, y):
        return lax.pmean(cv.grad(_loss)(p, x, y), "i")

    got = cv.vmap(step, in_axes=(None, 0, 0), axis_name="i")(p, xs, ys)
    want = cv.grad(lambda p: cnp.mean(cv.vmap(_loss, in_axes=(None, 0, 0))(p, xs, ys)))(p)
    for k in p:
        np.testing.assert_allclose(got[k], np.broadcast_to(want[k], (6,) + np.shape(want[k])), rtol=1e-12)
    # grad of the pmean-ed loss is each example's own gradient: the cotangent of pmean's
    # operand is psum(1/n) = 1 (reverse mode differentiates the sum over the examples)
    got2 = cv.vmap(cv.grad(lambda p, x, y: lax.pmean(_loss(p, x, y), "i")), in_axes=(None, 0, 0), axis_name="i")(p, xs, ys)
    own = cv.vmap(cv.grad(_loss), in_axes=(None, 0, 0))(p, xs, ys)
    for k in p:
        np.testing.assert_allclose(got2[k], own[k], rtol=1e-12)


def test_batch_norm_statistics_across_the_batch_under_jit_grad_and_jvp():
    xs, ws = rand(8, 4, seed=5), rand(4, seed=6)

    def normalised(x):
        mean = lax.pmean(x, "i")
        return (x - mean) / cnp.sqrt(lax.pmean((x - mean) ** 2, "i") + 1e-5)

    def total(xs):  # the same batch norm written over the whole batch: the reference
        mean = cnp.mean(xs, 0)
        return cnp.sum(((xs - mean) / cnp.sqrt(cnp.var(xs, 0) + 1e-5)) @ ws)

    per = cv.vmap(lambda x: cnp.sum(normalised(x) @ ws), axis_name="i")
    np.testing.assert_allclose(np.sum(per(xs)), total(xs), rtol=1e-12)
    np.testing.assert_allclose(cv.jit(per)(xs), per(xs), rtol=1e-12)
    np.testing.assert_allclose(cv.grad(lambda xs: cnp.sum(per(xs)))(xs), cv.grad(total)(xs), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cv.grad(lambda xs: cnp.sum(cv.jit(per)(xs)))(xs), cv.grad(total)(xs), rtol=1e-10,
                               atol=1e-12)
    t = rand(8, 4, seed=7)
    _, tangent = cv.jvp(lambda xs: cnp.sum(per(xs)), (xs,), (t,))
    _, want = cv.jvp(total, (xs,), (t,))
    np.testing.assert_allclose(tangent, want, rtol=1e-10)
    # vmap(grad) inside the named axis: each example's gradient of the batch's total
    per_example = cv.vmap(cv.grad(lambda x: cnp.sum(normalised(x) @ ws)), axis_name="i")(xs)
    np.testing.assert_allclose(per_example, cv.grad(total)(xs), rtol=1e-10, atol=1e-12)


def test_pmax_derivative_is_shared_between_ties():
    xs = np.array([1.0, 3.0, 3.0, 2.0])
    g = cv.grad(lambda xs: cnp.sum(cv.vmap(lambda x: lax.pmax(x, "i"), axis_name="i")(xs)))(xs)
    np.testing.assert_allclose(g, [0, 2, 2, 0])  # 4 outputs, each splitting 1 between the two 3s


def test_dtypes():
    ints = np.arange(4, dtype=np.int32)
    assert cv.vmap(lambda x: lax.psum(x, "i"), axis_name="i")(ints).dtype == np.int32
    bools = cv.vmap(lambda x: lax.psum(x, "i"), axis_name="i")(np.array([True, False, True]))
    assert bools.dtype == np.int64 and list(bools) == [2, 2, 2]
    mean = cv.vmap(lambda x: lax.pmean(x, "i"), axis_name="i")(ints)
    assert mean.dtype == np.float64 and list(mean) == [1.5] * 4
    f32 = cv.vmap(cv.grad(lambda x: lax.pmean(x * x, "i")), axis_name="i")(rand(3, dtype=np.float32))
    assert f32.dtype == np.float32
    assert cv.vmap(lambda x: lax.axis_index("i"), axis_name="i")(ints).dtype == np.int32


def test_a_pytree_and_a_batch_of_one_and_an_empty_batch():
    tree_in = {"a": rand(3, 2), "b": rand(3)}
    out = cv.vmap(lambda t: lax.psum(t, "i"), axis_name="i")(tree_in)
    np.testing.assert_allclose(out["a"], np.broadcast_to(tree_in["a"].sum(0), (3, 2)))
    np.testing.assert_allclose(out["b"], np.full(3, tree_in["b"].sum()))
    one = rand(1, 4)
    np.testing.assert_allclose(cv.vmap(lambda x: lax.all_gather(x, "i"), axis_name="i")(one), one[None])
    empty = np.zeros((0, 3))
    assert cv.vmap(lambda x: lax.psum(x, "i"), axis_name="i")(empty).shape == (0, 3)
    assert cv.vmap(lambda x: lax.all_gather(x, "i"), axis_name="i")(empty).shape == (0, 0, 3)
    assert cv.vmap(lambda x: lax.axis_index("i"), axis_name="i")(empty).shape == (0,)


def test_nested_names_and_shadowing():
    xs = rand(2, 3)
    inner = cv.vmap(cv.vmap(lambda x: lax.psum(x, "j"), axis_name="j"), axis_name="i")(xs)
    np.testing.assert_allclose(inner, np.broadcast_to(xs.sum(1, keepdims=True), (2, 3)))
    outer = cv.vmap(cv.vmap(lambda x: lax.psum(x, "i"), axis_name="j"), axis_name="i")(xs)
    np.testing.assert_allclose(outer, np.broadcast_to(xs.sum(0), (2, 3)))
    # the inner "i" shadows the outer one
    shadow = cv.vmap(cv.vmap(lambda x: lax.psum(x, "i"), axis_name="i"), axis_name="i")(xs)
    np.testing.assert_allclose(shadow, inner)
    # an unnamed vmap between them passes its batch dim through
    mid = cv.vmap(cv.vmap(cv.vmap(lambda x: lax.psum(x, "i"))), axis_name="i")(rand(2, 3, 4))
    np.testing.assert_allclose(mid, np.broadcast_to(rand(2, 3, 4).sum(0), (2, 3, 4)))


def test_collectives_compose_with_checkpoint_and_custom_jvp():
    xs = rand(5)

    @cv.custom_jvp
    def square(x):
        return x * x

    square.defjvp(lambda primals, tangents: (square(primals[0]), 2 * primals[0] * tangents[0]))

    def f(x):
        return lax.psum(square(cnp.sin(x)), "i")

    want = cv.vmap(cv.grad(f), axis_name="i")(xs)
    np.testing.assert_allclose(want, 5 * 2 * np.sin(xs) * np.cos(xs), rtol=1e-12)
    np.testing.assert_allclose(cv.vmap(cv.grad(cv.checkpoint(f)), axis_name="i")(xs), want, rtol=1e-12)
    np.testing.assert_allclose(cv.jit(cv.vmap(cv.grad(f), axis_name="i"))(xs), want, rtol=1e-12)


@pytest.mark.parametrize("call", [
    lambda c: cv.jit(lambda c: lax.psum(c, "i"))(c),
    lambda c: cv.checkpoint(lambda c: lax.psum(c, "i"))(c),
    lambda c: lax.fori_loop(0, 2, lambda k, acc: acc + lax.psum(c, "i") / 2, 0.0),
    lambda c: lax.while_loop(lambda acc: acc < 1, lambda acc: acc + lax.psum(c, "i"), 0.0),
    lambda c: lax.cond(c > 0, lambda c: lax.psum(c, "i"), lambda c: -lax.psum(c, "i"), c),
], ids=["jit", "checkpoint", "fori_loop", "while_loop", "cond"])
def test_a_call_whose_operands_no_vmap_owns_reaches_the_vmap_of_its_collectives(call):
    """A program (jit, checkpoint, control flow) whose body sums a value every example
    shares over "i" is processed by the vmap of "i" though it owns none of its operands:
    n times the value, not an evaluation outside the vmap."""
    for n in (3, 5):
        out = cv.vmap(lambda x: call(2.0) * x, axis_name="i")(np.ones(n))
        np.testing.assert_allclose(out, np.full(n, 2.0 * n))


def test_grad_of_a_scan_with_a_collective_under_a_named_vmap():
    """The backward scan of psum's transpose reads only the (shared) cotangents."""
    xs = rand(4, 5)

    def f(x):
        return lax.scan(lambda c, xi: (c + lax.psum(xi, "i"), None), 0.0, x * x)[0]

    want = 4 * 2 * xs  # every example's output depends on every x
    np.testing.assert_allclose(cv.vmap(cv.grad(f), axis_name="i")(xs), want, rtol=1e-12)
    np.testing.assert_allclose(cv.jit(cv.vmap(cv.grad(f), axis_name="i"))(xs), want, rtol=1e-12)


# ---------------------------------------------------------------------------------------
# jit
# ---------------------------------------------------------------------------------------


def _staged_inside(f, xs, **vmap_kwargs):
    """The text of ``make_jaxpr(f)`` traced inside ``vmap(..., axis_name="i")``."""
    texts = []

    def body(x):
        texts.append(str(cv.make_jaxpr(f)(x)))
        return x

    cv.vmap(body, axis_name="i", **vmap_kwargs)(xs)
    return texts[0]


def test_jit_stages_collectives_as_equations():
    xs = rand(3, 2)
    text = _staged_inside(lambda x: lax.psum(x, "i") + lax.pmax(x, ("i",)), xs)
    assert "psum[axes=('i',)]" in text and "pmax[axes=('i',)]" in text, text
    text = _staged_inside(lambda x: lax.all_gather(x, "i", axis=1), xs)
    assert "all_gather[axis_name='i' axis=1 axis_size=3]" in text, text
    text = _staged_inside(lambda x: lax.axis_index("i"), xs)
    assert re.search(r"i32\[\] = axis_index\[axis_name='i'", text), text
    # under vmap the batching rules replace them by batched primitives
    outer = str(cv.make_jaxpr(cv.vmap(lambda x: lax.psum(x, "i"), axis_name="i"))(xs))
    assert "psum" not in outer and "reduce_sum" in outer, outer


def test_a_jitted_function_follows_the_axis_size():
    """A program staged inside a named vmap depends on the axis size (all_gather's shape,
    pmean's divisor): jit's cache keys on the named axes in scope."""
    gather = cv.jit(lambda x: lax.all_gather(x, "i"))
    mean = cv.jit(lambda x: lax.pmean(x, "i"))
    for n in (3, 5, 3):
        xs = rand(n, 2, seed=n)
        np.testing.assert_allclose(cv.vmap(gather, axis_name="i")(xs), np.broadcast_to(xs, (n, n, 2)))
        np.testing.assert_allclose(cv.vmap(mean, axis_name="i")(xs), np.broadcast_to(xs.mean(0), (n, 2)))
    assert gather.trace_count == 2 and mean.trace_count == 2
    # vmap of a jitted function, and jit of a vmap, compute the same
    xs = rand(4, 3)
    np.testing.assert_allclose(cv.jit(cv.vmap(lambda x: lax.pmean(x, "i") * x, axis_name="i"))(xs),
                               xs.mean(0) * xs, rtol=1e-12)


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


def test_an_unbound_name_is_a_clear_error():
    def loss(x):
        return lax.psum(x, "k")

    with pytest.raises(core.UnboundAxisError, match=r"vmap\(loss, axis_name='i'\): psum uses the axis name 'k', "
                                                    r"which is not bound here \(axis names in scope: 'i'\)"):
        cv.vmap(loss, axis_name="i")(rand(3))
    with pytest.raises(core.UnboundAxisError, match=r"axis names in scope: none"):
        loss(rand(3))
    with pytest.raises(core.UnboundAxisError, match=r"jit\(loss\): psum uses the axis name 'k'"):
        cv.jit(loss)(rand(3))
    with pytest.raises(NameError):  # (an UnboundAxisError is a NameError, as JAX's)
        lax.axis_index("nowhere")


@pytest.mark.parametrize("call, message", [
    (lambda x: lax.ppermute(x, "i", [(0, 1), (2, 1)]), r"ppermute: perm .* sends from or to one member twice"),
    (lambda x: lax.ppermute(x, "i", [(0, 3)]), r"ppermute: perm .* names a member outside 0..2"),
    (lambda x: lax.psum(x, ("i", "i")), r"psum: axis_name \(.i., .i.\) repeats a name"),
    (lambda x: lax.ppermute(x, ("i", "j"), [(0, 1)]), r"ppermute acts along one named axis"),
    (lambda x: lax.psum_scatter(x, "i"), r"psum_scatter: the scatter dimension 0 of the operand \(shape \(2,\)\) must "
                                         r"equal the number of members 3"),
    (lambda x: lax.all_to_all(x, "i", 0, 0, tiled=True), r"all_to_all: split_axis 0 .* must be a multiple of"),
    (lambda x: lax.all_gather(x, "i", axis=2), r"all_gather: axis=2 must be an int in \[-2, 2\)"),
    (lambda x: lax.psum(x, None), r"psum: axis_name must be a name"),
])
def test_bad_arguments_name_the_collective(call, message):
    with pytest.raises(core.ShapeError, match=message):
        cv.vmap(call, axis_name="i")(rand(3, 2))


def test_chunked_vmap_with_an_axis_name_raises():
    with pytest.raises(cv.api_util.TransformError, match=r"chunk_size=2 cannot be combined with axis_name: the "
                                                         r"collectives over 'i' need every example"):
        cv.vmap(lambda x: x, axis_name="i", chunk_size=2)
    with pytest.raises(cv.api_util.TransformError, match="axis_name names one axis"):
        cv.vmap(lambda x: x, axis_name=("i", "j"))


# ---------------------------------------------------------------------------------------
# JAX's own vmap(axis_name=...) on the same functions (where JAX is installed)
# ---------------------------------------------------------------------------------------


def _jax_cases(lx, np_):
    """``(name, f, args, in_axes)``: the same functions in cuvmap (``lx`` = cuvmap.lax,
    ``np_`` = cuvmap.numpy) or JAX (jax.lax, jax.numpy)."""
    def bn(x, w):
        mean = lx.pmean(x, "i")
        return np_.sum(((x - mean) / np_.sqrt(lx.pmean((x - mean) ** 2, "i") + 1e-5)) * w)

    def loss(w, x, y):
        return lx.pmean((np_.tanh(x @ w) - y) ** 2, "i")

    return [
        ("batch_norm", bn, (rand(6, 3), rand(3, seed=1)), (0, None)),
        ("mean_loss", loss, (rand(3, seed=2), rand(6, 3, seed=3), rand(6, seed=4)), (None, 0, 0)),
        ("gather_scatter", lambda x: np_.sum(lx.psum_scatter(lx.all_gather(x, "i") * x, "i") ** 2),
         (rand(3, 2, seed=5),), 0),
        ("ppermute_index", lambda x: np_.sum(lx.ppermute(x, "i", [(0, 1), (1, 2), (2, 0)]) * x
                                             * lx.axis_index("i")), (rand(3, 2, seed=6),), 0),
        ("all_to_all", lambda x: np_.sum(lx.all_to_all(x, "i", 0, 0) ** 3 * x), (rand(3, 3, 2, seed=7),), 0),
    ]


@pytest.mark.parametrize("case", range(5))
def test_against_jax(case):
    jax = pytest.importorskip("jax", reason="JAX is not installed (an optional comparison)")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    name, f, args, in_axes = _jax_cases(lax, cnp)[case]
    _, jf, _, _ = _jax_cases(jax.lax, jnp)[case]
    argnums = 0
    for transform in ("value", "grad", "jit_grad"):
        if transform == "value":
            got = cv.vmap(f, in_axes=in_axes, axis_name="i")(*args)
            want = jax.vmap(jf, in_axes=in_axes, axis_name="i")(*args)
        elif transform == "grad":
            got = cv.vmap(cv.grad(f, argnums), in_axes=in_axes, axis_name="i")(*args)
            want = jax.vmap(jax.grad(jf, argnums), in_axes=in_axes, axis_name="i")(*args)
        else:
            got = cv.jit(cv.vmap(cv.grad(f, argnums), in_axes=in_axes, axis_name="i"))(*args)
            want = jax.jit(jax.vmap(jax.grad(jf, argnums), in_axes=in_axes, axis_name="i"))(*args)
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-10, atol=1e-12, err_msg=f"{name} {transform}")
    tangents = tuple(rand(*np.shape(a), seed=9) for a in args)
    got = cv.jvp(cv.vmap(f, in_axes=in_axes, axis_name="i"), args, tangents)[1]
    want = jax.jvp(jax.vmap(jf, in_axes=in_axes, axis_name="i"), args, tangents)[1]
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-10, atol=1e-12, err_msg=f"{name} jvp")


# ---------------------------------------------------------------------------------------
# cuvmap.distributed in one process
# ---------------------------------------------------------------------------------------


def test_a_job_of_one():
    group = distributed.ProcessGroup()
    assert (group.rank, group.size) == (0, 1)
    x = rand(3)

    @distributed.data_parallel
    def f(x):
        return lax.psum(x, "batch"), lax.all_gather(x, "batch"), lax.axis_index("batch"), lax.pmean(x * x, "batch")

    for fn in (f, cv.jit(f)):
        s, g, i, m = fn(x)
        np.testing.assert_array_equal(s, x)
        np.testing.assert_array_equal(g, x[None])
        assert int(i) == 0 and i.dtype == np.int32
        np.testing.assert_allclose(m, x * x)
    assert re.search(r"psum\[axes=\('batch'\(processes=1\),\)\]", str(cv.make_jaxpr(f)(x)))
    # grad outside data_parallel: the backward pass still reaches the group
    g = cv.grad(lambda x: distributed.data_parallel(lambda x: lax.psum(cnp.sum(x * x), "batch"))(x))(x)
    np.testing.assert_allclose(g, 2 * x)
    with pytest.raises(cv.api_util.TransformError, match="axis_name must be one name"):
        distributed.data_parallel(f, axis_name=("a", "b"))


class ThreadCommunicator:
    """A stand-in for a process group: ``size`` threads of one process, each with its own
    ``rank``, exchanging values through shared slots (each thread has an interpreter stack
    and an axis environment of its own). The collectives are written from their
    definitions (NumPy over the gathered values)."""

    class Exchange:
        def __init__(self, size):
            self.size = size
            self.slots = [None] * size
            self.barrier = threading.Barrier(size, timeout=30)

    def __init__(self, exchange, rank):
        self.exchange, self.rank, self.size = exchange, rank, exchange.size

    def _all(self, x):
        ex = self.exchange
        ex.slots[self.rank] = np.array(x)
        ex.barrier.wait()
        values = list(ex.slots)
        ex.barrier.wait()
        return values

    def allreduce(self, x, op="sum", in_place=False, axis_name=None):
        return {"sum": np.sum, "max": np.max, "min": np.min}[op](np.stack(self._all(x)), axis=0).astype(x.dtype)

    def allgather(self, x, axis_name=None):
        return np.stack(self._all(x))

    def reduce_scatter(self, x, axis_name=None):
        return np.sum(np.stack(self._all(x)), axis=0)[self.rank]

    def alltoall(self, x, axis_name=None):
        return np.stack([v[self.rank] for v in self._all(x)])

    def permute(self, x, perm, axis_name=None):
        values = self._all(x)
        source = [s for s, t in perm if t == self.rank]
        return values[source[0]].copy() if source else np.zeros_like(x)


def _collectives(x):
    return [
        lax.psum(x, "batch"), lax.pmax(x, "batch"), lax.pmin(x, "batch"), lax.pmean(x, "batch"),
        lax.all_gather(x, "batch", axis=1), lax.all_gather(x, "batch", axis=1, tiled=True),
        lax.psum_scatter(x, "batch", scatter_dimension=1), lax.psum_scatter(x, "batch", tiled=True),
        lax.ppermute(x, "batch", [(0, 2), (2, 1)]), lax.all_to_all(x, "batch", 1, 0),
        lax.all_to_all(x, "batch", 0, 1, tiled=True), lax.axis_index("batch") * cnp.ones_like(x),
    ]


def test_the_process_path_on_a_stand_in_communicator():
    """Each collective over an axis of processes (the impls that move the member axis and
    cut tiles around the communicator's calls) gives what the same function gives under
    ``vmap(axis_name="batch")``: three threads stand in for three processes, eagerly, under
    jit and under grad."""
    size = 3
    xs = rand(size, 3, 3)
    want = cv.vmap(lambda x: _collectives(x), axis_name="batch")(xs)
    want_grad = cv.vmap(cv.grad(lambda x: cnp.sum(cnp.stack([cnp.sum(o ** 2) for o in _collectives(x)]))),
                        axis_name="batch")(xs)
    jitted = cv.jit(_collectives)
    exchange = ThreadCommunicator.Exchange(size)
    results, errors = {}, []

    def run(rank):
        try:
            group = ThreadCommunicator(exchange, rank)
            dp = distributed.data_parallel(_collectives, group=group)
            dp_jit = distributed.data_parallel(jitted, group=group)
            dp_grad = distributed.data_parallel(
                cv.grad(lambda x: cnp.sum(cnp.stack([cnp.sum(o ** 2) for o in _collectives(x)]))), group=group)
            results[rank] = (dp(xs[rank]), dp_jit(xs[rank]), dp_grad(xs[rank]))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)
            exchange.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    for rank in range(size):
        eager, staged, grad = results[rank]
        for k, (e, s, w) in enumerate(zip(eager, staged, want)):
            np.testing.assert_allclose(e, w[rank], rtol=1e-12, err_msg=f"collective {k}, rank {rank}")
            np.testing.assert_allclose(s, w[rank], rtol=1e-12, err_msg=f"collective {k} under jit, rank {rank}")
        np.testing.assert_allclose(grad, want_grad[rank], rtol=1e-10, err_msg=f"grad, rank {rank}")
    assert jitted.trace_count == size  # one program per group (the staged equations hold it)


@pytest.mark.parametrize("environ, want", [
    ({}, (1, 0, 0, None)),
    ({"PMI_SIZE": "4", "PMI_RANK": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}, (4, 2, 0, "PMI")),
    ({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
     (3, 1, 1, "Open MPI")),
    ({"PMI_SIZE": "2", "PMI_RANK": "1"}, (2, 1, 1, "PMI")),  # one host: the local rank is the rank
])
def test_the_launchers_environment(environ, want):
    info = launch_mod.detect(environ)
    assert (info.size, info.rank, info.local_rank) == want[:3]
    assert (info.launcher is None) if want[3] is None else info.launcher.startswith(want[3])


def test_a_launchers_environment_that_makes_no_sense():
    with pytest.raises(RuntimeError, match=r"PMI_RANK='x' .* is not an integer"):
        launch_mod.detect({"PMI_SIZE": "2", "PMI_RANK": "x"})
    with pytest.raises(RuntimeError, match="rank 5 of 2"):
        launch_mod.detect({"PMI_SIZE": "2", "PMI_RANK": "5"})


def test_initialize_without_a_launcher_is_a_job_of_one(monkeypatch):
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(distributed.group, "_group", None)
    group = distributed.initialize()
    assert (group.rank, group.size, group.comm) == (0, 1, None)
    assert distributed.initialize() is group


class _Event:
    def __init__(self, done):
        self.done = done


@pytest.mark.slow
def test_the_watchdog_fires_on_a_collective_that_waits_too_long():
    fired = []
    dog = watchdog_mod.Watchdog(0.2, fired.append, describe="process 1 of 2: ")
    dog.begin(("all-reduce (sum)", np.dtype(np.float32), (3,)))
    dog.end()
    dog.enqueued(("NCCL all-gather", None, None), _Event(True))
    time.sleep(0.6)
    assert not fired  # a finished call and a completed event are not overdue
    dog.begin(("all-reduce (sum)", np.dtype(np.float32), (3,)))
    deadline = time.monotonic() + 5
    while not fired and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fired and re.match(r"cuvmap\.distributed: process 1 of 2: all-reduce \(sum\) of float32\[3\] has waited "
                              r"\d+ s for the other processes \(the timeout is 0\.2 s", fired[0])
    fired_gpu = []
    gpu = watchdog_mod.Watchdog(0.2, fired_gpu.append)
    gpu.enqueued(("NCCL all-reduce (sum)", np.dtype(np.float32), (8,)), _Event(False))
    deadline = time.monotonic() + 5
    while not fired_gpu and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fired_gpu and "NCCL all-reduce" in fired_gpu[0]


def test_the_timeout_setting(monkeypatch):
    monkeypatch.setenv("CUVMAP_COLLECTIVE_TIMEOUT", "12.5")
    assert watchdog_mod.default_timeout() == 12.5
    monkeypatch.setenv("CUVMAP_COLLECTIVE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="CUVMAP_COLLECTIVE_TIMEOUT='soon' is not a number"):
        watchdog_mod.default_timeout()


# ---------------------------------------------------------------------------------------
# The NCCL engine's bookkeeping on a stand-in (no GPU here): flat buffers, dtype codes,
# views back, the per-peer pieces of all-to-all, empty operands
# ---------------------------------------------------------------------------------------


class _HostArray(np.ndarray):
    """A NumPy array that answers like a CuPy one (``.data.ptr``, ``.device.id``)."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)

    @property
    def device(self):
        return types.SimpleNamespace(id=0)


def _fake_cupy_and_nccl(log):
    """Stand-ins for ``cupy`` and ``cupy.cuda.nccl``: a 1-rank communicator over host
    memory (a collective of one process copies its operand), logging each call's NCCL
    dtype code and count."""
    itemsize = {}
    nccl = types.ModuleType("cupy.cuda.nccl")
    for code, (name, size) in enumerate([("INT8", 1), ("UINT8", 1), ("INT32", 4), ("UINT32", 4), ("INT64", 8),
                                         ("UINT64", 8), ("FLOAT16", 2), ("FLOAT32", 4), ("FLOAT64", 8)]):
        setattr(nccl, f"NCCL_{name}", code)
        itemsize[code] = size
    nccl.NCCL_SUM, nccl.NCCL_PROD, nccl.NCCL_MAX, nccl.NCCL_MIN = range(4)
    nccl.get_unique_id = lambda: (0,) * 128
    group = []
    nccl.groupStart = lambda: group.clear()

    def group_end():
        sends = [g for g in group if g[0] == "send"]
        recvs = [g for g in group if g[0] == "recv"]
        for (_, src, n), (_, dst, m) in zip(sends, recvs):  # one process: each send is to itself
            assert n == m
            ctypes.memmove(dst, src, n)

    nccl.groupEnd = group_end

    class Communicator:
        def __init__(self, size, uid, rank):
            assert (size, rank) == (1, 0) and len(uid) == 128

        def _copy(self, what, send, recv, count, dtype):
            log.append((what, dtype, count))
            ctypes.memmove(recv, send, count * itemsize[dtype])

        def allReduce(self, send, recv, count, dtype, op, stream):
            self._copy("allReduce", send, recv, count, dtype)

        def allGather(self, send, recv, count, dtype, stream):
            self._copy("allGather", send, recv, count, dtype)

        def reduceScatter(self, send, recv, count, dtype, op, stream):
            self._copy("reduceScatter", send, recv, count, dtype)

        def send(self, ptr, count, dtype, peer, stream):
            group.append(("send", ptr, count * itemsize[dtype]))

        def recv(self, ptr, count, dtype, peer, stream):
            group.append(("recv", ptr, count * itemsize[dtype]))

    nccl.NcclCommunicator = Communicator
    host = lambda a: np.asarray(a).view(_HostArray)  # noqa: E731
    stream = types.SimpleNamespace(ptr=0, is_capturing=lambda: False)
    cuda = types.SimpleNamespace(nccl=nccl, Device=lambda: types.SimpleNamespace(id=0),
                                 get_current_stream=lambda: stream,
                                 Event=lambda disable_timing: types.SimpleNamespace(record=lambda s: None, done=True))
    cupy = types.SimpleNamespace(cuda=cuda, ascontiguousarray=lambda a: host(np.ascontiguousarray(a)),
                                 empty_like=lambda a: host(np.empty_like(a)), empty=lambda s, d: host(np.empty(s, d)),
                                 zeros_like=lambda a: host(np.zeros_like(a)))
    return cupy, nccl


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_, np.complex64, np.complex128])
@pytest.mark.parametrize("shape", [(), (0,), (2, 3)])
def test_the_nccl_engine_on_a_stand_in(monkeypatch, dtype, shape):
    from cuvmap.distributed import nccl as nccl_mod

    log = []
    cupy, nccl = _fake_cupy_and_nccl(log)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cupy.cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl)
    fired = []
    engine = nccl_mod.NCCLEngine(0, 1, watchdog=watchdog_mod.Watchdog(60, fired.append))
    values = np.asarray(np.arange(int(np.prod(shape))).reshape(shape) % 3)
    if np.dtype(dtype).kind == "c":
        values = values + 1j * (values + 1)
    x = np.asarray(values.astype(dtype)).view(_HostArray)
    checks = [(engine.allreduce(x, "sum"), x), (engine.allgather(x), x[None]), (engine.reduce_scatter(x[None]), x),
              (engine.alltoall(x[None]), x[None]), (engine.permute(x, [(0, 0)]), x),
              (engine.permute(x, []), np.zeros_like(x))]
    if np.dtype(dtype).kind != "c":
        checks.append((engine.allreduce(x, "max"), x))
    else:
        with pytest.raises(TypeError, match="complex values have no maximum"):
            engine.allreduce(x, "max")
    for got, want in checks:
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # what NCCL was asked: complex as pairs of floats, booleans as bytes, nothing for no element
    code = {np.dtype(np.bool_): nccl.NCCL_UINT8, np.dtype(np.uint8): nccl.NCCL_UINT8,
            np.dtype(np.complex64): nccl.NCCL_FLOAT32, np.dtype(np.complex128): nccl.NCCL_FLOAT64,
            np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.float32): nccl.NCCL_FLOAT32,
            np.dtype(np.int64): nccl.NCCL_INT64}[np.dtype(dtype)]
    count = x.size * (2 if np.dtype(dtype).kind == "c" else 1)
    assert all(entry[1:] == (code, count) for entry in log), log
    assert len(log) == (0 if x.size == 0 else 3 + (np.dtype(dtype).kind != "c"))
    assert not fired
