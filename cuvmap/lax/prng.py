"""The counter-based random bit generator: ``threefry2x32``, the Threefry-2x32 hash of
Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), with 20 rounds,
as JAX uses it.

``threefry2x32(key, count)`` maps a 64-bit key and a 64-bit counter, each a pair of uint32
words on the last axis, to 64 random bits (a pair of uint32 words): the leading dims of
``key`` and ``count`` broadcast, so one call hashes many counters under one key, or many
keys at once. Everything in :mod:`cuvmap.random` is built on it.

NOTE [threefry with array ops]
The hash is written with NumPy ufuncs on uint32 arrays (additions wrap modulo 2³², the
rotations are two shifts and an or), which CuPy runs as the same integer operations on the
GPU: every word is the same on both devices and in every batch layout, with no float
arithmetic involved. It is elementwise in (key, counter) pairs, so its batching rule is
plain broadcasting: under ``vmap`` over keys, a batch of B keys ``(B, 2)`` meets the
counters ``(n, 2)`` as ``(B, 1, 2)`` and one call hashes all ``B · n`` pairs — never a loop
over the batch. Its results are integers, so it carries no derivative.

On the GPU the 20 rounds would be about 125 kernel launches of those ufuncs; there the
impl runs them as one generated ``ElementwiseKernel`` instead (:func:`threefry2x32_body`,
compiled by ``cuvmap/cuda/kernels.py``), the same operations written in C on ``unsigned
int`` words, so the bits are the same.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.cuda import kernels
from cuvmap.core import Primitive, ShapedArray, ShapeError
from cuvmap.lax.elementwise import broadcast_shapes
from cuvmap.transforms import batching

U32 = np.dtype(np.uint32)

# ---------------------------------------------------------------------------------------
# Declaration
# ---------------------------------------------------------------------------------------

threefry2x32_p = Primitive("threefry2x32", differentiable=False)


# ---------------------------------------------------------------------------------------
# Public wrapper
# ---------------------------------------------------------------------------------------


def threefry2x32(key, count):
    """Threefry-2x32 (20 rounds) of ``count`` under ``key``.

    Args:
      key: uint32 array ``(..., 2)``: the two key words on the last axis.
      count: uint32 array ``(..., 2)``: the two counter words on the last axis; its leading
        dims broadcast with ``key``'s.
    Returns:
      uint32 array ``(broadcast leading dims, 2)``: the two output words.

    Example (the known-answer test of Random123, as in JAX's tests)::

        threefry2x32(np.uint32([0x13198a2e, 0x03707344]), np.uint32([0x243f6a88, 0x85a308d3]))
        # array([0xc4923a9c, 0x483df7a0], dtype=uint32)
    """
    return threefry2x32_p.bind(key, count)


# ---------------------------------------------------------------------------------------
# Shape rule
# ---------------------------------------------------------------------------------------


def _threefry2x32_shape_rule(key, count):
    for name, a in (("key", key), ("count", count)):
        if a.dtype != U32 or not a.shape or a.shape[-1] != 2:
            raise ShapeError(f"{name} must be a uint32 array of shape (..., 2), got {a.dtype}{list(a.shape)}")
    return ShapedArray(broadcast_shapes(key.shape[:-1], count.shape[:-1]) + (2,), U32)


# ---------------------------------------------------------------------------------------
# Impl
# ---------------------------------------------------------------------------------------

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32_words(k0, k1, x0, x1):
    """The hash on concrete uint32 arrays (NumPy or CuPy), word by word: returns
    ``(y0, y1)``. ``x0`` and ``x1`` must be at least 1-d (NumPy warns on overflowing
    0-d scalars); the key words broadcast against them."""
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0 = x0 + ks[0]
    x1 = x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 += x1
            t = x1 << np.uint32(r)
            x1 >>= np.uint32(32 - r)
            x1 |= t
            x1 ^= x0
        x0 += ks[(i + 1) % 3]
        x1 += ks[(i + 2) % 3]
        x1 += np.uint32(i + 1)
    return x0, x1


def threefry2x32_body():
    """The C body of the GPU kernel: the rounds of :func:`threefry2x32_words` on the
    ``unsigned int`` (uint32) words ``a``, ``b`` from inputs ``k0, k1, x0, x1`` into the
    outputs ``y0, y1`` (generated from the same rotation table, so the two cannot drift)."""
    lines = ["unsigned int ks0 = k0;", "unsigned int ks1 = k1;",
             "unsigned int ks2 = k0 ^ k1 ^ %du;" % int(_PARITY),
             "unsigned int a = x0 + ks0;", "unsigned int b = x1 + ks1;"]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            lines.append(f"a = a + b; b = (b << {r}u) | (b >> {32 - r}u); b = b ^ a;")
        lines.append(f"a = a + ks{(i + 1) % 3}; b = b + ks{(i + 2) % 3} + {i + 1}u;")
    lines.append("y0 = a; y1 = b;")
    return "\n".join(lines)


def _threefry2x32_impl(key, count):
    _threefry2x32_shape_rule(core.get_aval(key), core.get_aval(count))
    xp = backend.xp_of(key, count)
    shape = broadcast_shapes(key.shape[:-1], count.shape[:-1])
    lead = shape or (1,)
    pad = (1,) * (len(shape) - (key.ndim - 1))
    k0 = key[..., 0].reshape(pad + key.shape[:-1])
    k1 = key[..., 1].reshape(pad + key.shape[:-1])
    # the counter words as fresh arrays of the full shape: the rounds update them in place
    x0 = xp.array(xp.broadcast_to(count[..., 0], shape), dtype=U32).reshape(lead)
    x1 = xp.array(xp.broadcast_to(count[..., 1], shape), dtype=U32).reshape(lead)
    if not shape:
        k0, k1 = k0.reshape(1), k1.reshape(1)
    if xp is not np:
        out = kernels.threefry2x32(threefry2x32_body(), k0, k1, x0, x1)
        if out is not None:
            return out.reshape(shape + (2,))
    y0, y1 = threefry2x32_words(k0, k1, x0, x1)
    return xp.stack([y0, y1], axis=-1).reshape(shape + (2,))


threefry2x32_p.impl = _threefry2x32_impl
threefry2x32_p.shape_rule = _threefry2x32_shape_rule


# ---------------------------------------------------------------------------------------
# Batching rule (no derivative rules: integer results)
# ---------------------------------------------------------------------------------------



def _threefry2x32_batch(axis_size, vals, dims):
    """Broadcasting with the batch dims at the front. Not the elementwise family's rule,
    whose fast path keeps batch dims where they are: the word axis must stay last."""
    ranks = [len(core.shape_of(v)) - (d is not batching.not_mapped) for v, d in zip(vals, dims)]
    rank = max(ranks)
    moved = [v if d is batching.not_mapped else batching.pad_to_logical_rank(batching.move_bdim(v, d, 0), r, rank)
             for v, d, r in zip(vals, dims, ranks)]
    return threefry2x32(*moved), 0


batching.primitive_batchers[threefry2x32_p] = _threefry2x32_batch
