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
``cuvmap/nn/functional.py``). Convolutions read it from their weight (``C, S...`` for a weight of
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
from cuvmap.nn.layers.basic import (  # noqa: F401
    AvgPool, Conv, ConvTranspose, Dense, Flatten, Gelu, GroupNorm, LayerNorm, LogSoftmax, MaxPool, Relu, Sigmoid, Tanh,
    elementwise,
)
from cuvmap.nn.layers.combinators import (  # noqa: F401
    FanInConcat, FanInSum, FanOut, Identity, Parallel, Residual, Serial, parallel,
)
from cuvmap.nn.layers.layer import ExampleRank, Layer  # noqa: F401
from cuvmap.nn.layers.transformer import Dropout, Embedding, MultiHeadAttention  # noqa: F401
