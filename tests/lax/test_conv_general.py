"""JAX's convolution names (cuvmap/lax/conv_general.py) against a direct loop reference
(tests/lax/conv_general_reference.py): layouts, strides, both dilations, padding names and
pairs (negative ones crop), feature and batch groups, 0 to 3 spatial dims; derivatives to
second order against finite differences (float64, both modes); vmap over each operand
against a loop; jit; ``conv_transpose`` as the input gradient of a strided conv; the errors."""
import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax
from cuvmap.core import ShapeError
from cuvmap.lax import conv_general as cg
from cuvmap.test_util import check_batching, check_grads

from conv_general_reference import conv_general_nchw, layout_perms

# (name, specs, lhs N C S..., rhs O I K..., strides, padding, lhs_dilation, rhs_dilation, feature groups, batch groups)
CASES = [
    ("nchw", ("NCHW", "OIHW", "NCHW"), (2, 3, 6, 5), (4, 3, 2, 3), (1, 1), "VALID", None, None, 1, 1),
    ("nhwc-same-strided", ("NHWC", "HWIO", "NHWC"), (2, 3, 7, 6), (4, 3, 3, 2), (2, 1), "SAME", None, None, 1, 1),
    ("same-lower", ("NHWC", "HWIO", "NHWC"), (1, 2, 6, 6), (3, 2, 2, 2), (1, 1), "SAME_LOWER", None, None, 1, 1),
    ("mixed-layouts", ("NHWC", "OIHW", "NCHW"), (2, 2, 5, 6), (3, 2, 2, 2), (1, 2), [(1, 0), (0, 1)], None, None, 1, 1),
    ("hwcn", ("HWCN", "HWIO", "HWCN"), (2, 2, 5, 6), (3, 2, 1, 2), (1, 1), [(0, -1), (0, 0)], None, None, 1, 1),
    ("asymmetric-negative-pad", None, (2, 2, 7, 6), (3, 2, 3, 2), (1, 1), [(2, -1), (-1, 3)], None, None, 1, 1),
    ("rhs-dilation", None, (1, 2, 8, 7), (2, 2, 2, 3), (1, 2), [(1, 1), (2, 2)], None, (2, 2), 1, 1),
    ("lhs-dilation", None, (2, 2, 4, 5), (3, 2, 2, 3), (1, 1), [(1, 1), (0, 2)], (2, 3), None, 1, 1),
    ("both-dilations-strided", ("NHWC", "HWIO", "NHWC"), (1, 2, 5, 4), (2, 2, 3, 2), (2, 1), "SAME", (2, 1), (1, 2), 1, 1),
    ("feature-groups", None, (2, 6, 5, 5), (4, 3, 2, 2), (1, 1), "VALID", None, None, 2, 1),
    ("depthwise-nhwc", ("NHWC", "HWIO", "NHWC"), (2, 4, 5, 5), (8, 1, 3, 3), (1, 1), "SAME", None, None, 4, 1),
    ("batch-groups", None, (6, 2, 5, 4), (6, 2, 2, 2), (1, 1), "VALID", None, None, 1, 3),
    ("batch-groups-nhwc", ("NHWC", "HWIO", "NHWC"), (4, 3, 5, 5), (4, 3, 2, 3), (2, 1), [(1, 0), (1, 1)], None, None, 1, 2),
    ("1d", ("NWC", "WIO", "NWC"), (2, 3, 9), (4, 3, 3), (2,), "SAME", (1,), (2,), 1, 1),
    ("3d", ("NCDHW", "OIDHW", "NDHWC"), (1, 2, 4, 3, 5), (4, 1, 2, 2, 2), (1, 1, 2), "SAME", None, (1, 2, 1), 2, 1),
    ("0d-grouped-matmul", ("NC", "OI", "NC"), (3, 4), (6, 2), (), [], None, None, 2, 1),
]
IDS = [c[0] for c in CASES]


def _operands(case, rng):
    _, specs, xs, ws, *_ = case
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    nd = len(xs) - 2
    if specs is None:
        return x, w, None
    lp, rp, _ = layout_perms(*specs)
    return np.transpose(x, np.argsort(lp)), np.transpose(w, np.argsort(rp)), specs


def _fun(case):
    _, specs, xs, ws, strides, padding, ld, rd, fg, bg = case

    def f(x, w):
        return lax.conv_general_dilated(x, w, strides, padding, ld, rd, specs, fg, bg)

    return f


def _reference(case, x, w):
    _, specs, xs, ws, strides, padding, ld, rd, fg, bg = case
    nd = len(xs) - 2
    lp, rp, op = layout_perms(*specs) if specs is not None else (list(range(nd + 2)),) * 3
    x, w = np.transpose(x, lp), np.transpose(w, rp)
    ld, rd = ld or (1,) * nd, rd or (1,) * nd
    if isinstance(padding, str):
        padding = lax.padtype_to_pads(x.shape[2:], [1 + d * (k - 1) for k, d in zip(w.shape[2:], rd)], strides, padding)
    if nd == 0:
        x, w = x[..., None], w[..., None]
        out = conv_general_nchw(x, w, (1,), [(0, 0)], (1,), (1,), fg, bg)[..., 0]
    else:
        out = conv_general_nchw(x, w, strides, padding, ld, rd, fg, bg)
    return np.transpose(out, np.argsort(op))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_value_against_loops(case):
    x, w, _ = _operands(case, np.random.default_rng(0))
    got = _fun(case)(x, w)
    np.testing.assert_allclose(got, _reference(case, x, w), rtol=1e-12, atol=1e-12)
    got32 = _fun(case)(x.astype(np.float32), w.astype(np.float32))
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, _reference(case, x, w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grads_both_modes(case):
    x, w, _ = _operands(case, np.random.default_rng(1))
    check_grads(_fun(case), (x, w), order=2, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (1, -1)], ids=["lhs", "rhs", "both"])
def test_vmap_against_loop(case, in_axes):
    rng = np.random.default_rng(2)
    x, w, _ = _operands(case, rng)
    args = []
    for a, ax in zip((x, w), in_axes):
        if ax is None:
            args.append(a)
        else:
            batch = rng.standard_normal((3,) + a.shape)
            args.append(np.moveaxis(batch, 0, ax))
    check_batching(_fun(case), tuple(args), in_axes=in_axes, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("case", CASES[:6] + CASES[11:12], ids=IDS[:6] + IDS[11:12])
def test_jit(case):
    x, w, _ = _operands(case, np.random.default_rng(3))
    f = _fun(case)
    np.testing.assert_allclose(cv.jit(f)(x, w), f(x, w), rtol=1e-12, atol=1e-12)
    g = cv.jit(cv.grad(lambda x, w: (f(x, w) ** 2).sum(), argnums=(0, 1)))(x, w)
    h = cv.grad(lambda x, w: (f(x, w) ** 2).sum(), argnums=(0, 1))(x, w)
    for a, b in zip(g, h):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


def test_dimension_numbers_object_and_strings_agree():
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 6, 5, 3)), rng.standard_normal((2, 3, 3, 4))
    dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC"))
    assert dn == lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))
    a = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn)
    b = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    np.testing.assert_array_equal(a, b)
    # the spatial order is the rhs spec's: "WH" in the kernel swaps the strides' meaning
    dn_wh = lax.conv_dimension_numbers(x.shape, np.swapaxes(w, 0, 1).shape, ("NHWC", "WHIO", "NHWC"))
    assert dn_wh.lhs_spec == (0, 3, 2, 1)


def test_padtype_to_pads():
    assert lax.padtype_to_pads((7, 6), (3, 2), (2, 1), "SAME") == [(1, 1), (0, 1)]
    assert lax.padtype_to_pads((7, 6), (3, 2), (2, 1), "SAME_LOWER") == [(1, 1), (1, 0)]
    assert lax.padtype_to_pads((7, 6), (3, 2), (2, 1), "VALID") == [(0, 0), (0, 0)]
    with pytest.raises(ShapeError, match="padtype_to_pads.*'FULL'"):
        lax.padtype_to_pads((7,), (3,), (1,), "FULL")


def test_conv_and_conv_with_general_padding():
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((4, 3, 2, 2))
    ref = conv_general_nchw(x, w, (2, 1), [(1, 0), (0, 1)], (1, 1), (1, 2))
    np.testing.assert_allclose(lax.conv_with_general_padding(x, w, (2, 1), [(1, 0), (0, 1)], None, (1, 2)), ref,
                               rtol=1e-12)
    ref_same = conv_general_nchw(x, w, (1, 1), lax.padtype_to_pads((6, 5), (2, 2), (1, 1), "SAME"), (1, 1), (1, 1))
    np.testing.assert_allclose(lax.conv(x, w, (1, 1), "SAME"), ref_same, rtol=1e-12)
    np.testing.assert_allclose(lax.conv(x, w, window_strides=(1, 1), padding="SAME"), ref_same, rtol=1e-12)
    # aten's form of lax.conv is unchanged: symmetric int padding, a bias
    b = rng.standard_normal(4)
    aten = lax.conv(x, w, b, padding=1)
    ref_aten = conv_general_nchw(x, w, (1, 1), [(1, 1), (1, 1)], (1, 1), (1, 1)) + b[:, None, None]
    np.testing.assert_allclose(aten, ref_aten, rtol=1e-12)


@pytest.mark.parametrize("padding", ["VALID", "SAME"])
@pytest.mark.parametrize("strides", [(1, 1), (2, 1), (2, 3)])
def test_conv_transpose_is_the_input_gradient(strides, padding):
    """``conv_transpose(g, w, strides, padding, transpose_kernel=True)`` is the VJP in the
    input of the strided conv with that padding (the shapes chosen to divide evenly)."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((3, 3, 4, 5))  # HWIO; VALID needs kernel ≥ stride and (in − kernel) % stride = 0
    in_sp = (3 * strides[0] + (3 if padding == "VALID" else 0), 2 * strides[1] + (3 if padding == "VALID" else 0))
    x = rng.standard_normal((2,) + in_sp + (4,))
    dn = ("NHWC", "HWIO", "NHWC")

    def f(x):
        return lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=dn)

    g = rng.standard_normal(f(x).shape)
    _, pullback = cv.vjp(f, x)
    (expected,) = pullback(g)
    got = lax.conv_transpose(g, w, strides, padding, dimension_numbers=dn, transpose_kernel=True)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


def test_conv_transpose_grads_vmap_jit():
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((2, 4, 3, 3)), rng.standard_normal((2, 3, 3, 5))

    def f(x, w):
        return lax.conv_transpose(x, w, (2, 2), "SAME")

    assert f(x, w).shape == (2, 8, 6, 5)
    check_grads(f, (x, w), order=2, atol=1e-6, rtol=1e-6)
    check_batching(f, (rng.standard_normal((3,) + x.shape), rng.standard_normal((3,) + w.shape)), in_axes=(0, 0),
                   atol=1e-10, rtol=1e-10)
    np.testing.assert_allclose(cv.jit(f)(x, w), f(x, w), rtol=1e-12)


def test_precision_and_preferred_element_type():
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((1, 2, 4, 4)).astype(np.float32), rng.standard_normal((2, 2, 2, 2)).astype(np.float32)
    out = lax.conv_general_dilated(x, w, (1, 1), "VALID", precision=lax.Precision.HIGHEST,
                                   preferred_element_type=np.float64)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, conv_general_nchw(x, w, (1, 1), [(0, 0)] * 2, (1, 1), (1, 1)), rtol=1e-5)


BAD = [
    ("rank mismatch", lambda: lax.conv_general_dilated(np.ones((1, 2, 4, 4)), np.ones((2, 2, 3)), (1, 1), "VALID"),
     "same rank"),
    ("feature groups", lambda: lax.conv_general_dilated(np.ones((1, 3, 4, 4)), np.ones((2, 2, 2, 2)), (1, 1), "VALID",
                                                         feature_group_count=2), "feature_group_count"),
    ("batch groups", lambda: lax.conv_general_dilated(np.ones((3, 2, 4, 4)), np.ones((2, 2, 2, 2)), (1, 1), "VALID",
                                                       batch_group_count=2), "batch_group_count"),
    ("both groups", lambda: lax.conv_general_dilated(np.ones((2, 2, 4, 4)), np.ones((4, 1, 2, 2)), (1, 1), "VALID",
                                                      feature_group_count=2, batch_group_count=2), "at most one"),
    ("bad spec", lambda: lax.conv_general_dilated(np.ones((1, 2, 4, 4)), np.ones((2, 2, 2, 2)), (1, 1), "VALID",
                                                   dimension_numbers=("NCHW", "OIHX", "NCHW")), "spatial letters"),
    ("strides length", lambda: lax.conv_general_dilated(np.ones((1, 2, 4, 4)), np.ones((2, 2, 2, 2)), (1,), "VALID"),
     "window_strides"),
    ("padding name", lambda: lax.conv_general_dilated(np.ones((1, 2, 4, 4)), np.ones((2, 2, 2, 2)), (1, 1), "FULL"),
     "FULL"),
    ("crop everything", lambda: lax.conv_general_dilated(np.ones((1, 2, 4, 4)), np.ones((2, 2, 2, 2)), (1, 1),
                                                          [(-3, -2), (0, 0)]), "crops away"),
]


@pytest.mark.parametrize("make,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_errors(make, match):
    with pytest.raises(ShapeError, match=match):
        make()


# complex operands: four real convolutions of the parts (NOTE [complex convolutions from
# real ones]); a real operand beside a complex one takes two
def _complexified(case, rng, which):
    x, w, _ = _operands(case, rng)
    if which in ("both", "lhs"):
        x = x + 1j * rng.standard_normal(x.shape)
    if which in ("both", "rhs"):
        w = w + 1j * rng.standard_normal(w.shape)
    return x, w


COMPLEX = ["both", "lhs", "rhs"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("which", COMPLEX)
def test_complex_value_against_loops(case, which):
    x, w = _complexified(case, np.random.default_rng(4), which)
    got = _fun(case)(x, w)
    assert got.dtype == np.complex128
    np.testing.assert_allclose(got, _reference(case, x, w), rtol=1e-12, atol=1e-12)
    got64 = _fun(case)(x.astype(np.complex64 if x.dtype.kind == "c" else np.float32),
                       w.astype(np.complex64 if w.dtype.kind == "c" else np.float32))
    assert got64.dtype == np.complex64
    np.testing.assert_allclose(got64, _reference(case, x, w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES[::3], ids=IDS[::3])
def test_complex_grads_vmap_jit(case):
    x, w = _complexified(case, np.random.default_rng(5), "both")
    f = _fun(case)
    check_grads(f, (x, w), order=2, atol=1e-6, rtol=1e-6)
    batch = np.random.default_rng(6).standard_normal((3,) + x.shape) * (1 + 0.5j)
    check_batching(f, (batch, w), in_axes=(0, None), atol=1e-10, rtol=1e-10)
    np.testing.assert_allclose(cv.jit(f)(x, w), f(x, w), rtol=1e-12, atol=1e-12)
    # the gradient of a real loss: JAX's convention (∂/∂re − i ∂/∂im), as the real parts' gradients give
    loss = lambda x, w: cv.numpy.sum(cv.numpy.abs(f(x, w)) ** 2)  # noqa: E731
    gx = cv.grad(loss)(x, w)
    parts = lambda a, b: loss(a + 1j * b, w)  # noqa: E731
    ga, gb = cv.grad(parts, argnums=(0, 1))(x.real, x.imag)
    np.testing.assert_allclose(gx, ga - 1j * gb, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("xs, ws, strides, padding, want", [
    ((1, 2, 0, 4), (1, 2, 1, 2), (2, 1), "VALID", (1, 1, 0, 3)),   # an empty spatial input
    ((1, 2, 3, 4), (3, 2, 5, 2), (1, 1), "VALID", (1, 3, 0, 3)),   # a kernel larger than the input
    ((2, 2, 3, 4), (3, 2, 5, 2), (1, 1), [(1, 0), (0, 0)], (2, 3, 0, 3)),
], ids=["empty-input", "kernel-larger", "kernel-larger-padded"])
def test_an_output_size_below_one_is_an_empty_result(xs, ws, strides, padding, want):
    """XLA clamps an output size at 0 (JAX's conv_general_dilated): an empty result, and
    zero gradients of the operands' shapes."""
    x, w = np.ones(xs), np.ones(ws)

    def f(x, w):
        return lax.conv_general_dilated(x, w, strides, padding)

    for run in (f, cv.jit(f)):
        out = run(x, w)
        assert out.shape == want and out.dtype == np.float64
    gx, gw = cv.grad(lambda x, w: f(x, w).sum(), argnums=(0, 1))(x, w)
    assert gx.shape == xs and gw.shape == ws and not gx.any() and not gw.any()
