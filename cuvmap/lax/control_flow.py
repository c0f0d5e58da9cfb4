"""Control flow as primitives: ``cond``, ``switch``, ``scan``, ``while_loop``, and
``fori_loop`` and ``map`` built on them (JAX's names, signatures and semantics).

A Python ``if`` or loop inside a traced function runs while tracing: a loop unrolls into
one equation per iteration, and a branch on a traced value is impossible (under ``vmap``
the value differs per example; under ``jit`` it has none yet). These primitives take the
branch or the loop body as a function, stage it once into a program (a
:class:`~cuvmap.transforms.ir.ClosedJaxpr` in the primitive's params, whatever transforms
are active: the values the function closes over become operands) and are call primitives
(NOTE [call primitives] in :mod:`cuvmap.transforms.call`) whose methods give every
transform its rule:

- ``cond(p, f, g, *x) = f(*x) if p else g(*x)``; ``switch(i, fs, *x) = fs[clamp(i)](*x)``.
  vmap with an unbatched index stays a ``cond`` (the branches' outputs batched alike); with
  a batched index every branch runs and ``select`` picks per example (NOTE [a batched
  predicate]). Derivatives: per branch; reverse mode saves every branch's residuals (zeros
  for the branches not taken).
- ``scan(f, c, xs) = (c_n, ys)`` with ``(c_{i+1}, ys[i]) = f(c_i, xs[i])`` (``reverse``
  walks ``i`` backwards). vmap, jvp and partial evaluation find by a fixpoint which carries
  are batched, have nonzero tangents or are unknown; reverse mode runs a forward scan that
  stacks each step's residuals as extra outputs and a backward scan in the other direction
  whose carry is the carry's cotangent and the constants' cotangents summed so far (NOTE
  [reverse mode of a scan]).
- ``while_loop(cond_fun, body_fun, c)``: vmap with a batched predicate runs until every
  example is done and freezes the finished ones with ``select``; jvp by a fixpoint; no
  reverse mode (the number of iterations is not known in advance; as in JAX, use ``scan``
  or ``fori_loop`` with static bounds).

Eagerly, each runs its programs on the planned executor, a body's plan reused (with its
buffer pool) from one iteration to the next; staged (``jit``), each is one equation.
"""
import dataclasses

import numpy as np

from cuvmap import api_util, backend, core, tree
from cuvmap.core import CuvmapError, Tracer
from cuvmap.lax import elementwise, reduction, shape as lax_shape  # noqa: F401 (reduction: while's any)
from cuvmap.transforms import ir
from cuvmap.transforms.call import CallPrimitive, avals_of
from cuvmap.transforms.ir import ClosedJaxpr, Jaxpr, Var


class ControlFlowError(CuvmapError, TypeError):
    """A control-flow function was given functions whose results do not fit: a carry whose
    structure, shape or dtype changes from one iteration to the next, branches with
    different outputs, a predicate that is not a boolean scalar."""


# ---------------------------------------------------------------------------------------
# Staging a branch or a loop body
# ---------------------------------------------------------------------------------------


def _is_value(x):
    return isinstance(x, Tracer) or hasattr(x, "shape") or type(x) in core._PY_SCALAR_DTYPES


def _aval(x):
    """The aval a staged body sees for operand ``x`` (NumPy scalars as 0-d arrays)."""
    if isinstance(x, np.generic):
        x = np.asarray(x)
    return core.get_aval(x)


def _flatten_values(what, tree_, where):
    """The leaves of ``tree_`` (arguments or results of a user function), checked to be
    arrays or numbers; returns ``(paths, leaves, treedef)``."""
    paths, leaves, treedef = tree.flatten_with_path(tree_)
    for path, leaf in zip(paths, leaves):
        if not _is_value(leaf):
            raise ControlFlowError(
                f"{where}: {what}{tree.keystr(path)} is a {type(leaf).__name__}; control flow carries "
                "arrays, Python numbers or pytrees of them")
    return paths, [np.asarray(x) if isinstance(x, np.generic) else x for x in leaves], treedef


@dataclasses.dataclass(frozen=True)
class _Body:
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


def _stage_body(fun, in_tree, in_avals, where, fix_outputs=None, splat=True):
    """Stages ``fun`` (taking the pytree ``in_tree`` of values with ``in_avals``: its
    arguments as a tuple, or with ``splat=False`` its one argument) into a :class:`_Body`.
    ``fix_outputs(out_leaves)`` may rewrite the flat results (a carry's Python number cast
    to the carry's dtype)."""
    from cuvmap.transforms import staging

    box = []

    def flat(*leaves):
        args = tree.unflatten(in_tree, list(leaves))
        out = fun(*args) if splat else fun(args)
        paths, out_leaves, out_tree = _flatten_values("the output ", out, where)
        box.append((out_tree, paths))
        return fix_outputs(out_leaves) if fix_outputs is not None else out_leaves

    closed = ir.optimize(staging.trace_to_jaxpr(flat, list(in_avals), name=where))
    out_tree, out_paths = box[0]
    program = ClosedJaxpr(ir.consts_as_inputs(closed), [])
    return _Body(program, list(closed.consts), out_tree, out_paths)


def _same_aval(a, b):
    return a.shape == b.shape and a.dtype == b.dtype


def _describe(aval):
    return f"{aval.dtype}{list(aval.shape)}"


def _with_program(closed, invars=None, outvars=None):
    """``closed`` (no constants) with its arguments and results reordered or selected:
    ``invars``/``outvars`` index its own."""
    j = closed.jaxpr
    ins = j.invars if invars is None else [j.invars[i] for i in invars]
    outs = j.outvars if outvars is None else [j.outvars[i] for i in outvars]
    return ClosedJaxpr(Jaxpr([], ins, j.eqns, outs), [])


def _extend_outputs(closed, extra_invars):
    """``closed`` returning, after its outputs, its arguments at ``extra_invars``."""
    j = closed.jaxpr
    return ClosedJaxpr(Jaxpr([], j.invars, j.eqns, list(j.outvars) + [j.invars[i] for i in extra_invars]), [])


def _trace_flat(fun, in_avals, where):
    """Stages a flat function of flat values (cuvmap's own bodies, built by the rules)."""
    from cuvmap.transforms import staging

    closed = ir.optimize(staging.trace_to_jaxpr(fun, list(in_avals), name=where))
    return ClosedJaxpr(ir.consts_as_inputs(closed), []), list(closed.consts)


def _depends(closed, marked):
    """Which outputs of ``closed`` depend on the arguments marked in ``marked``."""
    from cuvmap.transforms.partial_eval import split_by_unknown

    j = closed.jaxpr
    _, _, dependent = split_by_unknown(j.eqns, [v for v, m in zip(j.invars, marked) if m])
    return [type(v) is Var and v in dependent for v in j.outvars]


def _zeros(aval, leading=()):
    """Zeros of ``aval`` (with ``leading`` dims before), as a primitive's result (staged
    under jit: a broadcast, never a constant array)."""
    scalar = core.zeros_like_aval(core.ShapedArray((), aval.dtype, device=aval.device))
    return lax_shape.broadcast_in_dim(scalar, tuple(leading) + tuple(aval.shape), ())


def _plan_of(program):
    """The executor's plan of ``program`` (no constants), made once and kept on the
    program: its pool of buffers serves every iteration. ``_plan_of(p).program(args)``
    runs it."""
    from cuvmap.transforms import executor

    return executor.nested_plan(program)


def _run_plan(program, args):
    """Runs ``program`` (no constants) on concrete ``args`` with its plan."""
    return _plan_of(program).program(args)


def _xp_of(values):
    arrays = [v for v in values if hasattr(v, "shape")]
    return backend.xp_of(*arrays) if arrays else np


# ---------------------------------------------------------------------------------------
# cond and switch
# ---------------------------------------------------------------------------------------


class CondPrimitive(CallPrimitive):
    """``cond[branches](index, *operands)``: runs ``branches[index]`` (``index`` an
    int32 scalar in range) on the operands; every branch takes the same operands (the
    values all of them close over, then the user's operands) and returns the same avals.
    Its batching, JVP and VJP rules are the functions ``_cond_*`` below."""

    __slots__ = ()
    what = "a cond"
    host_sync = True  # the index is read on the host

    def run(self, index, *operands, branches):
        return _run_plan(branches[int(index)], list(operands))

    def out_avals(self, params):
        return params["branches"][0].out_avals

    def partial_eval(self, trace, args, params):
        if trace.main.owns(args[0]):
            return self.stage(trace, args, params)
        return _cond_partial_eval(self, trace, args, params)

    def dce(self, params, used_outputs):
        branches = [_prune_outputs(b, used_outputs) for b in params["branches"]]
        reads = [_reads(b) for b in branches]
        used = [any(r[i] for r in reads) for i in range(len(branches[0].jaxpr.invars))]
        keep = [i for i, u in enumerate(used) if u]
        branches = tuple(_with_program(b, keep) for b in branches)
        return dict(params, branches=branches), [True] + used, list(used_outputs)


def _prune_outputs(closed, used_outputs):
    """``closed`` (no constants) with only the outputs marked and its dead equations
    dropped; its arguments stay."""
    j = closed.jaxpr
    outvars = [v for v, u in zip(j.outvars, used_outputs) if u]
    return ClosedJaxpr(ir.dce(Jaxpr([], j.invars, j.eqns, outvars)), [])


def _reads(closed):
    """For each argument of ``closed``, whether an equation or an output reads it."""
    j = closed.jaxpr
    read = {x for e in j.eqns for x in e.inputs if type(x) is Var} | {v for v in j.outvars if type(v) is Var}
    return [v in read for v in j.invars]


cond_p = CondPrimitive("cond")


def cond(pred, true_fun, false_fun, *operands):
    """``true_fun(*operands)`` if ``pred`` else ``false_fun(*operands)``, as one primitive
    that every transform handles (JAX's ``lax.cond``).

    Args:
      pred: a boolean (or integer) scalar: a Python value, an array or a traced value.
      true_fun, false_fun: functions of the operands returning the same structure, shapes
        and dtypes.
      *operands: pytrees of arrays and numbers.
    Returns:
      the chosen branch's result.

    Under ``vmap`` with a batched ``pred`` both branches run for every example and
    ``select`` picks per example (NOTE [a batched predicate]); under ``grad`` the gradient
    flows through the branch taken.

    Example::

        y = cond(x.sum() > 0, lambda x: x * 2.0, lambda x: -x, x)
    """
    for name, f in (("true_fun", true_fun), ("false_fun", false_fun)):
        if not callable(f):
            raise ControlFlowError(f"cond: {name} must be callable, got {f!r}")
    where = f"cond({api_util.fun_name(true_fun)}, {api_util.fun_name(false_fun)})"
    pred_aval = _scalar_aval(pred, "biu", where, "pred must be a boolean scalar")
    index = elementwise.convert_element_type(pred != 0 if pred_aval.dtype.kind != "b" else pred, np.int32)
    return _switch(index, (false_fun, true_fun), operands, where, labels=("false_fun", "true_fun"))


def _scalar_aval(x, kinds, where, requirement):
    """The aval of ``x``, a scalar of one of the dtype ``kinds``; else an error saying
    ``requirement`` and what ``x`` is."""
    aval = _aval(x) if _is_value(x) else None
    if aval is None or aval.shape != () or aval.dtype.kind not in kinds:
        got = _describe(aval) if aval is not None else type(x).__name__
        raise ControlFlowError(f"{where}: {requirement}, got {got}")
    return aval


def switch(index, branches, *operands):
    """``branches[index](*operands)`` with ``index`` clamped to ``[0, len(branches) - 1]``
    (JAX's ``lax.switch``); see :func:`cond`."""
    branches = tuple(branches)
    if not branches or not all(callable(b) for b in branches):
        raise ControlFlowError(f"switch: branches must be a non-empty sequence of functions, got {branches!r}")
    where = f"switch({', '.join(api_util.fun_name(b) for b in branches)})"
    _scalar_aval(index, "iub", where, "index must be an integer scalar")
    index = elementwise.convert_element_type(index, np.int32)
    index = elementwise.max(elementwise.min(index, np.int32(len(branches) - 1)), np.int32(0))
    return _switch(index, branches, operands, where)


def _switch(index, branch_funs, operands, where, labels=None):
    paths, leaves, in_tree = _flatten_values("operand ", tuple(operands), where)
    avals = [_aval(x) for x in leaves]
    bodies = [_stage_body(f, in_tree, avals, where) for f in branch_funs]
    labels = labels or [f"branch {k}" for k in range(len(branch_funs))]
    names = [f"{label} ({api_util.fun_name(f)})" for label, f in zip(labels, branch_funs)]
    first = bodies[0]
    for k, b in enumerate(bodies[1:], 1):
        if b.out_tree != first.out_tree:
            raise ControlFlowError(f"{where}: {names[k]} returns structure {b.out_tree}, but {names[0]} returns "
                                   f"{first.out_tree}; the branches must agree")
        for path, a0, ak in zip(first.out_paths, first.out_avals, b.out_avals):
            if not _same_aval(a0, ak):
                raise ControlFlowError(
                    f"{where}: {names[k]} returns output{tree.keystr(path)} as {_describe(ak)}, but {names[0]} "
                    f"returns {_describe(a0)}; the branches must return the same shapes and dtypes")
    branches, consts = _join([ClosedJaxpr(b.program.jaxpr, []) for b in bodies], [b.consts for b in bodies])
    outs = cond_p.bind(index, *consts, *leaves, branches=branches)
    results = api_util.unaliased([api_util.to_array_result(o) for o in outs], leaves)
    return tree.unflatten(first.out_tree, results)


# NOTE [a batched predicate]
# Under vmap with a batched index, each example takes its own branch, so every branch runs
# on the whole batch and the outputs are ``select``ed per example (JAX's rule). An
# untaken branch may compute NaN or inf for an example (``sqrt`` of a negative number,
# ``log 0``) that ``select`` drops from the forward values, but reverse mode would multiply
# that example's zero cotangent by the branch's infinite derivative: 0 · inf = NaN. So each
# batched floating operand enters branch ``b`` as ``select(taken_b, x, stop_gradient(x))``
# (the same value), whose cotangent is the branch's cotangent where the branch is taken and
# zero where it is not: the untaken examples' NaN never reaches the operand's gradient.
# (An unbatched operand is left as it is: guarding it would batch it, one copy per example;
# its gradient sums over examples, so an untaken branch's NaN that depends on a batched
# value can still reach it. JAX guards nothing.)
def _cond_batch(prim, axis, vals, dims, params):
    from cuvmap.transforms.batching import batch_jaxpr, bdim_at_front, move_bdim, not_mapped
    from cuvmap.transforms.staging import call

    branches = params["branches"]
    index, operands = vals[0], vals[1:]
    index_dim, op_dims = dims[0], dims[1:]
    in_avals = avals_of(operands)
    nout = len(branches[0].out_avals)
    if index_dim is not_mapped:
        out_batched = [False] * nout
        for b in branches:
            _, out_dims = batch_jaxpr(b, axis, op_dims, in_avals)
            out_batched = [o or d is not not_mapped for o, d in zip(out_batched, out_dims)]
        batched, consts = _join([batch_jaxpr(b, axis, op_dims, in_avals, instantiate=out_batched)[0]
                                 for b in branches])
        outs = prim.bind(index, *consts, *operands, branches=batched)
        return outs, [0 if b else not_mapped for b in out_batched]
    # a batched index: every branch runs, select picks (NOTE [a batched predicate])
    size = axis.size
    index = move_bdim(index, index_dim, 0)
    front = [x if d is not_mapped else move_bdim(x, d, 0) for x, d in zip(operands, op_dims)]
    front_dims = [not_mapped if d is not_mapped else 0 for d in op_dims]
    front_avals = avals_of(front)
    results = None
    for k, b in enumerate(branches):
        taken = elementwise.eq(index, np.int32(k))
        guarded = [_guard(x, taken) if d is not not_mapped and core.is_float(x) else x
                   for x, d in zip(front, front_dims)]
        program, _ = batch_jaxpr(b, axis, front_dims, front_avals, instantiate=[True] * nout)
        outs = call(program, guarded)
        if results is None:
            results = outs
        else:
            results = [elementwise.select(_expand(taken, o), o, r) for o, r in zip(outs, results)]
    return [bdim_at_front(r, 0, size) for r in results], [0] * nout


def _join(programs, consts=None):
    """Branches that take the same operands: ``programs`` each take their own constants
    (``consts[k]``, or their ``ClosedJaxpr.consts``) then the shared arguments. Returns
    ``(branches, all_consts)``: each branch takes every branch's constants, then the
    arguments, as ``cond`` passes them."""
    if consts is None:
        consts = [list(p.consts) for p in programs]
        programs = [ClosedJaxpr(ir.consts_as_inputs(p), []) for p in programs]
    all_consts = [c for cs in consts for c in cs]
    branches = []
    offset = 0
    for p, cs in zip(programs, consts):
        j = p.jaxpr
        n = len(cs)
        before = [Var(_aval(c)) for c in all_consts[:offset]]
        after = [Var(_aval(c)) for c in all_consts[offset + n:]]
        branches.append(ClosedJaxpr(Jaxpr([], before + j.invars[:n] + after + j.invars[n:], j.eqns, j.outvars), []))
        offset += n
    return tuple(branches), all_consts


def _guard(x, taken):
    """``x`` whose cotangent is zero where ``taken`` is false (NOTE [a batched predicate])."""
    return elementwise.select(_expand(taken, x), x, elementwise.stop_gradient(x))


def _expand(mask, x):
    """A ``(B,)`` mask as ``(B, 1, ..., 1)`` against ``x`` (batch dim at 0)."""
    nd = len(core.shape_of(x))
    return lax_shape.reshape(mask, core.shape_of(mask) + (1,) * (nd - 1)) if nd > 1 else mask


def _cond_jvp(prim, primals, tangents, params):
    from cuvmap.transforms.jvp import jvp_jaxpr

    branches = params["branches"]
    index, operands, op_tangents = primals[0], primals[1:], tangents[1:]
    nonzero = [t is not None for t in op_tangents]
    in_avals = avals_of(operands)
    nout = len(branches[0].out_avals)
    out_nz = [False] * nout
    for b in branches:
        _, nz = jvp_jaxpr(b, nonzero, in_avals)
        out_nz = [a or c for a, c in zip(out_nz, nz)]
    jvps, consts = _join([jvp_jaxpr(b, nonzero, in_avals, instantiate=out_nz)[0] for b in branches])
    outs = prim.bind(index, *consts, *operands, *[t for t in op_tangents if t is not None], branches=jvps)
    it = iter(outs[nout:])
    return outs[:nout], [next(it) if nz else None for nz in out_nz]


# NOTE [splitting the branches of a cond]
# Reverse mode and partial evaluation split each branch into a first program (run now:
# the forward program, or the known part) and a second (run later: the backward program,
# or the staged part) that reads some of the operands and the first one's residuals. The
# residuals differ from branch to branch, but the branches of one cond return the same
# avals: so every first branch returns its own residuals and zeros for the others'
# (:func:`_first_branches`), and every second branch takes the operands any of them reads
# and every branch's residuals, using its own (:func:`_second_branches`). The index picks
# the same branch both times.
def _first_branches(programs, num_out, in_avals):
    """The first branches (NOTE [splitting the branches of a cond]) of ``programs``, whose
    outputs are ``num_out`` results then residuals. Returns ``(branches, consts,
    res_avals)``."""
    res_avals = [p.out_avals[num_out:] for p in programs]

    def make(k):
        def branch(*ops):
            outs = ir.eval_jaxpr(programs[k].jaxpr, programs[k].consts, ops)
            res = []
            for m, avals in enumerate(res_avals):
                res += outs[num_out:] if m == k else [_zeros(a) for a in avals]
            return outs[:num_out] + res
        return branch

    branches, consts = _join(*_traced_branches(make, len(programs), in_avals))
    return branches, consts, res_avals


def _second_branches(programs, reads, read, res_avals, in_avals):
    """The second branches (NOTE [splitting the branches of a cond]): ``programs[k]`` takes
    the operands ``reads[k]``, its residuals, then the rest; each branch takes the operands
    ``read`` (the union of ``reads``), every branch's residuals, then the rest."""
    num_res = sum(len(a) for a in res_avals)

    def make(k):
        def branch(*vals):
            by_operand = dict(zip(read, vals[:len(read)]))
            rest = vals[len(read):]
            offset = sum(len(a) for a in res_avals[:k])
            mine = rest[offset:offset + len(res_avals[k])]
            p = programs[k]
            return ir.eval_jaxpr(p.jaxpr, p.consts, [by_operand[i] for i in reads[k]] + list(mine) + list(rest[num_res:]))
        return branch

    return _join(*_traced_branches(make, len(programs), in_avals))


def _traced_branches(make, n, in_avals):
    """The programs of the flat functions ``make(0) ... make(n - 1)`` on ``in_avals`` and
    their constants, for :func:`_join`."""
    traced = [_trace_flat(make(k), in_avals, "cond") for k in range(n)]
    return [p for p, _ in traced], [c for _, c in traced]


def _cond_vjp(prim, primals, needs_ct, params):
    """Reverse mode: the forward branches return the outputs and the residuals; the
    backward pass runs the backward program of the branch taken (NOTE [splitting the
    branches of a cond])."""
    from cuvmap.transforms.partial_eval import everything_saveable
    from cuvmap.transforms.vjp import vjp_programs

    branches = params["branches"]
    index, operands = primals[0], primals[1:]
    in_avals = avals_of(operands)
    splits = [vjp_programs(b, needs_ct[1:], in_avals, everything_saveable) for b in branches]
    nout = len(branches[0].out_avals)
    forwards, fwd_consts, saved_avals = _first_branches([s.forward for s in splits], nout, in_avals)
    outs = prim.bind(index, *fwd_consts, *operands, branches=forwards)
    out_primals, saved = outs[:nout], outs[nout:]
    with_ct = [j for j, takes in enumerate(splits[0].ct_outputs) if takes]
    ct_avals = [branches[0].out_avals[j] for j in with_ct]
    read = sorted({i for s in splits for i in s.primals_read})
    kept = [operands[i] for i in read] + saved
    backwards, bwd_consts = _second_branches([s.backward for s in splits], [s.primals_read for s in splits], read,
                                             saved_avals, avals_of(kept) + ct_avals)

    def backward(cts):
        cts = [_zeros(a) if c is None else c for c, a in zip(cts, ct_avals)]
        return prim.bind(index, *bwd_consts, *kept, *cts, branches=backwards)

    return out_primals, with_ct, backward  # (the index, an integer, never needs a cotangent)


def _cond_partial_eval(prim, trace, args, params):
    """Partial evaluation with a known index: each branch split alike (the outputs unknown
    in any branch unknown in all), the known cond now, the unknown one staged (NOTE
    [splitting the branches of a cond])."""
    from cuvmap.transforms.partial_eval import partial_eval_jaxpr

    branches = params["branches"]
    index, operands = args[0], args[1:]
    unknown_ins = [trace.main.owns(x) for x in operands]
    nout = len(branches[0].out_avals)
    out_unknown = [False] * nout
    for b in branches:
        out_unknown = [a or c for a, c in zip(out_unknown, partial_eval_jaxpr(b, unknown_ins).out_unknown)]
    splits = [partial_eval_jaxpr(b, unknown_ins, instantiate=out_unknown) for b in branches]
    known_ops = [x for x, u in zip(operands, unknown_ins) if not u]
    unknown_ops = [x for x, u in zip(operands, unknown_ins) if u]
    num_known_out = nout - sum(out_unknown)
    knowns, known_consts, res_avals = _first_branches([s.known for s in splits], num_known_out, avals_of(known_ops))
    known_outs = prim.bind(index, *known_consts, *known_ops, branches=knowns)
    known_results, residuals = known_outs[:num_known_out], known_outs[num_known_out:]
    read = sorted({i for s in splits for i in s.known_read})
    staged_args = [known_ops[i] for i in read] + residuals + unknown_ops
    staged, staged_consts = _second_branches([s.staged for s in splits], [s.known_read for s in splits], read,
                                             res_avals, avals_of(staged_args))
    unknown_results = iter(trace.stage_equation(prim, [index] + staged_consts + staged_args,
                                                dict(params, branches=staged), staged[0].out_avals))
    known_iter = iter(known_results)
    return [next(unknown_results) if u else next(known_iter) for u in out_unknown]


# the rules of cond_p, its methods (NOTE [call primitives] in cuvmap/transforms/call.py)
CondPrimitive.batch = _cond_batch
CondPrimitive.jvp = _cond_jvp
CondPrimitive.vjp = _cond_vjp


# ---------------------------------------------------------------------------------------
# scan
# ---------------------------------------------------------------------------------------


class ScanPrimitive(CallPrimitive):
    """``scan[length num_consts num_carry program reverse unroll](*consts, *init, *xs)``:
    ``program(*consts, *carry, *x) -> (*carry, *y)`` applied ``length`` times, ``x`` the
    slices ``xs[i]`` (``i`` backwards with ``reverse``); results the last carry, then each
    ``y`` stacked along a new leading axis (in the order of ``xs``). Its rules are the
    functions ``_scan_*`` below."""

    __slots__ = ()
    what = "a scan"

    def run(self, *args, length, num_consts, num_carry, program, reverse, unroll):
        consts, carry, xs = _split3(args, num_consts, num_carry)
        y_avals = program.out_avals[num_carry:]
        xp = _xp_of(args)
        ys = [xp.empty((length,) + tuple(a.shape), a.dtype) for a in y_avals]
        if not length:
            return list(carry) + ys
        # ``unroll`` steps per call of an unrolled program, then the rest one by one
        blocks = length // unroll if unroll > 1 else 0
        if blocks:
            block = _plan_of(_unrolled(program, num_consts, num_carry, unroll, reverse)).program
            for b in range(blocks):
                start = length - (b + 1) * unroll if reverse else b * unroll
                window = slice(start, start + unroll)
                outs = block(consts + carry + [x[window] for x in xs])
                carry = outs[:num_carry]
                for stacked, y in zip(ys, outs[num_carry:]):
                    stacked[window] = y
        step = _plan_of(program).program
        rest = range(length - blocks * unroll - 1, -1, -1) if reverse else range(blocks * unroll, length)
        for i in rest:
            outs = step(consts + carry + [x[i] for x in xs])
            carry = outs[:num_carry]
            for stacked, y in zip(ys, outs[num_carry:]):
                stacked[i] = y
        return list(carry) + ys

    def out_avals(self, params):
        n, length = params["num_carry"], params["length"]
        avals = params["program"].out_avals
        return avals[:n] + [core.ShapedArray((length,) + tuple(a.shape), a.dtype, False, a.device) for a in avals[n:]]

    def dce(self, params, used_outputs):
        nc, ncar = params["num_consts"], params["num_carry"]
        body = params["program"]
        used_carry, used_ys = list(used_outputs[:ncar]), list(used_outputs[ncar:])
        while True:  # a carry is live if a result is, or if a live value reads it
            pruned = _prune_outputs(body, used_carry + used_ys)
            reads = _reads(pruned)
            grown = [u or r for u, r in zip(used_carry, reads[nc:nc + ncar])]
            if grown == used_carry:
                break
            used_carry = grown
        used_consts, used_xs = reads[:nc], reads[nc + ncar:]
        used_in = used_consts + used_carry + used_xs
        program = _with_program(pruned, [i for i, u in enumerate(used_in) if u])
        new = dict(params, program=program, num_consts=sum(used_consts), num_carry=sum(used_carry))
        return new, used_in, used_carry + used_ys


def _unrolled(program, num_consts, num_carry, k, reverse):
    """The program of ``k`` steps of a scan's body: ``(*consts, *carry, *x_block) ->
    (*carry, *y_block)``, the blocks holding ``k`` slices (walked backwards with
    ``reverse``). Cached on ``program``."""
    key = ("unrolled", num_consts, num_carry, k, reverse)
    hit = program.derived.get(key)
    if hit is not None:
        return hit
    in_avals = program.in_avals
    block_avals = [core.ShapedArray((k,) + tuple(a.shape), a.dtype, False, a.device)
                   for a in in_avals[num_consts + num_carry:]]

    def steps(*vals):
        consts, carry, blocks = _split3(vals, num_consts, num_carry)
        ys = [None] * k
        for j in (range(k - 1, -1, -1) if reverse else range(k)):
            outs = ir.eval_jaxpr(program.jaxpr, program.consts, consts + carry + [b[j] for b in blocks])
            carry, ys[j] = outs[:num_carry], outs[num_carry:]
        stacked = [lax_shape.concatenate([lax_shape.expand_dims(y[i], (0,)) for y in ys], 0)
                   for i in range(len(program.out_avals) - num_carry)]
        return list(carry) + stacked

    unrolled, consts = _trace_flat(steps, in_avals[:num_consts + num_carry] + block_avals, "scan")
    if consts:  # (a staged body captures none; the hoisting would change the operands)
        raise AssertionError("an unrolled scan body captured constants")
    program.derived[key] = unrolled
    return unrolled


def _split3(args, n1, n2):
    args = list(args)
    return args[:n1], args[n1:n1 + n2], args[n1 + n2:]


def _bind_scan(consts, carry, xs, program, params, **changes):
    """Binds ``scan_p`` with ``program``, hoisting its constants in front of ``consts``."""
    hoisted = list(program.consts)
    body = ClosedJaxpr(ir.consts_as_inputs(program), []) if hoisted else program
    new = dict(params, program=body, num_consts=len(hoisted) + len(consts), num_carry=len(carry))
    new.update(changes)
    return scan_p.bind(*hoisted, *consts, *carry, *xs, **_ordered(new))


def _ordered(params):
    """Scan's params in the order the program text shows them."""
    keys = ("length", "num_consts", "num_carry", "program", "reverse", "unroll")
    return {k: params[k] for k in keys}


def _slice_aval(aval):
    return core.ShapedArray(tuple(aval.shape[1:]), aval.dtype, False, aval.device)


scan_p = ScanPrimitive("scan")


def scan(f, init, xs=None, length=None, reverse=False, unroll=1):
    """Loops ``f`` over the leading axis of ``xs`` with a carry (JAX's ``lax.scan``)::

        def scan(f, init, xs, length=None):
            carry, ys = init, []
            for x in xs:
                carry, y = f(carry, x)
                ys.append(y)
            return carry, stack(ys)

    as one primitive: ``f`` is staged once, whatever the length, and every transform
    handles the loop (``grad`` through a scan keeps each step's residuals, not a Python
    tape per step).

    Args:
      f: ``f(carry, x) -> (carry, y)``; the carry keeps its structure, shapes and dtypes.
      init: the initial carry, a pytree of arrays and numbers.
      xs: a pytree of arrays sharing a leading axis, or None (then ``length`` is needed and
        ``f`` gets ``None``).
      length: the number of iterations, checked against ``xs``.
      reverse: walk the leading axis backwards (``ys`` still indexed like ``xs``).
      unroll: how many iterations one step of the loop runs (a positive int, or True for
        all of them); the results are the same.
    Returns:
      ``(carry, ys)``: the last carry and the stacked ``y``\\ s.

    Example::

        def step(h, x):
            h = cnp.tanh(h @ w + x @ u)
            return h, h
        h_last, hs = scan(step, h0, xs)
    """
    if not callable(f):
        raise ControlFlowError(f"scan: f must be callable, got {f!r}")
    where = f"scan({api_util.fun_name(f)})"
    if not isinstance(reverse, (bool, np.bool_)):
        raise ControlFlowError(f"{where}: reverse must be True or False, got {reverse!r}")
    _, carry_leaves, carry_tree = _flatten_values("init", init, where)
    x_paths, x_leaves, x_tree = _flatten_values("xs", xs, where)
    length = _scan_length(where, x_paths, x_leaves, length)
    unroll = _scan_unroll(where, unroll, length)
    x_avals = [_slice_aval(_aval(x)) for x in x_leaves]
    carry_avals = [_aval(c) for c in carry_leaves]
    num_carry = len(carry_leaves)
    for _ in range(2):  # a second trace when a weakly typed carry took a dtype from f
        body, y_tree = _stage_scan_body(f, where, carry_tree, carry_avals, x_tree, x_avals)
        new_avals = _check_carry(where, "f", body.out_paths[:num_carry], carry_avals, body.out_avals[:num_carry])
        if new_avals is None:
            break
        carry_avals = new_avals
        carry_leaves = _as_carry(carry_leaves, carry_avals)
    else:
        raise AssertionError("the carry's dtype did not settle")
    params = {"length": length, "reverse": bool(reverse), "unroll": unroll}
    outs = _bind_scan(body.consts, carry_leaves, x_leaves, body.program, params)
    outs = api_util.unaliased([api_util.to_array_result(o) for o in outs], carry_leaves + x_leaves)
    return tree.unflatten(carry_tree, outs[:num_carry]), tree.unflatten(y_tree, outs[num_carry:])


def _scan_length(where, x_paths, x_leaves, length):
    sizes = []
    for path, x in zip(x_paths, x_leaves):
        shape = core.shape_of(x)
        if not shape:
            raise ControlFlowError(f"{where}: xs{tree.keystr(path)} is a scalar (shape ()); every leaf of xs "
                                   "needs a leading axis to scan over")
        sizes.append((path, shape[0]))
    if length is not None:
        if not api_util.is_int(length) or length < 0:
            raise ControlFlowError(f"{where}: length must be a non-negative int, got {length!r}")
        length = int(length)
    for path, n in sizes:
        if length is None:
            length = n
        elif n != length:
            first = f"length {length}" if not sizes or sizes[0][1] != length else f"xs{tree.keystr(sizes[0][0])} has {length}"
            raise ControlFlowError(f"{where}: xs{tree.keystr(path)} has {n} entries along its leading axis, but "
                                   f"{first}; every leaf of xs must have the same leading size")
    if length is None:
        raise ControlFlowError(f"{where}: xs is None (or has no leaves), so length must be given")
    return length


def _scan_unroll(where, unroll, length):
    if unroll is True:
        return max(length, 1)
    if unroll is False:
        return 1
    if not api_util.is_int(unroll) or unroll < 1:
        raise ControlFlowError(f"{where}: unroll must be a positive int or a bool, got {unroll!r}")
    return int(unroll)


def _stage_scan_body(f, where, carry_tree, carry_avals, x_tree, x_avals):
    """``f(carry, x) -> (carry, y)`` staged as ``(*carry, *x) -> (*carry, *y)``."""
    from cuvmap.transforms import staging

    num_carry = len(carry_avals)
    box = []

    def flat(*leaves):
        out = f(tree.unflatten(carry_tree, list(leaves[:num_carry])), tree.unflatten(x_tree, list(leaves[num_carry:])))
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ControlFlowError(f"{where}: f must return a pair (carry, y), got {tree.describe(out)}")
        c_paths, c_leaves, c_tree = _flatten_values("the carry it returns ", out[0], where)
        if c_tree != carry_tree:
            raise ControlFlowError(f"{where}: f returned a carry of structure {c_tree}, but the initial carry "
                                   f"has structure {carry_tree}; the carry must keep its structure")
        y_paths, y_leaves, y_tree = _flatten_values("the y it returns ", out[1], where)
        box.append((c_paths, y_tree, y_paths))
        return _cast_numbers(c_leaves, carry_avals) + y_leaves

    closed = ir.optimize(staging.trace_to_jaxpr(flat, list(carry_avals) + list(x_avals), name=where))
    c_paths, y_tree, y_paths = box[0]
    program = ClosedJaxpr(ir.consts_as_inputs(closed), [])
    return _Body(program, list(closed.consts), None, c_paths + y_paths), y_tree


def _cast_numbers(leaves, avals):
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
def _check_carry(where, fname, paths, in_avals, out_avals):
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
        if _same_aval(a, b):
            continue
        raise ControlFlowError(
            f"{where}: {fname} returned the carry{tree.keystr(path[1:] if path and path[0] == 0 else path)} as "
            f"{_describe(b)}, but the carry entering it is {_describe(a)}; the carry must keep its shape and dtype "
            "from one iteration to the next (cast it with .astype, or start from an array of the right dtype)")
    return retyped if changed else None


def _as_carry(leaves, avals):
    """The initial carry as arrays of ``avals``' dtypes (NOTE [a carry has no weak type])."""
    return [x if not type(x) in core._PY_SCALAR_DTYPES and _same_aval(_aval(x), a)
            else elementwise.convert_element_type(x, a.dtype) for x, a in zip(leaves, avals)]


def _scan_batch(prim, axis, vals, dims, params):
    """vmap of a scan: which carries are batched is found by a fixpoint (a carry fed by a
    batched value becomes batched); batched carries and slices have their batch dim at 0
    (``xs`` at 1), and batched ``ys`` come out at 1."""
    from cuvmap.transforms.batching import batch_jaxpr, bdim_at_front, move_bdim, not_mapped

    nc, ncar = params["num_consts"], params["num_carry"]
    body = params["program"]
    consts, carry, xs = _split3(vals, nc, ncar)
    c_dims, carry_dims, x_dims = _split3(dims, nc, ncar)
    xs = [x if d is not_mapped else move_bdim(x, d, 1) for x, d in zip(xs, x_dims)]
    slice_dims = [not_mapped if d is not_mapped else 0 for d in x_dims]
    slice_avals = [_slice_aval(_aval(x)) for x in xs]
    batched = [d is not not_mapped for d in carry_dims]
    ny = len(body.out_avals) - ncar
    while True:
        carry_vals = [bdim_at_front(c, d, axis.size) if b else c for c, d, b in zip(carry, carry_dims, batched)]
        in_avals = avals_of(consts) + avals_of(carry_vals) + slice_avals
        in_dims = list(c_dims) + [0 if b else not_mapped for b in batched] + slice_dims
        program, out_dims = batch_jaxpr(body, axis, in_dims, in_avals, instantiate=batched + [False] * ny)
        grown = [b or d is not not_mapped for b, d in zip(batched, out_dims[:ncar])]
        if grown == batched:
            break
        batched = grown
    # the consts' batch dims stay where they are: move them where the program expects
    outs = _bind_scan(consts, carry_vals, xs, program, params)
    return outs, [0 if b else not_mapped for b in batched] + [not_mapped if d is not_mapped else 1 for d in out_dims[ncar:]]


def _scan_jvp(prim, primals, tangents, params):
    """jvp of a scan: which carries have nonzero tangents is found by a fixpoint; the
    scan of the body's JVP carries the primal and tangent carries together."""
    from cuvmap.transforms.jvp import jvp_jaxpr

    nc, ncar = params["num_consts"], params["num_carry"]
    body = params["program"]
    consts, carry, xs = _split3(primals, nc, ncar)
    c_t, carry_t, x_t = _split3(tangents, nc, ncar)
    ny = len(body.out_avals) - ncar
    in_avals = body.in_avals
    c_nz = [t is not None for t in c_t]
    x_nz = [t is not None for t in x_t]
    carry_nz = [t is not None for t in carry_t]
    while True:
        program, out_nz = jvp_jaxpr(body, c_nz + carry_nz + x_nz, in_avals, instantiate=carry_nz + [False] * ny)
        grown = [a or b for a, b in zip(carry_nz, out_nz[:ncar])]
        if grown == carry_nz:
            break
        carry_nz = grown
    carry_t = [(t if t is not None else _zeros(_aval(p))) if nz else None for p, t, nz in zip(carry, carry_t, carry_nz)]
    # the JVP program takes (primals, nonzero tangents) and returns (primal outs, nonzero
    # tangent outs): reorder both into scan's (consts, carry, xs) -> (carry, ys) layout
    n = nc + ncar + len(xs)
    tangent_pos = iter(range(n, n + sum(c_nz) + sum(carry_nz) + sum(x_nz)))
    nz_all = c_nz + carry_nz + x_nz
    t_index = [next(tangent_pos) if nz else None for nz in nz_all]
    groups = [(0, nc), (nc, nc + ncar), (nc + ncar, n)]
    invars = []
    for lo, hi in groups:
        invars += list(range(lo, hi)) + [t_index[i] for i in range(lo, hi) if nz_all[i]]
    num_out = ncar + ny
    out_t_pos = iter(range(num_out, num_out + sum(out_nz)))
    out_t_index = [next(out_t_pos) if nz else None for nz in out_nz]
    outvars = (list(range(ncar)) + [out_t_index[j] for j in range(ncar) if out_nz[j]]
               + list(range(ncar, num_out)) + [out_t_index[j] for j in range(ncar, num_out) if out_nz[j]])
    flat = ClosedJaxpr(ir.consts_as_inputs(program), [])
    hoisted = len(program.consts)
    reordered = _with_program(flat, list(range(hoisted)) + [hoisted + i for i in invars], outvars)
    outs = _bind_scan(list(program.consts) + consts + [t for t in c_t if t is not None],
                      carry + [t for t in carry_t if t is not None],
                      xs + [t for t in x_t if t is not None],
                      reordered, params)
    num_carry_t = sum(carry_nz)
    out_carry, out_carry_t = outs[:ncar], outs[ncar:ncar + num_carry_t]
    rest = outs[ncar + num_carry_t:]
    out_ys, out_ys_t = rest[:ny], rest[ny:]
    it_c, it_y = iter(out_carry_t), iter(out_ys_t)
    tangents_out = [next(it_c) if nz else None for nz in carry_nz] + [next(it_y) if nz else None for nz in out_nz[ncar:]]
    return out_carry + out_ys, tangents_out


# NOTE [reverse mode of a scan]
# The body's reverse mode is split once by partial evaluation
# (:func:`cuvmap.transforms.vjp.vjp_programs`): ``forward(consts, carry, x) -> (carry',
# y, saved)`` and ``backward(reads, saved, ct_carry', ct_y) -> (ct_consts, ct_carry,
# ct_x)``, ``reads`` the primal inputs the backward program reads directly. The forward
# scan runs ``forward`` and stacks ``saved`` (and the carries ``backward`` reads) as extra
# outputs, so the tape keeps one stacked array per residual — the memory of JAX's scan
# partial evaluation, never a tape entry per step. The backward scan walks the other way:
# its carry is the carry's cotangent and the constants' cotangents summed so far, its
# slices the saved residuals, the read carries and xs, and the ys' cotangents; its ys are
# the xs' cotangents. It is a scan of staged programs, so it is differentiable in turn
# (``grad(grad(...))``, ``hessian``). Which carries take part (those that depend on a
# differentiated input) is found by a fixpoint over the body's dependencies.
def _scan_vjp(prim, primals, needs_ct, params):
    from cuvmap.transforms.partial_eval import everything_saveable
    from cuvmap.transforms.vjp import vjp_programs

    nc, ncar, length = params["num_consts"], params["num_carry"], params["length"]
    body = params["program"]
    consts, carry, xs = _split3(primals, nc, ncar)
    c_need, init_need, x_need = _split3(needs_ct, nc, ncar)
    ny = len(body.out_avals) - ncar
    in_avals = body.in_avals
    is_float = [a.dtype.kind in "fc" for a in body.out_avals]
    carry_d = [n and f for n, f in zip(init_need, is_float[:ncar])]
    while True:
        dep = _depends(body, c_need + carry_d + x_need)
        grown = [c or (d and f) for c, d, f in zip(carry_d, dep[:ncar], is_float[:ncar])]
        if grown == carry_d:
            break
        carry_d = grown
    ys_d = [d and f for d, f in zip(dep[ncar:], is_float[ncar:])]
    body_need = c_need + carry_d + x_need
    split = vjp_programs(body, body_need, in_avals, everything_saveable)
    reads = split.primals_read
    read_consts = [i for i in reads if i < nc]
    read_carries = [i - nc for i in reads if nc <= i < nc + ncar]
    read_xs = [i - nc - ncar for i in reads if i >= nc + ncar]
    # the forward body: the forward program, returning also the carries the backward reads
    fwd_consts = list(split.forward.consts)
    hoisted = len(fwd_consts)
    fwd = _extend_outputs(ClosedJaxpr(ir.consts_as_inputs(split.forward), []),
                          [hoisted + nc + j for j in read_carries])
    outs = _bind_scan(fwd_consts + consts, carry, xs, fwd, params)
    out_primals = outs[:ncar + ny]
    stacked = outs[ncar + ny:]  # the saved residuals, then the carries the backward pass reads
    with_ct = [j for j in range(ncar) if carry_d[j]] + [ncar + k for k in range(ny) if ys_d[k]]
    if not with_ct:
        return out_primals, [], None
    ct_carry_avals = [a for a, d in zip(body.out_avals[:ncar], carry_d) if d]
    const_ct_avals = [a for a, n in zip(in_avals[:nc], c_need) if n]
    y_ct_avals = [a for a, d in zip(body.out_avals[ncar:], ys_d) if d]
    read_const_vals = [consts[i] for i in read_consts]
    read_x_vals = [xs[j] for j in read_xs]
    bwd, bwd_consts = _backward_body(split, reads, nc, ncar, carry_d, ys_d, c_need, x_need, body.out_avals)

    def backward(cts):
        cts = list(cts)
        ct_carry = [c if c is not None else _zeros(a) for c, a in zip(cts[:len(ct_carry_avals)], ct_carry_avals)]
        ct_ys = [c if c is not None else _zeros(a, (length,)) for c, a in zip(cts[len(ct_carry_avals):], y_ct_avals)]
        acc = [_zeros(a) for a in const_ct_avals]
        res = _bind_scan(bwd_consts + read_const_vals, ct_carry + acc, stacked + read_x_vals + ct_ys, bwd, params,
                         reverse=not params["reverse"])
        carry_cts, res = res[:len(ct_carry_avals)], res[len(ct_carry_avals):]
        c_cts, x_cts = res[:len(const_ct_avals)], res[len(const_ct_avals):]
        # the cotangents of the operands marked in needs_ct, in their order
        carry_ct_it = iter(carry_cts)
        init_cts = [next(carry_ct_it) if d else None for d in carry_d]
        out = list(c_cts)
        out += [init_cts[j] for j in range(ncar) if init_need[j]]
        out += list(x_cts)
        return out

    return out_primals, with_ct, backward


def _backward_body(split, reads, nc, ncar, carry_d, ys_d, c_need, x_need, out_avals):
    """The backward scan's body (NOTE [reverse mode of a scan]) from the body's backward
    program, by rewriting its arguments and results rather than tracing it again:
    ``(read consts, ct_carry, acc, saved, read carries, read xs, ct_y) -> (ct_carry_prev,
    acc + ct_consts, ct_x)``. The cotangents of the outputs that take none here (a carry
    or a y that depends on nothing differentiated) are zeros. Returns ``(program,
    consts)``."""
    from cuvmap.lax.shape import broadcast_in_dim_p

    j = split.backward.jaxpr
    n_reads, num_saved = len(reads), split.num_saved
    read_vars = dict(zip(reads, j.invars[:n_reads]))
    saved_vars = j.invars[n_reads:n_reads + num_saved]
    ct_vars = iter(j.invars[n_reads + num_saved:])
    head, ct_carry_vars, ct_y_vars = [], [], []
    for k, takes in enumerate(split.ct_outputs):
        if not takes:
            continue
        v = next(ct_vars)
        if (carry_d[k] if k < ncar else ys_d[k - ncar]):
            (ct_carry_vars if k < ncar else ct_y_vars).append(v)
        else:  # no cotangent reaches it: zeros
            zero = ir.Literal(np.zeros((), out_avals[k].dtype))
            head.append(ir.JaxprEqn(broadcast_in_dim_p, [zero], [v],
                                    {"shape": tuple(out_avals[k].shape), "broadcast_dimensions": ()}))
    outs = list(j.outvars)
    c_cts, outs = outs[:sum(c_need)], outs[sum(c_need):]
    carry_cts, x_cts = outs[:sum(carry_d)], outs[sum(carry_d):]
    acc_vars = [Var(a) for a, need in zip(split.forward.in_avals[:nc], c_need) if need]
    new_acc = [Var(v.aval) for v in acc_vars]
    tail = [ir.JaxprEqn(elementwise.add_p, [a, c], [n], {}) for a, c, n in zip(acc_vars, c_cts, new_acc)]
    invars = ([read_vars[i] for i in reads if i < nc] + ct_carry_vars + acc_vars + saved_vars
              + [read_vars[i] for i in reads if nc <= i < nc + ncar] + [read_vars[i] for i in reads if i >= nc + ncar]
              + ct_y_vars)
    program = ClosedJaxpr(Jaxpr(j.constvars, invars, head + j.eqns + tail, carry_cts + new_acc + x_cts),
                          split.backward.consts)
    return ClosedJaxpr(ir.consts_as_inputs(program), []), list(program.consts)


def _scan_partial_eval(prim, trace, args, params):
    """Partial evaluation of a scan (under ``linearize``): which carries are unknown is
    found by a fixpoint; the known scan runs now and stacks the residuals the unknown part
    reads, and the unknown scan is staged (JAX's scan partial evaluation)."""
    from cuvmap.transforms.partial_eval import partial_eval_jaxpr

    nc, ncar = params["num_consts"], params["num_carry"]
    body = params["program"]
    main = trace.main
    unknown = [main.owns(x) for x in args]
    c_u, carry_u, x_u = _split3(unknown, nc, ncar)
    consts, carry, xs = _split3(args, nc, ncar)
    ny = len(body.out_avals) - ncar
    while True:
        split = partial_eval_jaxpr(body, c_u + carry_u + x_u, instantiate=carry_u + [False] * ny)
        grown = [a or b for a, b in zip(carry_u, split.out_unknown[:ncar])]
        if grown == carry_u:
            break
        carry_u = grown
    all_u = c_u + carry_u + x_u
    known_pos = [i for i, u in enumerate(all_u) if not u]
    read = [known_pos[i] for i in split.known_read]  # body inputs the staged part reads
    read_consts = [i for i in read if i < nc]
    read_carries = [i for i in read if nc <= i < nc + ncar]
    read_xs = [i for i in read if i >= nc + ncar]
    known = split.known
    # the known body: the known program, returning also the known carries the staged part reads
    k_prog_consts = list(known.consts)
    k_prog = _extend_outputs(ClosedJaxpr(ir.consts_as_inputs(known), []),
                             [len(k_prog_consts) + known_pos.index(i) for i in read_carries])
    k_consts = [c for c, u in zip(consts, c_u) if not u]
    k_carry = [c for c, u in zip(carry, carry_u) if not u]
    k_xs = [x for x, u in zip(xs, x_u) if not u]
    k_outs = _bind_scan(k_prog_consts + k_consts, k_carry, k_xs, k_prog, params)
    num_k_out = len(known.out_avals) - split.num_res
    known_results = k_outs[:num_k_out]
    stacked = k_outs[num_k_out:]  # residuals, then the known carries the staged part reads
    values = dict(enumerate(args))
    staged_prog = split.staged
    u_consts = [c for c, u in zip(consts, c_u) if u]
    u_carry = [c for c, u in zip(carry, carry_u) if u]
    u_xs = [x for x, u in zip(xs, x_u) if u]
    n_rc, n_res = len(read_consts), split.num_res

    def staged_body(*vals):
        vals = list(vals)
        r_consts, vals = vals[:n_rc], vals[n_rc:]
        uc, vals = vals[:len(u_consts)], vals[len(u_consts):]
        ucar, vals = vals[:len(u_carry)], vals[len(u_carry):]
        res, vals = vals[:n_res], vals[n_res:]
        r_carries, vals = vals[:len(read_carries)], vals[len(read_carries):]
        r_xs, ux = vals[:len(read_xs)], vals[len(read_xs):]
        by_input = dict(zip(read_consts + read_carries + read_xs, r_consts + r_carries + r_xs))
        return ir.eval_jaxpr(staged_prog.jaxpr, staged_prog.consts,
                             [by_input[i] for i in read] + res + uc + ucar + ux)

    s_avals = ([body.in_avals[i] for i in read_consts] + [body.in_avals[i] for i, u in enumerate(c_u) if u]
               + [body.in_avals[nc + j] for j, u in enumerate(carry_u) if u]
               + [_slice_aval(_aval(s)) for s in stacked]
               + [body.in_avals[i] for i in read_xs] + [body.in_avals[nc + ncar + j] for j, u in enumerate(x_u) if u])
    s_prog, s_consts = _trace_flat(staged_body, s_avals, "scan")
    s_params = dict(params, program=s_prog,
                    num_consts=len(s_consts) + n_rc + len(u_consts), num_carry=len(u_carry))
    operands = (s_consts + [values[i] for i in read_consts] + u_consts + u_carry + stacked
                + [values[i] for i in read_xs] + u_xs)
    unknown_results = iter(trace.stage_equation(prim, operands, _ordered(s_params), prim.out_avals(s_params)))
    known_iter = iter(known_results)
    return [next(unknown_results) if u else next(known_iter) for u in split.out_unknown]


# the rules of scan_p, its methods (NOTE [call primitives] in cuvmap/transforms/call.py)
ScanPrimitive.batch = _scan_batch
ScanPrimitive.jvp = _scan_jvp
ScanPrimitive.vjp = _scan_vjp
ScanPrimitive.partial_eval = _scan_partial_eval


# ---------------------------------------------------------------------------------------
# while_loop
# ---------------------------------------------------------------------------------------


class WhilePrimitive(CallPrimitive):
    """``while[cond_nconsts cond_program body_nconsts body_program](*cond_consts,
    *body_consts, *init)``: ``carry = body_program(*body_consts, *carry)`` while
    ``cond_program(*cond_consts, *carry)`` (a boolean scalar) holds; the result is the
    last carry. Its rules are the functions ``_while_*`` below."""

    __slots__ = ()
    what = "a while_loop"
    host_sync = True  # the predicate is read on the host

    def run(self, *args, cond_nconsts, cond_program, body_nconsts, body_program):
        cond_consts, body_consts, carry = _split3(args, cond_nconsts, body_nconsts)
        keep_going, step = _plan_of(cond_program).program, _plan_of(body_program).program
        while bool(keep_going(cond_consts + carry)[0]):
            carry = step(body_consts + carry)
        return list(carry)

    def out_avals(self, params):
        return params["body_program"].out_avals

    def vjp(self, primals, needs_ct, params):
        raise ControlFlowError(
            "reverse-mode differentiation (grad, vjp, jacrev) of a while_loop is not supported: the number of "
            "iterations is not known in advance, so there is no fixed set of residuals to keep (as in JAX, "
            "jax#2469). Use scan, or fori_loop with static (Python int) bounds, which is a scan; forward mode "
            "(jvp, jacfwd) works")

    def dce(self, params, used_outputs):
        ncc, nbc = params["cond_nconsts"], params["body_nconsts"]
        cond_prog, body = params["cond_program"], params["body_program"]
        cond_reads = _reads(cond_prog)
        used = [u or r for u, r in zip(used_outputs, cond_reads[ncc:])]
        while True:
            pruned = _prune_outputs(body, used)
            reads = _reads(pruned)
            grown = [u or r for u, r in zip(used, reads[nbc:])]
            if grown == used:
                break
            used = grown
        body_consts_used = reads[:nbc]
        cond_consts_used = cond_reads[:ncc]
        body = _with_program(pruned, [i for i, u in enumerate(body_consts_used + used) if u])
        cond_prog = _with_program(cond_prog, [i for i, u in enumerate(cond_consts_used + used) if u])
        new = dict(params, cond_nconsts=sum(cond_consts_used), cond_program=cond_prog,
                   body_nconsts=sum(body_consts_used), body_program=body)
        return new, cond_consts_used + body_consts_used + used, used


while_p = WhilePrimitive("while")


def _bind_while(cond_consts, cond_prog, body_consts, body_prog, carry):
    """Binds ``while_p``, hoisting the programs' constants in front of their consts."""
    cc = list(cond_prog.consts) + list(cond_consts)
    bc = list(body_prog.consts) + list(body_consts)
    cond_prog = ClosedJaxpr(ir.consts_as_inputs(cond_prog), []) if cond_prog.consts else cond_prog
    body_prog = ClosedJaxpr(ir.consts_as_inputs(body_prog), []) if body_prog.consts else body_prog
    return while_p.bind(*cc, *bc, *carry, cond_nconsts=len(cc), cond_program=cond_prog,
                        body_nconsts=len(bc), body_program=body_prog)


def while_loop(cond_fun, body_fun, init_val):
    """``val = body_fun(val)`` while ``cond_fun(val)``, as one primitive (JAX's
    ``lax.while_loop``)::

        def while_loop(cond_fun, body_fun, init_val):
            val = init_val
            while cond_fun(val):
                val = body_fun(val)
            return val

    Args:
      cond_fun: ``cond_fun(val) -> bool`` scalar.
      body_fun: ``body_fun(val) -> val``, keeping the structure, shapes and dtypes.
      init_val: a pytree of arrays and numbers.
    Returns:
      the last value.

    ``vmap`` with a batched predicate runs until every example is done, each example's
    value frozen once its own predicate fails; ``jvp``/``jacfwd`` work; reverse mode does
    not (the iterations are not known in advance): use :func:`scan` or :func:`fori_loop`
    with Python int bounds.
    """
    for name, f in (("cond_fun", cond_fun), ("body_fun", body_fun)):
        if not callable(f):
            raise ControlFlowError(f"while_loop: {name} must be callable, got {f!r}")
    where = f"while_loop({api_util.fun_name(cond_fun)}, {api_util.fun_name(body_fun)})"
    _, leaves, in_tree = _flatten_values("init_val", init_val, where)
    avals = [_aval(x) for x in leaves]
    for _ in range(2):  # a second trace when a weakly typed value took a dtype from body_fun
        body = _stage_body(body_fun, in_tree, avals, where, fix_outputs=lambda out: _cast_numbers(out, avals),
                           splat=False)
        if body.out_tree != in_tree:
            raise ControlFlowError(f"{where}: body_fun returned structure {body.out_tree}, but init_val has "
                                   f"structure {in_tree}; the value must keep its structure")
        new_avals = _check_carry(where, "body_fun", body.out_paths, avals, body.out_avals)
        if new_avals is None:
            break
        avals = new_avals
        leaves = _as_carry(leaves, avals)
    cond = _stage_body(cond_fun, in_tree, avals, where, splat=False)
    pred = cond.out_avals
    if len(pred) != 1 or pred[0].shape != () or pred[0].dtype != np.bool_:
        got = ", ".join(_describe(a) for a in pred) or "nothing"
        raise ControlFlowError(f"{where}: cond_fun must return a boolean scalar, got {got}")
    outs = while_p.bind(*cond.consts, *body.consts, *leaves, cond_nconsts=len(cond.consts),
                        cond_program=cond.program, body_nconsts=len(body.consts), body_program=body.program)
    outs = api_util.unaliased([api_util.to_array_result(o) for o in outs], leaves)
    return tree.unflatten(in_tree, outs)


def _while_batch(prim, axis, vals, dims, params):
    """vmap of a while_loop: which carries are batched by a fixpoint; with a batched
    predicate every carry is batched, the loop runs while any example's predicate holds,
    and an example whose predicate fails keeps its value (``select``)."""
    from cuvmap.transforms.batching import batch_jaxpr, bdim_at_front, not_mapped

    ncc, nbc = params["cond_nconsts"], params["body_nconsts"]
    cond_prog, body = params["cond_program"], params["body_program"]
    cc, bc, carry = _split3(vals, ncc, nbc)
    cc_d, bc_d, carry_d = _split3(dims, ncc, nbc)
    batched = [d is not not_mapped for d in carry_d]
    size = axis.size

    def fixpoint(batched):
        while True:
            carry_vals = [bdim_at_front(c, d, size) if b else c for c, d, b in zip(carry, carry_d, batched)]
            carry_dims = [0 if b else not_mapped for b in batched]
            body_b, out_dims = batch_jaxpr(body, axis, bc_d + carry_dims, avals_of(bc) + avals_of(carry_vals),
                                           instantiate=batched)
            grown = [b or d is not not_mapped for b, d in zip(batched, out_dims)]
            if grown == batched:
                return batched, carry_vals, carry_dims, body_b
            batched = grown

    batched, carry_vals, carry_dims, body_b = fixpoint(batched)
    cond_avals = avals_of(cc) + avals_of(carry_vals)
    cond_b, (pred_dim,) = batch_jaxpr(cond_prog, axis, cc_d + carry_dims, cond_avals)
    if pred_dim is not_mapped:
        outs = _bind_while(cc, cond_b, bc, body_b, carry_vals)
        return outs, carry_dims
    # a batched predicate: every example's value is frozen once its own predicate fails
    batched, carry_vals, carry_dims, body_b = fixpoint([True] * len(carry))
    cond_avals = avals_of(cc) + avals_of(carry_vals)
    cond_b, _ = batch_jaxpr(cond_prog, axis, cc_d + carry_dims, cond_avals, instantiate=[True])
    ncc_b, nbc_b = len(cc), len(bc)

    def any_running(*vals):
        (pred,) = ir.eval_jaxpr(cond_b.jaxpr, cond_b.consts, vals)
        # any(pred), as a count (a maximum of an empty batch has no value)
        return [elementwise.gt(reduction.reduce_sum(elementwise.convert_element_type(pred, np.int32)), np.int32(0))]

    def step_running(*vals):
        c_consts, b_consts, cur = vals[:ncc_b], vals[ncc_b:ncc_b + nbc_b], list(vals[ncc_b + nbc_b:])
        (pred,) = ir.eval_jaxpr(cond_b.jaxpr, cond_b.consts, list(c_consts) + cur)
        new = ir.eval_jaxpr(body_b.jaxpr, body_b.consts, list(b_consts) + cur)
        return [elementwise.select(_expand(pred, n), n, c) for n, c in zip(new, cur)]

    new_cond, new_cond_consts = _trace_flat(any_running, cond_avals, "while_loop")
    step_avals = avals_of(cc) + avals_of(bc) + avals_of(carry_vals)
    new_body, new_body_consts = _trace_flat(step_running, step_avals, "while_loop")
    outs = _bind_while(new_cond_consts + cc, new_cond, new_body_consts + cc + bc, new_body, carry_vals)
    return outs, [0] * len(outs)


def _while_jvp(prim, primals, tangents, params):
    """jvp of a while_loop: the carries with nonzero tangents by a fixpoint; the loop of the
    body's JVP, its predicate reading the primal carries."""
    from cuvmap.transforms.jvp import jvp_jaxpr

    ncc, nbc = params["cond_nconsts"], params["body_nconsts"]
    cond_prog, body = params["cond_program"], params["body_program"]
    cc, bc, carry = _split3(primals, ncc, nbc)
    _, bc_t, carry_t = _split3(tangents, ncc, nbc)
    bc_nz = [t is not None for t in bc_t]
    carry_nz = [t is not None for t in carry_t]
    while True:
        program, out_nz = jvp_jaxpr(body, bc_nz + carry_nz, body.in_avals, instantiate=carry_nz)
        grown = [a or b for a, b in zip(carry_nz, out_nz)]
        if grown == carry_nz:
            break
        carry_nz = grown
    carry_t = [(t if t is not None else _zeros(_aval(p))) if nz else None for p, t, nz in zip(carry, carry_t, carry_nz)]
    n = nbc + len(carry)
    tangent_pos = iter(range(n, n + sum(bc_nz) + sum(carry_nz)))
    nz_all = bc_nz + carry_nz
    t_index = [next(tangent_pos) if nz else None for nz in nz_all]
    invars = (list(range(nbc)) + [t_index[i] for i in range(nbc) if nz_all[i]]
              + list(range(nbc, n)) + [t_index[i] for i in range(nbc, n) if nz_all[i]])
    hoisted = len(program.consts)
    flat = ClosedJaxpr(ir.consts_as_inputs(program), [])
    body_jvp = _with_program(flat, list(range(hoisted)) + [hoisted + i for i in invars])
    # the predicate ignores the tangent carries
    cj = cond_prog.jaxpr
    extra = [Var(_aval(t)) for t in carry_t if t is not None]
    cond_jvp = ClosedJaxpr(Jaxpr([], cj.invars + extra, cj.eqns, cj.outvars), [])
    outs = _bind_while(cc, cond_jvp, list(program.consts) + bc + [t for t in bc_t if t is not None],
                       body_jvp, carry + [t for t in carry_t if t is not None])
    out_p, out_t = outs[:len(carry)], iter(outs[len(carry):])
    return out_p, [next(out_t) if nz else None for nz in carry_nz]


def _while_partial_eval(prim, trace, args, params):
    """Partial evaluation of a while_loop (under ``linearize``): when the predicate and the
    known carries depend on known values only, the known carries come from a loop that
    runs now; the unknown ones from the whole loop staged, which recomputes the known part
    (JAX's rule: there is no fixed number of iterations whose residuals could be kept)."""
    ncc, nbc = params["cond_nconsts"], params["body_nconsts"]
    cond_prog, body = params["cond_program"], params["body_program"]
    main = trace.main
    unknown = [main.owns(x) for x in args]
    cc_u, bc_u, carry_u = _split3(unknown, ncc, nbc)
    while True:
        dep = _depends(body, bc_u + carry_u)
        grown = [a or b for a, b in zip(carry_u, dep)]
        if grown == carry_u:
            break
        carry_u = grown
    if any(_depends(cond_prog, cc_u + carry_u)) or all(carry_u):
        return prim.stage(trace, args, params)
    cc, bc, carry = _split3(args, ncc, nbc)
    known = [i for i, u in enumerate(carry_u) if not u]
    body_known = _prune_outputs(body, [not u for u in carry_u])
    body_known = _with_program(body_known, list(range(nbc)) + [nbc + i for i in known])
    cond_known = _with_program(cond_prog, list(range(ncc)) + [ncc + i for i in known])
    known_outs = iter(prim.bind(*cc, *bc, *[carry[i] for i in known], cond_nconsts=ncc, cond_program=cond_known,
                                body_nconsts=nbc, body_program=body_known))
    staged = prim.stage(trace, args, params)
    return [s if u else next(known_outs) for s, u in zip(staged, carry_u)]


# the rules of while_p, its methods (NOTE [call primitives] in cuvmap/transforms/call.py)
WhilePrimitive.batch = _while_batch
WhilePrimitive.jvp = _while_jvp
WhilePrimitive.partial_eval = _while_partial_eval


# ---------------------------------------------------------------------------------------
# fori_loop and map
# ---------------------------------------------------------------------------------------


def fori_loop(lower, upper, body_fun, init_val):
    """``val = body_fun(i, val)`` for ``i`` in ``range(lower, upper)`` (JAX's
    ``lax.fori_loop``). With Python (or NumPy) int bounds it is a :func:`scan` of
    ``upper - lower`` steps, so reverse mode works; with traced bounds a
    :func:`while_loop` (forward mode only).

    Example::

        x = fori_loop(0, 10, lambda i, x: x * 0.5 + i, x0)
    """
    if not callable(body_fun):
        raise ControlFlowError(f"fori_loop: body_fun must be callable, got {body_fun!r}")
    static = all(api_util.is_int(b) for b in (lower, upper))
    if static:
        lower, upper = int(lower), int(upper)

        def step(carry, _):
            i, val = carry
            return (i + 1, body_fun(i, val)), None

        step.__name__ = api_util.fun_name(body_fun)
        (_, val), _ = scan(step, (lower, init_val), None, length=max(upper - lower, 0))
        return val
    for name, b in (("lower", lower), ("upper", upper)):
        _scalar_aval(b, "iu", f"fori_loop({api_util.fun_name(body_fun)})", f"{name} must be an integer scalar")

    def cond_fun(carry):
        return elementwise.lt(carry[0], carry[1])

    def body(carry):
        i, stop, val = carry
        return i + 1, stop, body_fun(i, val)

    cond_fun.__name__ = "i_below_upper"
    body.__name__ = api_util.fun_name(body_fun)
    _, _, val = while_loop(cond_fun, body, (lower, upper, init_val))
    return val


def map(f, xs):  # noqa: A001 - JAX's name
    """``stack([f(x) for x in xs])`` over the leading axis of the pytree ``xs``, as a
    :func:`scan` (JAX's ``lax.map``): one example at a time, so memory stays that of one
    call of ``f``."""
    if not callable(f):
        raise ControlFlowError(f"map: f must be callable, got {f!r}")

    def step(carry, x):
        return carry, f(x)

    step.__name__ = api_util.fun_name(f)
    _, ys = scan(step, (), xs)
    return ys
