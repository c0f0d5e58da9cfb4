"""``cuvmap.random``: explicit keys, Threefry-2x32, and draws that are the same under
``vmap``, in a loop and on either device.

References:
- the known-answer vectors of Random123 (those of JAX's tests), and JAX's documented
  splits of key 0, for the hash and the key layout;
- ``threefry2x32_reference`` (Python ints, ``tests/op_table.py``) and closed forms on its
  words for ``bits`` and ``uniform``;
- per-key Python loops for ``vmap`` (bit for bit);
- statistical bounds with fixed keys: means and variances within 5 standard errors, the
  Kolmogorov–Smirnov distance below its 0.1% critical value, bit and value frequencies,
  chi-square statistics below their 0.1% critical values (permutations of four elements,
  categorical frequencies against softmax(logits), choice and randint frequencies);
- closed forms for the derivatives of truncated_normal in its bounds and of the gathers
  of permutation and choice, and ``op_table.ref_erf_inv`` for normal's inversion.
"""
import math

import numpy as np
import pytest

import cuvmap as cv
from cuvmap import backend as cv_backend
from cuvmap import random
from cuvmap.lax import prng, sorting
from op_table import ref_erf_inv, threefry2x32_reference

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


def _run_c_body(body, **inputs):
    """Runs the GPU kernel's C body (statements on ``unsigned int`` words) with NumPy
    uint32 arrays: the declarations become assignments and ``13u`` a uint32 literal, so
    the statements keep C's wrapping arithmetic. Returns ``(y0, y1)``."""
    import re

    text = re.sub(r"(\d+)u\b", r"U32(\1)", body.replace("unsigned int ", ""))
    names = dict(U32=U32, **{k: v.copy() for k, v in inputs.items()})
    for line in text.splitlines():
        for statement in filter(None, (s.strip() for s in line.split(";"))):
            exec(statement, names)
    return names["y0"], names["y1"]


@pytest.mark.parametrize("k, x, want", KNOWN_ANSWERS)
def test_the_gpu_kernel_body_computes_the_same_words(k, x, want):
    """On the GPU the hash is one generated kernel (NOTE [threefry in one kernel] in
    cuvmap/cuda/kernels.py): its C statements, run on uint32 arrays, give the known answers
    and the ufunc words of many random pairs."""
    rng = np.random.default_rng(1)
    k0, k1 = np.array([k[0]], U32), np.array([k[1]], U32)
    x0 = np.concatenate([[x[0]], rng.integers(0, 2 ** 32, 99, dtype=U32)]).astype(U32)
    x1 = np.concatenate([[x[1]], rng.integers(0, 2 ** 32, 99, dtype=U32)]).astype(U32)
    y0, y1 = _run_c_body(prng.threefry2x32_body(), k0=k0, k1=k1, x0=x0, x1=x1)
    assert (int(y0[0]), int(y1[0])) == want
    w0, w1 = prng.threefry2x32_words(k0, k1, x0.copy(), x1.copy())
    np.testing.assert_array_equal(y0, w0)
    np.testing.assert_array_equal(y1, w1)


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
        cv.config.update("jax_no_such_setting", True)
    with cv.config.override(default_float="float32"):  # JAX's spelling of 64-bit floats
        cv.config.update("jax_enable_x64", True)
        assert cv.config.default_float == np.float64
    assert cv.config.default_float == np.float32


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
    ("gumbel", lambda k: random.gumbel(k, (2, 3), np.float64)),
    ("truncated_normal", lambda k: random.truncated_normal(k, -0.5, 2.0, (6,), np.float64)),
    ("truncated_normal_array_bounds",
     lambda k: random.truncated_normal(k, np.array([-np.inf, 0.0, 1.0]), np.array([0.0, np.inf, 1.5]))),
    ("permutation", lambda k: random.permutation(k, 7)),
    ("permutation_array_axis1", lambda k: random.permutation(k, np.arange(12.0).reshape(3, 4), axis=1)),
    ("permutation_independent", lambda k: random.permutation(k, np.arange(12).reshape(3, 4), 0, True)),
    ("choice", lambda k: random.choice(k, 6, (2, 3))),
    ("choice_no_replace", lambda k: random.choice(k, 9, (4,), replace=False)),
    ("choice_p_array_axis1", lambda k: random.choice(k, np.arange(8.0).reshape(2, 4), (3,), True,
                                                    np.array([0.1, 0.0, 0.6, 0.3]), axis=1)),
    ("choice_p_no_replace", lambda k: random.choice(k, 5, (3,), False, np.array([0.1, 0.2, 0.3, 0.2, 0.2]))),
    ("categorical", lambda k: random.categorical(k, np.array([[0.5, -1.0, 2.0], [0.0, 0.0, -np.inf]]))),
    ("categorical_axis0_shape", lambda k: random.categorical(k, np.log(np.arange(1.0, 7.0)).reshape(3, 2), 0,
                                                             (4, 2))),
]
# the draws whose operands are NumPy arrays (they stay on the CPU) and those whose float
# math (log, erf, erf_inv) may differ in the last bits between NumPy and CUDA
NUMPY_OPERANDS = ("uniform64_bounds", "bernoulli_array_p", "randint_int32_array_bounds",
                  "truncated_normal_array_bounds", "permutation_array_axis1", "permutation_independent",
                  "choice_p_array_axis1", "choice_p_no_replace", "categorical", "categorical_axis0_shape")
LIBM = ("normal32", "normal64", "split_then_normal", "gumbel", "truncated_normal")


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


@pytest.mark.parametrize("name, draw", DRAWS, ids=[d[0] for d in DRAWS])
def test_jit_and_vmap_of_jit_equal_eager_draws(name, draw):
    keys = random.split(random.key(101), 3)
    want = np.stack([draw(k) for k in keys])
    jitted = cv.jit(draw)
    np.testing.assert_array_equal(jitted(keys[0]), want[0])
    np.testing.assert_array_equal(cv.vmap(jitted)(keys), want)


@pytest.mark.parametrize("name, draw", [d for d in DRAWS if d[0] in (
    "normal32", "truncated_normal", "permutation", "permutation_independent", "choice_no_replace",
    "choice_p_array_axis1", "choice_p_no_replace", "categorical")], ids=lambda v: v if isinstance(v, str) else "")
def test_one_hash_and_one_sort_for_a_batch_of_keys(monkeypatch, name, draw):
    calls = []
    for prim in (prng.threefry2x32_p, sorting.argsort_p):
        def counting(*args, _impl=prim.impl, _name=prim.name, **params):
            calls.append((_name, np.shape(args[0])))
            return _impl(*args, **params)

        monkeypatch.setattr(prim, "impl", counting)
    draw(random.key(0))
    single = [c[0] for c in calls]
    keys = random.split(random.key(0), 32)
    calls.clear()
    cv.vmap(draw)(keys)
    # the same calls as for one key (never one per key), each for the whole batch
    assert [c[0] for c in calls] == single and single.count("threefry2x32") >= 1
    assert all(shape[0] == 32 for _, shape in calls), calls


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


def _chi2(counts, expected):
    return float(np.sum((counts - expected) ** 2 / expected))


def _chi2_critical(dof, z=3.0902):
    """The 0.1% upper critical value of the chi-square distribution with ``dof`` degrees of
    freedom, by the Wilson–Hilferty approximation (``z``: the normal's 0.1% point)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def test_chi2_critical_values():
    # the tabulated 0.1% points of chi-square with 3, 9 and 23 degrees of freedom
    for dof, table in ((3, 16.266), (9, 27.877), (23, 49.728)):
        assert abs(_chi2_critical(dof) - table) < 0.02 * table


def test_permutations_of_four_are_uniform_over_keys():
    m = 24_000
    perms = cv.vmap(lambda k: random.permutation(k, 4))(random.split(random.key(20), m))
    assert perms.dtype == np.int64 and perms.shape == (m, 4)
    np.testing.assert_array_equal(np.sort(perms, 1), np.broadcast_to(np.arange(4), (m, 4)))
    counts = np.unique(perms @ 4 ** np.arange(4), return_counts=True)[1]  # each permutation's base-4 code
    assert len(counts) == 24 and _chi2(counts, m / 24) < _chi2_critical(23)
    at = np.stack([(perms == v).sum(0) for v in range(4)])  # value v at each position
    assert _chi2(at, m / 4) < _chi2_critical(9)


def test_independent_permutations_are_uniform_and_rows_move_together_otherwise():
    m = 24_000
    k = random.key(21)
    cols = random.permutation(k, np.broadcast_to(np.arange(4)[:, None], (4, m)), axis=0, independent=True)
    np.testing.assert_array_equal(np.sort(cols, 0), np.broadcast_to(np.arange(4)[:, None], (4, m)))
    counts = np.unique(4 ** np.arange(4) @ cols, return_counts=True)[1]
    assert len(counts) == 24 and _chi2(counts, m / 24) < _chi2_critical(23)
    # not independent: whole slices move, by the permutation of arange(n) from the same key
    x = np.arange(20.0).reshape(4, 5)
    perm = random.permutation(k, 5)
    np.testing.assert_array_equal(random.permutation(k, x, axis=1), x[:, perm])
    np.testing.assert_array_equal(random.permutation(k, x[0]), x[0][perm])
    np.testing.assert_array_equal(random.permutation(k, x, axis=-1), x[:, perm])
    # past 1625 elements the shuffle sorts twice; still a permutation, and vmap equals a loop
    keys = random.split(k, 3)
    big = cv.vmap(lambda kk: random.permutation(kk, 2000))(keys)
    np.testing.assert_array_equal(np.sort(big, 1), np.broadcast_to(np.arange(2000), (3, 2000)))
    np.testing.assert_array_equal(big, np.stack([random.permutation(kk, 2000) for kk in keys]))
    assert random.permutation(k, 0).shape == (0,) and random.permutation(k, 1).tolist() == [0]


def _softmax(z):
    e = np.exp(z - np.max(z, axis=0))
    return e / e.sum(axis=0)


def test_categorical_frequencies_follow_softmax():
    logits = np.array([1.0, 0.0, -1.0, 2.0, -np.inf])
    p = _softmax(logits)
    draws = random.categorical(random.key(22), logits, shape=(N,))
    assert draws.dtype == np.int64 and draws.shape == (N,)
    counts = np.bincount(draws, minlength=5)
    assert counts[4] == 0  # probability 0
    assert np.all(np.abs(counts[:4] / N - p[:4]) < 5 * np.sqrt(p[:4] * (1 - p[:4]) / N))
    assert _chi2(counts[:4], N * p[:4]) < _chi2_critical(3)
    # categories along axis 0 of a batch of two distributions, one key per draw under vmap
    logits2 = np.array([[0.0, 3.0], [1.0, 0.0], [-1.0, 0.0]], np.float32)
    m = N // 4
    d = cv.vmap(lambda k: random.categorical(k, logits2, axis=0))(random.split(random.key(23), m))
    assert d.shape == (m, 2)
    for j in range(2):
        pj = _softmax(logits2[:, j].astype(np.float64))
        assert _chi2(np.bincount(d[:, j], minlength=3), m * pj) < _chi2_critical(2)


def test_choice_frequencies():
    c = random.choice(random.key(24), 7, (N,))
    assert c.dtype == np.int64
    assert _chi2(np.bincount(c, minlength=7), N / 7) < _chi2_critical(6)
    p = np.array([0.1, 0.0, 0.45, 0.05, 0.4])
    c = random.choice(random.key(25), 5, (N,), p=p)
    counts = np.bincount(c, minlength=5)
    assert counts[1] == 0
    nz = p > 0
    assert _chi2(counts[nz], N * p[nz]) < _chi2_critical(3)
    # without replacement: distinct elements; the first pick uniform, or following p, and
    # the second pick following p_j Σ_{i≠j} p_i / (1 − p_i) (successive sampling)
    m = 20_000
    keys = random.split(random.key(26), m)
    c = cv.vmap(lambda k: random.choice(k, 6, (3,), replace=False))(keys)
    assert np.all(np.diff(np.sort(c, 1), axis=1) > 0)
    for j in range(3):
        assert _chi2(np.bincount(c[:, j], minlength=6), m / 6) < _chi2_critical(5)
    pw = np.array([0.5, 0.25, 0.125, 0.125])
    c = cv.vmap(lambda k: random.choice(k, 4, (2,), False, pw))(keys)
    assert np.all(c[:, 0] != c[:, 1])
    second = np.array([pw[j] * sum(pw[i] / (1 - pw[i]) for i in range(4) if i != j) for j in range(4)])
    assert abs(second.sum() - 1) < 1e-12
    assert _chi2(np.bincount(c[:, 0], minlength=4), m * pw) < _chi2_critical(3)
    assert _chi2(np.bincount(c[:, 1], minlength=4), m * second) < _chi2_critical(3)
    # slices of an array along an axis
    a = np.arange(12.0).reshape(3, 4)
    k = random.key(27)
    np.testing.assert_array_equal(random.choice(k, a, (2, 5), axis=1), a[:, random.choice(k, 4, (2, 5))])
    np.testing.assert_array_equal(random.choice(k, a, (2,), replace=False), a[random.permutation(k, 3)[:2]])
    assert random.choice(k, a, (0, 2), axis=0).shape == (0, 2, 4)


def _truncated_cdf(lo, hi):
    plo, phi = _normal_cdf(np.array(lo)), _normal_cdf(np.array(hi))
    return lambda x: (_normal_cdf(x) - plo) / (phi - plo)


@pytest.mark.parametrize("lo, hi", [(-1.0, 2.0), (1.5, np.inf), (-np.inf, -3.0), (-0.1, 0.1), (-np.inf, np.inf)])
def test_truncated_normal_statistics(lo, hi):
    z = random.truncated_normal(random.key(28), lo, hi, (N,), np.float64)
    assert z.dtype == np.float64 and (z > lo).all() and (z < hi).all()
    assert _ks_distance(z, _truncated_cdf(lo, hi)) < KS_CRITICAL
    z32 = random.truncated_normal(random.key(29), lo, hi, (N // 10,))
    assert z32.dtype == np.float32 and (z32 > np.float32(lo)).all() and (z32 < np.float32(hi)).all()
    assert np.isfinite(z32).all()


def test_gumbel_statistics():
    g = random.gumbel(random.key(30), (N,), np.float64)
    assert _ks_distance(g, lambda x: np.exp(-np.exp(-x))) < KS_CRITICAL
    assert abs(g.mean() - 0.5772156649) < 5 * math.pi / math.sqrt(6 * N)


def test_normal_is_the_inversion_of_a_uniform_draw():
    """√2 · erf_inv(u) for JAX's u on [nextafter(−1, 0), 1), from the reference words and
    a bisection of math.erf (op_table.ref_erf_inv)."""
    k = random.key(13)
    w0, w1 = _reference_words(k, 12)
    floats = (((w0 << np.uint64(32)) | w1) >> np.uint64(12)) * 2.0 ** -52
    lo = np.nextafter(-1.0, 0.0)
    u = np.maximum(lo, floats * (1.0 - lo) + lo)
    np.testing.assert_allclose(random.normal(k, (12,), np.float64), math.sqrt(2) * ref_erf_inv(u), rtol=1e-15)


def test_randint_with_traced_bounds_equals_a_loop_and_is_uniform():
    lo, hi = np.array([0, -5, 10]), np.array([7, 5, 11])
    keys = random.split(random.key(31), 3)
    draw = lambda k, a, b: random.randint(k, (N // 10,), a, b)  # noqa: E731
    got = cv.vmap(draw)(keys, lo, hi)
    for i in range(3):
        np.testing.assert_array_equal(got[i], draw(keys[i], int(lo[i]), int(hi[i])))
        span = hi[i] - lo[i]
        assert got[i].min() >= lo[i] and got[i].max() < hi[i]
        if span > 1:
            assert _chi2(np.bincount(got[i] - lo[i], minlength=span), N // 10 / span) < _chi2_critical(span - 1)


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
        if name in NUMPY_OPERANDS:
            continue  # their NumPy operands would stay on the CPU
        cpu = cv.vmap(draw)(keys)
        gpu = cv.vmap(draw)(gkeys)
        assert cv_backend.is_cupy_array(gpu), name
        if name in LIBM:
            np.testing.assert_allclose(gpu.get(), cpu, rtol=1e-6, atol=1e-6, err_msg=name)  # libm ulps
        else:
            np.testing.assert_array_equal(gpu.get(), cpu, err_msg=name)


def test_truncated_normal_derivatives_in_its_bounds():
    """For fixed random bits the draw is x = Φ⁻¹(Φ(lo) + f·(Φ(hi) − Φ(lo))), so
    ∂x/∂lo = φ(lo)(1 − f)/φ(x) and ∂x/∂hi = φ(hi)·f/φ(x)."""
    from cuvmap.test_util import check_grads

    k = random.key(32)
    lo, hi = -0.7, 1.3
    draw = lambda a, b: random.truncated_normal(k, a, b, (20,), np.float64)  # noqa: E731
    x = draw(lo, hi)
    pdf = lambda v: np.exp(-v * v / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    f = _truncated_cdf(lo, hi)(x)
    g_lo, g_hi = cv.grad(lambda a, b: cv.numpy.sum(draw(a, b)), argnums=(0, 1))(lo, hi)
    np.testing.assert_allclose(g_lo, np.sum(pdf(lo) * (1 - f) / pdf(x)), rtol=1e-9)
    np.testing.assert_allclose(g_hi, np.sum(pdf(hi) * f / pdf(x)), rtol=1e-9)
    check_grads(draw, (np.array(lo), np.array(hi)), order=2, atol=1e-5, rtol=1e-5)
    # per-example bounds under vmap(grad)
    los = np.array([-0.7, 0.0, -2.0])
    g = cv.vmap(cv.grad(lambda a: cv.numpy.sum(draw(a, hi))))(los)
    np.testing.assert_allclose(g, [cv.grad(lambda a: cv.numpy.sum(draw(a, hi)))(v) for v in los], rtol=1e-12)


def test_permutation_and_choice_differentiate_as_gathers():
    k = random.key(33)
    x = np.linspace(-1.0, 1.0, 6)
    w = np.arange(6.0)
    perm = random.permutation(k, 6)
    g = cv.grad(lambda v: cv.numpy.sum(w * random.permutation(k, v)))(x)
    np.testing.assert_array_equal(g[perm], w)  # the cotangent goes back where each element came from
    idx = random.choice(k, 6, (10,))
    g = cv.grad(lambda v: cv.numpy.sum(random.choice(k, v, (10,))))(x)
    np.testing.assert_array_equal(g, np.bincount(idx, minlength=6))
    # categorical and permutations of integers carry no derivative: an integer side computation
    logits = np.array([0.2, -0.3, 1.0])
    h = cv.grad(lambda z: cv.numpy.sum(z) * cv.numpy.sum(random.categorical(k, z, shape=(4,))))(logits)
    np.testing.assert_array_equal(h, np.sum(random.categorical(k, logits, shape=(4,))) * np.ones(3))


def test_permutation_choice_categorical_errors():
    k = random.key(0)
    with pytest.raises(TypeError, match="a 0-d traced value cannot give the size"):
        cv.vmap(lambda n: random.permutation(k, n))(np.arange(3))
    with pytest.raises(TypeError, match="must be an integer"):
        random.permutation(k, np.array(2.5))
    with pytest.raises(ValueError, match=r"axis 2 is out of range for an array of shape \(3, 4\)"):
        random.permutation(k, np.ones((3, 4)), axis=2)
    with pytest.raises(ValueError, match=r"cannot take a larger sample \(5\) than the population \(4\)"):
        random.choice(k, 4, (5,), replace=False)
    with pytest.raises(ValueError, match=r"p must have the shape \(4,\) of the population"):
        random.choice(k, 4, (2,), p=np.ones(3) / 3)
    with pytest.raises(ValueError, match="must not be empty"):
        random.choice(k, 0, (2,))
    with pytest.raises(ValueError, match=r"shape \(4, 3\) must end with the batch shape \(2,\)"):
        random.categorical(k, np.zeros((2, 5)), shape=(4, 3))
    with pytest.raises(ValueError, match="at least one dim"):
        random.categorical(k, 1.0)
    with pytest.raises(ValueError, match="float16, float32 or float64"):
        random.truncated_normal(k, -1, 1, (2,), np.int32)
    with pytest.raises(ValueError, match="does not broadcast"):
        random.truncated_normal(k, np.zeros(3), 1.0, (2,))
