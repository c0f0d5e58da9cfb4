"""Shared fixtures: the backend parameter, ``cpu`` always and ``gpu`` when CuPy sees a
CUDA device (the gpu variants skip cleanly otherwise)."""
import pytest

from cuvmap import backend as cv_backend


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def backend(request):
    """``"cpu"`` or ``"gpu"``; the gpu variant skips unless CuPy sees a CUDA device."""
    if request.param == "gpu" and not cv_backend.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    return request.param
