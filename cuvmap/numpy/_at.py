"""``x.at[index]`` on traced values, and ``cuvmap.numpy.at(x)[index]`` on any array: JAX's
functional index updates (``x.at[index].set(v)``, ``.add``, ``.subtract``, ``.multiply``/``.mul``, ``.divide``,
``.power``, ``.min``, ``.max``, ``.apply``, ``.get``), each one of the scatters of
:mod:`cuvmap.lax.slicing_scatter`
(NOTE [index updates as scatters of flat positions]).
"""
import numpy as np

from cuvmap import core
from cuvmap.core import Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import shape as lax_shape
from cuvmap.lax import slicing
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._indexing import getitem

_FLAT = slicing.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0,),
                                        scatter_dims_to_operand_dims=(0,))


# NOTE [index updates as scatters of flat positions]
# ``index`` may be anything ``x[index]`` takes (ints, slices with steps, ``None``,
# ``Ellipsis``, integer arrays, traced or not). Rather than translating it into scatter
# dimension numbers, the update reads the flat positions it selects with the same
# indexing: ``positions = arange(x.size).reshape(x.shape)[index]`` (a gather of a
# constant), so the positions follow NumPy's semantics exactly, negative indices and
# bounds checks included. The update is then one scatter into ``ravel(x)`` at
# ``positions`` of ``values`` broadcast to their shape, reshaped back: under vmap and the
# derivatives it is the scatter's rules that apply. As in JAX, repeated positions
# accumulate for ``add``/``multiply``/``min``/``max`` (``set`` keeps the last in row-major
# order), and ``values`` are cast to ``x``'s dtype.


class _IndexUpdateHelper:
    """``x.at``: ``x.at[index]`` is an :class:`_IndexUpdateRef`."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def __getitem__(self, index):
        return _IndexUpdateRef(self.array, index)

    def __repr__(self):
        return f"_IndexUpdateHelper({self.array!r})"


class _IndexUpdateRef:
    """``x.at[index]``: the updates of ``x`` at ``index`` (JAX's ``_IndexUpdateRef``); each
    method returns a new array (NOTE [index updates as scatters of flat positions])."""

    __slots__ = ("array", "index")

    def __init__(self, array, index):
        self.array = array
        self.index = index

    def get(self, *, indices_are_sorted=False, unique_indices=False, mode=None, fill_value=None):
        """``x[index]`` (out-of-bounds indices raise IndexError, as ``x[index]`` does)."""
        return getitem(self.array, self.index)

    def set(self, values, *, indices_are_sorted=False, unique_indices=False, mode=None):  # noqa: A003
        """``x`` with ``x[index] = values``."""
        return _update(slicing.scatter, self.array, self.index, values, indices_are_sorted, unique_indices, mode)

    def add(self, values, *, indices_are_sorted=False, unique_indices=False, mode=None):
        """``x`` with ``x[index] += values`` (repeated indices accumulate)."""
        return _update(slicing.scatter_add, self.array, self.index, values, indices_are_sorted, unique_indices, mode)

    def subtract(self, values, *, indices_are_sorted=False, unique_indices=False, mode=None):
        """``x`` with ``x[index] -= values``."""
        return _update(slicing.scatter_add, self.array, self.index, ew.neg(_as_dtype(values, self.array)),
                       indices_are_sorted, unique_indices, mode)

    def multiply(self, values, *, indices_are_sorted=False, unique_indices=False, mode=None):
        """``x`` with ``x[index] *= values``."""
        return _update(slicing.scatter_mul, self.array, self.index, values, indices_are_sorted, unique_indices, mode)

    mul = multiply

    def divide(self, values, *, indices_are_sorted=False, unique_indices=False, mode=None):
        """``x`` with ``x[index] /= values``: ``x / ones.at[index].multiply(values)``, as JAX."""
        ones = lax_shape.broadcast_in_dim(core.full_like_concrete(self.array, 1, shape=()),
                                          core.shape_of(self.array), ())
        return ew.div(self.array, _update(slicing.scatter_mul, ones, self.index, values, indices_are_sorted,
                                          unique_indices, mode))

    def power(self, values, *, indices_are_sorted=False, unique_indices=False, mode=None):
        """``x`` with ``x[index] **= values``: ``x ** ones.at[index].multiply(values)``, as JAX."""
        ones = lax_shape.broadcast_in_dim(core.full_like_concrete(self.array, 1, shape=()),
                                          core.shape_of(self.array), ())
        return ew.pow(self.array, _update(slicing.scatter_mul, ones, self.index, values, indices_are_sorted,
                                          unique_indices, mode))

    def min(self, values, *, indices_are_sorted=False, unique_indices=False, mode=None):  # noqa: A003
        """``x`` with ``x[index] = minimum(x[index], values)``."""
        return _update(slicing.scatter_min, self.array, self.index, values, indices_are_sorted, unique_indices, mode)

    def max(self, values, *, indices_are_sorted=False, unique_indices=False, mode=None):  # noqa: A003
        """``x`` with ``x[index] = maximum(x[index], values)``."""
        return _update(slicing.scatter_max, self.array, self.index, values, indices_are_sorted, unique_indices, mode)

    def apply(self, func, *, indices_are_sorted=False, unique_indices=False, mode=None):
        """``x`` with ``func`` applied at ``index`` (once per time a position is selected)."""
        positions = _positions(self.array, self.index)
        flat = lax_shape.reshape(self.array, (int(np.prod(core.shape_of(self.array), dtype=np.int64)),))
        out = slicing.scatter_apply(flat, lax_shape.expand_dims(positions, (len(core.shape_of(positions)),)), func,
                                    _FLAT, update_shape=core.shape_of(positions),
                                    indices_are_sorted=indices_are_sorted, unique_indices=unique_indices, mode=mode)
        return lax_shape.reshape(out, core.shape_of(self.array))

    def __repr__(self):
        return f"_IndexUpdateRef({self.array!r}, {self.index!r})"


def _positions(x, index):
    """The flat positions in ``x`` that ``x[index]`` reads."""
    shape = core.shape_of(x)
    size = int(np.prod(shape, dtype=np.int64))
    ids = lax_shape.reshape(lax_indexing.iota(size, np.int64, like=x), shape)
    return getitem(ids, index)


def _as_dtype(values, x):
    dtype = core.dtype_of(x)
    if isinstance(values, Tracer) or hasattr(values, "dtype"):
        return values if core.dtype_of(values) == dtype else ew.convert_element_type(values, dtype)
    return np.asarray(values, dtype=dtype)


def _update(scatter, x, index, values, indices_are_sorted, unique_indices, mode):
    positions = _positions(x, index)
    shape = core.shape_of(x)
    values = _as_dtype(values, x)
    values = lax_shape.broadcast_to(values, core.shape_of(positions))
    flat = lax_shape.reshape(x, (int(np.prod(shape, dtype=np.int64)),))
    indices = lax_shape.expand_dims(positions, (len(core.shape_of(positions)),))
    out = scatter(flat, indices, values, _FLAT, indices_are_sorted=indices_are_sorted,
                  unique_indices=unique_indices, mode=mode)
    return lax_shape.reshape(out, shape)


Tracer.at = property(_IndexUpdateHelper)


def at(x):
    """``x.at`` for any array: ``cnp.at(x)[index].set(v)`` is JAX's ``x.at[index].set(v)``
    (also ``get``, ``add``, ``subtract``, ``multiply``/``mul``, ``divide``, ``power``,
    ``min``, ``max``, ``apply``), for the concrete NumPy and CuPy arrays that have no
    ``.at`` of their own as for traced values (which have ``x.at`` too). A cuvmap
    extension: JAX spells it ``x.at`` only. Each update returns a new array; ``x`` is
    unchanged (NOTE [index updates as scatters of flat positions])."""
    if not isinstance(x, Tracer) and not hasattr(x, "shape"):
        x = asarray(x)
    return _IndexUpdateHelper(x)
