"""The dtype checks of ``grad``, ``value_and_grad``, ``jacfwd``, ``jacrev`` and ``hessian``
for complex numbers and their ``holomorphic=`` option, with JAX's rules and TypeErrors
(NOTE [complex convention] in cuvmap/transforms/complex_rules.py):

- reverse mode (``grad``, ``jacrev``) takes real or complex inputs and needs real outputs:
  the gradient of a real ``f`` of ``z = x + iy`` is ``∂f/∂x − i ∂f/∂y``;
- forward mode (``jacfwd``) needs real inputs: a Jacobian of a complex input is a real
  2×2 block per element, which one complex matrix cannot hold unless ``f`` is holomorphic;
- ``holomorphic=True`` needs complex inputs and outputs and gives the complex derivative
  ``f'(z)`` (reverse mode pulls back the cotangent 1, forward mode pushes the tangent 1).

A complex function that is not holomorphic is differentiated with ``vjp`` or ``jvp``
directly, or through its real and imaginary parts.
"""
from cuvmap import core, tree
from cuvmap.api_util import TransformError, describe_arg
from cuvmap.core.bfloat16 import kind_of


class ComplexDtypeError(TransformError, TypeError):
    """A transform's dtype rule for complex numbers was broken (JAX raises TypeError)."""


def _is_complex(x):
    return kind_of(core.dtype_of(x)) == "c"


def check_inputs(f, args, argnums, holomorphic, transform):
    """With ``holomorphic=True`` every differentiated input leaf must be complex; without it
    ``jacfwd`` needs real ones."""
    for i in argnums:
        paths, leaves, _ = tree.flatten_with_path(args[i])
        for path, x in zip(paths, leaves):
            if not core.is_value(x):
                continue  # check_float_inputs names it
            if not ((holomorphic and not _is_complex(x)) or (transform == "jacfwd" and not holomorphic
                                                              and _is_complex(x))):
                continue  # (nothing to raise: the name below is built for the errors only)
            what = describe_arg(f, (0, i) + tuple(path))
            dtype = core.dtype_of(x)
            if holomorphic and not _is_complex(x):
                raise ComplexDtypeError(
                    f"{transform} with holomorphic=True requires inputs with complex dtype, but got {dtype}: {what} "
                    f"has dtype {dtype}")
            if transform == "jacfwd" and not holomorphic and _is_complex(x):
                raise ComplexDtypeError(
                    f"jacfwd requires real-valued inputs (input dtype that is a sub-dtype of np.floating), but got "
                    f"{dtype}: {what} has dtype {dtype}. For holomorphic differentiation, pass holomorphic=True. For differentiation "
                    "of non-holomorphic functions involving complex inputs or integer inputs, use cuvmap.jvp "
                    "directly, or differentiate the real and imaginary parts as separate real inputs")


def check_outputs(outputs, holomorphic, transform):
    """With ``holomorphic=True`` every output leaf must be complex; without it reverse mode
    (``grad``, ``jacrev``) needs real ones."""
    for o in tree.leaves(outputs):
        if not core.is_value(o) or not core.is_float(o):
            continue  # the transform's own check names an output that is not floating point
        dtype = core.dtype_of(o)
        if holomorphic and not _is_complex(o):
            raise ComplexDtypeError(
                f"{transform} with holomorphic=True requires outputs with complex dtype, but got {dtype}")
        if transform != "jacfwd" and not holomorphic and _is_complex(o):
            raise ComplexDtypeError(
                f"{transform} requires real-valued outputs (output dtype that is a sub-dtype of np.floating), but "
                f"got {dtype}. For holomorphic differentiation, pass holomorphic=True. For differentiation of "
                "non-holomorphic functions involving complex outputs, use cuvmap.vjp directly, or differentiate "
                "the real and imaginary parts (cuvmap.numpy.real, imag) as separate real outputs")
