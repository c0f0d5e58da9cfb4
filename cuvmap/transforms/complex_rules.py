"""Complex numbers in the derivative transforms: the convention every JVP and VJP rule
follows (NOTE [complex convention]) and the registry of the primitives whose rules follow
it. ``jvp`` and ``vjp`` refuse a primitive outside the registry when one of its
differentiated operands or its output is complex, naming the primitive and the dtype: a
rule written for real numbers never gives a silently wrong complex derivative.
"""
from cuvmap import core
from cuvmap.core import MissingRuleError
from cuvmap.core.bfloat16 import kind_of

# NOTE [complex convention]
# cuvmap follows JAX's convention for complex numbers, in every rule.
#
# A complex number z = x + iy is a pair of reals, and a derivative is a real-linear map.
# Every real-linear map of ż has the Wirtinger form
#     ḟ = a·ż + b·conj(ż),    a = ∂f/∂z = (∂f/∂x − i ∂f/∂y)/2,  b = ∂f/∂z̄ = (∂f/∂x + i ∂f/∂y)/2.
# - JVP rules compute ḟ. Where f is holomorphic (b = 0) the rule is complex-linear,
#   ḟ = f'(z)·ż, and the real rule ``g * f'(x)`` serves unchanged (exp, log, sin, pow,
#   mul, div, sqrt, tanh, ...). Where it is not, the rule is the real-linear form:
#     abs:   re(conj(z)·ż) / |z|                 (0 at z = 0)
#     sign:  (ż − s·re(conj(s)·ż)) / |z|,  s = z/|z|   (a composite of div and abs)
#     angle: im(conj(z)·ż) / |z|²                (atan2 of imag and real)
#     real:  re(ż);  imag: im(ż);  conj: conj(ż);  complex(x, y): ẋ + i·ẏ.
# - VJP rules are the transposes of the JVP rules under the pairing
#     ⟨u, v⟩ = re(u·v)        (no conjugation, JAX's),
#   the map ct ↦ ct̄ with ⟨ct̄, ż⟩ = ⟨ct, ḟ⟩ for every ż, which for the Wirtinger form is
#     ct̄ = ct·a + conj(ct·b).
#   So a holomorphic rule's transpose is again ``ct * f'(z)`` (no conjugate), conj's is
#   conj, real's is complex(ct, 0), imag's is complex(0, −ct), complex's is
#   (re(ct), −im(ct)), abs's is ct·conj(z)/|z|, dot_general's and the sums' are the real
#   ones. For a real-valued f of complex z, grad(f)(z) = vjp(f)(1.0) = 2a =
#   ∂f/∂x − i ∂f/∂y: JAX's gradient (PyTorch's is its conjugate, ∂f/∂x + i ∂f/∂y;
#   gradient descent in JAX's convention steps along its conjugate).
# - The transpose of the real-to-complex cast takes the real part, so a real input whose
#   path goes through complex intermediates gets a real cotangent (``vjp.match_operand``
#   casts a complex cotangent of a real operand to its real part), and a complex-to-real
#   cast takes the real part (NumPy's astype would warn; JAX's convert_element_type).
# - ``grad`` needs a real output unless ``holomorphic=True``, which needs complex inputs
#   and outputs and gives f'(z) (vjp of the cotangent 1); ``jacfwd`` needs real inputs and
#   ``jacrev`` real outputs unless ``holomorphic=True`` (JAX's TypeErrors:
#   cuvmap/holomorphic.py).
# A primitive whose rules follow this is registered with :func:`defcomplex`; jvp and vjp
# raise MissingRuleError for the others on complex values (:func:`check`).
primitives_with_complex_rules = set()


def defcomplex(*primitives):
    """Declares that these primitives' JVP and VJP rules follow NOTE [complex convention]
    for complex operands and outputs."""
    primitives_with_complex_rules.update(primitives)


def _complex_dtype(values):
    for v in values:
        if v is not None and core.is_float(v) and kind_of(core.dtype_of(v)) == "c":
            return core.dtype_of(v)
    return None


def check(primitive, out, operands, transform):
    """Raises MissingRuleError when ``primitive`` has no complex rules and its output or
    one of the differentiated ``operands`` is complex (called by the jvp and vjp traces
    for the primitives outside the registry)."""
    dtype = _complex_dtype((out, *operands))
    if dtype is not None:
        raise MissingRuleError(
            f"{primitive.name} has no {transform} rule for complex numbers (an operand or the result has dtype "
            f"{dtype}); differentiate it on real inputs, or split the complex values with real/imag "
            "(NOTE [complex convention])")
