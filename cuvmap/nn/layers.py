"""stax-style layers: each layer is a pair ``(init, apply)``.

- ``init(rng, input_shape, dtype=None) -> (output_shape, params)``: ``input_shape``
  includes the batch dim, as in stax (``(-1, C, H, W)`` or a concrete ``N``); ``params`` is
  a pytree (dicts of arrays, ``()`` for layers without parameters); ``dtype=None`` is
  ``cuvmap.config.default_float`` (float32 unless changed).
- ``apply(params, x, **kwargs) -> y``: ``x`` is a batch ``(N, ...)`` **or a single
  example** without the batch dim, which is what a per-example loss sees under ``vmap``.
  Keyword arguments are stax's: ``rng=key`` (a :mod:`cuvmap.random` key, which the
  combinators split among their layers, NOTE [keys through combinators]), ``mode=`` for
  :func:`Dropout`, ``mask=`` for :func:`MultiHeadAttention`; a layer ignores those it does
  not use::

      init, apply = Serial(Conv(8, 3, padding=1), Relu, MaxPool(2), Flatten, Dense(10), LogSoftmax)
      _, params = init(np.random.default_rng(0), (-1, 1, 28, 28))
      logp = apply(params, xs)                              # (N, 10)
      def loss(params, x, y):                               # x: one example (1, 28, 28)
          return -apply(params, x)[y]
      per_example = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)

NOTE [single examples in apply]
How does ``apply`` tell a batch from a single example? From ranks, as torch does for
unbatched inputs: a layer knows the rank of one example's input and accepts that rank or
one more (the functional ops need the same information: NOTE [batch or one example] in
``functional.py``). Convolutions read it from their weight (``C, S...`` for a weight of
rank ``2 + len(S)``); Dense, LayerNorm and the elementwise layers act on trailing dims and
need no rank. Pooling, Flatten and GroupNorm have no such weight, so their ``init``
records the example rank in the params as an :class:`ExampleRank`: a pytree node
*without leaves* (a static field), which ``vmap``, ``grad`` and the optimizers carry
through untouched, and which gradients reproduce (``grads`` has the same structure as
``params``); ``apply`` passes ``spatial_dims = rank − 1`` to the functional op.

Initialization follows torch's defaults (Kaiming-uniform with ``a = √5``): a weight with
``fan_in`` inputs per output and its bias are drawn from ``U(−1/√fan_in, 1/√fan_in)``.
``fan_in`` is ``in_features`` for Dense, ``C/groups · Π kernel`` for Conv and (as torch
computes it from the weight's second dim) ``out_channels/groups · Π kernel`` for
ConvTranspose. Norm layers start at ``weight = 1``, ``bias = 0``.

Devices: the arrays are created by ``rng``, so a ``numpy.random.Generator`` (or an int
seed, or a :mod:`cuvmap.random` key as stax's ``init`` takes) gives NumPy arrays and a
``cupy.random.Generator`` (``cupy.random.default_rng(0)``) gives CuPy arrays on the
current GPU. ``dtype`` is the parameters' dtype (``None``: the
``cuvmap.config.default_float`` setting, float32 unless changed); pass ``np.float64``, or
``cuvmap.config.update("default_float", "float64")`` once, for gradient checks. Data and
parameters must share the dtype: the layers with weights raise, naming both dtypes and
the fix, instead of promoting silently (NOTE [one dtype for data and parameters]).

Combinators (stax's): :func:`Serial`, :func:`parallel` (also ``Parallel``),
:func:`FanOut`, :func:`FanInSum`, :func:`FanInConcat`, :data:`Identity`, and
:func:`Residual` built from them, so a ResNet block is
``Residual(Conv(c, 3, padding=1), GroupNorm(g), Relu, Conv(c, 3, padding=1))``.

Layouts: Conv weights are torch's ``(O, C/groups, K...)`` (ConvTranspose
``(C, O/groups, K...)``), but Dense is stax's ``x @ weight + bias`` with ``weight``
``(in, out)``. Parameter dicts use torch's names ``weight`` and ``bias``.
"""
import collections
import functools
import inspect

import numpy as np

from cuvmap import backend, config, core, random, tree
from cuvmap import numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax import pooling as lax_pooling
from cuvmap.lax.convolution import conv_output_shape, conv_params
from cuvmap.nn import functional as F
from cuvmap.nn.attention import dot_product_attention
from cuvmap.window import spatial_tuple

Layer = collections.namedtuple("Layer", ["init", "apply"])
Layer.__doc__ = """A layer: ``init(rng, input_shape, dtype=None) -> (output_shape, params)`` and
``apply(params, x, **kwargs) -> y``. A plain pair ``(init, apply)`` works wherever a Layer
does (the combinators pass it only the keyword arguments its ``apply`` accepts)."""


class ExampleRank:
    """The rank of one example's input to a layer, kept in its params (NOTE [single
    examples in apply]). A pytree node with no leaves: transforms and optimizers pass it
    through, and it compares equal by value so that ``params`` and ``grads`` share one
    tree structure."""

    __slots__ = ("rank",)

    def __init__(self, rank):
        self.rank = int(rank)

    def __eq__(self, other):
        return isinstance(other, ExampleRank) and other.rank == self.rank

    def __hash__(self):
        return hash((ExampleRank, self.rank))

    def __repr__(self):
        return f"ExampleRank({self.rank})"

    def is_batched(self, x, what):
        """True for a batch (rank + 1), False for one example (rank); raises otherwise."""
        nd = len(core.shape_of(x))
        if nd == self.rank:
            return False
        if nd == self.rank + 1:
            return True
        raise ShapeError(f"{what}: input of shape {core.shape_of(x)} must have rank {self.rank} (one example) "
                         f"or {self.rank + 1} (a batch), as at init")


tree.register_pytree_node(ExampleRank, lambda e: ((), e.rank), lambda rank, _: ExampleRank(rank))


# ---------------------------------------------------------------------------------------
# Helpers: random numbers and arrays on the rng's device
# ---------------------------------------------------------------------------------------


def _rng(rng):
    """A generator from an int seed, a :mod:`cuvmap.random` key (as stax's ``init`` takes:
    its two words seed a NumPy generator, or a CuPy one for a key on the GPU) or a
    generator itself."""
    if isinstance(rng, (int, np.integer)):
        return np.random.default_rng(int(rng))
    if getattr(rng, "shape", None) == (2,) and getattr(rng, "dtype", None) == np.uint32:
        words = backend.device_put(rng, "cpu").tolist()
        seed = (int(words[0]) << 32) | int(words[1])
        if backend.is_cupy_array(rng):
            return backend.xp_for("gpu").random.default_rng(seed)
        return np.random.default_rng(seed)
    return rng


def _xp_of_rng(rng):
    if type(rng).__module__.startswith("cupy"):
        return backend.cupy_module() or backend.xp_for("gpu")
    return np


def _uniform(rng, shape, bound, dtype):
    """``U(−bound, bound)`` of ``shape`` and ``dtype``, drawn by ``rng`` on its device."""
    u = rng.random(tuple(shape), dtype=np.dtype(dtype))
    return (u * (2 * bound) - bound).astype(dtype, copy=False)


def _check_dtype(dtype):
    dtype = config.default_float if dtype is None else np.dtype(dtype)
    if dtype.kind != "f":
        raise ValueError(f"parameters must have a floating dtype, got {dtype}")
    return dtype


# NOTE [one dtype for data and parameters]
# ``float32 data @ float64 weights`` would silently compute in float64 (NumPy's promotion)
# and return float64, and a convolution would fail deep inside with "operands must share
# one dtype". Both are usually one mistake — parameters initialised in one dtype and data
# loaded in another — so the layers with weights compare the two dtypes (a cheap check of
# avals, under every transform) and raise a ShapeError that names both and the two fixes.
def _check_input_dtype(x, param, what):
    x_dtype, p_dtype = core.dtype_of(x), core.dtype_of(param)
    if x_dtype == p_dtype:
        return
    fix = f"cast the input (x.astype(np.{p_dtype.name}))"
    if x_dtype.kind == "f":
        fix += (f", or create the parameters in {x_dtype.name} (init(rng, input_shape, dtype=np.{x_dtype.name}), "
                f"or cuvmap.config.update('default_float', '{x_dtype.name}') before init)")
    raise ShapeError(f"{what}: the input has dtype {x_dtype} but the parameters have dtype {p_dtype}; {fix}")


def _kaiming_uniform(rng, weight_shape, fan_in, bias_shape, dtype):
    """torch's default init: weight and bias from ``U(−1/√fan_in, 1/√fan_in)``."""
    bound = 1.0 / float(np.sqrt(fan_in))
    params = {"weight": _uniform(rng, weight_shape, bound, dtype)}
    if bias_shape is not None:
        params["bias"] = _uniform(rng, bias_shape, bound, dtype)
    return params


def _spatial_input(input_shape, what):
    input_shape = tuple(input_shape)
    nd = len(input_shape) - 2
    if nd not in (1, 2, 3):
        raise ShapeError(f"{what}: input_shape {input_shape} must be (N, C, S...) with 1-3 spatial dims")
    return input_shape, nd


# ---------------------------------------------------------------------------------------
# Layers with parameters
# ---------------------------------------------------------------------------------------


def Dense(out_features, bias=True):
    """Fully connected layer ``y = x @ weight + bias`` on the last axis; ``weight`` is
    ``(in_features, out_features)``. Any leading dims (a batch, or none for one example)."""
    out_features = int(out_features)

    def init(rng, input_shape, dtype=None):
        input_shape = tuple(input_shape)
        fan_in = input_shape[-1]
        params = _kaiming_uniform(_rng(rng), (fan_in, out_features), fan_in, (out_features,) if bias else None,
                                  _check_dtype(dtype))
        return input_shape[:-1] + (out_features,), params

    def apply(params, x, **kwargs):
        _check_input_dtype(x, params["weight"], "Dense")
        y = x @ params["weight"]
        return y + params["bias"] if "bias" in params else y

    return Layer(init, apply)


def Conv(out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True):
    """Convolution layer (:func:`cuvmap.nn.conv`, torch's ``nn.ConvNd``), 1-3 spatial dims
    taken from the input shape at init. ``padding`` may be ``"same"`` or ``"valid"``.
    ``apply`` accepts ``(N, C, S...)`` or one example ``(C, S...)``."""

    def init(rng, input_shape, dtype=None):
        input_shape, nd = _spatial_input(input_shape, "Conv")
        c = input_shape[1]
        if c % groups or out_channels % groups:
            raise ShapeError(f"Conv: channels in {c} and out {out_channels} must be divisible by groups {groups}")
        kernel = spatial_tuple(kernel_size, nd, "kernel_size", "Conv")
        weight_shape = (out_channels, c // groups) + kernel
        if isinstance(padding, str) and padding not in ("same", "valid"):
            raise ShapeError(f"Conv: padding must be an int, a tuple, 'same' or 'valid', got {padding!r}")
        if padding == "same":
            if any(s != 1 for s in spatial_tuple(stride, nd, "stride", "Conv")):
                raise ShapeError(f"Conv: padding='same' needs stride 1, got {stride}")
            out_shape = input_shape[:1] + (out_channels,) + tuple(input_shape[2:])
        else:
            out_shape = conv_output_shape(
                input_shape, weight_shape,
                **conv_params(nd, stride, 0 if padding == "valid" else padding, dilation, False, 0, groups))
        fan_in = (c // groups) * int(np.prod(kernel))
        params = _kaiming_uniform(_rng(rng), weight_shape, fan_in, (out_channels,) if bias else None,
                                  _check_dtype(dtype))
        return out_shape, params

    def apply(params, x, **kwargs):
        _check_input_dtype(x, params["weight"], "Conv")
        return F.conv(x, params["weight"], params.get("bias"), stride=stride, padding=padding, dilation=dilation,
                      groups=groups)

    return Layer(init, apply)


def ConvTranspose(out_channels, kernel_size, stride=1, padding=0, output_padding=0, dilation=1, groups=1,
                  bias=True):
    """Transposed convolution layer (:func:`cuvmap.nn.conv_transpose`, torch's
    ``nn.ConvTransposeNd``); weight ``(C, O/groups, K...)``. ``apply`` accepts
    ``(N, C, S...)`` or one example ``(C, S...)``. ``padding`` is an int or one per spatial
    dim: a string raises in ``init`` (NOTE [no same padding for
    conv_transpose] in ``functional.py``)."""

    def init(rng, input_shape, dtype=None):
        input_shape, nd = _spatial_input(input_shape, "ConvTranspose")
        c = input_shape[1]
        if c % groups or out_channels % groups:
            raise ShapeError(
                f"ConvTranspose: channels in {c} and out {out_channels} must be divisible by groups {groups}")
        kernel = spatial_tuple(kernel_size, nd, "kernel_size", "ConvTranspose")
        F.check_transpose_padding(padding, kernel, stride, dilation, "ConvTranspose")
        weight_shape = (c, out_channels // groups) + kernel
        out_shape = conv_output_shape(
            input_shape, weight_shape,
            **conv_params(nd, stride, padding, dilation, True, output_padding, groups))
        fan_in = (out_channels // groups) * int(np.prod(kernel))
        params = _kaiming_uniform(_rng(rng), weight_shape, fan_in, (out_channels,) if bias else None,
                                  _check_dtype(dtype))
        return out_shape, params

    def apply(params, x, **kwargs):
        _check_input_dtype(x, params["weight"], "ConvTranspose")
        return F.conv_transpose(x, params["weight"], params.get("bias"), stride=stride, padding=padding,
                                output_padding=output_padding, groups=groups, dilation=dilation)

    return Layer(init, apply)


def LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True):
    """Layer normalization over the trailing ``normalized_shape`` of each example
    (:func:`cuvmap.nn.layer_norm`, torch's ``nn.LayerNorm``); ``weight`` and ``bias`` of
    that shape when ``elementwise_affine``. Any leading dims."""
    if isinstance(normalized_shape, (int, np.integer)):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(int(s) for s in normalized_shape)

    def init(rng, input_shape, dtype=None):
        input_shape = tuple(input_shape)
        k = len(normalized_shape)
        if input_shape[len(input_shape) - k:] != normalized_shape or len(input_shape) <= k:
            raise ShapeError(f"LayerNorm: input_shape {input_shape} must be (N, ..., *{normalized_shape})")
        if not elementwise_affine:
            return input_shape, {}
        xp, dtype = _xp_of_rng(_rng(rng)), _check_dtype(dtype)
        return input_shape, {"weight": xp.ones(normalized_shape, dtype), "bias": xp.zeros(normalized_shape, dtype)}

    def apply(params, x, **kwargs):
        if "weight" in params:
            _check_input_dtype(x, params["weight"], "LayerNorm")
        return F.layer_norm(x, normalized_shape, params.get("weight"), params.get("bias"), eps)

    return Layer(init, apply)


def GroupNorm(num_groups, eps=1e-5, affine=True):
    """Group normalization of each example's channels in ``num_groups`` groups
    (:func:`cuvmap.nn.group_norm`, torch's ``nn.GroupNorm``); ``weight`` and ``bias``
    ``(C,)`` when ``affine``. ``apply`` accepts ``(N, C, S...)`` or one example ``(C, S...)``
    (the example rank is kept in the params, NOTE [single examples in apply])."""

    def init(rng, input_shape, dtype=None):
        input_shape = tuple(input_shape)
        if not 2 <= len(input_shape) <= 5 or input_shape[1] % num_groups:
            raise ShapeError(f"GroupNorm: input_shape {input_shape} must be (N, C, S...) with 0-3 spatial dims and "
                             f"C divisible by num_groups={num_groups}")
        params = {"example_rank": ExampleRank(len(input_shape) - 1)}
        if affine:
            xp, dtype = _xp_of_rng(_rng(rng)), _check_dtype(dtype)
            c = input_shape[1]
            params.update(weight=xp.ones((c,), dtype), bias=xp.zeros((c,), dtype))
        return input_shape, params

    def apply(params, x, **kwargs):
        rank = params["example_rank"]
        if "weight" in params:
            _check_input_dtype(x, params["weight"], "GroupNorm")
        rank.is_batched(x, "GroupNorm")  # checks the rank: one example or a batch
        return F.group_norm(x, num_groups, params.get("weight"), params.get("bias"), eps,
                            spatial_dims=rank.rank - 1)

    return Layer(init, apply)


# ---------------------------------------------------------------------------------------
# Layers without parameters
# ---------------------------------------------------------------------------------------


def _pool_layer(name, pool_fn, kernel_size, stride, padding, **extra):
    def init(rng, input_shape, dtype=None):
        input_shape, nd = _spatial_input(input_shape, name)
        params = lax_pooling.pool_params(
            nd, spatial_tuple(kernel_size, nd, "kernel_size", name),
            None if stride is None else spatial_tuple(stride, nd, "stride", name),
            spatial_tuple(padding, nd, "padding", name))
        out_shape = lax_pooling.pool_output_shape(input_shape, **params)
        return out_shape, ExampleRank(len(input_shape) - 1)

    def apply(params, x, **kwargs):
        params.is_batched(x, name)  # checks the rank: one example or a batch
        return pool_fn(x, kernel_size, stride, padding, spatial_dims=params.rank - 1, **extra)

    return Layer(init, apply)


def MaxPool(kernel_size, stride=None, padding=0):
    """Max pooling (:func:`cuvmap.nn.max_pool`, torch's ``nn.MaxPoolNd``); ``stride``
    defaults to ``kernel_size``; 1-3 spatial dims from the input shape at init (so an int
    kernel is never ambiguous here). ``apply`` accepts ``(N, C, S...)`` or one example
    ``(C, S...)``."""
    return _pool_layer("MaxPool", F.max_pool, kernel_size, stride, padding)


def AvgPool(kernel_size, stride=None, padding=0, count_include_pad=True):
    """Average pooling (:func:`cuvmap.nn.avg_pool`, torch's ``nn.AvgPoolNd``); as
    :func:`MaxPool`."""
    return _pool_layer("AvgPool", F.avg_pool, kernel_size, stride, padding, count_include_pad=count_include_pad)


def _flatten_init(rng, input_shape, dtype=None):
    input_shape = tuple(input_shape)
    if len(input_shape) < 2:
        raise ShapeError(f"Flatten: input_shape {input_shape} must be (N, ...)")
    return (input_shape[0], int(np.prod(input_shape[1:], dtype=np.int64))), ExampleRank(len(input_shape) - 1)


def _flatten_apply(params, x, **kwargs):
    return F.flatten(x, 1) if params.is_batched(x, "Flatten") else F.flatten(x)


# Flattens each example: ``(N, d...) -> (N, Π d)``; one example ``(d...) -> (Π d,)``.
Flatten = Layer(_flatten_init, _flatten_apply)


def elementwise(fn, **fn_kwargs):
    """A layer without parameters applying ``fn(x, **fn_kwargs)`` (stax's ``elementwise``)."""

    def init(rng, input_shape, dtype=None):
        return tuple(input_shape), ()

    def apply(params, x, **kwargs):
        return fn(x, **fn_kwargs)

    return Layer(init, apply)


Relu = elementwise(F.relu)
Gelu = elementwise(F.gelu)  # exact (erf), as torch.nn.GELU; elementwise(F.gelu, approximate="tanh") for the tanh form
Tanh = elementwise(F.tanh)
Sigmoid = elementwise(F.sigmoid)
LogSoftmax = elementwise(F.log_softmax, axis=-1)


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
        if core.dtype_of(x).kind != "f":
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
        if core.dtype_of(ids).kind not in "iu":
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


# ---------------------------------------------------------------------------------------
# Combinators
# ---------------------------------------------------------------------------------------

# NOTE [keys through combinators]
# As in stax, a combinator given ``rng=key`` splits it, one key per layer
# (``random.split(key, len(layers))``), and passes its other keyword arguments to every
# layer; ``rng=None`` reaches every layer as None. A layer's ``apply`` gets only the
# keyword arguments it accepts (all of them with ``**kwargs``, else those it names), so a
# hand-written ``apply(params, x)`` pair combines with Dropout. Splitting is a pure
# function of the key, so under ``vmap`` with one key per example each example's layers
# get their own keys — the ones a loop over examples would give them.


def _keyword_filter(fn):
    """The keyword names ``fn`` accepts, or None when it accepts any."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters
                     if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))


def _caller(layer):
    accepted = _keyword_filter(layer.apply)

    def call(params, x, rng, kwargs):
        kwargs = dict(kwargs, rng=rng)
        if accepted is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in accepted}
        return layer.apply(params, x, **kwargs)

    return call


def _split_keys(rng, n):
    if rng is None:
        return [None] * n
    keys = random.split(rng, n)
    return [keys[i] for i in range(n)]


def Serial(*layers):
    """Layers in sequence: ``init`` threads the shapes through and returns the list of the
    layers' params; ``apply(params, x, rng=None, **kwargs)`` applies each layer to the
    previous output (NOTE [keys through combinators])."""
    layers = tuple(Layer(*layer) for layer in layers)
    calls = [_caller(layer) for layer in layers]

    def init(rng, input_shape, dtype=None):
        rng = _rng(rng)
        params = []
        shape = _shape_tree(input_shape)
        for layer in layers:
            shape, p = layer.init(rng, shape, dtype=dtype)
            params.append(p)
        return shape, params

    def apply(params, x, *, rng=None, **kwargs):
        if len(params) != len(layers):
            raise ValueError(f"Serial: {len(params)} params for {len(layers)} layers")
        for call, p, key in zip(calls, params, _split_keys(rng, len(layers))):
            x = call(p, x, key, kwargs)
        return x

    return Layer(init, apply)


def parallel(*layers):
    """Layers side by side (stax's ``parallel``): the input is a sequence with one entry
    per layer, and so are the output, the output shapes and the params."""
    layers = tuple(Layer(*layer) for layer in layers)
    calls = [_caller(layer) for layer in layers]

    def init(rng, input_shape, dtype=None):
        if not isinstance(input_shape, (list, tuple)) or len(input_shape) != len(layers) or not all(
                isinstance(s, (list, tuple)) for s in input_shape):
            raise ShapeError(f"parallel: input_shape must be a sequence of {len(layers)} shapes (one per layer), "
                             f"got {input_shape}; FanOut({len(layers)}) makes one")
        rng = _rng(rng)
        shapes, params = [], []
        for layer, shape in zip(layers, input_shape):
            shape, p = layer.init(rng, shape, dtype=dtype)
            shapes.append(shape)
            params.append(p)
        return shapes, params

    def apply(params, xs, *, rng=None, **kwargs):
        if not isinstance(xs, (list, tuple)) or len(xs) != len(layers):
            raise ShapeError(f"parallel: expected a sequence of {len(layers)} inputs (one per layer), got "
                             f"{tree.describe(xs)}")
        if len(params) != len(layers):
            raise ValueError(f"parallel: {len(params)} params for {len(layers)} layers")
        keys = _split_keys(rng, len(layers))
        return [call(p, x, key, kwargs) for call, p, x, key in zip(calls, params, xs, keys)]

    return Layer(init, apply)


Parallel = parallel


def _shape_tree(shape):
    """A shape, or a list of shapes (the input of a fan-in), as tuples."""
    if isinstance(shape, (list, tuple)) and shape and all(isinstance(s, (list, tuple)) for s in shape):
        return [tuple(s) for s in shape]
    return tuple(shape)


def _identity_init(rng, input_shape, dtype=None):
    return _shape_tree(input_shape), ()


def _identity_apply(params, x, **kwargs):
    return x


# Returns its input (stax's ``Identity``): the skip branch of a residual block.
Identity = Layer(_identity_init, _identity_apply)


def FanOut(num):
    """``num`` copies of the input (a list), for :func:`parallel` branches."""
    num = int(num)

    def init(rng, input_shape, dtype=None):
        return [tuple(input_shape)] * num, ()

    def apply(params, x, **kwargs):
        return [x] * num

    return Layer(init, apply)


def _fan_in_shapes(input_shape, what):
    if not isinstance(input_shape, (list, tuple)) or not input_shape or not all(
            isinstance(s, (list, tuple)) for s in input_shape):
        raise ShapeError(f"{what}: input_shape must be a list of shapes (the outputs of parallel branches), "
                         f"got {input_shape}")
    return [tuple(s) for s in input_shape]


def _fan_in_inputs(xs, what):
    if not isinstance(xs, (list, tuple)) or not xs:
        raise ShapeError(f"{what}: expected a list of inputs (the outputs of parallel branches), got "
                         f"{tree.describe(xs)}")
    return xs


def _FanInSum():
    def init(rng, input_shape, dtype=None):
        shapes = _fan_in_shapes(input_shape, "FanInSum")
        if any(s != shapes[0] for s in shapes):
            raise ShapeError(f"FanInSum: the inputs' shapes differ: {', '.join(map(str, shapes))}")
        return shapes[0], ()

    def apply(params, xs, **kwargs):
        xs = _fan_in_inputs(xs, "FanInSum")
        return functools.reduce(ew.add, xs)

    return Layer(init, apply)


# Sums its list of inputs (stax's ``FanInSum``), which must share one shape.
FanInSum = _FanInSum()


def FanInConcat(axis=-1):
    """Concatenates its list of inputs along ``axis`` (stax's ``FanInConcat``). ``axis``
    counts in the batched layout of ``init``'s shapes (``axis=1``: the channels of
    ``(N, C, H, W)``), and ``apply`` maps it onto one example as well (the example rank
    is kept in the params, NOTE [single examples in apply])."""
    axis = int(axis)

    def init(rng, input_shape, dtype=None):
        shapes = _fan_in_shapes(input_shape, "FanInConcat")
        rank = len(shapes[0])
        if not -rank <= axis < rank or axis % rank == 0:
            raise ShapeError(f"FanInConcat: axis {axis} must name a dim of the shapes {shapes} other than the batch "
                             "dim 0")
        ax = axis % rank
        others = [s[:ax] + s[ax + 1:] for s in shapes]
        if any(len(s) != rank or o != others[0] for s, o in zip(shapes, others)):
            raise ShapeError(f"FanInConcat: the inputs' shapes {shapes} must agree except along axis {axis}")
        out = shapes[0][:ax] + (sum(s[ax] for s in shapes),) + shapes[0][ax + 1:]
        return out, ExampleRank(rank - 1)

    def apply(params, xs, **kwargs):
        xs = _fan_in_inputs(xs, "FanInConcat")
        batched = params.is_batched(xs[0], "FanInConcat")
        ax = axis % (params.rank + 1)
        return cnp.concatenate(list(xs), axis=ax if batched else ax - 1)

    return Layer(init, apply)


def Residual(*layers):
    """A residual block ``x + f(x)`` with ``f = Serial(*layers)``: stax's
    ``Serial(FanOut(2), parallel(Serial(*layers), Identity), FanInSum)``, whose params it
    has. The layers must keep the shape of their input."""
    branch = Serial(*layers)
    block = Serial(FanOut(2), parallel(branch, Identity), FanInSum)

    def init(rng, input_shape, dtype=None):
        try:
            return block.init(rng, input_shape, dtype=dtype)
        except ShapeError as err:
            if not str(err).startswith("FanInSum"):
                raise
            out_shape, _ = branch.init(_rng(0), input_shape, dtype=dtype)
            raise ShapeError(
                f"Residual: its layers map the shape {tuple(input_shape)} to {tuple(out_shape)}; a residual block "
                "adds its input to their output, so they must keep the shape (for a change of shape, project the "
                "skip branch: Serial(FanOut(2), parallel(Serial(*layers), Conv(c, 1, stride=s)), FanInSum))") from None

    return Layer(init, block.apply)
