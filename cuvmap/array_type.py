"""``cuvmap.Array`` (JAX's ``jax.Array``), in a module of its own below the API layer so
that ``cuvmap.numpy`` can name it ``ndarray`` (JAX's ``jax.numpy.ndarray``) without an
import cycle; ``cuvmap.api_extras`` re-exports it as ``cuvmap.Array``.
"""
import abc

import numpy as np

from cuvmap import backend, core


# NOTE [cuvmap.Array is a virtual base class]
# JAX's values are all ``jax.Array``: the arrays its functions return and the tracers a
# transform passes to a function. cuvmap's concrete arrays are NumPy's and CuPy's own
# (``cnp.sin(x)`` returns a ``numpy.ndarray`` or a ``cupy.ndarray``) and its traced values
# are :class:`~cuvmap.core.Tracer`; ``cuvmap.Array`` is an abstract class whose
# ``isinstance`` holds for the three, so ``isinstance(x, cuvmap.Array)`` and annotations
# ``x: cuvmap.Array`` read as in JAX. Two differences follow from cuvmap returning NumPy
# arrays: ``issubclass(np.ndarray, cuvmap.Array)`` is True (False in JAX), and a NumPy
# array the user made is an ``Array`` too (JAX's are only after ``jnp.asarray``). NumPy
# scalars (``np.float32(1)``) and Python numbers are not, as in JAX.
class _ArrayMeta(abc.ABCMeta):
    def __instancecheck__(cls, x):
        return isinstance(x, (np.ndarray, core.Tracer)) or backend.is_cupy_array(x)

    def __subclasscheck__(cls, sub):
        if not isinstance(sub, type):
            raise TypeError("issubclass() arg 1 must be a class")
        return (issubclass(sub, (np.ndarray, core.Tracer)) or sub.__module__.startswith("cupy")
                and sub.__name__ == "ndarray")


class Array(metaclass=_ArrayMeta):
    """The type of cuvmap's arrays and traced values (JAX's ``jax.Array``):
    ``isinstance(x, cuvmap.Array)`` holds for a ``numpy.ndarray``, a ``cupy.ndarray`` and
    a tracer (what a transformed function receives), and not for Python numbers or NumPy
    scalars. An abstract class: it makes no arrays (``cuvmap.numpy.asarray`` does); use it
    in ``isinstance`` checks and annotations (NOTE [cuvmap.Array is a virtual base
    class])."""

    def __new__(cls, *args, **kwargs):
        raise TypeError("cuvmap.Array is an abstract type (for isinstance and annotations); "
                        "make arrays with cuvmap.numpy.asarray or cuvmap.numpy.array")
