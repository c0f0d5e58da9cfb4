"""What the modules of :mod:`cuvmap.numpy` share: dtypes and constants, ``shape``,
``ndim``, ``size``, and the normalisation of ``axis`` arguments."""
import builtins

import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError, Tracer


float32 = np.float32
float64 = np.float64
int32 = np.int32
int64 = np.int64
bool_ = np.bool_
pi = np.pi
inf = np.inf
newaxis = None

shape = core.shape_of


def ndim(a):
    return len(core.shape_of(a))


def size(a, axis=None):
    """``jnp.size``: the number of elements of ``a``, or of its dims ``axis`` (an int or a
    tuple; negatives count from the end; a repeated dim raises ValueError)."""
    dims = core.shape_of(a)
    if axis is None:
        return int(np.prod(dims, dtype=np.int64))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    n = len(dims)
    for i in axes:
        if not -n <= i < n:
            raise ShapeError(f"size: axis {i} is out of range for an array of shape {tuple(dims)}")
    canonical = [int(i) % n for i in axes]
    if len(set(canonical)) != len(canonical):
        raise ValueError(f"size: repeated axis in {axis!r} for an array of shape {tuple(dims)}")
    return int(np.prod([dims[i] for i in canonical], dtype=np.int64))


def _axes(x, axis, name=None):
    """Normalizes ``axis`` (None, int or tuple, negatives allowed) to a sorted tuple;
    errors name the function ``name``."""
    n = ndim(x)
    if axis is None:
        return tuple(range(n))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    out = []
    for a in axis:
        if not -n <= a < n:
            prefix = f"{name}: " if name else ""
            raise ShapeError(f"{prefix}axis {a} is out of range for an array of shape {shape(x)}")
        out.append(int(a) % n)
    return tuple(sorted(out))


def _axis(x, axis, name=None):
    return _axes(x, axis, name)[0]


def _holds_tracer(x):
    if isinstance(x, Tracer):
        return True
    return isinstance(x, (list, tuple)) and builtins.any(_holds_tracer(e) for e in x)


def _is_bool(x):
    return core.dtype_of(x) == np.bool_
