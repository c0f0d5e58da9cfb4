"""The operands of a collective: values, pytrees of them, and nodes that say what a
collective makes of them.

A collective of :mod:`cuvmap.lax.parallel` takes an array (NumPy or CuPy), a Python or
NumPy scalar, a tracer, or a pytree of them, and acts on every leaf; anything else is a
:class:`TypeError` naming the leaf (JAX's "not a valid JAX type").

NOTE [nodes that rebuild themselves after a collective]
Some pytree nodes state facts about their leaves that a collective changes: a
:class:`~cuvmap.dp.ClippedGradient` states the sensitivity of a sum that is *this
member's share*; after a ``psum`` it is the sum over the members, the same on each, and
noise added to it must be one draw shared by all of them (NOTE [noise once over a
data-parallel axis] in cuvmap/dp/noise.py), where noise on a share is kept on member 0
alone. Its per-example norms are this member's and have no sum. So a class may define
``__collective__(self, op, names, apply)``: a collective ``op`` (``"psum"``, ``"pmean"``,
``"all_gather"``, ...) over the resolved axis ``names`` (None for the collectives that
are not elementwise reductions) that meets an instance in its operand calls it instead of
reducing its leaves, with ``apply(subtree)`` the collective on any part of it, and puts
what it returns in the result. (The class lives above lax; lax only calls the method.)
"""
from cuvmap import core, tree
from cuvmap.core import bfloat16


def _is_collective_value(x):
    """Whether ``x`` is a value a collective takes: a tracer, a Python scalar, or an array
    (NumPy or CuPy, or a NumPy scalar) of booleans or numbers."""
    if isinstance(x, core.Tracer) or type(x) in core._PY_SCALAR_DTYPES:
        return True
    dtype = getattr(x, "dtype", None)
    return dtype is not None and hasattr(x, "shape") and (getattr(dtype, "kind", None) in _VALUE_KINDS
                                                          or bfloat16.is_bfloat16(dtype))


_VALUE_KINDS = frozenset("biufc")


def _not_a_value(op, x, path=None):
    """The TypeError for a leaf ``x`` that is no value (JAX: "Argument 's' of type <class
    'str'> is not a valid JAX type")."""
    text = repr(x)
    text = text if len(text) <= 80 else text[:77] + "..."
    at = "" if path is None else f" (at {path})"
    kind = f" of dtype {x.dtype}" if hasattr(x, "dtype") and hasattr(x, "shape") else ""
    return TypeError(f"{op}: Argument {text} of type {type(x)}{kind}{at} is not a valid cuvmap type: a collective "
                     "takes arrays (NumPy or CuPy) of booleans or numbers, Python or NumPy scalars and tracers, "
                     "or pytrees of them")


def _rebuilds_itself(node):
    return hasattr(type(node), "__collective__")


def map_operands(fn, x, op, names=None, bucketed=None):
    """``fn`` on every leaf of ``x`` (an array or tracer itself is one leaf), ``x``'s
    structure kept; a :class:`TypeError` names the first leaf that is not a value. A node
    with ``__collective__`` answers for itself (NOTE [nodes that rebuild themselves after
    a collective]). ``bucketed(fn, leaves)``, when given, maps ``fn`` over the leaves of
    a pytree in its own way (the buckets of :mod:`cuvmap.lax.parallel`)."""
    if _is_collective_value(x):
        return fn(x)
    if _rebuilds_itself(x):
        return x.__collective__(op, names, lambda sub: map_operands(fn, sub, op, names, bucketed))
    if hasattr(x, "shape") or isinstance(x, (str, bytes)):
        raise _not_a_value(op, x)
    paths, leaves, treedef = tree.flatten_with_path(x, is_leaf=_rebuilds_itself)
    operands = []
    for k, (path, leaf) in enumerate(zip(paths, leaves)):
        if _rebuilds_itself(leaf):
            continue
        if not _is_collective_value(leaf):
            raise _not_a_value(op, leaf, "x" + tree.keystr(path) if path else None)
        operands.append(k)
    out = list(leaves)
    values = [leaves[k] for k in operands]
    mapped = bucketed(fn, values) if bucketed is not None and len(values) > 1 else [fn(v) for v in values]
    for k, v in zip(operands, mapped):
        out[k] = v
    for k, leaf in enumerate(leaves):
        if _rebuilds_itself(leaf):
            out[k] = map_operands(fn, leaf, op, names, bucketed)
    return tree.unflatten(treedef, out)
