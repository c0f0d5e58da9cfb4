"""Elementwise primitives: arithmetic (``arithmetic.py``: rounding included), transcendental
functions (``transcendental.py``: erf and erf_inv included, NOTE [erf without SciPy], NOTE
[erf_inv from Giles' polynomials]), the remaining elementary functions (``elementary.py``:
tan, asin, acos, acosh, atanh, cbrt, square, exp2), special functions (``special.py``, on
the NumPy evaluations of ``special_impls.py``: erfc, lgamma, digamma, igamma, igammac, the
scaled Bessel functions), number representation (``representation.py``: is_finite,
nextafter, population_count, reduce_precision), clamp and select_n (``selection.py``), comparisons, select, dtype conversion and
stop_gradient (``comparisons.py``), on shape rules and a constructor they share
(``common.py``). This package re-exports every name (``lax.elementwise.add``).

Binary and ternary primitives follow NumPy broadcasting, and Python scalars are weakly
typed (NEP 50: ``float32_array * 2.0`` stays float32). The impls are NumPy ufuncs, which
dispatch to CuPy's through ``__array_ufunc__``, so one impl serves both backends (erf and
round pick the array module themselves).

Derivatives: the Jacobian of an elementwise primitive is diagonal, so one rule per
operand, ``g * ∂out/∂x_i``, serves as both its JVP rule and its VJP rule
(:func:`cuvmap.transforms.vjp.defderivative`). The transforms sum or broadcast the
result back to each operand's shape.
"""
from cuvmap.lax.elementwise.common import broadcast_shapes  # noqa: F401
from cuvmap.lax.elementwise.comparisons import (  # noqa: F401
    convert_element_type, convert_element_type_p, eq, eq_p, ge, ge_p, gt, gt_p, le, le_p, lt, lt_p, ne, ne_p, select,
    select_impl, select_into, select_p, stop_gradient, stop_gradient_p,
)
from cuvmap.lax.elementwise.arithmetic import (  # noqa: F401
    abs, abs_p, add, add_p, ceil, ceil_p, div, div_p, floor, floor_divide, floor_divide_p, floor_p, integer_pow,
    integer_pow_p, max, max_p, min, min_p, mul, mul_p, neg, neg_p, remainder, remainder_p, round, round_p, sign,
    sign_p, sub, sub_p,
)
from cuvmap.lax.elementwise.arithmetic import RoundingMethod, round_decimals  # noqa: F401
from cuvmap.lax.elementwise.transcendental import (  # noqa: F401
    asinh, asinh_p, atan, atan2, atan2_p, atan_p, cos, cos_p, cosh, cosh_p, erf, erf_inv, erf_inv_p, erf_p, exp,
    exp_p, expm1, expm1_p, log, log10, log10_p, log1p, log1p_p, log2, log2_p, log_p, logistic, logistic_p, pow,
    pow_p, rsqrt, rsqrt_p, sin, sin_p, sinh, sinh_p, sqrt, sqrt_p, tanh, tanh_p,
)
from cuvmap.lax.elementwise.complex_numbers import (  # noqa: F401
    angle, complex, complex_p, conj, conj_p, imag, imag_p, real, real_p,
)
from cuvmap.lax.elementwise.elementary import (  # noqa: F401
    acos, acos_p, acosh, acosh_p, asin, asin_p, atanh, atanh_p, cbrt, cbrt_p, exp2, exp2_p, square, square_p, tan,
    tan_p,
)
from cuvmap.lax.elementwise.special import (  # noqa: F401
    bessel_i0e, bessel_i0e_p, bessel_i1e, bessel_i1e_p, digamma, digamma_p, erfc, erfc_p, igamma, igamma_grad_a,
    igamma_grad_a_p, igamma_p, igammac, igammac_p, lgamma, lgamma_p, polygamma, polygamma_p,
)
from cuvmap.lax.elementwise.representation import (  # noqa: F401
    is_finite, is_finite_p, nextafter, nextafter_p, population_count, population_count_p, reduce_precision,
    reduce_precision_p,
)
from cuvmap.lax.elementwise.selection import clamp, clamp_p, select_n, select_n_p  # noqa: F401
