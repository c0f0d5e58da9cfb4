"""The primitive ``lax.fft`` (cuvmap/lax/fourier.py): its four transforms against
``numpy.fft`` and against the defining sums (written out as a DFT matrix), in every
precision; its shape rule's errors; its batching rule for a batch dim at every position;
its JVP and transpose against finite differences (float64 and complex128, both modes, to
second order) and the transpose identity ⟨vjp(ct), t⟩ = re⟨ct, jvp(t)⟩ of NOTE [complex
convention]; jit; and the GPU path on the strict CuPy stand-in (cuFFT's n-d IRFFT is
refused there: the impl decomposes it)."""
import itertools
import zlib

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import backend as cv_backend
from cuvmap import lax
from cuvmap.core import ShapeError
from cuvmap.lax.fourier import FftType, fft_p
from cuvmap.test_util import check_batching, check_grads


def _rng(*salt):
    return np.random.default_rng(zlib.crc32(repr(salt).encode()))


def _complex(rng, shape, dtype=np.complex128):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def _dft_matrix(n, sign):
    j = np.arange(n)
    return np.exp(sign * 2j * np.pi * np.outer(j, j) / n)


def _dft_reference(x, fft_type, lengths):
    """The transforms from their definitions: one DFT matrix per transformed axis, and
    the Hermitian extension of the half spectrum for IRFFT (its DC and Nyquist bins count
    once, by their real parts, as NumPy's irfft)."""
    k = len(lengths)
    x = np.asarray(x, dtype=np.complex128)
    if fft_type == FftType.IRFFT:
        # the inverse transforms of the outer axes, then the real transform of the last
        for a, n in enumerate(lengths[:-1]):
            axis = x.ndim - k + a
            x = np.moveaxis(np.tensordot(_dft_matrix(n, +1) / n, np.moveaxis(x, axis, 0), axes=1), 0, axis)
        n = lengths[-1]
        m = n // 2 + 1
        full = np.zeros(x.shape[:-1] + (n,), np.complex128)
        full[..., :m] = x[..., :m]
        full[..., 0] = full[..., 0].real
        if n % 2 == 0:
            full[..., n // 2] = full[..., n // 2].real
        for b in range(1, (n + 1) // 2):
            full[..., n - b] = np.conj(x[..., b])
        return (full @ _dft_matrix(n, +1).T / n).real
    sign = +1 if fft_type == FftType.IFFT else -1
    for a, n in enumerate(lengths):
        axis = x.ndim - k + a
        x = np.moveaxis(np.tensordot(_dft_matrix(n, sign), np.moveaxis(x, axis, 0), axes=1), 0, axis)
        if fft_type == FftType.IFFT:
            x = x / n
    if fft_type == FftType.RFFT:
        x = x[..., :lengths[-1] // 2 + 1]
    return x


def _numpy_reference(x, fft_type, lengths):
    axes = tuple(range(x.ndim - len(lengths), x.ndim))
    return {FftType.FFT: lambda: np.fft.fftn(x, axes=axes), FftType.IFFT: lambda: np.fft.ifftn(x, axes=axes),
            FftType.RFFT: lambda: np.fft.rfftn(x, axes=axes),
            FftType.IRFFT: lambda: np.fft.irfftn(x, s=lengths, axes=axes)}[fft_type]()


def _operand(fft_type, shape, lengths, precision=64, seed=0):
    """An operand of ``shape`` whose trailing dims suit ``fft_type`` with ``lengths``."""
    rng = _rng(fft_type, shape, lengths, seed)
    k = len(lengths)
    lead = shape[:len(shape) - k]
    if fft_type == FftType.RFFT:
        return rng.standard_normal(lead + lengths).astype(np.float64 if precision == 64 else np.float32)
    tail = lengths[:-1] + (lengths[-1] // 2 + 1,) if fft_type == FftType.IRFFT else lengths
    return _complex(rng, lead + tail, np.complex128 if precision == 64 else np.complex64)


# (fft_type, operand's leading dims, fft_lengths): odd and even last lengths, 1 to 3 axes
CASES = [
    (t, lead, lengths)
    for t in FftType
    for lead, lengths in [((), (6,)), ((3,), (5,)), ((2,), (4, 3)), ((), (3, 4, 5)), ((2, 1), (2, 6)), ((4,), (1,)),
                          ((3,), (2,))]
]
CASE_IDS = [f"{t.name}-{lead}-{lengths}" for t, lead, lengths in CASES]


@pytest.mark.parametrize("fft_type,lead,lengths", CASES, ids=CASE_IDS)
def test_fft_matches_numpy_and_the_definition(fft_type, lead, lengths):
    x = _operand(fft_type, lead + lengths, lengths)
    got = lax.fft(x, fft_type, lengths)
    want = _numpy_reference(x, fft_type, lengths)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, _dft_reference(x, fft_type, lengths), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fft_type", list(FftType))
def test_fft_single_precision_stays_single(fft_type):
    lengths = (4, 6)
    x = _operand(fft_type, (3,) + lengths, lengths, precision=32)
    got = lax.fft(x, fft_type, lengths)
    want = _numpy_reference(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64), fft_type, lengths)
    assert got.dtype == (np.float32 if fft_type == FftType.IRFFT else np.complex64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fft_type_names_and_conversions():
    x = np.arange(8.0).reshape(2, 4)
    for name, typ in [("fft", FftType.FFT), ("IFFT", FftType.IFFT), ("rfft", FftType.RFFT)]:
        np.testing.assert_allclose(lax.fft(x, name, (4,)), lax.fft(x, typ, (4,)))
    assert lax.FftType is FftType
    # real operands of FFT, IFFT and IRFFT become complex, integers become float64/complex128
    np.testing.assert_allclose(lax.fft(x, "fft", (4,)), np.fft.fft(x), rtol=1e-12)
    assert lax.fft(np.arange(4, dtype=np.int32), "rfft", (4,)).dtype == np.complex128
    assert lax.fft(x.astype(np.float32), "fft", (4,)).dtype == np.complex64
    assert lax.fft(x.astype(np.float16), "rfft", (4,)).dtype == np.complex64
    np.testing.assert_allclose(lax.fft(x, "irfft", (2, 6)), np.fft.irfftn(x, s=(2, 6), axes=(0, 1)), rtol=1e-12)
    # no fft_lengths: the operand, converted
    assert lax.fft(x, "fft", ()).dtype == np.complex128
    assert lax.fft([1.0, 2.0], "fft", [2]).tolist() == [3, -1]


def test_fft_zero_lengths_and_empty_batches():
    z = np.zeros((0, 4), np.complex128)
    assert lax.fft(z, "fft", (4,)).shape == (0, 4)
    assert lax.fft(np.zeros((3, 0)), "rfft", (0,)).shape == (3, 1)  # a sum over nothing: 0
    assert not lax.fft(np.zeros((3, 0)), "rfft", (0,)).any()
    assert lax.fft(np.zeros((3, 1), np.complex128), "irfft", (0,)).shape == (3, 0)
    # the zero maps' transposes are zero maps
    (x_bar,) = cv.vjp(lambda v: lax.fft(v, "rfft", (0,)), np.zeros((3, 0)))[1](np.ones((3, 1), np.complex128))
    assert x_bar.shape == (3, 0)
    (z_bar,) = cv.vjp(lambda v: lax.fft(v, "irfft", (0,)), np.ones((3, 1), np.complex128))[1](np.ones((3, 0)))
    assert z_bar.shape == (3, 1) and not z_bar.any()


def test_fft_errors_name_the_function_and_shapes():
    x = np.ones((3, 4), np.complex128)
    with pytest.raises(ShapeError, match=r"RFFT takes a real operand.*complex128.*\(3, 4\)"):
        lax.fft(x, "rfft", (4,))
    with pytest.raises(ShapeError, match=r"FFT input shape \(3, 4\) minor dimensions must be equal to fft_lengths \(5,\)"):
        lax.fft(x, "fft", (5,))
    with pytest.raises(ShapeError, match=r"IRFFT input shape \(3, 4\) minor .* fft_lengths=\(4,\) \(the last dim must be 3"):
        lax.fft(x, "irfft", (4,))
    with pytest.raises(ShapeError, match=r"at least as many input dimensions as fft_lengths \(1, 3, 4\) \(it takes 1 to 2"):
        lax.fft(x, "fft", (1, 3, 4))
    with pytest.raises(ValueError, match="unknown fft_type 'dct'"):
        lax.fft(x, "dct", (4,))
    with pytest.raises(TypeError, match="fft_type must be"):
        lax.fft(x, 7, (4,))


# ---------------------------------------------------------------------------------------
# Batching
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fft_type", list(FftType))
@pytest.mark.parametrize("bdim", [0, 1, 2, 3])
def test_fft_batching_at_every_position(fft_type, bdim):
    """The batch dim before the transformed axes stays; among them, it moves to the front."""
    lengths = (4, 5)
    x = _operand(fft_type, (3,) + lengths, lengths)
    xb = np.stack([x * (i + 1) for i in range(2)], axis=bdim)
    check_batching(lambda v: lax.fft(v, fft_type, lengths), (xb,), in_axes=bdim, atol=1e-12, rtol=1e-12)
    check_batching(lambda v: lax.fft(v, fft_type, lengths), (xb,), in_axes=bdim, out_axes=-1, atol=1e-12, rtol=1e-12)


def test_fft_nested_vmap_and_vmap_of_grad():
    x = _complex(_rng("nested"), (2, 3, 4, 5))
    f = lambda v: lax.fft(v, "fft", (5,))  # noqa: E731
    got = cv.vmap(cv.vmap(f, in_axes=1), in_axes=2)(x)
    np.testing.assert_allclose(got, np.moveaxis(np.fft.fft(np.moveaxis(x, (2, 1), (0, 1))), (0, 1), (0, 1)),
                               rtol=1e-12, atol=1e-12)
    energy = lambda v: lax.reduce_sum(lax.real(lax.mul(lax.conj(f(v)), f(v))), (0,))  # noqa: E731
    grads = cv.vmap(cv.grad(energy))(x.reshape(-1, 5))
    # Parseval: Σ|fft(z)|² = n Σ|z|², whose gradient (∂/∂x − i ∂/∂y) is 2n·conj(z)
    np.testing.assert_allclose(grads, 10 * np.conj(x.reshape(-1, 5)), rtol=1e-12)


# ---------------------------------------------------------------------------------------
# Derivatives
# ---------------------------------------------------------------------------------------

DERIVATIVE_CASES = [(t, lead, lengths) for t in FftType
                    for lead, lengths in [((2,), (5,)), ((), (6,)), ((), (4, 3)), ((2,), (3, 2)), ((), (2, 1, 4)),
                                          ((2,), (1,)), ((2,), (2,)), ((), (3, 1))]]


@pytest.mark.parametrize("fft_type,lead,lengths", DERIVATIVE_CASES,
                         ids=[f"{t.name}-{lead}-{lengths}" for t, lead, lengths in DERIVATIVE_CASES])
def test_fft_derivatives_against_finite_differences(fft_type, lead, lengths):
    x = _operand(fft_type, lead + lengths, lengths)
    check_grads(lambda v: lax.fft(v, fft_type, lengths), (x,), order=2, atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("fft_type,lead,lengths", DERIVATIVE_CASES,
                         ids=[f"{t.name}-{lead}-{lengths}" for t, lead, lengths in DERIVATIVE_CASES])
def test_fft_transpose_identity(fft_type, lead, lengths):
    """⟨vjp(ct), t⟩ = re⟨ct, jvp(t)⟩ with ⟨u, v⟩ = re Σ u·v (NOTE [complex convention]),
    for a complex ct and a tangent of the operand's dtype (complex, or real for RFFT)."""
    x = _operand(fft_type, lead + lengths, lengths, seed=1)
    t = _operand(fft_type, lead + lengths, lengths, seed=2)
    f = lambda v: lax.fft(v, fft_type, lengths)  # noqa: E731
    out, f_vjp = cv.vjp(f, x)
    _, jvp_t = cv.jvp(f, (x,), (t,))
    rng = _rng("ct", fft_type, lengths)
    ct = _complex(rng, out.shape) if out.dtype.kind == "c" else rng.standard_normal(out.shape)
    (x_bar,) = f_vjp(ct)
    assert x_bar.dtype == x.dtype  # RFFT's operand is real: so is its cotangent
    np.testing.assert_allclose(np.sum(x_bar * t).real, np.sum(ct * jvp_t).real, rtol=1e-11)


def test_fft_transposes_are_jax_s():
    """FFT is its own transpose (the DFT matrix is symmetric), not its adjoint N·IFFT."""
    x = _complex(_rng("jt"), (6,))
    ct = _complex(_rng("jt2"), (6,))
    (x_bar,) = cv.vjp(lambda v: lax.fft(v, "fft", (6,)), x)[1](ct)
    np.testing.assert_allclose(x_bar, np.fft.fft(ct), rtol=1e-12)
    (x_bar,) = cv.vjp(lambda v: lax.fft(v, "ifft", (6,)), x)[1](ct)
    np.testing.assert_allclose(x_bar, np.fft.ifft(ct), rtol=1e-12)


def test_grad_of_real_functions_of_transforms():
    x = _rng("g").standard_normal((3, 8))
    # Σ re(rfft(x)): each row's Σ_k re X_k = Σ_j x_j Σ_{k ≤ 4} cos(2π jk/8)
    g = cv.grad(lambda v: lax.reduce_sum(lax.real(lax.fft(v, "rfft", (8,))), (0, 1)))(x)
    want = np.cos(2 * np.pi * np.outer(np.arange(8), np.arange(5)) / 8).sum(1)
    np.testing.assert_allclose(g, np.broadcast_to(want, x.shape), rtol=1e-12, atol=1e-12)
    # irfft(rfft(x)) = x: the gradient of Σ w·irfft(rfft(x)) is w
    w = _rng("w").standard_normal((3, 8))
    g = cv.grad(lambda v: lax.reduce_sum(lax.mul(w, lax.fft(lax.fft(v, "rfft", (8,)), "irfft", (8,))), (0, 1)))(x)
    np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------
# jit and the GPU path
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fft_type", list(FftType))
def test_fft_jit(fft_type):
    lengths = (3, 4)
    x = _operand(fft_type, (2,) + lengths, lengths)
    f = cv.jit(lambda v: lax.fft(v, fft_type, lengths))
    np.testing.assert_allclose(f(x), _numpy_reference(x, fft_type, lengths), rtol=1e-12, atol=1e-12)
    assert "fft" in str(cv.make_jaxpr(lambda v: lax.fft(v, fft_type, lengths))(x))
    g = cv.jit(cv.grad(lambda v: lax.reduce_sum(lax.abs(lax.fft(v, fft_type, lengths)), (0, 1, 2))))(x)
    g_eager = cv.grad(lambda v: lax.reduce_sum(lax.abs(lax.fft(v, fft_type, lengths)), (0, 1, 2)))(x)
    np.testing.assert_allclose(g, g_eager, rtol=1e-12, atol=1e-12)


def test_fft_is_not_captured_as_a_cuda_graph():
    assert fft_p.capturable is False and fft_p.owns_output


@pytest.mark.parametrize("fft_type,lead,lengths", CASES, ids=CASE_IDS)
def test_fft_on_the_gpu(fft_type, lead, lengths, backend):
    x = _operand(fft_type, lead + lengths, lengths, precision=32)
    got = lax.fft(cv.device_put(x, backend), fft_type, lengths)
    if backend == "gpu":
        assert cv_backend.is_cupy_array(got)
        got = got.get()
    want = _numpy_reference(x, fft_type, lengths)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fft_gradient_and_vmap_on_the_gpu(backend):
    x = _complex(_rng("gpu"), (3, 4, 6))
    xd = cv.device_put(x, backend)
    for typ, lengths in itertools.product(["fft", "irfft"], [(6,), (4, 6)]):
        if typ == "irfft":
            lengths = lengths[:-1] + (10,)
        f = lambda v: lax.fft(v, typ, lengths)  # noqa: E731
        energy = lambda v: lax.reduce_sum(lax.abs(f(v)), tuple(range(len(f(v).shape))))  # noqa: E731
        got = cv.vmap(cv.grad(energy))(xd)
        want = cv.vmap(cv.grad(energy))(x)
        if backend == "gpu":
            assert cv_backend.is_cupy_array(got)
            got = got.get()
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_fft_is_holomorphic():
    """FFT and IFFT are complex-linear: their holomorphic Jacobians are the DFT matrices."""
    z = _complex(_rng("holo"), (5,))
    for typ, matrix in [("fft", _dft_matrix(5, -1)), ("ifft", _dft_matrix(5, +1) / 5)]:
        f = lambda v: lax.fft(v, typ, (5,))  # noqa: E731
        np.testing.assert_allclose(cv.jacfwd(f, holomorphic=True)(z), matrix, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(cv.jacrev(f, holomorphic=True)(z), matrix, rtol=1e-12, atol=1e-12)
