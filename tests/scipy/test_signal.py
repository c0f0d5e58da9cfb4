"""cuvmap.scipy.signal: convolve, correlate, convolve2d, correlate2d (JAX's signatures) and
convolve's autograd generalization (axes=, dot_axes=): values against a direct sum over
index tuples, derivatives against finite differences in both modes (float64), vmap over
each argument against a loop, jit against eager, float32 against float64. Rows are data."""
import itertools

import numpy as np
import pytest

import cuvmap as cv
from cuvmap.scipy import signal
from cuvmap.test_util import check_batching, check_grads


def _full_direct(a, b):
    """out[l] = Σ_i a[i] b[l − i] over every index tuple (N-D, same rank)."""
    shape = tuple(p + q - 1 for p, q in zip(a.shape, b.shape))
    out = np.zeros(shape, np.result_type(a, b))
    for i in itertools.product(*(range(p) for p in a.shape)):
        for j in itertools.product(*(range(q) for q in b.shape)):
            out[tuple(u + v for u, v in zip(i, j))] += a[i] * b[j]
    return out


def _mode_slice(full, n, m, mode):
    if mode == "full":
        return full
    if mode == "valid":
        return full[tuple(slice(min(p, q) - 1, max(p, q)) for p, q in zip(n, m))]
    return full[tuple(slice((q - 1) // 2, (q - 1) // 2 + p) for p, q in zip(n, m))]


def _convolve_ref(a, b, mode):
    return _mode_slice(_full_direct(a, b), a.shape, b.shape, mode)


def _correlate_ref(a, b, mode):
    return _convolve_ref(a, np.conj(b[tuple(slice(None, None, -1) for _ in b.shape)]), mode)


RNG = np.random.default_rng(11)
SHAPES = [((4,), (2,)), ((3,), (6,)), ((5,), (5,)), ((4, 3), (2, 2)), ((6, 7), (4, 2)), ((2, 3), (4, 5)),
          ((3, 4, 2), (2, 2, 2))]
MODES = ["full", "valid", "same"]
ROWS = [(f"{name}-{sa}-{sb}-{mode}", fun, ref, sa, sb, mode)
        for name, fun, ref in (("convolve", signal.convolve, _convolve_ref),
                               ("correlate", signal.correlate, _correlate_ref))
        for sa, sb in SHAPES for mode in MODES]


@pytest.mark.parametrize("name,fun,ref,sa,sb,mode", ROWS, ids=[r[0] for r in ROWS])
def test_values_grads_vmap_jit(name, fun, ref, sa, sb, mode):
    a, b = RNG.standard_normal(sa), RNG.standard_normal(sb)
    np.testing.assert_allclose(fun(a, b, mode), ref(a, b, mode), rtol=1e-13, atol=1e-14)
    f = lambda x, y: fun(x, y, mode)  # noqa: E731
    check_grads(f, (a, b), order=2, modes=("fwd", "rev"))
    stacked = (np.stack([a, 2 * a]), np.stack([b, -b]))
    for axes in ((0, 0), (0, None), (None, 0)):
        check_batching(f, tuple(s if ax == 0 else x for s, x, ax in zip(stacked, (a, b), axes)), in_axes=axes,
                       atol=1e-12, rtol=1e-12)
    np.testing.assert_allclose(cv.jit(f)(a, b), f(a, b), rtol=1e-15, atol=1e-15)
    out32 = f(a.astype(np.float32), b.astype(np.float32))
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, ref(a.astype(np.float32).astype(np.float64), b.astype(np.float32)
                                          .astype(np.float64), mode), rtol=1e-5, atol=1e-5)


GENERAL = [  # autograd's generalization: (shape a, shape b, axes, dot_axes)
    ((3, 5), (3, 4), ([1], [0]), ([], [])),
    ((3, 5), (3, 4), ([], []), ([0], [0])),
    ((3, 5), (3, 4, 2), ([1], [2]), ([0], [0])),
    ((2, 5, 4, 3), (2, 4, 2, 3, 2), ([1, 2], [2, 4]), ([0, 3], [0, 3])),
    ((4, 3), (3, 2), ([1, 0], [1, 0]), ([], [])),
    ((3, 3, 2), (3, 2, 3), ([1], [1]), ([0], [2])),
]


def _general_ref(a, b, axes, dot_axes, mode):
    """The definition by loops: for every free index of a and b, Σ over the dot axes of the
    convolution of the slices along the convolved axes."""
    ca, cb = axes
    da, db = dot_axes
    fa = [k for k in range(a.ndim) if k not in ca and k not in da]
    fb = [k for k in range(b.ndim) if k not in cb and k not in db]
    at = np.transpose(a, fa + list(da) + list(ca))
    bt = np.transpose(b, fb + list(db) + list(cb))
    free_a, free_b = at.shape[:len(fa)], bt.shape[:len(fb)]
    dots = at.shape[len(fa):len(fa) + len(da)]
    n, m = at.shape[len(fa) + len(da):], bt.shape[len(fb) + len(db):]
    out = None
    for i in itertools.product(*(range(s) for s in free_a)):
        for j in itertools.product(*(range(s) for s in free_b)):
            total = sum(_convolve_ref(np.asarray(at[i + d]), np.asarray(bt[j + d]), mode)
                        for d in itertools.product(*(range(s) for s in dots)))
            if out is None:
                out = np.zeros(free_a + free_b + np.shape(total))
            out[i + j] = total
    return out


@pytest.mark.parametrize("sa,sb,axes,dot_axes", GENERAL)
@pytest.mark.parametrize("mode", MODES)
def test_autograd_axes_and_dot_axes(sa, sb, axes, dot_axes, mode):
    a, b = RNG.standard_normal(sa), RNG.standard_normal(sb)
    n = [a.shape[k] for k in axes[0]]
    m = [b.shape[k] for k in axes[1]]
    if mode == "valid" and not (all(p >= q for p, q in zip(n, m)) or all(p <= q for p, q in zip(n, m))):
        with pytest.raises(ValueError, match="valid"):
            signal.convolve(a, b, mode, axes=axes, dot_axes=dot_axes)
        return
    f = lambda x, y: signal.convolve(x, y, mode, axes=axes, dot_axes=dot_axes)  # noqa: E731
    np.testing.assert_allclose(f(a, b), _general_ref(a, b, axes, dot_axes, mode), rtol=1e-13, atol=1e-13)
    check_grads(f, (a, b), order=1, modes=("fwd", "rev"))
    check_batching(f, (np.stack([a, -a]), np.stack([b, 2 * b])), in_axes=0, atol=1e-12, rtol=1e-12)


def test_2d_names_and_refusals():
    a, b = RNG.standard_normal((4, 5)), RNG.standard_normal((3, 2))
    for mode in MODES:
        np.testing.assert_allclose(signal.convolve2d(a, b, mode), _convolve_ref(a, b, mode), rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(signal.correlate2d(a, b, mode), _correlate_ref(a, b, mode), rtol=1e-13,
                                   atol=1e-14)
    c = RNG.standard_normal(4) + 1j * RNG.standard_normal(4)
    np.testing.assert_allclose(signal.correlate(c, c[:3]), _correlate_ref(c, c[:3], "full"), rtol=1e-13)
    assert signal.convolve(np.array([1, 2, 3]), np.array([1, 1])).dtype == np.float64  # integers promote
    with pytest.raises(ValueError, match="same number of dimensions"):
        signal.convolve(a, b[0])
    with pytest.raises(ValueError, match="mode"):
        signal.convolve(a, b, "circular")
    with pytest.raises(ValueError, match="method"):
        signal.convolve(a, b, method="winograd")
    with pytest.raises(ValueError, match="valid"):
        signal.convolve(np.ones((4, 2)), np.ones((2, 4)), "valid")
    with pytest.raises(ValueError, match="differ in length"):
        signal.convolve(a, b, axes=([1], [1]), dot_axes=([0], [0]))
    with pytest.raises(NotImplementedError, match="boundary"):
        signal.convolve2d(a, b, boundary="wrap")
    with pytest.raises(ValueError, match="two-dimensional"):
        signal.convolve2d(a[0], b[0])
