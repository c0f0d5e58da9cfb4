"""``jit`` and ``make_jaxpr``: the entry points of staging.

``jit(f)`` traces ``f`` on abstract values into a program on its first call for each
argument signature (:mod:`cuvmap.transforms.staging`), optimizes and plans it
(:mod:`cuvmap.transforms.ir`, :mod:`cuvmap.transforms.executor`), and runs the plan on
later calls; ``make_jaxpr(f)`` returns the program. This module holds the caches and the
argument handling; the machinery is in :mod:`cuvmap.transforms`.
"""
import collections
import contextlib
import functools
import inspect
import threading
import warnings
import weakref

import numpy as np

from cuvmap import api_util, config, core, tree
from cuvmap import backend as backends  # (jit's parameter backend= is JAX's keyword)
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

    __slots__ = ("program", "out_tree", "plans", "donated", "named", "host_args", "device", "key", "fast_keys")

    def __init__(self, program, out_tree, donated):
        self.key, self.fast_keys = None, []   # its keys in _Programs
        self.program = program
        self.out_tree = out_tree
        self.plans = {}
        self.donated = donated
        # a GPU program's NumPy arguments, put on its device at each call (NOTE [host
        # arrays meet device arrays] in cuvmap/backend.py)
        self.host_args, self.device = executor.host_arguments(program)
        # the program has collectives over a vmap's axis: that vmap must process the call
        # even when it owns no argument (NOTE [named axes] in cuvmap/core/tracers.py)
        self.named = bool(axis_names_in({"program": program}))


def make_jaxpr(f, static_argnums=(), static_argnames=(), axis_env=None, return_shape=False):
    """The program ``jit`` would stage for ``f``: ``make_jaxpr(f)(*args)`` returns a
    :class:`~cuvmap.transforms.ir.ClosedJaxpr`, which prints in a text form close to
    JAX's, e.g. for ``make_jaxpr(cv.grad(lambda x: cnp.sin(x) * 2.0))(1.0)``::

        { lambda ; a:~f64[]. let
            b:f64[] = sin a
            c:f64[] = mul b 2.0
            ...
          in (e,) }

    (``~`` marks a weakly typed value: a Python scalar argument.) ``axis_env``: a list of
    ``(name, size)`` pairs, named axes bound while ``f`` is staged, so that its collectives
    (``lax.psum(x, "i")``) are staged as equations (JAX's); ``return_shape=True``: returns
    ``(jaxpr, shapes)``, the results' shapes and dtypes as a pytree of
    :class:`~cuvmap.core.ShapeDtypeStruct` (JAX's).
    """
    api_util.check_callable(f, "make_jaxpr")
    where = f"make_jaxpr({api_util.fun_name(f)})"
    static_nums, static_names, _ = api_util.normalize_static(f, static_argnums, static_argnames, (), where)

    @api_util.with_context(where, f)
    def make(*args, **kwargs):
        _, leaves, paths, avals, rebuild = staging.stage_arguments(f, where, args, kwargs, static_nums, static_names)
        with contextlib.ExitStack() as axes:
            for name, size in axis_env or ():
                axes.enter_context(core.extend_axis_env(core.AxisFrame(name, int(size))))
            closed, out_tree = staging.trace_program(f, where, leaves, paths, avals, rebuild, True)
        return (closed, _out_info(closed, out_tree)) if return_shape else closed

    return make


def eval_shape(f, *args, **kwargs):
    """The shapes and dtypes of ``f(*args, **kwargs)``, as a pytree of
    :class:`~cuvmap.core.ShapeDtypeStruct`, without computing anything (``jax.eval_shape``):
    ``f`` is staged on abstract values (as ``jit`` traces it) and nothing runs, so the
    arguments may be :class:`~cuvmap.core.ShapeDtypeStruct` of any size as well as arrays
    and Python numbers (weakly typed, as in JAX)::

        cv.eval_shape(lambda x: x @ x.T, cv.ShapeDtypeStruct((100_000, 512), np.float32))
        # ShapeDtypeStruct(shape=(100000, 100000), dtype=float32)
    """
    api_util.check_callable(f, "eval_shape")
    where = f"eval_shape({api_util.fun_name(f)})"
    _, leaves, paths, avals, rebuild = staging.stage_arguments(f, where, args, kwargs, (), ())
    closed, out_tree = staging.trace_program(f, where, leaves, paths, avals, rebuild, True)
    outs = [core.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type, device=a.device or None)
            for a in closed.out_avals]
    return tree.unflatten(out_tree, outs)


_LIVE_JITTED = weakref.WeakSet()  # every jitted function alive, for clear_caches


def clear_caches():
    """Drops the programs and buffer pools every live jitted function keeps (JAX's
    ``jax.clear_caches``): the next call of each traces again. Each jitted function's own
    ``f.clear_cache()`` does this for one."""
    for jitted in list(_LIVE_JITTED):
        jitted.clear_cache()


def jit(f=None, static_argnums=(), static_argnames=(), donate_argnums=(), *, donate_argnames=(), keep_unused=False,
        device=None, backend=None, inline=False, compiler_options=None):  # noqa: A002 - JAX's keyword backend=
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
      donate_argnames: the same, by parameter name (JAX's; a name may not be static too).
      device, backend: the device to run on (``"cpu"``, ``"gpu"`` or one of
        :func:`cuvmap.devices`; ``backend`` names a platform): array arguments elsewhere
        are put there first (an explicit transfer). None: where the operands are.
      keep_unused, inline, compiler_options: JAX's options for XLA (keeping unused
        arguments, inlining into an enclosing ``jit``, XLA compiler flags as a dict),
        accepted with JAX's signature; they change no value and cuvmap's program is the
        same with or without them.
    Returns:
      the jitted function; ``.trace_count`` says how many times it has traced,
      ``.kept_pools()`` what its plans keep between calls and ``.kept_programs()`` how
      many programs it keeps (NOTE [what a jitted function keeps]: both bounded),
      ``.clear_cache()`` drops its programs and buffers.

    As in JAX, Python side effects (``print``, appending to a list) run while tracing
    only, not on the calls that reuse the program; Python control flow on traced values
    raises :class:`~cuvmap.core.ConcretizationError` (make the value static, or use
    ``cuvmap.numpy.where``). Arrays the function closes over are captured as constants of
    the program when it is traced. Used as ``@jit`` or ``@jit(static_argnums=...)``.
    """
    options = dict(donate_argnames=donate_argnames, keep_unused=keep_unused, device=device, backend=backend,
                   inline=inline, compiler_options=compiler_options)
    if f is None:
        return lambda g: jit(g, static_argnums, static_argnames, donate_argnums, **options)
    api_util.check_callable(f, "jit")
    where = f"jit({api_util.fun_name(f)})"
    static_nums, static_names, donated_nums = api_util.normalize_static(
        f, static_argnums, static_argnames, donate_argnums, where)
    api_util.validate_jit_argnums(f, static_argnums, "static_argnums", where)
    api_util.validate_jit_argnums(f, donate_argnums, "donate_argnums", where)
    api_util.validate_jit_argnames(f, static_argnames, "static_argnames", where)
    donated_nums |= _donated_names(f, static_names, donate_argnames, compiler_options, where)
    put_on = _jit_device(device, backend, where)
    if put_on is not None:
        f_on_device = f

        def f(*args, **kwargs):  # the arguments put on the device first, staged or not
            args, kwargs = _arrays_on(put_on, (args, kwargs))
            return f_on_device(*args, **kwargs)

        f = functools.wraps(f_on_device)(f)
    programs = _Programs()  # NOTE [what a jitted function keeps]
    cache, fast = programs.by_key, programs.fast  # (reads without the lock: NOTE [jit's fast path])
    flights = _SingleFlight()  # NOTE [one trace per signature]
    pools = _KeptPools()  # NOTE [what a jitted function keeps]
    no_statics = not static_nums and not static_names

    @api_util.with_context(where, f)
    def jitted(*args, **kwargs):
        if config.disable_jit:  # JAX's disable_jit: the function itself, eagerly
            return f(*args, **kwargs)
        if no_statics:
            leaves, treedef = tree.flatten((args, kwargs))
            signature = _fast_signature(leaves)
            entry = fast.get((treedef, signature, staging.axis_env_key())) if signature is not None else None
            if entry is not None and core._state.staging_main is None and not entry.named:
                if programs.last is not entry:
                    programs.used(entry)
                if entry.host_args:
                    leaves = backends.arguments_on_device(leaves, entry.host_args, entry.device)
                outs = executor.execute(executor.plan_for(entry.plans, entry.program, entry.donated), leaves)
                if pools.last is not entry:
                    pools.used(entry)
                return tree.unflatten(entry.out_tree, api_util.unaliased([api_util.to_array_result(o) for o in outs], leaves))
        key, leaves, paths, avals, rebuild = staging.stage_arguments(f, where, args, kwargs, static_nums, static_names)
        entry = entry_for(key, leaves, paths, avals, rebuild)
        program = entry.program
        eager = (core._state.staging_main is None and not entry.named
                 and not any(isinstance(x, Tracer) for x in leaves)
                 and not any(isinstance(c, Tracer) for c in program.consts))
        if eager:
            _check_concrete(leaves, paths, f, where)
            if entry.host_args:
                leaves = backends.arguments_on_device(leaves, entry.host_args, entry.device)
            outs = executor.execute(executor.plan_for(entry.plans, program, entry.donated), leaves)
            if pools.last is not entry:
                pools.used(entry)
        else:
            outs = call(program, leaves)
        results = api_util.unaliased([api_util.to_array_result(o) for o in outs], leaves)
        return tree.unflatten(entry.out_tree, results)

    def entry_for(key, leaves, paths, avals, rebuild):
        """The cache entry of the signature ``key``, staged now if it is new."""
        entry = cache.get(key)
        if entry is not None and programs.last is not entry:
            programs.used(entry)
        if entry is None:
            with flights.flight(key) as first:
                entry = None if first else cache.get(key)
                if entry is None:
                    closed, out_tree = staging.trace_program(f, where, leaves, paths, avals, rebuild, True)
                    program = ir.optimize(closed)
                    donated = tuple(i for i, p in enumerate(paths) if p[0] == 0 and p[1] in donated_nums)
                    entry = _Staged(program, out_tree, donated)
                    jitted.trace_count += 1
                    if not any(isinstance(c, Tracer) for c in program.consts):
                        # (a program holding tracers of this call's transforms is for this call only)
                        signature = _fast_signature(leaves) if no_statics else None
                        programs.add(key, entry, None if signature is None else (key[0], signature, key[3]))
                        _warn_retraces(programs.added, where)
        return entry

    @api_util.with_context(where, f)
    def trace(*args, **kwargs):
        """``f`` staged on these arguments (arrays, Python numbers or
        :class:`~cuvmap.core.ShapeDtypeStruct`), as :func:`make_jaxpr` stages it: a
        :class:`Traced` (``.jaxpr``, ``.out_info``, ``.lower()``). Runs nothing."""
        _, leaves, paths, avals, rebuild = staging.stage_arguments(f, where, args, kwargs, static_nums, static_names)
        closed, out_tree = staging.trace_program(f, where, leaves, paths, avals, rebuild, True)
        return Traced(closed, out_tree, lambda: lower(*args, **kwargs))

    @api_util.with_context(where, f)
    def lower(*args, **kwargs):
        """The program the jitted function runs for arguments like these (arrays, Python
        numbers or :class:`~cuvmap.core.ShapeDtypeStruct`): a :class:`Lowered`
        (``.as_text()``, ``.out_info``, ``.compile()``). Nothing runs, and the program is
        kept: a later call with arrays of these shapes and dtypes runs it without tracing."""
        key, leaves, paths, avals, rebuild = staging.stage_arguments(f, where, args, kwargs, static_nums, static_names)
        return Lowered(entry_for(key, leaves, paths, avals, rebuild), key, jitted, where)

    def jitted_eval_shape(*args, **kwargs):
        """The shapes and dtypes of the results, as :func:`eval_shape` (the program is kept
        for later calls, as by :meth:`lower`)."""
        return lower(*args, **kwargs).out_info

    def clear_cache():
        programs.clear()
        pools.clear()

    jitted.trace_count = 0
    jitted.clear_cache = clear_cache
    jitted.kept_pools = pools.info
    jitted.kept_programs = programs.info
    jitted.trace = trace
    jitted.lower = lower
    jitted.eval_shape = jitted_eval_shape
    jitted._stage_arguments = lambda *args, **kwargs: staging.stage_arguments(
        f, where, args, kwargs, static_nums, static_names)
    jitted._signature_key = lambda *args, **kwargs: jitted._stage_arguments(*args, **kwargs)[0]
    _LIVE_JITTED.add(jitted)
    return jitted


def _donated_names(f, static_names, donate_argnames, compiler_options, where):
    """The positions of the parameters named in ``donate_argnames`` (JAX's errors for a
    name that is static too or not a parameter); checks ``compiler_options`` is a dict."""
    names = (donate_argnames,) if isinstance(donate_argnames, str) else tuple(donate_argnames)
    if any(not isinstance(n, str) for n in names):
        raise TypeError(f"{where}: donate_argnames must be a str or a tuple of str, got {donate_argnames!r}")
    both = sorted(set(names) & set(static_names))
    if both:
        raise ValueError(f"{where}: static_argnames and donate_argnames cannot intersect. Argument names "
                         f"{', '.join(both)} appear in both")
    if compiler_options is not None and not isinstance(compiler_options, dict):
        raise TypeError(f"{where}: compiler_options must be a dict, got {type(compiler_options).__name__}")
    if not names:
        return set()
    try:
        signature = inspect.signature(f)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: Getting the signature of function {f!r} failed. Pass donate_argnums instead of "
                         "donate_argnames.") from None
    kinds = {name: p.kind for name, p in signature.parameters.items()}
    var_keyword = any(k == inspect.Parameter.VAR_KEYWORD for k in kinds.values())
    for n in names:
        kind = kinds.get(n)
        if kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL) or (kind is None and not var_keyword):
            raise ValueError(f"{where}: donate_argnames names {n!r}, which is not a parameter that can be passed by "
                             f"keyword (the signature is {signature})")
    params = api_util.param_names(f)
    return {params.index(n) for n in names if n in params}


def _jit_device(device, backend, where):
    """``"cpu"``, ``"gpu"`` or None from jit's ``device`` and ``backend``."""
    if device is not None and backend is not None:
        raise ValueError(f"{where}: can't specify both a device and a backend for jit")
    chosen = device if device is not None else backend
    if chosen is None:
        return None
    platform = getattr(chosen, "platform", chosen)
    platform = {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)
    if platform not in ("cpu", "gpu"):
        raise ValueError(f"{where}: unknown device or backend {chosen!r}; use 'cpu', 'gpu' or one of cuvmap.devices()")
    return platform


def _arrays_on(platform, args):
    """The NumPy and CuPy array leaves of ``args`` put on ``platform`` (other leaves, such
    as static strings and Python numbers, as they are)."""
    def put(leaf):
        if isinstance(leaf, np.ndarray) or backends.is_cupy_array(leaf):
            return backends.device_put(leaf, platform)
        return leaf

    return tree.map_preserving(put, args)


def _check_concrete(leaves, paths, f, where):
    """A jitted function runs on arrays: a :class:`~cuvmap.core.ShapeDtypeStruct` argument
    (shapes only) is for its ``.lower``/``.trace``/``.eval_shape`` and :func:`eval_shape`."""
    for leaf, path in zip(leaves, paths):
        if type(leaf) is core.ShapeDtypeStruct:
            raise api_util.TransformError(
                f"{api_util.describe_arg(f, path)} is a {leaf!r}, which has a shape but no values; a jitted "
                f"function runs on arrays. Use {where}.lower(...), .trace(...) or .eval_shape(...), or "
                "cv.eval_shape, to stage it on shapes alone")


def _out_info(program, out_tree):
    return tree.unflatten(out_tree, [core.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type,
                                                           device=a.device or None) for a in program.out_avals])


class Traced:
    """``jit(f).trace(*args)``: the staged program before optimization (``jaxpr``, as
    :func:`make_jaxpr` gives it), the shapes of the results (``out_info``, a pytree of
    :class:`~cuvmap.core.ShapeDtypeStruct`), and :meth:`lower`."""

    def __init__(self, jaxpr, out_tree, lower):
        self.jaxpr = jaxpr
        self.out_info = _out_info(jaxpr, out_tree)
        self._lower = lower

    def lower(self, *, lowering_platforms=None):
        """The :class:`Lowered` program (``lowering_platforms``, JAX's choice of XLA targets,
        is accepted: cuvmap's program is the same for every platform)."""
        return self._lower()


class Lowered:
    """``jit(f).lower(*args)``: the optimized program that ``jit`` runs for one argument
    signature. ``as_text()`` prints it, ``out_info`` holds the results' shapes and dtypes,
    ``compile()`` gives the function that runs it (arguments of that signature only)."""

    def __init__(self, entry, key, jitted, where):
        self.program = entry.program
        self.out_info = _out_info(entry.program, entry.out_tree)
        self.in_avals = list(entry.program.in_avals)
        self._key = key
        self._jitted = jitted
        self._where = where

    def as_text(self, dialect=None, *, debug_info=False):
        """The staged program's text (``dialect``, JAX's choice of IR, and ``debug_info`` are
        accepted: cuvmap has one program text)."""
        return str(self.program)

    def compile(self, compiler_options=None):
        """The :class:`Compiled` function (``compiler_options``, XLA's flags as a dict, are
        accepted and change nothing)."""
        if compiler_options is not None and not isinstance(compiler_options, dict):
            raise TypeError(f"{self._where}: compiler_options must be a dict, got {type(compiler_options).__name__}")
        return Compiled(self)


class Compiled:
    """``jit(f).lower(*args).compile()``: runs the lowered program on arguments of the
    signature it was lowered for; other arguments raise a ``TypeError``, as in JAX."""

    def __init__(self, lowered):
        self.lowered = lowered
        self.out_info = lowered.out_info

    def as_text(self, dialect=None, *, debug_info=False):
        return self.lowered.as_text(dialect, debug_info=debug_info)

    def __call__(self, *args, **kwargs):
        lowered = self.lowered
        key, leaves, paths, avals, _ = lowered._jitted._stage_arguments(*args, **kwargs)
        if key != lowered._key:
            raise TypeError(f"{lowered._where}: the compiled function was lowered for arguments of avals "
                            f"{lowered.in_avals}; these arguments differ (structure, shapes, dtypes or statics): "
                            f"{_compiled_mismatch(lowered, key, leaves, paths, avals)}")
        return lowered._jitted(*args, **kwargs)


def _compiled_mismatch(lowered, key, leaves, paths, avals):
    """JAX's words for how a compiled function's arguments differ from its signature."""
    tracer = next((x for x in leaves if isinstance(x, core.Tracer)), None)
    if tracer is not None:
        return ("Cannot apply JAX transformations to a function lowered and compiled for a particular signature. "
                f"Detected argument of Tracer type {type(tracer)}; transform jit(f) itself instead")
    if key[0] != lowered._key[0]:
        return ("Function compiled with input pytree does not match the input pytree it was called with: compiled "
                f"with {lowered._key[0]}, called with {key[0]}")
    if tuple(avals) != tuple(lowered._key[1]):
        f = getattr(lowered._jitted, "__wrapped__", None)
        mismatches = [f"Argument '{api_util.arg_path_name(f, p)}' compiled with {api_util.aval_str(a)} and called "
                      f"with {api_util.aval_str(b)}"
                      for p, a, b in zip(paths, lowered._key[1], avals) if a != b]
        return ("Argument types differ from the types for which this computation was compiled. The mismatches "
                "are:\n" + "\n".join(mismatches))
    return "the static arguments differ"


# NOTE [one trace per signature]
# Threads that call a jitted function for the first time with the same signature at once
# would each trace it (and count a trace each) while only one program is kept. A "single
# flight" per cache key makes the first thread trace and the others wait for its program;
# a thread that meets its own flight (a function that calls itself while tracing) traces
# on, and a trace that raises lets the waiters trace for themselves (and raise the same).


class _SingleFlight:
    """Per-key flights: ``with flights.flight(key) as first:`` -- ``first`` is True for
    the thread that must trace (the others wait until it has left the block)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._flights = {}  # key -> (owner thread id, threading.Event)

    @contextlib.contextmanager
    def flight(self, key):
        me = threading.get_ident()
        with self._lock:
            current = self._flights.get(key)
            if current is None:
                done = threading.Event()
                self._flights[key] = (me, done)
        if current is not None:
            owner, done = current
            if owner != me:
                done.wait()
            yield False
            return
        try:
            yield True
        finally:
            with self._lock:
                del self._flights[key]
            done.set()


# NOTE [what a jitted function keeps]
# Per argument signature a jitted function keeps its program and plans (small: the steps
# and a generated function, about as much as JAX's compiled code per shape) and, on the
# CPU, each plan's pool: the buffers of its intermediates, reused across calls so that a
# steady state allocates almost only the outputs (NOTE [buffer planning] in
# cuvmap/transforms/executor/buffers.py); about the size of the program's live intermediates. The
# pools are kept for the most recently used ``jit_pool_signatures`` signatures (8) while
# they hold at most ``jit_pool_bytes`` (1 GiB) in all: when a call switches to another
# signature, the least recently used pools beyond those bounds are emptied (never the one
# just called) and glibc's heap is trimmed (``malloc_trim``), so that a function called on
# a stream of shapes holds a bounded amount. The check runs only when the signature
# changes: a call with the same signature as the last pays one identity test.
# The programs themselves are bounded the same way: at most ``jit_cache_signatures``
# (CUVMAP_JIT_CACHE_SIGNATURES, 512) signatures keep theirs, the least recently used
# dropped beyond (a new call of that signature traces again); each is about 15 KB, so a
# function called on a stream of shapes keeps a few MB at most, where it kept every
# program it ever traced. Recency is updated when the signature changes, as the pools'.


class _Programs:
    """The programs of a jitted function by signature key (``by_key``) and by NOTE [jit's
    fast path]'s key (``fast``), at most ``config.jit_cache_signatures`` of them, the least
    recently used dropped first (NOTE [what a jitted function keeps])."""

    def __init__(self):
        self._lock = threading.Lock()
        self.by_key = collections.OrderedDict()
        self.fast = {}
        self.last = None
        self.evicted = 0
        self.added = 0

    def used(self, entry):
        """``entry`` was just called (a signature other than the last one's)."""
        with self._lock:
            self.last = entry
            if self.by_key.get(entry.key) is entry:
                self.by_key.move_to_end(entry.key)

    def add(self, key, entry, fast_key):
        with self._lock:
            entry.key = key
            self.by_key[key] = entry
            self.added += 1
            if fast_key is not None:
                self.fast[fast_key] = entry
                entry.fast_keys.append(fast_key)
            self.last = entry
            bound = max(config.read("jit_cache_signatures"), 1)
            while len(self.by_key) > bound:
                _, old = self.by_key.popitem(last=False)
                for k in old.fast_keys:
                    if self.fast.get(k) is old:
                        del self.fast[k]
                self.evicted += 1

    def clear(self):
        with self._lock:
            self.by_key.clear()
            self.fast.clear()
            self.last = None

    def info(self):
        """``{"signatures": n kept, "bound": the bound, "evicted": dropped so far}``."""
        with self._lock:
            return {"signatures": len(self.by_key), "bound": max(config.read("jit_cache_signatures"), 1),
                    "evicted": self.evicted}


class _KeptPools:
    """The signatures whose plans keep their pools, least recently used first."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries = collections.OrderedDict()  # id(entry) -> (entry, its pools' bytes)
        self.last = None
        self.dropped_bytes = 0

    def used(self, entry):
        """``entry`` was just run eagerly: make it the most recent and enforce the bounds."""
        nbytes = sum(executor.pool_bytes(p) for p in list(entry.plans.values()))
        dropped = 0
        with self._lock:
            self.last = entry
            self._entries[id(entry)] = (entry, nbytes)  # the others' sizes as of their last call
            self._entries.move_to_end(id(entry))
            limit, budget = max(config.jit_pool_signatures, 1), config.jit_pool_bytes
            total = sum(b for _, b in self._entries.values())
            while len(self._entries) > 1 and (len(self._entries) > limit or total > budget):
                _, (oldest, oldest_bytes) = self._entries.popitem(last=False)
                dropped += sum(executor.empty_pool(p) for p in list(oldest.plans.values()))
                total -= oldest_bytes
            self.dropped_bytes += dropped
        if dropped:
            executor.release_host_memory()

    def clear(self):
        with self._lock:
            entries = [e for e, _ in self._entries.values()]
            self._entries, self.last = collections.OrderedDict(), None
        for e in entries:
            for p in list(e.plans.values()):
                executor.empty_pool(p)
        executor.release_host_memory()

    def info(self):
        """``{"signatures": n, "bytes": pooled bytes, "dropped_bytes": dropped so far}``."""
        with self._lock:
            entries = [e for e, _ in self._entries.values()]
            dropped = self.dropped_bytes
        nbytes = sum(executor.pool_bytes(p) for e in entries for p in list(e.plans.values()))
        return {"signatures": len(entries), "bytes": nbytes, "dropped_bytes": dropped}


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


def _warn_retraces(num_signatures, where):
    """Warns once, when the ``JIT_RETRACE_WARNING``-th signature has been traced (programs
    traced per call because they hold an outer transform's tracers do not count)."""
    limit = JIT_RETRACE_WARNING
    if limit is not None and num_signatures == limit:
        warnings.warn(
            f"{where} has been traced {limit} times: each new argument shape, dtype or static "
            "value traces it again (a batch size that changes every call, a Python number that "
            "should be an array); see its .trace_count",
            RetraceWarning, stacklevel=4,
        )
