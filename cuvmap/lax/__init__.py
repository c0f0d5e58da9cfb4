"""Primitive families, one module each: every primitive's declaration, public wrapper,
shape rule, impl, batching rule, JVP rule and VJP rule live together."""
import importlib
import pkgutil

from cuvmap import core
from cuvmap.lax.elementwise import (  # noqa: F401
    abs, add, asinh, atan, atan2, ceil, convert_element_type, cos, cosh, div, eq, erf, erf_inv, exp, expm1,
    floor, floor_divide, ge, gt, integer_pow, le, log, log1p, log2, log10, logistic, lt, max, min,
    mul, ne, neg, pow, remainder, round, rsqrt, select, sign, sin, sinh, sqrt, stop_gradient, sub,
    tanh,
)
from cuvmap.lax.bitwise import (  # noqa: F401
    bitcast_convert_type, bitwise_and, bitwise_not, bitwise_or, bitwise_xor, shift_left, shift_right_arithmetic,
    shift_right_logical,
)
from cuvmap.lax.cumulative import cumprod, cumsum  # noqa: F401
from cuvmap.lax.sorting import argsort, sort  # noqa: F401
from cuvmap.lax.control_flow import cond, fori_loop, map, scan, switch, while_loop  # noqa: F401, A004
from cuvmap.lax.convolution import conv, conv_backward_input, conv_backward_weight  # noqa: F401
from cuvmap.lax import convolution_merged  # noqa: F401  (conv_backward and its merge rule)
from cuvmap.lax.indexing import iota, take  # noqa: F401
from cuvmap.lax.linalg import svd  # noqa: F401
from cuvmap.lax.pooling import (  # noqa: F401
    avg_pool, avg_pool_transpose, max_pool, max_pool_gather, max_pool_scatter,
)
from cuvmap.lax.parallel import (  # noqa: F401
    all_gather, all_to_all, axis_index, pmax, pmean, pmin, ppermute, psum, psum_scatter,
)
from cuvmap.lax.prng import threefry2x32  # noqa: F401
from cuvmap.lax.reduction import argmax, argmin, reduce_max, reduce_min, reduce_sum  # noqa: F401
from cuvmap.lax.shape import (  # noqa: F401
    broadcast_in_dim, broadcast_to, concatenate, expand_dims, squeeze, transpose, unbroadcast,
)
from cuvmap.lax.jax_shapes import (  # noqa: F401  (issue 32: JAX's signatures of the shape and product names)
    Precision, broadcast, dot, dot_general, pad, platform_dependent, reshape, rev, slice, slice_in_dim,
)
from cuvmap.lax.elementwise import (  # noqa: F401  (issue 32: JAX's remaining elementwise names)
    RoundingMethod, acos, acosh, asin, atanh, bessel_i0e, bessel_i1e, cbrt, clamp, digamma, erfc, exp2, igamma,
    igamma_grad_a, igammac, is_finite, lgamma, nextafter, polygamma, population_count, reduce_precision, select_n,
    square, tan,
)
from cuvmap.lax.slicing import (  # noqa: F401
    GatherDimensionNumbers, GatherScatterMode, ScatterDimensionNumbers, dynamic_index_in_dim, dynamic_slice,
    dynamic_slice_in_dim, dynamic_update_index_in_dim, dynamic_update_slice, dynamic_update_slice_in_dim, gather,
    index_in_dim, index_take, scatter, scatter_add, scatter_apply, scatter_max, scatter_min, scatter_mul,
)
from cuvmap.lax.conv_general import (  # noqa: F401  (JAX's conv names; lax.conv takes JAX's and aten's forms)
    ConvDimensionNumbers, conv, conv_dimension_numbers, conv_general_dilated, conv_transpose,
    conv_with_general_padding, padtype_to_pads,
)
from cuvmap.lax.cumulative import cumlogsumexp, cummax, cummin  # noqa: F401
from cuvmap.lax.reducers import reduce  # noqa: F401, A004
from cuvmap.lax.scan_ops import associative_scan  # noqa: F401
from cuvmap.lax.sorting import sort_key_val, top_k  # noqa: F401
from cuvmap.lax.windowed import (  # noqa: F401
    reduce_window, reduce_window_max, reduce_window_min, reduce_window_sum,
)
from cuvmap.lax.elementwise.complex_numbers import complex, conj, imag, real  # noqa: F401, A004
from cuvmap.lax.linalg_decompositions import cholesky, eigh, qr  # noqa: F401
from cuvmap.lax.linalg_solve import lu, lu_pivots_to_permutation, triangular_solve  # noqa: F401
from cuvmap.lax.linalg_eig import eig  # noqa: F401  (issue 32: JAX's lax.linalg names, also in cuvmap.lax.linalg)
from cuvmap.lax.linalg_schur import schur  # noqa: F401
from cuvmap.lax.linalg_tridiagonal import tridiagonal_solve  # noqa: F401
from cuvmap.lax.linalg_householder import hessenberg, householder_product, tridiagonal  # noqa: F401
from cuvmap.lax.fourier import FftType, fft  # noqa: F401  (issues 32, 33: JAX's lax.fft)
# issue 32 (apisurf): JAX's primitive names (<name>_p), optimization_barrier, and lax names composed of
# primitives; div (JAX's: integers rounded toward zero) replaces elementwise's true division as lax.div
from cuvmap.lax.jax_primitives import (  # noqa: F401
    abs_p, acos_p, acosh_p, add_p, and_p, asin_p, asinh_p, atan2_p, atan_p, atanh_p, bessel_i0e_p, bessel_i1e_p,
    bitcast_convert_type_p, broadcast_in_dim_p, cbrt_p, ceil_p, clamp_p, complex_p, concatenate_p, cond_p, conj_p,
    convert_element_type_p, cos_p, cosh_p, cumprod_p, cumsum_p, digamma_p, dot_general_p, eq_p, erf_inv_p, erf_p,
    erfc_p, exp2_p, exp_p, expm1_p, floor_p, ge_p, gt_p, igamma_grad_a_p, igamma_p, igammac_p, imag_p,
    integer_pow_p, is_finite_p, le_p, lgamma_p, log1p_p, log_p, logistic_p, lt_p, max_p, min_p, mul_p, ne_p, neg_p,
    nextafter_p, not_p, or_p, polygamma_p, population_count_p, pow_p, real_p, reduce_max_p, reduce_min_p,
    reduce_precision_p, reduce_sum_p, reshape_p, rsqrt_p, scan_p, select_n_p, shift_left_p, shift_right_arithmetic_p,
    shift_right_logical_p, sign_p, sin_p, sinh_p, sqrt_p, square_p, squeeze_p, sub_p, tan_p, tanh_p, transpose_p,
    while_p, xor_p,
)
from cuvmap.lax.barriers import optimization_barrier, optimization_barrier_p  # noqa: F401
from cuvmap.lax.elementwise.special_more import (  # noqa: F401  (issue 32: JAX's lax.betainc)
    betainc, regularized_incomplete_beta_p,
)
from cuvmap.lax.jax_extras import (  # noqa: F401
    axis_size, broadcast_shapes, div, empty, full_like, iota, rem, stack, unstack,
)

from cuvmap.lax.jax_shape_extras import split, tile  # noqa: F401  (issue 32, npmanip)
from cuvmap.lax.jax_reduce_names import (  # noqa: F401  (issue 32: the audit)
    broadcasted_iota, collapse, full, reduce_and, reduce_or, reduce_prod, reduce_xor,
)
from cuvmap.lax.jax_arith_names import (  # noqa: F401, E402  (issue 32: mul's out_dtype replaces elementwise's mul)
    batch_matmul, broadcast_to_rank, clz, mul, mulhi, reciprocal, scatter_sub,
)


def all_primitives():
    """Every primitive that cuvmap's families define, in the order they were made: every
    module of this package is imported, and the primitives that registered themselves
    from one of them are returned (NOTE [a registry that fills itself] in cuvmap/core/primitive.py;
    the registry test checks that each has every rule)."""
    for module in pkgutil.walk_packages(__path__, prefix=__name__ + "."):
        importlib.import_module(module.name)
    package = __name__ + "."
    return [p for p in core.registered_primitives() if p.module is not None and p.module.startswith(package)]


