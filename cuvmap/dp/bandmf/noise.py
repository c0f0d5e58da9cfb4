r"""The correlated noise of banded matrix factorisation, streamed: ``w = C'⁻¹ z`` one step
at a time, on the parameters' device, as a pure function of a state pytree (so it runs
under ``jit``).

``C' = C D⁻¹`` (:mod:`~cuvmap.dp.bandmf.strategy`) gives ``w_t = d_t u_t`` with
``u = C⁻¹ z``, and ``C`` lower-triangular, ``b``-banded and Toeplitz makes ``u`` the
recurrence

    u_t = (z_t − Σ_{j=1}^{b−1} c_j u_{t−j}) / c_0,        w_t = d_t · u_t,

(``u_{<0} = 0``): an autoregressive process of order ``b − 1``, whose state is the last
``b − 1`` values ``u_{t−1} … u_{t−b+1}``, one buffer the size of the parameters each
(:meth:`BandedNoise.update`; the leaves' buffers stacked on a leading axis, newest first).
Each leaf is its own coordinate: the same recurrence, elementwise.

``regenerate=True`` keeps no buffers (O(1) memory beyond the output): the draws come from
a counter-based key (``z_s`` of leaf ``i`` is ``random.normal(fold_in(fold_in(key, s), i))``,
the same numbers :meth:`BandedNoise.draw` uses), and step ``t`` recomputes
``u_t = Σ_{s=0}^{t} v_{t−s} z_s`` with ``v`` the Toeplitz coefficients of ``C⁻¹``
(:func:`~cuvmap.dp.bandmf.strategy.inverse_coefficients`). ``C⁻¹`` is dense (the inverse
of a banded matrix is not banded): ``u_t`` depends on every past draw, so step ``t`` draws
``t + 1`` times, ``T²/2`` over a run of ``T`` steps. No exact scheme draws ``b`` times per
step without the buffers; the option is for models whose ``b − 1`` copies do not fit and
runs short enough to pay the draws (NOTE [regenerating banded noise]).

Under data parallelism the noise must enter the released sum once: pass ``w`` as
``noise=`` to :func:`cuvmap.dp.private_gradient` (or ``Plan.private_gradient``), which
keeps member 0's ``w`` alone (NOTE [noise once over a data-parallel axis] in
``cuvmap/dp/noise.py``); member 0's state then carries the one correlated sequence, and
the others' states are never used (drawing from one shared key everywhere gives every
member that same sequence).
"""
import numpy as np

from cuvmap import backend, core, lax, random, tree
from cuvmap import numpy as cnp
from cuvmap.dp.bandmf.strategy import BandedStrategy, inverse_coefficients
from cuvmap.dp.noise import standard_normal_like
from cuvmap.core.bfloat16 import kind_of


# NOTE [regenerating banded noise]
# The noise of BandMF is w = D C⁻¹ z with C b-banded; C⁻¹ is a full lower-triangular
# Toeplitz matrix (the power series of 1/c(x)), so w_t = d_t Σ_{s≤t} v_{t−s} z_s reads
# every past z. Either the process's state is kept (the b − 1 last u's: b − 1 buffers the
# size of the parameters, one update per step: the default) or the past z are drawn again
# from their keys at every step (t + 1 draws at step t, no buffer). Truncating the sum to
# the last K terms (|v_k| decays geometrically when c(x) has no root in the unit disc)
# would draw K times but release other noise: C̃ = (truncated C⁻¹)⁻¹ is not banded, and
# the amplification of banded strategies (disjoint columns per participation) no longer
# holds exactly. So regeneration is exact and pays the draws; the banded *inverse*
# strategies (BandInvMF, arXiv:2505.12128), whose noise reads b draws, are another mechanism
# with another accounting.


def _leaf_key(key, step, index):
    return random.fold_in(random.fold_in(key, step), index)


def standard_normal_from_key(like, key, step):
    """Standard normal draws shaped like each leaf of ``like`` (shapes, dtypes, devices)
    from the counter-based ``key`` for ``step``: leaf ``i`` gets
    ``random.normal(fold_in(fold_in(key, step), i), shape, dtype)``. ``step`` may be traced
    (under ``jit``); a concrete host key is put on each leaf's device."""
    leaves, treedef = tree.flatten(like)
    return tree.unflatten(treedef, _normal_leaves([(tuple(core.shape_of(x)), core.dtype_of(x), x) for x in leaves],
                                                  key, step, "standard_normal_from_key"))


def _normal_leaves(templates, key, step, where):
    """One draw per ``(shape, dtype, array on the device)`` template, leaf ``i`` from
    ``fold_in(fold_in(key, step), i)``."""
    out = []
    for i, (shape, dtype, ref) in enumerate(templates):
        if kind_of(dtype) != "f":
            raise ValueError(f"{where}: a leaf has dtype {dtype}; noise needs floating-point leaves")
        out.append(random.normal(_leaf_key(_on_device_of(key, ref), step, i), shape, dtype))
    return out


def _on_device_of(key, leaf):
    if not hasattr(key, "_concrete_value") and backend.backend_name(key) != backend.backend_name(leaf):
        return backend.device_put(key, backend.backend_name(leaf))
    return key


class BandedNoise:
    """``w_t = (C'⁻¹ z)_t`` step by step, for a :class:`BandedStrategy` (the recurrence of
    the module's docstring), as pure functions of a state pytree (jax_privacy:
    ``toeplitz.inverse_as_streaming_matrix(coef, column_normalize_for_n=n)``, an optax-style
    ``init``/``update`` pair).

    Args:
      strategy: the :class:`~cuvmap.dp.bandmf.strategy.BandedStrategy` ``C'``.
      regenerate: keep no buffers and draw the past again from the key at every step
        (``t + 1`` draws at step ``t``; NOTE [regenerating banded noise]); only
        :meth:`draw` is then available.

    Example::

        noise = BandedNoise(BandedStrategy(sqrt_coefficients(4), steps))
        state = noise.init(params)                         # 3 zero buffers per leaf
        @cuvmap.jit
        def train_step(params, state, key, t, ...):
            w, state = noise.draw(state, key, t)           # w_t, shaped like params
            g = dp.private_gradient(clipped, noise_multiplier=σ, noise=w, expected_batch_size=n)
            ...
    """

    def __init__(self, strategy, *, regenerate=False):
        if not isinstance(strategy, BandedStrategy):
            raise ValueError(f"BandedNoise: strategy must be a BandedStrategy, got {type(strategy).__name__}")
        self.strategy = strategy
        self.regenerate = bool(regenerate)
        c = strategy.coefficients
        self._head, self._tail = float(c[0]), np.asarray(c[1:])
        self._scales = np.asarray(strategy.column_norms, dtype=np.float64)
        self._inverse = inverse_coefficients(c, strategy.steps) if self.regenerate else None

    def __repr__(self):
        how = "regenerated from keys" if self.regenerate else f"{self.strategy.bands - 1} buffers"
        return f"BandedNoise({self.strategy!r}, {how})"

    # -- the state ---------------------------------------------------------------------------

    def init(self, like):
        """The state before step 0: for each floating leaf of ``like`` (the parameters)
        ``b − 1`` zero buffers stacked as ``(b − 1, *leaf.shape)`` in its dtype and on its
        device (``u_{−1} = … = 0``); with ``regenerate``, ``()``."""
        if self.regenerate:
            return ()

        def buffers(leaf):
            dtype = core.dtype_of(leaf)
            if kind_of(dtype) != "f":
                raise ValueError(f"BandedNoise.init: a leaf has dtype {dtype}; noise needs floating-point leaves")
            return cnp.zeros((self.strategy.bands - 1,) + tuple(core.shape_of(leaf)), dtype, like=leaf)

        return tree.map(buffers, like)

    # -- one step ----------------------------------------------------------------------------

    def update(self, state, noise, step):
        """``(w_t, state')`` from the standard normal draws ``noise = z_t`` (a pytree shaped
        like the parameters, e.g. ``dp.standard_normal_like(params, rng)``) and the state
        after step ``t − 1``: ``u_t = (z_t − Σ_j c_j u_{t−j}) / c_0``, ``w_t = d_t u_t``;
        ``step`` is ``t`` (an int, or a traced 0-d integer under ``jit``)."""
        if self.regenerate:
            raise ValueError("BandedNoise.update: a regenerating noise recomputes the past from its key: use "
                             "draw(state, key, step)")
        self._check_step(step, "update")
        scale = self._scale(step)
        if tree.structure(noise) != tree.structure(state):
            raise ValueError(f"BandedNoise.update: noise has the pytree structure {tree.structure(noise)}, but the "
                             f"state was made for {tree.structure(state)} (BandedNoise.init(params))")
        z_leaves, treedef = tree.flatten(noise)
        pairs = [self._update_leaf(z, buf, scale) for z, buf in zip(z_leaves, tree.leaves(state))]
        return tree.unflatten(treedef, [p[0] for p in pairs]), tree.unflatten(treedef, [p[1] for p in pairs])

    def _update_leaf(self, z, buf, scale):
        dtype = core.dtype_of(z)
        if tuple(core.shape_of(buf))[1:] != tuple(core.shape_of(z)) or core.dtype_of(buf) != dtype:
            raise ValueError(f"BandedNoise.update: a noise leaf is {dtype}{list(core.shape_of(z))}, but its buffers "
                             f"are {core.dtype_of(buf)}{list(core.shape_of(buf))} (b − 1 = {self.strategy.bands - 1} "
                             "stacked, in the parameters' dtype)")
        head = dtype.type(self._head)
        if self.strategy.bands == 1:
            u = cnp.divide(z, head)
            return self._scaled(u, scale), buf
        tail = self._tail.astype(dtype)
        past = cnp.tensordot(tail, buf, axes=1)                   # Σ_j c_j u_{t−j}
        u = cnp.divide(cnp.subtract(z, past), head)
        new_buf = cnp.concatenate([cnp.reshape(u, (1,) + tuple(core.shape_of(u))), buf[:-1]], axis=0)
        return self._scaled(u, scale), new_buf

    def draw(self, state, key, step):
        """``(w_t, state')`` with ``z_t`` drawn from the counter-based ``key`` (a
        ``cuvmap.random`` key: :func:`standard_normal_from_key`), so that under ``jit``
        the step is a pure function of ``(state, key, t)``. (A regenerating noise has no
        state to take the shapes from: :meth:`draw_like`.)"""
        if self.regenerate:
            raise ValueError("BandedNoise.draw: a regenerating noise has no state to take the shapes from: use "
                             "draw_like(like, key, step)")
        buffers, treedef = tree.flatten(state)
        templates = [(tuple(core.shape_of(buf))[1:], core.dtype_of(buf), buf) for buf in buffers]
        z = tree.unflatten(treedef, _normal_leaves(templates, key, step, "BandedNoise.draw"))
        return self.update(state, z, step)

    def draw_like(self, like, key, step):
        """With ``regenerate``: ``w_t`` shaped like ``like`` (the parameters), recomputed
        from the key: ``u_t = Σ_{s=0}^{t} v_{t−s} z_s`` (``t + 1`` draws). Without it, the
        same as running :meth:`draw` from :meth:`init` for ``t + 1`` steps (for checks)."""
        self._check_step(step, "draw_like")
        if not self.regenerate:
            if not isinstance(step, (int, np.integer)):
                raise ValueError("BandedNoise.draw_like: without regenerate it replays the steps: step must be an int")
            state = self.init(like)
            for s in range(int(step) + 1):
                w, state = self.draw(state, key, s)
            return w
        scale = self._scale(step)
        v = self._inverse
        leaves, treedef = tree.flatten(like)
        templates = [(tuple(core.shape_of(leaf)), core.dtype_of(leaf), leaf) for leaf in leaves]

        def body(s, acc):
            # acc + v_{t−s} z_s for every leaf, z_s drawn again from its counter
            zs = _normal_leaves(templates, key, s, "BandedNoise.draw_like")
            coef = cnp.take(v, cnp.subtract(step, s))
            return tuple(cnp.add(a, cnp.multiply(cnp.astype(coef, core.dtype_of(z)), z)) for a, z in zip(acc, zs))

        init = tuple(cnp.zeros(tuple(core.shape_of(leaf)), core.dtype_of(leaf), like=leaf) for leaf in leaves)
        upper = int(step) + 1 if isinstance(step, (int, np.integer)) else cnp.add(step, 1)
        acc = lax.fori_loop(0, upper, body, init)
        return tree.unflatten(treedef, [self._scaled(a, scale) for a in acc])

    # -- the stateful generator ------------------------------------------------------------

    def stream(self, like, *, key=None, rng=None):
        """A Python generator of ``w_0, w_1, …, w_{n−1}`` shaped like ``like``, holding
        its state (eager loops): from ``key`` (:meth:`draw`, or :meth:`draw_like` with
        ``regenerate``) or from a NumPy/CuPy generator ``rng``
        (``dp.standard_normal_like``, the draws of ``Plan.noise``)."""
        if (key is None) == (rng is None):
            raise ValueError("BandedNoise.stream: pass either key (counter-based draws) or rng (a NumPy/CuPy "
                             "generator)")
        if self.regenerate and key is None:
            raise ValueError("BandedNoise.stream: a regenerating noise needs a key")
        state = self.init(like)
        for t in range(self.strategy.steps):
            if self.regenerate:
                yield self.draw_like(like, key, t)
                continue
            if key is not None:
                w, state = self.draw(state, key, t)
            else:
                w, state = self.update(state, standard_normal_like(like, rng), t)
            yield w

    # -- helpers -----------------------------------------------------------------------------

    def _check_step(self, step, what):
        if isinstance(step, (bool, np.bool_)):
            raise ValueError(f"BandedNoise.{what}: step must be an integer, got {step!r}")
        if isinstance(step, (int, np.integer)):
            if not 0 <= step < self.strategy.steps:
                raise ValueError(f"BandedNoise.{what}: step {step} is outside the strategy's {self.strategy.steps} "
                                 "steps")
            return
        if kind_of(core.dtype_of(step)) not in "iu" or tuple(core.shape_of(step)) != ():
            raise ValueError(f"BandedNoise.{what}: step must be a 0-d integer, got "
                             f"{core.dtype_of(step)}{list(core.shape_of(step))}")

    def _scale(self, step):
        """``d_t``: a float for a concrete step, a gather from the table for a traced one
        (``None`` when every ``d_t`` is 1: nothing to multiply)."""
        if np.all(self._scales == 1.0):
            return None
        if isinstance(step, (int, np.integer)):
            return float(self._scales[int(step)])
        return cnp.take(self._scales, step)

    @staticmethod
    def _scaled(u, scale):
        if scale is None:
            return u
        dtype = core.dtype_of(u)
        if isinstance(scale, float):
            return u if scale == 1.0 else cnp.multiply(u, dtype.type(scale))
        return cnp.multiply(u, cnp.astype(scale, dtype))
