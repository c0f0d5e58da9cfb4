"""``named_scope``: names for the parts of a staged program (``jax.named_scope``).

NOTE [named scopes] in :mod:`cuvmap.core` says how the names travel: staging records the
scopes each equation was staged in, the text form of a program prints them, and the
programs that ``vmap``, ``jvp`` and ``grad`` derive keep them (the backward pass's
equations as ``transpose(<scope>)``)::

    @cv.named_scope("dense")
    def dense(w, x):
        return cnp.tanh(x @ w)

    print(cv.make_jaxpr(cv.grad(lambda w, x: cnp.sum(dense(w, x))))(w, x))
    #     c:f64[4] = dot_general[...] b a  # [dense]
    #     d:f64[4] = tanh c  # [dense]
    #     ...
    #     k:f64[3,4] = transpose[permutation=(1, 0)] j  # [transpose(dense)]
"""
import contextlib

from cuvmap import core


@contextlib.contextmanager
def named_scope(name):
    """Stages the equations of the block (or of the decorated function) under ``name``:
    ``with cv.named_scope("encoder"): ...`` or ``@cv.named_scope("encoder")``. Scopes
    nest (``encoder/layer1``); they change no value and cost nothing eagerly but a
    tuple per entry.

    Args:
      name: a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"named_scope: name must be a str, got {type(name).__name__}")
    with core.extend_name_stack((name,)):
        yield
