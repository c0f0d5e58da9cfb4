"""Random numbers from explicit keys, as ``jax.random``: counter-based, reproducible, and
valid under every transform.

A *key* is a uint32 array of shape ``(2,)`` (JAX's raw ``PRNGKey`` layout). Nothing is
stateful: a draw is a pure function of its key, so the same key gives the same numbers
every time, and to draw again you split the key::

    import cuvmap.random as random
    key = random.key(0)
    key, sub = random.split(key)
    x = random.normal(sub, (3, 4))
    keys = random.split(key, 8)                         # one key per example
    noise = cv.vmap(lambda k: random.normal(k, (5,)))(keys)   # (8, 5), one hash call

Every draw hashes counters ``0 .. n-1`` under its key with Threefry-2x32
(:func:`cuvmap.lax.threefry2x32`, NOTE [threefry with array ops] in ``lax/prng.py``).
Under ``vmap`` over keys the hash runs once for the whole batch, never in a loop, and
gives example ``b`` exactly the numbers that a call with ``keys[b]`` gives. The bits are
identical on the CPU (NumPy) and the GPU (CuPy): they are integer arithmetic. So are the
draws of ``uniform``, ``bernoulli``, ``randint``, ``permutation`` and ``choice`` without
``p`` (exact float operations and sorts of those bits); ``normal``, ``truncated_normal``,
``gumbel``, ``categorical`` and ``choice`` with ``p`` apply ``erf_inv``, ``erf`` or
``log``, whose last bit may differ between cuvmap's CPU kernels and CUDA's.

Draws: ``bits``, ``uniform``, ``normal``, ``truncated_normal``, ``bernoulli``, ``randint``,
``gumbel``, ``categorical``, ``permutation`` and ``choice``, each a composite of
primitives, so every one is vectorised over keys under ``vmap`` and staged by ``jit``.

JAX compatibility: every draw follows JAX's algorithm with
``jax_threefry_partitionable=True`` (JAX's default since 0.5) and JAX's 64-bit seeds (as
under ``jax_enable_x64``): ``key``, ``split``, ``fold_in``, ``bits``, ``uniform``,
``bernoulli``, ``randint`` and the sort-based ``permutation`` (and ``choice`` built on
them) are meant to give JAX's numbers for the same key; ``normal`` (``√2 · erf_inv`` of a
uniform draw), ``truncated_normal``, ``gumbel`` and ``categorical`` JAX's numbers up to the
last bits of ``erf_inv``, ``erf`` and ``log``. The tests check the hash against the
Random123 vectors and ``split`` against JAX's documented splits of key 0 (JAX itself is
not a dependency). ``shuffle``, deprecated in JAX, is left out: use ``permutation``.

Derivatives: the float inputs of draws are differentiable as in JAX — the bounds of
``uniform`` and ``truncated_normal``, the array that ``permutation`` and ``choice`` gather
from — while the probability of ``bernoulli`` (a comparison) and the logits of
``categorical`` (an argmax) give integer or boolean results with zero derivative; keys
and bits are integers. Nothing here needs a rule of its own.
"""
import math

import numpy as np

from cuvmap import backend, config, core
from cuvmap.lax import bitwise, elementwise as ew
from cuvmap.lax import cumulative as lax_cumulative
from cuvmap.lax import indexing as lax_indexing
from cuvmap.lax import reduction as lax_reduction
from cuvmap.lax import shape as lax_shape
from cuvmap.lax import sorting as lax_sorting
from cuvmap.lax.prng import threefry2x32  # noqa: F401  (re-exported)
from cuvmap.core.bfloat16 import kind_of

U32 = np.dtype(np.uint32)
_UINT = {8: np.dtype(np.uint8), 16: np.dtype(np.uint16), 32: U32, 64: np.dtype(np.uint64)}


# ---------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------


def key(seed):
    """A key from an integer seed: the words ``(seed >> 32, seed & 0xFFFFFFFF)`` of the
    seed as a 64-bit integer (JAX's ``PRNGKey`` with 64-bit seeds); integer arrays of
    other widths give ``(0, seed)`` (shifting a 32-bit seed by 32 gives 0, as in JAX). The
    seed may be a traced value (``vmap(random.key)(seeds)``).

    Args:
      seed: a Python int in ``[-2**63, 2**64)`` or a 0-d integer array.
    Returns:
      uint32 array ``(2,)`` on the seed's device (the CPU for a Python int).
    """
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError("random.key: the seed must be an integer, got a bool")
    if isinstance(seed, int):
        s = seed
        if not -2 ** 63 <= s < 2 ** 64:
            raise OverflowError(f"random.key: seed {s} does not fit in 64 bits")
        s %= 2 ** 64
        return np.array([s >> 32, s & 0xFFFFFFFF], dtype=U32)
    dtype = core.dtype_of(seed)
    if kind_of(dtype) not in "iu" or core.shape_of(seed) != ():
        raise TypeError(f"random.key: the seed must be a 0-d integer, got {dtype}{list(core.shape_of(seed))}")
    hi = ew.convert_element_type(bitwise.shift_right_logical(seed, 32), U32)
    lo = ew.convert_element_type(seed, U32)
    return lax_shape.concatenate([lax_shape.reshape(hi, (1,)), lax_shape.reshape(lo, (1,))], 0)


PRNGKey = key


def _check_key(k, what):
    if isinstance(k, (list, tuple)):
        k = np.asarray(k, dtype=U32)
    shape = core.shape_of(k)
    if shape != (2,) or core.dtype_of(k) != U32:
        hint = ""
        if len(shape) > 1 and shape[-1] == 2 and core.dtype_of(k) == U32:
            hint = (f"; to draw with each of several keys, map over them: "
                    f"cuvmap.vmap(lambda k: random.{what}(k, ...))(keys)")
        raise ValueError(f"random.{what}: a key is a uint32 array of shape (2,) (from random.key or random.split), "
                         f"got {core.dtype_of(k)}{list(shape)}{hint}")
    return k


def _counters(n, k):
    """The counters ``0 .. n-1`` as (high, low) uint32 words ``(n, 2)`` on ``k``'s device:
    a constant to every transform."""
    xp = backend.xp_of(k)
    if n < 2 ** 32:
        lo = xp.arange(n, dtype=U32)
        hi = xp.zeros(n, dtype=U32)
    else:
        idx = xp.arange(n, dtype=np.uint64)
        lo, hi = idx.astype(U32), (idx >> np.uint64(32)).astype(U32)
    return xp.stack([hi, lo], axis=-1)


def _shape(shape, what):
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"random.{what}: negative dimension in shape {shape}")
    return shape


def split(key, num=2):
    """``num`` new keys from ``key`` (an int, or a shape: ``split(k, (2, 3))`` is
    ``(2, 3, 2)``): key ``i`` is the hash of counter ``i``.

    Returns:
      uint32 array ``(num, 2)`` (or ``(*shape, 2)``).
    """
    k = _check_key(key, "split")
    shape = _shape(num, "split")
    n = math.prod(shape)
    return lax_shape.reshape(threefry2x32(k, _counters(n, k)), shape + (2,))


def fold_in(key, data):
    """A new key from ``key`` and an integer ``data`` (a step number, an example index; a
    traced value too): the hash of the counter ``(0, uint32(data))``."""
    k = _check_key(key, "fold_in")
    if isinstance(data, (int, np.integer)) and not isinstance(data, (bool, np.bool_)):
        count = backend.xp_of(k).asarray([0, int(data) % 2 ** 32], dtype=U32)
    else:
        if kind_of(core.dtype_of(data)) not in "iu" or core.shape_of(data) != ():
            raise TypeError(f"random.fold_in: data must be a 0-d integer, got "
                            f"{core.dtype_of(data)}{list(core.shape_of(data))}")
        lo = lax_shape.reshape(ew.convert_element_type(data, U32), (1,))
        count = lax_shape.concatenate([ew.mul(lo, 0), lo], 0)
    return threefry2x32(k, count)


# ---------------------------------------------------------------------------------------
# Bits
# ---------------------------------------------------------------------------------------


def _words(k, shape):
    """The two 32-bit output words of the hash of counters ``0 .. n-1`` under ``k``, each
    of ``shape``."""
    n = math.prod(shape)
    out = threefry2x32(k, _counters(n, k))
    return lax_shape.reshape(out[:, 0], shape), lax_shape.reshape(out[:, 1], shape)


def bits(key, shape=(), dtype=np.uint32):
    """Uniformly random bits: an array of ``shape`` and the unsigned ``dtype`` (uint8,
    uint16, uint32 or uint64). Element ``i`` (in C order) depends on counter ``i`` only, so
    a longer draw extends a shorter one."""
    k = _check_key(key, "bits")
    dtype = np.dtype(dtype)
    if dtype not in _UINT.values():
        raise ValueError(f"random.bits: dtype must be uint8, uint16, uint32 or uint64, got {dtype}")
    y0, y1 = _words(k, _shape(shape, "bits"))
    if dtype.itemsize == 8:
        hi = bitwise.shift_left(ew.convert_element_type(y0, dtype), 32)
        return bitwise.bitwise_or(hi, ew.convert_element_type(y1, dtype))
    out = bitwise.bitwise_xor(y0, y1)
    return out if dtype == U32 else ew.convert_element_type(out, dtype)


# ---------------------------------------------------------------------------------------
# Distributions
# ---------------------------------------------------------------------------------------


def _float_dtype(dtype, what):
    dtype = config.default_float if dtype is None else np.dtype(dtype)
    if kind_of(dtype) != "f" or dtype.itemsize not in (2, 4, 8):
        raise ValueError(f"random.{what}: dtype must be float16, float32 or float64, got {dtype}")
    return dtype


def _is_scalar(value):
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _bound(value, dtype, shape, what, name):
    """A bound as a Python float rounded to ``dtype`` (weakly typed: it keeps the draw's
    dtype, and it is a constant on every device), or an array of ``dtype`` that
    broadcasts to ``shape``."""
    if _is_scalar(value):
        return float(np.asarray(value).astype(dtype))
    s = core.shape_of(value)
    try:
        ok = np.broadcast_shapes(s, shape) == shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"random.{what}: {name} of shape {s} does not broadcast to the shape {shape} of the draw")
    return ew.convert_element_type(value, dtype)


def uniform(key, shape=(), dtype=None, minval=0.0, maxval=1.0):
    """Uniform floats in ``[minval, maxval)``.

    The mantissa bits of a float in ``[1, 2)`` are filled with random bits, 1 is
    subtracted (exact), and the result is scaled (JAX's construction): the values are the
    multiples of ``2**-23`` (float32; ``2**-52`` for float64) in ``[0, 1)``, each equally
    likely.

    Args:
      key: a key.
      shape: the shape of the draw.
      dtype: a float dtype (``cuvmap.config.default_float`` when ``None``).
      minval, maxval: bounds (scalars, or arrays that broadcast to ``shape``); the draw is
        differentiable with respect to them, as in JAX.
    """
    k = _check_key(key, "uniform")
    dtype = _float_dtype(dtype, "uniform")
    shape = _shape(shape, "uniform")
    nbits = dtype.itemsize * 8
    nmant = np.finfo(dtype).nmant
    udtype = _UINT[nbits]
    b = bits(k, shape, udtype)
    one = int(np.array(1.0, dtype).view(udtype))
    mantissa = bitwise.bitwise_or(bitwise.shift_right_logical(b, nbits - nmant), one)
    floats = ew.sub(bitwise.bitcast_convert_type(mantissa, dtype), 1.0)
    if type(minval) in (int, float) and type(maxval) in (int, float) and (minval, maxval) == (0, 1):
        return floats
    lo = _bound(minval, dtype, shape, "uniform", "minval")
    hi = _bound(maxval, dtype, shape, "uniform", "maxval")
    if type(lo) is float and type(hi) is float:
        with np.errstate(over="ignore", invalid="ignore"):
            span = float(np.asarray(hi, dtype) - np.asarray(lo, dtype))  # in the draw's dtype, as JAX
    else:
        span = ew.sub(hi, lo)
    return ew.max(lo, ew.add(ew.mul(floats, span), lo))


def normal(key, shape=(), dtype=None):
    """Standard normal floats by inversion, as JAX draws them: ``√2 · erf_inv(u)`` for ``u``
    uniform in ``(−1, 1)`` (``uniform`` on ``[nextafter(−1, 0), 1)``), so that ``−1``, whose
    ``erf_inv`` is ``−inf``, is never drawn.

    Args:
      key: a key.
      shape: the shape of the draw.
      dtype: a float dtype (``cuvmap.config.default_float`` when ``None``).
    """
    k = _check_key(key, "normal")
    dtype = _float_dtype(dtype, "normal")
    shape = _shape(shape, "normal")
    lo = float(np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype)))
    u = uniform(k, shape, dtype, lo, 1.0)
    return ew.mul(ew.erf_inv(u), math.sqrt(2))


def truncated_normal(key, lower, upper, shape=None, dtype=None):
    """Standard normal floats conditioned on ``lower < x < upper``, by inversion (JAX's
    algorithm): ``√2 · erf_inv(u)`` for ``u`` uniform between ``erf(lower / √2)`` and
    ``erf(upper / √2)``, clipped to the open interval (the next floats inside the bounds) so
    that rounding never reaches a bound. The bounds may be ``±inf``.

    Args:
      key: a key.
      lower, upper: the bounds: scalars or arrays (traced ones too) that broadcast to ``shape``.
      shape: the shape of the draw (the bounds' broadcast shape when ``None``).
      dtype: a float dtype (``cuvmap.config.default_float`` when ``None``).
    Returns:
      an array of ``shape``, differentiable with respect to the bounds (as in JAX: the
      draw moves with them for fixed random bits).
    """
    k = _check_key(key, "truncated_normal")
    dtype = _float_dtype(dtype, "truncated_normal")
    if shape is None:
        shape = tuple(np.broadcast_shapes(core.shape_of(lower), core.shape_of(upper)))
    shape = _shape(shape, "truncated_normal")
    lower = _bound_array(_as_float(lower, "truncated_normal", "lower"), dtype, k)
    upper = _bound_array(_as_float(upper, "truncated_normal", "upper"), dtype, k)
    sqrt2 = math.sqrt(2)
    a = ew.erf(ew.div(lower, sqrt2))
    b = ew.erf(ew.div(upper, sqrt2))
    u = uniform(k, shape, dtype, a, b)
    out = ew.mul(ew.erf_inv(u), sqrt2)
    low = _next_float(ew.stop_gradient(lower), up=True)
    high = _next_float(ew.stop_gradient(upper), up=False)
    return ew.min(ew.max(out, low), high)


def _bound_array(value, dtype, k):
    """``value`` as an array of ``dtype``; a Python scalar on ``k``'s device."""
    if _is_scalar(value):
        return backend.xp_of(k).asarray(value, dtype=dtype)
    return ew.convert_element_type(value, dtype)


def _as_float(value, what, name):
    if isinstance(value, (list, tuple)):
        value = np.asarray(value, dtype=config.default_float)
    if not isinstance(value, (int, float)) and kind_of(core.dtype_of(value)) not in "biuf":
        raise TypeError(f"random.{what}: {name} must be real numbers, got {core.dtype_of(value)}")
    return value


def _next_float(x, up):
    """``numpy.nextafter(x, ±inf)`` of a float array, from its bits: a step of one in the
    sign-magnitude bit pattern, away from zero going outward (``x > 0`` going up), toward
    it going inward; ``±0`` steps to the smallest subnormal of the direction's sign;
    ``−inf`` goes up to the most negative finite float and ``inf`` down to the largest."""
    dtype = core.dtype_of(x)
    ints = np.dtype(f"int{dtype.itemsize * 8}")
    bits_ = bitwise.bitcast_convert_type(x, ints)
    step = ew.select(ew.gt(x, 0), 1, -1) if up else ew.select(ew.gt(x, 0), -1, 1)
    moved = bitwise.bitcast_convert_type(ew.add(bits_, ew.convert_element_type(step, ints)), dtype)
    tiny = np.array(1, ints).view(dtype).item()  # the smallest subnormal
    return ew.select(ew.eq(x, 0), tiny if up else -tiny, moved)


def bernoulli(key, p=0.5, shape=None):
    """Random booleans, True with probability ``p``: ``uniform(key, shape) < p``, with
    ``p``'s float dtype (``cuvmap.config.default_float`` for a Python float).

    Args:
      key: a key.
      p: a probability, or an array of them that broadcasts to ``shape``.
      shape: the shape of the draw (``p``'s shape when ``None``).
    """
    k = _check_key(key, "bernoulli")
    p_shape = core.shape_of(p)
    shape = p_shape if shape is None else _shape(shape, "bernoulli")
    if isinstance(p, (int, float)) and not isinstance(p, bool):
        dtype = config.default_float
    else:
        dtype = core.dtype_of(p)
        if kind_of(dtype) != "f":
            dtype = config.default_float
        _bound(p, dtype, shape, "bernoulli", "p")
    return ew.lt(uniform(k, shape, dtype), p)


def randint(key, shape, minval, maxval, dtype=np.int64):
    """Uniform integers in ``[minval, maxval)`` (JAX's algorithm: two draws of random bits
    combined modulo the span, so the bias is at most ``span / 2**nbits``; an empty range
    gives ``minval``).

    Args:
      key: a key.
      shape: the shape of the draw.
      minval, maxval: the bounds: ints (``maxval`` may be one past the dtype's largest
        value) or integer arrays that broadcast to ``shape``.
      dtype: a signed or unsigned integer dtype.
    """
    k = _check_key(key, "randint")
    dtype = np.dtype(dtype)
    if kind_of(dtype) not in "iu":
        raise ValueError(f"random.randint: dtype must be an integer dtype, got {dtype}")
    shape = _shape(shape, "randint")
    nbits = dtype.itemsize * 8
    udtype = _UINT[nbits]
    keys = split(k)
    higher, lower = bits(keys[0], shape, udtype), bits(keys[1], shape, udtype)
    info = np.iinfo(dtype)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (minval, maxval)):
        lo = max(int(minval), info.min)
        lo = min(lo, info.max)
        hi = min(int(maxval), info.max + 1)
        span = max(hi - lo, 1)
        if span == 2 ** nbits:
            return ew.convert_element_type(lower, dtype)
        multiplier = (2 ** (nbits // 2) % span) ** 2 % span
        offset = ew.add(ew.mul(ew.remainder(higher, span), multiplier), ew.remainder(lower, span))
        offset = ew.remainder(offset, span)
        return ew.add(ew.convert_element_type(offset, dtype), lo)
    lo = _int_bound(minval, dtype, shape, "minval")
    hi = _int_bound(maxval, dtype, shape, "maxval")
    span = ew.sub(ew.convert_element_type(hi, udtype), ew.convert_element_type(lo, udtype))
    span = ew.select(ew.le(hi, lo), udtype.type(1), span)
    multiplier = ew.remainder(udtype.type(2 ** (nbits // 2)), span)
    multiplier = ew.remainder(ew.mul(multiplier, multiplier), span)
    offset = ew.add(ew.mul(ew.remainder(higher, span), multiplier), ew.remainder(lower, span))
    offset = ew.remainder(offset, span)
    return ew.add(lo, ew.convert_element_type(offset, dtype))


def _int_bound(value, dtype, shape, name):
    if isinstance(value, (int, np.integer)):
        info = np.iinfo(dtype)
        return dtype.type(min(max(int(value), info.min), info.max))
    if kind_of(core.dtype_of(value)) not in "iu":
        raise ValueError(f"random.randint: {name} must be an integer or an integer array, got {core.dtype_of(value)}")
    _bound(value, dtype, shape, "randint", name)
    return ew.convert_element_type(value, dtype)


# ---------------------------------------------------------------------------------------
# Categorical draws and permutations
# ---------------------------------------------------------------------------------------


def gumbel(key, shape=(), dtype=None):
    """Standard Gumbel floats: ``−log(−log(u))`` for ``u`` uniform in ``[tiny, 1)`` (the
    smallest normal float up to 1; JAX's ``mode='low'``).

    Args:
      key: a key.
      shape: the shape of the draw.
      dtype: a float dtype (``cuvmap.config.default_float`` when ``None``).
    """
    k = _check_key(key, "gumbel")
    dtype = _float_dtype(dtype, "gumbel")
    u = uniform(k, _shape(shape, "gumbel"), dtype, float(np.finfo(dtype).tiny), 1.0)
    return ew.neg(ew.log(ew.neg(ew.log(u))))


def _float_operand(x, what, name):
    """``x`` as a float array: Python sequences and non-float arrays in
    ``cuvmap.config.default_float``, float arrays (and tracers) as they are."""
    if isinstance(x, (list, tuple, int, float)) and not isinstance(x, bool):
        return np.asarray(x, dtype=config.default_float)
    dtype = core.dtype_of(x)
    if kind_of(dtype) == "f":
        return x
    if kind_of(dtype) not in "biu":
        raise TypeError(f"random.{what}: {name} must be real numbers, got {dtype}")
    return ew.convert_element_type(x, config.default_float)


def categorical(key, logits, axis=-1, shape=None):
    """Indices drawn with probabilities ``softmax(logits)`` along ``axis``, by the Gumbel-max
    trick (JAX's algorithm): ``argmax(logits + gumbel noise, axis)``.

    Args:
      key: a key.
      logits: unnormalized log-probabilities (``-inf`` for impossible categories); the
        other dims are a batch of distributions.
      axis: the axis of the categories.
      shape: the shape of the draw: the batch shape (``logits.shape`` without ``axis``,
        the default) or any shape that ends with it (leading dims are more independent
        draws from the same distributions).
    Returns:
      int64 indices of ``shape``; no derivative.
    """
    k = _check_key(key, "categorical")
    logits = _float_operand(logits, "categorical", "logits")
    lshape = core.shape_of(logits)
    nd = len(lshape)
    if nd == 0:
        raise ValueError("random.categorical: logits must have at least one dim (the categories)")
    if not -nd <= int(axis) < nd:
        raise ValueError(f"random.categorical: axis {axis} is out of range for logits of shape {lshape}")
    axis = int(axis) % nd
    batch = lshape[:axis] + lshape[axis + 1:]
    shape = batch if shape is None else _shape(shape, "categorical")
    if len(shape) < len(batch) or shape[len(shape) - len(batch):] != batch:
        raise ValueError(f"random.categorical: shape {shape} must end with the batch shape {batch} of logits "
                         f"{lshape} without axis {axis}")
    prefix = shape[:len(shape) - len(batch)]
    noise_shape = prefix + lshape
    noise = gumbel(k, noise_shape, core.dtype_of(logits))
    return lax_reduction.argmax(ew.add(noise, logits), len(prefix) + axis)


def _shuffle(k, x, axis):
    """``x`` shuffled along ``axis``, each slice along the other dims independently: JAX's
    sort-based shuffle. Each round sorts by fresh 32-bit random keys (a stable sort, so a
    tie keeps the previous round's order); ``⌈3 ln(size) / ln(2³² − 1)⌉`` rounds (one for
    up to 1625 elements) make the chance of any tie in the last round's keys negligible,
    and the permutation uniform up to it."""
    size = math.prod(core.shape_of(x))
    rounds = int(np.ceil(3 * np.log(max(1, size)) / np.log(np.iinfo(np.uint32).max)))
    for _ in range(rounds):  # a static number of sorts of the whole array
        keys = split(k)
        k, sub = keys[0], keys[1]
        perm = lax_sorting.argsort(bits(sub, core.shape_of(x), U32), axis)
        x = lax_sorting.permute_along(x, perm, axis)
    return x


def _static_size(x, what):
    """``x`` as a Python int when it is a (0-d) integer, else ``None``."""
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"random.{what}: expected an integer or an array, got a bool")
    if isinstance(x, (int, np.integer)):
        return int(x)
    if core.shape_of(x) != ():
        return None
    if isinstance(x, core.Tracer):
        raise TypeError(f"random.{what}: a 0-d traced value cannot give the size of the population: its value "
                        "is not known to Python; pass a Python int (the size is static)")
    if kind_of(core.dtype_of(x)) not in "iu":
        raise TypeError(f"random.{what}: a 0-d argument must be an integer (a size), got {core.dtype_of(x)}")
    return int(x)


def _axis_of(x, axis, what):
    nd = len(core.shape_of(x))
    if not -nd <= int(axis) < nd:
        raise ValueError(f"random.{what}: axis {axis} is out of range for an array of shape {core.shape_of(x)}")
    return int(axis) % nd


def permutation(key, x, axis=0, independent=False):
    """A random permutation (JAX's algorithm, :func:`_shuffle`).

    Args:
      key: a key.
      x: an int ``n`` (a permutation of ``arange(n)``) or an array, shuffled along ``axis``.
      axis: the axis to shuffle.
      independent: with ``False`` (the default) every slice along ``axis`` moves together
        (the rows of a matrix keep their contents); with ``True`` each 1-d slice along
        ``axis`` is shuffled on its own.
    Returns:
      the shuffled array (int64 for an int ``x``); differentiable in ``x`` (a gather).

    Example: ``random.permutation(key, 5)`` is a reordering of ``[0, 1, 2, 3, 4]``.
    """
    k = _check_key(key, "permutation")
    n = _static_size(x, "permutation")
    if n is not None:
        if n < 0:
            raise ValueError(f"random.permutation: the size must be nonnegative, got {n}")
        return _shuffle(k, backend.xp_of(k).arange(n, dtype=np.int64), 0)
    axis = _axis_of(x, axis, "permutation")
    if independent or len(core.shape_of(x)) == 1:
        return _shuffle(k, x, axis)
    n = core.shape_of(x)[axis]
    order = _shuffle(k, backend.xp_of(k).arange(n, dtype=np.int64), 0)
    return lax_indexing.take(x, order, axis)


def _searchsorted_left(sorted_values, v):
    """For each element of ``v``: the count of ``sorted_values`` (1-d, ascending) below it,
    i.e. ``numpy.searchsorted(sorted_values, v, side='left')``, by a binary search of
    ``⌈log₂(n + 1)⌉`` vectorized steps (gathers and compares of all of ``v`` at once)."""
    n = core.shape_of(sorted_values)[0]
    lo = core.full_like_concrete(v, 0, dtype=np.int64)
    hi = core.full_like_concrete(v, n, dtype=np.int64)
    for _ in range(max(1, math.ceil(math.log2(n + 1)))):
        mid = ew.floor_divide(ew.add(lo, hi), 2)
        probe = lax_indexing.take(sorted_values, ew.min(mid, n - 1), 0)
        right = ew.lt(probe, v)
        lo = ew.select(right, ew.add(mid, 1), lo)
        hi = ew.select(right, hi, mid)
    return lo


def choice(key, a, shape=(), replace=True, p=None, axis=0):
    """Random elements of ``a`` (JAX's algorithms).

    Args:
      key: a key.
      a: an int ``n`` (draw from ``arange(n)``) or an array (draw slices along ``axis``).
      shape: the shape of the draw.
      replace: draw with replacement (independent draws) or without (distinct elements).
      p: the probabilities of the elements (a 1-d array of the population's size, summing
        to 1 up to rounding: it is normalized by its sum), or ``None`` for uniform.
      axis: the axis of ``a`` to draw along.
    Returns:
      ``shape`` indices for an int ``a``, else ``a.shape[:axis] + shape + a.shape[axis+1:]``.

    Uniform with replacement is ``randint``; uniform without replacement the first
    elements of a ``permutation``; weighted with replacement inverts the cumulative sums of
    ``p`` (a vectorized binary search); weighted without replacement takes the top
    ``size`` of ``log p`` plus Gumbel noise (the Gumbel-top-k trick, which draws without
    replacement with probabilities proportional to ``p``).
    """
    k = _check_key(key, "choice")
    shape = _shape(shape, "choice")
    n = _static_size(a, "choice")
    if n is None:
        axis = _axis_of(a, axis, "choice")
        n = core.shape_of(a)[axis]
        out_shape = core.shape_of(a)[:axis] + shape + core.shape_of(a)[axis + 1:]
    else:
        out_shape = shape
    draws = math.prod(shape)
    if draws == 0:
        dtype = np.int64 if isinstance(a, (int, np.integer)) or core.shape_of(a) == () else core.dtype_of(a)
        return backend.xp_of(k).zeros(out_shape, dtype=dtype)
    if n <= 0:
        raise ValueError("random.choice: the population a must not be empty unless no samples are taken")
    if not replace and draws > n:
        raise ValueError(f"random.choice: cannot take a larger sample ({draws}) than the population ({n}) "
                         "with replace=False")
    scalar = isinstance(a, (int, np.integer)) or core.shape_of(a) == ()
    if p is None:
        if replace:
            ind = randint(k, shape, 0, n)
        else:
            ind = lax_shape.reshape(lax_indexing.slice_in_dim(permutation(k, n), 0, draws, 0), shape)
    else:
        p = _float_operand(p, "choice", "p")
        if core.shape_of(p) != (n,):
            raise ValueError(f"random.choice: p must have the shape ({n},) of the population, got {core.shape_of(p)}")
        dtype = core.dtype_of(p)
        if replace:
            p_cuml = lax_cumulative.cumsum(p, 0)
            total = lax_shape.reshape(lax_indexing.slice_in_dim(p_cuml, n - 1, n, 0), ())
            r = ew.mul(total, ew.sub(1.0, uniform(k, shape, dtype)))
            ind = _searchsorted_left(p_cuml, r)
        else:
            g = ew.add(gumbel(k, (n,), dtype), ew.log(p))
            top = lax_indexing.slice_in_dim(lax_sorting.argsort(ew.neg(g), 0), 0, draws, 0)
            ind = lax_shape.reshape(top, shape)
    if scalar:
        return ind
    return lax_shape.reshape(lax_indexing.take(a, ind, axis), out_shape)
