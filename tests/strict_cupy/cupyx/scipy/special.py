"""``cupyx.scipy.special`` of the strict CuPy stand-in: SciPy's ufuncs as stand-in ufuncs
(SciPy comes with the test extras, through scikit-learn; without it the module is empty)."""
import numpy as _np

try:
    import scipy.special as _sp
except ImportError:  # pragma: no cover - the test extras bring SciPy
    _sp = None

from cupy._functions import ufunc

for _name in ("erf", "erfinv", "erfc", "gammaln", "digamma", "gammainc", "gammaincc", "i0e", "i1e"):  # NOTE [the stand-in's surface] in cupy/_functions.py
    if isinstance(getattr(_sp, _name, None), _np.ufunc):
        globals()[_name] = ufunc(getattr(_sp, _name), _name, module="cupyx.scipy.special")
