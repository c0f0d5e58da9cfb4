"""What the public transforms share: flattening arguments, ``in_axes``/``out_axes`` and
``argnums`` checks, static arguments and avals for staging, results that never alias their
inputs, and the error text.

Every error raised while a transformed function runs starts with the transform and the
function, e.g. ``vmap(loss, in_axes=(None, 0, 0)): argument 2 (ys) has size 10 along axis
0, ...``: :func:`with_context` adds the prefix, :func:`describe_arg` names an argument by its
pytree path. The transforms (:mod:`cuvmap.api`, :mod:`cuvmap.jit_api`,
:mod:`cuvmap.transforms`) import these; none of them is part of the public API.
"""
import collections
import functools
import inspect

import numpy as np

from cuvmap import backend, core, dtypes, tree
from cuvmap.core import CuvmapError, Tracer
from cuvmap.core.bfloat16 import kind_of
# ---------------------------------------------------------------------------------------
# Errors and names: functions, arguments by pytree path, error prefixes
# ---------------------------------------------------------------------------------------


class TransformError(CuvmapError, ValueError):
    """Bad arguments to a transform (axes, argnums, shapes of inputs or cotangents)."""


class ArgumentTypeError(TransformError, TypeError):
    """An argument of a type a transform cannot trace (a string, an arbitrary object): a
    ``TypeError``, as JAX's "is not a valid JAX type" (and a :class:`TransformError`)."""


class InputTypeError(TransformError, TypeError):
    """A differentiated input that is not a floating-point (or complex) value: a
    ``TypeError``, as JAX's "grad requires real- or complex-valued inputs" (and a
    :class:`TransformError`)."""


class OutputTypeError(TransformError, TypeError):
    """A transformed function returned something that is not an array or a number (a
    string, an arbitrary object, an array of strings): a ``TypeError``, as JAX's "is not a
    valid JAX type" (and a :class:`TransformError`)."""


class AuxOutputError(TransformError, TypeError):
    """With ``has_aux=True`` the function did not return a pair ``(output, aux)``: a
    ``TypeError``, as JAX's (and a :class:`TransformError`)."""


class GradOutputError(TransformError, TypeError):
    """``grad``'s function returned something other than one real or complex scalar (an
    array, a tuple, ``None``, an integer): a ``TypeError``, as JAX's "Gradient only defined
    for scalar-output functions" (and a :class:`TransformError`)."""


def is_output_leaf(x):
    """Whether ``x`` may be a leaf of a transformed function's result: a tracer, a Python
    number, or an array (NumPy, CuPy) of booleans or numbers."""
    if not core.is_value(x):
        return False
    dtype = getattr(x, "dtype", None)
    return dtype is None or kind_of(np.dtype(dtype)) in "biufcV"


def check_outputs(f, out_leaves, out, role="transformed function"):
    """Refuses a result ``out`` of ``f`` (flattened: ``out_leaves``) with a leaf that is
    not an array or a number (:class:`OutputTypeError`, naming ``f`` and the leaf's path;
    ``role`` says what ``f`` is to the transform: ``"batched function"`` for vmap)."""
    for k, leaf in enumerate(out_leaves):
        if not is_output_leaf(leaf):
            path = tree.flatten_with_path(out)[0][k]
            what = type(leaf).__name__ if not hasattr(leaf, "dtype") else f"an array of dtype {leaf.dtype}"
            raise OutputTypeError(
                f"Output from {role} {fun_name(f)}: {describe_out(path)} is {what} ({_short_repr(leaf)}): function "
                f"{fun_sourceinfo(f)} returned a value of type {type(leaf)} at output component "
                f"{tree.keystr(path) or '[]'}, which is not a valid JAX type: a transformed function returns arrays, "
                "Python numbers or pytrees of them (None and empty containers are pytrees with no leaves)")


def fun_sourceinfo(f):
    """``f at file.py:12`` (JAX's ``fun_sourceinfo``), or just the name when the function
    has no Python source."""
    g = f
    while isinstance(g, functools.partial):
        g = g.func
    g = inspect.unwrap(g) if callable(g) else g
    code = getattr(g, "__code__", None)
    return f"{fun_name(f)} at {code.co_filename}:{code.co_firstlineno}" if code is not None else fun_name(f)


def _short_repr(x):
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."



def fun_name(f):
    while isinstance(f, functools.partial):
        f = f.func
    return getattr(f, "__name__", None) or type(f).__name__


def param_names(f):
    try:
        params = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):
        return []
    names = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            break
    return names


def describe_arg(f, path):
    """``argument 2 (ys)['w1']`` for the leaf at ``path`` of ``(args, kwargs)``."""
    if not path:
        return "the arguments"
    if path == (0,):
        return "the positional arguments"
    if path == (1,):
        return "the keyword arguments"
    if path[0] == 0 and len(path) > 1:
        i = path[1]
        names = param_names(f)
        name = f" ({names[i]})" if i < len(names) else ""
        return f"argument {i}{name}{tree.keystr(path[2:])}"
    if path[0] == 1 and len(path) > 1:
        return f"keyword argument {path[1]}{tree.keystr(path[2:])}"
    return tree.keystr(path)


def arg_path_name(f, path):
    """JAX's name of the leaf at ``path`` of ``(args, kwargs)``: ``x['w']`` by the parameter's
    name, ``args[3]`` past the named ones, ``kwargs['y']`` for a keyword argument."""
    if path and path[0] == 1:
        return f"kwargs{tree.keystr(path[1:])}"
    names = param_names(f) if f is not None else []
    if len(path) > 1 and path[1] < len(names):
        return f"{names[path[1]]}{tree.keystr(path[2:])}"
    return f"args{tree.keystr(path[1:])}"


def split_aux(f, out, has_aux):
    """``(output, aux)`` of ``f``'s result ``out``: the pair ``f`` returns with
    ``has_aux=True`` (checked), else ``(out, None)``."""
    if not has_aux:
        return out, None
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise AuxOutputError(
            f"with has_aux=True, {fun_name(f)} must return a pair (output, aux) as a two-element tuple, got "
            f"{tree.describe(out)}"
        )
    return out[0], out[1]


def shape_str(x):
    return str(tuple(core.shape_of(x)))


def with_context(where, f, name=None):
    """Decorator: CuvmapErrors raised inside get ``where`` as their prefix (the innermost
    transform names itself first). The wrapper is named ``name`` (default ``where``), so
    that ``vmap(grad(loss))`` reads as such in messages."""

    def wrap(impl):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            try:
                return impl(*args, **kwargs)
            except CuvmapError as err:
                if err.where is None:
                    err.where = where
                raise

        wrapper.__name__ = name or where
        wrapper.__qualname__ = name or where
        return wrapper

    return wrap


def is_axis(x):
    return x is None or is_int(x)


def check_callable(f, transform):
    if isinstance(f, staticmethod):
        raise TypeError(f"{transform}({fun_name(f.__func__)}): staticmethod arguments are not supported, got {f!r} "
                        f"(apply {transform} below @staticmethod)")
    if inspect.isgeneratorfunction(f):
        raise TypeError(f"{transform}({fun_name(f)}): Expected a function, got a generator function: a transformed "
                        "function returns its results instead of yielding them")
    if not callable(f):
        raise TypeError(f"{transform}({f!r}): the function to transform must be callable (Expected a callable value), "
                        f"got an object of type {type(f).__name__}")


def prefix_error(spec_name, spec, what, err, describe):
    """The TransformError for an ``in_axes``/``out_axes`` that is not a prefix of ``what``
    (JAX's "vmap in_axes specification must be a tree prefix of the corresponding value")."""
    return TransformError(
        f"vmap {spec_name} specification must be a tree prefix of the corresponding value; {spec_name} {spec!r} "
        f"is not a pytree prefix of the {what}. Mismatch details: at {describe(err.path)}, {spec_name} has "
        f"{err.reason}"
    )


def aval_str(x):
    """JAX's short form of a value's (or an aval's) type: ``float32[4,3]``."""
    aval = x if isinstance(x, core.ShapedArray) else core.get_aval(x)
    return f"{aval.dtype.name}[{','.join(str(d) for d in aval.shape)}]"


def describe_out(path):
    return f"output {tree.keystr(path)}" if path else "the output"

# ---------------------------------------------------------------------------------------
# Results: arrays, never aliases of the inputs
# ---------------------------------------------------------------------------------------


def aux_result(x):
    """Aux values come back as given, except that NumPy scalars become 0-d arrays."""
    return to_array_result(x) if isinstance(x, (np.generic, np.ndarray)) else x


def check_axes_spec(spec, what):
    """``in_axes`` / ``out_axes`` leaves are ints or None: else JAX's ``TypeError``."""
    for leaf in tree.leaves(spec, is_leaf=lambda x: x is None):
        if not is_axis(leaf):
            raise InputTypeError(f"{what} must be an int, None, or (nested) container with those types as leaves, "
                                 f"but got {spec!r} (its leaf {_short_repr(leaf)} is neither)")


def is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def to_array_result(x):
    """Results at the top level are arrays, never Python or NumPy scalars."""
    if isinstance(x, Tracer):
        return x
    if backend.is_cupy_array(x):
        # a broadcast view (an unbatched output of vmap) would alias in-place writes
        return x.copy() if 0 in x.strides and x.size > 1 else x
    if isinstance(x, np.ndarray):
        return x if x.flags.writeable else x.copy()
    return np.asarray(x)


# NOTE [results never alias inputs]
# NumPy and CuPy arrays are mutable, so a result that shares memory with an argument (or
# with another result) would let an in-place update of one silently change the other:
# ``vmap(lambda x: x)(xs)`` would return ``xs`` itself, and the two gradients of
# ``x + y`` the same array. JAX never has the problem (its arrays are immutable); here the
# transforms copy any result whose memory is owned by an argument or an earlier result.
# The check compares the arrays that own the memory (``.base``), so it costs a set lookup
# per leaf, not a pairwise overlap test.


def memory_owner(x):
    while getattr(x, "base", None) is not None:
        x = x.base
    return x


def unaliased(results, inputs):
    """``results`` (a list of leaves) with copies of those that share memory with a leaf of
    ``inputs`` or with an earlier result (NOTE [results never alias inputs])."""
    owners = {id(memory_owner(x)) for x in inputs if hasattr(x, "base")}
    out = []
    for r in results:
        if hasattr(r, "base") and not isinstance(r, Tracer):
            owner = id(memory_owner(r))
            if owner in owners:
                r = r.copy()
                owner = id(r)
            owners.add(owner)
        out.append(r)
    return out

# ---------------------------------------------------------------------------------------
# Arguments: in_axes and out_axes, argnums
# ---------------------------------------------------------------------------------------


IN_AXES_FORM = ("vmap in_axes must be an int, None, or a tuple of entries corresponding to the positional "
                "arguments passed to the function, but got ")


def check_in_axes_form(in_axes):
    """JAX's check of ``vmap``'s ``in_axes`` (a list counts as a tuple, as in JAX)."""
    if not (is_axis(in_axes) or isinstance(in_axes, tuple)):
        raise InputTypeError(f"{IN_AXES_FORM}{in_axes!r}.")


def flat_in_axes(f, in_axes, args, kwargs):
    if isinstance(in_axes, tuple):
        if len(in_axes) != len(args):
            msg = f"{IN_AXES_FORM}len(in_axes)={len(in_axes)}, len(args)={len(args)}."
            if kwargs:
                msg += (f" Note that the function was called with keyword arguments {list(kwargs)}, which the "
                        "entries of a tuple in_axes never correspond to: keyword arguments are always mapped along "
                        "their leading axis (axis 0). If that is the intended mapping, make in_axes correspond to "
                        "the positional arguments only; otherwise pass the arguments positionally, or bind "
                        "unmapped keyword arguments with functools.partial before applying vmap.")
            raise TransformError(f"{msg} ({fun_name(f)} was called with {len(args)} positional argument(s); give "
                                 "in_axes one entry per positional argument)")
        prefix = (in_axes, {k: 0 for k in kwargs})
    elif is_axis(in_axes):
        prefix = (tuple(in_axes for _ in args), {k: 0 for k in kwargs})
    else:
        raise InputTypeError(f"{IN_AXES_FORM}{in_axes!r}.")
    try:
        return tree.broadcast_prefix(prefix, (args, kwargs), is_axis)
    except tree.PrefixError as err:
        raise prefix_error("in_axes", in_axes, "arguments", err, lambda path: describe_arg(f, path)) from None


def check_mapped_sizes(f, paths, leaves, axes, axis_size, args_kwargs=None):
    """The leaves' axes normalized and the mapped size; ``args_kwargs``: vmap's arguments
    (its errors then lead with JAX's wording and name them)."""
    normalized = []
    mapped = []
    for path, leaf, axis in zip(paths, leaves, axes):
        if axis is None:
            normalized.append(None)
            continue
        if not (isinstance(leaf, Tracer) or hasattr(leaf, "shape")):
            raise TransformError(
                f"{describe_arg(f, path)} is a {type(leaf).__name__}, which has no axis {axis} to map over; "
                f"pass an array or give it in_axes None (JAX: vmap was requested to map its argument along axis {axis}, "
                f"which implies that its rank should be at least {axis + 1 if axis >= 0 else -axis}, but is only 0 "
                "(its shape is ()))"
            )
        dtypes.check_supported(leaf, lambda: describe_arg(f, path), "vmap")
        shape = tuple(leaf.shape)
        if not -len(shape) <= axis < len(shape):
            raise TransformError(
                f"in_axes {axis} is out of range for {describe_arg(f, path)} of shape {shape} "
                f"(rank {len(shape)}); vmap was requested to map its argument along axis {axis}, which implies "
                f"that its rank should be at least {axis + 1 if axis >= 0 else -axis}, but is only {len(shape)} "
                f"(its shape is {shape})"
            )
        axis = axis % len(shape)
        normalized.append(axis)
        mapped.append((path, shape, axis))
    sizes = {shape[axis] for _, shape, axis in mapped}
    if len(sizes | ({axis_size} if axis_size is not None else set())) > 1:
        raise TransformError(inconsistent_sizes_message(f, mapped, leaves, paths, axes, axis_size,
                                                        args_kwargs is not None))
    if not mapped:
        if axis_size is None:
            if not leaves and args_kwargs is not None:
                raise TransformError(
                    "vmap wrapped function must be passed at least one argument containing an array or axis_size "
                    f"must be specified, got empty *args={args_kwargs[0]} and **kwargs={args_kwargs[1]}")
            raise TransformError(
                "nothing is mapped (every in_axes entry is None or the arguments have no leaves) "
                "and no axis_size was given (vmap must have at least one non-None value in in_axes or axis_size "
                "must be specified)"
            )
        return normalized, int(axis_size)
    return normalized, sizes.pop()


def inconsistent_sizes_message(f, mapped, leaves, paths, axes, axis_size, jax_first):
    """JAX's message for mapped axes of different sizes (each size with how many axes have
    it and one of them: ``axis 0 of argument x of type float32[10,4]``, the most common
    first) and cuvmap's (the first argument whose size differs); ``jax_first`` for
    ``vmap``'s own errors."""
    by_path = {path: leaf for path, leaf in zip(paths, leaves)}
    def name(path):
        at = arg_path_name(f, path)
        return at if at.startswith(("kwargs", "args")) else f"argument {at}"

    counts = collections.Counter(shape[axis] for _, shape, axis in mapped)
    first = {}
    for path, shape, axis in mapped:
        first.setdefault(shape[axis], (path, axis))
    lines = ["vmap got inconsistent sizes for array axes to be mapped:"]
    if axis_size is not None:
        lines.append(f"  * the `axis_size` argument was {axis_size};")
    for k, (size, count) in enumerate(counts.most_common()):
        path, axis = first[size]
        example = f"axis {axis} of {name(path)} of type {aval_str(by_path[path])}"
        if count == 1:
            lines.append(f"  * one axis had size {size}: {example};")
        else:
            lines.append(f"  * {'most' if k == 0 else 'some'} axes ({count} of them) had size {size}, e.g. {example};")
    ref_path, ref_shape, ref_axis = mapped[0]
    path, shape, axis = next((m for m in mapped if m[1][m[2]] != (axis_size if axis_size is not None else
                                                                   ref_shape[ref_axis])), mapped[0])
    ref = (f"axis_size is {axis_size}" if axis_size is not None else
           f"{describe_arg(f, ref_path)} has size {ref_shape[ref_axis]} along axis {ref_axis} (shape {ref_shape})")
    ours = (f"{describe_arg(f, path)} has size {shape[axis]} along axis {axis} (shape {shape}), but {ref}; mapped "
            "arguments must all have the same size along their mapped axes")
    jaxs = "\n".join(lines)[:-1]
    return f"{jaxs}\n{ours}" if jax_first else f"{ours}\n({jaxs})"


def normalize_out_axis(axis, ndim, path, logical_shape):
    if not -ndim <= axis < ndim:
        raise TransformError(
            f"out_axes {axis} is out of range for {describe_out(path)} of "
            f"shape {tuple(logical_shape)} (rank {ndim - 1} plus the mapped axis): axis {axis} is out of bounds "
            f"for array of dimension {ndim}"
        )
    return axis % ndim


def normalize_argnums(f, argnums, nargs):
    single = isinstance(argnums, (int, np.integer))
    nums = (argnums,) if single else tuple(argnums) if isinstance(argnums, (tuple, list)) else None
    if nums is None or any(not isinstance(a, (int, np.integer)) or isinstance(a, bool) for a in nums):
        raise TransformError(f"argnums must be an int or a tuple of ints, got {argnums!r}")
    if not nums:
        raise TransformError("argnums is empty")
    out = []
    for a in nums:
        if not -nargs <= a < nargs:
            raise InputTypeError(
                f"argnums {argnums!r} is out of range: {fun_name(f)} was called with {nargs} positional argument"
                + ("s" if nargs != 1 else "") + f" (differentiating with respect to argnums={argnums!r} requires at "
                f"least {max(n + 1 if n >= 0 else -n for n in nums)} positional arguments to be passed by the caller, "
                f"but got only {nargs} positional arguments.)"
            )
        out.append(int(a) % nargs)
    return single, tuple(out)


def dyn_function(f, args, kwargs, argnums):
    def f_dyn(*dyn):
        full = list(args)
        for i, d in zip(argnums, dyn):
            full[i] = d
        return f(*full, **kwargs)

    f_dyn.__name__ = f_dyn.__qualname__ = fun_name(f)
    return f_dyn


# NOTE [where the eager time goes]
# Issue 36's profile of the benchmark CNN (conv 1→16 k5, conv 16→32 k5, dense 12800→10,
# float32) at batch 8, 32 and 128. ``python -m benchmarks eager`` measures it (the figures
# are on docs/performance/eager.md): it times eager against ``jit`` and wraps
# Primitive.bind to split each eager call into the kernels (binds that reach an impl) and
# the dispatch around them. What it showed:
#
# - Binds per call are fixed by the program, not the batch: eager vmap(grad) binds 173
#   primitives per call, 91 of them reaching a kernel (conv ×2, conv_backward_weight ×2,
#   conv_backward_input, dot_general ×3, select ×6, reduce_sum ×6, reshape ×26); batched
#   grad binds 87, 62 reaching a kernel. Each forward op of vmap(grad) is three binds
#   (grad's trace binds it under vmap, vmap's rule binds it for the kernel), which is
#   where the 82 binds without a kernel come from. The dispatch (the vmap and vjp rules,
#   tracers, the tape, argument checks) costs about as much per bind at every batch: the
#   largest share of an eager call at batch 8 (the gap between eager and jit's program,
#   which pays none of it and reuses its buffers), a small one at 128. The suite also
#   counts the function calls of an eager call (cProfile's count), which the machine's
#   load moves only through the thread rule's branches (CUVMAP_CPU_THREADS=fixed pins
#   them): the measure to compare dispatch changes by.
# - Cut so far (issue 36; the numbers the same): eager vmap(grad) from 7364 function calls
#   per call to 5769, batched grad from 4777 to 3744 (batch 8 and 32 alike; the oneDNN
#   kernels and the thread rule pinned: CUVMAP_CONV_STRATEGY=onednn
#   CUVMAP_CPU_THREADS=fixed), and 181 binds to 173. The eager shape rules are cached per
#   signature (NOTE [eager shape rules are cached per signature] in
#   cuvmap/core/rule_cache.py): bind_weak ran relu's select with its Python 0 through the
#   shape rule twice per bind (for the loss's small selects, several times the kernel's
#   own time), and the convolutions' impls checked their operands by the rule. ``bind``
#   runs the eval interpreter without calling find_top_main and a trace's
#   process_primitive without bind_with_trace's call; the rule helpers import the lax
#   family modules without importlib's fromlist path (a Python call per import);
#   transpose's and dot_general's VJP rules order their axes in Python, not with
#   numpy.argsort on tuples; fold_bdim_into moves a batch dim across size-1 dims with its
#   one reshape (the per-example convolutions' weight gradients bound a transpose and a
#   reshape per operand); the backward pass transposes each recorded name stack once, not
#   per tape entry; the Python around each convolution kernel lost its generators; take's
#   batch rules normalize the checked indices with one remainder (floor modulo) where lt,
#   add and select were three binds.
# - What is left of the dispatch: the binds themselves (a few tens of function calls each:
#   the traces, the rules, the tracers; three binds per forward op under vmap(grad)),
#   optree's flattening of the arguments (about 15 flattens per vmap(grad) call, each as
#   costly as a few binds: vmap's and grad's argument checks and _vjp flatten the same
#   arguments again), cuvmap.numpy's wrappers (cross_entropy's take_along_axis), the
#   Python around each convolution kernel (strategy lookup, thread limits, oneDNN's
#   layouts and plans: about 150 calls per convolution, more when a new plan is made) and
#   the take batch rules, which check and normalize indices that take_along_axis has
#   checked and normalized already (a bounds check and a remainder, twice per call).
# - The argument checks of vmap and grad built each leaf's description (``argument 0
#   (params)['w1']``, an inspect.signature each) for the messages of errors they did not
#   raise, about 20 per vmap(grad) call; they are built only for the error now
#   (dtypes.check_supported takes a function).
# - The kernels: oneDNN's convolutions are most of the kernel time at every batch. The
#   per-example gradient of the dense layer is an outer product writing B × 12800 × 10
#   floats, bound by the memory as in torch.func: on the EPYC machine two threads gained
#   nothing, on the Ice Lake one oneDNN's matmul on two halved it from batch 32 (NOTE
#   [outer products on the team] in cuvmap/cpu/onednn_matmul.py). The skinny dense GEMM
#   of the forward pass (B×12800 by 12800×10) is a small fraction of the call at every batch, in either layout: not a
#   lever (the suite's last table). Plain NumPy on OpenBLAS's two threads sometimes takes
#   a scheduler's time slice for it while another process holds a core (the half of the
#   split behind it waits); cuvmap's dot_general asks for one thread then (NOTE [threads
#   under a busy machine] in cuvmap/cpu/threads.py), and the suite's cuvmap row shows it.
#   relu and its VJP (select) are memory-bound passes.
# - Threads with torch imported first: torch's libgomp serves oneDNN too, and its idle
#   workers spin for milliseconds after every parallel region (torch's own and oneDNN's).
#   The earlier "threads" mode ran cuvmap's convolutions in chunks on cuvmap's own
#   threads, beside a worker that spun after each torch call, and OpenBLAS's second thread
#   waited behind it too: eager vmap(grad) at batch 32 took about 1.3x its time with
#   torch absent. cuvmap now joins the team (NOTE [oneDNN beside another OpenMP user] in
#   cuvmap/cpu/openmp.py): convolutions on OpenMP's threads, GEMMs on one OpenBLAS thread
#   while the team still spins, OpenBLAS's pool never shut down (setting its count after a
#   shutdown starts spinning workers: that doubled the times when first tried). Spinning
#   itself is not the enemy: without torch, the same rules under libgomp's default spin
#   (GOMP_SPINCOUNT=300000) ran faster than PASSIVE (a few percent on the EPYC, more on the
#   Ice Lake: NOTE [OpenMP threads beside OpenBLAS] in cuvmap/cpu/openmp.py); cuvmap
#   still loads its own libgomp PASSIVE (a torch imported later shares it, and the
#   distributed runs place several processes on the cores).
# - Against torch's own profile (the eager suite profiles torch.func vmap(grad) and torch's
#   batched gradient of the same network with torch.profiler, after cuvmap's rounds, in
#   the same process): the convolutions dominate both (aten::convolution_backward and
#   aten::mkldnn_convolution are oneDNN too); torch's per-example dense gradient (aten::bmm)
#   takes about twice cuvmap's outer product; torch's relu and its VJP
#   (clamp_min, threshold_backward) run on its OpenMP team, cuvmap's select on one core in
#   NumPy. So at small batches the two frameworks' kernels are level, and the eager
#   difference is the dispatch around them.
# - What would close the rest: fewer binds per eager call (rules that bind fewer
#   primitives; the layering of three binds per forward op under vmap(grad) stays) or a
#   cached per-signature plan for eager transforms, which needs a way to know that a
#   trace repeats without tracing it (Python side effects and values read from globals
#   run on every eager call). Staging only the user's function each call (its Python
#   runs every call, so side effects keep their eager count) and replaying a plan cached
#   by the staged program was measured and not taken: staging the benchmark CNN's forward
#   and keying its program cost most of what the plan would save, and a function that
#   needs a concrete value (an eager grad allows it) would run its Python twice on the
#   fallback.


def check_float_inputs(f, args, argnums, transform, allow_int=False):
    """Raises for a differentiated leaf that is not a floating-point value (integer and
    boolean ones pass with ``allow_int``: their gradient is a ``float0`` zero)."""
    for i in argnums:
        paths, leaves, _ = tree.flatten_with_path(args[i])
        for path, x in zip(paths, leaves):
            if not core.is_value(x) or getattr(x, "dtype", None) == object:
                raise InputTypeError(
                    f"{describe_arg(f, (0, i) + tuple(path))} {_short_repr(x)} of type {type(x)}"
                    f"{' with dtype object' if core.is_value(x) else ''} is not a valid JAX type; {transform} "
                    "differentiates arrays, scalars or pytrees of them"
                )
            dtypes.check_supported(x, lambda: describe_arg(f, (0, i) + tuple(path)), transform)
            if not core.is_float(x) and not (allow_int and kind_of(core.dtype_of(x)) in "biu"):
                raise InputTypeError(
                    f"{describe_arg(f, (0, i) + tuple(path))} has dtype {core.dtype_of(x)}; {transform} "
                    "differentiates with respect to floating-point inputs only (cast it, leave it out of argnums, "
                    f"or pass allow_int=True for a float0 zero gradient): {transform} requires real- or "
                    "complex-valued inputs (input dtype that is a sub-dtype of np.inexact), but got "
                    f"{core.dtype_of(x)}."
                )

# ---------------------------------------------------------------------------------------
# Staging: static arguments, avals, tracing a function into a program
# ---------------------------------------------------------------------------------------


def validate_jit_argnums(f, argnums, what, where):
    """JAX's check of ``static_argnums`` / ``donate_argnums`` against ``f``'s signature:
    without ``*args``, each must index a positional parameter (a ``ValueError``)."""
    argnums = (argnums,) if is_int(argnums) else tuple(argnums)
    try:
        params = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return
    n = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    bad = [i for i in argnums if is_int(i) and not -n <= i < n]
    if bad:
        raise TransformError(f"{where}: Jitted function has {what}={argnums}, but only accepts {n} positional "
                             f"arguments ({bad[0]} is out of range)")


def validate_jit_argnames(f, argnames, what, where):
    """JAX's check of ``static_argnames`` against ``f``'s signature: never a positional-only
    or ``*args`` parameter, and a parameter of ``f`` unless it takes ``**kwargs``."""
    argnames = (argnames,) if isinstance(argnames, str) else tuple(argnames)
    try:
        params = inspect.signature(f).parameters
    except (TypeError, ValueError):
        return
    positional_only = {n for n, p in params.items() if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)}
    if positional_only & set(argnames):
        raise TransformError(f"{where}: Jitted function has invalid argnames {sorted(positional_only & set(argnames))} "
                             f"in {what}. These are positional-only")
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    unknown = [n for n in argnames if n not in params]
    if unknown:
        raise TransformError(f"{where}: Jitted function has invalid argnames {unknown} in {what}. Function does not "
                             f"take these args (its parameters are {', '.join(params)})")


def normalize_static(f, static_argnums, static_argnames, donate_argnums, where):
    def ints(value, what):
        value = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
        if any(not is_int(v) for v in value):
            raise TransformError(f"{where}: {what} must be an int or a tuple of ints, got {value!r}")
        return tuple(int(v) for v in value)

    static_argnums = ints(static_argnums, "static_argnums")
    donate_argnums = ints(donate_argnums, "donate_argnums")
    static_argnames = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    if any(not isinstance(n, str) for n in static_argnames):
        raise TransformError(f"{where}: static_argnames must be a str or a tuple of str, got {static_argnames!r}")
    # as in JAX, a name given in static_argnames is static positionally too, and vice versa
    names = param_names(f)
    nums = set(static_argnums) | {names.index(n) for n in static_argnames if n in names}
    argnames = set(static_argnames) | {names[i] for i in static_argnums if 0 <= i < len(names)}
    return nums, argnames, set(donate_argnums)


def static_key(f, where, statics, unhashable_ok=False):
    """The static values as a hashable key; a clear error for unhashable ones (``None``
    with ``unhashable_ok``: checkpoint closes over them, as JAX's does, and keeps no
    program for such a call)."""
    for what, value in statics:
        try:
            hash(value)
        except TypeError:
            if unhashable_ok:
                return None
            raise TransformError(
                f"static {what} is a {type(value).__name__} ({value!r}), which is not "
                "hashable (Non-hashable static arguments are not supported): jit caches its programs by the "
                "static values; pass a tuple (or another hashable value), or make it a traced argument"
            ) from None
        try:
            value == value  # noqa: B015 - the cache compares keys: a value that cannot be compared is refused here
        except Exception as err:
            raise TransformError(
                f"static {what} of type {type(value).__name__} raised {type(err).__name__} when compared with ==: "
                f"static arguments should be comparable using __eq__ (jit compares them to find its program)"
            ) from err
    return tuple((what, type(value), value) for what, value in statics)


def leaf_aval(f, path, leaf, where):
    if isinstance(leaf, Tracer):
        return leaf.aval
    dtypes.check_supported(leaf, lambda: describe_arg(f, path), where)
    if type(leaf) in core._PY_SCALAR_DTYPES:
        return core.get_aval(leaf)
    if isinstance(leaf, np.ma.MaskedArray):
        raise TransformError(f"{describe_arg(f, path)} is a masked array: numpy masked arrays are not supported as "
                             "direct inputs to JAX functions (as in JAX); use arr.filled() to convert the value to a "
                             "standard numpy array")
    if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype") or isinstance(leaf, type):
        at = arg_path_name(f, path)
        raise ArgumentTypeError(
            f"{describe_arg(f, path)} is a {type(leaf).__name__}, which jit cannot trace; "
            "pass arrays, Python numbers or pytrees of them, or mark it static with "
            f"static_argnums/static_argnames (Error interpreting argument to {fun_name(f)} as an abstract array. "
            f"The problematic value is of type {type(leaf)} and was passed to the function at path {at}.)"
        )
    if isinstance(leaf, np.generic):
        leaf = np.asarray(leaf)
    return core.get_aval(leaf)
