"""The derivative rules of cuvmap.scipy.linalg.sqrtm and solve_sylvester (autograd's; JAX's
have none): dX = solve_sylvester(X, X, dA) and A dX + dX B = dC − dA X − X dB, checked against
finite differences (first and second order, every composition of modes) on rows of real,
complex and stacked matrices, and against the defining identities."""
import numpy as np
import pytest

import cuvmap as cv
from cuvmap import numpy as cnp
from cuvmap.scipy import linalg as sla
from cuvmap.test_util import check_batching, check_grads

RNG = np.random.default_rng(21)
M3 = RNG.standard_normal((3, 3))
SPD = M3 @ M3.T + np.eye(3)
STACK = RNG.standard_normal((2, 4, 4))
COMPLEX = RNG.standard_normal((3, 3)) + 1j * RNG.standard_normal((3, 3))


def _sym(a):
    return 0.5 * (a + cnp.swapaxes(a, -1, -2))


SQRTM_ROWS = [  # (name, function of A, A)
    ("spd", lambda a: sla.sqrtm(_sym(a)), SPD),
    ("symmetric_indefinite", lambda a: sla.sqrtm(_sym(a)), M3),  # a complex root of a real matrix
    ("general", sla.sqrtm, M3 + 3 * np.eye(3)),
    ("stack", sla.sqrtm, STACK + 4 * np.eye(4)),
    ("complex", sla.sqrtm, COMPLEX + 3 * np.eye(3)),
]
SYLVESTER_ROWS = [  # (name, A, B, C)
    ("real", M3, RNG.standard_normal((3, 3)), RNG.standard_normal((3, 3))),
    ("rectangular", M3, RNG.standard_normal((2, 2)), RNG.standard_normal((3, 2))),
    ("stack", STACK + 3 * np.eye(4), RNG.standard_normal((2, 4, 4)) + 3 * np.eye(4), RNG.standard_normal((2, 4, 4))),
    ("complex", COMPLEX, RNG.standard_normal((3, 3)), RNG.standard_normal((3, 3)) + 0j),
]


@pytest.mark.parametrize("name,f,a", SQRTM_ROWS, ids=[r[0] for r in SQRTM_ROWS])
def test_sqrtm_derivatives(name, f, a):
    check_grads(f, (a,), order=1, modes=("fwd", "rev"))
    check_grads(f, (a,), order=2, modes=("fwd",))
    t = RNG.standard_normal(a.shape).astype(a.dtype)
    check_grads(lambda x: cv.jvp(f, (x,), (t,))[1], (a,), order=1, modes=("rev",))
    # X dX + dX X = dA for the symmetrized tangent
    x, dx = cv.jvp(f, (a,), (t,))
    dA = t if name not in ("spd", "symmetric_indefinite") else 0.5 * (t + np.swapaxes(t, -1, -2))
    np.testing.assert_allclose(x @ dx + dx @ x, dA, atol=1e-10)


@pytest.mark.parametrize("name,a,b,c", SYLVESTER_ROWS, ids=[r[0] for r in SYLVESTER_ROWS])
def test_solve_sylvester_derivatives(name, a, b, c):
    check_grads(sla.solve_sylvester, (a, b, c), order=1, modes=("fwd", "rev"))
    check_grads(sla.solve_sylvester, (a, b, c), order=2, modes=("fwd",))
    dtype = np.result_type(a, b, c)  # the primals' common dtype (solve_sylvester's)
    a, b, c = (np.asarray(v, dtype) for v in (a, b, c))
    tangents = tuple(RNG.standard_normal(np.shape(v)).astype(dtype) for v in (a, b, c))
    check_grads(lambda *v: cv.jvp(sla.solve_sylvester, v, tangents)[1], (a, b, c), order=1, modes=("rev",))
    x, dx = cv.jvp(sla.solve_sylvester, (a, b, c), tangents)
    da, db, dc = tangents
    np.testing.assert_allclose(a @ dx + dx @ b, dc - da @ x - x @ db, atol=1e-10)
    batched = tuple(np.stack([v, 1.01 * v]) for v in (a, b, c))
    check_batching(lambda *v: cv.jvp(sla.solve_sylvester, v, tangents)[1], batched, atol=1e-10, rtol=1e-10)
    g = cv.jit(cv.grad(lambda c: cnp.sum(cnp.real(sla.solve_sylvester(a, b, c)))))(c)
    np.testing.assert_allclose(g, cv.grad(lambda c: cnp.sum(cnp.real(sla.solve_sylvester(a, b, c))))(c), rtol=1e-13)


@pytest.mark.parametrize("name,f,a", SQRTM_ROWS[:3], ids=[r[0] for r in SQRTM_ROWS[:3]])
def test_sqrtm_second_order_in_every_mode(name, f, a):
    check_grads(f, (a,), order=2, modes=("fwd", "rev"))


def test_sylvester_second_order_in_every_mode():
    _, a, b, c = SYLVESTER_ROWS[0]
    check_grads(sla.solve_sylvester, (a, b, c), order=2, modes=("fwd", "rev"))
    check_grads(lambda c: sla.solve_sylvester(a, b, c, method="eigen"), (c,), order=1, modes=("fwd", "rev"))
