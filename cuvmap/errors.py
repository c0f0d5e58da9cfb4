"""cuvmap's errors (re-exported by :mod:`cuvmap.core` and :mod:`cuvmap`). This module
imports nothing, so the lowest modules (``cuvmap/window.py``) raise them too.
"""


class CuvmapError(Exception):
    """Base class of cuvmap's errors. ``where`` is filled in by the innermost transform
    wrapper (``"vmap(loss)"``) and printed first."""

    def __init__(self, message, where=None):
        super().__init__(message)
        self.message = message
        self.where = where

    def __str__(self):
        return f"{self.where}: {self.message}" if self.where else self.message


class ShapeError(CuvmapError, ValueError):
    """An operation was applied to operands of incompatible shapes, dtypes or parameters."""


class ShapeTypeError(ShapeError, TypeError):
    """A shape rule that JAX enforces with a ``TypeError`` (``dot_general``'s contracting
    dimensions): a :class:`ShapeError` that ``except TypeError`` catches too."""


class MissingRuleError(CuvmapError, NotImplementedError):
    """A primitive has no rule for the transform that reached it."""


class EscapedTracerError(CuvmapError):
    """A tracer was used after the transform that created it had returned."""


class ConcretizationError(CuvmapError, TypeError):
    """A traced value was converted to a concrete Python or NumPy value."""


class CrossThreadTracerError(CuvmapError, RuntimeError):
    """A tracer was used in a thread other than the one whose transform created it."""


def jax_concretization_phrase(what, aval_text):
    """JAX's words for a traced value converted to a Python value (``what``: ``"float()"``,
    ``"the truth value (...)"``, ...; ``aval_text``: ``float32[3]``), appended to cuvmap's
    message so that code matching JAX's errors finds them."""
    if what.startswith("the truth value"):
        return f"Attempted boolean conversion of traced array with shape {aval_text}."
    if what.startswith("The __index__"):
        return ""
    name = what[:-2] if what.endswith("()") else what
    tail = (f" The problem arose with the `{name}` function. If trying to convert the data type of a value, try "
            f"using `x.astype({name})` or `jnp.array(x, {name})` instead.") if name in ("float", "int", "complex") else ""
    return f"Abstract tracer value encountered where concrete value is expected: {what} of traced array with shape " \
           f"{aval_text}.{tail}"
