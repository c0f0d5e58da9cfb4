"""What the dense linear-algebra tests share (tests/linalg/test_householder.py,
tests/linalg/test_eig.py, tests/scipy/test_matrix_functions.py): the four LAPACK dtypes,
random general matrices of each, and the conjugate transpose ``Aᴴ`` of a stack."""
import numpy as np

LINALG_DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def random_matrix(rng, shape, dtype):
    """A standard normal array of ``shape`` in ``dtype``; complex dtypes get an independent
    standard normal imaginary part."""
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def adjoint(x):
    """``Aᴴ`` of each matrix of a stack ``(..., m, n) -> (..., n, m)``."""
    return np.conj(np.swapaxes(x, -1, -2))


def tridiagonal_matrix(dl, d, du):
    """The dense ``(..., m, m)`` matrix of LAPACK's tridiagonal bands: ``d`` on the
    diagonal, ``dl[..., 1:]`` below it and ``du[..., :-1]`` above it (``dl[..., 0]`` and
    ``du[..., -1]`` are unused, as in ``lax.linalg.tridiagonal_solve``)."""
    m = d.shape[-1]
    out = np.zeros(d.shape + (m,), dtype=d.dtype)
    i = np.arange(m)
    out[..., i, i] = d
    out[..., i[1:], i[:-1]] = dl[..., 1:]
    out[..., i[:-1], i[1:]] = du[..., :-1]
    return out
