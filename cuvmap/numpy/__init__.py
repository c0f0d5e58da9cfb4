"""NumPy-named functions that work on arrays and on tracers alike (like ``jax.numpy``).

Every function here is a composite of :mod:`cuvmap.lax` primitives and adds no primitive
of its own, so it is transformable by construction. Arrays stay plain ``numpy.ndarray``
or ``cupy.ndarray``. The package's modules, by topic: ``_creation`` (asarray, zeros,
...), ``_elementwise`` (arithmetic, comparisons, where, clip, bitwise and logical
functions), ``_reductions`` (sum, mean, var, max, prod, cumsum, sort, ...), ``_shapes``
(reshape, transpose, concatenate, flip, tril, diagonal, ...), ``_indexing`` (take,
take_along_axis, ``x[index]``), ``_products`` (matmul, dot, tensordot, einsum, ...) and
:mod:`cuvmap.numpy.linalg` (norm, vector_norm, matrix_norm, svd, svdvals); their public
names are this package's. Importing it gives tracers their operators and methods
(``+ - * / ** @``, comparisons, ``& | ^ ~ << >>``, indexing, ``.T``, ``.reshape``,
``.sum``, ...: ``_operators``).
"""
from cuvmap.numpy._common import (  # noqa: F401
    float32, float64, int32, int64, bool_, pi, inf, newaxis, shape, ndim, size,
)
from cuvmap.numpy._creation import (  # noqa: F401
    asarray, array, zeros_like, ones_like, full_like, zeros, ones, full, arange, eye,
)
from cuvmap.numpy._elementwise import (  # noqa: F401
    add, subtract, multiply, divide, true_divide, floor_divide, remainder, mod, negative, exp, log, log1p,
    expm1, sqrt, tanh, sin, cos, sinh, cosh, arctan, arctan2, arcsinh, log2, log10, erf, floor, ceil, abs,
    absolute, sign, maximum, minimum, equal, not_equal, less, less_equal, greater, greater_equal,
    stop_gradient, power, square, reciprocal, sigmoid, round, around, clip, astype, bitwise_and,
    bitwise_or, bitwise_xor, bitwise_not, invert, bitwise_invert, left_shift, right_shift,
    bitwise_left_shift, bitwise_right_shift, logical_not, logical_and, logical_or, logical_xor,
)
from cuvmap.numpy._elementary import (  # noqa: F401  (issue 32: elementary functions, classifications)
    tan, arcsin, arccos, arccosh, arctanh, cbrt, exp2, deg2rad, rad2deg, radians, degrees, isfinite, isinf, isnan,
)
from cuvmap.numpy._reductions import (  # noqa: F401
    sum, mean, var, std, max, min, amax, amin, argmax, argmin, logsumexp, prod, any, all, cumsum, cumprod,
    sort, argsort, trace,
)
from cuvmap.numpy._shapes import (  # noqa: F401
    reshape, ravel, transpose, swapaxes, moveaxis, expand_dims, squeeze, broadcast_to, broadcast_arrays,
    atleast_1d, concatenate, stack, flip, fliplr, flipud, roll, split, array_split, tril, triu,
    diagonal, diag,
)
from cuvmap.numpy._indexing import (  # noqa: F401
    take, take_along_axis, getitem,
)
from cuvmap.numpy._products import (  # noqa: F401
    matmul, dot, vdot, inner, outer, tensordot, cross, einsum,
)
from cuvmap.numpy._complex import (  # noqa: F401
    complex64, complex128, real, imag, conj, conjugate, angle, iscomplexobj, isrealobj, iscomplex, isreal,
    real_if_close,
)
from cuvmap.numpy._dtypes import (  # noqa: F401
    float16, int8, int16, uint8, uint16, uint32, uint64, bool, int_, uint, float_, floating, integer,
    signedinteger, unsignedinteger, inexact, complexfloating, flexible, character, number, generic, nan, e, euler_gamma, dtype, finfo, iinfo,
    issubdtype, isdtype, result_type, promote_types, can_cast,
)
from cuvmap.numpy._elementwise_composites import (  # noqa: F401
    isnan, isinf, isfinite, logaddexp, logaddexp2, sinc, isclose, allclose,
)
from cuvmap.numpy._ranges import linspace, logspace, geomspace, meshgrid  # noqa: F401
from cuvmap.numpy._stacking import (  # noqa: F401
    atleast_2d, atleast_3d, vstack, row_stack, hstack, dstack, column_stack, append, repeat, tile, delete, diff, ediff1d,
    r_, c_,
)
from cuvmap.numpy._statistics import (  # noqa: F401
    nansum, nanprod, nanmax, nanmin, nanmean, nanvar, nanstd, nanargmax, nanargmin, quantile, percentile,
    median, histogram,
)
from cuvmap.numpy._searching import (  # noqa: F401
    searchsorted, digitize, interp, nonzero, flatnonzero, argwhere, where, compress, extract, unique,
    put_along_axis,
)
from cuvmap.numpy._polynomials import polyval, convolve, correlate, kron  # noqa: F401
from cuvmap.numpy._index_helpers import (  # noqa: F401
    tri, tril_indices, triu_indices, tril_indices_from, triu_indices_from, diag_indices, diag_indices_from,
    indices, unravel_index, ravel_multi_index, count_nonzero, isscalar,
)
from cuvmap.numpy._creation import empty, empty_like, identity  # noqa: F401
# issue 32 (npmanip): array manipulation, indexing and window functions
from cuvmap.numpy._manipulation import (  # noqa: F401
    rot90, rollaxis, apply_over_axes, block, unstack, vsplit, hsplit, dsplit, diagflat, resize, ix_,
    trim_zeros, insert, s_, index_exp,
)
from cuvmap.numpy._selecting import select, choose, piecewise, partition, argpartition  # noqa: F401
from cuvmap.numpy._placing import place, put, fill_diagonal, mask_indices, packbits, unpackbits  # noqa: F401
from cuvmap.numpy._windows import bartlett, blackman, hamming, hanning, kaiser  # noqa: F401
from cuvmap.numpy._polynomial_arithmetic import (  # noqa: F401  (issue 32: polynomials, calculus, statistics)
    polyadd, polysub, polymul, polydiv, polyder, polyint, poly, polyfit, vander, roots,
)
from cuvmap.numpy._calculus import trapezoid, gradient, unwrap  # noqa: F401
from cuvmap.numpy._covariance import cov, corrcoef  # noqa: F401
from cuvmap.numpy._counting import bincount  # noqa: F401
from cuvmap.numpy._sort_keys import lexsort, sort_complex, top_k  # noqa: F401
from cuvmap.numpy._nan_cumulative import nancumsum, nancumprod  # noqa: F401
from cuvmap.numpy._pad_modes import pad  # noqa: F401  (pad moved from _shapes: its modes build on _shapes)
from cuvmap.numpy import _tracer_methods  # noqa: F401  (the tracers' other jax.Array methods)
from cuvmap.numpy import _operators, linalg  # noqa: F401  (_operators: the tracers' operators and methods)
from cuvmap.numpy.linalg import SVDResult  # noqa: F401
from cuvmap.numpy import fft  # noqa: F401  (issue 33: jax.numpy.fft, a module)
from cuvmap.numpy._at import at  # noqa: F401, E402  (x.at[...] on tracers, cnp.at(x)[...] on any array: scatters)
# bfloat16 (issue 33): ml_dtypes' type when the optional package is installed (NOTE [bfloat16
# needs ml_dtypes] in cuvmap/dtypes.py: the transforms refuse it by name)
from cuvmap import dtypes as _dtypes  # noqa: E402
if _dtypes.has_bfloat16():
    bfloat16 = _dtypes.bfloat16
# issue 32 (JAX code runs unchanged): more elementwise functions, the array-API names
from cuvmap.numpy._float_bits import (  # noqa: F401, E402
    signbit, copysign, fabs, trunc, rint, modf, frexp, ldexp, nextafter, nan_to_num,
)
from cuvmap.numpy._elementwise_more import (  # noqa: F401, E402
    positive, hypot, fmax, fmin, fmod, divmod, float_power, heaviside, bitwise_count, gcd, lcm, is_weakly_typed,
)
from cuvmap.numpy._array_api_names import (  # noqa: F401, E402
    asin, acos, atan, atan2, asinh, acosh, atanh, pow, concat, permute_dims, matrix_transpose, copy, vecdot, matvec,
    vecmat, float0, broadcast_shapes,
)
# issue 32's audit: jax.numpy names JAX code reaches for that were not there
from cuvmap.numpy._averages import (  # noqa: F401, E402
    average, ptp, cumulative_sum, cumulative_prod, isin, array_equal, array_equiv, isposinf, isneginf,
)
from cuvmap.numpy._nan_quantiles import nanquantile, nanpercentile, nanmedian  # noqa: F401, E402
from cuvmap.numpy._vectorize import vectorize, apply_along_axis  # noqa: F401, E402
from cuvmap.numpy._grids import mgrid, ogrid  # noqa: F401, E402  (NumPy's index tricks, traced bounds refused)
from cuvmap.numpy._set_operations import (  # noqa: F401, E402
    union1d, intersect1d, setdiff1d, setxor1d, unique_values, unique_counts, unique_inverse, unique_all,
)
from cuvmap.numpy._float_bits import spacing  # noqa: F401, E402
from cuvmap.numpy._elementwise_more import i0  # noqa: F401, E402
from cuvmap.numpy._jax_aliases import (  # noqa: F401, E402  (issue 32: NumPy's objects under jax.numpy's names)
    ComplexWarning, array_repr, array_str, cdouble, complex_, csingle, double, get_printoptions, iterable, load,
    object_, printoptions, save, savez, set_printoptions, single,
)
from cuvmap.numpy import _bit_views  # noqa: F401, E402  (issue 32: the tracers' view(dtype) and byteswap())
from cuvmap.numpy._histograms import histogram_bin_edges, histogram2d, histogramdd  # noqa: F401, E402  (issue 32)
from cuvmap.numpy._from_constructors import (  # noqa: F401, E402  (issue 32)
    einsum_path, from_dlpack, frombuffer, fromfile, fromfunction, fromiter, fromstring,
)

from cuvmap.array_type import Array as ndarray  # noqa: F401, E402  (jax.numpy.ndarray is jax.Array)
