"""Weakly typed arrays computed eagerly (JAX's ``weak_type=True`` on a concrete array).

A Python number is weakly typed: it takes the dtype of the array it meets (NEP 50). A
value computed from Python numbers and integer arrays only is weakly typed too in JAX
(NOTE [weak types of mixed operands] in cuvmap/lax/elementwise/common.py): ``int32_array
+ 1.5`` is a weak float, so ``(int32_array + 1.5) * float32_array`` is float32. Staged
programs carry that in their avals (NOTE [a weak value meets a strong one] in
cuvmap/transforms/staging.py); eagerly the value is a :class:`WeakArray`, a NumPy array
that says it is weak (NOTE [eager weak arrays]).
"""
import numpy as np

from cuvmap.core import bfloat16 as _bfloat16
from cuvmap.core.avals import _PY_SCALAR_DTYPES, ShapedArray
from cuvmap.core.rule_cache import RuleCache, signature
from cuvmap.errors import ShapeError


# NOTE [eager weak arrays]
# An eager primitive whose shape rule gives a weakly typed result from an array operand
# (``add(int32_array, 1.5)``) returns a :class:`WeakArray` view of NumPy's result, whose
# aval is weak (``core.get_aval``). When a WeakArray meets an operand whose dtype should
# win, ``bind`` first casts it to the result's dtype, as staging casts a weak variable
# (the same test: does the operand, made strong, change the result's dtype?), so eager
# and staged results agree in dtype and value. NumPy's own ufuncs (``weak * f32_array``,
# the operators) apply the same rule through ``__array_ufunc__``: a WeakArray meeting a
# strong operand takes the dtype the strong operands give with a Python number of the
# weak one's kind (NEP 50's result_type, JAX's lattice for these), and the result is
# plain; among weak operands and Python numbers only, the result stays weak (``weak * 2``,
# as JAX's). Comparisons give plain booleans; reductions and other ufunc methods plain
# arrays. A NumPy array the user made (``np.arange(3, dtype=np.int32) + 1.5``) is strong:
# only what cuvmap computes can be weak. Python numbers stay Python numbers; a result
# computed only from them is unchanged (NumPy's 0-d array, as before). Only NumPy arrays
# (host values) are made weak.
class WeakArray(np.ndarray):
    """A NumPy array that is weakly typed (JAX's ``weak_type=True``): a cuvmap primitive
    that meets it with a strong operand gives the strong operand's dtype
    (NOTE [eager weak arrays])."""

    weak_type = True  # (JAX's attribute of an array; cuvmap.dtypes.is_weakly_typed reads it)

    def __array_wrap__(self, obj, context=None, return_scalar=False):
        result = obj.view(np.ndarray) if isinstance(obj, np.ndarray) else obj
        if return_scalar and isinstance(result, np.ndarray) and result.ndim == 0:
            return result[()]
        return result

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if any(hasattr(x, "__array_ufunc__") and not isinstance(x, (np.ndarray, np.generic)) for x in inputs):
            return NotImplemented  # a device array (CuPy's): its own __array_ufunc__ decides
        plain = [_plain(x) for x in inputs]
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out)
        if method != "__call__" or out is not None or "dtype" in kwargs or "signature" in kwargs:
            return getattr(ufunc, method)(*plain, **kwargs)
        strong = [x.dtype if isinstance(x, (np.ndarray, np.generic)) else np.asarray(x).dtype  # (a list: NumPy's)
                  for x in inputs if type(x) is not WeakArray and type(x) not in _PY_SCALAR_DTYPES]
        if strong:
            for i, x in enumerate(inputs):
                if type(x) is WeakArray:
                    target = _bfloat16.result_type(*strong, _PY_NUMBER_OF_KIND.get(_bfloat16.kind_of(x.dtype), 0.0))
                    if target != x.dtype:
                        plain[i] = plain[i].astype(target)
            return ufunc(*plain, **kwargs)
        result = ufunc(*plain, **kwargs)
        if isinstance(result, np.ndarray) and result.dtype.kind in "iufc":
            return result.view(WeakArray)
        return result

    def __repr__(self):
        return np.ndarray.__repr__(self.view(np.ndarray))[:-1] + ", weak_type=True)"


# a Python number of each kind: what a weak operand stands for in NEP 50's result_type
_PY_NUMBER_OF_KIND = {"b": False, "i": 0, "u": 0, "f": 0.0, "c": 0j}


def may_be_weak(args):
    """Whether an eager bind of ``args`` can involve weak arrays: a WeakArray among them,
    or a Python number beside an integer or boolean NumPy array (the only strong operand
    a weak one lifts). Cheap: it runs before every eager primitive, which is also where an
    operand of one of ml_dtypes' dtypes is refused by name (TypeError)."""
    scalar = array = False
    for a in args:
        t = type(a)
        if t is WeakArray:
            return True
        if t in _PY_SCALAR_DTYPES:
            scalar = True
        elif t is np.ndarray or (isinstance(a, np.generic) and a.dtype.kind == "V"):
            kind = a.dtype.kind
            if kind in "biu":
                array = True
            elif kind == "V" and a.dtype.fields is None:
                if _bfloat16.is_bfloat16(a.dtype):
                    return True  # NOTE [bfloat16 computes in float32] in cuvmap/core/bfloat16.py
                # ml_dtypes' float8, int4: NOTE [bfloat16 needs ml_dtypes] in cuvmap/dtypes.py
                raise TypeError(f"an operand has dtype {a.dtype.name}, which cuvmap does not support yet (NumPy "
                                f"has no {a.dtype.name}; ml_dtypes provides the type, but not JAX's promotion "
                                "rules for it); cast it to float32 first (x.astype(numpy.float32))")
    return scalar and array


def bind_weak(primitive, args, params):
    """The eager bind of ``primitive`` on ``args`` with weak types applied (NOTE [eager
    weak arrays]): WeakArray operands cast where a strong operand decides the dtype, the
    result a WeakArray where the shape rule says weak. The decision is the shape rule's,
    cached per signature (NOTE [eager shape rules are cached per signature] in
    cuvmap/core/rule_cache.py)."""
    if primitive.shape_rule is None:
        return primitive.impl(*[_plain(a) for a in args], **params)
    if primitive.multiple_results:
        impl = primitive.impl
        avals = [_aval(a) for a in args]
        if _bfloat16.involves_bfloat16(avals):
            impl = _bfloat16.impl_for(primitive, primitive.shape_rule(*avals, **params))
        return impl(*[_plain(a) for a in args], **params)
    sig = signature(args, params)
    plan = None if sig is None else _plans.get(primitive, sig)
    if plan is None:
        plan = _weak_plan(primitive, args, params)
        if sig is not None:
            _plans.put(primitive, sig, plan)
    weak_out, out_dtype, casts, bfloat16_out = plan
    if casts:
        args = list(args)
        for i, cast in casts:
            plain = args[i].view(np.ndarray)
            args[i] = plain if cast is None else plain.astype(cast)
    impl = primitive.impl if bfloat16_out is None else _bfloat16.impl_for(primitive, (bfloat16_out,))
    result = impl(*args, **params)
    if isinstance(result, np.generic):
        result = np.asarray(result)
    if weak_out and type(result) is np.ndarray and result.dtype == out_dtype:
        return result.view(WeakArray)
    return result


_plans = RuleCache()


def _weak_plan(primitive, args, params):
    """``(weak result, result dtype, casts, bfloat16 result)`` of ``bind_weak``: ``casts``
    holds ``(i, dtype)`` for each WeakArray operand ``i``, the dtype it is cast to first
    (None: its own); the last is the result's aval where bfloat16 is involved (the impl
    then computes in float32: NOTE [bfloat16 computes in float32]), else None. It depends
    on the shape rule and the signature only (primitives share rules and so plans)."""
    avals = [_aval(a) for a in args]
    out = primitive.shape_rule(*avals, **params)
    casts = []
    for i, a in enumerate(args):
        if type(a) is not WeakArray:
            continue
        cast = None
        if not out.weak_type:
            strong = ShapedArray(a.shape, a.dtype)
            try:
                as_strong = primitive.shape_rule(*avals[:i], strong, *avals[i + 1:], **params).dtype
            except ShapeError:
                as_strong = out.dtype
            if as_strong != out.dtype:
                cast = out.dtype
        casts.append((i, cast))
    bfloat16_out = out if _bfloat16.involves_bfloat16(avals) or _bfloat16.is_bfloat16(out.dtype) else None
    return out.weak_type, out.dtype, tuple(casts), bfloat16_out


def _plain(a):
    return a.view(np.ndarray) if type(a) is WeakArray else a


def _aval(a):
    t = type(a)
    if t in _PY_SCALAR_DTYPES:
        return ShapedArray((), _PY_SCALAR_DTYPES[t], weak_type=True)
    return ShapedArray(a.shape, a.dtype, weak_type=t is WeakArray)
