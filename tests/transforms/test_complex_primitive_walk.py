"""Every primitive on complex128 values: a rule under NOTE [complex convention] or a clear
refusal, never a silent number (issue 33).

The walk takes every float64 row of the op table (tests/op_table.py: at least one row per
primitive of ``cuvmap.lax.all_primitives()``, and the composite rows of cuvmap.numpy),
turns its differentiable operands complex (``x + 0.3i·y``) and records what happens:

- ``refused``: computing the value raises (a TypeError, ShapeError or
  NotImplementedError; NumPy's own ufunc errors among them), or ``jvp`` raises
  MissingRuleError naming the primitive, ``complex`` and the dtype, and then ``vjp`` does
  too;
- ``computed``: then every primitive of the row that binds on complex values has complex
  rules (``complex_rules.defcomplex``), and the JVP equals central finite differences along
  a complex direction (a real step ε: the real-linear derivative), the VJP is its transpose
  under ``⟨u, v⟩ = re Σ u·v`` (so ``grad`` of a real function is ``∂/∂x − i ∂/∂y``), and
  ``jit`` and ``vmap`` of the JVP agree with the eager JVP and a loop; where the row has
  one complex operand and result and its JVP is complex-linear (holomorphic: about 200
  rows), ``jacfwd``/``jacrev``/``grad`` with ``holomorphic=True`` give the same Jacobian.

Then every primitive is accounted for: covered by a computed row, refused by one, without
a derivative, or in :data:`ACCOUNTED` with its reason. The closed forms and the holomorphic
Jacobians of the elementwise functions are in test_complex_rules.py (the table of NOTE
[complex convention]); the decompositions in tests/linalg/test_complex_linalg_rules.py.
"""
import functools
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import backend as cv_backend
from cuvmap import lax
from cuvmap import numpy as cnp
from cuvmap.core import MissingRuleError, ShapeError
from cuvmap.transforms import complex_rules
from cuvmap.transforms.call import CallPrimitive

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from op_table import ALL_ROWS, F64, closed_over_nondiff  # noqa: E402

REGISTRY = complex_rules.primitives_with_complex_rules
REGISTERED = {p.name for p in REGISTRY}
PRIMITIVES = {p.name: p for p in lax.all_primitives()}
# custom rules decide for themselves (pinv's custom JVP is complex-aware): the walk checks
# their numbers, not a registration
CUSTOM_CALLS = {"custom_jvp_call", "custom_vjp_call"}
EPS = 1e-6

WALKED = [r for r in ALL_ROWS if F64 in r.dtypes and r.differentiable and r.diff_argnums and "fwd" in r.modes]

# -m "not slow": the first row of each primitive (composite rows: every tenth); the full
# suite walks every row
_FAST = set()
_seen = set()
for _i, _r in enumerate(WALKED):
    _key = _r.prim if _r.prim is not None else _i // 10
    if _key not in _seen:
        _seen.add(_key)
        _FAST.add(_r.name)

# rows whose complex JVP finite differences cannot see, and why (their VJP, jit and vmap
# checks still run; tests/linalg/test_complex_linalg_rules.py checks the decompositions'
# gauge-invariant functions and the raw outputs in JAX's gauge)
NO_FINITE_DIFFERENCES = {
    **{n: "ties in the real parts, broken by the imaginary parts: a kink of the lexicographic max/min"
       for n in ("max_ties", "min_ties", "reduce_max_ties", "reduce_min_ties")},
    **{n: "raw singular vectors or eigenvectors: a phase each, JAX's gauge in the rule, LAPACK's in the values"
       for n in ("svd_tall", "svd_wide", "svd_square_full", "svd_stacked", "linalg_svd_stacked",
                 "eigh", "eigh_upper_unsymmetrized")},
}

# rows whose NumPy reference means something else on complex operands, and why
OTHER_VALUES = {
    **{n: "the operand is not Hermitian: cuvmap symmetrizes with (a + aᴴ)/2 as JAX, NumPy reads one triangle "
          "(Hermitian operands agree: tests/linalg/test_complex_linalg_rules.py)"
       for n in ("cholesky", "eigh", "linalg_cholesky_upper", "linalg_eigh", "linalg_eigvalsh", "scipy_cho_solve")},
    "pmean_batch_norm": "the row's cuvmap side squares x − mean, its NumPy side takes var (|x − mean|²)",
}

# primitives accounted for without a row that computes or refuses here, with the reason
_UNDER_VMAP = ("under vmap (the op-table rows) it is a reduction or a reshape, checked on complex values here; "
               "across processes tests/lax/test_collectives.py runs it on complex64/complex128")
ACCOUNTED = {
    "psum": _UNDER_VMAP, "all_gather": _UNDER_VMAP, "psum_scatter": _UNDER_VMAP, "ppermute": _UNDER_VMAP,
    "all_to_all": _UNDER_VMAP,
    "pmax": "under vmap reduce_max (lexicographic, checked here); across processes complex values are refused "
            "('complex values have no maximum', tests/lax/test_collectives.py)",
    "pmin": "as pmax",
    # no derivative for any dtype (JAX's have none either): test_no_derivative_for_any_dtype
    "schur": "no derivative rule for any dtype", "hessenberg": "no derivative rule for any dtype",
    "tridiagonal": "no derivative rule for any dtype", "pure_callback": "no derivative rule for any dtype",
    "quiet_cond": "cond under vmap with a batched predicate: test_cond_with_a_batched_predicate_on_complex_values",
    "reduce_precision": "real operands only: a complex one is a ShapeError (test_no_derivative_for_any_dtype)",
}


def _complexify(row, args, seed):
    rng = np.random.default_rng(row.seed("complex", seed))
    out = list(args)
    for i in row.diff_argnums:
        a = np.asarray(args[i])
        out[i] = a + 0.3j * rng.standard_normal(a.shape)
    return tuple(out), rng


def _directions(rng, values):
    """Random directions of ``values``' shapes and dtypes (complex parts for complex ones)."""
    def one(v):
        dtype = np.asarray(v).dtype
        d = rng.standard_normal(np.shape(v))
        return (d + 1j * rng.standard_normal(np.shape(v)) if dtype.kind == "c" else d).astype(dtype)
    return tuple(one(v) for v in values)


def _leaves(tree):
    return [np.asarray(x) for x in cv.tree.leaves(tree)]


def _equations(jaxpr):
    """``(eqn, is_call)`` for every equation of ``jaxpr`` and of the programs in its
    equations' parameters (cond's branches, scan's body, ...), a call equation first."""
    for eqn in jaxpr.eqns:
        values = [w for v in eqn.params.values() for w in (v if isinstance(v, (tuple, list)) else (v,))]
        inner = [j for j in (getattr(v, "jaxpr", v) for v in values) if hasattr(j, "eqns")]
        yield eqn, bool(inner) or isinstance(eqn.primitive, CallPrimitive) or eqn.primitive.name in CUSTOM_CALLS
        for j in inner:
            yield from _equations(j)


def _names(row, f, diff):
    """The primitives the row's function binds on these operands (its staged program's)."""
    try:
        closed = cv.make_jaxpr(f)(*diff)
    except Exception:  # noqa: BLE001 - a function that cannot be staged: its row prim only
        return {row.prim.name} if row.prim is not None else set()
    return {eqn.primitive.name for eqn, _ in _equations(closed.jaxpr)}


@functools.lru_cache(maxsize=None)
def outcome(name):
    """``(kind, detail, primitive names)`` of the row ``name`` on complex operands."""
    row = next(r for r in WALKED if r.name == name)
    args, rng = _complexify(row, row.make_args(F64), 0)
    f, diff = closed_over_nondiff(row, args)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", np.exceptions.ComplexWarning)  # a dropped imaginary part
            f(*diff)
    except (TypeError, ValueError, ShapeError, NotImplementedError) as e:
        return "refused", f"value: {type(e).__name__}: {e}", frozenset()
    prims = frozenset(_names(row, f, diff))
    t = _directions(rng, diff)
    try:
        cv.jvp(f, diff, t)
    except MissingRuleError as e:
        return "refused", f"jvp: {e}", prims
    return "computed", "", prims


def _case(r):
    marks = () if r.name in _FAST else (pytest.mark.slow,)
    return pytest.param(r, id=r.name, marks=marks)


CASES = [_case(r) for r in WALKED]


@pytest.mark.parametrize("row", CASES)
def test_a_rule_or_a_clear_refusal(row):
    kind, detail, prims = outcome(row.name)
    args, rng = _complexify(row, row.make_args(F64), 0)
    f, diff = closed_over_nondiff(row, args)
    if kind == "refused":
        # a refusal says why: cuvmap's messages name the complex dtype, NumPy's ufuncs say
        # they do not support the input types
        assert "complex" in detail or "not supported for the input types" in detail, detail
        if detail.startswith("jvp"):
            named = [p for p in prims if p not in REGISTERED and f"{p} has no JVP rule for complex numbers" in detail]
            assert named and "complex128" in detail, detail
            with pytest.raises(MissingRuleError, match="has no VJP rule for complex numbers"):
                out, pullback = cv.vjp(f, *diff)
                pullback(*[out])
        return
    outside = sorted(_complex_uses(f, diff) - REGISTERED)
    assert not outside, f"{row.name}: {outside} computed complex derivatives without complex rules"
    t = _directions(rng, diff)
    out, t_out = cv.jvp(f, diff, t)
    low = any(x.dtype in (np.float32, np.complex64) for x in _leaves(out))
    eps, tol = (1e-3, 1e-3) if low else (EPS, 1e-5)
    plus = f(*[d + eps * u for d, u in zip(diff, t)])
    minus = f(*[d - eps * u for d, u in zip(diff, t)])
    for got, p, m in zip(_leaves(t_out), _leaves(plus), _leaves(minus)):
        if got.dtype.kind not in "fc" or row.name in NO_FINITE_DIFFERENCES:
            continue
        np.testing.assert_allclose(got, (p - m) / (2 * eps), rtol=tol, atol=tol, err_msg=f"{row.name}: jvp")
    # the VJP is the JVP's transpose: re Σ ct·jvp(t) == re Σ vjp(ct)·t
    if "rev" in row.modes:
        out, pullback = cv.vjp(f, *diff)
        ct = cv.tree.map(lambda y: _directions(rng, (y,))[0], out)
        ct_in = pullback(ct)
        for c, d in zip(ct_in, diff):
            assert np.asarray(c).dtype == np.asarray(d).dtype, f"{row.name}: cotangent dtype"
        lhs = sum(np.real(np.sum(c * y)) for c, y in zip(_leaves(ct), _leaves(t_out)) if y.dtype.kind in "fc")
        rhs = sum(np.real(np.sum(np.asarray(c) * u)) for c, u in zip(ct_in, t))
        np.testing.assert_allclose(lhs, rhs, rtol=1e-7 if not low else 1e-4, atol=1e-7 if not low else 1e-4,
                                   err_msg=f"{row.name}: vjp is not the transpose of jvp")
    # a complex-linear JVP (a holomorphic function): jacfwd, jacrev and grad with holomorphic=True
    _holomorphic_jacobians(row, f, diff, t, t_out, rng, low)
    # jit and vmap of the JVP agree with the eager JVP (and a loop)
    n = len(diff)
    jitted = cv.jit(lambda *a: cv.jvp(f, a[:n], a[n:])[1])(*diff, *t)
    for got, want in zip(_leaves(jitted), _leaves(t_out)):
        np.testing.assert_allclose(got, want, rtol=1e-9 if not low else 1e-4, atol=1e-9 if not low else 1e-4,
                                   err_msg=f"{row.name}: jit")
    args2, rng2 = _complexify(row, row.make_args(F64), 1)
    _, diff2 = closed_over_nondiff(row, args2)
    t2 = _directions(rng2, diff2)
    stacked = [np.stack([a, b]) for a, b in zip(diff + t, diff2 + t2)]
    batched = cv.vmap(lambda *a: cv.jvp(f, a[:n], a[n:])[1])(*stacked)
    for k, (d, u) in enumerate(((diff, t), (diff2, t2))):
        want = cv.jvp(f, d, u)[1]
        for got, w in zip(_leaves(batched), _leaves(want)):
            np.testing.assert_allclose(got[k], w, rtol=1e-9 if not low else 1e-4, atol=1e-9 if not low else 1e-4,
                                       err_msg=f"{row.name}: vmap")


@pytest.mark.parametrize("row", CASES)
def test_values_match_numpy_on_complex_operands(row):
    """Where the row's NumPy reference computes on the complex operands (without a warning:
    no dropped imaginary part), cuvmap's value is NumPy's, eagerly and under jit: a silently
    wrong complex value (geomspace, nanvar and nanstd were) is caught here."""
    if outcome(row.name)[0] != "computed" or row.name in OTHER_VALUES:
        return
    args, _ = _complexify(row, row.make_args(F64), 0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            want = row.ref(*args)
    except Exception:  # noqa: BLE001 - a reference that does not take complex numbers
        return
    f, diff = closed_over_nondiff(row, args)
    for got in (f(*diff), cv.jit(f)(*diff)):
        for g, w in zip(_leaves(got), _leaves(want)):
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9, err_msg=f"{row.name}: value")


def _holomorphic_jacobians(row, f, diff, t, t_out, rng, low):
    """Where the row has one complex operand and one complex result and its JVP is
    complex-linear (jvp(i·t) = i·jvp(t): holomorphic), ``jacfwd``/``jacrev(holomorphic=True)``
    contract with ``t`` to the JVP and ``grad(Σ f·w, holomorphic=True)`` is ``w·J``."""
    outs = _leaves(t_out)
    if len(diff) != 1 or len(outs) != 1 or outs[0].dtype.kind != "c" or outs[0].size * np.size(diff[0]) > 4096:
        return
    (z,), (u,), (jvp_u,) = diff, t, outs
    i_jvp = _leaves(cv.jvp(f, (z,), (1j * u,))[1])[0]
    if not np.allclose(i_jvp, 1j * jvp_u, rtol=1e-9, atol=1e-9):
        return
    tol = 1e-4 if low else 1e-9
    axes = np.ndim(z)
    for jac in (cv.jacfwd, cv.jacrev) if "rev" in row.modes else (cv.jacfwd,):
        j = np.asarray(jac(f, holomorphic=True)(z))
        np.testing.assert_allclose(np.tensordot(j, u, axes=axes), jvp_u, rtol=tol, atol=tol,
                                   err_msg=f"{row.name}: {jac.__name__}(holomorphic=True)")
    if "rev" not in row.modes:
        return
    w = _directions(rng, (jvp_u,))[0]
    g = cv.grad(lambda z: cnp.sum(f(z) * w), holomorphic=True)(z)
    np.testing.assert_allclose(g, np.tensordot(w, j, axes=w.ndim), rtol=tol, atol=tol,
                               err_msg=f"{row.name}: grad(holomorphic=True)")


def _complex_uses(f, diff):
    """The differentiable primitives that meet a complex value in ``f``'s program (a call
    primitive, scan or cond, is its body's equations; comparisons and other primitives
    without derivatives are not uses)."""
    found = set()
    for eqn, is_call in _equations(cv.make_jaxpr(f)(*diff).jaxpr):
        prim = PRIMITIVES.get(eqn.primitive.name)
        if is_call or (prim is not None and not prim.differentiable):
            continue
        avals = [getattr(v, "aval", None) for v in list(eqn.invars) + list(eqn.outvars)]
        if any(a is not None and np.dtype(a.dtype).kind == "c" for a in avals):
            found.add(eqn.primitive.name)
    return found


@pytest.mark.slow
def test_every_primitive_has_a_complex_rule_or_refuses():
    """Each primitive of lax.all_primitives(): covered by a row that computes (and so was
    checked above), refused by one, without a derivative, or accounted for in ACCOUNTED."""
    computed, refused = set(), set()
    for r in WALKED:
        kind, detail, prims = outcome(r.name)
        if kind == "computed":
            computed |= {p for p in prims if p in REGISTERED or isinstance(PRIMITIVES.get(p), CallPrimitive)}
        else:
            refused |= {p.name for p in lax.all_primitives() if p.name in detail}
            if r.prim is not None:
                refused.add(r.prim.name)
    missing = []
    for p in lax.all_primitives():
        if p.name in computed or p.name in refused or p.name in ACCOUNTED or not p.differentiable:
            continue
        missing.append(p.name)
    assert not missing, f"primitives neither checked on complex values nor refusing them: {missing}"
    # every registered primitive is exercised by a row that computes (or accounted for)
    unexercised = sorted(p.name for p in REGISTRY if p.name not in computed and p.name not in ACCOUNTED)
    assert not unexercised, f"primitives with complex rules that no row checks: {unexercised}"


@pytest.mark.parametrize("fun,name", [
    (lambda z, w: lax.rem(z, w), "remainder"),
    (lambda z, w: lax.atan2(z, w), "atan2"),
    (lambda z, w: lax.cbrt(z), "cbrt"),
    (lambda z, w: cnp.floor_divide(z, w), "floor_divide"),
], ids=["remainder", "atan2", "cbrt", "floor_divide"])
def test_real_only_functions_refuse_complex_operands_by_name(fun, name):
    z = np.array([1.0 + 2.0j, -0.5 + 0.1j])
    with pytest.raises(TypeError):
        fun(z, z)  # eagerly: NumPy's ufunc refuses
    with pytest.raises(TypeError, match=f"{name}: complex operands are not supported, got complex128"):
        cv.jit(fun)(z, z)


def test_logistic_of_complex_numbers_is_holomorphic():
    z = np.array([0.3 + 0.4j, -1.0 + 2.0j, 2.0 - 0.5j])
    want = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(lax.logistic(z), want, rtol=1e-13)
    np.testing.assert_allclose(cv.jit(lax.logistic)(z), want, rtol=1e-13)
    np.testing.assert_allclose(cv.grad(lambda z: cnp.sum(lax.logistic(z)), holomorphic=True)(z),
                               want * (1 - want), rtol=1e-12)
    np.testing.assert_allclose(lax.logistic(np.array([-800.0, 0.0, 800.0])), [0.0, 0.5, 1.0])


def test_acosh_of_complex_numbers_has_the_principal_branchs_derivative():
    """1/(√(z − 1)·√(z + 1)), not 1/√(z² − 1) (which differs in sign where re z < 0)."""
    z = np.array([-2.0 + 0.5j, -0.5 - 1.5j, 1.5 + 0.2j, 0.1 + 3.0j])
    got = cv.grad(lambda z: cnp.sum(cnp.arccosh(z)), holomorphic=True)(z)
    fd = (np.arccosh(z + 1e-7) - np.arccosh(z - 1e-7)) / 2e-7
    np.testing.assert_allclose(got, fd, rtol=1e-6)
    np.testing.assert_allclose(got, 1 / (np.sqrt(z - 1) * np.sqrt(z + 1)), rtol=1e-12)


def test_no_derivative_for_any_dtype():
    """The primitives ACCOUNTED as having no derivative raise on complex operands too."""
    a = np.eye(3) + 0.1 * np.arange(9.0).reshape(3, 3) + 0.2j * np.arange(9.0).reshape(3, 3).T
    for name, f in [("schur", lambda a: lax.linalg.schur(a)[0]), ("hessenberg", lambda a: lax.linalg.hessenberg(a)[0]),
                    ("tridiagonal", lambda a: lax.linalg.tridiagonal(a + a.conj().T)[0])]:
        with pytest.raises(NotImplementedError, match=f"{name} has no derivative rule"):
            cv.jvp(f, (a,), (a,))
    with pytest.raises(ShapeError, match="reduce_precision.*complex128"):
        cv.jvp(lambda a: lax.reduce_precision(a, exponent_bits=8, mantissa_bits=23), (a,), (a,))
    cb = lambda a: cv.pure_callback(lambda v: v * 2, cv.ShapeDtypeStruct(a.shape, a.dtype), a)  # noqa: E731
    np.testing.assert_allclose(cb(a), 2 * a)
    with pytest.raises(Exception, match="pure_callback"):
        cv.jvp(cb, (a,), (a,))


def test_cond_with_a_batched_predicate_on_complex_values():
    """vmap of cond with a batched predicate (quiet_cond): JVP against finite differences,
    grad as ∂/∂x − i ∂/∂y, both under jit too."""
    z = np.array([0.5 + 1.0j, -1.0 + 0.3j, 2.0 - 0.7j])
    t = np.array([1.0 - 0.5j, 0.2 + 0.9j, -0.4 + 0.1j])

    def f(z):
        branch = lambda z: lax.cond(z.real > 0, lambda z: z * cnp.exp(z), lambda z: cnp.conj(z) ** 2, z)  # noqa: E731
        return cv.vmap(branch)(z)

    assert "quiet_cond" in str(cv.make_jaxpr(f)(z))
    fd = (f(z + 1e-6 * t) - f(z - 1e-6 * t)) / 2e-6
    np.testing.assert_allclose(cv.jvp(f, (z,), (t,))[1], fd, rtol=1e-6)
    np.testing.assert_allclose(cv.jit(lambda z, t: cv.jvp(f, (z,), (t,))[1])(z, t), fd, rtol=1e-6)
    g = cv.grad(lambda z: cnp.sum(cnp.abs(f(z)) ** 2))(z)
    w = np.where(z.real > 0, z * np.exp(z), np.conj(z) ** 2)
    # ∂/∂x − i ∂/∂y of |w|²: 2·conj(w)·w'(z) for a holomorphic w; for w = conj(z)²,
    # |w|² = |z|⁴, whose gradient is 4|z|²·conj(z) = 2·w·2z
    want = np.where(z.real > 0, 2 * np.conj(w) * (1 + z) * np.exp(z), 2 * w * 2 * z)
    np.testing.assert_allclose(g, want, rtol=1e-10)
    np.testing.assert_allclose(cv.jit(cv.grad(lambda z: cnp.sum(cnp.abs(f(z)) ** 2)))(z), want, rtol=1e-10)


def _listed(marker):
    """The primitive names docs/complex.md lists after ``<!-- complex-primitives: marker -->``."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "complex.md").read_text()
    block = text.split(f"<!-- complex-primitives: {marker} -->", 1)[1].strip().split("\n\n", 1)[0]
    return set(re.findall(r"`([a-z0-9_]+)`", block))


def test_the_docs_list_every_primitive_as_the_code_has_it():
    """docs/complex.md's two lists are the registry and the differentiable primitives
    outside it (control flow aside): the page says which functions support complex inputs."""
    rules = {p.name for p in REGISTRY}
    refused = {p.name for p in lax.all_primitives()
               if p.differentiable and p.name not in rules and not isinstance(p, CallPrimitive)}
    assert _listed("rules") == rules, "docs/complex.md: update the list of primitives with complex rules"
    assert _listed("refused") == refused, "docs/complex.md: update the list of primitives without complex rules"


def _on_gpu(values):
    return tuple(cv.device_put(v, "gpu") for v in values)


GPU_CASES = [pytest.param(r, id=r.name, marks=[pytest.mark.gpu, *(() if r.name in _FAST else (pytest.mark.slow,))])
             for r in WALKED]


@pytest.mark.parametrize("row", GPU_CASES)
def test_jvp_on_the_gpu_matches_the_cpu(row):
    """The complex JVP of every row that computes, eagerly and jitted on the GPU (CuPy; the
    strict stand-in without one: its kernels as C, complex arithmetic included), equals
    the CPU's."""
    if outcome(row.name)[0] != "computed" or not cv_backend.gpu_available():
        pytest.skip("refused on the CPU, or no GPU")
    args, rng = _complexify(row, row.make_args(F64), 0)
    args_gpu = tuple(cv.device_put(a, "gpu") if isinstance(a, np.ndarray) else a for a in args)
    f, diff = closed_over_nondiff(row, args)
    f_gpu, diff_gpu = closed_over_nondiff(row, args_gpu)
    t = _directions(rng, diff)
    want = _leaves(cv.jvp(f, diff, t)[1])
    n = len(diff)
    for got in (cv.jvp(f_gpu, diff_gpu, _on_gpu(t))[1],
                cv.jit(lambda *a: cv.jvp(f_gpu, a[:n], a[n:])[1])(*diff_gpu, *_on_gpu(t))):
        for g, w in zip(cv.tree.leaves(got), want):
            g = g.get() if hasattr(g, "get") else np.asarray(g)
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9, err_msg=f"{row.name}: gpu")
