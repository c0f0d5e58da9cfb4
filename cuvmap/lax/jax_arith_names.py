"""JAX's ``lax`` arithmetic names that compose cuvmap's primitives (issue 32, the mirror's
gaps): ``mul`` with JAX's ``out_dtype=``, ``mulhi``, ``reciprocal``, ``broadcast_to_rank``
and ``batch_matmul``. None adds a primitive, so every transform's rules are those of the
primitives they are made of.
"""
import numpy as np

from cuvmap import core
from cuvmap.lax import elementwise as ew
from cuvmap.lax.bitwise import (
    bitcast_convert_type, bitwise_and, bitwise_or, shift_right_arithmetic, shift_right_logical,
)
from cuvmap.lax.jax_shapes import broadcast, dot_general
from cuvmap.lax.slicing_scatter import scatter_add
from cuvmap.core.bfloat16 import kind_of


def mul(x, y, *, out_dtype=None):
    """``x * y`` (JAX's ``jax.lax.mul``). With ``out_dtype`` (JAX's keyword) both operands
    are first converted to ``out_dtype`` and multiplied there, so operands of different
    dtypes may meet; the derivatives are those of the casts and the product,
    ``∂(x·y)/∂x = y`` (the cotangent of ``x`` comes back in ``x``'s dtype)."""
    if out_dtype is not None:
        out_dtype = np.dtype(out_dtype)
        x, y = ew.convert_element_type(x, out_dtype), ew.convert_element_type(y, out_dtype)
    return ew.mul(x, y)


def _integer_operands(x, y, where):
    dx, dy = core.dtype_of(x), core.dtype_of(y)
    for name, d in (("x", dx), ("y", dy)):
        if kind_of(d) not in "iu":
            raise TypeError(f"{where}: {name} must have an integer dtype, got {d}")
    dtype = np.result_type(dx, dy) if dx != dy else dx
    return ew.convert_element_type(x, dtype), ew.convert_element_type(y, dtype), dtype


def mulhi(x, y, /):
    """The high half of the full product (JAX's ``jax.lax.mulhi``): for N-bit integers,
    ``⌊x·y / 2^N⌋`` computed exactly in 2N bits (floor division, so a negative product
    keeps its two's-complement high word). Below 64 bits the product is formed in 64 bits;
    64-bit operands are split into 32-bit halves and the partial products added with their
    carries (the unsigned high word, then ``− (x<0)·y − (y<0)·x`` for signed operands).
    Integers only: no derivative."""
    x, y, dtype = _integer_operands(x, y, "mulhi")
    bits = dtype.itemsize * 8
    if bits < 64:
        wide = np.dtype(np.int64) if kind_of(dtype) == "i" else np.dtype(np.uint64)
        prod = ew.mul(ew.convert_element_type(x, wide), ew.convert_element_type(y, wide))
        high = _shift_right_floor(prod, bits, wide)
        return ew.convert_element_type(high, dtype)
    u = np.dtype(np.uint64)
    xu, yu = _bitcast(x, u), _bitcast(y, u)
    high = _umulhi64(xu, yu)
    if kind_of(dtype) == "i":
        zero = np.uint64(0)
        high = ew.sub(high, ew.select(ew.lt(x, np.int64(0)), yu, ew.mul(yu, zero)))
        high = ew.sub(high, ew.select(ew.lt(y, np.int64(0)), xu, ew.mul(xu, zero)))
        return _bitcast(high, dtype)
    return high


def _bitcast(x, dtype):
    return bitcast_convert_type(x, dtype)


def _shift_right_floor(prod, bits, wide):
    if kind_of(wide) == "i":
        return shift_right_arithmetic(prod, wide.type(bits))
    return shift_right_logical(prod, wide.type(bits))


def _umulhi64(x, y):
    """The high 64 bits of the 128-bit product of uint64 ``x`` and ``y`` (schoolbook on
    32-bit halves, each partial product and carry fitting in 64 bits)."""
    mask, s = np.uint64(0xFFFFFFFF), np.uint64(32)
    xl, xh = bitwise_and(x, mask), shift_right_logical(x, s)
    yl, yh = bitwise_and(y, mask), shift_right_logical(y, s)
    t = ew.mul(xl, yl)
    k = shift_right_logical(t, s)
    t = ew.add(ew.mul(xh, yl), k)
    w1, w2 = bitwise_and(t, mask), shift_right_logical(t, s)
    t = ew.add(ew.mul(xl, yh), w1)
    k = shift_right_logical(t, s)
    return ew.add(ew.add(ew.mul(xh, yh), w2), k)


def reciprocal(x):
    """``1 / x`` elementwise (JAX's ``jax.lax.reciprocal``, ``integer_pow(x, -1)``); its
    derivative is ``−1 / x²``."""
    return ew.integer_pow(x, -1)


def broadcast_to_rank(x, rank):
    """``x`` with leading dims of size 1 added up to ``rank`` dims (JAX's
    ``jax.lax.broadcast_to_rank``); ``x`` itself when it already has ``rank`` dims."""
    ndim = len(core.shape_of(x))
    rank = int(rank)
    if rank < ndim:
        raise core.ShapeError(f"broadcast_to_rank: rank {rank} is less than the operand's {ndim} dims")
    if rank == ndim:
        return x
    return broadcast(x, (1,) * (rank - ndim))


def batch_matmul(lhs, rhs, precision=None):
    """Batched matrix product (JAX's ``jax.lax.batch_matmul``): ``out[..., i, k] =
    Σ_j lhs[..., i, j] · rhs[..., j, k]`` over equal leading (batch) dims, one
    ``dot_general`` with those dims as batch dims. Both operands must have the same number
    of dims, at least 2 (JAX's ValueError otherwise)."""
    ls, rs = core.shape_of(lhs), core.shape_of(rhs)
    if min(len(ls), len(rs)) < 2:
        raise ValueError(f"Arguments to batch_matmul must be at least 2D, got {len(ls)}, {len(rs)}")
    if len(ls) != len(rs):
        raise ValueError(f"Arguments to batch_matmul must have same ndim, got {len(ls)}, {len(rs)}")
    batch = tuple(range(len(ls) - 2))
    return dot_general(lhs, rhs, (((len(ls) - 1,), (len(rs) - 2,)), (batch, batch)), precision=precision)


def clz(x):
    """Count leading zeros (JAX's ``jax.lax.clz``): for N-bit integers, the number of zero
    bits above the highest set bit of the two's-complement pattern (N for 0, 0 for a
    negative value), in ``x``'s dtype: every bit below the highest set one is set by
    or-ing in shifted copies (by 1, 2, 4, ..., N/2), and ``N − population_count`` of that
    is the answer. Integers only: no derivative."""
    dtype = np.dtype(core.dtype_of(x))
    if kind_of(dtype) not in "iu":
        raise TypeError(f"clz: x must have an integer dtype, got {dtype}")
    unsigned = np.dtype(f"u{dtype.itemsize}")
    u = _bitcast(x, unsigned)
    bits, shift = 8 * dtype.itemsize, 1
    while shift < bits:
        u = bitwise_or(u, shift_right_logical(u, unsigned.type(shift)))
        shift *= 2
    return ew.sub(dtype.type(bits), ew.convert_element_type(ew.population_count(u), dtype))


def scatter_sub(operand, scatter_indices, updates, dimension_numbers, *, indices_are_sorted=False,
                unique_indices=False, mode=None):
    """``jax.lax.scatter_sub``: ``out = operand``, then ``out[start + W] −= updates[G, W]``
    for every update (repeated targets accumulate): :func:`cuvmap.lax.scatter_add` of
    ``−updates``, so its rules are scatter_add's and neg's (unsigned integers wrap, as in
    JAX)."""
    return scatter_add(operand, scatter_indices, ew.neg(updates), dimension_numbers,
                       indices_are_sorted=indices_are_sorted, unique_indices=unique_indices, mode=mode)
