"""The out-of-bounds modes of ``take`` and ``take_along_axis`` (JAX's ``mode=`` and
``fill_value=``): how an index outside ``[-n, n)`` (or, without wrapping, ``[0, n)``)
is treated (NOTE [gather modes]).

NOTE [gather modes]
Each mode turns the indices into in-bounds ones before the one ``take`` that gathers, so
the gather, its batching rule and its derivative stay those of ``take``:

* ``None`` without ``fill_value`` (cuvmap's default) and ``'raise'``: the indices are
  checked (``check_index_bounds``: an IndexError where they have values, eagerly, in a
  staged program when it runs, on the GPU at the next check); negative ones count from
  the end. JAX's default is ``'fill'``: cuvmap keeps the check by default because a
  silently filled gather is how a wrong label or an off-by-one index goes unnoticed;
  pass ``mode='fill'`` (or a ``fill_value``) for JAX's behaviour.
* ``'fill'`` (JAX's default): negative indices count from the end; the others outside the
  axis read ``fill_value`` (default NaN for inexact dtypes, the most negative value for
  signed integers, the largest for unsigned ones, True for booleans, as JAX). The gather
  reads a clamped index and a select puts the fill in: the fill's entries get a zero
  derivative.
* ``'clip'``: indices clamped into ``[0, n − 1]`` (``take`` clamps negative ones to 0, as
  NumPy and JAX; ``take_along_axis`` counts them from the end first unless
  ``wrap_negative_indices=False``).
* ``'wrap'`` (``take``): indices modulo ``n``.
* ``'promise_in_bounds'``: the caller promises in-bounds indices; cuvmap clamps (any
  answer is allowed for a broken promise, and a clamped read is never out of memory).
* ``'one_hot'`` (``take_along_axis``): JAX's one-hot contraction, whose out-of-bounds
  entries are 0: a fill with 0.
"""
import numpy as np

from cuvmap import core
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax.slicing_gather import default_fill_value

TAKE_MODES = (None, "raise", "fill", "clip", "wrap")
TAKE_ALONG_AXIS_MODES = (None, "raise", "fill", "clip", "promise_in_bounds", "one_hot")


def resolve_mode(name, mode, fill_value, allowed):
    """The effective mode: ``None`` with a ``fill_value`` is ``'fill'``, ``None`` alone
    the checked gather (``'raise'``)."""
    mode = getattr(mode, "name", mode)  # a GatherScatterMode member
    if isinstance(mode, str):
        mode = {"FILL_OR_DROP": "fill", "CLIP": "clip", "PROMISE_IN_BOUNDS": "promise_in_bounds",
                "ONE_HOT": "one_hot"}.get(mode, mode)
    if mode not in allowed:
        raise ValueError(f"{name}: invalid mode {mode!r}; use one of {', '.join(repr(m) for m in allowed)}")
    if mode is None:
        return "raise" if fill_value is None else "fill"
    return mode


def in_bounds_indices(idx, n, mode, name, axis, wrap_negative=True):
    """``(indices, valid)``: int64 indices inside ``[0, n)`` for ``mode`` and, for the
    filling modes, the mask of the entries that were in bounds (None otherwise)."""
    idx = lax_indexing.as_index_dtype(idx)
    if mode == "raise":
        idx = lax_indexing.check_index_bounds(idx, n, name, axis)
        return ew.select(ew.lt(idx, 0), ew.add(idx, n), idx), None
    if mode == "wrap":
        return ew.remainder(idx, n), None
    if wrap_negative:
        idx = ew.select(ew.lt(idx, 0), ew.add(idx, n), idx)
    clamped = ew.clamp(0, idx, n - 1)
    if mode in ("clip", "promise_in_bounds"):
        return clamped, None
    return clamped, ew.select(ew.ge(idx, 0), ew.lt(idx, n), ew.ne(idx, idx))  # 0 <= idx < n


def fill_out_of_bounds(out, valid, mode, fill_value, name):
    """``out`` with the entries whose index was out of bounds (``valid`` False, broadcast
    against ``out``) replaced by ``fill_value`` (0 for ``'one_hot'``; JAX's default fill
    otherwise)."""
    if valid is None:
        return out
    dtype = np.dtype(core.dtype_of(out))
    if mode == "one_hot":
        fill_value = 0
    elif fill_value is None:
        fill_value = default_fill_value(dtype)
    if isinstance(fill_value, core.Tracer):
        raise TypeError(f"{name}: fill_value must be a static scalar, not a traced value")
    fill = np.asarray(fill_value).astype(dtype)
    if fill.ndim:
        raise ValueError(f"{name}: fill_value must be a scalar, got shape {fill.shape}")
    return ew.select(valid, out, fill.item())
