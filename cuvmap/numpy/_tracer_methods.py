"""The array methods of ``jax.Array`` that tracers lacked: ``flatten``, ``item``,
``tolist``, ``copy``, ``repeat``, ``nonzero``, ``searchsorted``, ``sort``, ``take``,
``compress``, ``ptp``, ``put`` refused (immutable), ``itemsize`` and ``nbytes``; importing
this module attaches them to :class:`cuvmap.core.Tracer` (``import cuvmap.numpy`` does).
``item`` and ``tolist`` need a concrete value, so on a tracer they raise the
transform's concretization error, as JAX's do."""
import numpy as np

from cuvmap.core import Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.numpy._indexing import take
from cuvmap.numpy._reductions import max, min, sort
from cuvmap.numpy._searching import compress, nonzero, searchsorted
from cuvmap.numpy._shapes import ravel
from cuvmap.numpy._stacking import repeat


def _flatten(self, order="C"):
    if order not in ("C", "K", "A"):
        raise NotImplementedError(f"flatten: order={order!r} is not supported (only row-major)")
    return ravel(self)


def _item(self, *args):
    raise self._concretization_error("item()")


def _tolist(self):
    raise self._concretization_error("The tolist() method was called on traced array: tolist()")


def _sort(self, axis=-1, *, kind=None, order=None, stable=True, descending=False):
    # jax.Array.sort returns the sorted array (NumPy's sorts in place)
    return sort(self, axis, kind=kind, order=order, stable=stable, descending=descending)


def _ptp(self, axis=None, out=None, keepdims=False):
    return ew.sub(max(self, axis, keepdims=keepdims), min(self, axis, keepdims=keepdims))


def _put(self, *args, **kwargs):
    raise TypeError("traced values are immutable: put is not supported; use cuvmap.numpy.put_along_axis(..., inplace=False)")


_TRACER_METHODS = {
    "flatten": _flatten,
    "item": _item,
    "tolist": _tolist,
    "copy": lambda self: self,
    "repeat": lambda self, repeats, axis=None, *, total_repeat_length=None: repeat(
        self, repeats, axis, total_repeat_length=total_repeat_length),
    "nonzero": lambda self, *, size=None, fill_value=None: nonzero(self, size=size, fill_value=fill_value),
    "searchsorted": lambda self, v, side="left", sorter=None, *, method="scan": searchsorted(
        self, v, side, sorter, method=method),
    "sort": _sort,
    "take": lambda self, indices, axis=None, out=None, mode=None, unique_indices=False, indices_are_sorted=False,
    fill_value=None: take(self, indices, axis, out, mode, unique_indices, indices_are_sorted, fill_value),
    "compress": lambda self, condition, axis=None, *, size=None, fill_value=0: compress(
        condition, self, axis, size=size, fill_value=fill_value),
    "ptp": _ptp,
    "put": _put,
}
for _name, _fn in _TRACER_METHODS.items():
    if not hasattr(Tracer, _name):
        setattr(Tracer, _name, _fn)
Tracer.itemsize = property(lambda self: np.dtype(self.dtype).itemsize)
Tracer.nbytes = property(lambda self: np.dtype(self.dtype).itemsize * int(np.prod(self.shape, dtype=np.int64)))
