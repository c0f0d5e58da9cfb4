"""The functions of the stand-in's ``cupy`` namespace: ufuncs, array functions, creation
and transfer, indexing. Each runs NumPy's function of the same name through
:func:`cupy._strict.launch` (NumPy operands raise, results are stand-in arrays, 0-d
instead of NumPy scalars), with CuPy's own rules where they differ: transfers count their
device->host reads, data-dependent shapes (``nonzero``, boolean masks) read a count back,
float GEMMs are cuBLAS calls and linear-algebra solvers cuSOLVER calls."""
import numpy as np

from cupy._strict import (
    host_read,
    host_to_device,
    launch,
    ndarray,
    record,
    unwrap,
    used,
)

# ---------------------------------------------------------------------------------------
# ufuncs
# ---------------------------------------------------------------------------------------


def _check_dtype(x):
    if type(x) is ndarray and (x.dtype.kind in "OUSMmV" or x.dtype == np.longdouble and x.dtype.itemsize > 8):
        raise ValueError(f"Unsupported dtype {x.dtype}")
    return x


class ufunc:
    """``cupy.ufunc``: NumPy's ufunc of the same name on the unwrapped operands."""

    def __init__(self, np_ufunc, name=None, module="cupy"):
        self._u = np_ufunc
        self.__name__ = name or np_ufunc.__name__
        self._qualname = f"{module}.{self.__name__}"
        self.nin, self.nout, self.nargs = np_ufunc.nin, np_ufunc.nout, np_ufunc.nargs

    def __repr__(self):
        return f"<ufunc '{self.__name__}'>"

    def _run(self, method, fn, args, kwargs):
        used(self._qualname if method == "__call__" else f"{self._qualname}.{method}")
        out = kwargs.get("out")
        if isinstance(out, tuple):
            if len(out) != 1:
                raise ValueError("The 'out' parameter must have exactly one array value")
            out = kwargs["out"] = out[0]
        if out is not None and type(out) is not ndarray:
            raise TypeError("Output arguments must be cupy.ndarray")
        if "where" in kwargs and kwargs["where"] is not True:
            raise NotImplementedError(f"cupy.{self.__name__}: the 'where' argument (strict stand-in)")
        result = launch(f"{self.__name__}.{method}" if method != "__call__" else self.__name__, fn, args, kwargs)
        if out is not None:
            return out
        return _check_dtype(result) if type(result) is ndarray else result

    def __call__(self, *args, **kwargs):
        if len(args) > self.nin:  # outputs given positionally
            kwargs["out"] = args[self.nin:]
            args = args[:self.nin]
        return self._run("__call__", self._u, args, kwargs)

    def reduce(self, *args, **kwargs):
        return self._run("reduce", self._u.reduce, args, kwargs)

    def accumulate(self, *args, **kwargs):
        return self._run("accumulate", self._u.accumulate, args, kwargs)

    def reduceat(self, *args, **kwargs):
        return self._run("reduceat", self._u.reduceat, args, kwargs)

    def outer(self, *args, **kwargs):
        return self._run("outer", self._u.outer, args, kwargs)

    def at(self, a, indices, b=None):
        used(f"{self._qualname}.at")
        if type(a) is not ndarray:
            raise TypeError(f"{self.__name__}.at: the first argument must be a cupy.ndarray")
        idx = _index(indices)  # wrapped as CuPy's scatter does (NOTE [CuPy wraps integer-array indices])
        args = (a._a, _wrapped(a.shape, unwrap(idx))) if b is None else (a._a, _wrapped(a.shape, unwrap(idx)), _value(b))
        self._u.at(*args)
        record(f"{self.__name__}.at", lambda x, i, *v: self._u.at(x, _wrapped(x.shape, i), *v),
               (a, idx) if b is None else (a, idx, b))


# NOTE [the stand-in's surface]
# The stand-in implements the CuPy names cuvmap calls (through its array module ``xp``, or
# NumPy's dispatch to CuPy) and the tests use, and nothing more, so that a call CuPy could
# not serve fails here too: the names a session calls are recorded (strict_cupy.surface(),
# CUVMAP_STRICT_CUPY_SURFACE=path), and these lists are that record plus the names
# cuvmap's source spells out (xp.fmin, xp.copysign...). A name missing here raises
# AttributeError saying so: add it when CuPy 14 has it. The ndarray's operators and
# methods are its own (CuPy's ndarray API).
UFUNC_NAMES = """
absolute add arcsinh arctan arctan2 bitwise_and bitwise_or bitwise_xor ceil copysign cos cosh divide divmod
equal exp expm1 floor floor_divide fmin greater greater_equal invert isnan left_shift less less_equal log
log10 log1p log2 logaddexp maximum minimum multiply negative not_equal positive power reciprocal remainder
right_shift sign sin sinh sqrt square subtract tanh
tan arcsin arccos arccosh arctanh cbrt exp2 isfinite nextafter trunc
""".split()

UFUNCS = {name: ufunc(getattr(np, name)) for name in UFUNC_NAMES}
UFUNCS["abs"] = UFUNCS["absolute"]
UFUNCS["true_divide"] = UFUNCS["divide"]  # one ufunc in NumPy and CuPy


# ---------------------------------------------------------------------------------------
# Generic array functions
# ---------------------------------------------------------------------------------------


def _function(name, np_fn=None, library=None, module="cupy"):
    np_fn = np_fn or getattr(np, name)
    qualname = f"{module}.{name}"

    def fn(*args, **kwargs):
        used(qualname)
        lib = library(*args, **kwargs) if callable(library) else library
        out = kwargs.get("out")
        if out is not None and type(out) is not ndarray:
            raise TypeError(f"cupy.{name}: 'out' must be a cupy.ndarray")
        result = launch(name, np_fn, args, kwargs, library=lib)
        if out is not None:
            return out
        return _check_dtype(result) if type(result) is ndarray else result

    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = module
    return fn


def _float_gemm(*args, **kwargs):
    """cuBLAS when the product is of floats (CuPy's integer products are its own kernels)."""
    arrays = [a for a in args if type(a) is ndarray]
    if arrays and np.result_type(*[a.dtype for a in arrays]).kind in "fc":
        return "cublas"
    return None



FUNCTION_NAMES = """
argmax argmin broadcast_to concatenate cumprod cumsum empty_like flip max mean min moveaxis pad round squeeze
stack std sum tril zeros_like
conj ones_like swapaxes take_along_axis triu
""".split()

FUNCTIONS = {name: _function(name) for name in FUNCTION_NAMES}
FUNCTIONS["matmul"] = _function("matmul", library=_float_gemm)


def _stable(name):
    """CuPy sorts stably whatever ``kind`` says (thrust's stable sort)."""
    np_fn = getattr(np, name)
    inner = _function(name, lambda a, axis=-1, kind=None, order=None: np_fn(a, axis=axis, kind="stable"))

    def fn(a, axis=-1, kind=None, order=None):
        if order is not None:
            raise NotImplementedError(f"cupy.{name}: order is not supported")
        return inner(a, axis=axis)

    fn.__name__ = name
    return fn


FUNCTIONS["sort"] = _stable("sort")
FUNCTIONS["argsort"] = _stable("argsort")


def _with_device_indices(name, position, np_fn=None):
    """A function whose index operand may come from the host (CuPy's ``core.array``
    copies it to the device, as an index in ``x[...]``)."""
    inner = _function(name, np_fn)

    def fn(*args, **kwargs):
        args = list(args)
        if len(args) > position and type(args[position]) is np.ndarray:
            args[position] = _index_one(args[position])
        elif "indices" in kwargs and type(kwargs["indices"]) is np.ndarray:
            kwargs["indices"] = _index_one(kwargs["indices"])
        return inner(*args, **kwargs)

    fn.__name__ = name
    return fn


FUNCTIONS["take"] = _with_device_indices("take", 1, lambda *a, **k: _take(*a, **k))


def _data_dependent(name, np_fn=None):
    """A function whose output shape depends on the values: CuPy reads a count back."""
    inner = _function(name, np_fn)

    def fn(*args, **kwargs):
        host_read(f"cupy.{name} (a data-dependent shape)")
        return inner(*args, **kwargs)

    fn.__name__ = name
    return fn


FUNCTIONS["nonzero"] = _data_dependent("nonzero")


def where(condition, x=None, y=None):
    used("cupy.where")
    if x is None and y is None:
        return FUNCTIONS["nonzero"](condition)
    return launch("where", np.where, (condition, x, y))


FUNCTIONS["where"] = where


def copyto(dst, src, casting="same_kind", where=None):
    used("cupy.copyto")
    if type(dst) is not ndarray:
        raise TypeError("copyto: dst must be a cupy.ndarray")
    if type(src) is np.ndarray:
        if src.size != 1:
            raise ValueError("non-scalar numpy.ndarray cannot be used for copyto")
        src = src.reshape(())[()]
    args = (dst, src) if where is None else (dst, src, where)

    def run(d, s, w=True):
        np.copyto(d, s, casting=casting, where=w)

    run(*unwrap(args))
    record("copyto", run, args)


FUNCTIONS["copyto"] = copyto


# ---------------------------------------------------------------------------------------
# Creation and transfer
# ---------------------------------------------------------------------------------------


def _creation(name, np_fn=None):
    np_fn = np_fn or getattr(np, name)

    def fn(*args, **kwargs):
        used(f"cupy.{name}")
        for v in list(args) + list(kwargs.values()):
            if type(v) is np.ndarray and v.ndim:
                raise ValueError(f"cupy.{name}: a non-scalar numpy.ndarray argument")
        kwargs.pop("like", None)
        return _check_dtype(launch(name, np_fn, args, kwargs))

    fn.__name__ = name
    return fn


for _name in ("zeros", "ones", "empty", "full", "arange", "eye", "tri"):
    FUNCTIONS[_name] = _creation(_name)


def _is_all_cupy_sequence(obj):
    """CuPy's _compute_concat_info_impl: a nested sequence of stand-in arrays of one shape."""
    if type(obj) is ndarray:
        return obj.shape
    if isinstance(obj, (list, tuple)) and obj:
        shapes = [_is_all_cupy_sequence(e) for e in obj]
        if any(s is None for s in shapes) or len(set(shapes)) != 1:
            return None
        return (len(obj),) + shapes[0]
    return None


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False):
    used("cupy.array")
    return _array(obj, dtype, copy, order, ndmin)


def _array(obj, dtype=None, copy=True, order="K", ndmin=0):
    """CuPy's ``array``: a stand-in array (copied or cast on the device), a nested
    sequence of stand-in arrays (concatenated on the device), or host data (a host->device
    copy; a sequence mixing host and device data goes through ``numpy.array``, which
    refuses the device arrays)."""
    if type(obj) is ndarray:
        def conv(a):
            b = a.astype(dtype or a.dtype, order="C" if order in ("K", "A", None) else order, copy=bool(copy))
            return b if ndmin <= b.ndim else b.reshape((1,) * (ndmin - b.ndim) + b.shape)
        if not copy and (dtype is None or np.dtype(dtype) == obj.dtype) and ndmin <= obj.ndim:
            return obj
        return launch("array", conv, (obj,))
    if _is_all_cupy_sequence(obj) is not None:
        flat = _flatten(obj, [])
        return launch("array", lambda *xs: _restack(obj, iter(xs), dtype), tuple(flat))
    a = np.array(obj, dtype=dtype, copy=True, ndmin=ndmin)
    if a.dtype.kind in "OUSMmV":
        raise ValueError(f"Unsupported dtype {a.dtype}")
    if a.ndim == 0:  # CuPy fills a 0-d array with the value: a kernel, no copy
        value = a[()]
        return launch("fill", lambda: np.full((), value, dtype=a.dtype))
    host_to_device("cupy.array of host data")
    return ndarray._wrap(a)


def _flatten(obj, out):
    if type(obj) is ndarray:
        out.append(obj)
    else:
        for e in obj:
            _flatten(e, out)
    return out


def _restack(obj, it, dtype):
    if type(obj) is ndarray:
        return next(it)
    out = np.stack([_restack(e, it, None) for e in obj])
    return out if dtype is None else out.astype(dtype)


def asarray(a, dtype=None, order=None, *, copy=None, blocking=False):
    used("cupy.asarray")
    return _array(a, dtype=dtype, copy=bool(copy), order=order)


def ascontiguousarray(a, dtype=None):
    used("cupy.ascontiguousarray")
    if type(a) is not ndarray:
        raise TypeError(f"Argument 'a' has incorrect type (expected cupy.ndarray, got {type(a).__name__})")
    if a.flags.c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    return launch("ascontiguousarray", lambda x: np.ascontiguousarray(x, dtype=dtype), (a,))


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    used("cupy.asnumpy")
    if type(a) is ndarray:
        return a.get(stream=stream, order=order, out=out)
    return np.asarray(a, order=order)


for _f in (array, asarray, ascontiguousarray, copyto, where, asnumpy):
    FUNCTIONS[_f.__name__] = _f


# ndarray methods that are NumPy's methods of the same name (CuPy's ndarray API); argsort
# and take as CuPy's (stable; host indices copied to the device)
def _method(name):
    if name == "argsort":
        inner = FUNCTIONS["argsort"]
    elif name == "take":
        inner = FUNCTIONS["take"]
    else:
        method = getattr(np.ndarray, name)
        inner = _function(name, lambda a, *args, **kwargs: method(a, *args, **kwargs), module="ndarray")
    return inner


# ---------------------------------------------------------------------------------------
# Indexing
# ---------------------------------------------------------------------------------------


def _index(key):
    """CuPy's _prepare_slice_list: lists and NumPy arrays in an index become device arrays
    (an explicit host->device copy); stand-in arrays stay."""
    if isinstance(key, tuple):
        return tuple(_index_one(k) for k in key)
    return _index_one(key)


def _index_one(k):
    if k is None or k is Ellipsis or isinstance(k, slice) or type(k) is ndarray:
        return k
    if isinstance(k, (list, tuple, np.ndarray)) or isinstance(k, (bool, np.bool_)):
        host_to_device("an index array made on the host")
        a = np.asarray(k)
        if isinstance(k, list) and a.size == 0:
            a = a.astype(np.int32)
        if a.dtype.kind not in "biu":
            raise IndexError("arrays used as indices must be of integer or boolean type "
                             f"(actual: {a.dtype.type})")
        return ndarray._wrap(a)
    if np.isscalar(k) or (hasattr(k, "__index__") and not hasattr(k, "shape")):
        return k
    raise IndexError("only integers, slices (`:`), ellipsis (`...`), numpy.newaxis (`None`) and integer or "
                     "boolean arrays are valid indices")


def _has_mask(key):
    keys = key if isinstance(key, tuple) else (key,)
    return any(type(k) is ndarray and k.dtype == np.bool_ for k in keys)


def _has_advanced(key):
    keys = key if isinstance(key, tuple) else (key,)
    return any(type(k) is ndarray for k in keys)


# NOTE [CuPy wraps integer-array indices]
# CuPy does not check integer index arrays against the axis: its gather (``take``, ``x[i]``)
# and scatter kernels (``x[i] = v``, ``cupyx.scatter_add``) take the index modulo the
# axis's size (``_routines_indexing.pyx``: ``out_i = indices % index_range; if (out_i < 0)
# out_i += index_range``; docs/source/user_guide/difference.rst: "CuPy wraps around
# them"), where NumPy raises IndexError. A scalar integer index is still checked.
def _wrapped(shape, key):
    """``key`` with each integer index array taken modulo the size of the axis it indexes."""
    keys = key if isinstance(key, tuple) else (key,)
    consumed = sum(k.ndim if isinstance(k, np.ndarray) and k.dtype == np.bool_ else
                   0 if k is None or k is Ellipsis else 1 for k in keys)
    out, d = [], 0
    for k in keys:
        if k is Ellipsis:
            d += len(shape) - consumed
        elif k is None:
            pass
        elif isinstance(k, np.ndarray) and k.dtype == np.bool_:
            d += k.ndim
        else:
            if isinstance(k, np.ndarray) and k.dtype.kind in "iu" and d < len(shape) and shape[d] > 0:
                k = np.mod(k, shape[d])
            d += 1
        out.append(k)
    return tuple(out) if isinstance(key, tuple) else out[0]


def _take(a, indices, axis=None, out=None):
    """CuPy's ``take``: indices wrap (NOTE [CuPy wraps integer-array indices])."""
    return np.take(a, indices, axis=axis, out=out, mode="wrap")


def _getitem(a, key):
    key = _wrapped(a.shape, key)
    out = a[key]
    if isinstance(out, np.generic):  # CuPy returns a 0-d view
        keys = key if isinstance(key, tuple) else (key,)
        out = a[keys + (Ellipsis,)]
    return out


def getitem(x, key):
    used("ndarray.__getitem__")
    key = _index(key)
    if _has_mask(key):
        host_read("boolean-mask indexing (a data-dependent shape)")
    return launch("getitem", _getitem, (x, key))


def _value(v):
    """An assigned value: stand-in arrays, scalars; NumPy arrays are copied to the device
    (CuPy's core.array in _scatter_op_single)."""
    if type(v) is np.ndarray:
        host_to_device("a host array assigned into a device array")
        return ndarray._wrap(np.array(v))
    return v


def setitem(x, key, value):
    used("ndarray.__setitem__")
    key = _index(key)
    if _has_advanced(key):
        if _has_mask(key):
            host_read("boolean-mask assignment (a data-dependent shape)")
        value = _value(value)
    elif type(value) is np.ndarray:
        if value.ndim:  # CuPy: y.fill(value) refuses CPU arrays (gh-2079)
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        value = value.reshape(())[()]
    elif type(value) is not ndarray and not np.isscalar(value):
        raise TypeError(f"Unsupported type {type(value)}")

    def run(a, k, v):
        a[_wrapped(a.shape, k)] = v

    run(x._a, unwrap(key), unwrap(value))
    record("setitem", run, (x, key, value))
