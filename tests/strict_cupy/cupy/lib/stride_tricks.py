"""``cupy.lib.stride_tricks`` of the strict CuPy stand-in."""
import numpy as np

from cupy._functions import _function

as_strided = _function("as_strided", np.lib.stride_tricks.as_strided, module="cupy.lib.stride_tricks")
