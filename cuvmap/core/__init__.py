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

The parts, one module each (this package re-exports their names, ``core.X`` everywhere):
:mod:`~cuvmap.core.avals` (shapes and dtypes of values), :mod:`~cuvmap.core.tracers` (the
stack, named axes and scopes, traces and tracers) and :mod:`~cuvmap.core.primitive`
(primitives, their registry and ``bind``); the errors are :mod:`cuvmap.errors`'.
"""
from cuvmap.core.avals import (  # noqa: F401
    _PY_SCALAR_DTYPES, ShapeDtypeStruct, ShapedArray, as_array, common_float_dtype, dtype_of, is_float, shape_of,
)
from cuvmap.core.primitive import (  # noqa: F401
    Primitive, find_top_main, full_like_concrete, registered_primitives, set_error_note, staging, zeros_like_aval,
)
from cuvmap.core.tracers import (  # noqa: F401
    AxisFrame, MainTrace, PrimalTracer, Trace, Tracer, UnboundAxisError, _state, axis_env, axis_frame,
    extend_axis_env, extend_name_stack, get_aval, is_value, name_stack, new_main, new_name_stack, set_name_stack,
    trace_stack,
)
from cuvmap.core.weak import WeakArray  # noqa: F401
from cuvmap.errors import (  # noqa: F401
    ConcretizationError, CrossThreadTracerError, CuvmapError, EscapedTracerError, MissingRuleError, ShapeError,
)
