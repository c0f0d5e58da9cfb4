"""What the tables of JAX names share (tests/api/test_jax_surface_gaps.py,
tests/numpy/test_jax_numpy_missing_names.py, tests/numpy/test_polynomials_calculus.py):
rows ``(name, f, reference, args, diff)`` whose results, possibly tuples, are compared
entry by entry; ``vmap`` over one argument against a loop over the batch; derivatives with
respect to the arguments at ``diff`` in both modes against finite differences."""
import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap.test_util import check_grads


def assert_results_close(got, want, rtol, atol):
    """``got`` equals ``want`` (arrays, or tuples and lists of them) in shape and to the
    tolerances, NaNs in the same places."""
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_results_close(g, w, rtol, atol)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


def assert_vmap_over_argument_is_a_loop(f, args, k, batch, rtol, atol):
    """``vmap`` of ``f`` over its argument ``k`` (the others fixed) at the examples of
    ``batch`` equals ``f`` at each example, stacked."""
    def at(b):
        return f(*args[:k], b, *args[k + 1:])

    got = cv.vmap(at)(batch)
    want = [at(b) for b in batch]
    if isinstance(want[0], (tuple, list)):
        want = [np.stack([w[i] for w in want]) for i in range(len(want[0]))]
    else:
        want = np.stack(want)
    assert_results_close(got, want, rtol, atol)


def check_row_grads(f, args, diff, tol, real_part=False):
    """``check_grads`` (order 1, both modes, float64) of ``f`` with respect to the
    arguments at ``diff``, the others fixed; ``real_part`` differentiates the real part of
    each output (for functions with complex results of real inputs)."""
    def of_diff(*xs):
        full = list(args)
        for i, x in zip(diff, xs):
            full[i] = x
        out = f(*full)
        if not real_part:
            return out
        return tuple(cnp.real(o) for o in out) if isinstance(out, tuple) else cnp.real(out)

    check_grads(of_diff, tuple(np.asarray(args[i], np.float64) for i in diff), order=1, modes=("fwd", "rev"),
                atol=tol, rtol=tol)


def assert_refusal(name, thunk, classes, phrase):
    """A row of a table of JAX's refusals (tests/api/test_jax_refusals.py,
    tests/transforms/test_custom_rule_refusals.py): ``thunk()`` raises an instance of every
    class in ``classes`` (cuvmap's error and the exception type JAX's tests catch) whose
    message holds JAX's ``phrase``."""
    with pytest.raises(classes[0]) as info:
        thunk()
    for cls in classes:
        assert isinstance(info.value, cls), (name, type(info.value).__mro__)
    assert phrase in str(info.value), str(info.value)
