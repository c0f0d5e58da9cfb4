"""The layers of a transformer block besides :func:`~cuvmap.nn.layers.LayerNorm` and
:func:`~cuvmap.nn.layers.Dense`: :func:`Dropout` (from explicit keys), :func:`Embedding`
and :func:`MultiHeadAttention`.
"""
import numpy as np

from cuvmap import backend, core, random
from cuvmap import numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.nn.attention import dot_product_attention
from cuvmap.nn.layers.layer import Layer, _check_dtype, _check_input_dtype, _kaiming_uniform, _rng
from cuvmap.core.bfloat16 import kind_of

# ---------------------------------------------------------------------------------------
# Dropout, Embedding, MultiHeadAttention
# ---------------------------------------------------------------------------------------


def Dropout(rate, mode="train"):
    """Dropout: in ``"train"`` mode each element is zeroed with probability ``rate`` and
    the others scaled by ``1 / (1 - rate)``; in ``"eval"`` mode the identity.

    ``rate`` is the probability of *dropping*, as in torch and Flax — not stax's
    ``Dropout(rate)``, whose ``rate`` is the probability of keeping.

    ``apply(params, x, rng=key, mode=None)``: ``key`` is a :mod:`cuvmap.random` key, needed
    in train mode; ``mode`` overrides the mode given here (``net.apply(params, x,
    mode="eval")`` evaluates a network built for training). The mask is
    ``random.bernoulli(key, 1 - rate, x.shape)`` (float32 uniforms whatever the data's
    dtype, so one key gives one mask), a function of the key alone: in a per-example loss
    under ``vmap`` with one key per example (``random.split(key, n)``), every example gets
    its own mask, and the same one it gets in a loop.
    """
    rate = float(rate)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"Dropout: rate must be in [0, 1] (the probability of dropping), got {rate}")
    default_mode = _check_mode(mode)

    def init(rng, input_shape, dtype=None):
        return tuple(input_shape), ()

    def apply(params, x, *, rng=None, mode=None, **kwargs):
        m = default_mode if mode is None else _check_mode(mode)
        if m == "eval" or rate == 0.0:
            return x
        if rng is None:
            raise ValueError("Dropout in train mode needs a key: apply(params, x, rng=key) with a cuvmap.random "
                             "key (one per example under vmap, from random.split), or mode='eval'")
        if kind_of(core.dtype_of(x)) != "f":
            raise ShapeError(f"Dropout: the input must be floating point, got {core.dtype_of(x)}")
        if rate == 1.0:
            return cnp.zeros_like(x)
        keep = random.bernoulli(_key_like(rng, x), np.float32(1.0 - rate), core.shape_of(x))
        return ew.select(keep, ew.div(x, 1.0 - rate), 0.0)

    return Layer(init, apply)


def _check_mode(mode):
    if mode not in ("train", "eval"):
        raise ValueError(f"Dropout: mode must be 'train' or 'eval', got {mode!r}")
    return mode


def _key_like(key, x):
    """``key`` on ``x``'s device when ``key`` is a concrete array elsewhere (keys are
    usually made on the CPU by ``random.key``); a traced key cannot move, so a key traced
    on another device than ``x`` raises and says where to move it."""
    key_device, x_device = backend.backend_name(key), backend.backend_name(x)
    if key_device == x_device:
        return key
    if isinstance(key, core.Tracer):
        raise ValueError(f"Dropout: the key is on the {key_device} and the input on the {x_device}; move the keys "
                         f"before the transform (cuvmap.device_put(keys, {x_device!r}))")
    return backend.device_put(key, x_device)


def Embedding(num_embeddings, embedding_dim):
    """A lookup table (torch's ``nn.Embedding``): ``apply(params, ids)`` maps integer ids of
    any shape to ``ids.shape + (embedding_dim,)`` rows of ``weight``
    ``(num_embeddings, embedding_dim)``, initialised from ``N(0, 1)`` as in torch. The
    gradient of ``weight`` scatter-adds into the rows used. One example ``(L,)`` or a batch
    ``(N, L)`` alike."""
    num_embeddings, embedding_dim = int(num_embeddings), int(embedding_dim)

    def init(rng, input_shape, dtype=None):
        dtype = _check_dtype(dtype)
        rng = _rng(rng)
        weight = rng.standard_normal((num_embeddings, embedding_dim), dtype=np.float32 if dtype.itemsize < 4 else dtype)
        return tuple(input_shape) + (embedding_dim,), {"weight": weight.astype(dtype, copy=False)}

    def apply(params, ids, **kwargs):
        if kind_of(core.dtype_of(ids)) not in "iu":
            raise ShapeError(f"Embedding: ids must be integers, got {core.dtype_of(ids)} (shape "
                             f"{core.shape_of(ids)}); cast them with ids.astype(np.int64)")
        return cnp.take(params["weight"], ids, axis=0)

    return Layer(init, apply)


def MultiHeadAttention(num_heads, qkv_features=None, out_features=None, bias=True, is_causal=False):
    """Multi-head attention (Flax's ``MultiHeadDotProductAttention``, torch's
    ``nn.MultiheadAttention`` with ``batch_first=True``), on
    :func:`cuvmap.nn.dot_product_attention`.

    Self-attention: ``apply(params, x, mask=None)`` with ``x`` ``(N, T, D)`` or one example
    ``(T, D)``; cross-attention: ``x = (x_q, x_kv)`` with ``x_kv`` ``(N, S, D_kv)``, and
    ``init`` given the pair of shapes. The queries, keys and values are Dense projections
    to ``qkv_features`` (default ``D``) split into ``num_heads`` heads; the attended values
    are projected to ``out_features`` (default ``D``). ``mask`` (booleans, True where a
    query may attend) broadcasts to ``(..., num_heads, T, S)``; ``is_causal`` masks the
    future. Every statistic is per example, so it is valid in per-example losses.

    Params: ``{"query", "key", "value", "out"}``, each a Dense layer's
    ``{"weight", "bias"}`` (torch's Linear initialisation).
    """
    num_heads = int(num_heads)

    def init(rng, input_shape, dtype=None):
        rng, dtype = _rng(rng), _check_dtype(dtype)
        cross = len(input_shape) == 2 and all(isinstance(s, (tuple, list)) for s in input_shape)
        q_shape, kv_shape = (tuple(input_shape[0]), tuple(input_shape[1])) if cross else (tuple(input_shape),) * 2
        if len(q_shape) < 2 or len(kv_shape) < 2:
            raise ShapeError(f"MultiHeadAttention: input_shape {input_shape} must be (N, T, D) "
                             "(or a pair of them for cross-attention)")
        features = q_shape[-1] if qkv_features is None else int(qkv_features)
        if features % num_heads:
            raise ShapeError(f"MultiHeadAttention: qkv_features {features} must be divisible by num_heads {num_heads}")
        out = q_shape[-1] if out_features is None else int(out_features)
        params = {}
        for name, d_in, d_out in (("query", q_shape[-1], features), ("key", kv_shape[-1], features),
                                  ("value", kv_shape[-1], features), ("out", features, out)):
            params[name] = _kaiming_uniform(rng, (d_in, d_out), d_in, (d_out,) if bias else None, dtype)
        return q_shape[:-1] + (out,), params

    def project(p, x):
        y = x @ p["weight"]
        return y + p["bias"] if "bias" in p else y

    def apply(params, x, *, mask=None, **kwargs):
        x_q, x_kv = (x[0], x[1]) if isinstance(x, (tuple, list)) else (x, x)
        _check_input_dtype(x_q, params["query"]["weight"], "MultiHeadAttention")
        _check_input_dtype(x_kv, params["key"]["weight"], "MultiHeadAttention")
        features = core.shape_of(params["query"]["weight"])[1]
        heads = lambda y: cnp.reshape(y, core.shape_of(y)[:-1] + (num_heads, features // num_heads))  # noqa: E731
        q = heads(project(params["query"], x_q))
        k = heads(project(params["key"], x_kv))
        v = heads(project(params["value"], x_kv))
        att = dot_product_attention(q, k, v, mask=mask, is_causal=is_causal)  # (..., T, heads, head_dim)
        return project(params["out"], cnp.reshape(att, core.shape_of(att)[:-2] + (features,)))

    return Layer(init, apply)
