"""The interpreter stack: primitives, tracers, traces and ``bind``.

A *primitive* is a named operation with an impl (the bottom of the stack evaluates it on
concrete arrays), a shape rule, and rules for each transform (kept by the transform
modules). A *transform* (vmap, jvp, vjp) is an interpreter: while it runs it owns a
``MainTrace`` at some ``level`` of the stack, and the values it traces are *tracers* that
point to that main.

``prim.bind(*args, **params)`` finds the innermost transform that owns any operand (the
highest level among the tracers) and lets its trace process the primitive. The trace
applies its rule; the rule's own binds act on the values one level down, so each transform
sees only its own tracers and treats every other value as a constant. With no tracers the
impl runs directly: that is the eval interpreter.

Levels keep nested transforms apart: in ``grad(lambda x: grad(lambda y: x * y)(1.0))`` the
inner ``grad`` sees ``x`` as a constant, so perturbations never get confused. A tracer
whose main has been popped has *escaped* its transform; using it raises an error.
"""
import dis
import itertools
import sys
import threading
import weakref
from contextlib import contextmanager

import numpy as np

from cuvmap import backend
from cuvmap.errors import (  # noqa: F401
    ConcretizationError, CrossThreadTracerError, CuvmapError, EscapedTracerError, MissingRuleError, ShapeError,
)


# ---------------------------------------------------------------------------------------
# Avals: the abstract value of an operand (shape and dtype)
# ---------------------------------------------------------------------------------------


class _ShapeProperties:
    """``ndim`` and ``size`` from ``shape``, as arrays have them (avals, shape structs,
    tracers)."""

    __slots__ = ()

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))


class ShapedArray(_ShapeProperties):
    """Shape, dtype and device of a value. ``weak_type`` marks Python scalars, which adopt
    the dtype of the arrays they meet (NumPy 2's NEP 50 rule, as in JAX). ``device`` is
    ``"cpu"``, ``"gpu:<id>"``, or ``None`` where it is not known (the avals shape rules
    return). All four take part in equality and hashing: a program staged for a weak
    ``2.0`` must not be reused for a float64 array, nor one staged on the CPU for a GPU."""

    __slots__ = ("shape", "dtype", "weak_type", "device")

    def __init__(self, shape, dtype, weak_type=False, device=None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.weak_type = weak_type
        self.device = device

    def __eq__(self, other):
        return (
            isinstance(other, ShapedArray)
            and self.shape == other.shape
            and self.dtype == other.dtype
            and self.weak_type == other.weak_type
            and self.device == other.device
        )

    def __hash__(self):
        return hash((self.shape, self.dtype, self.weak_type, self.device))

    def __repr__(self):
        return f"{self.dtype.name}{list(self.shape)}"


_PY_SCALAR_DTYPES = {bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}


class ShapeDtypeStruct(_ShapeProperties):
    """A shape and a dtype standing for an array that is not there (``jax.ShapeDtypeStruct``):
    :func:`cuvmap.eval_shape` returns them, and ``eval_shape`` and ``make_jaxpr`` accept
    them wherever an array goes, so a program can be staged or its output shapes known
    without making any array (of any size). ``weak_type`` marks a Python scalar's aval;
    ``device`` is ``"cpu"`` (the default) or a GPU's (``"gpu:0"``)."""

    __slots__ = ("shape", "dtype", "weak_type", "device")

    def __init__(self, shape, dtype, *, weak_type=False, device=None):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.weak_type = bool(weak_type)
        self.device = "cpu" if device is None else device

    @property
    def aval(self):
        return ShapedArray(self.shape, self.dtype, self.weak_type, self.device)

    def __repr__(self):
        weak = ", weak_type=True" if self.weak_type else ""
        return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype.name}{weak})"

    def __eq__(self, other):
        return (type(other) is ShapeDtypeStruct and self.shape == other.shape and self.dtype == other.dtype
                and self.weak_type == other.weak_type and self.device == other.device)

    def __hash__(self):
        return hash((self.shape, self.dtype, self.weak_type, self.device))


def is_value(x):
    """Whether ``x`` is a value the transforms take as a leaf: a tracer, an array (NumPy,
    CuPy, anything with a ``shape``) or a Python scalar (``bool``, ``int``, ``float``,
    ``complex``: the kinds :func:`get_aval` knows). A leaf that is not (a string, ``None``,
    a function) is an error of the caller's, or a static argument."""
    return isinstance(x, Tracer) or hasattr(x, "shape") or type(x) in _PY_SCALAR_DTYPES


def get_aval(x):
    """The :class:`ShapedArray` of an array, tracer or Python scalar."""
    if isinstance(x, Tracer):
        return x.aval
    t = type(x)
    if t in _PY_SCALAR_DTYPES:
        return ShapedArray((), _PY_SCALAR_DTYPES[t], weak_type=True)
    if t is ShapeDtypeStruct:
        return x.aval
    return ShapedArray(x.shape, x.dtype, device=backend.device_of(x))


def as_array(x):
    """``x`` itself when it is an array (NumPy or CuPy), else ``numpy.asarray(x)`` (impls
    that call array methods also accept Python scalars)."""
    return x if hasattr(x, "shape") else np.asarray(x)


def shape_of(x):
    """Shape of an array, tracer or Python scalar (``()``)."""
    return getattr(x, "shape", ())


def dtype_of(x):
    t = type(x)
    if t in _PY_SCALAR_DTYPES:
        return np.dtype(_PY_SCALAR_DTYPES[t])
    return np.dtype(x.dtype)


def is_float(x):
    """True for floating-point and complex arrays/tracers and Python floats and complex
    numbers (the differentiable kinds)."""
    t = type(x)
    if t is float or t is complex:
        return True
    if t is int or t is bool:
        return False
    return x.dtype.kind in "fc"


def common_float_dtype(*avals):
    """The one floating dtype that all ``avals`` share; :class:`ShapeError` otherwise (for
    primitives without type promotion, such as the conv and pooling families)."""
    dtypes = {a.dtype for a in avals}
    if len(dtypes) != 1:
        raise ShapeError("operands must share one dtype, got " + ", ".join(str(a.dtype) for a in avals))
    dtype = dtypes.pop()
    if dtype.kind != "f":
        raise ShapeError(f"operands must be floating point, got {dtype}")
    return dtype


# ---------------------------------------------------------------------------------------
# The interpreter stack
# ---------------------------------------------------------------------------------------


class MainTrace:
    """One active transform on the stack. ``global_data`` is the transform's state (the
    axis size for vmap, the tape for reverse mode); ``thread`` is the ident of the thread
    whose stack it is on (NOTE [one stack per thread])."""

    __slots__ = ("level", "trace", "global_data", "active", "name", "thread")

    def __init__(self, level, trace_type, global_data, name):
        self.level = level
        self.global_data = global_data
        self.active = True
        self.name = name
        self.thread = threading.get_ident()
        self.trace = trace_type(self)

    def __repr__(self):
        return f"MainTrace({self.name}, level={self.level})"

    def owns(self, x):
        """Whether ``x`` is a tracer of this transform (a value of any other level, or an
        array, is a constant to it)."""
        return isinstance(x, Tracer) and x._main is self


# NOTE [one stack per thread]
# Each thread has its own interpreter stack, as JAX's trace state is thread-local. A level
# is a position on one thread's stack, so it only orders transforms of that thread: with
# one process-global list, a transform returning in another thread would shrink the list
# under this one, and its next nested transform would get its outer one's level — ``bind``
# could then no longer tell them apart, and nested derivatives came out silently wrong.
# A tracer belongs to the thread whose transform made it; ``bind`` raises
# ``CrossThreadTracerError`` when another thread uses it.
class _ThreadState(threading.local):
    def __init__(self):
        self.trace_stack = []
        # the innermost staging transform (jit, make_jaxpr), or None (NOTE [staging owns
        # the values made from nothing])
        self.staging_main = None
        # the named axes in scope, innermost last (NOTE [named axes])
        self.axis_env = []
        # the names of the named scopes entered, outermost first (NOTE [named scopes])
        self.name_stack = ()


_state = _ThreadState()


def trace_stack():
    """The calling thread's interpreter stack (innermost transform last)."""
    return _state.trace_stack


@contextmanager
def new_main(trace_type, global_data=None, name="transform"):
    """Pushes a transform on the calling thread's interpreter stack for the duration of the
    block."""
    stack = _state.trace_stack
    main = MainTrace(len(stack) + 1, trace_type, global_data, name)
    stack.append(main)
    try:
        yield main
    finally:
        stack.pop()
        main.active = False


# NOTE [named axes]
# ``vmap(f, axis_name="i")`` and ``cuvmap.distributed``'s data parallelism bind a name to a
# mapped axis for as long as ``f`` runs: an :class:`AxisFrame` on the thread's axis
# environment, holding the axis size and either the batching transform that maps it
# (``main``) or the communicator of the processes that share it. Collectives (``psum``,
# ``all_gather``, ...) name the axis they act along. Under ``vmap`` the transform of that
# name must process them even when their operand is not one of its values (``psum`` of an
# unbatched value is ``size * x``): a primitive whose ``axis_mains(params)`` returns the
# frames' transforms makes ``bind`` consider them beside its operands' transforms (JAX's
# ``AxisPrimitive``). An unbound name is an error naming it.
class AxisFrame:
    """A named axis in scope: its ``name``, ``size``, and the batching transform that maps
    it (``main``, a :class:`MainTrace`) or the ``communicator`` of the processes along it."""

    __slots__ = ("name", "size", "main", "communicator")

    def __init__(self, name, size, main=None, communicator=None):
        self.name = name
        self.size = size
        self.main = main
        self.communicator = communicator

    def __repr__(self):
        return f"AxisFrame({self.name!r}, size={self.size})"


class UnboundAxisError(CuvmapError, NameError):
    """A collective named an axis that no enclosing ``vmap(axis_name=...)`` or process
    group binds."""


def axis_env():
    """The calling thread's named axes in scope, innermost last (NOTE [named axes])."""
    return _state.axis_env


@contextmanager
def extend_axis_env(frame):
    """Binds ``frame``'s name for the duration of the block (NOTE [named axes])."""
    env = _state.axis_env
    env.append(frame)
    try:
        yield frame
    finally:
        env.pop()


def axis_frame(name, what="a collective"):
    """The innermost :class:`AxisFrame` named ``name``; :class:`UnboundAxisError` when none
    is in scope (``what`` names the operation in the message)."""
    for frame in reversed(_state.axis_env):
        if frame.name == name:
            return frame
    bound = ", ".join(repr(f.name) for f in _state.axis_env) or "none"
    raise UnboundAxisError(
        f"{what} uses the axis name {name!r}, which is not bound here (axis names in scope: {bound}); "
        "bind it with vmap(..., axis_name=...) or cuvmap.distributed.data_parallel(..., axis_name=...)")


# NOTE [named scopes]
# ``cuvmap.named_scope("layer1")`` (as ``jax.named_scope``) pushes a name on the thread's
# name stack for the duration of a block; staging records the stack on every equation it
# stages (``JaxprEqn.name_stack``, a tuple of names, outermost first), and the text form
# of a program shows it (``c:f32[3] = sin b  # [layer1]``). Names never change what is
# computed, and eagerly they cost one tuple per scope entered. A staged program's names
# are relative to the function staged (staging starts from an empty stack), and running
# a program under the transforms (``ir.eval_jaxpr``: an inlined ``jit``, the programs
# that ``vmap``, ``jvp`` and ``grad`` derive) re-enters each equation's names below the
# current ones, so a jitted function called inside ``named_scope("outer")`` of another
# staged function shows ``outer/...``. Reverse mode records the stack with each tape
# entry and runs that entry's backward rules under ``transpose(<names>)``, the names
# below the stack at the backward pass's start (as JAX's ``transpose(jvp(...))``).
def name_stack():
    """The calling thread's name stack (NOTE [named scopes]): a tuple, outermost first."""
    return _state.name_stack


@contextmanager
def extend_name_stack(names):
    """Runs the block with ``names`` (a tuple) below the current name stack."""
    previous = _state.name_stack
    _state.name_stack = previous + tuple(names)
    try:
        yield
    finally:
        _state.name_stack = previous


def set_name_stack(names):
    """Makes ``names`` (a tuple) the thread's name stack; returns the previous one (for
    a loop that switches names per step, as the backward pass does)."""
    previous = _state.name_stack
    _state.name_stack = names
    return previous


@contextmanager
def new_name_stack(names=()):
    """Runs the block with the name stack ``names`` (staging starts from ``()``)."""
    previous = _state.name_stack
    _state.name_stack = tuple(names)
    try:
        yield
    finally:
        _state.name_stack = previous


class Trace:
    """Processes primitives for one ``MainTrace``. Subclasses define ``process_primitive``
    (an ordinary primitive: the transform's rule for it) and ``process_call`` (a call
    primitive, whose params hold a program: the trace turns its tracers into what the
    primitive's method for this transform takes, NOTE [call primitives] in
    :mod:`cuvmap.transforms.call`)."""

    __slots__ = ("main",)

    def __init__(self, main):
        self.main = main

    def process_primitive(self, primitive, args, params):
        raise NotImplementedError

    def process_call(self, primitive, args, params):
        raise MissingRuleError(f"{self.main.name} cannot process {primitive.name}, a call primitive")


class Tracer(_ShapeProperties):
    """A value being traced by a transform. Subclasses hold the transform's data and
    define ``shape``, ``dtype`` and ``_concrete_value``. Operators and array methods are
    attached by :mod:`cuvmap.numpy`."""

    __slots__ = ("_main",)
    # NOTE [binary operators with arrays]: a high ``__array_priority__`` and no
    # ``__array_ufunc__`` make ``ndarray + tracer`` (NumPy and CuPy alike) defer to
    # ``Tracer.__radd__``, while ``np.sin(tracer)`` and other NumPy functions reach
    # ``__array__`` and raise a ConcretizationError. (``__array_ufunc__ = None`` would
    # defer the operators too, but turn ``np.sin(tracer)`` into NumPy's bare TypeError.)
    __array_priority__ = 1000

    @property
    def aval(self):
        return ShapedArray(self.shape, self.dtype, device=backend.device_of(self))

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tracer")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d tracer")
        return (self[i] for i in range(self.shape[0]))

    def __array__(self, dtype=None, copy=None):
        subscript = _caller_subscript()
        if subscript == "write":
            raise ConcretizationError(
                f"a traced value with shape {self.shape} was used as the position of an "
                "assignment into a concrete array (a[i] = v where a is a NumPy or CuPy array), "
                "which cannot be written at a traced position; build the new array instead, e.g. "
                "cuvmap.numpy.where(cuvmap.numpy.arange(len(a)) == i, v, a)",
                where=self._main.name,
            )
        if subscript == "read":
            raise ConcretizationError(
                f"a traced value with shape {self.shape} was used to index a concrete array "
                "(a[i] where a is a NumPy or CuPy array): NumPy cannot index with a traced "
                "value; write cuvmap.numpy.take(a, i, axis=0) or cuvmap.numpy.getitem(a, index), "
                "which index with tracers",
                where=self._main.name,
            )
        raise ConcretizationError(
            f"a traced value with shape {self.shape} was converted to a NumPy array "
            "(np.asarray, np.array or a NumPy function applied to it); use cuvmap.numpy "
            "functions on traced values instead",
            where=self._main.name,
        )

    def _concrete_value(self):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}<{self._main.name}>({self.aval})"

    # A value whose concrete number is not known to Python (a batch of them, or none yet
    # under jit) has no truth value and no Python number: each transform's tracer says why
    # in ``_concretization_error``. (Derivative tracers, which carry their primal, override
    # these: PrimalTracer.)
    def _concretization_error(self, what):
        return ConcretizationError(f"{what} of a traced value (shape {self.shape})", where=self._main.name)

    def __bool__(self):
        raise self._concretization_error("the truth value (Python if, while, and, or, not)")

    def __float__(self):
        raise self._concretization_error("float()")

    def __int__(self):
        raise self._concretization_error("int()")

    def __complex__(self):
        raise self._concretization_error("complex()")

    def __index__(self):
        raise self._concretization_error("the use as a Python index (range(), list[...])")


_SUBSCRIPT_OPS = {"BINARY_SUBSCR": "read", "STORE_SUBSCR": "write", "DELETE_SUBSCR": "write"}
_BINARY_OP_NAMES = [name for name, _ in getattr(dis, "_nb_ops", ())]
_NB_SUBSCR = _BINARY_OP_NAMES.index("NB_SUBSCR") if "NB_SUBSCR" in _BINARY_OP_NAMES else None


def _caller_subscript():
    """``"read"`` or ``"write"`` when ``Tracer.__array__`` was reached from a Python
    subscript of its caller (``a[i]``, or ``a[i] = v`` / ``del a[i]``), else ``None``:
    NumPy's ``ndarray.__getitem__`` is C code, so the frame above ``__array__`` is the
    user's, stopped at the subscript's bytecode (``BINARY_SUBSCR``, or ``BINARY_OP`` with
    ``NB_SUBSCR`` from Python 3.14). It only shapes an error message."""
    try:
        frame = sys._getframe(2)
        code, offset = frame.f_code.co_code, frame.f_lasti
        name = dis.opname[code[offset]]
        if name == "BINARY_OP" and _NB_SUBSCR is not None and code[offset + 1] == _NB_SUBSCR:
            return "read"
        return _SUBSCRIPT_OPS.get(name)
    except (ValueError, IndexError, AttributeError):
        return None


class PrimalTracer(Tracer):
    """A tracer of a derivative transform (jvp, vjp): it carries its primal value, so its
    shape, dtype and truth value are the primal's — Python control flow on values works
    under ``grad`` and ``jvp``, as in JAX's eager mode."""

    __slots__ = ("primal", "datum")

    def __init__(self, main, primal, datum):
        # ``datum``: what the transform keeps beside the primal (jvp's tangent, vjp's tape
        # node), which the subclass names
        self._main = main
        self.primal = primal
        self.datum = datum

    @property
    def shape(self):
        return shape_of(self.primal)

    @property
    def dtype(self):
        return dtype_of(self.primal)

    def _concrete_value(self):
        return self.primal

    def __bool__(self):
        return bool(self.primal)

    # NOTE [conversions that drop the derivative]
    # ``float(x)``, ``int(x)``, ``complex(x)`` (and ``math.*``, which calls ``float``) return
    # a Python number that no transform can see, so ``grad(lambda x: x * float(x))`` would
    # silently lose a term. As in JAX they raise; the truth value stays allowed (Python
    # ``if`` on a value under eager ``grad``), since branching drops no derivative.
    def _lost_derivative(self, what):
        return ConcretizationError(
            f"{what} of a traced value (shape {self.shape}) would drop its derivative; use "
            "cuvmap.numpy functions on it instead of Python numbers or math.*, or "
            "cuvmap.stop_gradient(x) first when the detachment is intended",
            where=self._main.name,
        )

    def __float__(self):
        raise self._lost_derivative("float()")

    def __int__(self):
        raise self._lost_derivative("int()")

    def __complex__(self):
        raise self._lost_derivative("complex()")

    def __index__(self):
        raise self._lost_derivative("the use as a Python index")


# ---------------------------------------------------------------------------------------
# Primitives
# ---------------------------------------------------------------------------------------


# NOTE [a registry that fills itself]
# A primitive registers itself when it is constructed, so no list of primitives is kept
# by hand: cuvmap.lax.all_primitives() imports every module of the lax package and returns
# the registered primitives that those modules made, and the registry test checks that
# each has every rule (a family added without rules fails it, however it is named). The
# registry holds primitives weakly (one that nothing references can never be bound), in
# the order they were made; ``module`` is the module whose code made the primitive (the
# caller of the constructor, past the ``__init__`` of subclasses), as namedtuple finds its
# ``__module__``, so a family's helper that defines its primitives counts as that family.
_registry = weakref.WeakValueDictionary()
_registry_keys = itertools.count()


def _defining_module(primitive):
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is primitive:
        frame = frame.f_back  # a subclass's __init__
    return frame.f_globals.get("__name__") if frame is not None else None


def registered_primitives():
    """Every primitive alive, in the order they were made (NOTE [a registry that fills
    itself]); :func:`cuvmap.lax.all_primitives` selects cuvmap's own."""
    return list(_registry.values())


# The facts of a primitive (the docstring of Primitive) and their defaults, the safe
# assumptions. A primitive states its own with the constructor's keywords (None: the
# default), a class of primitives as class attributes (control flow's host_sync = True).
_FACTS = {"owns_output": False, "impl_into": None, "impl_into_when": None, "host_sync": False, "capturable": None,
          "fused": None, "kind": None, "effectful": False, "workspace": None, "impl_for": None, "layout": None}


class Primitive:
    """A named operation. ``impl(*arrays, **params)`` evaluates it on concrete arrays;
    ``shape_rule(*avals, **params) -> ShapedArray`` states its output aval and raises
    :class:`ShapeError` for bad operands. Transform rules live in the transform modules.

    ``differentiable=False`` marks primitives whose outputs carry no derivative
    (comparisons, argmax, stop_gradient): transforms of derivatives pass them through.

    What the planned executor, fusion and the checkpoint policies need to know about a
    primitive are attributes (keyword arguments of the constructor, or class attributes of
    a class of primitives), set where the primitive is defined, so that
    ``cuvmap/transforms/`` names no lax primitive. Each default is the safe assumption:

    - ``owns_output``: the result never shares memory with an operand (a reduction, a
      matrix product, a convolution). Without it the executor assumes the result may be
      a view of an operand (a reshape, a slice, an identity).
    - ``impl_into``: a writer ``impl_into(*operands, out=buffer)`` that puts the result
      into ``out`` (a buffer of the output's shape and dtype) and returns it, or raises
      TypeError or ValueError to decline; a ufunc impl is its own writer. A primitive with
      a writer returns arrays of its own, so a plan may write its results into a dead
      operand's buffer or a pooled one (NOTE [buffer planning] in
      cuvmap/transforms/executor/buffers.py). ``impl_into_when(aval, gpu) -> bool``, where given,
      says for which outputs the writer applies (select's blend: NumPy floats only).
    - ``host_sync``: the impl reads operand values on the host (a while_loop's predicate,
      a cond's branch index: on the GPU a synchronisation), so a program with it is never
      captured as a CUDA graph.
    - ``capturable``: whether its GPU impl can run inside a CUDA stream capture (no host
      read, no library call a capture refuses: cuSOLVER's SVD is not); None (the default)
      means ``not host_sync``. :func:`cuvmap.transforms.executor.graph_capturable` asks it
      of every equation, those of nested programs included.
    - ``fused``: how a generated elementwise kernel computes it (a
      :class:`cuvmap.transforms.fusion.CExpression`), or None: it is never fused.
    - ``kind``: what a policy may ask about it: ``"dot"`` for matrix products (the
      checkpoint policies ``dots_saveable`` and ``dots_with_no_batch_dims_saveable``),
      else None.
    - ``effectful``: running it does something besides computing its result (a debug
      print, a host callback), so a staged program keeps every such equation, in order,
      even when nothing reads its result: no dead-code elimination, common
      subexpressions or constant folding touch it.
    - ``workspace``: ``workspace(in_avals, out_avals, params, strided) -> bytes``, the
      memory its impl allocates for itself while it runs, besides its result (the unfolded
      columns of a convolution, a copy of an operand not laid out for a GEMM), for the
      plan's memory estimate (NOTE [planned peak memory] in cuvmap/transforms/executor/peak_memory.py;
      an operand given twice comes once, then as None; ``strided[i]``: whether operand
      ``i`` may be laid out other than in C order); None: nothing worth counting.
    - ``layout``: ``layout(strided, in_avals, out_avals, params) -> (allocates,
      strided_out)`` for that estimate: whether the result is a new array (else a view of
      an operand) and whether it may be laid out other than in C order. None: a primitive
      with a writer allocates, in its operands' layout (NumPy's ``order="K"``); any other
      allocates a C-ordered result (a view must say so: ``reshape``, ``transpose``, ...).
    - ``impl_for(*avals, **params)``: the impl for operands of these avals, a callable of
      the operands alone that a plan calls instead of ``impl(*operands, **params)``
      (dot_general works out its layout once: NOTE [a product's layout is worked out
      once] in cuvmap/lax/linalg.py), or None.

    Every primitive registers itself when it is made (NOTE [a registry that fills
    itself]); ``module`` is the module that made it.

    ``bind`` is the one entry point of every primitive: it finds the transform that
    processes it and hands it over with ``bind_with_trace`` (JAX's name), which asks the
    trace to ``process_primitive``; call primitives (:mod:`cuvmap.transforms.call`) ask it
    to ``process_call`` instead. ``multiple_results``: ``bind`` and the impl return a list.
    """

    __slots__ = ("name", "impl", "shape_rule", "differentiable", "module", *_FACTS, "__weakref__")
    multiple_results = False
    # a primitive that names axes (a collective) returns the transforms mapping them from
    # ``axis_mains(params)``; ``bind`` lets them process it (NOTE [named axes])
    axis_mains = None

    # Where the rules of the transforms are: None for entries of the transforms' rule
    # tables (batching.primitive_batchers, jvp.primitive_jvps, vjp.primitive_vjps); a
    # call-like primitive (its params hold a program), whose rules are methods of its
    # class, names those methods here (CallPrimitive does), and the registry test asks for
    # them instead, each a method its class defines or inherits (test_util.missing_rules).
    rule_methods = None

    def __init__(self, name, differentiable=True, *, impl=None, shape_rule=None, owns_output=None, impl_into=None,
                 impl_into_when=None, host_sync=None, capturable=None, fused=None, kind=None, effectful=None,
                 workspace=None, impl_for=None, layout=None):
        self.name = name
        self.impl = impl
        self.shape_rule = shape_rule
        self.differentiable = differentiable
        given = dict(owns_output=owns_output, impl_into=impl_into, impl_into_when=impl_into_when,
                     host_sync=host_sync, capturable=capturable, fused=fused, kind=kind, effectful=effectful,
                     workspace=workspace, impl_for=impl_for, layout=layout)
        mro = type(self).__mro__
        by_class = {f for c in mro[:mro.index(Primitive)] for f in _FACTS if f in c.__dict__}
        for fact, value in given.items():
            if fact in by_class:  # a class attribute of the primitive's class states it
                if value is not None:
                    raise TypeError(f"Primitive({name!r}): {fact} is a class attribute of {type(self).__name__}")
                continue
            setattr(self, fact, _FACTS[fact] if value is None else value)
        self.module = _defining_module(self)
        _registry[next(_registry_keys)] = self

    def __repr__(self):
        return f"{self.name}_p"

    def check(self, *operands, **params):
        """Runs the shape rule on the operands' avals: impls whose kernels would fail deep
        inside NumPy call it first, so bad input fails with the rule's message."""
        return self.shape_rule(*(get_aval(x) for x in operands), **params)

    def bind(self, *args, **params):
        top = find_top_main(self, args, params)
        try:
            if top is None:
                out = self.impl(*args, **params)
                # NumPy ufuncs return scalars for 0-d operands; results are always arrays
                return np.asarray(out) if isinstance(out, np.generic) else out
            return self.bind_with_trace(top.trace, args, params)
        except _PASS_THROUGH:
            raise
        except Exception as err:
            if top is None:
                moved = backend.host_operands_on_device(args)  # NOTE [host arrays meet device arrays]
                if moved is not None:
                    return self.bind(*moved, **params)
            # NOTE [errors keep their kind]
            raise self.bind_error(args, params, err, top)

    def bind_with_trace(self, trace, args, params):
        """Hands the primitive to ``trace`` (the transform ``bind`` chose)."""
        return trace.process_primitive(self, args, params)

    def bind_error(self, args, params, err, top):
        """The error ``bind`` raises when applying the primitive failed (NOTE [errors keep
        their kind])."""
        return _op_error(self, args, params, err, top)


# NOTE [staging owns the values made from nothing]
# An op whose operands are all constants (``iota``, ``cnp.zeros(3) + 1``) has no tracer to
# say which transform should see it. Eagerly that is right: it is a constant to every
# transform. Inside ``jit`` it must still be staged, or it would run once at trace time and
# its result be frozen into the program (as JAX's dynamic trace, the innermost staging
# transform owns such ops). So ``find_top_main`` takes the innermost of the operands'
# transforms and the thread's innermost staging transform.
def find_top_main(primitive, args, params=None):
    """The transform that processes ``primitive`` on ``args``: the innermost that owns an
    operand, or the innermost staging transform when that is further in, or for a
    primitive naming axes the innermost transform mapping one of them (NOTE [named axes]);
    ``None`` for the eval interpreter. Raises for tracers that escaped or crossed threads."""
    top = _state.staging_main
    if primitive.axis_mains is not None:
        for main in primitive.axis_mains(params):
            if main is not None and (top is None or main.level > top.level):
                top = main
    for x in args:
        if isinstance(x, Tracer):
            main = x._main
            if not main.active:
                raise EscapedTracerError(_escaped_message(primitive, x), where=main.name)
            if top is None or main.level > top.level:
                top = main
    if top is not None and top.thread != threading.get_ident():
        raise CrossThreadTracerError(_cross_thread_message(primitive, top), where=top.name)
    return top


@contextmanager
def staging(main):
    """Makes ``main`` the thread's innermost staging transform for the block."""
    previous = _state.staging_main
    _state.staging_main = main
    try:
        yield main
    finally:
        _state.staging_main = previous


def _escaped_message(primitive, tracer):
    """The text of an escaped-tracer error; its ``where`` is the transform the tracer
    belonged to, so the message starts with that transform and function."""
    return (
        f"a traced value (shape {tracer.shape}) escaped this transform and was used by "
        f"{primitive.name} after the transform returned: it was stored outside the function "
        "(a global, a closure cell, a list). Return values from the transformed function instead."
    )


def _cross_thread_message(primitive, main):
    return (
        f"a traced value of this transform was used by {primitive.name} in another thread; a "
        "transform's values belong to the thread that runs it. Run the whole transformed "
        "function in one thread (each thread may run transforms of its own)"
    )


# NOTE [errors keep their kind]
# When a primitive fails, ``bind`` adds what the user needs to find the call: the op, the
# operands' (logical) avals, its params and the transform. Only a failure that the shape
# rule explains (bad operands) becomes a ``ShapeError``; any other exception — a
# ``MemoryError`` from an impl, an ``IndexError`` from a gather, a cuDNN failure — is
# re-raised as itself, with that context as an exception note (PEP 678), so that
# ``except MemoryError`` keeps working. Every level of the stack that the error passes
# through refreshes the note; the outermost one (the user's coordinates) is what remains.
_PASS_THROUGH = (MissingRuleError, EscapedTracerError, ConcretizationError, CrossThreadTracerError)
_NOTE_PREFIX = "cuvmap: while evaluating "


def _op_error(primitive, args, params, err, top):
    """The error for a primitive that failed at some level: a :class:`ShapeError` with the
    shape rule's reason when the rule rejects the operands' (logical) avals or the failure
    was a ShapeError, else ``err`` itself with a note naming the op and the shapes."""
    try:
        avals = [get_aval(x) for x in args]
    except Exception:
        avals = None
    reason = None
    if avals is not None and primitive.shape_rule is not None:
        try:
            primitive.shape_rule(*avals, **params)
        except ShapeError as shape_err:
            reason = shape_err.message
        except Exception:
            reason = None
    operands = ", ".join(repr(a) for a in avals) if avals is not None else "?"
    where = f" under {top.name}" if top is not None else ""
    call = f"{primitive.name}({operands}{_fmt_params(params)}){where}"
    if reason is None and not isinstance(err, ShapeError):
        _set_note(err, _NOTE_PREFIX + call)
        return err
    if reason is None:
        reason = err.message
    # strip an inner level's decoration so the message names the op once
    prefix = f"{primitive.name}("
    if reason.startswith(prefix) and "): " in reason:
        reason = reason.split("): ", 1)[1]
    new = ShapeError(f"{call}: {reason}")
    new.__cause__ = err if not isinstance(err, ShapeError) else err.__cause__
    new.__suppress_context__ = True
    return new


def set_error_note(err, what):
    """Notes on ``err`` that it was raised while evaluating ``what`` (NOTE [errors keep
    their kind]); for the primitives that do not describe themselves by their operands."""
    _set_note(err, _NOTE_PREFIX + what)


def _set_note(err, note):
    """Adds ``note`` to ``err``, replacing the note an inner level added."""
    notes = getattr(err, "__notes__", None)
    if notes is None:
        notes = []
        try:
            err.__notes__ = notes
        except Exception:
            return
    for i, n in enumerate(notes):
        if isinstance(n, str) and n.startswith(_NOTE_PREFIX):
            notes[i] = note
            return
    notes.append(note)


def _fmt_params(params):
    if not params:
        return ""
    return ", " + ", ".join(f"{k}={v!r}" for k, v in params.items())


def zeros_like_aval(aval):
    """A concrete array of zeros with ``aval``'s shape, dtype and device."""
    device = aval.device or "cpu"
    if device == "cpu":
        return np.zeros(aval.shape, aval.dtype)
    cp = backend.xp_for("gpu")
    with cp.cuda.Device(int(device.split(":")[1])):
        return cp.zeros(aval.shape, aval.dtype)


def full_like_concrete(x, value, shape=None, dtype=None):
    """A concrete array filled with ``value`` on ``x``'s backend, with ``x``'s logical shape
    and dtype unless given. Not a primitive: the result is a constant to every transform."""
    xp = backend.xp_of(x)
    return xp.full(shape_of(x) if shape is None else shape, value, dtype=dtype_of(x) if dtype is None else dtype)
