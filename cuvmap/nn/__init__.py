"""Neural-network building blocks.

- the functional ops (``torch.nn.functional`` conventions), re-exported here:
  ``nn.conv``, ``nn.max_pool``, ``nn.layer_norm``, ``nn.cross_entropy``, ...
  (:mod:`cuvmap.nn.functional`);
- :func:`dot_product_attention` (:mod:`cuvmap.nn.attention`, ``jax.nn``'s layout);
- :mod:`cuvmap.nn.layers`: stax-style ``(init, apply)`` layers and combinators
  (``Serial``, ``parallel``, ``FanOut``, ``FanInSum``, ``FanInConcat``, ``Residual``),
  ``Dropout`` from explicit keys, ``Embedding``, ``MultiHeadAttention``;
- :mod:`cuvmap.nn.optim`: ``sgd`` and ``adam`` as pure pytree updates.

There is no batch norm, by design: see NOTE [no batch norm] in ``functional.py``.
"""
from cuvmap.nn import functional, layers, optim  # noqa: F401
from cuvmap.nn.attention import dot_product_attention  # noqa: F401
from cuvmap.nn.functional import (  # noqa: F401
    avg_pool, avg_pool1d, avg_pool2d, avg_pool3d, conv, conv_transpose, cross_entropy, flatten, gelu,
    group_norm, layer_norm, log_softmax, max_pool, max_pool1d, max_pool2d, max_pool3d, mse, mse_loss, relu,
    sigmoid, softmax, tanh,
)
