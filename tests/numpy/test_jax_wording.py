"""JAX's error texts where JAX's own tests match them (issue 32, the mirror's d_wording
rows), and the dtype helpers of ``jax.dtypes``: each refusal raises the exception class
JAX raises, with cuvmap's prefix naming the function and JAX's sentence in it.

References are NumPy and closed forms; the rows are data."""
import re

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import dtypes, lax
from cuvmap.errors import ConcretizationError

ERROR_ROWS = [
    # (name, call, exception, pattern)
    ("choose raise under jit", lambda: cv.jit(lambda a: cnp.choose(a, [np.ones(3), np.zeros(3)], mode="raise"))(
        np.array([0, 1, 0])), ConcretizationError,
     "jnp.choose was jit-compiled with mode='raise'. Use mode='wrap' or mode='clip' instead."),
    ("ravel_multi_index raise under jit", lambda: cv.jit(lambda i: cnp.ravel_multi_index((i, i), (3, 3)))(
        np.array([0, 1])), ConcretizationError,
     "ravel_multi_index was jit-compiled with mode='raise'. Use mode='wrap' or mode='clip' instead."),
    ("arange names stop", lambda: cv.jit(cnp.arange)(3), ConcretizationError, "jnp.arange argument 'stop'"),
    ("arange names start", lambda: cv.jit(lambda s: cnp.arange(s, 3))(0), ConcretizationError,
     "jnp.arange argument 'start'"),
    ("arange names step", lambda: cv.jit(lambda s: cnp.arange(0, 3, s))(1), ConcretizationError,
     "jnp.arange argument 'step'"),
    ("broadcast_to fewer dims", lambda: cnp.broadcast_to(np.zeros((3, 4, 5)), (4, 5)), ValueError,
     r"broadcast_to: Cannot broadcast to shape with fewer dimensions: arr_shape=\(3, 4, 5\) shape=\(4, 5\)"),
    ("broadcast_to incompatible", lambda: cnp.broadcast_to(np.ones((2, 3)), (1, 3)), ValueError,
     r"Incompatible shapes for broadcasting: \(2, 3\) and requested shape \(1, 3\)"),
    ("compress size under jit", lambda: cv.jit(cnp.compress)(np.arange(4) > 1, np.arange(4.0)), ConcretizationError,
     "The size argument of jnp.compress must be specified"),
    ("extract size under jit", lambda: cv.jit(cnp.extract)(np.arange(4) > 1, np.arange(4.0)), ConcretizationError,
     "The size argument of jnp.compress must be specified"),
    ("interp shapes", lambda: cnp.interp(0.0, np.arange(2.0), np.arange(3.0)), ValueError,
     "^xp and fp must be one-dimensional arrays of equal size$"),
    ("interp left", lambda: cnp.interp(0.0, np.arange(3.0), np.arange(3.0), left="interpolate"), ValueError,
     "the only valid string value of `left` is 'extrapolate', but got: 'interpolate'"),
    ("interp complex x", lambda: cnp.interp(1j, 1j * np.arange(3.0), np.arange(3.0)), ValueError,
     re.escape("jnp.interp: complex x values not supported.")),
    ("mgrid traced start", lambda: cv.jit(lambda a, b: cnp.mgrid[a:b])(0, 2), ConcretizationError,
     "slice start of jnp.mgrid"),
    ("ogrid traced stop", lambda: cv.jit(lambda b: cnp.ogrid[0:b])(2), ConcretizationError, "slice stop of jnp.ogrid"),
    ("trace same axes", lambda: cnp.trace(np.ones((2, 3, 2)), axis1=1, axis2=-2), ValueError,
     "axis1 and axis2 can not be same"),
    ("top_k negative k", lambda: cnp.top_k(np.arange(10), -1), ValueError, "k argument to top_k must be nonnegative"),
    ("top_k large k", lambda: cnp.top_k(np.arange(10), 15), ValueError,
     "k argument to top_k must be no larger than size"),
    ("top_k axis", lambda: cnp.top_k(np.arange(10), 2, axis=5), ValueError, "axis 5 is out of bounds"),
    ("fftfreq d", lambda: cnp.fft.fftfreq(4, d=[0, 1, 2]), ValueError,
     re.escape("The d argument of jax.numpy.fft.fftfreq only takes a single value. Got d = [0, 1, 2].")),
    ("lax.fft too few dims", lambda: lax.fft(np.ones((14, 15), np.complex128), "fft", (4, 5, 6)), ValueError,
     r"FFT input shape \(14, 15\) must have at least as many input dimensions as fft_lengths \(4, 5, 6\)"),
    ("lax.fft minor dims", lambda: lax.fft(np.ones((14, 15), np.complex128), "fft", (17,)), ValueError,
     r"FFT input shape \(14, 15\) minor dimensions must be equal to fft_lengths \(17,\)"),
    ("lax.fft irfft minor dims", lambda: lax.fft(np.ones((2, 14, 15), np.complex128), "irfft", (13, 15)), ValueError,
     r"IRFFT input shape \(2, 14, 15\) minor dimensions must be equal to all except the last fft_length, "
     r"got fft_lengths=\(13, 15\)"),
    ("zeros float shape", lambda: cnp.zeros(1.5), TypeError, "Shapes must be 1D sequences of concrete values of integer type"),
    ("ones negative dim", lambda: cnp.ones((-1, 1)), TypeError, "negative dimensions are not allowed"),
    ("zeros traced shape", lambda: cv.jit(cnp.zeros)(2), TypeError,
     r"Shapes must be 1D sequences of concrete values of integer type.*\nIf using `jit`, try using `static_argnums`"),
    ("tensordot axes exceed ranks", lambda: cnp.tensordot(np.ones((3, 2, 2)), np.ones(2), axes=2), TypeError,
     "Number of tensordot axes.*exceeds input ranks"),
    ("tensordot unequal axes", lambda: cnp.tensordot(np.ones((3, 2, 2)), np.ones(2), axes=([0], [0, 1])), TypeError,
     "tensordot requires axes lists to have equal length"),
    ("tensordot bad axes lists", lambda: cnp.tensordot(np.ones((3, 2)), np.ones(2), axes=("bad", "axes")), TypeError,
     "tensordot requires both axes lists to be either ints, tuples or lists"),
    ("tensordot bad axes", lambda: cnp.tensordot(np.ones((3, 2)), np.ones(2), axes="badaxes"), TypeError,
     "tensordot axes argument must be an int, a pair of ints, or a pair of lists"),
    ("pad callable returning None", lambda: cnp.pad(np.ones(3), 1, lambda *a: None), TypeError,
     "callable mode returned None"),
    ("array with None", lambda: cnp.array([0.0, None]), ValueError, "None is not a valid value for jnp.array"),
    ("array with a huge int", lambda: cnp.array([0, -2**63 - 1]), OverflowError, "Python int too large"),
    ("masked array into jit", lambda: cv.jit(cnp.asarray)(np.ma.array([1, 2], mask=[True, False])), ValueError,
     "numpy masked arrays are not supported"),
    # control flow (lax): JAX's texts
    ("scan traced length", lambda: cv.jit(lambda n, x: lax.scan(lambda c, z: (c, z), x, (), n))(3, 1.0),
     ConcretizationError, "The `length` argument to `scan` expects a concrete `int` value"),
    ("scan traced unroll", lambda: cv.jit(lambda n, x: lax.scan(lambda c, z: (c, z), x, (), 10, unroll=n))(3, 1.0),
     ConcretizationError, "The `unroll` argument to `scan` expects a concrete `int` or `bool` value"),
    ("cond str pred", lambda: lax.cond("foo", lambda t: 2.0, lambda f: 3.0, 1.0), TypeError,
     re.escape("Pred must be a scalar, got foo of type <class 'str'>")),
    ("cond tuple pred", lambda: lax.cond((1.0, 1.0), lambda t: 2.0, lambda f: 3.0, 1.0), TypeError,
     re.escape("Pred must be a scalar, got (1.0, 1.0) of type <class 'tuple'>")),
    ("switch str index", lambda: lax.switch("foo", [lambda _: 2.0, lambda _: 3.0], 1.0), TypeError,
     re.escape("Index type must be an integer, got foo.")),
    ("switch tuple index", lambda: lax.switch((1.0, 1.0), [lambda _: 2.0, lambda _: 3.0], 1.0), TypeError,
     re.escape("Branch index must be scalar, got (1.0, 1.0) of shape (2,).")),
    ("switch no branches", lambda: lax.switch(0, [], 1.0), ValueError, "Empty branch sequence"),
    ("while_loop cond returns a pair", lambda: lax.while_loop(lambda c: (1.0, 1.0), lambda c: c, 0.0), TypeError,
     re.escape("cond_fun must return a boolean scalar, but got pytree PyTreeSpec((*, *)).")),
    ("while_loop cond returns a float", lambda: lax.while_loop(lambda c: np.float32(1.0), lambda c: c, np.float32(0.0)),
     TypeError, re.escape("cond_fun must return a boolean scalar, but got output type(s) [ShapedArray(float32[])].")),
    ("scan body output not a pair", lambda: lax.scan(lambda c, x: np.float32(0.0), 0, np.arange(5.0)), TypeError,
     re.escape("scan body output must be a pair, got float32[].")),
    ("associative_scan fn", lambda: lax.associative_scan(42, 0), TypeError, "lax.associative_scan.*callable"),
    ("jit of a str argument", lambda: cv.jit(lambda p: p)("abc"), TypeError, "is a str, which jit cannot trace"),
    ("platform_dependent without a branch", lambda: lax.platform_dependent(3.0, tpu=lambda x: x + 2.0),
     NotImplementedError, "translation rule .* not found for platform"),
    ("vmap out_axes out of bounds", lambda: cv.vmap(lambda y: y, in_axes=0, out_axes=-4)(np.ones((3, 4, 5))),
     ValueError, "axis -4 is out of bounds"),
    ("array of a structured dtype", lambda: cnp.array(3, [("a", "<i4"), ("b", "<i4")]), TypeError,
     "JAX only supports number, bool, and string dtypes"),
    ("clip of complex values", lambda: cnp.clip(np.ones(3) + 1j), ValueError,
     "Complex values have no ordering and cannot be clipped"),
    ("clip by a complex bound", lambda: cnp.clip(np.arange(3), min=-1 + 5j), ValueError,
     "Complex values have no ordering and cannot be clipped"),
    ("tri of a traced N", lambda: cv.jit(cnp.tri)(3, M=3, k=0), TypeError,
     "Shapes must be 1D sequences of concrete values of integer type"),
    ("tolist under jit", lambda: cv.jit(lambda x: x.tolist())(np.ones(2)), ConcretizationError,
     r"The tolist\(\) method was called on traced array"),
    ("split at traced indices", lambda: cv.jit(lambda i: cnp.split(cnp.zeros((12, 2)), i))(2.0), TypeError,
     "Abstract tracer value encountered where concrete value is expected"),
    ("interp period not a scalar", lambda: cnp.interp(0.5, np.arange(3.0), np.arange(3.0), period=np.ones(2)),
     ValueError, "period must be a scalar; got"),
    ("r_ bad directive", lambda: cnp.r_["asdfgh", [1, 2, 3]], ValueError, "could not understand directive"),
    ("c_ traced slice start", lambda: cv.jit(lambda a, b: cnp.c_[a:b])(0, 2), ConcretizationError,
     "slice start of jnp.c_"),
    ("array copy twice", lambda: cnp.array(np.arange(3), None, True, copy=False), TypeError,
     "array\\(\\) got multiple values for argument 'copy'"),
    ("array six positional arguments", lambda: cnp.array(np.arange(3), None, True, "K", 0, "extra"), TypeError,
     "array\\(\\) takes at most 5 positional arguments"),
    ("delete traced repeated-or-not indices", lambda: cv.jit(lambda i: cnp.delete(np.arange(4.0), i))(np.array([1])),
     ConcretizationError, "assume_unique_indices=True"),
]


@pytest.mark.parametrize("name, call, exc, pattern", ERROR_ROWS, ids=[r[0] for r in ERROR_ROWS])
def test_jax_error_texts(name, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


@pytest.mark.parametrize("name, call, want", [
    ("mgrid", lambda: cnp.mgrid[1:5:3, :5], np.mgrid[1:5:3, :5]),
    ("mgrid complex step", lambda: cnp.mgrid[-1:1:5j], np.mgrid[-1:1:5j]),
    ("ogrid", lambda: np.stack(np.broadcast_arrays(*cnp.ogrid[0:5, 1:3])),
     np.stack(np.broadcast_arrays(*np.ogrid[0:5, 1:3]))),
    ("mgrid under jit", lambda: cv.jit(lambda: cnp.mgrid[:4])(), np.arange(4)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_grids_are_numpys(name, call, want):
    np.testing.assert_array_equal(call(), want)


DTYPE_ROWS = [
    # (dtype, itemsize_bits, scalar_type_of)
    (np.bool_, 8, bool), (np.int8, 8, int), (np.uint16, 16, int), (np.int32, 32, int), (np.int64, 64, int),
    (np.float16, 16, float), (np.float32, 32, float), (np.float64, 64, float), (np.complex64, 64, complex),
    (np.complex128, 128, complex),
]


@pytest.mark.parametrize("dtype, bits, scalar", DTYPE_ROWS, ids=[np.dtype(r[0]).name for r in DTYPE_ROWS])
def test_jax_dtypes_helpers(dtype, bits, scalar):
    assert dtypes.itemsize_bits(dtype) == bits == 8 * np.dtype(dtype).itemsize
    assert dtypes.scalar_type_of(np.zeros(2, dtype)) is scalar
    assert dtypes.scalar_type_of(np.dtype(dtype)) is scalar
    assert dtypes.canonicalize_dtype(dtype) == np.dtype(dtype)
    # under jit, on a tracer: from the dtype, never the value
    got = cv.jit(lambda x: cnp.full(2, dtypes.itemsize_bits(x.dtype) + 0 * (dtypes.scalar_type_of(x) is scalar)))(
        np.ones(2, dtype))
    assert got.tolist() == [bits, bits]


def test_jax_dtypes_helpers_refuse():
    with pytest.raises(ValueError, match="itemsize_bits: dtype cannot be None"):
        dtypes.itemsize_bits(None)
    with pytest.raises(ValueError, match="itemsize_bits: expected"):
        dtypes.itemsize_bits(np.dtype("U3"))
    with pytest.raises(TypeError, match="scalar_type_of"):
        dtypes.scalar_type_of(np.array(["a"]))
    assert dtypes.scalar_type_of(2.0) is float and dtypes.scalar_type_of(True) is bool


X34 = np.arange(12.0).reshape(3, 4)
SHIFTS = np.array([1, 2, 3, -1, 0, 5])

EDGE_ROWS = [
    # (name, cuvmap's, NumPy's): shapes, dtypes and values must agree
    ("repeat of a 0-d array along axis 0", lambda: cnp.repeat(np.array(3), 2, axis=0), np.repeat(np.array(3), 2, axis=0)),
    ("roll flattened by a traced shift vector", lambda: cv.jit(lambda x, s: cnp.roll(x, s))(X34, SHIFTS),
     np.roll(X34, SHIFTS)),
    ("roll one axis by a traced shift vector", lambda: cv.jit(lambda x, s: cnp.roll(x, s, axis=1))(X34, SHIFTS[:2]),
     np.roll(X34, SHIFTS[:2], axis=1)),
    ("diff of order 0 ignores append", lambda: cnp.diff(X34, n=0, axis=1, append=1.0),
     np.diff(X34, n=0, axis=1, append=1.0)),
    ("array of a masked array drops the mask", lambda: cnp.array(np.ma.array([1, 2], mask=[True, False])),
     np.array(np.ma.array([1, 2], mask=[True, False]))),
    ("unwrap keeps float16 (a Python period is weak)", lambda: cnp.unwrap(np.array([0.0, 4.0, 9.0], np.float16), period=np.pi),
     np.unwrap(np.array([0.0, 4.0, 9.0], np.float16), period=np.pi)),
    ("unwrap keeps int8 with an int period", lambda: cnp.unwrap(np.array([0, 5, 11, 2], np.int8), period=4),
     np.unwrap(np.array([0, 5, 11, 2], np.int8), period=4)),
    ("iscomplexobj of a list", lambda: cnp.iscomplexobj([1 + 1j]), np.iscomplexobj([1 + 1j])),
    ("iscomplexobj of None", lambda: cnp.iscomplexobj(None), np.iscomplexobj(None)),
    ("iscomplexobj of a tuple of arrays", lambda: cnp.iscomplexobj((np.arange(5),)), np.iscomplexobj((np.arange(5),))),
    ("split at a derivative tracer's known value (jvp)",
     lambda: np.stack(cv.jvp(lambda i: cnp.split(cnp.arange(12.0), i), (2.0,), (1.0,))[0]),
     np.stack(np.split(np.arange(12.0), 2))),
    ("split at a list holding a derivative tracer (jvp)",
     lambda: np.concatenate(cv.jvp(lambda i: cnp.split(cnp.arange(12.0), (1, i.astype(np.int32))), (4.0,), (1.0,))[0]),
     np.concatenate(np.split(np.arange(12.0), (1, 4)))),
    ("iscomplexobj of a list under jit", lambda: cv.jit(cnp.iscomplexobj)([1 + 1j]), True),
    ("linspace retstep one sample", lambda: cnp.linspace(np.zeros((2, 2)), np.ones((2, 2)), 1, retstep=True)[1],
     np.linspace(np.zeros((2, 2)), np.ones((2, 2)), 1, retstep=True)[1]),
    ("linspace retstep no sample", lambda: cnp.linspace(np.zeros(2), np.ones(2), 0, retstep=True)[1],
     np.linspace(np.zeros(2), np.ones(2), 0, retstep=True)[1]),
    ("linspace retstep one sample no endpoint",
     lambda: cnp.linspace(np.zeros(2), np.ones(2), 1, endpoint=False, retstep=True)[1],
     np.linspace(np.zeros(2), np.ones(2), 1, endpoint=False, retstep=True)[1]),
]


@pytest.mark.parametrize("name, got, want", EDGE_ROWS, ids=[r[0] for r in EDGE_ROWS])
def test_numpy_edge_cases(name, got, want):
    out = np.asarray(got())
    assert out.shape == np.shape(want) and out.dtype == np.asarray(want).dtype
    np.testing.assert_array_equal(out, want)


def test_array_positional_copy_is_deprecated_and_copy_false_keeps_the_array():
    x = np.arange(3)
    with pytest.warns(DeprecationWarning, match="Passing the copy, order, and ndmin arguments to jnp.array"):
        assert cnp.array(x, None, False) is x
    with pytest.warns(DeprecationWarning, match="positionally is deprecated"):
        assert cnp.array(x, None, True) is not x
    assert cnp.array(x, copy=False) is x and cnp.array(x) is not x
    assert cnp.array(x, np.float64, copy=False).dtype == np.float64  # a conversion still happens


def test_is_weakly_typed():
    """``jax.dtypes.is_weakly_typed``: Python numbers, values cuvmap computed from them
    (``jnp.ravel(1)``), and those values inside vmap and jit, are weak; arrays are not."""
    weak = cnp.ravel(1)
    assert dtypes.is_weakly_typed(weak) and dtypes.is_weakly_typed(2.0) and dtypes.is_weakly_typed(cnp.asarray(2.0))
    assert not dtypes.is_weakly_typed(np.ones(2)) and not dtypes.is_weakly_typed(np.float32(1))
    seen = []
    out = cv.vmap(lambda x: seen.append(dtypes.is_weakly_typed(x)) or x)(weak)
    assert seen == [True] and dtypes.is_weakly_typed(out)
    assert cv.jit(lambda x: cnp.asarray(dtypes.is_weakly_typed(x)))(1.0)
    assert not cv.jit(lambda x: cnp.asarray(dtypes.is_weakly_typed(x)))(np.ones(1))


def test_stop_gradient_of_a_non_value_is_a_type_error():
    with pytest.raises(TypeError, match="stop_gradient: Argument .* is not a valid JAX type"):
        cv.lax.stop_gradient(lambda x: x)
    np.testing.assert_array_equal(cv.grad(lambda x: cv.lax.stop_gradient({"foo": x})["foo"] + x)(3.0), 1.0)
