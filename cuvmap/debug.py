"""Debugging inside transformed functions, as ``jax.debug``: :func:`print` and
:func:`callback` run with the concrete values every time the function runs — eagerly,
on every call of a ``jit``-ted function (never at trace time, where Python's own
``print`` runs), with the primal values under ``grad``, and once per example in order
under ``vmap`` (NOTE [debug callbacks] in :mod:`cuvmap.lax.callbacks`)::

    @cv.jit
    def f(x):
        cv.debug.print("x = {x}, sum = {s}", x=x, s=cnp.sum(x))
        return cnp.sin(x)
"""
import builtins

from cuvmap.lax.callbacks import debug_callback


def callback(fn, *args, **kwargs):
    """Calls ``fn(*args, **kwargs)`` with the concrete values of the array leaves of
    ``args`` and ``kwargs`` (NumPy or CuPy arrays) whenever the function around it runs;
    the other leaves (strings, None, objects) are passed as they are. Returns None."""
    if not callable(fn):
        raise TypeError(f"cuvmap.debug.callback: fn must be callable, got {type(fn).__name__}")
    debug_callback(fn, args, kwargs)


def print(fmt, *args, **kwargs):  # noqa: A001 - jax.debug.print's name
    """Prints ``fmt.format(*args, **kwargs)`` with the concrete values of ``args`` and
    ``kwargs`` whenever the function around it runs (see the module docstring)."""
    if not isinstance(fmt, str):
        raise TypeError(f"cuvmap.debug.print: fmt must be a str, got {type(fmt).__name__}")
    debug_callback(lambda *a, **k: builtins.print(fmt.format(*a, **k)), args, kwargs)
