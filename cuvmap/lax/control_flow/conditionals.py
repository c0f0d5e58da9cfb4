"""``cond`` and ``switch``: ``cond(p, f, g, *x) = f(*x) if p else g(*x)`` and
``switch(i, fs, *x) = fs[clamp(i)](*x)``, as the primitive ``cond_p`` whose branches are
staged programs (JAX's ``lax.cond``/``lax.switch``).

vmap with an unbatched index stays a ``cond`` (the branches' outputs batched alike); with a
batched index every branch runs and ``select`` picks per example, as one ``quiet_cond``
(NOTE [a batched predicate]). Derivatives: per branch; reverse mode saves every branch's
residuals (zeros for the branches not taken; NOTE [splitting the branches of a cond]).
"""
import numpy as np

from cuvmap import api_util, tree
from cuvmap.core import Tracer
from cuvmap.lax import elementwise
from cuvmap.lax.control_flow.common import (
    COND_STAGER, ControlFlowError, ControlFlowPrimitive, aval_of, describe, expand, flatten_values,
    forwarded_inputs, is_value,
    prune_outputs, reads, run_plan, same_aval, stage_body, trace_flat, with_program, zeros)
from cuvmap.transforms import ir
from cuvmap.transforms.batching import batch_jaxpr, move_bdim, not_mapped
from cuvmap.transforms.call import avals_of
from cuvmap.transforms.ir import ClosedJaxpr, Jaxpr, Var
from cuvmap.transforms.jvp import jvp_jaxpr
from cuvmap.transforms.partial_eval import everything_saveable, partial_eval_jaxpr
from cuvmap.transforms.vjp import vjp_programs
from cuvmap.core.bfloat16 import kind_of


class CondPrimitive(ControlFlowPrimitive):
    """``cond[branches](index, *operands)``: runs ``branches[index]`` (``index`` an
    int32 scalar in range) on the operands; every branch takes the same operands (the
    values all of them close over, then the user's operands) and returns the same avals."""

    __slots__ = ()
    what = "a cond"
    host_sync = True  # the index is read on the host

    def run(self, index, *operands, branches):
        return run_plan(branches[int(index)], list(operands))

    def out_avals(self, params):
        return params["branches"][0].out_avals

    def dce(self, params, used_outputs):
        branches = [prune_outputs(b, used_outputs) for b in params["branches"]]
        read = [reads(b) for b in branches]
        used = [any(r[i] for r in read) for i in range(len(branches[0].jaxpr.invars))]
        keep = [i for i, u in enumerate(used) if u]
        branches = tuple(with_program(b, keep) for b in branches)
        return dict(params, branches=branches), [True] + used, list(used_outputs)

    def batch(self, axis, vals, dims, params):
        """vmap: with an unbatched index, a cond of the batched branches (an output batched
        in any branch batched in all); with a batched one, every branch on every example
        and a select (NOTE [a batched predicate])."""
        branches = params["branches"]
        index, operands = vals[0], vals[1:]
        index_dim, op_dims = dims[0], dims[1:]
        if index_dim is not not_mapped:
            return _select_branches(axis, move_bdim(index, index_dim, 0), operands, op_dims, branches)
        in_avals = avals_of(operands)
        out_batched = _any_branch(branches, lambda b: [d is not not_mapped
                                                       for d in batch_jaxpr(b, axis, op_dims, in_avals)[1]])
        batched, consts = _join([batch_jaxpr(b, axis, op_dims, in_avals, instantiate=out_batched)[0]
                                 for b in branches])
        outs = self.bind(index, *consts, *operands, branches=batched)
        return outs, [0 if b else not_mapped for b in out_batched]

    def jvp(self, primals, tangents, params):
        """jvp: a cond of the branches' JVP programs (an output's tangent nonzero in any
        branch instantiated in all)."""
        branches = params["branches"]
        index, operands, op_tangents = primals[0], primals[1:], tangents[1:]
        nonzero = [t is not None for t in op_tangents]
        in_avals = avals_of(operands)
        nout = len(branches[0].out_avals)
        out_nz = _any_branch(branches, lambda b: jvp_jaxpr(b, nonzero, in_avals)[1])
        jvps, consts = _join([jvp_jaxpr(b, nonzero, in_avals, instantiate=out_nz)[0] for b in branches])
        outs = self.bind(index, *consts, *operands, *[t for t in op_tangents if t is not None], branches=jvps)
        it = iter(outs[nout:])
        return outs[:nout], [next(it) if nz else None for nz in out_nz]

    def vjp(self, primals, needs_ct, params):
        """Reverse mode: the forward branches return the outputs and the residuals; the
        backward pass runs the backward program of the branch taken (NOTE [splitting the
        branches of a cond]). The index, an integer, never needs a cotangent."""
        branches = params["branches"]
        index, operands = primals[0], primals[1:]
        in_avals = avals_of(operands)
        splits = [vjp_programs(b, needs_ct[1:], in_avals, everything_saveable) for b in branches]
        nout = len(branches[0].out_avals)
        forwards, fwd_consts, saved_avals = _first_branches([s.forward for s in splits], nout, in_avals)
        outs = self.bind(index, *fwd_consts, *operands, branches=forwards)
        out_primals, saved = outs[:nout], outs[nout:]
        with_ct = [j for j, takes in enumerate(splits[0].ct_outputs) if takes]
        ct_avals = [branches[0].out_avals[j] for j in with_ct]
        read = sorted({i for s in splits for i in s.primals_read})
        kept = [operands[i] for i in read] + saved
        backwards, bwd_consts = _second_branches([s.backward for s in splits], [s.primals_read for s in splits],
                                                 read, saved_avals, avals_of(kept) + ct_avals)

        def backward(cts):
            cts = [zeros(a) if c is None else c for c, a in zip(cts, ct_avals)]
            return self.bind(index, *bwd_consts, *kept, *cts, branches=backwards)

        return out_primals, with_ct, backward

    def partial_eval(self, trace, args, params):
        """Partial evaluation: an unknown index stages the whole cond; with a known one
        each branch is split alike (the outputs unknown in any branch unknown in all), the
        known cond runs now and the unknown one is staged (NOTE [splitting the branches of
        a cond])."""
        if trace.main.owns(args[0]):
            return self.stage(trace, args, params)
        branches = params["branches"]
        index, operands = args[0], args[1:]
        unknown_ins = [trace.main.owns(x) for x in operands]
        nout = len(branches[0].out_avals)
        out_unknown = _any_branch(branches, lambda b: partial_eval_jaxpr(b, unknown_ins).out_unknown)
        splits = [partial_eval_jaxpr(b, unknown_ins, instantiate=out_unknown) for b in branches]
        known_ops = [x for x, u in zip(operands, unknown_ins) if not u]
        unknown_ops = [x for x, u in zip(operands, unknown_ins) if u]
        num_known_out = nout - sum(out_unknown)
        knowns, known_consts, res_avals = _first_branches([s.known for s in splits], num_known_out,
                                                          avals_of(known_ops))
        known_outs = self.bind(index, *known_consts, *known_ops, branches=knowns)
        known_results, residuals = known_outs[:num_known_out], known_outs[num_known_out:]
        read = sorted({i for s in splits for i in s.known_read})
        staged_args = [known_ops[i] for i in read] + residuals + unknown_ops
        staged, staged_consts = _second_branches([s.staged for s in splits], [s.known_read for s in splits], read,
                                                 res_avals, avals_of(staged_args))
        unknown_results = iter(trace.stage_equation(self, [index] + staged_consts + staged_args,
                                                    dict(params, branches=staged), staged[0].out_avals))
        known_iter = iter(known_results)
        return [next(unknown_results) if u else next(known_iter) for u in out_unknown]


class QuietCondPrimitive(CondPrimitive):
    """``quiet_cond[branches](0, *operands)``: a cond of one branch, run with NumPy's
    floating-point warnings off. It is the form a cond takes under vmap with a batched
    index (NOTE [a batched predicate]): its branch runs every branch of the cond on every
    example and selects, and the examples whose results are selected away may divide by
    zero or take the square root of a negative number. Its rules are cond's, which bind it
    again: its derivatives and batched forms stay quiet."""

    __slots__ = ()
    what = "a cond with a batched predicate"
    host_sync = False  # its index is the literal 0: nothing is read on the host

    def run(self, index, *operands, branches):
        with np.errstate(all="ignore"):
            return run_plan(branches[0], list(operands))


cond_p = CondPrimitive("cond")
quiet_cond_p = QuietCondPrimitive("quiet_cond")


def _any_branch(branches, flags_of):
    """The flags (over the outputs) set by ``flags_of`` in any branch."""
    out = [False] * len(branches[0].out_avals)
    for b in branches:
        out = [a or bool(c) for a, c in zip(out, flags_of(b))]
    return out


# ---------------------------------------------------------------------------------------
# The user's functions
# ---------------------------------------------------------------------------------------


_NO_OPERAND = object()  # ``operand=`` not given


def cond(pred, true_fun, false_fun, *operands, operand=_NO_OPERAND):
    """``true_fun(*operands)`` if ``pred`` else ``false_fun(*operands)``, as one primitive
    that every transform handles (JAX's ``lax.cond``).

    Args:
      pred: a scalar: a boolean, or a number (integer or floating), which is converted as
        JAX does (``pred != 0``: nonzero takes ``true_fun``); a Python value, an array or a
        traced value.
      true_fun, false_fun: functions of the operands returning the same structure, shapes
        and dtypes.
      *operands: pytrees of arrays and numbers.
      operand: one operand given by keyword (JAX's older spelling), instead of ``*operands``.
    Returns:
      the chosen branch's result.

    JAX's deprecated five-argument form ``cond(pred, true_operand, true_fun,
    false_operand, false_fun)`` is accepted too, as JAX still accepts it.

    Under ``vmap`` with a batched ``pred`` both branches run for every example and
    ``select`` picks per example, with NumPy's floating-point warnings off (NOTE [a batched
    predicate]); under ``grad`` the gradient flows through the branch taken.

    Example::

        y = cond(x.sum() > 0, lambda x: x * 2.0, lambda x: -x, x)
    """
    if not (callable(true_fun) and callable(false_fun)):
        if callable(false_fun) and len(operands) == 2 and callable(operands[1]) and operand is _NO_OPERAND:
            # the deprecated form cond(pred, true_operand, true_fun, false_operand, false_fun)
            x_true, f_true, x_false, f_false = true_fun, false_fun, *operands
            return cond(pred, lambda x, _: f_true(x), lambda _, x: f_false(x), x_true, x_false)
        for name, f in (("true_fun", true_fun), ("false_fun", false_fun)):
            if not callable(f):
                raise ControlFlowError(f"cond: {name} must be callable, got {f!r} (lax.cond: true_fun and "
                                       "false_fun arguments should be callable)")
    operands = _keyword_operand("cond", operands, operand)
    where = f"cond({api_util.fun_name(true_fun)}, {api_util.fun_name(false_fun)})"
    if pred is None:
        raise ControlFlowError(f"{where}: the cond predicate is None; pred must be a boolean or numeric scalar")
    pred_aval = aval_of(pred) if is_value(pred) else None
    if pred_aval is None or kind_of(pred_aval.dtype) not in "biuf":
        got = describe(pred_aval) if pred_aval is not None else repr(pred)
        raise ControlFlowError(f"{where}: Pred type must be either boolean or number, got {got}")
    if pred_aval.shape != ():
        raise ControlFlowError(f"{where}: pred must be a scalar (a boolean or a number), got {describe(pred_aval)}")
    # a number is a predicate as in JAX: nonzero (NaN included) takes true_fun
    index = elementwise.convert_element_type(pred != 0 if kind_of(pred_aval.dtype) != "b" else pred, np.int32)
    return _switch(index, (false_fun, true_fun), operands, where, labels=("false_fun", "true_fun"))


def switch(index, branches, *operands, operand=_NO_OPERAND):
    """``branches[index](*operands)`` with ``index`` clamped to ``[0, len(branches) - 1]``
    (JAX's ``lax.switch``): an index below 0 runs the first branch, one past the end the
    last, as ``clamp(0, index, len(branches) - 1)``; see :func:`cond`. ``operand=`` gives
    one operand by keyword (JAX's older spelling)."""
    branches = tuple(branches)
    if not branches or not all(callable(b) for b in branches):
        raise ControlFlowError(f"switch: branches must be a non-empty sequence of functions, got {branches!r} "
                               "(lax.switch: branches argument should be a sequence of callables)")
    operands = _keyword_operand("switch", operands, operand)
    where = f"switch({', '.join(api_util.fun_name(b) for b in branches)})"
    index_aval = aval_of(index) if is_value(index) else None
    if index_aval is None or kind_of(index_aval.dtype) not in "iub":
        got = describe(index_aval) if index_aval is not None else repr(index)
        raise ControlFlowError(f"{where}: Index type must be an integer, got {got}")
    if index_aval.shape != ():
        raise ControlFlowError(f"{where}: Branch index must be scalar, got {describe(index_aval)}")
    index = elementwise.convert_element_type(index, np.int32)
    index = elementwise.max(elementwise.min(index, np.int32(len(branches) - 1)), np.int32(0))
    return _switch(index, branches, operands, where)


def _keyword_operand(name, operands, operand):
    """``operands``, or ``(operand,)`` when the one operand was given by keyword."""
    if operand is _NO_OPERAND:
        return operands
    if operands:
        raise ControlFlowError(f"{name}: if 'operand' keyword is passed then no positional operands can be "
                               f"passed, got {len(operands)} positional operands")
    return (operand,)


def _switch(index, branch_funs, operands, where, labels=None):
    paths, leaves, in_tree = flatten_values("operand ", tuple(operands), where)
    avals = [aval_of(x) for x in leaves]
    origins = [f"operand {p[0]}{tree.keystr(p[1:])}" for p in paths]
    bodies = [stage_body(f, in_tree, avals, where, COND_STAGER, origins) for f in branch_funs]
    labels = labels or [f"branch {k}" for k in range(len(branch_funs))]
    names = [f"{label} ({api_util.fun_name(f)})" for label, f in zip(labels, branch_funs)]
    first = bodies[0]
    for k, b in enumerate(bodies[1:], 1):
        if b.out_tree != first.out_tree:
            raise ControlFlowError(f"{where}: {names[k]} returns structure {b.out_tree}, but {names[0]} returns "
                                   f"{first.out_tree}; the branches must agree")
        for path, a0, ak in zip(first.out_paths, first.out_avals, b.out_avals):
            if not same_aval(a0, ak):
                raise ControlFlowError(
                    f"{where}: {names[k]} returns output{tree.keystr(path)} as {describe(ak)}, but {names[0]} "
                    f"returns {describe(a0)}; the branches must return the same shapes and dtypes")
    branches, consts = _join([b.program for b in bodies], [b.consts for b in bodies])
    # an output every branch returns unchanged is the operand itself (NOTE [forwarded operands])
    fwd = forwarded_inputs(branches)
    computed = [f is None for f in fwd]
    if not all(computed):
        branches = [prune_outputs(b, computed) for b in branches]
    outs = iter(cond_p.bind(index, *consts, *leaves, branches=branches) if any(computed) else [])
    args = list(consts) + list(leaves)
    outs = [next(outs) if f is None else args[f] for f in fwd]
    results = api_util.unaliased([api_util.to_array_result(o) for o in outs], leaves)
    return tree.unflatten(first.out_tree, results)


def _join(programs, consts=None):
    """Branches that take the same operands: ``programs`` each take their own constants
    (``consts[k]``, or their ``ClosedJaxpr.consts``) then the shared arguments. Returns
    ``(branches, all_consts)``: each branch takes every branch's constants, then the
    arguments, as ``cond`` passes them."""
    if consts is None:
        hoisted = [ir.hoist_consts(p) for p in programs]
        programs, consts = [p for p, _ in hoisted], [c for _, c in hoisted]
    all_consts = [c for cs in consts for c in cs]
    branches = []
    offset = 0
    for p, cs in zip(programs, consts):
        j = p.jaxpr
        n = len(cs)
        before = [Var(aval_of(c)) for c in all_consts[:offset]]
        after = [Var(aval_of(c)) for c in all_consts[offset + n:]]
        branches.append(ClosedJaxpr(Jaxpr([], before + j.invars[:n] + after + j.invars[n:], j.eqns, j.outvars), []))
        offset += n
    return tuple(branches), all_consts


# ---------------------------------------------------------------------------------------
# A batched predicate
# ---------------------------------------------------------------------------------------


# NOTE [a batched predicate]
# Under vmap with a batched index, each example takes its own branch, so every branch runs
# on the whole batch and the outputs are ``select``ed per example (JAX's rule). An
# untaken branch may compute NaN or inf for an example (``sqrt`` of a negative number,
# ``log 0``) that ``select`` drops. Two consequences:
# - NumPy would warn ("invalid value encountered in sqrt", from the executor's generated
#   code, naming no line of the user's) about values nobody sees, where JAX prints nothing.
#   So the branches and the selects are one program, the one branch of a ``quiet_cond``,
#   which runs it with ``np.errstate(all="ignore")``; its derivatives and batched forms are
#   quiet_conds too. A cond with an unbatched index runs one branch and stays a ``cond``,
#   at no cost. Eagerly, with nothing above vmap (concrete operands), the branches simply
#   run under errstate; on the GPU (CuPy never warns) they are inlined as they are, so that
#   jit's fusion sees them with the rest of the program. Elsewhere the quiet_cond costs
#   what a nested program costs: its own plan, and no sharing with the program around it.
# - Reverse mode would multiply that example's zero cotangent by the branch's infinite
#   derivative: 0 · inf = NaN. So each batched floating operand enters branch ``b`` as
#   ``select(taken_b, x, stop_gradient(x))`` (the same value), whose cotangent is the
#   branch's cotangent where the branch is taken and zero where it is not: the untaken
#   examples' NaN never reaches the operand's gradient. (An unbatched operand is left as
#   it is: guarding it would batch it, one copy per example; its gradient sums over
#   examples, so an untaken branch's NaN that depends on a batched value can still reach
#   it. JAX guards nothing.)
def _select_branches(axis, index, operands, op_dims, branches):
    """The batched cond of ``branches`` with ``index`` batched at 0 (NOTE [a batched
    predicate]): a quiet_cond whose branch runs each branch and selects; with concrete
    operands (nothing but eval below vmap, nothing above it to see the branches) the same
    now, with the warnings off; on the GPU, where nothing warns, the branches and selects
    inline."""
    front = [x if d is not_mapped else move_bdim(x, d, 0) for x, d in zip(operands, op_dims)]
    front_dims = tuple(not_mapped if d is not_mapped else 0 for d in op_dims)
    front_avals = avals_of(front)
    nout = len(branches[0].out_avals)
    programs = [batch_jaxpr(b, axis, front_dims, front_avals, instantiate=[True] * nout)[0] for b in branches]
    floating = [d is not not_mapped and kind_of(a.dtype) in "fc" for d, a in zip(front_dims, front_avals)]

    def select_branch(index, *ops, guarded=floating):
        results = None
        for k, p in enumerate(programs):
            taken = elementwise.eq(index, np.asarray(k, np.int32))  # (a literal when staged)
            ins = [_guard(x, taken) if g else x for x, g in zip(ops, guarded)]
            outs = ir.eval_jaxpr(p.jaxpr, p.consts, ins)
            results = outs if results is None else [elementwise.select(expand(taken, o), o, r)
                                                    for o, r in zip(outs, results)]
        return results

    in_avals = (aval_of(index),) + tuple(front_avals)
    if not any(isinstance(v, Tracer) for v in [index] + front):
        with np.errstate(all="ignore"):
            return select_branch(index, *front, guarded=[False] * len(front)), [0] * nout
    if any(a.device and a.device.startswith("gpu") for a in in_avals):
        return select_branch(index, *front), [0] * nout  # CuPy never warns: inlined, fused with the rest
    key = ("select branches", axis.size, axis.name, front_dims, in_avals, tuple(id(b) for b in branches[1:]))
    hit = branches[0].derived.get(key)
    if hit is None:
        program, consts = trace_flat(select_branch, in_avals, "cond")
        # (the entry holds the other branches, so their ids in the key stay theirs)
        hit = branches[0].derived[key] = (program, consts, branches)
    program, consts, _ = hit
    return quiet_cond_p.bind(np.asarray(0, np.int32), *consts, index, *front, branches=(program,)), [0] * nout


def _guard(x, taken):
    """``x`` whose cotangent is zero where ``taken`` is false (NOTE [a batched predicate])."""
    return elementwise.select(expand(taken, x), x, elementwise.stop_gradient(x))


# ---------------------------------------------------------------------------------------
# Splitting the branches (reverse mode, partial evaluation)
# ---------------------------------------------------------------------------------------


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
                res += outs[num_out:] if m == k else [zeros(a) for a in avals]
            return outs[:num_out] + res
        return branch

    branches, consts = _join(*_traced_branches(make, len(programs), in_avals))
    return branches, consts, res_avals


def _second_branches(programs, reads_of, read, res_avals, in_avals):
    """The second branches (NOTE [splitting the branches of a cond]): ``programs[k]`` takes
    the operands ``reads_of[k]``, its residuals, then the rest; each branch takes the
    operands ``read`` (the union of ``reads_of``), every branch's residuals, then the rest."""
    num_res = sum(len(a) for a in res_avals)

    def make(k):
        def branch(*vals):
            by_operand = dict(zip(read, vals[:len(read)]))
            rest = vals[len(read):]
            offset = sum(len(a) for a in res_avals[:k])
            mine = rest[offset:offset + len(res_avals[k])]
            p = programs[k]
            return ir.eval_jaxpr(p.jaxpr, p.consts,
                                 [by_operand[i] for i in reads_of[k]] + list(mine) + list(rest[num_res:]))
        return branch

    return _join(*_traced_branches(make, len(programs), in_avals))


def _traced_branches(make, n, in_avals):
    """The programs of the flat functions ``make(0) ... make(n - 1)`` on ``in_avals`` and
    their constants, for :func:`_join`."""
    traced = [trace_flat(make(k), in_avals, "cond") for k in range(n)]
    return [p for p, _ in traced], [c for _, c in traced]
