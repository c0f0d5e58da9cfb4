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

__all__ = ["svd", "norm"]
