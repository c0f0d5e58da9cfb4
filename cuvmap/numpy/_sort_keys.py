"""Sorting by several keys, as ``jax.numpy`` names it: ``lexsort`` (the permutation that
sorts by a sequence of keys, the last one primary) and ``sort_complex`` (by real part,
then imaginary part). Both are the stable sorts of :mod:`cuvmap.lax.sorting`."""
import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError
from cuvmap.lax import sorting as lax_sorting
from cuvmap.numpy._common import _axis, ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._shapes import ravel


def lexsort(keys, axis=-1):
    """``jnp.lexsort``: the int64 indices that sort along ``axis`` by the keys ``keys[-1]``
    (primary), then ``keys[-2]``, ... (ties of all keys keep their order): ``keys`` is a
    sequence of arrays of one shape or an array whose first dim enumerates the keys."""
    if isinstance(keys, (tuple, list)):
        keys = [asarray(k) for k in keys]
    else:
        keys = asarray(keys)
        if ndim(keys) == 0:
            raise ShapeError("lexsort: keys must be a sequence of arrays or an array of at least 1 dim, got a scalar")
        keys = [keys[i] for i in range(shape(keys)[0])]
    if not keys:
        raise ShapeError("lexsort: needs at least one key")
    shapes = {tuple(shape(k)) for k in keys}
    if len(shapes) != 1:
        raise ShapeError(f"lexsort: all keys must have one shape, got {sorted(shapes)}")
    if ndim(keys[0]) == 0:
        raise ShapeError("lexsort: the keys must have at least 1 dim")
    axis = _axis(keys[0], axis, "lexsort")
    return lax_sorting.lexsort_permutation(tuple(reversed(keys)), axis)


def sort_complex(a):
    """``jnp.sort_complex``: ``a`` sorted along its last axis by real part, then imaginary
    part, as a complex array (complex64 for float32 and narrower floats, else complex128);
    the derivative follows the sorting permutation."""
    a = asarray(a)
    dt = np.dtype(core.dtype_of(a))
    if dt.kind != "c":
        a = astype(a, np.complex64 if dt.kind == "f" and dt.itemsize <= 4 else np.complex128)
    if ndim(a) == 0:
        return a
    return lax_sorting.sort(a, -1)
