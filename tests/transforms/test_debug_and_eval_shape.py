"""``cuvmap.debug.print`` / ``debug.callback`` under every transform (NOTE [debug
callbacks] in cuvmap/lax/callbacks.py), and ``eval_shape`` / ``ShapeDtypeStruct``.

References: the printed lines are closed forms of the inputs (what one call per run, per
example, per step must print); eval_shape's results are the shapes of the same functions
run on arrays; "no array work" is a memory bound far below the shapes' sizes."""
import tracemalloc

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax
from cuvmap.nn import layers

X = np.array([0.0, 1.0, 2.0])
XS = np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])


def printing(x):
    cv.debug.print("x={x} s={s}", x=x, s=cnp.sum(x))
    return cnp.sum(cnp.sin(x))


def _line(x):
    return f"x={x} s={np.sum(x)}"


# name: (run it, the lines it prints)
DEBUG_PRINT = {
    "eager": (lambda: printing(X), [_line(X)]),
    "jit, two calls": (lambda: [cv.jit(printing)(v) for v in (X, X + 1)], [_line(X), _line(X + 1)]),
    "grad: the primal": (lambda: cv.grad(printing)(X), [_line(X)]),
    "jvp": (lambda: cv.jvp(printing, (X,), (np.ones(3),)), [_line(X)]),
    "vmap: each example in order": (lambda: cv.vmap(printing)(XS), [_line(XS[0]), _line(XS[1])]),
    "jit(vmap)": (lambda: cv.jit(cv.vmap(printing))(XS), [_line(XS[0]), _line(XS[1])]),
    "vmap(grad)": (lambda: cv.vmap(cv.grad(printing))(XS), [_line(XS[0]), _line(XS[1])]),
    "jit(grad)": (lambda: cv.jit(cv.grad(printing))(X), [_line(X)]),
    "grad(jit)": (lambda: cv.grad(cv.jit(printing))(X), [_line(X)]),
    "scan: each step": (
        lambda: cv.jit(lambda xs: lax.scan(lambda c, x: (printing(x) + c, None), 0.0, xs))(XS),
        [_line(XS[0]), _line(XS[1])]),
    "while_loop": (
        lambda: lax.while_loop(lambda c: c < 3, lambda c: (cv.debug.print("c={}", c), c + 1)[1], 0),
        ["c=0", "c=1", "c=2"]),
    "cond: the branch taken": (
        lambda: cv.jit(lambda p, x: lax.cond(p, printing, lambda x: cnp.sum(x), x))(True, X), [_line(X)]),
    "eval_shape: nothing runs": (lambda: cv.eval_shape(printing, X), []),
}


@pytest.mark.parametrize("name", DEBUG_PRINT)
def test_debug_print_runs_with_the_values_whatever_the_transform(name, capsys):
    run, lines = DEBUG_PRINT[name]
    run()
    assert capsys.readouterr().out.splitlines() == lines


def test_a_jitted_debug_print_runs_on_every_call_and_never_while_tracing(capsys):
    jf = cv.jit(printing)
    cv.make_jaxpr(printing)(X)  # staging alone prints nothing
    assert capsys.readouterr().out == ""
    for _ in range(3):
        jf(X)
    assert capsys.readouterr().out.splitlines() == [_line(X)] * 3 and jf.trace_count == 1


def test_effects_survive_the_optimizer():
    """Identical callbacks are not merged (CSE), a callback of constants is not folded, and
    a callback whose token nothing reads is not dead code."""
    seen = []
    const = np.arange(2.0)

    def f(x):
        cv.debug.callback(lambda v: seen.append(("x", v.tolist())), x)
        cv.debug.callback(lambda v: seen.append(("x", v.tolist())), x)
        cv.debug.callback(lambda v, tag: seen.append((tag, v.tolist())), const, "const")
        return x * 2.0

    jf = cv.jit(f)
    jf(X)
    jf(X)
    assert seen == [("x", X.tolist()), ("x", X.tolist()), ("const", [0.0, 1.0])] * 2
    assert str(cv.make_jaxpr(f)(X)).count("debug_callback") == 3


def test_debug_callback_gets_arrays_and_the_static_leaves():
    got = []
    cv.jit(lambda x: (cv.debug.callback(lambda a, b=None, *, note: got.append((type(a), a.shape, b, note)),
                                        {"w": x}["w"], None, note="n"), x)[1])(X)
    assert got == [(np.ndarray, (3,), None, "n")]


@pytest.mark.parametrize("bad, message", [(lambda: cv.debug.print(3, X), "fmt must be a str"),
                                          (lambda: cv.debug.callback("f", X), "fn must be callable")])
def test_debug_errors(bad, message):
    with pytest.raises(TypeError, match=message):
        bad()


# ---------------------------------------------------------------------------------------
# eval_shape and ShapeDtypeStruct
# ---------------------------------------------------------------------------------------

S = cv.ShapeDtypeStruct
MODEL = layers.Serial(layers.Dense(10), layers.Relu, layers.Dense(3), layers.LogSoftmax)
PARAMS = MODEL.init(np.random.default_rng(0), (-1, 784))[1]


def _per_example_grads(p, x, y):
    return cv.vmap(cv.grad(lambda p, x, y: cnp.sum(MODEL.apply(p, x[None]) * y)), in_axes=(None, 0, 0))(p, x, y)


def _sds(tree):
    return cv.tree.map(lambda a: S(a.shape, a.dtype), tree)


# name: (f, the abstract arguments, concrete arguments of the same avals)
EVAL_SHAPE = {
    "matmul": (lambda a, b: a @ b, (S((4, 5), np.float32), S((5, 2), np.float32)),
               (np.ones((4, 5), np.float32), np.ones((5, 2), np.float32))),
    "pytree out": (lambda x, y: {"a": x * y, "b": (cnp.sum(x), y)}, (S((3,), np.float32), 2.0),
                   (np.ones(3, np.float32), 2.0)),
    "int dtype": (lambda i: cnp.sum(i), (S((4,), np.int32),), (np.ones(4, np.int32),)),
    "per-example grads": (_per_example_grads, (_sds(PARAMS), S((6, 784), np.float32), S((6, 3), np.float32)),
                          (PARAMS, np.ones((6, 784), np.float32), np.ones((6, 3), np.float32))),
    "scan": (lambda c, xs: lax.scan(lambda c, x: (c + x, c * x), c, xs), (S((2,), np.float64), S((7, 2), np.float64)),
             (np.ones(2), np.ones((7, 2)))),
}


@pytest.mark.parametrize("name", EVAL_SHAPE)
def test_eval_shape_gives_the_shapes_of_a_run(name):
    f, abstract, concrete = EVAL_SHAPE[name]
    want = cv.tree.map(lambda a: S(np.shape(a), np.asarray(a).dtype, weak_type=isinstance(a, float)), f(*concrete))
    assert cv.eval_shape(f, *abstract) == want
    assert cv.eval_shape(f, *concrete) == want  # arrays are accepted too


def test_eval_shape_does_no_array_work():
    """Per-example gradients of a batch of a million examples (3 GB of inputs, 31 GB of
    gradients): shapes only, in well under a megabyte."""
    args = (_sds(PARAMS), S((10**6, 784), np.float32), S((10**6, 3), np.float32))
    cv.eval_shape(_per_example_grads, *args)  # first use: imports, caches
    tracemalloc.start()
    out = cv.eval_shape(_per_example_grads, *args)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert out[0]["weight"] == S((10**6, 784, 10), np.float32)
    assert peak < 1 << 20, peak


def test_shape_dtype_struct_is_a_value_like_jaxs():
    s = S([2, 3], "float32")
    assert (s.shape, s.dtype, s.ndim, s.size, s.weak_type) == ((2, 3), np.dtype(np.float32), 2, 6, False)
    assert s == S((2, 3), np.float32) and hash(s) == hash(S((2, 3), np.float32)) and s != S((2, 3), np.float64)
    assert repr(s) == "ShapeDtypeStruct(shape=(2, 3), dtype=float32)"
    assert str(cv.make_jaxpr(lambda x: cnp.sin(x))(s)).splitlines()[0] == "{ lambda ; a:f32[2,3]. let"


# ---------------------------------------------------------------------------------------
# Weak types (NOTE [a weak value meets a strong one] in cuvmap/transforms/staging.py)
# ---------------------------------------------------------------------------------------

F32 = np.ones(3, np.float32)
U8 = np.arange(3, dtype=np.uint8)
I32 = np.arange(3, dtype=np.int32)

# name: (f, arguments, what eval_shape gives: JAX's weak types with NumPy's float64 default).
# The Python-number arguments run the same lines eagerly as Python arithmetic, whose
# results are the reference for jit's dtypes.
WEAK_TYPES = {
    "a Python number's arithmetic stays weak": (lambda x: x + 1, (2.0,), S((), np.float64, weak_type=True)),
    "a weak int and a weak float: a weak float": (lambda i, x: i * x + 1, (2, 3.0), S((), np.float64, weak_type=True)),
    "a weak value takes float32 from an array": (lambda x, a: (x + 1) * a, (2.0, F32), S((3,), np.float32)),
    "a weak int takes uint8": (lambda i, a: i * 2 + a, (3, U8), S((3,), np.uint8)),
    "a weak float with int32 is float64": (lambda x, a: x * 2 + a, (2.0, I32), S((3,), np.float64)),
    "a weak value in where": (lambda x, a: cnp.where(a > 0, x * 2, a), (2.0, F32), S((3,), np.float32)),
    "a weak value in maximum": (lambda x, a: cnp.maximum(x - 1, a), (2.0, F32), S((3,), np.float32)),
    "a weak value under vmap": (lambda a, x: cv.vmap(lambda r: (x * 2.0) * r)(a), (np.ones((2, 3), np.float32), 3.0),
                                S((2, 3), np.float32)),
    "a weak value into a checkpointed region": (
        lambda x, a: cv.checkpoint(lambda y, b: cnp.sin(b) * y)(x + 1, a), (2.0, F32), S((3,), np.float32)),
    "a weak value under grad": (lambda x, a: cv.grad(lambda b: cnp.sum((x + 1) * b))(a), (2.0, F32), S((3,), np.float32)),
}


@pytest.mark.parametrize("name", WEAK_TYPES)
def test_weak_types_follow_jax_and_the_run_has_the_staged_dtype(name):
    f, args, want = WEAK_TYPES[name]
    assert cv.eval_shape(f, *args) == want
    out = cv.jit(f)(*args)
    assert (np.shape(out), np.asarray(out).dtype) == (want.shape, want.dtype)
    eager = f(*args)
    assert np.asarray(eager).dtype == want.dtype, "the same lines run eagerly"


def test_a_weak_struct_keeps_its_dtype():
    """JAX's lattice: a weakly typed float32 meeting a Python int stays a weak float32."""
    assert cv.eval_shape(lambda x: x + 1, S((), np.float32, weak_type=True)) == S((), np.float32, weak_type=True)
    assert cv.eval_shape(lambda x: x * 2.5, S((), np.int32, weak_type=True)) == S((), np.float64, weak_type=True)


def test_only_a_computed_weak_value_is_cast():
    """jit's Python-number arguments are Python numbers when it runs (NumPy keeps them
    weak): no cast; a weak value the program computed is a NumPy scalar: cast once."""
    text = str(cv.make_jaxpr(lambda x, a: (x * a, (x + 1) * a))(2.0, F32))
    assert text.count("convert_element_type[new_dtype=float32]") == 1, text
