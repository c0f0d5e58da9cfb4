"""The operators and array methods of tracers (``+ - * / // % ** @``, comparisons,
``& | ^ ~ << >>``, indexing, ``.T``, ``.reshape``, ``.sum``, ...): importing this module
attaches them to :class:`cuvmap.core.Tracer` (``import cuvmap.numpy`` does)."""
from cuvmap.core import Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.numpy._elementwise import (
    abs, add, astype, bitwise_and, bitwise_not, bitwise_or, bitwise_xor, clip, divide, equal, floor_divide,
    greater, greater_equal, left_shift, less, less_equal, multiply, negative, not_equal, power, remainder,
    right_shift, round, subtract,
)
from cuvmap.numpy._indexing import getitem
from cuvmap.numpy._products import dot, matmul
from cuvmap.numpy._reductions import (
    all, any, argmax, argmin, argsort, cumprod, cumsum, max, mean, min, prod, std, sum, trace, var,
)
from cuvmap.numpy._shapes import diagonal, ravel, reshape, squeeze, swapaxes, transpose


def _operator(symbol, fn, reflected=False):
    """The tracer method of operator ``symbol``: ``fn`` with errors that name the operator."""
    name = fn.__name__

    def method(self, other):
        x, y = (other, self) if reflected else (self, other)
        try:
            return fn(x, y)
        except TypeError as err:
            raise TypeError(str(err).replace(f"{name}:", f"{name} (operator {symbol}):", 1)) from None

    return method


def _invert_operator(self):
    try:
        return bitwise_not(self)
    except TypeError as err:
        raise TypeError(str(err).replace("bitwise_not:", "bitwise_not (operator ~):", 1)) from None


def _swap(f):
    return lambda self, other: f(other, self)


def _tracer_reshape(self, *shape_, order="C", copy=None):
    return reshape(self, shape_[0] if len(shape_) == 1 else shape_, order)


def _tracer_transpose(self, *axes):
    if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
        axes = axes[0]
    return transpose(self, tuple(axes) if axes else None)


def _no_out(name, out):
    if out is not None:
        raise TypeError(f"{name}: out= is not supported on traced values (they are immutable)")


# NOTE [NumPy functions on tracers]: ``np.sum(tracer)``, ``np.mean``, ``np.max``, ``np.argmax``
# ... call the method of the same name with NumPy's signature (``axis, dtype, out``), so the
# methods take those arguments; NumPy's ufuncs (``np.sin(tracer)``) raise a
# ConcretizationError instead (see NOTE [binary operators with arrays] in core/tracers.py).


def _tracer_sum(self, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    _no_out("sum", out)
    return sum(self, axis, dtype, keepdims=keepdims, initial=initial, where=where)


def _tracer_mean(self, axis=None, dtype=None, out=None, keepdims=False, *, where=None):
    _no_out("mean", out)
    return mean(self, axis, dtype, keepdims=keepdims, where=where)


def _tracer_var(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None, correction=None):
    _no_out("var", out)
    return var(self, axis, dtype, ddof=ddof, keepdims=keepdims, where=where, correction=correction)


def _tracer_std(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=None, correction=None):
    _no_out("std", out)
    return std(self, axis, dtype, ddof=ddof, keepdims=keepdims, where=where, correction=correction)


def _tracer_extremum(fn):
    def method(self, axis=None, out=None, keepdims=False, initial=None, where=None):
        _no_out(fn.__name__, out)
        return fn(self, axis, keepdims=keepdims, initial=initial, where=where)

    return method


def _tracer_arg(fn):
    def method(self, axis=None, out=None, keepdims=None):
        _no_out(fn.__name__, out)
        return fn(self, axis, keepdims=keepdims)

    return method


def _tracer_clip(self, min=None, max=None, out=None):  # noqa: A002 - NumPy's names
    _no_out("clip", out)
    return clip(self, min, max)


def _tracer_prod(self, axis=None, dtype=None, out=None, keepdims=False):
    _no_out("prod", out)
    return prod(self, axis, dtype, keepdims=keepdims)


def _tracer_cumulative(fn):
    def method(self, axis=None, dtype=None, out=None):
        _no_out(fn.__name__, out)
        return fn(self, axis, dtype)

    return method


def _tracer_any_all(fn):
    def method(self, axis=None, out=None, keepdims=False, *, where=None):
        _no_out(fn.__name__, out)
        return fn(self, axis, keepdims=keepdims, where=where)

    return method


def _tracer_round(self, decimals=0, out=None):
    _no_out("round", out)
    return round(self, decimals)


def _tracer_argsort(self, axis=-1, kind=None, order=None, *, stable=True, descending=False):
    return argsort(self, axis, kind=kind, order=order, stable=stable, descending=descending)


def _tracer_trace(self, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    _no_out("trace", out)
    return trace(self, offset, axis1, axis2, dtype)


def _setitem(self, index, value):
    raise TypeError(
        "traced values are immutable: item assignment is not supported; build the result with "
        "cuvmap.numpy.where, concatenate or pad"
    )


_TRACER_METHODS = {
    "__add__": add, "__radd__": _swap(add),
    "__sub__": subtract, "__rsub__": _swap(subtract),
    "__mul__": multiply, "__rmul__": _swap(multiply),
    "__truediv__": divide, "__rtruediv__": _swap(divide),
    "__floordiv__": floor_divide, "__rfloordiv__": _swap(floor_divide),
    "__mod__": remainder, "__rmod__": _swap(remainder),
    "__divmod__": lambda self, other: (floor_divide(self, other), remainder(self, other)),
    "__rdivmod__": lambda self, other: (floor_divide(other, self), remainder(other, self)),
    "__pow__": power, "__rpow__": _swap(ew.pow),
    "__matmul__": matmul, "__rmatmul__": _swap(matmul),
    "__neg__": negative, "__pos__": lambda self: self, "__abs__": abs,
    "__lt__": less, "__le__": less_equal, "__gt__": greater, "__ge__": greater_equal,
    "__eq__": equal, "__ne__": not_equal,
    "__getitem__": getitem, "__setitem__": _setitem,
    "reshape": _tracer_reshape, "transpose": _tracer_transpose,
    "__and__": _operator("&", bitwise_and), "__rand__": _operator("&", bitwise_and, True),
    "__or__": _operator("|", bitwise_or), "__ror__": _operator("|", bitwise_or, True),
    "__xor__": _operator("^", bitwise_xor), "__rxor__": _operator("^", bitwise_xor, True),
    "__lshift__": _operator("<<", left_shift), "__rlshift__": _operator("<<", left_shift, True),
    "__rshift__": _operator(">>", right_shift), "__rrshift__": _operator(">>", right_shift, True),
    "__invert__": _invert_operator,
    "sum": _tracer_sum, "mean": _tracer_mean, "var": _tracer_var, "std": _tracer_std,
    "max": _tracer_extremum(max), "min": _tracer_extremum(min),
    "argmax": _tracer_arg(argmax), "argmin": _tracer_arg(argmin), "astype": astype, "ravel": ravel,
    "squeeze": squeeze, "clip": _tracer_clip, "dot": dot, "swapaxes": swapaxes,
    "prod": _tracer_prod, "cumsum": _tracer_cumulative(cumsum), "cumprod": _tracer_cumulative(cumprod),
    "any": _tracer_any_all(any), "all": _tracer_any_all(all), "round": _tracer_round,
    "argsort": _tracer_argsort, "diagonal": diagonal, "trace": _tracer_trace,
    "__round__": lambda self, ndigits=None: round(self, 0 if ndigits is None else ndigits),
}
for _name, _fn in _TRACER_METHODS.items():
    setattr(Tracer, _name, _fn)
Tracer.__hash__ = object.__hash__
Tracer.T = property(lambda self: transpose(self))
Tracer.mT = property(lambda self: swapaxes(self, -1, -2))
