"""The driver of ghost clipping: :func:`clipped_grad` stages the per-example loss, runs
the batched forward and backward pass once with the taps of
:mod:`~cuvmap.dp.ghost.analysis`, and sums the clipped gradients with the rules of
:mod:`~cuvmap.dp.ghost.rules` (NOTE [ghost clipping] in :mod:`cuvmap.dp.ghost`)."""
import threading

from cuvmap import api, api_util, core, lax, tree
from cuvmap import numpy as cnp
from cuvmap.api_util import TransformError
from cuvmap.dp import clipping
from cuvmap.dp.ghost import analysis, choice
from cuvmap.dp.ghost.rules import per_row
from cuvmap.transforms import ir

def clipped_grad(loss, max_norm, *, method="auto", argnums=0, has_aux=False, tiny=1e-6):
    """The sum of clipped per-example gradients of ``loss`` and the per-example gradient
    norms, by ghost clipping and book-keeping (NOTE [ghost clipping]).

    ``clipped_grad(loss, C)(params, *batch, mask=m)`` returns ``ClippedGradient(summed,
    norms)`` with ``summed = Σ_b m_b · min(1, C / (‖g_b‖ + tiny)) · g_b`` (a pytree like
    ``params``) and ``norms[b] = ‖g_b‖``, ``g_b = grad(loss)(params, *example_b)``: the
    values of ``dp.clipped_sum(vmap(grad(loss))(params, *batch), C, mask=m,
    return_norms=True)``, without materialising the per-example gradients of dense,
    convolution and embedding weights where their norms have a cheaper form.

    Args:
      loss: the loss of ONE example, ``loss(params, *example) -> scalar`` (or ``(scalar,
        aux)`` with ``has_aux``), written exactly as for ``vmap(grad(loss))``.
      max_norm: the clipping bound ``C > 0``.
      method: ``"auto"`` (each layer's cost model, timed where close), ``"ghost"`` (ghost
        norms wherever a layer allows them) or ``"per_example"`` (every layer's explicit
        per-example gradient, from the same single backward pass).
      argnums: the argument(s) differentiated; every other positional argument is batched
        along axis 0 (a pytree of arrays with a common leading size ``B``, which may be 0).
      has_aux: ``loss`` returns ``(value, aux)``; the per-example aux comes back batched.
      tiny: added to the norms in the clip factor, as in :func:`cuvmap.dp.clipped_sum`.

    Returns:
      a function ``(params, *batch, mask=None)`` returning a
      :class:`~cuvmap.dp.ClippedGradient` ``(summed, norms)``, or ``(ClippedGradient,
      aux)`` with ``has_aux``. ``mask``: ``(B,)`` weights (1 real, 0 padding; bool or
      float), as :func:`cuvmap.dp.pad_batch` returns. It works eagerly and under ``jit``, on
      NumPy and CuPy arrays; :func:`cuvmap.dp.private_gradient` takes its result. Its
      ``methods(params, *batch)`` says how each parameter leaf is differentiated.

    As under ``jit``, ``loss`` is traced (on one example's shapes) once per argument
    structure and per-example shapes, whatever the batch size: Python side effects in it run
    then, and arrays it closes over are read then (pass arrays that change as arguments).

    Example::

        clipped = dp.clipped_grad(loss, 1.0)
        summed, norms = clipped(params, xs, ys, mask=mask)
        g = dp.private_gradient(clipped(params, xs, ys), 1.0, 1.1, noise=z, expected_batch_size=256)
    """
    api_util.check_callable(loss, "clipped_grad")
    name = api_util.fun_name(loss)
    where = f"clipped_grad({name})"
    if not max_norm > 0:
        raise TransformError(f"{where}: max_norm must be positive, got {max_norm!r}")
    if method not in choice.METHODS:
        raise TransformError(f"{where}: method must be one of {', '.join(map(repr, choice.METHODS))}, got {method!r}")

    # per-example programs by argument structure and per-example avals, and their lock
    cache = ({}, threading.Lock())

    @api_util.with_context(where, loss)
    def clipped(*args, mask=None):
        return _clipped(loss, where, args, mask, float(max_norm), method, argnums, has_aux, tiny, cache)

    @api_util.with_context(where, loss)
    def methods(*args):
        """How each parameter leaf of ``args`` would be differentiated, a pytree like the
        parameters: ``"ghost"``, ``"per_example"``, ``"per_example, k uses"`` (a parameter
        used k times), ``"vmap"`` (used some other way) or ``"unused"`` (NOTE [ghost
        clipping])."""
        return _Staged(loss, where, args, method, argnums, has_aux, cache).methods()

    clipped.methods = methods
    return clipped


class _Program:
    """The per-example program of a loss for one argument structure and per-example avals,
    and how each parameter leaf is used in it: what does not depend on the batch size, so
    one serves every batch (:data:`_PROGRAMS_KEPT` of them are kept per function)."""

    def __init__(self, program, params, taps, fallback, out_tree):
        self.program, self.params, self.taps, self.fallback, self.out_tree = program, params, taps, fallback, out_tree


#: per-example programs a clipped_grad function keeps (argument structures and shapes met)
_PROGRAMS_KEPT = 8


class _Staged:
    """A call: its parameter and batch leaves, the per-example program (traced, or found in
    ``cache``, a pair of a dict and its lock), and the method of each parameter with one use for this batch size."""

    def __init__(self, loss, where, args, method, argnums, has_aux, cache):
        self.single, nums = api_util.normalize_argnums(loss, argnums, len(args))
        api_util.check_float_inputs(loss, args, nums, "clipped_grad")
        batch_nums = [i for i in range(len(args)) if i not in nums]
        if not batch_nums:
            raise TransformError(f"{api_util.fun_name(loss)} was called with no batch argument: every positional "
                                 "argument not in argnums is a batch of examples along axis 0")
        param_paths, self.param_leaves, self.param_tree = tree.flatten_with_path(tuple(args[i] for i in nums))
        param_paths = [(0, nums[p[0]]) + tuple(p[1:]) for p in param_paths]
        batch_paths, self.batch_leaves, batch_tree = tree.flatten_with_path(tuple(args[i] for i in batch_nums))
        batch_paths = [(0, batch_nums[p[0]]) + tuple(p[1:]) for p in batch_paths]
        _, self.size = api_util.check_mapped_sizes(loss, batch_paths, self.batch_leaves,
                                                   [0] * len(self.batch_leaves), None)
        # the per-example program: the parameters, then one example of the batch
        avals = [api_util.leaf_aval(loss, p, x, where) for p, x in zip(param_paths, self.param_leaves)]
        for p, x in zip(batch_paths, self.batch_leaves):
            a = api_util.leaf_aval(loss, p, x, where)
            avals.append(core.ShapedArray(a.shape[1:], a.dtype, False, a.device))
        key = (tree.structure(args), tuple(avals))
        programs, lock = cache
        with lock:
            program = programs.get(key)
        if program is None:
            program = _trace(loss, where, args, nums, batch_nums, self.param_tree, batch_tree,
                             param_paths + batch_paths, avals, has_aux)
            if not any(isinstance(c, core.Tracer) for c in program.program.consts):
                # (a program holding tracers of this call's transforms is for this call only)
                with lock:
                    while len(programs) >= _PROGRAMS_KEPT:
                        programs.pop(next(iter(programs)))
                    programs[key] = program
        self.program, self.params, self.taps = program.program, program.params, program.taps
        self.fallback, self.out_tree = program.fallback, program.out_tree
        device = avals[0].device if avals else None
        self.method = [choice.choose(plan.uses[0][0], method, self.size, device)
                       if not plan.fallback and len(plan.uses) == 1 else None for plan in self.params]

    def methods(self):
        """How each parameter leaf is differentiated, a pytree like the parameters."""
        names = []
        for plan, method in zip(self.params, self.method):
            if plan.fallback:
                names.append("vmap")
            elif not plan.uses:
                names.append("unused")
            elif len(plan.uses) == 1:
                names.append(method)
            else:
                names.append(f"per_example, {len(plan.uses)} uses")
        out = tree.unflatten(self.param_tree, names)
        return out[0] if self.single else out


def _trace(loss, where, args, nums, batch_nums, param_tree, batch_tree, paths, avals, has_aux):
    """Stages the per-example loss on ``avals`` (the parameter leaves, then one example's
    batch leaves) and reads each parameter's uses: a :class:`_Program`."""
    num_params = param_tree.num_leaves

    def rebuild(traced):
        full = list(args)
        for i, v in zip(nums, tree.unflatten(param_tree, list(traced[:num_params]))):
            full[i] = v
        for i, v in zip(batch_nums, tree.unflatten(batch_tree, list(traced[num_params:]))):
            full[i] = v
        return full, {}

    def per_example(*full):
        value, aux = api_util.split_aux(loss, loss(*full), has_aux)
        leaves = tree.leaves(value)
        if len(leaves) != 1 or leaves[0] is not value or core.shape_of(value) != () or not core.is_float(value):
            raise TransformError(f"{api_util.fun_name(loss)} must return a float scalar per example (the loss "
                                 f"of one example), got {tree.describe(value)}")
        return value, aux

    per_example.__name__ = api_util.fun_name(loss)
    closed, out_tree = api_util.trace_program(per_example, where, None, paths, avals, rebuild)
    program = ir.optimize(closed)
    consumers = analysis.consumers_of(program.jaxpr)
    params = analysis.analyse(program.jaxpr, num_params, consumers)
    taps = analysis.taps_of(program.jaxpr, params, consumers, num_params, batch_tree.num_leaves)
    fallback = [i for i, plan in enumerate(params) if plan.fallback]
    return _Program(program, params, taps, fallback, out_tree)


def _clipped(loss, where, args, mask, max_norm, method, argnums, has_aux, tiny, cache):
    staged = _Staged(loss, where, args, method, argnums, has_aux, cache)
    size = staged.size
    if mask is not None and tuple(core.shape_of(mask)) != (size,):
        raise TransformError(f"mask has shape {tuple(core.shape_of(mask))}, but the batch has {size} examples "
                             f"(the mask needs shape ({size},))")
    outs, kept, cts, fallback_grads = _forward_backward(staged)
    summed, norms = _clip_and_sum(staged, outs[0], kept, cts, fallback_grads, mask, max_norm, tiny)
    del kept, cts, fallback_grads
    summed = tree.unflatten(staged.param_tree, [api_util.to_array_result(s) for s in summed])
    result = clipping.ClippedGradient(summed[0] if staged.single else summed, api_util.to_array_result(norms))
    if not has_aux:
        return result
    return result, tree.unflatten(staged.out_tree, outs)[1]


class _TapValues:
    """The batched operands and output cotangent of each tap, released (set free for the
    allocator) as soon as the last layer that reads them is done."""

    def __init__(self, staged, kept, cts):
        self.values, self.cts, self.readers = {}, {}, {}
        for t, (k, tap) in enumerate(staged.taps.items()):
            own = iter(kept[t])
            self.values[k] = {}
            for i in tap.operands:
                if i in tap.from_batch:
                    j, shape = tap.from_batch[i]
                    self.values[k][i] = lax.reshape(staged.batch_leaves[j], (staged.size,) + shape)
                else:
                    self.values[k][i] = next(own)
            kept[t] = None
            self.cts[k] = cts[staged.taps[tap.ct_from].z]
            self.readers[k] = len(tap.layers)
        cts[:] = [None] * len(cts)

    def inputs(self, layer):
        k = layer.eqn_index
        return [self.values[k][i] for i in layer.needs], self.cts[k]

    def done(self, layer):
        k = layer.eqn_index
        self.readers[k] -= 1
        if not self.readers[k]:
            del self.values[k], self.cts[k]


def _clip_and_sum(staged, losses, kept, cts, fallback_grads, mask, max_norm, tiny):
    """The per-example norms over every parameter, then each parameter's clipped sum. The
    lists ``kept``, ``cts`` and ``fallback_grads`` are emptied, so that each array is freed
    when its last use is done."""
    taps = _TapValues(staged, kept, cts)
    size, param_leaves = staged.size, staged.param_leaves
    squares = []
    ghost, explicit = [], []   # (param, layer, chain) and [param, per-example grads, chain]
    for i, plan in enumerate(staged.params):
        if plan.fallback:
            j = staged.fallback.index(i)
            explicit.append([i, fallback_grads[j], ()])
            fallback_grads[j] = None
        elif len(plan.uses) == 1 and staged.method[i] == "ghost":
            layer, chain = plan.uses[0]
            squares.append(layer.ghost_sq_norms(*taps.inputs(layer)))
            ghost.append((i, layer, chain))
        elif len(plan.uses) == 1:
            layer, chain = plan.uses[0]
            explicit.append([i, layer.per_example_grads(*taps.inputs(layer)), chain])
            taps.done(layer)
        elif plan.uses:
            # several uses: the sum of the uses' gradients (cross terms included), in W's layout
            total = None
            for layer, chain in plan.uses:
                g_use = analysis.pull_back(chain, layer.per_example_grads(*taps.inputs(layer)), batched=True)
                taps.done(layer)
                total = g_use if total is None else cnp.add(total, g_use)
            explicit.append([i, total, ()])
    for _, grads, _ in explicit:
        squares.append(clipping.squared_norms([grads], size))
    if squares:
        total = squares[0]
        for s in squares[1:]:
            total = cnp.add(total, s)
        norms = cnp.sqrt(cnp.maximum(total, 0))
    else:  # no parameter reaches the loss
        norms = cnp.zeros_like(losses)
    scale = clipping.clip_scale(norms, max_norm, tiny, mask)
    summed = [None] * len(param_leaves)
    # the explicit sums first: a bias's per-example gradients may be its tap's cotangents,
    # which the ghost layer's sum then releases
    for entry in explicit:
        i, grads, chain = entry
        entry[1] = None
        summed[i] = analysis.pull_back(chain, cnp.tensordot(cnp.astype(scale, core.dtype_of(grads)), grads, axes=1),
                               batched=False)
        del grads
    for i, layer, chain in ghost:
        acts, g = taps.inputs(layer)
        weighted = layer.weighted_sum(acts, cnp.multiply(g, per_row(scale, g)))
        del acts, g
        taps.done(layer)
        summed[i] = analysis.pull_back(chain, weighted, batched=False)
    for i, leaf in enumerate(param_leaves):
        if summed[i] is None:
            summed[i] = cnp.zeros_like(leaf)
        elif core.dtype_of(summed[i]) != core.dtype_of(leaf):
            summed[i] = cnp.astype(summed[i], core.dtype_of(leaf))
    return summed, norms


def _forward_backward(staged):
    """One batched forward pass and one backward pass. Returns ``(outputs, kept, cts,
    fallback_grads)``: the per-example outputs (losses, aux leaves), the taps' kept operands
    and the cotangents of the z's (a leading batch dim each), and the per-example gradients
    of the fallback parameters."""
    jaxpr, consts = staged.program.jaxpr, staged.program.consts
    param_leaves, batch_leaves, size, taps = staged.param_leaves, staged.batch_leaves, staged.size, staged.taps
    fallback = staged.fallback

    def per_example(fallback_vals, zs, batch):
        params = list(param_leaves)
        for i, v in zip(fallback, fallback_vals):
            params[i] = v
        kept = {}

        def tap(k, eqn, ins, out):
            # each tap keeps its operands (but those read from the batch) and gets its z
            t = taps.get(k)
            if t is None:
                return out
            kept[k] = [ins[i] for i in t.operands if i not in t.from_batch]
            return out if t.z is None else cnp.add(out, zs[t.z])

        outs = ir.eval_jaxpr(jaxpr, consts, params + list(batch), hook=tap if taps else None)
        return outs[0], (outs[1:], [kept[k] for k in taps])

    batched = api.vmap(per_example)
    if not taps and not fallback:
        losses, (aux, kept) = batched([], [], batch_leaves)
        return [losses] + list(aux), kept, [], []
    # zeros on the batch's device, broadcast (no memory): the points the cotangents are taken at
    z_avals = [jaxpr.eqns[k].outs[0].aval for k, tap in taps.items() if tap.z is not None]
    zs = [cnp.broadcast_to(cnp.zeros((), a.dtype, like=batch_leaves[0]), (size,) + a.shape) for a in z_avals]
    copies = [cnp.broadcast_to(param_leaves[i], (size,) + tuple(core.shape_of(param_leaves[i]))) for i in fallback]

    def pass_(fallback_vals, zs_):
        losses, (aux, kept) = batched(fallback_vals, zs_, batch_leaves)
        return losses, (aux, kept)

    losses, pullback, (aux, kept) = api.vjp(pass_, copies, zs, has_aux=True)
    fallback_grads, cts = pullback(core.full_like_concrete(losses, 1))
    return [losses] + list(aux), list(kept), list(cts), list(fallback_grads)
