"""``cuvmap.numpy`` beyond the op table: accuracy of erf and erf_inv over their whole
ranges, derivatives at the points where a shortcut would fail (zeros of cumprod and prod,
the kinks of norm, ties of sort and clip, repeated singular values), einsum's contraction
order and parsing, pad's modes against NumPy for many widths, the SVD against NumPy's and
its derivatives in closed form, the bitwise operators of traced integers against NumPy's,
and errors in the user's terms.

The op table (``op_table.py``) checks values, vmap, and derivatives against finite
differences for every function; the references here are closed forms, loops and NumPy.
"""
import math
import re

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax
from cuvmap.core import ShapeError

ERF = np.vectorize(math.erf, otypes=[np.float64])


# ---------------------------------------------------------------------------------------
# erf
# ---------------------------------------------------------------------------------------


def test_erf_matches_math_erf_over_its_range():
    x = np.concatenate([np.linspace(-7, 7, 20001), np.logspace(-310, 0.8, 2000), -np.logspace(-30, 0.8, 500),
                        [5.9, 5.95, 5.97, 6.0, 6.01, 6.03125, 6.04, 1e300]])
    got, want = lax.erf(x), ERF(x)
    err = np.abs(got - want)
    assert err.max() <= 4e-16
    # relative accuracy near zero (erf(x) ≈ 1.128 x), down to the subnormals
    small = (np.abs(x) < 0.1) & (x != 0)
    assert np.max(err[small] / np.abs(want[small])) < 4e-16
    x32 = x[np.abs(x) < 1e30].astype(np.float32)
    got32 = lax.erf(x32)
    assert got32.dtype == np.float32
    assert np.max(np.abs(got32 - ERF(x32.astype(np.float64)))) < 1.5e-7


def test_erf_special_values():
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-320, -40.0])
    got = lax.erf(x)
    np.testing.assert_array_equal(got[[0, 1, 3, 6]], [1.0, -1.0, 0.0, -1.0])
    assert np.isnan(got[2]) and np.signbit(got[4]) and got[5] > 0
    assert lax.erf(np.float16(0.5)).dtype == np.float16
    assert lax.erf(np.arange(3)).dtype == np.float64
    # the derivative 2/√π·exp(−x²), in closed form
    xs = np.linspace(-3, 3, 13)
    np.testing.assert_allclose(cv.vmap(cv.grad(cnp.erf))(xs), 2 / math.sqrt(math.pi) * np.exp(-xs * xs),
                               rtol=1e-14)


# ---------------------------------------------------------------------------------------
# Derivatives at zeros, kinks and ties
# ---------------------------------------------------------------------------------------


def _cumprod_jacobian(x):
    """∂out_i/∂x_j = Π_{m ≤ i, m ≠ j} x_m, one product at a time."""
    n = len(x)
    jac = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1):
            jac[i, j] = np.prod([x[m] for m in range(i + 1) if m != j])
    return jac


@pytest.mark.parametrize("x", [[2.0, 0.0, 3.0, 0.0, -1.5], [0.0, 0.0, 2.0], [1.5, -2.0, 0.0, 4.0, 0.5, 3.0, 2.0]])
def test_cumprod_and_prod_derivatives_are_exact_at_zeros(x):
    x = np.array(x)
    want = _cumprod_jacobian(x)
    np.testing.assert_allclose(cv.jacrev(cnp.cumprod)(x), want, rtol=1e-15, atol=0)
    np.testing.assert_allclose(cv.jacfwd(cnp.cumprod)(x), want, rtol=1e-15, atol=0)
    rev = cv.jacrev(lambda v: cnp.cumprod(v[::-1])[::-1])(x)
    np.testing.assert_allclose(cv.jacrev(lambda v: lax.cumprod(v, 0, reverse=True))(x), rev, rtol=1e-15, atol=0)
    # prod's gradient is the last row: the product of the others
    np.testing.assert_allclose(cv.grad(cnp.prod)(x), want[-1], rtol=1e-15, atol=0)
    np.testing.assert_allclose(cv.jvp(cnp.prod, (x,), (np.ones_like(x),))[1], want[-1].sum(), rtol=1e-15)


def test_prod_any_all_of_empty_axes():
    np.testing.assert_array_equal(cnp.prod(np.zeros((2, 0)), axis=1), [1.0, 1.0])
    np.testing.assert_array_equal(cnp.any(np.zeros((0, 3)), axis=0), [False] * 3)
    np.testing.assert_array_equal(cnp.all(np.zeros((0, 3)), axis=0), [True] * 3)
    assert cnp.all(np.array([np.nan, 1.0])) and not cnp.any(np.array([0.0, -0.0]))
    assert cv.grad(lambda x: cnp.prod(x, axis=1).sum())(np.zeros((2, 0))).shape == (2, 0)


def test_norm_derivatives_at_zero_follow_jax():
    norm = cnp.linalg.norm
    zeros = np.zeros((2, 3))
    for fn in (lambda x: norm(x.ravel(), 1), lambda x: norm(x.ravel(), np.inf), lambda x: norm(x, 1),
               lambda x: norm(x, -np.inf, (1, 0))):
        np.testing.assert_array_equal(cv.grad(fn)(zeros), np.zeros((2, 3)))
    # sqrt(Σx²) has no derivative at 0: NaN, as in JAX
    with np.errstate(all="ignore"):
        assert np.isnan(cv.grad(norm)(zeros)).all()
    x = np.array([3.0, -4.0])
    np.testing.assert_allclose(cv.grad(norm)(x), x / 5)
    np.testing.assert_allclose(cv.grad(lambda v: norm(v, np.inf))(x), [0.0, -1.0])


def test_sort_derivative_follows_the_stable_permutation():
    x = np.array([2.0, 1.0, 2.0, 1.0])
    # sort(x) = x[[1, 3, 0, 2]]: out[0] comes from x[1], out[2] from x[0]
    np.testing.assert_array_equal(cv.grad(lambda v: cnp.sort(v)[0])(x), [0, 1, 0, 0])
    np.testing.assert_array_equal(cv.grad(lambda v: cnp.sort(v)[2])(x), [1, 0, 0, 0])
    np.testing.assert_array_equal(cv.grad(lambda v: cnp.sort(v, descending=True)[0])(x), [0, 0, 1, 0])
    np.testing.assert_array_equal(cnp.argsort(x), [1, 3, 0, 2])
    np.testing.assert_array_equal(cnp.argsort(x, descending=True), [0, 2, 1, 3])
    nan = np.array([np.nan, 1.0, -np.inf])
    np.testing.assert_array_equal(cnp.sort(nan), np.sort(nan))
    np.testing.assert_array_equal(cnp.argsort(nan), [2, 1, 0])


def test_clip_derivative_reaches_array_bounds_and_splits_ties():
    x = np.array([-2.0, 0.0, 2.0, -1.0, 1.0])
    lo = np.full(5, -1.0)
    hi = np.array(1.0)
    gx, glo, ghi = cv.grad(lambda *a: cnp.clip(*a).sum(), argnums=(0, 1, 2))(x, lo, hi)
    np.testing.assert_array_equal(gx, [0, 1, 0, 0.5, 0.5])
    np.testing.assert_array_equal(glo, [1, 0, 0, 0.5, 0])
    assert ghi == 1.5
    with pytest.raises(TypeError, match="min or a_min"):
        cnp.clip(x, -1, min=-1)


def test_rounding_has_zero_derivatives_and_rounds_halves_to_even():
    np.testing.assert_array_equal(cnp.round(np.array([0.5, 1.5, 2.5, -0.5])), [0, 2, 2, -0])
    np.testing.assert_array_equal(cnp.around(np.array([1.25, 1.35]), 1), np.round([1.25, 1.35], 1))
    x = np.array([1.3, -2.7])
    for fn in (cnp.floor, cnp.ceil, cnp.round, cnp.sign):
        np.testing.assert_array_equal(cv.grad(lambda v: (fn(v) * v).sum())(x), fn(x))


# ---------------------------------------------------------------------------------------
# einsum
# ---------------------------------------------------------------------------------------


EINSUM_CASES = [
    ("ij,jk,kl,lm->im", [(2, 3), (3, 4), (4, 5), (5, 2)]),
    ("...ij,...jk", [(2, 1, 3, 4), (5, 4, 6)]),
    ("a...,...b", [(2, 3, 4), (3, 4, 5)]),
    ("ii", [(3, 3)]),
    ("i...i", [(3, 2, 3)]),
    ("iij,jik->k", [(3, 3, 2), (2, 3, 4)]),
    ("ij,ij->ij", [(2, 1), (2, 3)]),
    ("ab,cd,ef->", [(1, 2), (2, 3), (3, 1)]),
    ("bi,bj,ij,b->", [(3, 2), (3, 4), (2, 4), (3,)]),
    ("ij->", [(0, 3)]),
    ("ij,jk", [(2, 0), (0, 3)]),
    ("i,j,k", [(2,), (3,), (1,)]),
]


@pytest.mark.parametrize("subscripts,shapes", EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
def test_einsum_matches_numpy(subscripts, shapes):
    rng = np.random.default_rng(0)
    ops = [rng.standard_normal(s) for s in shapes]
    want = np.einsum(subscripts, *ops)
    got = cnp.einsum(subscripts, *ops)
    assert np.shape(got) == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_einsum_contracts_the_smallest_intermediate_first(monkeypatch):
    calls = []
    real = lax.dot_general

    def recording(x, y, dimension_numbers):
        out = real(x, y, dimension_numbers)
        calls.append((np.shape(x), np.shape(y), np.shape(out)))
        return out

    monkeypatch.setattr(lax, "dot_general", recording)
    a, b, c = np.ones((50, 40)), np.ones((40, 30)), np.ones((30, 2))
    out = cnp.einsum("ij,jk,kl->il", a, b, c)
    np.testing.assert_allclose(out, a @ b @ c)
    # left to right would form a 50×30 intermediate; b·c is 40×2
    assert calls == [((40, 30), (30, 2), (40, 2)), ((50, 40), (40, 2), (50, 2))]


def test_einsum_errors_name_the_subscripts():
    x = np.ones((2, 3))
    with pytest.raises(ShapeError, match=re.escape("einsum: 'ij,jk' names 2 operands, but 1 were given")):
        cnp.einsum("ij,jk", x)
    with pytest.raises(ShapeError, match=re.escape(
            "einsum: 'ij,jk->ik': subscript 'j' has size 3 in operand 0 (shape (2, 3)) but size 4 in operand 1")):
        cnp.einsum("ij,jk->ik", x, np.ones((4, 2)))
    with pytest.raises(ShapeError, match="subscripts 'ijk' name 3 dims, but operand 0"):
        cnp.einsum("ijk", x)
    with pytest.raises(ShapeError, match="output subscript 'q' names no dim"):
        cnp.einsum("ij->q", x)
    with pytest.raises(ShapeError, match="need '...' too"):
        cnp.einsum("...j->j", np.ones((2, 3, 4)))
    with pytest.raises(ShapeError, match="subscripts must be letters"):
        cnp.einsum("i1", x)


# ---------------------------------------------------------------------------------------
# pad, split, roll, diag, cross, norm, sort: NumPy's semantics and errors
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["constant", "edge", "wrap", "reflect", "symmetric"])
def test_pad_matches_numpy(mode):
    x = np.arange(12.0).reshape(3, 4)
    for width in [0, 2, (1, 3), ((0, 7), (9, 2)), ((5, 0), (0, 0))]:
        np.testing.assert_array_equal(cnp.pad(x, width, mode), np.pad(x, width, mode), err_msg=f"{mode} {width}")
    one = np.array([[5.0]])
    np.testing.assert_array_equal(cnp.pad(one, 3, mode), np.pad(one, 3, mode))


def test_pad_errors():
    with pytest.raises(ShapeError, match="pad: cannot extend the empty axis 0"):
        cnp.pad(np.ones((0, 2)), 1, "edge")
    np.testing.assert_array_equal(cnp.pad(np.ones((0, 2)), 1), np.zeros((2, 4)))
    with pytest.raises(NotImplementedError, match="Unimplemented padding mode 'foo' for np.pad"):
        cnp.pad(np.ones(3), 1, "foo")
    with pytest.raises(ShapeError, match="negative entries"):
        cnp.pad(np.ones(3), -1)
    with pytest.raises(ShapeError, match=re.escape("pad: pad_width ((1, 2), (3, 4), (5, 6)) must be")):
        cnp.pad(np.ones((2, 2)), ((1, 2), (3, 4), (5, 6)))


def test_split_roll_and_their_errors():
    x = np.arange(10.0)
    for spec in ([3, 7], [-2], [8, 3], [0, 10, 12]):
        for got, want in zip(cnp.split(x, spec), np.split(x, spec), strict=True):
            np.testing.assert_array_equal(got, want)
    assert [p.shape for p in cnp.array_split(x, 4)] == [(3,), (3,), (2,), (2,)]
    with pytest.raises(ShapeError, match=re.escape("split: axis 0 of size 10 (shape (10,)) does not divide into "
                                                   "3 equal sections; array_split allows unequal ones")):
        cnp.split(x, 3)
    with pytest.raises(ShapeError, match="array_split: the number of sections must be positive"):
        cnp.array_split(x, 0)
    with pytest.raises(TypeError, match="split: indices_or_sections must be static"):
        cv.vmap(lambda v, i: cnp.split(v, i))(np.ones((2, 4)), np.ones((2,), dtype=np.int64))
    m = np.arange(6).reshape(2, 3)
    for shift, axis in [(4, None), (-1, 1), ((1, 1), (1, 1)), ((1, -1), (0, 1))]:
        np.testing.assert_array_equal(cnp.roll(m, shift, axis), np.roll(m, shift, axis))
    with pytest.raises(ShapeError, match="roll: shift"):
        cnp.roll(m, (1, 2, 3), (0, 1))
    with pytest.raises(ShapeError, match="roll: axis 2 is out of range for an array of shape"):
        cnp.roll(m, 1, 2)


def test_diag_diagonal_tril_cross_errors():
    with pytest.raises(ShapeError, match=re.escape("diag: the input must be 1-d or 2-d, got shape (2, 2, 2)")):
        cnp.diag(np.ones((2, 2, 2)))
    with pytest.raises(ShapeError, match="diagonal: axis1 and axis2 can not be same"):
        cnp.diagonal(np.ones((2, 2)), 0, 1, -1)
    with pytest.raises(ShapeError, match=re.escape("tril: the array must have at least 2 dims, got shape (3,)")):
        cnp.tril(np.ones(3))
    with pytest.raises(ShapeError, match="cross: the vectors must have 2 or 3 components, got 4 and 3"):
        cnp.cross(np.ones(4), np.ones(3))
    for k in (-4, -1, 0, 2, 5):
        np.testing.assert_array_equal(cnp.diag(np.arange(3.0), k), np.diag(np.arange(3.0), k))
        np.testing.assert_array_equal(cnp.diagonal(np.ones((3, 4)), k), np.diagonal(np.ones((3, 4)), k))
    with pytest.warns(DeprecationWarning, match="Support for 2-dimensional vectors in jnp.cross is deprecated"):
        np.testing.assert_array_equal(cnp.cross(np.array([1.0, 2.0]), np.array([3.0, 4.0])), -2.0)


LINALG_NAMES = [
    "EigResult",
    "EighResult",
    "QRResult",
    "SVDResult",
    "SlogdetResult",
    "cholesky",
    "cond",
    "cross",
    "det",
    "diagonal",
    "eig",
    "eigh",
    "eigvals",
    "eigvalsh",
    "inv",
    "lstsq",
    "matmul",
    "matrix_norm",
    "matrix_power",
    "matrix_rank",
    "matrix_transpose",
    "multi_dot",
    "norm",
    "outer",
    "pinv",
    "qr",
    "slogdet",
    "solve",
    "svd",
    "svdvals",
    "tensordot",
    "tensorinv",
    "tensorsolve",
    "trace",
    "vecdot",
    "vector_norm",
]


@pytest.mark.slow
def test_numpy_is_a_package_whose_linalg_is_a_module_of_its_own():
    """``cuvmap.numpy.linalg`` is a module file that imports on its own, first thing in a
    fresh interpreter, in each way people write it; the package's names are unchanged."""
    import importlib.util
    import subprocess
    import sys

    spec = importlib.util.find_spec("cuvmap.numpy.linalg")
    assert spec is not None and spec.origin.replace("\\", "/").endswith("cuvmap/numpy/linalg.py")
    assert cnp.__spec__.submodule_search_locations  # a package
    code = ("import cuvmap.numpy.linalg as la; from cuvmap.numpy import linalg; import cuvmap.numpy as cnp; "
            "import numpy as np; assert la is linalg is cnp.linalg; "
            "assert float(la.norm(np.array([3.0, 4.0]))) == 5.0; "
            "assert cnp.linalg.SVDResult is cnp.SVDResult; print(sorted(la.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(sorted(LINALG_NAMES))


def test_norm_errors_and_namespace():
    import cuvmap.numpy.linalg as la
    from cuvmap.numpy import linalg

    assert la is linalg is cnp.linalg
    assert not hasattr(cnp, "norm") and not hasattr(cnp, "svd")
    with pytest.raises(ShapeError, match="Invalid order 'fro' for vector norm"):
        la.norm(np.ones(3), "fro")
    with pytest.raises(ShapeError, match="invalid ord 3 for a matrix norm"):
        la.norm(np.ones((2, 2)), 3)
    with pytest.raises(ShapeError, match="Invalid order 'fro' for vector norm"):
        la.norm(np.ones(3), "fro")
    with pytest.raises(ShapeError, match="norm: ord=1 needs axis for an array of shape"):
        la.norm(np.ones((2, 2, 2)), 1)
    with pytest.raises(ShapeError, match="norm: axis 3 is out of range"):
        la.norm(np.ones((2, 2)), axis=3)
    assert la.norm(np.array([3, 4])).dtype == np.float64
    np.testing.assert_allclose(la.norm(np.ones((2, 3, 4))), math.sqrt(24))


def test_axis_errors_name_the_function():
    x = np.ones((2, 3))
    for fn, name in [(cnp.cumsum, "cumsum"), (cnp.cumprod, "cumprod"), (cnp.sort, "sort"), (cnp.argsort, "argsort"),
                     (cnp.prod, "prod"), (cnp.any, "any"), (cnp.all, "all"), (cnp.flip, "flip")]:
        with pytest.raises(ShapeError, match=f"^{name}: axis 2 is out of range for an array of shape"):
            fn(x, 2)


def test_tracer_methods_and_numpy_functions_on_tracers():
    x = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]])

    def f(v):
        return (v.prod(axis=1).sum() + v.cumsum(axis=0)[-1].sum() + v.cumprod().sum() + np.prod(v)
                + v.diagonal().sum() + v[:, :2].trace() + v.round(1).sum() * 0 + v.any() + v.all(axis=0).sum())

    want = (x.prod(axis=1).sum() + x.cumsum(axis=0)[-1].sum() + x.cumprod().sum() + np.prod(x)
            + x.diagonal().sum() + x[:, :2].trace() + 1 + 3)
    np.testing.assert_allclose(f(x), want)
    value, g = cv.value_and_grad(f)(x)
    np.testing.assert_allclose(value, want)
    assert g.shape == x.shape and np.isfinite(g).all()
    np.testing.assert_array_equal(cv.vmap(lambda v: v.argsort())(x), np.argsort(x, axis=1))
    np.testing.assert_array_equal(cv.vmap(lambda v: round(v, 1))(x), np.round(x, 1))


ACCUMULATED_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                     "float16", "float32", "float64", "complex64"]


@pytest.mark.parametrize("dtype", ACCUMULATED_DTYPES)
@pytest.mark.parametrize("name", ["sum", "prod", "cumsum", "cumprod", "trace"])
def test_reductions_accumulate_in_numpys_dtype(name, dtype):
    x = (np.arange(6) % 3).reshape(2, 3).astype(dtype)
    want = getattr(np, name)(x)
    for run in (getattr(cnp, name), cv.jit(getattr(cnp, name))):
        got = run(x)
        assert got.dtype == want.dtype, (name, dtype, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want)
    batched = cv.vmap(lambda v: getattr(cnp, name)(v[None]))(x)
    assert batched.dtype == want.dtype


def test_cumulative_and_sorting_dtypes():
    i32 = np.arange(1, 5, dtype=np.int32)
    assert cnp.cumsum(i32).dtype == np.cumsum(i32).dtype == np.int64
    assert cnp.cumprod(i32).dtype == np.cumprod(i32).dtype == np.int64
    assert cnp.cumsum(i32 > 2).dtype == np.int64
    assert cnp.cumsum(i32, dtype=np.float32).dtype == np.float32
    assert cnp.argsort(i32).dtype == np.int64 and cnp.sort(i32).dtype == np.int32
    np.testing.assert_array_equal(cnp.sort(np.ones((2, 0))), np.ones((2, 0)))
    with pytest.raises(NotImplementedError, match="order="):
        cnp.sort(i32, order="a")


# ---------------------------------------------------------------------------------------
# Bitwise operators on traced values (NOTE [bitwise operators on traced values])
# ---------------------------------------------------------------------------------------

BITWISE_OPERATORS = {
    "&": lambda x, y: x & y, "|": lambda x, y: x | y, "^": lambda x, y: x ^ y,
    "<<": lambda x, y: x << y, ">>": lambda x, y: x >> y,
}


def _bits(dtype, shape, seed):
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32, np.uint64])
@pytest.mark.parametrize("op", list(BITWISE_OPERATORS), ids=list(BITWISE_OPERATORS))
def test_bitwise_operators_match_numpy_under_vmap_and_jit(op, dtype):
    fn = BITWISE_OPERATORS[op]
    bits = np.dtype(dtype).itemsize * 8
    x = _bits(dtype, (5, 6), 0)
    # shift amounts from 0 to past the bit width; other operands: every bit pattern
    y = np.random.default_rng(1).integers(0, bits + 3, size=(6,)).astype(dtype) if op in ("<<", ">>") \
        else _bits(dtype, (6,), 1)
    want = fn(x, y)
    for got in (cv.vmap(fn, in_axes=(0, None))(x, y), cv.vmap(fn, in_axes=(1, None))(x.T, y),
                cv.jit(fn)(x, y), cv.vmap(cv.jit(fn), in_axes=(0, None))(x, y)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    # with a Python int on either side (weakly typed: the array's dtype stays)
    for left, right in ((x, 3), (5, x % bits) if op in ("<<", ">>") else (5, x)):
        want = fn(left, right)
        got = cv.vmap(fn, in_axes=(0 if left is x else None, None if left is x else 0))(left, right)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_invert_and_booleans_match_numpy():
    x = _bits(np.int16, (4, 5), 2)
    b = x > 0
    c = x % 3 == 0
    fn = lambda x, b, c: (~x, ~b, b & c, b | True, b ^ c, c & x, b << 2, b >> c)  # noqa: E731
    for got, want in zip(cv.vmap(fn)(x, b, c), fn(x, b, c), strict=True):
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want)
    for got, want in zip(cv.jit(fn)(x, b, c), fn(x, b, c), strict=True):
        np.testing.assert_array_equal(got, want)
    # the function names, NumPy 2's aliases included
    y = _bits(np.int16, (5,), 3) % 16
    for name, ref in [("bitwise_invert", np.invert), ("invert", np.invert), ("bitwise_not", np.invert)]:
        np.testing.assert_array_equal(getattr(cnp, name)(x), ref(x))
    for name, ref in [("bitwise_left_shift", np.left_shift), ("bitwise_right_shift", np.right_shift),
                      ("bitwise_and", np.bitwise_and), ("bitwise_xor", np.bitwise_xor)]:
        np.testing.assert_array_equal(getattr(cnp, name)(x, y), ref(x, y))


def test_right_shift_is_arithmetic_for_signed_and_logical_for_unsigned():
    x = np.array([-128, -7, -1, 0, 5, 127], np.int8)
    for k in (0, 1, 3, 7, 8, 9, 100):
        np.testing.assert_array_equal(cv.vmap(lambda v: v >> k)(x), x >> k)
        np.testing.assert_array_equal(cv.vmap(lambda v: v >> k)(x.view(np.uint8)), x.view(np.uint8) >> k)
        np.testing.assert_array_equal(cv.vmap(lambda v: v << k)(x), x << k)
    # a negative signed integer shifted by the bit width or more is -1
    np.testing.assert_array_equal(cv.vmap(lambda v: v >> 8)(x), [-1, -1, -1, 0, 0, 0])


@pytest.mark.parametrize("op", list(BITWISE_OPERATORS) + ["~"])
def test_bitwise_operators_reject_floats(op):
    fn = (lambda x: ~x) if op == "~" else (lambda x: BITWISE_OPERATORS[op](x, 1))
    name = {"&": "bitwise_and", "|": "bitwise_or", "^": "bitwise_xor", "<<": "left_shift", ">>": "right_shift",
            "~": "bitwise_not"}[op]
    match = re.escape(f"{name} (operator {op}): operands must be integers or booleans, got float64")
    for transform in (cv.vmap, cv.jit, cv.grad):
        with pytest.raises(TypeError, match=match):
            transform(lambda x: cnp.sum(fn(x)))(np.ones(3))
    with pytest.raises(TypeError, match="float32"):
        cnp.bitwise_or(np.ones(3, np.float32), np.ones(3, np.int32))
    with pytest.raises(TypeError, match="no common integer dtype"):
        cv.vmap(lambda v: v >> np.uint64(1))(np.ones((2, 3), np.int64))


def test_grad_through_an_integer_side_computation():
    """Bitwise ops on integers computed from the input carry no derivative; the float path
    through them differentiates as usual (closed forms)."""
    x = np.array([0.3, -1.2, 2.5, 0.7, -0.4])

    def f(v):
        rank = cnp.argsort(cnp.argsort(v))             # int64 ranks
        odd = (rank & 1).astype(bool)                   # odd ranks
        hi = (rank >> 1) ^ 1                            # an integer weight
        return cnp.sum(cnp.where(odd, v * v, 3 * v) * hi.astype(v.dtype))

    rank = np.argsort(np.argsort(x))
    odd, hi = (rank & 1).astype(bool), ((rank >> 1) ^ 1).astype(float)
    want = np.where(odd, 2 * x, 3.0) * hi
    np.testing.assert_allclose(cv.grad(f)(x), want, rtol=1e-15)
    np.testing.assert_allclose(cv.jit(cv.grad(f))(x), want, rtol=1e-15)
    np.testing.assert_allclose(cv.jvp(f, (x,), (np.ones(5),))[1], want.sum(), rtol=1e-14)
    xs = np.stack([x, -x, 2 * x])
    np.testing.assert_allclose(cv.vmap(cv.grad(f))(xs), np.stack([cv.grad(f)(v) for v in xs]), rtol=1e-15)
    np.testing.assert_allclose(cv.hessian(f)(x), np.diag(np.where(odd, 2.0, 0.0) * hi), atol=1e-15)
    # an integer output has a zero tangent of JAX's float0 dtype, as in JAX
    out, tangent = cv.jvp(lambda v: cnp.argsort(v) << 2, (x,), (np.ones(5),))
    np.testing.assert_array_equal(out, np.argsort(x) << 2)
    assert tangent.dtype == cv.dtypes.float0 and tangent.shape == out.shape


# ---------------------------------------------------------------------------------------
# erf_inv (NOTE [erf_inv from Giles' polynomials])
# ---------------------------------------------------------------------------------------


def test_erf_inv_matches_a_bisection_of_math_erf_over_its_range():
    from op_table import ref_erf_inv

    tails = 1 - np.logspace(-16, -1, 400)
    y = np.concatenate([np.linspace(-0.999, 0.999, 4001), tails, -tails, np.logspace(-300, -1, 300),
                        1 - np.arange(1, 40) * 2.0 ** -53, [0.999, 0.99903, 0.9991]])
    got, want = lax.erf_inv(y), ref_erf_inv(y)
    nonzero = want != 0
    assert (got[~nonzero] == 0).all()
    assert np.max(np.abs(got - want)[nonzero] / np.abs(want[nonzero])) < 4 * 2.0 ** -52
    y32 = y.astype(np.float32)
    y32 = y32[np.abs(y32) < 1]
    got32 = lax.erf_inv(y32)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, ref_erf_inv(y32.astype(np.float64)).astype(np.float32), rtol=2 ** -23, atol=0)
    # erf undoes it
    np.testing.assert_allclose(lax.erf(lax.erf_inv(y[np.abs(y) < 0.99])), y[np.abs(y) < 0.99], rtol=4e-16, atol=4e-16)


def test_erf_inv_special_values_and_derivative():
    got = lax.erf_inv(np.array([1.0, -1.0, 0.0, -0.0, 1.5, -2.0, np.nan]))
    np.testing.assert_array_equal(got[:4], [np.inf, -np.inf, 0.0, -0.0])
    assert np.signbit(got[3]) and np.isnan(got[4:]).all()
    assert lax.erf_inv(np.float16(0.5)).dtype == np.float16 and lax.erf_inv(np.arange(1)).dtype == np.float64
    # the derivative (√π/2)·exp(erf_inv(y)²), in closed form, and to second order
    ys = np.linspace(-0.95, 0.95, 17)
    x = lax.erf_inv(ys)
    np.testing.assert_allclose(cv.vmap(cv.grad(lax.erf_inv))(ys), math.sqrt(math.pi) / 2 * np.exp(x * x), rtol=1e-14)
    second = cv.vmap(cv.grad(cv.grad(lax.erf_inv)))(ys)
    np.testing.assert_allclose(second, 2 * x * (math.sqrt(math.pi) / 2 * np.exp(x * x)) ** 2, rtol=1e-13)



# ---------------------------------------------------------------------------------------
# svd and the singular-value norms (NOTE [svd's derivatives])
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (3, 3), (2, 4, 3), (0, 3, 2), (3, 0)])
@pytest.mark.parametrize("full_matrices", [True, False])
def test_svd_matches_numpy(shape, full_matrices):
    a = np.random.default_rng(0).standard_normal(shape)
    got = cnp.linalg.svd(a, full_matrices=full_matrices)
    want = np.linalg.svd(a, full_matrices=full_matrices)
    assert type(got).__name__ == "SVDResult" and got._fields == ("U", "S", "Vh")
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
    np.testing.assert_allclose(got.S, want.S, rtol=1e-13, atol=1e-13)
    k = got.S.shape[-1]
    # a decomposition: orthonormal columns and rows, and U S Vh = a
    np.testing.assert_allclose(np.swapaxes(got.U, -1, -2) @ got.U, np.broadcast_to(np.eye(got.U.shape[-1]),
                               got.U.shape[:-2] + (got.U.shape[-1],) * 2), atol=1e-13)
    np.testing.assert_allclose(got.Vh @ np.swapaxes(got.Vh, -1, -2), np.broadcast_to(np.eye(got.Vh.shape[-2]),
                               got.Vh.shape[:-2] + (got.Vh.shape[-2],) * 2), atol=1e-13)
    np.testing.assert_allclose((got.U[..., :k] * got.S[..., None, :]) @ got.Vh[..., :k, :], a, atol=1e-13)
    np.testing.assert_array_equal(cnp.linalg.svd(a, compute_uv=False), np.linalg.svd(a, compute_uv=False))
    np.testing.assert_array_equal(cnp.linalg.svdvals(a), np.linalg.svd(a, compute_uv=False))


def test_svd_dtypes_and_errors():
    assert cnp.linalg.svd(np.eye(3, dtype=np.int64), compute_uv=False).dtype == np.float64
    assert cnp.linalg.svd(np.eye(3, dtype=np.float32)).U.dtype == np.float32
    np.testing.assert_allclose(cnp.linalg.svd(np.diag([3.0, 1.0]), hermitian=True).S, [3.0, 1.0])
    with pytest.raises(ShapeError, match=re.escape("svd: the array must have at least 2 dims")):
        cnp.linalg.svd(np.ones(3))
    with pytest.raises(ShapeError, match="svd does not accept dtype float16: the operand must be float32, float64, "
                                         "complex64 or complex128") as info:
        cnp.linalg.svd(np.ones((2, 2), np.float16))
    assert isinstance(info.value, TypeError)  # JAX's exception type
    # the full decomposition of a non-square matrix has no derivative
    a = np.random.default_rng(1).standard_normal((4, 2))
    for transform in (lambda f: cv.grad(f), lambda f: (lambda x: cv.jvp(f, (x,), (x,))[1])):
        for full_tall in (a, a.T):
            match = r"full_matrices=True decomposition of a (4×2|2×4) matrix is not defined"
            with pytest.raises(ShapeError, match=match):
                transform(lambda x: cnp.sum(cnp.linalg.svd(x).U))(full_tall)
    # the reduced one does, and so do the singular values alone
    assert np.isfinite(cv.grad(lambda x: cnp.sum(cnp.linalg.svd(x, full_matrices=False).U ** 3))(a)).all()


def test_svd_derivatives_in_closed_form():
    """∂s_i/∂A = u_i v_iᵀ: the spectral norm's gradient is u_1 v_1ᵀ, the smallest singular
    value's u_k v_kᵀ, the nuclear norm's U Vᵀ."""
    from op_table import separated

    a = separated(np.random.default_rng(2).standard_normal((5, 3)))
    u, s, vh = np.linalg.svd(a, full_matrices=False)
    la = cnp.linalg
    np.testing.assert_allclose(cv.grad(lambda x: la.norm(x, 2))(a), np.outer(u[:, 0], vh[0]), atol=1e-13)
    np.testing.assert_allclose(cv.grad(lambda x: la.norm(x, -2))(a), np.outer(u[:, -1], vh[-1]), atol=1e-13)
    np.testing.assert_allclose(cv.grad(lambda x: la.norm(x, "nuc"))(a), u @ vh, atol=1e-13)
    np.testing.assert_allclose(cv.jacrev(la.svdvals)(a), np.einsum("mi,in->imn", u, vh), atol=1e-13)
    np.testing.assert_allclose(cv.jacfwd(la.svdvals)(a), np.einsum("mi,in->imn", u, vh), atol=1e-13)
    # the nuclear norm of a matrix with a repeated singular value still has its gradient U Vᵀ
    q = np.linalg.qr(np.random.default_rng(3).standard_normal((3, 3)))[0]
    np.testing.assert_allclose(cv.grad(lambda x: la.norm(x, "nuc"))(2 * q), q, atol=1e-13)
    # but the singular vectors' derivatives are undefined there (F has 1 / 0)
    with np.errstate(all="ignore"):
        assert not np.isfinite(cv.jacfwd(lambda x: la.svd(x).U)(2 * q)).all()


def test_svd_under_jit_and_vmap_is_one_decomposition(monkeypatch):
    from cuvmap.lax import linalg as lax_linalg

    a = np.random.default_rng(4).standard_normal((6, 4, 3))
    calls = []
    impl = lax_linalg.svd_p.impl

    def counting(x, **params):
        calls.append((np.shape(x), params["compute_uv"]))
        return impl(x, **params)

    monkeypatch.setattr(lax_linalg.svd_p, "impl", counting)
    f = lambda x: cnp.sum(cnp.linalg.svd(x, full_matrices=False).U[:, 0] ** 2 * cnp.linalg.norm(x, 2))  # noqa: E731
    want = np.stack([f(x) for x in a])
    calls.clear()
    np.testing.assert_allclose(cv.vmap(f)(a), want, rtol=1e-13)
    assert calls == [((6, 4, 3), True), ((6, 4, 3), False)]  # one stacked call each, not one per example
    np.testing.assert_allclose(cv.jit(cv.vmap(f))(a), want, rtol=1e-13)
    g = cv.vmap(cv.grad(f))(a)
    np.testing.assert_allclose(g, np.stack([cv.grad(f)(x) for x in a]), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(cv.jit(cv.vmap(cv.grad(f)))(a), g, rtol=1e-12, atol=1e-14)
    jaxpr = str(cv.make_jaxpr(lambda x: cnp.linalg.svd(x))(a[0]))
    assert jaxpr.count("svd") == 1, jaxpr
