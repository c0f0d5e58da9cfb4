"""``jax.numpy``'s ``from*`` constructors and ``einsum_path`` (issue 32, the mirror's gaps):
``fromfunction`` (JAX's: ``function`` mapped over every index by nested ``vmap``s),
``frombuffer`` and ``fromstring`` (NumPy's parse, a cuvmap array), ``from_dlpack``
(NumPy's or CuPy's import, by the producer's device), ``fromfile`` and ``fromiter``
(refused, as JAX refuses them: they consume their input), and ``einsum_path`` (NumPy's
contraction order, from the operands' shapes only, so it works on traced operands).
"""
import numpy as np

from cuvmap import api, backend, core
from cuvmap.numpy._creation import arange

_IMPURE = ("jnp.{name}() is not implemented because it may be non-pure and thus unsafe for use with JIT and other "
           "JAX transformations (as in JAX). Consider using cuvmap.numpy.asarray(np.{name}(...)) instead, outside "
           "transforms: np.{name} consumes its input")


def fromfunction(function, shape, *, dtype=float, **kwargs):
    """``jnp.fromfunction``: the array whose entry at index ``(i_1, ..., i_n)`` is
    ``function(i_1, ..., i_n, **kwargs)``, with the indices of ``dtype``. As in JAX (not
    NumPy), ``function`` is applied to scalar indices under one ``vmap`` per dimension,
    so it need not broadcast; the result is whatever pytree ``function`` returns,
    batched."""
    try:
        dims = tuple(int(s) for s in shape)
    except TypeError:
        dims = (int(shape),)
    for i in range(len(dims)):
        in_axes = tuple(0 if i == j else None for j in range(len(dims)))[::-1]
        function = api.vmap(function, in_axes=in_axes)
    return function(*(arange(s, dtype=dtype) for s in dims), **kwargs)


def frombuffer(buffer, dtype=float, count=-1, offset=0):
    """``jnp.frombuffer``: the 1-D array of ``dtype`` read from ``buffer`` (bytes or an
    object with the buffer interface), ``count`` items (all: -1) from byte ``offset``.
    A copy, so the result does not alias ``buffer``."""
    return np.frombuffer(buffer=buffer, dtype=dtype, count=count, offset=offset).copy()


def fromstring(string, dtype=float, count=-1, *, sep):
    """``jnp.fromstring``: the 1-D array of ``dtype`` parsed from the text ``string``,
    values separated by ``sep`` (JAX requires it: NumPy's binary mode is deprecated)."""
    return np.fromstring(string, dtype=dtype, count=count, sep=sep)


def fromfile(*args, **kwargs):
    """``jnp.fromfile``: refused, as in JAX (it consumes the file: not a pure function)."""
    raise NotImplementedError(_IMPURE.format(name="fromfile"))


def fromiter(*args, **kwargs):
    """``jnp.fromiter``: refused, as in JAX (it consumes the iterable: not a pure function)."""
    raise NotImplementedError(_IMPURE.format(name="fromiter"))


def from_dlpack(x, /, *, device=None, copy=None):
    """``jnp.from_dlpack``: the array ``x`` exports through DLPack, on the producer's
    device: a NumPy array from a CPU producer, a CuPy array from a CUDA one (CuPy
    installed). ``device`` (``"cpu"``, ``"gpu"`` or a cuvmap device) moves the result
    there (:func:`cuvmap.device_put`); ``copy`` is passed to the importer."""
    kwargs = {} if copy is None else {"copy": copy}
    on_gpu = hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] not in (1, 3)  # kDLCPU, kDLCUDAHost
    if on_gpu:
        cupy = backend.cupy_module()
        if cupy is None:
            raise RuntimeError("from_dlpack: the producer's array is on a GPU, but CuPy (with a GPU) is not available")
        out = cupy.from_dlpack(x, **kwargs)
    else:
        out = np.from_dlpack(x, **kwargs)
    return out if device is None else backend.device_put(out, device)


def einsum_path(subscripts, /, *operands, optimize="auto"):
    """``jnp.einsum_path``: ``numpy.einsum_path``'s contraction order and its report for
    ``einsum(subscripts, *operands)``, computed from the operands' shapes and dtypes only
    (stand-ins without data), so operands may be traced. ``optimize``: ``"auto"`` and
    ``"optimal"`` are NumPy's ``"optimal"``, ``"greedy"`` its greedy search, ``False`` no
    reordering. (JAX returns opt_einsum's path and ``PathInfo``; the path is the same
    kind of list of contracted operand positions.)"""
    stand_ins = [np.broadcast_to(np.zeros((), core.dtype_of(op)), tuple(core.shape_of(op))) if _is_array(op) else op
                 for op in operands]
    mode = {"auto": "optimal", True: "optimal"}.get(optimize, optimize)
    return np.einsum_path(subscripts, *stand_ins, optimize=mode)


def _is_array(x):
    return hasattr(x, "shape") and hasattr(x, "dtype")
