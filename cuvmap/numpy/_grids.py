"""``jnp.mgrid`` and ``jnp.ogrid``: NumPy's index tricks (dense and open mesh grids), whose
slice bounds and steps must be concrete: a traced one raises
:class:`~cuvmap.errors.ConcretizationError` naming it, as JAX's does."""
import numpy as np

from cuvmap.core import ConcretizationError, Tracer


class _GridIndexer:
    """``grid[start:stop:step, ...]``: NumPy's ``mgrid``/``ogrid`` after checking that
    every slice bound is concrete."""

    def __init__(self, grid, name):
        self._grid, self._name = grid, name

    def __getitem__(self, key):
        for k in key if isinstance(key, tuple) else (key,):
            if not isinstance(k, slice):
                continue
            for part in ("start", "stop", "step"):
                if isinstance(getattr(k, part), Tracer):
                    raise ConcretizationError(
                        f"{self._name}: a traced value was given as the slice {part} of jnp.{self._name}; the "
                        "bounds and steps of a mesh grid set its shape and must be concrete (static)")
        return self._grid[key]

    def __repr__(self):
        return f"cuvmap.numpy.{self._name}"


mgrid = _GridIndexer(np.mgrid, "mgrid")
ogrid = _GridIndexer(np.ogrid, "ogrid")
