"""Complex numbers under NOTE [complex convention] (cuvmap/transforms/complex_rules.py), in
complex128: a table of elementwise functions (each with its input domain, whether it is
holomorphic, and its closed-form derivative where one is short) checked under jvp, vjp,
grad (holomorphic=True where it applies), jacfwd/jacrev, vmap and jit against closed forms
and Wirtinger finite differences (cuvmap.test_util.wirtinger_derivatives); then the
reductions, dot_general, the transforms and control flow on complex values, real inputs
through complex intermediates, JAX's dtype errors, and the refusal of the primitives that
have no complex rule.
"""
from dataclasses import dataclass

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import lax
from cuvmap import numpy as cnp
from cuvmap.core import MissingRuleError
from cuvmap.test_util import check_batching, check_grads, wirtinger_derivatives
from cuvmap.transforms import complex_rules

C128 = np.complex128
TOL = 1e-7  # finite differences (eps 1e-5) against exact rules
EPS = 1e-5


def _points(domain, shape=(6,), seed=0):
    """``plane``: both parts standard normal; ``right``: re in [0.3, 2], |im| ≤ 1.5 (away
    from the branch cuts of log, sqrt, pow, log1p, atan and asinh); ``nonzero``: |z| in
    [0.5, 2] (away from the kinks of abs, sign and angle); ``disk`` and ``upper``: below."""
    rng = np.random.default_rng(seed)
    if domain == "plane":
        return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    if domain == "right":
        return rng.uniform(0.3, 2.0, shape) + 1j * rng.uniform(-1.5, 1.5, shape)
    if domain == "nonzero":
        return rng.uniform(0.5, 2.0, shape) * np.exp(1j * rng.uniform(-3.0, 3.0, shape))
    if domain == "disk":  # |z| < 0.9: inside the branch points ±1 of asin, acos, atanh; tan's poles ±π/2 away
        return rng.uniform(0.0, 0.9, shape) * np.exp(1j * rng.uniform(-3.0, 3.0, shape))
    if domain == "upper":  # im z in [0.3, 1.5]: off acosh's cut (−∞, 1], re z < 0 included
        return rng.uniform(-2.0, 2.0, shape) + 1j * rng.uniform(0.3, 1.5, shape)
    raise ValueError(domain)


W = np.array([0.7 - 0.2j, -1.1 + 0.4j, 0.3 + 0.9j, 1.2 + 0.1j, -0.5 - 0.6j, 0.8 + 0.8j])


@dataclass(frozen=True)
class Case:
    """One elementwise function of complex ``z``: ``fun`` (cuvmap), ``ref`` (NumPy), the
    input ``domain``, whether it is ``holomorphic``, and ``derivative``: the closed-form
    ``f'(z)`` of a holomorphic function, or the Wirtinger pair ``(∂f/∂z, ∂f/∂z̄)`` of
    another (None: finite differences alone)."""

    name: str
    fun: object
    ref: object
    domain: str = "plane"
    holomorphic: bool = True
    derivative: object = None


CASES = [
    Case("neg", cnp.negative, np.negative, derivative=lambda z: -np.ones_like(z)),
    Case("add", lambda z: z + W, lambda z: z + W, derivative=lambda z: np.ones_like(z)),
    Case("sub_left", lambda z: W - z, lambda z: W - z, derivative=lambda z: -np.ones_like(z)),
    Case("mul", lambda z: z * W, lambda z: z * W, derivative=lambda z: W + 0 * z),
    Case("mul_self", lambda z: z * z, lambda z: z * z, derivative=lambda z: 2 * z),
    Case("div", lambda z: W / z, lambda z: W / z, "nonzero", derivative=lambda z: -W / z ** 2),
    Case("div_by_constant", lambda z: z / W, lambda z: z / W, derivative=lambda z: 1 / W + 0 * z),
    Case("integer_pow_2", lambda z: z ** 2, lambda z: z ** 2, derivative=lambda z: 2 * z),
    Case("integer_pow_3", lambda z: lax.integer_pow(z, 3), lambda z: z ** 3, derivative=lambda z: 3 * z ** 2),
    Case("integer_pow_-2", lambda z: lax.integer_pow(z, -2), lambda z: z ** -2.0, "nonzero",
         derivative=lambda z: -2 * z ** -3.0),
    Case("square", cnp.square, np.square, derivative=lambda z: 2 * z),
    Case("reciprocal", cnp.reciprocal, np.reciprocal, "nonzero", derivative=lambda z: -1 / z ** 2),
    Case("pow_complex_exponent", lambda z: cnp.power(z, 1.5 - 0.5j), lambda z: z ** (1.5 - 0.5j), "right",
         derivative=lambda z: (1.5 - 0.5j) * z ** (0.5 - 0.5j)),
    Case("pow_complex_base", lambda z: cnp.power(0.8 + 0.6j, z), lambda z: (0.8 + 0.6j) ** z,
         derivative=lambda z: np.log(0.8 + 0.6j) * (0.8 + 0.6j) ** z),
    Case("pow_self", lambda z: cnp.power(z, z), lambda z: z ** z, "right",
         derivative=lambda z: z ** z * (np.log(z) + 1)),
    Case("exp", cnp.exp, np.exp, derivative=np.exp),
    Case("log", cnp.log, np.log, "right", derivative=lambda z: 1 / z),
    Case("log1p", cnp.log1p, np.log1p, "right", derivative=lambda z: 1 / (1 + z)),
    Case("expm1", cnp.expm1, np.expm1, derivative=np.exp),
    Case("log2", cnp.log2, np.log2, "right", derivative=lambda z: 1 / (z * np.log(2))),
    Case("log10", cnp.log10, np.log10, "right", derivative=lambda z: 1 / (z * np.log(10))),
    Case("sqrt", cnp.sqrt, np.sqrt, "right", derivative=lambda z: 0.5 / np.sqrt(z)),
    Case("rsqrt", lax.rsqrt, lambda z: 1 / np.sqrt(z), "right", derivative=lambda z: -0.5 * z ** -1.5),
    Case("sin", cnp.sin, np.sin, derivative=np.cos),
    Case("cos", cnp.cos, np.cos, derivative=lambda z: -np.sin(z)),
    Case("tanh", cnp.tanh, np.tanh, derivative=lambda z: 1 / np.cosh(z) ** 2),
    Case("sinh", cnp.sinh, np.sinh, derivative=np.cosh),
    Case("cosh", cnp.cosh, np.cosh, derivative=np.sinh),
    Case("arctan", cnp.arctan, np.arctan, "right", derivative=lambda z: 1 / (1 + z ** 2)),
    Case("arcsinh", cnp.arcsinh, np.arcsinh, "right", derivative=lambda z: 1 / np.sqrt(1 + z ** 2)),
    Case("tan", cnp.tan, np.tan, "disk", derivative=lambda z: 1 / np.cos(z) ** 2),
    Case("arcsin", cnp.arcsin, np.arcsin, "disk", derivative=lambda z: 1 / np.sqrt(1 - z ** 2)),
    Case("arccos", cnp.arccos, np.arccos, "disk", derivative=lambda z: -1 / np.sqrt(1 - z ** 2)),
    Case("arctanh", cnp.arctanh, np.arctanh, "disk", derivative=lambda z: 1 / (1 - z ** 2)),
    Case("arccosh", cnp.arccosh, np.arccosh, "upper", derivative=lambda z: 1 / (np.sqrt(z - 1) * np.sqrt(z + 1))),
    Case("lax_square", lax.square, np.square, derivative=lambda z: 2 * z),
    Case("exp2", cnp.exp2, np.exp2, derivative=lambda z: np.log(2) * np.exp2(z)),
    Case("logistic", lax.logistic, lambda z: 1 / (1 + np.exp(-z)), "disk",
         derivative=lambda z: np.exp(-z) / (1 + np.exp(-z)) ** 2),
    # not holomorphic: the real-linear forms of NOTE [complex convention]
    Case("abs", cnp.abs, np.abs, "nonzero", False,
         derivative=lambda z: (np.conj(z) / (2 * abs(z)), z / (2 * abs(z)))),
    Case("abs_squared", lambda z: cnp.abs(z) ** 2, lambda z: np.abs(z) ** 2, "plane", False,
         derivative=lambda z: (np.conj(z), z)),
    Case("sign", cnp.sign, np.sign, "nonzero", False,
         derivative=lambda z: (1 / (2 * abs(z)), -z ** 2 / (2 * abs(z) ** 3))),
    Case("angle", cnp.angle, np.angle, "nonzero", False,
         derivative=lambda z: (-1j / (2 * z), 1j / (2 * np.conj(z)))),
    Case("real", cnp.real, np.real, "plane", False, derivative=lambda z: (0.5 + 0 * z, 0.5 + 0 * z)),
    Case("imag", cnp.imag, np.imag, "plane", False, derivative=lambda z: (-0.5j + 0 * z, 0.5j + 0 * z)),
    Case("conj", cnp.conj, np.conj, "plane", False, derivative=lambda z: (0 * z, 1 + 0 * z)),
    Case("real_times_z", lambda z: cnp.real(z) * z, lambda z: np.real(z) * z, "plane", False,
         derivative=lambda z: (0.5 * z + np.real(z), 0.5 * z)),
    Case("x_plus_iy_rebuilt", lambda z: lax.complex(cnp.imag(z), cnp.real(z)), lambda z: z.imag + 1j * z.real,
         "plane", False, derivative=lambda z: (0 * z, 1j + 0 * z)),
]
IDS = [c.name for c in CASES]


def _pair(case, z):
    """The Wirtinger pair ``(a, b)`` by finite differences, checked against the closed form."""
    a, b = wirtinger_derivatives(case.fun, z, eps=EPS)
    if case.derivative is not None:
        want = case.derivative(z)
        want_a, want_b = (want, 0 * z) if case.holomorphic else want
        np.testing.assert_allclose(a, want_a, rtol=TOL, atol=TOL, err_msg=f"{case.name}: ∂f/∂z, closed form")
        np.testing.assert_allclose(b, want_b, rtol=TOL, atol=TOL, err_msg=f"{case.name}: ∂f/∂z̄, closed form")
    return a, b


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_value_matches_numpy(case):
    z = _points(case.domain)
    np.testing.assert_allclose(case.fun(z), case.ref(z), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jvp_is_the_real_linear_derivative(case):
    z = _points(case.domain)
    t = _points("plane", seed=1)
    a, b = _pair(case, z)
    out, t_out = cv.jvp(case.fun, (z,), (t,))
    np.testing.assert_allclose(out, case.ref(z), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(t_out, a * t + b * np.conj(t), rtol=TOL, atol=TOL)
    assert np.asarray(t_out).dtype == np.asarray(out).dtype


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_vjp_is_the_transpose(case):
    z = _points(case.domain)
    a, b = _pair(case, z)
    out, pullback = cv.vjp(case.fun, z)
    ct = W if np.iscomplexobj(out) else np.real(W)
    (ct_z,) = pullback(ct)
    assert ct_z.dtype == C128
    np.testing.assert_allclose(ct_z, ct * a + np.conj(ct * b), rtol=TOL, atol=TOL)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grad_of_a_real_function_is_jaxs(case):
    """grad of real g(z) = re(Σ f(z)·w) is ∂g/∂x − i ∂g/∂y (2·∂g/∂z), by finite differences of g."""
    z = _points(case.domain)

    def g(z):
        return cnp.sum(cnp.real(case.fun(z) * W))

    got = cv.grad(g)(z)
    a, b = _pair(case, z)
    np.testing.assert_allclose(got, W * a + np.conj(W * b), rtol=TOL, atol=TOL)
    gx = np.array([(g(z + EPS * e) - g(z - EPS * e)) / (2 * EPS) for e in np.eye(len(z))])
    gy = np.array([(g(z + 1j * EPS * e) - g(z - 1j * EPS * e)) / (2 * EPS) for e in np.eye(len(z))])
    np.testing.assert_allclose(got, gx - 1j * gy, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(cv.jit(cv.grad(g))(z), got, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_check_grads_second_order(case):
    check_grads(case.fun, (_points(case.domain),), order=2, atol=1e-6, rtol=1e-6, eps=EPS)


HOLOMORPHIC = [c for c in CASES if c.holomorphic]


@pytest.mark.parametrize("case", HOLOMORPHIC, ids=[c.name for c in HOLOMORPHIC])
def test_holomorphic_grad_and_jacobians_are_the_complex_derivative(case):
    z = _points(case.domain)
    want = case.derivative(z)
    got = cv.grad(lambda z: cnp.sum(case.fun(z)), holomorphic=True)(z)  # elementwise: f'(z) for each z
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.diagonal(cv.jacfwd(case.fun, holomorphic=True)(z)), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.diagonal(cv.jacrev(case.fun, holomorphic=True)(z)), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_vmap_of_jvp_and_grad_match_loops(case):
    zs = _points(case.domain, shape=(3, 6), seed=2)
    ts = _points("plane", shape=(3, 6), seed=3)
    check_batching(lambda z, t: cv.jvp(case.fun, (z,), (t,))[1], (zs, ts), atol=1e-12, rtol=1e-12)
    check_batching(cv.grad(lambda z: cnp.sum(cnp.real(case.fun(z) * W))), (zs,), atol=1e-12, rtol=1e-12)


# ---------------------------------------------------------------------------------------
# The reproducers (JAX's values, float64/complex128)
# ---------------------------------------------------------------------------------------

Z = np.array([0.5 + 1.5j, -0.1 + 0.8j])
T = np.array([1.0 + 0.3j, 0.2 - 0.7j])


def test_jvp_of_abs_is_real_linear():
    np.testing.assert_allclose(cv.jvp(cnp.abs, (Z,), (T,))[1], [0.6008327554, -0.7194014606], rtol=1e-9)


def test_grad_of_abs_squared_is_twice_the_conjugate():
    np.testing.assert_allclose(cv.grad(lambda z: cnp.sum(cnp.abs(z) ** 2))(Z), [1 - 3j, -0.2 - 1.6j], rtol=1e-12)


def test_a_real_input_through_complex_values_keeps_a_real_gradient():
    g = cv.grad(lambda x: cnp.sum(cnp.abs(x * (1 + 1j))))(1.0)
    assert not np.iscomplexobj(g)
    np.testing.assert_allclose(g, np.sqrt(2), rtol=1e-12)
    x = np.array([0.3, -1.2, 2.0])
    for f in (lambda x: cnp.sum(cnp.real(cnp.exp(1j * x))), lambda x: cnp.sum(cnp.imag(lax.complex(x, x * x)))):
        g = cv.grad(f)(x)
        assert g.dtype == np.float64
    np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(cnp.real(cnp.exp(1j * x))))(x), -np.sin(x), rtol=1e-12)
    np.testing.assert_allclose(cv.grad(lambda x: cnp.sum(cnp.imag(lax.complex(x, x * x))))(x), 2 * x, rtol=1e-12)
    x32 = x.astype(np.float32)
    assert cv.grad(lambda x: cnp.sum(cnp.abs(x * (1 + 1j))))(x32).dtype == np.float32


# ---------------------------------------------------------------------------------------
# Two complex operands, the complex constructor, reductions, dot_general
# ---------------------------------------------------------------------------------------


def test_binary_operators_in_both_operands():
    z, w = _points("nonzero", seed=4), _points("nonzero", seed=5)
    for f in (cnp.multiply, cnp.divide, cnp.add, cnp.subtract):
        check_grads(f, (z, w), order=2, atol=1e-6, rtol=1e-6, eps=EPS)
    check_grads(cnp.power, (_points("right", seed=4), w), order=2, atol=1e-6, rtol=1e-6, eps=EPS)
    gz, gw = cv.grad(lambda z, w: cnp.sum(z * w), argnums=(0, 1), holomorphic=True)(z, w)
    np.testing.assert_allclose(gz, w)
    np.testing.assert_allclose(gw, z)


def test_python_complex_scalars():
    """A Python complex as the primal (weakly typed, no .dtype of its own)."""
    np.testing.assert_allclose(cv.grad(cnp.abs)(3.0 + 4.0j), 0.6 - 0.8j)
    np.testing.assert_allclose(cv.grad(cnp.real)(1.0 + 2.0j), 1.0)
    np.testing.assert_allclose(cv.grad(cnp.imag)(1.0 + 2.0j), -1.0j)
    np.testing.assert_allclose(cv.grad(lambda z: z * z, holomorphic=True)(1.0 + 2.0j), 2.0 + 4.0j)


def test_complex_from_two_reals():
    x, y = np.array([0.3, -1.0, 2.0]), np.array([1.5, 0.2, -0.7])
    out, t = cv.jvp(lax.complex, (x, y), (np.ones(3), 2 * np.ones(3)))
    np.testing.assert_array_equal(out, x + 1j * y)
    np.testing.assert_array_equal(t, np.full(3, 1 + 2j))
    _, pullback = cv.vjp(lax.complex, x, y)
    ct_x, ct_y = pullback(np.full(3, 2.0 + 3.0j))
    assert ct_x.dtype == ct_y.dtype == np.float64
    np.testing.assert_array_equal(ct_x, np.full(3, 2.0))   # re(ct)
    np.testing.assert_array_equal(ct_y, np.full(3, -3.0))  # −im(ct)
    check_grads(lax.complex, (x, y), order=2)
    np.testing.assert_array_equal(lax.complex(np.inf, 1.0), np.array(complex(np.inf, 1.0)))  # no NaN


@pytest.mark.parametrize("name,f,deriv", [
    ("sum", lambda z: cnp.sum(z), lambda z: np.ones_like(z)),
    ("mean", lambda z: cnp.mean(z), lambda z: np.full_like(z, 1 / z.size)),
    ("prod", lambda z: cnp.prod(z), lambda z: np.prod(z) / z),
    ("sum_of_cumsum", lambda z: cnp.sum(cnp.cumsum(z) * W), lambda z: np.cumsum(W[::-1])[::-1]),
    ("sum_of_cumprod", lambda z: cnp.sum(cnp.cumprod(z)),
     lambda z: np.array([sum(np.prod(z[:k + 1]) / z[j] for k in range(j, z.size)) for j in range(z.size)])),
])
def test_reductions_holomorphic(name, f, deriv):
    z = _points("nonzero", seed=6)
    np.testing.assert_allclose(cv.grad(f, holomorphic=True)(z), deriv(z), rtol=1e-10)
    check_grads(f, (z,), order=2, atol=1e-6, rtol=1e-6, eps=EPS)
    real_f = cv.grad(lambda z: cnp.real(f(z)))(z)  # the real part's gradient: the same f'(z) (a = f'/2 twice)
    np.testing.assert_allclose(real_f, deriv(z), rtol=1e-10)


def test_vdot_var_std_of_complex_numbers_match_numpy():
    z, w = _points("plane", seed=15), _points("plane", seed=16)
    np.testing.assert_allclose(cnp.vdot(z, w), np.vdot(z, w), rtol=1e-13)
    for f in ("var", "std"):
        got = getattr(cnp, f)(z)
        np.testing.assert_allclose(got, getattr(np, f)(z), rtol=1e-13)
        assert np.asarray(got).dtype == np.float64
    np.testing.assert_allclose(cv.grad(cnp.var)(z), 2 * np.conj(z - z.mean()) / z.size, rtol=1e-12)
    # the NaN-ignoring ones too (nanstd of complex numbers was 0, nanvar complex)
    zn = np.where(np.arange(z.size) == 2, np.nan, z)
    for f in ("nanvar", "nanstd"):
        got = getattr(cnp, f)(zn)
        np.testing.assert_allclose(got, getattr(np, f)(zn), rtol=1e-13)
        assert np.asarray(got).dtype == np.float64
    np.testing.assert_allclose(cv.grad(cnp.nanvar)(zn), np.nan_to_num(2 * np.conj(zn - np.nanmean(zn)) / (z.size - 1)),
                               rtol=1e-12)
    check_grads(cnp.vdot, (z, w), order=2, atol=1e-6, rtol=1e-6, eps=EPS)


def test_dot_general_has_no_conjugate_in_its_transposes():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))
    b = rng.standard_normal((4, 2)) + 1j * rng.standard_normal((4, 2))
    ga, gb = cv.grad(lambda a, b: cnp.sum(cnp.matmul(a, b)), argnums=(0, 1), holomorphic=True)(a, b)
    np.testing.assert_allclose(ga, np.ones((3, 2)) @ b.T, rtol=1e-12)
    np.testing.assert_allclose(gb, a.T @ np.ones((3, 2)), rtol=1e-12)
    check_grads(cnp.matmul, (a, b), order=2, atol=1e-6, rtol=1e-6, eps=EPS)
    # a real loss of complex matrices: ∂/∂x − i ∂/∂y of ‖a b‖²  =  2·conj(a b) bᵀ
    g = cv.grad(lambda a: cnp.sum(cnp.abs(cnp.matmul(a, b)) ** 2))(a)
    np.testing.assert_allclose(g, 2 * np.conj(a @ b) @ b.T, rtol=1e-10)
    check_batching(lambda a: cnp.matmul(a, b), (np.stack([a, 2 * a]),))


# ---------------------------------------------------------------------------------------
# The transforms
# ---------------------------------------------------------------------------------------


def test_hessian_linearize_and_jit():
    z = _points("right", seed=8)
    h = cv.hessian(lambda z: cnp.sum(z ** 3 + cnp.exp(z)), holomorphic=True)(z)
    np.testing.assert_allclose(h, np.diag(6 * z + np.exp(z)), rtol=1e-10, atol=1e-12)
    h, aux = cv.hessian(lambda z: (cnp.sum(z ** 3), z * 2), has_aux=True, holomorphic=True)(z)
    np.testing.assert_allclose(h, np.diag(6 * z), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(aux, 2 * z)
    out, f_jvp = cv.linearize(lambda z: cnp.log(z) * z, z)
    t = _points("plane", seed=9)
    np.testing.assert_allclose(f_jvp(t), (np.log(z) + 1) * t, rtol=1e-10)
    f = lambda z: cnp.sum(cnp.abs(cnp.sin(z)) ** 2)  # noqa: E731
    np.testing.assert_allclose(cv.jit(cv.grad(f))(z), cv.grad(f)(z), rtol=1e-12)
    np.testing.assert_allclose(cv.grad(cv.jit(f))(z), cv.grad(f)(z), rtol=1e-12)
    np.testing.assert_allclose(cv.jvp(cv.jit(cnp.abs), (z,), (t,))[1], cv.jvp(cnp.abs, (z,), (t,))[1], rtol=1e-12)
    np.testing.assert_allclose(cv.grad(f)(z), 2 * np.conj(np.sin(z)) * np.cos(z), rtol=1e-10)


def test_control_flow_with_complex_carries():
    z = _points("right", shape=(3,), seed=10)

    def scanned(z):
        def body(c, x):
            c = c * x + 0.1j
            return c, cnp.abs(c)
        c, ys = lax.scan(body, z, cnp.stack([z, 2 * z]))
        return cnp.sum(cnp.abs(c) ** 2) + cnp.sum(ys)

    def branched(z):
        return lax.cond(True, lambda z: cnp.sum(cnp.abs(z * z)), lambda z: cnp.sum(cnp.abs(z)), z)

    def looped(z):
        return cnp.sum(cnp.abs(lax.fori_loop(0, 3, lambda i, c: c * z, cnp.ones_like(z))) ** 2)

    for f in (scanned, branched, looped):
        check_grads(f, (z,), order=1, atol=1e-6, rtol=1e-6, eps=EPS)
        np.testing.assert_allclose(cv.jit(cv.grad(f))(z), cv.grad(f)(z), rtol=1e-12)
        assert cv.grad(f)(z).dtype == C128
    np.testing.assert_allclose(cv.grad(looped)(z), 6 * np.conj(z ** 3) * z ** 2, rtol=1e-10)


# ---------------------------------------------------------------------------------------
# JAX's dtype errors and the primitives without complex rules
# ---------------------------------------------------------------------------------------


def test_grad_of_a_complex_output_needs_holomorphic():
    with pytest.raises(TypeError, match="grad requires real-valued outputs.*complex128.*holomorphic=True"):
        cv.grad(lambda z: z * z)(1.0 + 2.0j)
    with pytest.raises(TypeError, match="value_and_grad requires real-valued outputs"):
        cv.value_and_grad(lambda z: z * z)(1.0 + 2.0j)
    with pytest.raises(TypeError, match="jacrev requires real-valued outputs"):
        cv.jacrev(lambda z: z * z)(Z)
    np.testing.assert_allclose(cv.grad(lambda z: z * z, holomorphic=True)(1.0 + 2.0j), 2.0 + 4.0j)


def test_holomorphic_needs_complex_inputs_and_outputs():
    with pytest.raises(TypeError, match="grad with holomorphic=True requires inputs with complex dtype.*float64"):
        cv.grad(lambda x: x * x, holomorphic=True)(1.0)
    with pytest.raises(TypeError, match="requires outputs with complex dtype.*float64"):
        cv.grad(lambda z: cnp.abs(z), holomorphic=True)(1.0 + 1.0j)
    with pytest.raises(TypeError, match="jacfwd with holomorphic=True requires inputs with complex dtype"):
        cv.jacfwd(lambda x: x, holomorphic=True)(np.ones(2))
    with pytest.raises(TypeError, match="jacrev with holomorphic=True requires outputs with complex dtype"):
        cv.jacrev(cnp.abs, holomorphic=True)(Z)


def test_jacfwd_needs_real_inputs_unless_holomorphic():
    with pytest.raises(TypeError, match="jacfwd requires real-valued inputs.*complex128"):
        cv.jacfwd(cnp.abs)(Z)
    # reverse mode takes complex inputs of a real function: rows are JAX's gradients
    np.testing.assert_allclose(cv.jacrev(cnp.abs)(Z), np.diag(np.conj(Z) / np.abs(Z)), rtol=1e-12)


def test_a_primitive_without_complex_rules_raises_naming_it_and_the_dtype():
    z = _points("plane", seed=11)
    clamped = lambda z: lax.clamp(-1.0 + 0j, z, 1.0 + 0j)  # noqa: E731 - computes, has no complex rule
    with pytest.raises(MissingRuleError, match="clamp has no JVP rule for complex numbers.*complex128"):
        cv.jvp(clamped, (z,), (z,))
    with pytest.raises(MissingRuleError, match="clamp has no VJP rule for complex numbers.*complex128"):
        cv.grad(lambda z: cnp.sum(cnp.abs(clamped(z))))(z)
    with pytest.raises(MissingRuleError, match="atan2 has no VJP rule for complex numbers.*complex64"):
        complex_rules.check(lax.elementwise.atan2_p, np.zeros(2, np.complex64), [], "VJP")


@pytest.mark.parametrize("f", [cnp.erf, lax.erf_inv], ids=["erf", "erf_inv"])
def test_erf_of_complex_numbers_raises_instead_of_dropping_the_imaginary_part(f):
    z = np.array([0.5 + 1.0j])
    with pytest.raises(TypeError, match="must be real, got complex128"):
        f(z)
    with pytest.raises(TypeError, match="must be real, got complex128"):
        cv.jit(f)(z)


def test_max_and_min_select_in_lexicographic_order():
    z = np.array([1 + 2j, 1 + 3j, 0.5 + 9j, -2 + 0j])
    t = _points("plane", shape=(4,), seed=14)
    np.testing.assert_allclose(cv.jvp(cnp.max, (z,), (t,))[1], t[1])
    np.testing.assert_allclose(cv.grad(lambda z: cnp.real(cnp.min(z) * (2 - 1j)))(z), [0, 0, 0, 2 - 1j])
    np.testing.assert_allclose(cv.jvp(lambda z: cnp.maximum(z, 1 + 2.5j), (z,), (t,))[1], [0, t[1], 0, 0])


# ---------------------------------------------------------------------------------------
# Powers with a zero exponent or a zero base (real; JAX's values)
# ---------------------------------------------------------------------------------------


def test_zero_exponent_and_zero_base():
    with np.errstate(all="raise"):  # nothing computed only to be dropped: no 0·inf
        assert cv.grad(lambda x: cnp.power(x, 0.0))(0.0) == 0.0
    assert cv.grad(lambda x: x ** 0)(0.0) == 0.0
    assert cv.grad(lambda x: cnp.power(x, 1.0))(0.0) == 1.0
    assert cv.grad(lambda x: cnp.power(x, 2.0))(0.0) == 0.0
    assert cv.grad(lambda y: cnp.power(0.0, y))(2.0) == 0.0          # log(0) replaced: JAX's 0
    assert cv.grad(lambda y: cnp.power(2.0, y))(0.0) == np.log(2.0)
    assert cv.jvp(lambda x: cnp.power(x, 0.0), (0.0,), (1.0,))[1] == 0.0
    assert cv.grad(cv.jit(lambda x: cnp.power(x, 0.0)))(0.0) == 0.0
    x, y = np.array([0.0, 0.0, 2.0]), np.array([0.0, 3.0, 0.0])
    gx, gy = cv.grad(lambda x, y: cnp.sum(cnp.power(x, y)), argnums=(0, 1))(x, y)
    np.testing.assert_array_equal(gx, [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(gy, [0.0, 0.0, np.log(2.0)])
    assert cv.grad(lambda z: cnp.power(z, 0.0 + 0.0j), holomorphic=True)(0.0 + 0.0j) == 0.0


# ---------------------------------------------------------------------------------------
# cuvmap.numpy's complex helpers
# ---------------------------------------------------------------------------------------


def test_numpy_helpers_match_numpy():
    z = np.array([1.0 + 2.0j, -3.0 + 0.0j, 0.0 - 1.0j])
    x = np.array([1.0, -2.0, 0.0])
    for name in ("real", "imag", "conj", "conjugate", "iscomplex", "isreal"):
        for v in (z, x):
            got, want = getattr(cnp, name)(v), getattr(np, name)(v)
            np.testing.assert_array_equal(got, want)
            assert np.asarray(got).dtype == np.asarray(want).dtype, name
    np.testing.assert_allclose(cnp.angle(z), np.angle(z))
    np.testing.assert_allclose(cnp.angle(z, deg=True), np.angle(z, deg=True))
    np.testing.assert_allclose(cnp.angle(np.array([1, -2, 0])), np.angle(np.array([1, -2, 0])))
    assert cnp.iscomplexobj(z) and not cnp.iscomplexobj(x) and cnp.isrealobj(x) and cnp.iscomplexobj(1j)
    np.testing.assert_array_equal(cnp.real_if_close(np.array([1.0 + 1e-20j])), np.array([1.0]))
    assert cnp.real_if_close(z) is z
    assert cnp.complex64 is np.complex64 and cnp.complex128 is np.complex128


def test_tracer_attributes():
    z = _points("plane", seed=12)
    t = _points("plane", seed=13)
    _, t_out = cv.jvp(lambda z: z.real * z.imag + z.conj() * z.conjugate(), (z,), (t,))
    want = t.real * z.imag + z.real * t.imag + 2 * np.conj(z) * np.conj(t)
    np.testing.assert_allclose(t_out, want, rtol=1e-12)
    assert cv.vmap(lambda z: z.real)(z).dtype == np.float64
    with pytest.raises(TypeError, match="real_if_close"):
        cv.jit(cnp.real_if_close)(z)


def test_sort_of_complex_numbers_is_lexicographic_with_permutation_derivatives():
    """Real part first, then imaginary part (NumPy's and JAX's order), ties included; the
    JVP and VJP are the sorting permutation (no conjugate), against finite differences."""
    z = np.array([1.0 + 2.0j, -0.5 + 1.0j, 1.0 - 1.0j, 0.3 + 0.0j, -0.5 - 2.0j])
    np.testing.assert_array_equal(cnp.sort(z), np.sort(z))
    np.testing.assert_array_equal(cv.jit(cnp.sort)(z), np.sort(z))
    w = z + np.array([0.0, 0.1, 0.2, 0.0, -0.2])  # (distinct real parts: differentiable)
    check_grads(cnp.sort, (w,), order=2)
    check_grads(lambda w: lax.sort(w, 0), (np.stack([w, w[::-1]], 1),))
    t = np.arange(5) * (1 - 1j)
    np.testing.assert_array_equal(cv.jvp(cnp.sort, (z,), (t,))[1], t[np.argsort(z, kind="stable")])
    np.testing.assert_array_equal(cv.vmap(cnp.sort)(np.stack([z, np.conj(z)])), np.sort(np.stack([z, np.conj(z)]), -1))


def test_geomspace_of_complex_end_points_is_numpys_spiral():
    for a, b in [(1.2 + 0.3j, 0.7 - 0.2j), (-1 + 1j, 3 - 2j), (np.array([1j, -2.0]), np.array([-1j, 5 + 5j]))]:
        want = np.geomspace(np.asarray(a), np.asarray(b), 5)
        np.testing.assert_allclose(cnp.geomspace(a, b, 5), want, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(cv.jit(lambda a, b: cnp.geomspace(a, b, 5))(a, b), want, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(cnp.geomspace(a, b, 4, endpoint=False), np.geomspace(np.asarray(a), np.asarray(b), 4,
                                                                                       endpoint=False), rtol=1e-12)
