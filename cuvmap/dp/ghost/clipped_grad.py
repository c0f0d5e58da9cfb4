"""The driver of ghost clipping: :func:`clipped_grad` stages the per-example loss, runs
the batched forward and backward pass once with the taps of
:mod:`~cuvmap.dp.ghost.analysis`, and sums the clipped gradients with the rules of
:mod:`~cuvmap.dp.ghost.rules` (NOTE [ghost clipping] in :mod:`cuvmap.dp.ghost`)."""
import threading

from cuvmap import api, api_util, core, lax, tree
from cuvmap import memory_budget as memory_budget_mod
from cuvmap import numpy as cnp
from cuvmap.api_util import TransformError
from cuvmap.dp import clipping
from cuvmap.dp.ghost import analysis, choice
from cuvmap.dp.ghost.rules import per_row
from cuvmap.transforms import ir, staging

def clipped_grad(loss, max_norm, *, method="auto", argnums=0, in_axes=0, has_aux=False, tiny=1e-6,
                 nan_safe=False, relation="add_remove", groups=None, chunk_size=None, memory_budget=None):
    """The sum of clipped per-example gradients of ``loss`` and the per-example gradient
    norms, by ghost clipping and book-keeping (NOTE [ghost clipping]).

    ``clipped_grad(loss, C)(params, *batch, mask=m)`` returns ``ClippedGradient(summed,
    norms)`` with ``summed = Σ_b m_b · min(1, C / (‖g_b‖ + tiny)) · g_b`` (a pytree like
    ``params``) and ``norms[b] = ‖g_b‖``, ``g_b = grad(loss)(params, *example_b)``: the
    values of ``dp.clipped_sum(vmap(grad(loss))(params, *batch), C, mask=m,
    return_norms=True)``, without materialising the per-example gradients of dense,
    convolution and embedding weights where their norms have a cheaper form. The ghost
    norms are computed from rows scaled to at most 1, so they overflow only where the
    per-example gradient's norm does (NOTE [ghost norms without overflow]).

    Args:
      loss: the loss of ONE example, ``loss(params, *example) -> scalar`` (or ``(scalar,
        aux)`` with ``has_aux``), written exactly as for ``vmap(grad(loss))``.
      max_norm: the clipping bound ``C > 0``, a number.
      method: ``"auto"`` (each layer's cost model, timed where close), ``"ghost"`` (ghost
        norms wherever a layer allows them) or ``"per_example"`` (every layer's explicit
        per-example gradient, from the same single backward pass).
      argnums: the argument(s) differentiated.
      in_axes: for the other positional arguments, where their examples are, as ``vmap``'s
        ``in_axes``: an int or None for all of them, or a tuple with one entry per
        positional argument (None at ``argnums``), each an int (the axis of the examples,
        size ``B`` for every batched leaf; ``B`` may be 0), None (one value that every
        example shares: a frozen weight, a Python number, neither batched nor
        differentiated) or a pytree prefix of them. The default 0: every argument not in
        ``argnums`` is a batch along axis 0.
      has_aux: ``loss`` returns ``(value, aux)``; the per-example aux comes back batched.
      tiny: added to the norms in the clip factor, as in :func:`cuvmap.dp.clipped_sum`.
      nan_safe: an example whose gradient is not finite (a NaN or an infinity anywhere, so
        a norm that is NaN or infinite) contributes zero to ``summed`` instead of making
        all of it NaN (as ``jax_privacy``'s ``nan_safe``); its sensitivity stays at most
        ``C``. Its norm is reported as computed, and ``result.num_dropped(mask)`` counts
        such examples. Off by default: a non-finite example then makes ``summed`` NaN, as
        in Opacus and ``torch.func`` + clipping.
      relation: the neighbouring relation the result's sensitivity is stated for:
        ``"add_remove"`` (``Δ = C``) or ``"replace"`` (``Δ = 2C``) (NOTE [sensitivity as
        data] in :mod:`cuvmap.dp.clipping`).
      groups: group-wise clipping (NOTE [clipping by group and by user]): None (one norm
        over every parameter), ``"param"`` (each leaf), ``"layer"`` (the leaves under one
        parent node) or a pytree prefix of the parameters with a group label at each leaf
        (block-wise); ``max_norm`` is then a number (``C / √K`` per group) or a dict
        ``{label: C_k}``.
      chunk_size: the examples processed at a time (jax_privacy's ``microbatch_size``,
        Opacus's ``max_physical_batch_size``): the sums of the chunks are added and their
        norms joined, so the result is that of the whole batch; ``"auto"``: the largest
        chunk whose planned memory fits ``memory_budget``. Each chunk runs the staged
        program of its size (:mod:`cuvmap.memory_budget`). Not with ``groups`` or
        ``users`` (a user's examples must be clipped together).
      memory_budget: what a call may allocate, its results included: an int of bytes, or a
        float in (0, 1], that fraction of the memory free on the batch's device (with
        ``chunk_size="auto"`` and no budget: half of it); implies ``chunk_size="auto"``.

    Returns:
      a function ``(params, *batch, mask=None, users=None)`` returning a
      :class:`~cuvmap.dp.ClippedGradient` ``(summed, norms)``, or ``(ClippedGradient,
      aux)`` with ``has_aux``. ``mask``: ``(B,)`` weights (1 real, 0 padding; bool or
      float), as :func:`cuvmap.dp.pad_batch` returns. ``users``: ``(B,)`` integer user
      slots in ``[0, B)`` (as :func:`cuvmap.dp.sample_users` gives them): each user's summed
      gradient is clipped, the norms are per user slot and the sensitivity is per user
      (NOTE [user norms from factored gradients] in :mod:`cuvmap.dp.ghost`). It works eagerly and under ``jit``, on
      NumPy and CuPy arrays; :func:`cuvmap.dp.private_gradient` takes its result. Its
      ``methods(params, *batch)`` says how each parameter leaf is differentiated.

    As under ``jit``, ``loss`` is traced (on one example's shapes) once per argument
    structure and per-example shapes, whatever the batch size: Python side effects in it run
    then, and arrays it closes over are read then (pass arrays that change as arguments).

    Example::

        clipped = dp.clipped_grad(loss, 1.0)
        summed, norms = clipped(params, xs, ys, mask=mask)
        g = dp.private_gradient(clipped(params, xs, ys), 1.0, 1.1, noise=z, expected_batch_size=256)
        dp.clipped_grad(loss, 1.0, in_axes=(None, 0, None))(params, xs, 3)   # one label for all
    """
    api_util.check_callable(loss, "clipped_grad")
    name = api_util.fun_name(loss)
    where = f"clipped_grad({name})"
    if groups is None or not isinstance(max_norm, dict):
        clipping.check_max_norm(max_norm, where, TransformError, hint=(
            f"; clipped_grad({name}, C) takes the bound, and the function it returns takes the parameters and the "
            f"batch: clipped_grad({name}, 1.0)(params, xs, ys)"))
    relation = clipping.check_relation(relation, where)
    if method not in choice.METHODS:
        raise TransformError(f"{where}: method must be one of {', '.join(map(repr, choice.METHODS))}, got {method!r}")
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    api_util.check_axes_spec(in_axes, f"{where}: in_axes")
    settings = _Settings(loss, where, method, argnums, in_axes, has_aux)
    chunks = memory_budget_mod.check_chunk_spec(chunk_size, memory_budget, where)
    chunked = memory_budget_mod.ChunkedMap(where, _chunk_combine) if chunks is not None else None

    @api_util.with_context(where, loss)
    def clipped(*args, mask=None, users=None):
        if chunked is not None:
            if users is not None or groups is not None:
                raise TransformError(f"{where}: chunk_size/memory_budget do not combine with users= or groups= "
                                     "(a user's examples, and a group's bound, are clipped over the whole batch)")
            return _clipped_in_chunks(settings, chunked, chunks, memory_budget, args, mask, max_norm, tiny,
                                      bool(nan_safe), relation)
        return _clipped(settings, args, mask, users, max_norm, groups, tiny, bool(nan_safe), relation)

    @api_util.with_context(where, loss)
    def methods(*args, users=None):
        """How each parameter leaf of ``args`` would be differentiated (with ``users``: for
        user-level clipping), a pytree like the parameters: ``"ghost"``, ``"per_example"``,
        ``"per_example, k uses"`` (a parameter used k times), ``"vmap"`` (used some other
        way) or ``"unused"`` (NOTE [ghost clipping])."""
        return _Staged(settings, args, users is not None).methods()

    clipped.methods = methods
    if chunked is not None:
        @api_util.with_context(where, loss)
        def memory_plan(*args, mask=None):
            """The :class:`~cuvmap.memory_budget.ChunkPlan` a call with these arguments
            follows (nothing runs)."""
            return _clipped_in_chunks(settings, chunked, chunks, memory_budget, args, mask, max_norm, tiny,
                                      bool(nan_safe), relation, plan_only=True)

        clipped.memory_plan = memory_plan
    return clipped


class _Settings:
    """What a clipped_grad function was made with, and its per-example programs by argument
    structure and per-example avals (:data:`_PROGRAMS_KEPT` of them), under their lock."""

    def __init__(self, loss, where, method, argnums, in_axes, has_aux):
        self.loss, self.where, self.method, self.argnums, self.in_axes = loss, where, method, argnums, in_axes
        self.has_aux = has_aux
        self.programs, self.lock = {}, threading.Lock()


class _Program:
    """The per-example program of a loss for one argument structure and per-example avals,
    and how each parameter leaf is used in it: what does not depend on the batch size, so
    one serves every batch."""

    def __init__(self, program, params, taps, fallback, out_tree):
        self.program, self.params, self.taps, self.fallback, self.out_tree = program, params, taps, fallback, out_tree


#: per-example programs a clipped_grad function keeps (argument structures and shapes met)
_PROGRAMS_KEPT = 8


def _in_axes_for(settings, args, nums):
    """One in_axes entry per positional argument: None at ``argnums`` (a tuple's entry there
    must be None), the user's elsewhere."""
    loss, in_axes = settings.loss, settings.in_axes
    if not isinstance(in_axes, tuple):
        return tuple(None if i in nums else in_axes for i in range(len(args)))
    if len(in_axes) != len(args):
        raise TransformError(f"in_axes has {len(in_axes)} entries but {api_util.fun_name(loss)} was called with "
                             f"{len(args)} positional arguments; give one entry per positional argument")
    for i in nums:
        if any(a is not None for a in tree.leaves(in_axes[i], is_leaf=lambda x: x is None)):
            raise TransformError(f"{api_util.describe_arg(loss, (0, i))} is differentiated (argnums), so its in_axes "
                                 f"entry must be None, got {in_axes[i]!r}: clipped_grad batches the other arguments")
    return in_axes


def _suggested_in_axes(args, nums, scalar_arg):
    entries = ["None" if i in nums or i == scalar_arg else "0" for i in range(len(args))]
    return f"in_axes=({', '.join(entries)}{',' if len(entries) == 1 else ''})"


class _Staged:
    """A call: its parameter leaves, batched leaves (the examples along axis 0) and shared
    leaves (in_axes None), the per-example program (traced, or found in the settings'
    cache), and the method of each parameter with one use for this batch size."""

    def __init__(self, settings, args, by_user=False):
        loss, where = settings.loss, settings.where
        self.single, nums = api_util.normalize_argnums(loss, settings.argnums, len(args))
        api_util.check_float_inputs(loss, args, nums, "clipped_grad")
        others = [i for i in range(len(args)) if i not in nums]
        param_paths, self.param_leaves, self.param_tree = tree.flatten_with_path(tuple(args[i] for i in nums))
        param_paths = [(0, nums[p[0]]) + tuple(p[1:]) for p in param_paths]
        # the other arguments' leaves, in the order of a flattening of (args, {}), and their axes
        axes = api_util.flat_in_axes(loss, _in_axes_for(settings, args, nums), args, {})
        paths, leaves, _ = tree.flatten_with_path((args, {}))
        other = [(tuple(p), x, a) for p, x, a in zip(paths, leaves, axes) if p[0] == 0 and p[1] not in nums]
        batched = [k for k, (_, _, a) in enumerate(other) if a is not None]
        if not others or not batched:
            raise TransformError(f"{api_util.fun_name(loss)} was called with no batch argument: the positional "
                                 "arguments not in argnums hold the examples (in_axes says along which axis; "
                                 "an argument with in_axes None is shared by every example)")
        for k in batched:
            path, x, a = other[k]
            if not (isinstance(x, core.Tracer) or hasattr(x, "shape")):
                raise TransformError(
                    f"{api_util.describe_arg(loss, path)} is a {type(x).__name__}, which has no axis {a} to take the "
                    f"examples from: pass an array with one entry per example or, if every example shares the "
                    f"value, give it in_axes None ({_suggested_in_axes(args, nums, path[1])})")
        bpaths = [other[k][0] for k in batched]
        baxes, self.size = api_util.check_mapped_sizes(loss, bpaths, [other[k][1] for k in batched],
                                                       [other[k][2] for k in batched], None)
        self.batch_leaves = [x if a == 0 else cnp.moveaxis(x, a, 0) for x, a in
                             zip((other[k][1] for k in batched), baxes)]
        shared = [k for k in range(len(other)) if other[k][2] is None]
        self.shared_leaves = [other[k][1] for k in shared]
        # the per-example program: the parameters, one example of the batch, the shared leaves
        avals = [api_util.leaf_aval(loss, p, x, where) for p, x in zip(param_paths, self.param_leaves)]
        for p, x in zip(bpaths, self.batch_leaves):
            a = api_util.leaf_aval(loss, p, x, where)
            avals.append(core.ShapedArray(a.shape[1:], a.dtype, False, a.device))
        avals += [api_util.leaf_aval(loss, other[k][0], other[k][1], where) for k in shared]
        key = (tree.structure(args), tuple(avals), tuple(batched))
        with settings.lock:
            program = settings.programs.get(key)
        if program is None:
            program = _trace(settings, args, nums, others, self.param_tree, batched + shared, len(batched),
                             param_paths + bpaths + [other[k][0] for k in shared], avals)
            if not any(isinstance(c, core.Tracer) for c in program.program.consts):
                # (a program holding tracers of this call's transforms is for this call only)
                with settings.lock:
                    while len(settings.programs) >= _PROGRAMS_KEPT:
                        settings.programs.pop(next(iter(settings.programs)))
                    settings.programs[key] = program
        self.program, self.params, self.taps = program.program, program.params, program.taps
        self.fallback, self.out_tree = program.fallback, program.out_tree
        device = avals[0].device if avals else None
        # user-level clipping: NOTE [user norms from factored gradients]
        self.by_user = by_user
        self.method = [(choice.choose_for_users if by_user else choice.choose)(
            plan.uses[0][0], settings.method, self.size, device)
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


def _trace(settings, args, nums, others, param_tree, order, num_batched, paths, avals):
    """Stages the per-example loss on ``avals`` (the parameter leaves, then one example's
    ``num_batched`` batch leaves, then the shared leaves; ``order`` gives the index of each
    of the last two among the other arguments' leaves) and reads each parameter's uses: a
    :class:`_Program`."""
    loss, has_aux = settings.loss, settings.has_aux
    num_params = param_tree.num_leaves
    other_tree = tree.structure(tuple(args[i] for i in others))

    def rebuild(traced):
        full = list(args)
        for i, v in zip(nums, tree.unflatten(param_tree, list(traced[:num_params]))):
            full[i] = v
        values = [None] * len(order)
        for k, v in zip(order, traced[num_params:]):
            values[k] = v
        for i, v in zip(others, tree.unflatten(other_tree, values)):
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
    closed, out_tree = staging.trace_program(per_example, settings.where, None, paths, avals, rebuild)
    program = ir.optimize(closed)
    consumers = analysis.consumers_of(program.jaxpr)
    params = analysis.analyse(program.jaxpr, num_params, consumers)
    taps = analysis.taps_of(program.jaxpr, params, consumers, num_params, num_batched)
    fallback = [i for i, plan in enumerate(params) if plan.fallback]
    return _Program(program, params, taps, fallback, out_tree)


def _clipped(settings, args, mask, users, max_norm, groups, tiny, nan_safe, relation):
    staged = _Staged(settings, args, users is not None)
    size = staged.size
    if mask is not None and tuple(core.shape_of(mask)) != (size,):
        raise TransformError(f"mask has shape {tuple(core.shape_of(mask))}, but the batch has {size} examples "
                             f"(the mask needs shape ({size},))")
    if users is not None:
        users = clipping.check_users(users, size, settings.where)
    params = tree.unflatten(staged.param_tree, staged.param_leaves)
    grp = clipping.resolve_groups(params[0] if staged.single else params, groups, max_norm, settings.where)
    outs, kept, cts, fallback_grads = _forward_backward(staged)
    summed, norms, group_norms = _clip_and_sum(staged, outs[0], kept, cts, fallback_grads, mask, users, grp, tiny,
                                               nan_safe)
    del kept, cts, fallback_grads
    summed = tree.unflatten(staged.param_tree, [api_util.to_array_result(s) for s in summed])
    result = clipping.ClippedGradient(
        summed[0] if staged.single else summed, api_util.to_array_result(norms),
        None if group_norms is None else tuple(api_util.to_array_result(n) for n in group_norms),
        max_norm=grp.total, relation=relation, unit="example" if users is None else "user", groups=grp.spec)
    if not settings.has_aux:
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


def _clip_and_sum(staged, losses, kept, cts, fallback_grads, mask, users, grp, tiny, nan_safe):
    """The norms of the units (examples, or user slots with ``users``) per group of ``grp``,
    then each parameter's clipped sum (with ``nan_safe``, the units of non-finite norm zeroed
    in every operand of the sums). The lists ``kept``, ``cts`` and ``fallback_grads`` are
    emptied, so that each array is freed when its last use is done. Returns ``(summed,
    norms, group_norms)``."""
    taps = _TapValues(staged, kept, cts)
    size, param_leaves = staged.size, staged.param_leaves
    squares = [None] * len(param_leaves)
    ghost, explicit = [], []   # (param, layer, chain) and [param, per-example (or per-user) grads, chain]
    for i, plan in enumerate(staged.params):
        if plan.fallback:
            j = staged.fallback.index(i)
            explicit.append([i, fallback_grads[j], ()])
            fallback_grads[j] = None
        elif len(plan.uses) == 1 and staged.method[i] == "ghost":
            layer, chain = plan.uses[0]
            acts, g = taps.inputs(layer)
            squares[i] = layer.ghost_sq_norms(acts, g) if users is None else \
                layer.ghost_user_sq_norms(acts, g, users, mask)
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
    for entry in explicit:
        if users is not None:   # each user's sum of its examples' gradients, in B user slots
            entry[1] = clipping.per_user(entry[1], users, mask)
        squares[entry[0]] = clipping.squared_norms([entry[1]], size)
    group_squares = []
    for k in range(len(grp)):
        parts = [sq for sq, g in zip(squares, grp.of_leaf) if g == k and sq is not None]
        total = parts[0] if parts else cnp.zeros_like(losses)   # (no parameter of the group reaches the loss)
        for sq in parts[1:]:
            total = cnp.add(total, sq)
        group_squares.append(total)
    norms, group_norms, scales = clipping.group_clip(group_squares, grp, tiny, mask if users is None else None)
    finite = clipping.finite_rows(norms) if nan_safe else None
    if users is not None:
        # a ghost layer's sum weights each example by its user's factor (and its mask entry);
        # the explicit sums are already per user
        example_finite = None if finite is None else cnp.take(finite, users)
        example_scales = [cnp.take(s, users) for s in scales]
        if mask is not None:
            example_scales = [cnp.multiply(s, cnp.astype(mask, core.dtype_of(s))) for s in example_scales]
    else:
        example_finite, example_scales = finite, scales
    summed = [None] * len(param_leaves)
    # the explicit sums first: a bias's per-example gradients may be its tap's cotangents,
    # which the ghost layer's sum then releases
    for entry in explicit:
        i, grads, chain = entry
        entry[1] = None
        grads = clipping.zero_rows(grads, finite)
        scale = clipping.zero_rows(scales[grp.of_leaf[i]], finite)
        summed[i] = analysis.pull_back(chain, cnp.tensordot(cnp.astype(scale, core.dtype_of(grads)), grads, axes=1),
                                       batched=False)
        del grads
    for i, layer, chain in ghost:
        acts, g = taps.inputs(layer)
        acts = [clipping.zero_rows(a, example_finite) if core.is_float(a) else a for a in acts]
        scale = clipping.zero_rows(example_scales[grp.of_leaf[i]], example_finite)
        weighted = layer.weighted_sum(acts, clipping.zero_rows(cnp.multiply(g, per_row(scale, g)), example_finite))
        del acts, g
        taps.done(layer)
        summed[i] = analysis.pull_back(chain, weighted, batched=False)
    for i, leaf in enumerate(param_leaves):
        if summed[i] is None:
            summed[i] = cnp.zeros_like(leaf)
        elif core.dtype_of(summed[i]) != core.dtype_of(leaf):
            summed[i] = cnp.astype(summed[i], core.dtype_of(leaf))
    return summed, norms, group_norms


def _forward_backward(staged):
    """One batched forward pass and one backward pass. Returns ``(outputs, kept, cts,
    fallback_grads)``: the per-example outputs (losses, aux leaves), the taps' kept operands
    and the cotangents of the z's (a leading batch dim each), and the per-example gradients
    of the fallback parameters."""
    jaxpr, consts = staged.program.jaxpr, staged.program.consts
    param_leaves, batch_leaves, size, taps = staged.param_leaves, staged.batch_leaves, staged.size, staged.taps
    fallback, shared = staged.fallback, staged.shared_leaves

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

        outs = ir.eval_jaxpr(jaxpr, consts, params + list(batch) + shared, hook=tap if taps else None)
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


# ---------------------------------------------------------------------------------------
# In chunks (chunk_size, memory_budget)
# ---------------------------------------------------------------------------------------


def _chunk_combine(out_tree, out_avals):
    """A chunk returns ``(summed, norms, aux)``: the sums add up, norms and aux stack."""
    summed, _, _ = tree.unflatten(out_tree, list(range(len(out_avals))))
    sums = set(tree.leaves(summed))
    return [(memory_budget_mod.SUM,) if i in sums else (memory_budget_mod.STACK, 0) for i in range(len(out_avals))]


def _clipped_in_chunks(settings, chunked, chunks, memory_budget, args, mask, max_norm, tiny, nan_safe, relation,
                       plan_only=False):
    """:func:`_clipped` over chunks of the batch (:mod:`cuvmap.memory_budget`): each chunk
    is a call of its own on a slice of every batched leaf (and of the mask)."""
    loss = settings.loss
    _, nums = api_util.normalize_argnums(loss, settings.argnums, len(args))
    paths, leaves, treedef = tree.flatten_with_path((args, {}))
    axes = api_util.flat_in_axes(loss, _in_axes_for(settings, args, nums), args, {})
    if not any(a is not None for a in axes):
        raise TransformError(f"{api_util.fun_name(loss)} was called with no batch argument: the positional "
                             "arguments not in argnums hold the examples")
    axes, size = api_util.check_mapped_sizes(loss, paths, leaves, axes, None)
    if mask is not None:
        if tuple(core.shape_of(mask)) != (size,):
            raise TransformError(f"mask has shape {tuple(core.shape_of(mask))}, but the batch has {size} examples "
                                 f"(the mask needs shape ({size},))")
        leaves, axes = list(leaves) + [mask], list(axes) + [0]

    def body(b, chunk_leaves):
        m = chunk_leaves[-1] if mask is not None else None
        a, _ = tree.unflatten(treedef, chunk_leaves[:len(chunk_leaves) - (mask is not None)])
        res = _clipped(settings, a, m, None, max_norm, None, tiny, nan_safe, relation)
        res, aux = res if settings.has_aux else (res, ())
        return tree.flatten((res.summed, res.norms, aux))

    key = (treedef, mask is not None, max_norm, tiny, nan_safe)
    if plan_only:
        return chunked.plan(body, leaves, axes, size, chunks, memory_budget, key=key)
    outs, out_tree = chunked(body, leaves, axes, size, chunks, memory_budget, key=key)
    outs = api_util.unaliased([api_util.to_array_result(o) for o in outs], leaves)
    summed, norms, aux = tree.unflatten(out_tree, outs)
    result = clipping.ClippedGradient(summed, norms, None, max_norm=float(max_norm), relation=relation, unit="example")
    return (result, aux) if settings.has_aux else result
