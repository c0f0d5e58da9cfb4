"""Functional neural-network ops with ``torch.nn.functional``'s conventions, built from
cuvmap's primitives (so they are transformable like everything else).

Layouts are torch's: ``(N, C, S...)`` for convolutions, pooling and group norm, features
last for dense layers, losses and layer norm. Where torch accepts an unbatched input (a
single example without ``N``: convolutions and pooling), so do these functions, which is
what a per-example loss under ``vmap`` sees.

- convolutions: :func:`conv`, :func:`conv_transpose`;
- pooling: :func:`max_pool`, :func:`avg_pool` (1-3 spatial dims; ``max_pool2d`` and
  friends fix the number of spatial dims);
- activations: :func:`relu`, :func:`gelu` (tanh approximation), :func:`tanh`,
  :func:`sigmoid`, :func:`softmax`, :func:`log_softmax`;
- normalization: :func:`layer_norm`, :func:`group_norm`;
- losses: :func:`cross_entropy` (integer labels or probability / one-hot targets),
  :func:`mse`;
- shapes: :func:`flatten`.

NOTE [no batch norm]
Batch normalization is deliberately absent. Its statistics are means and variances over
the examples of a batch, so the output for one example depends on every other example:
the loss is not a sum of per-example terms, and "the gradient of example i" is not defined
by the batch computation. ``vmap(grad(loss))`` would silently compute something else (each
example normalized by its own statistics), and DP-SGD's per-example clipping, whose privacy
argument needs each example's contribution isolated, is invalid under it. Use
:func:`group_norm` or :func:`layer_norm`, whose statistics are per example (Opacus and
JAX's DP libraries make the same substitution).
"""
import math

import numpy as np

from cuvmap import core
from cuvmap import numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax import pooling as lax_pooling
from cuvmap.lax import shape as lax_shape
from cuvmap.lax.conv import conv as lax_conv_op


# ---------------------------------------------------------------------------------------
# Convolutions
# ---------------------------------------------------------------------------------------


def _spatial_rank(x, w, what):
    """The number of spatial dims, from the weight (torch infers it from the input, which
    may lack its batch dim)."""
    nd = len(core.shape_of(w)) - 2
    if nd not in (1, 2, 3):
        raise ShapeError(f"{what}: weight of shape {core.shape_of(w)} must be (O, C/groups, k...) with 1-3 spatial dims")
    x_rank = len(core.shape_of(x))
    if x_rank not in (nd + 1, nd + 2):
        raise ShapeError(
            f"{what}: input of shape {core.shape_of(x)} must be (N, C, {nd} spatial dims) or (C, {nd} spatial dims) "
            f"for a weight of shape {core.shape_of(w)}"
        )
    return nd, x_rank == nd + 1


def conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """Convolution (cross-correlation, as in deep learning), ``torch.nn.functional.convNd``.

    Args:
      x: ``(N, C, S...)`` or an unbatched ``(C, S...)``.
      w: ``(O, C/groups, K...)``; 1, 2 or 3 spatial dims.
      b: ``(O,)`` or None.
      stride, dilation: int or one per spatial dim.
      padding: int, one per spatial dim, ``"valid"`` (no padding) or ``"same"`` (output
        size equals input size; stride 1 only; an odd total is padded one more at the end,
        as torch does).
      groups: number of channel groups.
    Returns:
      ``(N, O, out...)`` (or ``(O, out...)`` for an unbatched input).

    Example::

        h = conv(x, w, b, padding=1)     # x (32, 1, 28, 28), w (16, 1, 3, 3) -> (32, 16, 28, 28)
    """
    nd, unbatched = _spatial_rank(x, w, "conv")
    if unbatched:
        x = lax_shape.expand_dims(x, (0,))
    stride = core.spatial_tuple(stride, nd, "stride", "conv")
    dilation = core.spatial_tuple(dilation, nd, "dilation", "conv")
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0,) * nd
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ShapeError(f"conv: padding='same' needs stride 1, got stride {stride}")
            kernel = core.shape_of(w)[2:]
            total = [d * (k - 1) for d, k in zip(dilation, kernel)]
            padding = tuple(t // 2 for t in total)
            extra = tuple(t - 2 * (t // 2) for t in total)
            if any(extra):
                x = lax_shape.pad(x, ((0, 0), (0, 0)) + tuple((0, e) for e in extra))
        else:
            raise ShapeError(f"conv: padding must be an int, a tuple, 'same' or 'valid', got {padding!r}")
    out = lax_conv_op(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return lax_shape.squeeze(out, (0,)) if unbatched else out


def conv_transpose(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Transposed convolution, ``torch.nn.functional.conv_transposeNd`` (the adjoint of
    :func:`conv` in its input; the gradient of a strided conv, an upsampling layer).

    Args:
      x: ``(N, C, S...)`` or an unbatched ``(C, S...)``.
      w: ``(C, O/groups, K...)``.
      b: ``(O,)`` or None.
      output_padding: extra size added at the end of each output dim (smaller than stride
        or dilation), to pick among the input sizes a strided conv maps to one size.
    Returns:
      ``(N, O, (S−1)·stride − 2·padding + dilation·(K−1) + output_padding + 1, ...)``.
    """
    nd, unbatched = _spatial_rank(x, w, "conv_transpose")
    if unbatched:
        x = lax_shape.expand_dims(x, (0,))
    out = lax_conv_op(
        x, w, b, stride=stride, padding=padding, dilation=dilation, transposed=True,
        output_padding=output_padding, groups=groups,
    )
    return lax_shape.squeeze(out, (0,)) if unbatched else out


# ---------------------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------------------


def _pool_rank(x, kernel_size, spatial_dims, what):
    """``(nd, unbatched)``: the number of spatial dims — from ``spatial_dims``, else from a
    tuple ``kernel_size``, else ``rank − 2`` (a batched input) — and whether ``x`` lacks
    its batch dim."""
    rank = len(core.shape_of(x))
    if spatial_dims is not None:
        nd, source = int(spatial_dims), "spatial_dims"
    elif isinstance(kernel_size, (tuple, list)):
        nd, source = len(kernel_size), f"kernel_size {tuple(kernel_size)}"
    else:
        nd, source = rank - 2, "the input's rank"
    if nd not in (1, 2, 3) or rank not in (nd + 1, nd + 2):
        raise ShapeError(
            f"{what}: input of shape {core.shape_of(x)} must be (N, C, S...) or (C, S...) with 1-3 spatial dims "
            f"(here {nd} spatial dims, from {source})")
    return nd, rank == nd + 1


def _pool(op, x, kernel_size, stride, padding, spatial_dims, what, **extra):
    nd, unbatched = _pool_rank(x, kernel_size, spatial_dims, what)
    if unbatched:
        x = lax_shape.expand_dims(x, (0,))
    params = lax_pooling.pool_params(nd, kernel_size, stride, padding)
    out = op(x, params["window"], params["stride"], params["padding"], **extra)
    return lax_shape.squeeze(out, (0,)) if unbatched else out


def max_pool(x, kernel_size, stride=None, padding=0, spatial_dims=None):
    """Max pooling, ``torch.nn.functional.max_poolNd``:
    ``out[n, c, y] = max_{0 ≤ t < k} x[n, c, y·stride − padding + t]``, padding counting as −∞.

    Args:
      x: ``(N, C, S...)`` or an unbatched ``(C, S...)``, 1-3 spatial dims.
      kernel_size: int or one per spatial dim.
      stride: int or one per spatial dim; ``None`` (default) means ``kernel_size``.
      padding: int or one per spatial dim, at most ``kernel_size // 2``.
      spatial_dims: the number of spatial dims; by default the length of a tuple
        ``kernel_size``, else ``x.ndim − 2`` (so an unbatched input needs a tuple
        ``kernel_size``, ``spatial_dims`` or one of ``max_pool1d/2d/3d``).
    Returns:
      ``(N, C, ⌊(S + 2·padding − k) / stride⌋ + 1, ...)`` (no ``N`` when unbatched).

    The gradient goes to the first maximum of each window (torch's rule, NOTE [max pool
    ties] in ``cuvmap/lax/pooling.py``). Not supported: ``dilation``, ``ceil_mode``,
    ``return_indices``.
    """
    return _pool(lax_pooling.max_pool, x, kernel_size, stride, padding, spatial_dims, "max_pool")


def avg_pool(x, kernel_size, stride=None, padding=0, count_include_pad=True, spatial_dims=None):
    """Average pooling, ``torch.nn.functional.avg_poolNd``:
    ``out[n, c, y] = (1/D) Σ_{0 ≤ t < k} x[n, c, y·stride − padding + t]``, padding counting
    as 0; ``D = Π k`` when ``count_include_pad`` (torch's default), else the number of
    window positions inside ``x``.

    Args: as :func:`max_pool`, plus ``count_include_pad``. Not supported: ``ceil_mode``,
    ``divisor_override``.
    """
    return _pool(lax_pooling.avg_pool, x, kernel_size, stride, padding, spatial_dims, "avg_pool",
                 count_include_pad=count_include_pad)


def max_pool1d(x, kernel_size, stride=None, padding=0):
    """:func:`max_pool` over one spatial dim: ``(N, C, L)`` or ``(C, L)``."""
    return max_pool(x, kernel_size, stride, padding, spatial_dims=1)


def max_pool2d(x, kernel_size, stride=None, padding=0):
    """:func:`max_pool` over two spatial dims: ``(N, C, H, W)`` or ``(C, H, W)``."""
    return max_pool(x, kernel_size, stride, padding, spatial_dims=2)


def max_pool3d(x, kernel_size, stride=None, padding=0):
    """:func:`max_pool` over three spatial dims: ``(N, C, D, H, W)`` or ``(C, D, H, W)``."""
    return max_pool(x, kernel_size, stride, padding, spatial_dims=3)


def avg_pool1d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    """:func:`avg_pool` over one spatial dim."""
    return avg_pool(x, kernel_size, stride, padding, count_include_pad, spatial_dims=1)


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    """:func:`avg_pool` over two spatial dims."""
    return avg_pool(x, kernel_size, stride, padding, count_include_pad, spatial_dims=2)


def avg_pool3d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    """:func:`avg_pool` over three spatial dims."""
    return avg_pool(x, kernel_size, stride, padding, count_include_pad, spatial_dims=3)


# ---------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------


def relu(x):
    """``max(x, 0)``; its derivative at 0 is 0."""
    return cnp.where(x > 0, x, 0)


_GELU_C = math.sqrt(2.0 / math.pi)


def gelu(x, approximate="tanh"):
    """GELU, tanh approximation:
    ``0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`` (torch's ``approximate='tanh'``).

    The exact GELU ``x · Φ(x) = 0.5 · x · (1 + erf(x/√2))`` needs ``erf``, for which cuvmap
    has no primitive yet, so ``approximate='none'`` raises. Note that torch's *default* is
    the exact form; the two differ by less than 1e-3 everywhere.
    """
    if approximate == "none":
        raise NotImplementedError(
            "gelu(approximate='none') needs erf, which cuvmap has no primitive for; use approximate='tanh'")
    if approximate != "tanh":
        raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
    inner = ew.mul(_GELU_C, ew.add(x, ew.mul(0.044715, ew.integer_pow(x, 3))))
    return ew.mul(ew.mul(0.5, x), ew.add(1.0, ew.tanh(inner)))


def tanh(x):
    """``tanh(x)``."""
    return ew.tanh(x)


def sigmoid(x):
    """``1 / (1 + exp(−x))``."""
    return ew.logistic(x)


def log_softmax(x, axis=-1):
    """``x − logsumexp(x)`` along ``axis``."""
    return x - cnp.logsumexp(x, axis=axis, keepdims=True)


def softmax(x, axis=-1):
    """``exp(x) / Σ exp(x)`` along ``axis``."""
    return cnp.exp(log_softmax(x, axis))


# ---------------------------------------------------------------------------------------
# Normalization (statistics per example; see NOTE [no batch norm])
# ---------------------------------------------------------------------------------------


def _normalize(x, axes, eps):
    """``(x − mean) / sqrt(var + eps)`` with the (biased) mean and variance over ``axes``."""
    mean = cnp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = cnp.mean(cnp.square(centered), axis=axes, keepdims=True)
    return centered * ew.rsqrt(var + eps)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer normalization, ``torch.nn.functional.layer_norm``: over the trailing
    ``len(normalized_shape)`` dims ``A``,

        y = (x − E_A[x]) / sqrt(Var_A[x] + eps) · weight + bias

    with the biased variance. Each leading index (each example) has its own statistics.

    Args:
      x: ``(..., *normalized_shape)``.
      normalized_shape: an int or a tuple, the trailing shape of ``x`` to normalize over.
      weight, bias: ``normalized_shape`` arrays or None (no scale / no shift).
    """
    if isinstance(normalized_shape, (int, np.integer)):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(int(s) for s in normalized_shape)
    shape = tuple(core.shape_of(x))
    k = len(normalized_shape)
    if k == 0 or shape[len(shape) - k:] != normalized_shape:
        raise ShapeError(f"layer_norm: input of shape {shape} does not end with normalized_shape {normalized_shape}")
    y = _normalize(x, tuple(range(len(shape) - k, len(shape))), eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """Group normalization, ``torch.nn.functional.group_norm``: the ``C`` channels of each
    example are split into ``num_groups`` groups ``G`` of ``C / num_groups`` consecutive
    channels, and for each example ``n`` and group ``G``, over the channels of ``G`` and all
    spatial positions,

        y[n, c, s] = (x[n, c, s] − E_{G,s}[x[n]]) / sqrt(Var_{G,s}[x[n]] + eps) · weight[c] + bias[c]

    with the biased variance. Statistics are per example, so per-example gradients are the
    gradients of each example's own loss.

    Args:
      x: ``(N, C, S...)`` (torch requires the batch dim; for one example, ``x[None]``).
      num_groups: divides ``C``.
      weight, bias: ``(C,)`` or None.
    """
    shape = tuple(core.shape_of(x))
    if len(shape) < 2:
        raise ShapeError(f"group_norm: input of shape {shape} must be (N, C, ...)")
    n, c = shape[:2]
    if num_groups < 1 or c % num_groups:
        raise ShapeError(f"group_norm: {c} channels are not divisible by num_groups={num_groups}")
    grouped = cnp.reshape(x, (n, num_groups, -1))
    y = cnp.reshape(_normalize(grouped, (2,), eps), shape)
    per_channel = (c,) + (1,) * (len(shape) - 2)
    if weight is not None:
        y = y * cnp.reshape(weight, per_channel)
    if bias is not None:
        y = y + cnp.reshape(bias, per_channel)
    return y


# ---------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------


def _reduce(losses, reduction, what):
    if reduction == "mean":
        return cnp.mean(losses)
    if reduction == "sum":
        return cnp.sum(losses)
    if reduction == "none":
        return losses
    raise ValueError(f"{what}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def cross_entropy(logits, labels, reduction="mean"):
    """Cross entropy of ``logits`` (..., K) against integer labels (...) or probability /
    one-hot targets (..., K):

        loss_i = −log_softmax(logits_i)[labels_i]        (integer labels)
        loss_i = −Σ_k targets_ik · log_softmax(logits_i)_k   (float targets of the logits' shape)

    reduced by ``reduction`` (``'mean'``, the default, ``'sum'`` or ``'none'``). The classes
    are on the last axis: the same as torch for ``(N, K)`` and unbatched ``(K,)`` logits
    (torch puts them on axis 1 for ``(N, K, d...)``).
    """
    logp = log_softmax(logits, -1)
    if core.is_float(labels) and len(core.shape_of(labels)) == len(core.shape_of(logits)):
        losses = -cnp.sum(logp * labels, axis=-1)
    else:
        losses = -cnp.take_along_axis(logp, cnp.expand_dims(labels, -1), axis=-1)[..., 0]
    return _reduce(losses, reduction, "cross_entropy")


def mse(prediction, target, reduction="mean"):
    """Mean squared error, ``torch.nn.functional.mse_loss``: ``(prediction − target)²``
    elementwise, reduced by ``reduction`` (``'mean'``, ``'sum'`` or ``'none'``)."""
    return _reduce(cnp.square(prediction - target), reduction, "mse")


mse_loss = mse


# ---------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------


def flatten(x, start_dim=0, end_dim=-1):
    """``torch.flatten``: merges dims ``start_dim .. end_dim`` (inclusive) into one.
    ``flatten(x)`` flattens a single example; ``flatten(x, 1)`` keeps a leading batch dim."""
    shape = tuple(core.shape_of(x))
    rank = max(len(shape), 1)
    if not (-rank <= int(start_dim) < rank and -rank <= int(end_dim) < rank):
        raise ShapeError(f"flatten: start_dim {start_dim} or end_dim {end_dim} out of range for shape {shape}")
    start, end = int(start_dim) % rank, int(end_dim) % rank
    if start > end:
        raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {shape}")
    if not shape:
        return cnp.reshape(x, (1,))
    merged = int(np.prod(shape[start:end + 1], dtype=np.int64))
    return cnp.reshape(x, shape[:start] + (merged,) + shape[end + 1:])
