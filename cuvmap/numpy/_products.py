"""Products: ``matmul`` (the ``@`` operator), ``dot``, ``vdot``, ``inner``, ``outer``,
``tensordot``, ``cross`` and ``einsum`` (any number of operands, ``...`` and repeated
subscripts, contracted pairwise in a greedy order), all on ``dot_general``."""
import builtins
import warnings

import numpy as np

from cuvmap import core, lax
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax import jax_shapes as lax_jax_shapes
from cuvmap.lax import reduction as lax_reduction
from cuvmap.lax import shape as lax_shape
from cuvmap.numpy._common import _axis, ndim, shape
from cuvmap.numpy._creation import asarray
from cuvmap.numpy._dtypes import result_type
from cuvmap.numpy._elementwise import astype
from cuvmap.numpy._indexing import getitem
from cuvmap.numpy._reductions import sum
from cuvmap.numpy._shapes import broadcast_arrays, broadcast_to, diagonal, moveaxis, ravel, stack
from cuvmap.core.bfloat16 import kind_of


def _batched_input_hint(ka, kb):
    """A hint for the commonest cause of a contracting-dim mismatch in per-example code: a
    batch passed where one example was expected (``(32·6272,)`` against ``(6272, 10)``)."""
    big, small = builtins.max(ka, kb), builtins.min(ka, kb)
    if small > 0 and big % small == 0 and big > small:
        which = "first" if ka > kb else "second"
        return (
            f"; the {which} operand's dim is {big // small}× the other's: if it holds a batch of {big // small} "
            "examples where the function expects one (a flatten or reshape(-1) over the batch), map the "
            "function over the batch with cuvmap.vmap instead"
        )
    return ""


# NOTE [precision and preferred_element_type of the products]
# JAX's products take ``precision`` (a lax.Precision or a pair) and ``preferred_element_type``
# keywords. ``precision`` is checked, recorded in the dot_general equation (JAX's canonical
# pair) and changes nothing (NumPy and CuPy compute float32 in float32); the equation's
# ``preferred_element_type`` is the result's dtype, as jnp's. ``preferred_element_type`` is the dtype of the result and of the accumulation:
# when it is a float or complex type, or the operands cast to it safely, the operands are
# converted to it first (float16 operands accumulate in float32, int8 ones in int32, as in
# JAX); otherwise (a narrower type) the result is converted. ``_preferred_operands`` and ``_preferred_result`` apply it around each product.


def _preferred_operands(a, b, precision, preferred_element_type, name):
    lax_jax_shapes._check_precision(precision, name)
    if preferred_element_type is not None:
        preferred = np.dtype(preferred_element_type)
        if kind_of(preferred) in "fc" or np.can_cast(result_type(a, b), preferred, "safe"):
            return astype(a, preferred), astype(b, preferred)
    return a, b


def _preferred_result(out, preferred_element_type):
    return out if preferred_element_type is None else astype(out, preferred_element_type)


def matmul(a, b, *, precision=None, preferred_element_type=None):
    """NumPy's ``matmul``: 1-d operands are vectors, leading dims broadcast as batches.
    ``precision`` and ``preferred_element_type`` as JAX's (NOTE [precision and
    preferred_element_type of the products])."""
    a, b = _preferred_operands(asarray(a), asarray(b), precision, preferred_element_type, "matmul")
    return _preferred_result(_matmul(a, b, precision), preferred_element_type)


def _matmul(a, b, precision=None):
    na, nb = ndim(a), ndim(b)
    if na == 0 or nb == 0:
        raise ShapeError(f"matmul: operands must have at least one dim, got {shape(a)} and {shape(b)}")
    ka, kb = shape(a)[-1], shape(b)[-1 if nb == 1 else -2]
    if ka != kb:
        raise ShapeError(
            f"matmul: contracting dims do not match for shapes {shape(a)} and {shape(b)} ({ka} vs {kb})"
            + _batched_input_hint(ka, kb)
        )
    if nb == 1:
        return lax.dot_general(a, b, (((na - 1,), (0,)), ((), ())), precision=precision)
    if na == 1:
        return lax.dot_general(a, b, (((0,), (nb - 2,)), ((), ())), precision=precision)
    if nb == 2:
        return lax.dot_general(a, b, (((na - 1,), (0,)), ((), ())), precision=precision)
    if na == 2:
        out = lax.dot_general(a, b, (((1,), (nb - 2,)), ((), ())), precision=precision)  # (m, *batch, n)
        return moveaxis(out, 0, -2)
    batch = ew.broadcast_shapes(shape(a)[:-2], shape(b)[:-2])
    a = broadcast_to(a, batch + shape(a)[-2:])
    b = broadcast_to(b, batch + shape(b)[-2:])
    nbatch = len(batch)
    bd = tuple(range(nbatch))
    return lax.dot_general(a, b, (((nbatch + 1,), (nbatch,)), (bd, bd)), precision=precision)


def dot(a, b, *, precision=None, preferred_element_type=None):
    """NumPy's ``dot``: sum over the last dim of ``a`` and the second-to-last of ``b``.
    ``precision`` and ``preferred_element_type`` as JAX's (NOTE [precision and
    preferred_element_type of the products])."""
    a, b = _preferred_operands(*_pair(a, b), precision, preferred_element_type, "dot")
    na, nb = ndim(a), ndim(b)
    if na == 0 or nb == 0:
        return _preferred_result(ew.mul(a, b), preferred_element_type)
    out = lax.dot_general(a, b, (((na - 1,), (builtins.max(nb - 2, 0),)), ((), ())), precision=precision)
    return _preferred_result(out, preferred_element_type)


def _pair(a, b):
    """Two operands as arrays or tracers (Python scalars stay weakly typed)."""
    return (a if isinstance(a, (int, float, complex)) else asarray(a),
            b if isinstance(b, (int, float, complex)) else asarray(b))


def vdot(a, b, *, precision=None, preferred_element_type=None):
    """``Σ conj(a)·b`` over the flattened operands (``numpy.vdot``: a complex ``a`` is
    conjugated). ``precision`` and ``preferred_element_type`` as JAX's (NOTE [precision
    and preferred_element_type of the products])."""
    a, b = _preferred_operands(asarray(a), asarray(b), precision, preferred_element_type, "vdot")
    if kind_of(core.dtype_of(a)) == "c":
        a = ew.conj(a)
    products = ew.mul(ravel(a), ravel(b))
    return _preferred_result(sum(products, dtype=core.dtype_of(products)), preferred_element_type)


def inner(a, b, *, precision=None, preferred_element_type=None):
    """``jnp.inner``: the sum over the last dims of ``a`` and ``b`` (a product when either is
    a scalar). ``precision`` and ``preferred_element_type`` as JAX's (NOTE [precision and
    preferred_element_type of the products])."""
    a, b = _preferred_operands(*_pair(a, b), precision, preferred_element_type, "inner")
    if ndim(a) == 0 or ndim(b) == 0:
        return _preferred_result(ew.mul(a, b), preferred_element_type)
    out = lax.dot_general(a, b, (((ndim(a) - 1,), (ndim(b) - 1,)), ((), ())), precision=precision)
    return _preferred_result(out, preferred_element_type)


def outer(a, b, out=None):
    """``jnp.outer``: ``out[i, j] = a[i]·b[j]`` of the flattened operands (``out`` refused)."""
    if out is not None:
        raise NotImplementedError("outer: out= is not supported (arrays are immutable)")
    a, b = asarray(a), asarray(b)
    return lax.dot_general(ravel(a), ravel(b), (((), ()), ((), ())))


def tensordot(a, b, axes=2, *, precision=None, preferred_element_type=None):
    """``jnp.tensordot``: the sum of products over the last ``axes`` dims of ``a`` and the
    first of ``b`` (an int), or over the dims listed in ``axes = (axes_a, axes_b)``.
    ``precision`` and ``preferred_element_type`` as JAX's (NOTE [precision and
    preferred_element_type of the products])."""
    a, b = _preferred_operands(*_pair(a, b), precision, preferred_element_type, "tensordot")
    return _preferred_result(_tensordot(a, b, axes, precision), preferred_element_type)


def _tensordot(a, b, axes, precision=None):
    if (ndim(a) == 0 or ndim(b) == 0) and axes in (0, ((), ()), ([], [])):
        return ew.mul(a, b)
    a, b = asarray(a), asarray(b)
    # JAX's checks and texts (TypeError, as JAX's), before the contraction's own
    if isinstance(axes, (int, np.integer)):
        if axes > builtins.min(ndim(a), ndim(b)):
            raise TypeError(f"tensordot: Number of tensordot axes (axes {axes}) exceeds input ranks "
                            f"({shape(a)} and {shape(b)})")
        ca = tuple(range(ndim(a) - axes, ndim(a)))
        cb = tuple(range(axes))
    elif isinstance(axes, (list, tuple)) and len(axes) == 2:
        ca, cb = axes
        if not all(isinstance(c, (int, np.integer, list, tuple)) for c in (ca, cb)):
            raise TypeError(f"tensordot: tensordot requires both axes lists to be either ints, tuples or lists, "
                            f"got {ca!r} and {cb!r}")
        ca = (ca,) if isinstance(ca, (int, np.integer)) else tuple(ca)
        cb = (cb,) if isinstance(cb, (int, np.integer)) else tuple(cb)
        if len(ca) != len(cb):
            raise TypeError(f"tensordot: tensordot requires axes lists to have equal length, got {ca} and {cb}")
        ca = tuple(int(i) % ndim(a) for i in ca)
        cb = tuple(int(i) % ndim(b) for i in cb)
    else:
        raise TypeError(f"tensordot: tensordot axes argument must be an int, a pair of ints, or a pair of lists, "
                        f"got {axes!r}")
    return lax.dot_general(a, b, ((ca, cb), ((), ())), precision=precision)


def cross(a, b, axisa=-1, axisb=-1, axisc=-1, axis=None):
    """``numpy.cross``: the cross product of 3-vectors along ``axisa``/``axisb`` (leading dims
    broadcast), written to ``axisc`` of the result; a 2-vector counts as having z = 0, and
    two 2-vectors give the z component alone (as NumPy and JAX do)."""
    if axis is not None:
        axisa = axisb = axisc = axis
    a = moveaxis(a, _axis(a, axisa, "cross"), -1)
    b = moveaxis(b, _axis(b, axisb, "cross"), -1)
    na, nb = shape(a)[-1], shape(b)[-1]
    if na not in (2, 3) or nb not in (2, 3):
        raise ShapeError(f"cross: the vectors must have 2 or 3 components, got {na} and {nb} "
                         f"(shapes {shape(a)} and {shape(b)} with the vector axis last)")
    if na == 2 or nb == 2:  # deprecated by NumPy 2 and by JAX (to be removed in JAX 0.12)
        warnings.warn("cross: Support for 2-dimensional vectors in jnp.cross is deprecated (as in NumPy 2); use "
                      "arrays of 3-dimensional vectors instead", DeprecationWarning, stacklevel=2)
    ac = [getitem(a, (Ellipsis, i)) for i in range(na)]
    bc = [getitem(b, (Ellipsis, i)) for i in range(nb)]

    def minus(p, q):
        """p − q where a missing (None) factor product is 0."""
        if p is None:
            return ew.neg(q)
        return p if q is None else ew.sub(p, q)

    def times(i, j):
        return None if i >= na or j >= nb else ew.mul(ac[i], bc[j])

    z = minus(times(0, 1), times(1, 0))
    if na == 2 and nb == 2:
        return z
    out = stack(broadcast_arrays(minus(times(1, 2), times(2, 1)), minus(times(2, 0), times(0, 2)), z), axis=-1)
    return moveaxis(out, -1, _axis(out, axisc, "cross"))


# NOTE [einsum's contraction order]
# ``einsum`` with n operands becomes n − 1 pairwise contractions, each one ``dot_general``
# (plus ``reduce_sum`` for labels only one operand has, ``diagonal`` for a label repeated
# within an operand, a final ``transpose``), so every transform handles it through those
# primitives. The pairs are chosen greedily (opt_einsum's greedy strategy, simplified): at
# each step the pair whose intermediate result is smallest, ties broken by the memory the
# step frees, then by position. A chain ``ij,jk,kl->il`` with a thin last matrix thus
# contracts ``jk,kl`` first. Labels are kept in an intermediate only while the output or
# another remaining operand still needs them; a label whose size is 1 in some operands and
# n in others broadcasts (NumPy's rule), the size-1 dims being squeezed away first.


def _einsum_labels(spec, rank, ellipsis_rank, i, subscripts):
    """Operand ``i``'s labels: its letters, with ``...`` replaced by the ellipsis labels
    ``("...", k)`` aligned to the right, as broadcasting aligns dims."""
    if "." in spec.replace("...", ""):
        raise ShapeError(f"einsum: {subscripts!r}: '.' may only appear as '...'")
    letters = spec.replace("...", "")
    bad = [c for c in letters if not c.isalpha()]
    if bad:
        raise ShapeError(f"einsum: {subscripts!r}: subscripts must be letters, got {bad[0]!r}")
    if "..." not in spec:
        if len(spec) != rank:
            raise ShapeError(f"einsum: subscripts {spec!r} name {len(spec)} dims, but operand {i} has shape of rank {rank}")
        return list(spec)
    n_ell = rank - len(letters)
    if n_ell < 0 or spec.count("...") > 1:
        raise ShapeError(f"einsum: subscripts {spec!r} do not fit operand {i} of rank {rank}")
    head, tail = spec.split("...")
    return list(head) + [("...", ellipsis_rank - n_ell + k) for k in range(n_ell)] + list(tail)


def _einsum_parse(subscripts, operands):
    spec = subscripts.replace(" ", "")
    if spec.count("->") > 1:
        raise ShapeError(f"einsum: {subscripts!r} has more than one '->'")
    lhs, out_spec = spec.split("->") if "->" in spec else (spec, None)
    in_specs = lhs.split(",")
    if len(in_specs) != len(operands):
        raise ShapeError(f"einsum: {subscripts!r} names {len(in_specs)} operands, but {len(operands)} were given")
    ranks = [ndim(x) for x in operands]
    ellipsis_rank = builtins.max(
        [r - len(sp.replace("...", "")) for sp, r in zip(in_specs, ranks) if "..." in sp], default=0)
    labels = [_einsum_labels(sp, r, ellipsis_rank, i, subscripts) for i, (sp, r) in enumerate(zip(in_specs, ranks))]
    ellipsis = [("...", k) for k in range(ellipsis_rank)]
    if out_spec is None:
        counts = {}
        for ls in labels:
            for c in ls:
                counts[c] = counts.get(c, 0) + 1
        out = ellipsis + sorted(c for c, k in counts.items() if k == 1 and isinstance(c, str))
    else:
        if "." in out_spec.replace("...", "") or out_spec.count("...") > 1:
            raise ShapeError(f"einsum: {subscripts!r}: bad output subscripts {out_spec!r}")
        if ellipsis_rank and "..." not in out_spec:
            raise ShapeError(f"einsum: {subscripts!r}: the operands have dims under '...', so the output "
                             "subscripts need '...' too (as in NumPy)")
        head, _, tail = out_spec.partition("...")
        out = list(head) + (ellipsis if "..." in out_spec else []) + list(tail)
        seen = {c for ls in labels for c in ls}
        for c in out:
            if out.count(c) > 1:
                raise ShapeError(f"einsum: {subscripts!r}: output subscript {c!r} appears more than once")
            if c not in seen:
                raise ShapeError(f"einsum: {subscripts!r}: output subscript {c!r} names no dim of the operands")
    return labels, out


def _einsum_sizes(operands, labels, subscripts):
    """Each label's size, and the operands with their size-1 broadcast dims squeezed."""
    sizes = {}
    for i, (x, ls) in enumerate(zip(operands, labels)):
        for c, n in zip(ls, shape(x)):
            if n != 1:
                prev = sizes.setdefault(c, (n, i))
                if prev[0] != n:
                    name = "..." if isinstance(c, tuple) else repr(c)
                    raise ShapeError(
                        f"einsum: {subscripts!r}: subscript {name} has size {prev[0]} in operand {prev[1]} "
                        f"(shape {shape(operands[prev[1]])}) but size {n} in operand {i} (shape {shape(x)})")
    sizes = {c: n for c, (n, _) in sizes.items()}
    new_ops, new_labels = [], []
    for x, ls in zip(operands, labels):
        drop = tuple(d for d, (c, n) in enumerate(zip(ls, shape(x))) if n == 1 and sizes.get(c, 1) != 1)
        if drop:
            x = lax_shape.squeeze(x, drop)
            ls = [c for d, c in enumerate(ls) if d not in drop]
        for c in ls:
            sizes.setdefault(c, 1)
        new_ops.append(x)
        new_labels.append(ls)
    return sizes, new_ops, new_labels


def _einsum_sum_unneeded(x, ls, needed):
    axes = tuple(d for d, c in enumerate(ls) if c not in needed)
    if axes:
        x = lax_reduction.reduce_sum(x, axes)
        ls = [c for c in ls if c in needed]
    return x, ls


def _einsum_contract(x, lx, y, ly, needed):
    """One pairwise step: ``dot_general`` over the shared labels that nothing else needs,
    with the shared labels still needed as batch dims."""
    x, lx = _einsum_sum_unneeded(x, lx, set(ly) | needed)
    y, ly = _einsum_sum_unneeded(y, ly, set(lx) | needed)
    batch = [c for c in lx if c in ly and c in needed]
    contract = [c for c in lx if c in ly and c not in needed]
    dn = ((tuple(lx.index(c) for c in contract), tuple(ly.index(c) for c in contract)),
          (tuple(lx.index(c) for c in batch), tuple(ly.index(c) for c in batch)))
    out = lax.dot_general(x, y, dn)
    return out, batch + [c for c in lx if c not in ly] + [c for c in ly if c not in lx]


def _einsum_sublist_letter(label, name="einsum"):
    if label is Ellipsis:
        return "..."
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    if not isinstance(label, (int, np.integer)) or not 0 <= label < len(letters):
        raise ValueError(f"{name}: sublist labels must be ints in [0, 52) or Ellipsis, got {label!r}")
    return letters[int(label)]


def _einsum_from_sublists(args):
    """NumPy's sublist form ``einsum(op0, [0, 1], op1, [1, 2], [0, 2])`` as subscripts
    and operands (``'ab,bc->ac'``)."""
    args = list(args)
    out = args.pop() if len(args) % 2 else None
    operands = args[0::2]
    specs = ["".join(_einsum_sublist_letter(c) for c in sub) for sub in args[1::2]]
    subscripts = ",".join(specs)
    if out is not None:
        subscripts += "->" + "".join(_einsum_sublist_letter(c) for c in out)
    return subscripts, operands


def einsum(subscripts, *operands, optimize="auto", precision=None, preferred_element_type=None, out=None):
    """``numpy.einsum`` with any number of operands: explicit (``'ij,jk->ik'``) or implicit
    output, ``...`` (broadcast as NumPy does), labels repeated within an operand
    (diagonals: ``'ii->i'``, traces) and size-1 broadcasting. The operands are contracted
    pairwise in a greedy order (NOTE [einsum's contraction order]); ``optimize`` is
    accepted for compatibility and the order is always greedy. NumPy's sublist form
    ``einsum(x, [0, 1], y, [1, 2], [0, 2])`` (ints for labels, ``Ellipsis`` for ``...``)
    is the same as ``einsum('ab,bc->ac', x, y)``; mixed dtypes promote.

    Example: ``einsum('bi,ij,bj->b', x, A, y)`` is the batch of bilinear forms xᵀAy.
    """
    if out is not None:
        raise NotImplementedError("einsum: out= is not supported (arrays are immutable)")
    if not isinstance(subscripts, str):
        subscripts, operands = _einsum_from_sublists((subscripts,) + operands)
    if not operands:
        raise ShapeError("einsum: needs at least one operand")
    lax_jax_shapes._check_precision(precision, "einsum")
    operands = tuple(asarray(x) for x in operands)
    if preferred_element_type is not None:  # NOTE [precision and preferred_element_type of the products]
        preferred = np.dtype(preferred_element_type)
        if kind_of(preferred) in "fc" or np.can_cast(result_type(*operands), preferred, "safe"):
            operands = tuple(astype(x, preferred) for x in operands)
    if len({core.dtype_of(x) for x in operands}) > 1:
        common = np.result_type(*(core.dtype_of(x) for x in operands))
        operands = tuple(astype(x, common) for x in operands)
    result = _einsum_strings(subscripts, operands)
    return result if preferred_element_type is None else astype(result, preferred_element_type)


def _einsum_strings(subscripts, operands):
    labels, out = _einsum_parse(subscripts, operands)
    sizes, ops, labels = _einsum_sizes(operands, labels, subscripts)
    # diagonals of labels repeated within an operand
    for i, (x, ls) in enumerate(zip(ops, labels)):
        while len(set(ls)) != len(ls):
            c = next(c for c in ls if ls.count(c) > 1)
            p = ls.index(c)
            q = ls.index(c, p + 1)
            x = diagonal(x, 0, p, q)
            ls = [l for d, l in enumerate(ls) if d not in (p, q)] + [c]
        ops[i], labels[i] = x, ls
    out_set = set(out)
    # labels that only one operand has and the output lacks are summed first
    for i in range(len(ops)):
        others = out_set.union(*(labels[j] for j in range(len(ops)) if j != i))
        ops[i], labels[i] = _einsum_sum_unneeded(ops[i], labels[i], others)

    def size_of(ls):
        return int(np.prod([sizes[c] for c in ls], dtype=np.int64))

    while len(ops) > 1:
        best = None
        for i in range(len(ops)):
            for j in range(i + 1, len(ops)):
                needed = out_set.union(*(labels[m] for m in range(len(ops)) if m not in (i, j)))
                result = [c for c in dict.fromkeys(labels[i] + labels[j]) if c in needed]
                size = size_of(result)
                key = (size, size - size_of(labels[i]) - size_of(labels[j]), i, j)
                if best is None or key < best[0]:
                    best = (key, i, j, needed)
        _, i, j, needed = best
        z, lz = _einsum_contract(ops[i], labels[i], ops[j], labels[j], needed)
        ops = [o for m, o in enumerate(ops) if m not in (i, j)] + [z]
        labels = [ls for m, ls in enumerate(labels) if m not in (i, j)] + [lz]
    (x,), (ls,) = ops, labels
    x, ls = _einsum_sum_unneeded(x, ls, out_set)
    return lax_shape.transpose(x, tuple(ls.index(c) for c in out))
