"""Window functions for spectral analysis, as ``jax.numpy`` names them: ``bartlett``,
``blackman``, ``hamming``, ``hanning`` and ``kaiser``. Each is a closed form of
``n = 0, ..., M - 1`` in :mod:`cuvmap.lax` elementwise primitives, in
``cuvmap.config.default_float`` (JAX's default float: float32 unless 64-bit mode is on);
``kaiser`` is differentiable in ``beta``, which may be traced. ``M`` is a static int, and
``M <= 1`` gives ``ones(M)``, as in NumPy."""
import numpy as np

from cuvmap import config, core
from cuvmap.core import ConcretizationError, Tracer
from cuvmap.lax import elementwise as ew
from cuvmap.lax import indexing as lax_indexing
from cuvmap.core.bfloat16 import kind_of


def _count(M, name):  # noqa: N803 - NumPy's name
    if isinstance(M, Tracer):
        raise ConcretizationError(f"{name}: the window size M must be a static int, got a traced value")
    return max(int(M), 0)


def _positions(M, name, dtype=None, like=None):  # noqa: N803 - NumPy's name
    """``(n, ones)``: ``n = 0, ..., M - 1`` in ``dtype`` (the default float dtype) on the
    device of ``like`` (the host without one), or the window of ones for ``M <= 1`` (``n``
    is then ``None``)."""
    m = _count(M, name)
    dtype = config.default_float if dtype is None else dtype
    if m <= 1:
        return None, np.ones(m, dtype)
    return ew.convert_element_type(lax_indexing.iota(m, like=like), dtype), None


def bartlett(M):  # noqa: N803 - NumPy's name
    """``jnp.bartlett``: the triangular window ``w[n] = 1 − |2n − M + 1| / (M − 1)``."""
    n, ones = _positions(M, "bartlett")
    if n is None:
        return ones
    return ew.sub(1, ew.div(ew.abs(ew.add(ew.mul(n, 2), 1 - M)), M - 1))


def blackman(M):  # noqa: N803 - NumPy's name
    """``jnp.blackman``: ``w[n] = 0.42 − 0.5 cos(2πn / (M − 1)) + 0.08 cos(4πn / (M − 1))``."""
    n, ones = _positions(M, "blackman")
    if n is None:
        return ones
    phase = ew.mul(n, 2 * np.pi / (M - 1))
    return ew.add(ew.sub(0.42, ew.mul(0.5, ew.cos(phase))), ew.mul(0.08, ew.cos(ew.mul(phase, 2))))


def hamming(M):  # noqa: N803 - NumPy's name
    """``jnp.hamming``: ``w[n] = 0.54 − 0.46 cos(2πn / (M − 1))``."""
    n, ones = _positions(M, "hamming")
    if n is None:
        return ones
    return ew.sub(0.54, ew.mul(0.46, ew.cos(ew.mul(n, 2 * np.pi / (M - 1)))))


def hanning(M):  # noqa: N803 - NumPy's name
    """``jnp.hanning``: the Hann window ``w[n] = 0.5 − 0.5 cos(2πn / (M − 1))``."""
    n, ones = _positions(M, "hanning")
    if n is None:
        return ones
    return ew.mul(0.5, ew.sub(1, ew.cos(ew.mul(n, 2 * np.pi / (M - 1)))))


def _i0(x):
    """The modified Bessel function ``I₀(x) = e^{|x|} · i0e(x)``."""
    return ew.mul(ew.exp(ew.abs(x)), ew.bessel_i0e(x))


def kaiser(M, beta):  # noqa: N803 - NumPy's name
    """``jnp.kaiser``: ``w[n] = I₀(β √(1 − ((n − α) / α)²)) / I₀(β)`` with ``α = (M − 1) / 2``
    and ``I₀`` the modified Bessel function of order 0 (``e^{|x|}`` times
    ``lax.bessel_i0e``). Differentiable in ``beta``."""
    beta = beta if isinstance(beta, Tracer) or hasattr(beta, "dtype") else np.asarray(beta, config.default_float)
    # the positions in beta's precision where it is the wider (float64 beta, float32 default)
    dtype = np.result_type(config.default_float, core.dtype_of(beta))
    n, ones = _positions(M, "kaiser", dtype if kind_of(dtype) == "f" else None, like=beta)
    if n is None:
        return ones
    alpha = 0.5 * (M - 1)
    ratio = ew.div(ew.sub(n, alpha), alpha)
    radius = ew.sqrt(ew.max(ew.sub(1, ew.mul(ratio, ratio)), 0))
    return ew.div(_i0(ew.mul(beta, radius)), _i0(beta))
