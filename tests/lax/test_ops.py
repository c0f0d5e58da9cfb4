"""Generic tests driven by the op table (``op_table.py``): every row gets

- its impl checked against its NumPy reference, in each of the row's dtypes and backends;
- (primitive rows) its shape rule checked against the impl's output shape and dtype;
- ``vmap`` checked against a per-example loop, for every ``in_axes`` combination of its
  operands (axes 0, 1, -1 and None; sampled for three operands) at batch sizes 3, 1 and 0;
- (differentiable rows) forward and reverse mode checked against central finite
  differences in float64, to second order, and ``jacfwd`` against ``jacrev``;
- (non-differentiable rows) zero tangents and cotangents;

and a sample of rows gets ``vmap`` of ``vmap``, ``vmap`` of ``grad`` and ``grad`` of
``vmap``. The registry test fails when a primitive lacks a rule or a row.
"""
import itertools
import random

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import backend as cv_backend
from cuvmap import core, lax
from cuvmap.lax.elementwise import select_impl, select_into
from cuvmap.test_util import check_batching, check_grads, missing_rules
from cuvmap.transforms import batching, jvp as jvp_mod, vjp as vjp_mod
from cuvmap.transforms.call import CallPrimitive
from cuvmap.transforms.program_call import jit_call_p
from cuvmap.transforms.remat import checkpoint_p

from op_table import ALL_ROWS, F32, F64, NESTED_SAMPLE, PRIMITIVE_ROWS, closed_over_nondiff, weighted_sum

ROWS_BY_NAME = {r.name: r for r in ALL_ROWS}


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def put(args, backend):
    """Moves the array operands to ``backend``; Python scalars stay as they are (weak types)."""
    if backend == "cpu":
        return tuple(args)
    return tuple(cv.device_put(a, "gpu") if isinstance(a, np.ndarray) else a for a in args)


def to_numpy(x):
    if cv_backend.is_cupy_array(x):
        return x.get()
    return np.asarray(x)


def assert_matches(got, want, rtol, atol, what=""):
    got, want = to_numpy(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    if want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def axis_choices(arg):
    if arg.is_pyscalar:
        return (None,)
    if len(arg.shape) == 0:
        return (0, -1, None)
    return (0, 1, -1, None)


def in_axes_combos(row, max_combos=20):
    """Every combination of per-operand axes with at least one operand mapped; for rows
    with more than two operands, a deterministic sample that keeps "all at 0" and each
    operand mapped alone."""
    choices = [axis_choices(a) for a in row.args]
    combos = [c for c in itertools.product(*choices) if any(ax is not None for ax in c)]
    if len(row.args) <= 2 or len(combos) <= max_combos:
        return combos
    must = [tuple(0 if ch != (None,) else None for ch in choices)]
    for i, ch in enumerate(choices):
        if ch != (None,):
            must.append(tuple(-1 if j == i else None for j in range(len(choices))))
    rest = [c for c in combos if c not in must]
    rnd = random.Random(row.seed("in_axes"))
    return must + rnd.sample(rest, max_combos - len(must))


def batched_shape(shape, axis, size):
    """``shape`` with a mapped axis of ``size`` inserted where ``in_axes`` entry ``axis``
    says (``None``: unchanged)."""
    if axis is None:
        return tuple(shape)
    pos = axis if axis >= 0 else len(shape) + 1 + axis
    return tuple(shape[:pos]) + (size,) + tuple(shape[pos:])


def axes_id(in_axes):
    return "in_axes=(" + ",".join("N" if a is None else str(a) for a in in_axes) + ")"


def _random(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape)


# ---------------------------------------------------------------------------------------
# Parameter lists
# ---------------------------------------------------------------------------------------

def _sample(seq, k, seed):
    """The first element and ``k - 1`` others, deterministically."""
    seq = list(seq)
    if len(seq) <= k:
        return seq
    return [seq[0]] + random.Random(seed).sample(seq[1:], k - 1)


def _slow_unless(chosen, case):
    """The marks of a case of a sweep: none when it is among the chosen, else ``slow``."""
    return () if case in chosen else (pytest.mark.slow,)


def _first_dtype_fast(r, d):
    """The marks of a row's dtype: -m "not slow" checks each row in its first dtype, the
    full suite in every dtype the row lists."""
    return _slow_unless(r.dtypes[:1], d)


def _sampled_unless_nested(r):
    """The marks of a check that -m "not slow" runs on the op table's nested sample
    (NESTED_SAMPLE: rows of every family) and the full suite on every row."""
    return () if r.name in NESTED_SAMPLE else (pytest.mark.slow,)


# the impl on each backend in each dtype; -m "not slow": every row on the CPU in its first
# dtype, the nested sample on the GPU (the strict CuPy stand-in without one)
IMPL_CASES = [
    pytest.param(r, d, "cpu", id=f"{r.name}-{d.name}-cpu", marks=_first_dtype_fast(r, d))
    for r in ALL_ROWS for d in r.dtypes
] + [
    pytest.param(r, d, "gpu", id=f"{r.name}-{d.name}-gpu",
                 marks=[pytest.mark.gpu, *(_first_dtype_fast(r, d) or _sampled_unless_nested(r))])
    for r in ALL_ROWS for d in r.dtypes
]
SHAPE_CASES = [pytest.param(r, d, id=f"{r.name}-{d.name}", marks=_first_dtype_fast(r, d))
               for r in PRIMITIVE_ROWS for d in r.dtypes]
# vmap against the loop: every in_axes combination on the CPU; on the GPU (the strict CuPy
# stand-in without one) a sample of GPU_VMAP_SAMPLE per row, the first combination (every
# operand mapped at 0) among them: the batching rules are the CPU's, what the GPU variant
# adds is the device discipline of the batched impls, and the whole set would add a quarter
# to the suite's time. -m "not slow" takes DEFAULT_VMAP_SAMPLE of each row's combinations on
# the CPU (the first among them) and the first on the GPU: every row's batching rule, in a
# fifth of the time; the combinations marked slow run in the full suite. (On the GPU -m "not
# slow" takes the nested sample's rows only.)
GPU_VMAP_SAMPLE = 3
DEFAULT_VMAP_SAMPLE = 1
# Batch sizes: -m "not slow" maps each row's sampled combination at size 3 (the nested
# sample's rows at 3, 1 and 0 as well); the full suite every combination at 3, 1 and 0.
ALL_SIZES, FIRST_SIZE, OTHER_SIZES = (3, 1, 0), (3,), (1, 0)


def _cpu_vmap_cases(r, c, chosen):
    if c in chosen and r.name not in NESTED_SAMPLE:
        return [pytest.param(r, c, "cpu", FIRST_SIZE, id=f"cpu-{r.name}-{axes_id(c)}"),
                pytest.param(r, c, "cpu", OTHER_SIZES, id=f"cpu-{r.name}-{axes_id(c)}-sizes10",
                             marks=pytest.mark.slow)]
    return [pytest.param(r, c, "cpu", ALL_SIZES, id=f"cpu-{r.name}-{axes_id(c)}", marks=_slow_unless(chosen, c))]


VMAP_CASES = [
    case
    for r in ALL_ROWS if r.args for combos in [in_axes_combos(r)]
    for chosen in [_sample(combos, DEFAULT_VMAP_SAMPLE, r.seed("cpu"))] for c in combos
    for case in _cpu_vmap_cases(r, c, chosen)
] + [
    pytest.param(r, c, "gpu", ALL_SIZES, id=f"gpu-{r.name}-{axes_id(c)}",
                 marks=[pytest.mark.gpu, *(_slow_unless(combos[:1], c) or _sampled_unless_nested(r))])
    for r in ALL_ROWS if r.args for combos in [_sample(in_axes_combos(r), GPU_VMAP_SAMPLE, r.seed("gpu"))]
    for c in combos
]
GRAD_ROWS = [r for r in ALL_ROWS if r.differentiable and r.diff_argnums and F64 in r.dtypes]
REV_ROWS = [r for r in GRAD_ROWS if "rev" in r.modes]
NONDIFF_ROWS = [r for r in ALL_ROWS if not r.differentiable and r.diff_argnums and F64 in r.dtypes]
NESTED_ROWS = [ROWS_BY_NAME[n] for n in NESTED_SAMPLE]
NESTED_GRAD_ROWS = [r for r in NESTED_ROWS if r in REV_ROWS]


def _nested_cases():
    cases = []
    for row in NESTED_ROWS:
        for inner in _sample(in_axes_combos(row), 2, row.seed("inner")):
            ranks = [len(batched_shape(a.shape, ax, 2)) for a, ax in zip(row.args, inner)]
            outer_choices = [
                (None,) if a.is_pyscalar else ((0, 1, -1, None) if r >= 1 else (0, None))
                for a, r in zip(row.args, ranks)
            ]
            outers = [c for c in itertools.product(*outer_choices) if any(ax is not None for ax in c)]
            for outer in _sample(outers, 2, row.seed("outer", inner)):
                name = f"{row.name}-inner{axes_id(inner)[7:]}-outer{axes_id(outer)[7:]}"
                first_of_row = not cases or cases[-1].values[0] is not row
                marks = () if first_of_row else (pytest.mark.slow,)
                cases.append(pytest.param(row, inner, outer, id=name, marks=marks))
    return cases


NESTED_CASES = _nested_cases()
# a sample of each row's combinations, the first by default (-m "not slow")
VMAP_GRAD_CASES = [
    pytest.param(r, c, id=f"{r.name}-{axes_id(c)}", marks=_slow_unless(combos[:1], c))
    for r in NESTED_GRAD_ROWS for combos in [_sample(in_axes_combos(r), 3, r.seed("vmap_grad"))] for c in combos
]
GRAD_VMAP_CASES = [
    pytest.param(r, c, id=f"{r.name}-{axes_id(c)}", marks=_slow_unless(combos[:1], c))
    for r in NESTED_GRAD_ROWS for combos in [_sample(in_axes_combos(r), 2, r.seed("grad_vmap"))] for c in combos
]


# ---------------------------------------------------------------------------------------
# The registry and the table's coverage
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("prim", lax.all_primitives(), ids=lambda p: p.name)
def test_registry_has_every_rule(prim):
    assert not missing_rules(prim), missing_rules(prim)


_PROBE_FAMILY = """
import numpy as np
from cuvmap.core import Primitive, ShapedArray

probe_p = Primitive("registry_probe")
probe_p.impl = np.negative
probe_p.shape_rule = lambda x: ShapedArray(x.shape, x.dtype)
"""


def test_the_registry_sees_a_family_that_no_list_names(tmp_path, monkeypatch):
    """A new module of cuvmap.lax that defines a primitive without rules is found (its
    primitive registered itself) and fails the registry test's check."""
    import gc
    import sys

    (tmp_path / "registry_probe_family.py").write_text(_PROBE_FAMILY)
    monkeypatch.setattr(lax, "__path__", [*lax.__path__, str(tmp_path)])
    try:
        found = {p.name: p for p in lax.all_primitives()}
        assert "registry_probe" in found
        assert missing_rules(found["registry_probe"]) == [
            "registry_probe has no batching rule", "registry_probe has no JVP rule", "registry_probe has no VJP rule"]
    finally:
        sys.modules.pop("cuvmap.lax.registry_probe_family", None)
        if hasattr(lax, "registry_probe_family"):
            delattr(lax, "registry_probe_family")
        found = None
        gc.collect()
    assert "registry_probe" not in [p.name for p in core.registered_primitives()]


def test_a_call_like_primitive_declares_where_its_rules_are():
    """A primitive whose rules are methods of its class (a call-like primitive) names them
    in ``rule_methods``; the registry check then asks for those methods, not for entries
    of the rule tables."""
    class ProbeCall(core.Primitive):
        __slots__ = ()
        rule_methods = ("batch", "jvp")

        def batch(self, trace, args, params):
            return args

    class ProbeLoop(ProbeCall):  # a subclass inherits the rules its class defines
        __slots__ = ()

        def jvp(self, primals, tangents, params):
            return primals, tangents

    p = ProbeCall("probe_call")
    p.impl = lambda *args: list(args)
    assert p.module == __name__  # the module that made it, past the subclass's __init__
    assert missing_rules(p) == ["probe_call has no method jvp (one of its rule_methods)"]
    loop = ProbeLoop("probe_loop")
    loop.impl = p.impl
    assert missing_rules(loop) == []
    assert p not in lax.all_primitives() and loop not in lax.all_primitives()  # cuvmap's families only

    # the call protocol defines none of its rule methods: a call primitive states each
    # (control flow), or inherits a program call's (jit's call, checkpoint)
    class ProbeProtocol(CallPrimitive):
        __slots__ = ()

        def run(self, *args):
            return list(args)

    bare = ProbeProtocol("probe_protocol")
    assert missing_rules(bare) == [f"probe_protocol has no method {m} (one of its rule_methods)"
                                   for m in CallPrimitive.rule_methods if m != "run"]
    assert missing_rules(jit_call_p) == [] and missing_rules(checkpoint_p) == []
    assert set(CallPrimitive.rule_methods) >= {"batch", "jvp", "vjp", "partial_eval", "dce"}
    assert {"cond", "scan", "while"} <= {q.name for q in lax.all_primitives() if isinstance(q, CallPrimitive)}


def test_every_primitive_has_a_row():
    covered = {r.prim for r in PRIMITIVE_ROWS} | {p for r in ALL_ROWS for p in r.covers}
    missing = [p.name for p in lax.all_primitives() if p not in covered]
    assert not missing, f"primitives without a row in tests/op_table.py: {missing}"


def test_rows_bind_their_primitive_with_their_params():
    """The ``params`` a row states are the ones its wrapper binds (checked on the output
    shape of ``prim.impl``), so the shape rule test tests what the wrapper runs."""
    for row in PRIMITIVE_ROWS:
        args = row.make_args(row.dtypes[0])
        direct = row.prim.impl(*args, **row.params)
        assert np.shape(row.fun(*args)) == np.shape(direct), row.name


# ---------------------------------------------------------------------------------------
# Impl, shape rule
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("row,dtype,backend", IMPL_CASES)
def test_impl_matches_numpy(row, dtype, backend):
    if backend == "gpu" and not cv_backend.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    args = row.make_args(dtype)
    want = row.ref(*args)
    got = row.fun(*put(args, backend))
    if backend == "gpu" and row.args:
        assert cv_backend.is_cupy_array(got), f"{row.name}: result left the GPU ({type(got).__name__})"
    rtol, atol = row.tolerance(np.asarray(want).dtype)
    assert_matches(got, want, rtol, atol, row.name)


@pytest.mark.parametrize("row,dtype", SHAPE_CASES)
def test_shape_rule_matches_impl(row, dtype):
    args = row.make_args(dtype)
    avals = [core.get_aval(a) for a in args]
    out_aval = row.prim.shape_rule(*avals, **row.params)
    out = row.prim.impl(*args, **row.params)
    assert tuple(out_aval.shape) == np.shape(out), f"shape rule says {out_aval}, impl gives {np.shape(out)}"
    out_dtype = np.asarray(out).dtype
    assert out_aval.dtype == out_dtype, f"shape rule says {out_aval}, impl gives {out_dtype}"


# ---------------------------------------------------------------------------------------
# vmap
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("row,in_axes,backend,sizes", VMAP_CASES)
def test_vmap_matches_loop(row, in_axes, backend, sizes):
    if backend == "gpu" and not cv_backend.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    for size in sizes:
        shapes = [batched_shape(a.shape, ax, size) for a, ax in zip(row.args, in_axes)]
        args = row.make_args(row.vmap_dtype, shapes, seed=size)
        check_batching(row.fun, put(args, backend), in_axes=in_axes, atol=1e-10, rtol=1e-10)


# two combinations per dtype; -m "not slow" takes the first combination of the first other
# dtype of the nested sample's rows
OTHER_DTYPE_VMAP_CASES = [
    pytest.param(r, d, c, id=f"{r.name}-{d.name}-{axes_id(c)}",
                 marks=_slow_unless(combos[:1], c) or _slow_unless(others[:1], d) or _sampled_unless_nested(r))
    for r in ALL_ROWS if r.args for others in [[d for d in r.dtypes if d != r.vmap_dtype]] for d in others
    for combos in [_sample(in_axes_combos(r), 2, r.seed("dtype", d.name))] for c in combos
]


@pytest.mark.parametrize("row,dtype,in_axes", OTHER_DTYPE_VMAP_CASES)
def test_vmap_matches_loop_other_dtypes(row, dtype, in_axes):
    shapes = [batched_shape(a.shape, ax, 3) for a, ax in zip(row.args, in_axes)]
    args = row.make_args(dtype, shapes, seed=11)
    tol = 1e-5 if dtype == F32 else 0
    check_batching(row.fun, args, in_axes=in_axes, atol=tol, rtol=tol)


def _nested_loop(f, args, inner, outer):
    """The reference for ``vmap(vmap(f, inner), outer)``: two Python loops."""
    size_out = next(np.shape(a)[ax] for a, ax in zip(args, outer) if ax is not None)
    results = []
    for b in range(size_out):
        ex = [a if ax is None else np.take(a, b, axis=ax) for a, ax in zip(args, outer)]
        size_in = next(np.shape(a)[ax] for a, ax in zip(ex, inner) if ax is not None)
        row = []
        for c in range(size_in):
            ex2 = [a if ax is None else np.take(a, c, axis=ax) for a, ax in zip(ex, inner)]
            row.append(to_numpy(f(*ex2)))
        results.append(np.stack(row))
    return np.stack(results)


@pytest.mark.parametrize("row,inner,outer", NESTED_CASES)
def test_vmap_of_vmap_matches_loops(row, inner, outer):
    shapes = [
        batched_shape(batched_shape(a.shape, ai, 2), ao, 3) for a, ai, ao in zip(row.args, inner, outer)
    ]
    args = row.make_args(row.vmap_dtype, shapes, seed=7)
    got = cv.vmap(cv.vmap(row.fun, in_axes=inner), in_axes=outer)(*args)
    want = _nested_loop(row.fun, args, inner, outer)
    assert_matches(got, want, 1e-10, 1e-10, f"{row.name} vmap of vmap")


# ---------------------------------------------------------------------------------------
# Derivatives
# ---------------------------------------------------------------------------------------


def _grad_cases():
    """Every row's first-order rules in -m "not slow"; a row's second order there only on
    the nested sample, the rest's in the full suite (the second order is three quarters
    of the sweep's time)."""
    for r in GRAD_ROWS:
        if r.grad_order == 1 or r.name in NESTED_SAMPLE:
            yield pytest.param(r, r.grad_order, id=r.name)
        else:
            yield pytest.param(r, 1, id=r.name)
            yield pytest.param(r, r.grad_order, id=f"{r.name}-order{r.grad_order}", marks=pytest.mark.slow)


@pytest.mark.parametrize("row,order", list(_grad_cases()))
def test_grads_match_finite_differences(row, order):
    f, diff = closed_over_nondiff(row, row.make_args(F64))
    check_grads(f, diff, order=order, modes=row.modes, atol=row.grad_tol, rtol=row.grad_tol, eps=row.grad_eps)


# -m "not slow": the nested sample (grads_match_finite_differences checks every row's rules)
@pytest.mark.parametrize("row", [pytest.param(r, id=r.name, marks=_sampled_unless_nested(r)) for r in REV_ROWS])
def test_jacfwd_matches_jacrev(row):
    f, diff = closed_over_nondiff(row, row.make_args(F64))
    argnums = tuple(range(len(diff)))
    out_shape = np.shape(f(*diff))
    fwd = cv.jacfwd(f, argnums)(*diff)
    rev = cv.jacrev(f, argnums)(*diff)
    assert len(fwd) == len(rev) == len(diff)
    for i, (a, b, x) in enumerate(zip(fwd, rev, diff)):
        assert np.shape(a) == out_shape + np.shape(x), f"jacfwd block {i}: shape {np.shape(a)}"
        # a float32 operand's reverse-mode block is float32 (its cotangent's dtype)
        tol = 1e-6 if np.result_type(a, b) != F64 or x.dtype != F64 else 1e-10
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=tol, atol=tol,
                                   err_msg=f"{row.name}: jacfwd vs jacrev, operand {i}")


@pytest.mark.parametrize("row", [pytest.param(r, id=r.name, marks=_sampled_unless_nested(r))
                                 for r in REV_ROWS if F32 in r.dtypes])
def test_derivatives_keep_float32(row):
    """Tangents have the output's dtype and cotangents the inputs' (no silent float64)."""
    f, diff = closed_over_nondiff(row, row.make_args(F32))
    tangents = tuple(_random(i, np.shape(x)).astype(np.float32) for i, x in enumerate(diff))
    out, t_out = cv.jvp(f, diff, tangents)
    t_dtype, out_dtype = to_numpy(t_out).dtype, to_numpy(out).dtype
    assert t_dtype == out_dtype, f"tangent {t_dtype}, output {out_dtype}"
    assert np.shape(t_out) == np.shape(out)
    out, pullback = cv.vjp(f, *diff)
    cts = pullback(_random(9, np.shape(out)).astype(to_numpy(out).dtype))
    for c, x in zip(cts, diff):
        c_aval = (np.shape(c), to_numpy(c).dtype)
        assert c_aval == (np.shape(x), x.dtype), f"cotangent {c_aval}, operand {(np.shape(x), x.dtype)}"


@pytest.mark.parametrize("row", NONDIFF_ROWS, ids=lambda r: r.name)
def test_nondifferentiable_has_zero_derivatives(row):
    f, diff = closed_over_nondiff(row, row.make_args(F64))
    tangents = tuple(_random(i, np.shape(x)) for i, x in enumerate(diff))
    out, t_out = cv.jvp(f, diff, tangents)
    assert np.shape(t_out) == np.shape(out)
    assert not np.any(to_numpy(t_out)), f"{row.name}: nonzero tangent {t_out}"
    if core.is_float(out):
        out, pullback = cv.vjp(f, *diff)
        cts = pullback(_random(9, np.shape(out)))
        for c, x in zip(cts, diff):
            assert np.shape(c) == np.shape(x)
            assert not np.any(to_numpy(c)), f"{row.name}: nonzero cotangent {c}"


@pytest.mark.parametrize("row,in_axes", VMAP_GRAD_CASES)
def test_vmap_of_grad_matches_loop(row, in_axes):
    weights = _random(row.seed("w"), np.shape(row.fun(*row.make_args(F64))))
    g = cv.grad(weighted_sum(row.fun, weights), argnums=row.diff_argnums)
    shapes = [batched_shape(a.shape, ax, 3) for a, ax in zip(row.args, in_axes)]
    args = row.make_args(F64, shapes, seed=3)
    check_batching(g, args, in_axes=in_axes, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("row,in_axes", GRAD_VMAP_CASES)
def test_grad_of_vmap_matches_finite_differences(row, in_axes):
    shapes = [batched_shape(a.shape, ax, 3) for a, ax in zip(row.args, in_axes)]
    args = row.make_args(F64, shapes, seed=5)
    vf = cv.vmap(row.fun, in_axes=in_axes)
    weights = _random(row.seed("W"), np.shape(vf(*args)))
    # the operands that are not differentiated (indices, predicates) stay fixed, batched or not
    f, diff = closed_over_nondiff(row, args, fun=weighted_sum(vf, weights))
    check_grads(f, diff, order=row.grad_order, modes=("fwd", "rev"), atol=row.grad_tol, rtol=row.grad_tol,
                eps=row.grad_eps)


# The branch-free select (NOTE [branch-free select] in cuvmap/lax/elementwise/comparisons.py) blends
# bit patterns and reuses its mask's buffer when it can: its result must equal np.where
# bit for bit, special values included, whichever operand broadcasts.
SPECIAL_VALUES = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -2.5, 3.0])
SELECT_SHAPES = [
    # pred, on_true, on_false: a shape, or a Python scalar
    ((2, 8), (2, 8), (2, 8)),
    ((2, 8), (2, 8), 0),
    ((2, 8), (2, 8), 0.0),
    ((2, 8), (2, 8), -0.0),
    ((2, 8), (2, 8), 2.5),
    ((8,), (2, 8), (2, 8)),
    ((8,), (2, 8), 0),
    ((2, 8), (8,), (2, 1)),
    ((2, 8), (1, 8), 0),
    # a positive zero on the true side: relu's ``x <= 0 ? 0 : x`` and its VJP
    ((2, 8), 0, (2, 8)),
    ((2, 8), 0.0, (2, 8)),
    ((2, 8), -0.0, (2, 8)),
    ((8,), 0, (2, 8)),
    ((2, 8), 0, (1, 8)),
]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shapes", SELECT_SHAPES, ids=str)
def test_branch_free_select_matches_where_bit_for_bit(shapes, dtype):
    rng = np.random.default_rng(0)
    pred_shape, true_shape, false_spec = shapes
    pred = rng.random(pred_shape) < 0.5

    def operand(shape):
        return rng.choice(SPECIAL_VALUES, size=shape).astype(dtype)

    on_true = operand(true_shape) if isinstance(true_shape, tuple) else true_shape
    on_false = operand(false_spec) if isinstance(false_spec, tuple) else false_spec
    got = select_impl(pred, on_true, on_false)
    want = np.where(pred, on_true, on_false)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def _select_into_cases():
    """(shapes, buffer): a fresh buffer, and each operand that has the result's shape (the
    planner writes into no other)."""
    for shapes in SELECT_SHAPES:
        full = np.broadcast_shapes(*(s if isinstance(s, tuple) else () for s in shapes))
        yield pytest.param(shapes, "fresh", id=f"{shapes}-fresh")
        for name, s in (("on_true", shapes[1]), ("on_false", shapes[2])):
            if isinstance(s, tuple) and s == full:
                yield pytest.param(shapes, name, id=f"{shapes}-{name}")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shapes,into", list(_select_into_cases()))
def test_select_into_a_buffer_matches_where_bit_for_bit(shapes, dtype, into):
    """The jit executor's select (select_into) writes the same bits as np.where into its
    buffer, also when the buffer is one of the operands (an in-place step)."""
    rng = np.random.default_rng(1)
    pred_shape, true_shape, false_spec = shapes
    pred = rng.random(pred_shape) < 0.5
    on_true = rng.choice(SPECIAL_VALUES, size=true_shape).astype(dtype) if isinstance(true_shape, tuple) \
        else true_shape
    on_false = rng.choice(SPECIAL_VALUES, size=false_spec).astype(dtype) if isinstance(false_spec, tuple) \
        else false_spec
    want = np.where(pred, on_true, on_false)
    if into == "fresh":
        out = np.full(want.shape, 7.0, dtype)
    else:
        out = on_true if into == "on_true" else on_false
    got = select_into(pred, on_true, on_false, out=out)
    assert got is out
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_select_into_declines_what_it_cannot_blend():
    with pytest.raises(TypeError):
        select_into(np.array([True, False]), np.array([1, 2]), 0, out=np.empty(2, np.int64))

