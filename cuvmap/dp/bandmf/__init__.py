r"""Banded matrix factorisation (BandMF): DP-SGD with noise correlated across steps, so
that much of it cancels in the running sum of updates (Choquette-Choo et al. 2023, McKenna
2024; jax_privacy's ``matrix_factorization`` package).

DP-SGD adds ``σ·z_t`` (independent) to step ``t``'s clipped gradient sum. BandMF adds
``σ·w_t`` with ``w = C'⁻¹ z``, ``C'`` a ``b``-banded lower-triangular Toeplitz matrix with
columns of norm 1: the released ``x + σ C'⁻¹ z = C'⁻¹ (C' x + σ z)`` is a post-processing
of the Gaussian mechanism on ``C' x``, and the optimiser's trajectory ``A x̃`` (``A`` the
prefix sums, or SGD with momentum's workload) carries the noise ``σ A C'⁻¹ z``, smaller
than DP-SGD's ``σ A z`` for a good ``C'``. With cyclic Poisson sampling (the units split
into ``b`` groups, step ``t`` samples group ``t mod b`` with rate ``q``) one unit's
participations use disjoint rows of ``C'``, and the run has the privacy of DP-SGD with
rate ``q`` over ``⌈T/b⌉`` steps (amplified BandMF). ``b = 1`` is DP-SGD.

Modules: :mod:`~cuvmap.dp.bandmf.strategy` (``BandedStrategy``: the matrix, its exact
sensitivity, its expected error; the square-root and the optimised coefficients),
:mod:`~cuvmap.dp.bandmf.lbfgs` (the optimiser), :mod:`~cuvmap.dp.bandmf.noise`
(``BandedNoise``: ``w_t`` streamed by the banded recurrence, under ``jit``),
:mod:`~cuvmap.dp.bandmf.sampling` (``CyclicPoissonSampler``),
:mod:`~cuvmap.dp.bandmf.accounting` (``BandMFAccountant``, ``calibrate_noise``) and
:mod:`~cuvmap.dp.bandmf.mechanism` (what ``dp.Plan(..., mechanism="bandmf")`` builds).

Example::

    plan = dp.Plan(dataset_size=N, sample_rate=q, noise_multiplier=0.0, max_norm=1.0, steps=500,
                   expected_batch_size=q * N / 4, mechanism="bandmf", bands=4).calibrated(1.0, 1e-5)
    sampler = plan.sampler(np.random.default_rng(0))     # the groups are drawn here, once
    state = plan.noise_state(params)                     # b − 1 buffers shaped like params
    for t in range(plan.steps):
        idx = sampler.sample(t)
        ...
        w, state = plan.correlated_noise(state, t, key=key)   # or noise=plan.noise(params, rng)
        g = plan.private_gradient(clipped, noise=w)
    plan.epsilon(1e-5)
"""
from cuvmap.dp.bandmf.accounting import (  # noqa: F401
    BandMFAccountant, calibrate_noise, epsilon, participations, truncation_probability,
)
from cuvmap.dp.bandmf.mechanism import BandMF  # noqa: F401
from cuvmap.dp.bandmf.noise import BandedNoise, standard_normal_from_key  # noqa: F401
from cuvmap.dp.bandmf.sampling import CyclicPoissonSampler  # noqa: F401
from cuvmap.dp.bandmf.strategy import (  # noqa: F401
    BandedStrategy, inverse_coefficients, momentum_workload, optimal_coefficients, sqrt_coefficients,
)

__all__ = [
    "BandMF",
    "BandMFAccountant",
    "BandedNoise",
    "BandedStrategy",
    "CyclicPoissonSampler",
    "calibrate_noise",
    "epsilon",
    "inverse_coefficients",
    "momentum_workload",
    "optimal_coefficients",
    "participations",
    "sqrt_coefficients",
    "standard_normal_from_key",
    "truncation_probability",
]
