"""Global settings, read and changed as in JAX (``jax.config.update``)::

    import cuvmap as cv
    cv.config.update("default_float", "float64")   # layer initialisers and random draws
    cv.config.default_float                         # dtype('float64')
    with cv.config.override(default_float="float32"):
        ...                                         # restored on exit

Settings:

- ``default_float`` (``float32``; the environment variable ``CUVMAP_DEFAULT_FLOAT`` sets
  the initial value): the dtype of parameters created by the layers' ``init`` when no
  ``dtype`` is given, and of :mod:`cuvmap.random`'s ``uniform``, ``normal`` draws. Arrays
  that you create keep their own dtype: cuvmap never converts data to this dtype, and a
  layer whose data and parameters differ in dtype raises and says which to change.

- ``jit_gpu_fusion`` (``True``; ``CUVMAP_JIT_GPU_FUSION=0`` turns it off): on the GPU, a
  jitted program runs its chains of elementwise primitives as generated kernels
  (:mod:`cuvmap.transforms.fusion`).
- ``jit_cuda_graphs`` (``True``; ``CUVMAP_JIT_CUDA_GRAPHS=0``): on the GPU, a jitted
  program that needs no host synchronisation is captured as a CUDA graph on its second
  call and replayed afterwards (``cuvmap/cuda/graphs.py``).

- ``jit_pool_signatures`` (``8``; ``CUVMAP_JIT_POOL_SIGNATURES``) and ``jit_pool_bytes``
  (``1 << 30``, 1 GiB; ``CUVMAP_JIT_POOL_BYTES``): on the CPU a jitted function keeps, for
  each argument signature, its program (small) and the buffers its plan reuses across
  calls (about the program's intermediates); the buffers are kept only for its most
  recently used ``jit_pool_signatures`` signatures and while they hold at most
  ``jit_pool_bytes`` in all (the signature just called always keeps its own). Dropped
  buffers go back to the operating system (glibc's ``malloc_trim``).
- ``jit_cache_signatures`` (``512``; ``CUVMAP_JIT_CACHE_SIGNATURES``): a jitted function
  keeps the programs of its most recently used ``jit_cache_signatures`` argument
  signatures (about 15 KB each); a signature dropped beyond that traces again when it is
  called (NOTE [what a jitted function keeps] in :mod:`cuvmap.jit_api`).
- ``measured_choices`` (``4096``; ``CUVMAP_MEASURED_CHOICES``): the keys each table of
  measured choices keeps (the convolution strategy's, ghost clipping's), the least
  recently used forgotten first (:mod:`cuvmap.measured_choices`).
- ``device_bounds_check`` (``True``; ``CUVMAP_DEVICE_BOUNDS_CHECK=0`` turns it off): on the
  GPU, the bounds checks of gathers run on the device and report at a later call (NOTE
  [device-side bounds checks] in :mod:`cuvmap.cuda.device_errors`); off, they read the
  indices on the host at once, as on the CPU (a synchronisation each; such programs are
  not captured as CUDA graphs).
- ``deterministic`` (``False``; ``CUVMAP_DETERMINISTIC=1`` turns it on): the same program,
  seed and machine give the same bits. Nothing that cuvmap chooses by timing is timed:
  the ``auto`` convolution strategy takes the vendor's kernels wherever they can run the
  operands (oneDNN for float32 NumPy arrays, cuDNN for CuPy arrays) and the unfold kernels
  elsewhere, ghost clipping's ``method="auto"`` takes each layer's cost-model estimate
  alone, and cuDNN runs only algorithms it marks deterministic, chosen by its heuristics
  (NOTE [reproducible runs]).
- ``collective_check`` (``True``; ``CUVMAP_COLLECTIVE_CHECK=0`` turns it off): before each
  collective over an axis of processes, one small all-reduce checks that every process
  calls the same one (NOTE [the collective check] in :mod:`cuvmap.distributed.check`).
  Every process of a job must have the same value: ``distributed.initialize`` refuses a
  disagreement (NOTE [settings every process shares] in :mod:`cuvmap.distributed.group`),
  and a later change must be made on every process alike.

JAX's settings, kept so that JAX code that sets them runs (``cuvmap.numpy_rank_promotion``
and the other context managers of :mod:`cuvmap.jax_settings` change them for a block):

- ``disable_jit`` (``False``): ``jit`` runs the function as it is, eagerly, every call
  (JAX's ``jax_disable_jit``; for debugging with prints and breakpoints).
- ``numpy_rank_promotion`` (``"allow"``; ``"warn"``, ``"raise"``): JAX's check of implicit
  rank promotion in ``jax.numpy`` binary operations. Accepted and kept; cuvmap does not
  check it (NumPy's broadcasting always applies; docs/jax.md lists the difference).
- ``numpy_dtype_promotion`` (``"standard"``; ``"strict"``): kept, not checked (cuvmap
  promotes as NumPy with NEP 50).
- ``default_matmul_precision`` (``None``; ``"default"``, ``"high"``, ``"highest"``,
  ``"bfloat16"``, ``"tensorfloat32"``, ``"float32"``, ...): JAX's precision of matrix
  products on TPUs and tensor cores; a purely numerical tuning setting, kept and
  without effect (NumPy's and cuBLAS's float32 products run at full float32 precision).
- ``debug_nans``, ``debug_infs`` (``False``): kept, without effect (cuvmap does not re-run
  a program to find the first NaN).

A change of the jit settings applies to the programs planned after it: a jitted function
keeps one plan per combination of them.

The settings are process-wide (as JAX's), not per thread. An environment variable that is
set but empty means the default, for every ``CUVMAP_*`` variable (:func:`from_environment`).
"""
import contextlib
import os

import numpy as np

_FLOATS = ("float16", "float32", "float64")


def _float_dtype(value, name):
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in _FLOATS:
        raise ValueError(f"cuvmap.config: {name} must be one of {', '.join(_FLOATS)}, got {value!r}")
    return dtype


def _bool(value, name):
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
    elif isinstance(value, (bool, np.bool_)) or value in (0, 1):
        return bool(value)
    raise ValueError(f"cuvmap.config: {name} must be True or False (or 1/0), got {value!r}")


def _count(value, name):
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < 0 or isinstance(value, (bool, float)) and value != number:
        raise ValueError(f"cuvmap.config: {name} must be a non-negative int, got {value!r}")
    return number


def from_environment(name, default):
    """The environment variable ``name`` as text, or ``default`` when it is unset or empty
    (only spaces): for every ``CUVMAP_*`` variable, ``CUVMAP_X=`` means the default, as an
    unset one does (a shell's ``export CUVMAP_X=`` or a CI matrix's empty entry)."""
    value = os.environ.get(name, "")
    return default if value.strip() == "" else value


def _choice(*allowed):
    def check(value, name):
        if value not in allowed:
            raise ValueError(f"cuvmap.config: {name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        return value
    return check


_PRECISIONS = (None, "default", "high", "highest", "bfloat16", "tensorfloat32", "float32", "fastest",
               "bfloat16_3x", "ANY_F8_ANY_F8_F32", "F16_F16_F32", "F32_F32_F32", "F64_F64_F64")

_CHECKS = {"default_float": _float_dtype, "jit_gpu_fusion": _bool, "jit_cuda_graphs": _bool,
           "jit_pool_signatures": _count, "jit_pool_bytes": _count, "jit_cache_signatures": _count,
           "measured_choices": _count, "device_bounds_check": _bool,
           "deterministic": _bool,
           "collective_check": _bool,
           "disable_jit": _bool, "numpy_rank_promotion": _choice("allow", "warn", "raise"),
           "numpy_dtype_promotion": _choice("standard", "strict"),
           "default_matmul_precision": _choice(*_PRECISIONS), "debug_nans": _bool, "debug_infs": _bool}
_values = {
    "default_float": _float_dtype(from_environment("CUVMAP_DEFAULT_FLOAT", "float32"), "CUVMAP_DEFAULT_FLOAT"),
    "jit_gpu_fusion": _bool(from_environment("CUVMAP_JIT_GPU_FUSION", "1"), "CUVMAP_JIT_GPU_FUSION"),
    "jit_cuda_graphs": _bool(from_environment("CUVMAP_JIT_CUDA_GRAPHS", "1"), "CUVMAP_JIT_CUDA_GRAPHS"),
    "jit_pool_signatures": _count(from_environment("CUVMAP_JIT_POOL_SIGNATURES", "8"), "CUVMAP_JIT_POOL_SIGNATURES"),
    "jit_pool_bytes": _count(from_environment("CUVMAP_JIT_POOL_BYTES", str(1 << 30)), "CUVMAP_JIT_POOL_BYTES"),
    "jit_cache_signatures": _count(from_environment("CUVMAP_JIT_CACHE_SIGNATURES", "512"),
                                   "CUVMAP_JIT_CACHE_SIGNATURES"),
    "measured_choices": _count(from_environment("CUVMAP_MEASURED_CHOICES", "4096"), "CUVMAP_MEASURED_CHOICES"),
    "device_bounds_check": _bool(from_environment("CUVMAP_DEVICE_BOUNDS_CHECK", "1"), "CUVMAP_DEVICE_BOUNDS_CHECK"),
    "deterministic": _bool(from_environment("CUVMAP_DETERMINISTIC", "0"), "CUVMAP_DETERMINISTIC"),
    "collective_check": _bool(from_environment("CUVMAP_COLLECTIVE_CHECK", "1"), "CUVMAP_COLLECTIVE_CHECK"),
    "disable_jit": False, "numpy_rank_promotion": "allow", "numpy_dtype_promotion": "standard",
    "default_matmul_precision": None, "debug_nans": False, "debug_infs": False,
}

# NOTE [reproducible runs]
# Where cuvmap picks between equivalent computations by timing them — the "auto"
# convolution strategy (NOTE [conv strategy] in cuvmap/lax/conv_strategy.py), ghost
# clipping's per-layer method (NOTE [ghost clipping] in cuvmap/dp/ghost/__init__.py),
# cuDNN's algorithm under cudnn.set_benchmark(True) — the pick depends on the machine's
# load at the first call, and the candidates round float32 differently (a sum in another
# order), so two runs with the same seed can differ in the last bits, and the differences
# grow over training. `deterministic` replaces each timing by a fixed rule that depends
# only on the shapes, dtypes and device: the vendor's convolution kernels where they can
# run the operands (else the unfold ones), the cost model's estimate for ghost clipping,
# cuDNN's heuristic order restricted to the algorithms it reports as deterministic (no
# atomics in the backward passes). What it gives up: on shapes where the timed pick would
# have been the other kernel, that kernel's speed (python -m benchmarks conv shows both).
# The rest of cuvmap is deterministic already on a given machine: NumPy/CuPy reductions,
# BLAS and oneDNN run the same instructions for the same shapes and thread counts, random
# draws come from explicit keys or generators.


def _jax_spelling(name, value=None):
    """JAX's name of a setting (``"jax_numpy_rank_promotion"``) as cuvmap's, and
    ``jax_enable_x64`` as ``default_float`` (float64 on, float32 off)."""
    if name == "jax_enable_x64":
        return "default_float", ("float64" if _bool(value, name) else "float32") if value is not None else None
    if name.startswith("jax_") and name[4:] in _CHECKS:
        return name[4:], value
    return name, value


def update(name, value):
    """Sets the setting ``name`` to ``value`` (``update("default_float", "float64")``); JAX's
    spellings work too (``update("jax_enable_x64", True)`` sets ``default_float`` to
    float64, ``update("jax_disable_jit", True)`` sets ``disable_jit``)."""
    name, value = _jax_spelling(name, value)
    if name not in _CHECKS:
        raise KeyError(f"cuvmap.config: unknown setting {name!r}; the settings are {sorted(_CHECKS)}")
    _values[name] = _CHECKS[name](value, name)


def read(name):
    """The current value of the setting ``name`` (JAX's spellings as in :func:`update`)."""
    if name == "jax_enable_x64":
        return _values["default_float"] == np.float64
    name, _ = _jax_spelling(name)
    if name not in _values:
        raise KeyError(f"cuvmap.config: unknown setting {name!r}; the settings are {sorted(_CHECKS)}")
    return _values[name]


@contextlib.contextmanager
def override(**settings):
    """Changes settings for the duration of a ``with`` block."""
    old = {name: read(name) for name in settings}
    try:
        for name, value in settings.items():
            update(name, value)
        yield
    finally:
        _values.update(old)


def __getattr__(name):  # ``cuvmap.config.default_float`` (PEP 562)
    if name in _values:
        return _values[name]
    raise AttributeError(f"module 'cuvmap.config' has no attribute {name!r}")
