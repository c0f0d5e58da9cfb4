"""JAX's ``lax.split`` and ``lax.tile``: ``split`` and ``tile``
are composites of ``slice`` and of ``broadcast_in_dim`` with ``reshape``, so they
differentiate, batch and stage as those do (JAX makes ``split`` a primitive of its own;
its rules here are those of the slices)."""
import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError, Tracer
from cuvmap.lax import indexing, shape
from cuvmap.lax.elementwise import common as elementwise_common




def split(operand, sizes, axis=0):
    """``jax.lax.split``: the pieces of ``operand`` along ``axis`` of lengths ``sizes``
    (static ints that add up to the length of the axis), as a list."""
    rank = len(core.shape_of(operand))
    if not -rank <= int(axis) < rank:
        raise ShapeError(f"split: axis {axis} is out of range for an operand of shape {core.shape_of(operand)}")
    axis = int(axis) % rank
    if any(isinstance(s, Tracer) for s in sizes):
        raise core.ConcretizationError("split: sizes must be static ints, got a traced value")
    sizes = [int(s) for s in sizes]
    n = core.shape_of(operand)[axis]
    if any(s < 0 for s in sizes) or sum(sizes) != n:
        raise ShapeError(f"split: sizes {tuple(sizes)} must be non-negative and add up to {n}, the length of axis "
                         f"{axis} of shape {core.shape_of(operand)}")
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return [indexing.slice_in_dim(operand, lo, hi, axis) for lo, hi in zip(bounds[:-1], bounds[1:])]


def tile(operand, reps):
    """``jax.lax.tile``: ``operand`` repeated ``reps[d]`` times along each dim ``d``
    (``len(reps)`` must be the rank): a broadcast to ``(r₀, s₀, r₁, s₁, ...)`` reshaped to
    ``(r₀ s₀, r₁ s₁, ...)``."""
    s = core.shape_of(operand)
    reps = tuple(int(r) for r in reps)
    if len(reps) != len(s):
        raise ShapeError(f"tile: reps {reps} must have one entry per dim of the operand's shape {s}")
    if any(r < 0 for r in reps):
        raise ShapeError(f"tile: reps {reps} must be non-negative")
    spread = tuple(d for pair in zip(reps, s) for d in pair)
    out = shape.broadcast_in_dim(operand, spread, tuple(range(1, 2 * len(s), 2)))
    return shape.reshape(out, tuple(r * d for r, d in zip(reps, s)))
