"""cuvmap/window.py, the window arithmetic of the conv and pooling families and kernels,
against brute-force enumeration of the window positions."""
import itertools

import numpy as np

from cuvmap import window

# (spatial, kernel, stride, padding, dilation), one spatial dim each
CASES_1D = [(s, k, st, p, d) for s in (1, 4, 7) for k in (1, 2, 3) for st in (1, 2, 3) for p in (0, 1, 2)
            for d in (1, 2) if s + 2 * p >= d * (k - 1) + 1]


def _positions(s, k, st, p, d):
    """The output positions y whose window (padded coordinates y·st + t·d) fits in s + 2p."""
    return [y for y in range(s + 2 * p) if y * st + (k - 1) * d <= s + 2 * p - 1]


def test_output_spatial_counts_the_windows():
    for s, k, st, p, d in CASES_1D:
        assert window.output_spatial((s,), (k,), (st,), (p,), (d,)) == (len(_positions(s, k, st, p, d)),)
        if d == 1:
            assert window.output_spatial((s,), (k,), (st,), (p,)) == (len(_positions(s, k, st, p, 1)),)
    # one call, several dims
    assert window.output_spatial((7, 4), (3, 2), (2, 1), (1, 0), (2, 1)) == (
        len(_positions(7, 3, 2, 1, 2)), len(_positions(4, 2, 1, 0, 1)))


def test_transposed_output_spatial_is_the_extent_of_the_adjoint():
    """The transposed conv of a length-s input writes positions y·st − p + t·d (the padding
    p cropped at both ends of its output); its output holds the last of them, plus
    output_padding positions."""
    for s, k, st, p, d in CASES_1D:
        last = max(y * st - p + t * d for y in range(s) for t in range(k))
        for op in range(max(st, d)):
            assert window.transposed_output_spatial((s,), (k,), (st,), (p,), (d,), (op,)) == (last - p + 1 + op,)


def test_taps_are_row_major():
    assert list(window.taps((2, 3))) == list(itertools.product(range(2), range(3)))
    assert list(window.taps((1, 1, 2))) == [(0, 0, 0), (0, 0, 1)]


def test_tap_slices_read_the_tap_of_every_window():
    for s, k, st, p, d in CASES_1D:
        padded = np.arange(s + 2 * p)
        out = window.output_spatial((s,), (k,), (st,), (p,), (d,))
        for (t,) in window.taps((k,)):
            (sl,) = window.tap_slices((t,), out, (st,), (d,))
            assert padded[sl].tolist() == [y * st + t * d for y in _positions(s, k, st, p, d)]


def test_pad_interior_and_padded_spatial():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    assert window.pad_spatial(np, x, (0, 0)) is x
    xp = window.pad_spatial(np, x, (1, 2), value=-1.0)
    assert xp.shape[2:] == window.padded_spatial((4, 5), (1, 2)) == (6, 9)
    np.testing.assert_array_equal(xp[(slice(None), slice(None)) + window.interior((1, 2), (4, 5))], x)
    assert (xp == -1).sum() == xp.size - x.size
