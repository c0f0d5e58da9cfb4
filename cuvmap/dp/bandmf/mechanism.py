r"""What a ``dp.Plan(..., mechanism="bandmf")`` builds, together and checked against each
other: the strategy, the noise, the sampler and the accountant (NOTE [one plan] in
``cuvmap/dp/plan.py``; NOTE [bandmf in a plan] here).
"""
import numpy as np

from cuvmap.dp.bandmf import accounting, noise, sampling, strategy

#: the samplers a plan names, and the mechanisms each is accounted for with
SAMPLERS = {"poisson": "dpsgd", "cyclic_poisson": "bandmf"}


# NOTE [bandmf in a plan]
# Amplified BandMF's ε is that of ⌈T/b⌉ Poisson-subsampled Gaussian steps only when all of
# these hold at once, so a plan builds them together and refuses the rest:
#   strategy   b-banded, lower-triangular, columns of norm 1 (BandedStrategy), b ≤ T (more
#              bands than steps: a matrix of T columns has at most T bands, and the user
#              surely meant something else);
#   sampler    cyclic Poisson over b groups drawn independently per unit: plain Poisson
#              sampling lets one unit be in two steps less than b apart, whose columns
#              overlap (the ⌈T/b⌉ reduction fails; the sensitivity over a run is then the
#              min-sep one of all T steps), and shuffled or fixed-size batches are another
#              mechanism the Poisson accountants do not cover;
#   noise      σ·Δ·w_t with w = C'⁻¹z (BandedNoise), Δ the clipped sum's sensitivity: the
#              plan's private_gradient checks the sum as for DP-SGD; the state advances
#              once per step;
#   accounting T steps recorded, ⌈T/b⌉ composed by the plan's accountant (RDP or PLD),
#              with the truncation's (1 + e^ε)·T·p in δ when batches are capped.
# bands=1 with coefficients [1] is DP-SGD: the same sampler draws (cyclic Poisson over one
# group is Poisson), the same noise bit for bit (w = z / 1 · 1) and the same accountant.
class BandMF:
    """The strategy, noise, sampler and accountant of amplified BandMF for a plan (NOTE
    [bandmf in a plan]; jax_privacy: ``execution_plan.BandMFConfig(...).make()``).

    Args:
      steps: ``T``.
      bands: ``b`` (``1 ≤ b ≤ T``).
      coefficients: ``"optimal"`` (or None: :func:`~cuvmap.dp.bandmf.optimal_coefficients`
        for the prefix sums over ``T`` steps), ``"sqrt"``, or ``b`` numbers.
      sampler: ``"cyclic_poisson"`` (or None); any other is refused.
      max_batch_size: the truncation (``None``: none).
      where: the caller's name, for errors.
    """

    def __init__(self, steps, bands, coefficients=None, sampler=None, max_batch_size=None, *, where="Plan"):
        if isinstance(bands, (bool, np.bool_)) or not isinstance(bands, (int, np.integer)) or bands < 1:
            raise ValueError(f"{where}: mechanism='bandmf' needs bands, a positive int, got {bands!r}")
        bands = int(bands)
        if bands > steps:
            raise ValueError(f"{where}: bands={bands} > steps={steps}: a strategy over {steps} steps has at most "
                             f"{steps} bands (and with cyclic sampling over {bands} groups some groups would "
                             "never be sampled)")
        check_sampler(sampler, "bandmf", where)
        if max_batch_size is not None and (isinstance(max_batch_size, (bool, np.bool_))
                                           or not isinstance(max_batch_size, (int, np.integer)) or max_batch_size < 1):
            raise ValueError(f"{where}: max_batch_size must be a positive int or None, got {max_batch_size!r}")
        c = strategy.coefficients_for(coefficients, bands, steps, where)
        self.strategy = strategy.BandedStrategy(c, steps)
        self.noise = noise.BandedNoise(self.strategy)
        self.bands, self.steps = bands, int(steps)
        self.max_batch_size = None if max_batch_size is None else int(max_batch_size)

    def __repr__(self):
        return f"BandMF({self.strategy!r}, max_batch_size={self.max_batch_size})"

    def sampler(self, num_units, sample_rate, rng, user_of_example=None):
        """The cyclic Poisson sampler over ``num_units`` units (its groups drawn from
        ``rng`` now)."""
        return sampling.CyclicPoissonSampler(num_units, sample_rate, self.bands, rng,
                                             max_batch_size=self.max_batch_size, user_of_example=user_of_example)

    def accountant(self, base, num_units):
        """A fresh :class:`~cuvmap.dp.bandmf.accounting.BandMFAccountant` over the base
        accountant class ``base``."""
        truncation = None if self.max_batch_size is None else (num_units, self.max_batch_size)
        return accounting.BandMFAccountant(self.bands, base, truncation=truncation)

    def calibrate_noise(self, target_epsilon, delta, sample_rate, num_units, accountant="pld", rtol=1e-3):
        """The smallest ``σ`` meeting ``(target_epsilon, delta)`` for this mechanism
        (:func:`~cuvmap.dp.bandmf.accounting.calibrate_noise`)."""
        truncation = None if self.max_batch_size is None else (num_units, self.max_batch_size)
        return accounting.calibrate_noise(target_epsilon, delta, sample_rate, self.steps, self.bands, accountant,
                                          truncation=truncation, rtol=rtol)


def check_sampler(sampler, mechanism, where):
    """Refuses a sampler the mechanism's accountant does not cover (NOTE [bandmf in a
    plan]); None is the mechanism's own."""
    if sampler is None:
        return
    if sampler in ("shuffle", "fixed_size"):
        raise ValueError(f"{where}: sampler={sampler!r}: shuffled or fixed-size batches are another mechanism than "
                         "Poisson sampling, which the accountants here assume (opacus#80, tensorflow/privacy#19)")
    if sampler not in SAMPLERS:
        raise ValueError(f"{where}: sampler must be one of {sorted(SAMPLERS)}, got {sampler!r}")
    if SAMPLERS[sampler] != mechanism:
        if mechanism == "bandmf":
            raise ValueError(f"{where}: sampler={sampler!r} with a banded strategy: plain Poisson sampling can put "
                             "an example in two steps less than `bands` apart, where the strategy's columns overlap, "
                             "and the amplified-BandMF accounting (⌈T/b⌉ subsampled Gaussians) does not hold; "
                             "BandMF samples cyclically (sampler='cyclic_poisson', the default)")
        raise ValueError(f"{where}: sampler={sampler!r} is BandMF's: mechanism='dpsgd' samples by plain Poisson "
                         "sampling; cyclic sampling with independent noise is mechanism='bandmf', bands=b, "
                         "coefficients=[1, 0, ..., 0] (b numbers)")
