"""``associative_scan``: the inclusive prefix scan of a pytree of arrays under an
associative operator, by the parallel (odd/even) algorithm — JAX's ``lax.associative_scan``.

For ``fn`` associative, ``elems`` a pytree of arrays of one size ``n`` along ``axis``::

    out[..., i, ...] = fn(... fn(fn(x_0, x_1), x_2) ..., x_i)          (reverse: x_i ∘ ... ∘ x_{n−1})

``fn(a, b)`` is called on whole slices (pytrees of arrays whose entries along ``axis`` are
combined elementwise), so it must be vectorized, as JAX requires. The algorithm
(Blelloch's, as in JAX; NOTE [the odd/even prefix scan]) calls ``fn`` ``O(log n)`` times
on arrays of total size ``O(n)``: no loop over elements. It is built from ``slice``,
``concatenate``, ``reshape`` and whatever primitives ``fn`` binds, so ``grad`` (both
modes), ``vmap`` and ``jit`` apply with no rule of its own.
"""
import builtins

from cuvmap import core, tree
from cuvmap.core import ShapeError
from cuvmap.lax.indexing import normalize_slice, slice_p
from cuvmap.lax.shape import concatenate, expand_dims, pad_p, reshape

# NOTE [the odd/even prefix scan]
# With x of length n: combine neighbouring pairs, r_j = fn(x_{2j}, x_{2j+1}), and scan r
# recursively: its prefixes are the prefixes of x at the odd positions 1, 3, 5, ....
# The prefix at an even position 2j > 0 is fn(prefix_{2j−1}, x_{2j}); position 0 is x_0.
# Interleaving the even and odd results gives the scan. Depth 2·⌈log₂ n⌉ calls of fn,
# each on half the previous length: O(n) work.


def _slice(x, start, stop, step, axis):
    shape = core.shape_of(x)
    slices = [(0, n, 1) for n in shape]
    slices[axis] = normalize_slice(builtins.slice(start, stop, step), shape[axis])
    return slice_p.bind(x, slices=tuple(slices))


def _interleave(evens, odds, axis):
    """``out[2j] = evens[j]``, ``out[2j + 1] = odds[j]`` along ``axis``; ``evens`` has as
    many entries as ``odds`` or one more."""
    shape = core.shape_of(evens)
    n_even, n_odd = shape[axis], core.shape_of(odds)[axis]
    if n_even == n_odd + 1:
        pads = [(0, 0)] * len(shape)
        pads[axis] = (0, 1)
        odds = pad_p.bind(odds, pads=tuple(pads), value=0)
    pair = concatenate([expand_dims(evens, (axis + 1,)), expand_dims(odds, (axis + 1,))], axis + 1)
    flat = reshape(pair, shape[:axis] + (2 * n_even,) + shape[axis + 1:])
    return _slice(flat, 0, n_even + n_odd, 1, axis)


def associative_scan(fn, elems, reverse=False, axis=0):
    """JAX's ``lax.associative_scan(fn, elems, reverse=False, axis=0)``: the inclusive
    scan of the pytree ``elems`` under the associative ``fn`` (module docstring); returns a
    pytree like ``elems``. ``reverse`` scans from the end (``out[i]`` combines
    ``x_i, ..., x_{n−1}``)."""
    if not callable(fn):
        raise TypeError(f"lax.associative_scan: fn argument should be callable, got {fn!r}")
    leaves, treedef = tree.flatten(elems)
    if not leaves:
        raise ShapeError("associative_scan: elems has no arrays")
    shapes = [tuple(core.shape_of(x)) for x in leaves]
    ndim = len(shapes[0])
    if not -ndim <= int(axis) < ndim:
        raise ShapeError(f"associative_scan: axis {axis} is out of range for elems of shape {shapes[0]}")
    axis = int(axis) % ndim
    sizes = {s[axis] if len(s) > axis else None for s in shapes}
    if len(sizes) != 1:
        raise ShapeError(f"associative_scan: every leaf of elems needs one size along axis {axis}, got shapes {shapes}")

    def combine(a, b):
        out = fn(tree.unflatten(treedef, a), tree.unflatten(treedef, b))
        out_leaves, out_def = tree.flatten(out)
        if out_def != treedef:
            raise ShapeError(
                f"associative_scan: fn must return the structure of elems {treedef}, returned {out_def}"
            )
        for o, x in zip(out_leaves, a):
            if tuple(core.shape_of(o)) != tuple(core.shape_of(x)):
                raise ShapeError(
                    f"associative_scan: fn must be elementwise; it returned shape {tuple(core.shape_of(o))} "
                    f"for operands of shape {tuple(core.shape_of(x))}"
                )
        return out_leaves

    def scan(xs):
        n = core.shape_of(xs[0])[axis]
        if n < 2:
            return xs
        odds = scan(combine([_slice(x, 0, n - 1, 2, axis) for x in xs], [_slice(x, 1, None, 2, axis) for x in xs]))
        if n % 2 == 0:
            evens = combine([_slice(o, 0, n // 2 - 1, 1, axis) for o in odds], [_slice(x, 2, None, 2, axis) for x in xs])
        else:
            evens = combine(odds, [_slice(x, 2, None, 2, axis) for x in xs])
        evens = [concatenate([_slice(x, 0, 1, 1, axis), e], axis) for x, e in zip(xs, evens)]
        return [_interleave(e, o, axis) for e, o in zip(evens, odds)]

    if reverse:
        leaves = [_slice(x, None, None, -1, axis) for x in leaves]
    out = scan(list(leaves))
    if reverse:
        out = [_slice(x, None, None, -1, axis) for x in out]
    return tree.unflatten(treedef, out)
