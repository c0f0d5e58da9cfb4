"""Ghost norm or explicit per-example gradient, per layer: the rules' cost estimates, and
where they are close, a measurement kept per layer shape and batch bucket in a
:class:`~cuvmap.measured_choices.MeasuredChoices` (the table the convolution strategy uses
too). NOTE [ghost clipping] in :mod:`cuvmap.dp.ghost` states the cost model."""
import math
import time

import numpy as np

from cuvmap import backend, config, core
from cuvmap import numpy as cnp
from cuvmap.dp import clipping
from cuvmap.dp.ghost.rules import per_row
from cuvmap.measured_choices import MeasuredChoices

#: estimates within this factor of each other are settled by timing both methods
CLOSE = 4.0
METHODS = ("auto", "ghost", "per_example")

_measured = MeasuredChoices("ghost")


def measured_choices():
    """The layers ``method="auto"`` has timed so far: ``{key: (choice, {method: ms})}``."""
    return _measured.snapshot()


def clear_measured_choices():
    """Forgets the timed choices (the next call of each layer times it again)."""
    _measured.clear()


def choose(layer, method, size, device):
    """``"ghost"`` or ``"per_example"`` for a parameter's only use (NOTE [ghost clipping]).
    Under ``cv.config.deterministic`` the estimates alone decide (NOTE [reproducible runs]
    in cuvmap/config.py)."""
    if not layer.has_ghost or method == "per_example":
        return "per_example"
    if method == "ghost":
        return "ghost"
    ghost, explicit = layer.costs()
    if ghost * CLOSE <= explicit or size == 0 or config.read("deterministic"):
        return "ghost" if ghost <= explicit else "per_example"
    if explicit * CLOSE <= ghost:
        return "per_example"
    bucket = 1 << (size - 1).bit_length()   # the power of two at or above the batch size
    key = layer.key() + (device or "cpu", bucket)

    def measure():
        times = _time_both(layer, bucket, device or "cpu")
        return (min(times, key=times.get), times), None

    return _measured.measure_once(key, measure)[0][0]


def choose_for_users(layer, method, size, device):
    """``"ghost"`` or ``"per_example"`` for a parameter's only use under user-level clipping
    (NOTE [user norms from factored gradients]): the ghost form only where the rule has
    one, chosen by the estimates of ``layer.user_costs`` (nothing is timed)."""
    if not layer.has_user_ghost or method == "per_example":
        return "per_example"
    if method == "ghost":
        return "ghost"
    ghost, explicit = layer.user_costs(size)
    return "ghost" if ghost <= explicit else "per_example"


def _time_both(layer, size, device):
    """Milliseconds of each method's work for ``layer`` (norms, then the weighted sum) on
    random operands of its shapes for a batch of ``size``, on ``device``: the faster of two
    calls after a warm-up call (CUDA events on the GPU)."""
    xp = backend.xp_for("gpu" if device.startswith("gpu") else "cpu")
    rng = np.random.default_rng(0)
    acts, g = layer.example_inputs(size, rng, xp)
    weights = xp.asarray(rng.random(size).astype(g.dtype))

    def ghost():
        layer.ghost_sq_norms(acts, g)
        layer.weighted_sum(acts, cnp.multiply(g, per_row(weights, g)))

    def explicit():
        grads = layer.per_example_grads(acts, g)
        clipping.squared_norms([grads], size)
        cnp.tensordot(weights, grads, axes=1)

    # at trace time under jit: run the candidates, do not stage them
    with core.staging(None):
        return {"ghost": _time_call(ghost, xp), "per_example": _time_call(explicit, xp)}


def _time_call(fn, xp):
    if xp is not np:
        from cuvmap.cuda import device as cuda_device   # optional: CuPy's device code

        return cuda_device.time_gpu(fn, repeats=2)
    fn()
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best
