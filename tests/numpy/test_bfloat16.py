"""bfloat16 computes as in JAX (NOTE [bfloat16 computes in float32] in cuvmap/core/bfloat16.py):
JAX's promotions, each primitive in float32 rounded once to bfloat16, bfloat16 tangents and
cotangents; what has no bfloat16 rule (LAPACK's decompositions, ...) refuses naming it.

The walk takes every float32 row of the op table (tests/op_table.py), rounds its
differentiable operands to bfloat16 and checks:

- a row whose program is one primitive gives exactly that primitive computed in float32
  on the rounded operands, rounded to bfloat16 (one rounding, as XLA's CPU backend);
  a composite row agrees with the float32 computation within bfloat16's precision
  (``2⁻⁸`` relative per rounding, a few roundings deep);
- every float32 result of the float32 row is bfloat16 here (JAX's promotion: bfloat16
  with integers and Python scalars stays bfloat16), other dtypes unchanged;
- ``jit`` gives the eager bits; ``vjp`` gives bfloat16 cotangents close to float32's;
- or computing it raises an error that names bfloat16.
"""
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax
from cuvmap import numpy as cnp

ml_dtypes = pytest.importorskip("ml_dtypes")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from op_table import ALL_ROWS, F32, closed_over_nondiff  # noqa: E402
from sampling import sampled  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F64 = np.dtype(np.float16), np.dtype(np.float64)
C64, C128 = np.dtype(np.complex64), np.dtype(np.complex128)

# JAX's lattice (jax.numpy.promote_types with 64-bit types): bfloat16 joins
PROMOTIONS = [
    (np.bool_, BF16), (np.int8, BF16), (np.uint8, BF16), (np.int16, BF16), (np.int32, BF16), (np.int64, BF16),
    (np.uint64, BF16), (BF16, BF16), (np.float16, F32), (np.float32, F32), (np.float64, F64),
    (np.complex64, C64), (np.complex128, C128),
]


@pytest.mark.parametrize("other, expected", PROMOTIONS)
def test_promotion_follows_jax(other, expected):
    other = np.dtype(other)
    assert cnp.promote_types(BF16, other) == expected
    assert cnp.promote_types(other, BF16) == expected
    assert cnp.result_type(np.ones(2, BF16), np.ones(2, other)) == expected
    x, y = np.ones(3, BF16), np.ones(3, other)
    assert cnp.add(x, y).dtype == expected
    assert cv.jit(lambda a, b: a * b)(x, y).dtype == expected
    assert cv.eval_shape(lambda a, b: a - b, x, y).dtype == expected


@pytest.mark.parametrize("scalar, expected", [(2, BF16), (2.5, BF16), (True, BF16), (1j, C64)])
def test_python_scalars_are_weak(scalar, expected):
    x = np.array([1.0, 2.5, -3.0], BF16)
    assert cnp.multiply(x, scalar).dtype == expected
    assert cv.jit(lambda a: a * scalar)(x).dtype == expected
    assert cnp.result_type(x, scalar) == expected


def test_dtype_questions():
    assert cnp.issubdtype(BF16, cnp.floating) and cnp.issubdtype(BF16, cnp.inexact)
    assert not cnp.issubdtype(BF16, cnp.integer) and not cnp.issubdtype(BF16, cnp.complexfloating)
    assert cnp.issubdtype(cnp.bfloat16, cnp.bfloat16)
    assert cnp.isdtype(BF16, "real floating") and not cnp.isdtype(BF16, "integral")
    assert cnp.can_cast(BF16, np.float32) and not cnp.can_cast(np.float32, BF16)
    info = cnp.finfo(BF16)
    assert info.eps == 2.0 ** -7 and info.bits == 16 and info.nmant == 7


def test_bit_level_functions_are_exact():
    """The functions that read a float's bits see bfloat16's own (8 exponent bits, 7 of
    mantissa), not float32's: nextafter and a bitcast run on the bfloat16 operand itself."""
    x = np.array([1.0, -2.0, 3e-39, 0.75, 0.0], BF16)
    toward = np.array([2.0, -3.0, 1.0, 0.0, -1.0], BF16)
    for run in (cnp.nextafter, cv.jit(cnp.nextafter)):
        got = run(x, toward)
        assert got.dtype == BF16
        np.testing.assert_array_equal(got.view(np.int16), np.nextafter(x, toward).view(np.int16))
    for run in (lambda a: lax.bitcast_convert_type(a, np.int16), cv.jit(lambda a: lax.bitcast_convert_type(a, np.int16))):
        np.testing.assert_array_equal(run(x), x.view(np.int16))
    mantissa, exponent = cnp.frexp(x)
    m32, e32 = np.frexp(x.astype(np.float32))
    np.testing.assert_array_equal(mantissa.astype(np.float32), m32)
    np.testing.assert_array_equal(exponent, e32)
    np.testing.assert_array_equal(cnp.spacing(x), np.spacing(x))
    np.testing.assert_array_equal(cnp.ldexp(x, 3).astype(np.float32), np.ldexp(x.astype(np.float32), 3))


def test_nan_to_num_uses_the_bfloat16_limits():
    x = np.array([np.inf, -np.inf, np.nan, 1.5], BF16)
    got = cnp.nan_to_num(x)
    assert got.dtype == BF16
    info = ml_dtypes.finfo(BF16)
    np.testing.assert_array_equal(got.astype(np.float32), np.array([info.max, info.min, 0, 1.5], np.float32))


def test_a_cast_to_bfloat16_is_differentiable():
    x = np.array([0.3, -1.7, 2.2], np.float32)

    def f(x):
        return cnp.sum(cnp.sin(x.astype(BF16)) * 2).astype(np.float32)

    g = cv.grad(f)(x)
    assert g.dtype == np.float32
    expected = (2 * np.cos(x.astype(BF16).astype(np.float32))).astype(BF16).astype(np.float32)
    np.testing.assert_allclose(g, expected, rtol=2 ** -7)
    np.testing.assert_array_equal(cv.jit(cv.grad(f))(x), g)


def test_per_example_gradients_in_bfloat16():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(BF16)
    xs = rng.standard_normal((5, 4)).astype(BF16)

    def loss(w, x):
        return cnp.sum(cnp.tanh(x @ w) ** 2)

    per_example = cv.vmap(cv.grad(loss), in_axes=(None, 0))(w, xs)
    assert per_example.dtype == BF16 and per_example.shape == (5, 4, 3)
    loop = np.stack([cv.grad(loss)(w, x) for x in xs])
    np.testing.assert_allclose(per_example.astype(np.float32), loop.astype(np.float32), rtol=2 ** -6, atol=2 ** -6)
    w32, xs32 = w.astype(np.float32), xs.astype(np.float32)
    reference = cv.vmap(cv.grad(loss), in_axes=(None, 0))(w32, xs32)
    np.testing.assert_allclose(per_example.astype(np.float32), reference, rtol=3e-2, atol=3e-2)


def test_float8_is_still_refused():
    x = np.ones(3, ml_dtypes.float8_e4m3fn)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        cnp.sin(x)


# --- the walk over the op table ------------------------------------------------------------

WALKED = [r for r in ALL_ROWS if F32 in r.dtypes and r.differentiable and r.diff_argnums]
CASES = sampled(WALKED, 4, ids=[r.name for r in WALKED])


def _leaves(tree):
    return [np.asarray(x) for x in cv.tree.leaves(tree)]


def _rounded(row):
    """``(f, bfloat16 operands, float32 operands)``: every float32 operand of the row
    rounded to bfloat16 (the fixed ones too, so that no float32 operand lifts the result),
    and the same values in float32."""
    args = [np.asarray(a).astype(BF16) if np.asarray(a).dtype == F32 else a for a in row.make_args(F32)]
    f, bf = closed_over_nondiff(row, args)
    as_f32 = [np.asarray(a).astype(F32) if np.asarray(a).dtype == BF16 else a for a in args]
    f32_fun, f32 = closed_over_nondiff(row, as_f32)
    return f, f32_fun, bf, f32, as_f32


# rows whose float32 results are not bfloat16 here, and why
OTHER_DTYPES = {
    "convert_to_f32": "an explicit cast to float32",
    "kaiser": "a window has the default float dtype (its beta, a parameter, is promoted with it)",
    **{n: "through complex64 (there is no complex bfloat16: a complex of bfloat16 parts is complex64, as "
          "bfloat16 * 1j is in JAX)"
       for n in ("complex_abs", "complex_real_of_product", "complex_imag_of_conj", "complex_angle",
                 "complex_pyscalar_factor", "fft_power_spectrum", "fft_ortho_inverse_resized",
                 "fft_circular_self_convolution")},
}


def _one_primitive(f, args):
    """Whether ``f`` stages to one equation of a primitive without programs of its own (a
    scan's body rounds at each of its primitives)."""
    try:
        eqns = cv.make_jaxpr(f)(*args).jaxpr.eqns
    except Exception:  # noqa: BLE001 - a function that cannot be staged
        return False
    inner = [v for v in eqns[0].params.values() if hasattr(getattr(v, "jaxpr", v), "eqns")] if eqns else []
    return len(eqns) == 1 and not inner


@pytest.mark.parametrize("row", CASES)
def test_every_row_computes_or_names_bfloat16(row):
    f, f32_fun, bf, f32, operands = _rounded(row)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        reference = _leaves(f32_fun(*f32))
        independent = _leaves(row.ref(*operands))  # the row's own reference (NumPy's, a closed form)
        try:
            got = _leaves(f(*bf))
        except (TypeError, ValueError, NotImplementedError) as e:  # ShapeError is a ValueError
            assert "bfloat16" in str(e), f"{row.name}: {type(e).__name__}: {e}"
            with pytest.raises(type(e), match="bfloat16"):
                cv.jit(f)(*bf)
            return
        staged = _leaves(cv.jit(f)(*bf))
    exact = _one_primitive(f32_fun, f32)
    assert len(independent) == len(got), row.name
    for g, s, r, ind in zip(got, staged, reference, independent):
        assert s.dtype == g.dtype, (row.name, s.dtype, g.dtype)
        np.testing.assert_array_equal(s.astype(F32) if s.dtype == BF16 else s,
                                      g.astype(F32) if g.dtype == BF16 else g, err_msg=f"{row.name}: jit")
        if r.dtype != F32:
            assert g.dtype == r.dtype or (r.dtype == F64 and g.dtype == F32), (row.name, g.dtype, r.dtype)
            continue
        if row.name in OTHER_DTYPES:
            assert g.dtype in (F32, C64), (row.name, g.dtype)
            np.testing.assert_allclose(g, r, rtol=6e-2, atol=6e-2, err_msg=row.name)
            continue
        assert g.dtype == BF16, (row.name, g.dtype)
        if exact:
            np.testing.assert_array_equal(g.astype(F32), r.astype(BF16).astype(F32), err_msg=row.name)
        else:
            np.testing.assert_allclose(g.astype(F32), r, rtol=6e-2, atol=6e-2, err_msg=row.name)
        # and the row's independent reference on the same (rounded) operands
        np.testing.assert_allclose(g.astype(np.float64), np.asarray(ind, np.float64), rtol=6e-2, atol=6e-2,
                                   err_msg=f"{row.name}: against the row's reference")


REVERSE = [r for r in WALKED if "rev" in r.modes]

# rows whose bfloat16 derivatives are not float32's within bfloat16's precision, and why
BEYOND_BFLOAT16 = {
    "logsumexp_large": "adds 1000 to the operands first: in bfloat16 (spacing 4 to 8 there) x + 1000 rounds "
                       "their differences away, so the softmax it differentiates to is flat, as in JAX",
}


@pytest.mark.parametrize("row", sampled(REVERSE, 4, ids=[r.name for r in REVERSE]))
def test_every_row_has_bfloat16_cotangents(row):
    f, f32_fun, bf, f32, _ = _rounded(row)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            out, pullback = cv.vjp(f, *bf)
        except (TypeError, ValueError, NotImplementedError) as e:
            assert "bfloat16" in str(e), f"{row.name}: {type(e).__name__}: {e}"
            return
        cts = cv.tree.map(lambda o: np.ones(np.shape(o), np.asarray(o).dtype), out)
        grads = _leaves(pullback(cts))
        out32, pullback32 = cv.vjp(f32_fun, *f32)
        grads32 = _leaves(pullback32(cv.tree.map(lambda o: np.ones(np.shape(o), np.asarray(o).dtype), out32)))
    for g, g32, x in zip(grads, grads32, bf):
        assert g.dtype == np.asarray(x).dtype, (row.name, g.dtype)
        if g.dtype == BF16 and np.all(np.isfinite(g32)) and row.name not in BEYOND_BFLOAT16:
            scale = max(1.0, float(np.max(np.abs(g32), initial=0)))
            np.testing.assert_allclose(g.astype(F32), g32, rtol=1e-1, atol=1e-1 * scale, err_msg=row.name)


def test_bfloat16_stays_on_the_host():
    """CuPy has no bfloat16: moving a bfloat16 array to the GPU, or meeting CuPy arrays
    with one, raises naming bfloat16 (here under the strict CuPy stand-in)."""
    import conftest
    if not conftest.STRICT_CUPY:
        pytest.skip("needs the strict CuPy stand-in (a real GPU runs tools/gpu_checks.sh)")
    import cupy
    x = np.ones(3, BF16)
    with pytest.raises(TypeError, match="device_put: an array of shape \\(3,\\) has dtype bfloat16, which CuPy"):
        cv.device_put(x, "gpu")
    with pytest.raises(TypeError, match="has dtype bfloat16, which CuPy does not support"):
        cnp.add(x, cupy.ones(3, np.float32))


def test_lax_rfft_refuses_bfloat16_and_jnp_fft_upcasts():
    x = np.ones((14, 15), BF16)
    with pytest.raises(ValueError, match="RFFT input must be float32 or float64, got bfloat16"):
        lax.fft(x, fft_type="rfft", fft_lengths=(5, 6))
    got = cnp.fft.rfft(x)
    assert got.dtype == np.complex64
    np.testing.assert_allclose(got, np.fft.rfft(x.astype(np.float32)), rtol=1e-6, atol=1e-5)
