"""stax-style layers: each layer is a pair ``(init, apply)``.

- ``init(rng, input_shape, dtype=np.float32) -> (output_shape, params)``: ``input_shape``
  includes the batch dim, as in stax (``(-1, C, H, W)`` or a concrete ``N``); ``params`` is
  a pytree (dicts of arrays, ``()`` for layers without parameters).
- ``apply(params, x) -> y``: ``x`` is a batch ``(N, ...)`` **or a single example** without
  the batch dim, which is what a per-example loss sees under ``vmap``::

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
seed) gives NumPy arrays and a ``cupy.random.Generator`` (``cupy.random.default_rng(0)``)
gives CuPy arrays on the current GPU. ``dtype`` (float32 by default) is the parameters'
dtype; pass ``np.float64`` for gradient checks.

Layouts: Conv weights are torch's ``(O, C/groups, K...)`` (ConvTranspose
``(C, O/groups, K...)``), but Dense is stax's ``x @ weight + bias`` with ``weight``
``(in, out)``. Parameter dicts use torch's names ``weight`` and ``bias``.
"""
import collections

import numpy as np

from cuvmap import backend, core, tree
from cuvmap.core import ShapeError
from cuvmap.lax import pooling as lax_pooling
from cuvmap.lax.conv import conv_output_shape, conv_params
from cuvmap.nn import functional as F

Layer = collections.namedtuple("Layer", ["init", "apply"])
Layer.__doc__ = """A layer: ``init(rng, input_shape, dtype=np.float32) -> (output_shape, params)`` and
``apply(params, x) -> y``. A plain pair ``(init, apply)`` works wherever a Layer does."""


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
    if isinstance(rng, (int, np.integer)):
        return np.random.default_rng(int(rng))
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
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise ValueError(f"parameters must have a floating dtype, got {dtype}")
    return dtype


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

    def init(rng, input_shape, dtype=np.float32):
        input_shape = tuple(input_shape)
        fan_in = input_shape[-1]
        params = _kaiming_uniform(_rng(rng), (fan_in, out_features), fan_in, (out_features,) if bias else None,
                                  _check_dtype(dtype))
        return input_shape[:-1] + (out_features,), params

    def apply(params, x):
        y = x @ params["weight"]
        return y + params["bias"] if "bias" in params else y

    return Layer(init, apply)


def Conv(out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True):
    """Convolution layer (:func:`cuvmap.nn.conv`, torch's ``nn.ConvNd``), 1-3 spatial dims
    taken from the input shape at init. ``padding`` may be ``"same"`` or ``"valid"``.
    ``apply`` accepts ``(N, C, S...)`` or one example ``(C, S...)``."""

    def init(rng, input_shape, dtype=np.float32):
        input_shape, nd = _spatial_input(input_shape, "Conv")
        c = input_shape[1]
        if c % groups or out_channels % groups:
            raise ShapeError(f"Conv: channels in {c} and out {out_channels} must be divisible by groups {groups}")
        kernel = core.spatial_tuple(kernel_size, nd, "kernel_size", "Conv")
        weight_shape = (out_channels, c // groups) + kernel
        if isinstance(padding, str) and padding not in ("same", "valid"):
            raise ShapeError(f"Conv: padding must be an int, a tuple, 'same' or 'valid', got {padding!r}")
        if padding == "same":
            if any(s != 1 for s in core.spatial_tuple(stride, nd, "stride", "Conv")):
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

    def apply(params, x):
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

    def init(rng, input_shape, dtype=np.float32):
        input_shape, nd = _spatial_input(input_shape, "ConvTranspose")
        c = input_shape[1]
        if c % groups or out_channels % groups:
            raise ShapeError(
                f"ConvTranspose: channels in {c} and out {out_channels} must be divisible by groups {groups}")
        kernel = core.spatial_tuple(kernel_size, nd, "kernel_size", "ConvTranspose")
        F.check_transpose_padding(padding, kernel, stride, dilation, "ConvTranspose")
        weight_shape = (c, out_channels // groups) + kernel
        out_shape = conv_output_shape(
            input_shape, weight_shape,
            **conv_params(nd, stride, padding, dilation, True, output_padding, groups))
        fan_in = (out_channels // groups) * int(np.prod(kernel))
        params = _kaiming_uniform(_rng(rng), weight_shape, fan_in, (out_channels,) if bias else None,
                                  _check_dtype(dtype))
        return out_shape, params

    def apply(params, x):
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

    def init(rng, input_shape, dtype=np.float32):
        input_shape = tuple(input_shape)
        k = len(normalized_shape)
        if input_shape[len(input_shape) - k:] != normalized_shape or len(input_shape) <= k:
            raise ShapeError(f"LayerNorm: input_shape {input_shape} must be (N, ..., *{normalized_shape})")
        if not elementwise_affine:
            return input_shape, {}
        xp, dtype = _xp_of_rng(_rng(rng)), _check_dtype(dtype)
        return input_shape, {"weight": xp.ones(normalized_shape, dtype), "bias": xp.zeros(normalized_shape, dtype)}

    def apply(params, x):
        return F.layer_norm(x, normalized_shape, params.get("weight"), params.get("bias"), eps)

    return Layer(init, apply)


def GroupNorm(num_groups, eps=1e-5, affine=True):
    """Group normalization of each example's channels in ``num_groups`` groups
    (:func:`cuvmap.nn.group_norm`, torch's ``nn.GroupNorm``); ``weight`` and ``bias``
    ``(C,)`` when ``affine``. ``apply`` accepts ``(N, C, S...)`` or one example ``(C, S...)``
    (the example rank is kept in the params, NOTE [single examples in apply])."""

    def init(rng, input_shape, dtype=np.float32):
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

    def apply(params, x):
        rank = params["example_rank"]
        rank.is_batched(x, "GroupNorm")  # checks the rank: one example or a batch
        return F.group_norm(x, num_groups, params.get("weight"), params.get("bias"), eps,
                            spatial_dims=rank.rank - 1)

    return Layer(init, apply)


# ---------------------------------------------------------------------------------------
# Layers without parameters
# ---------------------------------------------------------------------------------------


def _pool_layer(name, pool_fn, kernel_size, stride, padding, **extra):
    def init(rng, input_shape, dtype=np.float32):
        input_shape, nd = _spatial_input(input_shape, name)
        params = lax_pooling.pool_params(
            nd, core.spatial_tuple(kernel_size, nd, "kernel_size", name),
            None if stride is None else core.spatial_tuple(stride, nd, "stride", name),
            core.spatial_tuple(padding, nd, "padding", name))
        out_shape = lax_pooling.pool_output_shape(input_shape, **params)
        return out_shape, ExampleRank(len(input_shape) - 1)

    def apply(params, x):
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


def _flatten_init(rng, input_shape, dtype=np.float32):
    input_shape = tuple(input_shape)
    if len(input_shape) < 2:
        raise ShapeError(f"Flatten: input_shape {input_shape} must be (N, ...)")
    return (input_shape[0], int(np.prod(input_shape[1:], dtype=np.int64))), ExampleRank(len(input_shape) - 1)


def _flatten_apply(params, x):
    return F.flatten(x, 1) if params.is_batched(x, "Flatten") else F.flatten(x)


# Flattens each example: ``(N, d...) -> (N, Π d)``; one example ``(d...) -> (Π d,)``.
Flatten = Layer(_flatten_init, _flatten_apply)


def elementwise(fn, **fn_kwargs):
    """A layer without parameters applying ``fn(x, **fn_kwargs)`` (stax's ``elementwise``)."""

    def init(rng, input_shape, dtype=np.float32):
        return tuple(input_shape), ()

    def apply(params, x):
        return fn(x, **fn_kwargs)

    return Layer(init, apply)


Relu = elementwise(F.relu)
Gelu = elementwise(F.gelu, approximate="tanh")  # the tanh approximation (see nn.gelu)
Tanh = elementwise(F.tanh)
Sigmoid = elementwise(F.sigmoid)
LogSoftmax = elementwise(F.log_softmax, axis=-1)


# ---------------------------------------------------------------------------------------
# Combinators
# ---------------------------------------------------------------------------------------


def Serial(*layers):
    """Layers in sequence: ``init`` threads the shapes through and returns the list of the
    layers' params; ``apply(params, x)`` applies each layer to the previous output."""
    layers = tuple(Layer(*layer) for layer in layers)

    def init(rng, input_shape, dtype=np.float32):
        rng = _rng(rng)
        params = []
        shape = tuple(input_shape)
        for layer in layers:
            shape, p = layer.init(rng, shape, dtype=dtype)
            params.append(p)
        return shape, params

    def apply(params, x):
        if len(params) != len(layers):
            raise ValueError(f"Serial: {len(params)} params for {len(layers)} layers")
        for layer, p in zip(layers, params):
            x = layer.apply(p, x)
        return x

    return Layer(init, apply)
