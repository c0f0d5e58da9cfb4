"""Primitive families, one module each: every primitive's declaration, public wrapper,
shape rule, impl, batching rule, JVP rule and VJP rule live together."""
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
from cuvmap.lax.conv import conv, conv_backward_input, conv_backward_weight  # noqa: F401
from cuvmap.lax.indexing import iota, slice, slice_in_dim, take  # noqa: F401
from cuvmap.lax.linalg import dot_general, svd  # noqa: F401
from cuvmap.lax.pooling import (  # noqa: F401
    avg_pool, avg_pool_transpose, max_pool, max_pool_gather, max_pool_scatter,
)
from cuvmap.lax.prng import threefry2x32  # noqa: F401
from cuvmap.lax.reduction import argmax, argmin, reduce_max, reduce_min, reduce_sum  # noqa: F401
from cuvmap.lax.shape import (  # noqa: F401
    broadcast_in_dim, broadcast_to, concatenate, expand_dims, pad, reshape, squeeze, transpose,
)


def all_primitives():
    """Every primitive defined by cuvmap's families (used by the registry test)."""
    import importlib

    from cuvmap.core import Primitive

    found = []
    families = ("elementwise", "indexing", "linalg", "reduction", "shape", "conv", "pooling")
    families += ("bitwise", "prng", "cumulative", "sorting", "control_flow")
    for name in families:
        module = importlib.import_module(f"cuvmap.lax.{name}")
        for value in vars(module).values():
            if isinstance(value, Primitive) and value not in found:
                found.append(value)
    return found
