"""Issue 32's audit of the JAX surface (Deliver 1-7): the gaps it found and closed.

- names: ``cuvmap.numpy.roots`` (``strip_zeros=``), ``poly`` of a square matrix,
  ``cuvmap.numpy.at(x)`` (JAX's ``x.at`` for concrete arrays);
- JAX's parameters: ``quantile``/``percentile`` ``weights=`` with ``method='inverted_cdf'``,
  ``nanvar``/``nanstd`` ``mean=``, ``scipy.special.logsumexp`` ``where=``, ``log_ndtr``
  ``series_order=``, ``softmax``/``log_softmax`` ``axis=None`` (JAX's default there),
  ``lax.dot`` ``dimension_numbers=``, ``lax.conv_transpose`` ``use_consistent_padding=``,
  the unary functions' ``accuracy=``, JAX's parameter names (``operand``, ``array``, ...);
- JAX's types: ``cnp.asarray(python_number)`` weakly typed, ``grad`` of a non-scalar a
  ``TypeError``.

Each value row is checked against NumPy or a closed form, under ``jit``, under ``vmap``
over each array argument against a loop, and with ``check_grads`` in both modes in float64
where differentiable. The signature table is JAX's documented parameters written out here
(JAX itself is not imported)."""
import inspect

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.lax as lax
import cuvmap.numpy as cnp
import cuvmap.scipy.linalg as sla
import cuvmap.scipy.special as special
from cuvmap.core import ConcretizationError
from name_rows import assert_results_close, assert_vmap_over_argument_is_a_loop, check_row_grads


RNG = np.random.default_rng(32)
A45 = RNG.normal(size=(4, 5))
W45 = RNG.uniform(0.2, 2.0, size=(4, 5))
W5 = RNG.uniform(0.2, 2.0, size=5)
Q3 = np.array([0.1, 0.5, 0.77])
V5 = RNG.normal(size=5)
MASK5 = np.array([True, False, True, True, False])
P4 = np.array([1.0, -6.0, 11.0, -6.0]) + RNG.normal(size=4) * 0.01   # roots near 1, 2, 3
SQ3 = RNG.normal(size=(3, 3))


def _np_roots(p):
    return np.sort_complex(np.roots(p).astype(complex))


def _np_logsumexp(a, where):
    return np.log(np.sum(np.exp(a[where])))


def _np_softmax_all(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _np_conv_transpose_1d(y, k, stride, pad):
    """JAX's conv_transpose (``transpose_kernel=False``: the kernel is not flipped, so it is
    torch's conv_transpose1d of the flipped kernel) on NWC / WIO arrays, with torch's
    padding (``use_consistent_padding=True``), as a loop: ``out[i·s + j − p_lo] += y[i] ·
    k[kw − 1 − j]``."""
    n, w, _ = y.shape
    kw, _, o = k.shape
    full = np.zeros((n, (w - 1) * stride + kw, o))
    for i in range(w):
        for j in range(kw):
            full[:, i * stride + j, :] += y[:, i, :] @ k[kw - 1 - j]
    return full[:, pad[0]:full.shape[1] - pad[1], :]


Y_CT = RNG.normal(size=(2, 4, 3))     # NWC
K_CT = RNG.normal(size=(3, 3, 2))     # WIO: I = 3 inputs of the transposed conv, O = 2

# (name, cuvmap function, reference, args, indices of the args to differentiate)
ROWS = [
    ("roots", lambda p: cnp.sort_complex(cnp.roots(p)), _np_roots, (P4,), (0,)),
    ("roots leading zeros stripped", lambda p: cnp.sort_complex(cnp.roots(cnp.concatenate([cnp.zeros(2), p]))),
     _np_roots, (P4,), ()),
    ("roots strip_zeros=False", lambda p: cnp.roots(cnp.concatenate([cnp.zeros(1), p]), strip_zeros=False)[-1:],
     lambda p: np.array([complex(np.nan, np.nan)]), (P4,), ()),
    ("poly of a square matrix", lambda m: cnp.real(cnp.poly(m)), np.poly, (SQ3,), (0,)),
    ("quantile inverted_cdf weights", lambda a, w: cnp.quantile(a, Q3, axis=1, method="inverted_cdf", weights=w),
     lambda a, w: np.quantile(a, Q3, axis=1, method="inverted_cdf", weights=w), (A45, W45), (0,)),
    ("quantile inverted_cdf axis weights", lambda a, w: cnp.quantile(a, 0.4, axis=1, method="inverted_cdf",
                                                                     weights=w),
     lambda a, w: np.quantile(a, 0.4, axis=1, method="inverted_cdf", weights=w), (A45, W5), (0,)),
    ("quantile inverted_cdf", lambda a: cnp.quantile(a, Q3, method="inverted_cdf"),
     lambda a: np.quantile(a, Q3, method="inverted_cdf"), (A45,), (0,)),
    ("percentile inverted_cdf weights", lambda a, w: cnp.percentile(a, 30.0, axis=0, method="inverted_cdf",
                                                                    weights=w),
     lambda a, w: np.percentile(a, 30.0, axis=0, method="inverted_cdf", weights=w), (A45, W45), (0,)),
    ("nanvar mean", lambda a, m: cnp.nanvar(a, axis=1, mean=m), lambda a, m: np.nanvar(a, axis=1, mean=m),
     (A45, A45.mean(1, keepdims=True) + 0.1), (0, 1)),
    ("nanstd mean ddof", lambda a, m: cnp.nanstd(a, axis=0, ddof=1, mean=m),
     lambda a, m: np.nanstd(a, axis=0, ddof=1, mean=m), (A45, A45.mean(0, keepdims=True)), (0, 1)),
    ("logsumexp where", lambda a: special.logsumexp(a, where=MASK5), lambda a: _np_logsumexp(a, MASK5), (V5,), (0,)),
    ("logsumexp where b return_sign", lambda a, b: special.logsumexp(a, b=b, where=MASK5, return_sign=True),
     lambda a, b: (np.log(abs(np.sum((b * np.exp(a))[MASK5]))), np.sign(np.sum((b * np.exp(a))[MASK5]))),
     (V5, V5), (0, 1)),
    ("softmax axis None", special.softmax, _np_softmax_all, (A45,), (0,)),
    ("log_softmax axis None", special.log_softmax, lambda x: np.log(_np_softmax_all(x)), (A45,), (0,)),
    ("log_ndtr series_order", lambda x: special.log_ndtr(x, series_order=5), lambda x: special.log_ndtr(x),
     (np.array([-30.0, -3.0, 0.5]),), (0,)),
    ("lax.dot dimension_numbers", lambda a, b: lax.dot(a, b, dimension_numbers=(((1,), (1,)), ((0,), (0,)))),
     lambda a, b: np.einsum("bi,bi->b", a, b), (A45, W45), (0, 1)),
    ("conv_transpose use_consistent_padding", lambda y, k: lax.conv_transpose(
        y, k, (2,), ((1, 2),), dimension_numbers=("NWC", "WIO", "NWC"), use_consistent_padding=True),
     lambda y, k: _np_conv_transpose_1d(y, k, 2, (1, 2)), (Y_CT, K_CT), (0, 1)),
    ("exp accuracy", lambda x: lax.exp(x, accuracy=None), np.exp, (V5,), (0,)),
    ("at set concrete", lambda x, v: cnp.at(x)[1:3].set(v), lambda x, v: np.concatenate([x[:1], v, x[3:]]),
     (V5, V5[:2]), (0, 1)),
    ("at add repeated", lambda x: cnp.at(x)[np.array([0, 0, 4])].add(2.0),
     lambda x: x + np.array([4.0, 0, 0, 0, 2.0]), (V5,), (0,)),
    ("at get", lambda x: cnp.at(x)[::2].get(), lambda x: x[::2], (V5,), (0,)),
]
IDS = [r[0] for r in ROWS]


def _assert_close(got, want):
    assert_results_close(got, want, rtol=1e-08, atol=1e-09)


@pytest.mark.parametrize("name, f, ref, args, diff", ROWS, ids=IDS)
def test_values(name, f, ref, args, diff):
    _assert_close(f(*args), ref(*args))


@pytest.mark.parametrize("name, f, ref, args, diff", ROWS, ids=IDS)
def test_under_jit(name, f, ref, args, diff):
    if name.startswith("roots") and "False" not in name:
        # strip_zeros=True reads the coefficients to size the result: JAX's refusal
        with pytest.raises(ConcretizationError):
            cv.jit(f)(*args)
        return
    _assert_close(cv.jit(f)(*args), f(*args))


VMAP_CASES = [(r, k) for r in ROWS for k in range(len(r[3]))
              if not (r[0].startswith("roots") and "False" not in r[0])]


@pytest.mark.parametrize("row, k", VMAP_CASES, ids=[f"{r[0]}-arg{k}" for r, k in VMAP_CASES])
def test_under_vmap_over_each_argument(row, k):
    name, f, ref, args, diff = row
    batch = np.stack([args[k], args[k] * 1.25 + 0.05, args[k][::-1] if np.ndim(args[k]) else args[k]])

    assert_vmap_over_argument_is_a_loop(f, args, k, batch, rtol=1e-08, atol=1e-09)


GRAD_ROWS = [r for r in ROWS if r[4]]


@pytest.mark.parametrize("name, f, ref, args, diff", GRAD_ROWS, ids=[r[0] for r in GRAD_ROWS])
def test_derivatives_both_modes(name, f, ref, args, diff):
    check_row_grads(f, args, diff, tol=1e-05, real_part=True)


def test_roots_derivative_closed_form():
    # p(r) = 0: dr/dp_k = −r^(n−k) / p'(r)
    p = np.array([1.0, -3.0, 2.0])
    jac = cv.jacrev(lambda p: cnp.real(cnp.sort_complex(cnp.roots(p))))(p)
    np.testing.assert_allclose(jac, [[1.0, 1.0, 1.0], [-4.0, -2.0, -1.0]], atol=1e-12)


def test_roots_strip_zeros_needs_concrete_coefficients():
    with pytest.raises(ConcretizationError, match="strip_zeros=False"):
        cv.jit(cnp.roots)(P4)
    out = cv.vmap(lambda p: cnp.roots(p, strip_zeros=False))(np.array([[1.0, -3.0, 2.0], [0.0, 1.0, -1.0]]))
    np.testing.assert_allclose(np.sort_complex(out[0]), [1, 2])
    np.testing.assert_allclose(out[1, 0], 1.0)
    assert np.isnan(out[1, 1])


def test_at_of_a_concrete_array_copies():
    x = np.arange(4.0)
    y = cnp.at(x)[np.array([1, 3])].multiply(np.array([2.0, 3.0]))
    np.testing.assert_array_equal(y, [0.0, 2.0, 2.0, 9.0])
    np.testing.assert_array_equal(x, np.arange(4.0))
    np.testing.assert_array_equal(cnp.at([1.0, 2.0])[0].max(5.0), [5.0, 2.0])


def test_quantile_weights_need_inverted_cdf():
    with pytest.raises(NotImplementedError, match="inverted_cdf"):
        cnp.quantile(A45, 0.5, weights=W45)


@pytest.mark.parametrize("bad, error", [(31, ValueError), (-1, ValueError), (2.0, TypeError)])
def test_log_ndtr_series_order_checked(bad, error):
    with pytest.raises(error, match="series_order"):
        special.log_ndtr(V5, series_order=bad)


# --- weak types of Python numbers (JAX: weak_type = dtype is None and is_weakly_typed(x))
F32 = np.ones(3, np.float32)
I8 = np.ones(3, np.int8)
# (eagerly NumPy's own operators know nothing of weak types: cuvmap.numpy's functions do)
WEAK_ROWS = [
    ("asarray float", lambda a: cnp.multiply(cnp.asarray(2.0), a), F32, np.float32),
    ("array float", lambda a: cnp.add(cnp.array(2.0), a), F32, np.float32),
    ("asarray int", lambda a: cnp.multiply(cnp.asarray(3), a), I8, np.int8),
    ("asarray with dtype is strong", lambda a: cnp.multiply(cnp.asarray(2.0, dtype=np.float64), a), F32, np.float64),
    ("asarray bool is strong", lambda a: cnp.add(cnp.asarray(True), a), I8, np.int8),
    ("asarray numpy scalar is strong", lambda a: cnp.multiply(cnp.asarray(np.float64(2.0)), a), F32, np.float64),
]


@pytest.mark.parametrize("name, f, a, dtype", WEAK_ROWS, ids=[r[0] for r in WEAK_ROWS])
def test_python_numbers_are_weak(name, f, a, dtype):
    assert f(a).dtype == dtype
    assert cv.jit(f)(a).dtype == dtype
    assert cv.eval_shape(f, a).dtype == dtype


def test_weak_type_reported():
    assert cnp.is_weakly_typed(cnp.asarray(1.5)) and cv.eval_shape(lambda: cnp.asarray(1.5)).weak_type
    assert not cnp.is_weakly_typed(cnp.asarray([1.5])) and not cnp.is_weakly_typed(cnp.asarray(1.5, np.float64))


# --- JAX's refusals
@pytest.mark.parametrize("f", [lambda x: x * np.ones(2), lambda x: (x, x), lambda x: None, lambda x: x > 0],
                         ids=["vector", "tuple", "None", "bool"])
def test_grad_of_a_non_scalar_is_a_type_error(f):
    with pytest.raises(TypeError, match="grad"):
        cv.grad(f)(1.0)
    with pytest.raises(cv.GradOutputError):
        cv.grad(f)(1.0)


# --- JAX's parameters: (function, JAX's parameters in order with their defaults; ... = none)
E = inspect.Parameter.empty
SIGNATURES = [
    (lax.transpose, [("operand", E), ("permutation", E)]),
    (lax.broadcast_in_dim, [("operand", E), ("shape", E), ("broadcast_dimensions", E)]),
    (lax.squeeze, [("array", E), ("dimensions", E)]),
    (lax.expand_dims, [("array", E), ("dimensions", E)]),
    (lax.concatenate, [("operands", E), ("dimension", E)]),
    (lax.argmax, [("operand", E), ("axis", E), ("index_dtype", None)]),
    (lax.argmin, [("operand", E), ("axis", E), ("index_dtype", None)]),
    (lax.cumsum, [("operand", E), ("axis", 0), ("reverse", False)]),
    (lax.cumprod, [("operand", E), ("axis", 0), ("reverse", False)]),
    (lax.cummax, [("operand", E), ("axis", 0), ("reverse", False)]),
    (lax.cummin, [("operand", E), ("axis", 0), ("reverse", False)]),
    (lax.cumlogsumexp, [("operand", E), ("axis", 0), ("reverse", False)]),
    (lax.dot, [("lhs", E), ("rhs", E), ("precision", None), ("preferred_element_type", None),
               ("dimension_numbers", None)]),
    (lax.conv_transpose, [("lhs", E), ("rhs", E), ("strides", E), ("padding", E), ("rhs_dilation", None),
                          ("dimension_numbers", None), ("transpose_kernel", False), ("precision", None),
                          ("preferred_element_type", None), ("use_consistent_padding", False)]),
    (cnp.asarray, [("a", E), ("dtype", None), ("order", None), ("copy", None), ("device", None)]),
    (cnp.array, [("object", E), ("dtype", None), ("copy", True), ("order", "K"), ("ndmin", 0), ("device", None)]),
    (cnp.mean, [("a", E), ("axis", None), ("dtype", None), ("out", None), ("keepdims", False), ("where", None)]),
    (cnp.take_along_axis, [("arr", E), ("indices", E), ("axis", -1), ("mode", None), ("fill_value", None)]),
    (cnp.outer, [("a", E), ("b", E), ("out", None)]),
    (cnp.trace, [("a", E), ("offset", 0), ("axis1", 0), ("axis2", 1), ("dtype", None), ("out", None)]),
    (cnp.nanvar, [("a", E), ("axis", None), ("dtype", None), ("out", None), ("ddof", 0), ("keepdims", False),
                  ("where", None), ("mean", None)]),
    (cnp.quantile, [("a", E), ("q", E), ("axis", None), ("out", None), ("overwrite_input", False),
                    ("method", "linear"), ("keepdims", False), ("weights", None)]),
    (cnp.roots, [("p", E), ("strip_zeros", True)]),
    (special.logsumexp, [("a", E), ("axis", None), ("b", None), ("keepdims", False), ("return_sign", False),
                         ("where", None)]),
    (special.log_ndtr, [("x", E), ("series_order", 3)]),
    (special.logit, [("x", E)]),
    (special.softmax, [("x", E), ("axis", None)]),
    (special.log_softmax, [("x", E), ("axis", None)]),
    (lax.convert_element_type, [("operand", E), ("new_dtype", E)]),
    (lax.bitcast_convert_type, [("operand", E), ("new_dtype", E)]),
    (lax.reduce_sum, [("operand", E), ("axes", None)]),
    (lax.reduce_max, [("operand", E), ("axes", None)]),
    (lax.shift_left, [("x", E), ("y", E)]),
    (lax.stack, [("operands", E), ("axis", 0)]),
    (lax.full, [("shape", E), ("fill_value", E), ("dtype", None), ("sharding", None)]),
    (lax.broadcasted_iota, [("dtype", E), ("shape", E), ("dimension", E), ("sharding", None)]),
    (lax.collapse, [("operand", E), ("start_dimension", E), ("stop_dimension", None)]),
    (lax.reduce_prod, [("operand", E), ("axes", E)]),
    (cnp.sum, [("a", E), ("axis", None), ("dtype", None), ("out", None), ("keepdims", False), ("initial", None),
               ("where", None)]),
    (cnp.var, [("a", E), ("axis", None), ("dtype", None), ("out", None), ("ddof", 0), ("keepdims", False),
               ("where", None), ("correction", None), ("mean", None)]),
    (cnp.reshape, [("a", E)]),
    (cnp.zeros_like, [("a", E), ("dtype", None), ("shape", None), ("device", None)]),
    (cnp.full_like, [("a", E), ("fill_value", E), ("dtype", None), ("shape", None), ("device", None)]),
    (cnp.empty_like, [("prototype", E), ("dtype", None), ("shape", None), ("device", None)]),
    (cnp.concatenate, [("arrays", E), ("axis", 0)]),
    (cnp.stack, [("arrays", E), ("axis", 0)]),
    (cnp.flip, [("m", E), ("axis", None)]),
    (cnp.power, [("x1", E), ("x2", E)]),
    (cnp.split, [("ary", E), ("indices_or_sections", E), ("axis", 0)]),
    (cnp.pad, [("array", E), ("pad_width", E), ("mode", "constant")]),
    (cnp.astype, [("x", E), ("dtype", E), ("copy", False), ("device", None)]),
    (cnp.average, [("a", E), ("axis", None), ("weights", None), ("returned", False), ("keepdims", False)]),
    (cnp.isin, [("element", E), ("test_elements", E), ("assume_unique", False), ("invert", False),
                ("method", "auto")]),
    (cnp.vectorize, [("pyfunc", E), ("excluded", frozenset()), ("signature", None)]),
    (cnp.intersect1d, [("ar1", E), ("ar2", E), ("assume_unique", False), ("return_indices", False), ("size", None),
                       ("fill_value", None)]),
    (sla.eigh, [("a", E), ("b", None), ("lower", True), ("eigvals_only", False), ("overwrite_a", False),
                ("overwrite_b", False), ("turbo", True), ("eigvals", None), ("type", 1), ("check_finite", True)]),
] + [(getattr(lax, n), [("x", E), ("accuracy", None)])
     for n in ("exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "sqrt", "rsqrt",
               "cbrt")]


@pytest.mark.parametrize("f, params", SIGNATURES, ids=[f"{s[0].__module__}.{s[0].__name__}" for s in SIGNATURES])
def test_jax_parameters(f, params):
    sig = inspect.signature(f).parameters
    names = [p for p in sig if sig[p].kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    assert names[:len(params)] == [p for p, _ in params]
    for p, default in params:
        if p == "index_dtype":
            continue   # JAX requires it; cuvmap defaults it to int64 (docs/jax.md)
        assert sig[p].default == default, (p, sig[p].default, default)


@pytest.mark.gpu
@pytest.mark.skipif(not cv.backend.gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("name, f, ref, args, diff", ROWS, ids=IDS)
def test_device_arrays_stay_on_the_device(name, f, ref, args, diff):
    device_args = tuple(cv.device_put(x, "gpu") for x in args)
    got, want = f(*device_args), f(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert cv.backend.is_cupy_array(g), name
        _assert_close(cv.device_put(g, "cpu"), w)
