"""``cupyx`` of the strict CuPy stand-in: ``scatter_add`` (and its siblings) and
``cupyx.scipy.special``."""
import numpy as _np

from cupy._functions import _index, _value, _wrapped
from cupy._strict import ndarray, record, unwrap, used


def _scatter(name, np_ufunc):
    def fn(a, slices, value):
        used(f"cupyx.{name}")
        if type(a) is not ndarray:
            raise TypeError(f"cupyx.{name}: the first argument must be a cupy.ndarray")
        idx, val = _index(slices), _value(value)
        np_ufunc.at(a._a, _wrapped(a.shape, unwrap(idx)), unwrap(val))  # NOTE [CuPy wraps integer-array indices]
        record(name, lambda x, i, v: np_ufunc.at(x, _wrapped(x.shape, i), v), (a, idx, val))
    fn.__name__ = name
    return fn


scatter_add = _scatter("scatter_add", _np.add)  # NOTE [the stand-in's surface] in cupy/_functions.py
scatter_max = _scatter("scatter_max", _np.maximum)
scatter_min = _scatter("scatter_min", _np.minimum)


def __getattr__(name):
    if name == "scipy":
        import importlib
        return importlib.import_module("cupyx.scipy")
    raise AttributeError(f"module 'cupyx' (the strict CuPy stand-in) has no attribute {name!r}")
