"""Functional neural-network ops with ``torch.nn.functional``'s conventions, built from
cuvmap's primitives (so they are transformable like everything else).

Layouts are torch's: ``(N, C, S...)`` for convolutions, pooling and group norm, features
last for dense layers, losses and layer norm. Every function also accepts one example
without ``N`` (``(C, S...)``), which is what a per-example loss under ``vmap`` sees; see
NOTE [batch or one example] for how each one tells the two apart.

- convolutions: :func:`conv`, :func:`conv_transpose`;
- pooling: :func:`max_pool`, :func:`avg_pool` (1-3 spatial dims; ``max_pool2d`` and
  friends fix the number of spatial dims);
- activations: :func:`relu`, :func:`gelu` (exact, or the tanh approximation), :func:`tanh`,
  :func:`sigmoid`, :func:`softmax`, :func:`log_softmax`;
- normalization: :func:`layer_norm`, :func:`group_norm`;
- losses: :func:`cross_entropy` (integer class indices or class probabilities),
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

NOTE [batch or one example]
A rank-3 input may be a batch ``(N, C, L)`` or one example ``(C, H, W)``, and reading one
as the other gives a wrong network without any error (pooling only the last axis,
normalizing over the wrong axes). So a function reads the number of spatial dims only
from something that states it, and raises when nothing does:

- :func:`conv`, :func:`conv_transpose`: the weight ``(O, C/groups, K...)`` has it;
- :func:`max_pool`, :func:`avg_pool`: a tuple ``kernel_size``, ``spatial_dims``, or the
  names ``max_pool1d/2d/3d``, ``avg_pool1d/2d/3d``. An int kernel alone is accepted only
  where the rank has one reading (rank 2 is ``(C, L)``, rank 5 ``(N, C, D, H, W)``);
  on ranks 3 and 4 it raises and says what to write;
- :func:`group_norm`: ``spatial_dims`` (0-3), needed wherever the rank has two readings
  (ranks 2-4); torch's ``group_norm`` always reads ``(N, C, *)``, which for a
  per-example function under ``vmap`` would treat ``C`` as the batch;
- :func:`layer_norm`, :func:`cross_entropy`, the activations: trailing axes only, so a
  leading batch dim changes nothing; :func:`flatten` flattens what it is told to.

The stax layers (:mod:`cuvmap.nn.layers`) know the rank from ``init`` and pass it on.
"""
import math

import numpy as np

from cuvmap import core
from cuvmap import numpy as cnp
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import pooling as lax_pooling
from cuvmap.lax import shape as lax_shape
from cuvmap.lax.convolution import conv as lax_conv_op
from cuvmap.window import spatial_tuple
from cuvmap.core.bfloat16 import kind_of


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
    stride = spatial_tuple(stride, nd, "stride", "conv")
    dilation = spatial_tuple(dilation, nd, "dilation", "conv")
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
      stride, dilation: int or one per spatial dim.
      padding: int or one per spatial dim, cropped from both ends of each output dim.
        Strings (``"same"``, ``"valid"``) raise, as torch has none for transposed convs;
        the error names the ints that give ``out = in · stride`` (NOTE [no same padding
        for conv_transpose]).
      output_padding: extra size added at the end of each output dim (smaller than stride
        or dilation), to pick among the input sizes a strided conv maps to one size.
      groups: number of channel groups.
    Returns:
      ``(N, O, (S−1)·stride − 2·padding + dilation·(K−1) + output_padding + 1, ...)``
      (no ``N`` for an unbatched input).
    """
    nd, unbatched = _spatial_rank(x, w, "conv_transpose")
    check_transpose_padding(padding, core.shape_of(w)[2:], stride, dilation, "conv_transpose")
    if unbatched:
        x = lax_shape.expand_dims(x, (0,))
    out = lax_conv_op(
        x, w, b, stride=stride, padding=padding, dilation=dilation, transposed=True,
        output_padding=output_padding, groups=groups,
    )
    return lax_shape.squeeze(out, (0,)) if unbatched else out


def check_transpose_padding(padding, kernel, stride, dilation, what):
    """Raises for a string ``padding`` of a transposed convolution, with the int padding
    that gives the output size ``input · stride`` when one exists.

    NOTE [no same padding for conv_transpose]
    torch's ``conv_transposeNd`` takes only int padding, and "same" has no single meaning
    for it: a regular conv's "same" keeps the size (``out = in``), while TensorFlow's and
    Keras's transposed "same" means ``out = in · stride``, which needs a total crop of
    ``T = dilation·(K−1) + 1 − stride`` split unevenly when ``T`` is odd. Rather than pick
    one, cuvmap raises and names the torch arguments that give ``out = in · stride``:
    ``padding = ⌈T/2⌉, output_padding = 2·padding − T`` (``T ≥ 0``), or ``padding = 0,
    output_padding = −T`` (``T < 0``); none exists when that ``output_padding`` is not below
    ``max(stride, dilation)`` (stride 1 with an even kernel).
    """
    if not isinstance(padding, str):
        return
    nd = len(kernel)
    stride = spatial_tuple(stride, nd, "stride", what)
    dilation = spatial_tuple(dilation, nd, "dilation", what)
    pads, output_pads = [], []
    for k, s, d in zip(kernel, stride, dilation):
        total = d * (k - 1) + 1 - s
        pad = max(0, -(-total // 2))
        pads.append(pad)
        output_pads.append(2 * pad - total)
    valid = all(op < max(s, d) for op, s, d in zip(output_pads, stride, dilation))

    def show(values):
        return str(values[0]) if len(set(values)) == 1 else str(tuple(values))

    hint = (f"; for an output of size input·stride (TensorFlow's transposed 'same') pass "
            f"padding={show(pads)}, output_padding={show(output_pads)}" if valid else "")
    raise ShapeError(
        f"{what}: padding={padding!r} is not supported for a transposed convolution (torch's conv_transpose "
        f"has no string padding either): pass an int or one int per spatial dim{hint} "
        f"(kernel {tuple(kernel)}, stride {stride}, dilation {dilation})")


# ---------------------------------------------------------------------------------------
# Batch or one example (NOTE [batch or one example])
# ---------------------------------------------------------------------------------------

_SPATIAL_NAMES = {0: (), 1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}


def _layout(nd, batched):
    """``(N, C, H, W)``-style text for ``nd`` spatial dims, with or without ``N``."""
    return "(" + ", ".join((("N",) if batched else ()) + ("C",) + _SPATIAL_NAMES[nd]) + ")"


def _readings(rank, allowed):
    """The ``(nd, batched)`` layouts of rank ``rank`` with ``nd`` in ``allowed``."""
    return [(nd, rank == nd + 2) for nd in allowed if rank in (nd + 1, nd + 2)]


def _check_rank(x, nd, source, what):
    """Whether ``x`` is a batch for ``nd`` spatial dims; raises if it is neither layout."""
    shape = tuple(core.shape_of(x))
    if len(shape) not in (nd + 1, nd + 2):
        raise ShapeError(f"{what}: input of shape {shape} must be a batch {_layout(nd, True)} or one example "
                         f"{_layout(nd, False)} for {nd} spatial dims (from {source})")
    return len(shape) == nd + 2


# ---------------------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------------------


def _pool_rank(x, kernel_size, spatial_dims, what):
    """``(nd, batched)``: the number of spatial dims — from ``spatial_dims``, else from a
    tuple ``kernel_size``, else from the rank where it has one reading — and whether ``x``
    has its batch dim (NOTE [batch or one example])."""
    shape = tuple(core.shape_of(x))
    kernel_is_tuple = isinstance(kernel_size, (tuple, list))
    if spatial_dims is not None:
        nd = int(spatial_dims)
        if nd not in (1, 2, 3):
            raise ShapeError(f"{what}: spatial_dims must be 1, 2 or 3, got {spatial_dims!r}")
        if kernel_is_tuple and len(kernel_size) != nd:
            raise ShapeError(f"{what}: kernel_size {tuple(kernel_size)} has {len(kernel_size)} entries, but "
                             f"spatial_dims={nd}")
        named = what.endswith(f"{nd}d")  # max_pool2d and friends
        return nd, _check_rank(x, nd, f"the name {what}" if named else f"spatial_dims={nd}", what)
    if kernel_is_tuple:
        nd = len(kernel_size)
        if nd not in (1, 2, 3):
            raise ShapeError(f"{what}: kernel_size {tuple(kernel_size)} must have 1-3 entries (one per spatial dim)")
        return nd, _check_rank(x, nd, f"kernel_size {tuple(kernel_size)}", what)
    readings = _readings(len(shape), (1, 2, 3))
    if len(readings) == 1:
        return readings[0]
    if not readings:
        raise ShapeError(f"{what}: input of shape {shape} must be (N, C, S...) or (C, S...) with 1-3 spatial dims")
    k = kernel_size
    choices = "; ".join(
        f"{what}{nd}d(x, {k}) or {what}(x, {(int(k),) * nd}) for {'a batch' if batched else 'one example'} "
        f"{_layout(nd, batched)}"
        for nd, batched in sorted(readings, key=lambda r: r[1]))
    raise ShapeError(
        f"{what}: an int kernel_size={k} on an input of shape {shape} is ambiguous: it may be "
        + " or ".join(f"{'a batch' if b else 'one example'} {_layout(nd, b)}" for nd, b in readings)
        + f". Say which: {choices} (or pass spatial_dims)")


def _pool(op, x, kernel_size, stride, padding, spatial_dims, what, **extra):
    nd, batched = _pool_rank(x, kernel_size, spatial_dims, what)
    if not batched:
        x = lax_shape.expand_dims(x, (0,))
    params = dict(window=spatial_tuple(kernel_size, nd, "kernel_size", what),
                  stride=None if stride is None else spatial_tuple(stride, nd, "stride", what),
                  padding=spatial_tuple(padding, nd, "padding", what))
    params = lax_pooling.pool_params(nd, **params)
    out = op(x, params["window"], params["stride"], params["padding"], **extra)
    return out if batched else lax_shape.squeeze(out, (0,))


def max_pool(x, kernel_size, stride=None, padding=0, spatial_dims=None):
    """Max pooling, ``torch.nn.functional.max_poolNd``:
    ``out[n, c, y] = max_{0 ≤ t < k} x[n, c, y·stride − padding + t]``, padding counting as −∞.

    Args:
      x: a batch ``(N, C, S...)`` or one example ``(C, S...)``, 1-3 spatial dims.
      kernel_size: int or one per spatial dim. A tuple also gives the number of spatial
        dims; an int alone does only where the rank has one reading (``(C, L)``,
        ``(N, C, D, H, W)``), and raises on ranks 3 and 4, where ``(C, H, W)`` and
        ``(N, C, L)`` look alike (NOTE [batch or one example]).
      stride: int or one per spatial dim; ``None`` (default) means ``kernel_size``.
      padding: int or one per spatial dim, at most ``kernel_size // 2``.
      spatial_dims: the number of spatial dims (1-3); or use ``max_pool1d/2d/3d``.
    Returns:
      ``(N, C, ⌊(S + 2·padding − k) / stride⌋ + 1, ...)`` (no ``N`` for one example).

    Example::

        y = max_pool2d(x, 2)             # x (16, 28, 28) -> (16, 14, 14); (8, 16, 28, 28) -> (8, 16, 14, 14)

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

    Args:
      x, kernel_size, stride, padding, spatial_dims: as :func:`max_pool` (an int kernel
        on a rank-3 or rank-4 input raises; use ``avg_pool2d`` and friends).
      count_include_pad: whether padded positions count in the divisor ``D``.
    Returns:
      as :func:`max_pool`.

    Not supported: ``ceil_mode``, ``divisor_override``.
    """
    return _pool(lax_pooling.avg_pool, x, kernel_size, stride, padding, spatial_dims, "avg_pool",
                 count_include_pad=count_include_pad)


def max_pool1d(x, kernel_size, stride=None, padding=0):
    """:func:`max_pool` over one spatial dim: ``(N, C, L)`` or one example ``(C, L)``."""
    return _pool(lax_pooling.max_pool, x, kernel_size, stride, padding, 1, "max_pool1d")


def max_pool2d(x, kernel_size, stride=None, padding=0):
    """:func:`max_pool` over two spatial dims: ``(N, C, H, W)`` or one example ``(C, H, W)``."""
    return _pool(lax_pooling.max_pool, x, kernel_size, stride, padding, 2, "max_pool2d")


def max_pool3d(x, kernel_size, stride=None, padding=0):
    """:func:`max_pool` over three spatial dims: ``(N, C, D, H, W)`` or one example ``(C, D, H, W)``."""
    return _pool(lax_pooling.max_pool, x, kernel_size, stride, padding, 3, "max_pool3d")


def avg_pool1d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    """:func:`avg_pool` over one spatial dim: ``(N, C, L)`` or one example ``(C, L)``."""
    return _pool(lax_pooling.avg_pool, x, kernel_size, stride, padding, 1, "avg_pool1d",
                 count_include_pad=count_include_pad)


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    """:func:`avg_pool` over two spatial dims: ``(N, C, H, W)`` or one example ``(C, H, W)``."""
    return _pool(lax_pooling.avg_pool, x, kernel_size, stride, padding, 2, "avg_pool2d",
                 count_include_pad=count_include_pad)


def avg_pool3d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    """:func:`avg_pool` over three spatial dims: ``(N, C, D, H, W)`` or one example ``(C, D, H, W)``."""
    return _pool(lax_pooling.avg_pool, x, kernel_size, stride, padding, 3, "avg_pool3d",
                 count_include_pad=count_include_pad)


# ---------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------


# NOTE [relu keeps NaN]
# relu is ``x <= 0 ? 0 : x``, torch's ``relu`` and ``threshold_backward`` exactly: a NaN
# input gives NaN, as torch's and JAX's relu do. The earlier ``where(x > 0, x, 0)`` gave 0
# for NaN, and so hid a diverged network: with NaN weights in a layer its relu gave zeros,
# the next layer its bias, the loss a finite number and that layer zero gradients, and
# training went on without a sign. ``-0.0`` gives ``+0.0``. The derivative is
# ``x <= 0 ? 0 : g``: 0 at 0 (torch's and JAX's choice), and a NaN input passes its
# cotangent on (torch's; JAX's custom_jvp gives 0 there). Both selects take the
# positive-zero blend of NOTE [branch-free select] in cuvmap/lax/elementwise/comparisons.py.


def relu(x):
    """``max(x, 0)``, torch's ``relu`` and JAX's ``jax.nn.relu``: ``x`` where ``x > 0``, 0
    where ``x <= 0``, NaN where ``x`` is NaN (NOTE [relu keeps NaN]); its derivative is 1
    where ``x > 0`` and 0 where ``x <= 0`` (0 at 0)."""
    return cnp.where(x <= 0, 0, x)


_GELU_C = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)


def gelu(x, approximate="none"):
    """GELU, exact by default as torch's: ``x · Φ(x) = 0.5 · x · (1 + erf(x/√2))``; with
    ``approximate='tanh'``, ``0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))``. The two
    differ by less than 1e-3 everywhere.
    """
    if approximate == "none":
        return ew.mul(ew.mul(0.5, x), ew.add(1.0, ew.erf(ew.mul(x, _SQRT_HALF))))
    if approximate != "tanh":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
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
      weight, bias: ``normalized_shape`` arrays (or shapes that broadcast into it) or None
        (no scale / no shift); any other shape raises ShapeError.
    """
    if isinstance(normalized_shape, (int, np.integer)):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(int(s) for s in normalized_shape)
    shape = tuple(core.shape_of(x))
    k = len(normalized_shape)
    if k == 0 or shape[len(shape) - k:] != normalized_shape:
        raise ShapeError(f"layer_norm: input of shape {shape} does not end with normalized_shape {normalized_shape}")
    for name, value in (("weight", weight), ("bias", bias)):
        # normalized_shape, or a shape that broadcasts into it (shared along its leading dims);
        # a (N, D) weight would have broadcast too, scaling each example by its own row
        if value is not None and not _broadcasts_into(tuple(core.shape_of(value)), normalized_shape):
            raise ShapeError(f"layer_norm: {name} of shape {tuple(core.shape_of(value))} must be normalized_shape "
                             f"{normalized_shape} (or broadcast into it) for an input of shape {shape}")
    y = _normalize(x, tuple(range(len(shape) - k, len(shape))), eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def _broadcasts_into(shape, target):
    """Whether an array of ``shape`` broadcasts to exactly ``target``."""
    return len(shape) <= len(target) and all(s in (1, t) for s, t in zip(shape[::-1], target[::-1]))


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, *, spatial_dims=None):
    """Group normalization, ``torch.nn.functional.group_norm``: the ``C`` channels of each
    example are split into ``num_groups`` groups ``G`` of ``C / num_groups`` consecutive
    channels, and for each example ``n`` and group ``G``, over the channels of ``G`` and all
    spatial positions,

        y[n, c, s] = (x[n, c, s] − E_{G,s}[x[n]]) / sqrt(Var_{G,s}[x[n]] + eps) · weight[c] + bias[c]

    with the biased variance. Statistics are per example, so per-example gradients are the
    gradients of each example's own loss.

    Args:
      x: a batch ``(N, C, S...)`` or one example ``(C, S...)``, 0-3 spatial dims.
      num_groups: divides ``C``.
      weight, bias: ``(C,)`` or None.
      eps: added to the variance.
      spatial_dims: the number of spatial dims ``len(S)`` (0-3), which tells a batch from
        one example. Required where the rank has two readings — ranks 2-4: ``(N, C)`` or
        ``(C, L)``, ``(N, C, L)`` or ``(C, H, W)``, ``(N, C, H, W)`` or ``(C, D, H, W)`` —
        and optional for rank 1 (one example ``(C,)``) and rank 5 (``(N, C, D, H, W)``).
        torch's ``group_norm`` reads every input as ``(N, C, *)``; here that needs
        ``spatial_dims=x.ndim - 2`` (NOTE [batch or one example]). The ``GroupNorm`` layer
        passes it for you.
    Returns:
      ``y``, of the shape of ``x``.

    Example::

        y = group_norm(x, 4, w, b, spatial_dims=2)      # x (16, 28, 28): one example
        y = group_norm(xs, 4, w, b, spatial_dims=2)     # xs (N, 16, 28, 28): a batch
    """
    shape = tuple(core.shape_of(x))
    if spatial_dims is not None:
        nd = int(spatial_dims)
        if nd not in (0, 1, 2, 3):
            raise ShapeError(f"group_norm: spatial_dims must be 0, 1, 2 or 3, got {spatial_dims!r}")
        batched = _check_rank(x, nd, f"spatial_dims={nd}", "group_norm")
    else:
        readings = _readings(len(shape), (0, 1, 2, 3))
        if not readings:
            raise ShapeError(f"group_norm: input of shape {shape} must be a batch (N, C, S...) or one example "
                             f"(C, S...) with 0-3 spatial dims")
        if len(readings) > 1:
            choices = " or ".join(
                f"spatial_dims={nd} for {'a batch' if b else 'one example'} {_layout(nd, b)}" for nd, b in readings)
            raise ShapeError(
                f"group_norm: an input of shape {shape} may be "
                + " or ".join(f"{'a batch' if b else 'one example'} {_layout(nd, b)}" for nd, b in readings)
                + f"; say which: group_norm(x, {num_groups}, ..., spatial_dims=...) with {choices}")
        nd, batched = readings[0]
    if not batched:
        x = lax_shape.expand_dims(x, (0,))
    full = tuple(core.shape_of(x))
    n, c = full[:2]
    if num_groups < 1 or c % num_groups:
        raise ShapeError(f"group_norm: C = {c} channels (input of shape {shape} read as {_layout(nd, batched)}) "
                         f"are not divisible by num_groups={num_groups}")
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None and tuple(core.shape_of(param)) != (c,):
            raise ShapeError(f"group_norm: {name} of shape {tuple(core.shape_of(param))} must be (C,) = ({c},) for "
                             f"an input of shape {shape} read as {_layout(nd, batched)}")
    grouped = cnp.reshape(x, (n, num_groups, int(np.prod(full[1:], dtype=np.int64)) // num_groups))  # n may be 0
    y = cnp.reshape(_normalize(grouped, (2,), eps), full)
    per_channel = (c,) + (1,) * nd
    if weight is not None:
        y = y * cnp.reshape(weight, per_channel)
    if bias is not None:
        y = y + cnp.reshape(bias, per_channel)
    return y if batched else lax_shape.squeeze(y, (0,))


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


def _label_kind(logits, labels):
    """``"indices"`` or ``"probabilities"``; raises, in terms of the labels, for anything
    else. Reads only shapes and dtypes, so it works on tracers (logical shapes under vmap)."""
    logits_shape, label_shape = tuple(core.shape_of(logits)), tuple(core.shape_of(labels))
    if not logits_shape:
        raise ShapeError("cross_entropy: logits must have the classes on their last axis, (..., K); got a scalar")
    kind = kind_of(core.dtype_of(labels))
    expected = (f"labels must be integer class indices of shape logits.shape[:-1] = {logits_shape[:-1]}, or float "
                f"class probabilities of the logits' shape {logits_shape}")
    got = f"got {core.dtype_of(labels)} labels of shape {label_shape}"
    if kind in "iu" and label_shape == logits_shape[:-1]:
        return "indices"
    if kind == "f" and label_shape == logits_shape:
        return "probabilities"
    if kind in "iu" and label_shape == logits_shape:
        hint = ("; integer labels of the logits' shape look one-hot: pass labels.argmax(-1) (class indices) or "
                "labels.astype(float) (probabilities)")
    elif kind == "f" and label_shape == logits_shape[:-1]:
        hint = "; float labels of shape logits.shape[:-1] look like class indices: pass labels.astype(int)"
    else:
        hint = ""
    raise ShapeError(f"cross_entropy: {expected}; {got}{hint}")


def cross_entropy(logits, labels, reduction="mean"):
    """Cross entropy of ``logits`` ``(..., K)`` against integer class indices or class
    probabilities, ``torch.nn.functional.cross_entropy`` with the classes last:

        loss_i = −log_softmax(logits_i)[labels_i]                (integer labels, shape (...))
        loss_i = −Σ_k labels_ik · log_softmax(logits_i)_k        (float labels, shape (..., K))

    reduced by ``reduction`` (``'mean'``, the default, ``'sum'`` or ``'none'``).

    Args:
      logits: ``(..., K)``: a batch ``(N, K)`` or one example ``(K,)``.
      labels: integer class indices in ``[0, K)`` of shape ``logits.shape[:-1]``, or float
        class probabilities of the logits' shape (as torch accepts; a float one-hot is a
        probability vector). Anything else raises, naming the shapes and dtypes: integer
        one-hot labels (``labels.argmax(-1)`` makes indices) and float class indices.
      reduction: ``'mean'``, ``'sum'`` or ``'none'``.
    Returns:
      a scalar, or the per-example losses ``(...)`` for ``reduction='none'``.

    The classes are on the last axis: the same as torch for ``(N, K)`` and unbatched
    ``(K,)`` logits (torch puts them on axis 1 for ``(N, K, d...)``). Integer labels outside
    ``[0, K)`` raise IndexError where they have values (eagerly, or when a staged program
    runs), as torch's do: a label of -1 is a missing label, not the last class (NOTE [class
    labels are checked]).
    """
    kind = _label_kind(logits, labels)
    if kind == "probabilities":
        losses = -cnp.sum(log_softmax(logits, -1) * labels, axis=-1)
    else:
        lse = cnp.logsumexp(logits, axis=-1)
        losses = -(_logit_of_label(logits, labels) - lse)   # −log_softmax(logits)[label], the same rounding
    return _reduce(losses, reduction, "cross_entropy")


# NOTE [class labels are checked]
# An integer label must lie in [0, K), as torch's cross_entropy requires: a label of -1
# (a common "no label" marker) raises IndexError naming cross_entropy, where a gather's
# NumPy-style reading would have taken it silently for the last class. The check is the
# bounds-check primitive (check_index_bounds with negative=False), so it runs where the
# labels have values: eagerly, when a staged program runs, under vmap on the whole batch.
# The label's logit is then picked by a one-hot select and a sum over the classes, exact
# (the one logit plus zeros; -inf in the other classes, a masked class, gives no NaN),
# which is six primitives where take_along_axis bound a dozen (index normalisation,
# offsets, take and their batching): the loss is a noticeable share of an eager
# vmap(grad) step at small batches.


def _logit_of_label(logits, labels):
    """``logits[..., label]`` for each example, the labels checked to lie in ``[0, K)``
    (NOTE [class labels are checked])."""
    k = core.shape_of(logits)[-1]
    labels = lax_indexing.check_index_bounds(labels, k, "cross_entropy",
                                             f"the classes (integer labels lie in [0, {k}), as torch's)",
                                             negative=False)
    labels = lax_indexing.as_index_dtype(labels)   # (uint8 labels could not count 300 classes)
    hit = ew.eq(cnp.expand_dims(labels, -1), cnp.arange(k, dtype=np.int64))
    return cnp.sum(cnp.where(hit, logits, 0), axis=-1)


def mse(prediction, target, reduction="mean"):
    """Mean squared error, ``torch.nn.functional.mse_loss``: ``(prediction − target)²``
    elementwise, reduced by ``reduction`` (``'mean'``, ``'sum'`` or ``'none'``).

    ``prediction`` and ``target`` have one shape (either may be a scalar): shapes that
    differ raise ShapeError, where torch warns and broadcasts. A ``(N, 1)`` prediction
    against a ``(N,)`` target would broadcast to ``(N, N)`` and compare every prediction
    with every target, a wrong loss that trains without an error."""
    p_shape, t_shape = tuple(core.shape_of(prediction)), tuple(core.shape_of(target))
    if p_shape != t_shape and p_shape and t_shape:
        raise ShapeError(f"mse: prediction of shape {p_shape} and target of shape {t_shape} differ; broadcasting "
                         f"them would compare every prediction with every target (torch warns of it): reshape one "
                         f"to the other's shape")
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
