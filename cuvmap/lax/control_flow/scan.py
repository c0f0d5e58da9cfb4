"""``scan(f, c, xs) = (c_n, ys)`` with ``(c_{i+1}, ys[i]) = f(c_i, xs[i])`` (``reverse``
walks ``i`` backwards), as the primitive ``scan_p`` whose body is a staged program (JAX's
``lax.scan``).

vmap, jvp and partial evaluation find by a fixpoint which carries are batched, have
nonzero tangents or are unknown; reverse mode runs a forward scan that stacks each step's
residuals as extra outputs and a backward scan in the other direction whose carry is the
carry's cotangent and the constants' cotangents summed so far (NOTE [reverse mode of a
scan]). Eagerly the body's plan is reused (with its buffer pool) from one iteration to the
next.
"""
import numpy as np

from cuvmap import api_util, core, tree
from cuvmap.lax import elementwise, shape as lax_shape
from cuvmap.lax.control_flow.common import (
    SCAN_STAGER, Body, ControlFlowError, ControlFlowPrimitive, as_carry, aval_of, cast_numbers, check_carry,
    depends, extend_outputs, flatten_values, forwarded_inputs, grow, loop_jvp_program, loop_of, prune_outputs, reads, split3,
    stage_flat, trace_flat, with_program, xp_of, zeros, carries_on_device, device_of)
from cuvmap.transforms import ir
from cuvmap.transforms.batching import batch_jaxpr, bdim_at_front, move_bdim, not_mapped
from cuvmap.transforms.call import avals_of
from cuvmap.transforms.ir import ClosedJaxpr, Jaxpr, Var
from cuvmap.transforms.jvp import jvp_jaxpr
from cuvmap.transforms.partial_eval import everything_saveable, partial_eval_jaxpr
from cuvmap.transforms.vjp import vjp_programs
from cuvmap.core.bfloat16 import kind_of


class ScanPrimitive(ControlFlowPrimitive):
    """``scan[length num_consts num_carry program reverse unroll](*consts, *init, *xs)``:
    ``program(*consts, *carry, *x) -> (*carry, *y)`` applied ``length`` times, ``x`` the
    slices ``xs[i]`` (``i`` backwards with ``reverse``); results the last carry, then each
    ``y`` stacked along a new leading axis (in the order of ``xs``)."""

    __slots__ = ()
    what = "a scan"

    def run(self, *args, length, num_consts, num_carry, program, reverse, unroll):
        """Eval: the body's plan compiled as a loop (NOTE [a loop runs as generated
        Python] in cuvmap/transforms/loop_plans.py) writes each step's ``y``\\ s into the
        stacked results, made here. With ``unroll=k`` (``0``: all of them) the loop runs a
        program of ``k`` steps per iteration, and the remainder one step at a time (NOTE
        [scan's unroll])."""
        consts, carry, xs = split3(args, num_consts, num_carry)
        carry = carries_on_device(carry, device_of(args))
        xp = xp_of(args)
        ys = [xp.empty((length,) + tuple(a.shape), a.dtype) for a in program.out_avals[num_carry:]]
        if not length:
            return list(carry) + ys
        k = length if unroll == 0 else min(unroll, length)
        loop = loop_of(program, num_consts, num_carry)
        if k == 1:
            carry = loop(consts, carry, xs, ys, range(length - 1, -1, -1) if reverse else range(length))
            return carry + ys
        trips, full = length // k, length // k * k
        block, hoisted = _unrolled(program, num_consts, num_carry, k, reverse)
        block_loop = loop_of(block, len(hoisted) + num_consts, num_carry)
        # step j of a block reads row j of each x block and writes row j of each y block:
        # strided views of the stacked arrays, so nothing is sliced or stacked in the body
        x_blocks = [x[:full].reshape((trips, k) + tuple(x.shape[1:])) for x in xs]
        y_blocks = [y[:full].reshape((trips, k) + tuple(y.shape[1:])) for y in ys]
        x_cols = [xb[:, j] for j in range(k) for xb in x_blocks]
        y_cols = [yb[:, j] for j in range(k) for yb in y_blocks]
        if reverse:  # the remainder (the last rows) first, then the blocks backwards
            carry = loop(consts, carry, xs, ys, range(length - 1, full - 1, -1))
            carry = block_loop(hoisted + list(consts), carry, x_cols, y_cols, range(trips - 1, -1, -1))
        else:
            carry = block_loop(hoisted + list(consts), carry, x_cols, y_cols, range(trips))
            carry = loop(consts, carry, xs, ys, range(full, length))
        return carry + ys

    def out_avals(self, params):
        n, length = params["num_carry"], params["length"]
        avals = params["program"].out_avals
        return avals[:n] + [core.ShapedArray((length,) + tuple(a.shape), a.dtype, False, a.device) for a in avals[n:]]

    def dce(self, params, used_outputs):
        """The program optimizer: a carry is live if a result is, or if a live value reads
        it (a fixpoint); the constants, carries and xs nothing live reads are dropped."""
        nc, ncar = params["num_consts"], params["num_carry"]
        body = params["program"]
        used_ys = list(used_outputs[ncar:])

        def step(used_carry):
            pruned = prune_outputs(body, used_carry + used_ys)
            read = reads(pruned)
            return (pruned, read), read[nc:nc + ncar]

        used_carry, (pruned, read) = grow(list(used_outputs[:ncar]), step)
        used_consts, used_xs = read[:nc], read[nc + ncar:]
        used_in = used_consts + used_carry + used_xs
        program = with_program(pruned, [i for i, u in enumerate(used_in) if u])
        new = dict(params, program=program, num_consts=sum(used_consts), num_carry=sum(used_carry))
        return new, used_in, used_carry + used_ys

    def batch(self, axis, vals, dims, params):
        """vmap: which carries are batched is found by a fixpoint (a carry fed by a batched
        value becomes batched); batched carries and slices have their batch dim at 0
        (``xs`` at 1), and batched ``ys`` come out at 1."""
        nc, ncar = params["num_consts"], params["num_carry"]
        body = params["program"]
        consts, carry, xs = split3(vals, nc, ncar)
        c_dims, carry_dims, x_dims = split3(dims, nc, ncar)
        xs = [x if d is not_mapped else move_bdim(x, d, 1) for x, d in zip(xs, x_dims)]
        slice_dims = [not_mapped if d is not_mapped else 0 for d in x_dims]
        slice_avals = [_slice_aval(aval_of(x)) for x in xs]
        ny = len(body.out_avals) - ncar

        def step(batched):
            carry_vals = [bdim_at_front(c, d, axis.size) if b else c for c, d, b in zip(carry, carry_dims, batched)]
            in_avals = avals_of(consts) + avals_of(carry_vals) + slice_avals
            in_dims = list(c_dims) + [0 if b else not_mapped for b in batched] + slice_dims
            program, out_dims = batch_jaxpr(body, axis, in_dims, in_avals, instantiate=batched + [False] * ny)
            return (carry_vals, program, out_dims), [d is not not_mapped for d in out_dims[:ncar]]

        batched, (carry_vals, program, out_dims) = grow([d is not not_mapped for d in carry_dims], step)
        # (the consts' batch dims stay where they are: the program expects them there)
        outs = _bind_scan(consts, carry_vals, xs, program, params)
        return outs, ([0 if b else not_mapped for b in batched]
                      + [not_mapped if d is not_mapped else 1 for d in out_dims[ncar:]])

    def jvp(self, primals, tangents, params):
        """jvp: which carries have nonzero tangents is found by a fixpoint; the scan of the
        body's JVP carries the primal and tangent carries together."""
        nc, ncar = params["num_consts"], params["num_carry"]
        body = params["program"]
        consts, carry, xs = split3(primals, nc, ncar)
        c_t, carry_t, x_t = split3(tangents, nc, ncar)
        ny = len(body.out_avals) - ncar
        c_nz = [t is not None for t in c_t]
        x_nz = [t is not None for t in x_t]

        def step(carry_nz):
            program, out_nz = jvp_jaxpr(body, c_nz + carry_nz + x_nz, body.in_avals,
                                        instantiate=carry_nz + [False] * ny)
            return (program, out_nz), out_nz[:ncar]

        carry_nz, (program, out_nz) = grow([t is not None for t in carry_t], step)
        carry_t = [(t if t is not None else zeros(aval_of(p))) if nz else None
                   for p, t, nz in zip(carry, carry_t, carry_nz)]
        # the JVP program takes (primals, nonzero tangents) and returns (primal outs, nonzero
        # tangent outs): reordered into scan's (consts, carry, xs) -> (carry, ys) layout
        body_jvp, hoisted = loop_jvp_program(program, [nc, ncar, len(xs)], c_nz + carry_nz + x_nz, [ncar, ny], out_nz)
        outs = _bind_scan(hoisted + consts + _nonzero(c_t), carry + _nonzero(carry_t), xs + _nonzero(x_t),
                          body_jvp, params)
        num_carry_t = sum(carry_nz)
        out_carry, out_carry_t = outs[:ncar], outs[ncar:ncar + num_carry_t]
        rest = outs[ncar + num_carry_t:]
        out_ys, out_ys_t = rest[:ny], rest[ny:]
        it_c, it_y = iter(out_carry_t), iter(out_ys_t)
        tangents_out = ([next(it_c) if nz else None for nz in carry_nz]
                        + [next(it_y) if nz else None for nz in out_nz[ncar:]])
        return out_carry + out_ys, tangents_out

    def vjp(self, primals, needs_ct, params):
        """Reverse mode: a forward scan that stacks the residuals, and a backward scan the
        other way (NOTE [reverse mode of a scan])."""
        nc, ncar, length = params["num_consts"], params["num_carry"], params["length"]
        body = params["program"]
        consts, carry, xs = split3(primals, nc, ncar)
        c_need, init_need, x_need = split3(needs_ct, nc, ncar)
        ny = len(body.out_avals) - ncar
        in_avals = body.in_avals
        is_float = [kind_of(a.dtype) in "fc" for a in body.out_avals]

        def step(carry_d):
            dep = depends(body, c_need + carry_d + x_need)
            return dep, [d and f for d, f in zip(dep[:ncar], is_float[:ncar])]

        carry_d, dep = grow([n and f for n, f in zip(init_need, is_float[:ncar])], step)
        ys_d = [d and f for d, f in zip(dep[ncar:], is_float[ncar:])]
        split = vjp_programs(body, c_need + carry_d + x_need, in_avals, everything_saveable)
        read = split.primals_read
        read_consts = [i for i in read if i < nc]
        read_carries = [i - nc for i in read if nc <= i < nc + ncar]
        read_xs = [i - nc - ncar for i in read if i >= nc + ncar]
        # the forward body: the forward program, returning also the carries the backward reads
        fwd, fwd_consts = ir.hoist_consts(split.forward)
        fwd = extend_outputs(fwd, [len(fwd_consts) + nc + j for j in read_carries])
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
        bwd, bwd_consts = _backward_body(split, nc, ncar, carry_d, ys_d, c_need, body.out_avals)
        n_ct_carry = len(ct_carry_avals)

        def backward(cts):
            cts = list(cts)
            ct_carry = [c if c is not None else zeros(a) for c, a in zip(cts[:n_ct_carry], ct_carry_avals)]
            ct_ys = [c if c is not None else zeros(a, (length,)) for c, a in zip(cts[n_ct_carry:], y_ct_avals)]
            acc = [zeros(a) for a in const_ct_avals]
            res = _bind_scan(bwd_consts + read_const_vals, ct_carry + acc, stacked + read_x_vals + ct_ys, bwd, params,
                             reverse=not params["reverse"])
            carry_cts, res = res[:n_ct_carry], res[n_ct_carry:]
            c_cts, x_cts = res[:len(const_ct_avals)], res[len(const_ct_avals):]
            # the cotangents of the operands marked in needs_ct, in their order
            carry_ct_it = iter(carry_cts)
            init_cts = [next(carry_ct_it) if d else None for d in carry_d]
            return list(c_cts) + [init_cts[j] for j in range(ncar) if init_need[j]] + list(x_cts)

        return out_primals, with_ct, backward

    def partial_eval(self, trace, args, params):
        """Partial evaluation (under ``linearize``): which carries are unknown is found by a
        fixpoint; the known scan runs now and stacks the residuals the unknown part reads,
        and the unknown scan is staged (JAX's scan partial evaluation)."""
        nc, ncar = params["num_consts"], params["num_carry"]
        body = params["program"]
        unknown = [trace.main.owns(x) for x in args]
        c_u, carry_u, x_u = split3(unknown, nc, ncar)
        consts, carry, xs = split3(args, nc, ncar)
        ny = len(body.out_avals) - ncar

        def step(carry_u):
            split = partial_eval_jaxpr(body, c_u + carry_u + x_u, instantiate=carry_u + [False] * ny)
            return split, split.out_unknown[:ncar]

        carry_u, split = grow(carry_u, step)
        known_pos = [i for i, u in enumerate(c_u + carry_u + x_u) if not u]
        read = [known_pos[i] for i in split.known_read]  # body inputs the staged part reads
        read_carries = [i for i in read if nc <= i < nc + ncar]
        # the known body: the known program, returning also the known carries the staged part reads
        k_prog, k_prog_consts = ir.hoist_consts(split.known)
        k_prog = extend_outputs(k_prog, [len(k_prog_consts) + known_pos.index(i) for i in read_carries])
        k_outs = _bind_scan(k_prog_consts + _known(consts, c_u), _known(carry, carry_u), _known(xs, x_u), k_prog,
                            params)
        num_k_out = len(split.known.out_avals) - split.num_res
        known_results = k_outs[:num_k_out]
        stacked = k_outs[num_k_out:]  # residuals, then the known carries the staged part reads
        s_prog, s_consts, n_s_consts = _staged_body(split, body, read, nc, ncar, c_u, carry_u, x_u, stacked)
        s_params = dict(params, program=s_prog, num_consts=len(s_consts) + n_s_consts, num_carry=sum(carry_u))
        u_consts, u_carry, u_xs = _unknown(consts, c_u), _unknown(carry, carry_u), _unknown(xs, x_u)
        operands = (s_consts + [args[i] for i in read if i < nc] + u_consts + u_carry + stacked
                    + [args[i] for i in read if i >= nc + ncar] + u_xs)
        unknown_results = iter(trace.stage_equation(self, operands, _ordered(s_params), self.out_avals(s_params)))
        known_iter = iter(known_results)
        return [next(unknown_results) if u else next(known_iter) for u in split.out_unknown]


scan_p = ScanPrimitive("scan")


class ScanArgumentError(ControlFlowError, ValueError):
    """``scan``'s ``xs``, ``length`` or ``unroll`` do not fit (a leaf without a leading
    axis, leading sizes that disagree, a negative ``unroll``): a ``ValueError``, as JAX's
    (and a :class:`ControlFlowError`)."""


def _nonzero(tangents):
    return [t for t in tangents if t is not None]


def _known(values, unknown):
    return [v for v, u in zip(values, unknown) if not u]


def _unknown(values, unknown):
    return [v for v, u in zip(values, unknown) if u]


def _split_at(vals, sizes):
    """``vals`` cut into consecutive pieces of ``sizes``."""
    pieces, lo = [], 0
    for n in sizes:
        pieces.append(list(vals[lo:lo + n]))
        lo += n
    return pieces


def _staged_body(split, body, read, nc, ncar, c_u, carry_u, x_u, stacked):
    """The body of the staged scan of a partial evaluation: ``(read consts, unknown
    consts, unknown carries, stacked residuals and read carries, read xs, unknown xs) ->
    the unknown outputs``. Returns ``(program, consts, number of read and unknown
    consts)``."""
    read_consts = [i for i in read if i < nc]
    read_carries = [i for i in read if nc <= i < nc + ncar]
    read_xs = [i for i in read if i >= nc + ncar]
    staged = split.staged
    n_res = split.num_res
    sizes = [len(read_consts), sum(c_u), sum(carry_u), n_res, len(read_carries), len(read_xs), sum(x_u)]

    def staged_body(*vals):
        r_consts, uc, ucar, res, r_carries, r_xs, ux = _split_at(vals, sizes)
        by_input = dict(zip(read_consts + read_carries + read_xs, r_consts + r_carries + r_xs))
        return ir.eval_jaxpr(staged.jaxpr, staged.consts, [by_input[i] for i in read] + res + uc + ucar + ux)

    a = body.in_avals
    s_avals = ([a[i] for i in read_consts] + _unknown(a[:nc], c_u) + _unknown(a[nc:nc + ncar], carry_u)
               + [_slice_aval(aval_of(s)) for s in stacked] + [a[i] for i in read_xs] + _unknown(a[nc + ncar:], x_u))
    program, consts = trace_flat(staged_body, s_avals, "scan")
    return program, consts, len(read_consts) + sum(c_u)


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
def _backward_body(split, nc, ncar, carry_d, ys_d, c_need, out_avals):
    """The backward scan's body (NOTE [reverse mode of a scan]) from the body's backward
    program, by rewriting its arguments and results rather than tracing it again:
    ``(read consts, ct_carry, acc, saved, read carries, read xs, ct_y) -> (ct_carry_prev,
    acc + ct_consts, ct_x)``. The cotangents of the outputs that take none here (a carry
    or a y that depends on nothing differentiated) are zeros. Returns ``(program,
    consts)``."""
    j = split.backward.jaxpr
    read = split.primals_read
    n_reads, num_saved = len(read), split.num_saved
    read_vars = dict(zip(read, j.invars[:n_reads]))
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
            head.append(ir.JaxprEqn(lax_shape.broadcast_in_dim_p, [zero], [v],
                                    {"shape": tuple(out_avals[k].shape), "broadcast_dimensions": ()}))
    outs = list(j.outvars)
    c_cts, outs = outs[:sum(c_need)], outs[sum(c_need):]
    carry_cts, x_cts = outs[:sum(carry_d)], outs[sum(carry_d):]
    acc_vars = [Var(a) for a, need in zip(split.forward.in_avals[:nc], c_need) if need]
    new_acc = [Var(v.aval) for v in acc_vars]
    tail = [ir.JaxprEqn(elementwise.add_p, [a, c], [n], {}) for a, c, n in zip(acc_vars, c_cts, new_acc)]
    invars = ([read_vars[i] for i in read if i < nc] + ct_carry_vars + acc_vars + saved_vars
              + [read_vars[i] for i in read if nc <= i < nc + ncar] + [read_vars[i] for i in read if i >= nc + ncar]
              + ct_y_vars)
    program = ClosedJaxpr(Jaxpr(j.constvars, invars, head + j.eqns + tail, carry_cts + new_acc + x_cts),
                          split.backward.consts)
    return ir.hoist_consts(program)


# NOTE [scan's unroll]
# ``unroll=k`` (JAX's) runs ``k`` steps per iteration of the loop: the body's program is
# traced ``k`` times into one program (:func:`_unrolled`, made once per body and ``k``,
# kept in the body's ``derived``) that takes ``k`` rows of each ``x`` and returns ``k``
# rows of each ``y``, and the loop walks ``length // k`` blocks; the ``length % k`` steps
# left over run one at a time after the blocks (before them with ``reverse``). ``unroll=0``
# or ``True`` is one block of every step, ``1`` or ``False`` the plain loop. The block's
# rows are strided views of the stacked ``xs`` and ``ys`` (``xs[:full].reshape(trips, k,
# ...)[:, j]``), so the unrolled program slices and stacks nothing: its steps are the
# body's, ``k`` times, planned as one straight-line program (the executor reuses buffers
# across the ``k`` steps and fuses elementwise chains that cross a step on the GPU). The
# results are the same numbers in the same order. What it buys in cuvmap is smaller than
# in XLA: a step of the plain loop already costs only its body's impls and a few
# bytecodes (NOTE [a loop runs as generated Python] in cuvmap/transforms/loop_plans.py),
# so unrolling saves those bytecodes and lets fusion cross steps, and costs a program ``k``
# times longer to plan. The transforms keep ``unroll`` in the params (the program text
# shows it) and pass it on: the JVP, the forward and backward scans of reverse mode and
# the batched scan unroll as the user's did.


def _bind_scan(consts, carry, xs, program, params, **changes):
    """Binds ``scan_p`` with ``program``, hoisting its constants in front of ``consts``."""
    body, hoisted = ir.hoist_consts(program)
    new = dict(params, program=body, num_consts=len(hoisted) + len(consts), num_carry=len(carry))
    new.update(changes)
    return scan_p.bind(*hoisted, *consts, *carry, *xs, **_ordered(new))


def _ordered(params):
    """Scan's params in the order the program text shows them."""
    keys = ("length", "num_consts", "num_carry", "program", "reverse", "unroll")
    return {k: params[k] for k in keys}


def _slice_aval(aval):
    return core.ShapedArray(tuple(aval.shape[1:]), aval.dtype, False, aval.device)


def _unrolled(program, num_consts, num_carry, k, reverse):
    """``program`` (``(consts, carry, x) -> (carry, y)``) ``k`` times in one program
    (NOTE [scan's unroll]): ``(hoisted, consts, carry, x_0.., .., x_{k-1}..) -> (carry,
    y_0.., .., y_{k-1}..)``, the rows of step ``j`` in ``j``'s place, the steps run
    ``k - 1`` down to ``0`` with ``reverse``. Returns ``(program, hoisted constants)``,
    made once per body, ``k`` and direction."""
    key = ("unrolled", num_consts, num_carry, k, bool(reverse))
    hit = program.derived.get(key)
    if hit is not None:
        return hit
    in_avals = program.in_avals
    nc, ncar = num_consts, num_carry
    x_avals = in_avals[nc + ncar:]
    nx = len(x_avals)

    def unrolled(*vals):
        consts, carry, x_rows = vals[:nc], list(vals[nc:nc + ncar]), vals[nc + ncar:]
        ys = [None] * k
        for j in (range(k - 1, -1, -1) if reverse else range(k)):
            outs = ir.eval_jaxpr(program.jaxpr, program.consts, list(consts) + carry + list(x_rows[j * nx:(j + 1) * nx]))
            carry, ys[j] = list(outs[:ncar]), list(outs[ncar:])
        return carry + [y for step in ys for y in step]

    made = trace_flat(unrolled, list(in_avals[:nc + ncar]) + list(x_avals) * k, f"scan body unrolled {k} times")
    return program.derived.setdefault(key, made)


# ---------------------------------------------------------------------------------------
# The user's function
# ---------------------------------------------------------------------------------------


def scan(f, init, xs=None, length=None, reverse=False, unroll=1, _split_transpose=False):
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
      unroll: how many iterations one step of the loop runs, as JAX's: an int ``k >= 1``
        runs ``k`` steps staged as one program per iteration and the ``length % k`` left
        one by one, ``0`` or ``True`` all of them in one program, ``1`` or ``False`` one
        step at a time (NOTE [scan's unroll]); the results are the same.
      _split_transpose: JAX's experimental switch for how reverse mode splits the
        transposed scan; accepted for compatibility, it changes nothing here (the reverse
        pass is always one backward scan, NOTE [reverse mode of a scan]).
    Returns:
      ``(carry, ys)``: the last carry and the stacked ``y``\\ s.

    Example::

        def step(h, x):
            h = cnp.tanh(h @ w + x @ u)
            return h, h
        h_last, hs = scan(step, h0, xs)
    """
    if not callable(f):
        raise ControlFlowError(f"scan: f must be callable, got {f!r} (lax.scan: f argument should be callable)")
    where = f"scan({api_util.fun_name(f)})"
    if not isinstance(reverse, (bool, np.bool_)):
        raise ControlFlowError(f"{where}: reverse must be True or False, got {reverse!r}")
    carry_paths, carry_leaves, carry_tree = flatten_values("init", init, where)
    x_paths, x_leaves, x_tree = flatten_values("xs", xs, where)
    length = _scan_length(where, x_paths, x_leaves, length)
    unroll = _scan_unroll(where, unroll, length)
    x_avals = [_slice_aval(aval_of(x)) for x in x_leaves]
    carry_avals = [aval_of(c) for c in carry_leaves]
    num_carry = len(carry_leaves)
    origins = [f"the carry{tree.keystr(p)}" for p in carry_paths] + [f"xs{tree.keystr(p)}" for p in x_paths]
    for _ in range(2):  # a second trace when a weakly typed carry took a dtype from f
        body, y_tree = _stage_scan_body(f, where, carry_tree, carry_avals, x_tree, x_avals, origins)
        new_avals = check_carry(where, "f", body.out_paths[:num_carry], carry_avals, body.out_avals[:num_carry])
        if new_avals is None:
            break
        carry_avals = new_avals
        carry_leaves = as_carry(carry_leaves, carry_avals)
    else:
        raise AssertionError("the carry's dtype did not settle")
    params = {"length": length, "reverse": bool(reverse), "unroll": unroll}
    # a carry the body returns unchanged is a constant of the loop (NOTE [forwarded operands])
    nc = len(body.consts)
    program = body.program
    fwd = forwarded_inputs([program])[:num_carry]
    read_only = [j for j in range(num_carry) if fwd[j] == nc + j]
    if read_only:
        moving = [j for j in range(num_carry) if fwd[j] != nc + j]
        program = with_program(program, list(range(nc)) + [nc + j for j in read_only + moving]
                               + list(range(nc + num_carry, len(program.in_avals))),
                               moving + list(range(num_carry, len(program.out_avals))))
    consts = list(body.consts) + [carry_leaves[j] for j in read_only]
    moving_leaves = [c for j, c in enumerate(carry_leaves) if j not in read_only]
    outs = iter(_bind_scan(consts, moving_leaves, x_leaves, program, params))
    fixed = dict(zip(read_only, cast_numbers([carry_leaves[j] for j in read_only], [carry_avals[j] for j in read_only])))
    outs = [fixed[j] if j in fixed else next(outs) for j in range(num_carry)] + list(outs)
    outs = api_util.unaliased([api_util.to_array_result(o) for o in outs], carry_leaves + x_leaves)
    return tree.unflatten(carry_tree, outs[:num_carry]), tree.unflatten(y_tree, outs[num_carry:])


def _scan_length(where, x_paths, x_leaves, length):
    sizes = []
    for path, x in zip(x_paths, x_leaves):
        shape = core.shape_of(x)
        if not shape:
            raise ScanArgumentError(f"{where}: xs{tree.keystr(path)} is a scalar (shape ()); every leaf of xs "
                                    "needs a leading axis to scan over (scan got value with no leading axis to "
                                    "scan over)")
        sizes.append((path, shape[0]))
    if length is not None:
        if not api_util.is_int(length) or length < 0:
            raise ControlFlowError(f"{where}: length must be a non-negative int, got {length!r}")
        length = int(length)
    for path, n in sizes:
        if length is None:
            length = n
        elif n != length:
            first = (f"length {length}" if not sizes or sizes[0][1] != length
                     else f"xs{tree.keystr(sizes[0][0])} has {length}")
            raise ScanArgumentError(f"{where}: xs{tree.keystr(path)} has {n} entries along its leading axis, but "
                                   f"{first}; every leaf of xs must have the same leading size")
    if length is None:
        raise ControlFlowError(f"{where}: xs is None (or has no leaves), so length must be given")
    return length


def _scan_unroll(where, unroll, length):
    """JAX's ``unroll``: ``True`` is every step (``max(length, 1)``), ``False`` one, an int
    ``k >= 0`` kept as it is (``0`` unrolls every step, as JAX's)."""
    if isinstance(unroll, (bool, np.bool_)):
        return max(length, 1) if unroll else 1
    if not api_util.is_int(unroll) or unroll < 0:
        raise ScanArgumentError(f"{where}: unroll must be a non-negative int or a bool (`unroll` must be a `bool` or "
                                f"a non-negative `int`), got {unroll!r}")
    return int(unroll)


def _stage_scan_body(f, where, carry_tree, carry_avals, x_tree, x_avals, origins):
    """``f(carry, x) -> (carry, y)`` staged as ``(*carry, *x) -> (*carry, *y)``."""
    num_carry = len(carry_avals)
    box = []

    def flat(*leaves):
        out = f(tree.unflatten(carry_tree, list(leaves[:num_carry])), tree.unflatten(x_tree, list(leaves[num_carry:])))
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ControlFlowError(f"{where}: f must return a pair (carry, y), got {tree.describe(out)}")
        c_paths, c_leaves, c_tree = flatten_values("the carry it returns ", out[0], where)
        if c_tree != carry_tree:
            raise ControlFlowError(f"{where}: f returned a carry of structure {c_tree}, but the initial carry "
                                   f"has structure {carry_tree}; the carry must keep its structure")
        y_paths, y_leaves, y_tree = flatten_values("the y it returns ", out[1], where)
        box.append((c_paths, y_tree, y_paths))
        return cast_numbers(c_leaves, carry_avals) + y_leaves

    program, consts = stage_flat(flat, list(carry_avals) + list(x_avals), where, SCAN_STAGER, origins)
    c_paths, y_tree, y_paths = box[0]
    return Body(program, consts, None, c_paths + y_paths), y_tree
