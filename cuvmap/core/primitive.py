"""Primitives and ``bind``.

A *primitive* is a named operation with an impl (the bottom of the stack evaluates it on
concrete arrays), a shape rule, and rules for each transform (kept by the transform
modules). ``prim.bind(*args, **params)`` finds the innermost transform that owns any
operand (the highest level among the tracers) and lets its trace process the primitive.
The trace applies its rule; the rule's own binds act on the values one level down, so
each transform sees only its own tracers and treats every other value as a constant. With
no tracers the impl runs directly: that is the eval interpreter.
"""
import itertools
import sys
import threading
import weakref
from contextlib import contextmanager

import numpy as np

from cuvmap import backend
from cuvmap.core.avals import ShapedArray, dtype_of, shape_of
from cuvmap.core.rule_cache import RuleCache, signature
from cuvmap.core.tracers import Tracer, _state, get_aval
from cuvmap.core.weak import bind_weak, may_be_weak
from cuvmap.errors import ConcretizationError, CrossThreadTracerError, EscapedTracerError, MissingRuleError, ShapeError



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
# how many times an impl was replaced (Primitive.def_impl): part of the key of the
# executor's plans, which call the impls they were made with
_impl_epoch = 0


def impl_epoch():
    """A number that changes whenever a primitive's impl is replaced (``def_impl``)."""
    return _impl_epoch


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
          "fused": None, "kind": None, "effectful": False, "workspace": None, "impl_for": None, "layout": None,
          "channels_last": None}

_checked = RuleCache()   # Primitive.check's results (NOTE [eager shape rules are cached per signature])


class Primitive:
    """A named operation. ``impl(*arrays, **params)`` evaluates it on concrete arrays;
    ``shape_rule(*avals, **params) -> ShapedArray`` states its output aval and raises
    :class:`ShapeError` for bad operands; it is a pure function of the avals and params
    (it reads no value, setting or state: eager binds cache its results per signature,
    NOTE [eager shape rules are cached per signature] in cuvmap/core/rule_cache.py).
    Transform rules live in the transform modules.

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
    - ``channels_last(params) -> (reads, writes, impl)`` or None: for an equation with
      these params, the operands (indices) its impl reads as fast laid out channels-last
      (``N spatial... C`` memory behind an ``N C spatial...`` shape) as in C order, the
      results (indices) it can write channels-last, and the impl that does (a
      convolution's: NOTE [channels-last activations in a plan] in
      cuvmap/transforms/executor/layouts.py). None (the default): neither.

    Every primitive registers itself when it is made (NOTE [a registry that fills
    itself]); ``module`` is the module that made it.

    ``bind`` is the one entry point of every primitive: it finds the transform that
    processes it and hands it over with ``bind_with_trace`` (JAX's name), which asks the
    trace to ``process_primitive``; call primitives (:mod:`cuvmap.transforms.call`) ask it
    to ``process_call`` instead. ``multiple_results``: ``bind`` and the impl return a list.
    """

    __slots__ = ("name", "impl", "shape_rule", "differentiable", "module", "_multiple_results", *_FACTS,
                 "__weakref__")

    @property
    def multiple_results(self):
        """Whether ``bind`` and the impl return a list (JAX's attribute, settable on an
        instance: ``p.multiple_results = True``; call primitives' classes state it)."""
        return self._multiple_results

    @multiple_results.setter
    def multiple_results(self, value):
        self._multiple_results = bool(value)

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
                 workspace=None, impl_for=None, layout=None, channels_last=None):
        self.name = name
        self.impl = impl
        self.shape_rule = shape_rule
        self.differentiable = differentiable
        self._multiple_results = False
        given = dict(owns_output=owns_output, impl_into=impl_into, impl_into_when=impl_into_when,
                     host_sync=host_sync, capturable=capturable, fused=fused, kind=kind, effectful=effectful,
                     workspace=workspace, impl_for=impl_for, layout=layout, channels_last=channels_last)
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

    def def_impl(self, impl):
        """Sets ``impl`` (JAX's ``Primitive.def_impl``) and returns it. Eager ``bind``
        calls it, and so do staged programs planned after it (a plan is made again once an
        impl changes: :func:`impl_epoch`)."""
        self.impl = impl
        global _impl_epoch
        _impl_epoch += 1
        return impl

    def def_abstract_eval(self, abstract_eval):
        """Sets the shape rule from JAX's form (``Primitive.def_abstract_eval``):
        ``abstract_eval(*avals, **params)`` takes the operands' avals (:class:`ShapedArray`:
        ``shape``, ``dtype``, ``weak_type``) and returns the result's aval (a ShapedArray, a
        :class:`ShapeDtypeStruct` or anything with ``shape`` and ``dtype``), a sequence of
        them for a primitive with ``multiple_results``. Returns ``abstract_eval``. A
        primitive made this way stages under ``jit`` and runs eagerly through its impl;
        ``vmap`` and the derivatives need their rules registered as for any primitive."""

        def shape_rule(*avals, **params):
            out = abstract_eval(*avals, **params)
            if self.multiple_results:
                return [_as_shaped_array(o, self.name) for o in out]
            return _as_shaped_array(out, self.name)

        self.shape_rule = shape_rule
        return abstract_eval

    def def_effectful_abstract_eval(self, effectful_abstract_eval):
        """JAX's form returning ``(avals, effects)``: the effects are accepted and unused
        (cuvmap has no effect system; a primitive whose impl has side effects is marked
        ``effectful`` instead). Returns ``effectful_abstract_eval``."""
        self.def_abstract_eval(lambda *avals, **params: effectful_abstract_eval(*avals, **params)[0])
        return effectful_abstract_eval

    def check(self, *operands, **params):
        """Runs the shape rule on the operands' avals: impls whose kernels would fail deep
        inside NumPy call it first, so bad input fails with the rule's message. Returns
        the output's aval, cached per signature (NOTE [eager shape rules are cached per
        signature] in cuvmap/core/rule_cache.py)."""
        sig = signature(operands, params)
        if sig is not None:
            hit = _checked.get(self, sig)
            if hit is not None:
                return hit
        out = self.shape_rule(*(get_aval(x) for x in operands), **params)
        return out if sig is None else _checked.put(self, sig, out)

    def bind(self, *args, **params):
        # find_top_main's answer for the eval interpreter (no tracer, no staging, no named
        # axis) without calling it: most eager binds are there
        top = None
        if _state.staging_main is not None or self.axis_mains is not None:
            top = find_top_main(self, args, params)
        else:
            for x in args:
                if isinstance(x, Tracer):
                    top = find_top_main(self, args, params)
                    break
        try:
            if top is None:
                if may_be_weak(args):  # NOTE [eager weak arrays] in cuvmap/core/weak.py
                    return bind_weak(self, args, params)
                out = self.impl(*args, **params)
                # NumPy ufuncs return scalars for 0-d operands; results are always arrays
                return np.asarray(out) if isinstance(out, np.generic) else out
            if self._plain_bind_with_trace:  # bind_with_trace's own body, without its call
                return top.trace.process_primitive(self, args, params)
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

    # whether the class keeps Primitive's bind_with_trace (``bind`` then runs its body
    # itself); a subclass that overrides it (call primitives) is seen here when defined
    _plain_bind_with_trace = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._plain_bind_with_trace = cls.bind_with_trace is Primitive.bind_with_trace

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
        f"{primitive.name} after the transform returned: it was stored outside the function in global "
        "state (a global, a closure cell, a list). Return values from the transformed function instead "
        "(JAX's UnexpectedTracerError: Encountered an unexpected tracer: an intermediate value with type "
        f"{tracer.dtype}[{','.join(str(d) for d in tracer.shape)}] escaped the scope of its transformation)."
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
    kind = type(err) if isinstance(err, ShapeError) else ShapeError
    if avals is not None and primitive.shape_rule is not None:
        try:
            primitive.shape_rule(*avals, **params)
        except ShapeError as shape_err:
            reason = shape_err.message
            kind = type(shape_err)  # (a ShapeTypeError stays one: JAX's TypeError)
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
    new = kind(f"{call}: {reason}")
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
    """``, k=v`` for each param an error names: a dtype by its name, params left at None out."""
    shown = [f"{k}={v.name if isinstance(v, np.dtype) else repr(v)}" for k, v in params.items() if v is not None]
    return ", " + ", ".join(shown) if shown else ""


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


def _as_shaped_array(aval, name):
    """A ShapedArray for what a JAX-style abstract eval returned (``def_abstract_eval``)."""
    if isinstance(aval, ShapedArray):
        return aval
    if hasattr(aval, "shape") and hasattr(aval, "dtype"):
        return ShapedArray(tuple(aval.shape), np.dtype(aval.dtype), weak_type=bool(getattr(aval, "weak_type", False)))
    raise TypeError(f"{name}: its abstract eval returned {type(aval).__name__}, not an aval (a ShapedArray or "
                    "ShapeDtypeStruct with a shape and a dtype)")
