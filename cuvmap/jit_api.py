"""``jit`` and ``make_jaxpr``: the entry points of staging.

``jit(f)`` traces ``f`` on abstract values into a program on its first call for each
argument signature (:mod:`cuvmap.transforms.staging`), optimizes and plans it
(:mod:`cuvmap.transforms.ir`, :mod:`cuvmap.transforms.executor`), and runs the plan on
later calls; ``make_jaxpr(f)`` returns the program. This module holds the caches and the
argument handling; the machinery is in :mod:`cuvmap.transforms`.
"""
import warnings

import numpy as np

from cuvmap import api_util, core, tree
from cuvmap.core import Tracer
from cuvmap.transforms import executor, ir, staging
from cuvmap.transforms.call import axis_names_in
from cuvmap.transforms.program_call import call


class RetraceWarning(UserWarning):
    """A jitted function was traced again and again (new shapes, dtypes or static values
    on most calls), so it pays tracing far more often than it runs a cached program."""


# A jitted function warns (once) when it has been traced this many times; None: never.
JIT_RETRACE_WARNING = 20


class _Staged:
    """A cache entry of a jitted function: the program, the output structure, and the
    executor's plans (made on the first eager run, with the donated arguments; one per
    combination of the jit settings)."""

    __slots__ = ("program", "out_tree", "plans", "donated", "named")

    def __init__(self, program, out_tree, donated):
        self.program = program
        self.out_tree = out_tree
        self.plans = {}
        self.donated = donated
        # the program has collectives over a vmap's axis: that vmap must process the call
        # even when it owns no argument (NOTE [named axes] in cuvmap/core.py)
        self.named = bool(axis_names_in({"program": program}))


def make_jaxpr(f, static_argnums=(), static_argnames=()):
    """The program ``jit`` would stage for ``f``: ``make_jaxpr(f)(*args)`` returns a
    :class:`~cuvmap.transforms.ir.ClosedJaxpr`, which prints in a text form close to
    JAX's, e.g. for ``make_jaxpr(cv.grad(lambda x: cnp.sin(x) * 2.0))(1.0)``::

        { lambda ; a:~f64[]. let
            b:f64[] = sin a
            c:f64[] = mul b 2.0
            ...
          in (e,) }

    (``~`` marks a weakly typed value: a Python scalar argument.)
    """
    api_util.check_callable(f, "make_jaxpr")
    where = f"make_jaxpr({api_util.fun_name(f)})"
    static_nums, static_names, _ = api_util.normalize_static(f, static_argnums, static_argnames, (), where)

    @api_util.with_context(where, f)
    def make(*args, **kwargs):
        _, leaves, paths, avals, rebuild = staging.stage_arguments(f, where, args, kwargs, static_nums, static_names)
        closed, _ = staging.trace_program(f, where, leaves, paths, avals, rebuild)
        return closed

    return make


def jit(f=None, static_argnums=(), static_argnames=(), donate_argnums=()):
    """Stages ``f`` into a program on its first call and runs that program afterwards.

    The first call with given argument structure, shapes, dtypes, weak types (Python
    scalars), devices and static values traces ``f`` on abstract values into a program
    (see :func:`make_jaxpr`), which is optimized (common subexpressions, constant folding,
    dead code) and planned (NOTE [buffer planning] in :mod:`cuvmap.transforms.executor`);
    later calls that match run the plan without tracing. ``jit`` composes with every
    transform in every order: ``vmap(jit(f))``, ``grad(jit(f))`` and ``jit(vmap(grad(f)))``
    stage programs of their own.

    Args:
      f: the function; its arguments and results are pytrees of arrays and Python numbers.
      static_argnums, static_argnames: arguments that are not traced but passed to ``f``
        as they are (Python configuration values: sizes, flags, strings); they must be
        hashable, and each new value traces again.
      donate_argnums: positional arguments whose buffers the program may overwrite (the
        caller must not use them afterwards).
    Returns:
      the jitted function; ``.trace_count`` says how many times it has traced.

    As in JAX, Python side effects (``print``, appending to a list) run while tracing
    only, not on the calls that reuse the program; Python control flow on traced values
    raises :class:`~cuvmap.core.ConcretizationError` (make the value static, or use
    ``cuvmap.numpy.where``). Arrays the function closes over are captured as constants of
    the program when it is traced. Used as ``@jit`` or ``@jit(static_argnums=...)``.
    """
    if f is None:
        return lambda g: jit(g, static_argnums, static_argnames, donate_argnums)
    api_util.check_callable(f, "jit")
    where = f"jit({api_util.fun_name(f)})"
    static_nums, static_names, donated_nums = api_util.normalize_static(
        f, static_argnums, static_argnames, donate_argnums, where)
    cache = {}
    fast = {}  # NOTE [jit's fast path]
    no_statics = not static_nums and not static_names

    @api_util.with_context(where, f)
    def jitted(*args, **kwargs):
        if no_statics:
            leaves, treedef = tree.flatten((args, kwargs))
            signature = _fast_signature(leaves)
            entry = fast.get((treedef, signature, staging.axis_env_key())) if signature is not None else None
            if entry is not None and core._state.staging_main is None and not entry.named:
                outs = executor.execute(executor.plan_for(entry.plans, entry.program, entry.donated), leaves)
                return tree.unflatten(entry.out_tree, api_util.unaliased([api_util.to_array_result(o) for o in outs], leaves))
        key, leaves, paths, avals, rebuild = staging.stage_arguments(f, where, args, kwargs, static_nums, static_names)
        entry = cache.get(key)
        if entry is None:
            closed, out_tree = staging.trace_program(f, where, leaves, paths, avals, rebuild)
            program = ir.optimize(closed)
            donated = tuple(i for i, p in enumerate(paths) if p[0] == 0 and p[1] in donated_nums)
            entry = _Staged(program, out_tree, donated)
            jitted.trace_count += 1
            if not any(isinstance(c, Tracer) for c in program.consts):
                cache[key] = entry  # a program holding tracers of this call's transforms is for this call only
                if no_statics:
                    signature = _fast_signature(leaves)
                    if signature is not None:
                        fast[(key[0], signature, key[3])] = entry
            _warn_retraces(jitted, where)
        program = entry.program
        eager = (core._state.staging_main is None and not entry.named
                 and not any(isinstance(x, Tracer) for x in leaves)
                 and not any(isinstance(c, Tracer) for c in program.consts))
        if eager:
            outs = executor.execute(executor.plan_for(entry.plans, program, entry.donated), leaves)
        else:
            outs = call(program, leaves)
        results = api_util.unaliased([api_util.to_array_result(o) for o in outs], leaves)
        return tree.unflatten(entry.out_tree, results)

    def clear_cache():
        cache.clear()
        fast.clear()

    jitted.trace_count = 0
    jitted.clear_cache = clear_cache
    return jitted


# NOTE [jit's fast path]
# A call of a jitted function that finds its program should cost little more than the
# program. The full lookup builds the arguments' avals and paths (for error messages) on
# every call; when the function has no static arguments and every argument leaf is a NumPy
# array or a Python number, the leaves' (shape, dtype) and scalar types determine the
# avals (NumPy arrays live on the CPU; Python numbers are weakly typed), so a second
# dictionary keyed by the pytree structure and that signature finds the entry directly.
# Anything else (CuPy arrays, whose device counts; tracers; NumPy scalars) takes the full
# lookup, which also fills the fast dictionary.


def _fast_signature(leaves):
    """The leaves' signature for NOTE [jit's fast path], or None when a leaf needs the full
    lookup."""
    signature = []
    for x in leaves:
        t = type(x)
        if t is np.ndarray:
            signature.append((x.shape, x.dtype))
        elif t in core._PY_SCALAR_DTYPES:
            signature.append(t)
        else:
            return None
    return tuple(signature)


def _warn_retraces(jitted, where):
    limit = JIT_RETRACE_WARNING
    if limit is not None and jitted.trace_count == limit:
        warnings.warn(
            f"{where} has been traced {limit} times: each new argument shape, dtype or static "
            "value traces it again (a batch size that changes every call, a Python number that "
            "should be an array); see its .trace_count",
            RetraceWarning, stacklevel=3,
        )
