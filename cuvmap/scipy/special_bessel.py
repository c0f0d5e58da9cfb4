"""The Bessel functions and the incomplete beta function of
:mod:`cuvmap.scipy.special` (which re-exports them): ``j0``, ``j1``, ``y0``, ``y1``, ``jn``,
``yn``, ``iv``, ``ive``, JAX's ``bessel_jn`` and ``betainc``.

The Bessel functions are the primitives of :mod:`cuvmap.lax.elementwise.special_more`
(``bessel_jn``, ``bessel_yn``, ``bessel_ive``), with SciPy's names; their derivatives in ``x``
are the closed forms (``j0' = −j1``, ``y0' = −y1``, ``jn' = (j_{n−1} − j_{n+1})/2``,
``iv' = iv_{v+1} + (v/x) iv``), which are again Bessel functions, so every order of
derivative exists. The orders have no derivative (as in SciPy/autograd and JAX).
"""
from cuvmap import numpy as cnp
from cuvmap.lax.elementwise import special_more
from cuvmap.scipy._util import promote_inexact


def j0(x):
    """The Bessel function of the first kind of order 0, ``J₀(x) = (1/π) ∫₀^π cos(x sin t) dt``;
    ``J₀' = −J₁``. Absolute error about 1e-15 for ``|x| ≤ 1e3`` (relative away from its
    zeros). SciPy: ``scipy.special.j0`` (JAX has ``bessel_jn``)."""
    return special_more.bessel_jn(0.0, promote_inexact(x))


def j1(x):
    """``J₁(x)``, the Bessel function of the first kind of order 1; ``J₁' = (J₀ − J₂)/2``.
    SciPy: ``scipy.special.j1``."""
    return special_more.bessel_jn(1.0, promote_inexact(x))


def y0(x):
    """The Bessel function of the second kind of order 0, ``Y₀(x)``, for ``x > 0`` (``−inf``
    at 0, NaN below); ``Y₀' = −Y₁``. Absolute error about 4e-15 for ``0 < x ≤ 1e3``
    (relative, away from its zeros and near 0, about 1e-15). SciPy: ``scipy.special.y0``."""
    return special_more.bessel_yn(0.0, promote_inexact(x))


def y1(x):
    """``Y₁(x)``, the Bessel function of the second kind of order 1, for ``x > 0``;
    ``Y₁' = (Y₀ − Y₂)/2``. SciPy: ``scipy.special.y1``."""
    return special_more.bessel_yn(1.0, promote_inexact(x))


def jn(n, x):
    """``J_n(x)`` for integer orders ``n`` (an int or an array of integer values, broadcast
    against ``x``; NaN for non-integers, ``J_{−n} = (−1)ⁿ J_n``); ``J_n' = (J_{n−1} − J_{n+1})/2``.
    Tested for ``|n| ≤ 100``, ``|x| ≤ 1e3``. SciPy: ``scipy.special.jn``."""
    n, x = promote_inexact(n, x)
    return special_more.bessel_jn(n, x)


def yn(n, x):
    """``Y_n(x)`` for integer orders ``n`` and ``x > 0`` (by the forward recurrence from
    ``Y₀``, ``Y₁``; ``−inf`` where it overflows); ``Y_n' = (Y_{n−1} − Y_{n+1})/2``.
    SciPy: ``scipy.special.yn``."""
    n, x = promote_inexact(n, x)
    return special_more.bessel_yn(n, x)


def ive(v, x):
    """The exponentially scaled modified Bessel function of the first kind of real order,
    ``ive(v, x) = e^{−|x|} I_v(x)``, ``I_v(x) = Σ_k (x/2)^{v+2k} / (k! Γ(v+k+1))``, for
    ``v ≥ 0`` or an integer ``v``; negative ``x`` only for integer ``v`` (NaN otherwise,
    SciPy's value there is complex). Relative error about 1e-13 for ``|x| ≤ 100`` and
    ``v ≤ 50`` (1e-15 where ``|x| ≥ 30`` and ``4v² ≤ |x|``; up to 5e-12 near ``|x| = 1e3``
    for high orders). Differentiable in ``x`` (autograd's rule), not in ``v``.
    SciPy: ``scipy.special.ive``."""
    v, x = promote_inexact(v, x)
    return special_more.bessel_ive(v, x)


def iv(v, x):
    """The modified Bessel function of the first kind of real order
    ``I_v(x) = e^{|x|} · ive(v, x)`` (``inf`` where it overflows); ``I_v' = (I_{v−1} + I_{v+1})/2
    = I_{v+1} + (v/x) I_v``. SciPy: ``scipy.special.iv``."""
    v, x = promote_inexact(v, x)
    return cnp.exp(cnp.abs(x)) * special_more.bessel_ive(v, x)


def bessel_jn(z, *, v, n_iter=50):
    """``J_0(z), …, J_v(z)`` stacked along a new leading axis (shape ``(v + 1,) + z.shape``),
    for a Python int ``v ≥ 0``. ``n_iter`` (JAX's number of recurrence steps) is checked and
    otherwise unused: each order is :func:`jn`, accurate to float64. JAX:
    ``jax.scipy.special.bessel_jn``."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"bessel_jn: v must be a non-negative Python int, got {v!r}")
    if not isinstance(n_iter, int) or n_iter < 1:
        raise ValueError(f"bessel_jn: n_iter must be a positive Python int, got {n_iter!r}")
    z = promote_inexact(z)
    return cnp.stack([special_more.bessel_jn(float(k), z) for k in range(v + 1)])


def betainc(a, b, x):
    """The regularized incomplete beta function
    ``I_x(a, b) = ∫₀ˣ t^{a−1}(1−t)^{b−1} dt / B(a, b)`` for ``a, b > 0`` and ``0 ≤ x ≤ 1``
    (NaN elsewhere; :func:`cuvmap.lax.betainc`, relative error about 1e-14 for
    ``a, b ≤ 1e3``). Differentiable in ``x`` (``x^{a−1}(1−x)^{b−1}/B(a, b)``); the
    derivatives in ``a`` and ``b`` raise, as JAX's. JAX: ``jax.scipy.special.betainc``."""
    a, b, x = promote_inexact(a, b, x)
    return special_more.betainc(a, b, x)
