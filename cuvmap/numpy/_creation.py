"""Arrays from values and shapes: ``asarray``, ``array``, ``zeros``, ``ones``, ``full``,
``arange``, ``eye`` and the ``*_like`` functions. Values made from nothing are constants
to every transform (``zeros_like`` of a tracer is a concrete array)."""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Tracer
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._shapes import broadcast_to, stack


def _first_device_value(x):
    """The first tracer or CuPy array in the nested lists and tuples ``x``, or None."""
    if isinstance(x, Tracer) or backend.is_cupy_array(x):
        return x
    if isinstance(x, (list, tuple)):
        for e in x:
            found = _first_device_value(e)
            if found is not None:
                return found
    return None


def _stacked(x, like):
    """The nested lists ``x`` stacked; numbers and host arrays among them join ``like``'s
    device (CuPy refuses a NumPy operand beside a CuPy one)."""
    if isinstance(x, (list, tuple)):
        return stack([_stacked(e, like) for e in x])
    if isinstance(x, Tracer) or backend.is_cupy_array(x):
        return x
    return backend.xp_of(like).asarray(x)


def asarray(x, dtype=None):
    """Tracers pass through; nested lists and tuples that hold tracers or CuPy arrays are
    stacked into one (as ``jnp.asarray([t.sum(), t.mean()])``), on the device of the
    first of them; anything else becomes a NumPy array (or stays a CuPy one). No copy is
    made when none is needed."""
    if isinstance(x, Tracer):
        return x if dtype is None else astype(x, dtype)
    like = _first_device_value(x) if isinstance(x, (list, tuple)) else None
    if like is not None:
        out = _stacked(x, like)
        return out if dtype is None else astype(out, dtype)
    if backend.is_cupy_array(x):
        return x if dtype is None else x.astype(dtype)
    return np.asarray(x, dtype=dtype)


def array(x, dtype=None):
    """Like :func:`asarray`, but a concrete array is always copied (as ``numpy.array``)."""
    if isinstance(x, Tracer) or (isinstance(x, (list, tuple)) and _first_device_value(x) is not None):
        return asarray(x, dtype)
    if backend.is_cupy_array(x):
        return x.astype(x.dtype if dtype is None else dtype, copy=True)
    return np.array(x, dtype=dtype)


def zeros_like(x, dtype=None):
    """Zeros with ``x``'s (logical) shape, dtype and backend: a constant, not a tracer."""
    return core.full_like_concrete(x, 0, dtype=dtype)


def ones_like(x, dtype=None):
    return core.full_like_concrete(x, 1, dtype=dtype)


def full_like(x, fill_value, dtype=None):
    """Constant unless ``fill_value`` is traced: then the fill value broadcast to ``x``'s
    shape, so derivatives flow to it (as ``jnp.full_like``)."""
    if isinstance(fill_value, Tracer):
        return full(core.get_aval(x).shape, fill_value, dtype=core.get_aval(x).dtype if dtype is None else dtype)
    return core.full_like_concrete(x, fill_value, dtype=dtype)


def _creation_module(like):
    """Creation functions have no array operand to decide the device: ``like`` (an array
    or tracer) picks NumPy or CuPy, as NumPy's ``like=`` does; the default is the CPU."""
    return np if like is None else backend.xp_of(like)


def zeros(shape, dtype=np.float64, like=None):
    return _creation_module(like).zeros(shape, dtype=dtype)


def ones(shape, dtype=np.float64, like=None):
    return _creation_module(like).ones(shape, dtype=dtype)


def full(shape, fill_value, dtype=None, like=None):
    """``fill_value`` everywhere; a traced ``fill_value`` is broadcast to ``shape`` (a
    tracer, so derivatives flow to it, as ``jnp.full``)."""
    if isinstance(fill_value, Tracer):
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        return broadcast_to(asarray(fill_value, dtype), shape)
    return _creation_module(like).full(shape, fill_value, dtype=dtype)


def arange(*args, dtype=None, like=None):
    return _creation_module(like).arange(*args, dtype=dtype)


def eye(n, m=None, dtype=np.float64, like=None):
    return _creation_module(like).eye(n, m, dtype=dtype)
