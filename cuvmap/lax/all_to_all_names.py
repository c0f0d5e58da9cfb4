"""``all_to_all`` over several named axes (``lax.all_to_all(x, ("i", "j"), ...)``): their
members taken together, ``i``-major, as JAX orders them (``axis_index(("i", "j")) =
i·n_j + j``), composed of one single-name ``all_to_all`` per name (NOTE [all_to_all over
several names]). :func:`cuvmap.lax.parallel.all_to_all` calls it, passing itself.
"""
import math

from cuvmap import core, tree
from cuvmap.core import ShapeError
from cuvmap.lax import shape as lax_shape
from cuvmap.lax.process_axes import axis_size

# NOTE [all_to_all over several names]
# Over names (i, j) with sizes (n_i, n_j), member m = (i, j) of the N = n_i·n_j members
# gets from every member c = (c_i, c_j) the slice m of c's split axis, stacked along a new
# axis at concat_axis indexed by c: y_m[c] = x_c[m]. Split the split axis into (n_i, n_j)
# (a_i, a_j). An all_to_all over i alone, splitting a_i into a new leading axis c_i, gives
# z_(i,j)[c_i] = x_(c_i, j)[a_i = i]; one over j then, splitting a_j into a leading c_j,
# gives y_(i,j)[c_j][c_i] = z_(i,c_j)[c_i][a_j = j] = x_(c_i,c_j)[i, j]: the exchange over
# (i, j). Moving c_i, c_j (i-major) to concat_axis and merging them gives the result; more
# names go the same way, one exchange each, and no member holds more than its own data. A
# tiled all_to_all cuts the split axis into N blocks first and merges the new axis into the
# existing concat_axis after.


def all_to_all_over_names(single, x, names, split_axis, concat_axis, tiled):
    """``all_to_all(x, names, split_axis, concat_axis, tiled=tiled)`` for several (resolved)
    names, as ``single`` (the one-name all_to_all) exchanges composed (NOTE [all_to_all
    over several names])."""
    sizes = [axis_size(n) for n in names]
    total = math.prod(sizes)

    def one(leaf):
        shape = tuple(core.shape_of(leaf))
        rank = len(shape)
        s = split_axis + rank if -rank <= split_axis < 0 else split_axis
        c = concat_axis + rank if -rank <= concat_axis < 0 else concat_axis
        if not (0 <= s < rank and 0 <= c < rank):
            raise ShapeError(f"all_to_all: split_axis {split_axis} or concat_axis {concat_axis} out of range for "
                             f"shape {shape}")
        if (shape[s] % total if tiled else shape[s] != total):
            raise ShapeError(f"all_to_all: split_axis {s} of the operand (shape {shape}) must "
                             f"{'be a multiple of' if tiled else 'equal'} the number of members {total} of {names!r}")
        if tiled:  # blocks: (N, b) at s; exchange the N axis into a new axis before concat_axis, then merge
            blocked = lax_shape.reshape(leaf, shape[:s] + (total, shape[s] // total) + shape[s + 1:])
            y = _untiled(single, blocked, names, sizes, s, c)
            out = tuple(core.shape_of(y))
            return lax_shape.reshape(y, out[:c] + (out[c] * out[c + 1],) + out[c + 2:])
        return _untiled(single, leaf, names, sizes, s, c)

    return tree.map_preserving(lambda leaf: one(leaf) if core.is_value(leaf) else leaf, x)


def _untiled(single, leaf, names, sizes, s, c):
    shape = tuple(core.shape_of(leaf))
    x = lax_shape.reshape(leaf, shape[:s] + tuple(sizes) + shape[s + 1:])
    labels = [("rest", d) for d in range(s)] + [("a", t) for t in range(len(names))] + \
             [("rest", d) for d in range(s + 1, len(shape))]
    for t, name in enumerate(names):
        pos = labels.index(("a", t))
        x = single(x, name, pos, 0)
        del labels[pos]
        labels.insert(0, ("c", t))
    rest = [lb for lb in labels if lb[0] == "rest"]
    order = rest[:c] + [("c", t) for t in range(len(names))] + rest[c:]
    x = lax_shape.transpose(x, tuple(labels.index(lb) for lb in order))
    out = tuple(core.shape_of(x))
    k = len(names)
    return lax_shape.reshape(x, out[:c] + (math.prod(out[c:c + k]),) + out[c + k:])

