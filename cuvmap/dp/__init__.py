r"""Differentially private SGD on top of per-example gradients: clipping, noise, accounting.

The package's modules: :mod:`~cuvmap.dp.clipping` (per-example norms, clipping, the clipped
sum by example, group or user, as a ``ClippedGradient`` that carries its sensitivity),
:mod:`~cuvmap.dp.ghost` (``clipped_grad``: the clipped sum and the norms from the loss, by
ghost clipping and book-keeping, its layer rules in one table), :mod:`~cuvmap.dp.padding`
(Poisson batches padded to a few sizes, for ``jit``), :mod:`~cuvmap.dp.sampling` (the
Poisson samplers of examples and of users), :mod:`~cuvmap.dp.noise` (the Gaussian
mechanism calibrated to the sensitivity, once over a data-parallel axis, the private
gradient), :mod:`~cuvmap.dp.accounting` (the RDP accountant), :mod:`~cuvmap.dp.plan`
(``Plan``: all of them built once from ``(N, q, σ, C, steps)``) and :mod:`~cuvmap.dp.bandmf`
(banded matrix factorisation: noise correlated across steps, cyclic Poisson sampling and
their accountant, ``Plan(..., mechanism="bandmf")``; its names are ``cuvmap.dp.bandmf.<name>``);
every other name is available as ``cuvmap.dp.<name>``.

``vmap(grad(loss), in_axes=(None, 0, 0))(params, xs, ys)`` gives a pytree shaped like
``params`` whose leaves carry a leading batch dimension ``B``: one gradient per example.
DP-SGD (Abadi et al. 2016) turns those into a private update in three steps:

1. **Clip** each example's gradient ``g_b`` (the whole parameter pytree, flattened) to L2
   norm at most ``C``::

       ḡ_b = g_b · min(1, C / (‖g_b‖₂ + tiny))

   so one example changes the sum ``Σ_b ḡ_b`` by at most ``C`` (its L2 sensitivity is C
   under add/remove-one adjacency).
2. **Noise**: ``G̃ = Σ_b ḡ_b + N(0, σ² C² I)``, with ``σ`` the *noise multiplier*.
3. **Normalise**: divide by the batch size (under Poisson sampling: by the *expected* batch
   size ``q·N``, see :func:`private_gradient`).

The **accountant** bounds the privacy loss of ``T`` such steps, each on a batch drawn by
Poisson sampling with rate ``q`` (every example in independently with probability ``q``):

* one step is the *sampled Gaussian mechanism* (SGM); its Rényi DP at order ``α > 1``
  (Mironov, Talwar, Zhang 2019) is ``ε_α = log(A_α) / (α − 1)`` with
  ``A_α = E_{z∼μ₀}[(μ(z)/μ₀(z))^α]``, ``μ₀ = N(0, σ²)``, ``μ = (1−q)·μ₀ + q·N(1, σ²)``;
  see :func:`rdp_sampled_gaussian` for the integer and fractional formulas;
* RDP composes additively (Mironov 2017, Prop. 1): ``T`` steps give ``T·ε_α``;
* RDP converts to ``(ε, δ)``-DP by minimising over the orders, see :func:`rdp_to_epsilon`.

References:

* M. Abadi, A. Chu, I. Goodfellow, H. B. McMahan, I. Mironov, K. Talwar, L. Zhang.
  *Deep Learning with Differential Privacy.* CCS 2016, arXiv:1607.00133.
* I. Mironov. *Rényi Differential Privacy.* CSF 2017, arXiv:1702.07476.
* I. Mironov, K. Talwar, L. Zhang. *Rényi Differential Privacy of the Sampled Gaussian
  Mechanism.* arXiv:1908.10530, 2019 (Sec. 3.3: the series for fractional orders).
* B. Balle, G. Barthe, M. Gaboardi, J. Hsu, T. Sato. *Hypothesis Testing Interpretations
  and Rényi Differential Privacy.* AISTATS 2020, arXiv:1905.09982 (Theorem 21).
* C. Canonne, G. Kamath, T. Steinke. *The Discrete Gaussian for Differential Privacy.*
  NeurIPS 2020, arXiv:2004.00010 (Proposition 12).

Example::

    import numpy as np
    import cuvmap as cv
    from cuvmap import dp

    per_ex = cv.vmap(cv.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
    g = dp.private_gradient(per_ex, max_norm=1.0, noise_multiplier=1.1,
                            rng=np.random.default_rng(), expected_batch_size=256)
    params = cv.tree.map(lambda p, d: p - lr * d, params, g)

    acct = dp.RDPAccountant()
    acct.step(noise_multiplier=1.1, sample_rate=256 / 60000, num_steps=steps)
    eps = acct.get_epsilon(delta=1e-5)


    # :class:`PLDAccountant` has the same interface and is tight (privacy loss distributions
    # composed by FFT on a pessimistic grid, :mod:`~cuvmap.dp.pld`); :func:`calibrate_noise`
    # gives the smallest noise multiplier meeting a target ε by either accountant.

    # or all of it from one plan (NOTE [one plan] in cuvmap/dp/plan.py)
    plan = dp.Plan(dataset_size=60000, sample_rate=256 / 60000, noise_multiplier=1.1, max_norm=1.0,
                   steps=steps, expected_batch_size=256)
    eps = plan.epsilon(1e-5)
"""
from cuvmap.dp.accounting import (  # noqa: F401
    DEFAULT_ORDERS, RDPAccountant, calibrate_noise, epsilon, rdp_sampled_gaussian, rdp_to_epsilon,
)
from cuvmap.dp.pld import PLDAccountant  # noqa: F401
from cuvmap.dp.accounting import _log_a_frac  # noqa: F401  (the tests check its series as cuvmap.dp._log_a_frac)
from cuvmap.dp.clipping import ClippedGradient, clip_per_example, clipped_sum, per_example_global_norms  # noqa: F401
from cuvmap.dp.noise import add_noise, private_gradient, standard_normal_like  # noqa: F401
from cuvmap.dp.padding import batch_buckets, bucket_for, pad_batch  # noqa: F401
from cuvmap.dp.sampling import poisson_sample, sample_users  # noqa: F401
from cuvmap.dp.plan import ACCOUNTANTS, Plan, register_accountant  # noqa: F401
from cuvmap.dp.ghost import clipped_grad  # noqa: F401
from cuvmap.dp import bandmf  # noqa: F401

__all__ = [
    "ACCOUNTANTS",
    "ClippedGradient",
    "DEFAULT_ORDERS",
    "PLDAccountant",
    "RDPAccountant",
    "add_noise",
    "bandmf",
    "batch_buckets",
    "bucket_for",
    "calibrate_noise",
    "clip_per_example",
    "clipped_grad",
    "clipped_sum",
    "epsilon",
    "pad_batch",
    "poisson_sample",
    "per_example_global_norms",
    "Plan",
    "private_gradient",
    "rdp_sampled_gaussian",
    "rdp_to_epsilon",
    "register_accountant",
    "sample_users",
    "standard_normal_like",
]
