"""Student's t distribution with ``df`` degrees of freedom, location ``loc`` and scale
``scale``, as ``jax.scipy.stats.t`` (``logpdf``, ``pdf``) with SciPy's/autograd's ``cdf``,
``logcdf``, ``sf`` and ``logsf`` besides. With ``z = (x − loc)/scale``:
``logpdf = lgamma((df+1)/2) − lgamma(df/2) − ½ log(df π) − log(scale) − (df+1)/2 · log1p(z²/df)``;
``cdf = 1 − ½ I_{df/(df+z²)}(df/2, ½)`` for ``z ≥ 0`` (``½ I`` below; where ``z² < df``,
``½ + sign(z) · ½ I_{z²/(df+z²)}(½, df/2)``), ``I`` the regularized
incomplete beta function (:func:`cuvmap.scipy.special.betainc`). The densities are
differentiable in every argument; ``cdf``/``logcdf``/``sf``/``logsf`` in ``x`` and ``loc``
(and ``scale``), not in ``df`` (whose derivative raises, as ``betainc``'s in ``a``).
"""
import math

from cuvmap import numpy as cnp
from cuvmap.errors import MissingRuleError
from cuvmap.scipy import special
from cuvmap.scipy._util import promote_inexact
from cuvmap.scipy.stats._common import log_scale, standardize
from cuvmap.transforms.custom_derivatives import custom_jvp
from cuvmap.transforms.symbolic_zeros import is_zero


def logpdf(x, df, loc=0, scale=1):
    """The log density of Student's t (see the module's formula). JAX:
    ``jax.scipy.stats.t.logpdf``."""
    z, scale = standardize(x, loc, scale)
    df = promote_inexact(df)
    half = 0.5 * (df + 1)
    norm = special.gammaln(half) - special.gammaln(0.5 * df) - 0.5 * cnp.log(df * math.pi) - log_scale(scale)
    return norm - half * cnp.log1p(z * z / df)


def pdf(x, df, loc=0, scale=1):
    """``exp(logpdf(x, df, loc, scale))``. JAX: ``jax.scipy.stats.t.pdf``."""
    return cnp.exp(logpdf(x, df, loc, scale))


@custom_jvp
def _cdf_standard(z, df):
    """P(T ≤ z) for the standard t: ½ I_{df/(df+z²)}(df/2, ½) reflected for z > 0; where
    z² < df, ½ + sign(z) · ½ I_{z²/(df+z²)}(½, df/2) (the same value, without the rounding of
    df/(df+z²) near 1, which float32 would feel)."""
    z2 = z * z
    near = z2 < df
    w_near = cnp.where(near, z2 / (df + z2), 0.5)
    w_far = cnp.where(near, 0.5, df / (df + z2))
    tail = 0.5 * special.betainc(0.5 * df, 0.5, w_far)
    central = 0.5 * special.betainc(0.5, 0.5 * df, w_near)
    return cnp.where(near, 0.5 + cnp.sign(z) * central, cnp.where(z > 0, 1 - tail, tail))


@_cdf_standard.defjvp
def _cdf_standard_jvp(primals, tangents):
    # d/dz cdf = the density (finite at z = 0, where the betainc form's chain rule is 0·inf)
    z, df = primals
    z_dot, df_dot = tangents
    if not is_zero(df_dot):
        raise MissingRuleError("scipy.stats.t.cdf: no derivative with respect to df (as betainc's in a); "
                               "differentiate with respect to x, loc or scale")
    out = _cdf_standard(z, df)
    if is_zero(z_dot):
        return out, None
    return out, z_dot * pdf(z, df)


_cdf_standard.defjvp(_cdf_standard_jvp, symbolic_zeros=True)


def cdf(x, df, loc=0, scale=1):
    """The distribution function ``P(T ≤ x)`` (module's formula). SciPy/autograd:
    ``scipy.stats.t.cdf`` (JAX's ``t`` has only the densities)."""
    z, _ = standardize(x, loc, scale)
    return _cdf_standard(z, promote_inexact(df))


def logcdf(x, df, loc=0, scale=1):
    """``log cdf(x, df, loc, scale)``. SciPy/autograd: ``scipy.stats.t.logcdf``."""
    return cnp.log(cdf(x, df, loc, scale))


def sf(x, df, loc=0, scale=1):
    """The survival function ``1 − cdf``, computed as ``cdf`` of ``−z`` (no cancellation in
    the upper tail). SciPy: ``scipy.stats.t.sf``."""
    z, _ = standardize(x, loc, scale)
    return _cdf_standard(-z, promote_inexact(df))


def logsf(x, df, loc=0, scale=1):
    """``log sf(x, df, loc, scale)``. SciPy: ``scipy.stats.t.logsf``."""
    return cnp.log(sf(x, df, loc, scale))
