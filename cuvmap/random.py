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
draws of ``uniform``, ``bernoulli`` and ``randint`` (exact float operations on those
bits); ``normal`` applies ``log`` and ``cos``, whose last bit may differ between NumPy's
and CUDA's math libraries.

JAX compatibility: ``key``, ``split``, ``fold_in``, ``bits``, ``uniform``, ``bernoulli``
and ``randint`` follow JAX's algorithms with ``jax_threefry_partitionable=True`` (JAX's
default since 0.5), with JAX's 64-bit seeds (as under ``jax_enable_x64``), so they are
meant to give JAX's numbers for the same key; the tests check the hash against the
Random123 vectors and ``split`` against JAX's documented splits of key 0 (JAX itself is
not a dependency). ``normal`` uses the Box–Muller transform of two uniform draws (JAX
inverts ``erf``): the same distribution, not JAX's stream.

Derivatives: draws take no float inputs except the bounds of ``uniform`` (differentiable,
as in JAX) and the probability of ``bernoulli`` (a comparison: zero derivative); keys and
bits are integers. Nothing here needs a rule of its own.
"""
import math

import numpy as np

from cuvmap import backend, config, core
from cuvmap.lax import bitwise, elementwise as ew
from cuvmap.lax import shape as lax_shape
from cuvmap.lax.prng import threefry2x32  # noqa: F401  (re-exported)

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
    if dtype.kind not in "iu" or core.shape_of(seed) != ():
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
        if core.dtype_of(data).kind not in "iu" or core.shape_of(data) != ():
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
    if dtype.kind != "f" or dtype.itemsize not in (2, 4, 8):
        raise ValueError(f"random.{what}: dtype must be float16, float32 or float64, got {dtype}")
    return dtype


def _bound(value, dtype, shape, what, name):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
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
    return ew.max(lo, ew.add(ew.mul(floats, ew.sub(hi, lo)), lo))


def normal(key, shape=(), dtype=None):
    """Standard normal floats, by the Box–Muller transform of two uniform draws from the
    two keys of ``split(key)``: ``sqrt(-2 log(1 - u1)) · cos(2π u2)``.

    Args:
      key: a key.
      shape: the shape of the draw.
      dtype: a float dtype (``cuvmap.config.default_float`` when ``None``).
    """
    k = _check_key(key, "normal")
    dtype = _float_dtype(dtype, "normal")
    shape = _shape(shape, "normal")
    keys = split(k)
    u1 = uniform(keys[0], shape, dtype)
    u2 = uniform(keys[1], shape, dtype)
    radius = ew.sqrt(ew.mul(ew.log1p(ew.neg(u1)), -2.0))
    return ew.mul(radius, ew.cos(ew.mul(u2, 2 * math.pi)))


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
        if dtype.kind != "f":
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
    if dtype.kind not in "iu":
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
    if core.dtype_of(value).kind not in "iu":
        raise ValueError(f"random.randint: {name} must be an integer or an integer array, got {core.dtype_of(value)}")
    _bound(value, dtype, shape, "randint", name)
    return ew.convert_element_type(value, dtype)
