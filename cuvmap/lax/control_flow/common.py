"""What the control-flow primitives share: their base class, the staging of a user's
function into a body, the carry's rules, and the surgery on programs their rules do.

Every program in a control-flow primitive's params is a
:class:`~cuvmap.transforms.ir.ClosedJaxpr` without constants: the values a body closes
over are the primitive's leading operands (:func:`cuvmap.transforms.ir.hoist_consts`).
"""
import dataclasses

import numpy as np

from cuvmap import backend, core, tree
from cuvmap.core import CuvmapError, is_value  # noqa: F401 (is_value: for the package's modules)
from cuvmap.lax import elementwise, shape as lax_shape
from cuvmap.transforms import executor, ir, loop_plans, staging
from cuvmap.transforms.call import CallPrimitive
from cuvmap.transforms.ir import ClosedJaxpr, Jaxpr, Var
from cuvmap.transforms.partial_eval import split_by_unknown
from cuvmap.core.bfloat16 import kind_of


class ControlFlowError(CuvmapError, TypeError):
    """A control-flow function was given functions whose results do not fit: a carry whose
    structure, shape or dtype changes from one iteration to the next, branches with
    different outputs, a predicate that is not a boolean scalar."""


# NOTE [the rules of a control-flow primitive]
# A control-flow primitive is a call primitive (NOTE [call primitives] in
# cuvmap/transforms/call.py) that is not a program call: its params hold several programs
# (branches, a loop's predicate and body) and counts that split its operands, so none of a
# program call's rules fit it. Each of its rules is a method of its own class, in the
# order of ``rule_methods``: ``run`` (eval), ``out_avals``, ``dce`` (the program
# optimizer), ``batch`` (vmap), ``jvp``, ``vjp`` (grad) and ``partial_eval`` (linearize),
# so that a reader of ``class ScanPrimitive`` sees all of a scan. The registry test
# (``test_util.missing_rules``) asks each class for those methods itself. Staging (jit)
# is the one rule they share: one equation.
class ControlFlowPrimitive(CallPrimitive):
    """A control-flow primitive (NOTE [the rules of a control-flow primitive])."""

    __slots__ = ()
    rule_methods = ("run", "out_avals", "dce", "batch", "jvp", "vjp", "partial_eval")

    def stage(self, trace, args, params):
        """Staging: one equation with one result per output."""
        return trace.stage_equation(self, args, params, self.out_avals(params))


# ---------------------------------------------------------------------------------------
# Staging a branch or a loop body
# ---------------------------------------------------------------------------------------

_CHOOSE = "use cuvmap.numpy.where to choose per element, or lax.cond to choose which function runs"
# who staged a body, for the error of a Python conversion in it (NOTE [who staged a
# value] in cuvmap/transforms/staging.py)
SCAN_STAGER = staging.Stager(
    why="the body of a scan (fori_loop and map are scans) is staged: traced once, on abstract values, for all "
        "its iterations, so its carry and xs have no values while it is traced",
    hint=_CHOOSE)
WHILE_STAGER = staging.Stager(
    why="cond_fun and body_fun of a while_loop (as of a fori_loop with traced bounds) are staged: traced once, "
        "on abstract values, for all the iterations, so the loop's value has none while they are traced",
    hint=_CHOOSE)
COND_STAGER = staging.Stager(
    why="the branches of a cond (or switch) are staged: traced once, on abstract values, before a branch is "
        "chosen, so their operands have no values while they are traced",
    hint=_CHOOSE)


def aval_of(x):
    """The aval a staged body sees for operand ``x`` (NumPy scalars as 0-d arrays)."""
    if isinstance(x, np.generic):
        x = np.asarray(x)
    return core.get_aval(x)


def flatten_values(what, tree_, where):
    """The leaves of ``tree_`` (arguments or results of a user function), checked to be
    arrays or numbers; returns ``(paths, leaves, treedef)``."""
    paths, leaves, treedef = tree.flatten_with_path(tree_)
    for path, leaf in zip(paths, leaves):
        if not is_value(leaf):
            raise ControlFlowError(
                f"{where}: {what}{tree.keystr(path)} is a {type(leaf).__name__}; control flow carries "
                "arrays, Python numbers or pytrees of them")
    return paths, [np.asarray(x) if isinstance(x, np.generic) else x for x in leaves], treedef


@dataclasses.dataclass(frozen=True)
class Body:
    """A user function staged into a program: ``program`` takes the values it closes over
    (``consts``, passed as the primitive's leading operands), then its arguments' leaves;
    ``out_tree`` and ``out_paths`` describe its result."""

    program: ClosedJaxpr
    consts: list
    out_tree: object
    out_paths: list

    @property
    def out_avals(self):
        return self.program.out_avals


def stage_flat(flat, in_avals, where, stager, origins=None):
    """Stages the flat function ``flat`` (a user's function wrapped by a control-flow
    function) on ``in_avals``: ``(program, consts)``, the program taking its constants
    first. ``origins`` name the arguments in errors."""
    closed = staging.trace_to_jaxpr(flat, list(in_avals), name=where, origins=origins, stager=stager)
    return ir.hoist_consts(ir.optimize(closed))


def stage_body(fun, in_tree, in_avals, where, stager, origins, fix_outputs=None, splat=True):
    """Stages ``fun`` (taking the pytree ``in_tree`` of values with ``in_avals``: its
    arguments as a tuple, or with ``splat=False`` its one argument) into a :class:`Body`.
    ``fix_outputs(out_leaves)`` may rewrite the flat results (a carry's Python number cast
    to the carry's dtype)."""
    box = []

    def flat(*leaves):
        args = tree.unflatten(in_tree, list(leaves))
        out = fun(*args) if splat else fun(args)
        paths, out_leaves, out_tree = flatten_values("the output ", out, where)
        box.append((out_tree, paths))
        return fix_outputs(out_leaves) if fix_outputs is not None else out_leaves

    program, consts = stage_flat(flat, in_avals, where, stager, origins)
    out_tree, out_paths = box[0]
    return Body(program, consts, out_tree, out_paths)


def trace_flat(fun, in_avals, where):
    """Stages a flat function of flat values (cuvmap's own bodies, built by the rules):
    ``(program, consts)``."""
    return ir.hoist_consts(ir.optimize(staging.trace_to_jaxpr(fun, list(in_avals), name=where)))


def same_aval(a, b):
    return a.shape == b.shape and a.dtype == b.dtype


def describe(aval):
    return f"{aval.dtype}{list(aval.shape)}"


def scalar_aval(x, kinds, where, requirement):
    """The aval of ``x``, a scalar of one of the dtype ``kinds``; else an error saying
    ``requirement`` and what ``x`` is."""
    aval = aval_of(x) if is_value(x) else None
    if aval is None or aval.shape != () or kind_of(aval.dtype) not in kinds:
        got = describe(aval) if aval is not None else type(x).__name__
        raise ControlFlowError(f"{where}: {requirement}, got {got}")
    return aval


# ---------------------------------------------------------------------------------------
# The carry of a loop
# ---------------------------------------------------------------------------------------


def cast_numbers(leaves, avals):
    """A carry returned as a Python number takes its carry's dtype (it is weakly typed)."""
    return [elementwise.convert_element_type(x, a.dtype) if type(x) in core._PY_SCALAR_DTYPES and a.shape == ()
            else x for x, a in zip(leaves, avals)]


# NOTE [a carry has no weak type]
# A Python number is weakly typed (it takes the dtype of the arrays it meets) only while it
# is a Python number: once a loop has run one iteration its carry is an array of its own
# dtype, and the next iteration would promote differently (``x_f32 + i`` is float32 for a
# Python int ``i`` and float64 for an int64 array). So a carry is never weak: a Python
# number starts as an array, of the dtype the body gives it where that differs (``0.0``
# summing float32 values becomes a float32 zero), and the body is staged again with that.
def check_carry(where, fname, paths, in_avals, out_avals):
    """Checks that a body returns its carry's avals. Returns None when it does, or the
    carry's avals with every weakly typed one made an array's (NOTE [a carry has no weak
    type]); the body is then staged again with those."""
    retyped = list(in_avals)
    changed = False
    for k, (path, a, b) in enumerate(zip(paths, in_avals, out_avals)):
        if a.weak_type:
            dtype = b.dtype if a.shape == b.shape else a.dtype
            retyped[k] = core.ShapedArray(a.shape, dtype, False, a.device)
            changed = True
            continue
        if same_aval(a, b):
            continue
        raise ControlFlowError(
            f"{where}: {fname} returned the carry{tree.keystr(path[1:] if path and path[0] == 0 else path)} as "
            f"{describe(b)}, but the carry entering it is {describe(a)}; the carry must keep its shape and dtype "
            "from one iteration to the next (cast it with .astype, or start from an array of the right dtype)")
    return retyped if changed else None


def as_carry(leaves, avals):
    """The initial carry as arrays of ``avals``' dtypes (NOTE [a carry has no weak type])."""
    return [x if not type(x) in core._PY_SCALAR_DTYPES and same_aval(aval_of(x), a)
            else elementwise.convert_element_type(x, a.dtype) for x, a in zip(leaves, avals)]


def grow(flags, step):
    """The fixpoint of the rules' dataflow questions (which carries are batched, have a
    nonzero tangent, are unknown): ``step(flags) -> (result, more)`` marks in ``more`` the
    carries its ``result`` makes true as well; ``flags`` grow until ``step`` adds none.
    Returns ``(flags, result)``, ``result`` that of the last step."""
    while True:
        result, more = step(flags)
        grown = [a or bool(b) for a, b in zip(flags, more)]
        if grown == flags:
            return flags, result
        flags = grown


# ---------------------------------------------------------------------------------------
# Programs
# ---------------------------------------------------------------------------------------


def with_program(closed, invars=None, outvars=None):
    """``closed`` (no constants) with its arguments and results reordered or selected:
    ``invars``/``outvars`` index its own."""
    j = closed.jaxpr
    ins = j.invars if invars is None else [j.invars[i] for i in invars]
    outs = j.outvars if outvars is None else [j.outvars[i] for i in outvars]
    return ClosedJaxpr(Jaxpr([], ins, j.eqns, outs), [])


def extend_outputs(closed, extra_invars):
    """``closed`` (no constants) returning, after its outputs, its arguments at
    ``extra_invars``."""
    j = closed.jaxpr
    return ClosedJaxpr(Jaxpr([], j.invars, j.eqns, list(j.outvars) + [j.invars[i] for i in extra_invars]), [])


def prune_outputs(closed, used_outputs):
    """``closed`` (no constants) with only the outputs marked and its dead equations
    dropped; its arguments stay."""
    j = closed.jaxpr
    outvars = [v for v, u in zip(j.outvars, used_outputs) if u]
    return ClosedJaxpr(ir.dce(Jaxpr([], j.invars, j.eqns, outvars)), [])


def forwarded_inputs(programs):
    """For each output of the ``programs`` (which take the same arguments and return the
    same avals), the index of the argument that every one of them returns there unchanged,
    else None (NOTE [forwarded operands])."""
    positions = [{v: i for i, v in enumerate(p.jaxpr.invars)} for p in programs]
    found = []
    for m in range(len(programs[0].jaxpr.outvars)):
        at = {pos.get(p.jaxpr.outvars[m]) if type(p.jaxpr.outvars[m]) is Var else None
              for p, pos in zip(programs, positions)}
        found.append(at.pop() if len(at) == 1 else None)
    return found


# NOTE [forwarded operands]
# A branch of a cond, or a loop body, often returns one of its arguments unchanged: a
# value the branches pass through (``lambda x, y: (x * 2, y)``), a read-only carry of a
# scan or a while loop (the weights an RNN step reads). Such a result IS the operand, so
# the control-flow function returns the operand itself (and a loop passes the carry to
# its body as a constant instead), as JAX's forwarding does: the primitive no longer
# computes it. It matters beyond the copy saved: under ``vmap`` the result stays
# unbatched when the operand is (a batched predicate would otherwise make every output of
# a cond batched through its select, and ``out_axes=None`` would refuse it), and reverse
# mode keeps no residual for it.


def reads(closed):
    """For each argument of ``closed``, whether an equation or an output reads it."""
    j = closed.jaxpr
    read = {x for e in j.eqns for x in e.inputs if type(x) is Var} | {v for v in j.outvars if type(v) is Var}
    return [v in read for v in j.invars]


def depends(closed, marked):
    """Which outputs of ``closed`` depend on the arguments marked in ``marked``."""
    j = closed.jaxpr
    _, _, dependent = split_by_unknown(j.eqns, [v for v, m in zip(j.invars, marked) if m])
    return [type(v) is Var and v in dependent for v in j.outvars]


def interleave_tangents(sizes, nonzero):
    """The order that puts the values of a JVP program (the primals, then the nonzero
    tangents) group by group: each of the groups of ``sizes`` primals followed by its
    nonzero tangents (``nonzero`` marks the primals that have one), as a loop's operands
    (consts, carry, xs) and results (carry, ys) come."""
    n = sum(sizes)
    positions = iter(range(n, n + sum(nonzero)))
    tangent_at = [next(positions) if nz else None for nz in nonzero]
    order, lo = [], 0
    for size in sizes:
        order += list(range(lo, lo + size)) + [tangent_at[i] for i in range(lo, lo + size) if nonzero[i]]
        lo += size
    return order


def loop_jvp_program(program, in_sizes, in_nonzero, out_sizes=None, out_nonzero=None):
    """A loop body's JVP program (from :func:`cuvmap.transforms.jvp.jvp_jaxpr`) with its
    arguments, and with ``out_sizes`` its results, in the loop's order
    (:func:`interleave_tangents`), its constants hoisted first. Returns ``(program,
    consts)``."""
    flat, consts = ir.hoist_consts(program)
    hoisted = len(consts)
    invars = list(range(hoisted)) + [hoisted + i for i in interleave_tangents(in_sizes, in_nonzero)]
    outvars = None if out_sizes is None else interleave_tangents(out_sizes, out_nonzero)
    return with_program(flat, invars, outvars), consts


def split3(args, n1, n2):
    args = list(args)
    return args[:n1], args[n1:n1 + n2], args[n1 + n2:]


def zeros(aval, leading=()):
    """Zeros of ``aval`` (with ``leading`` dims before), as a primitive's result (staged
    under jit: a broadcast, never a constant array)."""
    scalar = core.zeros_like_aval(core.ShapedArray((), aval.dtype, device=aval.device))
    return lax_shape.broadcast_in_dim(scalar, tuple(leading) + tuple(aval.shape), ())


def expand(mask, x):
    """A ``(B,)`` mask as ``(B, 1, ..., 1)`` against ``x`` (batch dim at 0)."""
    nd = len(core.shape_of(x))
    return lax_shape.reshape(mask, core.shape_of(mask) + (1,) * (nd - 1)) if nd > 1 else mask


def plan_of(program):
    """The executor's plan of ``program`` (no constants), made once and kept on the
    program: its pool of buffers serves every iteration. ``plan_of(p).program(args)``
    runs it."""
    return executor.nested_plan(program)


def loop_of(program, num_consts, num_carry):
    """The scan loop of ``program``'s plan (:func:`cuvmap.transforms.loop_plans.loop_of`):
    ``loop(consts, carry, xs, ys, indices)``."""
    return loop_plans.loop_of(plan_of(program), num_consts, num_carry)


def while_of(cond_program, body_program, cond_nconsts, body_nconsts):
    """The while loop of the two programs' plans (:func:`cuvmap.transforms.loop_plans.while_of`):
    ``loop(cond_consts, body_consts, carry)``."""
    return loop_plans.while_of(plan_of(cond_program), plan_of(body_program), cond_nconsts, body_nconsts)


def run_plan(program, args):
    """Runs ``program`` (no constants) on concrete ``args`` with its plan."""
    return plan_of(program).program(args)


def xp_of(values):
    arrays = [v for v in values if hasattr(v, "shape")]
    return backend.xp_of(*arrays) if arrays else np


def carries_on_device(carry, device):
    """``carry`` with its host values (Python numbers, NumPy arrays) moved to the GPU when
    ``device`` is ``"gpu"``: a loop's carries often start as Python numbers (a counter, an
    accumulator's 0), and inside the loop they meet the body's values, which CuPy refuses to
    mix with NumPy ones. A number becomes a 0-d array of its aval's dtype (what a carry is
    after one step anyway)."""
    if device != "gpu":
        return list(carry)
    cp = backend.xp_for("gpu")
    return [cp.asarray(c, dtype=core.get_aval(c).dtype) if type(c) in core._PY_SCALAR_DTYPES
            or isinstance(c, (np.ndarray, np.generic)) else c for c in carry]


def device_of(values):
    """``"gpu"`` when any of the concrete ``values`` is a CuPy array, else ``"cpu"``."""
    return "gpu" if any(backend.is_cupy_array(v) for v in values) else "cpu"
