"""JAX's configuration context managers and device queries (cuvmap/jax_settings.py)."""
import numpy as np
import pytest

import cuvmap as cv


def test_disable_jit_runs_the_function_eagerly_and_restores():
    calls = []

    @cv.jit
    def f(x):
        calls.append(type(x))
        return x * 2.0

    with cv.disable_jit():
        assert float(f(1.0)) == 2.0 and float(f(2.0)) == 4.0
        assert calls == [float, float]  # the Python function itself, on the values
        assert cv.config.disable_jit is True
    assert cv.config.disable_jit is False
    f(1.0)
    f(2.0)
    assert len(calls) == 3  # traced once, then the program


@pytest.mark.parametrize("manager, name, value, default", [
    (cv.numpy_rank_promotion, "numpy_rank_promotion", "raise", "allow"),
    (cv.numpy_dtype_promotion, "numpy_dtype_promotion", "strict", "standard"),
    (cv.default_matmul_precision, "default_matmul_precision", "float32", None),
    (cv.debug_nans, "debug_nans", True, False),
    (cv.debug_infs, "debug_infs", True, False),
])
def test_settings_as_context_managers_and_decorators(manager, name, value, default):
    with manager(value):
        assert cv.config.read(name) == value
    assert cv.config.read(name) == default

    @manager(value)
    def read():
        return cv.config.read(name)

    assert read() == value and read() == value
    assert cv.config.read(name) == default


def test_settings_refuse_unknown_values_and_take_jax_spellings():
    with pytest.raises(ValueError, match="numpy_rank_promotion must be one of 'allow', 'warn', 'raise', got 'no'"):
        with cv.numpy_rank_promotion("no"):
            pass
    with cv.config.override(numpy_rank_promotion="allow"):
        cv.config.update("jax_numpy_rank_promotion", "warn")
        assert cv.config.numpy_rank_promotion == "warn"
    with cv.config.override(default_float="float32"):
        cv.config.update("jax_enable_x64", True)
        assert cv.config.default_float == np.float64 and cv.config.read("jax_enable_x64")
    with cv.enable_x64(False):
        assert cv.config.default_float == np.float32
    with cv.checking_leaks(), cv.enable_checks():
        assert float(cv.grad(lambda x: x * x)(3.0)) == 6.0


def test_devices():
    devices = cv.devices("cpu")
    assert len(devices) == 1 and devices[0].platform == "cpu" and devices[0].id == 0
    assert cv.device_count("cpu") == cv.local_device_count("cpu") == 1
    assert cv.local_devices(backend="cpu") == devices
    assert cv.default_backend() in ("cpu", "gpu")
    x = cv.device_put(np.ones(2, np.float32), devices[0])
    assert isinstance(x, np.ndarray)
    with pytest.raises(RuntimeError, match="unknown backend"):
        cv.devices("tpu")
