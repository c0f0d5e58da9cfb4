"""``cuvmap.random``: explicit keys, Threefry-2x32, and draws that are the same under
``vmap``, in a loop and on either device.

References:
- the known-answer vectors of Random123 (those of JAX's tests), and JAX's documented
  splits of key 0, for the hash and the key layout;
- ``threefry2x32_reference`` (Python ints, ``tests/op_table.py``) and closed forms on its
  words for ``bits`` and ``uniform``;
- per-key Python loops for ``vmap`` (bit for bit);
- statistical bounds with fixed keys: means and variances within 5 standard errors, the
  Kolmogorov–Smirnov distance below its 0.1% critical value, bit and value frequencies.
"""
import math

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import backend as cv_backend
from cuvmap import random
from cuvmap.lax import prng
from op_table import threefry2x32_reference

U32 = np.uint32


def _np(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


# ---------------------------------------------------------------------------------------
# The hash and the keys
# ---------------------------------------------------------------------------------------

# (key, counter, output): the Random123 known-answer vectors for Threefry-2x32-20
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize("k, x, want", KNOWN_ANSWERS)
def test_threefry_known_answers(k, x, want, backend):
    key, count = cv.device_put(np.array(k, U32), backend), cv.device_put(np.array(x, U32), backend)
    got = random.threefry2x32(key, count)
    assert cv_backend.backend_name(got) == backend
    np.testing.assert_array_equal(_np(got), np.array(want, U32))
    np.testing.assert_array_equal(threefry2x32_reference(np.array(k, U32), np.array(x, U32)), np.array(want, U32))


def test_threefry_broadcasts_keys_against_counters():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2 ** 32, (3, 1, 2), dtype=U32)
    counts = rng.integers(0, 2 ** 32, (4, 2), dtype=U32)
    got = random.threefry2x32(keys, counts)
    assert got.shape == (3, 4, 2)
    for i in range(3):
        for j in range(4):
            np.testing.assert_array_equal(got[i, j], threefry2x32_reference(keys[i, 0], counts[j]))


def test_key_layout_matches_jax():
    np.testing.assert_array_equal(random.key(0), [0, 0])
    np.testing.assert_array_equal(random.key(42), [0, 42])
    np.testing.assert_array_equal(random.key(2 ** 32 + 5), [1, 5])
    np.testing.assert_array_equal(random.key(-1), [0xFFFFFFFF, 0xFFFFFFFF])  # a 64-bit seed
    np.testing.assert_array_equal(random.key(np.int32(-1)), [0, 0xFFFFFFFF])  # a 32-bit seed, as in JAX
    np.testing.assert_array_equal(random.key(np.int64(7)), [0, 7])
    assert random.key(3).dtype == U32 and random.PRNGKey is random.key
    with pytest.raises(OverflowError):
        random.key(2 ** 64)
    with pytest.raises(TypeError):
        random.key(True)


def test_split_matches_jax():
    # jax.random.split(jax.random.key(0)) with jax_threefry_partitionable (JAX's default)
    np.testing.assert_array_equal(random.split(random.key(0)),
                                  [[1797259609, 2579123966], [928981903, 3453687069]])
    # the legacy jax.random.split(jax.random.PRNGKey(0)) = [[4146024105, 967050713],
    # [2718843009, 1272950319]] hashes the counters 0..3 split in halves: the same hash
    words = random.threefry2x32(random.key(0), np.array([[0, 2], [1, 3]], U32))
    np.testing.assert_array_equal(np.concatenate([words[:, 0], words[:, 1]]).reshape(2, 2),
                                  [[4146024105, 967050713], [2718843009, 1272950319]])


def test_split_shapes_and_fold_in():
    k = random.key(5)
    keys = random.split(k, 6)
    assert keys.shape == (6, 2) and keys.dtype == U32
    counters = np.stack([np.zeros(6, U32), np.arange(6, dtype=U32)], -1)
    np.testing.assert_array_equal(keys, threefry2x32_reference(k, counters))
    np.testing.assert_array_equal(random.split(k, (2, 3)), keys.reshape(2, 3, 2))
    assert random.split(k, 0).shape == (0, 2)
    assert len({tuple(r) for r in keys.tolist()}) == 6
    np.testing.assert_array_equal(random.fold_in(k, 7), threefry2x32_reference(k, np.array([0, 7], U32)))
    np.testing.assert_array_equal(random.fold_in(k, -1), threefry2x32_reference(k, np.array([0, 2 ** 32 - 1], U32)))
    np.testing.assert_array_equal(random.fold_in(k, np.int32(7)), random.fold_in(k, 7))


# ---------------------------------------------------------------------------------------
# Bits and uniform against closed forms on the reference words
# ---------------------------------------------------------------------------------------


def _reference_words(k, n):
    counters = np.stack([np.zeros(n, U32), np.arange(n, dtype=U32)], -1)
    out = threefry2x32_reference(k, counters).astype(np.uint64)
    return out[:, 0], out[:, 1]


def test_bits_and_uniform_closed_forms():
    k = random.key(11)
    w0, w1 = _reference_words(k, 12)
    np.testing.assert_array_equal(random.bits(k, (3, 4)), (w0 ^ w1).astype(U32).reshape(3, 4))
    np.testing.assert_array_equal(random.bits(k, (12,), np.uint64), (w0 << np.uint64(32)) | w1)
    np.testing.assert_array_equal(random.bits(k, (12,), np.uint8), ((w0 ^ w1) % 256).astype(np.uint8))
    np.testing.assert_array_equal(random.bits(k, (12,), np.uint16), ((w0 ^ w1) % 2 ** 16).astype(np.uint16))
    u32 = random.uniform(k, (12,), np.float32)
    assert u32.dtype == np.float32
    np.testing.assert_array_equal(u32, (((w0 ^ w1) >> np.uint64(9)) * 2.0 ** -23).astype(np.float32))
    u64 = random.uniform(k, (12,), np.float64)
    np.testing.assert_array_equal(u64, (((w0 << np.uint64(32)) | w1) >> np.uint64(12)) * 2.0 ** -52)
    scaled = random.uniform(k, (12,), np.float64, minval=-2.0, maxval=3.0)
    np.testing.assert_allclose(scaled, u64 * 5 - 2, rtol=1e-15)
    assert random.uniform(k).shape == () and random.bits(k).shape == ()


def test_a_longer_draw_extends_a_shorter_one():
    k = random.key(3)
    np.testing.assert_array_equal(random.bits(k, (10,))[:4], random.bits(k, (4,)))
    np.testing.assert_array_equal(random.normal(k, (2, 5), np.float64).ravel()[:7], random.normal(k, (7,), np.float64))


def test_default_dtype_follows_the_config():
    k = random.key(0)
    assert random.uniform(k, (2,)).dtype == np.float32
    assert random.normal(k, (2,)).dtype == np.float32
    with cv.config.override(default_float="float64"):
        assert random.uniform(k, (2,)).dtype == np.float64
        assert random.normal(k, (2,)).dtype == np.float64
        assert cv.config.default_float == np.float64
    assert cv.config.default_float == np.float32
    with pytest.raises(ValueError, match="default_float"):
        cv.config.update("default_float", "int32")
    with pytest.raises(KeyError, match="settings"):
        cv.config.update("jax_enable_x64", True)


# ---------------------------------------------------------------------------------------
# vmap equals a loop over keys, bit for bit, with one hash call for the whole batch
# ---------------------------------------------------------------------------------------

DRAWS = [
    ("split", lambda k: random.split(k, 3)),
    ("fold_in", lambda k: random.fold_in(k, 12)),
    ("bits", lambda k: random.bits(k, (4, 3))),
    ("bits64", lambda k: random.bits(k, (5,), np.uint64)),
    ("uniform32", lambda k: random.uniform(k, (6,), np.float32)),
    ("uniform64_bounds", lambda k: random.uniform(k, (2, 3), np.float64, -1.0, np.array([1.0, 2.0, 3.0]))),
    ("normal32", lambda k: random.normal(k, (7,), np.float32)),
    ("normal64", lambda k: random.normal(k, (2, 3), np.float64)),
    ("bernoulli", lambda k: random.bernoulli(k, 0.3, (9,))),
    ("bernoulli_array_p", lambda k: random.bernoulli(k, np.linspace(0, 1, 5))),
    ("randint", lambda k: random.randint(k, (8,), -3, 10)),
    ("randint_int32_array_bounds", lambda k: random.randint(k, (3,), np.array([0, 5, -9]), 20, np.int32)),
    ("split_then_normal", lambda k: random.normal(random.split(k)[1], (4,))),
]


@pytest.mark.parametrize("name, draw", DRAWS, ids=[d[0] for d in DRAWS])
@pytest.mark.parametrize("size", [5, 1, 0])
def test_vmap_over_keys_equals_a_loop(name, draw, size):
    keys = random.split(random.key(100), size)
    got = cv.vmap(draw)(keys)
    want = np.stack([draw(k) for k in keys]) if size else None
    if size:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    else:
        assert got.shape == (0,) + np.shape(draw(random.key(0)))
    # keys along axis 1, and nested vmap over a (2, size) grid of keys
    np.testing.assert_array_equal(cv.vmap(draw, in_axes=1)(keys.T), got)
    grid = random.split(random.key(7), (2, size))
    nested = cv.vmap(cv.vmap(draw))(grid)
    for i in range(2):
        for j in range(size):
            np.testing.assert_array_equal(nested[i, j], draw(grid[i, j]))


def test_vmap_over_seeds_and_fold_in_data_equals_a_loop():
    seeds = np.array([0, 1, 2 ** 40, -5])
    np.testing.assert_array_equal(cv.vmap(random.key)(seeds), np.stack([random.key(int(s)) for s in seeds]))
    k = random.key(9)
    data = np.arange(6)
    np.testing.assert_array_equal(cv.vmap(random.fold_in, in_axes=(None, 0))(k, data),
                                  np.stack([random.fold_in(k, int(i)) for i in data]))


def test_one_hash_call_for_a_batch_of_keys(monkeypatch):
    calls = []
    impl = prng.threefry2x32_p.impl

    def counting(key, count):
        calls.append(key.shape)
        return impl(key, count)

    monkeypatch.setattr(prng.threefry2x32_p, "impl", counting)
    draw = lambda k: random.normal(k, (50,))  # noqa: E731 - split + two uniform draws: 3 hashes
    draw(random.key(0))
    single = len(calls)
    keys = random.split(random.key(0), 32)
    calls.clear()
    cv.vmap(draw)(keys)
    assert len(calls) == single == 3
    assert all(shape[0] == 32 for shape in calls)  # each call hashes the whole batch of keys


# ---------------------------------------------------------------------------------------
# Statistics with fixed keys
# ---------------------------------------------------------------------------------------

N = 200_000


def _ks_distance(samples, cdf):
    x = np.sort(samples.astype(np.float64))
    f = cdf(x)
    n = len(x)
    return max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))


KS_CRITICAL = 1.95 / math.sqrt(N)  # the 0.1% critical value of the KS distance


def _normal_cdf(x):
    return 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_uniform_statistics(dtype):
    u = random.uniform(random.key(1), (N,), dtype)
    assert u.dtype == dtype and u.min() >= 0 and u.max() < 1
    se = math.sqrt(1 / 12 / N)
    assert abs(u.mean() - 0.5) < 5 * se
    assert abs(u.var() - 1 / 12) < 5 * math.sqrt(1 / 180 / N)  # Var(U²-ish): 1/180 for the variance estimate
    assert _ks_distance(u, lambda x: x) < KS_CRITICAL
    lo, hi = -3.0, 5.0
    v = random.uniform(random.key(2), (N,), dtype, lo, hi)
    assert v.min() >= lo and v.max() < hi
    assert abs(v.mean() - 1.0) < 5 * 8 * se


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normal_statistics(dtype):
    z = random.normal(random.key(3), (N,), dtype).astype(np.float64)
    assert abs(z.mean()) < 5 / math.sqrt(N)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / N)
    assert abs(np.mean(z ** 3)) < 5 * math.sqrt(15 / N)  # skewness 0
    assert abs(np.mean(z ** 4) - 3) < 5 * math.sqrt(96 / N)  # kurtosis 3
    assert _ks_distance(z, _normal_cdf) < KS_CRITICAL
    tail = np.mean(np.abs(z) > 3)  # 0.0027
    assert abs(tail - 0.0026998) < 5 * math.sqrt(0.0027 / N)


def test_split_keys_give_independent_streams():
    k1, k2 = random.split(random.key(4))
    a = random.normal(k1, (N,), np.float64)
    b = random.normal(k2, (N,), np.float64)
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(N)
    # neighbouring elements of one stream are uncorrelated too
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 5 / math.sqrt(N)
    # and a batch of keys under vmap gives uncorrelated rows
    rows = cv.vmap(lambda k: random.uniform(k, (1000,), np.float64))(random.split(random.key(5), 200))
    c = np.corrcoef(rows)
    assert np.max(np.abs(c[np.triu_indices(200, 1)])) < 6 / math.sqrt(1000)


def test_bits_are_balanced():
    b = random.bits(random.key(6), (N,))
    ones = np.unpackbits(b.view(np.uint8)).reshape(N, 32).mean(0)
    assert np.max(np.abs(ones - 0.5)) < 5 * math.sqrt(0.25 / N)


def test_bernoulli_statistics():
    for p in (0.0, 0.1, 0.5, 0.9, 1.0):
        m = random.bernoulli(random.key(7), p, (N,))
        assert m.dtype == np.bool_
        assert abs(m.mean() - p) <= 5 * math.sqrt(p * (1 - p) / N)
    ps = np.array([0.2, 0.8])
    m = cv.vmap(lambda k: random.bernoulli(k, ps))(random.split(random.key(8), N // 2))
    np.testing.assert_allclose(m.mean(0), ps, atol=5 * math.sqrt(0.16 / (N // 2)))


@pytest.mark.parametrize("lo, hi, dtype", [(0, 10, np.int64), (-5, 3, np.int32), (0, 256, np.uint8),
                                           (-2 ** 31, 2 ** 31, np.int32), (100, 100, np.int64)])
def test_randint_range_and_frequencies(lo, hi, dtype):
    r = random.randint(random.key(9), (N,), lo, hi, dtype)
    assert r.dtype == dtype
    if hi <= lo:
        np.testing.assert_array_equal(r, lo)  # an empty range gives minval, as in JAX
        return
    assert r.min() >= lo and r.max() < hi
    span = hi - lo
    if span <= 256:
        counts = np.bincount((r.astype(np.int64) - lo), minlength=span)
        expected = N / span
        assert np.max(np.abs(counts - expected)) < 5 * math.sqrt(expected)
    else:
        assert abs(r.astype(np.float64).mean() - (lo + hi - 1) / 2) < 5 * span / math.sqrt(12 * N)


# ---------------------------------------------------------------------------------------
# Derivatives, errors and devices
# ---------------------------------------------------------------------------------------


def test_uniform_is_differentiable_in_its_bounds_and_noise_is_a_constant():
    k = random.key(10)
    u = random.uniform(k, (50,), np.float64)

    def f(lo, hi):
        return cv.numpy.sum(random.uniform(k, (50,), np.float64, lo, hi) ** 2)

    g_lo, g_hi = cv.grad(f, argnums=(0, 1))(-1.0, 2.0)
    v = u * 3 - 1
    np.testing.assert_allclose(g_lo, np.sum(2 * v * (1 - u)), rtol=1e-12)
    np.testing.assert_allclose(g_hi, np.sum(2 * v * u), rtol=1e-12)
    x = np.linspace(-1, 1, 20)
    noise = random.normal(k, (20,), np.float64)
    np.testing.assert_allclose(cv.grad(lambda x: cv.numpy.sum(x * random.normal(k, x.shape, np.float64)))(x), noise)
    # per-example noise under vmap(grad), each example with its own key
    keys = random.split(k, 4)
    xs = np.ones((4, 20))
    g = cv.vmap(cv.grad(lambda x, kk: cv.numpy.sum(x * random.normal(kk, (20,), np.float64))))(xs, keys)
    np.testing.assert_array_equal(g, np.stack([random.normal(kk, (20,), np.float64) for kk in keys]))


def test_errors_say_what_a_key_is():
    keys = random.split(random.key(0), 3)
    with pytest.raises(ValueError, match=r"uint32 array of shape \(2,\).*cuvmap.vmap"):
        random.normal(keys, (2,))
    with pytest.raises(ValueError, match="uint32"):
        random.uniform(np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="float"):
        random.uniform(random.key(0), (2,), np.int32)
    with pytest.raises(ValueError, match="broadcast"):
        random.uniform(random.key(0), (2,), maxval=np.ones(3))
    with pytest.raises(ValueError, match="uint8, uint16"):
        random.bits(random.key(0), (2,), np.int32)


@pytest.mark.gpu
def test_same_numbers_on_cpu_and_gpu():
    if not cv_backend.gpu_available():
        pytest.skip("no CUDA device (or CuPy) available")
    keys = random.split(random.key(12), 6)
    gkeys = cv.device_put(keys, "gpu")
    for name, draw in DRAWS:
        if name in ("uniform64_bounds", "bernoulli_array_p", "randint_int32_array_bounds"):
            continue  # their NumPy operands would stay on the CPU
        cpu = cv.vmap(draw)(keys)
        gpu = cv.vmap(draw)(gkeys)
        assert cv_backend.is_cupy_array(gpu), name
        if name.startswith("normal") or name == "split_then_normal":
            np.testing.assert_allclose(gpu.get(), cpu, rtol=1e-6, atol=1e-6, err_msg=name)  # log, cos: libm ulps
        else:
            np.testing.assert_array_equal(gpu.get(), cpu, err_msg=name)
