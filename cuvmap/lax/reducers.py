"""``reduce`` with a Python reducer, as JAX's ``lax.reduce``: the reducer recognised on the
standard monoids, and any other associative, commutative reducer by a tree of its calls.

    reduce(x, init, ⊕, dims)[k] = init ⊕ x[k, j_1] ⊕ x[k, j_2] ⊕ ...        (j over the reduced dims)

``⊕`` is identified (NOTE [recognising the reducer]) as one of the monoids ``add``, ``mul``,
``max``, ``min``, ``and``, ``or``; ``add``, ``max``, ``min`` (``and``/``or`` on booleans) run
as one ``reduce_sum``/``reduce_max``/``reduce_min`` primitive, ``mul`` and every other
reducer as ``⌈log₂ n⌉`` vectorized calls of ``⊕`` on halves (NOTE [the reduction tree]).
``init`` enters once (``init ⊕ result``; skipped when it is the monoid's identity), so a
non-identity ``init`` such as ``max`` from 0 gives ``max(0, max x)``. Everything is built
from primitives, so ``grad`` (both modes), ``vmap`` and ``jit`` apply.
"""
import builtins
import operator

import numpy as np

from cuvmap import core, tree
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax.bitwise import bitwise_and, bitwise_or
from cuvmap.lax.indexing import slice_p
from cuvmap.lax.reduction import reduce_max, reduce_min, reduce_sum
from cuvmap.lax.shape import broadcast_in_dim, concatenate, reshape, squeeze, transpose

# NOTE [recognising the reducer]
# JAX recognises `lax.add`, `lax.max`, ... by identity and traces anything else into a
# generic reduction. cuvmap recognises the known functions by identity too, and any other
# callable by probing it: it is called on concrete probe arrays of the operand's dtype and
# compared, exactly, with each monoid's binary operation; the probes hold mixed signs,
# zeros and distinct magnitudes, so add, mul, max and min (and, on booleans, and/or) give
# four different answers on them. A reducer that matches none runs as a tree, which is
# only right for an associative, commutative reducer (as XLA also requires): that is
# probed too, on random probes, and a reducer that fails — `lambda a, b: a - b` — raises a
# ShapeError naming the function, instead of returning a number that depends on the order.

# NOTE [the reduction tree]
# The reduced dims are moved last and merged into one of length n; while n > 1 the first
# ⌊n/2⌋ entries are combined with the next ⌊n/2⌋ by one vectorized call of the reducer, and
# an odd last entry is carried along: ⌈log₂ n⌉ calls, O(n) work, no loop over elements.

_KNOWN = {
    ew.add: "add", operator.add: "add", ew.mul: "mul", operator.mul: "mul",
    ew.max: "max", ew.min: "min", builtins.max: "max", builtins.min: "min",
    bitwise_and: "and", operator.and_: "and", bitwise_or: "or", operator.or_: "or",
}


def monoid_binary(name):
    return {"add": ew.add, "mul": ew.mul, "max": ew.max, "min": ew.min, "and": bitwise_and, "or": bitwise_or}[name]


def _probe_pair(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array([True, True, False, False]), np.array([True, False, True, False])
    if np.issubdtype(dtype, np.unsignedinteger):
        return np.array([3, 0, 5, 7, 1, 2], dtype), np.array([1, 4, 5, 2, 0, 6], dtype)
    return np.array([3, -2, 0, 7, 1, -5], dtype), np.array([-1, 4, 5, 2, 0, -3], dtype)


def _numpy_monoid(name, a, b):
    return {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
            "and": np.bitwise_and, "or": np.bitwise_or}[name](a, b)


def identify_monoid(computation, dtype):
    """The name of the monoid ``computation`` computes on ``dtype`` (``"add"``, ``"mul"``,
    ``"max"``, ``"min"``, ``"and"``, ``"or"``) or None (NOTE [recognising the reducer]);
    on booleans add/or and mul/and are reported as ``"max"`` and ``"min"``."""
    name = _KNOWN.get(computation)
    if name is None:
        a, b = _probe_pair(dtype)
        try:
            with np.errstate(all="ignore"):
                out = np.asarray(core.as_array(computation(a, b)))
        except Exception:  # noqa: BLE001 - a reducer that probes cannot be named runs as a tree
            return None
        if out.shape != a.shape:
            return None
        candidates = ("max", "min") if np.dtype(dtype) == np.bool_ else ("add", "mul", "max", "min", "and", "or")
        for cand in candidates:
            if np.issubdtype(np.dtype(dtype), np.inexact) and cand in ("and", "or"):
                continue
            if np.array_equal(out, _numpy_monoid(cand, a, b)):
                name = cand
                break
    if name is not None and np.dtype(dtype) == np.bool_:
        name = {"add": "max", "or": "max", "mul": "min", "and": "min"}.get(name, name)
    return name


def monoid_identity(name, dtype):
    """The identity of the monoid ``name`` on ``dtype`` (−∞ / the smallest integer for max, ...)."""
    dtype = np.dtype(dtype)
    if name == "add" or name == "or":
        return np.zeros((), dtype)[()]
    if name == "mul":
        return np.ones((), dtype)[()]
    if name == "and":
        return np.invert(np.zeros((), dtype))[()]   # every bit set (unsigned: the maximum; bool: True)
    if dtype == np.bool_:
        return np.bool_(name == "min")
    if np.issubdtype(dtype, np.inexact):
        return np.array(-np.inf if name == "max" else np.inf, dtype)[()]
    info = np.iinfo(dtype)
    return np.array(info.min if name == "max" else info.max, dtype)[()]


def _random_probes(dtype, rng, size=8):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size).astype(bool)
    if np.issubdtype(dtype, np.integer):
        low = 0 if np.issubdtype(dtype, np.unsignedinteger) else -50
        return rng.permutation(np.arange(low, low + 100))[:size].astype(dtype)
    return rng.standard_normal(size).astype(dtype)


def check_associative_commutative(op, leaves_like, treedef, where):
    """Raises a ShapeError naming ``where`` unless ``op`` (on pytrees like ``treedef``)
    is associative and commutative on random probes (NOTE [recognising the reducer])."""
    rng = np.random.default_rng(0)
    a, b, c = ([_random_probes(core.dtype_of(x), rng) for x in leaves_like] for _ in range(3))

    def call(x, y):
        out = op(tree.unflatten(treedef, x), tree.unflatten(treedef, y))
        return [np.asarray(core.as_array(o)) for o in tree.leaves(out)]

    def close(xs, ys):
        for x, y in zip(xs, ys):
            if np.issubdtype(x.dtype, np.inexact):
                tol = 100 * np.finfo(x.dtype).eps
                if not np.allclose(x, y, rtol=tol, atol=tol, equal_nan=True):
                    return False
            elif not np.array_equal(x, y):
                return False
        return True

    try:
        with np.errstate(all="ignore"):
            ab = call(a, b)
            commutative = close(ab, call(b, a))
            associative = close(call(ab, c), call(a, call(b, c)))
    except Exception:  # noqa: BLE001 - a reducer that cannot be probed is taken at its word
        return
    if not (commutative and associative):
        name = getattr(op, "__name__", repr(op))
        raise ShapeError(
            f"{where}: the reducer {name} is not a monoid (add, mul, max, min, and, or) and is not "
            f"{'associative' if commutative else 'commutative'} on probe values; the reduction's order "
            "is unspecified, so it must be associative and commutative"
        )


def _slice_last(x, start, stop):
    shape = core.shape_of(x)
    slices = [(0, n, 1) for n in shape]
    slices[-1] = (start, stop, 1)
    return slice_p.bind(x, slices=tuple(slices))


def tree_reduce_last(combine, xs):
    """Reduces the last dim of every array of the list ``xs`` with the vectorized
    ``combine(list, list) -> list`` (NOTE [the reduction tree]); returns the list without
    that dim."""
    n = core.shape_of(xs[0])[-1]
    while n > 1:
        half = n // 2
        combined = combine([_slice_last(x, 0, half) for x in xs], [_slice_last(x, half, 2 * half) for x in xs])
        if n % 2:
            combined = [concatenate([c, _slice_last(x, 2 * half, n)], len(core.shape_of(x)) - 1)
                        for c, x in zip(combined, xs)]
        xs, n = combined, half + n % 2
    return [squeeze(x, (len(core.shape_of(x)) - 1,)) for x in xs]


def _move_last_and_merge(x, dims):
    shape = core.shape_of(x)
    kept = [i for i in range(len(shape)) if i not in dims]
    x = transpose(x, tuple(kept) + tuple(dims))
    n = int(np.prod([shape[d] for d in dims], dtype=np.int64))
    return reshape(x, tuple(shape[i] for i in kept) + (n,))


def fill_scalar(value, shape, like):
    """The scalar ``value`` (in ``like``'s dtype when concrete) broadcast to ``shape``."""
    if not isinstance(value, core.Tracer):
        value = np.asarray(core.as_array(value)).astype(core.dtype_of(like))
    return broadcast_in_dim(value, tuple(shape), ())



def flat_operands(name, operands, init_values, init_name, operand_name):
    """``(leaves, treedef, init_leaves, shape)`` of a variadic reduction's operands and
    init values, checked: the same pytree structure, at least one operand, one shape for
    all of them, scalar init values."""
    leaves, treedef = tree.flatten(operands)
    init_leaves, init_def = tree.flatten(init_values)
    if treedef != init_def:
        raise ShapeError(f"{name}: {init_name} {init_def} must have the structure of {operand_name} {treedef}")
    if not leaves:
        raise ShapeError(f"{name}: needs at least one operand")
    shapes = [tuple(core.shape_of(x)) for x in leaves]
    if len(set(shapes)) != 1:
        raise ShapeError(f"{name}: the operands must have one shape, got {shapes}")
    for v in init_leaves:
        if core.shape_of(v) != ():
            raise ShapeError(f"{name}: init values must be scalars, got shape {core.shape_of(v)}")
    return leaves, treedef, init_leaves, shapes[0]


def reduce(operands, init_values, computation, dimensions):  # noqa: A001 - lax vocabulary
    """JAX's ``lax.reduce(operands, init_values, computation, dimensions)`` (the module
    docstring states the math).

    Args:
      operands: an array or a pytree of arrays of one shape.
      init_values: a scalar per operand, in the pytree structure of ``operands``.
      computation: ``(acc, x) -> acc`` on pytrees like ``operands``; a monoid
        (``lax.add``, ``lax.max``, ``jnp.minimum``, ``lambda a, b: a * b``, ...) or any
        associative, commutative function of whole arrays.
      dimensions: the dims reduced away.
    Returns:
      a pytree like ``operands`` of arrays without ``dimensions``.
    """
    leaves, treedef, init_leaves, shape = flat_operands("reduce", operands, init_values, "init_values", "operands")
    ndim = len(shape)
    if any(not -ndim <= int(d) < ndim for d in dimensions):
        raise ShapeError(f"reduce: dimensions {tuple(dimensions)} are out of range for shape {shape}")
    dims = tuple(sorted(int(d) % ndim for d in dimensions))
    if len(set(dims)) != len(dims):
        raise ShapeError(f"reduce: dimensions {tuple(dimensions)} are repeated")
    if len(leaves) == 1 and treedef == tree.structure(leaves[0]):
        name = identify_monoid(computation, core.dtype_of(leaves[0]))
        if name is not None:
            return _monoid_reduce(name, leaves[0], init_leaves[0], dims)

    def combine(a, b):
        out = computation(tree.unflatten(treedef, a), tree.unflatten(treedef, b))
        out_leaves, out_def = tree.flatten(out)
        if out_def != treedef:
            raise ShapeError(f"reduce: the reducer must return the structure of operands {treedef}, got {out_def}")
        return out_leaves

    check_associative_commutative(computation, leaves, treedef, "reduce")
    kept_shape = tuple(s for i, s in enumerate(shape) if i not in dims)
    if not dims:
        out = leaves
    elif int(np.prod([shape[d] for d in dims], dtype=np.int64)) == 0:
        return tree.unflatten(treedef, [fill_scalar(v, kept_shape, x) for v, x in zip(init_leaves, leaves)])
    else:
        out = tree_reduce_last(combine, [_move_last_and_merge(x, dims) for x in leaves])
    inits = [fill_scalar(v, kept_shape, x) for v, x in zip(init_leaves, leaves)]
    out = [ew.convert_element_type(o, core.dtype_of(x)) if core.dtype_of(o) != core.dtype_of(x) else o
           for o, x in zip(combine(inits, out), leaves)]
    return tree.unflatten(treedef, out)


def is_identity(name, value, dtype):
    if isinstance(value, core.Tracer):
        return False
    v = np.asarray(core.as_array(value))
    return bool(np.array_equal(v.astype(dtype), np.asarray(monoid_identity(name, dtype))))


def _monoid_reduce(name, x, init, dims):
    dtype = core.dtype_of(x)
    shape = core.shape_of(x)
    if any(shape[d] == 0 for d in dims):
        return fill_scalar(init, tuple(s for i, s in enumerate(shape) if i not in dims), x)
    if name == "add":
        out = reduce_sum(x, dims) if dims else x
    elif name == "max":
        out = reduce_max(x, dims) if dims else x
    elif name == "min":
        out = reduce_min(x, dims) if dims else x
    else:
        out = x if not dims else tree_reduce_last(lambda a, b: [monoid_binary(name)(a[0], b[0])],
                                                  [_move_last_and_merge(x, dims)])[0]
    if not is_identity(name, init, dtype):
        out = monoid_binary(name)(fill_scalar(init, core.shape_of(out), x), out)
    if core.dtype_of(out) != dtype:
        out = ew.convert_element_type(out, dtype)
    return out
