"""The GPU smoke test of tools/gpu_checks.sh: the main job's DP-SGD step (ghost-clipped
per-example gradients of examples/dp_sgd_digits.py's CNN, noise, Adam) under jit on the
GPU, against the same step on the CPU; its CUDA graph (captured from the second call when
the bounds check runs on the device); and an out-of-bounds label, which must raise an
IndexError (at the call with CUVMAP_DEVICE_BOUNDS_CHECK=0, else at the synchronisation).

    python3 tools/gpu_smoke.py               # exit status 0: every check passed
    python3 tools/gpu_smoke.py --preflight   # the device, and whether cuDNN loaded

With ``CUVMAP_STRICT_CUPY=1`` it runs on the strict CuPy stand-in of tests/strict_cupy
(as tests/conftest.py installs it), which is how CI checks it without a GPU.
"""
import importlib.util
import os
import sys
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _install_strict_cupy():
    """The stand-in first on the path, cuvmap's cuBLAS binding on its emulated libcublas
    (tests/conftest.py does the same for the tests)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "strict_cupy"))
    from cupy import _libcublas

    from cuvmap import backend
    from cuvmap.cuda import cublas

    backend._cupy, backend._cupy_probed = None, False
    cublas.use_library(_libcublas.LIBRARY)


def _main_job():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    spec = importlib.util.spec_from_file_location("dp_sgd_digits", os.path.join(ROOT, "examples", "dp_sgd_digits.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv):
    if os.environ.get("CUVMAP_STRICT_CUPY") == "1":
        _install_strict_cupy()
    import cuvmap as cv
    from cuvmap import config, dp, nn
    from cuvmap.cuda import device, graphs

    if "--preflight" in argv:
        return device.preflight()
    if not cv.backend.gpu_available():
        print("smoke: no CUDA device (or CuPy) available")
        return 1
    on_device = config.read("device_bounds_check")
    print(f"smoke: {device.describe()}; bounds check on the {'device' if on_device else 'host'}")
    job = _main_job()
    rng = np.random.default_rng(0)
    _, params = job.MODEL.init(rng, (-1, 1, 8, 8))
    params = cv.tree.map(lambda p: p.astype(np.float32), params)
    x = rng.standard_normal((16, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 16)
    mask = np.ones(16, np.float32)
    noise = dp.standard_normal_like(params, np.random.default_rng(1))
    opt = nn.optim.adam(1e-2)
    clipped_grad = dp.clipped_grad(job.loss, 1.0)

    def step(params, state, x, y, mask, noise):
        clipped = clipped_grad(params, x, y, mask=mask)
        grads = dp.private_gradient(clipped, 1.0, 1.0, mask=mask, noise=noise, expected_batch_size=16.0)
        return opt.update(grads, state, params)

    want = step(params, opt.init(params), x, y, mask, noise)
    captured = []
    capture = graphs.GraphRunner._capture

    def counting(self, cp, args):
        capture(self, cp, args)
        captured.append(self)

    graphs.GraphRunner._capture = counting
    jstep = cv.jit(step)
    gparams, gx, gy, gmask, gnoise = cv.device_put((params, x, y, mask, noise), "gpu")
    gstate = opt.init(gparams)
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphs.GraphCaptureWarning)
        outs = [jstep(gparams, gstate, gx, gy, gmask, gnoise) for _ in range(3)]
    got = cv.device_put(cv.block_until_ready(outs[-1]), "cpu")
    worst = max(float(np.max(np.abs(g - w))) for g, w in zip(cv.tree.leaves(got), cv.tree.leaves(want)))
    print(f"smoke: the jitted step on the GPU against the CPU: largest difference {worst:.2e} (tolerance 1e-4)")
    print(f"smoke: CUDA graphs captured: {len(captured)} (want {1 if on_device else 0})")
    ok = worst <= 1e-4 and len(captured) == (1 if on_device else 0)
    bad = cv.device_put(np.where(np.arange(16) == 3, 10, y), "gpu")
    try:
        cv.block_until_ready(jstep(gparams, gstate, gx, bad, gmask, gnoise))
    except IndexError as err:
        print(f"smoke: an out-of-bounds label raised IndexError: {err}")
    else:
        print("smoke: !! an out-of-bounds label raised nothing")
        ok = False
    cv.block_until_ready(jstep(gparams, gstate, gx, gy, gmask, gnoise))   # nothing left over
    print("smoke: ok" if ok else "smoke: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
