"""Rows for the generic op tests (``tests/lax/test_ops.py``, ``tests/jit/test_jit.py``) of the
primitives of ``cuvmap/lax/elementwise/special_more.py`` (``regularized_incomplete_beta``,
``bessel_jn``, ``bessel_yn``, ``bessel_ive``) and ``cuvmap/lax/linalg_sylvester.py``
(``sylvester``): each against an independent reference (series, integral representations by
the trapezoidal rule, a Kronecker-product solve), finite differences (``grad`` forward and
reverse, float64, in the operands with derivatives), a loop (``vmap`` over each operand) and
``jit``. ``op_table.PRIMITIVE_ROWS`` includes them; the special values, ranges and closed
forms are checked in ``tests/scipy/test_bessel_betainc.py`` and
``tests/scipy/test_sylvester_derivatives.py``."""
import math

import numpy as np

from cuvmap import backend, core
from cuvmap.lax.elementwise import special_more
from cuvmap.lax import linalg_sylvester


def _betainc_one(a, b, x):
    """I_x(a, b) by its hypergeometric series (x ≤ 1/2; above, 1 − I_{1−x}(b, a))."""
    if x > 0.5:
        return 1 - _betainc_one(b, a, 1 - x)
    coefficient, terms = 1.0, []
    for n in range(200):
        terms.append(coefficient / (a + n))
        coefficient *= (n + 1 - b) * x / (n + 1)
    return math.exp(a * math.log(x) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)) * math.fsum(terms)


def _jn_one(n, x):
    """J_n(x) = (1/2π) ∫₀^{2π} cos(nτ − x sin τ) dτ (the trapezoidal rule, exact to rounding)."""
    t = np.arange(256) * (2 * math.pi / 256)
    return math.fsum(np.cos(n * t - x * np.sin(t))) / 256


def _yn_one(n, x):
    """Y_n(x) by its integral representation
    (1/π) ∫₀^π sin(x sin τ − nτ) dτ − (1/π) ∫₀^∞ (e^{nt} + (−1)ⁿ e^{−nt}) e^{−x sinh t} dt,
    both by composite Gauss–Legendre."""
    nodes, weights = np.polynomial.legendre.leggauss(40)

    def quad(f, lo, hi, pieces=16):
        edges = np.linspace(lo, hi, pieces + 1)
        return math.fsum(0.5 * (b - a) * float(np.dot(weights, f(0.5 * (b - a) * nodes + 0.5 * (b + a))))
                         for a, b in zip(edges[:-1], edges[1:]))

    first = quad(lambda t: np.sin(x * np.sin(t) - n * t), 0.0, math.pi)
    second = quad(lambda t: (np.exp(n * t) + (-1) ** n * np.exp(-n * t)) * np.exp(-x * np.sinh(t)), 0.0,
                  math.asinh(800.0 / x) + 1)
    return (first - second) / math.pi


def _ive_one(v, x):
    """e^{−x} I_v(x) by its positive series (x > 0)."""
    term = math.exp(v * math.log(x / 2) - math.lgamma(v + 1) - x)
    terms = [term]
    for k in range(1, 120):
        term *= (x / 2) ** 2 / (k * (v + k))
        terms.append(term)
    return math.fsum(terms)


def _shifted(a, by):
    """``a + by·I``: well separated eigenvalues for the Sylvester rows (no aᵢ + bⱼ near 0)."""
    eye = backend.xp_of(a).asarray(by * np.eye(core.shape_of(a)[-1]), dtype=core.dtype_of(a))  # on a's device
    return a + eye


def _sylvester_ref(a, b, c):
    a = a + 4 * np.eye(a.shape[-1])
    b = b + 4 * np.eye(b.shape[-1])
    m, n = c.shape[-2:]
    out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2], c.shape[:-2]) + (m, n), np.float64)
    for idx in np.ndindex(out.shape[:-2]):
        k = np.kron(np.eye(n), a[idx]) + np.kron(b[idx].T, np.eye(m))  # vec(AX + XB), column-major
        out[idx] = np.linalg.solve(k, c[idx].reshape(-1, order="F")).reshape((m, n), order="F")
    return out.astype(c.dtype)


def rows():
    """The rows of the special_more and sylvester primitives."""
    # op_table builds its PRIMITIVE_ROWS from this function (a documented cycle: imported here)
    from op_table import A, _math_ref, prim_row
    return [
        prim_row("betainc", special_more.regularized_incomplete_beta_p, {},
                 # x in (0.2, 0.8): "positive" operands scaled by 1/2.5
                 lambda a, b, x: special_more.betainc(a, b, x / 2.5),
                 _math_ref(lambda a, b, x: _betainc_one(a, b, x / 2.5)),
                 [A(3, 4, domain="positive"), A(4, domain="positive"), A(3, 4, domain="positive")],
                 tol64=(1e-12, 1e-14), diff_argnums=(2,)),
        prim_row("bessel_jn", special_more.bessel_jn_p, {}, special_more.bessel_jn, _math_ref(_jn_one),
                 [A(3, 4, domain="ints"), A(3, 4, domain="positive")], tol64=(1e-13, 1e-15), diff_argnums=(1,)),
        prim_row("bessel_yn", special_more.bessel_yn_p, {}, special_more.bessel_yn, _math_ref(_yn_one),
                 [A(3, 4, domain="ints"), A(3, 4, domain="positive")], tol64=(1e-11, 1e-13), diff_argnums=(1,),
                 grad_tol=1e-4),
        prim_row("bessel_ive", special_more.bessel_ive_p, {}, special_more.bessel_ive, _math_ref(_ive_one),
                 [A(3, 4, domain="positive"), A(4, domain="positive")], tol64=(1e-13, 1e-15), diff_argnums=(1,)),
        prim_row("sylvester", linalg_sylvester.sylvester_p, {"tol": 1e-8},
                 lambda a, b, c: linalg_sylvester.sylvester(_shifted(a, 4.0), _shifted(b, 4.0), c), _sylvester_ref,
                 [A(2, 3, 3), A(2, 2, 2), A(2, 3, 2)], tol32=(1e-4, 1e-5), tol64=(1e-12, 1e-13)),
    ]
