"""Functional neural-network ops with ``torch.nn.functional``'s conventions, built from
cuvmap's primitives (so they are transformable like everything else)."""
import numpy as np

from cuvmap import core
from cuvmap import numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.lax.conv import conv as lax_conv_op
from cuvmap.lax import shape as lax_shape


def _ntuple(v, nd, name, what):
    if isinstance(v, (int, np.integer)):
        return (int(v),) * nd
    v = tuple(int(i) for i in v)
    if len(v) != nd:
        raise ShapeError(f"{what}: {name} {v} must have one entry per spatial dim ({nd})")
    return v


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
    stride = _ntuple(stride, nd, "stride", "conv")
    dilation = _ntuple(dilation, nd, "dilation", "conv")
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


def relu(x):
    """``max(x, 0)``; its derivative at 0 is 0."""
    return cnp.where(x > 0, x, 0)


def log_softmax(x, axis=-1):
    """``x - logsumexp(x)`` along ``axis``."""
    return x - cnp.logsumexp(x, axis=axis, keepdims=True)


def softmax(x, axis=-1):
    return cnp.exp(log_softmax(x, axis))


def cross_entropy(logits, labels):
    """Mean cross entropy of ``logits`` (..., K) against integer labels (...) or
    probabilities / one-hot targets (..., K)."""
    logp = log_softmax(logits, -1)
    if core.is_float(labels) and len(core.shape_of(labels)) == len(core.shape_of(logits)):
        return -cnp.mean(cnp.sum(logp * labels, axis=-1))
    picked = cnp.take_along_axis(logp, cnp.expand_dims(labels, -1), axis=-1)
    return -cnp.mean(picked)
