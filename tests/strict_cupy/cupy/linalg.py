"""``cupy.linalg`` of the stand-in: cuSOLVER's factorisations and solvers (refused during
capture), cuBLAS's products, and the norms (CuPy's reductions; the matrix 2-norm and the
nuclear norm take an SVD)."""
import numpy as np

from cupy._functions import _float_gemm, _function

_SOLVER = ("svd", "eigh", "eigvalsh", "eig", "eigvals", "qr", "cholesky", "inv", "pinv", "solve", "lstsq", "det",
           "slogdet", "matrix_rank", "tensorinv", "tensorsolve")

for _name in _SOLVER:
    globals()[_name] = _function(_name, getattr(np.linalg, _name), library="cusolver", module="cupy.linalg")


def _norm_library(x, ord=None, axis=None, keepdims=False):
    two_dims = (axis is None and getattr(x, "ndim", 0) == 2) or (isinstance(axis, tuple) and len(axis) == 2)
    return "cusolver" if two_dims and ord in (2, -2, "nuc") else None


norm = _function("norm", np.linalg.norm, library=_norm_library, module="cupy.linalg")
multi_dot = _function("multi_dot", np.linalg.multi_dot, library=lambda arrays, **kw: _float_gemm(*arrays),
                      module="cupy.linalg")
matmul = _function("matmul", np.linalg.matmul, library=_float_gemm, module="cupy.linalg")
matrix_power = _function("matrix_power", np.linalg.matrix_power, library=_float_gemm, module="cupy.linalg")

__all__ = list(_SOLVER) + ["norm", "multi_dot", "matmul", "matrix_power"]
