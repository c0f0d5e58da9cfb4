"""Generated CuPy kernels: the fused elementwise groups of ``jit`` (the groups and their
source come from :mod:`cuvmap.transforms.fusion`; this module only compiles and calls).
"""
import contextlib
import functools
import threading
import warnings

from cuvmap import backend
from cuvmap.cuda import libs

# NOTE [fused kernels round as the unfused ones]
# NVRTC contracts a * b + c into one fused multiply-add by default, which rounds once
# instead of twice; separate CuPy ufunc kernels cannot contract across kernels. Fused
# kernels are compiled with --fmad=false so that a fused program gives the same bits as
# the same program run op by op (the GPU tests compare them for equality); the math
# functions (sin, exp, ...) are the same CUDA functions CuPy's ufuncs call. (NaN payloads
# aside: CuPy's maximum/minimum may return a canonical NaN where the fused kernel returns
# the operand's NaN; both are NaN.) The one function that does not follow: CUDA's double pow
# is compiled code of its own whose rounding depends on the contraction, so a fused one can
# differ from CuPy's power kernel (compiled with contraction) in the last bit; float64
# powers (pow, and integer_pow other than squares) are never fused (CExpression.unfused).
COMPILE_OPTIONS = ("--fmad=false",)


_no_device = contextlib.nullcontext


class FusedKernelWarning(RuntimeWarning):
    """A fused kernel could not be built or run; its equations run one by one instead."""


@functools.lru_cache(maxsize=1024)
def elementwise_kernel(in_params, out_params, operation, name):
    """The CuPy ``ElementwiseKernel`` of these pieces (compiled on its first call, and
    cached by CuPy on disk). NVRTC, which compiles it, is preloaded from the
    ``nvidia-cuda-nvrtc`` wheel first (NOTE [preloading the CUDA wheels] in
    cuvmap/cuda/libs.py; once per process)."""
    libs.preload(libs.NVRTC)
    cp = backend.cupy_module()
    return cp.ElementwiseKernel(in_params, out_params, operation, name,
                                options=COMPILE_OPTIONS, return_tuple=True)


def fused_elementwise(source, out_shape, out_dtypes, fallback):
    """A callable ``(*inputs) -> tuple of outputs`` that runs the kernel of ``source``
    (``(in_params, out_params, operation, name)``) into fresh arrays of ``out_shape`` and
    ``out_dtypes``; if the kernel cannot be compiled or launched, it warns once
    (:class:`FusedKernelWarning`) and calls ``fallback(*inputs)`` from then on."""
    state = {"failed": False}
    lock = threading.Lock()

    def run(*inputs):
        if not state["failed"]:
            cp = backend.cupy_module()
            try:
                kernel = elementwise_kernel(*source)
                device = next((x.device for x in inputs if type(x) is cp.ndarray), None)
                with device if device is not None else _no_device():  # the operands' GPU
                    outs = [cp.empty(out_shape, dtype) for dtype in out_dtypes]
                    return kernel(*inputs, *outs)
            except MemoryError:  # CuPy's OutOfMemoryError: the fallback would need memory too
                raise
            except Exception as err:  # compilation (CompileException) or launch failure
                with lock:
                    first = not state["failed"]
                    state["failed"] = True
                if first:
                    warnings.warn(f"jit: the fused kernel {source[3]} failed ({type(err).__name__}: {err}); "
                                  "its equations run one by one", FusedKernelWarning, stacklevel=2)
        return fallback(*inputs)

    run.source = source
    return run


# NOTE [threefry in one kernel]
# cuvmap.lax.prng's hash as uint32 ufuncs is about 125 kernel launches per draw on the
# GPU. There it runs as one ElementwiseKernel whose body prng generates from its own
# rotation table (threefry2x32_body), writing both words of each pair into one interleaved
# (..., 2) array. A kernel that fails to compile warns once and returns None, and the
# impl runs the ufuncs instead (the same bits either way).
_threefry = {"failed": False}


def threefry2x32(body, k0, k1, x0, x1):
    """The Threefry-2x32 words of broadcast uint32 CuPy arrays ``k0, k1, x0, x1`` (one
    kernel: ``body`` from :func:`cuvmap.lax.prng.threefry2x32_body`) as one array of
    shape ``broadcast + (2,)``, or None when the kernel cannot be built (warned once)."""
    if _threefry["failed"]:
        return None
    cp = backend.cupy_module()
    try:
        kernel = elementwise_kernel("uint32 k0, uint32 k1, uint32 x0, uint32 x1", "uint32 y0, uint32 y1",
                                    body, "cuvmap_threefry2x32")
        shape = cp.broadcast_shapes(k0.shape, k1.shape, x0.shape, x1.shape)
        out = cp.empty(shape + (2,), dtype=cp.uint32)
        kernel(k0, k1, x0, x1, out[..., 0], out[..., 1])
        return out
    except MemoryError:
        raise
    except Exception as err:  # compilation or launch
        _threefry["failed"] = True
        warnings.warn(f"random: the threefry kernel failed ({type(err).__name__}: {err}); the hash runs as "
                      "separate kernels", FusedKernelWarning, stacklevel=3)
        return None
