"""``jax.numpy``'s multi-dimensional histograms and bin edges (issue 32, the mirror's gaps):
``histogram_bin_edges``, ``histogram2d`` and ``histogramdd``, on the bin edges and bin
membership of :func:`cuvmap.numpy.histogram` (each entry compared with every edge). The
joint counts are one ``einsum`` of the per-dimension memberships over the points. Counts
have no derivative (forward only); with ``weights`` the sums are differentiable in them.
"""
import builtins

import numpy as np

from cuvmap import core
from cuvmap.lax import elementwise as ew
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._products import einsum
from cuvmap.numpy._reductions import sum
from cuvmap.numpy._shapes import ravel, reshape, stack
from cuvmap.numpy._stacking import diff
from cuvmap.numpy._statistics import _bin_edges, _float, _in_bins


def histogram_bin_edges(a, bins=10, range=None, weights=None):  # noqa: A002 - NumPy's name
    """``jnp.histogram_bin_edges``: the edges :func:`cuvmap.numpy.histogram` uses for the
    flattened ``a``: ``bins + 1`` equally spaced edges over ``range`` (default: ``a``'s min
    to max, an empty range widened by ±0.5), or ``bins`` itself when it is the edges.
    ``weights`` is accepted and unused, as NumPy's for these rules."""
    del weights
    return _bin_edges(ravel(_float(a)), bins, range, "histogram_bin_edges")


def histogramdd(sample, bins=10, range=None, weights=None, density=None):  # noqa: A002 - NumPy's name
    """``jnp.histogramdd``: ``(hist, edges)`` of ``N`` points in ``D`` dimensions
    (``sample`` of shape ``(N, D)``): ``hist[i_1, ..., i_D]`` counts (or sums the
    ``weights`` of) the points whose coordinate ``d`` lies in bin ``i_d`` of ``edges[d]``
    (half-open bins, the last closed; points outside any are not counted). ``bins`` is an
    int, or one per dimension (an int or the edges); ``range`` one ``(lo, hi)`` or ``None``
    per dimension. ``density`` divides by the total and each bin's volume. Unweighted
    counts are int64 (JAX: its default int)."""
    sample = _float(sample)
    if len(core.shape_of(sample)) != 2:
        raise ValueError(f"histogramdd: sample must have shape (N, D), got {tuple(core.shape_of(sample))}")
    n, d = core.shape_of(sample)
    if range is not None and (len(range) != d or any(r is not None and np.shape(r)[0] != 2 for r in range)):
        raise ValueError(f"For sample.shape={(n, d)}, range must be a sequence of {d} pairs or Nones; got {range=}")
    per_dim = [bins] * d if isinstance(bins, (int, np.integer)) else list(bins)
    if len(per_dim) != d:
        raise ValueError(f"histogramdd: should be a bin for each dimension ({d}), got {len(per_dim)}")
    edges, members = [], []
    for i in builtins.range(d):
        column = sample[:, i]
        e = _bin_edges(column, per_dim[i], None if range is None else range[i], "histogramdd")
        edges.append(e)
        members.append(astype(_in_bins(column, e), core.dtype_of(sample)))
    letters = "abcdefghijklmnopqrstuvwxyz"[:d]
    operands = members
    spec = ",".join(f"N{c}" for c in letters)
    if weights is not None:
        w = _float(weights)
        if tuple(core.shape_of(w)) != (n,):
            raise ValueError(f"histogramdd: should have one weight for each sample, got weights of shape "
                             f"{tuple(core.shape_of(w))} for {n} samples")
        operands, spec = [w] + members, "N," + spec
    hist = einsum(f"{spec}->{letters}", *operands)
    if weights is None and not density:
        hist = astype(ew.round_decimals(hist, 0), np.int64)
    if density:
        hist = ew.div(hist, sum(hist))
        for i, e in enumerate(edges):
            widths = diff(e)
            hist = ew.div(hist, reshape(widths, tuple(-1 if j == i else 1 for j in builtins.range(d))))
    return hist, edges


def histogram2d(x, y, bins=10, range=None, weights=None, density=None):  # noqa: A002 - NumPy's name
    """``jnp.histogram2d``: ``(hist, x_edges, y_edges)``, :func:`histogramdd` of the points
    ``(x[k], y[k])``. ``bins`` is an int, a pair (ints or edges), or one array of edges
    for both coordinates."""
    x, y = asarray(x), asarray(y)
    try:
        count = len(bins)
    except TypeError:
        count = 1
    if count not in (1, 2):
        bins = [bins, bins]
    dtype = np.result_type(core.dtype_of(_float(x)), core.dtype_of(_float(y)))
    sample = stack([astype(ravel(x), dtype), astype(ravel(y), dtype)], axis=1)
    hist, edges = histogramdd(sample, bins, range, weights, density)
    return hist, edges[0], edges[1]

