"""What the distributions of :mod:`cuvmap.scipy.stats` share: the standardized variable of a
location-scale family and the support masks."""
import math

from cuvmap import numpy as cnp
from cuvmap.scipy._util import promote_inexact


def standardize(x, loc, scale):
    """``(promoted x, loc, scale)`` and ``y = (x − loc) / scale``."""
    x, loc, scale = promote_inexact(x, loc, scale)
    return (x - loc) / scale, scale


def log_scale(scale):
    """``log(scale)``, the density's Jacobian term; a Python float stays a Python float
    (weakly typed: a float32 ``x`` keeps its dtype)."""
    return math.log(scale) if isinstance(scale, float) else cnp.log(scale)
