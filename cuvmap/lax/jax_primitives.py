"""JAX's names of cuvmap's primitives: ``lax.sin_p``, ``lax.add_p``, ... (``jax.lax.<name>_p``).

Each name is cuvmap's own :class:`~cuvmap.core.Primitive` object — the one the staged
programs hold (``make_jaxpr(f)(x).eqns[0].primitive is cuvmap.lax.sin_p``) and whose
``bind`` the public functions call — exported where cuvmap has a primitive of JAX's name
and meaning (NOTE [which primitives have JAX's names]).
"""
from cuvmap.lax.bitwise import (
    bitcast_convert_type_p, bitwise_and_p, bitwise_not_p, bitwise_or_p, bitwise_xor_p, shift_left_p,
    shift_right_arithmetic_p, shift_right_logical_p,
)
from cuvmap.lax.control_flow.conditionals import cond_p
from cuvmap.lax.control_flow.loops import while_p
from cuvmap.lax.control_flow.scan import scan_p
from cuvmap.lax.cumulative import cumprod_p, cumsum_p
from cuvmap.lax.elementwise.arithmetic import abs_p, add_p, ceil_p, floor_p, integer_pow_p, max_p, min_p, mul_p, neg_p
from cuvmap.lax.elementwise.arithmetic import sign_p, sub_p
from cuvmap.lax.elementwise.comparisons import convert_element_type_p, eq_p, ge_p, gt_p, le_p, lt_p, ne_p
from cuvmap.lax.elementwise.complex_numbers import complex_p, conj_p, imag_p, real_p
from cuvmap.lax.elementwise.elementary import acos_p, acosh_p, asin_p, atanh_p, cbrt_p, exp2_p, square_p, tan_p
from cuvmap.lax.elementwise.representation import is_finite_p, nextafter_p, population_count_p, reduce_precision_p
from cuvmap.lax.elementwise.selection import clamp_p, select_n_p
from cuvmap.lax.elementwise.special import (
    bessel_i0e_p, bessel_i1e_p, digamma_p, erfc_p, igamma_grad_a_p, igamma_p, igammac_p, lgamma_p, polygamma_p,
)
from cuvmap.lax.elementwise.transcendental import (
    asinh_p, atan2_p, atan_p, cos_p, cosh_p, erf_inv_p, erf_p, exp_p, expm1_p, log1p_p, log_p, logistic_p, pow_p,
    rsqrt_p, sin_p, sinh_p, sqrt_p, tanh_p,
)
from cuvmap.lax.linalg import dot_general_p
from cuvmap.lax.reduction import reduce_max_p, reduce_min_p, reduce_sum_p
from cuvmap.lax.shape import broadcast_in_dim_p, concatenate_p, reshape_p, squeeze_p, transpose_p

# NOTE [which primitives have JAX's names]
# A primitive is exported as ``<name>_p`` when cuvmap's primitive computes what JAX's of
# that name computes, so that comparing an equation's primitive with ``lax.sin_p`` (JAX's
# tests of staged programs do) and binding it give JAX's answers. JAX's bitwise
# primitives are named after the operator (``and_p``, ``or_p``, ``xor_p``, ``not_p``):
# those names are cuvmap's bitwise_and_p, ... . The params are cuvmap's (the text of
# ``make_jaxpr`` shows them: ``reduce_sum[axes=(0,)]``, ``transpose[permutation=...]``,
# as JAX's); a param cuvmap does not know (JAX's ``accuracy=``, ``sharding=``) raises a
# TypeError from ``bind``. Not exported, because cuvmap's primitive of that name computes
# something else or takes other operands: ``div`` (true division of integers; JAX's
# rounds toward zero: ``cuvmap.lax.div`` is JAX's, in lax/jax_extras.py), ``remainder``
# (NumPy's sign; JAX's ``rem`` has the dividend's), ``round``, ``argmax``/``argmin``
# (one ``axis``, no ``index_dtype``), ``sort``, ``slice``, ``pad``, ``iota``, ``gather``
# and the scatters (their operands and parameters differ), the convolutions and the
# collectives (their params differ), and the linalg primitives (``jax.lax.linalg``).
# ``cond_p``, ``while_p`` and ``scan_p`` are exported to identify equations (their params
# are cuvmap's programs and counts, so binding them is cuvmap's business).
and_p = bitwise_and_p
or_p = bitwise_or_p
xor_p = bitwise_xor_p
not_p = bitwise_not_p

JAX_PRIMITIVE_NAMES = (
    "abs_p", "acos_p", "acosh_p", "add_p", "and_p", "asin_p", "asinh_p", "atan2_p", "atan_p", "atanh_p",
    "bessel_i0e_p", "bessel_i1e_p", "bitcast_convert_type_p", "broadcast_in_dim_p", "cbrt_p", "ceil_p", "clamp_p",
    "complex_p", "concatenate_p", "cond_p", "conj_p", "convert_element_type_p", "cos_p", "cosh_p", "cumprod_p",
    "cumsum_p", "digamma_p", "dot_general_p", "eq_p", "erf_inv_p", "erf_p", "erfc_p", "exp2_p", "exp_p", "expm1_p",
    "floor_p", "ge_p", "gt_p", "igamma_grad_a_p", "igamma_p", "igammac_p", "imag_p", "integer_pow_p",
    "is_finite_p", "le_p", "lgamma_p", "log1p_p", "log_p", "logistic_p", "lt_p", "max_p", "min_p", "mul_p", "ne_p",
    "neg_p", "nextafter_p", "not_p", "or_p", "polygamma_p", "population_count_p", "pow_p", "real_p",
    "reduce_max_p", "reduce_min_p", "reduce_precision_p", "reduce_sum_p", "reshape_p", "rsqrt_p", "scan_p",
    "select_n_p", "shift_left_p", "shift_right_arithmetic_p", "shift_right_logical_p", "sign_p", "sin_p", "sinh_p",
    "sqrt_p", "square_p", "squeeze_p", "sub_p", "tan_p", "tanh_p", "transpose_p", "while_p", "xor_p",
)
