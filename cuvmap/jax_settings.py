"""JAX's configuration context managers and device queries, on :mod:`cuvmap.config` and
:mod:`cuvmap.backend` (``jax.numpy_rank_promotion``, ``jax.disable_jit``, ``jax.devices``,
...), so that JAX code and tests that set them run unchanged.

Each context manager sets a :mod:`cuvmap.config` setting for a ``with`` block (or, as a
decorator, for the calls of a function) and restores it after, as JAX's do. What each
setting does in cuvmap (some are kept without effect: purely numerical tuning, or checks
cuvmap does not make) is listed in :mod:`cuvmap.config` and docs/jax.md.
"""
import contextlib

from cuvmap import backend, config


@contextlib.contextmanager
def _setting(name, value):
    """A context manager (and decorator) that sets the setting ``name`` for its block."""
    with config.override(**{name: value}):
        yield


def disable_jit(disable=True):
    """``jit`` runs functions eagerly, as plain Python, inside the block (JAX's
    ``jax.disable_jit``): prints, breakpoints and Python control flow on values work."""
    return _setting("disable_jit", disable)


def numpy_rank_promotion(level):
    """JAX's ``jax.numpy_rank_promotion("allow" | "warn" | "raise")``: kept in
    ``config.numpy_rank_promotion``; cuvmap does not check rank promotion (NumPy's
    broadcasting always applies)."""
    return _setting("numpy_rank_promotion", level)


def numpy_dtype_promotion(mode):
    """JAX's ``jax.numpy_dtype_promotion("standard" | "strict")``: kept in
    ``config.numpy_dtype_promotion``; cuvmap promotes as NumPy (NEP 50) in either."""
    return _setting("numpy_dtype_promotion", mode)


def default_matmul_precision(precision):
    """JAX's ``jax.default_matmul_precision(...)``: the precision of matrix products on
    reduced-precision hardware; a numerical tuning setting that cuvmap keeps without
    effect (its float32 products run at float32 precision)."""
    return _setting("default_matmul_precision", precision)


def enable_x64(new_val=True):
    """JAX's ``jax.enable_x64``: in cuvmap, ``default_float`` float64 (on) or float32 (off)
    for the block (cuvmap keeps every array's own dtype whatever the setting)."""
    return _setting("default_float", "float64" if new_val else "float32")


def debug_nans(new_val=True):
    """JAX's ``jax.debug_nans``: kept in ``config.debug_nans``, without effect."""
    return _setting("debug_nans", new_val)


def debug_infs(new_val=True):
    """JAX's ``jax.debug_infs``: kept in ``config.debug_infs``, without effect."""
    return _setting("debug_infs", new_val)


@contextlib.contextmanager
def checking_leaks():
    """JAX's ``jax.checking_leaks()``: cuvmap always checks for escaped tracers (an
    :class:`~cuvmap.EscapedTracerError` at their first use), so the block changes nothing."""
    yield


@contextlib.contextmanager
def enable_checks(new_val=True):
    """JAX's ``jax.enable_checks`` (its internal type checks of programs): cuvmap's shape
    rules check every equation whatever the setting, so the block changes nothing."""
    yield


# ---------------------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------------------


class Device:
    """A device as JAX's ``jax.Device`` shows it: ``platform`` (``"cpu"`` or ``"gpu"``),
    ``id``, ``device_kind``, ``process_index``. ``cuvmap.device_put(x, device)`` takes it
    (its platform)."""

    __slots__ = ("platform", "id", "device_kind", "process_index")

    def __init__(self, platform, id=0):  # noqa: A002 - JAX's attribute name
        self.platform = platform
        self.id = id
        self.device_kind = "cpu" if platform == "cpu" else "cuda"
        self.process_index = 0

    def __repr__(self):
        return f"{'CpuDevice' if self.platform == 'cpu' else 'CudaDevice'}(id={self.id})"

    def __eq__(self, other):
        return isinstance(other, Device) and (self.platform, self.id) == (other.platform, other.id)

    def __hash__(self):
        return hash((self.platform, self.id))

    def __str__(self):
        return f"{self.platform.upper()} {self.id}" if self.platform == "gpu" else "TFRT_CPU_0"


def default_backend():
    """``"gpu"`` when CuPy sees a CUDA device, else ``"cpu"`` (JAX's ``jax.default_backend``)."""
    return "gpu" if backend.gpu_available() else "cpu"


def devices(backend_name=None):
    """The devices of ``backend_name`` (``"cpu"``, ``"gpu"``; default
    :func:`default_backend`), as JAX's ``jax.devices``: one CPU device; the CUDA devices
    CuPy sees."""
    name = {"cuda": "gpu", "rocm": "gpu"}.get(backend_name, backend_name) or default_backend()
    if name == "cpu":
        return [Device("cpu", 0)]
    if name == "gpu":
        cp = backend.cupy_module()
        if cp is None:
            raise RuntimeError("devices('gpu'): CuPy is not installed or sees no CUDA device")
        return [Device("gpu", k) for k in range(cp.cuda.runtime.getDeviceCount())]
    raise RuntimeError(f"devices({backend_name!r}): unknown backend; expected 'cpu' or 'gpu'")


def local_devices(process_index=None, backend=None):
    """The devices of this process (JAX's ``jax.local_devices``): :func:`devices`."""
    return devices(backend)


def device_count(backend=None):
    """How many devices :func:`devices` lists (JAX's ``jax.device_count``)."""
    return len(devices(backend))


def local_device_count(backend=None):
    """How many devices this process has (JAX's ``jax.local_device_count``)."""
    return len(devices(backend))
