"""The strict CuPy stand-in: ``cupy`` and ``cupyx`` packages (in this folder) that run on
the CPU and refuse what CuPy 14 refuses, so that every gpu-marked test checks the GPU
path's device discipline on every CI run, without a GPU.

What it checks:

- its arrays wrap NumPy arrays and refuse implicit conversion (``__array__`` raises
  ``TypeError``; no ``__array_interface__`` or buffer), so ``numpy.asarray(x)``,
  ``np.testing`` on a device array or a NumPy function CuPy has no counterpart for fail;
- NumPy arrays as operands of its ufuncs and functions raise as CuPy's
  ``_preprocess_args`` does; binary operators defer by ``__array_priority__`` as CuPy
  does; results are stand-in arrays (0-d, never NumPy scalars);
- ``ElementwiseKernel`` bodies are evaluated as C, with the declared dtypes enforced;
- every device->host read is counted per call site (:func:`host_reads`);
- stream capture: a device->host read, a synchronisation, a host->device copy and any
  cuBLAS (through CuPy), cuSOLVER or cuRAND call raise (as CuPy 14 and CUDA do) and are
  recorded (:func:`refusals`); the launches are recorded into a graph (:func:`graphs`) that
  replays them on the captured buffers, which hold garbage until it is launched;
- integer index arrays wrap around the axis, as CuPy's gathers and scatters do;
- addresses: ``ndarray.data.ptr`` is the NumPy buffer's address, ``ndarray(memptr=...)``
  views registered memory, pinned host memory (``runtime.hostAlloc``) is shared with the
  device, and ``libcublas`` is emulated on the bytes at the addresses cuvmap's own cuBLAS
  binding passes (``cupy/_libcublas.py``: column-major, cuBLAS's argument checks, an
  illegal address outside every buffer, a GEMM in a capture only on the capturing stream);
  tests/conftest.py hands it to ``cuvmap.cuda.cublas.use_library``.

What it does not prove: anything about a GPU's speed, CUDA's math functions, kernel
compilation (NVRTC), cuDNN or NCCL (both unavailable under it), memory, or streams
running concurrently; the tests on a real device (tools/gpu_checks.sh) stay the truth.

Installed by tests/conftest.py (this folder first on ``sys.path``) unless a real CuPy with
a device is present or ``CUVMAP_STRICT_CUPY=0``; ``CUVMAP_STRICT_CUPY=1`` forces it.
"""
import contextlib
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def _strict():
    from cupy import _strict
    return _strict


def active():
    """Whether ``import cupy`` gives the stand-in."""
    import sys
    mod = sys.modules.get("cupy")
    return mod is not None and getattr(mod, "__file__", "").startswith(HERE)


def host_reads():
    """{call site ``"path:line (function)"``: count} of device->host reads."""
    return _strict().host_reads()


def refusals():
    """The refusals during captures: dicts with ``kind``, ``what`` and ``site``."""
    return _strict().refusals()


def graphs():
    """The graphs captured (``cupy.cuda.graph.Graph``; ``.names()`` lists the launches)."""
    return _strict().graphs()


def surface():
    """{CuPy name: calls} of the functions, ufuncs and kernels called in this process (never
    reset): the surface the stand-in has to implement (``CUVMAP_STRICT_CUPY_SURFACE=path``
    writes it at the end of a pytest session)."""
    return _strict().surface()


def reset():
    """Clears the reads, refusals and graphs."""
    _strict().reset()


@contextlib.contextmanager
def recording():
    """``with recording() as log:`` clears the ledger, and ``log`` holds, on exit, the
    ``host_reads``, ``refusals`` and ``graphs`` of the block."""
    reset()
    log = {}
    try:
        yield log
    finally:
        log.update(host_reads=host_reads(), refusals=refusals(), graphs=graphs())
