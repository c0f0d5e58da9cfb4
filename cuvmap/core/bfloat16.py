"""bfloat16 values: JAX's promotion rules for them and their computation in float32 (NOTE
[bfloat16 computes in float32]).

bfloat16 comes from ``ml_dtypes`` (cuvmap's optional ``bfloat16`` extra, JAX's own dtype
package), which registers it with NumPy as a dtype of kind ``"V"``: NumPy neither calls it
floating (``np.issubdtype(bfloat16, np.floating)`` is false) nor promotes it as JAX does.
:func:`kind_of` is the kind cuvmap's rules ask for (``"f"`` for bfloat16) and
:func:`result_type` NumPy's promotion with JAX's lattice for bfloat16.
"""
import numpy as np

from cuvmap import dtypes

BFLOAT16 = np.dtype(dtypes.bfloat16) if dtypes.has_bfloat16() else None


# NOTE [bfloat16 computes in float32]
# A primitive whose operands or result are bfloat16 runs its impl on float32 operands and
# rounds each bfloat16 result to nearest even (ml_dtypes' cast), as XLA on the CPU computes
# bfloat16 elementwise operations in float32: one rounding per primitive, so an eager
# primitive, a staged program (jit runs such an equation through :func:`float32_impl`, never
# fused and without a writer into a pooled buffer) and vmap give the same bits. The kernels
# underneath (NumPy's ufuncs and BLAS, oneDNN's convolutions, LAPACK) then need no bfloat16
# paths. Promotion is JAX's lattice (:func:`result_type`): bfloat16 with any integer or
# boolean, or a Python int or float, stays bfloat16; with float16 or float32 it is float32,
# with float64 float64, with complex64 (or a Python complex) complex64. Tangents and
# cotangents of bfloat16 values are bfloat16 (``core.is_float``). On a GPU (CuPy has no
# bfloat16) and for ml_dtypes' other types (float8_*, int4) cuvmap still refuses by name
# (cuvmap.dtypes.check_supported).
def is_bfloat16(dtype):
    """Whether ``dtype`` is bfloat16."""
    return BFLOAT16 is not None and dtype == BFLOAT16


def kind_of(dtype):
    """NumPy's kind of ``dtype`` (``"b"``, ``"i"``, ``"u"``, ``"f"``, ``"c"``, ...), with
    ``"f"`` for bfloat16 (NumPy's is ``"V"``)."""
    kind = dtype.kind
    if kind == "V" and BFLOAT16 is not None and dtype == BFLOAT16:
        return "f"
    return kind


def result_type(*operands):
    """``np.result_type`` of dtypes and Python scalars (NEP 50: the scalars are weak), with
    JAX's lattice where bfloat16 is among them (NOTE [bfloat16 computes in float32])."""
    if BFLOAT16 is None or not any(isinstance(o, np.dtype) and o == BFLOAT16 for o in operands):
        return np.result_type(*operands)
    others = [o for o in operands if not (isinstance(o, np.dtype) and o == BFLOAT16)]
    strong = [o for o in others if isinstance(o, np.dtype)]
    if any(o.kind in "fc" for o in strong):
        # bfloat16 ∨ float16 = float32, and the wider floats and complex types absorb it
        return np.result_type(np.float32, *others)
    if any(type(o) is complex for o in others):
        return np.dtype(np.complex64)
    return BFLOAT16


def promote_types(a, b):
    """``np.promote_types`` with JAX's lattice for bfloat16."""
    return result_type(np.dtype(a), np.dtype(b))


def _upcast(x):
    dtype = getattr(x, "dtype", None)
    if dtype is not None and is_bfloat16(dtype):
        return x.astype(np.float32)
    return x


def _upcast_param(value):
    """A dtype param (``new_dtype=``, ``dtype=``, ``preferred_element_type=``) of bfloat16 as
    float32; any other param as it is."""
    if isinstance(value, (np.dtype, type)):
        try:
            if is_bfloat16(np.dtype(value)):
                return np.dtype(np.float32)
        except TypeError:  # a type that is no dtype
            pass
    return value


def involves_bfloat16(avals):
    """Whether any of ``avals`` (ShapedArrays) is bfloat16."""
    return BFLOAT16 is not None and any(a.dtype == BFLOAT16 for a in avals)


def float32_impl(impl, out_avals, multiple_results=False):
    """``impl`` computing in float32 for bfloat16 operands and results (NOTE [bfloat16
    computes in float32]): bfloat16 operands and dtype parameters become float32, and each
    result whose aval (``out_avals``, from the shape rule) is bfloat16 is rounded to it."""
    out_avals = tuple(out_avals)

    def impl_in_float32(*args, **params):
        args = [_upcast(a) for a in args]
        params = {k: _upcast_param(v) for k, v in params.items()}
        out = impl(*args, **params)
        if multiple_results:
            return [_round(o, a) for o, a in zip(out, out_avals)]
        return _round(out, out_avals[0])

    return impl_in_float32


def _round(x, aval):
    if aval is not None and is_bfloat16(aval.dtype) and getattr(x, "dtype", None) != BFLOAT16:
        return np.asarray(x).astype(BFLOAT16)
    return x


# primitives whose impls take bfloat16 operands as they are: a change of precision would
# change their meaning (a bitcast reads the operand's bits; the float after x in float32
# rounds back to x in bfloat16), and NumPy computes them on ml_dtypes' type exactly
_NATIVE = set()


def computes_natively(*primitives):
    """Marks ``primitives`` as run on bfloat16 operands as they are (not in float32)."""
    _NATIVE.update(p.name for p in primitives)


def impl_for(primitive, out_avals):
    """The impl that runs ``primitive`` where an operand or a result is bfloat16 (NOTE
    [bfloat16 computes in float32]): its own for those marked by :func:`computes_natively`,
    else its impl in float32."""
    if primitive.name in _NATIVE:
        return primitive.impl
    # the impl is read at each call: a later def_impl is seen, as by plain binds
    return float32_impl(lambda *args, **params: primitive.impl(*args, **params), out_avals,
                        multiple_results=primitive.multiple_results)


def eqn_impl(eqn):
    """The impl a staged program runs for equation ``eqn``: its primitive's, or
    :func:`impl_for` where an operand or a result is bfloat16."""
    prim = eqn.primitive
    if BFLOAT16 is None or not eqn_involves_bfloat16(eqn):
        return prim.impl
    return impl_for(prim, [v.aval for v in eqn.outs])


def eqn_involves_bfloat16(eqn):
    """Whether an operand or a result of equation ``eqn`` is bfloat16."""
    if BFLOAT16 is None:
        return False
    return (any(getattr(getattr(x, "aval", None), "dtype", None) == BFLOAT16 for x in eqn.inputs)
            or any(v.aval.dtype == BFLOAT16 for v in eqn.outs))
