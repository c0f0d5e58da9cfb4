"""Pytree utilities: thin wrappers over optree with cuvmap's conventions.

A pytree is a nested structure of tuples, lists, dicts, namedtuples, None and classes
registered with :func:`register_pytree_node`; its leaves are arrays, tracers and scalars.
``None`` is an empty subtree (it has no leaves), as in JAX.

The functions have ``jax.tree``'s names and semantics (``flatten``, ``unflatten``,
``leaves``, ``structure``, ``map``, ``map_with_path``, ``leaves_with_path``, ``reduce``,
``all``, ``transpose``), with one difference: a *path* is a tuple of the raw keys on the
way to a leaf — dict keys, sequence (and namedtuple) indices — as optree gives them, where
JAX wraps them in ``DictKey``/``SequenceKey``/``GetAttrKey`` objects; :func:`keystr`
formats one (``['w1'][0]``). JAX's ``ravel_pytree`` is
:func:`cuvmap.flatten_util.ravel_pytree` (it needs primitives, which this module is below).
"""
import builtins
import dataclasses
import functools
import threading

import optree

NAMESPACE = "cuvmap"

PyTreeSpec = optree.PyTreeSpec


# NOTE [nodes whose meaning a mapped function changes]
# Most containers are just containers: tree.map(f, t) rebuilds each node around f's
# results. A few carry facts about their leaves' values — a ClippedGradient states the L2
# sensitivity of its sum (NOTE [sensitivity as data] in cuvmap/dp/clipping.py) — and a
# user function mapped over the leaves (2 * x) makes the fact false. Such a class is
# registered with mapped=: what map and map_with_path build from its mapped children
# instead (the plain sum, which states nothing). The transforms rebuild it unchanged (jit,
# vmap and grad flatten and unflatten; the functions that move or unwrap values without
# changing them use map_preserving). And map names such a node, with the hint it was
# registered with, when a structure mismatch involves one (the parameters mapped together
# with a ClippedGradient: "use .summed").
_mapping = threading.local()   # .on: the unflatten of map's result is in progress
_HINTS = {}                    # class -> the hint for a structure mismatch


def _unflatten_mapped(treedef, leaves):
    _mapping.on = True
    try:
        return treedef.unflatten(leaves)
    finally:
        _mapping.on = False


def flatten(tree, is_leaf=None):
    """Returns ``(leaves, treedef)``; ``unflatten(treedef, leaves)`` rebuilds the tree."""
    return optree.tree_flatten(tree, is_leaf=is_leaf, namespace=NAMESPACE)


def unflatten(treedef, leaves):
    return optree.tree_unflatten(treedef, leaves)


def leaves(tree, is_leaf=None):
    return optree.tree_leaves(tree, is_leaf=is_leaf, namespace=NAMESPACE)


def structure(tree, is_leaf=None):
    """The tree's structure (a ``PyTreeSpec``, JAX's ``PyTreeDef``), leaves left out."""
    return optree.tree_structure(tree, is_leaf=is_leaf, namespace=NAMESPACE)


def map(f, tree, *rest, is_leaf=None):  # noqa: A001 - mirrors jax.tree.map
    """Applies ``f`` leafwise to ``tree`` and the trees in ``rest`` (same structure). A
    node registered with ``mapped=`` is rebuilt by that function (NOTE [nodes whose
    meaning a mapped function changes])."""
    leaves_, treedef = optree.tree_flatten(tree, is_leaf=is_leaf, namespace=NAMESPACE)
    flat = [leaves_] + [_flatten_up_to(treedef, r, (tree,) + rest) for r in rest]
    return _unflatten_mapped(treedef, [f(*xs) for xs in zip(*flat)])


def map_preserving(f, tree, *rest, is_leaf=None):
    """:func:`map` for a function that keeps what each leaf means (a transfer between
    devices, unwrapping a tracer's primal, ``stop_gradient``): every node, a ``mapped=``
    one too, is rebuilt as it was (NOTE [nodes whose meaning a mapped function changes])."""
    return optree.tree_map(f, tree, *rest, is_leaf=is_leaf, namespace=NAMESPACE)


def _flatten_up_to(treedef, other, trees):
    try:
        return treedef.flatten_up_to(other)
    except (ValueError, TypeError) as err:
        for k, t in enumerate(trees):
            for cls, hint in _HINTS.items():
                if any(isinstance(node, cls) for node in optree.tree_leaves(
                        t, is_leaf=lambda n, cls=cls: isinstance(n, cls), namespace=NAMESPACE)):
                    which = "the first tree" if k == 0 else f"tree {k + 1}"
                    raise ValueError(f"tree.map: {which} holds a {cls.__name__} where the others hold another "
                                     f"structure: {hint} ({err})") from None
        raise ValueError(f"tree.map: pytree structure error: the trees after the first must have its structure "
                         f"{treedef} (or one that it is a prefix of): {err}") from None


def flatten_with_path(tree, is_leaf=None):
    """Returns ``(paths, leaves, treedef)``; each path is a tuple of keys/indices (optree's
    order of results; :func:`leaves_with_path` gives ``(path, leaf)`` pairs)."""
    return optree.tree_flatten_with_path(tree, is_leaf=is_leaf, namespace=NAMESPACE)


def leaves_with_path(tree, is_leaf=None):
    """The ``(path, leaf)`` pairs of ``tree`` in leaf order (``jax.tree.leaves_with_path``).

    Example::

        leaves_with_path({"b": [1, 2], "a": 3})   # [(('a',), 3), (('b', 0), 1), (('b', 1), 2)]
    """
    paths, leaves_, _ = flatten_with_path(tree, is_leaf=is_leaf)
    return list(zip(paths, leaves_))


def map_with_path(f, tree, *rest, is_leaf=None):
    """``map`` whose function also gets each leaf's path: ``f(path, leaf, *rest_leaves)``
    (``jax.tree.map_with_path``).

    Example::

        map_with_path(lambda p, x: x * 0 if p[0] == "bias" else x, params)
    """
    paths, leaves_, treedef = optree.tree_flatten_with_path(tree, is_leaf=is_leaf, namespace=NAMESPACE)
    flat = [leaves_] + [_flatten_up_to(treedef, r, (tree,) + rest) for r in rest]
    return _unflatten_mapped(treedef, [f(p, *xs) for p, *xs in zip(paths, *flat)])


_NO_INITIALIZER = object()


def reduce(function, tree, initializer=_NO_INITIALIZER, is_leaf=None):  # noqa: A001 - jax.tree.reduce
    """``functools.reduce(function, leaves(tree)[, initializer])`` (``jax.tree.reduce``).

    Example::

        reduce(lambda a, b: a + b, {"w": 2, "b": [3, 4]}, 0)   # 9
    """
    if initializer is _NO_INITIALIZER:
        return functools.reduce(function, leaves(tree, is_leaf=is_leaf))
    return functools.reduce(function, leaves(tree, is_leaf=is_leaf), initializer)


def all(tree, *, is_leaf=None):  # noqa: A001 - jax.tree.all
    """True when every leaf is truthy (``jax.tree.all``); True for a tree without leaves."""
    return builtins.all(leaves(tree, is_leaf=is_leaf))


def transpose(outer_treedef, inner_treedef, pytree_to_transpose):
    """Turns an outer tree of inner trees into an inner tree of outer trees
    (``jax.tree.transpose``). ``inner_treedef=None`` takes the structure of the first
    inner tree.

    Example::

        transpose(structure([0, 0]), structure((0, 0)), [(1, 2), (3, 4)])   # ([1, 3], [2, 4])
    """
    if inner_treedef is None:
        inner = outer_treedef.flatten_up_to(pytree_to_transpose)
        if not inner:
            raise ValueError("transpose: inner_treedef=None needs an outer tree with at least one leaf")
        inner_treedef = structure(inner[0])
    return optree.tree_transpose(outer_treedef, inner_treedef, pytree_to_transpose)


def register_pytree_node(cls, flatten_fn, unflatten_fn, *, mapped=None, hint=None):
    """Registers a container class.

    Args:
      cls: the class.
      flatten_fn: ``obj -> (children, aux_data)``; children is a sequence of subtrees.
      unflatten_fn: ``(aux_data, children) -> obj``.
      mapped: ``(aux_data, children) -> object``, what :func:`map` builds for a node of
        ``cls`` from its mapped children, for a class that states facts about its
        leaves' values which a mapped function may break (NOTE [nodes whose meaning a
        mapped function changes]); None: ``unflatten_fn``.
      hint: what :func:`map` says when the structures of its trees differ and one holds
        a node of ``cls`` (what to pass instead).

    Example::

        register_pytree_node(Point, lambda p: ((p.x, p.y), None),
                             lambda aux, xy: Point(*xy))
    """
    if mapped is not None:
        plain = unflatten_fn

        def unflatten_fn(aux, children):
            return (mapped if getattr(_mapping, "on", False) else plain)(aux, children)

    if hint is not None:
        _HINTS[cls] = hint
    optree.register_pytree_node(cls, flatten_fn, unflatten_fn, namespace=NAMESPACE)
    return cls


def register_pytree_node_class(cls):
    """Registers ``cls`` by its own methods (JAX's ``jax.tree_util.register_pytree_node_class``):
    ``obj.tree_flatten() -> (children, aux_data)`` and the classmethod
    ``cls.tree_unflatten(aux_data, children) -> obj``. Returns ``cls``, so it decorates::

        @register_pytree_node_class
        class Special:
            def __init__(self, x, y): self.x, self.y = x, y
            def tree_flatten(self): return (self.x, self.y), None
            @classmethod
            def tree_unflatten(cls, aux, children): return cls(*children)
    """
    return register_pytree_node(cls, lambda obj: obj.tree_flatten(), cls.tree_unflatten)


def register_dataclass(nodetype, data_fields=None, meta_fields=None, drop_fields=()):
    """Registers a dataclass (JAX's ``jax.tree_util.register_dataclass``): the values of
    ``data_fields`` are its children (traced, mapped), those of ``meta_fields`` its static
    aux data (hashable: part of jit's cache key); ``drop_fields`` are neither (they must
    have defaults). Without ``data_fields`` and ``meta_fields``, a dataclass's fields are
    split by their metadata: ``dataclasses.field(metadata=dict(static=True))`` is a meta
    field, the others data fields. Rebuilt with ``nodetype(**fields)``. Returns
    ``nodetype``, so it decorates."""
    if data_fields is None and meta_fields is None:
        if not dataclasses.is_dataclass(nodetype):
            raise TypeError(f"register_dataclass: {nodetype.__name__} is not a dataclass; give data_fields and "
                            "meta_fields")
        fields = [f for f in dataclasses.fields(nodetype) if f.init and f.name not in drop_fields]
        meta_fields = [f.name for f in fields if f.metadata.get("static", False)]
        data_fields = [f.name for f in fields if not f.metadata.get("static", False)]
    elif data_fields is None or meta_fields is None:
        raise TypeError("register_dataclass: give both data_fields and meta_fields, or neither (for a dataclass)")
    data_fields, meta_fields = tuple(data_fields), tuple(meta_fields)
    if dataclasses.is_dataclass(nodetype):
        init = {f.name for f in dataclasses.fields(nodetype) if f.init}
        missing = init - set(data_fields) - set(meta_fields) - set(drop_fields)
        if missing:
            raise ValueError(f"register_dataclass: data_fields, meta_fields and drop_fields of {nodetype.__name__} "
                             f"must name every init field; missing: {sorted(missing)}")

    def flatten(obj):
        return [getattr(obj, n) for n in data_fields], tuple(getattr(obj, n) for n in meta_fields)

    def unflatten(meta, children):
        return nodetype(**dict(zip(data_fields, children)), **dict(zip(meta_fields, meta)))

    return register_pytree_node(nodetype, flatten, unflatten)


def keystr(path):
    """Formats a pytree path the way Python indexing reads: ``['w1'][0]``."""
    return "".join(f"[{k!r}]" for k in path)


class PrefixError(ValueError):
    """Raised by :func:`broadcast_prefix`: ``path`` is where the trees disagree (a tuple of
    keys, ``()`` for the top level) and ``reason`` says how."""

    def __init__(self, path, reason):
        super().__init__(f"at {keystr(path) or 'the top level'}: {reason}")
        self.path = path
        self.reason = reason


def broadcast_prefix(prefix, tree, is_prefix_leaf):
    """Expands ``prefix`` (a tree whose leaves satisfy ``is_prefix_leaf``) to one value per
    leaf of ``tree``. Raises :class:`PrefixError` (a ``ValueError``) with the offending
    path when ``prefix`` is not a prefix of ``tree``."""
    out = []

    def walk(p, t, path):
        if is_prefix_leaf(p):
            out.extend([p] * len(leaves(t)))
            return
        p_level = t_level = None
        try:
            p_level = optree.tree_flatten_one_level(p, namespace=NAMESPACE)
            t_level = optree.tree_flatten_one_level(t, namespace=NAMESPACE)
        except ValueError:
            pass
        if (
            p_level is None or t_level is None or type(p) is not type(t)
            or tuple(p_level.entries) != tuple(t_level.entries)
        ):
            kind = "different types" if type(p) is not type(t) else "different keys or lengths"
            raise PrefixError(path, f"{describe(p)}, which is not a prefix of {describe(t)} ({kind})")
        for entry, p_child, t_child in zip(p_level.entries, p_level.children, t_level.children):
            walk(p_child, t_child, path + (entry,))

    walk(prefix, tree, ())
    return out


def describe(x):
    """A few words on what ``x`` is, for error messages: its container type and length (or
    keys), or an array's (or tracer's) shape."""
    if x is None:
        return "None"
    if isinstance(x, dict):
        return f"a {type(x).__name__} with keys {sorted(x, key=repr)}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of length {len(x)}"
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"an array of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"
