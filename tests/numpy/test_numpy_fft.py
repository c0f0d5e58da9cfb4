"""``cuvmap.numpy.fft`` (cuvmap/numpy/fft.py) against ``numpy.fft``: every transform with
every ``norm``, ``n``/``s`` shorter and longer than the axes, ``axis``/``axes`` in any order
(negative ones included); the frequencies and shifts; derivatives of real-valued
functions (``Σ|fft(x)|²``, real and imaginary parts) and of the transforms themselves
against finite differences in float64 and complex128, both modes; vmap over every dim of
the operand; jit; and the GPU path on the strict CuPy stand-in."""
import zlib

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import backend as cv_backend
from cuvmap.core import ShapeError
from cuvmap.numpy import fft as cfft
from cuvmap.test_util import check_batching, check_grads
from sampling import product, sampled

NORMS = [None, "backward", "ortho", "forward"]


def _rng(*salt):
    return np.random.default_rng(zlib.crc32(repr(salt).encode()))


def _real(shape, *salt):
    return _rng("real", shape, *salt).standard_normal(shape)


def _complex(shape, *salt):
    rng = _rng("complex", shape, *salt)
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def _operand(name, shape, *salt):
    """A real operand for the transforms of real signals (rfft*, ihfft), else complex."""
    return _real(shape, *salt) if name.startswith("rfft") or name == "ihfft" else _complex(shape, *salt)


ONE_AXIS = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft"]
N_AXES = ["fftn", "ifftn", "rfftn", "irfftn"]
TWO_AXES = ["fft2", "ifft2", "rfft2", "irfft2"]


def _close(got, want, rtol=1e-12, atol=1e-12):
    if cv_backend.is_cupy_array(got):
        got = got.get()
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------

# -m "not slow": a quarter of the combinations (each transform, norm, length and axis among them)
@pytest.mark.parametrize("name,norm,n,axis", sampled(product(ONE_AXIS, NORMS, [None, 1, 4, 5, 9], [-1, 0, 1]), 4))
def test_one_axis_transforms_match_numpy(name, norm, n, axis):
    x = _operand(name, (5, 6, 3), name)
    _close(getattr(cfft, name)(x, n=n, axis=axis, norm=norm), getattr(np.fft, name)(x, n=n, axis=axis, norm=norm))


S_AXES = [(None, None), (None, (0, 2)), (None, (-1, 0)), ((3, 8), (2, 0)), ((4, 4), None), ((2, 5), (1, -1)),
          ((7, 2, 3), None), ((6, 4, 2), (1, 0, 2))]
S_AXES_2 = [(None, (-2, -1)), (None, (0, 2)), (None, (-1, 0)), ((3, 8), (2, 0)), ((4, 4), (-2, -1)), ((2, 5), (1, -1))]


def _explicit_axes(s, axes, ndim=3):
    """NumPy 2's explicit form of ``axes=None`` with ``s`` given: the last ``len(s)`` axes."""
    return axes if axes is not None or s is None else tuple(range(ndim - len(s), ndim))


@pytest.mark.parametrize("name", N_AXES)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("s,axes", S_AXES)
def test_n_axes_transforms_match_numpy(name, norm, s, axes):
    x = _operand(name, (4, 5, 6), name)
    _close(getattr(cfft, name)(x, s=s, axes=axes, norm=norm),
           getattr(np.fft, name)(x, s=s, axes=_explicit_axes(s, axes), norm=norm))


@pytest.mark.parametrize("name", TWO_AXES)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("s,axes", S_AXES_2)
def test_two_axes_transforms_match_numpy(name, norm, s, axes):
    x = _operand(name, (4, 5, 6), name)
    _close(getattr(cfft, name)(x, s=s, axes=axes, norm=norm), getattr(np.fft, name)(x, s=s, axes=axes, norm=norm))
    if axes == (-2, -1):
        _close(getattr(cfft, name)(x, s=s, norm=norm), getattr(np.fft, name)(x, s=s, norm=norm))


def test_round_trips_and_single_precision():
    x = _real((3, 8), "rt").astype(np.float32)
    y = cfft.rfft(x)
    assert y.dtype == np.complex64 and cfft.irfft(y).dtype == np.float32
    np.testing.assert_allclose(cfft.irfft(y, n=8), x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cfft.ifftn(cfft.fftn(x)), x, rtol=1e-5, atol=1e-6)
    assert cfft.fft(np.arange(4)).dtype == np.complex128  # integers: float64, as NumPy
    np.testing.assert_allclose(cfft.fft([1.0, 2.0, 3.0]), np.fft.fft([1.0, 2.0, 3.0]), rtol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("d", [1.0, 0.25, 3])
def test_frequencies_match_numpy(n, d):
    _close(cfft.fftfreq(n, d), np.fft.fftfreq(n, d))
    _close(cfft.rfftfreq(n, d), np.fft.rfftfreq(n, d))
    assert cfft.fftfreq(n, d, dtype=np.float32).dtype == np.float32


def test_frequencies_of_a_traced_spacing():
    # d/dd (k / (d n)) = −k / (d² n)
    g = cv.grad(lambda d: cnp.sum(cfft.fftfreq(5, d) ** 2))(0.5)
    np.testing.assert_allclose(g, -2 * np.sum(np.fft.fftfreq(5, 1.0) ** 2) / 0.5 ** 3, rtol=1e-12)
    np.testing.assert_allclose(cv.jit(lambda d: cfft.rfftfreq(6, d))(np.float64(0.1)), np.fft.rfftfreq(6, 0.1),
                               rtol=1e-12)


def test_frequencies_under_vmap_and_on_the_gpu(backend):
    ds = cv.device_put(np.array([0.5, 1.0, 2.0]), backend)
    got = cv.vmap(lambda d: cfft.fftfreq(5, d))(ds)
    got32 = cv.vmap(lambda d: cfft.rfftfreq(6, d, dtype=np.float32))(ds)
    if backend == "gpu":
        assert cv_backend.is_cupy_array(got) and cv_backend.is_cupy_array(got32)
    _close(got, np.stack([np.fft.fftfreq(5, d) for d in (0.5, 1.0, 2.0)]))
    _close(got32, np.stack([np.fft.rfftfreq(6, d) for d in (0.5, 1.0, 2.0)]).astype(np.float32), rtol=1e-6)


@pytest.mark.parametrize("axes", [None, 0, 1, -1, (0, 2), (2, 0, 1)])
@pytest.mark.parametrize("shape", [(4, 5, 6), (1, 3, 2)])
def test_shifts_match_numpy(axes, shape):
    x = _real(shape, "shift")
    _close(cfft.fftshift(x, axes), np.fft.fftshift(x, axes))
    _close(cfft.ifftshift(x, axes), np.fft.ifftshift(x, axes))
    _close(cfft.ifftshift(cfft.fftshift(x, axes), axes), x)


def test_no_axes_and_non_symmetric_outer_axes():
    x = _real((2, 3), "noaxes")
    _close(cfft.fftn(x, axes=()), x.astype(np.complex128))
    _close(cfft.rfftn(x, axes=[], norm="ortho"), x)
    # JAX's issue 29325: irfftn with s cropping and padding, Hermitian symmetry along the last axis only
    a = np.array([[1.0 + 0.0j, 2.0 + 0.0j], [3.0 + 0.0j, 4.0 + 0.0j]])
    _close(cfft.irfftn(a, s=(5, 1), axes=(0, 1)), np.fft.irfftn(a, s=(5, 1), axes=(0, 1)))
    _close(cfft.irfftn(a * (1 + 2j)), np.fft.irfftn(a * (1 + 2j)))


def test_empty_axes_give_empty_results_as_jax():
    assert cfft.fft(np.zeros((3, 0))).shape == (3, 0)
    assert cfft.irfft(np.zeros((2, 1), np.complex128)).shape == (2, 0)  # n = 2·(1 − 1)


def test_errors():
    x = np.ones((3, 4))
    with pytest.raises(ValueError, match="invalid norm 'unitary'"):
        cfft.fft(x, norm="unitary")
    with pytest.raises(ValueError, match="must be positive"):
        cfft.fft(x, n=0)
    with pytest.raises(ValueError, match=r"jax.numpy.fft.fftn does not support repeated axes. Got axes \(0, 0\)"):
        cfft.fftn(x, axes=(0, 0))
    with pytest.raises(ValueError, match="have different lengths"):
        cfft.fftn(x, s=(2, 3), axes=(0,))
    with pytest.raises(ValueError, match=r"fft does not support multiple axes. Please use jax.numpy.fft.fftn. Got axis = \(0, 1\)"):
        cfft.fft(x, axis=(0, 1))
    with pytest.raises(ValueError, match="irfft does not support multiple axes"):
        cfft.irfft(x, axis=[1, 1])
    with pytest.raises(ValueError, match="only supports 2 axes"):
        cfft.fft2(np.ones((2, 3, 4)), axes=(0, 1, 2))
    with pytest.raises(ShapeError, match=r"rfft.*axis 2 is out of range.*\(3, 4\)"):
        cfft.rfft(x, axis=2)
    with pytest.raises(ShapeError, match="RFFT takes a real operand"):
        cfft.rfft(x + 1j)
    with pytest.raises(ShapeError, match=r"s=\(2, 2, 2\) has more lengths"):
        cfft.fftn(x, s=(2, 2, 2))


# ---------------------------------------------------------------------------------------
# Derivatives
# ---------------------------------------------------------------------------------------

GRAD_CASES = [
    ("fft", dict(n=None, axis=-1, norm=None)), ("fft", dict(n=3, axis=0, norm="ortho")),
    ("ifft", dict(n=7, axis=1, norm="forward")), ("rfft", dict(n=None, axis=0, norm=None)),
    ("rfft", dict(n=7, axis=-1, norm="ortho")), ("irfft", dict(n=None, axis=-1, norm=None)),
    ("irfft", dict(n=5, axis=0, norm="forward")), ("irfft", dict(n=8, axis=1, norm="ortho")),
    ("hfft", dict(n=None, axis=-1, norm=None)), ("hfft", dict(n=5, axis=0, norm="ortho")),
    ("ihfft", dict(n=6, axis=1, norm=None)),
    ("fftn", dict(s=(3, 6), axes=(0, 2), norm=None)), ("ifftn", dict(s=None, axes=None, norm="ortho")),
    ("rfftn", dict(s=None, axes=(2, 0), norm=None)), ("rfftn", dict(s=(4, 3), axes=None, norm="forward")),
    ("irfftn", dict(s=None, axes=None, norm=None)), ("irfftn", dict(s=(3, 5), axes=(1, 0), norm="ortho")),
    ("fft2", dict(s=None, axes=(-2, -1), norm=None)), ("rfft2", dict(s=(3, 3), axes=(0, 1), norm=None)),
    ("irfft2", dict(s=(2, 6), axes=(-2, -1), norm=None)),
]
GRAD_IDS = [f"{name}-{i}" for i, (name, _) in enumerate(GRAD_CASES)]


@pytest.mark.parametrize("name,kw", GRAD_CASES, ids=GRAD_IDS)
def test_transform_derivatives(name, kw):
    x = _operand(name, (3, 4, 5), name, "grad")
    check_grads(lambda v: getattr(cfft, name)(v, **kw), (x,), order=2, atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("name,kw", GRAD_CASES, ids=GRAD_IDS)
def test_grad_of_real_valued_functions(name, kw):
    """``grad`` of Σ|T(x)|² + Σ re T(x) · w (real output) against finite differences, for a
    real x and (except where the transform takes a real signal) for a complex one too."""
    f = getattr(cfft, name)
    out_shape = np.shape(getattr(np.fft, name)(_operand(name, (3, 4, 5)), **_numpy_kw(name, kw)))
    w = _real(out_shape, "w")

    def loss(v):
        y = f(v, **kw)
        return cnp.sum(cnp.abs(y) ** 2) + cnp.sum(cnp.real(y) * w) + cnp.sum(cnp.imag(y + 0j) * w)

    for x in (_real((3, 4, 5), name), _operand(name, (3, 4, 5), name, "c")):
        check_grads(loss, (x,), order=1, atol=1e-6, rtol=1e-6)
        g = cv.grad(loss)(x)
        assert g.dtype == x.dtype  # a real input gets a real gradient
        # JAX's convention: grad = ∂f/∂x − i ∂f/∂y, checked along one real and one imaginary direction
        t = _rng("dir", name).standard_normal(x.shape)
        eps = 1e-6
        fd = (loss(x + eps * t) - loss(x - eps * t)) / (2 * eps)
        np.testing.assert_allclose(np.sum(np.real(g) * t), fd, rtol=1e-6, atol=1e-6)
        if x.dtype.kind == "c":
            fd_imag = (loss(x + 1j * eps * t) - loss(x - 1j * eps * t)) / (2 * eps)
            np.testing.assert_allclose(-np.sum(np.imag(g) * t), fd_imag, rtol=1e-6, atol=1e-6)


def _numpy_kw(name, kw):
    kw = dict(kw)
    if "s" in kw:
        kw["axes"] = _explicit_axes(kw["s"], kw.get("axes"))
    return kw


def test_parseval_gradient():
    z = _complex((4, 6), "parseval")
    g = cv.grad(lambda v: cnp.sum(cnp.abs(cfft.fft2(v, norm="ortho")) ** 2))(z)
    np.testing.assert_allclose(g, 2 * np.conj(z), rtol=1e-12)  # Σ|z|²'s gradient, ∂/∂x − i ∂/∂y


@pytest.mark.parametrize("name", ["fftshift", "ifftshift"])
def test_shift_derivatives(name):
    check_grads(lambda v: getattr(cfft, name)(v, axes=(0, -1)), (_complex((5, 4), name),), order=2)


# ---------------------------------------------------------------------------------------
# vmap, jit, the GPU
# ---------------------------------------------------------------------------------------

VMAP_CASES = [("fft", dict(n=6)), ("irfft", dict(axis=0, norm="ortho")), ("rfft", dict(n=3, axis=0)),
              ("hfft", dict()), ("ihfft", dict(axis=0)), ("fftn", dict(s=(2, 5))), ("irfftn", dict(axes=(1, 0))),
              ("rfft2", dict(norm="forward")), ("ifft2", dict(s=(3, 3), axes=(1, 0))),
              ("fftshift", dict()), ("ifftshift", dict(axes=1))]


@pytest.mark.parametrize("name,kw", VMAP_CASES, ids=[c[0] for c in VMAP_CASES])
@pytest.mark.parametrize("in_axis", [0, 1, 2])
def test_vmap_over_every_dim(name, kw, in_axis):
    x = _operand(name, (3, 4, 5), name, "vmap")
    f = lambda v: getattr(cfft, name)(v, **kw)  # noqa: E731
    check_batching(f, (x,), in_axes=in_axis, atol=1e-12, rtol=1e-12)
    check_batching(f, (x,), in_axes=in_axis, out_axes=1, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name,kw", VMAP_CASES, ids=[c[0] for c in VMAP_CASES])
def test_jit(name, kw):
    x = _operand(name, (3, 4, 5), name, "jit")
    f = lambda v: getattr(cfft, name)(v, **kw)  # noqa: E731
    want = getattr(np.fft, name)(x, **_numpy_kw(name, kw))
    _close(cv.jit(f)(x), want)
    if name not in ("fftshift", "ifftshift"):
        loss = lambda v: cnp.sum(cnp.abs(f(v)))  # noqa: E731
        np.testing.assert_allclose(cv.jit(cv.grad(loss))(x), cv.grad(loss)(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,kw", VMAP_CASES + [("irfftn", dict()), ("irfft2", dict(s=(3, 6)))],
                         ids=[c[0] for c in VMAP_CASES] + ["irfftn_all", "irfft2_s"])
def test_on_the_gpu(name, kw, backend):
    x = _operand(name, (3, 4, 5), name, "gpu")
    x = x.astype(np.complex64 if x.dtype.kind == "c" else np.float32)
    f = lambda v: getattr(cfft, name)(v, **kw)  # noqa: E731
    got = f(cv.device_put(x, backend))
    if backend == "gpu":
        assert cv_backend.is_cupy_array(got)
    _close(got, getattr(np.fft, name)(x, **_numpy_kw(name, kw)), rtol=1e-4, atol=1e-4)
    if name.endswith("shift"):
        return
    loss = lambda v: cnp.sum(cnp.abs(f(v)))  # noqa: E731
    g = cv.jit(cv.grad(loss))(cv.device_put(x, backend))
    if backend == "gpu":
        assert cv_backend.is_cupy_array(g)
        g = g.get()
    np.testing.assert_allclose(g, cv.grad(loss)(x), rtol=1e-3, atol=1e-4)


def test_gradient_of_a_few_bins_picked_by_tuples():
    """autograd's test_rfftn_subset: ``rfftn(x)[(0, 1, 0), (3, 3, 2)]``, tuples inside the
    index being integer arrays as in NumPy."""
    x = _real((4, 4, 4), "subset")
    f = lambda v: cfft.rfftn(v)[(0, 1, 0), (3, 3, 2)]  # noqa: E731
    _close(f(x), np.fft.rfftn(x)[(0, 1, 0), (3, 3, 2)])
    check_grads(f, (x,), order=1)
    y = np.fft.rfftn(x)
    g = lambda v: cfft.irfftn(v)[(0, 1, 0), (3, 3, 2)]  # noqa: E731
    _close(g(y), np.fft.irfftn(y)[(0, 1, 0), (3, 3, 2)])
    check_grads(g, (y,), order=1)
