"""Comparisons, select and the casts: ``eq``, ``ne``, ``lt``, ``le``, ``gt``, ``ge``,
``select`` (branch-free on NumPy floats: NOTE [branch-free select]),
``convert_element_type`` and ``stop_gradient``.

Comparisons carry no derivative; ``select``'s passes the cotangent to the branch each
element took; a cast's is the cast back (between floating dtypes).
"""
import math

import numpy as np

from cuvmap import core, tree
from cuvmap.core import ShapedArray, ShapeError
from cuvmap.core import bfloat16 as _bfloat16
from cuvmap.lax.elementwise.common import (
    _c_comparison, _comparison_shape_rule, _nary, _naryop_shape_rule, _same_shape_rule, broadcast_shapes,
)
from cuvmap.transforms import batching, jvp, vjp
from cuvmap.transforms.fusion import CExpression
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# Declarations and impls
# ---------------------------------------------------------------------------------------

eq_p = _nary("eq", np.equal, _comparison_shape_rule, differentiable=False, fused=_c_comparison("=="))
ne_p = _nary("ne", np.not_equal, _comparison_shape_rule, differentiable=False, fused=_c_comparison("!="))
lt_p = _nary("lt", np.less, _comparison_shape_rule, differentiable=False, fused=_c_comparison("<"))
le_p = _nary("le", np.less_equal, _comparison_shape_rule, differentiable=False, fused=_c_comparison("<="))
gt_p = _nary("gt", np.greater, _comparison_shape_rule, differentiable=False, fused=_c_comparison(">"))
ge_p = _nary("ge", np.greater_equal, _comparison_shape_rule, differentiable=False, fused=_c_comparison(">="))


# NOTE [branch-free select]
# np.where branches per element, and on a random mask (relu's, max pool's) it mispredicts
# about half the time: it measured an order of magnitude slower than np.maximum on the
# same values. For NumPy float operands the impl blends the bit patterns instead: with
# m = -pred as an integer mask (all ones where pred holds),
# select = (bits(on_true) & m) | (bits(on_false) & ~m), exact for every value (inf, NaN
# and -0.0 included) and several times faster than np.where, most with a zero operand
# (relu's). tests/lax/test_ops.py checks it bit for bit against np.where.
# relu is ``select(x <= 0, 0, x)`` (NOTE [relu keeps NaN] in cuvmap/nn/functional.py), so
# a positive zero on either side takes the short path: the mask is widened into the
# result's own buffer (``-pred`` keeps ``on_true`` where pred holds, ``pred - 1`` keeps
# ``on_false`` where it does not), then one AND in place.
_SAME_SIZE_INT = {2: np.int16, 4: np.int32, 8: np.int64}


def _float_bits(value, dtype, int_type):
    return np.asarray(value, dtype=dtype).view(int_type)


def _is_positive_zero(value):
    """A Python 0 or 0.0 (not -0.0, whose sign bit the blend must keep)."""
    return type(value) in (int, float) and value == 0 and math.copysign(1.0, value) > 0


def select_impl(pred, on_true, on_false):
    """``numpy.where`` on concrete arrays, branch-free for NumPy floats (used by pooling too)."""
    if type(pred) is not np.ndarray or pred.dtype != np.bool_ or pred.ndim == 0:
        return np.where(pred, on_true, on_false)
    dtype = np.result_type(on_true, on_false)
    if (kind_of(dtype) != "f" or dtype.itemsize not in _SAME_SIZE_INT
            or type(on_true) not in _NUMPY_OPERANDS or type(on_false) not in _NUMPY_OPERANDS):
        return np.where(pred, on_true, on_false)
    int_type = _SAME_SIZE_INT[dtype.itemsize]
    zero_false, zero_true = _is_positive_zero(on_false), _is_positive_zero(on_true)
    if zero_false or zero_true:
        # one side a positive zero (relu's select and its VJP's): the mask widened into the
        # result's own buffer, then the blend in place, so that the only array of the
        # result's width is the result (NOTE [branch-free select])
        bits = _float_bits(on_true if zero_false else on_false, dtype, int_type)
        if bits.shape != pred.shape:
            return np.bitwise_and(bits, _keep_mask(pred, zero_false, np.int8)).view(dtype)
        out = _keep_mask(pred, zero_false, int_type)
        return np.bitwise_and(bits, out, out=out).view(dtype)
    shape = np.broadcast_shapes(pred.shape, np.shape(on_true), np.shape(on_false))
    mask = _keep_mask(pred, True, int_type)  # 0 or -1 (all bits set)
    # the mask's buffer is reused for the last result when it has the full shape: one
    # fresh array fewer to touch (fresh pages are slow here, NOTE [cache blocking])
    reuse = mask if mask.shape == shape else None
    out = np.bitwise_and(_float_bits(on_true, dtype, int_type), mask)
    np.invert(mask, out=mask)
    other = np.bitwise_and(_float_bits(on_false, dtype, int_type), mask, out=reuse)
    if other.shape == out.shape:
        out |= other
    else:
        out = np.bitwise_or(out, other)
    return out.view(dtype)


_NUMPY_OPERANDS = (np.ndarray, int, float, np.float16, np.float32, np.float64)


def _keep_mask(pred, keep_true, int_type, out=None):
    """All bits set where the kept side is taken, none elsewhere: ``-pred`` keeps
    ``on_true`` (``keep_true``), ``pred - 1`` keeps ``on_false``; ``int_type`` wide, or into
    ``out``. The one-byte result is widened on its way into the wide buffer (``out=`` with
    unsafe casting), which measured about 30% faster than widening the operand first
    (``dtype=``)."""
    flags = pred.view(np.int8)
    if out is None:
        out = np.empty_like(flags, dtype=int_type)   # (in pred's layout: a channels-last mask stays so)
    if keep_true:
        return np.negative(flags, out=out, casting="unsafe")
    return np.subtract(flags, np.int8(1), out=out, casting="unsafe")


def _select_shape_rule(pred, on_true, on_false):
    if pred.dtype != np.bool_:
        raise ShapeError(f"predicate must be boolean, got {pred.dtype}")
    out = _naryop_shape_rule(on_true, on_false)
    return ShapedArray(broadcast_shapes(pred.shape, out.shape), out.dtype, out.weak_type)


def select_into(pred, on_true, on_false, *, out):
    """``select`` written into ``out``, a buffer of the result's shape and dtype that the
    jit executor owns (NOTE [buffer planning] in cuvmap/transforms/executor/buffers.py): the
    branch-free blend of NOTE [branch-free select] with a one-byte mask, so that relu's
    select (a positive zero on either side) allocates nothing of the result's size (another
    ``on_false`` needs one temporary). ``out`` may be ``on_true``'s or ``on_false``'s
    buffer (each element is read before it is written). Raises TypeError where the blend
    does not apply (not NumPy floats), and the executor then calls :func:`select_impl`."""
    dtype = out.dtype
    if (type(out) is not np.ndarray or type(pred) is not np.ndarray or pred.dtype != np.bool_
            or kind_of(dtype) != "f" or dtype.itemsize not in _SAME_SIZE_INT
            or type(on_true) not in _NUMPY_OPERANDS or type(on_false) not in _NUMPY_OPERANDS):
        raise TypeError("select_into: the blend needs NumPy float operands")
    int_type = _SAME_SIZE_INT[dtype.itemsize]
    bits = out.view(int_type)
    zero_false, zero_true = _is_positive_zero(on_false), _is_positive_zero(on_true)
    if zero_false or zero_true:
        kept_bits = _float_bits(on_true if zero_false else on_false, dtype, int_type)
        if pred.shape == bits.shape and not np.may_share_memory(kept_bits, bits):
            # the mask widened into ``out`` itself, then the blend in place: no temporary
            _keep_mask(pred, zero_false, int_type, out=bits)
            np.bitwise_and(kept_bits, bits, out=bits)
            return out
        np.bitwise_and(kept_bits, _keep_mask(pred, zero_false, np.int8), out=bits)
        return out
    mask = np.negative(pred.view(np.int8))  # 0 or -1; widened to the int type elementwise
    other = np.bitwise_and(_float_bits(on_false, dtype, int_type), np.invert(mask))  # on_false read first
    np.bitwise_and(_float_bits(on_true, dtype, int_type), mask, out=bits)
    np.bitwise_or(bits, other, out=bits)
    return out


def _select_workspace(in_avals, out_avals, params, strided):
    """The blend's one-byte mask, and the second operand's bits unless it is a positive zero
    (the plan's memory estimate cannot tell, so it counts them: NOTE [planned peak memory])."""
    out = out_avals[0]
    return out.size + out.size * out.dtype.itemsize


select_p = _nary("select", select_impl, _select_shape_rule, impl_into=select_into, workspace=_select_workspace,
                 impl_into_when=lambda aval, gpu: not gpu and kind_of(aval.dtype) == "f",  # the blend's operands
                 fused=CExpression("({0} ? {1} : {2})", bool_operands=(0,)))


def _convert_element_type_impl(x, *, new_dtype):
    if isinstance(x, (bool, int, float, complex)):
        x = np.asarray(x)
    if kind_of(x.dtype) == "c" and kind_of(np.dtype(new_dtype)) != "c":
        # the real part, as JAX's cast (NumPy's astype warns that it discards the
        # imaginary part): the transpose of the real-to-complex cast (NOTE [complex
        # convention] in cuvmap/transforms/complex_rules.py)
        x = x.real
    return x.astype(new_dtype)


def _convert_element_type_shape_rule(x, *, new_dtype):
    return ShapedArray(x.shape, new_dtype)


# fused as a cast of its operand to the output's type (new_dtype)
convert_element_type_p = _nary(
    "convert_element_type", _convert_element_type_impl, _convert_element_type_shape_rule,
    fused=CExpression("{0}", accepts=lambda new_dtype: True),
)


stop_gradient_p = _nary("stop_gradient", lambda x: x, _same_shape_rule, differentiable=False, fused=CExpression("{0}"),
                        layout=lambda strided, *_: (False, strided[0]))  # its operand itself


# ---------------------------------------------------------------------------------------
# Public wrappers
# ---------------------------------------------------------------------------------------

def eq(x, y):
    return eq_p.bind(x, y)


def ne(x, y):
    return ne_p.bind(x, y)


def lt(x, y):
    return lt_p.bind(x, y)


def le(x, y):
    return le_p.bind(x, y)


def gt(x, y):
    return gt_p.bind(x, y)


def ge(x, y):
    return ge_p.bind(x, y)


def select(pred, on_true, on_false):
    """``on_true`` where ``pred`` holds, else ``on_false`` (``numpy.where``), broadcasting."""
    return select_p.bind(pred, on_true, on_false)


def convert_element_type(operand, new_dtype):
    """``operand.astype(new_dtype)``; differentiable between floating dtypes (bfloat16
    among them: NOTE [bfloat16 computes in float32] in cuvmap/core/bfloat16.py). A cast to
    one of ml_dtypes' other dtypes (float8, int4, ...) raises naming it: cuvmap does not
    compute with them (NOTE [bfloat16 needs ml_dtypes] in cuvmap/dtypes.py), and a
    derivative through such a cast would otherwise be a silent zero."""
    new_dtype = np.dtype(new_dtype)
    if kind_of(new_dtype) == "V" and new_dtype.fields is None and not _bfloat16.is_bfloat16(new_dtype):
        raise TypeError(f"convert_element_type: a cast to {new_dtype.name}, which cuvmap's operations and "
                        f"transforms do not support yet (NumPy has no {new_dtype.name}; ml_dtypes provides the type, "
                        "but not JAX's promotion rules for it); compute in float32")
    return convert_element_type_p.bind(operand, new_dtype=new_dtype)


def stop_gradient(x):
    """The identity, whose derivative is zero: transforms of derivatives see a constant.
    ``x`` may be a pytree: every leaf is stopped (``jax.lax.stop_gradient``); a leaf that
    is no value (a function, a string) is JAX's TypeError."""
    def stop(leaf):
        if not core.is_value(leaf):
            raise TypeError(f"stop_gradient: Argument {leaf!r} of type {type(leaf)} is not a valid JAX type "
                            "(it takes arrays, Python numbers and pytrees of them)")
        return stop_gradient_p.bind(leaf)

    return tree.map_preserving(stop, x)


# ---------------------------------------------------------------------------------------
# Batching rules
# ---------------------------------------------------------------------------------------

batching.defbroadcasting(eq_p, ne_p, lt_p, le_p, gt_p, ge_p, select_p)
batching.defunary(convert_element_type_p, stop_gradient_p)


# ---------------------------------------------------------------------------------------
# Derivative rules (each serves as JVP and VJP: see cuvmap/lax/elementwise/__init__.py)
# ---------------------------------------------------------------------------------------

def _where_nonzero(pred, g):
    """``g`` where ``pred`` holds, zero elsewhere, in ``g``'s dtype."""
    return select(pred, g, 0)


vjp.defderivative(
    select_p,
    None,
    lambda g, out, pred, t, f: _where_nonzero(pred, g),
    lambda g, out, pred, t, f: select(pred, 0, g),
    reads=(0,),
)


def _convert_element_type_jvp(t, out, x, *, new_dtype):
    return convert_element_type(t, new_dtype)


def _convert_element_type_vjp(ct, out, x, *, new_dtype):
    if not core.is_float(x):
        return None
    return convert_element_type(ct, core.dtype_of(x))


jvp.defjvp(convert_element_type_p, _convert_element_type_jvp)
vjp.defvjp(convert_element_type_p, _convert_element_type_vjp, reads=())
