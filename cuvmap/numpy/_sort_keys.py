"""Sorting by several keys, as ``jax.numpy`` names it: ``lexsort`` (the permutation that
sorts by a sequence of keys, the last one primary) and ``sort_complex`` (by real part,
then imaginary part), and ``top_k`` (the k largest or smallest entries and their
indices). All are the stable sorts of :mod:`cuvmap.lax.sorting`."""
import numpy as np

from cuvmap import core
from cuvmap.core import ShapeError
from cuvmap.lax import sorting as lax_sorting
from cuvmap.lax.bitwise import bitwise_not
from cuvmap.lax.elementwise import neg
from cuvmap.numpy._common import _axis, ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._shapes import ravel
from cuvmap.core.bfloat16 import kind_of


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
    if kind_of(dt) != "c":
        a = astype(a, np.complex64 if kind_of(dt) == "f" and dt.itemsize <= 4 else np.complex128)
    if ndim(a) == 0:
        return a
    return lax_sorting.sort(a, -1)


def top_k(a, k, /, *, axis=-1, mode="largest", sorted=True):  # noqa: A002 - JAX's name
    """``jnp.top_k``: the ``k`` largest (``mode="largest"``) or smallest
    (``mode="smallest"``) entries of ``a`` along ``axis`` and their int32 indices, in
    order (largest first, or smallest first), ties by ascending index. ``sorted=False``
    allows any order; cuvmap's are always sorted. The smallest entries are the largest of
    an order-reversing map: ``−a`` for floats, ``~a`` for integers and booleans (exact,
    no overflow), mapped back. Derivatives flow through the values' gather
    (:func:`cuvmap.lax.top_k`), none through the indices."""
    del sorted  # always sorted
    a = asarray(a)
    dt = np.dtype(core.dtype_of(a))
    if kind_of(dt) == "c":
        raise ValueError("top_k is not compatible with complex inputs.")
    if mode not in ("largest", "smallest"):
        raise ValueError(f"mode must be 'largest' or 'smallest', got {mode!r}")
    if ndim(a) == 0:
        raise ShapeError("top_k: a must have at least one dim, got a scalar")
    axis = _axis(a, axis, "top_k")
    if mode == "largest":
        return lax_sorting.top_k(a, k, axis=axis)
    flip = bitwise_not if kind_of(dt) in "biu" else neg
    values, indices = lax_sorting.top_k(flip(a), k, axis=axis)
    return flip(values), indices
