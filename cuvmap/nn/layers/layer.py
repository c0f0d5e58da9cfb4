"""What a stax-style layer is: the pair :class:`Layer` ``(init, apply)``, the example rank
a layer keeps in its params (:class:`ExampleRank`, NOTE [single examples in apply] in
``cuvmap/nn/layers/__init__.py``), and what the layers' ``init`` share: generators from
seeds and keys, torch's default initialisation, the dtype checks (NOTE [one dtype for
data and parameters]).
"""
import collections

import numpy as np

from cuvmap import backend, config, core, tree
from cuvmap.core import ShapeError
from cuvmap.core.bfloat16 import kind_of

Layer = collections.namedtuple("Layer", ["init", "apply"])
Layer.__doc__ = """A layer: ``init(rng, input_shape, dtype=None) -> (output_shape, params)`` and
``apply(params, x, **kwargs) -> y``. A plain pair ``(init, apply)`` works wherever a Layer
does (the combinators pass it only the keyword arguments its ``apply`` accepts)."""


class ExampleRank:
    """The rank of one example's input to a layer, kept in its params (NOTE [single
    examples in apply]). A pytree node with no leaves: transforms and optimizers pass it
    through, and it compares equal by value so that ``params`` and ``grads`` share one
    tree structure."""

    __slots__ = ("rank",)

    def __init__(self, rank):
        self.rank = int(rank)

    def __eq__(self, other):
        return isinstance(other, ExampleRank) and other.rank == self.rank

    def __hash__(self):
        return hash((ExampleRank, self.rank))

    def __repr__(self):
        return f"ExampleRank({self.rank})"

    def is_batched(self, x, what):
        """True for a batch (rank + 1), False for one example (rank); raises otherwise."""
        nd = len(core.shape_of(x))
        if nd == self.rank:
            return False
        if nd == self.rank + 1:
            return True
        raise ShapeError(f"{what}: input of shape {core.shape_of(x)} must have rank {self.rank} (one example) "
                         f"or {self.rank + 1} (a batch), as at init")


tree.register_pytree_node(ExampleRank, lambda e: ((), e.rank), lambda rank, _: ExampleRank(rank))


# ---------------------------------------------------------------------------------------
# Helpers: random numbers and arrays on the rng's device
# ---------------------------------------------------------------------------------------


def _rng(rng):
    """A generator from an int seed, a :mod:`cuvmap.random` key (as stax's ``init`` takes:
    its two words seed a NumPy generator, or a CuPy one for a key on the GPU) or a
    generator itself."""
    if isinstance(rng, (int, np.integer)):
        return np.random.default_rng(int(rng))
    if getattr(rng, "shape", None) == (2,) and getattr(rng, "dtype", None) == np.uint32:
        words = backend.device_put(rng, "cpu").tolist()
        seed = (int(words[0]) << 32) | int(words[1])
        if backend.is_cupy_array(rng):
            return backend.xp_for("gpu").random.default_rng(seed)
        return np.random.default_rng(seed)
    return rng


def _xp_of_rng(rng):
    if type(rng).__module__.startswith("cupy"):
        return backend.cupy_module() or backend.xp_for("gpu")
    return np


def _uniform(rng, shape, bound, dtype):
    """``U(−bound, bound)`` of ``shape`` and ``dtype``, drawn by ``rng`` on its device."""
    u = rng.random(tuple(shape), dtype=np.dtype(dtype))
    return (u * (2 * bound) - bound).astype(dtype, copy=False)


def _check_dtype(dtype):
    dtype = config.default_float if dtype is None else np.dtype(dtype)
    if kind_of(dtype) != "f":
        raise ValueError(f"parameters must have a floating dtype, got {dtype}")
    return dtype


# NOTE [one dtype for data and parameters]
# ``float32 data @ float64 weights`` would silently compute in float64 (NumPy's promotion)
# and return float64, and a convolution would fail deep inside with "operands must share
# one dtype". Both are usually one mistake — parameters initialised in one dtype and data
# loaded in another — so the layers with weights compare the two dtypes (a cheap check of
# avals, under every transform) and raise a ShapeError that names both and the two fixes.
def _check_input_dtype(x, param, what):
    x_dtype, p_dtype = core.dtype_of(x), core.dtype_of(param)
    if x_dtype == p_dtype:
        return
    fix = f"cast the input (x.astype(np.{p_dtype.name}))"
    if kind_of(x_dtype) == "f":
        fix += (f", or create the parameters in {x_dtype.name} (init(rng, input_shape, dtype=np.{x_dtype.name}), "
                f"or cuvmap.config.update('default_float', '{x_dtype.name}') before init)")
    raise ShapeError(f"{what}: the input has dtype {x_dtype} but the parameters have dtype {p_dtype}; {fix}")


def _kaiming_uniform(rng, weight_shape, fan_in, bias_shape, dtype):
    """torch's default init: weight and bias from ``U(−1/√fan_in, 1/√fan_in)``."""
    bound = 1.0 / float(np.sqrt(fan_in))
    params = {"weight": _uniform(rng, weight_shape, bound, dtype)}
    if bias_shape is not None:
        params["bias"] = _uniform(rng, bias_shape, bound, dtype)
    return params


def _spatial_input(input_shape, what):
    input_shape = tuple(input_shape)
    nd = len(input_shape) - 2
    if nd not in (1, 2, 3):
        raise ShapeError(f"{what}: input_shape {input_shape} must be (N, C, S...) with 1-3 spatial dims")
    return input_shape, nd
