"""JAX's smaller API names (issue 32): cuvmap.Array, ensure_compile_time_eval, named_call,
device_get, pmap, transfer_guard, jit's and make_jaxpr's JAX options, ClosedJaxpr's JAX
attributes, tree.register_pytree_node_class / register_dataclass."""
import dataclasses
import functools
import logging
import types

import numpy as np
import pytest

import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap import lax, tree
from cuvmap.test_util import check_grads

# ---------------------------------------------------------------------------------------
# Array
# ---------------------------------------------------------------------------------------


def test_array_holds_for_arrays_and_tracers_only():
    seen = []

    def record(x):
        seen.append(isinstance(x, cv.Array))
        return x * 2

    cv.jit(record)(3.0)
    cv.vmap(record)(np.arange(3.0))
    cv.grad(record)(1.0)
    cv.jvp(record, (1.0,), (1.0,))
    assert seen == [True, True, True, True]
    assert isinstance(np.ones(2), cv.Array) and isinstance(cnp.sin(np.ones(2)), cv.Array)
    assert isinstance(cv.jit(lambda x: x + 1)(np.ones(2)), cv.Array)
    for not_array in (1.0, 3, np.float32(1.0), [1.0], None, "x"):
        assert not isinstance(not_array, cv.Array)
    assert issubclass(np.ndarray, cv.Array) and not issubclass(float, cv.Array)


def test_array_is_abstract_and_annotates():
    with pytest.raises(TypeError, match="abstract"):
        cv.Array()

    def f(x: cv.Array) -> cv.Array:
        return x

    assert f.__annotations__["x"] is cv.Array


def test_array_on_the_gpu(backend):
    x = cv.device_put(np.arange(3.0), backend)
    assert isinstance(x, cv.Array)
    assert isinstance(cnp.sin(x), cv.Array)


# ---------------------------------------------------------------------------------------
# ensure_compile_time_eval, named_call, device_get
# ---------------------------------------------------------------------------------------


def test_ensure_compile_time_eval_computes_now_under_jit():
    kinds = []

    @cv.jit
    def f(x):
        with cv.ensure_compile_time_eval():
            y = cnp.sin(3.0)
            kinds.append(isinstance(y, np.ndarray))
            scale = 2.0 if float(y) > 0 else -2.0  # Python control flow on the value
        return x * y * scale

    np.testing.assert_allclose(f(1.5), 1.5 * np.sin(3.0) * 2.0, rtol=1e-15)
    assert kinds == [True]
    # without the block the same value is staged (a tracer), and float() of it raises
    with pytest.raises(cv.ConcretizationError):
        cv.jit(lambda x: x * (2.0 if float(cnp.sin(3.0)) > 0 else 1.0))(1.0)
    # traced values are still staged inside the block
    text = str(cv.make_jaxpr(lambda x: _under_eval(x))(1.0))
    assert "cos" in text and "sin" not in text


def _under_eval(x):
    with cv.ensure_compile_time_eval():
        return cnp.cos(x) + cnp.sin(1.0)


def test_named_call_names_the_equations_and_keeps_values():
    def f(x):
        return cnp.tanh(x) * 2

    g = cv.named_call(f, name="block")
    np.testing.assert_allclose(g(np.arange(3.0)), np.tanh(np.arange(3.0)) * 2)
    assert "[block]" in str(cv.make_jaxpr(g)(np.ones(2)))
    assert "[f]" in str(cv.make_jaxpr(cv.named_call(f))(np.ones(2)))
    check_grads(g, (np.array([0.3, -0.2]),))


def test_device_get_returns_host_values_and_refuses_tracers(backend):
    x = cv.device_put(np.arange(4.0), backend)
    got = cv.device_get({"x": x, "n": 3})
    assert type(got["x"]) is np.ndarray and got["n"] == 3
    np.testing.assert_array_equal(got["x"], np.arange(4.0))
    with pytest.raises(cv.ConcretizationError, match="device_get"):
        cv.jit(cv.device_get)(1.0)


# ---------------------------------------------------------------------------------------
# pmap on one device
# ---------------------------------------------------------------------------------------


def test_pmap_maps_the_leading_axis_with_collectives():
    x = np.arange(12.0).reshape(3, 4)
    out = cv.pmap(lambda v: v - lax.psum(v, "i") / 3, axis_name="i")(x)
    np.testing.assert_allclose(out, x - x.mean(0), rtol=1e-14)
    out = cv.pmap(lambda v, w: v * w, in_axes=(0, None))(x, np.arange(4.0))
    np.testing.assert_allclose(out, x * np.arange(4.0))
    out = cv.pmap(lambda v: v.sum(), in_axes=1, out_axes=0)(x)
    np.testing.assert_allclose(out, x.sum(0))


def test_pmap_gradient_matches_the_closed_form():
    x = np.arange(6.0).reshape(3, 2)
    g = cv.grad(lambda v: cv.pmap(lambda r: lax.psum(r, "i") ** 2, axis_name="i")(v).sum())(x)
    np.testing.assert_allclose(g, np.broadcast_to(3 * 2 * x.sum(0), x.shape))  # d/dx Σ_i (Σ_j x_j)²


def test_pmap_static_arguments_and_errors():
    f = cv.pmap(lambda a, k: a * k, static_broadcasted_argnums=(1,))
    np.testing.assert_allclose(f(np.ones((2, 2)), 3), 3 * np.ones((2, 2)))
    np.testing.assert_allclose(f(np.ones((2, 2)), 4), 4 * np.ones((2, 2)))
    with pytest.raises(ValueError, match="must be passed positionally"):
        f(np.ones((2, 2)), k=1)
    with pytest.raises(ValueError, match="at least one argument with a mapped axis"):
        cv.pmap(lambda x: x)({})
    with pytest.raises(TypeError, match="must be an int"):
        cv.pmap(lambda x: x, in_axes=False)(np.zeros(1))


# ---------------------------------------------------------------------------------------
# transfer_guard
# ---------------------------------------------------------------------------------------


def test_transfer_guard_levels_per_kind_of_transfer(caplog):
    from cuvmap import transfer_guards as tg

    tg.check("host_to_device", False, "nothing guarded")  # the default: allow
    with cv.transfer_guard("disallow"):
        assert [tg.level(d) for d in tg.DIRECTIONS] == ["disallow"] * 3
        with pytest.raises(cv.TransferGuardError, match="implicit"):
            tg.check("host_to_device", False, "x")
        tg.check("host_to_device", True, "an explicit device_put is allowed")
        with cv.transfer_guard_device_to_host("disallow_explicit"):
            with pytest.raises(cv.TransferGuardError, match="explicit"):
                tg.check("device_to_host", True, "x")
            tg.check("host_to_device", True, "other directions keep their level")
        assert tg.level("device_to_host") == "disallow"
    assert tg.level("host_to_device") == "allow"
    with caplog.at_level(logging.WARNING, logger="cuvmap.transfer_guards"):
        with cv.transfer_guard_host_to_device("log"):
            tg.check("host_to_device", True, "explicit: not logged at 'log'")
            tg.check("host_to_device", False, "implicit one")
        with cv.transfer_guard("log_explicit"):
            tg.check("host_to_device", True, "explicit one")
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == ["implicit one", "explicit one"]
    with pytest.raises(ValueError, match="level must be one of"):
        with cv.transfer_guard("forbid"):
            pass


def test_transfer_guard_changes_nothing_on_the_cpu():
    with cv.transfer_guard("disallow_explicit"):
        np.testing.assert_allclose(cv.jit(lambda x: cnp.sin(x) + np.ones(3))(np.zeros(3)), np.ones(3))
        np.testing.assert_array_equal(cv.device_put(np.arange(3), "cpu"), np.arange(3))


@pytest.mark.gpu
@pytest.mark.skipif(not cv.backend.gpu_available(), reason="needs CuPy and a CUDA device")
def test_transfer_guard_on_the_gpu():
    x = cv.device_put(np.arange(3.0), "gpu")
    host = np.ones(3)
    with cv.transfer_guard("disallow"):
        with pytest.raises(cv.TransferGuardError, match="host-to-device"):
            cnp.add(x, host)  # a NumPy operand meeting a CuPy one
        y = cv.device_put(host, "gpu")  # explicit: allowed
        np.testing.assert_array_equal(cv.device_put(y + x, "cpu"), np.arange(3.0) + 1)
    with cv.transfer_guard("disallow_explicit"):
        with pytest.raises(cv.TransferGuardError):
            cv.device_put(host, "gpu")
        with pytest.raises(cv.TransferGuardError, match="device-to-host"):
            cv.device_put(x, "cpu")
    np.testing.assert_array_equal(cv.device_put(cnp.add(x, host), "cpu"), np.arange(3.0) + 1)


# ---------------------------------------------------------------------------------------
# jit's and make_jaxpr's JAX options; the staged program's JAX attributes
# ---------------------------------------------------------------------------------------


def test_jit_accepts_jax_options_and_computes_the_same():
    def f(x, y):
        return cnp.sin(x) * y

    x, y = np.arange(3.0), np.full(3, 2.0)
    for options in [dict(donate_argnames="y"), dict(inline=True), dict(compiler_options={"xla_flag": 1}),
                    dict(device="cpu"), dict(device=cv.devices()[0]), dict(backend="cpu"), dict(keep_unused=True)]:
        np.testing.assert_allclose(cv.jit(f, **options)(x, y), np.sin(x) * 2, err_msg=str(options))
    np.testing.assert_allclose(cv.jit(donate_argnames=("x",))(f)(x, y), np.sin(x) * 2)


def test_jit_option_errors():
    def f(a, b, c):
        return a

    with pytest.raises(ValueError, match="cannot intersect"):
        cv.jit(f, static_argnames="a", donate_argnames="a")
    with pytest.raises(ValueError, match="'d'"):
        cv.jit(f, donate_argnames=("b", "d"))
    cv.jit(lambda a, **kw: a, donate_argnames=("b",))  # **kwargs takes any name

    def g(a, /, b, *args):
        return a

    for name in ("a", "args"):
        with pytest.raises(ValueError):
            cv.jit(g, donate_argnames=name)
    with pytest.raises(TypeError, match="compiler_options must be a dict"):
        cv.jit(f, compiler_options=["x"])
    with pytest.raises(ValueError, match="both a device and a backend"):
        cv.jit(f, device="cpu", backend="cpu")
    with pytest.raises(ValueError, match="unknown device"):
        cv.jit(f, device="tpu")


def test_lower_and_compile_accept_jax_options():
    lowered = cv.jit(lambda x: x * 3).trace(2.0).lower(lowering_platforms=("tpu",))
    assert float(lowered.compile(compiler_options={})(2.0)) == 6.0


def test_make_jaxpr_axis_env_and_return_shape():
    closed = cv.make_jaxpr(lambda x: x - lax.psum(x, "i"), axis_env=[("i", 4)])(2.0)
    assert [e.primitive.name for e in closed.eqns] == ["psum", "sub"]
    closed, shapes = cv.make_jaxpr(lambda x: (x + 1, cnp.zeros(2, np.float32)), return_shape=True)(np.int32(1))
    assert shapes == (cv.ShapeDtypeStruct((), np.int32), cv.ShapeDtypeStruct((2,), np.float32))
    assert len(closed.out_avals) == 2


def test_closed_jaxpr_reads_as_jax():
    c = np.arange(3.0)
    closed = cv.make_jaxpr(lambda x: cnp.sin(x) * 2.0 + c)(np.ones(3))
    assert closed.eqns is closed.jaxpr.eqns
    assert [e.primitive for e in closed.eqns] == [lax.sin_p, lax.mul_p, lax.add_p]
    mul = closed.eqns[1]
    assert mul.invars[0] is closed.eqns[0].outvars[0] and mul.invars[1].val == 2.0
    assert len(closed.constvars) == 1 and closed.literals is closed.consts
    np.testing.assert_array_equal(closed.consts[0], c)
    assert closed.invars == closed.jaxpr.invars and closed.outvars == closed.jaxpr.outvars
    assert closed.pretty_print(use_color=False) == str(closed) == closed.jaxpr.pretty_print()


# ---------------------------------------------------------------------------------------
# pytree classes
# ---------------------------------------------------------------------------------------


@tree.register_pytree_node_class
class _Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def tree_flatten(self):
        return (self.a, self.b), "aux"

    @classmethod
    def tree_unflatten(cls, aux, children):
        assert aux == "aux"
        return cls(*children)


def test_register_pytree_node_class_round_trips_and_differentiates():
    p = _Pair(np.array(2.0), np.array(3.0))
    assert tree.leaves(p) == [p.a, p.b]
    g = cv.grad(lambda p: p.a ** 2 * p.b)(p)
    assert isinstance(g, _Pair)
    np.testing.assert_allclose([g.a, g.b], [2 * 2.0 * 3.0, 2.0 ** 2])
    out = cv.vmap(lambda p: p.a + p.b)(_Pair(np.arange(3.0), np.ones(3)))
    np.testing.assert_allclose(out, np.arange(3.0) + 1)


@functools.partial(tree.register_dataclass, data_fields=["w"], meta_fields=["scale"])
@dataclasses.dataclass
class _Explicit:
    w: object
    scale: float


@tree.register_dataclass
@dataclasses.dataclass
class _Inferred:
    w: object
    n: int = dataclasses.field(default=2, metadata=dict(static=True))


def test_register_dataclass_data_and_meta_fields():
    assert tree.leaves(_Explicit(np.ones(2), 3.0)) == [pytest.approx(np.ones(2))]
    traces = []

    @cv.jit
    def f(d):
        traces.append(1)
        return d.w * d.scale

    np.testing.assert_allclose(f(_Explicit(np.ones(2), 3.0)), 3 * np.ones(2))
    np.testing.assert_allclose(f(_Explicit(np.ones(2), 4.0)), 4 * np.ones(2))  # meta: a new trace
    assert len(traces) == 2
    d = _Inferred(np.array(1.5), 5)
    assert tree.leaves(d) == [1.5]
    g = cv.grad(lambda d: d.w ** d.n)(d)
    assert isinstance(g, _Inferred) and g.n == 5
    np.testing.assert_allclose(g.w, 5 * 1.5 ** 4)


def test_register_dataclass_errors():
    with pytest.raises(TypeError, match="not a dataclass"):
        tree.register_dataclass(types.SimpleNamespace)

    @dataclasses.dataclass
    class Partial:
        a: object
        b: object

    with pytest.raises(ValueError, match="missing"):
        tree.register_dataclass(Partial, data_fields=["a"], meta_fields=[])


def test_custom_derivatives_of_a_functools_partial():
    def fun(x, y, a):
        return x + y * a

    wrapped = functools.partial(fun, a=0.1)
    f = cv.custom_jvp(wrapped)
    f.defjvp(lambda primals, tangents: cv.jvp(wrapped, primals, tangents))
    assert f.__name__ == "fun"
    np.testing.assert_allclose(cv.grad(lambda args: f(*args))((1.0, 2.0)), (1.0, 0.1))
    g = cv.custom_vjp(wrapped)
    g.defvjp(lambda x, y: (wrapped(x, y), None), lambda _, ct: (ct, 0.1 * ct))
    np.testing.assert_allclose(cv.grad(g, argnums=(0, 1))(1.0, 2.0), (1.0, 0.1))
