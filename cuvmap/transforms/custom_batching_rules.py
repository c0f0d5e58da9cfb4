"""The batched versions of a custom-derivative function and its rules (NOTE [batching a
custom rule]): under ``vmap`` a ``custom_jvp_call`` or ``custom_vjp_call`` binds again one
level down with ``vmap`` of its function and of each rule, made here
(:mod:`cuvmap.transforms.custom_derivatives` holds the call primitives and the user's
view). Zero tangents and cotangents (``None``) pass through as they are.
"""
from cuvmap import tree
from cuvmap.transforms.batching import BatchTracer, bdim_at_front, move_bdim, new_batch_main


# NOTE [batching a custom rule]
# Under vmap a custom call goes one level down with ``vmap`` of the function and of each
# rule, so the level below, whatever it is, picks the one it needs (the eval interpreter
# ``vmap(f)``, reverse mode ``vmap(fwd)`` and ``vmap(bwd)``, staging all of them in one
# equation). Each batched version pushes a batch trace of its own when it runs, rather
# than reusing the caller's: a staged program may call it long after that trace returned
# (``grad`` of a program derived from ``vmap(jit(f))``). Whichever runs, the outputs
# (and the output tangents) come back with their batch dim at 0 — unbatched ones are
# broadcast — so the caller knows the layout without knowing which one ran. Tangents have
# their primals' layout; residuals travel with their batch dims, as data that only
# ``vmap(bwd)`` reads; ``vmap(bwd)`` returns each cotangent in its operand's layout, summed
# over the batch for an unbatched operand (every example used it).
def _wrap(main, vals, dims):
    return [v if d is None or v is None else BatchTracer(main, v, d) for v, d in zip(vals, dims)]


def _out_at_front(x, main, size):
    """The physical value of an output of a batched function, batch dim at 0 (``None``,
    a zero tangent, stays ``None``)."""
    if x is None:
        return None
    if main.owns(x):
        return move_bdim(x.val, x.bdim, 0)
    return bdim_at_front(x, None, size)


def _ct_in_layout(ct, main, size, dim):
    """A cotangent from ``vmap(bwd)`` in its operand's physical layout (batch dim ``dim``,
    or summed over the batch for an unbatched operand)."""
    from cuvmap.lax import reduction  # a rule's primitive: lax imports the transforms

    if ct is None:
        return None
    if main.owns(ct):
        if dim is None:
            return reduction.reduce_sum(ct.val, (ct.bdim,))
        return move_bdim(ct.val, ct.bdim, dim)
    if dim is None:
        return ct
    return move_bdim(bdim_at_front(ct, None, size), 0, dim)


def batch_fun(fun, axis, dims, name):
    """``vmap(fun)`` over operands with batch dims ``dims``; outputs batched at 0."""
    size = axis.size

    def batched(*vals):
        with new_batch_main(axis, name) as main:
            outs = fun(*_wrap(main, vals, dims))
        return [_out_at_front(o, main, size) for o in outs]

    batched.__name__ = f"vmap({fun.__name__})"
    return batched


def batch_jvp(jvp, axis, dims, name):
    """``vmap`` of a flat JVP rule; tangents have their primals' batch dims."""
    size = axis.size

    def batched(primals, tangents):
        with new_batch_main(axis, name) as main:
            out_p, out_t = jvp(_wrap(main, primals, dims), _wrap(main, tangents, dims))
        return [_out_at_front(o, main, size) for o in out_p], [_out_at_front(t, main, size) for t in out_t]

    batched.__name__ = f"vmap({jvp.__name__})"
    return batched


class _BatchedResiduals:
    """The residuals of ``vmap(fwd)``: their physical leaves with the batch dims."""

    __slots__ = ("vals", "dims", "treedef")

    def __init__(self, vals, dims, treedef):
        self.vals = vals
        self.dims = dims
        self.treedef = treedef


# a pytree node, so that the residuals of ``vmap(vmap(fwd))`` (the inner ones inside the
# outer ones) flatten to arrays whose batch dims the outer vmap unwraps
tree.register_pytree_node(_BatchedResiduals, lambda r: (list(r.vals), (tuple(r.dims), r.treedef)),
                          lambda aux, vals: _BatchedResiduals(list(vals), list(aux[0]), aux[1]))


def batch_fwd(fwd, axis, dims, name):
    """``vmap`` of a flat ``fwd``: outputs batched at 0, residuals with their batch dims."""
    size = axis.size

    def batched(*vals, perturbed=None):
        with new_batch_main(axis, name) as main:
            outs, residuals = fwd(*_wrap(main, vals, dims), perturbed=perturbed)
        leaves, treedef = tree.flatten(residuals)
        res_vals, res_dims = main.trace.unwrap(leaves)
        return [_out_at_front(o, main, size) for o in outs], _BatchedResiduals(res_vals, res_dims, treedef)

    batched.__name__ = f"vmap({fwd.__name__})"
    batched.optimize_remat = getattr(fwd, "optimize_remat", False)
    return batched


def batch_bwd(bwd, axis, dims, name):
    """``vmap`` of a flat ``bwd``: the output cotangents are batched at 0 (as the outputs
    are), the input cotangents come back in their operands' layouts."""
    size = axis.size

    def batched(residuals, cts):
        with new_batch_main(axis, name) as main:
            res = tree.unflatten(residuals.treedef, _wrap(main, residuals.vals, residuals.dims))
            in_cts = bwd(res, _wrap(main, cts, [0] * len(cts)))
        return [_ct_in_layout(c, main, size, d) for c, d in zip(in_cts, dims)]

    batched.__name__ = f"vmap({bwd.__name__})"
    return batched
