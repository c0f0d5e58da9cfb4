"""Complex numbers: ``real``, ``imag``, ``conj``, ``complex`` (JAX's ``lax`` names), the
composite ``angle``, and the derivative rules of
``abs``, whose complex form is not holomorphic (NOTE [complex convention] in
cuvmap/transforms/complex_rules.py).

The rules of the holomorphic primitives (arithmetic, exp, log, sqrt, pow, trigonometric
and hyperbolic functions) are their real rules, which that NOTE shows serve complex
numbers unchanged; this module declares them with ``defcomplex``.
"""
import numpy as np

from cuvmap import backend, core
from cuvmap.core import ShapedArray, ShapeError
from cuvmap.lax.elementwise import arithmetic, comparisons, transcendental
from cuvmap.lax.elementwise.arithmetic import abs_p, div, mul, neg, sign
from cuvmap.lax.elementwise.common import _nary, _naryop_shape_rule
from cuvmap.lax.elementwise.comparisons import convert_element_type, eq, select
from cuvmap.transforms import batching, complex_rules, jvp, vjp
from cuvmap.core.bfloat16 import kind_of


# ---------------------------------------------------------------------------------------
# Declarations and impls
# ---------------------------------------------------------------------------------------

def _real_dtype(dtype):
    """complex64 -> float32, complex128 -> float64."""
    return np.finfo(dtype).dtype


def _complex_dtype(dtype):
    """float32 -> complex64, float64 -> complex128 (float16 -> complex64, as NumPy)."""
    return np.result_type(dtype, np.complex64)


def _complex_operand_shape_rule(name):
    def rule(x):
        if kind_of(x.dtype) != "c":
            raise ShapeError(f"{name}: operand must be complex, got {x.dtype}")
        return ShapedArray(x.shape, _real_dtype(x.dtype), weak_type=x.weak_type)

    return rule


def _conj_shape_rule(x):
    if kind_of(x.dtype) != "c":
        raise ShapeError(f"conj: operand must be complex, got {x.dtype}")
    return ShapedArray(x.shape, x.dtype, weak_type=x.weak_type)


def _complex_shape_rule(x, y):
    for name, a in (("real part", x), ("imaginary part", y)):
        if kind_of(a.dtype) != "f":
            raise ShapeError(f"complex: the {name} must be floating point, got {a.dtype}")
    out = _naryop_shape_rule(x, y)
    return ShapedArray(out.shape, _complex_dtype(out.dtype), weak_type=out.weak_type)


def _part_impl(part):
    def impl(x):
        x = core.as_array(x)
        return getattr(x, part).copy()  # a C-ordered array of its own, not a strided view

    return impl


def _complex_impl(x, y):
    x, y = core.as_array(x), core.as_array(y)
    xp = backend.xp_of(x) if not isinstance(x, np.ndarray) else backend.xp_of(y)
    dtype = _complex_dtype(np.result_type(x, y))
    out = xp.empty(np.broadcast_shapes(x.shape, y.shape), dtype)
    out.real[...] = x  # no x + 1j*y: 1j*inf would put a NaN in the real part
    out.imag[...] = y
    return out


real_p = _nary("real", _part_impl("real"), _complex_operand_shape_rule("real"))
imag_p = _nary("imag", _part_impl("imag"), _complex_operand_shape_rule("imag"))
conj_p = _nary("conj", lambda x: core.as_array(x).conj(), _conj_shape_rule)
complex_p = _nary("complex", _complex_impl, _complex_shape_rule)


# ---------------------------------------------------------------------------------------
# Public wrappers
# ---------------------------------------------------------------------------------------

def real(x):
    """The real part ``re(z)`` of a complex ``z`` (``jax.lax.real``); a real dtype of the
    same precision. Its derivative is ``re(ż)``, its transpose ``complex(ct, 0)``."""
    return real_p.bind(x)


def imag(x):
    """The imaginary part ``im(z)`` of a complex ``z`` (``jax.lax.imag``). Its derivative
    is ``im(ż)``, its transpose ``complex(0, −ct)`` (NOTE [complex convention])."""
    return imag_p.bind(x)


def conj(x):
    """The complex conjugate ``x − iy`` of ``z = x + iy`` (``jax.lax.conj``); a real ``x``
    gives ``x`` as a complex number, as in JAX. Its derivative is ``conj(ż)``, and so is
    its transpose."""
    dtype = core.dtype_of(x)
    if kind_of(dtype) != "c":
        return convert_element_type(x, _complex_dtype(dtype if kind_of(dtype) == "f" else np.float64))
    return conj_p.bind(x)


def complex(x, y):  # noqa: A001 - lax vocabulary
    """``x + i·y`` from real ``x`` and ``y`` of one float dtype, broadcasting
    (``jax.lax.complex``). Its derivative is ``ẋ + i·ẏ``; the transpose gives
    ``(re(ct), −im(ct))``."""
    return complex_p.bind(x, y)


def angle(z):
    """The argument of ``z`` in ``(−π, π]``: ``atan2(im(z), re(z))`` (0 or π for a real
    ``z``, as NumPy). Its derivative is ``im(conj(z)·ż) / |z|²``."""
    if kind_of(core.dtype_of(z)) == "c":
        return transcendental.atan2(imag(z), real(z))
    if not core.is_float(z):
        z = convert_element_type(z, np.float64)
    return transcendental.atan2(jvp.zeros_like(z), z)  # +0, so that a negative z gives +π


# ---------------------------------------------------------------------------------------
# Batching rules
# ---------------------------------------------------------------------------------------

batching.defunary(real_p, imag_p, conj_p)
batching.defbroadcasting(complex_p)


# ---------------------------------------------------------------------------------------
# JVP and VJP rules
# ---------------------------------------------------------------------------------------

def _as_complex(ct, like_dtype):
    """``ct`` (real) as a complex number of ``like_dtype``: ``complex(ct, 0)``."""
    return convert_element_type(ct, like_dtype)


jvp.defjvp(real_p, lambda t, out, x: real(t))
vjp.defvjp(real_p, lambda ct, out, x: _as_complex(ct, core.dtype_of(x)), reads=())
jvp.defjvp(imag_p, lambda t, out, x: imag(t))
vjp.defvjp(imag_p, lambda ct, out, x: mul(_as_complex(neg(ct), core.dtype_of(x)), 1j), reads=())
jvp.defjvp(conj_p, lambda t, out, x: conj(t))
vjp.defvjp(conj_p, lambda ct, out, x: conj(ct), reads=())


def _complex_vjp_imag(ct, out, x, y):
    return neg(imag(ct))


jvp.defjvp(
    complex_p,
    lambda t, out, x, y: _as_complex(t, core.dtype_of(out)),
    lambda t, out, x, y: mul(_as_complex(t, core.dtype_of(out)), 1j),
)
vjp.defvjp(complex_p, lambda ct, out, x, y: real(ct), _complex_vjp_imag, reads=())


def _nonzero(r):
    """``r`` with its zeros replaced by 1 (the rules below are 0 there: their numerators are)."""
    return select(eq(r, 0), 1, r)


def _abs_jvp(t, out, x):
    """``sign(x)·ẋ`` for real ``x``; ``re(conj(z)·ż) / |z|`` for complex ``z``."""
    if kind_of(core.dtype_of(x)) != "c":
        return mul(t, sign(x))
    return div(real(mul(conj(x), t)), _nonzero(out))


def _abs_vjp(ct, out, x):
    """The transpose: ``ct·sign(x)`` for real ``x``; ``ct·conj(z) / |z|`` for complex ``z``."""
    if kind_of(core.dtype_of(x)) != "c":
        return mul(ct, sign(x))
    return mul(_as_complex(div(ct, _nonzero(out)), core.dtype_of(x)), conj(x))


jvp.defjvp(abs_p, _abs_jvp)
vjp.defvjp(abs_p, _abs_vjp, reads=(0, "out"))


# The primitives whose rules follow NOTE [complex convention]: the holomorphic ones (their
# real rules serve), the linear ones (no conjugate in a transpose) and this module's.
complex_rules.defcomplex(
    arithmetic.neg_p, arithmetic.add_p, arithmetic.sub_p, arithmetic.mul_p, arithmetic.div_p,
    arithmetic.integer_pow_p, abs_p,
    # max and min order complex numbers lexicographically (NumPy's and JAX's order); their
    # rules are selections with real weights, so they need no conjugate
    arithmetic.max_p, arithmetic.min_p,
    transcendental.pow_p, transcendental.exp_p, transcendental.log_p, transcendental.log1p_p,
    transcendental.expm1_p, transcendental.sqrt_p, transcendental.rsqrt_p, transcendental.tanh_p,
    transcendental.sin_p, transcendental.cos_p, transcendental.log2_p,
    transcendental.log10_p, transcendental.atan_p, transcendental.sinh_p, transcendental.cosh_p,
    transcendental.asinh_p, transcendental.logistic_p,
    comparisons.select_p, comparisons.convert_element_type_p, comparisons.stop_gradient_p,
    real_p, imag_p, conj_p, complex_p,
)
