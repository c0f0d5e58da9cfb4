"""Neural-network building blocks: functional layers (``torch.nn.functional`` conventions)."""
from cuvmap.nn.functional import (  # noqa: F401
    conv, conv_transpose, cross_entropy, log_softmax, relu, softmax,
)
