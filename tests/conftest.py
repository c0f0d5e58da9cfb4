"""Shared fixtures: the backend parameter, ``cpu`` always and ``gpu`` when CuPy sees a
CUDA device (the gpu variants skip cleanly otherwise).

Without a GPU the gpu variants run on the strict CuPy stand-in (tests/strict_cupy: its
docstring says what it checks and what it does not prove), installed here before anything
imports ``cupy``: unless ``CUVMAP_STRICT_CUPY=0`` (tools/gpu_checks.sh sets it) or a real
CuPy sees a device; ``CUVMAP_STRICT_CUPY=1`` installs it even then."""
import importlib.util
import os
import sys

import pytest

_STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "strict_cupy")


def _real_cupy_has_a_device():
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver, no device: the stand-in serves
        for name in [m for m in sys.modules if m.split(".")[0] in ("cupy", "cupyx", "cupy_backends")]:
            del sys.modules[name]
        return False


def _install_strict_cupy():
    setting = os.environ.get("CUVMAP_STRICT_CUPY", "")
    if setting == "0" or (setting != "1" and _real_cupy_has_a_device()):
        return False
    for name in [m for m in sys.modules if m.split(".")[0] in ("cupy", "cupyx", "cupy_backends")]:
        del sys.modules[name]
    sys.path.insert(0, _STANDIN)
    from cupy import _libcublas

    from cuvmap import backend
    from cuvmap.cuda import cublas

    backend._cupy, backend._cupy_probed = None, False  # probe again: the stand-in's device
    cublas.use_library(_libcublas.LIBRARY)  # cuvmap's own cuBLAS binding calls the emulated libcublas
    return True


STRICT_CUPY = _install_strict_cupy()

from cuvmap import backend as cv_backend  # noqa: E402

# gpu tests that fail under the stand-in for defects not fixed yet: {test id: reason}, each a
# strict xfail (a test that starts to pass must leave the list). None at present.
KNOWN_GPU_FAILURES = {}


def pytest_collection_modifyitems(config, items):
    if not STRICT_CUPY:
        return
    for item in items:
        reason = KNOWN_GPU_FAILURES.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=f"strict CuPy stand-in: {reason}", strict=True))


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("CUVMAP_STRICT_CUPY_SURFACE")
    if STRICT_CUPY and path:  # the CuPy names the session called, one a line, with their call counts
        import strict_cupy

        with open(path, "w") as fh:
            fh.writelines(f"{name} {n}\n" for name, n in sorted(strict_cupy.surface().items()))


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def backend(request):
    """``"cpu"`` or ``"gpu"``; the gpu variant skips unless CuPy (or the strict stand-in)
    sees a CUDA device."""
    if request.param == "gpu" and not cv_backend.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    return request.param
