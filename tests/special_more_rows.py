"""Rows for the generic op tests (``tests/lax/test_ops.py``, ``tests/jit/test_jit.py``) of the
primitives of ``cuvmap/lax/elementwise/special_more.py`` (``regularized_incomplete_beta``,
``bessel_jn``, ``bessel_yn``, ``bessel_ive``) and ``cuvmap/lax/linalg_sylvester.py``
(``sylvester``): each against an independent reference (series, integral representations by
the trapezoidal rule, a Kronecker-product solve), finite differences (``grad`` forward and
reverse, float64, in the operands with derivatives), a loop (``vmap`` over each operand) and
``jit``. ``op_table.PRIMITIVE_ROWS`` includes them; the special values, ranges and closed
forms are checked in ``tests/scipy/test_bessel_betainc.py`` and
``tests/scipy/test_sylvester_derivatives.py``."""

import numpy as np

from cuvmap import backend, core
from cuvmap.lax.elementwise import special_more
from cuvmap.lax import linalg_sylvester

from bessel_references import betainc_series_one, ive_one, jn_one, yn_one


def _shifted(a, by):
    """``a + by·I``: well separated eigenvalues for the Sylvester rows (no aᵢ + bⱼ near 0)."""
    eye = backend.xp_of(a).asarray(by * np.eye(core.shape_of(a)[-1]), dtype=core.dtype_of(a))  # on a's device
    return a + eye


def _sylvester_ref(a, b, c):
    a = a + 4 * np.eye(a.shape[-1])
    b = b + 4 * np.eye(b.shape[-1])
    m, n = c.shape[-2:]
    out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2], c.shape[:-2]) + (m, n), np.float64)
    for idx in np.ndindex(out.shape[:-2]):
        k = np.kron(np.eye(n), a[idx]) + np.kron(b[idx].T, np.eye(m))  # vec(AX + XB), column-major
        out[idx] = np.linalg.solve(k, c[idx].reshape(-1, order="F")).reshape((m, n), order="F")
    return out.astype(c.dtype)


def rows():
    """The rows of the special_more and sylvester primitives."""
    # op_table builds its PRIMITIVE_ROWS from this function (a documented cycle: imported here)
    from op_table import A, _math_ref, prim_row
    return [
        prim_row("betainc", special_more.regularized_incomplete_beta_p, {},
                 # x in (0.2, 0.8): "positive" operands scaled by 1/2.5
                 lambda a, b, x: special_more.betainc(a, b, x / 2.5),
                 _math_ref(lambda a, b, x: betainc_series_one(a, b, x / 2.5)),
                 [A(3, 4, domain="positive"), A(4, domain="positive"), A(3, 4, domain="positive")],
                 tol64=(1e-12, 1e-14), diff_argnums=(2,)),
        prim_row("bessel_jn", special_more.bessel_jn_p, {}, special_more.bessel_jn, _math_ref(jn_one),
                 [A(3, 4, domain="ints"), A(3, 4, domain="positive")], tol64=(1e-13, 1e-15), diff_argnums=(1,)),
        prim_row("bessel_yn", special_more.bessel_yn_p, {}, special_more.bessel_yn, _math_ref(yn_one),
                 [A(3, 4, domain="ints"), A(3, 4, domain="positive")], tol64=(1e-11, 1e-13), diff_argnums=(1,),
                 grad_tol=1e-4),
        prim_row("bessel_ive", special_more.bessel_ive_p, {}, special_more.bessel_ive, _math_ref(ive_one),
                 [A(3, 4, domain="positive"), A(4, domain="positive")], tol64=(1e-13, 1e-15), diff_argnums=(1,)),
        prim_row("sylvester", linalg_sylvester.sylvester_p, {"tol": 1e-8},
                 lambda a, b, c: linalg_sylvester.sylvester(_shifted(a, 4.0), _shifted(b, 4.0), c), _sylvester_ref,
                 [A(2, 3, 3), A(2, 2, 2), A(2, 3, 2)], tol32=(1e-4, 1e-5), tol64=(1e-12, 1e-13)),
    ]
