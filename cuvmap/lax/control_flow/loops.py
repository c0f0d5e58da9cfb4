"""``while_loop(cond_fun, body_fun, c)`` as the primitive ``while_p`` (JAX's
``lax.while_loop``), and ``fori_loop`` and ``map`` built on it and on ``scan``.

vmap with a batched predicate runs until every example is done and freezes the finished
ones with ``select``; jvp by a fixpoint; no reverse mode (the number of iterations is not
known in advance; as in JAX, use ``scan`` or ``fori_loop`` with static bounds).
"""
import math
import weakref

import numpy as np

from cuvmap import api_util, tree
from cuvmap.core import PrimalTracer, Tracer
from cuvmap.lax import bitwise, elementwise, reduction
from cuvmap.lax.control_flow.chunked import ChunkedMap, check_chunk_spec, vmap_combine
from cuvmap.lax.control_flow.conditionals import cond
from cuvmap.lax.control_flow.common import (
    WHILE_STAGER, ControlFlowError, ControlFlowPrimitive, as_carry, aval_of, cast_numbers, check_carry, depends,
    describe, expand, flatten_values, forwarded_inputs, grow, is_value, loop_jvp_program, prune_outputs, reads, split3,
    stage_body, trace_flat, while_of, with_program, zeros, carries_on_device, device_of)
from cuvmap.lax.control_flow.scan import scan
from cuvmap.transforms import batching, ir
from cuvmap.transforms.batching import batch_jaxpr, bdim_at_front, not_mapped
from cuvmap.transforms.call import avals_of
from cuvmap.transforms.ir import ClosedJaxpr, Jaxpr, Var
from cuvmap.transforms.jvp import jvp_jaxpr
from cuvmap.transforms.remat import checkpoint
from cuvmap.core.bfloat16 import kind_of


class WhileGradError(ControlFlowError, ValueError):
    """Reverse-mode differentiation of a ``while_loop`` (or a ``fori_loop`` with traced
    bounds), which has no fixed number of iterations; a ``ValueError`` as JAX's."""


class WhilePrimitive(ControlFlowPrimitive):
    """``while[cond_nconsts cond_program body_nconsts body_program](*cond_consts,
    *body_consts, *init)``: ``carry = body_program(*body_consts, *carry)`` while
    ``cond_program(*cond_consts, *carry)`` (a boolean scalar) holds; the result is the
    last carry."""

    __slots__ = ()
    what = "a while_loop"
    host_sync = True  # the predicate is read on the host

    def run(self, *args, cond_nconsts, cond_program, body_nconsts, body_program):
        cond_consts, body_consts, carry = split3(args, cond_nconsts, body_nconsts)
        carry = carries_on_device(carry, device_of(args))
        # the predicate's and the body's plans run as one generated loop (NOTE [a loop runs
        # as generated Python] in cuvmap/transforms/loop_plans.py)
        return while_of(cond_program, body_program, cond_nconsts, body_nconsts)(cond_consts, body_consts, carry)

    def out_avals(self, params):
        return params["body_program"].out_avals

    def dce(self, params, used_outputs):
        """The program optimizer: a carry is live if a result or the predicate reads it, or
        a live carry's update does (a fixpoint)."""
        ncc, nbc = params["cond_nconsts"], params["body_nconsts"]
        cond_prog, body = params["cond_program"], params["body_program"]
        cond_reads = reads(cond_prog)

        def step(used):
            pruned = prune_outputs(body, used)
            read = reads(pruned)
            return (pruned, read), read[nbc:]

        used, (pruned, read) = grow([u or r for u, r in zip(used_outputs, cond_reads[ncc:])], step)
        body_consts_used = read[:nbc]
        cond_consts_used = cond_reads[:ncc]
        body = with_program(pruned, [i for i, u in enumerate(body_consts_used + used) if u])
        cond_prog = with_program(cond_prog, [i for i, u in enumerate(cond_consts_used + used) if u])
        new = dict(params, cond_nconsts=sum(cond_consts_used), cond_program=cond_prog,
                   body_nconsts=sum(body_consts_used), body_program=body)
        return new, cond_consts_used + body_consts_used + used, used

    def batch(self, axis, vals, dims, params):
        """vmap: which carries are batched by a fixpoint; with a batched predicate every
        carry is batched, the loop runs while any example's predicate holds, and an example
        whose predicate fails keeps its value (``select``)."""
        ncc, nbc = params["cond_nconsts"], params["body_nconsts"]
        cond_prog, body = params["cond_program"], params["body_program"]
        cc, bc, carry = split3(vals, ncc, nbc)
        cc_d, bc_d, carry_d = split3(dims, ncc, nbc)

        carry = carries_on_device(carry, axis.device)  # a Python-number counter broadcast on the GPU

        def step(batched):
            carry_vals = [bdim_at_front(c, d, axis.size) if b else c for c, d, b in zip(carry, carry_d, batched)]
            carry_dims = [0 if b else not_mapped for b in batched]
            body_b, out_dims = batch_jaxpr(body, axis, bc_d + carry_dims, avals_of(bc) + avals_of(carry_vals),
                                           instantiate=batched)
            return (carry_vals, carry_dims, body_b), [d is not not_mapped for d in out_dims]

        _, (carry_vals, carry_dims, body_b) = grow([d is not not_mapped for d in carry_d], step)
        cond_avals = avals_of(cc) + avals_of(carry_vals)
        cond_b, (pred_dim,) = batch_jaxpr(cond_prog, axis, cc_d + carry_dims, cond_avals)
        if pred_dim is not_mapped:
            return _bind_while(cc, cond_b, bc, body_b, carry_vals), carry_dims
        # a batched predicate: every example's value is frozen once its own predicate fails
        _, (carry_vals, carry_dims, body_b) = grow([True] * len(carry), step)
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
            return [elementwise.select(expand(pred, n), n, c) for n, c in zip(new, cur)]

        new_cond, new_cond_consts = trace_flat(any_running, cond_avals, "while_loop")
        step_avals = avals_of(cc) + avals_of(bc) + avals_of(carry_vals)
        new_body, new_body_consts = trace_flat(step_running, step_avals, "while_loop")
        outs = _bind_while(new_cond_consts + cc, new_cond, new_body_consts + cc + bc, new_body, carry_vals)
        return outs, [0] * len(outs)

    def jvp(self, primals, tangents, params):
        """jvp: the carries with nonzero tangents by a fixpoint; the loop of the body's JVP,
        its predicate reading the primal carries."""
        ncc, nbc = params["cond_nconsts"], params["body_nconsts"]
        cond_prog, body = params["cond_program"], params["body_program"]
        cc, bc, carry = split3(primals, ncc, nbc)
        _, bc_t, carry_t = split3(tangents, ncc, nbc)
        bc_nz = [t is not None for t in bc_t]
        carry_nz, program = grow([t is not None for t in carry_t],
                                 lambda nz: jvp_jaxpr(body, bc_nz + nz, body.in_avals, instantiate=nz))
        carry_t = [(t if t is not None else zeros(aval_of(p))) if nz else None
                   for p, t, nz in zip(carry, carry_t, carry_nz)]
        body_jvp, hoisted = loop_jvp_program(program, [nbc, len(carry)], bc_nz + carry_nz)
        # the predicate ignores the tangent carries
        cj = cond_prog.jaxpr
        extra = [Var(aval_of(t)) for t in carry_t if t is not None]
        cond_jvp = ClosedJaxpr(Jaxpr([], cj.invars + extra, cj.eqns, cj.outvars), [])
        outs = _bind_while(cc, cond_jvp, hoisted + bc + [t for t in bc_t if t is not None],
                           body_jvp, carry + [t for t in carry_t if t is not None])
        out_p, out_t = outs[:len(carry)], iter(outs[len(carry):])
        return out_p, [next(out_t) if nz else None for nz in carry_nz]

    def vjp(self, primals, needs_ct, params):
        raise WhileGradError(
            "Reverse-mode differentiation does not work for lax.while_loop or lax.fori_loop with dynamic "
            "start/stop values: reverse mode (grad, vjp, jacrev) of a while_loop is not supported: the number of "
            "iterations is not known in advance, so there is no fixed set of residuals to keep (as in JAX, "
            "jax#2469). Give the loop a bound, while_loop(cond_fun, body_fun, init_val, max_steps=N), which is "
            "differentiable in reverse mode (checkpointed), or use scan, or fori_loop with static (Python int) "
            "bounds; forward mode (jvp, jacfwd) works")

    def partial_eval(self, trace, args, params):
        """Partial evaluation (under ``linearize``): when the predicate and the known
        carries depend on known values only, the known carries come from a loop that runs
        now; the unknown ones from the whole loop staged, which recomputes the known part
        (JAX's rule: there is no fixed number of iterations whose residuals could be
        kept)."""
        ncc, nbc = params["cond_nconsts"], params["body_nconsts"]
        cond_prog, body = params["cond_program"], params["body_program"]
        unknown = [trace.main.owns(x) for x in args]
        cc_u, bc_u, carry_u = split3(unknown, ncc, nbc)
        carry_u, _ = grow(carry_u, lambda u: (None, depends(body, bc_u + u)))
        if any(depends(cond_prog, cc_u + carry_u)) or all(carry_u):
            return self.stage(trace, args, params)
        cc, bc, carry = split3(args, ncc, nbc)
        known = [i for i, u in enumerate(carry_u) if not u]
        body_known = prune_outputs(body, [not u for u in carry_u])
        body_known = with_program(body_known, list(range(nbc)) + [nbc + i for i in known])
        cond_known = with_program(cond_prog, list(range(ncc)) + [ncc + i for i in known])
        known_outs = iter(self.bind(*cc, *bc, *[carry[i] for i in known], cond_nconsts=ncc, cond_program=cond_known,
                                    body_nconsts=nbc, body_program=body_known))
        staged = self.stage(trace, args, params)
        return [s if u else next(known_outs) for s, u in zip(staged, carry_u)]


while_p = WhilePrimitive("while")


def _bind_while(cond_consts, cond_prog, body_consts, body_prog, carry):
    """Binds ``while_p``, hoisting the programs' constants in front of their consts."""
    cond_prog, cond_hoisted = ir.hoist_consts(cond_prog)
    body_prog, body_hoisted = ir.hoist_consts(body_prog)
    cc = cond_hoisted + list(cond_consts)
    bc = body_hoisted + list(body_consts)
    return while_p.bind(*cc, *bc, *carry, cond_nconsts=len(cc), cond_program=cond_prog,
                        body_nconsts=len(bc), body_program=body_prog)


# ---------------------------------------------------------------------------------------
# The user's functions
# ---------------------------------------------------------------------------------------


def while_loop(cond_fun, body_fun, init_val, max_steps=None):
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
      max_steps: ``None``, or a Python int ``N``: the loop stops after at most ``N``
        iterations, returning the value it has then, and is differentiable in reverse mode
        (NOTE [a bounded while loop]).
    Returns:
      the last value.

    ``vmap`` with a batched predicate runs until every example is done, each example's
    value frozen once its own predicate fails; ``jvp``/``jacfwd`` work; reverse mode does
    not without ``max_steps`` (the iterations are not known in advance).
    """
    if max_steps is not None:
        return _bounded_while(cond_fun, body_fun, init_val, max_steps)
    for name, f in (("cond_fun", cond_fun), ("body_fun", body_fun)):
        if not callable(f):
            raise ControlFlowError(f"while_loop: {name} must be callable, got {f!r} (lax.while_loop: cond_fun and "
                                   "body_fun arguments should be callable)")
    where = f"while_loop({api_util.fun_name(cond_fun)}, {api_util.fun_name(body_fun)})"
    paths, leaves, in_tree = flatten_values("init_val", init_val, where)
    avals = [aval_of(x) for x in leaves]
    origins = [f"the loop's value{tree.keystr(p)}" for p in paths]
    for _ in range(2):  # a second trace when a weakly typed value took a dtype from body_fun
        body = stage_body(body_fun, in_tree, avals, where, WHILE_STAGER, origins,
                          fix_outputs=lambda out: cast_numbers(out, avals), splat=False)
        if body.out_tree != in_tree:
            raise ControlFlowError(f"{where}: body_fun returned structure {body.out_tree}, but init_val has "
                                   f"structure {in_tree}; the value must keep its structure")
        new_avals = check_carry(where, "body_fun", body.out_paths, avals, body.out_avals)
        if new_avals is None:
            break
        avals = new_avals
        leaves = as_carry(leaves, avals)
    cond = stage_body(cond_fun, in_tree, avals, where, WHILE_STAGER, origins, splat=False)
    pred = cond.out_avals
    if len(pred) != 1 or cond.out_tree != tree.structure(True):  # JAX's texts (its tests match them)
        raise ControlFlowError(f"{where}: cond_fun must return a boolean scalar, but got pytree {cond.out_tree}.")
    if pred[0].shape != () or pred[0].dtype != np.bool_:
        raise ControlFlowError(f"{where}: cond_fun must return a boolean scalar, but got output type(s) "
                               f"[ShapedArray({pred[0]})].")
    # a value the body returns unchanged is a constant of the loop (NOTE [forwarded operands])
    ncc, nbc, n = len(cond.consts), len(body.consts), len(leaves)
    fwd = forwarded_inputs([body.program])
    read_only = [j for j in range(n) if fwd[j] == nbc + j]
    if len(read_only) == n:  # nothing changes: the loop stays as written (it ends at once or never)
        read_only = []
    moving = [j for j in range(n) if j not in read_only]
    cond_program, body_program = cond.program, body.program
    if read_only:
        cond_program = with_program(cond_program, list(range(ncc)) + [ncc + j for j in read_only + moving])
        body_program = with_program(body_program, list(range(nbc)) + [nbc + j for j in read_only + moving], moving)
    fixed = [leaves[j] for j in read_only]
    outs = iter(while_p.bind(*cond.consts, *fixed, *body.consts, *fixed, *[leaves[j] for j in moving],
                             cond_nconsts=ncc + len(fixed), cond_program=cond_program,
                             body_nconsts=nbc + len(fixed), body_program=body_program))
    fixed = dict(zip(read_only, cast_numbers(fixed, [avals[j] for j in read_only])))
    outs = [fixed[j] if j in fixed else next(outs) for j in range(n)]
    outs = api_util.unaliased([api_util.to_array_result(o) for o in outs], leaves)
    return tree.unflatten(in_tree, outs)


# NOTE [a bounded while loop]
# while_loop(cond, body, init, max_steps=N) (equinox's checkpointed while_loop; jax#2469)
# runs as a scan of ⌈N/K⌉ blocks of K = ⌈√N⌉ guarded steps: a step applies body only
# while the loop runs (cond(carry) held at every step so far, and fewer than N steps
# taken), through lax.cond, so a finished loop's carry never goes through body again; a
# block is skipped altogether (cond) once the loop has finished, so at most K - 1 steps
# are wasted; and each block is checkpointed. Reverse mode then keeps the ⌈N/K⌉ carries
# at the blocks' starts and, block by block on the way back, recomputes one block's K
# carries: about 2√N carries instead of N, for one more forward pass. The gradient is
# the exact gradient of the iterations actually run. Under vmap with a batched predicate
# each example stops at its own count (the guards become per-example selects, which run
# body on a finished example's value and discard it: a body that is NaN there makes its
# derivative NaN too, as jnp.where's does).


def _bounded_while(cond_fun, body_fun, init_val, max_steps):
    where = f"while_loop({api_util.fun_name(cond_fun)}, {api_util.fun_name(body_fun)}, max_steps={max_steps!r})"
    if not api_util.is_int(max_steps) or int(max_steps) < 0:
        raise ControlFlowError(f"{where}: max_steps must be a non-negative Python int")
    max_steps = int(max_steps)
    if max_steps == 0:
        return init_val
    block = math.isqrt(max_steps - 1) + 1  # ⌈√N⌉
    num_blocks = -(-max_steps // block)

    def guarded_step(state, _):
        val, running, count = state
        running = bitwise.bitwise_and(running, elementwise.lt(count, max_steps))
        running = bitwise.bitwise_and(running, _predicate(cond_fun(val), where))
        val = cond(running, body_fun, lambda v: v, val)
        return (val, running, count + 1), None

    guarded_step.__name__ = api_util.fun_name(body_fun)

    @checkpoint
    def run_block(state):
        state, _ = scan(guarded_step, state, None, length=block)
        return state

    def outer(state, _):
        return cond(state[1], run_block, lambda s: s, state), None

    (val, _, _), _ = scan(outer, (init_val, True, 0), None, length=num_blocks)
    return val


def _predicate(pred, where):
    """``cond_fun``'s result, checked to be a boolean scalar."""
    aval = aval_of(pred)
    if aval.shape != () or aval.dtype != np.bool_:
        raise ControlFlowError(f"{where}: cond_fun must return a boolean scalar, but got output type(s) "
                               f"[ShapedArray({aval})].")
    return pred


def fori_loop(lower, upper, body_fun, init_val, *, unroll=None):
    """``val = body_fun(i, val)`` for ``i`` in ``range(lower, upper)`` (JAX's
    ``lax.fori_loop``)::

        def fori_loop(lower, upper, body_fun, init_val):
            val = init_val
            for i in range(lower, upper):
                val = body_fun(i, val)
            return val

    With bounds whose values are known now (Python or NumPy numbers, arrays, or values
    under ``grad``/``jvp``, which carry theirs) it is a :func:`scan` of ``max(upper -
    lower, 0)`` steps over ``i = int(lower), int(lower) + 1, ...``, so reverse mode works
    and ``unroll`` (as :func:`scan`'s; ``None`` is 1) applies; float bounds count as their
    ``int()``, as in JAX, and no derivative flows to them. With traced bounds (under
    ``jit`` or ``vmap``, or inside another loop's body) it is a :func:`while_loop` (forward
    mode only) whose counter has the bounds' dtype, and ``unroll`` must be left out.
    ``lower`` and ``upper`` must have the same dtype, except that a Python number takes
    the other bound's.

    Example::

        x = fori_loop(0, 10, lambda i, x: x * 0.5 + i, x0)
    """
    if not callable(body_fun):
        raise ControlFlowError(f"fori_loop: body_fun must be callable, got {body_fun!r} "
                               "(lax.fori_loop: body_fun argument should be callable)")
    where = f"fori_loop({api_util.fun_name(body_fun)})"
    dtype = _bounds_dtype(where, lower, upper)
    static = _static_bounds(lower, upper)
    if static is not None:
        lower, upper = static

        def step(carry, _):
            i, val = carry
            return (i + 1, body_fun(i, val)), None

        step.__name__ = api_util.fun_name(body_fun)
        (_, val), _ = scan(step, (lower, init_val), None, length=max(upper - lower, 0),
                           unroll=1 if unroll is None else unroll)
        return val
    if unroll is not None and unroll is not False and unroll != 1:
        raise ValueError(f"{where}: Can only use `unroll` in `fori_loop` if the loop bounds are statically known "
                         "(Python or NumPy numbers); these are traced")
    lower = elementwise.convert_element_type(lower, dtype)
    upper = elementwise.convert_element_type(upper, dtype)

    def cond_fun(carry):
        return elementwise.lt(carry[0], carry[1])

    def body(carry):
        i, stop, val = carry
        return i + 1, stop, body_fun(i, val)

    cond_fun.__name__ = "i_below_upper"
    body.__name__ = api_util.fun_name(body_fun)
    _, _, val = while_loop(cond_fun, body, (lower, upper, init_val))
    return val


def _bounds_dtype(where, lower, upper):
    """The loop counter's dtype: the bounds' common dtype (a Python number, weakly typed,
    takes the other's), checked to be a real scalar's, as JAX's ``fori_loop``."""
    avals = []
    for name, b in (("lower", lower), ("upper", upper)):
        aval = aval_of(b) if is_value(b) else None
        if aval is None or aval.shape != () or kind_of(aval.dtype) not in "iuf":
            got = describe(aval) if aval is not None else type(b).__name__
            raise ControlFlowError(f"{where}: {name} must be a real scalar (an integer, or a float as JAX "
                                   f"accepts), got {got}")
        avals.append(aval)
    (lo, hi) = avals
    if lo.dtype == hi.dtype or hi.weak_type:
        return lo.dtype
    if lo.weak_type:
        return hi.dtype
    raise ControlFlowError(f"{where}: lower and upper arguments to fori_loop must have equal types, got "
                           f"{lo.dtype.name} and {hi.dtype.name}")


def _static_bounds(lower, upper):
    """``(int(lower), int(upper))`` when both bounds have values now (JAX's
    ``core.is_concrete``: numbers, arrays, and values under ``grad``/``jvp``), else None."""
    values = []
    for b in (lower, upper):
        while isinstance(b, PrimalTracer):  # a derivative's tracer carries its value
            b = b.primal
        if isinstance(b, Tracer):  # staged or batched: no value now
            return None
        values.append(int(b))
    return tuple(values)


def map(f, xs, *, batch_size=None, memory_budget=None):  # noqa: A001 - JAX's name
    """``stack([f(x) for x in xs])`` over the leading axis of the pytree ``xs`` (JAX's
    ``lax.map``).

    Without ``batch_size`` it is a :func:`scan`: one example at a time, so memory stays
    that of one call of ``f``. With ``batch_size=k`` (as in JAX) it is ``vmap(f)`` over
    chunks of ``k`` examples plus one chunk of the remainder (``batch_size=0``: one chunk of
    all, ``vmap(f)(xs)``, as in JAX); ``batch_size="auto"`` (or a
    ``memory_budget``: an int of bytes, or a float fraction of the memory free on ``xs``'s
    device) takes the largest chunk whose staged program plans its peak within the budget
    (:mod:`cuvmap.memory_budget`). Eagerly each chunk runs its staged program; under a
    transform the chunks are a scan (and one call for the remainder)::

        lax.map(lambda x: jnp_fn(x), xs, batch_size=64)
        lax.map(per_example_grad, (xs, ys), memory_budget=2 << 30)
    """
    if not callable(f):
        raise ControlFlowError(f"map: f must be callable, got {f!r}")
    if api_util.is_int(batch_size) and batch_size == 0:  # JAX: batch_size=0 is one full batch (a vmap)
        shapes = [np.shape(x) for x in tree.leaves(xs)]
        batch_size = max(shapes[0][0], 1) if shapes and shapes[0] else batch_size
    if batch_size is None and memory_budget is None:
        def step(carry, x):
            return carry, f(x)

        step.__name__ = api_util.fun_name(f)
        _, ys = scan(step, (), xs)
        return ys
    return _map_in_chunks(f, xs, batch_size, memory_budget)


# f -> its ChunkedMap: the chunk choice per signature; the programs are staged on every
# call, as a scan's body is (f may read values that change between calls)
_map_chunked = weakref.WeakKeyDictionary()


def _map_in_chunks(f, xs, batch_size, memory_budget):
    """``map`` with a batch size or a budget (NOTE [choosing a chunk] in
    cuvmap/lax/control_flow/chunked.py): ``vmap(f)`` over each chunk."""
    where = f"map({api_util.fun_name(f)})"
    spec = check_chunk_spec(batch_size, memory_budget, where)
    paths, leaves, treedef = flatten_values("xs", xs, where)
    if not leaves:
        raise ControlFlowError(f"{where}: xs has no arrays to map over")
    sizes = {tuple(getattr(x, "shape", ()))[:1] for x in leaves}
    if len(sizes) != 1 or sizes == {()}:
        shapes = ", ".join(f"{tree.keystr(p) or 'xs'}: {tuple(getattr(x, 'shape', ()))}" for p, x in zip(paths, leaves))
        raise ControlFlowError(f"{where}: the leaves of xs must share their leading axis (the examples), got {shapes}")
    size = sizes.pop()[0]
    try:
        chunked = _map_chunked.get(f)
        if chunked is None:
            chunked = _map_chunked.setdefault(f, ChunkedMap(where, vmap_combine(0), cache_programs=False))
    except TypeError:  # f cannot be weakly referenced: a map of its own
        chunked = ChunkedMap(where, vmap_combine(0), cache_programs=False)
    vmap_where = f"vmap({api_util.fun_name(f)})"
    axes = [0] * len(leaves)

    @api_util.with_context(vmap_where, f)
    def mapped(b, chunk_leaves):  # vmap(f) of a chunk of b examples (as cuvmap.vmap(f) runs it)
        call_leaves, call_tree = tree.flatten(((tree.unflatten(treedef, chunk_leaves),), {}))
        return batching.vmap_flat(f, vmap_where, call_leaves, call_tree, [0] * len(call_leaves), b, 0)

    def body(b, chunk_leaves):
        return tree.flatten(mapped(b, chunk_leaves))

    outs, out_tree = chunked(body, leaves, axes, size, spec, memory_budget, key=treedef)
    return tree.unflatten(out_tree, api_util.unaliased([api_util.to_array_result(o) for o in outs], leaves))
