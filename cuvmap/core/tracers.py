"""The interpreter stack: a thread's stack of transforms (``MainTrace``), its named axes
and named scopes, traces and tracers, and the aval of a value (a tracer's own).

A *transform* (vmap, jvp, vjp) is an interpreter: while it runs it owns a ``MainTrace`` at
some ``level`` of the stack, and the values it traces are *tracers* that point to that
main. Levels keep nested transforms apart: in ``grad(lambda x: grad(lambda y: x * y)(1.0))``
the inner ``grad`` sees ``x`` as a constant, so perturbations never get confused. A tracer
whose main has been popped has *escaped* its transform; using it raises an error.
"""
import dis
import sys
import threading
from contextlib import contextmanager

from cuvmap import backend
from cuvmap.core.avals import _PY_SCALAR_DTYPES, ShapeDtypeStruct, ShapedArray, _ShapeProperties, dtype_of
from cuvmap.core.weak import WeakArray
from cuvmap.errors import ConcretizationError, CuvmapError, MissingRuleError, jax_concretization_phrase



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
            "functions on traced values instead (The numpy.ndarray conversion method __array__() was called on "
            f"traced array with shape {self.dtype}[{','.join(str(d) for d in self.shape)}])",
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
        aval_text = f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"
        return ConcretizationError(f"{what} of a traced value (shape {self.shape}) "
                                   f"({jax_concretization_phrase(what, aval_text)})", where=self._main.name)

    def __bool__(self):
        raise self._concretization_error("the truth value (Python if, while, and, or, not)")

    def __float__(self):
        raise self._concretization_error("float()")

    def __int__(self):
        raise self._concretization_error("int()")

    def __complex__(self):
        raise self._concretization_error("complex()")

    def __index__(self):
        raise self._concretization_error("The __index__() method was called on traced array: the use as a Python "
                                         "index (range(), list[...])")


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
        return getattr(self.primal, "shape", ())  # shape_of, inlined: every rule asks

    @property
    def dtype(self):
        return dtype_of(self.primal)

    @property
    def aval(self):
        """The primal's aval: a Python number's (or a weak array's, or a tracer's) weak
        type is kept, so that a value derived from ``grad(f)(5.0)``'s input meets a
        float32 array as the Python number would (as in JAX)."""
        primal = self.primal
        if type(primal) in _PY_SCALAR_DTYPES or type(primal) is WeakArray or isinstance(primal, Tracer):
            return get_aval(primal)
        return ShapedArray(self.shape, self.dtype, device=backend.device_of(self))

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
    if t is WeakArray:  # NOTE [eager weak arrays] in cuvmap/core/weak.py
        return ShapedArray(x.shape, x.dtype, weak_type=True, device="cpu")
    return ShapedArray(x.shape, x.dtype, device=backend.device_of(x))
