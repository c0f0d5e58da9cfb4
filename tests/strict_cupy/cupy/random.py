"""``cupy.random`` of the stand-in: ``default_rng``/``Generator`` (CuPy's own kernels,
capturable) over NumPy's generator, and the legacy functions (cuRAND through CuPy's
``RandomState``, refused during capture)."""
import numpy as np

from cupy._strict import launch, used


class Generator:
    """``cupy.random.Generator``: NumPy's ``Generator`` whose draws are stand-in arrays."""

    _METHODS = ("random", "standard_normal")  # NOTE [the stand-in's surface] in cupy/_functions.py

    def __init__(self, bit_generator=None, seed=None):
        self._g = np.random.default_rng(seed)

    def __getattr__(self, name):
        if name not in self._METHODS:
            raise AttributeError(f"'cupy.random.Generator' (strict CuPy stand-in) has no attribute {name!r}")
        method = getattr(self._g, name)

        def draw(*args, **kwargs):
            used(f"cupy.random.Generator.{name}")
            for v in list(args) + list(kwargs.values()):
                if type(v) is np.ndarray:
                    raise TypeError(f"Unsupported type {type(v)}")
            out = kwargs.get("out")
            result = launch(f"Generator.{name}", method, args, kwargs)
            return out if out is not None else result

        return draw


Generator.__module__ = "cupy.random"


def default_rng(seed=None):
    used("cupy.random.default_rng")
    if isinstance(seed, Generator):
        return seed
    return Generator(seed=seed)


class RandomState:
    """``cupy.random.RandomState``: host cuRAND calls (refused during capture)."""

    def __init__(self, seed=None):
        self._r = np.random.RandomState(seed)

    def __getattr__(self, name):
        method = getattr(self._r, name)

        def draw(*args, **kwargs):
            used(f"cupy.random.RandomState.{name}")
            return launch(f"RandomState.{name}", method, args, kwargs, library="curand")

        return draw


_global = RandomState()


def seed(seed=None):
    _global._r.seed(seed)


def _legacy(name):
    def fn(*args, **kwargs):
        return getattr(_global, name)(*args, **kwargs)
    fn.__name__ = name
    return fn


standard_normal = _legacy("standard_normal")

__all__ = ["Generator", "default_rng", "RandomState", "seed", "standard_normal"]
