"""The op table: the data that drives the generic tests in ``tests/lax/test_ops.py``.

One :class:`Row` per case. ``PRIMITIVE_ROWS`` holds at least one row per primitive of
:func:`cuvmap.lax.all_primitives` (a registry test fails when a primitive has none), the
conv family included (its references are written from the definition, one einsum per
kernel tap, independent of the im2col kernels);
``COMPOSITE_ROWS`` holds functions of :mod:`cuvmap.numpy` built from several primitives
(indexing, take_along_axis, einsum, matmul, logsumexp, var).

A row holds:

- ``fun``: the function under test, over the row's operands (static parameters bound);
- ``ref``: an independent NumPy reference for it;
- ``args``: one :class:`Arg` per operand (shape, domain, dtype);
- for primitive rows, ``prim`` and the ``params`` that ``fun`` binds, for the shape rule test;
- ``dtypes``: the dtypes the impl test runs in (float operands take the test dtype);
- ``differentiable`` and the derivative tolerances.

Adding a primitive means adding a row here; the generic tests then check its impl
against NumPy, its shape rule, its batching rule for every ``in_axes`` combination, and
its derivatives against finite differences.
"""
import functools
import importlib
import itertools
import math
import zlib
from dataclasses import dataclass

import numpy as np

import cuvmap as cv
from cuvmap import backend, core, lax
from cuvmap import numpy as cnp
from cuvmap import scipy as cv_scipy
from cuvmap.lax import cumulative as lax_cumulative
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import bitwise as lax_bitwise
from cuvmap.lax import callbacks as lax_callbacks
from cuvmap.lax import parallel
from cuvmap.lax import linalg as lax_linalg
from cuvmap.lax import linalg_decompositions as lax_decomp
from cuvmap.lax import linalg_solve as lax_solve
from cuvmap.lax import prng as lax_prng
from cuvmap.lax import reduction as lax_reduction
from cuvmap.lax import shape as lax_shape
from cuvmap.lax import sorting as lax_sorting
from cuvmap.lax import fourier as lax_fourier  # issue 33
from cuvmap.lax import barriers as lax_barriers  # issue 32 (apisurf)

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I32 = np.dtype(np.int32)
I64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)

FLOATS = (F32, F64)
NUMERIC = (F32, F64, I64)
ANY = (F32, F64, I64, BOOL)


# ---------------------------------------------------------------------------------------
# Operands
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arg:
    """One operand of a row.

    ``dtype=None`` means the test dtype (float32/float64/int/bool as the test runs);
    a fixed ``dtype`` (index arrays, predicates) never changes and is never differentiated.
    ``domain`` says where values come from (see :func:`_values`); ``bound`` is the size
    of the indexed axis for ``domain="index"`` (values in ``[-bound, bound)``).
    ``value`` makes the operand a fixed Python scalar (weakly typed, never batched).
    """

    shape: tuple = ()
    domain: str = "real"
    dtype: object = None
    bound: int = 0
    value: object = None

    @property
    def is_pyscalar(self):
        return self.value is not None

    @property
    def follows_test_dtype(self):
        return self.dtype is None and not self.is_pyscalar and self.domain != "index"

    def make(self, rng, dtype, shape=None):
        if self.is_pyscalar:
            return self.value
        shape = self.shape if shape is None else tuple(shape)
        if self.domain == "index":
            return np.asarray(rng.integers(-self.bound, self.bound, size=shape), dtype=self.dtype or I64)
        dtype = np.dtype(self.dtype or dtype)
        return _values(rng, self.domain, shape, dtype)


def _values(rng, domain, shape, dtype):
    """Values for a domain:

    - ``real``: standard normal; ``positive``: in [0.5, 2]; ``nonzero``: ±[0.5, 2];
      ``unit``: in [-0.9, 0.9] (inside erf_inv's domain);
    - ``grid0`` / ``grid_half``: near the integers / near the half-integers (two operands
      drawn from these never tie: max/min stay away from their kink);
    - ``distinct``: all values at least 0.2 apart (no ties in max/argmax reductions);
    - ``ints``: small integers (ties, zeros: sign, comparisons, abs at its kink);
    - ``pairmax`` / ``pairmin``: distinct values, except that the max (min) along the last
      axis appears exactly twice (ties in reduce_max/reduce_min);
    - ``bits`` (integer dtypes): every bit pattern; ``shift``: shift amounts from 0 to a
      few past the bit width.
    """
    size = int(np.prod(shape, dtype=np.int64))
    if dtype == BOOL:
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.kind in "iu":
        if domain == "bits":  # every bit pattern of the dtype
            info = np.iinfo(dtype)
            return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        if domain == "shift":  # shift amounts, some of them the bit width or more
            return rng.integers(0, dtype.itemsize * 8 + 4, size=shape).astype(dtype)
        if domain == "positive":
            v = rng.integers(1, 4, size=shape)
        elif domain in ("nonzero", "divisor"):
            v = rng.integers(1, 4, size=shape) * rng.choice([-1, 1], size=shape)
        elif domain in ("distinct", "pairmax", "pairmin"):
            v = rng.permutation(size).reshape(shape) - size // 2
        elif domain == "grid_half":
            v = 2 * rng.integers(-3, 4, size=shape) + 1
        elif domain == "grid0":
            v = 2 * rng.integers(-3, 4, size=shape)
        else:
            v = rng.integers(-3, 4, size=shape)
        return np.asarray(v).astype(dtype)
    if domain == "real":
        v = rng.standard_normal(shape)
    elif domain == "positive":
        v = rng.uniform(0.5, 2.0, size=shape)
    elif domain == "nonzero":
        v = rng.uniform(0.5, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    elif domain == "divisor":
        # for x // y and x % y with x from "grid_half" (|x| in [0.4, 3.6]): |x / y| stays
        # below 1 and 0.1 away from the jumps at x / y = −1, 0 and 1
        v = rng.uniform(3.7, 3.9, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    elif domain == "unit":
        v = rng.uniform(-0.9, 0.9, size=shape)
    elif domain == "grid0":
        v = rng.integers(-3, 4, size=shape) + rng.uniform(-0.1, 0.1, size=shape)
    elif domain == "grid_half":
        v = rng.integers(-3, 4, size=shape) + 0.5 + rng.uniform(-0.1, 0.1, size=shape)
    elif domain == "ints":
        v = rng.integers(-2, 3, size=shape).astype(np.float64)
    elif domain in ("distinct", "pairmax", "pairmin"):
        v = (rng.permutation(size) - size / 2) * 0.25 + rng.uniform(0, 0.05, size=size)
        v = v.reshape(shape)
        if domain != "distinct" and shape and shape[-1] > 1:
            v = _pair_extremum(v, np.argmax if domain == "pairmax" else np.argmin)
    else:
        raise ValueError(f"unknown domain {domain!r}")
    return np.asarray(v).astype(dtype)


def _pair_extremum(v, arg):
    """Copies the extremum of each row (along the last axis) to one other position."""
    v = v.copy()
    flat = v.reshape(-1, v.shape[-1])
    for row in flat:
        k = arg(row)
        row[(k + 1) % len(row)] = row[k]
    return flat.reshape(v.shape)


def I(shape, bound, dtype=I64):  # noqa: E743 - reads as "indices"
    """Integer index operand for an axis of size ``bound`` (negative indices included)."""
    return Arg(tuple(shape), domain="index", bound=bound, dtype=np.dtype(dtype))


def A(*shape, domain="real", dtype=None):
    return Arg(tuple(shape), domain=domain, dtype=dtype)


def P(*shape):
    """Boolean predicate operand."""
    return Arg(tuple(shape), dtype=BOOL)


def S(value):
    """A Python scalar operand (weakly typed; never batched or differentiated)."""
    return Arg((), value=value)


# ---------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    fun: object
    ref: object
    args: tuple
    prim: object = None
    params: dict = None
    dtypes: tuple = FLOATS
    differentiable: bool = None
    tol32: tuple = (1e-5, 1e-6)  # (rtol, atol) of the impl test in float32
    tol64: tuple = (1e-12, 1e-12)
    grad_tol: float = 1e-5  # atol = rtol of check_grads (float64)
    grad_eps: float = 1e-4
    grad_order: int = 2
    diff_argnums: tuple = None
    modes: tuple = ("fwd", "rev")  # the derivative modes the row supports (while_loop: forward only)
    covers: tuple = ()  # call primitives (control flow) that this composite row exercises

    def __post_init__(self):
        self.args = tuple(self.args)
        if self.differentiable is None:
            self.differentiable = True if self.prim is None else self.prim.differentiable
        if self.diff_argnums is None:
            self.diff_argnums = tuple(i for i, a in enumerate(self.args) if a.follows_test_dtype)

    def __repr__(self):
        return f"Row({self.name})"

    def seed(self, *salt):
        return zlib.crc32(repr((self.name,) + salt).encode())

    def make_args(self, dtype, shapes=None, seed=0):
        """The row's operands in ``dtype``; ``shapes`` overrides the operand shapes
        (batched shapes for the vmap tests)."""
        rng = np.random.default_rng(self.seed(str(dtype), seed))
        shapes = shapes or [a.shape for a in self.args]
        return tuple(a.make(rng, dtype, s) for a, s in zip(self.args, shapes))

    @property
    def vmap_dtype(self):
        return F64 if F64 in self.dtypes else self.dtypes[0]

    def tolerance(self, out_dtype):
        """``(rtol, atol)`` for a result of ``out_dtype`` (exact for ints and bools)."""
        if out_dtype == F32:
            return self.tol32
        if out_dtype == F64:
            return self.tol64
        return (0, 0)


def prim_row(name, prim, params, fun, ref, args, **kw):
    return Row(name, fun, ref, args, prim=prim, params=dict(params), **kw)


def closed_over_nondiff(row, args, fun=None):
    """``(f, diff_args)``: ``row.fun`` (or ``fun``, over the same operands) as a function
    of the row's differentiable operands only, the others (indices, predicates, Python
    scalars) fixed at their values in ``args``."""
    args = list(args)
    fun = row.fun if fun is None else fun

    def f(*diff):
        full = list(args)
        for i, d in zip(row.diff_argnums, diff):
            full[i] = d
        return fun(*full)

    return f, tuple(args[i] for i in row.diff_argnums)


def weighted_sum(fun, weights):
    """``x ↦ Σ fun(x) · weights``: a scalar function whose gradient sees every output."""
    return lambda *args: lax.reduce_sum(lax.mul(fun(*args), weights))


def _rows_elementwise():
    p = ew
    rows = [
        prim_row("neg", p.neg_p, {}, lax.neg, np.negative, [A(3, 4)], dtypes=NUMERIC + (I32,)),
        prim_row("add", p.add_p, {}, lax.add, lambda x, y: x + y, [A(3, 4), A(3, 4)], dtypes=NUMERIC + (I32,)),
        prim_row("add_bcast", p.add_p, {}, lax.add, lambda x, y: x + y, [A(2, 3, 4), A(3, 1)]),
        prim_row("add_pyscalar", p.add_p, {}, lax.add, lambda x, s: x + s, [A(3, 4), S(2.5)], dtypes=NUMERIC),
        prim_row("mul_pyint", p.mul_p, {}, lax.mul, lambda x, s: x * s, [A(3, 4), S(3)], dtypes=NUMERIC + (I32,)),
        prim_row("sub", p.sub_p, {}, lax.sub, lambda x, y: x - y, [A(3, 4), A(4)], dtypes=NUMERIC),
        prim_row("sub_pyscalar_left", p.sub_p, {}, lax.sub, lambda s, x: s - x, [S(1.5), A(3, 4)], dtypes=NUMERIC),
        prim_row("div_pyscalar_left", p.div_p, {}, p.div, lambda s, x: s / x,
                 [S(1.0), A(3, 4, domain="nonzero")], dtypes=NUMERIC),
        prim_row("pow_pyscalar_base", p.pow_p, {}, lax.pow, lambda s, y: s ** y, [S(2.0), A(3, 4)]),
        prim_row("max_pyscalar", p.max_p, {}, lax.max, np.maximum, [A(3, 4, domain="grid_half"), S(0.0)],
                 dtypes=NUMERIC),
        # float32 meets float64: the result is float64, the float32 operand's cotangent float32
        prim_row("add_mixed_precision", p.add_p, {}, lax.add, lambda x, y: x + y, [A(3, 4), A(4, dtype=F32)],
                 diff_argnums=(0, 1), grad_eps=1e-2, grad_tol=1e-4),
        prim_row("mul_mixed_precision", p.mul_p, {}, lax.mul, lambda x, y: x * y, [A(4, dtype=F32), A(3, 4)],
                 diff_argnums=(0, 1), grad_eps=1e-2, grad_tol=1e-4),
        prim_row("mul", p.mul_p, {}, lax.mul, lambda x, y: x * y, [A(3, 4), A(3, 4)], dtypes=NUMERIC),
        prim_row("mul_bcast", p.mul_p, {}, lax.mul, lambda x, y: x * y, [A(3, 1), A(1, 4)]),
        prim_row("mul_scalar_operand", p.mul_p, {}, lax.mul, lambda x, y: x * y, [A(), A(3, 4)]),
        prim_row("div", p.div_p, {}, p.div, lambda x, y: x / y,
                 [A(3, 4), A(3, 4, domain="nonzero")], dtypes=NUMERIC),
        prim_row("floor_divide", p.floor_divide_p, {}, lax.floor_divide, lambda x, y: x // y,
                 [A(3, 4, domain="grid_half"), A(3, 4, domain="divisor")], dtypes=NUMERIC + (I32,)),
        prim_row("floor_divide_pyint", p.floor_divide_p, {}, lax.floor_divide, lambda x, s: x // s,
                 [A(3, 4, domain="grid_half"), S(2)], dtypes=NUMERIC),
        prim_row("remainder", p.remainder_p, {}, lax.remainder, lambda x, y: x % y,
                 [A(3, 4, domain="grid_half"), A(4, domain="divisor")], dtypes=NUMERIC + (I32,)),
        # x in [-2.6, 3.6] keeps 0.4 away from the multiples of 4
        prim_row("remainder_pyscalar", p.remainder_p, {}, lax.remainder, lambda x, s: x % s,
                 [A(3, 4, domain="grid_half"), S(4.0)], dtypes=NUMERIC),
        prim_row("remainder_pyscalar_left", p.remainder_p, {}, lax.remainder, lambda s, y: s % y,
                 [S(3.0), A(3, 4, domain="divisor")], dtypes=NUMERIC),
        prim_row("pow", p.pow_p, {}, lax.pow, lambda x, y: x ** y,
                 [A(3, 4, domain="positive"), A(3, 4)], tol32=(1e-5, 1e-5)),
        prim_row("pow_int", p.pow_p, {}, lax.pow, lambda x, y: x ** y,
                 [A(3, 4, domain="positive"), A(4, domain="positive")], dtypes=(I64,)),
        prim_row("pow_bcast_exponent", p.pow_p, {}, lax.pow, lambda x, y: x ** y,
                 [A(3, 4, domain="positive"), A(domain="positive")]),
        prim_row("max", p.max_p, {}, lax.max, np.maximum, [A(3, 4, domain="grid0"), A(4, domain="grid_half")],
                 dtypes=NUMERIC),
        prim_row("min", p.min_p, {}, lax.min, np.minimum, [A(3, 4, domain="grid_half"), A(3, 4, domain="grid0")],
                 dtypes=NUMERIC),
        # ties: the derivative is split evenly, which is what central differences see
        # (first order only: the derivative jumps at a tie)
        prim_row("max_ties", p.max_p, {}, lax.max, np.maximum, [A(3, 4, domain="ints"), A(3, 4, domain="ints")],
                 grad_order=1),
        prim_row("min_ties", p.min_p, {}, lax.min, np.minimum, [A(3, 4, domain="ints"), A(4, domain="ints")],
                 grad_order=1),
        prim_row("exp", p.exp_p, {}, lax.exp, np.exp, [A(3, 4)], dtypes=NUMERIC),
        prim_row("log", p.log_p, {}, lax.log, np.log, [A(3, 4, domain="positive")], dtypes=NUMERIC),
        prim_row("log1p", p.log1p_p, {}, lax.log1p, lambda x: np.log(1 + x.astype(np.float64)).astype(
            np.result_type(x.dtype, np.float32) if x.dtype.kind == "f" else np.float64),
            [A(3, 4, domain="positive")], dtypes=NUMERIC),
        prim_row("expm1", p.expm1_p, {}, lax.expm1, lambda x: (np.exp(x.astype(np.float64)) - 1).astype(
            x.dtype if x.dtype.kind == "f" else np.float64), [A(3, 4)], dtypes=NUMERIC,
            tol64=(1e-12, 1e-14)),
        prim_row("sqrt", p.sqrt_p, {}, lax.sqrt, np.sqrt, [A(3, 4, domain="positive")], dtypes=NUMERIC),
        prim_row("rsqrt", p.rsqrt_p, {}, lax.rsqrt, lambda x: 1 / np.sqrt(x), [A(3, 4, domain="positive")],
                 dtypes=NUMERIC),
        prim_row("tanh", p.tanh_p, {}, lax.tanh, lambda x: np.sinh(x) / np.cosh(x), [A(3, 4)], dtypes=NUMERIC),
        prim_row("logistic", p.logistic_p, {}, lax.logistic, lambda x: 1 / (1 + np.exp(-x)), [A(3, 4)],
                 dtypes=NUMERIC),
        prim_row("sin", p.sin_p, {}, lax.sin, np.sin, [A(3, 4)], dtypes=NUMERIC),
        prim_row("cos", p.cos_p, {}, lax.cos, np.cos, [A(3, 4)], dtypes=NUMERIC),
        prim_row("abs", p.abs_p, {}, lax.abs, np.abs, [A(3, 4, domain="nonzero")], dtypes=NUMERIC + (I32,)),
        # |x| at 0: the derivative sign(0) = 0 is what central differences see
        prim_row("abs_at_zero", p.abs_p, {}, lax.abs, np.abs, [A(3, 4, domain="ints")], grad_order=1),
        prim_row("sign", p.sign_p, {}, lax.sign, np.sign, [A(3, 4, domain="ints")], dtypes=NUMERIC),
        prim_row("integer_pow_2", p.integer_pow_p, {"y": 2}, lambda x: lax.integer_pow(x, 2),
                 lambda x: x * x, [A(3, 4)], dtypes=NUMERIC + (I32,)),
        prim_row("integer_pow_3", p.integer_pow_p, {"y": 3}, lambda x: lax.integer_pow(x, 3),
                 lambda x: x * x * x, [A(3, 4)], dtypes=NUMERIC),
        prim_row("integer_pow_neg2", p.integer_pow_p, {"y": -2}, lambda x: lax.integer_pow(x, -2),
                 lambda x: 1 / (x * x), [A(3, 4, domain="nonzero")], tol32=(1e-5, 1e-6)),
        prim_row("integer_pow_1", p.integer_pow_p, {"y": 1}, lambda x: lax.integer_pow(x, 1),
                 lambda x: x.copy(), [A(3, 4)]),
        prim_row("integer_pow_0", p.integer_pow_p, {"y": 0}, lambda x: lax.integer_pow(x, 0),
                 lambda x: np.ones_like(x), [A(3, 4)], dtypes=NUMERIC),
        prim_row("select", p.select_p, {}, lax.select, np.where, [P(3, 4), A(3, 4), A(3, 4)], dtypes=NUMERIC),
        prim_row("select_bcast", p.select_p, {}, lax.select, np.where, [P(4), A(3, 1), A(3, 4)]),
        prim_row("select_pyscalar", p.select_p, {}, lax.select, np.where, [P(3, 4), A(3, 4), S(0.0)],
                 dtypes=NUMERIC),
        prim_row("convert_to_f64", p.convert_element_type_p, {"new_dtype": F64},
                 lambda x: lax.convert_element_type(x, np.float64), lambda x: x.astype(np.float64), [A(3, 4)],
                 dtypes=NUMERIC + (BOOL,)),
        prim_row("convert_to_f32", p.convert_element_type_p, {"new_dtype": F32},
                 lambda x: lax.convert_element_type(x, np.float32), lambda x: x.astype(np.float32), [A(3, 4)],
                 grad_tol=1e-3, grad_eps=1e-2),
        prim_row("convert_to_i32", p.convert_element_type_p, {"new_dtype": I32},
                 lambda x: lax.convert_element_type(x, np.int32), lambda x: x.astype(np.int32),
                 [A(3, 4, domain="grid_half")], dtypes=NUMERIC, differentiable=False),
        prim_row("convert_int_to_f64", p.convert_element_type_p, {"new_dtype": F64},
                 lambda x: lax.convert_element_type(x, np.float64), lambda x: x.astype(np.float64),
                 [A(3, 4, dtype=I64)], dtypes=(I64,), differentiable=False),
        prim_row("stop_gradient", p.stop_gradient_p, {}, lax.stop_gradient, lambda x: x.copy(), [A(3, 4)],
                 dtypes=ANY),
    ]
    for name, prim, wrapper, ref in [
        ("eq", p.eq_p, lax.eq, np.equal), ("ne", p.ne_p, lax.ne, np.not_equal),
        ("lt", p.lt_p, lax.lt, np.less), ("le", p.le_p, lax.le, np.less_equal),
        ("gt", p.gt_p, lax.gt, np.greater), ("ge", p.ge_p, lax.ge, np.greater_equal),
    ]:
        rows.append(prim_row(name, prim, {}, wrapper, ref, [A(3, 4, domain="ints"), A(4, domain="ints")],
                             dtypes=ANY))
    rows.append(prim_row("lt_pyscalar", p.lt_p, {}, lax.lt, np.less, [A(3, 4, domain="ints"), S(0.5)],
                         dtypes=NUMERIC))
    rows += [
        prim_row("log2", p.log2_p, {}, lax.log2, np.log2, [A(3, 4, domain="positive")], dtypes=NUMERIC),
        prim_row("log10", p.log10_p, {}, lax.log10, np.log10, [A(3, 4, domain="positive")], dtypes=NUMERIC),
        prim_row("atan", p.atan_p, {}, lax.atan, np.arctan, [A(3, 4)], dtypes=NUMERIC),
        # y broadcasts against x; x stays away from the origin (the derivative's pole)
        prim_row("atan2", p.atan2_p, {}, lax.atan2, np.arctan2, [A(4), A(3, 4, domain="nonzero")], dtypes=NUMERIC),
        prim_row("sinh", p.sinh_p, {}, lax.sinh, np.sinh, [A(3, 4)], dtypes=NUMERIC),
        prim_row("cosh", p.cosh_p, {}, lax.cosh, np.cosh, [A(3, 4)], dtypes=NUMERIC),
        prim_row("asinh", p.asinh_p, {}, lax.asinh, np.arcsinh, [A(3, 4)], dtypes=NUMERIC),
        # the reference is Python's math.erf, one element at a time
        prim_row("erf", p.erf_p, {}, lax.erf, ref_erf, [A(3, 4)], dtypes=NUMERIC, tol64=(1e-15, 1e-15)),
        # the reference inverts math.erf by bisection, one element at a time
        prim_row("erf_inv", p.erf_inv_p, {}, lax.erf_inv, ref_erf_inv, [A(3, 4, domain="unit")],
                 tol64=(2e-15, 0), grad_eps=2e-5),
        # near the half-integers (floor, ceil) and away from them (round): no jumps nearby
        prim_row("floor", p.floor_p, {}, lax.floor, np.floor, [A(3, 4, domain="grid_half")]),
        prim_row("ceil", p.ceil_p, {}, lax.ceil, np.ceil, [A(3, 4, domain="grid_half")]),
        prim_row("round", p.round_p, {"decimals": 0, "rounding_method": lax.RoundingMethod.AWAY_FROM_ZERO},
                 lax.round, np.round, [A(3, 4, domain="grid0")]),
        prim_row("round_decimals", p.round_p, {"decimals": 1, "rounding_method": lax.RoundingMethod.TO_NEAREST_EVEN},
                 lambda x: ew.round_decimals(x, 1), lambda x: np.round(x, 1), [A(3, 4)]),
    ]
    return rows


def ref_erf(x):
    out = np.vectorize(math.erf, otypes=[np.float64])(x)
    return out.astype(x.dtype if x.dtype.kind == "f" else np.float64)


def _erf_inv_one(y):
    """The x with math.erf(x) = y, by bisection on [0.88 |y|, |y|] (erf_inv(y) / y grows
    from √π/2 ≈ 0.886 at 0 to 0.95 at |y| = 0.5) or, for |y| ≥ 0.5, on math.erfc(x) = 1 − |y|
    (exact there), which keeps the tails accurate."""
    if y == 0:
        return y
    a = abs(y)
    lo, hi = (0.88 * a, a) if a < 0.5 else (0.4, 30.0)
    while True:
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            return math.copysign(mid, y)
        if (math.erf(mid) < a) if a < 0.5 else (math.erfc(mid) > 1 - a):
            lo = mid
        else:
            hi = mid


def ref_erf_inv(x):
    return np.vectorize(_erf_inv_one, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype)


def _cumsum_ref(axis, reverse=False):
    def ref(x):
        dtype = np.int64 if x.dtype == BOOL else x.dtype
        if reverse:
            return np.flip(np.cumsum(np.flip(x, axis), axis, dtype=dtype), axis)
        return np.cumsum(x, axis, dtype=dtype)

    return ref


def _cumprod_ref(axis, reverse=False):
    def ref(x):
        if reverse:
            return np.flip(np.cumprod(np.flip(x, axis), axis, dtype=x.dtype), axis)
        return np.cumprod(x, axis, dtype=x.dtype)

    return ref


def _rows_cumulative_sorting():
    cp, sp = lax_cumulative, lax_sorting
    return [
        prim_row("cumsum", cp.cumsum_p, {"axis": 1, "reverse": False}, lambda x: lax.cumsum(x, 1),
                 _cumsum_ref(1), [A(3, 4)], dtypes=NUMERIC + (I32, BOOL)),
        prim_row("cumsum_reverse", cp.cumsum_p, {"axis": 0, "reverse": True},
                 lambda x: lax.cumsum(x, -3, reverse=True), _cumsum_ref(0, True), [A(2, 3, 4)]),
        prim_row("cumprod", cp.cumprod_p, {"axis": 1, "reverse": False}, lambda x: lax.cumprod(x, 1),
                 _cumprod_ref(1), [A(3, 5)], dtypes=NUMERIC),
        # zeros among small integers: cumprod is multilinear, so central differences are
        # exact there, and a rule that divides by x would give NaN
        prim_row("cumprod_zeros", cp.cumprod_p, {"axis": 2, "reverse": False}, lambda x: lax.cumprod(x, 2),
                 _cumprod_ref(2), [A(2, 3, 6, domain="ints")]),
        prim_row("cumprod_reverse_zeros", cp.cumprod_p, {"axis": 0, "reverse": True},
                 lambda x: lax.cumprod(x, 0, reverse=True), _cumprod_ref(0, True), [A(5, 3, domain="ints")]),
        prim_row("sort", sp.sort_p, {"axis": 1}, lambda x: lax.sort(x, 1), lambda x: np.sort(x, 1),
                 [A(3, 5, domain="distinct")], dtypes=NUMERIC),
        prim_row("sort_axis0", sp.sort_p, {"axis": 0}, lambda x: lax.sort(x, 0), lambda x: np.sort(x, 0),
                 [A(4, 2, 3, domain="distinct")]),
        # ties: stable
        prim_row("argsort", sp.argsort_p, {"axis": 1}, lambda x: lax.argsort(x, 1),
                 lambda x: np.argsort(x, 1, kind="stable"), [A(3, 6, domain="ints")], dtypes=NUMERIC + (BOOL,)),
    ]


def _slice_ref(spec):
    return lambda x: x[tuple(slice(*s) for s in spec)]


def _slice_transpose_ref(spec, shape):
    def ref(ct):
        out = np.zeros(shape, dtype=ct.dtype)
        out[tuple(slice(*s) for s in spec)] = ct
        return out

    return ref


def _take_transpose_ref(axis, shape):
    def ref(ct, idx):
        out = np.zeros(shape, dtype=ct.dtype)
        moved = np.moveaxis(out, axis, 0)  # a view: accumulate into out
        ct_moved = np.moveaxis(ct, tuple(range(axis, axis + idx.ndim)), tuple(range(idx.ndim)))
        for pos in np.ndindex(idx.shape):
            moved[idx[pos]] += ct_moved[pos]
        return out

    return ref


def _rows_indexing():
    ip = lax_indexing
    rows = [
        prim_row("iota", ip.iota_p, {"size": 5, "dtype": I64, "device": "cpu"}, lambda: lax.iota(5),
                 lambda: np.array([0, 1, 2, 3, 4]), [], dtypes=(I64,)),
        prim_row("iota_f32", ip.iota_p, {"size": 4, "dtype": F32, "device": "cpu"},
                 lambda: lax.iota(4, np.float32), lambda: np.array([0.0, 1.0, 2.0, 3.0], np.float32), [],
                 dtypes=(F32,)),
    ]
    for name, spec, shape in [
        ("slice", ((1, 3, 1), (0, 4, 2)), (3, 4)),
        ("slice_neg_step", ((2, None, -1), (3, 0, -2)), (3, 4)),
        ("slice_3d", ((0, 2, 1), (1, 3, 1), (3, None, -3)), (2, 3, 4)),
        ("slice_empty_dim", ((0, 3, 1), (2, 2, 1)), (3, 4)),
    ]:
        rows.append(prim_row(name, ip.slice_p, {"slices": spec}, lambda x, spec=spec: lax_indexing.slice(x, spec),
                             _slice_ref(spec), [A(*shape)], dtypes=ANY))
    rows += [
        prim_row("slice_in_dim_reversed", ip.slice_p, {"slices": ((2, None, -1), (0, 4, 1))},
                 lambda x: lax_indexing.slice_in_dim(x, -1, None, 0, -1), lambda x: x[::-1], [A(3, 4)]),
        prim_row("slice_in_dim_step", ip.slice_p, {"slices": ((0, 2, 1), (0, 3, 1), (1, 4, 2))},
                 lambda x: lax_indexing.slice_in_dim(x, 1, None, 2, 2), lambda x: x[:, :, 1::2], [A(2, 3, 4)]),
    ]
    for name, spec, shape, ct_shape in [
        ("slice_transpose", ((2, None, -2), (3, 0, -2)), (3, 4), (2, 2)),
        ("slice_transpose_3d", ((0, 2, 1), (1, 3, 1), (0, 4, 3)), (2, 3, 4), (2, 2, 2)),
    ]:
        rows.append(prim_row(
            name, ip.slice_transpose_p, {"slices": spec, "shape": shape},
            lambda ct, spec=spec, shape=shape: ip.slice_transpose_p.bind(ct, slices=spec, shape=shape),
            _slice_transpose_ref(spec, shape), [A(*ct_shape)], dtypes=NUMERIC))
    rows += [
        prim_row("take", ip.take_p, {"axis": 1}, lambda x, i: lax.take(x, i, 1),
                 lambda x, i: x[:, i], [A(3, 4), I((2, 3), 4)], dtypes=ANY),
        prim_row("check_index_bounds", ip.check_index_bounds_p, {"n": 4, "op": "take", "where": "axis 1"},
                 lambda i: ip.check_index_bounds(i, 4, "take", 1), lambda i: i, [I((2, 3), 4)], dtypes=NUMERIC),
        prim_row("take_axis0", ip.take_p, {"axis": 0}, lambda x, i: lax.take(x, i, 0),
                 lambda x, i: x[i], [A(3, 4), I((5,), 3)], dtypes=NUMERIC),
        prim_row("take_int32_indices", ip.take_p, {"axis": 0}, lambda x, i: lax.take(x, i, 0),
                 lambda x, i: x[i], [A(3, 4), I((2, 2), 3, I32)]),
        prim_row("take_scalar_index", ip.take_p, {"axis": 1}, lambda x, i: lax.take(x, i, 1),
                 lambda x, i: x[:, i], [A(2, 3, 4), I((), 3)]),
        prim_row("take_transpose", ip.take_transpose_p, {"axis": 1, "shape": (3, 4)},
                 lambda ct, i: ip.take_transpose_p.bind(ct, i, axis=1, shape=(3, 4)),
                 _take_transpose_ref(1, (3, 4)), [A(3, 5), I((5,), 4)], dtypes=NUMERIC),
        prim_row("take_transpose_axis0", ip.take_transpose_p, {"axis": 0, "shape": (3, 4)},
                 lambda ct, i: ip.take_transpose_p.bind(ct, i, axis=0, shape=(3, 4)),
                 _take_transpose_ref(0, (3, 4)), [A(2, 3, 4), I((2, 3), 3)], dtypes=NUMERIC),
        prim_row("take_transpose_int32_indices", ip.take_transpose_p, {"axis": 1, "shape": (2, 3)},
                 lambda ct, i: ip.take_transpose_p.bind(ct, i, axis=1, shape=(2, 3)),
                 _take_transpose_ref(1, (2, 3)), [A(2, 4), I((4,), 3, I32)]),
    ]
    return rows


def _dot_row(name, dn, subscripts, x_shape, y_shape, **kw):
    return prim_row(
        name, lax_linalg.dot_general_p, {"dimension_numbers": dn},
        lambda x, y: lax.dot_general(x, y, dn),
        lambda x, y: np.einsum(subscripts, x, y),
        [A(*x_shape), A(*y_shape)], **kw)


def svd_shift(x):
    """A fixed matrix with well-separated singular values (2k + 1, ..., 5, 3), to add to a
    standard normal ``x`` scaled by 0.3 (whose spectral norm stays well below 1): the
    singular values of the sum keep apart from each other and from 0 (Weyl), as the
    derivatives of the SVD need (NOTE [svd's derivatives]). It lives on ``x``'s device (a
    NumPy constant added to a CuPy array is an error, as in CuPy)."""
    m, n = np.shape(x)[-2:]
    k = min(m, n)
    d = np.zeros((m, n), dtype=x.dtype)
    d[np.arange(k), np.arange(k)] = 2.0 * np.arange(k, 0, -1) + 1
    return cv.device_put(d, "gpu") if backend.backend_name(x) == "gpu" else d


def separated(x):
    return 0.3 * x + svd_shift(x)


def signed_svd(m, u, s, vh):
    """The singular pairs with a fixed sign (the sign of the largest-magnitude entry of
    each column of ``u`` made positive, the row of ``vh`` flipped with it), so that
    decompositions from different LAPACK calls or devices compare; ``m`` is
    ``cuvmap.numpy`` or ``numpy``."""
    k = np.shape(s)[-1]
    uk = u[..., :k]
    idx = m.argmax(m.abs(uk), axis=-2)
    sign = m.sign(m.take_along_axis(uk, idx[..., None, :], -2))  # (..., 1, k)
    return uk * sign, s, vh[..., :k, :] * m.swapaxes(sign, -1, -2)


def svd_parts(m, u, s, vh):
    """The signed reduced parts of an SVD raveled into one vector, plus (for full
    matrices of a non-square matrix) as many columns of the projector onto the completion
    columns of U (rows of the one onto the completion rows of Vh) as the completion has
    entries: any orthonormal completion shares them, and the vector has the size of the
    packed output (NOTE [svd's one output])."""
    lead = np.shape(s)[:-1]
    k = np.shape(s)[-1]
    us, s, vs = signed_svd(m, u, s, vh)
    parts = [m.reshape(us, lead + (-1,)), s, m.reshape(vs, lead + (-1,))]
    if np.shape(u)[-1] > k:
        ue = u[..., k:]
        projector = m.matmul(ue, m.swapaxes(ue, -1, -2))
        parts.append(m.reshape(projector[..., :np.shape(ue)[-1]], lead + (-1,)))
    if np.shape(vh)[-2] > k:
        ve = vh[..., k:, :]
        projector = m.matmul(m.swapaxes(ve, -1, -2), ve)
        parts.append(m.reshape(projector[..., :np.shape(ve)[-2], :], lead + (-1,)))
    return m.concatenate(parts, axis=-1)


def _svd_row(name, shape, full_matrices, **kw):
    return prim_row(
        name, lax_linalg.svd_p, {"full_matrices": full_matrices, "compute_uv": True},
        lambda x: svd_parts(cnp, *lax.svd(separated(x), full_matrices)),
        lambda x: svd_parts(np, *np.linalg.svd(separated(x), full_matrices)),
        [A(*shape)], tol32=(2e-5, 2e-6), **kw)


def _rows_linalg():
    return [
        prim_row("svd_values", lax_linalg.svd_p, {"full_matrices": False, "compute_uv": False},
                 lambda x: lax.svd(separated(x), compute_uv=False),
                 lambda x: np.linalg.svd(separated(x), compute_uv=False), [A(3, 4)], tol32=(2e-6, 0)),
        # a stack: the batch dim of vmap lands among the leading dims or the matrix dims
        prim_row("svd_values_stacked", lax_linalg.svd_p, {"full_matrices": False, "compute_uv": False},
                 lambda x: lax.svd(separated(x), compute_uv=False),
                 lambda x: np.linalg.svd(separated(x), compute_uv=False), [A(2, 4, 3)], tol32=(2e-6, 0)),
        # U's projection term (m > n), V's (m < n), neither (square, full == reduced)
        _svd_row("svd_tall", (4, 3), False),
        _svd_row("svd_wide", (2, 4), False),
        _svd_row("svd_square_full", (3, 3), True),
        _svd_row("svd_stacked", (2, 3, 2), False),
        # full matrices of a non-square matrix: values and vmap only (no derivative: the
        # completion is arbitrary)
        _svd_row("svd_full_tall", (4, 2), True, diff_argnums=()),
        _svd_row("svd_full_wide", (2, 3), True, diff_argnums=()),
        _dot_row("dot_general_matmul", (((1,), (0,)), ((), ())), "ik,kj->ij", (3, 4), (4, 5),
                 dtypes=NUMERIC + (I32,)),
        _dot_row("dot_general_vector", (((0,), (0,)), ((), ())), "i,i->", (4,), (4,)),
        _dot_row("dot_general_outer", (((), ()), ((), ())), "i,j->ij", (3,), (4,)),
        _dot_row("dot_general_batched", (((2,), (1,)), ((0,), (0,))), "bik,bkj->bij", (2, 3, 4), (2, 4, 5)),
        _dot_row("dot_general_batch_not_leading", (((2,), (0,)), ((1,), (2,))), "ibk,kjb->bij",
                 (3, 2, 4), (4, 5, 2)),
        _dot_row("dot_general_two_contractions", (((1, 2), (1, 0)), ((), ())), "ikl,lk->i", (3, 4, 2), (2, 4)),
        _dot_row("dot_general_matvec_transposed", (((0,), (0,)), ((), ())), "ki,k->i", (4, 3), (4,)),
    ]


def _rows_reduction():
    rp = lax_reduction
    rows = []
    for name, prim, wrapper, ref in [
        # reduce_sum keeps the operand's dtype (NumPy's sum would promote int32 to int64),
        # except that booleans are counted in int64
        ("reduce_sum", rp.reduce_sum_p, lax.reduce_sum,
         lambda x, axis: np.sum(x, axis=axis, dtype=np.int64 if x.dtype == BOOL else x.dtype)),
        ("reduce_max", rp.reduce_max_p, lax.reduce_max, np.max),
        ("reduce_min", rp.reduce_min_p, lax.reduce_min, np.min),
    ]:
        domain = "real" if name == "reduce_sum" else "distinct"
        dtypes = NUMERIC + (I32, BOOL) if name == "reduce_sum" else NUMERIC
        for suffix, shape, axes in [("", (3, 4), (1,)), ("_02", (2, 3, 4), (0, 2)), ("_all", (3, 4), (0, 1))]:
            rows.append(prim_row(
                name + suffix, prim, {"axes": axes}, lambda x, w=wrapper, axes=axes: w(x, axes),
                lambda x, r=ref, axes=axes: r(x, axis=axes), [A(*shape, domain=domain)], dtypes=dtypes))
    rows += [
        prim_row("reduce_sum_neg_axes", rp.reduce_sum_p, {"axes": (0, 2)}, lambda x: lax.reduce_sum(x, (-1, 0)),
                 lambda x: x.sum(axis=(0, -1)), [A(2, 3, 4)]),
        prim_row("reduce_max_ties", rp.reduce_max_p, {"axes": (1,)}, lambda x: lax.reduce_max(x, (1,)),
                 lambda x: x.max(axis=1), [A(3, 4, domain="pairmax")], grad_order=1),
        prim_row("reduce_min_ties", rp.reduce_min_p, {"axes": (2,)}, lambda x: lax.reduce_min(x, (2,)),
                 lambda x: x.min(axis=2), [A(2, 3, 4, domain="pairmin")], grad_order=1),
        prim_row("argmax", rp.argmax_p, {"axis": 1}, lambda x: lax.argmax(x, 1), lambda x: np.argmax(x, axis=1),
                 [A(3, 4, domain="distinct")], dtypes=NUMERIC),
        prim_row("argmax_ties", rp.argmax_p, {"axis": 1}, lambda x: lax.argmax(x, 1),
                 lambda x: np.argmax(x, axis=1), [A(3, 4, domain="ints")], dtypes=NUMERIC + (BOOL,)),
        prim_row("argmin", rp.argmin_p, {"axis": 0}, lambda x: lax.argmin(x, 0), lambda x: np.argmin(x, axis=0),
                 [A(2, 3, 4, domain="distinct")], dtypes=NUMERIC),
        prim_row("argmin_neg_axis", rp.argmin_p, {"axis": 2}, lambda x: lax.argmin(x, -1),
                 lambda x: np.argmin(x, axis=-1), [A(2, 3, 4, domain="ints")], dtypes=NUMERIC),
    ]
    return rows


def _rows_shape():
    sp = lax_shape
    return [
        prim_row("reshape", sp.reshape_p, {"new_sizes": (2, 6)}, lambda x: lax.reshape(x, (2, 6)),
                 lambda x: x.reshape(2, 6), [A(3, 4)], dtypes=ANY),
        prim_row("reshape_3d", sp.reshape_p, {"new_sizes": (6, 4)}, lambda x: lax.reshape(x, (6, 4)),
                 lambda x: x.reshape(6, 4), [A(2, 3, 4)]),
        prim_row("reshape_flat", sp.reshape_p, {"new_sizes": (12,)}, lambda x: lax.reshape(x, (12,)),
                 lambda x: x.ravel(), [A(3, 4)]),
        prim_row("reshape_to_scalar", sp.reshape_p, {"new_sizes": ()}, lambda x: lax.reshape(x, ()),
                 lambda x: x.reshape(()), [A(1, 1)]),
        prim_row("reshape_from_scalar", sp.reshape_p, {"new_sizes": (1, 1)}, lambda x: lax.reshape(x, (1, 1)),
                 lambda x: x.reshape(1, 1), [A()]),
        prim_row("transpose", sp.transpose_p, {"permutation": (2, 0, 1)}, lambda x: lax.transpose(x, (2, 0, 1)),
                 lambda x: np.moveaxis(x, 2, 0), [A(2, 3, 4)], dtypes=ANY),
        prim_row("transpose_2d", sp.transpose_p, {"permutation": (1, 0)}, lambda x: lax.transpose(x, (1, 0)),
                 lambda x: x.T, [A(3, 4)]),
        prim_row("broadcast_in_dim", sp.broadcast_in_dim_p, {"shape": (2, 3, 4), "broadcast_dimensions": (1,)},
                 lambda x: lax.broadcast_in_dim(x, (2, 3, 4), (1,)),
                 lambda x: np.broadcast_to(x[None, :, None], (2, 3, 4)), [A(3)], dtypes=ANY),
        prim_row("broadcast_in_dim_size1", sp.broadcast_in_dim_p,
                 {"shape": (3, 4), "broadcast_dimensions": (0, 1)},
                 lambda x: lax.broadcast_in_dim(x, (3, 4), (0, 1)),
                 lambda x: np.broadcast_to(x, (3, 4)), [A(3, 1)]),
        prim_row("broadcast_in_dim_scalar", sp.broadcast_in_dim_p, {"shape": (2, 3), "broadcast_dimensions": ()},
                 lambda x: lax.broadcast_in_dim(x, (2, 3), ()),
                 lambda x: np.full((2, 3), x), [A()]),
        prim_row("broadcast_in_dim_mixed", sp.broadcast_in_dim_p,
                 {"shape": (2, 3, 4), "broadcast_dimensions": (0, 2)},
                 lambda x: lax.broadcast_in_dim(x, (2, 3, 4), (0, 2)),
                 lambda x: np.broadcast_to(x[:, None, :], (2, 3, 4)), [A(1, 4)]),
        prim_row("squeeze", sp.squeeze_p, {"dimensions": (1,)}, lambda x: lax.squeeze(x, (1,)),
                 lambda x: x[:, 0, :], [A(3, 1, 4)], dtypes=ANY),
        prim_row("squeeze_two", sp.squeeze_p, {"dimensions": (0, 2)}, lambda x: lax.squeeze(x, (0, 2)),
                 lambda x: x[0, :, 0], [A(1, 3, 1)]),
        prim_row("expand_dims", sp.expand_dims_p, {"dimensions": (0,)}, lambda x: lax.expand_dims(x, (0,)),
                 lambda x: x[None], [A(3, 4)], dtypes=ANY),
        prim_row("expand_dims_two", sp.expand_dims_p, {"dimensions": (1, 3)}, lambda x: lax.expand_dims(x, (1, 3)),
                 lambda x: x[:, None, :, None], [A(3, 4)]),
        prim_row("concatenate", sp.concatenate_p, {"dimension": 1},
                 lambda x, y, z: lax.concatenate([x, y, z], 1),
                 lambda x, y, z: np.concatenate([x, y, z], axis=1), [A(3, 2), A(3, 4), A(3, 1)], dtypes=ANY),
        prim_row("concatenate_2", sp.concatenate_p, {"dimension": 0},
                 lambda x, y: lax.concatenate([x, y], 0),
                 lambda x, y: np.concatenate([x, y], axis=0), [A(2, 3), A(1, 3)]),
        prim_row("pad", sp.pad_p, {"pads": ((1, 0), (2, 1)), "value": 0},
                 lambda x: lax_shape.pad(x, ((1, 0), (2, 1))),
                 lambda x: np.pad(x, ((1, 0), (2, 1))), [A(3, 4)], dtypes=ANY),
        prim_row("pad_value", sp.pad_p, {"pads": ((0, 0), (1, 1), (0, 2)), "value": 1.5},
                 lambda x: lax_shape.pad(x, ((0, 0), (1, 1), (0, 2)), 1.5),
                 lambda x: np.pad(x, ((0, 0), (1, 1), (0, 2)), constant_values=1.5), [A(2, 3, 4)]),
    ]


# ---------------------------------------------------------------------------------------
# The conv family: references from the definition, one einsum per kernel tap
#   conv(x, w)[n, g·Og + o, y] = Σ_{c,k} x[n, g·Cg + c, y·s − p + k·d] · w[g·Og + o, c, k]
# ---------------------------------------------------------------------------------------


def _taps(kernel, stride, dilation, out_sp):
    """For each kernel tap ``k``: the strided slices of the padded input it reads."""
    for k in itertools.product(*(range(n) for n in kernel)):
        yield k, (slice(None), slice(None)) + tuple(
            slice(ki * d, ki * d + s * (o - 1) + 1, s) for ki, d, s, o in zip(k, dilation, stride, out_sp))


def _grouped(x, groups):
    """``(N, G·Cg, ...)`` -> ``(N, G, Cg, ...)``."""
    return x.reshape(x.shape[:1] + (groups, x.shape[1] // groups) + x.shape[2:])


def ref_conv(x, w, stride, padding, dilation, groups):
    """The regular convolution, from its definition."""
    nd = x.ndim - 2
    kernel = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple((p, p) for p in padding))
    out_sp = tuple((xp.shape[2 + i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(nd))
    wg = w.reshape((groups, w.shape[0] // groups) + w.shape[1:])  # G Og Cg K...
    out = np.zeros((x.shape[0], groups, w.shape[0] // groups) + out_sp, dtype=np.result_type(x, w))
    for k, window in _taps(kernel, stride, dilation, out_sp):
        out += np.einsum("ngc...,goc->ngo...", _grouped(xp[window], groups), wg[(Ellipsis,) + k])
    return out.reshape((x.shape[0], w.shape[0]) + out_sp)


def ref_conv_input_adjoint(g, w, in_sp, stride, padding, dilation, groups):
    """``∂⟨ref_conv(x, w), g⟩/∂x`` for ``x`` with spatial size ``in_sp``: every output
    position adds ``g · w`` back onto the input positions its taps read."""
    kernel = w.shape[2:]
    out_sp = g.shape[2:]
    full = tuple(s + 2 * p for s, p in zip(in_sp, padding))
    wg = w.reshape((groups, w.shape[0] // groups) + w.shape[1:])  # G Og Cg K...
    x_pad = np.zeros((g.shape[0], groups, w.shape[1]) + full, dtype=np.result_type(g, w))
    for k, window in _taps(kernel, stride, dilation, out_sp):
        x_pad[(slice(None),) + window] += np.einsum("ngo...,goc->ngc...", _grouped(g, groups), wg[(Ellipsis,) + k])
    x_pad = x_pad.reshape((g.shape[0], groups * w.shape[1]) + full)
    return x_pad[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(padding, in_sp))]


def ref_conv_weight_adjoint(g, x, kernel, stride, padding, dilation, groups):
    """``∂⟨ref_conv(x, w), g⟩/∂w`` for ``w`` with spatial size ``kernel``."""
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple((p, p) for p in padding))
    out_sp = g.shape[2:]
    o, cg = g.shape[1], x.shape[1] // groups
    dw = np.zeros((groups, o // groups, cg) + tuple(kernel), dtype=np.result_type(g, x))
    for k, window in _taps(kernel, stride, dilation, out_sp):
        gg, xw = _grouped(g, groups), _grouped(xp[window], groups)
        dw[(Ellipsis,) + k] = np.einsum("ngos,ngcs->goc", gg.reshape(gg.shape[:3] + (-1,)),
                                        xw.reshape(xw.shape[:3] + (-1,)))
    return dw.reshape((o, cg) + tuple(kernel))


def _conv_transposed_out_sp(in_sp, kernel, stride, padding, dilation, output_padding):
    return tuple((s - 1) * st - 2 * p + d * (k - 1) + op + 1
                 for s, k, st, p, d, op in zip(in_sp, kernel, stride, padding, dilation, output_padding))


def _conv_rows():
    from cuvmap.lax import convolution as lax_conv

    rows = []
    # (name, x shape, w shape, with bias, params): regular and transposed, 1-d and 2-d,
    # groups 1 and 2, stride, padding, dilation and output_padding
    cases = [
        ("conv_1d_groups", (2, 4, 5), (6, 2, 3), False,
         dict(stride=(2,), padding=(1,), dilation=(1,), transposed=False, output_padding=(0,), groups=2)),
        ("conv_2d_bias", (2, 2, 4, 3), (3, 2, 2, 2), True,
         dict(stride=(1, 1), padding=(1, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1)),
        ("conv_2d_dilated_groups", (1, 4, 5, 5), (2, 2, 2, 2), False,
         dict(stride=(1, 2), padding=(1, 1), dilation=(2, 1), transposed=False, output_padding=(0, 0), groups=2)),
        ("conv_transposed_1d_groups", (2, 4, 3), (4, 3, 3), False,
         dict(stride=(2,), padding=(1,), dilation=(1,), transposed=True, output_padding=(1,), groups=2)),
        ("conv_transposed_2d_bias", (2, 2, 3, 2), (2, 3, 2, 2), True,
         dict(stride=(2, 1), padding=(0, 1), dilation=(1, 1), transposed=True, output_padding=(1, 0), groups=1)),
    ]
    for name, xs, ws, with_bias, params in cases:
        cp = {k: params[k] for k in ("stride", "padding", "dilation", "groups")}
        if params["transposed"]:
            out_sp = _conv_transposed_out_sp(xs[2:], ws[2:], params["stride"], params["padding"],
                                             params["dilation"], params["output_padding"])
            out_ch = ws[1] * params["groups"]
            # the transposed conv is the regular conv's input-adjoint
            fwd = lambda x, w, out_sp=out_sp, cp=cp: ref_conv_input_adjoint(x, w, out_sp, **cp)  # noqa: E731
            bwd_in = lambda g, w, cp=cp: ref_conv(g, w, **cp)  # noqa: E731
            bwd_w = lambda g, x, cp=cp, k=ws[2:]: ref_conv_weight_adjoint(x, g, k, **cp)  # noqa: E731
        else:
            out_sp = tuple(np.shape(ref_conv(np.zeros(xs), np.zeros(ws), **cp))[2:])
            out_ch = ws[0]
            fwd = lambda x, w, cp=cp: ref_conv(x, w, **cp)  # noqa: E731
            bwd_in = lambda g, w, cp=cp, s=xs[2:]: ref_conv_input_adjoint(g, w, s, **cp)  # noqa: E731
            bwd_w = lambda g, x, cp=cp, k=ws[2:]: ref_conv_weight_adjoint(g, x, k, **cp)  # noqa: E731
        nd = len(xs) - 2
        if with_bias:
            ref = lambda x, w, b, fwd=fwd, nd=nd: fwd(x, w) + b.reshape((-1,) + (1,) * nd)  # noqa: E731
            fun = lambda x, w, b, p=params: lax.conv(x, w, b, **p)  # noqa: E731
            args = [A(*xs), A(*ws), A(out_ch)]
        else:
            ref = fwd
            fun = lambda x, w, p=params: lax.conv(x, w, **p)  # noqa: E731
            args = [A(*xs), A(*ws)]
        tol = dict(tol32=(1e-5, 1e-5), grad_tol=1e-5)
        rows.append(prim_row(name, lax_conv.conv_p, params, fun, ref, args, **tol))
        gs = (xs[0], out_ch) + out_sp
        rows.append(prim_row(
            name.replace("conv", "conv_backward_input", 1), lax_conv.conv_backward_input_p,
            dict(params, input_shape=xs),
            lambda g, w, p=params, xs=xs: lax.conv_backward_input(g, w, xs, **p),
            bwd_in, [A(*gs), A(*ws)], **tol))
        rows.append(prim_row(
            name.replace("conv", "conv_backward_weight", 1), lax_conv.conv_backward_weight_p,
            dict(params, weight_shape=ws),
            lambda g, x, p=params, ws=ws: lax.conv_backward_weight(g, x, ws, **p),
            bwd_w, [A(*gs), A(*xs)], **tol))
    return rows


# ---------------------------------------------------------------------------------------
# The pooling family: references from sliding windows (numpy's sliding_window_view over
# the padded input; the selected position of a max window is numpy's argmax over the
# window in row-major order, i.e. the first maximum) and, for the scatters, a loop over
# output positions. Inputs of the max rows are "distinct": no ties, so finite differences
# see the derivative the rules compute.
# ---------------------------------------------------------------------------------------


def _pool_windows(x, window, stride, padding, value):
    """``(N, C, out..., prod(window))``: every window of the padded input, flattened."""
    nd = len(window)
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple((p, p) for p in padding), constant_values=value)
    win = np.lib.stride_tricks.sliding_window_view(xp, window, axis=tuple(range(2, 2 + nd)))
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)]
    return win.reshape(win.shape[:2 + nd] + (-1,))


def ref_max_pool(x, window, stride, padding):
    return _pool_windows(x, window, stride, padding, -np.inf).max(axis=-1)


def _pool_divisor(shape, window, stride, padding, count_include_pad):
    if count_include_pad:
        return float(np.prod(window))
    ones = np.ones((1, 1) + tuple(shape[2:]))
    return _pool_windows(ones, window, stride, padding, 0.0).sum(axis=-1)[0, 0]


def ref_avg_pool(x, window, stride, padding, count_include_pad):
    total = _pool_windows(x, window, stride, padding, 0.0).sum(axis=-1)
    return (total / _pool_divisor(x.shape, window, stride, padding, count_include_pad)).astype(x.dtype)


def _max_selection(x, m, window, stride, padding):
    """``(has, sel)``: per window, whether some tap equals the maxima ``m`` (a NaN matching a
    NaN) and the first such tap (``m = None``: the window's maximum, i.e. numpy's argmax)."""
    win = _pool_windows(x, window, stride, padding, -np.inf)
    if m is None:
        m = win.max(axis=-1)
    eq = (win == m[..., None]) | (np.isnan(win) & np.isnan(m)[..., None])
    return eq.any(axis=-1), eq.argmax(axis=-1)


def ref_max_pool_gather(t, x, m=None, *, window, stride, padding):
    has, sel = _max_selection(x, m, window, stride, padding)
    got = np.take_along_axis(_pool_windows(t, window, stride, padding, 0.0), sel[..., None], axis=-1)[..., 0]
    return np.where(has, got, 0).astype(t.dtype)


def _scatter_windows(g, shape, window, stride, padding, tap_weight):
    """Adds ``g[n, c, y] * tap_weight(n, c, y, tap)`` onto every tap of window ``y``, one
    output position at a time."""
    padded = np.zeros(tuple(shape[:2]) + tuple(s + 2 * p for s, p in zip(shape[2:], padding)), dtype=g.dtype)
    for pos in np.ndindex(g.shape):
        n, c, y = pos[0], pos[1], pos[2:]
        for t in np.ndindex(*window):
            w = tap_weight(n, c, y, t)
            if w:
                padded[(n, c) + tuple(yi * s + ti for yi, s, ti in zip(y, stride, t))] += g[pos] * w
    return padded[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(padding, shape[2:]))]


def ref_max_pool_scatter(g, x, m=None, *, window, stride, padding):
    has, sel = _max_selection(x, m, window, stride, padding)
    return _scatter_windows(g, x.shape, window, stride, padding,
                            lambda n, c, y, t: float(has[(n, c) + y] and
                                                     np.ravel_multi_index(t, window) == sel[(n, c) + y]))


def ref_avg_pool_transpose(g, shape, window, stride, padding, count_include_pad):
    d = np.broadcast_to(_pool_divisor(shape, window, stride, padding, count_include_pad), g.shape[2:])
    return _scatter_windows(g, shape, window, stride, padding, lambda n, c, y, t: 1.0 / d[y])


def _pooling_rows(composite=False):
    """The pooling family's primitive rows, or (``composite=True``) the rows of the gather
    and the scatter as the rules use them, which belong with the composite rows."""
    pl = importlib.import_module("cuvmap.lax.pooling")
    rows, composite_rows = [], []
    # (name, x shape, window, stride, padding): 1-, 2- and 3-d, overlapping and
    # non-overlapping windows, with and without padding
    geometries = [
        ("1d", (2, 3, 7), (3,), (2,), (1,)),
        ("2d", (2, 2, 5, 6), (3, 2), (2, 1), (1, 1)),
        ("2d_disjoint", (1, 3, 4, 6), (2, 2), (2, 2), (0, 0)),
        ("3d", (1, 2, 4, 3, 5), (2, 2, 3), (2, 1, 2), (1, 0, 1)),
    ]
    for geo, xs, window, stride, padding in geometries:
        params = dict(window=window, stride=stride, padding=padding)
        gs = ref_max_pool(np.zeros(xs), **params).shape
        rows.append(prim_row(
            f"max_pool_{geo}", pl.max_pool_p, params,
            lambda x, p=params: lax.max_pool(x, p["window"], p["stride"], p["padding"]),
            lambda x, p=params: ref_max_pool(x, **p), [A(*xs, domain="distinct")]))
        # the primitives with their third operand, the window maxima m, drawn on their own:
        # x and m from small integers, so that taps tie with each other and with m, and some
        # windows hold no tap equal to m (gathering 0, scattering nothing); differentiated
        # in t and g only (in x and m the derivative is zero but jumps at every tie)
        rows.append(prim_row(
            f"max_pool_gather_{geo}", pl.max_pool_gather_p, params,
            lambda t, x, m, p=params: lax.max_pool_gather(t, x, m, **p),
            lambda t, x, m, p=params: ref_max_pool_gather(t, x, m, **p),
            [A(*xs), A(*xs, domain="ints"), A(*gs, domain="ints")], diff_argnums=(0,)))
        rows.append(prim_row(
            f"max_pool_scatter_{geo}", pl.max_pool_scatter_p, params,
            lambda g, x, m, p=params: lax.max_pool_scatter(g, x, m, **p),
            lambda g, x, m, p=params: ref_max_pool_scatter(g, x, m, **p),
            [A(*gs), A(*xs, domain="ints"), A(*gs, domain="ints")], diff_argnums=(0,)))
        # as the rules use them: m = max_pool(x), and m omitted (the wrappers compute it);
        # x "distinct", so the derivative in x (zero) is what finite differences see
        composite_rows.append(Row(
            f"max_pool_gather_of_maxima_{geo}",
            lambda t, x, p=params: lax.max_pool_gather(t, x, lax.max_pool(x, **p), **p),
            lambda t, x, p=params: ref_max_pool_gather(t, x, **p), [A(*xs), A(*xs, domain="distinct")]))
        composite_rows.append(Row(
            f"max_pool_scatter_of_x_{geo}", lambda g, x, p=params: lax.max_pool_scatter(g, x, **p),
            lambda g, x, p=params: ref_max_pool_scatter(g, x, **p), [A(*gs), A(*xs, domain="distinct")]))
        for include in (True, False):
            suffix = "" if include else "_exclude_pad"
            ap = dict(params, count_include_pad=include)
            rows.append(prim_row(
                f"avg_pool_{geo}{suffix}", pl.avg_pool_p, ap,
                lambda x, p=ap: lax.avg_pool(x, p["window"], p["stride"], p["padding"], p["count_include_pad"]),
                lambda x, p=ap: ref_avg_pool(x, **p), [A(*xs)]))
            rows.append(prim_row(
                f"avg_pool_transpose_{geo}{suffix}", pl.avg_pool_transpose_p, dict(ap, input_shape=xs),
                lambda g, p=ap, xs=xs: lax.avg_pool_transpose(g, xs, **p),
                lambda g, p=ap, xs=xs: ref_avg_pool_transpose(g, xs, **p), [A(*gs)]))
    return composite_rows if composite else rows


# ---------------------------------------------------------------------------------------
# Bitwise primitives and the Threefry hash: references on Python ints, element by element
# ---------------------------------------------------------------------------------------


def _elementwise_ref(fn, dtype=None):
    """A reference applying ``fn`` to Python ints element by element (with broadcasting);
    the result has ``dtype`` (the first operand's by default)."""

    def ref(*xs):
        xs = np.broadcast_arrays(*[np.asarray(x) for x in xs])
        out_dtype = np.dtype(dtype or xs[0].dtype)
        out = [fn(*(v.item() for v in vals)) for vals in zip(*(x.ravel() for x in xs))]
        return np.array(out, dtype=out_dtype).reshape(xs[0].shape) if out else np.zeros(xs[0].shape, out_dtype)

    return ref


def _unsigned(v, bits):
    return int(v) % 2 ** bits


def _signed(v, bits):
    v %= 2 ** bits
    return v - 2 ** bits if v >= 2 ** (bits - 1) else v


def _wrap(v, dtype):
    bits = np.dtype(dtype).itemsize * 8
    return _unsigned(v, bits) if np.dtype(dtype).kind == "u" else _signed(v, bits)


def _bitcast_ref(src, dst):
    import struct

    fmt = {"float32": "f", "float64": "d", "uint32": "I", "uint64": "Q", "int32": "i"}

    def ref(x):
        values = np.asarray(x).ravel().tolist()
        packed = [struct.unpack("<" + fmt[dst], struct.pack("<" + fmt[src], v))[0] for v in values]
        return np.array(packed, dtype=dst).reshape(np.shape(x))

    return ref


def threefry2x32_reference(key, count):
    """Threefry-2x32 with 20 rounds on Python ints, from the Random123 paper's
    description (one (key, counter) pair at a time), for the leading dims broadcast."""
    key, count = np.asarray(key), np.asarray(count)
    lead = np.broadcast_shapes(key.shape[:-1], count.shape[:-1])
    key = np.broadcast_to(key, lead + (2,)).reshape(-1, 2)
    count = np.broadcast_to(count, lead + (2,)).reshape(-1, 2)
    mask = 0xFFFFFFFF
    rotations = [13, 15, 26, 6, 17, 29, 16, 24]
    out = []
    for (k0, k1), (x0, x1) in zip(key.tolist(), count.tolist()):
        ks = [k0, k1, k0 ^ k1 ^ 0x1BD11BDA]
        x0, x1 = (x0 + ks[0]) & mask, (x1 + ks[1]) & mask
        for r in range(20):
            rot = rotations[r % 8]
            x0 = (x0 + x1) & mask
            x1 = ((x1 << rot) | (x1 >> (32 - rot))) & mask
            x1 ^= x0
            if r % 4 == 3:
                s = r // 4 + 1
                x0 = (x0 + ks[s % 3]) & mask
                x1 = (x1 + ks[(s + 1) % 3] + s) & mask
        out.append((x0, x1))
    return np.array(out, dtype=np.uint32).reshape(lead + (2,))


def _rows_bits():
    bp = lax_bitwise
    U32 = np.dtype(np.uint32)
    U64 = np.dtype(np.uint64)
    INTS = (I64, I32, BOOL)
    bits32 = dict(domain="bits", dtype=U32)
    rows = []
    for name, prim, wrapper, fn in [
        ("bitwise_and", bp.bitwise_and_p, lax.bitwise_and, lambda a, b: a & b),
        ("bitwise_or", bp.bitwise_or_p, lax.bitwise_or, lambda a, b: a | b),
        ("bitwise_xor", bp.bitwise_xor_p, lax.bitwise_xor, lambda a, b: a ^ b),
    ]:
        rows += [
            prim_row(name, prim, {}, wrapper, _elementwise_ref(fn), [A(3, 4), A(4)], dtypes=INTS),
            prim_row(name + "_uint32", prim, {}, wrapper, _elementwise_ref(fn),
                     [A(3, 4, **bits32), A(3, 4, **bits32)], dtypes=(U32,)),
        ]
    rows += [
        prim_row("bitwise_or_pyint", bp.bitwise_or_p, {}, lax.bitwise_or,
                 _elementwise_ref(lambda a, b: a | b), [A(3, 4, **bits32), S(0x3F800000)], dtypes=(U32,)),
        prim_row("bitwise_not", bp.bitwise_not_p, {}, lax.bitwise_not,
                 _elementwise_ref(lambda a: not a if isinstance(a, bool) else ~a), [A(3, 4)], dtypes=INTS),
        prim_row("bitwise_not_uint32", bp.bitwise_not_p, {}, lax.bitwise_not,
                 _elementwise_ref(lambda a: a ^ 0xFFFFFFFF), [A(3, 4, **bits32)], dtypes=(U32,)),
        prim_row("shift_left", bp.shift_left_p, {}, lax.shift_left,
                 _elementwise_ref(lambda a, s: (a << s) & 0xFFFFFFFF if s < 32 else 0),
                 [A(3, 4, **bits32), A(4, domain="shift", dtype=U32)], dtypes=(U32,)),
        prim_row("shift_left_int64", bp.shift_left_p, {}, lax.shift_left,
                 _elementwise_ref(lambda a, s: _signed(a << s, 64) if s < 64 else 0),
                 [A(3, 4, domain="bits", dtype=I64), A(3, 4, domain="shift", dtype=I64)], dtypes=(I64,)),
        prim_row("shift_left_pyint", bp.shift_left_p, {}, lax.shift_left,
                 _elementwise_ref(lambda a, s: (a << s) % 2 ** 64), [A(3, domain="bits", dtype=U64), S(32)],
                 dtypes=(U64,)),
        prim_row("shift_right_logical", bp.shift_right_logical_p, {}, lax.shift_right_logical,
                 _elementwise_ref(lambda a, s: a >> s if s < 32 else 0),
                 [A(3, 4, **bits32), A(3, 1, domain="shift", dtype=U32)], dtypes=(U32,)),
        prim_row("shift_right_logical_int32", bp.shift_right_logical_p, {}, lax.shift_right_logical,
                 _elementwise_ref(lambda a, s: _signed(_unsigned(a, 32) >> s, 32) if s < 32 else 0),
                 [A(3, 4, domain="bits", dtype=I32), A(4, domain="shift", dtype=I32)], dtypes=(I32,)),
        prim_row("shift_right_logical_pyint", bp.shift_right_logical_p, {}, lax.shift_right_logical,
                 _elementwise_ref(lambda a, s: a >> s), [A(2, 3, **bits32), S(9)], dtypes=(U32,)),
        # the sign bit fills in, also past the bit width (-1 or 0), and on unsigned
        # integers (the top bit)
        prim_row("shift_right_arithmetic_int32", bp.shift_right_arithmetic_p, {}, lax.shift_right_arithmetic,
                 _elementwise_ref(lambda a, s: a >> min(s, 31)),
                 [A(3, 4, domain="bits", dtype=I32), A(4, domain="shift", dtype=I32)], dtypes=(I32,)),
        prim_row("shift_right_arithmetic_int64", bp.shift_right_arithmetic_p, {}, lax.shift_right_arithmetic,
                 _elementwise_ref(lambda a, s: a >> min(s, 63)),
                 [A(3, 4, domain="bits", dtype=I64), A(3, 1, domain="shift", dtype=I64)], dtypes=(I64,)),
        prim_row("shift_right_arithmetic_uint32", bp.shift_right_arithmetic_p, {}, lax.shift_right_arithmetic,
                 _elementwise_ref(lambda a, s: _unsigned(_signed(a, 32) >> min(s, 31), 32)),
                 [A(3, 4, **bits32), A(4, domain="shift", dtype=U32)], dtypes=(U32,)),
        prim_row("shift_right_arithmetic_pyint", bp.shift_right_arithmetic_p, {}, lax.shift_right_arithmetic,
                 _elementwise_ref(lambda a, s: a >> s), [A(2, 3, domain="bits", dtype=I64), S(7)], dtypes=(I64,)),
        prim_row("bitcast_u32_to_f32", bp.bitcast_convert_type_p, {"new_dtype": F32},
                 lambda x: lax.bitcast_convert_type(x, np.float32), _bitcast_ref("uint32", "float32"),
                 [A(3, 4, **bits32)], dtypes=(U32,)),
        prim_row("bitcast_f64_to_u64", bp.bitcast_convert_type_p, {"new_dtype": U64},
                 lambda x: lax.bitcast_convert_type(x, np.uint64), _bitcast_ref("float64", "uint64"),
                 [A(3, 4)], dtypes=(F64,)),
        prim_row("bitcast_f32_to_i32_scalar", bp.bitcast_convert_type_p, {"new_dtype": I32},
                 lambda x: lax.bitcast_convert_type(x, np.int32), _bitcast_ref("float32", "int32"),
                 [A()], dtypes=(F32,)),
        prim_row("threefry2x32", lax_prng.threefry2x32_p, {}, lax.threefry2x32, threefry2x32_reference,
                 [A(2, **bits32), A(5, 2, **bits32)], dtypes=(U32,)),
        prim_row("threefry2x32_keys", lax_prng.threefry2x32_p, {}, lax.threefry2x32, threefry2x32_reference,
                 [A(3, 1, 2, **bits32), A(4, 2, **bits32)], dtypes=(U32,)),
        prim_row("threefry2x32_pairs", lax_prng.threefry2x32_p, {}, lax.threefry2x32, threefry2x32_reference,
                 [A(3, 2, **bits32), A(3, 2, **bits32)], dtypes=(U32,)),
    ]
    return rows


# ---------------------------------------------------------------------------------------
# lax.gather, the scatters and their front ends (cuvmap.lax.slicing)
# ---------------------------------------------------------------------------------------

from cuvmap.lax import slicing_gather as lax_gather  # noqa: E402 - this block's own imports
from cuvmap.lax import slicing_scatter as lax_scatter  # noqa: E402
from slicing_references import gather_reference, scatter_reference  # noqa: E402
from linalg_references import tridiagonal_matrix as _tridiagonal_matrix  # noqa: E402

_GDN = lax.GatherDimensionNumbers
_SDN = lax.ScatterDimensionNumbers
_PROMISE = lax.GatherScatterMode.PROMISE_IN_BOUNDS
_CLIP = lax.GatherScatterMode.CLIP
_FILL = lax.GatherScatterMode.FILL_OR_DROP


def _gather_row(name, dnums, slice_sizes, args, mode=None, fill_value=None, **kw):
    parsed = _PROMISE if mode is None else lax.GatherScatterMode.from_any(mode)
    params = {"dimension_numbers": dnums, "slice_sizes": slice_sizes, "unique_indices": False,
              "indices_are_sorted": False, "mode": parsed, "fill_value": fill_value}
    ref_mode = "fill" if parsed is _FILL else "clip"
    return prim_row(name, lax_gather.gather_p, params,
                    lambda x, i: lax.gather(x, i, dnums, slice_sizes, mode=mode, fill_value=fill_value),
                    lambda x, i: gather_reference(x, i, dnums, slice_sizes, ref_mode, fill_value), args, **kw)


_SCATTERS = {"replace": (lax.scatter, lax_scatter.scatter_p), "add": (lax.scatter_add, lax_scatter.scatter_add_p),
             "mul": (lax.scatter_mul, lax_scatter.scatter_mul_p), "min": (lax.scatter_min, lax_scatter.scatter_min_p),
             "max": (lax.scatter_max, lax_scatter.scatter_max_p)}


def _scatter_row(name, kind, dnums, args, mode=None, **kw):
    fun, prim = _SCATTERS[kind]
    parsed = lax.GatherScatterMode.from_any(mode)
    params = {"dimension_numbers": dnums, "indices_are_sorted": False, "unique_indices": False, "mode": parsed}
    ref_mode = "clip" if parsed is _CLIP else "drop"
    return prim_row(name, prim, params, lambda x, i, u: fun(x, i, u, dnums, mode=mode),
                    lambda x, i, u: scatter_reference(kind, x, i, u, dnums, ref_mode), args, **kw)


_ROWS_GDN = _GDN(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
_WINDOW_GDN = _GDN(offset_dims=(2, 3), collapsed_slice_dims=(), start_index_map=(0, 1))
_COLUMNS_GDN = _GDN(offset_dims=(0,), collapsed_slice_dims=(1,), start_index_map=(1,))
_BATCHING_GDN = _GDN(offset_dims=(2,), collapsed_slice_dims=(1,), start_index_map=(1,), operand_batching_dims=(0,),
                     start_indices_batching_dims=(0,))
_ROWS_SDN = _SDN(update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,))
_WINDOW_SDN = _SDN(update_window_dims=(1, 2), inserted_window_dims=(), scatter_dims_to_operand_dims=(0, 1))
_BATCHING_SDN = _SDN(update_window_dims=(2,), inserted_window_dims=(1,), scatter_dims_to_operand_dims=(1,),
                     operand_batching_dims=(0,), scatter_indices_batching_dims=(0,))
_UNIQUE_ROWS = np.array([[3], [0], [4]])


def _dynamic_slice_ref(x, i, j):
    i = min(max(int(i) + (x.shape[0] if i < 0 else 0), 0), x.shape[0] - 2)
    j = min(max(int(j) + (x.shape[1] if j < 0 else 0), 0), x.shape[1] - 3)
    return x[i:i + 2, j:j + 3]


def _dynamic_update_slice_ref(x, u, i, j):
    i = min(max(int(i) + (x.shape[0] if i < 0 else 0), 0), x.shape[0] - u.shape[0])
    j = min(max(int(j) + (x.shape[1] if j < 0 else 0), 0), x.shape[1] - u.shape[1])
    out = x.copy()
    out[i:i + u.shape[0], j:j + u.shape[1]] = u
    return out


def _rows_slicing():
    """Indices drawn from [-n, n): negative ones are out of bounds for lax (clamped,
    filled or dropped by the row's mode)."""
    return [
        _gather_row("gather_rows", _ROWS_GDN, (1, 4), [A(5, 4), I((3, 1), 5)], dtypes=ANY),
        _gather_row("gather_window_clip", _WINDOW_GDN, (2, 3), [A(5, 6), I((2, 3, 2), 6)], mode="clip",
                    dtypes=NUMERIC),
        _gather_row("gather_columns_fill", _COLUMNS_GDN, (5, 1), [A(5, 6), I((4, 1), 6)], mode="fill",
                    fill_value=0.5),
        _gather_row("gather_batching_dims", _BATCHING_GDN, (1, 1, 4), [A(3, 5, 4), I((3, 2, 1), 5)]),
        _gather_row("gather_int8_indices", _ROWS_GDN, (1, 4), [A(5, 4), I((3, 1), 5, np.int8)]),
        _scatter_row("scatter_add_rows", "add", _ROWS_SDN, [A(5, 4), I((3, 1), 5), A(3, 4)], dtypes=NUMERIC),
        _scatter_row("scatter_add_window_clip", "add", _WINDOW_SDN, [A(5, 6), I((2, 2), 6), A(2, 2, 3)],
                     mode="clip"),
        _scatter_row("scatter_add_batching_dims", "add", _BATCHING_SDN, [A(3, 5, 4), I((3, 2, 1), 5), A(3, 2, 4)]),
        _scatter_row("scatter_rows", "replace", _ROWS_SDN, [A(5, 4), I((6, 1), 5), A(6, 4)], dtypes=ANY),
        _scatter_row("scatter_window_clip", "replace", _WINDOW_SDN, [A(5, 6), I((3, 2), 6), A(3, 2, 3)],
                     mode="clip"),
        # duplicates: scatter_mul's derivative in the updates needs unique indices (JAX's
        # rule), so this row differentiates the operand; the unique row below the updates
        _scatter_row("scatter_mul_rows", "mul", _ROWS_SDN, [A(5, 4), I((3, 1), 5), A(3, 4)], dtypes=NUMERIC,
                     diff_argnums=(0,)),
        _scatter_row("scatter_min_rows", "min", _ROWS_SDN, [A(5, 4), I((4, 1), 5), A(4, 4)], dtypes=NUMERIC),
        _scatter_row("scatter_max_window_clip", "max", _WINDOW_SDN, [A(5, 6), I((2, 2), 6), A(2, 2, 3)],
                     mode="clip"),
    ]


def _rows_slicing_composite():
    return [
        Row("scatter_mul_unique", lambda x, u: lax.scatter_mul(x, _UNIQUE_ROWS, u, _ROWS_SDN, unique_indices=True),
            lambda x, u: scatter_reference("mul", x, _UNIQUE_ROWS, u, _ROWS_SDN), [A(5, 4), A(3, 4)]),
        Row("dynamic_slice", lambda x, i, j: lax.dynamic_slice(x, (i, j), (2, 3)), _dynamic_slice_ref,
            [A(4, 5), I((), 4), I((), 5)]),
        Row("dynamic_update_slice", lambda x, u, i, j: lax.dynamic_update_slice(x, u, (i, j)),
            _dynamic_update_slice_ref, [A(4, 5), A(2, 3), I((), 4), I((), 5)]),
        Row("dynamic_index_in_dim", lambda x, i: lax.dynamic_index_in_dim(x, i, 1, keepdims=False),
            lambda x, i: x[:, int(i)], [A(3, 4), I((), 4)]),
        Row("dynamic_update_index_in_dim", lambda x, u, i: lax.dynamic_update_index_in_dim(x, u, i, 0),
            lambda x, u, i: _dynamic_update_slice_ref(x, u[None], i, 0), [A(4, 3), A(3), I((), 4)]),
        Row("index_take", lambda x, i, j: lax.index_take(x, (i, j), (0, 2)),
            lambda x, i, j: np.moveaxis(x, 1, -1)[i % 3, j % 5], [A(3, 4, 5), I((6,), 3), I((6,), 5)]),
    ]


# issue 32: JAX's remaining elementwise names (elementary, special, representation, selection)
def _math_ref(fn):
    """A reference from Python's math module, one element at a time."""
    def ref(*xs):
        dtype = np.result_type(*xs)
        out = np.vectorize(fn, otypes=[np.float64])(*(np.asarray(x, np.float64) for x in xs))
        return out.astype(dtype if dtype.kind == "f" else np.float64)
    return ref


def ref_digamma(x):
    """ψ(x) = ψ(x + N) − Σ_{k<N} 1/(x + k), N = 2000, with ψ(y) ≈ log y − 1/(2y) − 1/(12y²) + 1/(120y⁴)."""
    x64 = np.asarray(x, np.float64)
    y = x64 + 2000.0
    out = np.log(y) - 0.5 / y - 1 / (12 * y**2) + 1 / (120 * y**4)
    for k in range(2000):
        out -= 1.0 / (x64 + k)
    return out.astype(x.dtype)


def _igamma_one(a, x):
    """P(a, x) from its series x^a e^{−x} Σ xⁿ / Γ(a + n + 1), in Python floats."""
    total, n = 0.0, 0
    while True:
        term = math.exp(a * math.log(x) - x + n * math.log(x) - math.lgamma(a + n + 1))
        total += term
        if n > x and term < 1e-18 * total:
            return total
        n += 1


def _bessel_ie_one(order, x):
    """e^{−|x|} I_order(x) = (1/π) ∫₀^π e^{x cos θ − |x|} cos(order θ) dθ by the trapezoid rule
    over the whole period (exponentially accurate for a periodic integrand)."""
    n = 400
    theta = np.arange(n) * (2 * math.pi / n)
    return float(np.mean(np.exp(x * np.cos(theta) - abs(x)) * np.cos(order * theta)))


def _popcount_ref(x):
    bits = 8 * x.dtype.itemsize
    return np.vectorize(lambda v: bin(int(v) % (1 << bits)).count("1"), otypes=[x.dtype])(x)


def _rows_jax_elementwise():
    p = ew
    return [
        prim_row("tan", p.tan_p, {}, lax.tan, _math_ref(math.tan), [A(3, 4, domain="unit")], dtypes=NUMERIC),
        prim_row("asin", p.asin_p, {}, lax.asin, _math_ref(math.asin), [A(3, 4, domain="unit")]),
        prim_row("acos", p.acos_p, {}, lax.acos, _math_ref(math.acos), [A(3, 4, domain="unit")]),
        prim_row("atanh", p.atanh_p, {}, lax.atanh, _math_ref(math.atanh), [A(3, 4, domain="unit")]),
        # acosh on [1.5, 3]: x + 1 with x from "positive"
        prim_row("acosh", p.acosh_p, {}, lambda x: lax.acosh(lax.add(x, 1.0)),
                 lambda x: _math_ref(math.acosh)(x + x.dtype.type(1)), [A(3, 4, domain="positive")]),
        prim_row("cbrt", p.cbrt_p, {}, lax.cbrt, _math_ref(lambda v: math.copysign(abs(v) ** (1 / 3), v)),
                 [A(3, 4, domain="nonzero")], tol64=(1e-15, 0)),
        prim_row("square", p.square_p, {}, lax.square, lambda x: x * x, [A(3, 4)], dtypes=NUMERIC + (I32,)),
        prim_row("exp2", p.exp2_p, {}, lax.exp2, _math_ref(lambda v: 2.0**v), [A(3, 4)], dtypes=NUMERIC),
        prim_row("erfc", p.erfc_p, {}, lax.erfc, _math_ref(math.erfc), [A(3, 4)], dtypes=NUMERIC,
                 tol64=(1e-15, 1e-16)),
        prim_row("lgamma", p.lgamma_p, {}, lax.lgamma, _math_ref(math.lgamma), [A(3, 4, domain="positive")],
                 tol64=(1e-13, 1e-15)),
        prim_row("lgamma_negative", p.lgamma_p, {}, lax.lgamma, _math_ref(math.lgamma),
                 [A(3, 4, domain="grid_half")], tol64=(1e-13, 1e-14)),
        prim_row("digamma", p.digamma_p, {}, lax.digamma, ref_digamma, [A(3, 4, domain="positive")],
                 tol64=(1e-12, 1e-13)),
        prim_row("digamma_negative", p.digamma_p, {}, lax.digamma, ref_digamma, [A(3, 4, domain="grid_half")],
                 tol64=(1e-12, 1e-12), grad_tol=1e-4),
        prim_row("polygamma_1", p.polygamma_p, {"order": 1}, lambda x: lax.polygamma(1, x),
                 lambda x: sum(1.0 / (x.astype(np.float64) + k) ** 2 for k in range(100000)).astype(x.dtype)
                 + (1.0 / (x.astype(np.float64) + 100000)).astype(x.dtype),
                 [A(3, 4, domain="positive")], tol64=(1e-9, 1e-9), tol32=(1e-5, 1e-5)),
        prim_row("igamma", p.igamma_p, {}, lax.igamma, _math_ref(_igamma_one),
                 [A(3, 4, domain="positive"), A(3, 4, domain="positive")], tol64=(1e-13, 1e-14), grad_order=1),
        prim_row("igamma_bcast", p.igamma_p, {}, lax.igamma, _math_ref(_igamma_one),
                 [A(4, domain="positive"), A(3, 1, domain="positive")], tol64=(1e-13, 1e-14), grad_order=1),
        prim_row("igammac", p.igammac_p, {}, lax.igammac, _math_ref(lambda a, x: 1 - _igamma_one(a, x)),
                 [A(3, 4, domain="positive"), A(3, 4, domain="positive")], tol64=(1e-13, 1e-14), grad_order=1),
        # the reference: central differences of the series in a
        prim_row("igamma_grad_a", p.igamma_grad_a_p, {}, lax.igamma_grad_a,
                 _math_ref(lambda a, x: (_igamma_one(a + 1e-5, x) - _igamma_one(a - 1e-5, x)) / 2e-5),
                 [A(3, 4, domain="positive"), A(3, 4, domain="positive")], tol64=(1e-8, 1e-9),
                 tol32=(1e-4, 1e-5), diff_argnums=(1,), grad_order=1),
        prim_row("bessel_i0e", p.bessel_i0e_p, {}, lax.bessel_i0e, _math_ref(lambda v: _bessel_ie_one(0, v)),
                 [A(3, 4)], tol64=(1e-14, 1e-15)),
        prim_row("bessel_i1e", p.bessel_i1e_p, {}, lax.bessel_i1e, _math_ref(lambda v: _bessel_ie_one(1, v)),
                 [A(3, 4)], tol64=(1e-14, 1e-15)),
        prim_row("is_finite", p.is_finite_p, {}, lax.is_finite, lambda x: np.abs(x) < np.inf, [A(3, 4)],
                 differentiable=False),
        prim_row("nextafter", p.nextafter_p, {}, lax.nextafter,
                 lambda x, y: np.vectorize(math.nextafter, otypes=[np.float64])(x, y).astype(x.dtype)
                 if x.dtype == F64 else np.nextafter(x, y), [A(3, 4), A(4)], differentiable=False),
        prim_row("population_count", p.population_count_p, {}, lax.population_count, _popcount_ref,
                 [A(3, 4, domain="bits")], dtypes=(I32, I64)),
        prim_row("reduce_precision_f32", p.reduce_precision_p, {"exponent_bits": 8, "mantissa_bits": 23},
                 lambda x: lax.reduce_precision(x, 8, 23), lambda x: x.astype(np.float32).astype(x.dtype),
                 [A(3, 4)], diff_argnums=()),  # derivatives: JAX's identity, not the steps' zero (tests/lax/)
        prim_row("reduce_precision_f16", p.reduce_precision_p, {"exponent_bits": 5, "mantissa_bits": 10},
                 lambda x: lax.reduce_precision(x, 5, 10), lambda x: x.astype(np.float16).astype(x.dtype),
                 [A(3, 4, domain="nonzero")], diff_argnums=()),
        # bounds near the integers, x near the half-integers: no ties; min > max happens
        prim_row("clamp", p.clamp_p, {}, lax.clamp, lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi),
                 [A(4, domain="grid0"), A(3, 4, domain="grid_half"), A(3, 1, domain="grid0")], dtypes=NUMERIC),
        prim_row("clamp_pyscalars", p.clamp_p, {}, lax.clamp, lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi),
                 [S(-1.0), A(3, 4, domain="grid_half"), S(1.0)]),
        prim_row("select_n_bool", p.select_n_p, {}, lax.select_n, lambda w, a, b: np.where(w, b, a),
                 [P(3, 4), A(3, 4), A(3, 4)], dtypes=NUMERIC),
        prim_row("select_n_int", p.select_n_p, {}, lax.select_n, lambda w, *cs: np.choose(w, cs),
                 [Arg((3, 4), domain="positive", dtype=I32), A(3, 4), A(3, 4), A(4), A(3, 4)]),
    ]


# ---------------------------------------------------------------------------------------
# Linear algebra: solves, determinants and decompositions (cuvmap/lax/linalg_solve.py,
# linalg_decompositions.py). The operands are standard normal; each row
# makes from them the well-conditioned matrix its function needs: ``separated(x)``
# (singular values 2k + 1, ..., 3, apart from each other and from 0), its symmetric part
# (distinct eigenvalues), ``spd(x)`` (symmetric positive definite, distinct eigenvalues).
# ---------------------------------------------------------------------------------------


def spd(x):
    m = separated(x)
    return cnp.matmul(m, cnp.swapaxes(m, -1, -2))


def symmetric(x):
    m = separated(x)
    return (m + cnp.swapaxes(m, -1, -2)) * 0.5


def signed_columns(m, v):
    """The columns of ``v`` with the sign of their largest-magnitude entry made positive."""
    idx = m.argmax(m.abs(v), axis=-2)
    return v * m.sign(m.take_along_axis(v, idx[..., None, :], -2))


def _packed_eigh(m, w, v):
    return m.concatenate([signed_columns(m, v), w[..., None]], axis=-1)


def _packed_qr(m, q, r):
    lead = np.shape(q)[:-2]
    return m.concatenate([m.reshape(q, lead + (-1,)), m.reshape(r, lead + (-1,))], axis=-1)


def _ref_lu(a):
    """LU with partial pivoting, written from the definition (packed as lu_p's)."""
    a = np.array(a, dtype=a.dtype)
    *lead, n, _ = a.shape
    flat = a.reshape(-1, n, n)
    out = np.zeros(flat.shape[:-1] + (n + 2,), dtype=a.dtype)
    for b, m in enumerate(flat):
        m = m.copy()
        perm = list(range(n))
        for j in range(n):
            p = j + int(np.argmax(np.abs(m[j:, j])))
            out[b, j, n] = p
            m[[j, p]] = m[[p, j]]
            perm[j], perm[p] = perm[p], perm[j]
            m[j + 1:, j] /= m[j, j]
            m[j + 1:, j + 1:] -= np.outer(m[j + 1:, j], m[j, j + 1:])
        out[b, :, :n] = m
        out[b, :, n + 1] = perm
    return out.reshape(tuple(lead) + (n, n + 2))


def _ref_pivots(pivots, n):
    flat = pivots.reshape(-1, pivots.shape[-1])
    out = np.tile(np.arange(n), (flat.shape[0], 1))
    for row, piv in zip(out, flat):
        for j, p in enumerate(piv):
            row[j], row[p] = row[p], row[j]
    return out.reshape(pivots.shape[:-1] + (n,)).astype(np.int32)


def _ref_adjugate(a):
    return np.linalg.det(a)[..., None, None] * np.linalg.inv(a)


def _ref_triangular(a, b, lower, transpose_a, unit):
    m = np.tril(a) if lower else np.triu(a)
    if unit:
        eye = np.eye(a.shape[-1], dtype=a.dtype)
        m = m - eye * np.diagonal(m, 0, -2, -1)[..., None, :] + eye
    if transpose_a:
        m = np.swapaxes(m, -1, -2)
    return np.linalg.solve(m, b)


def _triangular_row(name, lower, transpose_a, unit, shapes):
    params = {"lower": lower, "transpose_a": transpose_a, "unit_diagonal": unit}
    return prim_row(name, lax_solve.triangular_solve_p, params,
                    lambda a, b: lax_solve.triangular_solve_left(separated(a), b, **params),
                    lambda a, b: _ref_triangular(separated(a), b, lower, transpose_a, unit),
                    [A(*shapes[0]), A(*shapes[1])], tol32=(2e-5, 2e-6))


def _rows_linalg_solvers():
    flipped = lambda x: separated(x)[..., ::-1, :]  # noqa: E731 - rows swapped: the LU pivots
    return [
        prim_row("solve", lax_solve.solve_p, {}, lambda a, b: lax_solve.solve(separated(a), b),
                 lambda a, b: np.linalg.solve(separated(a), b), [A(3, 3), A(3, 2)], tol32=(2e-5, 2e-6)),
        prim_row("solve_stacked", lax_solve.solve_p, {}, lambda a, b: lax_solve.solve(separated(a), b),
                 lambda a, b: np.linalg.solve(separated(a), b), [A(2, 3, 3), A(2, 3, 1)], tol32=(2e-5, 2e-6)),
        _triangular_row("triangular_solve_lower", True, False, False, [(3, 3), (3, 2)]),
        _triangular_row("triangular_solve_upper_transposed_unit", False, True, True, [(2, 4, 4), (2, 4, 3)]),
        _triangular_row("triangular_solve_lower_transposed", True, True, False, [(3, 3), (3, 1)]),
        prim_row("lu", lax_solve.lu_p, {}, lambda x: lax_solve.lu_p.bind(flipped(x)), lambda x: _ref_lu(flipped(x)),
                 [A(4, 4)], tol32=(2e-5, 2e-6)),
        prim_row("lu_stacked", lax_solve.lu_p, {}, lambda x: lax_solve.lu_p.bind(flipped(x)),
                 lambda x: _ref_lu(flipped(x)), [A(2, 3, 3)], tol32=(2e-5, 2e-6)),
        prim_row("lu_index_real", lax_solve.lu_index_real_p, {}, lax_solve.lu_index_real_p.bind, lambda x: x,
                 [A(2, 3)]),
        prim_row("lu_pivots_to_permutation", lax_solve.lu_pivots_to_permutation_p, {"permutation_size": 4},
                 lambda p: lax_solve.lu_pivots_to_permutation(p, 4), lambda p: _ref_pivots(p, 4),
                 [A(2, 3, domain="positive", dtype=I32)], dtypes=(I32,)),
        prim_row("det", lax_solve.det_p, {}, lambda x: lax_solve.det(separated(x)),
                 lambda x: np.linalg.det(separated(x)), [A(2, 3, 3)], tol32=(2e-5, 2e-6)),
        prim_row("adjugate", lax_solve.adjugate_p, {}, lambda x: lax_solve.adjugate(separated(x)),
                 lambda x: _ref_adjugate(separated(x)), [A(3, 3)], tol32=(5e-5, 5e-6), tol64=(1e-11, 1e-11)),
        prim_row("slogdet", lax_solve.slogdet_p, {}, lambda x: lax_solve.slogdet_p.bind(flipped(x)),
                 lambda x: np.stack(np.linalg.slogdet(flipped(x)), -1), [A(2, 4, 4)], tol32=(2e-5, 2e-6)),
        prim_row("cholesky", lax_decomp.cholesky_p, {}, lambda x: lax_decomp.cholesky(spd(x)),
                 lambda x: np.linalg.cholesky(spd(x)), [A(2, 3, 3)], tol32=(2e-5, 2e-6)),
        prim_row("eigh", lax_decomp.eigh_p, {"lower": True},
                 lambda x: _packed_eigh(cnp, *lax_decomp.eigh(symmetric(x))[::-1]),
                 lambda x: _packed_eigh(np, *np.linalg.eigh(symmetric(x))), [A(2, 3, 3)], tol32=(5e-5, 5e-6)),
        # only the upper triangle is read: the derivative folds onto it
        prim_row("eigh_upper_unsymmetrized", lax_decomp.eigh_p, {"lower": False},
                 lambda x: _packed_eigh(cnp, *lax_decomp.eigh(separated(x), lower=False, symmetrize_input=False)[::-1]),
                 lambda x: _packed_eigh(np, *np.linalg.eigh(separated(x), UPLO="U")), [A(3, 3)], tol32=(5e-5, 5e-6)),
        prim_row("qr", lax_decomp.qr_p, {"full_matrices": False},
                 lambda x: _packed_qr(cnp, *lax_decomp.qr(separated(x), full_matrices=False)),
                 lambda x: _packed_qr(np, *np.linalg.qr(separated(x))), [A(2, 4, 3)], tol32=(5e-5, 5e-6)),
        prim_row("qr_square_full", lax_decomp.qr_p, {"full_matrices": True},
                 lambda x: _packed_qr(cnp, *lax_decomp.qr(separated(x), full_matrices=True)),
                 lambda x: _packed_qr(np, *np.linalg.qr(separated(x), mode="complete")), [A(3, 3)],
                 tol32=(5e-5, 5e-6)),
        # full matrices of a tall matrix: the Householder completion's derivative (JAX's)
        prim_row("qr_tall_full", lax_decomp.qr_p, {"full_matrices": True},
                 lambda x: _packed_qr(cnp, *lax_decomp.qr(x, full_matrices=True)),
                 lambda x: _packed_qr(np, *np.linalg.qr(x, mode="complete")), [A(3, 2)], tol32=(5e-5, 5e-6)),
        prim_row("qr_wide", lax_decomp.qr_p, {"full_matrices": False},
                 lambda x: _packed_qr(cnp, *lax_decomp.qr(x, full_matrices=False)),
                 lambda x: _packed_qr(np, *np.linalg.qr(x)), [A(2, 4)], tol32=(5e-5, 5e-6)),
    ]


# ---------------------------------------------------------------------------------------
# General eigenproblems, the Schur decomposition, tridiagonal solves (issue 32:
# cuvmap/lax/linalg_eig.py, linalg_schur.py, linalg_tridiagonal.py, linalg_householder.py;
# each row's result has its primitive's packed layout). eig's results are complex: the
# rows give re(z) + im(z)/2, the eigenvectors as v·v (free of geev's sign choice for real
# eigenvectors, as JAX's tests); the reference runs the same
# LAPACK call in double precision (the order of the eigenvalues is geev's). schur has no
# derivative: its row checks the reconstruction Z T Zᴴ = x and Z Zᴴ = I; hessenberg's
# Q H Qᴴ = x and Q Qᴴ = I; tridiagonal's the eigenvalues of T against those of the
# symmetric matrix of the triangle read (no derivatives, as JAX).
# ---------------------------------------------------------------------------------------
from cuvmap.lax import linalg_eig as lax_eig  # noqa: E402 - this block's own imports
from cuvmap.lax import linalg_householder as lax_householder  # noqa: E402
from cuvmap.lax import linalg_schur as lax_schur  # noqa: E402
from cuvmap.lax import linalg_tridiagonal as lax_tridiagonal  # noqa: E402


def _eig_summary(m, w, *vs):
    """Real numbers in the packed output's layout: re(z) + im(z)/2 of each of w and v·v."""
    packed = m.concatenate([w[..., :, None]] + [v * v for v in vs], axis=-1)
    return m.real(packed) + 0.5 * m.imag(packed)


def _ref_eig(x, left, right):
    w, vr = np.linalg.eig(x.astype(np.float64))
    vs = []
    if left:
        vl = np.conj(np.swapaxes(np.linalg.inv(vr), -1, -2))
        vl = vl / np.linalg.norm(vl, axis=-2, keepdims=True)
        top = np.take_along_axis(vl, np.argmax(np.abs(vl), axis=-2)[..., None, :], -2)
        vs.append(vl * np.conj(top) / np.abs(top))
    if right:
        vs.append(vr)
    return _eig_summary(np, w, *vs).astype(x.dtype)


def _eig_row(name, left, right, shape):
    params = {"compute_left_eigenvectors": left, "compute_right_eigenvectors": right,
              "enable_eigvec_derivs": left or right}
    return prim_row(name, lax_eig.eig_p, params, lambda x: _eig_summary(cnp, *lax_eig.eig(x, **params)),
                    lambda x: _ref_eig(x, left, right), [A(*shape)], tol32=(1e-4, 1e-5), tol64=(1e-10, 1e-10),
                    grad_tol=1e-4)


def _schur_reconstruction(x):
    t, z = lax_schur.schur(x)
    zt = cnp.swapaxes(z, -1, -2)
    return cnp.concatenate([z @ t @ zt, z @ zt], axis=-1)


def _hessenberg_reconstruction(x):
    """Q H Qᵀ and the squared norms of Q's rows, in the packed output's layout."""
    h, q = cv_scipy.linalg.hessenberg(x, calc_q=True)
    return cnp.concatenate([q @ h @ cnp.swapaxes(q, -1, -2), cnp.sum(q * q, axis=-1)[..., None, :]], axis=-2)


def _tridiagonal_eigenvalues(x, lower):
    """The eigenvalues of the tridiagonal T (from d and e) and its diagonals: the
    reduction keeps the eigenvalues of the symmetric matrix of the triangle read."""
    _, d, e, _ = lax_householder.tridiagonal(x, lower=lower)
    n = d.shape[-1]
    xp = backend.xp_of(d)
    eye = lambda k: xp.eye(n, k=k, dtype=d.dtype)  # noqa: E731 - on d's device
    off = cnp.concatenate([e, e[..., :1] * 0], axis=-1)
    t = d[..., :, None] * eye(0) + off[..., None, :] * eye(-1) + off[..., :, None] * eye(1)
    w = cnp.linalg.eigvalsh(t)
    return cnp.broadcast_to(w[..., None, :], w.shape[:-1] + (n + 3, n))  # the packed output's layout


def _ref_symmetric_eigenvalues(x, lower):
    tri = np.tril(x) if lower else np.triu(x)
    strict = np.tril(x, -1) if lower else np.triu(x, 1)
    w = np.linalg.eigvalsh((tri + np.swapaxes(strict, -1, -2)).astype(np.float64)).astype(x.dtype)
    n = x.shape[-1]
    return np.broadcast_to(w[..., None, :], w.shape[:-1] + (n + 3, n))


def _rows_linalg_eig():
    dominant = lambda d: d + 4.0  # noqa: E731 - a well-conditioned system for the derivative checks
    return [
        _eig_row("eig_values", False, False, (2, 3, 3)),
        _eig_row("eig_right", False, True, (3, 3)),
        _eig_row("eig_left_right", True, True, (2, 3, 3)),
        prim_row("schur", lax_schur.schur_p, {"compute_schur_vectors": True}, _schur_reconstruction,
                 lambda x: np.concatenate([x, np.broadcast_to(np.eye(x.shape[-1], dtype=x.dtype), x.shape)], -1),
                 [A(2, 4, 4)], tol32=(1e-4, 1e-5), tol64=(1e-10, 1e-10), diff_argnums=()),
        prim_row("tridiagonal_solve", lax_tridiagonal.tridiagonal_solve_p, {"perturb_singular": False},
                 lambda dl, d, du, b: lax_tridiagonal.tridiagonal_solve(dl, dominant(d), du, b),
                 lambda dl, d, du, b: np.linalg.solve(_tridiagonal_matrix(dl, dominant(d), du), b),
                 [A(2, 4), A(2, 4), A(2, 4), A(2, 4, 3)], tol32=(1e-4, 1e-5), tol64=(1e-10, 1e-10)),
        prim_row("hessenberg", lax_householder.hessenberg_p, {}, _hessenberg_reconstruction,
                 lambda x: np.concatenate([x, np.ones(x.shape[:-2] + (1, x.shape[-1]), dtype=x.dtype)], -2),
                 [A(2, 5, 5)], tol32=(1e-4, 1e-5), tol64=(1e-10, 1e-10), diff_argnums=()),
        prim_row("tridiagonal_lower", lax_householder.tridiagonal_p, {"lower": True},
                 lambda x: _tridiagonal_eigenvalues(x, True), lambda x: _ref_symmetric_eigenvalues(x, True),
                 [A(2, 5, 5)], tol32=(1e-4, 1e-5), tol64=(1e-10, 1e-10), diff_argnums=()),
        prim_row("tridiagonal_upper", lax_householder.tridiagonal_p, {"lower": False},
                 lambda x: _tridiagonal_eigenvalues(x, False), lambda x: _ref_symmetric_eigenvalues(x, False),
                 [A(4, 4)], tol32=(1e-4, 1e-5), tol64=(1e-10, 1e-10), diff_argnums=()),
    ]


def _rows_api_surface():
    """issue 32 (apisurf): optimization_barrier, the identity behind a barrier equation."""
    return [
        prim_row("optimization_barrier", lax_barriers.optimization_barrier_p, {},
                 lax.optimization_barrier, lambda x: x, [A(3, 4)], dtypes=NUMERIC),
    ]


PRIMITIVE_ROWS = (
    _rows_elementwise() + _rows_indexing() + _rows_linalg() + _rows_reduction() + _rows_shape() + _conv_rows()
    + _pooling_rows() + _rows_cumulative_sorting()
    + _rows_bits()
    + _rows_slicing()
    + _rows_jax_elementwise()
    + _rows_linalg_solvers()
    + _rows_linalg_eig()
    + _rows_api_surface()
)


# ---------------------------------------------------------------------------------------
# Composites (cuvmap.numpy): no shape rule of their own
# ---------------------------------------------------------------------------------------


def _getitem_row(name, index_fn, args, dtypes=FLOATS):
    """``index_fn(*index_arrays)`` builds the index tuple; ``args[0]`` is the array."""
    return Row(name, lambda x, *ix: cnp.getitem(x, index_fn(*ix)), lambda x, *ix: x[index_fn(*ix)], args,
               dtypes=dtypes)


def _tae_ref(axis):
    return lambda x, i: np.take_along_axis(x, i, axis=axis)


def _rows_composite():
    rows = [
        _getitem_row("getitem_int", lambda: 1, [A(3, 4)], dtypes=ANY),
        _getitem_row("getitem_neg_int_slice", lambda: (-1, slice(1, 3)), [A(3, 4)]),
        _getitem_row("getitem_neg_steps", lambda: (slice(None, None, -1), slice(3, 0, -2)), [A(3, 4)], dtypes=ANY),
        _getitem_row("getitem_none", lambda: (None, slice(None), 1), [A(3, 4)]),
        _getitem_row("getitem_ellipsis", lambda: (Ellipsis, 2), [A(2, 3, 4)]),
        _getitem_row("getitem_ellipsis_none", lambda: (1, Ellipsis, None), [A(2, 3, 4)]),
        _getitem_row("getitem_array", lambda i: i, [A(3, 4), I((2, 2), 3)], dtypes=ANY),
        _getitem_row("getitem_array_axis1", lambda i: (slice(None), i), [A(3, 4), I((5,), 4)]),
        _getitem_row("getitem_arrays_adjacent", lambda i, j: (slice(None), i, j),
                     [A(2, 3, 4), I((5,), 3), I((5,), 4)]),
        _getitem_row("getitem_arrays_nonadjacent", lambda i, j: (i, slice(None), j),
                     [A(2, 3, 4), I((5,), 2), I((5,), 4)]),
        _getitem_row("getitem_int32_arrays", lambda i, j: (i, slice(None), j),
                     [A(2, 3, 4), I((3,), 2, I32), I((3,), 4, I32)]),
        _getitem_row("getitem_arrays_broadcast", lambda i, j: (i, j), [A(3, 4), I((2, 1), 3), I((3,), 4)]),
        _getitem_row("getitem_int_array_nonadjacent", lambda j: (1, slice(None), j), [A(2, 3, 4), I((5,), 4)]),
        _getitem_row("getitem_list", lambda: [0, -1, 1], [A(3, 4)]),
        _getitem_row("getitem_0d_array", lambda i: (slice(None), i), [A(3, 4), I((), 4)]),
        _getitem_row("getitem_neg_int_array", lambda j: (-1, slice(None), j), [A(2, 3, 4), I((2, 2), 4)]),
        _getitem_row("getitem_ellipsis_array", lambda j: (Ellipsis, j), [A(2, 3, 4), I((3,), 4)]),
        _getitem_row("getitem_slice_array", lambda j: (slice(None, None, -1), j), [A(3, 4), I((2, 3), 4)]),
        Row("take_along_axis", lambda x, i: cnp.take_along_axis(x, i, 1), _tae_ref(1), [A(3, 4), I((3, 5), 4)],
            dtypes=NUMERIC),
        Row("take_along_axis_0", lambda x, i: cnp.take_along_axis(x, i, 0), _tae_ref(0), [A(3, 4), I((2, 4), 3)]),
        Row("take_along_axis_bcast", lambda x, i: cnp.take_along_axis(x, i, -1), _tae_ref(-1),
            [A(3, 4), I((1, 5), 4)]),
        Row("iota_like", lambda x: lax.add(x, lax.iota(4, core.dtype_of(x), like=x)),
            lambda x: x + np.arange(4, dtype=x.dtype), [A(3, 4)]),
    ]
    for name, subscripts, shapes in [
        ("einsum_transpose", "ijk->ki", [(2, 3, 4)]),
        ("einsum_sum_all", "ij->", [(3, 4)]),
        ("einsum_implicit", "ji", [(3, 4)]),
        ("einsum_matmul", "ij,jk->ik", [(3, 4), (4, 5)]),
        ("einsum_batched", "bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("einsum_batch_in_middle", "ij,kj->ikj", [(3, 4), (2, 4)]),
        ("einsum_outer", "i,j->ij", [(3,), (4,)]),
        ("einsum_private_sum", "ijk,jl->il", [(2, 3, 4), (3, 5)]),
    ]:
        rows.append(Row(name, lambda *xs, s=subscripts: cnp.einsum(s, *xs),
                        lambda *xs, s=subscripts: np.einsum(s, *xs), [A(*s) for s in shapes]))
    for name, a, b in [
        ("matmul_vv", (4,), (4,)), ("matmul_mv", (3, 4), (4,)), ("matmul_vm", (4,), (4, 5)),
        ("matmul_mm", (3, 4), (4, 5)), ("matmul_bm", (2, 3, 4), (4, 5)), ("matmul_mb", (3, 4), (2, 4, 5)),
        ("matmul_vb", (4,), (2, 4, 5)), ("matmul_broadcast_batch", (2, 1, 3, 4), (3, 4, 5)),
    ]:
        rows.append(Row(name, cnp.matmul, np.matmul, [A(*a), A(*b)], tol32=(1e-5, 1e-5)))
    rows += [
        # the tracer operators // % divmod (and their reflections)
        Row("floordiv_mod_operators", lambda x, y: x // y + x % y, lambda x, y: x // y + x % y,
            [A(3, 4, domain="grid_half"), A(4, domain="divisor")], dtypes=NUMERIC),
        Row("rfloordiv_rmod_operators", lambda y: 7.0 // y - 3.0 % y, lambda y: 7.0 // y - 3.0 % y,
            [A(3, 4, domain="divisor")]),
        Row("divmod_operator", lambda x, y: divmod(x, y)[0] * 2 + divmod(x, y)[1],
            lambda x, y: np.divmod(x, y)[0] * 2 + np.divmod(x, y)[1],
            [A(3, 4, domain="grid_half"), A(4, domain="divisor")], dtypes=NUMERIC),
        Row("logsumexp", lambda x: cnp.logsumexp(x, axis=1),
            lambda x: np.log(np.sum(np.exp(x.astype(np.float64)), axis=1)).astype(x.dtype), [A(3, 4)]),
        Row("logsumexp_all_keepdims", lambda x: cnp.logsumexp(x, axis=None, keepdims=True),
            lambda x: np.log(np.sum(np.exp(x.astype(np.float64)), keepdims=True)).astype(x.dtype), [A(2, 3, 4)]),
        # exp(1000) overflows: logsumexp must shift by the maximum
        Row("logsumexp_large", lambda x: cnp.logsumexp(lax.add(x, 1000.0), axis=-1),
            lambda x: (np.log(np.sum(np.exp(x.astype(np.float64)), axis=-1)) + 1000).astype(x.dtype),
            [A(3, 4)]),
        Row("var", lambda x: cnp.var(x, axis=0), lambda x: np.var(x, axis=0), [A(3, 4)], tol32=(1e-5, 1e-5)),
        Row("var_keepdims", lambda x: cnp.var(x, axis=(0, 2), keepdims=True),
            lambda x: np.var(x, axis=(0, 2), keepdims=True), [A(2, 3, 4)], tol32=(1e-5, 1e-5)),
        Row("var_ddof", lambda x: cnp.var(x, ddof=1), lambda x: np.var(x, ddof=1), [A(2, 3, 4)],
            tol32=(1e-5, 1e-5)),
        Row("vdot", cnp.vdot, np.vdot, [A(3, 4), A(4, 3)], tol32=(1e-5, 1e-5)),
        Row("broadcast_arrays", lambda x, y: cnp.stack(cnp.broadcast_arrays(x, y)),
            lambda x, y: np.stack(np.broadcast_arrays(x, y)), [A(3, 1), A(4)]),
        # full_like is a constant (no derivative in x): added to x to see the shape and dtype
        Row("full_like", lambda x: lax.add(x, cnp.full_like(x, 2.5)), lambda x: x + np.full_like(x, 2.5), [A(3, 4)]),
        # a list of traced values stacked into one array (jnp.asarray([...]))
        Row("asarray_list", lambda x, y: cnp.asarray([cnp.sum(x), cnp.mean(y), x[0, 0]]),
            lambda x, y: np.asarray([np.sum(x), np.mean(y), x[0, 0]]), [A(3, 4), A(2)], tol32=(1e-5, 1e-5)),
    ]
    return rows + _rows_numpy_functions()


def _pieces(pieces):
    """The pieces of a split joined again, each scaled by its position (a swapped or
    misplaced piece changes the result)."""
    return [p * (k + 1) for k, p in enumerate(pieces)]


_PAD_WIDTHS = ((2, 5), (3, 1))  # wider than the axis: reflect and wrap go round more than once


def _pad_modes(pad, x):
    return (pad(x, _PAD_WIDTHS, mode="edge") + 2 * pad(x, _PAD_WIDTHS, mode="wrap")
            + 3 * pad(x, _PAD_WIDTHS, mode="reflect") + 4 * pad(x, _PAD_WIDTHS, mode="symmetric"))


def _ref_cross_2d_3d(a, b):
    """a (…, 2) × b (3,) with a's z = 0, written out."""
    return np.stack([a[:, 1] * b[2], -a[:, 0] * b[2], a[:, 0] * b[1] - a[:, 1] * b[0]], axis=-1)


def _vector_norms(norm, x):
    return [norm(x, o, 0) for o in (1, 2, np.inf, -np.inf, 3, 0.5, 0, -1, -2, -1.5)]


def _singular_value_norms(norm, x):
    x = separated(x)
    return [norm(x, o, (1, 2)) for o in (2, -2, "nuc")] + [norm(x, "nuc", (2, 1)), norm(x, 2, (-1, -2))]


def _matrix_norms(norm, x):
    return [norm(x, o, (0, 1)) for o in (None, "fro", 1, -1, np.inf, -np.inf)] + [norm(x, 1, (1, 0))]


def _rows_numpy_functions():
    """The functions of issue 11's numpy list that are composites."""
    la = cnp.linalg
    rows = [
        Row("prod", lambda x: cnp.prod(x, axis=1), lambda x: np.prod(x, axis=1), [A(3, 5)], dtypes=NUMERIC),
        # zeros: the derivative is the product of the others, with no division
        Row("prod_zeros_keepdims", lambda x: cnp.prod(x, axis=(0, 2), keepdims=True),
            lambda x: np.prod(x, axis=(0, 2), keepdims=True), [A(2, 3, 3, domain="ints")]),
        Row("prod_all_bool", lambda x: cnp.prod(x), lambda x: np.prod(x), [A(2, 3)], dtypes=(BOOL, F64)),
        Row("any_all", lambda x: cnp.stack([cnp.any(x, 1), cnp.all(x, 1), cnp.any(x > 1, 1, keepdims=True)[:, 0]]),
            lambda x: np.stack([np.any(x, 1), np.all(x, 1), np.any(x > 1, 1)]), [A(3, 4, domain="ints")],
            dtypes=ANY, differentiable=False),
        Row("cumsum_flat", lambda x: cnp.cumsum(x), lambda x: np.cumsum(x), [A(2, 3)]),
        Row("cumprod_dtype", lambda x: cnp.cumprod(x, 0, dtype=np.float64), lambda x: np.cumprod(x, 0, dtype=np.float64),
            [A(3, 2)]),
        Row("sort_descending_flat", lambda x: cnp.sort(x, None, descending=True), lambda x: -np.sort(-x, None),
            [A(2, 3, domain="distinct")], dtypes=NUMERIC),
        # ties keep their order, as in JAX's stable descending argsort
        Row("argsort_descending", lambda x: cnp.argsort(x, 0, descending=True),
            lambda x: np.argsort(-x, 0, kind="stable"), [A(5, 3, domain="ints")], dtypes=NUMERIC,
            differentiable=False),
        Row("split", lambda x: cnp.concatenate(_pieces(cnp.split(x, [1, -1, 2], axis=1)), 1),
            lambda x: np.concatenate(_pieces(np.split(x, [1, -1, 2], axis=1)), 1), [A(3, 4)]),
        Row("array_split", lambda x: cnp.concatenate(_pieces(cnp.array_split(x, 3, axis=-1)), -1),
            lambda x: np.concatenate(_pieces(np.array_split(x, 3, axis=-1)), -1), [A(2, 7)]),
        Row("flip_roll", lambda x: cnp.flip(x, (0, 2)) + cnp.roll(x, (1, -7), (2, 0)) + cnp.roll(x, 5),
            lambda x: np.flip(x, (0, 2)) + np.roll(x, (1, -7), (2, 0)) + np.roll(x, 5), [A(2, 3, 4)], dtypes=NUMERIC),
        Row("tril_triu", lambda x: cnp.tril(x, -1) + 2 * cnp.triu(x, 1) + cnp.triu(x, -3),
            lambda x: np.tril(x, -1) + 2 * np.triu(x, 1) + np.triu(x, -3), [A(2, 3, 4)], dtypes=NUMERIC),
        # integers and booleans pass through floor, ceil and round unchanged
        Row("floor_ceil_round_int", lambda x: cnp.floor(x) + cnp.ceil(x) + cnp.round(x),
            lambda x: np.floor(x) + np.ceil(x) + np.round(x), [A(3, 4)], dtypes=(I64, I32)),
        Row("clip_array_bounds", cnp.clip, np.clip,
            [A(3, 4, domain="grid0"), A(4, domain="grid_half"), A(3, 1, domain="grid_half")], dtypes=NUMERIC),
        Row("clip_keywords", lambda x: cnp.clip(x, min=-0.5) + cnp.clip(x, max=0.5),
            lambda x: np.clip(x, -0.5, None) + np.clip(x, None, 0.5), [A(3, 4, domain="grid0")]),
        Row("pad_modes", lambda x: _pad_modes(cnp.pad, x), lambda x: _pad_modes(np.pad, x), [A(3, 2)], dtypes=NUMERIC),
        Row("diag_vector", lambda v: cnp.diag(v, 1) + cnp.diag(v, -1), lambda v: np.diag(v, 1) + np.diag(v, -1),
            [A(3)], dtypes=NUMERIC),
        Row("diagonal", lambda x: cnp.diagonal(x, -1, 2, 0), lambda x: np.diagonal(x, -1, 2, 0), [A(3, 4, 5)]),
        Row("diag_trace_matrix", lambda x: cnp.diag(x, 1) * cnp.trace(x) + cnp.trace(x, -2),
            lambda x: np.diag(x, 1) * np.trace(x) + np.trace(x, -2), [A(4, 5)], dtypes=NUMERIC),
        Row("outer", cnp.outer, np.outer, [A(3), A(2, 2)]),
        Row("cross", cnp.cross, np.cross, [A(4, 3), A(3)]),
        Row("cross_axes", lambda a, b: cnp.cross(a, b, axisa=0, axisb=1, axisc=0),
            lambda a, b: np.cross(a, b, axisa=0, axisb=1, axisc=0), [A(3, 4), A(4, 3)]),
        Row("cross_2d_3d", cnp.cross, _ref_cross_2d_3d, [A(4, 2), A(3)]),
        Row("norm", lambda x: la.norm(x, axis=1), lambda x: np.linalg.norm(x, axis=1), [A(3, 4)]),
        Row("norm_vector_ords", lambda x: cnp.stack(_vector_norms(la.norm, x)),
            lambda x: np.stack(_vector_norms(np.linalg.norm, x)), [A(3, 4, domain="nonzero")],
            tol32=(1e-5, 1e-5)),
        Row("norm_matrix_ords", lambda x: cnp.stack(_matrix_norms(la.norm, x)),
            lambda x: np.stack(_matrix_norms(np.linalg.norm, x)), [A(3, 4, domain="distinct")]),
        # the spectral norm, its negative (the smallest singular value) and the nuclear norm
        Row("norm_singular_value_ords", lambda x: cnp.stack(_singular_value_norms(la.norm, x)),
            lambda x: np.stack(_singular_value_norms(np.linalg.norm, x)), [A(2, 3, 4)], tol32=(2e-6, 0)),
        Row("norm_singular_value_keepdims",
            lambda x: la.norm(separated(x), 2, (0, 1), keepdims=True) * la.norm(separated(x), "nuc", keepdims=True),
            lambda x: (np.linalg.norm(separated(x), 2, (0, 1), keepdims=True)
                       * np.linalg.norm(separated(x), "nuc", keepdims=True)), [A(4, 3)], tol32=(2e-6, 0)),
        Row("linalg_svd_stacked", lambda x: svd_parts(cnp, *la.svd(separated(x), full_matrices=False)),
            lambda x: svd_parts(np, *np.linalg.svd(separated(x), full_matrices=False)), [A(2, 2, 3)],
            tol32=(2e-5, 2e-6)),
        Row("matrix_vector_norm",
            lambda x: la.matrix_norm(separated(x), ord="nuc") + la.vector_norm(x, axis=(2, 1), ord=3),
            lambda x: np.linalg.matrix_norm(separated(x), ord="nuc") + np.linalg.vector_norm(x, axis=(2, 1), ord=3),
            [A(2, 3, 4, domain="nonzero")], tol32=(2e-6, 0)),
        Row("norm_keepdims", lambda x: la.norm(x, np.inf, (2, 0), keepdims=True) + la.norm(x, keepdims=True),
            lambda x: np.linalg.norm(x, np.inf, (2, 0), keepdims=True) + np.linalg.norm(x.ravel(), keepdims=True),
            [A(2, 3, 4, domain="distinct")]),
    ]
    for name, subscripts, shapes in [
        ("einsum_chain3", "ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
        ("einsum_ellipsis_broadcast", "...ij,...jk", [(2, 1, 3, 4), (5, 4, 2)]),
        ("einsum_diagonal", "iij,jk->ki", [(3, 3, 2), (2, 4)]),
        ("einsum_four", "ijk,jkl,li,m->m", [(2, 3, 2), (3, 2, 3), (3, 2), (2,)]),
    ]:
        rows.append(Row(name, lambda *xs, s=subscripts: cnp.einsum(s, *xs),
                        lambda *xs, s=subscripts: np.einsum(s, *xs), [A(*s) for s in shapes]))
    return rows


def _bitwise_functions(m, x, y):
    """Every bitwise function of ``m`` (``cuvmap.numpy`` or ``numpy``) on ``x`` and ``y``,
    with Python ints and shifts past the bit width."""
    k = m.remainder(y, 70) if m is cnp else y % 70  # amounts 0..69: some past 32 and 64
    k = k if x.dtype.kind != "b" else y
    return [m.bitwise_and(x, y), m.bitwise_or(x, 6), m.bitwise_xor(5, y), m.invert(x), m.bitwise_not(y),
            m.left_shift(x, k), m.right_shift(x, k), m.right_shift(x, 3), m.left_shift(1, m.bitwise_and(y, 7))]


def _bitwise_operators(x, y):
    """The same through the operators (on tracers: cuvmap's; on arrays: NumPy's)."""
    k = y % 70 if x.dtype.kind != "b" else y
    return [x & y, x | 6, 5 ^ y, ~x, ~y, x << k, x >> k, x >> 3, 1 << (y & 7)]


def _rows_bitwise():
    INTS = (I64, I32, np.dtype(np.uint8), np.dtype(np.int8))
    stack = lambda xs: np.stack(np.broadcast_arrays(*xs))  # noqa: E731
    cstack = lambda xs: cnp.stack(cnp.broadcast_arrays(*xs))  # noqa: E731
    return [
        # the cuvmap.numpy functions against NumPy's operators on every bit pattern
        Row("bitwise_functions", lambda x, y: cstack(_bitwise_functions(cnp, x, y)),
            lambda x, y: stack(_bitwise_operators(x, y)), [A(3, 4, domain="bits"), A(4, domain="bits")],
            dtypes=INTS + (BOOL,), differentiable=False),
        # the operators of traced values (the vmap tests), against NumPy's functions
        Row("bitwise_operators", lambda x, y: cstack(_bitwise_operators(x, y)),
            lambda x, y: stack(_bitwise_functions(np, x, y)), [A(3, 4, domain="bits"), A(3, 1, domain="bits")],
            dtypes=INTS, differentiable=False),
        Row("logical_functions",
            lambda x, y: cnp.stack([cnp.logical_and(x, y), cnp.logical_or(x, y), cnp.logical_xor(x, y),
                                    cnp.broadcast_to(cnp.logical_not(y), (3, 4))]),
            lambda x, y: np.stack([np.logical_and(x, y), np.logical_or(x, y), np.logical_xor(x, y),
                                   np.broadcast_to(np.logical_not(y), (3, 4))]),
            [A(3, 4, domain="ints"), A(4, domain="ints")], dtypes=ANY, differentiable=False),
    ]


# ---------------------------------------------------------------------------------------
# Collectives over a named axis (cuvmap.lax.parallel): each row maps its operands' leading
# axis with vmap(..., axis_name="i") (and an inner "j" for the nested rows), so the generic
# tests check the named batching rules against closed forms, their transposes against
# finite differences, and (wrapping the row in an unnamed vmap) the rules that pass other
# batch dims through
# ---------------------------------------------------------------------------------------


def _named(f, in_axes=0):
    """``f`` mapped over its operands' leading axis, named ``"i"``."""
    return lambda *xs: cv.vmap(f, in_axes=in_axes, axis_name="i")(*xs)


def _named2(f):
    """``f`` mapped over the two leading axes, named ``"i"`` (outer) and ``"j"``."""
    return lambda x: cv.vmap(cv.vmap(f, axis_name="j"), axis_name="i")(x)


def _each(x, fn):
    """``fn(x)`` broadcast back over the leading axis (every member gets the same)."""
    return np.broadcast_to(fn(x), x.shape[:1] + np.shape(fn(x))).copy()


def _batch_norm(m, x):
    """Batch normalisation over the named axis (cuvmap) or axis 0 (NumPy)."""
    if m is np:
        mean, var = x.mean(0), x.var(0)
    else:
        mean = lax.pmean(x, "i")
        var = lax.pmean((x - mean) ** 2, "i")
    return (x - mean) / cnp.sqrt(var + 1e-3) if m is not np else (x - mean) / np.sqrt(var + 1e-3)


def _ref_all_to_all(x, split, concat):
    """Member m gets, from each member c, x[c]'s m-th slice along ``split``, stacked along
    ``concat``: written out as loops."""
    n = x.shape[0]
    return np.stack([np.stack([np.take(x[c], m, axis=split) for c in range(n)], axis=concat) for m in range(n)])


def _ref_ppermute(x, perm):
    out = np.zeros_like(x)
    for src, dst in perm:
        out[dst] = x[src]
    return out


def _as_float(i, like):
    return lax.convert_element_type(i, core.dtype_of(like))


_CYCLE = ((0, 1), (1, 2), (2, 3), (3, 0))


def _rows_parallel():
    return [
        Row("psum", _named(lambda v: lax.psum(v, "i")), lambda x: _each(x, lambda x: x.sum(0)), [A(4, 3)],
            covers=(parallel.psum_p,)),
        Row("psum_product", _named(lambda v: v * lax.psum(v * v, "i")), lambda x: x * (x * x).sum(0), [A(4, 3)]),
        # psum of a value every member shares: n times it
        Row("psum_unbatched", _named(lambda v, c: v * lax.psum(c, "i"), in_axes=(0, None)),
            lambda x, c: x * (4 * c), [A(4, 3), A(3)]),
        Row("pmean_batch_norm", _named(lambda v: _batch_norm(lax, v)), lambda x: _batch_norm(np, x), [A(5, 3)],
            tol32=(1e-4, 1e-5)),
        Row("pmax", _named(lambda v: lax.pmax(v, "i") * v), lambda x: x.max(0) * x, [A(4, 3, domain="distinct")],
            covers=(parallel.pmax_p,)),
        Row("pmin", _named(lambda v: lax.pmin(v, "i")), lambda x: _each(x, lambda x: x.min(0)),
            [A(4, 3, domain="distinct")], covers=(parallel.pmin_p,)),
        Row("all_gather", _named(lambda v: lax.all_gather(v, "i") * v), lambda x: x[None] * x[:, None], [A(3, 2)],
            covers=(parallel.all_gather_p,)),
        Row("all_gather_axis1_tiled", _named(lambda v: lax.all_gather(v, "i", axis=1, tiled=True)),
            lambda x: _each(x, lambda x: np.concatenate(list(x), axis=1)), [A(3, 2, 2)]),
        Row("psum_scatter", _named(lambda v: lax.psum_scatter(v, "i")), lambda x: x.sum(0), [A(3, 3, 2)],
            covers=(parallel.psum_scatter_p,)),
        Row("psum_scatter_dim1_tiled", _named(lambda v: lax.psum_scatter(v, "i", scatter_dimension=1, tiled=True)),
            lambda x: np.stack([x.sum(0)[:, 2 * m:2 * m + 2] for m in range(3)]), [A(3, 2, 6)]),
        Row("ppermute_cycle", _named(lambda v: lax.ppermute(v, "i", _CYCLE) * v),
            lambda x: _ref_ppermute(x, _CYCLE) * x, [A(4, 3)], covers=(parallel.ppermute_p,)),
        # members 0 and 2 receive nothing: zeros
        Row("ppermute_partial", _named(lambda v: lax.ppermute(v, "i", ((0, 1), (2, 3)))),
            lambda x: _ref_ppermute(x, ((0, 1), (2, 3))), [A(4, 3)]),
        Row("all_to_all", _named(lambda v: lax.all_to_all(v, "i", 0, 0)), lambda x: _ref_all_to_all(x, 0, 0),
            [A(3, 3, 2)], covers=(parallel.all_to_all_p,)),
        Row("all_to_all_split1_concat0", _named(lambda v: lax.all_to_all(v, "i", 1, 0)),
            lambda x: _ref_all_to_all(x, 1, 0), [A(3, 2, 3)]),
        Row("all_to_all_tiled", _named(lambda v: lax.all_to_all(v, "i", 0, 1, tiled=True)),
            lambda x: np.stack([np.concatenate([x[c, 2 * m:2 * m + 2] for c in range(3)], axis=1) for m in range(3)]),
            [A(3, 6, 2)]),
        Row("axis_index", _named(lambda v: v * _as_float(lax.axis_index("i"), v)),
            lambda x: x * np.arange(4, dtype=x.dtype)[:, None], [A(4, 3)], covers=(parallel.axis_index_p,)),
        # nested named vmaps: a sum over both names, over the outer name only, the product
        # axis's index and a gather over both (the first name major)
        Row("psum_two_names", _named2(lambda v: lax.psum(v, ("i", "j")) + lax.psum(v * v, "i")),
            lambda x: np.broadcast_to(x.sum((0, 1)) + (x * x).sum(0), x.shape).copy(), [A(2, 3, 2)]),
        Row("axis_index_two_names", _named2(lambda v: v * _as_float(lax.axis_index(("i", "j")), v)),
            lambda x: x * np.arange(6, dtype=x.dtype).reshape(2, 3, 1), [A(2, 3, 2)]),
        Row("all_gather_two_names", _named2(lambda v: lax.all_gather(v, ("i", "j"))),
            lambda x: np.broadcast_to(x.reshape(6, 2), (2, 3, 6, 2)).copy(), [A(2, 3, 2)]),
    ]


# ---------------------------------------------------------------------------------------
# Control flow (cuvmap.lax.control_flow): composites over call primitives, checked
# against Python loops and branches
# ---------------------------------------------------------------------------------------


def _rnn_ref(h, xs, w):
    ys = []
    for x in xs:
        h = np.tanh(h @ w + x)
        ys.append(h * 2.0)
    return np.concatenate([h.ravel(), np.asarray(ys, dtype=h.dtype).reshape(-1)])


def _rnn(h, xs, w, unroll=1):
    def step(h, x):
        h = cnp.tanh(h @ w + x)
        return h, h * 2.0
    h, ys = lax.scan(step, h, xs, unroll=unroll)
    return cnp.concatenate([cnp.ravel(h), cnp.ravel(ys)])


def _scan_pytree(a, b, xs):
    """A carry of two leaves, xs of two leaves, reverse, unrolled."""
    def step(c, x):
        a, b = c
        u, v = x
        return (a * cnp.cos(u) + b, b - v * a), a * b
    (a, b), ys = lax.scan(step, (a, b), (xs, xs * 2.0), reverse=True, unroll=3)  # a block of 3, then 1 step
    return cnp.concatenate([cnp.ravel(a), cnp.ravel(b), cnp.ravel(ys)])


def _scan_pytree_ref(a, b, xs):
    ys = [None] * len(xs)
    for i in reversed(range(len(xs))):
        u, v = xs[i], xs[i] * 2.0
        ys[i] = a * b
        a, b = a * np.cos(u) + b, b - v * a
    return np.concatenate([a.ravel(), b.ravel(), np.asarray(ys, dtype=a.dtype).reshape(-1)])


def _no_xs(c):
    c, ys = lax.scan(lambda c, _: (cnp.sin(c) + 0.5, c * c), c, None, length=4)
    return cnp.concatenate([cnp.ravel(c), cnp.ravel(ys)])


def _no_xs_ref(c):
    ys = []
    for _ in range(4):
        ys.append(c * c)
        c = np.sin(c) + 0.5
    return np.concatenate([c.ravel(), np.asarray(ys, dtype=c.dtype).reshape(-1)])


def _empty_scan(c, xs):
    c, ys = lax.scan(lambda c, x: (c * x, c + x), c, xs)
    return cnp.concatenate([cnp.ravel(c), cnp.ravel(ys)])


def _branches3():
    return [lambda x: x * 2.0, lambda x: cnp.sin(x), lambda x: x ** 3]


def _branches3_ref():
    return [lambda x: x * 2.0, np.sin, lambda x: x ** 3]


def _counted_while(x, n):
    """A predicate on an integer counter: batched when ``n`` is."""
    return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, cnp.sin(c[1]) * 1.5), (0, x))[1]


def _counted_while_ref(x, n):
    for _ in range(max(int(n), 0)):
        x = np.sin(x) * 1.5
    return x


def _doubling_while(x):
    """A predicate on the value itself: each example stops after its own count."""
    return lax.while_loop(lambda c: cnp.sum(c) < 5.0, lambda c: c * 2.0 + 0.1, x)


def _doubling_while_ref(x):
    while np.sum(x) < 5.0:
        x = x * 2.0 + 0.1
    return x


def _rows_control_flow():
    from cuvmap.lax import control_flow as cf

    # (a batched predicate makes a cond a quiet_cond: vmap with p or i batched)
    sw_ref = _branches3_ref()
    return [
        Row("cond_closure", lambda p, x: lax.cond(p > 0, lambda x: cnp.sin(x) * p, lambda x: cnp.cos(x) - p, x),
            lambda p, x: np.sin(x) * p if p > 0 else np.cos(x) - p,
            [A(domain="nonzero"), A(3)], covers=(cf.cond_p, cf.quiet_cond_p)),
        Row("cond_two_operands", lambda p, a, b: lax.cond(p > 0, lambda a, b: a @ b, lambda a, b: a @ (b * b), a, b),
            lambda p, a, b: a @ b if p > 0 else a @ (b * b),
            [A(domain="nonzero"), A(2, 3), A(3)], tol32=(1e-5, 1e-5), covers=(cf.cond_p, cf.quiet_cond_p)),
        Row("switch_clamped", lambda i, x: lax.switch(i, _branches3(), x),
            lambda i, x: sw_ref[int(np.clip(i, 0, 2))](x), [I((), 4), A(2, 3)], covers=(cf.cond_p, cf.quiet_cond_p)),
        Row("scan_rnn", _rnn, _rnn_ref, [A(3), A(5, 3), A(3, 3, domain="unit")], tol32=(1e-5, 1e-5), grad_tol=1e-4,
            covers=(cf.scan_p,)),
        Row("scan_rnn_unroll_2", lambda h, xs, w: _rnn(h, xs, w, unroll=2), _rnn_ref,  # 2 blocks and 1 step
            [A(3), A(5, 3), A(3, 3, domain="unit")], tol32=(1e-5, 1e-5), grad_tol=1e-4, covers=(cf.scan_p,)),
        Row("scan_pytree_reverse", _scan_pytree, _scan_pytree_ref, [A(2), A(2), A(4, 2)], tol32=(1e-5, 1e-5),
            covers=(cf.scan_p,)),
        Row("scan_no_xs", _no_xs, _no_xs_ref, [A(3)], covers=(cf.scan_p,)),
        Row("scan_length_0", _empty_scan, lambda c, xs: c.ravel(), [A(2), A(0, 2)], covers=(cf.scan_p,)),
        Row("fori_loop_static",
            lambda x: lax.fori_loop(0, 4, lambda i, x: x * cnp.sin(x) + lax.convert_element_type(i, x.dtype), x),
            lambda x: _fori_ref(x), [A(3)], covers=(cf.scan_p,)),
        Row("map", lambda xs: lax.map(lambda x: cnp.sum(cnp.sin(x)) * x, xs),
            lambda xs: np.stack([np.sum(np.sin(x)) * x for x in xs]), [A(4, 3)], covers=(cf.scan_p,)),
        Row("while_counter", _counted_while, _counted_while_ref, [A(3), I((), 4)], modes=("fwd",),
            covers=(cf.while_p,)),
        Row("while_value", _doubling_while, _doubling_while_ref, [A(2, domain="positive")], modes=("fwd",),
            covers=(cf.while_p,)),
        Row("debug_callback", lambda x: (cv.debug.callback(lambda v: None, x), x * cnp.sin(x))[1],
            lambda x: x * np.sin(x), [A(2, 3)], covers=(lax_callbacks.debug_callback_p,)),
        Row("fori_loop_traced_bound", lambda x, n: lax.fori_loop(0, n, lambda i, x: x * 0.5 + cnp.cos(x), x),
            lambda x, n: _fori_traced_ref(x, n), [A(3), I((), 4)], modes=("fwd",), covers=(cf.while_p,)),
    ] + [
        # a host function under each vmap_method (not differentiable: cv.pure_callback raises)
        Row(f"pure_callback_{method}", functools.partial(_host_sin_mul, method=method),
            lambda x, y: np.sin(x) * y, [A(2, 3), A(3)], differentiable=False, diff_argnums=(),
            covers=(lax_callbacks.pure_callback_p,))
        for method in ("sequential", "expand_dims", "broadcast_all")
    ]


def _host_sin_mul(x, y, method):
    """``sin(x) * y`` by a host callback; under expand_dims/broadcast_all the callback
    gets leading batch dims (size 1 where unbatched), which ``y[..., None, :]`` aligns."""
    def host(x, y):
        return backend.xp_of(x).sin(x) * (y if method == "sequential" else y[..., None, :])

    out = cv.ShapeDtypeStruct(np.broadcast_shapes(x.shape, y.shape), np.result_type(x.dtype, y.dtype))
    return cv.pure_callback(host, out, x, y, vmap_method=method)


def _fori_ref(x):
    for i in range(4):
        x = x * np.sin(x) + np.asarray(i, x.dtype)
    return x


def _fori_traced_ref(x, n):
    for _ in range(max(int(n), 0)):
        x = x * 0.5 + np.cos(x)
    return x


def _rows_complex():
    """Real functions through complex intermediates: the complex primitives' rows (their
    complex operands are tested by tests/transforms/test_complex_rules.py), whose real
    inputs get real cotangents (NOTE [complex convention] in cuvmap/transforms/complex_rules.py)."""
    def z(x, y):
        return x + 1j * y

    return [
        Row("complex_abs", lambda x, y: lax.abs(lax.complex(x, y)), np.hypot, [A(3, 4, domain="nonzero"), A(3, 4)],
            covers=(ew.complex_p,)),
        Row("complex_real_of_product", lambda x, y: lax.real(lax.mul(lax.complex(x, y), lax.complex(y, x))),
            lambda x, y: np.real(z(x, y) * z(y, x)), [A(3, 4), A(4)], covers=(ew.real_p,)),
        Row("complex_imag_of_conj", lambda x, y: lax.imag(lax.mul(lax.conj(lax.complex(x, y)), lax.exp(lax.complex(y, x)))),
            lambda x, y: np.imag(np.conj(z(x, y)) * np.exp(z(y, x))), [A(3, 4), A(3, 4)], covers=(ew.imag_p, ew.conj_p)),
        Row("complex_angle", lambda x, y: cnp.angle(lax.complex(x, y)), lambda x, y: np.angle(z(x, y)),
            [A(3, 4, domain="nonzero"), A(3, 4, domain="nonzero")]),
        Row("complex_pyscalar_factor", lambda x: cnp.abs(lax.mul(x, 1 + 1j)), lambda x: np.abs(x * (1 + 1j)),
            [A(3, 4, domain="nonzero")]),
    ]


def _rows_jax_numpy():
    """The rows of issue 32 item 5's jax.numpy names (tests/jax_numpy_rows.py).
    Imported here, not at the top: that file builds its rows from this module's Row and
    Arg (a documented cycle)."""
    import jax_numpy_rows
    return jax_numpy_rows.rows()


# ---------------------------------------------------------------------------------------
# cuvmap.numpy.linalg and cuvmap.scipy.linalg (composites of the linalg primitives)
# ---------------------------------------------------------------------------------------


def _ref_expm(a):
    """The Taylor series, summed until its terms vanish (the matrices here have small norms)."""
    out = np.broadcast_to(np.eye(a.shape[-1], dtype=a.dtype), a.shape).copy()
    term = out.copy()
    for k in range(1, 40):
        term = term @ a / k
        out = out + term
    return out


def _rows_linalg_functions():
    la, sla = cnp.linalg, cv_scipy.linalg
    tol = dict(tol32=(5e-5, 5e-6))
    return [
        Row("linalg_det_slogdet", lambda x: la.det(separated(x)) + la.slogdet(separated(x)[..., ::-1, :])[1],
            lambda x: np.linalg.det(separated(x)) + np.linalg.slogdet(separated(x)[..., ::-1, :])[1], [A(2, 3, 3)],
            **tol),
        Row("linalg_solve_broadcast", lambda a, b: la.solve(separated(a), b),
            lambda a, b: np.linalg.solve(separated(a), b), [A(2, 3, 3), A(3, 2)], **tol),
        Row("linalg_solve_vector", lambda a, b: la.solve(separated(a), b),
            lambda a, b: np.linalg.solve(separated(a), b), [A(3, 3), A(3)], **tol),
        Row("linalg_inv_matrix_power", lambda x: la.inv(separated(x)) + la.matrix_power(separated(x), -2)
            + la.matrix_power(0.3 * x, 3), lambda x: np.linalg.inv(separated(x)) + np.linalg.matrix_power(separated(x), -2)
            + np.linalg.matrix_power(0.3 * x, 3), [A(2, 3, 3)], **tol),
        Row("linalg_cholesky_upper", lambda x: la.cholesky(spd(x)) + la.cholesky(spd(x), upper=True),
            lambda x: np.linalg.cholesky(spd(x)) + np.swapaxes(np.linalg.cholesky(spd(x)), -1, -2), [A(3, 3)], **tol),
        Row("linalg_eigh", lambda x: _packed_eigh(cnp, *la.eigh(symmetric(x))),
            lambda x: _packed_eigh(np, *np.linalg.eigh(symmetric(x))), [A(2, 3, 3)], **tol),
        Row("linalg_eigvalsh", lambda x: la.eigvalsh(symmetric(x)), lambda x: np.linalg.eigvalsh(symmetric(x)),
            [A(4, 4)], **tol),
        Row("linalg_qr_r", lambda x: cnp.concatenate([_packed_qr(cnp, *la.qr(separated(x))),
                                                       cnp.ravel(la.qr(separated(x), mode="r"))]),
            lambda x: np.concatenate([_packed_qr(np, *np.linalg.qr(separated(x))),
                                      np.linalg.qr(separated(x), mode="r").ravel()]), [A(4, 2)], **tol),
        Row("linalg_pinv_lstsq", lambda a, b: la.pinv(separated(a)) + la.lstsq(separated(a), b)[0],
            lambda a, b: np.linalg.pinv(separated(a)) + np.linalg.lstsq(separated(a), b, rcond=None)[0],
            [A(4, 3), A(4, 4)], **tol),
        Row("linalg_cond_tensorinv", lambda x: la.cond(separated(x)) + la.cond(separated(x), 1)
            + la.tensorinv(cnp.reshape(separated(x), (2, 2, 4)), 2).sum(),
            lambda x: np.linalg.cond(separated(x)) + np.linalg.cond(separated(x), 1)
            + np.linalg.tensorinv(separated(x).reshape(2, 2, 4), 2).sum(), [A(4, 4)], **tol),
        Row("linalg_multi_dot", lambda a, b, c: la.multi_dot([a, b, c]), lambda a, b, c: np.linalg.multi_dot([a, b, c]),
            [A(3), A(3, 5), A(5, 2)], **tol),
        Row("linalg_tensorsolve", lambda a, b: la.tensorsolve(cnp.reshape(separated(a), (2, 2, 4)), b),
            lambda a, b: np.linalg.tensorsolve(separated(a).reshape(2, 2, 4), b), [A(4, 4), A(2, 2)], **tol),
        Row("scipy_solve_triangular", lambda a, b: sla.solve_triangular(separated(a), b, trans="T", lower=True),
            lambda a, b: np.linalg.solve(np.swapaxes(np.tril(separated(a)), -1, -2), b), [A(3, 3), A(3)], **tol),
        Row("scipy_cho_solve", lambda a, b: sla.cho_solve(sla.cho_factor(spd(a)), b)
            + sla.cho_solve(sla.cho_factor(spd(a), lower=True), b),
            lambda a, b: 2 * np.linalg.solve(spd(a), b), [A(3, 3), A(3, 2)], **tol),
        Row("scipy_lu_solve", lambda a, b: sla.lu_solve(sla.lu_factor(separated(a)[..., ::-1, :]), b)
            + sla.lu_solve(sla.lu_factor(separated(a)[..., ::-1, :]), b, trans=1),
            lambda a, b: np.linalg.solve(separated(a)[..., ::-1, :], b)
            + np.linalg.solve(np.swapaxes(separated(a)[..., ::-1, :], -1, -2), b), [A(3, 3), A(3, 2)], **tol),
        Row("scipy_lu", lambda x: cnp.stack(sla.lu(separated(x)[::-1])),
            lambda x: np.stack(_ref_plu(separated(x)[::-1])), [A(3, 3)], **tol),
        Row("scipy_expm", lambda x: sla.expm(0.5 * x), lambda x: _ref_expm(0.5 * x), [A(2, 3, 3)],
            tol32=(1e-4, 1e-5), tol64=(1e-11, 1e-11)),
        Row("linalg_array_api_names", lambda x, v: la.trace(x) + la.diagonal(x, offset=1).sum(-1)
            + la.matrix_transpose(x)[:, 0, 1] + la.vecdot(x[:, 0], v) + la.outer(v, v)[:2, 0]
            + la.tensordot(x[0], x[1], axes=2) + la.cross(x[:, :, :3], x[:, :, 1:])[:, 0, 0],
            lambda x, v: np.linalg.trace(x) + np.linalg.diagonal(x, offset=1).sum(-1)
            + np.linalg.matrix_transpose(x)[:, 0, 1] + np.linalg.vecdot(x[:, 0], v) + np.linalg.outer(v, v)[:2, 0]
            + np.linalg.tensordot(x[0], x[1], axes=2) + np.linalg.cross(x[:, :, :3], x[:, :, 1:])[:, 0, 0],
            [A(2, 4, 4), A(4)]),
        # JAX's right-side triangular solve: x op(a) = b
        Row("lax_triangular_solve_right", lambda a, b: lax.triangular_solve(separated(a), b, lower=True),
            lambda a, b: b @ np.linalg.inv(np.tril(separated(a))), [A(2, 3, 3), A(2, 4, 3)], **tol),
        # a norm of 12: three squarings
        Row("scipy_expm_squared", lambda x: sla.expm(3.0 * x), lambda x: _ref_expm_eig(3.0 * x), [A(3, 3)],
            tol32=(1e-4, 1e-4), tol64=(1e-9, 1e-9), grad_tol=1e-4),
    ]


def _ref_plu(a):
    lu = _ref_lu(a)
    n = a.shape[-1]
    l_mat = np.tril(lu[:, :n], -1) + np.eye(n, dtype=a.dtype)
    u_mat = np.triu(lu[:, :n])
    p = np.eye(n, dtype=a.dtype)[lu[:, n + 1].astype(int)].T
    return p, l_mat, u_mat


def _ref_expm_eig(a):
    w, v = np.linalg.eig(a.astype(np.float64))
    return ((v * np.exp(w)) @ np.linalg.inv(v)).real.astype(a.dtype)


COMPOSITE_ROWS = (_rows_composite() + _rows_bitwise() + _pooling_rows(composite=True) + _rows_parallel()
                  + _rows_control_flow() + _rows_complex()
                  + _rows_slicing_composite() + _rows_jax_numpy() + _rows_linalg_functions())


def _rows_elementwise_more():
    """The rows of the jax.numpy elementwise and array-API names (tests/elementwise_more_rows.py).
    Imported here, not at the top: that file builds its rows from this module's Row and Arg
    (a documented cycle)."""
    import elementwise_more_rows
    return elementwise_more_rows.rows()


COMPOSITE_ROWS = COMPOSITE_ROWS + _rows_elementwise_more()
# issue 32 (npmanip): the jax.numpy manipulation, selection, placing and window names
def _rows_numpy_manipulation():
    """The rows of tests/numpy_manipulation_rows.py. Imported here, not at the top: that
    file builds its rows from this module's Row and Arg (a documented cycle)."""
    import numpy_manipulation_rows
    return numpy_manipulation_rows.rows()


COMPOSITE_ROWS = COMPOSITE_ROWS + _rows_numpy_manipulation()
def _rows_fft():
    """lax.fft (issue 33) through real functions of its transforms (its complex operands:
    tests/lax/test_fourier.py): a circular self-convolution (RFFT then IRFFT), a power
    spectrum of complex(x, y) (FFT), and numpy.fft's ortho inverse with cropping and padding
    (IFFT)."""
    return [
        Row("fft_circular_self_convolution", lambda x: lax.fft(lax.integer_pow(lax.fft(x, "rfft", (3, 4)), 2), "irfft",
                                                              (3, 4)),
            lambda x: np.fft.irfftn(np.fft.rfftn(x, axes=(1, 2)) ** 2, s=(3, 4), axes=(1, 2)), [A(2, 3, 4)],
            tol32=(1e-4, 1e-5), covers=(lax_fourier.fft_p,)),
        Row("fft_power_spectrum", lambda x, y: cnp.abs(cnp.fft.fft(lax.complex(x, y), axis=0)),
            lambda x, y: np.abs(np.fft.fft(x + 1j * y, axis=0)), [A(4, 3), A(4, 3)], tol32=(1e-4, 1e-5)),
        Row("fft_ortho_inverse_resized", lambda x: cnp.real(cnp.fft.ifftn(x, s=(3, 5), axes=(1, 0), norm="ortho")),
            lambda x: np.real(np.fft.ifftn(x, s=(3, 5), axes=(1, 0), norm="ortho")), [A(4, 3)], tol32=(1e-4, 1e-5)),
    ]


COMPOSITE_ROWS = COMPOSITE_ROWS + _rows_fft()  # issue 33


def _rows_conv_merged():
    """``conv_backward``, the plan's one step for a convolution's input, weight and bias
    gradients of one output gradient (NOTE [a convolution's gradients merged for the plan]):
    its results raveled and joined, against the loops; not differentiable (the plan's only),
    batched part by part."""
    from cuvmap.lax import convolution_merged as conv_merged

    params = dict(stride=(1, 2), padding=(1, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1)
    cp = {k: params[k] for k in ("stride", "padding", "dilation", "groups")}
    xs, ws = (2, 2, 4, 5), (3, 2, 2, 2)
    gs = (2, 3) + tuple(np.shape(ref_conv(np.zeros(xs), np.zeros(ws), **cp))[2:])
    merged = dict(params, input_shape=xs, weight_shape=ws, bias=True)
    return [Row(
        "conv_backward_merged_2d_bias",
        lambda g, w, x: cnp.concatenate([cnp.ravel(a) for a in conv_merged.conv_backward_p.bind(g, w, x, **merged)]),
        lambda g, w, x: np.concatenate([np.ravel(ref_conv_input_adjoint(g, w, xs[2:], **cp)),
                                        np.ravel(ref_conv_weight_adjoint(g, x, ws[2:], **cp)), g.sum(axis=(0, 2, 3))]),
        [A(*gs), A(*ws), A(*xs)], covers=(conv_merged.conv_backward_p,), differentiable=False,
        tol32=(1e-5, 1e-5))]


COMPOSITE_ROWS = COMPOSITE_ROWS + _rows_conv_merged()
# issue 32 (scipy32): betainc, the Bessel functions of integer and real order, the Sylvester solve
def _rows_special_more():
    """The rows of tests/special_more_rows.py. Imported here, not at the top: that file builds
    its rows from this module's Row and Arg (a documented cycle)."""
    import special_more_rows
    return special_more_rows.rows()


PRIMITIVE_ROWS = PRIMITIVE_ROWS + _rows_special_more()
ALL_ROWS = PRIMITIVE_ROWS + COMPOSITE_ROWS

# rows for the (costlier) nested-transform tests: vmap of vmap, vmap of grad, grad of vmap
NESTED_SAMPLE = (
    "add_bcast", "mul_scalar_operand", "div", "max", "select_bcast", "logistic", "integer_pow_3",
    "convert_to_f64", "slice_neg_step", "slice_transpose", "take", "take_transpose",
    "dot_general_batched", "dot_general_batch_not_leading", "reduce_sum_02", "reduce_max",
    "argmax", "reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims_two",
    "concatenate", "pad_value",
    "getitem_arrays_nonadjacent", "take_along_axis", "einsum_batch_in_middle",
    "matmul_broadcast_batch", "logsumexp", "var",
    "conv_1d_groups", "conv_2d_bias", "conv_transposed_1d_groups",
    "cond_closure", "switch_clamped", "scan_rnn", "scan_pytree_reverse", "while_counter",
    "conv_backward_input_1d_groups", "conv_backward_weight_transposed_1d_groups",
    "max_pool_2d", "max_pool_gather_1d", "max_pool_scatter_2d", "avg_pool_2d_exclude_pad",
    "avg_pool_transpose_1d",
    "erf", "erf_inv", "atan2", "cumsum_reverse", "cumprod_zeros", "sort", "prod_zeros_keepdims", "pad_modes",
    "einsum_chain3", "norm_matrix_ords", "clip_array_bounds", "svd_values", "svd_tall", "svd_wide",
    "norm_singular_value_ords", "bitwise_operators",
    "psum_product", "pmean_batch_norm", "pmax", "all_gather", "psum_scatter_dim1_tiled", "ppermute_partial",
    "all_to_all_tiled", "psum_two_names",
)

_names = [r.name for r in ALL_ROWS]
assert len(set(_names)) == len(_names), "duplicate row names"
assert set(NESTED_SAMPLE) <= set(_names), set(NESTED_SAMPLE) - set(_names)
