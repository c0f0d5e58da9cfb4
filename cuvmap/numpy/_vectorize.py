"""``jnp.vectorize`` and ``jnp.apply_along_axis``: NumPy's loops over array elements as
``vmap`` (one batched call, no Python loop over the elements).

``vectorize(f, signature="(m,n),(n)->(m)")`` broadcasts the loop dims (those before each
argument's core dims) of its arguments and maps ``f`` over each of them with nested
``vmap``\\ s; without a signature every dim is a loop dim. ``apply_along_axis`` maps a
function of 1-D slices over every other dim."""
import functools
import re

import numpy as np

from cuvmap import api
from cuvmap.core import ShapeError
from cuvmap.numpy._common import _axis, ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._shapes import broadcast_to, moveaxis

_DIMS = r"\((?:\w+(?:,\s*\w+)*)?\)"
_SIGNATURE = re.compile(rf"^\s*{_DIMS}(?:\s*,\s*{_DIMS})*\s*->\s*{_DIMS}(?:\s*,\s*{_DIMS})*\s*$")


def _parse_signature(signature):
    """``"(m,n),(n)->(m)"`` as ``([("m", "n"), ("n",)], [("m",)])``; a single output
    without parentheses around the list is one output."""
    if not _SIGNATURE.match(signature):
        raise ValueError(f"vectorize: not a valid gufunc signature: {signature!r}")
    ins, outs = signature.split("->")
    parse = lambda side: [tuple(d.strip() for d in g.split(",") if d.strip())   # noqa: E731
                          for g in re.findall(r"\(([^)]*)\)", side)]
    return parse(ins), parse(outs)


def vectorize(pyfunc, *, excluded=frozenset(), signature=None):
    """``jnp.vectorize``: ``pyfunc`` of single elements (or, with a gufunc ``signature``
    such as ``"(n),(n)->()"``, of core sub-arrays) applied over the broadcast loop dims of
    its arguments, by ``vmap`` (JAX's implementation strategy). ``excluded`` holds the
    positions (ints) or names (strings) of arguments passed through unchanged; other
    keyword arguments are passed through unchanged too."""
    excluded = frozenset(excluded)
    if any(not isinstance(e, (int, str)) for e in excluded):
        raise TypeError(f"vectorize: excluded must hold ints and strings, got {set(excluded)}")
    in_core, out_core = _parse_signature(signature) if signature is not None else (None, None)

    @functools.wraps(pyfunc)
    def wrapped(*args, **kwargs):
        mapped = [i for i in range(len(args)) if i not in excluded]
        values = [asarray(args[i]) for i in mapped]
        cores = [()] * len(values) if in_core is None else in_core
        if len(cores) != len(values):
            raise ValueError(f"vectorize: the signature {signature!r} has {len(cores)} inputs, got {len(values)} "
                             "vectorized arguments")
        sizes = {}
        loops = []
        for v, core_dims in zip(values, cores):
            k = len(core_dims)
            if ndim(v) < k:
                raise ValueError(f"vectorize: an input of shape {shape(v)} has fewer dims than its core dims "
                                 f"{core_dims} of the signature {signature!r}")
            for name, n in zip(core_dims, shape(v)[ndim(v) - k:]):
                if sizes.setdefault(name, n) != n:
                    raise ValueError(f"vectorize: core dim {name!r} has sizes {sizes[name]} and {n}")
            loops.append(shape(v)[:ndim(v) - k])
        try:
            loop = tuple(np.broadcast_shapes(*loops)) if loops else ()
        except ValueError:
            raise ShapeError(f"vectorize: the loop dims {loops} do not broadcast") from None
        values = [broadcast_to(v, loop + shape(v)[ndim(v) - len(c):]) for v, c in zip(values, cores)]

        def call(*vs):
            full = list(args)
            for i, v in zip(mapped, vs):
                full[i] = v
            out = pyfunc(*full, **kwargs)
            if out_core is not None:
                _check_outputs(out, out_core, sizes, signature)
            return out

        f = call
        for _ in loop:
            f = api.vmap(f)
        return f(*values)

    return wrapped


def _check_outputs(out, out_core, sizes, signature):
    outs = out if isinstance(out, tuple) and len(out_core) != 1 else (out,)
    if len(outs) != len(out_core):
        raise ValueError(f"vectorize: the signature {signature!r} has {len(out_core)} outputs, the function "
                         f"returned {len(outs)}")
    for o, core_dims in zip(outs, out_core):
        if ndim(o) != len(core_dims):
            raise ValueError(f"vectorize: an output of shape {shape(o)} does not have the core dims {core_dims} of "
                             f"the signature {signature!r}")


def apply_along_axis(func1d, axis, arr, *args, **kwargs):
    """``jnp.apply_along_axis``: ``func1d(arr[i, ..., :, ..., j], *args, **kwargs)`` for
    every 1-D slice along ``axis``, by ``vmap`` over the other dims; the dims of
    ``func1d``'s result take the place of ``axis`` (NumPy's layout)."""
    arr = asarray(arr)
    axis = _axis(arr, axis, "apply_along_axis")

    def one(x):
        return asarray(func1d(x, *args, **kwargs))

    f = one
    for _ in range(ndim(arr) - 1):
        f = api.vmap(f)
    out = f(moveaxis(arr, axis, -1))
    k = ndim(out) - (ndim(arr) - 1)
    return moveaxis(out, tuple(range(ndim(out) - k, ndim(out))), tuple(range(axis, axis + k))) if k else out
