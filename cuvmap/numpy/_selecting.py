"""Choosing entries among several arrays and partial sorts, as ``jax.numpy`` names them:
``select``, ``choose``, ``piecewise``, ``partition`` and ``argpartition``. Each is a
composite of ``select_n``, ``take_along_axis``, ``sort`` and ``argsort`` (the primitives
of :mod:`cuvmap.lax`), so it differentiates, batches and stages as those do."""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import ConcretizationError, ShapeError, Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import shape as lax_shape
from cuvmap.numpy._common import _axis, ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._reductions import argsort, sort
from cuvmap.numpy._indexing import take_along_axis
from cuvmap.numpy._shapes import broadcast_arrays
from cuvmap.core.bfloat16 import kind_of


def _operand(x):
    return x if isinstance(x, Tracer) else asarray(x)


def _as_bool(x):
    return x if core.dtype_of(x) == np.bool_ else ew.ne(x, 0)


def _promoted(xs):
    """The operands in their common dtype (Python scalars weakly, as NumPy's NEP 50)."""
    dtype = np.result_type(*(x if isinstance(x, (bool, int, float, complex)) else core.dtype_of(_operand(x))
                             for x in xs))
    return [astype(_operand(x), dtype) for x in xs]


def _case_index(conditions, last_wins):
    """For each position, the 1-based index of the condition that holds there (the first
    that holds, or the last with ``last_wins``), 0 where none holds: the ``which`` operand of
    ``select_n`` over ``(default, case_1, ..., case_n)``."""
    which = 0
    order = range(len(conditions)) if last_wins else reversed(range(len(conditions)))
    for i in order:
        which = ew.select(conditions[i], np.int32(i + 1), which)
    return which


def select(condlist, choicelist, default=0):
    """``jnp.select``: at each position, the entry of ``choicelist[i]`` for the first ``i``
    whose ``condlist[i]`` holds there, else ``default`` (everything broadcasts; the choices
    and the default promote to one dtype). One ``select_n``: differentiable in the
    choices and the default, each receiving the cotangent where it was chosen."""
    condlist, choicelist = list(condlist), list(choicelist)
    if len(condlist) != len(choicelist):
        raise ValueError(f"select: condlist and choicelist must have the same length, got {len(condlist)} and "
                         f"{len(choicelist)}")
    if not condlist:
        raise ValueError("select: condlist must be non-empty")
    conditions = [_as_bool(_operand(c)) for c in condlist]
    cases = _promoted([default] + choicelist)
    which = _case_index(conditions, last_wins=False)
    parts = broadcast_arrays(asarray(which) if not isinstance(which, Tracer) else which, *conditions, *cases)
    return ew.select_n(parts[0], *parts[1 + len(conditions):])


def choose(a, choices, out=None, mode="raise"):
    """``jnp.choose``: ``choices[a[i]][i]`` at each position ``i`` (``a`` and the choices
    broadcast). ``mode``: ``'raise'`` (``a`` must be concrete with entries in
    ``[0, n)``; under a transform it raises :class:`ConcretizationError`, as JAX's),
    ``'wrap'`` (``a mod n``) or ``'clip'`` (to ``[0, n - 1]``). A gather along the stacked
    choices: differentiable in ``choices``."""
    if out is not None:
        raise NotImplementedError("choose: out= is not supported (cuvmap arrays are immutable)")
    a = _operand(a)
    if kind_of(core.dtype_of(a)) not in "iu":
        raise TypeError(f"choose: a must be an integer array, got dtype {core.dtype_of(a)}")
    if isinstance(choices, Tracer) or hasattr(choices, "shape"):
        choices = [choices[i] for i in range(shape(choices)[0])]
    choices = _promoted(list(choices))
    n = len(choices)
    if n == 0:
        raise ValueError("choose: choices must be non-empty")
    if mode == "raise":
        if isinstance(a, Tracer):
            raise ConcretizationError("choose: mode='raise' checks the values of a, which must be concrete; "
                                      "use mode='wrap' or mode='clip' under a transform")
        host = a.get() if backend.is_cupy_array(a) else np.asarray(a)
        if ((host < 0) | (host >= n)).any():
            raise ValueError(f"invalid entry in choice array (choose: the entries of a must be in [0, {n}), as "
                             "mode='raise' requires)")
    elif mode == "wrap":
        a = ew.remainder(a, n)
    elif mode == "clip":
        a = ew.max(ew.min(a, n - 1), 0)
    else:
        raise ValueError(f"choose: mode={mode!r} is not one of 'raise', 'wrap', 'clip'")
    a, *choices = broadcast_arrays(a, *choices)
    stacked = lax_shape.concatenate([lax_shape.expand_dims(c, (0,)) for c in choices], 0)
    index = lax_shape.expand_dims(astype(a, np.int64), (0,))
    return lax_shape.squeeze(take_along_axis(stacked, index, 0), (0,))


def piecewise(x, condlist, funclist, *args, **kw):
    """``jnp.piecewise``: at each position, ``funclist[i]`` of ``x`` for the last ``i``
    whose ``condlist[i]`` holds there (NumPy's rule), else the extra last entry of
    ``funclist`` (one more function than conditions) or 0. An entry of ``funclist`` is a
    function (called as ``f(x, *args, **kw)`` on the whole ``x``, its result cast to
    ``x``'s dtype) or a constant. Every function runs on every entry (as under JAX's
    ``vmap`` of ``switch``) and one ``select_n`` keeps the chosen results: the derivative
    of each entry is that of its chosen function."""
    x = _operand(x)
    if isinstance(condlist, (bool, np.bool_)) or (
            not isinstance(condlist, (list, tuple)) and ndim(_operand(condlist)) == ndim(x) and ndim(x) > 0):
        condlist = [condlist]  # one condition given on its own
    if isinstance(condlist, (list, tuple)):
        conditions = [_as_bool(_operand(c)) for c in condlist]
    else:
        stacked = _operand(condlist)
        conditions = [_as_bool(stacked[i]) for i in range(shape(stacked)[0])]
    funclist = list(funclist)
    nc, nf = len(conditions), len(funclist)
    if nf == nc + 1:
        funclist = funclist[-1:] + funclist[:-1]
    elif nf == nc:
        funclist = [0] + funclist
    else:
        raise ValueError(f"piecewise: with {nc} condition(s), either {nc} or {nc + 1} functions are expected; "
                         f"got {nf}")
    dtype = core.dtype_of(x)

    def evaluate(f):
        value = f(x, *args, **kw) if callable(f) else f
        return astype(_operand(value), dtype)

    cases = [evaluate(f) for f in funclist]
    which = _case_index(conditions, last_wins=True)
    parts = broadcast_arrays(asarray(which) if not isinstance(which, Tracer) else which, x, *conditions, *cases)
    return ew.select_n(parts[0], *parts[2 + nc:])


def _kth(a, kth, axis, name):
    if isinstance(kth, Tracer):
        raise ConcretizationError(f"{name}: kth must be static (ints), got a traced value")
    n = shape(a)[axis]
    for k in np.atleast_1d(kth).tolist():
        if not -n <= int(k) < n:
            raise ShapeError(f"{name}: kth={k} is out of bounds for axis {axis} of size {n} (shape {shape(a)})")


def _partition_operand(a, kth, axis, name):
    """``a`` as an array and ``axis`` normalised, after JAX's refusals: no complex arrays,
    at least 1 dim, ``kth`` an index into the axis."""
    a = _operand(a)
    if kind_of(core.dtype_of(a)) == "c":
        raise NotImplementedError(f"{name}: complex arrays are not supported (as in JAX)")
    if ndim(a) == 0:
        raise ShapeError(f"{name}: the array must have at least 1 dim, got a 0-d array")
    axis = _axis(a, axis, name)
    _kth(a, kth, axis, name)
    return a, axis


def partition(a, kth, axis=-1):
    """``jnp.partition``: a copy of ``a`` in which, along ``axis``, the entry at ``kth``
    (an int, or NumPy's sequence of ints; negatives count from the end) is the one a sort
    would put there, with no larger entry before it and no smaller one after it. cuvmap
    sorts the whole axis (a valid partition for every ``kth``; NaNs last, as in NumPy);
    the order within each side is unspecified in NumPy and JAX alike. Differentiable as
    ``sort``."""
    a, axis = _partition_operand(a, kth, axis, "partition")
    return sort(a, axis)


def argpartition(a, kth, axis=-1):
    """``jnp.argpartition``: the indices that :func:`partition` ``a`` along ``axis``
    (``take_along_axis(a, argpartition(a, kth, axis), axis)`` is a partition at ``kth``);
    cuvmap returns the stable ``argsort`` along ``axis``, a valid answer for every
    ``kth``."""
    a, axis = _partition_operand(a, kth, axis, "argpartition")
    return argsort(a, axis)

