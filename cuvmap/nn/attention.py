"""Scaled dot-product attention, ``jax.nn.dot_product_attention``'s layout and semantics.

Everything is per example (no statistic crosses the leading dims), so the function is
valid under ``vmap`` over examples and in per-example losses; the ``MultiHeadAttention``
layer (:mod:`cuvmap.nn.layers`) is built on it.
"""
import math

import numpy as np

from cuvmap import backend, core
from cuvmap import numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False):
    """``softmax(scale · q kᵀ + bias, masked) v`` for every head, as
    ``jax.nn.dot_product_attention``.

    Layouts (JAX's): ``query`` is ``(..., T, N, H)`` — any leading dims (a batch ``B``, or
    none for one example), ``T`` queries, ``N`` heads of size ``H`` —, ``key`` and ``value``
    are ``(..., S, K, H)`` with ``K`` dividing ``N`` (grouped-query attention when
    ``K < N``: query head ``n`` reads key/value head ``n // (N / K)``). The leading dims
    broadcast.

    Args:
      query, key, value: as above, one float dtype.
      bias: added to the logits; broadcasts to ``(..., N, T, S)``.
      mask: booleans broadcasting to ``(..., N, T, S)``; ``True`` where a query may attend
        to a key. Masked logits are set to ``-0.7 · finfo.max`` (JAX's choice), so a query
        whose keys are all masked attends uniformly instead of producing NaN.
      scale: the logits' scale, ``1 / sqrt(H)`` by default.
      is_causal: query ``t`` attends to keys ``s <= t`` only (the mask ``tril``, aligned at
        the top left, as JAX's).
    Returns:
      ``(..., T, N, H)``: the attended values.

    Example::

        q = k = v = np.random.default_rng(0).standard_normal((2, 5, 4, 8))   # B, T, N, H
        out = dot_product_attention(q, k, v, is_causal=True)                  # (2, 5, 4, 8)
    """
    qs, ks, vs = (core.shape_of(a) for a in (query, key, value))
    what = "dot_product_attention"
    if len(qs) < 3 or len(ks) < 3:
        raise ShapeError(f"{what}: query and key must be (..., T, N, H) and (..., S, K, H), got shapes {qs} and {ks}")
    if ks != vs:
        raise ShapeError(f"{what}: key and value must have one shape, got {ks} and {vs}")
    if qs[-1] != ks[-1]:
        raise ShapeError(f"{what}: query and key heads must have one size H, got {qs[-1]} and {ks[-1]} "
                         f"(shapes {qs} and {ks})")
    n, k_heads = qs[-2], ks[-2]
    if k_heads == 0 or n % k_heads:
        raise ShapeError(f"{what}: the number of key/value heads {k_heads} must divide the number of query heads {n}")
    dtypes = {core.dtype_of(a) for a in (query, key, value)}
    if len(dtypes) != 1:
        raise ShapeError(f"{what}: query, key and value must share one dtype, got "
                         + ", ".join(str(core.dtype_of(a)) for a in (query, key, value)))
    dtype = dtypes.pop()
    t, s, h = qs[-3], ks[-3], qs[-1]
    q = cnp.moveaxis(query, -2, -3)  # (..., N, T, H)
    k = cnp.moveaxis(key, -2, -3)  # (..., K, S, H)
    v = cnp.moveaxis(value, -2, -3)
    if k_heads != n:
        k, v = (_repeat_heads(a, n // k_heads) for a in (k, v))
    logits = cnp.matmul(q, cnp.swapaxes(k, -1, -2))  # (..., N, T, S)
    logits = ew.mul(logits, 1.0 / math.sqrt(h) if scale is None else scale)
    if bias is not None:
        logits = ew.add(logits, bias)
    if mask is not None or is_causal:
        keep = None
        if mask is not None:
            if core.dtype_of(mask) != np.bool_:
                raise ShapeError(f"{what}: mask must be boolean (True where a query may attend), "
                                 f"got {core.dtype_of(mask)}")
            keep = mask
        if is_causal:
            xp = backend.xp_of(query)
            causal = xp.tril(xp.ones((t, s), dtype=bool))  # a constant on the query's device
            keep = causal if keep is None else cnp.logical_and(keep, causal)
        logits = ew.select(keep, logits, float(-0.7 * np.finfo(dtype).max))
    # softmax as exp(z - max) / Σ: with every key masked, z - max is exactly 0 (a log-sum-exp
    # at -0.7·finfo.max would lose the log S to rounding); softmax is shift-invariant, so
    # the max needs no derivative
    e = cnp.exp(ew.sub(logits, ew.stop_gradient(cnp.max(logits, axis=-1, keepdims=True))))
    probs = ew.div(e, cnp.sum(e, axis=-1, keepdims=True))
    out = cnp.matmul(probs, v)  # (..., N, T, H)
    return cnp.moveaxis(out, -3, -2)


def _repeat_heads(x, g):
    """``(..., K, S, H) -> (..., K·g, S, H)``, each head repeated ``g`` times in a row."""
    s = core.shape_of(x)
    lead, kh, rest = s[:-3], s[-3], s[-2:]
    x = cnp.broadcast_to(cnp.expand_dims(x, -3), lead + (kh, g) + rest)
    return cnp.reshape(x, lead + (kh * g,) + rest)
