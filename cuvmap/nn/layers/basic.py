"""The basic layers: with parameters :func:`Dense`, :func:`Conv`, :func:`ConvTranspose`,
:func:`LayerNorm`, :func:`GroupNorm`; without :func:`MaxPool`, :func:`AvgPool`,
:data:`Flatten` and the elementwise activations (:func:`elementwise`, :data:`Relu`, ...).
"""
import numpy as np

from cuvmap.core import ShapeError
from cuvmap.lax import pooling as lax_pooling
from cuvmap.lax.convolution import conv_output_shape, conv_params
from cuvmap.nn import functional as F
from cuvmap.nn.layers.layer import (
    ExampleRank, Layer, _check_dtype, _check_input_dtype, _kaiming_uniform, _rng, _spatial_input, _xp_of_rng,
)
from cuvmap.window import spatial_tuple

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
    conv_transpose] in ``cuvmap/nn/functional.py``)."""

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
