"""Arrays from values and shapes: ``asarray``, ``array``, ``zeros``, ``ones``, ``full``,
``arange``, ``eye`` and the ``*_like`` functions. Values made from nothing are constants
to every transform (``zeros_like`` of a tracer is a concrete array)."""
import builtins

import numpy as np

from cuvmap import backend, core
from cuvmap.core import Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._shapes import broadcast_to, reshape, stack
from cuvmap.core.bfloat16 import kind_of


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


# NOTE [weak arrays from Python numbers]
# As JAX's ``jnp.asarray(2.0)`` and ``jnp.array(2.0)`` (``weak_type = dtype is None and
# is_weakly_typed(object)``), a Python int, float or complex given without a dtype becomes a
# weakly typed 0-d array: a core.WeakArray (NOTE [eager weak arrays] in
# cuvmap/core/weak.py), whose aval is weak under every transform, so that
# ``cnp.asarray(2.0) * float32_array`` is float32 eagerly, under jit and in eval_shape.
# A bool, a NumPy scalar or a list gives a strong array, as in JAX.
_WEAK_SCALARS = (int, float, complex)


def _weak_scalar(a, dtype):
    """``a`` as a weakly typed 0-d array when it is a Python number and no dtype is asked
    (NOTE [weak arrays from Python numbers]); otherwise None."""
    if dtype is None and type(a) in _WEAK_SCALARS:
        return np.asarray(a).view(core.WeakArray)
    return None


def asarray(a, dtype=None, order=None, *, copy=None, device=None):
    """Tracers pass through; nested lists and tuples that hold tracers or CuPy arrays are
    stacked into one (as ``jnp.asarray([t.sum(), t.mean()])``), on the device of the
    first of them; a Python int, float or complex without ``dtype`` becomes a weakly typed
    0-d array (NOTE [weak arrays from Python numbers]); anything else becomes a NumPy
    array (or stays a CuPy one). No copy is made when none is needed."""
    weak = _weak_scalar(a, dtype)
    if weak is not None:
        return weak
    if isinstance(a, Tracer):
        return a if dtype is None else astype(a, dtype)
    like = _first_device_value(a) if isinstance(a, (list, tuple)) else None
    if like is not None:
        out = _stacked(a, like)
        return out if dtype is None else astype(out, dtype)
    if backend.is_cupy_array(a):
        return a if dtype is None else a.astype(dtype)
    return np.asarray(a, dtype=dtype)


def array(object, dtype=None, copy=True, order="K", ndmin=0, *, device=None):  # noqa: A002 - jax.numpy's name
    """Like :func:`asarray`, but a concrete array is copied (as ``numpy.array``); the
    result has at least ``ndmin`` dims (leading 1s added); a Python number without
    ``dtype`` is weakly typed (NOTE [weak arrays from Python numbers])."""
    weak = _weak_scalar(object, dtype) if not ndmin else None
    if weak is not None:
        return weak
    if isinstance(object, Tracer) or (isinstance(object, (list, tuple)) and _first_device_value(object) is not None):
        out = asarray(object, dtype)
    elif backend.is_cupy_array(object):
        out = object.astype(object.dtype if dtype is None else dtype, copy=True)
    else:
        if isinstance(object, np.ma.MaskedArray):
            raise ValueError("array: numpy masked arrays are not supported")
        out = np.array(object, dtype=dtype)
        if out.dtype == np.dtype("O"):
            raise TypeError(f"array: cannot make an array of Python objects from {type(object).__name__}")
    s = core.shape_of(out)
    if len(s) < ndmin:
        out = reshape(out, (1,) * (ndmin - len(s)) + tuple(s))
    return out


def _like_shape(shape):
    if shape is None:
        return None
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)


def zeros_like(a, dtype=None, shape=None, *, device=None):  # noqa: A002 - jax.numpy's name
    """Zeros with ``a``'s (logical) shape (or ``shape``), dtype and backend: a constant, not a tracer."""
    return core.full_like_concrete(_operand(a), 0, shape=_like_shape(shape), dtype=dtype)


def ones_like(a, dtype=None, shape=None, *, device=None):  # noqa: A002 - jax.numpy's name
    """Ones with ``a``'s (logical) shape (or ``shape``), dtype and backend: a constant."""
    return core.full_like_concrete(_operand(a), 1, shape=_like_shape(shape), dtype=dtype)


def empty_like(prototype, dtype=None, shape=None, *, device=None):  # noqa: A002 - jax.numpy's name
    """``jnp.empty_like``: as JAX, zeros (arrays are never uninitialized)."""
    return zeros_like(prototype, dtype, shape)


def full_like(a, fill_value, dtype=None, shape=None, *, device=None):  # noqa: A002 - jax.numpy's name
    """Constant unless ``fill_value`` is traced: then the fill value broadcast to ``a``'s
    shape (or ``shape``), so derivatives flow to it (as ``jnp.full_like``)."""
    a = _operand(a)
    target = _like_shape(shape)
    if isinstance(fill_value, Tracer):
        return full(core.get_aval(a).shape if target is None else target, fill_value,
                    dtype=core.get_aval(a).dtype if dtype is None else dtype)
    return core.full_like_concrete(a, fill_value, shape=target, dtype=dtype)


def _operand(x):
    return x if hasattr(x, "shape") and hasattr(x, "dtype") else asarray(x)


def _creation_module(like):
    """Creation functions have no array operand to decide the device: ``like`` (an array
    or tracer) picks NumPy or CuPy, as NumPy's ``like=`` does; the default is the CPU."""
    return np if like is None else backend.xp_of(like)


def zeros(shape, dtype=None, like=None, *, device=None):  # noqa: A002 - jax.numpy's name
    _check_forgot_shape_tuple("zeros", shape, dtype)
    return _creation_module(like).zeros(_shape_arg(shape), dtype=dtype)


def ones(shape, dtype=None, like=None, *, device=None):  # noqa: A002 - jax.numpy's name
    _check_forgot_shape_tuple("ones", shape, dtype)
    return _creation_module(like).ones(_shape_arg(shape), dtype=dtype)


def empty(shape, dtype=None, like=None, *, device=None):  # noqa: A002 - jax.numpy's name
    """``jnp.empty``: as JAX, zeros (arrays are never uninitialized)."""
    _check_forgot_shape_tuple("empty", shape, dtype)
    return zeros(shape, dtype, like)


def _check_forgot_shape_tuple(name, shape, dtype):
    """``zeros(2, 3)`` meant ``zeros((2, 3))``: JAX's TypeError with its hint."""
    if isinstance(dtype, int) and not isinstance(dtype, bool) and isinstance(shape, int):
        raise TypeError(f"Cannot interpret '{dtype}' as a data type.\n\nDid you accidentally write "
                        f"`jax.numpy.{name}({shape}, {dtype})` when you meant `jax.numpy.{name}(({shape}, {dtype}))`, "
                        "i.e. with a single tuple argument for the shape?")


def _shape_arg(shape):
    """A static shape: an int or a sequence of ints, none negative."""
    if isinstance(shape, Tracer) or (isinstance(shape, (list, tuple)) and builtins.any(isinstance(s, Tracer) for s in shape)):
        raise core.ConcretizationError("a shape must be static (ints), got a traced value")
    out = (int(shape),) if isinstance(shape, (int, np.integer)) or np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    if builtins.any(s < 0 for s in out):
        raise ValueError(f"negative dimensions are not allowed: {out}")
    return out


def full(shape, fill_value, dtype=None, like=None, *, device=None):  # noqa: A002 - jax.numpy's name
    """``fill_value`` everywhere; a traced ``fill_value`` is broadcast to ``shape`` (a
    tracer, so derivatives flow to it, as ``jnp.full``)."""
    shape = _shape_arg(shape)
    if isinstance(fill_value, Tracer):
        return broadcast_to(asarray(fill_value, dtype), shape)
    return _creation_module(like).full(shape, fill_value, dtype=dtype)


def arange(*args, dtype=None, like=None, device=None, step=None, stop=None, start=None):
    """``jnp.arange(start, stop=None, step=None, dtype=None)``: evenly spaced values in
    ``[start, stop)`` (a constant; the arguments must be static)."""
    if start is not None:
        args = (start,) + args
    if stop is not None:
        args = args + (stop,)
    if step is not None:
        args = args + (step,)
    for a in args:
        if isinstance(a, Tracer):
            raise core.ConcretizationError("arange: start, stop and step must be static, got a traced value")
        if isinstance(a, complex) or np.iscomplexobj(a):
            raise ValueError("arange: complex arguments are not supported (as in JAX: Passing complex "
                             "start/stop/step to jnp.arange is no longer supported)")
    return _creation_module(like).arange(*args, dtype=dtype)


def eye(N, M=None, k=0, dtype=None, like=None, *, device=None):  # noqa: N803 - jax.numpy's names
    """``jnp.eye``: the ``N × M`` matrix with ones on diagonal ``k`` (``k`` may be traced:
    then the ones are where ``j − i = k``)."""
    if isinstance(k, Tracer):
        return diagonal_band(N, M, k, dtype, ew_eq=True)
    return _creation_module(like).eye(int(N), None if M is None else int(M), int(k), dtype=dtype or np.float64)


def diagonal_band(N, M, k, dtype, ew_eq):  # noqa: N803 - jax.numpy's names
    """The ``N × M`` array of ``j − i = k`` (``ew_eq``) or ``j − i ≤ k`` for a traced ``k``:
    ones there, zeros elsewhere, in ``dtype`` (float64 by default)."""
    M = N if M is None else M
    rows = np.arange(int(N))[:, None]
    cols = np.arange(int(M))[None, :]
    offset = cols - rows
    mask = ew.eq(offset, k) if ew_eq else ew.le(offset, k)
    return astype(mask, dtype or np.float64)


def identity(n, dtype=None, like=None):
    """``jnp.identity``: the ``n × n`` identity matrix."""
    return eye(n, dtype=dtype, like=like)


def promote_inexact(*xs):
    """The operands as arrays in their promoted dtype, integers and booleans as float64
    (JAX's ``promote_dtypes_inexact`` with 64-bit types): what the composites that compute
    in floating point (calculus, covariances, polynomials) take their operands as."""
    xs = [asarray(x) for x in xs]
    dtype = np.result_type(*[core.dtype_of(x) for x in xs])
    if kind_of(dtype) not in "fc":
        dtype = np.dtype(np.float64)
    return [astype(x, dtype) for x in xs]
