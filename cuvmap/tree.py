"""Pytree utilities: thin wrappers over optree with cuvmap's conventions.

A pytree is a nested structure of tuples, lists, dicts, namedtuples, None and classes
registered with :func:`register_pytree_node`; its leaves are arrays, tracers and scalars.
``None`` is an empty subtree (it has no leaves), as in JAX.
"""
import optree

NAMESPACE = "cuvmap"

PyTreeSpec = optree.PyTreeSpec


def flatten(tree, is_leaf=None):
    """Returns ``(leaves, treedef)``; ``unflatten(treedef, leaves)`` rebuilds the tree."""
    return optree.tree_flatten(tree, is_leaf=is_leaf, namespace=NAMESPACE)


def unflatten(treedef, leaves):
    return optree.tree_unflatten(treedef, leaves)


def leaves(tree, is_leaf=None):
    return optree.tree_leaves(tree, is_leaf=is_leaf, namespace=NAMESPACE)


def structure(tree, is_leaf=None):
    return optree.tree_structure(tree, is_leaf=is_leaf, namespace=NAMESPACE)


def map(f, tree, *rest, is_leaf=None):  # noqa: A001 - mirrors jax.tree.map
    """Applies ``f`` leafwise to ``tree`` and the trees in ``rest`` (same structure)."""
    return optree.tree_map(f, tree, *rest, is_leaf=is_leaf, namespace=NAMESPACE)


def flatten_with_path(tree):
    """Returns ``(paths, leaves, treedef)``; each path is a tuple of keys/indices."""
    return optree.tree_flatten_with_path(tree, namespace=NAMESPACE)


def register_pytree_node(cls, flatten_fn, unflatten_fn):
    """Registers a container class.

    Args:
      cls: the class.
      flatten_fn: ``obj -> (children, aux_data)``; children is a sequence of subtrees.
      unflatten_fn: ``(aux_data, children) -> obj``.

    Example::

        register_pytree_node(Point, lambda p: ((p.x, p.y), None),
                             lambda aux, xy: Point(*xy))
    """
    optree.register_pytree_node(cls, flatten_fn, unflatten_fn, namespace=NAMESPACE)
    return cls


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
            raise PrefixError(path, f"{describe(p)}, which is not a prefix of {describe(t)}")
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
