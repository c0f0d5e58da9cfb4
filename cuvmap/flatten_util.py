"""``ravel_pytree``: a pytree of arrays as one flat vector and back, as
``jax.flatten_util.ravel_pytree``.

Built from cuvmap primitives (reshape, convert_element_type, concatenate, slice), so both
directions work under every transform: ``grad`` of a function of the flat vector, ``vmap``
over stacked pytrees (``vmap(lambda p: ravel_pytree(p)[0])(per_example_grads)`` gives one
row per example) and ``vmap(unravel)``.
"""
import warnings

import numpy as np

from cuvmap import config, core, tree
from cuvmap.core import Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import shape as lax_shape
from cuvmap.core.bfloat16 import kind_of


def ravel_pytree(pytree):
    """Flattens the leaves of ``pytree`` (in ``cuvmap.tree.leaves`` order, each in C order)
    into one 1-d array.

    Mixed dtypes are handled as JAX does: the flat vector has the leaves' promoted dtype
    (floating and complex leaves decide it when there are any — an int leaf beside float32
    leaves stays float32, as in JAX's promotion lattice — and NumPy's promotion otherwise);
    ``unravel`` then requires that dtype and casts each piece back to its leaf's dtype.
    When every leaf has one dtype, ``unravel`` accepts any dtype and keeps it (JAX's
    dtype-polymorphic case). A tree without leaves gives an empty vector of
    ``cuvmap.config.default_float``.

    Args:
      pytree: a pytree of arrays, tracers or scalars.
    Returns:
      ``(flat, unravel)``: ``flat`` of shape ``(total size,)``, and ``unravel(flat)``
      rebuilding a pytree of the original structure, shapes (and dtypes). Concrete results
      are fresh arrays: updating ``flat`` in place never changes the leaves, and the other
      way round.

    Example::

        flat, unravel = ravel_pytree({"w": np.ones((2, 3)), "b": np.zeros(3)})
        flat.shape                    # (9,): b first (sorted keys), then w
        unravel(flat)["w"].shape      # (2, 3)
    """
    leaves, treedef = tree.flatten(pytree)
    shapes = [core.shape_of(x) for x in leaves]
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    from_dtypes = [core.dtype_of(x) for x in leaves]
    total = sum(sizes)
    if not leaves:
        flat = np.zeros(0, config.default_float)
        to_dtype = None
    else:
        to_dtype = _result_type(from_dtypes)
        pieces = []
        for x, n, dtype in zip(leaves, sizes, from_dtypes):
            if not isinstance(x, Tracer) and not hasattr(x, "shape"):
                x = np.asarray(x, dtype=dtype)
            if dtype != to_dtype:
                x = ew.convert_element_type(x, to_dtype)
            pieces.append(lax_shape.reshape(x, (n,)))
        flat = _fresh(lax_shape.concatenate(pieces, 0), leaves)
    single = len(set(from_dtypes)) <= 1

    def unravel(flat_vector):
        """Rebuilds the pytree from a vector like ``ravel_pytree``'s ``flat``."""
        if core.shape_of(flat_vector) != (total,):
            raise ValueError(f"unravel: expected an array of shape ({total},), got shape "
                             f"{core.shape_of(flat_vector)}")
        if not single and core.dtype_of(flat_vector) != to_dtype:
            raise TypeError(f"unravel: the tree's leaves have the dtypes {sorted({d.name for d in from_dtypes})}, "
                            f"so it takes an array of their promoted dtype {to_dtype}, got "
                            f"{core.dtype_of(flat_vector)}")
        out = []
        start = 0
        for shape, n, dtype in zip(shapes, sizes, from_dtypes):
            piece = flat_vector if n == total else lax_indexing.slice_in_dim(flat_vector, start, start + n, 0)
            piece = lax_shape.reshape(piece, shape)
            if not single:
                with warnings.catch_warnings():  # complex to real drops the imaginary part, as in JAX
                    warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
                    piece = ew.convert_element_type(piece, dtype)
            out.append(_fresh(piece, (flat_vector,)))
            start += n
        return tree.unflatten(treedef, out)

    return flat, unravel


def _result_type(dtypes):
    """The dtype of the flat vector: JAX's promotion for the kinds that occur in
    parameter trees (floating and complex dtypes win over integers and booleans)."""
    inexact = [d for d in dtypes if kind_of(d) in "fc"]
    return np.result_type(*(inexact or dtypes))


def _fresh(x, sources):
    """``x``, copied when it is a concrete array sharing memory with one of ``sources``."""
    if isinstance(x, Tracer) or not hasattr(x, "base"):
        return x
    owner = x
    while getattr(owner, "base", None) is not None:
        owner = owner.base
    for s in sources:
        if isinstance(s, Tracer):
            continue
        s_owner = s
        while getattr(s_owner, "base", None) is not None:
            s_owner = s_owner.base
        if s_owner is owner:
            return x.copy()
    return x
