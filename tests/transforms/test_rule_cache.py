"""Eager shape rules cached per signature (NOTE [eager shape rules are cached per
signature] in cuvmap/core/rule_cache.py): the signature tells apart what the rule tells
apart, a cached answer equals the rule's own, errors are never cached, and a replaced rule
is asked again."""
import numpy as np
import pytest

import cuvmap.core.primitive as core_primitive
import cuvmap.core.rule_cache as rule_cache
import cuvmap.core.weak as core_weak
import cuvmap.numpy as cnp
from cuvmap.core import Primitive, ShapedArray, ShapeError, WeakArray
from cuvmap.lax import convolution, elementwise

F32 = np.ones((2, 3), np.float32)
I32 = np.arange(6, dtype=np.int32).reshape(2, 3)
WEAK_I = np.arange(6, dtype=np.int64).reshape(2, 3).view(WeakArray)
WEAK_F = np.linspace(0.0, 1.0, 6).reshape(2, 3).view(WeakArray)

# pairs of (args, params) that a rule may answer differently: their signatures differ
DIFFERENT = {
    "dtype": (((F32,), {}), ((F32.astype(np.float64),), {})),
    "shape": (((F32,), {}), ((F32.T,), {})),
    "weak array": (((I32.astype(np.int64),), {}), ((WEAK_I,), {})),
    "int and float scalars": (((F32, 1), {}), ((F32, 1.0), {})),
    "bool and int scalars": (((F32, True), {}), ((F32, 1), {})),
    "int and bool param": (((F32,), {"axis": 1}), ((F32,), {"axis": True})),
    "int and float param": (((F32,), {"axis": 1}), ((F32,), {"axis": 1.0})),
    "ints and bools in a tuple": (((F32,), {"axes": (1, 0)}), ((F32,), {"axes": (True, 0)})),
    "ints and bools in nested tuples": (((F32,), {"dn": ((1,), (0,))}), ((F32,), {"dn": ((True,), (0,))})),
}

# operands and params that have no signature: the rule runs on every call
NO_SIGNATURE = {
    "a NumPy scalar": ((np.float32(1.0),), {}),
    "an array of another library": ((type("DeviceArray", (), {"shape": (2,), "dtype": np.dtype("f4")})(),), {}),
    "an unhashable param": ((F32,), {"axes": [0, 1]}),
}


@pytest.mark.parametrize("case", DIFFERENT)
def test_the_signature_tells_apart_what_a_rule_may(case):
    (args_a, params_a), (args_b, params_b) = DIFFERENT[case]
    sig_a, sig_b = rule_cache.signature(args_a, params_a), rule_cache.signature(args_b, params_b)
    assert sig_a is not None and sig_b is not None
    assert sig_a != sig_b


@pytest.mark.parametrize("case", NO_SIGNATURE)
def test_what_has_no_signature(case):
    args, params = NO_SIGNATURE[case]
    assert rule_cache.signature(args, params) is None


# eager binds through bind_weak, each run twice (the second answered by the cache); the
# dtype and weak type must be the rule's (what jit's staged program gives)
WEAK_BINDS = {
    "weak int + float scalar": lambda: elementwise.add(WEAK_I, 1.5),
    "weak int * float32 array": lambda: elementwise.mul(WEAK_I, F32),
    "weak float + int32 array": lambda: elementwise.add(WEAK_F, I32),
    "int32 array + int scalar": lambda: elementwise.add(I32, 2),
    "select with a Python zero": lambda: cnp.where(I32 > 2, F32, 0),
    "weak int < int scalar": lambda: elementwise.lt(WEAK_I, 3),
}


@pytest.mark.parametrize("case", WEAK_BINDS)
def test_a_cached_weak_plan_gives_the_rules_result(monkeypatch, case):
    with monkeypatch.context() as m:
        m.setattr(core_weak, "signature", lambda args, params: None)  # the rule on every bind
        expected = WEAK_BINDS[case]()
    core_weak._plans.clear()
    for _ in range(2):  # a miss, then a hit
        got = WEAK_BINDS[case]()
        assert type(got) is type(expected) and got.dtype == expected.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_a_bad_operand_raises_on_every_call():
    x = np.ones((2, 3, 8, 8), np.float32)
    w = np.ones((4, 5, 3, 3), np.float32)  # 5 input channels for an input of 3
    for _ in range(2):
        with pytest.raises(ShapeError, match="input channels"):
            convolution.conv(x, w)


def test_a_replaced_shape_rule_is_asked_again():
    p = Primitive("rule_cache_probe", impl=lambda x, y: x + y,
                  shape_rule=lambda x, y: ShapedArray(x.shape, x.dtype, weak_type=True))
    assert type(p.bind(I32, 1)) is WeakArray and p.check(I32, 1).weak_type
    p.shape_rule = lambda x, y: ShapedArray(x.shape, x.dtype)
    assert type(p.bind(I32, 1)) is np.ndarray and not p.check(I32, 1).weak_type


def test_the_tables_are_bounded(monkeypatch):
    monkeypatch.setattr(rule_cache, "LIMIT", 3)
    table = rule_cache.RuleCache()
    p = core_primitive.Primitive("rule_cache_bound_probe", shape_rule=lambda x: x)
    for i in range(10):
        table.put(p, (i,), i)
        assert len(table.table) <= 3
