"""Global settings, read and changed as in JAX (``jax.config.update``)::

    import cuvmap as cv
    cv.config.update("default_float", "float64")   # layer initialisers and random draws
    cv.config.default_float                         # dtype('float64')
    with cv.config.override(default_float="float32"):
        ...                                         # restored on exit

Settings:

- ``default_float`` (``float32``; the environment variable ``CUVMAP_DEFAULT_FLOAT`` sets
  the initial value): the dtype of parameters created by the layers' ``init`` when no
  ``dtype`` is given, and of :mod:`cuvmap.random`'s ``uniform``, ``normal`` draws. Arrays
  that you create keep their own dtype: cuvmap never converts data to this dtype, and a
  layer whose data and parameters differ in dtype raises and says which to change.

The settings are process-wide (as JAX's), not per thread.
"""
import contextlib
import os

import numpy as np

_FLOATS = ("float16", "float32", "float64")


def _float_dtype(value, name):
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in _FLOATS:
        raise ValueError(f"cuvmap.config: {name} must be one of {', '.join(_FLOATS)}, got {value!r}")
    return dtype


_CHECKS = {"default_float": _float_dtype}
_values = {"default_float": _float_dtype(os.environ.get("CUVMAP_DEFAULT_FLOAT", "float32"), "CUVMAP_DEFAULT_FLOAT")}


def update(name, value):
    """Sets the setting ``name`` to ``value`` (``update("default_float", "float64")``)."""
    if name not in _CHECKS:
        raise KeyError(f"cuvmap.config: unknown setting {name!r}; the settings are {sorted(_CHECKS)}")
    _values[name] = _CHECKS[name](value, name)


def read(name):
    """The current value of the setting ``name``."""
    if name not in _values:
        raise KeyError(f"cuvmap.config: unknown setting {name!r}; the settings are {sorted(_CHECKS)}")
    return _values[name]


@contextlib.contextmanager
def override(**settings):
    """Changes settings for the duration of a ``with`` block."""
    old = {name: read(name) for name in settings}
    try:
        for name, value in settings.items():
            update(name, value)
        yield
    finally:
        _values.update(old)


def __getattr__(name):  # ``cuvmap.config.default_float`` (PEP 562)
    if name in _values:
        return _values[name]
    raise AttributeError(f"module 'cuvmap.config' has no attribute {name!r}")
