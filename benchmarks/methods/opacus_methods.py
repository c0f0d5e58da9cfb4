"""Opacus's rows of the dp suite: ghost clipping (``GradSampleModuleFastGradientClipping``)
and the per-sample hooks of ``GradSampleModule`` then the clipped sum, on the suite's
weights and data as ``nn.Module``s (:mod:`benchmarks.models`)."""
from benchmarks.methods import Method
from benchmarks.methods.torch_methods import Batch, clip_and_sum, in_cuvmap_layout, to_numpy


def setup(args, notes, fw):
    """Imports Opacus (torch is set up already); None with the reason in ``notes`` when
    skipped or not installed; ``fw["opacus"]`` its version."""
    if args.no_opacus:
        notes.append("Opacus: skipped (--no-opacus)")
        return None
    try:
        import opacus  # optional: a peer, compared with where installed
    except ImportError:
        notes.append("Opacus: skipped (opacus is not installed)")
        return None
    fw["opacus"] = opacus.__version__
    return opacus


def clipped_sum_methods(args, torch, opacus, params, make_module, xs, ys, max_norm):
    """(e) ghost clipping, its norms from a first backward pass and the clipped sum from a
    second one (``DPTensorFastGradientClipping.backward`` without an optimizer), and the
    per-sample hooks then the clipped sum in torch."""
    import torch.nn.functional as F  # torch is optional: imported where installed
    from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping

    b = Batch(args, torch, params, xs, ys)
    names = list(params)
    ghost_net = GradSampleModuleFastGradientClipping(make_module(params).to(b.device), max_grad_norm=max_norm,
                                                     use_ghost_clipping=True, loss_reduction="sum")
    hooks_net = GradSampleModule(make_module(params).to(b.device), loss_reduction="sum")

    def opacus_ghost():
        ghost_net.zero_grad(set_to_none=True)
        losses = F.cross_entropy(ghost_net(b.x), b.y, reduction="none")
        losses.sum().backward(retain_graph=True)
        coef = ghost_net.get_clipping_coef()
        norms = ghost_net.per_sample_gradient_norms
        ghost_net.zero_grad(set_to_none=True)
        ghost_net.disable_hooks()
        (coef * losses).sum().backward()
        ghost_net.enable_hooks()
        return in_cuvmap_layout(ghost_net._module, names, False), norms

    def opacus_hooks():
        hooks_net.zero_grad(set_to_none=True)
        for q in hooks_net.parameters():
            q.grad_sample = None
        F.cross_entropy(hooks_net(b.x), b.y, reduction="sum").backward()
        return clip_and_sum(torch, in_cuvmap_layout(hooks_net._module, names, True), max_norm)

    return [
        Method("opacus_ghost", "Opacus: ghost clipping (GradSampleModuleFastGradientClipping, 2 backward passes)",
               "opacus", opacus_ghost, b.timer, "clipped", to_numpy, memory=False),
        Method("opacus_hooks", "Opacus: per-sample hooks (GradSampleModule) + clipped sum", "opacus", opacus_hooks,
               b.timer, "clipped", to_numpy, memory=False),
    ]
