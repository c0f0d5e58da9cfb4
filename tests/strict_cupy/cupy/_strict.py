"""The core of the strict CuPy stand-in: the array type, the one place every "kernel"
runs (:func:`launch`), the device->host ledger and the state of stream capture.

An :class:`ndarray` wraps a NumPy array (``_a``) and refuses what ``cupy.ndarray``
refuses: ``__array__`` raises ``TypeError`` (so ``numpy.asarray(x)`` does), there is no
``__array_interface__`` or buffer, NumPy arrays as operands of its ufuncs and functions
raise ``TypeError`` as CuPy's ``_preprocess_args`` does, binary operators defer by
``__array_priority__`` as ``_should_use_rop`` does, and every device->host read (``get``,
``item``, ``int()``, ``bool()``, ``repr``, a data-dependent shape) is counted per call
site. While a stream of this thread is being captured, a device->host read and a call of
cuBLAS, cuSOLVER or cuRAND raise (as CuPy 14 and CUDA do) and are recorded as refusals;
every launch is recorded into the graph, which ``Graph.launch`` replays on the same
buffers.
"""
import collections
import os
import sys
import threading
import weakref

import numpy as np

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/strict_cupy

# ---------------------------------------------------------------------------------------
# The ledger: device->host reads per call site, refusals, graphs
# ---------------------------------------------------------------------------------------

_lock = threading.Lock()
_host_reads = collections.Counter()
_refusals = []
_graphs = []
_used = collections.Counter()  # the CuPy names called (the surface cuvmap and the tests use)
_tls = threading.local()


class CUDARuntimeError(RuntimeError):
    """``cupy.cuda.runtime.CUDARuntimeError``: a CUDA runtime call failed."""

    def __init__(self, status, message):
        self.status = status
        super().__init__(f"{status}: {message}")


def call_site(skip_numpy=True):
    """``"path:line (function)"`` of the first frame outside the stand-in (and outside
    NumPy, whose dispatch calls back into the stand-in)."""
    f = sys._getframe(1)
    numpy_dir = os.path.dirname(np.__file__)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_HERE) and not (skip_numpy and name.startswith(numpy_dir)):
            break
        f = f.f_back
    if f is None:
        return "?"
    name = f.f_code.co_filename
    root = os.path.dirname(os.path.dirname(_HERE))
    if name.startswith(root + os.sep):
        name = os.path.relpath(name, root)
    return f"{name}:{f.f_lineno} ({f.f_code.co_name})"


def capture():
    """The capture in progress on this thread (a ``_Capture``), or None."""
    return getattr(_tls, "capture", None)


def refuse(kind, what, exc):
    """Records a refusal during capture, invalidates the capture and raises ``exc``."""
    cap = capture()
    site = call_site()
    with _lock:
        _refusals.append({"kind": kind, "what": what, "site": site})
    if cap is not None:
        cap.invalidated = cap.invalidated or f"{what} at {site}"
    raise exc


def host_read(what):
    """A device->host read: counted at its call site; refused during capture."""
    if capture() is not None:
        refuse("host read", what, CUDARuntimeError(
            "cudaErrorStreamCaptureUnsupported", f"operation not permitted when stream is capturing ({what})"))
    site = call_site()
    with _lock:
        _host_reads[site] += 1


def host_to_device(what):
    """A host->device copy of host data: a capture would bake the host address (or refuse
    the synchronous copy), so it is refused during capture; allowed otherwise."""
    if capture() is not None:
        refuse("host->device copy", what, CUDARuntimeError(
            "cudaErrorStreamCaptureUnsupported", f"operation not permitted when stream is capturing ({what})"))


LIBRARIES = {"cublas": "cuBLAS", "cusolver": "cuSOLVER", "curand": "cuRAND"}


def library_call(lib, what):
    """A call of a CUDA library that CuPy 14 refuses during stream capture."""
    if capture() is not None:
        name = LIBRARIES[lib]
        refuse(name, what, NotImplementedError(
            f"calling {name} API during stream capture is currently unsupported ({what})"))


def used(name):
    _used[name] += 1


def surface():
    """{CuPy name: calls} of the functions, ufuncs and methods called since the process
    started (never reset): the surface the stand-in must implement."""
    with _lock:
        return dict(_used)


def host_reads():
    """{call site: count} of device->host reads since the last :func:`reset`."""
    with _lock:
        return dict(_host_reads)


def refusals():
    """The refusals recorded during captures since the last :func:`reset`: dicts with
    ``kind`` (host read, cuBLAS, cuSOLVER, cuRAND, host->device copy, allocation, cuBLAS on
    a stream that is not captured), ``what`` and ``site``."""
    with _lock:
        return list(_refusals)


def graphs():
    """The graphs captured since the last :func:`reset` (``cupy.cuda.graph.Graph``)."""
    with _lock:
        return list(_graphs)


def reset():
    with _lock:
        _host_reads.clear()
        _refusals.clear()
        _graphs.clear()


def _add_graph(g):
    with _lock:
        _graphs.append(g)


# ---------------------------------------------------------------------------------------
# Memory by address
# ---------------------------------------------------------------------------------------

# NOTE [the stand-in's addresses]
# A stand-in array's device address (``ndarray.data.ptr``) is the address of its NumPy
# buffer, and pinned host memory (``runtime.hostAlloc``) is a NumPy buffer too, so an
# address handed to an emulated C library (cuBLAS: cupy/_libcublas.py) or wrapped by
# ``ndarray(memptr=...)`` is found here: the arrays whose address was taken are registered
# (weakly; strongly while a capture records, since its graph replays on those addresses),
# and an access outside every registered buffer is an illegal address, as on a GPU.
_memory = {}  # start address -> (end address, a callable giving the owning NumPy array or None)


def _owner(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def register_memory(a, keep=False):
    """Registers the buffer of the NumPy array ``a`` (its owner's whole buffer)."""
    root = _owner(a)
    start = root.__array_interface__["data"][0]
    if keep:
        ref = (lambda r=root: r)
    else:
        ref = weakref.ref(root)
    with _lock:
        if len(_memory) > 4096:
            for k in [k for k, (_, r) in _memory.items() if r() is None]:
                del _memory[k]
        _memory[start] = (start + root.nbytes, ref)
    cap = capture()
    if cap is not None:
        cap.keep.append(root)


def forget_memory(start):
    with _lock:
        _memory.pop(start, None)


def memory_at(ptr, nbytes):
    """``(owner, offset)``: the registered NumPy array whose buffer holds the ``nbytes``
    bytes at ``ptr``, and the byte offset of ``ptr`` in it; an address outside every
    registered buffer raises ``cudaErrorIllegalAddress``."""
    with _lock:
        items = list(_memory.items())
    for start, (end, ref) in items:
        if start <= ptr and ptr + max(int(nbytes), 0) <= end:
            root = ref()
            if root is not None:
                return root, ptr - start
    raise CUDARuntimeError("cudaErrorIllegalAddress",
                           f"an illegal memory access was encountered ({int(nbytes)} bytes at {ptr:#x} lie outside "
                           "every device buffer)")


# ---------------------------------------------------------------------------------------
# Operands
# ---------------------------------------------------------------------------------------


def _unsupported(x):
    # CuPy's _preprocess_args -> CScalar(arg): "Unsupported type <class 'numpy.ndarray'>"
    return TypeError(f"Unsupported type {type(x)}")


def unwrap(x, depth=2):
    """The NumPy array under a stand-in array; NumPy arrays raise (they would be an
    implicit host->device transfer); lists and tuples are looked into ``depth`` levels."""
    t = type(x)
    if t is ndarray:
        return x._a
    if t is np.ndarray:
        raise _unsupported(x)
    if depth and (t is list or t is tuple):
        return t(unwrap(e, depth - 1) for e in x)
    return x


def wrap(x):
    """NumPy results as stand-in arrays: a NumPy scalar becomes a 0-d array (CuPy never
    returns NumPy scalars from its kernels)."""
    t = type(x)
    if t is np.ndarray:
        return ndarray._wrap(x)
    if isinstance(x, np.generic):
        return ndarray._wrap(np.asarray(x))
    if t is list:
        return [wrap(e) for e in x]
    if isinstance(x, tuple):  # NumPy's named results (SVDResult...) are CuPy's plain tuples
        return tuple(wrap(e) for e in x)
    return x


def _arrays_in(x, out):
    if type(x) is ndarray:
        out.append(x)
    elif type(x) in (list, tuple):
        for e in x:
            _arrays_in(e, out)
    elif type(x) is dict:
        for e in x.values():
            _arrays_in(e, out)
    return out


class _Node:
    """One launch recorded in a graph: ``fn`` re-run on the current contents of its
    operands, its fresh results written into the buffers they had when captured.
    ``allocated``: the results that are new buffers (not views of an operand, not an
    operand written in place), which hold garbage until the graph is launched."""

    __slots__ = ("name", "fn", "args", "kwargs", "results", "allocated")

    def __init__(self, name, fn, args, kwargs, results):
        self.name, self.fn, self.args, self.kwargs, self.results = name, fn, args, kwargs, results
        inputs = [a._a for a in _arrays_in((args, kwargs), [])]
        self.allocated = [r for r in results if not any(np.may_share_memory(r._a, i) for i in inputs)]

    def replay(self):
        args = unwrap(self.args, depth=3)
        kwargs = {k: unwrap(v, depth=3) for k, v in self.kwargs.items()}
        with np.errstate(all="ignore"):
            out = self.fn(*args, **kwargs)
        fresh = _arrays_in(wrap(out), [])
        inputs = [a._a for a in _arrays_in((self.args, self.kwargs), [])]
        for old, new in zip(self.results, fresh):
            if any(np.may_share_memory(new._a, i) for i in inputs):
                continue  # a view of an operand (or the operand written in place)
            np.copyto(old._a, new._a, casting="unsafe")

    def __repr__(self):
        return f"<node {self.name}>"


def launch(name, fn, args=(), kwargs=None, library=None, check=True):
    """Runs the "kernel" ``fn`` (a NumPy function) on the unwrapped operands and wraps its
    results; ``library`` (cublas, cusolver, curand) is refused during capture. During a
    capture the launch is recorded into the graph."""
    kwargs = kwargs or {}
    if library is not None:
        library_call(library, name)
    if check:
        uargs = unwrap(args)
        ukwargs = {k: unwrap(v) for k, v in kwargs.items()}
    else:
        uargs, ukwargs = args, kwargs
    out = wrap(fn(*uargs, **ukwargs))
    cap = capture()
    if cap is not None:
        cap.nodes.append(_Node(name, fn, args, kwargs, _arrays_in(out, [])))
    return out


def record(name, fn, args=(), kwargs=None):
    """Records, during a capture, an in-place launch that has already run (``fn`` re-runs
    it on the stand-in arrays in ``args``)."""
    cap = capture()
    if cap is not None:
        cap.nodes.append(_Node(name, fn, args, kwargs or {}, []))


# ---------------------------------------------------------------------------------------
# The array
# ---------------------------------------------------------------------------------------


def _should_use_rop(x, y):
    # CuPy's _should_use_rop: NEP 13, then __array_priority__
    y_ufunc = getattr(y, "__array_ufunc__", _should_use_rop)
    if y_ufunc is not _should_use_rop:
        return y_ufunc is None
    return getattr(x, "__array_priority__", 0) < getattr(y, "__array_priority__", 0)


def _binop(name, reflected_name=None):
    def op(self, other):
        import cupy
        ufunc = getattr(cupy, name)
        if type(other) is ndarray:
            return ufunc(self, other)
        if _should_use_rop(self, other):
            return NotImplemented
        return getattr(np, name)(self, other)

    def rop(self, other):
        import cupy
        return getattr(cupy, name)(other, self)

    def iop(self, other):
        import cupy
        return getattr(cupy, name)(self, other, out=self)

    return op, rop, iop


def _compare(name):
    def op(self, other):
        import cupy
        if type(other) is ndarray:
            return getattr(cupy, name)(self, other)
        if _should_use_rop(self, other):
            return NotImplemented
        if type(other) is np.ndarray and other.ndim == 0:
            other = other.item()
        if name in ("equal", "not_equal") and (other is None or type(other).__eq__ is object.__eq__):
            return cupy.full(self.shape, name == "not_equal", dtype=bool)
        return getattr(np, name)(self, other)
    return op


class _Flags:
    def __init__(self, a):
        self._a = a

    c_contiguous = property(lambda self: self._a.flags.c_contiguous)
    f_contiguous = property(lambda self: self._a.flags.f_contiguous)
    owndata = property(lambda self: self._a.base is None)
    writeable = True

    def __getitem__(self, key):
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous,
                "OWNDATA": self.owndata}[key]


class UnownedMemory:
    """``cupy.cuda.UnownedMemory``: memory allocated elsewhere (``owner`` keeps it alive)."""

    def __init__(self, ptr, size, owner, device_id=None):
        self.ptr, self.size, self.owner = int(ptr), int(size), owner
        self.device_id = 0 if device_id is None else int(device_id)


class MemoryPointer:
    """``cupy.cuda.MemoryPointer``: a device address (here the NumPy buffer's, NOTE [the
    stand-in's addresses]); ``MemoryPointer(mem, offset)`` as CuPy's, or a bare address."""

    def __init__(self, mem, offset=0, device_id=0):
        if hasattr(mem, "ptr"):
            self.mem = mem
            self.ptr = mem.ptr + int(offset)
            self.device_id = getattr(mem, "device_id", device_id)
        else:
            self.mem = None
            self.ptr = int(mem) + int(offset)
            self.device_id = device_id

    def __int__(self):
        return self.ptr


class ndarray:
    """``cupy.ndarray`` over a NumPy array (see the module docstring for what it refuses)."""

    __slots__ = ("_a", "__weakref__")
    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is None:
            self._a = np.empty(shape, dtype=dtype, order=order)
            return
        # an array on memory allocated elsewhere (NOTE [the stand-in's addresses])
        probe = np.empty(shape, dtype=dtype, order=order) if strides is None else None
        strides = probe.strides if strides is None else tuple(strides)
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        extent = max([0] + [(n - 1) * abs(st) for n, st in zip(shape, strides) if n]) + np.dtype(dtype).itemsize
        root, offset = memory_at(memptr.ptr, extent)
        self._a = np.ndarray(shape, dtype=dtype, buffer=root, offset=offset, strides=strides)

    @classmethod
    def _wrap(cls, a):
        obj = object.__new__(cls)
        obj._a = a
        return obj

    # -- what CuPy refuses ---------------------------------------------------------------

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    # -- attributes ----------------------------------------------------------------------

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: _Flags(self._a))
    @property
    def data(self):
        register_memory(self._a)  # NOTE [the stand-in's addresses]
        return MemoryPointer(self._a.__array_interface__["data"][0])
    base = property(lambda self: None if self._a.base is None else ndarray._wrap(self._a.base))

    @shape.setter
    def shape(self, value):
        self._a.shape = value

    @property
    def device(self):
        from cupy import cuda
        return cuda.Device(0)

    @property
    def T(self):
        return launch("transpose", np.transpose, (self,))

    @property
    def mT(self):
        return launch("matrix_transpose", lambda a: np.swapaxes(a, -1, -2), (self,))

    @property
    def real(self):
        return launch("real", np.real, (self,))

    @property
    def imag(self):
        return launch("imag", np.imag, (self,))

    # -- device->host --------------------------------------------------------------------

    def get(self, stream=None, order="C", out=None, blocking=True):
        host_read("ndarray.get")
        if out is not None:
            np.copyto(out, self._a)
            return out
        return np.array(self._a, order=order)

    def item(self, *args):
        host_read("ndarray.item")
        return self._a.item(*args)

    def tolist(self):
        host_read("ndarray.tolist")
        return self._a.tolist()

    def __int__(self):
        host_read("int(ndarray)")
        return int(self._a)

    def __float__(self):
        host_read("float(ndarray)")
        return float(self._a)

    def __complex__(self):
        host_read("complex(ndarray)")
        return complex(self._a)

    def __bool__(self):
        if self.size == 0:
            return False
        if self.size == 1:
            host_read("bool(ndarray)")
            return bool(self._a.reshape(()))
        raise ValueError("The truth value of an array with more than one element is ambiguous. "
                         "Use a.any() or a.all()")

    def __repr__(self):
        host_read("repr(ndarray)")
        return repr(self._a)

    def __str__(self):
        host_read("str(ndarray)")
        return str(self._a)

    def __format__(self, spec):
        host_read("format(ndarray)")
        return format(self._a, spec)

    def set(self, arr, stream=None):
        if type(arr) is not np.ndarray:
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, not {type(arr)}")
        host_to_device("ndarray.set")
        self._a[...] = arr

    # -- container -----------------------------------------------------------------------

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of unsized object")
        return self._a.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self._a.shape[0]))

    def __getitem__(self, key):
        from cupy import _functions
        return _functions.getitem(self, key)

    def __setitem__(self, key, value):
        from cupy import _functions
        _functions.setitem(self, key, value)

    # -- NumPy interoperation (CuPy's __array_ufunc__ and __array_function__) -------------

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        import cupy
        inout = inputs
        if "out" in kwargs:
            out = kwargs["out"]
            if len(out) != 1:
                raise ValueError("The 'out' parameter must have exactly one array value")
            inout += out
            kwargs["out"] = out[0]
        if method not in ("__call__", "outer", "at", "reduce", "accumulate", "reduceat"):
            return NotImplemented
        name = ufunc.__name__
        try:
            func = getattr(cupy, name, None)
            if func is None:  # SciPy's special functions are cupyx.scipy.special's
                import cupyx.scipy.special
                func = getattr(cupyx.scipy.special, name)
            if method != "__call__":
                func = getattr(func, method)
        except (AttributeError, ImportError):
            return NotImplemented
        for x in inout:
            if not (isinstance(x, (int, float, complex, bool, np.generic, ndarray, np.ndarray))):
                return NotImplemented
        if name in ("greater", "greater_equal", "less", "less_equal", "equal", "not_equal"):
            inputs = tuple(x.item() if type(x) is np.ndarray and x.ndim == 0 else x for x in inputs)
        return func(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        import cupy
        try:
            module = cupy
            for part in func.__module__.split(".")[1:]:
                module = getattr(module, part)
            cupy_func = getattr(module, func.__name__)
        except AttributeError:
            return NotImplemented
        if cupy_func is func:
            return NotImplemented
        for t in types:
            if not issubclass(t, (ndarray, np.ndarray)):
                return NotImplemented
        return cupy_func(*args, **kwargs)

    # -- operators -----------------------------------------------------------------------

    __add__, __radd__, __iadd__ = _binop("add")
    __sub__, __rsub__, __isub__ = _binop("subtract")
    __mul__, __rmul__, __imul__ = _binop("multiply")
    __truediv__, __rtruediv__, __itruediv__ = _binop("true_divide")
    __floordiv__, __rfloordiv__, __ifloordiv__ = _binop("floor_divide")
    __mod__, __rmod__, __imod__ = _binop("remainder")
    __pow__, __rpow__, __ipow__ = _binop("power")
    __and__, __rand__, __iand__ = _binop("bitwise_and")
    __or__, __ror__, __ior__ = _binop("bitwise_or")
    __xor__, __rxor__, __ixor__ = _binop("bitwise_xor")
    __lshift__, __rlshift__, __ilshift__ = _binop("left_shift")
    __rshift__, __rrshift__, __irshift__ = _binop("right_shift")
    __matmul__, __rmatmul__ = _binop("matmul")[:2]
    __lt__ = _compare("less")
    __le__ = _compare("less_equal")
    __gt__ = _compare("greater")
    __ge__ = _compare("greater_equal")
    __eq__ = _compare("equal")
    __ne__ = _compare("not_equal")
    __hash__ = None

    __divmod__, __rdivmod__ = _binop("divmod")[:2]
    def __neg__(self):
        import cupy
        return cupy.negative(self)

    def __pos__(self):
        import cupy
        return self.copy() if self.dtype == np.bool_ else cupy.positive(self)

    def __abs__(self):
        import cupy
        return cupy.absolute(self)

    def __invert__(self):
        import cupy
        return cupy.invert(self)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        host_read("pickle(ndarray)")
        import cupy
        return cupy.array, (np.array(self._a),)

    # -- methods (kernels) ----------------------------------------------------------------

    def copy(self, order="C"):
        return launch("copy", lambda a: np.array(a, order=order, copy=True), (self,))

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        kw = {} if casting is None else {"casting": casting}
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return launch("astype", lambda a: a.astype(dtype, order=order, copy=True, **kw), (self,))

    def view(self, dtype=None, type=None):
        if dtype is None:
            return launch("view", lambda a: a.view(), (self,))
        return launch("view", lambda a: a.view(dtype), (self,))

    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return launch("reshape", lambda a: a.reshape(shape, order=order), (self,))

    def transpose(self, *axes):
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = axes[0]
        return launch("transpose", lambda a: a.transpose(axes or None), (self,))

    def fill(self, value):
        if type(value) is ndarray or type(value) is np.ndarray:
            raise TypeError(f"Unsupported type {type(value)}")
        self._a.fill(value)
        record("fill", lambda a: a.fill(value), (self,))

    def dot(self, b, out=None):
        import cupy
        return cupy.dot(self, b, out=out)

    def sort(self, axis=-1, kind=None):
        self._a.sort(axis=axis, kind="stable")
        record("sort", lambda a: a.sort(axis=axis, kind="stable"), (self,))

    def flatten(self, order="C"):
        return launch("flatten", lambda a: a.flatten(order), (self,))

    def nonzero(self):
        import cupy
        return cupy.nonzero(self)

    def __getattr__(self, name):
        # the rest of ndarray's methods (CuPy's ndarray API)
        if name in _METHODS:
            from cupy import _functions
            fn = _functions._method(name)
            return lambda *args, **kwargs: fn(self, *args, **kwargs)
        raise AttributeError(f"'cupy.ndarray' object (strict CuPy stand-in) has no attribute {name!r}")


# ndarray methods that are cupy functions with the array first
_METHODS = frozenset("""
all any argmax argmin argsort clip conj conjugate cumprod cumsum diagonal max mean min
prod ptp ravel repeat round squeeze std sum swapaxes take trace var partition argpartition
""".split())

ndarray.__module__ = "cupy"
ndarray.__qualname__ = ndarray.__name__ = "ndarray"
