"""Optimizers as pure functions of pytrees (no mutation), optax-like.

An optimizer is a pair :class:`Optimizer` ``(init, update)``:

- ``init(params) -> state``;
- ``update(grads, state, params) -> (new_params, new_state)``.

``params``, ``grads`` and the moment estimates in ``state`` are pytrees of one structure
(any nesting of dicts, lists, tuples; the :class:`~cuvmap.nn.layers.ExampleRank` nodes of
layer params pass through). Nothing is modified in place, so an old ``(params, state)``
stays valid (re-running a step gives the same result), and the update is made of array
arithmetic that works on NumPy and CuPy arrays and on tracers alike (an optimizer step can
be differentiated or vmapped, e.g. to train an ensemble with ``vmap``). ``lr`` is a number
or a schedule ``step -> lr`` of the 0-based step count.

Example::

    opt = adam(1e-3)
    state = opt.init(params)
    for x, y in batches:
        grads = cv.grad(loss)(params, x, y)
        params, state = opt.update(grads, state, params)

The update rules are torch's (``torch.optim.SGD`` with ``dampening=0`` and
``torch.optim.Adam``), written out in each docstring.
"""
import collections

import numpy as np

from cuvmap import core, tree
from cuvmap import numpy as cnp

Optimizer = collections.namedtuple("Optimizer", ["init", "update"])
Optimizer.__doc__ = """``init(params) -> state``, ``update(grads, state, params) -> (new_params, new_state)``."""

SGDState = collections.namedtuple("SGDState", ["step", "momentum"])
SGDState.__doc__ = ("``step``: updates done so far (a 0-d int64 array on the parameters' device); ``momentum``: "
                    "the buffers (a pytree like params, or None).")

AdamState = collections.namedtuple("AdamState", ["step", "m", "v"])
AdamState.__doc__ = ("``step``: updates done so far (a 0-d int64 array on the parameters' device); ``m``, ``v``: "
                     "the first and second moment estimates.")


def _lr_at(lr, step):
    return lr(step) if callable(lr) else lr


def _zeros_like(params):
    return tree.map(cnp.zeros_like, params)


# NOTE [step count as an array]
# The step count is a 0-d int64 array (optax's ``count``), not a Python int: an update
# under ``jit`` takes it as an argument of one fixed aval and returns it as an array, so a
# jitted training loop traces once. Scalars computed from it (Adam's bias corrections
# 1 − b1ᵗ, a schedule's learning rate) are then arrays, which NEP 50 does not let adopt
# the parameters' dtype as Python floats do (float32 / float64 array → float64), so they
# are cast to each parameter's dtype before they meet it: float32 parameters stay float32,
# with the values the Python floats would give (the bias corrections are computed in
# float64 and rounded once, as a Python float is when it meets a float32 array).


def _count(params):
    """A 0-d int64 zero on the parameters' device (NOTE [step count as an array])."""
    leaves = tree.leaves(params)
    return cnp.zeros((), np.int64, like=leaves[0] if leaves else None)


def _next_step(step):
    """``step + 1`` as a 0-d array (``+`` on a NumPy 0-d array gives a NumPy scalar, which
    a jitted update would see as another argument type)."""
    return cnp.add(step, 1)


def _like(scalar, p):
    """``scalar`` ready to meet parameter ``p``: Python numbers as they are, arrays and
    tracers cast to ``p``'s dtype (NOTE [step count as an array])."""
    if type(scalar) in (int, float):  # not np.float64, a float subclass that NEP 50 does not weaken
        return scalar
    return cnp.astype(scalar, core.dtype_of(p))


def sgd(lr, momentum=0.0, nesterov=False, weight_decay=0.0):
    """Stochastic gradient descent with optional momentum (torch's ``SGD``, dampening 0).

    For each parameter ``p`` with gradient ``g``, at step ``t`` (buffer ``b₀ = 0``)::

        g ← g + weight_decay · p
        b_t = momentum · b_{t−1} + g                (when momentum > 0)
        d = g + momentum · b_t  (nesterov)   or   b_t   (or g without momentum)
        p ← p − lr · d

    Args:
      lr: learning rate, or a schedule ``step -> lr``.
      momentum: the heavy-ball coefficient (0 disables the buffers).
      nesterov: Nesterov momentum (needs ``momentum > 0``).
      weight_decay: L2 penalty coefficient added to the gradient.
    """
    if nesterov and momentum <= 0:
        raise ValueError("sgd: nesterov momentum needs momentum > 0")
    if momentum < 0 or weight_decay < 0:
        raise ValueError(f"sgd: momentum {momentum} and weight_decay {weight_decay} must be non-negative")

    def init(params):
        return SGDState(_count(params), _zeros_like(params) if momentum else None)

    def update(grads, state, params):
        rate = _lr_at(lr, state.step)
        if weight_decay:
            grads = tree.map(lambda g, p: g + weight_decay * p, grads, params)
        if not momentum:
            new_params = tree.map(lambda p, g: p - _like(rate, p) * g, params, grads)
            return new_params, SGDState(_next_step(state.step), None)
        buf = tree.map(lambda b, g: momentum * b + g, state.momentum, grads)
        if nesterov:
            direction = tree.map(lambda g, b: g + momentum * b, grads, buf)
        else:
            direction = buf
        new_params = tree.map(lambda p, d: p - _like(rate, p) * d, params, direction)
        return new_params, SGDState(_next_step(state.step), buf)

    return Optimizer(init, update)


def adam(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0):
    """Adam (torch's ``Adam``; ``weight_decay`` is the L2 penalty added to the gradient,
    not AdamW's decoupled decay).

    For each parameter ``p`` with gradient ``g``, at step ``t = 1, 2, ...`` (``m₀ = v₀ = 0``)::

        g ← g + weight_decay · p
        m_t = b1 · m_{t−1} + (1 − b1) · g
        v_t = b2 · v_{t−1} + (1 − b2) · g²
        p ← p − lr · (m_t / (1 − b1ᵗ)) / (sqrt(v_t / (1 − b2ᵗ)) + eps)

    Args:
      lr: learning rate, or a schedule ``step -> lr`` (of the 0-based step count).
      b1, b2: the decay rates of the moment estimates.
      eps: added to the denominator.
      weight_decay: L2 penalty coefficient added to the gradient.
    """
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise ValueError(f"adam: b1 {b1} and b2 {b2} must be in [0, 1)")

    def init(params):
        return AdamState(_count(params), _zeros_like(params), _zeros_like(params))

    def update(grads, state, params):
        rate = _lr_at(lr, state.step)
        t = _next_step(state.step)
        if weight_decay:
            grads = tree.map(lambda g, p: g + weight_decay * p, grads, params)
        m = tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.m, grads)
        v = tree.map(lambda v, g: b2 * v + (1 - b2) * (g * g), state.v, grads)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t

        def step(p, m, v):
            return p - _like(rate, p) * (m / _like(c1, p)) / (cnp.sqrt(v / _like(c2, p)) + eps)

        new_params = tree.map(step, params, m, v)
        return new_params, AdamState(t, m, v)

    return Optimizer(init, update)
