"""Complex numbers: ``real``, ``imag``, ``conj``/``conjugate``, ``angle``, the predicates
``iscomplexobj``, ``isrealobj``, ``iscomplex``, ``isreal``, ``real_if_close`` and the
dtypes ``complex64``/``complex128`` (jax.numpy's names), and the tracers' ``.real``,
``.imag``, ``.conj()`` and ``.conjugate()``. Derivatives follow NOTE [complex convention]
(cuvmap/transforms/complex_rules.py); docs/complex.md lists what supports complex inputs.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.transforms.jvp import zeros_like
from cuvmap.core.bfloat16 import kind_of

complex64 = np.complex64
complex128 = np.complex128


def iscomplexobj(x):
    """Whether ``x`` has a complex dtype (``numpy.iscomplexobj``: the dtype, not the values)."""
    return kind_of(core.dtype_of(x)) == "c"


def isrealobj(x):
    """Whether ``x`` has a dtype that is not complex (``numpy.isrealobj``)."""
    return not iscomplexobj(x)


def real(val):
    """The real part ``re(z)`` of each element (``jax.numpy.real``); a real ``val`` is
    returned as it is. Derivative: ``re(ż)``; the cotangent of a complex ``z`` is
    ``complex(ct, 0)``."""
    return ew.real(val) if iscomplexobj(val) else val


def imag(val):
    """The imaginary part ``im(z)`` of each element (``jax.numpy.imag``); zeros of ``val``'s
    dtype for a real ``val``. Derivative: ``im(ż)``; the cotangent of a complex ``z`` is
    ``complex(0, −ct)`` (NOTE [complex convention])."""
    if iscomplexobj(val):
        return ew.imag(val)
    return zeros_like(val)


def conjugate(x):
    """The complex conjugate ``x − iy`` of each element ``x + iy`` (``jax.numpy.conjugate``);
    a real ``x`` is returned as it is. Derivative and transpose: the conjugate."""
    return ew.conj(x) if iscomplexobj(x) else x


conj = conjugate


def angle(z, deg=False):
    """The argument of each element, ``atan2(im(z), re(z))`` in ``(−π, π]``, in degrees with
    ``deg=True`` (``jax.numpy.angle``); 0 or π for real elements, in float64 for integers.
    Derivative: ``im(conj(z)·ż) / |z|²`` (NaN at 0, where the angle jumps)."""
    out = ew.angle(z)
    return ew.mul(out, 180 / np.pi) if deg else out


def iscomplex(x):
    """Elementwise ``im(x) != 0`` (``numpy.iscomplex``: False everywhere for a real dtype)."""
    return ew.ne(imag(x), 0)


def isreal(x):
    """Elementwise ``im(x) == 0`` (``numpy.isreal``: True everywhere for a real dtype)."""
    return ew.eq(imag(x), 0)


def real_if_close(a, tol=100):
    """``real(a)`` when every imaginary part is within ``tol`` machine epsilons of 0 (a
    ``tol`` below 1 is an absolute tolerance), else ``a`` (``numpy.real_if_close``). Its
    result's dtype depends on the values, so ``a`` must be concrete: under a transform it
    raises, as in JAX."""
    if not iscomplexobj(a):
        return a
    if isinstance(a, Tracer):
        raise core.ConcretizationError(
            "real_if_close: the result's dtype depends on the values of a traced array; call it outside the "
            "transform, or use real")
    value = backend.concrete(a)
    xp = backend.xp_of(value)
    if tol > 1:
        tol = np.finfo(value.dtype).eps * tol
    return ew.real(value) if bool(xp.all(xp.abs(value.imag) < tol)) else a


Tracer.real = property(real)
Tracer.imag = property(imag)
Tracer.conj = conjugate
Tracer.conjugate = conjugate
