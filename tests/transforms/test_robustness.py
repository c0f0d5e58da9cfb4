"""Robustness: errors that keep their kind, conversions that would drop a derivative,
batches of size 0, what the tape keeps, results that never alias inputs, and results that
are arrays. Each test failed before the change it covers."""
import math
import tracemalloc

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax, nn
from cuvmap.core import ConcretizationError, ShapeError
from cuvmap.lax import elementwise

# ---------------------------------------------------------------------------------------
# Errors keep their kind (NOTE [errors keep their kind])
# ---------------------------------------------------------------------------------------

X = np.linspace(0.1, 1.0, 6).reshape(2, 3)

TRANSFORMS = {
    "eval": lambda f: f,
    "vmap": lambda f: cv.vmap(f),
    "grad": lambda f: cv.grad(lambda x: cnp.sum(f(x))),
    "vmap(grad)": lambda f: cv.vmap(cv.grad(lambda x: cnp.sum(f(x)))),
    "jvp": lambda f: (lambda x: cv.jvp(f, (x,), (np.ones_like(x),))),
}


class FailingKernel(RuntimeError):
    """Stands for a vendor library's error (a cuDNN status, say)."""


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("kind", [MemoryError, FailingKernel, OverflowError])
def test_an_impl_error_keeps_its_kind_and_gets_a_note(monkeypatch, transform, kind):
    def failing_impl(x):
        raise kind("no luck")

    monkeypatch.setattr(elementwise.exp_p, "impl", failing_impl)
    with pytest.raises(kind, match="no luck") as info:
        TRANSFORMS[transform](cnp.exp)(X)
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1, notes
    # the note names the op with the user's (logical) shape, and the transform
    shape = "float64[3]" if transform.startswith("vmap") else "float64[2, 3]"
    assert notes[0].startswith(f"cuvmap: while evaluating exp({shape})"), notes
    if transform != "eval":
        assert " under " in notes[0]


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_an_out_of_range_index_is_an_index_error(transform):
    with pytest.raises(IndexError, match="out of bounds for the gathered axis with size 3") as info:
        TRANSFORMS[transform](lambda x: cnp.take(x, np.array([0, 5]), axis=-1))(X)
    assert not isinstance(info.value, ShapeError)


def test_bad_shapes_are_still_shape_errors_with_the_op_and_shapes():
    with pytest.raises(ShapeError, match=r"add\(float64\[3\], float64\[4\]\) under vmap"):
        cv.vmap(lambda x: x + np.ones(4))(X)


# ---------------------------------------------------------------------------------------
# Conversions that drop the derivative (NOTE [conversions that drop the derivative])
# ---------------------------------------------------------------------------------------

CONVERSIONS = {
    "float": lambda x: x * float(x),
    "int": lambda x: x * int(x),
    "complex": lambda x: x * complex(x).real,
    "math.exp": lambda x: x * math.exp(x),
    "range": lambda x: x * len(range(x)),
}


@pytest.mark.parametrize("name", CONVERSIONS)
@pytest.mark.parametrize("transform", ["grad", "jvp"])
def test_conversions_that_drop_the_derivative_raise(name, transform):
    f = CONVERSIONS[name]
    with pytest.raises(ConcretizationError, match="would drop its derivative"):
        if transform == "grad":
            cv.grad(f)(3.0)
        else:
            cv.jvp(f, (3.0,), (1.0,))


def test_truth_values_and_stop_gradient_stay_allowed():
    # Python control flow on a value under eager grad drops no derivative
    assert float(cv.grad(lambda x: x ** 2 if x > 0 else -x)(3.0)) == 6.0
    # the detachment, when intended, is spelled stop_gradient
    assert float(cv.grad(lambda x: x * float(cv.stop_gradient(x)))(3.0)) == 3.0


# ---------------------------------------------------------------------------------------
# Batches of size 0
# ---------------------------------------------------------------------------------------

EMPTY = np.zeros((0, 1, 5, 5))
W = np.ones((2, 1, 3, 3))

EMPTY_BATCH_CASES = {
    "nn.conv": (lambda x: nn.conv(x, W, padding=1), (0, 2, 5, 5)),
    "lax.conv of a batch of one": (lambda x: lax.conv(x[None], W), (0, 1, 2, 3, 3)),
    "nn.max_pool2d": (lambda x: nn.max_pool2d(x, 2), (0, 1, 2, 2)),
    "nn.avg_pool2d": (lambda x: nn.avg_pool2d(x, 2), (0, 1, 2, 2)),
    "grad of a CNN loss": (
        lambda x: cv.grad(lambda w: cnp.sum(nn.relu(nn.conv(x, w)) ** 2))(W), (0,) + W.shape),
    "matmul": (lambda x: x.reshape(-1) @ np.ones((25, 3)), (0, 3)),
}


@pytest.mark.parametrize("name", EMPTY_BATCH_CASES)
def test_vmap_over_an_empty_batch_returns_empty_results(name):
    f, shape = EMPTY_BATCH_CASES[name]
    out = cv.vmap(f)(EMPTY)
    assert out.shape == shape
    assert out.dtype == np.float64


def test_per_example_gradients_of_an_empty_batch():
    params = {"w": W, "b": np.zeros(2)}

    def loss(p, x, y):
        logits = nn.conv(x, p["w"], p["b"]).reshape(-1)[:3]
        return nn.cross_entropy(logits, y)

    grads = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(params, EMPTY, np.zeros(0, np.int64))
    assert grads["w"].shape == (0,) + W.shape
    assert grads["b"].shape == (0, 2)


def test_axis_size_zero_with_nothing_mapped():
    out = cv.vmap(lambda x: x * 2, in_axes=None, axis_size=0)(np.ones(3))
    assert out.shape == (0, 3)


# ---------------------------------------------------------------------------------------
# What the tape keeps (NOTE [what the tape keeps])
# ---------------------------------------------------------------------------------------


def _tape_bytes(fn, steps, x):
    """Bytes allocated and still held after tracing ``steps`` steps of ``fn`` under vjp."""
    def chain(x):
        y = x
        for _ in range(steps):
            y = fn(y)
        return y

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out, pullback = cv.vjp(chain, x)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return held, out, pullback


LINEAR_CHAINS = {
    "add": lambda y: y + 1.0,
    "sub and neg": lambda y: -(y - 2.0),
    "reshape and transpose": lambda y: y.reshape(250, 500).T.reshape(500, 250),
    "slice and pad": lambda y: cnp.pad(y[1:, :], ((1, 0), (0, 0))),
    "sum and broadcast": lambda y: y - cnp.sum(y, axis=0, keepdims=True) * 0.001,
}


@pytest.mark.parametrize("name", LINEAR_CHAINS)
def test_the_tape_of_linear_ops_does_not_grow_with_the_chain(name):
    x = np.ones((500, 250))   # 1 MB
    nbytes = x.nbytes
    short, _, _ = _tape_bytes(LINEAR_CHAINS[name], 2, x)
    long, out, pullback = _tape_bytes(LINEAR_CHAINS[name], 20, x)
    # the output itself and a few temporaries, never one array per step
    assert long - short < 2 * nbytes, (short / nbytes, long / nbytes)
    assert long < 4 * nbytes, long / nbytes
    (ct,) = pullback(np.ones_like(out))
    assert ct.shape == x.shape


def test_the_tape_keeps_what_a_nonlinear_rule_reads():
    # exp's rule reads its output: the chain holds one array per step, and the gradient is right
    x = np.full((500, 250), 0.01)
    held, out, pullback = _tape_bytes(lambda y: cnp.exp(y) * 0.1, 10, x)
    assert held >= 10 * x.nbytes
    # reference: the closed form of d/dx of the composed map, by the chain rule
    y, d = x.copy(), np.ones_like(x)
    for _ in range(10):
        d = d * np.exp(y) * 0.1
        y = np.exp(y) * 0.1
    np.testing.assert_allclose(pullback(np.ones_like(out))[0], d, rtol=1e-12)


# ---------------------------------------------------------------------------------------
# Results never alias inputs (NOTE [results never alias inputs]); results are arrays
# ---------------------------------------------------------------------------------------

ALIASING = {
    "vmap identity": lambda x: [cv.vmap(lambda a: a)(x)],
    "vmap of a view": lambda x: [cv.vmap(lambda a: a[1:])(x)],
    "vmap unmapped output": lambda x: [cv.vmap(lambda a, b: b, in_axes=(0, None))(x, x)],
    "vmap moved axis": lambda x: [cv.vmap(lambda a: a, out_axes=1)(x)],
    "vjp output": lambda x: [cv.vjp(lambda a: a, x)[0]],
    "vjp cotangent": lambda x: list(cv.vjp(lambda a: a, np.ones(x.shape))[1](x)),
    "jvp primal and tangent": lambda x: list(cv.jvp(lambda a: a, (x,), (x,))),
    "value_and_grad value": lambda x: [cv.value_and_grad(lambda a, b: b, argnums=0)(1.0, x[0, 0])[0]],
}


@pytest.mark.parametrize("name", ALIASING)
def test_results_never_share_memory_with_inputs(name):
    x = np.arange(12.0).reshape(3, 4)
    for r in ALIASING[name](x):
        assert not np.shares_memory(r, x), name


def test_gradients_of_a_sum_are_separate_arrays():
    gx, gy = cv.grad(lambda x, y: cnp.sum(x + y), argnums=(0, 1))(np.ones(3), np.ones(3))
    assert not np.shares_memory(gx, gy)
    gx += 1
    np.testing.assert_array_equal(gy, np.ones(3))


@pytest.mark.parametrize("fn", [cnp.var, cnp.std, cnp.mean, cnp.sum, cnp.max, lambda x: cnp.exp(x[0])],
                         ids=["var", "std", "mean", "sum", "max", "exp of an element"])
def test_plain_evaluation_returns_arrays_not_numpy_scalars(fn):
    out = fn(np.arange(4.0))
    assert type(out) is np.ndarray and out.shape == ()


def test_asarray_of_a_list_of_tracers_under_vmap():
    t = np.arange(15.0).reshape(5, 3)
    out = cv.vmap(lambda r: cnp.array([r.sum(), r.mean(), 2.0]))(t)
    np.testing.assert_allclose(out, np.stack([t.sum(1), t.mean(1), np.full(5, 2.0)], axis=1))
    g = cv.grad(lambda r: cnp.sum(cnp.asarray([[r[0], r[1]], [r[2], r[0]]]) ** 2))(np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(g, [4.0, 4.0, 6.0])


def test_cnp_array_copies_like_numpy():
    x = np.ones(3)
    assert not np.shares_memory(cnp.array(x), x)
    assert cnp.asarray(x) is x


# ---------------------------------------------------------------------------------------
# Derivatives at a Python scalar: rules that read an operand's shape get its weak 0-d aval
# ---------------------------------------------------------------------------------------

# name: (f, df/dx at x = 1.0 as a closed form)
AT_A_PYTHON_SCALAR = {
    "index with None": (lambda x: cnp.sum(x[None]), 1.0),
    "reshape": (lambda x: cnp.sum(cnp.reshape(x, (1,))), 1.0),
    "method reshape": (lambda x: cnp.sum(x.reshape(1)), 1.0),
    "stack": (lambda x: cnp.sum(cnp.stack([x, x])), 2.0),
    "atleast_1d": (lambda x: cnp.sum(cnp.atleast_1d(x)), 1.0),
    "expand_dims": (lambda x: cnp.sum(cnp.expand_dims(x, 0)), 1.0),
    "broadcast_to": (lambda x: cnp.sum(cnp.broadcast_to(x, (3,))), 3.0),
    "full with a traced fill": (lambda x: cnp.sum(cnp.full((2,), x)), 2.0),
    "full_like with a traced fill": (lambda x: cnp.sum(cnp.full_like(np.ones((2, 2)), x)), 4.0),
    "array of scalars": (lambda x: cnp.sum(cnp.array([x, x, x])), 3.0),
}


@pytest.mark.parametrize("name", AT_A_PYTHON_SCALAR)
@pytest.mark.parametrize("transform", ["grad", "jacrev", "jacfwd", "grad of grad"])
def test_derivatives_at_a_python_scalar(name, transform):
    f, expected = AT_A_PYTHON_SCALAR[name]
    derivative = {
        "grad": cv.grad(f),
        "jacrev": cv.jacrev(f),
        "jacfwd": cv.jacfwd(f),
        "grad of grad": cv.grad(cv.grad(f)),
    }[transform]
    assert float(derivative(1.0)) == (0.0 if transform == "grad of grad" else expected)
