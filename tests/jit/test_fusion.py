"""GPU fusion and CUDA-graph replay of jitted programs.

On the CPU (always): the partition into fused groups (NOTE [fusion groups]) run through
the groups' references equals unfused execution on random programs (broadcasting,
reductions, selects, non-finite literals), the groups respect their limits, the CUDA
source of a group is what it should be (and compiles with NVRTC where CuPy's NVRTC is
installed), the graph runner's protocol (NOTE [graph replay]) against a stand-in for CuPy,
and the settings that switch both off. On a GPU (the ``gpu`` marks, run by
``tools/gpu_checks.sh``): fused kernels and graph replay give the same bits as the
program run op by op, and a failed capture falls back with a warning.
"""
import contextlib
import threading
import types
import warnings

import numpy as np
import pytest
from hypothesis import given, settings

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import backend, config, core, nn
from cuvmap.cuda import graphs, kernels
from cuvmap.transforms import executor, fusion, ir

from random_programs import program_fun, programs


def _program(f, *args):
    return ir.optimize(cv.make_jaxpr(f)(*args))


def _units(f, *args):
    closed = _program(f, *args)
    return fusion.fuse(closed.jaxpr.eqns, closed.jaxpr.outvars)


def _groups(units):
    return [u for u in units if isinstance(u, fusion.FusedGroup)]


def _run_fused_on_cpu(closed, args):
    """The program planned with fusion, each group run by its reference."""
    p = executor.plan(closed, fuse=True, fused_callable=lambda g: g.reference, graphs=False)
    return p.program(list(args)), p


# ---------------------------------------------------------------------------------------
# The partition
# ---------------------------------------------------------------------------------------


def chain(x, y):
    for _ in range(4):
        x = cnp.tanh(x * 1.5 + y) - cnp.sin(x)
    return cnp.sum(x)


def test_a_chain_is_one_group_and_the_reduction_stays():
    x, y = np.linspace(0, 1, 32).reshape(4, 8), np.full((4, 8), 0.25)
    units = _units(chain, x, y)
    groups = _groups(units)
    assert len(groups) == 1 and len(groups[0].eqns) == 4 * 5
    assert [u.primitive.name for u in units if not isinstance(u, fusion.FusedGroup)] == ["reduce_sum"]
    assert len(groups[0].outputs) == 1 and len(groups[0].inputs) == 2  # the literals are in the source


def test_a_value_read_outside_is_an_output_and_a_reduction_splits_the_chain():
    def f(x):
        a = cnp.exp(x) * 2.0
        s = cnp.sum(a, axis=1, keepdims=True)  # reads a: the first group closes before it
        return cnp.tanh(a - s) + a

    x = np.linspace(-1, 1, 12).reshape(3, 4)
    units = _units(f, x)
    names = [("group" if isinstance(u, fusion.FusedGroup) else u.primitive.name) for u in units]
    assert names[:2] == ["group", "reduce_sum"], names
    first = units[0]
    assert [v.aval.shape for v in first.outputs] == [(3, 4)]
    got, _ = _run_fused_on_cpu(_program(f, x), [x])
    np.testing.assert_array_equal(got[0], f(x))


def test_broadcast_inputs_join_a_group_of_the_larger_shape():
    def f(x, row):
        h = cnp.sin(row) * 3.0  # shape (4,): a group of its own shape (one equation: stays)
        return cnp.exp(x) * h + x

    x, row = np.linspace(0, 1, 12).reshape(3, 4), np.linspace(1, 2, 4)
    closed = _program(f, x, row)
    groups = _groups(fusion.fuse(closed.jaxpr.eqns, closed.jaxpr.outvars))
    big = [g for g in groups if g.shape == (3, 4)]
    assert len(big) == 1 and any(x.aval.shape == (4,) for x in big[0].inputs)
    got, _ = _run_fused_on_cpu(closed, [x, row])
    np.testing.assert_array_equal(got[0], f(x, row))


def test_groups_respect_their_limits():
    def long_chain(x):
        for _ in range(150):
            x = cnp.sin(x) * 1.01
        return x

    x = np.linspace(0, 1, 8)
    groups = _groups(_units(long_chain, x))
    assert all(len(g.eqns) <= fusion.MAX_GROUP_EQNS for g in groups)
    assert sum(len(g.eqns) for g in groups) == 300

    def many_inputs(*xs):
        acc = xs[0]
        for v in xs[1:]:
            acc = acc * v + 1.0
        return acc

    xs = [np.full(8, 1.0 + i / 100) for i in range(40)]
    closed = _program(many_inputs, *xs)
    groups = _groups(fusion.fuse(closed.jaxpr.eqns, closed.jaxpr.outvars))
    assert len(groups) >= 2
    assert all(len(g.inputs) + len(g.outputs) <= fusion.MAX_KERNEL_ARGS for g in groups)
    got, _ = _run_fused_on_cpu(closed, xs)
    np.testing.assert_array_equal(got[0], many_inputs(*xs))


def test_non_fusible_equations_and_dtypes_are_left_alone():
    def f(x, i):
        y = cnp.sin(x) * 2.0
        z = y @ y.T  # dot_general
        w = cnp.cumsum(z, axis=0)
        return cnp.exp(w) + 1.0, (i + 1) * 2

    x, i = np.linspace(0, 1, 6).reshape(2, 3), np.arange(3, dtype=np.int32)
    closed = _program(f, x, i)
    units = fusion.fuse(closed.jaxpr.eqns, closed.jaxpr.outvars)
    names = [u.primitive.name for u in units if not isinstance(u, fusion.FusedGroup)]
    assert "dot_general" in names and "cumsum" in names
    got, _ = _run_fused_on_cpu(closed, [x, i])
    want = f(x, i)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert got[1].dtype == np.int32


def test_non_finite_literals_are_written_by_their_bits():
    def f(x):
        return cnp.minimum(x * 2.0, float("inf")) + cnp.maximum(x, float("-inf"))

    x = np.linspace(-1, 1, 5)
    closed = _program(f, x)
    (group,) = _groups(fusion.fuse(closed.jaxpr.eqns, closed.jaxpr.outvars))
    assert len(group.inputs) == 1
    operation = group.cuda_kernel_source()[2]
    assert "__longlong_as_double(0x7ff0000000000000LL)" in operation
    assert "__longlong_as_double(0xfff0000000000000LL)" in operation
    got, _ = _run_fused_on_cpu(closed, [x])
    np.testing.assert_array_equal(got[0], f(x))
    # a float literal that overflows float32 is float32's inf, as NumPy rounds it
    (g32,) = _groups(_units(lambda x: x * 1e39 + x, np.ones(4, np.float32)))
    assert "__int_as_float(0x7f800000)" in g32.cuda_kernel_source()[2]


def test_integer_comparisons_with_out_of_range_literals_compare_values():
    """uint8 < 300 holds everywhere (NumPy compares by value); a cast of 300 to uint8 would
    make it x < 44."""
    x = np.arange(250, 256, dtype=np.uint8)
    f = lambda x: cnp.where(x < 300, x, x + x)  # noqa: E731
    (group,) = _groups(_units(f, x))
    operation = group.cuda_kernel_source()[2]
    assert "(((long long)in0) < ((long long)300LL))" in operation
    np.testing.assert_array_equal(f(x), x)


def _probe_primitive(name, **facts):
    """A primitive defined outside cuvmap's families (2x + 1), with the given facts."""
    p = core.Primitive(name, **facts)
    p.impl = lambda x: x * 2.0 + 1.0
    p.shape_rule = lambda x: core.ShapedArray(x.shape, x.dtype)
    return p


def test_fusion_knows_primitives_by_their_fused_expression():
    """A primitive's ``fused`` attribute, not its name, makes it fusible: one defined
    outside cuvmap's families joins a group with its expression; without one it stays an
    equation of its own."""
    fused = _probe_primitive("probe_affine", fused=fusion.CExpression("({0} * ({T})2 + ({T})1)", float_only=True))
    plain = _probe_primitive("probe_affine_plain")
    x = np.linspace(-1, 1, 8)
    (group,) = _groups(_units(lambda x: cnp.sin(fused.bind(x)) * x, x))
    assert [e.primitive.name for e in group.eqns] == ["probe_affine", "sin", "mul"]
    assert "double v0 = (((double)in0) * (double)2 + (double)1);" in group.cuda_kernel_source()[2]
    got, _ = _run_fused_on_cpu(_program(lambda x: cnp.sin(fused.bind(x)) * x, x), [x])
    np.testing.assert_array_equal(got[0], np.sin(x * 2.0 + 1.0) * x)
    units = _units(lambda x: cnp.sin(plain.bind(x)) * x, x)
    assert [u.primitive.name for u in units if not isinstance(u, fusion.FusedGroup)] == ["probe_affine_plain"]
    # float_only: an integer computation is not fused
    units = _units(lambda i: fused.bind(i) + i, np.arange(8))
    assert not any(isinstance(u, fusion.FusedGroup) and len(u.eqns) == 2 for u in units)


# (dtype, the primitives fused in the group of sin(x) ** 3 * x ** 2 + x ** x): float64
# powers stay unfused (NOTE [fused kernels round as the unfused ones]); squares fuse
POWER_FUSION = [
    (np.float32, ["sin", "integer_pow", "integer_pow", "mul", "pow", "add"]),
    (np.float64, ["integer_pow", "mul", "add"]),  # x ** 2 * (sin(x) ** 3), then + x ** x
]


@pytest.mark.parametrize("dtype, fused", POWER_FUSION, ids=["float32", "float64"])
def test_float64_powers_stay_unfused(dtype, fused):
    x = np.linspace(0.5, 2.0, 8).astype(dtype)
    units = _units(lambda x: cnp.sin(x) ** 3 * x ** 2 + x ** x, x)
    names = [e.primitive.name for g in _groups(units) for e in g.eqns]
    assert names == fused
    got, _ = _run_fused_on_cpu(_program(lambda x: cnp.sin(x) ** 3 * x ** 2 + x ** x, x), [x])
    np.testing.assert_array_equal(got[0], np.sin(x) ** 3 * x ** 2 + x ** x)


# Random programs over two shapes that broadcast, with reductions, selects, comparisons,
# casts and powers between the elementwise ops; fused (groups by their references) must
# equal eager bit for bit, and every group must have two or more equations.
UNARY = [cnp.sin, cnp.exp, cnp.tanh, lambda a: -a, lambda a: a * 2.0, cnp.abs, lambda a: a ** 2,
         lambda a: cnp.where(a > 0.1, a, 0.5 * a), lambda a: cnp.sum(a, axis=-1, keepdims=True) + a,
         lambda a: (a > 0).astype(a.dtype) + a, lambda a: cnp.maximum(a, float("nan")) if a.ndim > 5 else a - 1.0,
         lambda a: cnp.log1p(a * a)]
BINARY = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b, cnp.maximum, cnp.minimum,
          lambda a, b: a / (1.0 + b * b)]


@settings(max_examples=80, deadline=None)
@given(spec=programs(len(UNARY), len(BINARY), num_inputs=2, max_steps=14))
def test_fused_execution_equals_eager(spec):
    f = program_fun(spec, UNARY, BINARY)
    x, row = np.linspace(-1, 1, 12).reshape(3, 4), np.linspace(0.5, -0.5, 4)
    closed = _program(f, x, row)
    units = fusion.fuse(closed.jaxpr.eqns, closed.jaxpr.outvars)
    assert all(len(g.eqns) >= 2 for g in _groups(units))
    member_count = sum(len(g.eqns) if isinstance(g, fusion.FusedGroup) else 1 for g in units)
    assert member_count == len(closed.jaxpr.eqns)
    with np.errstate(all="ignore"):
        want = f(x, row)
        got, _ = _run_fused_on_cpu(closed, [x, row])
        got_again, _ = _run_fused_on_cpu(closed, [x, row])
    for g, g2, w in zip(got, got_again, want):
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(g2, w)
        assert np.asarray(g).dtype == np.asarray(w).dtype


# ---------------------------------------------------------------------------------------
# The CUDA source
# ---------------------------------------------------------------------------------------


def test_cuda_source_of_a_small_group():
    x, y = np.ones(8, np.float32), np.ones(8, np.float32)
    (group,) = _groups(_units(lambda x, y: cnp.where(x > 0.5, cnp.sin(x) * 2.0 + y, 0.0), x, y))
    in_params, out_params, operation, name = group.cuda_kernel_source()
    assert in_params == "float32 in0, float32 in1"
    assert out_params == "float32 out0"
    assert operation.splitlines() == [
        "bool v0 = (((float)in0) > ((float)0.5));",
        "float v1 = sin(((float)in0));",
        "float v2 = (((float)v1) * ((float)2.0));",
        "float v3 = (((float)v2) + ((float)in1));",
        "float v4 = (((bool)v0) ? ((float)v3) : ((float)0.0));",
        "out0 = v4;",
    ]
    assert name.startswith("cuvmap_fused_5_")


def test_cuda_source_keeps_numpy_dtypes():
    """A comparison of ints compares ints; an integer true division is float64; a weak
    Python float does not widen float32 (NumPy's rules, which the shape rules follow)."""
    i = np.arange(4, dtype=np.int32)
    (group,) = _groups(_units(lambda i: cnp.where(i > 2, i / 2, 0.5), i))
    in_params, out_params, operation, _ = group.cuda_kernel_source()
    assert in_params == "int32 in0" and out_params == "float64 out0"
    assert "bool v0 = (((int)in0) > ((int)2LL));" in operation
    assert "double v1 = (((double)in0) / ((double)2.0));" in operation
    (g2,) = _groups(_units(lambda x: cnp.exp(x) * 0.1, np.ones(3, np.float32)))
    assert "double" not in g2.cuda_kernel_source()[2]


def _nvrtc():
    try:
        from cuvmap.cuda import libs

        libs.preload(libs.NVRTC)          # from the nvidia-cuda-nvrtc wheel, as kernels.py does
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
        return nvrtc
    except Exception:  # noqa: BLE001 - CuPy or its NVRTC absent: nothing to compile with
        return None


def _as_kernel(in_params, out_params, operation):
    """The group's operation in a kernel shaped as CuPy's ElementwiseKernel writes it: the
    parameters as local values and references of their C types."""
    def decls(params, const):
        out = []
        for p in params.split(", "):
            dtype, name = p.split(" ")
            out.append((fusion.C_TYPES[np.dtype(dtype)], name))
        return out

    ins, outs = decls(in_params, True), decls(out_params, False)
    args = [f"const {t}* _{n}" for t, n in ins] + [f"{t}* _{n}" for t, n in outs] + ["long long size"]
    body = [f"const {t} {n} = _{n}[i];" for t, n in ins] + [f"{t} &{n} = _{n}[i];" for t, n in outs]
    return (f'extern "C" __global__ void k({", ".join(args)}) {{\n'
            "long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
            "if (i >= size) return;\n" + "\n".join(body) + "\n" + operation + "\n}\n")


FUSIBLE_SAMPLES = [
    ("arith", lambda x, y: (x + y) * (x - y) / (1.0 + y * y) - (-x)),
    ("transcendental", lambda x, y: cnp.exp(x) + cnp.log(cnp.abs(x) + 1) + cnp.log1p(y * y) + cnp.expm1(x)
     + cnp.sqrt(y * y) + cnp.tanh(x) + cnp.sin(x) * cnp.cos(y) + cnp.log2(y * y + 1) + cnp.log10(x * x + 1)),
    ("trig", lambda x, y: cnp.arctan(x) + cnp.arctan2(x, y) + cnp.sinh(x) + cnp.cosh(y) + cnp.arcsinh(x)),
    ("rounding", lambda x, y: cnp.floor(x) + cnp.ceil(y) + cnp.maximum(x, y) * cnp.minimum(x, y)),
    ("powers", lambda x, y: x ** 3 + x ** -2 + cnp.power(cnp.abs(x) + 1.0, y) + lax_rsqrt(y * y + 1.0)),
    ("select", lambda x, y: cnp.where((x > y) | (x == 0.5), x, y) + (x <= y) * 1.0 + (x != y) * 2.0),
    ("casts", lambda x, y: (x * 100).astype(np.int32).astype(x.dtype) + nn.sigmoid(y) + nn.gelu(x)),
    ("non-finite", lambda x, y: cnp.minimum(x * 2.0, float("inf")) + y * 3.0 + x * 1e39),
]


def lax_rsqrt(x):
    from cuvmap import lax

    return lax.rsqrt(x) if hasattr(lax, "rsqrt") else 1.0 / cnp.sqrt(x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,f", FUSIBLE_SAMPLES, ids=[s[0] for s in FUSIBLE_SAMPLES])
def test_group_sources_compile_with_nvrtc(name, f, dtype):
    x, y = np.linspace(-1, 1, 8).astype(dtype), np.linspace(0.5, 2, 8).astype(dtype)
    groups = _groups(_units(f, x, y))
    assert groups, "the sample should fuse"
    nvrtc = _nvrtc()
    if nvrtc is None:
        pytest.skip("CuPy's NVRTC is not installed here (the GPU extra brings it)")
    for g in groups:
        in_params, out_params, operation, _ = g.cuda_kernel_source()
        source = _as_kernel(in_params, out_params, operation)
        prog = nvrtc.createProgram(source, "fused.cu", [], [])
        try:
            nvrtc.compileProgram(prog, ["--gpu-architecture=compute_80", *kernels.COMPILE_OPTIONS])
        except Exception as err:  # noqa: BLE001
            pytest.fail(f"{err}\n{nvrtc.getProgramLog(prog)}\n{source}")
        finally:
            nvrtc.destroyProgram(prog)


# ---------------------------------------------------------------------------------------
# The graph runner against a stand-in for CuPy (NOTE [graph replay])
# ---------------------------------------------------------------------------------------


class FakeCuPy:
    """Enough of CuPy for GraphRunner, on NumPy: a capture records the program and its
    buffers; a replay recomputes into the captured output buffers (as a real graph writes
    to the addresses it was captured with)."""

    ndarray = np.ndarray
    array = staticmethod(np.array)
    copyto = staticmethod(np.copyto)

    def __init__(self):
        fake = self
        self.capturing = False
        self.recorded = None
        self.launches = 0

        class Stream:
            def __init__(self, non_blocking=False):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def record(self):
                return object()

            def wait_event(self, event):
                pass

            def synchronize(self):
                pass

            def begin_capture(self, mode=None):
                fake.capturing = True

            def is_capturing(self):
                return fake.capturing

            def end_capture(self):
                fake.capturing = False
                if fake.recorded is None:
                    raise RuntimeError("nothing was captured")
                return Graph(*fake.recorded)

        class Graph:
            def __init__(self, program, inputs, outputs):
                self.program, self.inputs, self.outputs = program, inputs, outputs

            def launch(self, stream=None):
                fake.launches += 1
                for buffer, value in zip(self.outputs, self.program(self.inputs, replay=True)):
                    np.copyto(buffer, value)

        self.cuda = types.SimpleNamespace(
            Stream=Stream, MemoryPool=lambda: types.SimpleNamespace(malloc=None),
            get_current_stream=lambda: Stream(), using_allocator=lambda malloc: contextlib.nullcontext(),
            runtime=types.SimpleNamespace(streamCaptureModeThreadLocal=2))


def _fake_runner(f, fail_capture=False):
    fake = FakeCuPy()
    eager_calls = []

    def eager(args):
        eager_calls.append(1)
        return [f(*args)]

    def make_program():
        def program(inputs, replay=False):
            if fake.capturing:
                if fail_capture:
                    raise RuntimeError("operation not permitted when stream is capturing")
                outs = [f(*inputs)]
                fake.recorded = (program, inputs, outs)
                return outs
            return [f(*inputs)]

        return program

    return graphs.GraphRunner(eager, make_program, name="jit(f)", cp=fake), fake, eager_calls


def test_graph_runner_captures_on_the_second_call_and_replays():
    f = lambda x, y: np.sin(x) * y  # noqa: E731
    runner, fake, eager_calls = _fake_runner(f)
    xs = [np.linspace(0, i, 5) for i in range(1, 5)]
    y = np.full(5, 2.0)
    results = [runner([x, y])[0] for x in xs]
    assert len(eager_calls) == 1 and runner.captured and fake.launches == 3
    for r, x in zip(results, xs):  # every call's own arguments; earlier results not overwritten
        np.testing.assert_array_equal(r, f(x, y))
    assert results[1] is not runner._outputs[0]


def test_graph_runner_runs_python_scalars_eagerly():
    runner, fake, eager_calls = _fake_runner(lambda x, s: x * s)
    x = np.ones(3)
    for s in (1.0, 2.0, 3.0):
        np.testing.assert_array_equal(runner([x, s])[0], x * s)
    assert len(eager_calls) == 3 and not runner.captured


def test_graph_runner_falls_back_once_when_the_capture_fails():
    f = lambda x: np.exp(x)  # noqa: E731
    runner, fake, eager_calls = _fake_runner(f, fail_capture=True)
    x = np.linspace(0, 1, 4)
    runner([x])
    # the warning names the cause raised inside the capture, not the error of ending the
    # invalidated capture ("nothing was captured" here, cudaErrorStreamCaptureInvalidated on a GPU)
    with pytest.warns(graphs.GraphCaptureWarning,
                      match=r"could not be captured as a CUDA graph \(RuntimeError: operation not permitted"):
        np.testing.assert_array_equal(runner([x])[0], f(x))
    assert not fake.capturing  # the capture was ended
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(runner([x + 1])[0], f(x + 1))
    assert len(eager_calls) == 3 and not runner.captured and runner.failure is not None


def test_a_runner_called_during_a_capture_runs_eagerly():
    inner, fake, inner_eager = _fake_runner(lambda x: x + 1.0)
    x = np.ones(3)
    fake.capturing = True  # as if an outer program were being captured on this stream
    for _ in range(3):
        np.testing.assert_array_equal(inner([x])[0], x + 1.0)
    assert len(inner_eager) == 3 and not inner.captured and inner.calls == 0


def test_graph_runner_in_threads():
    f = lambda x: np.tanh(x) * 3.0  # noqa: E731
    runner, _, _ = _fake_runner(f)
    xs = [np.linspace(0, i, 64) for i in range(6)]
    runner([xs[0]])
    results = [[] for _ in xs]

    def work(i):
        for _ in range(30):
            results[i].append(runner([xs[i]])[0])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, rs in enumerate(results):
        for r in rs:
            np.testing.assert_array_equal(r, f(xs[i]))


# ---------------------------------------------------------------------------------------
# The switches
# ---------------------------------------------------------------------------------------


def test_settings_switch_and_validate():
    assert config.jit_gpu_fusion is True and config.jit_cuda_graphs is True
    with config.override(jit_gpu_fusion=False, jit_cuda_graphs="0"):
        assert config.jit_gpu_fusion is False and config.jit_cuda_graphs is False
    assert config.jit_gpu_fusion is True
    with pytest.raises(ValueError, match="jit_cuda_graphs must be True or False"):
        config.update("jit_cuda_graphs", "sometimes")


def test_cpu_plans_neither_fuse_nor_capture():
    x = np.linspace(0, 1, 16)
    p = executor.plan(_program(lambda x: cnp.sin(x) * 2.0 + x, x))
    assert all(s.kind != executor.FUSED for s in p.steps)
    assert not isinstance(p.program, graphs.GraphRunner)
    assert not executor.graph_capturable(_program(lambda x: cnp.sin(x), x))


def _on_gpu(closed):
    for v in closed.jaxpr.invars:
        v.aval = type(v.aval)(v.aval.shape, v.aval.dtype, v.aval.weak_type, device="gpu:0")
    return closed


def test_a_gather_with_its_bounds_check_is_capturable():
    """On the GPU the bounds check reads nothing on the host (NOTE [device-side bounds
    checks]), so a program with a gather can be captured."""
    closed = _program(lambda x, i: cnp.take_along_axis(x, i, axis=0), np.ones((4, 3)), np.zeros((2, 3), int))
    assert any(e.primitive.name == "check_index_bounds" for e in closed.jaxpr.eqns)
    gpu_like = _on_gpu(ir.ClosedJaxpr(closed.jaxpr, closed.consts))
    assert executor.is_gpu_program(gpu_like) and executor.graph_capturable(gpu_like)


CAPTURABLE_FACTS = [  # (facts of the primitive, whether a program with it is capturable)
    ({}, True),
    ({"host_sync": True}, False),          # capturable's default: not host_sync
    ({"capturable": False}, False),        # a library a capture refuses (cuSOLVER)
    ({"host_sync": False, "capturable": True}, True),
]


@pytest.mark.parametrize("facts, capturable", CAPTURABLE_FACTS, ids=[str(f) for f, _ in CAPTURABLE_FACTS])
def test_whether_a_program_is_capturable_comes_from_its_primitives_facts(facts, capturable):
    """``capturable`` (by default ``not host_sync``) marks what a capture may run, whoever
    defines the primitive, in nested programs too."""
    x = np.ones(4)
    probe = _probe_primitive("probe_capturable", **facts)
    assert executor.graph_capturable(_on_gpu(_program(lambda x: cnp.sin(probe.bind(x)), x))) is capturable
    nested = _on_gpu(_program(lambda x: cv.checkpoint(lambda y: cnp.sin(probe.bind(y)))(x), x))
    assert executor.graph_capturable(nested) is capturable


def test_a_primitive_that_reads_the_host_prevents_the_capture():
    """``host_sync`` marks a primitive whose impl reads values on the host, whoever
    defines it."""
    x = np.ones(4)
    for host_sync in (False, True):
        probe = _probe_primitive("probe_host_read", host_sync=host_sync)
        closed = _on_gpu(_program(lambda x: cnp.sin(probe.bind(x)), x))
        assert executor.graph_capturable(closed) is not host_sync

    class HostReading(core.Primitive):  # a class of primitives states it in its body
        __slots__ = ()
        host_sync = True

    assert HostReading("probe_host_class").host_sync and not core.Primitive("probe_plain_class").host_sync
    with pytest.raises(TypeError, match="host_sync is a class attribute of HostReading"):
        HostReading("probe_host_class", host_sync=False)


def test_a_jitted_function_keeps_one_plan_per_setting():
    jf = cv.jit(lambda x: cnp.tanh(x) + 1.0)
    x = np.linspace(0, 1, 8)
    jf(x)
    with config.override(jit_gpu_fusion=False):
        jf(x)
    assert jf.trace_count == 1


# ---------------------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not backend.gpu_available(), reason="no CUDA device that CuPy can use")


def _gpu(x):
    return cv.device_put(x, "gpu")


GPU_PROGRAMS = [
    ("chain", chain, lambda: (np.linspace(0, 1, 4096).reshape(64, 64).astype(np.float32),
                              np.full((64, 64), 0.25, np.float32))),
    ("samples", FUSIBLE_SAMPLES[1][1], lambda: (np.linspace(-1, 1, 1000), np.linspace(0.5, 2, 1000))),
    ("select", FUSIBLE_SAMPLES[5][1], lambda: (np.linspace(-1, 1, 999).astype(np.float32),
                                               np.linspace(1, -1, 999).astype(np.float32))),
    ("casts", FUSIBLE_SAMPLES[6][1], lambda: (np.linspace(-1, 1, 300), np.linspace(-2, 2, 300))),
    ("grad", lambda x, y: cv.grad(lambda a: cnp.sum(cnp.tanh(a * y) ** 2))(x),
     lambda: (np.linspace(-1, 1, 512), np.linspace(0, 1, 512))),
    ("powers", FUSIBLE_SAMPLES[4][1], lambda: (np.linspace(0.1, 3, 777), np.linspace(-2, 2, 777))),
    # signed zeros and NaNs through maximum/minimum: CuPy's (CUDA's fmax) gives +0.0 for
    # max(-0.0, +0.0) in either order, and the fused kernel must too
    ("signed zeros", lambda x, y: cnp.maximum(x * 1.0, y * 1.0) - cnp.minimum(y * 1.0, x * 1.0),
     lambda: (np.array([0.0, -0.0, 0.0, -0.0, np.nan, 1.0, -1.0] * 40), np.array([-0.0, 0.0, 0.0, -0.0, 2.0, np.nan, -0.0] * 40))),
]


def _assert_same_bits(got, want):
    """Equal bit for bit (so +0.0 and -0.0 differ), NaN payloads aside."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.kind == "f":
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        keep = ~np.isnan(want)
        uint = np.dtype(f"u{got.dtype.itemsize}")
        np.testing.assert_array_equal(got[keep].view(uint), want[keep].view(uint))
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name,f,make", GPU_PROGRAMS, ids=[g[0] for g in GPU_PROGRAMS])
def test_fused_and_graphed_programs_give_the_unfused_bits(name, f, make, monkeypatch):
    args = [_gpu(a) for a in make()]
    with config.override(jit_gpu_fusion=False, jit_cuda_graphs=False):
        want = cv.device_put(cv.jit(f)(*args), "cpu")
    kernels_made, replays = [], []
    make_kernel, replay = kernels.fused_elementwise, graphs.GraphRunner._replay
    monkeypatch.setattr(kernels, "fused_elementwise", lambda *a: kernels_made.append(a) or make_kernel(*a))
    monkeypatch.setattr(graphs.GraphRunner, "_replay", lambda self, cp, a: replays.append(1) or replay(self, cp, a))
    jf = cv.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the kernels compile, the graph captures
        for _ in range(3):
            got = cv.device_put(jf(*args), "cpu")
            for g, w in zip(cv.tree.leaves(got), cv.tree.leaves(want)):
                _assert_same_bits(g, w)
    assert kernels_made, "the program should have fused groups"
    assert len(replays) == 2, "the second and third calls replay the graph"


@pytest.mark.gpu
@gpu
def test_graph_replay_on_the_gpu_follows_new_arguments_and_keeps_old_results():
    f = cv.jit(lambda x, y: cnp.sum(cnp.tanh(x * y) + x, axis=0))
    x, y = _gpu(np.linspace(0, 1, 4096).reshape(64, 64)), _gpu(np.full((64, 64), 0.5))
    results = [f(x * i, y) for i in range(1, 5)]
    for i, r in enumerate(results, 1):
        np.testing.assert_allclose(cv.device_put(r, "cpu"),
                                   np.sum(np.tanh(cv.device_put(x, "cpu") * i * 0.5) + cv.device_put(x, "cpu") * i,
                                          axis=0), rtol=1e-12)


@pytest.mark.gpu
@gpu
def test_a_capture_that_fails_falls_back_on_the_gpu(monkeypatch):
    cp = backend.cupy_module()
    f = cv.jit(lambda x: cnp.exp(x) * 2.0 + 1.0)
    x = _gpu(np.linspace(0, 1, 256))
    f(x)
    original = cp.cuda.Stream.begin_capture

    def refuse(self, *a, **k):
        raise RuntimeError("refused by the test")

    monkeypatch.setattr(cp.cuda.Stream, "begin_capture", refuse, raising=False)
    with pytest.warns(graphs.GraphCaptureWarning):
        got = f(x)
    monkeypatch.setattr(cp.cuda.Stream, "begin_capture", original, raising=False)
    np.testing.assert_allclose(cv.device_put(got, "cpu"), np.exp(np.linspace(0, 1, 256)) * 2.0 + 1.0, rtol=1e-12)


@pytest.mark.gpu
@gpu
def test_per_example_gradients_jitted_on_the_gpu_equal_eager():
    from test_jit import _cnn_loss, _cnn_params

    rng = np.random.default_rng(0)
    params = cv.device_put(_cnn_params(rng), "gpu")
    xs = _gpu(rng.standard_normal((6, 1, 16, 16)).astype(np.float32))
    ys = _gpu(rng.integers(0, 10, 6))
    pe = cv.vmap(cv.grad(_cnn_loss), in_axes=(None, 0, 0))
    want = cv.device_put(pe(params, xs, ys), "cpu")
    jpe = cv.jit(pe)
    for _ in range(3):
        got = cv.device_put(jpe(params, xs, ys), "cpu")
        for g, w in zip(cv.tree.leaves(got), cv.tree.leaves(want)):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


def test_a_host_synchronisation_inside_a_region_prevents_the_capture():
    def gather(x, i):
        return cv.checkpoint(lambda x, i: cnp.take_along_axis(x, i, axis=0))(x, i) * 2.0

    def loop(x, i):  # a while_loop reads its predicate on the host
        return cv.checkpoint(lambda x: cv.lax.while_loop(lambda v: v.sum() < 9.0, lambda v: v * 2.0, x))(x) * 2.0

    for f, capturable in ((gather, True), (loop, False)):
        closed = _on_gpu(_program(f, np.ones((4, 3)), np.zeros((2, 3), int)))
        assert not any(e.primitive.name in ("check_index_bounds", "while") for e in closed.jaxpr.eqns)
        assert executor.is_gpu_program(closed) and executor.graph_capturable(closed) is capturable


def test_programs_run_during_a_capture_are_planned_afresh(monkeypatch):
    """NOTE [graph replay]: a nested program's cached plan (and its pool) is not used while
    a graph is captured on this thread; it is used again afterwards."""
    closed = _program(lambda x: cnp.exp(x) * 2.0, np.ones(1024))
    args = [np.linspace(0, 1, 1024)]
    executor.run(closed, args)
    cached = dict(closed.plans)
    plans_made = []
    original = executor.plan
    monkeypatch.setattr(executor.planner, "plan", lambda *a, **k: plans_made.append(1) or original(*a, **k))
    monkeypatch.setattr(graphs._capture_state, "active", True, raising=False)
    for _ in range(2):
        np.testing.assert_array_equal(executor.run(closed, args)[0], np.exp(args[0]) * 2.0)
    assert len(plans_made) == 2 and closed.plans == cached
    monkeypatch.setattr(graphs._capture_state, "active", False)
    executor.run(closed, args)
    assert len(plans_made) == 2
