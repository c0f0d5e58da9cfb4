"""Checks for transformations against independent references, for cuvmap's own tests and
for users' own functions and primitives.

- :func:`check_grads` compares forward mode (``jvp``) and reverse mode (``vjp``) with
  central finite differences, to any order (HIPS autograd's and JAX's ``check_grads``),
  complex inputs and outputs included (NOTE [complex convention] in
  cuvmap/transforms/complex_rules.py: finite differences along complex directions, and
  reverse mode checked through the pairing ``⟨u, v⟩ = re(Σ u·v)``).
- :func:`wirtinger_derivatives` gives ``∂f/∂z`` and ``∂f/∂z̄`` of an elementwise function
  by central differences along the real and the imaginary axis.
- :func:`check_batching` compares ``vmap(f)`` with a Python loop over the examples.
- :func:`missing_rules` lists the rules a primitive lacks (cuvmap's registry test runs it
  on every primitive of :func:`cuvmap.lax.all_primitives`).

Example::

    from cuvmap.test_util import check_grads, check_batching
    check_grads(my_loss, (params, x), order=2)              # float64 inputs
    check_batching(my_fn, (params, xs), in_axes=(None, 0))
"""
import numpy as np

from cuvmap import api, backend, tree
from cuvmap.transforms import batching, jvp, vjp
from cuvmap.core.bfloat16 import kind_of

EPS = 1e-4


def _to_numpy(x):
    x = backend.concrete(x)
    if backend.is_cupy_array(x):
        return x.get()
    return np.asarray(x)


def _wide(x):
    """``x`` as a NumPy array in float64, or complex128 for a complex ``x``."""
    x = _to_numpy(x)
    return x.astype(np.complex128 if kind_of(x.dtype) == "c" else np.float64)


def _inner(xs, ys):
    """Σ over leaves of ``re(Σ x·y)`` in float64: the pairing under which a VJP is the
    transpose of a JVP, for complex numbers too (NOTE [complex convention] in
    cuvmap/transforms/complex_rules.py; for real ones the dot product)."""
    total = 0.0
    for x, y in zip(tree.leaves(xs), tree.leaves(ys)):
        total += float(np.real(np.sum(_wide(x) * _wide(y))))
    return total


def _random_like(rng, xs):
    def one(x):
        arr = _to_numpy(x)
        if kind_of(arr.dtype) == "c":  # a complex direction: both parts random
            r = (rng.standard_normal(arr.shape) + 1j * rng.standard_normal(arr.shape)).astype(arr.dtype)
        else:
            r = rng.standard_normal(arr.shape).astype(arr.dtype if kind_of(arr.dtype) == "f" else np.float64)
        if backend.is_cupy_array(backend.concrete(x)):
            return backend.cupy_module().asarray(r)
        return r

    return tree.map(one, xs)


def _axpy(a, xs, ys):
    """``a * xs + ys`` leafwise (concrete arrays)."""
    return tree.map(lambda x, y: y + a * x, xs, ys)


def _assert_close(actual, expected, atol, rtol, what):
    # NaN agrees with NaN (JAX's check_grads too): both say f is undefined there
    if not np.allclose(actual, expected, atol=atol, rtol=rtol, equal_nan=True):
        raise AssertionError(f"{what}: got {actual!r}, expected {expected!r} (atol={atol}, rtol={rtol})")


def numerical_jvp(f, args, tangents, eps=EPS):
    """Central difference ``(f(x + eps t) - f(x - eps t)) / (2 eps)``, leafwise."""
    plus = f(*_axpy(eps, tangents, args))
    minus = f(*_axpy(-eps, tangents, args))
    return tree.map(lambda p, m: (_wide(p) - _wide(m)) / (2 * eps), plus, minus)


def wirtinger_derivatives(f, z, eps=EPS):
    """The Wirtinger derivatives ``(∂f/∂z, ∂f/∂z̄)`` of an elementwise function ``f`` at the
    complex array ``z``, by central differences along the real and the imaginary axis:
    ``∂f/∂z = (∂f/∂x − i ∂f/∂y)/2``, ``∂f/∂z̄ = (∂f/∂x + i ∂f/∂y)/2`` (complex128).

    They give every derivative under NOTE [complex convention]
    (cuvmap/transforms/complex_rules.py): the JVP ``a·ż + b·conj(ż)``, the VJP
    ``ct·a + conj(ct·b)`` (``a, b`` the pair returned), and for a real ``f`` the gradient
    ``2a = ∂f/∂x − i ∂f/∂y``; ``f`` is holomorphic where ``b`` is 0, with ``f'(z) = a``.

    Example::

        a, b = wirtinger_derivatives(cnp.abs, z)    # a = conj(z)/(2|z|), b = z/(2|z|)
    """
    z = _wide(z).astype(np.complex128)
    dx = (_wide(f(z + eps)) - _wide(f(z - eps))) / (2 * eps)
    dy = (_wide(f(z + 1j * eps)) - _wide(f(z - 1j * eps))) / (2 * eps)
    return (dx - 1j * dy) / 2, (dx + 1j * dy) / 2


def check_jvp(f, args, atol=1e-6, rtol=1e-6, eps=EPS, rng=None):
    """``jvp(f)`` against central differences along a random tangent."""
    rng = rng or np.random.default_rng(0)
    tangents = _random_like(rng, args)
    _, t_out = api.jvp(f, args, tangents)
    expected = numerical_jvp(f, args, tangents, eps)
    for a, e in zip(tree.leaves(t_out), tree.leaves(expected)):
        _assert_close(_to_numpy(a), e, atol, rtol, "jvp vs finite differences")


def check_vjp(f, args, atol=1e-6, rtol=1e-6, eps=EPS, rng=None):
    """``⟨vjp(f)(u), v⟩`` against ``⟨u, (f(x + eps v) - f(x - eps v)) / 2 eps⟩``."""
    rng = rng or np.random.default_rng(1)
    out, vjp_fun = api.vjp(f, *args)
    u = _random_like(rng, out)
    v = _random_like(rng, args)
    lhs = _inner(vjp_fun(u), v)
    rhs = _inner(u, numerical_jvp(f, args, v, eps))
    _assert_close(lhs, rhs, atol, rtol, "vjp vs finite differences (inner products)")


# JAX's default_gradient_tolerance (jax._src.public_test_util): what check_grads takes for
# a dtype when atol/rtol is None or a dict that does not name it
GRADIENT_TOLERANCE = {
    np.dtype(np.float16): 1e-2, np.dtype(np.float32): 2e-3, np.dtype(np.float64): 1e-5,
    np.dtype(np.complex64): 1e-3, np.dtype(np.complex128): 1e-5,
}


def _tolerance(tol, dtypes):
    """A scalar tolerance from JAX's forms: a number as it is; ``None`` or a dict
    ``{dtype: tol}`` (merged over :data:`GRADIENT_TOLERANCE`) gives the largest tolerance
    of the inexact ``dtypes`` checked (JAX's ``tolerance(dtype, tol)``)."""
    if tol is not None and not isinstance(tol, dict):
        return tol
    table = dict(GRADIENT_TOLERANCE)
    table.update({np.dtype(k): v for k, v in (tol or {}).items()})
    found = [table[d] for d in dtypes if d in table]
    return max(found) if found else GRADIENT_TOLERANCE[np.dtype(np.float64)]


def check_grads(f, args, order=2, modes=("fwd", "rev"), atol=None, rtol=None, eps=None, seed=0):
    """Checks ``f``'s derivatives to ``order`` against finite differences.

    Complex inputs take complex directions and complex outputs complex cotangents, so the
    whole real-linear derivative (both Wirtinger derivatives) is checked; reverse mode
    is checked as the transpose of forward mode under ``⟨u, v⟩ = re(Σ u·v)``, JAX's
    convention (NOTE [complex convention] in cuvmap/transforms/complex_rules.py).

    Args:
      f: a function of arrays (float64 or complex128 recommended) returning a pytree of
        arrays.
      args: a tuple of arguments.
      order: 1 checks first derivatives; 2 also checks the derivatives of the JVP and VJP
        functions themselves (second derivatives), and so on.
      modes: ``"fwd"`` checks ``jvp``, ``"rev"`` checks ``vjp``.
      atol, rtol: a number, or JAX's forms: ``None``, the default (JAX's per-dtype
        gradient tolerances, :data:`GRADIENT_TOLERANCE`: 1e-5 in float64, 2e-3 in
        float32, as ``jax.test_util.check_grads``) or a dict ``{dtype: tol}`` over them; the
        largest tolerance of the arguments' and outputs' dtypes applies. A NaN agrees
        with a NaN in the same place (both say ``f`` is undefined there), as in JAX.
      eps: the finite-difference step (``None``: :data:`EPS`).
    Raises:
      AssertionError naming the mode and order on a mismatch.
    """
    rng = np.random.default_rng(seed)
    args = tuple(args)
    if atol is None or rtol is None or isinstance(atol, dict) or isinstance(rtol, dict):
        dtypes = {np.dtype(_to_numpy(x).dtype) for x in tree.leaves((args, f(*args)))}
        atol, rtol = _tolerance(atol, dtypes), _tolerance(rtol, dtypes)
    eps = EPS if eps is None else eps

    def check(f, args, order_left, level):
        if "fwd" in modes:
            try:
                check_jvp(f, args, atol, rtol, eps, rng)
            except AssertionError as err:
                raise AssertionError(f"order {level} forward mode: {err}") from None
            if order_left > 1:
                t = _random_like(rng, args)

                def f_jvp(*primals):
                    return api.jvp(f, primals, t)[1]

                check(f_jvp, args, order_left - 1, level + 1)
        if "rev" in modes:
            try:
                check_vjp(f, args, atol, rtol, eps, rng)
            except AssertionError as err:
                raise AssertionError(f"order {level} reverse mode: {err}") from None
            if order_left > 1:
                u = _random_like(rng, f(*args))

                def f_vjp(*primals):
                    return api.vjp(f, *primals)[1](u)

                check(f_vjp, args, order_left - 1, level + 1)

    check(f, args, order, 1)


def _example(leaf, b, ax):
    """Example ``b`` of ``leaf`` along ``ax``, an array of the leaf's own kind on its own
    device (a 0-d NumPy array, not a NumPy scalar)."""
    leaf = backend.concrete(leaf)
    xp = backend.xp_of(leaf)
    return xp.asarray(xp.take(leaf, b, axis=ax))


def _zero_example(leaf, ax):
    """An all-zeros example of ``leaf`` (mapped along ``ax``), on the leaf's device."""
    leaf = backend.concrete(leaf)
    shape = tuple(leaf.shape)
    ax %= len(shape)
    return backend.xp_of(leaf).zeros(shape[:ax] + shape[ax + 1:], leaf.dtype)


def check_batching(f, args, in_axes=0, out_axes=0, atol=1e-6, rtol=1e-6):
    """``vmap(f, in_axes, out_axes)(*args)`` against stacking ``f`` over a loop of examples.

    ``in_axes`` is an int/None or a tuple with one entry per argument (int or None for the
    whole argument). Every leaf stays on its own device: the loop gives ``f`` each mapped
    leaf's examples as arrays of that leaf's kind (NumPy or CuPy) and every unmapped leaf
    as it is, so it computes where the vmapped call does; each vmapped output must be on
    the device of the loop's. Only the comparison copies results to the host.
    """
    in_axes_t = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
    sizes = set()
    for a, ax in zip(args, in_axes_t):
        if ax is not None:
            for leaf in tree.leaves(a):
                sizes.add(np.shape(backend.concrete(leaf))[ax])
    assert len(sizes) == 1, f"check_batching: mapped sizes {sizes}"
    size = sizes.pop()
    got = api.vmap(f, in_axes=in_axes, out_axes=out_axes)(*args)
    if size == 0:
        # no example to loop over: f on one all-zeros example gives each output's logical
        # shape and dtype, which the empty batched outputs must have (with 0 at out_axes)
        ex_args = [a if ax is None else tree.map(lambda leaf, ax=ax: _zero_example(leaf, ax), a)
                   for a, ax in zip(args, in_axes_t)]
        with np.errstate(all="ignore"):
            template = f(*ex_args)
        examples = []
    else:
        examples = []
        for b in range(size):
            ex_args = [a if ax is None else tree.map(lambda leaf, ax=ax: _example(leaf, b, ax), a)
                       for a, ax in zip(args, in_axes_t)]
            examples.append(f(*ex_args))
    out_axes_flat = tree.leaves(out_axes, is_leaf=lambda a: a is None) if not isinstance(out_axes, int) else None
    got_leaves = tree.leaves(got)
    for j, g in enumerate(got_leaves):
        oa = out_axes if out_axes_flat is None else out_axes_flat[j]
        loop_leaf = tree.leaves(template if size == 0 else examples[0])[j]
        if backend.backend_name(g) != backend.backend_name(loop_leaf):
            raise AssertionError(f"vmap output {j} is on the {backend.backend_name(g)}, the loop's on the "
                                 f"{backend.backend_name(loop_leaf)}")
        if size == 0:
            one = _to_numpy(loop_leaf)
            want = one if oa is None else np.moveaxis(np.empty((0,) + one.shape, one.dtype), 0, oa)
            if _to_numpy(g).dtype != want.dtype:
                raise AssertionError(f"vmap output {j}: dtype {_to_numpy(g).dtype}, one example gives {want.dtype}")
        elif oa is None:
            want = _to_numpy(loop_leaf)     # unmapped: every example gives it
        else:
            want = np.stack([_to_numpy(tree.leaves(e)[j]) for e in examples], axis=oa)
        g = _to_numpy(g)
        if g.shape != want.shape:
            raise AssertionError(f"vmap output {j}: shape {g.shape}, loop gives {want.shape}")
        _assert_close(g, want, atol, rtol, f"vmap output {j} vs per-example loop")


def missing_rules(prim):
    """The rules that primitive ``prim`` lacks, as a list of sentences (empty when it has
    them all): an impl, a shape rule, a batching rule (for a collective, an entry of
    ``batching.axis_primitive_batchers``) and, when it is differentiable, a JVP rule and a
    VJP rule, as entries of the transforms' rule tables. A call-like
    primitive, whose rules are methods (``rule_methods`` names them, as the protocol
    :class:`cuvmap.transforms.call.CallPrimitive` does without defining them), needs those
    methods instead, from its own class or one it inherits from.

    Example::

        assert not missing_rules(my_op_p), missing_rules(my_op_p)
    """
    missing = [] if callable(prim.impl) else [f"{prim.name} has no impl"]
    if prim.rule_methods is not None:
        return missing + [f"{prim.name} has no method {m} (one of its rule_methods)"
                          for m in prim.rule_methods if not callable(getattr(prim, m, None))]
    if not callable(prim.shape_rule):
        missing.append(f"{prim.name} has no shape rule")
    if prim not in batching.primitive_batchers and prim not in batching.axis_primitive_batchers:
        missing.append(f"{prim.name} has no batching rule")
    if prim.differentiable:
        if prim not in jvp.primitive_jvps:
            missing.append(f"{prim.name} has no JVP rule")
        if prim not in vjp.primitive_vjps:
            missing.append(f"{prim.name} has no VJP rule")
    return missing
