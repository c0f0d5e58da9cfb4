"""NumPy's names for the elementary functions of :mod:`cuvmap.lax.elementwise.elementary`
(``tan``, ``arcsin``, ``arccos``, ``arccosh``, ``arctanh``, ``cbrt``, ``exp2``), the angle
conversions (``deg2rad``/``radians``, ``rad2deg``/``degrees``) and the float
classifications (``isfinite``, ``isinf``, ``isnan``; integers and booleans are finite)."""
import math

import numpy as np

from cuvmap import core
from cuvmap.lax import elementwise as ew
from cuvmap.core.bfloat16 import kind_of

tan = ew.tan
arcsin = ew.asin
arccos = ew.acos
arccosh = ew.acosh
arctanh = ew.atanh
cbrt = ew.cbrt
exp2 = ew.exp2


def deg2rad(x):
    """Degrees to radians: ``x · π / 180``."""
    return ew.mul(x, math.pi / 180)


def rad2deg(x):
    """Radians to degrees: ``x · 180 / π``."""
    return ew.mul(x, 180 / math.pi)


radians = deg2rad
degrees = rad2deg


def _is_float(x):
    return kind_of(core.dtype_of(x)) in "fc"


def isfinite(x):
    """True where ``x`` is neither infinite nor NaN (always for integers and booleans)."""
    if not _is_float(x):
        return ew.eq(x, x)
    return ew.is_finite(x)


def isinf(x):
    """True where ``x`` is ``+inf`` or ``−inf``."""
    if not _is_float(x):
        return ew.ne(x, x)
    return ew.eq(ew.abs(x), np.inf)


def isnan(x):
    """True where ``x`` is NaN (``x != x``)."""
    return ew.ne(x, x)
