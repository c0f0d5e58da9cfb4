"""JAX names the mirror run of JAX's tests found missing (issue 32): ``lax.mul(out_dtype=)``,
``lax.mulhi``, ``lax.reciprocal``, ``lax.broadcast_to_rank``, ``lax.batch_matmul``,
``lax.linalg.symmetric_product``, ``jnp.top_k`` and ``jax.numpy``'s NumPy aliases
(``complex_``, ``cdouble``, ``csingle``, ``double``, ``single``, ``object_``, ``save``,
``savez``, ``load``, printing, ``iterable``, ``ComplexWarning``).

Values against NumPy, Python's exact integers or closed forms; under ``jit`` and ``vmap``
over each argument against a loop; where differentiable, ``check_grads`` in both modes
(float64)."""
import io

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax
from cuvmap.lax import linalg as lax_linalg
from cuvmap.test_util import check_grads
from sampling import sampled

RNG = np.random.default_rng(3232)


def _vmap_each_argument(f, args):
    """``vmap`` over each argument in turn (a batch of 3 copies, perturbed) against a loop."""
    for i in range(len(args)):
        batch = np.stack([args[i] + (j if args[i].dtype.kind in "iu" else 0.1 * j) for j in range(3)]).astype(
            args[i].dtype)
        in_axes = tuple(0 if k == i else None for k in range(len(args)))
        got = cv.vmap(f, in_axes=in_axes)(*[batch if k == i else a for k, a in enumerate(args)])
        want = [f(*[batch[j] if k == i else a for k, a in enumerate(args)]) for j in range(3)]
        for g, w in zip(cv.tree.leaves(got), zip(*[cv.tree.leaves(x) for x in want])):
            np.testing.assert_allclose(g, np.stack(w), rtol=1e-12)


# ---------------------------------------------------------------------------------------
# lax: mul(out_dtype=), reciprocal, broadcast_to_rank, batch_matmul, symmetric_product
# ---------------------------------------------------------------------------------------

X23 = RNG.normal(size=(2, 3))
Y23 = RNG.normal(size=(2, 3))
POS23 = RNG.uniform(0.5, 2.0, size=(2, 3))
B234 = RNG.normal(size=(2, 3, 4))
B245 = RNG.normal(size=(2, 4, 5))
A53 = RNG.normal(size=(5, 3))
C55 = RNG.normal(size=(5, 5))
C55 = C55 + C55.T


def _symmetrized(m):
    return np.tril(m) + np.swapaxes(np.tril(m, -1), -1, -2)


LAX_ROWS = [
    # (name, function, args, reference, differentiable)
    ("mul out_dtype", lambda x, y: lax.mul(x, y, out_dtype=np.float64), (X23, Y23), X23 * Y23, True),
    ("mul", lax.mul, (X23, Y23), X23 * Y23, True),
    ("reciprocal", lax.reciprocal, (POS23,), 1 / POS23, True),
    ("broadcast_to_rank", lambda x: lax.broadcast_to_rank(x, 4), (X23,), X23[None, None], True),
    ("broadcast_to_rank same", lambda x: lax.broadcast_to_rank(x, 2), (X23,), X23, True),
    ("batch_matmul", lax.batch_matmul, (B234, B245), B234 @ B245, True),
    ("symmetric_product", lambda a, c: lax_linalg.symmetric_product(a, c, alpha=2.0, beta=-0.5), (A53, C55),
     2 * A53 @ A53.T - 0.5 * C55, True),
    ("symmetric_product symmetrize", lambda a, c: lax_linalg.symmetric_product(a, c, beta=1.0, symmetrize_output=True),
     (A53, np.triu(C55)), _symmetrized(A53 @ A53.T + np.triu(C55)), True),
    ("symmetric_product batched", lambda a, c: lax_linalg.symmetric_product(a, c, beta=1.0),
     (np.stack([A53, 2 * A53]), np.stack([C55, C55])), np.stack([A53 @ A53.T, 4 * A53 @ A53.T]) + C55, True),
]


@pytest.mark.parametrize("name, f, args, want, differentiable", LAX_ROWS, ids=[r[0] for r in LAX_ROWS])
def test_lax_names(name, f, args, want, differentiable):
    np.testing.assert_allclose(f(*args), want, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(cv.jit(f)(*args), want, rtol=1e-13, atol=1e-13)
    _vmap_each_argument(f, args)
    if differentiable:
        check_grads(f, args, order=2, modes=("fwd", "rev"))


def test_mul_out_dtype_casts_mixed_operands_and_returns_cotangents_in_their_dtypes():
    x, y = np.float32(2.0), np.float64(3.0)
    out = lax.mul(x, y, out_dtype=np.float64)
    assert out.dtype == np.float64 and out == 6.0
    gx, gy = cv.grad(lambda a, b: lax.mul(a, b, out_dtype=np.float64), argnums=(0, 1))(x, y)
    assert (gx.dtype, gy.dtype) == (np.float32, np.float64) and (gx, gy) == (3.0, 2.0)
    assert lax.mul(np.int8(100), np.int8(3), out_dtype=np.int32) == 300  # no int8 wrap-around


def test_batch_matmul_and_symmetric_product_errors_name_the_shapes():
    with pytest.raises(ValueError, match="at least 2D"):
        lax.batch_matmul(np.ones(3), np.ones((3, 3)))
    with pytest.raises(ValueError, match="same ndim"):
        lax.batch_matmul(np.ones((2, 3, 3)), np.ones((3, 3)))
    with pytest.raises(ValueError, match=r"symmetric_product.*\(5, 3\) and \(4, 4\)"):
        lax_linalg.symmetric_product(A53, np.ones((4, 4)))
    with pytest.raises(ValueError, match="broadcast_to_rank"):
        lax.broadcast_to_rank(X23, 1)


# ---------------------------------------------------------------------------------------
# mulhi: against Python's exact integers, every integer dtype, with the extremes
# ---------------------------------------------------------------------------------------

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def _mulhi_reference(x, y, dtype):
    bits = np.dtype(dtype).itemsize * 8
    mask = (1 << bits) - 1
    return np.array([((int(a) * int(b)) >> bits) & mask for a, b in zip(x.ravel(), y.ravel())],
                    dtype=object).astype(np.uint64).view(np.int64 if np.dtype(dtype).kind == "i" else np.uint64) \
        .astype(dtype).reshape(x.shape) if bits == 64 else \
        np.array([(int(a) * int(b)) >> bits for a, b in zip(x.ravel(), y.ravel())]).astype(dtype).reshape(x.shape)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=[np.dtype(d).name for d in INT_DTYPES])
def test_mulhi_is_the_high_half_of_the_exact_product(dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, size=(4, 6), dtype=dtype, endpoint=True)
    y = RNG.integers(info.min, info.max, size=(4, 6), dtype=dtype, endpoint=True)
    x[0, :4] = [info.min, info.max, info.min, 0]
    y[0, :4] = [info.min, info.max, info.max, info.max]
    want = _mulhi_reference(x, y, dtype)
    for f in (lax.mulhi, cv.jit(lax.mulhi)):
        got = f(x, y)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(cv.vmap(lax.mulhi, in_axes=(0, None))(x, y[0]), _mulhi_reference(
        x, np.broadcast_to(y[0], x.shape), dtype))
    np.testing.assert_array_equal(cv.vmap(lax.mulhi, in_axes=(None, 1), out_axes=1)(x[:, 0], y), _mulhi_reference(
        np.broadcast_to(x[:, :1], y.shape), y, dtype))


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=[np.dtype(d).name for d in INT_DTYPES])
def test_clz_counts_the_leading_zero_bits(dtype):
    info, bits = np.iinfo(dtype), np.dtype(dtype).itemsize * 8
    x = RNG.integers(info.min, info.max, size=(3, 10), dtype=dtype, endpoint=True)
    x[0, :4] = [0, 1, info.max, info.min]
    want = np.array([bits - int(v).bit_length() if v >= 0 else 0 for v in x.ravel().astype(object)]).astype(
        dtype).reshape(x.shape)
    for f in (lax.clz, cv.jit(lax.clz), cv.vmap(lax.clz)):
        got = f(x)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, want)
    with pytest.raises(TypeError, match="clz: x must have an integer dtype"):
        lax.clz(np.float32(1.0))


def test_scatter_sub_subtracts_repeated_targets_and_is_linear():
    dn = lax.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0,),
                                     scatter_dims_to_operand_dims=(0,))
    operand, idx, updates = RNG.normal(size=5), np.array([[1], [3], [1]]), RNG.normal(size=3)
    want = operand.copy()
    np.subtract.at(want, idx[:, 0], updates)
    f = lambda o, u: lax.scatter_sub(o, idx, u, dn)  # noqa: E731
    np.testing.assert_allclose(f(operand, updates), want, rtol=1e-15)
    np.testing.assert_allclose(cv.jit(f)(operand, updates), want, rtol=1e-15)
    _vmap_each_argument(f, (operand, updates))
    check_grads(f, (operand, updates), order=2, modes=("fwd", "rev"))


def test_mulhi_refuses_floats():
    with pytest.raises(TypeError, match="mulhi: x must have an integer dtype"):
        lax.mulhi(np.float32(1.0), np.int32(2))


# ---------------------------------------------------------------------------------------
# jnp.top_k
# ---------------------------------------------------------------------------------------


def _top_k_reference(x, k, axis, mode):
    key = -x.astype(np.float64) if mode == "largest" else x.astype(np.float64)
    idx = np.take(np.argsort(key, axis=axis, kind="stable"), np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis), idx


TOP_K_ROWS = [
    # (shape, axis, k, mode, dtype)
    ((20,), 0, 3, "largest", np.float64),
    ((20,), -1, 20, "smallest", np.float64),
    ((5, 8), 0, 1, "smallest", np.int32),
    ((5, 8), -1, 0, "largest", np.int32),
    ((3, 4, 5), 1, 3, "smallest", np.uint32),
    ((3, 4, 5), 2, 5, "largest", np.uint32),
    ((6, 5), 1, 2, "smallest", np.bool_),
    ((6, 5), 0, 6, "largest", np.bool_),
]


@pytest.mark.parametrize("shape, axis, k, mode, dtype", TOP_K_ROWS)
def test_top_k_values_and_indices(shape, axis, k, mode, dtype):
    x = RNG.integers(0, 4, size=shape).astype(dtype)  # many ties: ascending indices break them
    want_v, want_i = _top_k_reference(x, k, axis, mode)
    f = lambda a: cnp.top_k(a, k, axis=axis, mode=mode, sorted=True)  # noqa: E731
    for g in (f, cv.jit(f)):
        v, i = g(x)
        assert v.dtype == x.dtype and i.dtype == np.int32
        np.testing.assert_array_equal(v, want_v)
        np.testing.assert_array_equal(i, want_i)
    bv, bi = cv.vmap(f)(np.stack([x, x[::-1] if x.ndim == 1 else x]))
    np.testing.assert_array_equal(bv[0], want_v)
    np.testing.assert_array_equal(bi[0], want_i)


@pytest.mark.parametrize("mode", ["largest", "smallest"])
def test_top_k_derivative_flows_through_the_values(mode):
    x = RNG.normal(size=(4, 6))
    f = lambda a: cnp.top_k(a, 3, axis=1, mode=mode)[0]  # noqa: E731
    check_grads(f, (x,), order=2, modes=("fwd", "rev"))
    g = cv.grad(lambda a: f(a).sum())(x)
    _, idx = _top_k_reference(x, 3, 1, mode)
    want = np.zeros_like(x)
    np.put_along_axis(want, idx, 1.0, axis=1)
    np.testing.assert_array_equal(g, want)


def test_top_k_errors():
    with pytest.raises(ValueError, match="complex"):
        cnp.top_k(np.ones(3, np.complex128), 1)
    with pytest.raises(ValueError, match="mode must be 'largest' or 'smallest'"):
        cnp.top_k(np.ones(3), 1, mode="middle")


# ---------------------------------------------------------------------------------------
# jax.numpy's NumPy aliases
# ---------------------------------------------------------------------------------------

ALIAS_ROWS = [
    ("complex_", np.complex128), ("cdouble", np.complex128), ("csingle", np.complex64), ("double", np.float64),
    ("single", np.float32), ("object_", np.object_),
]


@pytest.mark.parametrize("name, want", ALIAS_ROWS, ids=[r[0] for r in ALIAS_ROWS])
def test_dtype_aliases(name, want):
    assert getattr(cnp, name) is want
    assert cnp.zeros(2, getattr(cnp, name)).dtype == np.dtype(want)


def test_save_load_and_printing():
    x = RNG.normal(size=(3, 2))
    with io.BytesIO() as f:
        cnp.save(f, x)
        f.seek(0)
        np.testing.assert_array_equal(cnp.load(f), x)
    with io.BytesIO() as f:
        cnp.savez(f, a=x)
        f.seek(0)
        np.testing.assert_array_equal(cnp.load(f)["a"], x)
    assert cnp.array_repr(np.arange(3)) == "array([0, 1, 2])"
    assert cnp.array_str(np.arange(3)) == "[0 1 2]"
    with cnp.printoptions(precision=2):
        assert cnp.get_printoptions()["precision"] == 2
    assert cnp.iterable([1]) and not cnp.iterable(1.0)
    assert issubclass(cnp.ComplexWarning, Warning)


# ---------------------------------------------------------------------------------------
# round(x, decimals) with decimals beyond the dtype's precision: x, not NumPy's NaN
# ---------------------------------------------------------------------------------------

ROUND_ROWS = [
    # (dtype, decimals, want as a function of x): exact closed forms
    (np.float32, 100, lambda x: x), (np.float32, 1000, lambda x: x), (np.float64, 400, lambda x: x),
    (np.float64, 1000, lambda x: x), (np.float16, 10, lambda x: x),
    (np.float64, -400, lambda x: x * 0), (np.float32, -50, lambda x: x * 0),
    (np.complex64, 1000, lambda x: x), (np.complex128, -400, lambda x: x * 0),
    (np.float64, 2, lambda x: np.round(x, 2)), (np.complex128, 1, lambda x: np.round(x, 1)),
]


@pytest.mark.parametrize("dtype, decimals, want", ROUND_ROWS, ids=[f"{np.dtype(r[0]).name}-{r[1]}" for r in ROUND_ROWS])
def test_round_with_large_decimals_is_exact(dtype, decimals, want):
    x = np.array([7.354473, -4.153887, 0.131803, 1e4, 0.0, -2.5], dtype)
    if np.dtype(dtype).kind == "c":
        x = x * (1 - 0.5j)
    f = lambda v: cnp.round(v, decimals)  # noqa: E731
    for g in (f, cv.jit(f), cv.vmap(f)):
        got = g(x)
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got, want(x))


def test_round_keeps_x_where_the_scaled_value_is_integral_already():
    x = np.array([1e300, 1.234e10, 3.141592653589793])
    np.testing.assert_array_equal(cnp.round(x, 300)[:2], x[:2])  # |x|·10³⁰⁰ overflows: x, not inf or NaN
    assert cnp.round(x, 300)[2] == x[2]
    assert float(cv.grad(lambda v: cnp.round(v, 1000))(1.25)) == 0.0  # piecewise constant


# ---------------------------------------------------------------------------------------
# compress / extract with size=: fill_value takes a's dtype (JAX's), a bool array stays bool
# ---------------------------------------------------------------------------------------

FILL_ROWS = [
    # (a, fill_value): the result's dtype is a's
    (np.array([[True, False, True], [False, True, True]]), 1),
    (np.array([[1, 2, 3], [4, 5, 6]], np.int8), 1),
    (np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32), 7.5),
]


@pytest.mark.parametrize("a, fill_value", FILL_ROWS, ids=["bool", "int8", "float32"])
def test_compress_and_extract_fill_value_takes_the_array_dtype(a, fill_value):
    cond = np.array([True, False, True])
    want = np.full_like(a, fill_value)
    picked = np.compress(cond, a, axis=1)
    want[:, :picked.shape[1]] = picked
    f = lambda c, x: cnp.compress(c, x, axis=1, size=3, fill_value=fill_value)  # noqa: E731
    for g in (f, cv.jit(f)):
        got = g(cond, a)
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(got, want)
    flat = cnp.extract(np.array([1, 0, 1, 1, 0, 0], bool), a.ravel(), size=6, fill_value=fill_value)
    assert flat.dtype == a.dtype
    np.testing.assert_array_equal(flat, np.concatenate([a.ravel()[[0, 2, 3]], np.full(3, fill_value, a.dtype)]))


def test_compress_fill_value_derivative():
    f = lambda fv: cnp.compress(np.array([True, False, True]), np.arange(3.0), size=3, fill_value=fv)  # noqa: E731
    check_grads(f, (2.0,), order=1, modes=("fwd", "rev"))


# ---------------------------------------------------------------------------------------
# tracers' view(dtype) and byteswap(): bit-exact against NumPy's (little-endian)
# ---------------------------------------------------------------------------------------

VIEW_DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
               np.uint32, np.uint64, np.bool_, np.complex64, np.complex128]
VIEW_ROWS = [(shape, src, dst) for shape in [(2, 32), ()] for src in VIEW_DTYPES for dst in VIEW_DTYPES
             if shape or np.dtype(src).itemsize == np.dtype(dst).itemsize]


def _bytes(v):
    return np.asarray(v).reshape(-1).view(np.uint8)


def _random_bits(shape, dtype):
    if np.dtype(dtype) == np.bool_:
        return RNG.random(shape) < 0.5
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return RNG.integers(0, 256, size=nbytes, dtype=np.uint8).view(dtype).reshape(shape)


# -m "not slow": a quarter of the dtype pairs and shapes
@pytest.mark.parametrize("shape, src, dst", sampled(
    VIEW_ROWS, 4, ids=[f"{len(r[0])}d-{np.dtype(r[1]).name}-{np.dtype(r[2]).name}" for r in VIEW_ROWS]))
def test_tracer_view_is_numpys_view(shape, src, dst):
    x = _random_bits(shape, src)
    want = x.view(dst)
    if np.dtype(dst) == np.bool_ and np.dtype(src) != np.bool_:
        want = (_bytes(x) != 0).reshape(want.shape)  # a byte read as bool is != 0 (JAX's rule)
    got = cv.jit(lambda v: v.view(dst))(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(_bytes(got), _bytes(want))
    batched = cv.vmap(lambda v: v.view(dst))(np.stack([x, x]))
    np.testing.assert_array_equal(_bytes(batched[1]), _bytes(want))


@pytest.mark.parametrize("dtype", [d for d in VIEW_DTYPES if d is not np.bool_], ids=lambda d: np.dtype(d).name)
def test_tracer_byteswap_is_numpys(dtype):
    x = _random_bits((3, 4), dtype)
    got = cv.jit(lambda v: v.byteswap())(x)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(_bytes(got), _bytes(x.byteswap()))


def test_tracer_view_errors():
    with pytest.raises(ValueError, match="0d array"):
        cv.jit(lambda v: v.view(np.float32))(np.float64(1.0))
    with pytest.raises(ValueError, match="divisor"):
        cv.jit(lambda v: v.view(np.float64))(np.ones(3, np.float32))
    assert cv.jit(lambda v: v.view())(np.ones(3)).dtype == np.float64


# ---------------------------------------------------------------------------------------
# dtypes: convolve/correlate preferred_element_type (exact integers), linalg.vecdot of int8
# ---------------------------------------------------------------------------------------

CONV_ROWS = [(op, mode, pt) for op in ("convolve", "correlate") for mode in ("full", "same", "valid")
             for pt in (None, np.int16, np.int32, np.float32)]


@pytest.mark.parametrize("op, mode, preferred", CONV_ROWS)
def test_convolutions_preferred_element_type(op, mode, preferred):
    x, y = np.array([3, -1, 4, 1, -5], np.int16), np.array([2, 7, -1], np.int16)
    want = getattr(np, op)(x, y, mode=mode).astype(np.float64 if preferred is None else preferred)
    f = lambda a, v: getattr(cnp, op)(a, v, mode=mode, preferred_element_type=preferred)  # noqa: E731
    for g in (f, cv.jit(f)):
        got = g(x, y)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.uint8, np.float32, np.complex64],
                         ids=lambda d: np.dtype(d).name)
def test_linalg_vecdot_keeps_the_operand_dtype(dtype):
    a = (np.arange(12).reshape(3, 4) % 5).astype(dtype)
    want = np.linalg.vecdot(a, a[::-1])
    for g in (cnp.linalg.vecdot, cnp.vecdot, cv.jit(cnp.linalg.vecdot)):
        got = g(a, a[::-1])
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6)


# ---------------------------------------------------------------------------------------
# promote_types: Python's int, float, complex are weak (JAX's rule), not NumPy's 64-bit types
# ---------------------------------------------------------------------------------------

PROMOTE_ROWS = [
    (complex, np.float32, np.complex64), (np.float32, complex, np.complex64), ("uint8", int, np.uint8),
    ("float16", float, np.float16), (np.int8, complex, np.complex128), (int, float, np.float64),
    (float, complex, np.complex128), (int, int, np.int64), (np.float32, np.float64, np.float64),
    (np.int32, "float32", np.float64), (bool, int, np.int64),
]


@pytest.mark.parametrize("a, b, want", PROMOTE_ROWS)
def test_promote_types_treats_builtin_types_as_weak(a, b, want):
    assert cnp.promote_types(a, b) == np.dtype(want)


def test_fftn_of_float32_is_complex64_as_promote_types_says():
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    assert cnp.fft.fftn(x).dtype == cnp.promote_types(complex, x.dtype) == np.complex64


# ---------------------------------------------------------------------------------------
# errors carry JAX's key phrase next to cuvmap's explanation
# ---------------------------------------------------------------------------------------

def _raise_hashable():
    cv.jit(lambda x, s: x, static_argnums=1)(1.0, np.array([1]))


WORDING_ROWS = [
    # (call, exception type, JAX's phrase, cuvmap's phrase)
    (lambda: cv.jit(lambda x: list(range(3))[x])(np.int64(1)), cv.errors.ConcretizationError,
     r"The __index__\(\) method was called on traced array", r"the use as a Python index \(range\(\), list\[...\]\)"),
    (lambda: cv.jit(3), TypeError, "Expected a callable value", "the function to transform must be callable"),
    (_raise_hashable, ValueError, "Non-hashable static arguments are not supported", "static argument 1 is a ndarray"),
    (lambda: cnp.zeros(2, 3), TypeError, r"Did you accidentally write `jax\.numpy\.zeros\(2, 3\)` when you meant "
     r"`jax\.numpy\.zeros\(\(2, 3\)\)`", "Cannot interpret '3' as a data type"),
    (lambda: cnp.ones(2, 3), TypeError, r"`jax\.numpy\.ones\(\(2, 3\)\)`", "single tuple argument"),
    (lambda: cnp.empty(2, 3), TypeError, r"`jax\.numpy\.empty\(\(2, 3\)\)`", "single tuple argument"),
    (lambda: cv.vmap(lambda a, b: a + b)(np.ones(2), np.ones(3)), ValueError,
     "vmap got inconsistent sizes for array axes to be mapped:", r"argument 1 \(b\) has size 3 along axis 0"),
    (lambda: cv.vmap(lambda a: a)(1.0), ValueError, "vmap was requested to map its argument along axis 0",
     "is a float, which has no axis 0 to map over"),
    (lambda: cv.vmap(cnp.sum, in_axes=-4)(np.ones((3, 4, 5))), ValueError,
     r"vmap was requested to map its argument along axis -4, which implies that its rank should be at least 4, "
     r"but is only 3 \(its shape is \(3, 4, 5\)\)", "in_axes -4 is out of range"),
    (lambda: cv.grad(lambda x: x, holomorphic=True)(1.0), TypeError,
     "grad with holomorphic=True requires inputs with complex dtype, but got float", r"argument 0 \(x\) has dtype"),
    (lambda: cnp.fft.fftfreq([0, 1, 2]), ValueError,
     r"The n argument of jax.numpy.fft.fftfreq only takes an int. Got n = \[0, 1, 2\].", "n takes one int"),
    (lambda: cnp.arange(1j), ValueError, "Passing complex start/stop/step to jnp.arange is no longer supported",
     "arange: complex arguments are not supported"),
]


@pytest.mark.parametrize("call, exc, jax_phrase, cuvmap_phrase", WORDING_ROWS, ids=range(len(WORDING_ROWS)))
def test_errors_carry_jaxs_phrase(call, exc, jax_phrase, cuvmap_phrase):
    with pytest.raises(exc, match=jax_phrase) as info:
        call()
    assert __import__("re").search(cuvmap_phrase, str(info.value))


# ---------------------------------------------------------------------------------------
# histogram_bin_edges, histogram2d, histogramdd against NumPy's
# ---------------------------------------------------------------------------------------

HX, HY, HW = RNG.normal(size=50), RNG.normal(size=50), RNG.uniform(size=50)
HS = RNG.normal(size=(40, 3))
HIST2D_ROWS = [
    {}, {"bins": 4}, {"bins": [3, 5]}, {"bins": np.linspace(-2, 2, 6)}, {"bins": [np.linspace(-2, 2, 4), 3]},
    {"range": [(-1, 1), (-2, 2)]}, {"weights": HW}, {"density": True}, {"bins": 3, "weights": HW, "density": True},
]


@pytest.mark.parametrize("kwargs", HIST2D_ROWS, ids=range(len(HIST2D_ROWS)))
def test_histogram2d(kwargs):
    want = np.histogram2d(HX, HY, **kwargs)
    for g in (cnp.histogram2d, cv.jit(lambda x, y: cnp.histogram2d(x, y, **kwargs))):
        got = g(HX, HY, **kwargs) if g is cnp.histogram2d else g(HX, HY)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-13)
        unweighted_counts = "weights" not in kwargs and not kwargs.get("density")
        assert got[0].dtype == (np.int64 if unweighted_counts else np.float64)


HISTDD_ROWS = [{"bins": 3}, {"bins": (2, 3, 4)}, {"weights": HS[:, 0] ** 2, "density": True},
               {"range": [(-1, 1), None, (0, 2)]}]


@pytest.mark.parametrize("kwargs", HISTDD_ROWS, ids=range(len(HISTDD_ROWS)))
def test_histogramdd(kwargs):
    hist, edges = cnp.histogramdd(HS, **kwargs)
    want_hist, want_edges = np.histogramdd(HS, **kwargs)
    np.testing.assert_allclose(hist, want_hist, rtol=1e-13)
    for a, b in zip(edges, want_edges):
        np.testing.assert_allclose(a, b, rtol=1e-13)


def test_histogram_bin_edges_and_transforms():
    np.testing.assert_allclose(cnp.histogram_bin_edges(HX, 7), np.histogram_bin_edges(HX, 7), rtol=1e-13)
    np.testing.assert_allclose(cnp.histogram_bin_edges(HX, 5, range=(-1, 2)),
                               np.histogram_bin_edges(HX, 5, range=(-1, 2)), rtol=1e-13)
    np.testing.assert_array_equal(cnp.histogram_bin_edges(HX, [0.0, 1.0, 3.0]), [0.0, 1.0, 3.0])
    f = lambda s: cnp.histogramdd(s, bins=3, range=[(-2, 2)] * 3)[0]  # noqa: E731
    batched = cv.vmap(f)(np.stack([HS, 2 * HS]))
    np.testing.assert_array_equal(batched[1], np.histogramdd(2 * HS, bins=3, range=[(-2, 2)] * 3)[0])
    # weighted sums are linear in the weights: their derivative is the membership
    g = lambda w: cnp.histogram2d(HX, HY, bins=3, weights=w)[0]  # noqa: E731
    check_grads(g, (HW,), order=1, modes=("fwd", "rev"))
    with pytest.raises(ValueError, match="one weight for each sample"):
        cnp.histogramdd(HS, weights=np.ones(3))
    with pytest.raises(ValueError, match="range must be a sequence of 3 pairs"):
        cnp.histogramdd(HS, range=[(0, 1)])


# ---------------------------------------------------------------------------------------
# fromfunction, frombuffer, fromstring, from_dlpack, fromfile/fromiter (refused), einsum_path
# ---------------------------------------------------------------------------------------

FROMFUNCTION_ROWS = [
    # (function, shape, dtype, reference by NumPy's fromfunction, or by a loop over indices)
    (lambda i, j: i + 2 * j, (2, 3), float, np.fromfunction(lambda i, j: i + 2 * j, (2, 3))),
    (lambda i, j: i * j, (3, 4), np.int32, np.fromfunction(lambda i, j: i * j, (3, 4), dtype=np.int32)),
    (lambda i: cnp.sin(i), (5,), float, np.sin(np.arange(5.0))),
    # JAX's rule: scalars under vmap, so a non-broadcasting function works too
    (lambda i, j: cnp.sum(cnp.arange(3.0) * i) + j, (2, 2), float,
     np.array([[np.sum(np.arange(3.0) * i) + j for j in range(2)] for i in range(2)])),
]


@pytest.mark.parametrize("function, shape, dtype, want", FROMFUNCTION_ROWS, ids=range(len(FROMFUNCTION_ROWS)))
def test_fromfunction(function, shape, dtype, want):
    got = cnp.fromfunction(function, shape, dtype=dtype)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-15)


def test_frombuffer_fromstring_from_dlpack_and_the_refused_ones():
    buf = np.arange(4, dtype=np.float32).tobytes()
    got = cnp.frombuffer(buf, dtype=np.float32, count=2, offset=4)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [1.0, 2.0])
    np.testing.assert_array_equal(cnp.fromstring("1, 2, 3", dtype=np.int64, sep=","), [1, 2, 3])
    x = np.arange(3.0)
    np.testing.assert_array_equal(cnp.from_dlpack(x), x)
    for name in ("fromfile", "fromiter"):
        with pytest.raises(NotImplementedError, match=f"jnp.{name}\\(\\) is not implemented because it may be non-pure"):
            getattr(cnp, name)(range(3), int)


EINSUM_PATH_ROWS = ["ij,jk,kl->il", "ij,jk->ik", "ii->i", "abc,cd,bd->a"]


@pytest.mark.parametrize("subscripts", EINSUM_PATH_ROWS)
def test_einsum_path_is_numpys_from_shapes_and_works_on_tracers(subscripts):
    sizes = {"i": 3, "j": 4, "k": 5, "l": 2, "a": 2, "b": 3, "c": 4, "d": 5}
    operands = [RNG.normal(size=tuple(sizes[c] if s != "ii" else 3 for c in s))
                for s in subscripts.split("->")[0].split(",")]
    want = np.einsum_path(subscripts, *operands, optimize="optimal")
    assert cnp.einsum_path(subscripts, *operands) == want
    seen = []
    cv.jit(lambda *ops: seen.append(cnp.einsum_path(subscripts, *ops)[0]) or ops[0])(*operands)
    assert seen == [want[0]]
    assert cnp.einsum_path(subscripts, *operands, optimize="greedy")[0][0] == "einsum_path"


# ---------------------------------------------------------------------------------------
# clear_caches, jacobian, print_environment_info, jnp.ndarray
# ---------------------------------------------------------------------------------------


def test_clear_caches_makes_every_jitted_function_trace_again():
    f, g = cv.jit(lambda x: x * 2), cv.jit(lambda x: x + 1)
    f(1.0), g(1.0), f(2.0)
    assert (f.trace_count, g.trace_count) == (1, 1)
    cv.clear_caches()
    assert (f(3.0), g(3.0)) == (6.0, 4.0)
    assert (f.trace_count, g.trace_count) == (2, 2)


def test_jacobian_is_jacrev_and_ndarray_is_array():
    x = RNG.normal(size=3)
    np.testing.assert_allclose(cv.jacobian(lambda v: cnp.sin(v) * v[0])(x), cv.jacrev(lambda v: cnp.sin(v) * v[0])(x))
    assert cv.jacobian is cv.jacrev
    assert cnp.ndarray is cv.Array and isinstance(x, cnp.ndarray)
    assert cv.jit(lambda v: isinstance(v, cnp.ndarray))(x)
    text = cv.print_environment_info(return_string=True)
    assert "cuvmap:" in text and f"numpy:     {np.__version__}" in text


# ---------------------------------------------------------------------------------------
# check_grads: JAX's per-dtype tolerances (atol=rtol=None), NaN agreeing with NaN
# ---------------------------------------------------------------------------------------

CHECK_GRADS_ROWS = [
    # (function, args): float32 finite differences resolve ~1e-4 only: JAX's 2e-3 default passes
    (lambda v: lax.sort(v, dimension=0), (np.array([3.0, 1.0, 4.0, 0.0, 2.0], np.float32),)),
    (lambda v: cnp.sin(v) * v, (RNG.normal(size=(2, 3)).astype(np.float32),)),
    # outside arcsin's domain the derivative and the differences are both NaN: they agree
    (cnp.arcsin, (np.array([0.3, -1.5, 0.9]),)),
]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # arcsin outside [-1, 1]
@pytest.mark.parametrize("f, args", CHECK_GRADS_ROWS, ids=["sort-f32", "sin-f32", "arcsin-nan"])
def test_check_grads_none_tolerances_follow_the_dtype(f, args):
    check_grads(f, args, order=2, modes=("fwd", "rev"), atol=None, rtol=None,
                eps=1e-2 if args[0].dtype == np.float32 else None)


def test_check_grads_still_catches_a_wrong_derivative():
    wrong = cv.custom_jvp(lambda x: cnp.sin(x))
    wrong.defjvp(lambda p, t: (cnp.sin(p[0]), 1.001 * cnp.cos(p[0]) * t[0]))  # 0.1 % off
    with pytest.raises(AssertionError, match="order 1 forward mode"):
        check_grads(wrong, (np.array([0.3, 1.2]),), order=1, modes=("fwd",))
    nan_derivative = cv.custom_jvp(lambda x: x)
    nan_derivative.defjvp(lambda p, t: (p[0], t[0] * np.nan))  # NaN where f is smooth
    with pytest.raises(AssertionError):
        check_grads(nan_derivative, (np.array([0.3]),), order=1, modes=("fwd",))


# ---------------------------------------------------------------------------------------
# device_put's may_alias / donate / src (JAX's keywords)
# ---------------------------------------------------------------------------------------

DEVICE_PUT_ROWS = [
    # (keywords, same object returned)
    ({}, True), ({"may_alias": True, "donate": False}, True), ({"may_alias": None}, True),
    ({"may_alias": False}, False), ({"donate": True}, False), ({"may_alias": False, "src": "cpu"}, False),
]


@pytest.mark.parametrize("kwargs, aliased", DEVICE_PUT_ROWS, ids=range(len(DEVICE_PUT_ROWS)))
def test_device_put_may_alias_and_donate(kwargs, aliased):
    x = np.arange(8.0)
    out = cv.device_put(x, "cpu", **kwargs)
    assert (out is x) == aliased
    np.testing.assert_array_equal(out, x)
    if not aliased:
        assert not np.shares_memory(out, x)


def test_device_put_refuses_may_alias_with_donate():
    with pytest.raises(ValueError, match="may_alias and donate cannot be True at the same time."):
        cv.device_put(np.ones(2), may_alias=True, donate=True)
