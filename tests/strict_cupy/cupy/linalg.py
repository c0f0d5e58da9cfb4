"""``cupy.linalg`` of the stand-in: the SVD (cuSOLVER, refused during capture) and the norms
(CuPy's reductions; the matrix 2-norm and the nuclear norm take an SVD). NOTE [the
stand-in's surface] in cupy/_functions.py."""
import numpy as np

from cupy._functions import _function

svd = _function("svd", np.linalg.svd, library="cusolver", module="cupy.linalg")


def _norm_library(x, ord=None, axis=None, keepdims=False):
    two_dims = (axis is None and getattr(x, "ndim", 0) == 2) or (isinstance(axis, tuple) and len(axis) == 2)
    return "cusolver" if two_dims and ord in (2, -2, "nuc") else None


norm = _function("norm", np.linalg.norm, library=_norm_library, module="cupy.linalg")

# the solvers and decompositions of cuvmap/lax/linalg_solve.py and linalg_decompositions.py
# (cuSOLVER's getrf/getrs, potrf, syevd, geqrf; CuPy batches them over leading dims)
solve = _function("solve", np.linalg.solve, library="cusolver", module="cupy.linalg")
inv = _function("inv", np.linalg.inv, library="cusolver", module="cupy.linalg")
det = _function("det", np.linalg.det, library="cusolver", module="cupy.linalg")
slogdet = _function("slogdet", np.linalg.slogdet, library="cusolver", module="cupy.linalg")
cholesky = _function("cholesky", np.linalg.cholesky, library="cusolver", module="cupy.linalg")
eigh = _function("eigh", np.linalg.eigh, library="cusolver", module="cupy.linalg")
qr = _function("qr", np.linalg.qr, library="cusolver", module="cupy.linalg")

__all__ = ["svd", "norm", "solve", "inv", "det", "slogdet", "cholesky", "eigh", "qr"]
