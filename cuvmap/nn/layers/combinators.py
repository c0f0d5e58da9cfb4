"""stax's combinators: :func:`Serial`, :func:`parallel` (also ``Parallel``),
:func:`FanOut`, :data:`FanInSum`, :func:`FanInConcat`, :data:`Identity`, and
:func:`Residual` built from them (NOTE [keys through combinators]).
"""
import functools
import inspect

from cuvmap import numpy as cnp
from cuvmap import random, tree
from cuvmap.core import ShapeError
from cuvmap.lax import elementwise as ew
from cuvmap.nn.layers.layer import ExampleRank, Layer, _rng

# ---------------------------------------------------------------------------------------
# Combinators
# ---------------------------------------------------------------------------------------

# NOTE [keys through combinators]
# As in stax, a combinator given ``rng=key`` splits it, one key per layer
# (``random.split(key, len(layers))``), and passes its other keyword arguments to every
# layer; ``rng=None`` reaches every layer as None. A layer's ``apply`` gets only the
# keyword arguments it accepts (all of them with ``**kwargs``, else those it names), so a
# hand-written ``apply(params, x)`` pair combines with Dropout. Splitting is a pure
# function of the key, so under ``vmap`` with one key per example each example's layers
# get their own keys — the ones a loop over examples would give them.


def _keyword_filter(fn):
    """The keyword names ``fn`` accepts, or None when it accepts any."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters
                     if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))


def _caller(layer):
    accepted = _keyword_filter(layer.apply)

    def call(params, x, rng, kwargs):
        kwargs = dict(kwargs, rng=rng)
        if accepted is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in accepted}
        return layer.apply(params, x, **kwargs)

    return call


def _split_keys(rng, n):
    if rng is None:
        return [None] * n
    keys = random.split(rng, n)
    return [keys[i] for i in range(n)]


def Serial(*layers):
    """Layers in sequence: ``init`` threads the shapes through and returns the list of the
    layers' params; ``apply(params, x, rng=None, **kwargs)`` applies each layer to the
    previous output (NOTE [keys through combinators])."""
    layers = tuple(Layer(*layer) for layer in layers)
    calls = [_caller(layer) for layer in layers]

    def init(rng, input_shape, dtype=None):
        rng = _rng(rng)
        params = []
        shape = _shape_tree(input_shape)
        for layer in layers:
            shape, p = layer.init(rng, shape, dtype=dtype)
            params.append(p)
        return shape, params

    def apply(params, x, *, rng=None, **kwargs):
        if len(params) != len(layers):
            raise ValueError(f"Serial: {len(params)} params for {len(layers)} layers")
        for call, p, key in zip(calls, params, _split_keys(rng, len(layers))):
            x = call(p, x, key, kwargs)
        return x

    return Layer(init, apply)


def parallel(*layers):
    """Layers side by side (stax's ``parallel``): the input is a sequence with one entry
    per layer, and so are the output, the output shapes and the params."""
    layers = tuple(Layer(*layer) for layer in layers)
    calls = [_caller(layer) for layer in layers]

    def init(rng, input_shape, dtype=None):
        if not isinstance(input_shape, (list, tuple)) or len(input_shape) != len(layers) or not all(
                isinstance(s, (list, tuple)) for s in input_shape):
            raise ShapeError(f"parallel: input_shape must be a sequence of {len(layers)} shapes (one per layer), "
                             f"got {input_shape}; FanOut({len(layers)}) makes one")
        rng = _rng(rng)
        shapes, params = [], []
        for layer, shape in zip(layers, input_shape):
            shape, p = layer.init(rng, shape, dtype=dtype)
            shapes.append(shape)
            params.append(p)
        return shapes, params

    def apply(params, xs, *, rng=None, **kwargs):
        if not isinstance(xs, (list, tuple)) or len(xs) != len(layers):
            raise ShapeError(f"parallel: expected a sequence of {len(layers)} inputs (one per layer), got "
                             f"{tree.describe(xs)}")
        if len(params) != len(layers):
            raise ValueError(f"parallel: {len(params)} params for {len(layers)} layers")
        keys = _split_keys(rng, len(layers))
        return [call(p, x, key, kwargs) for call, p, x, key in zip(calls, params, xs, keys)]

    return Layer(init, apply)


Parallel = parallel


def _shape_tree(shape):
    """A shape, or a list of shapes (the input of a fan-in), as tuples."""
    if isinstance(shape, (list, tuple)) and shape and all(isinstance(s, (list, tuple)) for s in shape):
        return [tuple(s) for s in shape]
    return tuple(shape)


def _identity_init(rng, input_shape, dtype=None):
    return _shape_tree(input_shape), ()


def _identity_apply(params, x, **kwargs):
    return x


# Returns its input (stax's ``Identity``): the skip branch of a residual block.
Identity = Layer(_identity_init, _identity_apply)


def FanOut(num):
    """``num`` copies of the input (a list), for :func:`parallel` branches."""
    num = int(num)

    def init(rng, input_shape, dtype=None):
        return [tuple(input_shape)] * num, ()

    def apply(params, x, **kwargs):
        return [x] * num

    return Layer(init, apply)


def _fan_in_shapes(input_shape, what):
    if not isinstance(input_shape, (list, tuple)) or not input_shape or not all(
            isinstance(s, (list, tuple)) for s in input_shape):
        raise ShapeError(f"{what}: input_shape must be a list of shapes (the outputs of parallel branches), "
                         f"got {input_shape}")
    return [tuple(s) for s in input_shape]


def _fan_in_inputs(xs, what):
    if not isinstance(xs, (list, tuple)) or not xs:
        raise ShapeError(f"{what}: expected a list of inputs (the outputs of parallel branches), got "
                         f"{tree.describe(xs)}")
    return xs


def _FanInSum():
    def init(rng, input_shape, dtype=None):
        shapes = _fan_in_shapes(input_shape, "FanInSum")
        if any(s != shapes[0] for s in shapes):
            raise ShapeError(f"FanInSum: the inputs' shapes differ: {', '.join(map(str, shapes))}")
        return shapes[0], ()

    def apply(params, xs, **kwargs):
        xs = _fan_in_inputs(xs, "FanInSum")
        return functools.reduce(ew.add, xs)

    return Layer(init, apply)


# Sums its list of inputs (stax's ``FanInSum``), which must share one shape.
FanInSum = _FanInSum()


def FanInConcat(axis=-1):
    """Concatenates its list of inputs along ``axis`` (stax's ``FanInConcat``). ``axis``
    counts in the batched layout of ``init``'s shapes (``axis=1``: the channels of
    ``(N, C, H, W)``), and ``apply`` maps it onto one example as well (the example rank
    is kept in the params, NOTE [single examples in apply])."""
    axis = int(axis)

    def init(rng, input_shape, dtype=None):
        shapes = _fan_in_shapes(input_shape, "FanInConcat")
        rank = len(shapes[0])
        if not -rank <= axis < rank or axis % rank == 0:
            raise ShapeError(f"FanInConcat: axis {axis} must name a dim of the shapes {shapes} other than the batch "
                             "dim 0")
        ax = axis % rank
        others = [s[:ax] + s[ax + 1:] for s in shapes]
        if any(len(s) != rank or o != others[0] for s, o in zip(shapes, others)):
            raise ShapeError(f"FanInConcat: the inputs' shapes {shapes} must agree except along axis {axis}")
        out = shapes[0][:ax] + (sum(s[ax] for s in shapes),) + shapes[0][ax + 1:]
        return out, ExampleRank(rank - 1)

    def apply(params, xs, **kwargs):
        xs = _fan_in_inputs(xs, "FanInConcat")
        batched = params.is_batched(xs[0], "FanInConcat")
        ax = axis % (params.rank + 1)
        return cnp.concatenate(list(xs), axis=ax if batched else ax - 1)

    return Layer(init, apply)


def Residual(*layers):
    """A residual block ``x + f(x)`` with ``f = Serial(*layers)``: stax's
    ``Serial(FanOut(2), parallel(Serial(*layers), Identity), FanInSum)``, whose params it
    has. The layers must keep the shape of their input."""
    branch = Serial(*layers)
    block = Serial(FanOut(2), parallel(branch, Identity), FanInSum)

    def init(rng, input_shape, dtype=None):
        try:
            return block.init(rng, input_shape, dtype=dtype)
        except ShapeError as err:
            if not str(err).startswith("FanInSum"):
                raise
            out_shape, _ = branch.init(_rng(0), input_shape, dtype=dtype)
            raise ShapeError(
                f"Residual: its layers map the shape {tuple(input_shape)} to {tuple(out_shape)}; a residual block "
                "adds its input to their output, so they must keep the shape (for a change of shape, project the "
                "skip branch: Serial(FanOut(2), parallel(Serial(*layers), Conv(c, 1, stride=s)), FanInSum))") from None

    return Layer(init, block.apply)
