"""torch's rows: torch.func ``vmap(grad)`` of a functional net on
``torch.nn.functional`` (per-example gradients and the clipped sum), and torch's batched
gradient for reference, on the suite's weights and data (:mod:`benchmarks.models`)."""
from benchmarks import models
from benchmarks.machine.settings import blas_threads
from benchmarks.methods import Method
from benchmarks.rounds.timers import cpu_timer, torch_event_timer


def setup(args, notes, fw, what):
    """Imports torch and sets it up like NumPy: the same thread count, no TF32. Returns the
    module, or None with the reason in ``notes`` (``what`` names the rows skipped);
    ``args`` has ``no_torch`` and ``device``; ``fw["torch"]`` says how torch runs."""
    if args.no_torch:
        notes.append(f"{what}: skipped (--no-torch)")
        return None
    try:
        import torch  # optional: a peer, compared with where installed
        import torch.func  # noqa: F401
    except ImportError:
        notes.append(f"{what}: skipped (torch is not installed)")
        return None
    if args.device == "gpu" and not torch.cuda.is_available():
        notes.append(f"{what}: skipped (torch {torch.__version__} sees no CUDA device)")
        return None
    threads, source = blas_threads()
    torch.set_num_threads(threads)
    # cuvmap computes in strict float32; so must the comparison (TF32 is on by default for
    # torch's cuDNN convolutions on Ampere and later)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    fw["torch"] = (f"{torch.__version__}; torch.set_num_threads({threads}) = NumPy's BLAS threads "
                   f"(from {source}); TF32 off")
    return torch


def to_numpy(t):
    return t.detach().cpu().numpy()


class Batch:
    """The suite's data and weights as torch tensors on the suite's device, with its timer."""

    def __init__(self, args, torch, params, xs, ys):
        self.device = "cuda" if args.device == "gpu" else "cpu"
        self.timer = torch_event_timer(torch) if self.device == "cuda" else cpu_timer()
        self.params = {k: torch.tensor(v, device=self.device) for k, v in params.items()}
        self.x, self.y = torch.tensor(xs, device=self.device), torch.tensor(ys, device=self.device)


def per_example_methods(args, torch, params, xs, ys):
    """(e) torch.func ``vmap(grad)`` of the benchmark CNN, and torch's batched gradient."""
    from torch.func import grad, vmap  # torch is optional: imported where installed

    b = Batch(args, torch, params, xs, ys)
    per_example = vmap(grad(models.torch_per_example_loss), in_dims=(None, 0, 0))
    batched = grad(models.torch_batch_loss)
    return [
        Method("torch_vmap", "torch.func: vmap(grad)", "torch", lambda: per_example(b.params, b.x, b.y), b.timer,
               "per_example", to_numpy),
        Method("torch_batched", "torch: grad of the mean loss (batched, reference)", "torch",
               lambda: batched(b.params, b.x, b.y), b.timer, "batched", to_numpy),
    ]


def clip_and_sum(torch, per_example, max_norm):
    """The sum of per-example gradients ``{name: (B, ...)}`` clipped to L2 norm ``max_norm``
    (Opacus's ``max_norm / (norm + 1e-6)``, at most 1), and the norms."""
    b = next(iter(per_example.values())).shape[0]
    norms = torch.sqrt(sum(torch.sum(g.reshape(b, -1) ** 2, dim=1) for g in per_example.values()))
    coef = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
    return {k: torch.tensordot(coef, g, dims=1) for k, g in per_example.items()}, norms


def in_cuvmap_layout(module, names, per_example):
    """A module's ``.grad`` (with ``per_example`` its ``.grad_sample``, as Opacus fills it) as a
    dict in cuvmap's layouts: Linear weights (out, in) transposed to (in, out)."""
    out = {}
    for name, param in zip(names, module.parameters()):
        g = param.grad_sample if per_example else param.grad
        if param.ndim == 2:
            g = g.transpose(1, 2) if per_example else g.T
        out[name] = g
    return out


def clipped_sum_methods(args, torch, params, make_module, per_example_loss, xs, ys, max_norm):
    """(d) the batched gradient of an ``nn.Module`` (reference), and torch.func ``vmap(grad)``
    then the clipped sum in torch."""
    import torch.nn.functional as F  # torch is optional: imported where installed
    from torch.func import grad, vmap

    b = Batch(args, torch, params, xs, ys)
    net = make_module(params).to(b.device)
    per_example_grads = vmap(grad(per_example_loss), in_dims=(None, 0, 0))

    def batched():
        net.zero_grad(set_to_none=True)
        F.cross_entropy(net(b.x), b.y).backward()
        return in_cuvmap_layout(net, list(params), False)

    def torch_func():
        return clip_and_sum(torch, per_example_grads(b.params, b.x, b.y), max_norm)

    return [
        Method("torch_batched", "torch: backward of the mean loss (non-private, reference)", "torch", batched,
               b.timer, "batched", to_numpy, memory=False),
        Method("torch_func_clip", "torch.func: vmap(grad) + clipped sum", "torch", torch_func, b.timer, "clipped",
               to_numpy, memory=False),
    ]
