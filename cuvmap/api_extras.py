"""JAX's smaller public names around the transforms (issue 32, "JAX code runs unchanged"):
``Array`` (the type of arrays and traced values), ``ensure_compile_time_eval``,
``named_call`` and ``device_get``.
"""
import abc
import contextlib
import functools

import numpy as np

from cuvmap import api_util, backend, core, tree
from cuvmap.scope import named_scope


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


@contextlib.contextmanager
def ensure_compile_time_eval():
    """Inside the block, operations on concrete values run now, eagerly, even under
    ``jit`` (JAX's ``jax.ensure_compile_time_eval``): ``cnp.sin(2.0)`` is a concrete
    array, not a staged equation, so Python control flow, ``float()`` and printing work on
    values that do not depend on the traced arguments. Operations on traced values are
    staged as always. Example::

        @cuvmap.jit
        def f(x):
            with cuvmap.ensure_compile_time_eval():
                y = cnp.sin(3.0)                 # a concrete array
            return x * y if y > 0 else x         # Python control flow on y

    (The innermost staging transform owns the values made from nothing — NOTE [staging owns
    the values made from nothing] in cuvmap/core/primitive.py — and the block sets none.)
    """
    with core.staging(None):
        yield


def named_call(fun, *, name=None):
    """``fun`` with its equations staged under the named scope ``name`` (default: its
    ``__name__``), JAX's ``jax.named_call``; the values are ``fun``'s. The name shows in
    the text of staged programs (:func:`cuvmap.named_scope`)."""
    api_util.check_callable(fun, "named_call")
    scope = name if name is not None else api_util.fun_name(fun)

    @functools.wraps(fun)
    def named(*args, **kwargs):
        with named_scope(scope):
            return fun(*args, **kwargs)

    return named


def device_get(x):
    """Every array leaf of the pytree ``x`` as a NumPy array on the host (JAX's
    ``jax.device_get``): CuPy arrays are copied to the host, NumPy arrays and Python
    scalars are returned as they are; a traced value raises (its value is not known yet:
    return it from the transformed function first)."""

    def get(leaf):
        if isinstance(leaf, core.Tracer):
            raise core.ConcretizationError(
                f"device_get: a traced value (shape {leaf.shape}) has no value yet; return it from the transformed "
                "function and call device_get on the result")
        if backend.is_cupy_array(leaf):
            return leaf.get()
        return leaf

    return tree.map_preserving(get, x)
