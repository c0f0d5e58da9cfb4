"""Staging: the interpreter behind ``jit``, ``make_jaxpr``, ``checkpoint`` and the
programs the transforms derive.

``trace_to_jaxpr(f, avals)`` runs ``f`` once on :class:`StagedTracer` values, which have
an aval (shape, dtype, weak type, device) and no value, and records every primitive
applied to them as an equation of a :class:`~cuvmap.transforms.ir.Jaxpr` (JAX's dynamic
trace). Values the function meets that are not its arguments — arrays it closed over,
tracers of transforms outside the staging — become the program's constants. A call
primitive met while staging (NOTE [call primitives] in :mod:`cuvmap.transforms.call`)
becomes one equation with one result per output (:meth:`StagingTrace.stage_equation`),
or its equations, where it inlines itself (``jit``'s call:
:mod:`cuvmap.transforms.program_call`).

:func:`stage_arguments` and :func:`trace_program` stage a user's function of pytrees
(static arguments apart, the cache key, errors that name arguments by their path) for
``jit``/``make_jaxpr`` (:mod:`cuvmap.jit_api`) and ``checkpoint``
(:mod:`cuvmap.transforms.remat`).
"""
import dataclasses

import numpy as np

from cuvmap import api_util, backend, core, dtypes, tree
from cuvmap.core import ConcretizationError, Trace, Tracer
from cuvmap.errors import jax_concretization_phrase
from cuvmap.transforms import ir
from cuvmap.transforms.ir import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# The staging trace
# ---------------------------------------------------------------------------------------


class StagedTracer(Tracer):
    """A value of a function being staged: the program variable it is (which has its aval)."""

    __slots__ = ("var",)

    def __init__(self, main, var):
        self._main = main
        self.var = var

    @property
    def aval(self):
        return self.var.aval

    @property
    def shape(self):
        return self.var.aval.shape

    @property
    def dtype(self):
        return self.var.aval.dtype

    def _concrete_value(self):
        # NOTE [a staged value has a device but no value]
        # Code that asks the concrete array under a tracer for its backend (``xp_of``,
        # ``full_like_concrete``) gets an empty array of the value's dtype on its device:
        # enough to pick NumPy or CuPy and a dtype. Nothing may read values through it;
        # the conversions below raise instead.
        return _device_witness(self.var.aval)

    def _concretization_error(self, what):
        origin = _origin_of(self.var)
        depends = f" that depends on {origin}" if origin else ""
        stager = self._main.global_data.stager
        aval_text = f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"
        return ConcretizationError(
            f"{what} of a traced value (shape {self.shape}, {self.dtype}){depends}: {stager.why}; {stager.hint} "
            f"({jax_concretization_phrase(what, aval_text)})",
            where=self._main.name,
        )


# NOTE [who staged a value]
# A Python ``if``, ``float()`` or ``int()`` on a staged value has no answer: the function
# is traced once, on avals, for every value it will run on. What to do instead depends on
# who staged it: under ``jit`` a configuration argument can be made static, while the body
# of a ``scan`` or the branch of a ``cond`` (staged even when the user wrote no ``jit``)
# needs ``cnp.where`` or ``lax.cond``. So each stager passes ``trace_to_jaxpr`` a
# :class:`Stager` whose two sentences the error prints.
@dataclasses.dataclass(frozen=True)
class Stager:
    """Who stages a function, as the error of a staged value's Python conversion says it:
    ``why`` its values are not known while it is traced, and the ``hint`` of what to do."""

    why: str
    hint: str


JIT_STAGER = Stager(
    why="under jit (and checkpoint, which stages its function too) the values of the arguments are not known "
        "while the function is traced",
    hint="mark that argument static with static_argnums/static_argnames if it is a configuration value, or use "
         "cuvmap.numpy.where to choose per element")


_witnesses = {}


def _device_witness(aval):
    key = (aval.dtype, aval.device)
    w = _witnesses.get(key)
    if w is None:
        device = aval.device or "cpu"
        if device == "cpu":
            w = np.empty(0, aval.dtype)
        else:
            cp = backend.xp_for("gpu")
            with cp.cuda.Device(int(device.split(":")[1])):
                w = cp.empty(0, aval.dtype)
        _witnesses[key] = w
    return w


def _origin_of(var):
    return getattr(var, "origin", None)


class JaxprBuilder:
    """The state of one staging: the equations so far and the constants met."""

    __slots__ = ("eqns", "constvars", "consts", "const_ids", "stager", "python_number_args")

    def __init__(self, stager=JIT_STAGER):
        self.stager = stager
        # the weakly typed arguments that are Python numbers when the program runs
        # (NOTE [a weak value meets a strong one])
        self.python_number_args = ()
        self.eqns = []
        self.constvars = []
        self.consts = []
        self.const_ids = {}

    def const_var(self, x):
        key = id(x)
        v = self.const_ids.get(key)
        if v is None:
            # a captured constant of one of ml_dtypes' dtypes: refused by name, as an input
            # is (NOTE [bfloat16 needs ml_dtypes] in cuvmap/dtypes.py)
            dtypes.check_supported(x, "a constant the function closes over", "staging")
            v = Var(core.get_aval(x))
            self.const_ids[key] = v
            self.constvars.append(v)
            self.consts.append(x)
        return v


def _out_device(avals):
    """The device of a result: a GPU operand's (a NumPy constant meeting it goes there:
    NOTE [host arrays meet device arrays] in cuvmap/backend.py), else the CPU."""
    for a in avals:
        if a.device is not None and a.device != "cpu":
            return a.device
    return "cpu"


# NOTE [a weak value meets a strong one]
# A Python number is weakly typed (JAX's weak types, NumPy's NEP 50): ``x_f32 * 2.0`` is
# float32. A staged value computed only from weakly typed ones (``x + 1`` for a Python
# float argument ``x``, ``2.0 * y`` for a Python number ``y``) stays weakly typed, as in
# JAX, so ``eval_shape`` and ``make_jaxpr`` show ``~f64[]`` and a later ``* x_f32`` gives
# float32, as the same lines run eagerly on Python numbers do. When the program runs, that
# value is a NumPy (or CuPy) scalar or 0-d array, which NumPy treats as strongly typed
# (``np.float64(3.0) * x_f32`` is float64). So where a primitive's result is strongly
# typed and a weakly typed operand decides its dtype (the shape rule gives another dtype
# for the operand made strong), staging casts that operand to the result's dtype first
# (one ``convert_element_type`` equation, as JAX's jaxprs show them), and the program
# computes in the dtype its avals say. The arguments of a program that ``jit`` (or
# ``make_jaxpr``, ``eval_shape``) stages for a Python number are that Python number when
# it runs, weakly typed for NumPy too: they are not cast (``mul c b`` for ``sin(x) * 2.0``
# with ``b`` the 2.0), while a sub-program's arguments (a checkpointed region's, a loop
# body's) may be NumPy scalars computed by the program that calls it, and are.
def _cast_weak_operands(main, builder, primitive, inputs, avals, params, dtype):
    """``inputs`` and ``avals`` with each weakly typed variable that decides the dtype of
    ``primitive``'s result cast to ``dtype``, staged in ``main`` (NOTE [a weak value meets
    a strong one])."""
    from cuvmap.lax import elementwise  # the cast: lax imports this module

    inputs, avals = list(inputs), list(avals)
    for i, v in enumerate(inputs):
        if type(v) is not Var or not v.aval.weak_type or v in builder.python_number_args:
            continue
        strong = core.ShapedArray(v.aval.shape, v.aval.dtype, False, v.aval.device)
        try:
            as_strong = primitive.shape_rule(*avals[:i], strong, *avals[i + 1:], **params).dtype
        except core.ShapeError:
            continue
        if as_strong == dtype:
            continue
        cast = elementwise.convert_element_type(StagedTracer(main, v), dtype).var
        inputs[i], avals[i] = cast, cast.aval
    return inputs, avals


class StagingTrace(Trace):
    __slots__ = ()

    def to_input(self, builder, x):
        if self.main.owns(x):
            return x.var
        if type(x) in core._PY_SCALAR_DTYPES or (type(x) is np.ndarray and x.shape == () and kind_of(x.dtype) in "biuf"):
            return Literal(x)
        return builder.const_var(x)

    def process_primitive(self, primitive, args, params):
        builder = self.main.global_data
        inputs = [self.to_input(builder, x) for x in args]
        avals = [v.aval for v in inputs]
        out = primitive.shape_rule(*avals, **params)
        if primitive.multiple_results:  # a primitive made with JAX's API (Primitive.def_abstract_eval)
            return self.stage_equation(primitive, args, params, out)
        if not out.weak_type and any(type(v) is Var and v.aval.weak_type for v in inputs):
            inputs, avals = _cast_weak_operands(self.main, builder, primitive, inputs, avals, params, out.dtype)
        out_aval = core.ShapedArray(out.shape, out.dtype, out.weak_type, _out_device(avals))
        origin = next((v.origin for v in inputs if type(v) is Var and v.origin), None)
        var = Var(out_aval, origin)
        builder.eqns.append(JaxprEqn(primitive, inputs, [var], params, core._state.name_stack))
        return StagedTracer(self.main, var)

    def process_call(self, primitive, args, params):
        return primitive.stage(self, args, params)

    def stage_equation(self, primitive, args, params, out_avals):
        """Stages ``primitive(*args, **params)`` as one equation with one result per aval
        of ``out_avals`` (NOTE [an equation with several results] in ir.py); returns their
        tracers. Results without a device take the operands'."""
        if not out_avals:
            return []  # a call without results computes nothing anyone can read
        builder = self.main.global_data
        inputs = [self.to_input(builder, x) for x in args]
        device = _out_device([v.aval for v in inputs])
        outs = [Var(core.ShapedArray(a.shape, a.dtype, a.weak_type, a.device or device)) for a in out_avals]
        builder.eqns.append(JaxprEqn(primitive, inputs, outs, params, core._state.name_stack))
        return [StagedTracer(self.main, v) for v in outs]


def trace_to_jaxpr(f, in_avals, name="jit", origins=None, stager=JIT_STAGER, python_number_args=False):
    """Stages ``f(*args)`` for arguments with ``in_avals`` (``origins``: for each, the text
    that names it in errors; ``name``: the transform's, and ``stager``: who staged the
    values, in errors: NOTE [who staged a value]). ``f`` returns a list of values: staged
    ones, arrays it made or closed over (constants of the program) and Python scalars
    (literals). Returns the :class:`~cuvmap.transforms.ir.ClosedJaxpr` from the arguments
    to those values. ``python_number_args``: the weakly typed arguments will be Python
    numbers when the program runs (NOTE [a weak value meets a strong one])."""
    builder = JaxprBuilder(stager)
    # a program's names are relative to the function staged (NOTE [named scopes] in core/tracers.py)
    with core.new_main(StagingTrace, builder, name=name) as main, core.staging(main), core.new_name_stack():
        invars = [Var(a, None if origins is None else origins[i]) for i, a in enumerate(in_avals)]
        if python_number_args:
            builder.python_number_args = {v for v in invars if v.aval.weak_type and v.aval.shape == ()}
        tracers = [StagedTracer(main, v) for v in invars]
        outs = f(*tracers)
        outvars = []
        for o in outs:
            if main.owns(o):
                outvars.append(o.var)
            elif type(o) in core._PY_SCALAR_DTYPES:
                outvars.append(Literal(o))
            else:
                outvars.append(builder.const_var(o))
    jaxpr = Jaxpr(builder.constvars, invars, builder.eqns, outvars)
    return ClosedJaxpr(jaxpr, builder.consts)


# ---------------------------------------------------------------------------------------
# A user's function of pytrees
# ---------------------------------------------------------------------------------------


def stage_arguments(f, where, args, kwargs, static_nums, static_names, unhashable_ok=False):
    """Splits the arguments into static and traced ones. Returns ``(key, leaves, paths,
    avals, rebuild)``: the cache key (``None`` for unhashable statics with
    ``unhashable_ok``), the traced leaves with their paths (in the user's
    numbering of positional arguments) and avals, and ``rebuild(traced_leaves)``, which
    gives ``f``'s arguments back."""
    # as in JAX, a static position beyond the positional arguments given is ignored (the
    # argument may come by keyword, with static_argnames, or take its default)
    nums = {i % len(args) for i in static_nums if -len(args) <= i < len(args)}
    statics = [(f"argument {i}", args[i]) for i in sorted(nums)]
    statics += [(f"keyword argument {k}", kwargs[k]) for k in sorted(kwargs) if k in static_names]
    key_static = api_util.static_key(f, where, statics, unhashable_ok)
    dyn_args = tuple(a for i, a in enumerate(args) if i not in nums)
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_names}
    paths, leaves, treedef = tree.flatten_with_path((dyn_args, dyn_kwargs))
    # paths in the user's numbering of positional arguments
    dyn_positions = [i for i in range(len(args)) if i not in nums]
    user_paths = [(0, dyn_positions[p[1]]) + tuple(p[2:]) if p[0] == 0 else p for p in paths]
    avals = [api_util.leaf_aval(f, p, x, where) for p, x in zip(user_paths, leaves)]

    def rebuild(traced):
        d_args, d_kwargs = tree.unflatten(treedef, list(traced))
        it = iter(d_args)
        full = [args[i] if i in nums else next(it) for i in range(len(args))]
        full_kwargs = dict(d_kwargs)
        full_kwargs.update({k: v for k, v in kwargs.items() if k in static_names})
        return full, full_kwargs

    key = None if key_static is None else (treedef, tuple(avals), key_static, axis_env_key())
    return key, leaves, user_paths, avals, rebuild


def axis_env_key():
    """The named axes in scope (NOTE [named axes] in cuvmap/core/tracers.py) as a hashable value:
    their names, sizes and process groups. A program staged inside ``vmap(...,
    axis_name=...)`` or ``data_parallel`` depends on them (``all_gather``'s output shape,
    ``pmean``'s divisor), so staging caches key on it; ``()`` outside any."""
    env = core.axis_env()
    if not env:
        return ()
    return tuple((frame.name, frame.size, frame.communicator) for frame in env)


def trace_program(f, where, leaves, paths, avals, rebuild, python_number_args=False):
    """Stages ``f`` on ``avals`` (the traced leaves of :func:`stage_arguments`, whose
    ``paths`` name them in errors). Returns ``(ClosedJaxpr, out_tree)``.
    ``python_number_args``: the program runs on the leaves themselves, whose weakly typed
    ones are Python numbers (``jit``: NOTE [a weak value meets a strong one])."""
    out_tree_box = []

    def flat_fun(*traced):
        full, full_kwargs = rebuild(traced)
        out = f(*full, **full_kwargs)
        out_paths, out_leaves, out_tree = tree.flatten_with_path(out)
        api_util.check_outputs(f, out_leaves, out)
        out_tree_box.append(out_tree)
        return out_leaves

    origins = [api_util.describe_arg(f, p) for p in paths]
    closed = trace_to_jaxpr(flat_fun, avals, name=where, origins=origins, python_number_args=python_number_args)
    return closed, out_tree_box[0]
