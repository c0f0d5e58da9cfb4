r"""One object for the privacy-critical pieces of DP-SGD, built once from
``(N, q, σ, C, steps)``: the sampler, the padding buckets, the clipping, the noise, the
normalisation and the accountant (as jax_privacy's ``DPExecutionPlan``).

Each piece is right on its own; what breaks a guarantee is pieces that disagree: an
accountant for Poisson sampling over a loader of fixed-size batches, noise for a bound
other than the clipping's, a normalisation from the private data, a replace-one
sensitivity accounted as add/remove-one. A :class:`Plan` derives all of them from the
same numbers and checks what it is handed (NOTE [one plan]). ``mechanism="bandmf"``
builds amplified BandMF's instead: a banded strategy, its correlated noise, cyclic Poisson
sampling and the accountant over ``⌈T/b⌉`` participations (:mod:`cuvmap.dp.bandmf`, NOTE
[bandmf in a plan]).
"""
import copy
import math
import numbers
import warnings

import numpy as np

from cuvmap import tree
from cuvmap.dp import bandmf
from cuvmap.dp import accounting, clipping, padding, pld, sampling
from cuvmap.dp import noise as noise_mod
from cuvmap.dp.ghost import clipped_grad as _clipped_grad

#: the accountants a plan can report ε with, by name (the RDP accountant of the
#: Poisson-subsampled Gaussian; another module may add one with :func:`register_accountant`)
ACCOUNTANTS = {"rdp": accounting.RDPAccountant, "pld": pld.PLDAccountant}


def register_accountant(name, cls):
    """Makes ``cls`` (an accountant with ``step(noise_multiplier=, sample_rate=,
    num_steps=)`` and ``get_epsilon(delta)`` for the Poisson-subsampled Gaussian) available
    to plans as ``accountant=name``."""
    ACCOUNTANTS[name] = cls
    return cls


# NOTE [one plan]
# A Plan is public configuration only: (N, q, σ, C, T), the public expected batch size n,
# the relation, the unit (example or user) and the groups. From them, once:
#   sampler      Poisson with rate q over the N units (dp.poisson_sample, dp.sample_users),
#                the sampling the accountant assumes; never fixed-size batches;
#   buckets      the padded sizes batch_buckets(q·N, N) (NOTE [padding Poisson batches]);
#   clipping     clipped_grad / clipped_sum with the plan's C, groups and relation;
#   noise        private_gradient with σ times the clipped sum's sensitivity, refusing a
#                clipped sum whose sensitivity is not the plan's (another C, relation, unit
#                or groups), drawn once over a data-parallel axis;
#   normalising  by n, never by a batch's size (NOTE [normalising the private gradient]);
#   accounting   T steps of the subsampled Gaussian with (q, σ): epsilon(δ) is the
#                accountant's for this sampler, with no step counting left to the loop.
# The relation is add/remove-one: the accountants here are stated for it under Poisson
# sampling (a replace-one sensitivity would need another analysis), so a plan refuses
# "replace". n: Opacus' q·N uses the dataset's size N, which is private under
# add/remove-one (opacus#571); a plan takes n as a public number, or q·N when asked by
# name (expected_batch_size="from_dataset_size": N is then treated as public).
#
# NOTE [what a plan warns about]
# Two numbers a plan takes weaken the guarantee the user reads without any error:
#   δ ≥ 1/N   releasing one unit's data whole, chosen at random, is (0, 1/N)-DP: at such a
#             δ the (ε, δ) statement allows that, whatever ε is (the usual choice is δ ≪ 1/N);
#   n ≉ q·N   the accountant's sampling rate is q; a public normalisation n that differs
#             from q·N (by more than _BATCH_SIZE_RTOL) usually means the batches the user has
#             in mind are not the ones q describes (n/N would be the rate), and the ε is
#             reported for the wrong rate.
# Both are warnings, not errors: n is a free public number (any n keeps the guarantee of q),
# and a δ is the user's choice to make knowingly.
_BATCH_SIZE_RTOL = 0.1


class Plan:
    """DP-SGD's sampler, padding buckets, clipping, noise, normalisation and accountant,
    built once from ``(N, q, σ, C, steps)`` and consistent by construction (NOTE [one plan]).

    Args:
      dataset_size: ``N``, the number of units (examples, or users with ``unit="user"``).
      sample_rate: ``q`` in ``(0, 1]``: each unit in a step's batch with probability ``q``.
      noise_multiplier: ``σ ≥ 0``: the noise std over the sensitivity.
      max_norm: the clipping bound ``C`` (with ``groups``, a number or a dict of bounds).
      steps: ``T``, the number of steps the run takes (the accountant composes them).
      expected_batch_size: the public number the noisy sum is divided by (the expected
        batch size you chose), or ``"from_dataset_size"`` for ``q·N`` (treating ``N`` as
        public). Required.
      unit: ``"example"`` or ``"user"`` (user-level DP: the sampler samples users,
        ``clipped_grad`` clips each user's sum).
      num_examples: with ``unit="user"``, the number of examples (for the padding buckets).
      groups: group-wise clipping, as :func:`cuvmap.dp.clipped_grad`'s ``groups``.
      accountant: the name of the accountant ``epsilon`` reports (:data:`ACCOUNTANTS`).
      relation: ``"add_remove"`` (the only one the accountants cover).
      mechanism: ``"dpsgd"`` (independent noise, Poisson sampling) or ``"bandmf"``
        (amplified banded matrix factorisation: :mod:`cuvmap.dp.bandmf`; ``q`` is then the
        rate within the step's group, the expected batch ``q·N/b``).
      bands: with ``"bandmf"``, ``b`` (``1 ≤ b ≤ steps``).
      coefficients: with ``"bandmf"``, ``"optimal"`` (the default: optimised for the
        prefix sums over ``steps``), ``"sqrt"``, or ``b`` numbers.
      sampler: ``"poisson"`` (DP-SGD's) or ``"cyclic_poisson"`` (BandMF's); the other
        combinations, and shuffled batches, are refused (NOTE [bandmf in a plan]).
      max_batch_size: with ``"bandmf"``, truncate batches to this many units (accounted).

    Example::

        plan = dp.Plan(dataset_size=60000, sample_rate=256 / 60000, noise_multiplier=1.1, max_norm=1.0,
                       steps=14063, expected_batch_size=256)
        clipped_grad = plan.clipped_grad(loss)
        for step in range(plan.steps):
            idx = plan.sample(rng)
            (x, y), mask = plan.pad((xs[idx], ys[idx]))
            g = plan.private_gradient(clipped_grad(params, x, y, mask=mask), noise=plan.noise(params, noise_rng))
            ...
        plan.epsilon(1e-5)
    """

    def __init__(self, dataset_size, sample_rate, noise_multiplier, max_norm, steps, *, expected_batch_size=None,
                 unit="example", num_examples=None, groups=None, accountant="rdp", relation="add_remove",
                 mechanism="dpsgd", bands=None, coefficients=None, sampler=None, max_batch_size=None):
        where = "Plan"
        if not (_is_int(dataset_size) and dataset_size >= 1):
            raise ValueError(f"{where}: dataset_size must be a positive int, got {dataset_size!r}")
        sampling._check_rate(sample_rate, where)
        if isinstance(noise_multiplier, bool) or not noise_multiplier >= 0:
            raise ValueError(f"{where}: noise_multiplier must be >= 0, got {noise_multiplier!r}")
        if not (_is_int(steps) and steps >= 0):
            hint = (f" (a fractional count such as epochs / q: pass math.ceil(steps) = {math.ceil(steps)}, never "
                    "fewer steps than run)" if isinstance(steps, float) and math.isfinite(steps) and steps > 0 else "")
            raise ValueError(f"{where}: steps must be an int >= 0, got {steps!r}{hint}")
        if clipping.check_relation(relation, where) != "add_remove":
            raise ValueError(f"{where}: relation={relation!r}, but the accountants of the Poisson-subsampled Gaussian "
                             "are stated for add/remove-one; a replace-one sensitivity (2C) needs another analysis")
        if unit not in ("example", "user"):
            raise ValueError(f"{where}: unit must be 'example' or 'user', got {unit!r}")
        if unit == "user" and not (_is_int(num_examples) and num_examples >= dataset_size):
            raise ValueError(f"{where}: unit='user' needs num_examples, the number of examples (at least one per "
                             f"user: >= dataset_size={dataset_size}), for the padding buckets")
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"{where}: accountant must be one of {sorted(ACCOUNTANTS)}, got {accountant!r}")
        if expected_batch_size is None:
            raise ValueError(
                f"{where}: expected_batch_size is needed: the public number the noisy sum is divided by (the expected "
                "batch size you chose); q·N from the dataset's size uses N, which is private under add/remove-one "
                "(opacus#571): pass expected_batch_size='from_dataset_size' to use it all the same")
        self.bandmf = self._mechanism(mechanism, steps, bands, coefficients, sampler, max_batch_size, where)
        self.mechanism, self.bands = mechanism, 1 if self.bandmf is None else self.bandmf.bands
        if expected_batch_size == "from_dataset_size":
            expected_batch_size = sample_rate * dataset_size / self.bands
        if (isinstance(expected_batch_size, (bool, str)) or not expected_batch_size > 0
                or not math.isfinite(expected_batch_size)):
            raise ValueError(f"{where}: expected_batch_size must be a positive number or 'from_dataset_size' (a finite "
                             f"number), got {expected_batch_size!r}")
        if groups is None or not isinstance(max_norm, dict):
            clipping.check_max_norm(max_norm, where)
        self.dataset_size, self.sample_rate, self.noise_multiplier = int(dataset_size), float(sample_rate), noise_multiplier
        self.max_norm, self.steps, self.expected_batch_size = max_norm, int(steps), float(expected_batch_size)
        self.unit, self.groups, self.relation, self.accountant_name = unit, groups, relation, accountant
        self.num_examples = self.dataset_size if unit == "example" else int(num_examples)
        self.buckets = self.buckets_for(self.num_examples)
        expected = self.sample_rate * self.dataset_size / self.bands   # a BandMF step samples one of b groups
        if abs(self.expected_batch_size - expected) > _BATCH_SIZE_RTOL * expected:
            formula, per_group = ("q·N", "") if self.bands == 1 else ("q·N/b", f"/{self.bands}")
            warnings.warn(
                f"Plan: expected_batch_size={self.expected_batch_size:g} is far from {formula} = {self.sample_rate:g}·"
                f"{self.dataset_size}{per_group} = {expected:g} (NOTE [what a plan warns about]): the accountant "
                f"reports ε for the sampling rate q, batches of {expected:g} {unit}s on average; if yours average "
                f"{self.expected_batch_size:g}, the rate is "
                f"{self.expected_batch_size * self.bands / self.dataset_size:g} and the ε is larger than reported",
                UserWarning, stacklevel=2)

    def __repr__(self):
        how = "" if self.bandmf is None else f", bandmf with {self.bands} bands"
        return (f"Plan(N={self.dataset_size} {self.unit}s, q={self.sample_rate:g}, σ={self.noise_multiplier:g}, "
                f"C={self.max_norm}, steps={self.steps}, n={self.expected_batch_size:g}, {self.relation}, "
                f"accountant={self.accountant_name!r}{how})")

    @staticmethod
    def _mechanism(mechanism, steps, bands, coefficients, sampler, max_batch_size, where):
        """None for DP-SGD (refusing BandMF's arguments), else the :class:`~cuvmap.dp.bandmf.BandMF`."""
        if mechanism == "bandmf":
            return bandmf.BandMF(steps, bands, coefficients, sampler, max_batch_size, where=where)
        if mechanism != "dpsgd":
            raise ValueError(f"{where}: mechanism must be 'dpsgd' or 'bandmf', got {mechanism!r}")
        for name, value in (("bands", bands), ("coefficients", coefficients), ("max_batch_size", max_batch_size)):
            if value is not None:
                raise ValueError(f"{where}: {name} is for mechanism='bandmf' (this plan is DP-SGD's)")
        bandmf.mechanism.check_sampler(sampler, "dpsgd", where)
        return None

    # -- the sampler and the padding ------------------------------------------------------

    def sample(self, rng, user_of_example=None):
        """One step's Poisson batch: the indices of the sampled examples (each in with
        probability ``q``); with ``unit="user"``, ``(indices, user slots)`` for the users of
        ``user_of_example`` (each user in with probability ``q``, all its examples). A
        BandMF plan samples cyclically: use :meth:`sampler`."""
        if self.bandmf is not None:
            raise ValueError("Plan.sample: a bandmf plan samples cyclically (step t from group t mod b, groups drawn "
                             "once): sampler = plan.sampler(rng), then sampler.sample(t)")
        if self.unit == "user":
            if user_of_example is None:
                raise ValueError("Plan.sample: a user-level plan samples users: pass user_of_example, the user id "
                                 "of every example")
            return sampling.sample_users(user_of_example, self.sample_rate, rng)
        if user_of_example is not None:
            raise ValueError("Plan.sample: an example-level plan samples examples; user_of_example is for unit='user'")
        return sampling.poisson_sample(self.dataset_size, self.sample_rate, rng)

    def sampler(self, rng, user_of_example=None):
        """A sampler of the plan's units drawing from ``rng``, whose ``sample(step)`` gives
        step ``step``'s batch (as :meth:`sample`): cyclic Poisson over ``b`` groups for BandMF
        (the groups drawn from ``rng`` now, once), plain Poisson for DP-SGD (the draws of
        :meth:`sample`) (:class:`~cuvmap.dp.bandmf.CyclicPoissonSampler`)."""
        if self.unit == "user" and user_of_example is None:
            raise ValueError("Plan.sampler: a user-level plan samples users: pass user_of_example, the user id of "
                             "every example")
        if self.unit == "example" and user_of_example is not None:
            raise ValueError("Plan.sampler: an example-level plan samples examples; user_of_example is for "
                             "unit='user'")
        if self.bandmf is None:
            return bandmf.CyclicPoissonSampler(self.dataset_size, self.sample_rate, 1, rng,
                                               user_of_example=user_of_example)
        return self.bandmf.sampler(self.dataset_size, self.sample_rate, rng, user_of_example)

    def buckets_for(self, num_examples):
        """The padded sizes for Poisson batches over ``num_examples`` examples (a shard's,
        under data parallelism): ``batch_buckets(q · num_examples, num_examples)``."""
        return padding.batch_buckets(max(self.sample_rate * num_examples / self.bands, 1e-9), int(num_examples))

    def pad(self, batch, buckets=None):
        """``(padded, mask)``: ``batch`` padded to the smallest of ``buckets`` (the plan's by
        default) that holds it (NOTE [padding Poisson batches])."""
        leaves = tree.leaves(batch)
        size = leaves[0].shape[0] if leaves else 0
        return padding.pad_batch(batch, padding.bucket_for(size, self.buckets if buckets is None else buckets))

    # -- clipping, noise, normalisation ------------------------------------------------------

    def clipped_grad(self, loss, **kwargs):
        """:func:`cuvmap.dp.clipped_grad` of ``loss`` with the plan's bound, groups and relation
        (``kwargs``: ``method``, ``argnums``, ``in_axes``, ``has_aux``, ``nan_safe``, ...)."""
        for key in ("max_norm", "groups", "relation"):
            if key in kwargs:
                raise ValueError(f"Plan.clipped_grad: {key} is the plan's ({getattr(self, key)!r})")
        return _clipped_grad(loss, self.max_norm, groups=self.groups, relation=self.relation, **kwargs)

    def clipped_sum(self, per_example_grads, **kwargs):
        """:func:`cuvmap.dp.clipped_sum` with the plan's bound, groups and relation."""
        return clipping.clipped_sum(per_example_grads, self.max_norm, groups=self.groups, relation=self.relation,
                                    **kwargs)

    def noise(self, like, rng=None):
        """Standard normal draws shaped like ``like`` (the parameters), for ``noise=`` of a
        jitted step (:func:`cuvmap.dp.standard_normal_like`)."""
        return noise_mod.standard_normal_like(like, rng)

    def noise_state(self, like):
        """The state of the plan's noise before step 0, for :meth:`correlated_noise`: ``b − 1``
        zero buffers shaped like each leaf of ``like`` (the parameters), stacked
        (:meth:`cuvmap.dp.bandmf.BandedNoise.init`); empty ones for DP-SGD."""
        return self._noise_process().init(like)

    def correlated_noise(self, state, step, noise=None, *, key=None):
        """``(w_t, state')``: the noise of step ``t = step`` for :meth:`private_gradient`'s
        ``noise=``, from fresh standard normal draws ``noise = z_t`` (:meth:`noise`) or from
        the counter-based ``key`` (``cuvmap.random``); a pure function of its arguments, so
        a jitted step can carry the state. BandMF: ``w_t = d_t u_t``,
        ``u_t = (z_t − Σ_j c_j u_{t−j}) / c_0`` (:class:`~cuvmap.dp.bandmf.BandedNoise`);
        DP-SGD: ``w_t = z_t``."""
        if (noise is None) == (key is None):
            raise ValueError("Plan.correlated_noise: pass either noise (standard normal draws: plan.noise(params, "
                             "rng)) or key (a cuvmap.random key, for draws inside jit)")
        process = self._noise_process()
        return process.update(state, noise, step) if key is None else process.draw(state, key, step)

    def _noise_process(self):
        if self.bandmf is not None:
            return self.bandmf.noise
        if self.steps < 1:
            raise ValueError("Plan.correlated_noise: a plan of 0 steps releases no noise")
        return bandmf.BandedNoise(bandmf.BandedStrategy.dpsgd(self.steps))

    def private_gradient(self, clipped, *, noise=None, rng=None, axis_name="auto"):
        """``(Σ clip + σ·Δ·z) / n`` for ``clipped``, a :class:`~cuvmap.dp.ClippedGradient`
        made with this plan's bound, groups, relation and unit (a ValueError names both
        otherwise, eagerly and under ``jit``): σ the plan's, ``n`` its expected batch size,
        the noise once over a data-parallel axis (NOTE [noise once over a data-parallel
        axis])."""
        if not isinstance(clipped, clipping.ClippedGradient):
            raise ValueError("Plan.private_gradient: takes what plan.clipped_grad or plan.clipped_sum returns (a "
                             f"ClippedGradient that carries its sensitivity), got {type(clipped).__name__}")
        want = self._expected_clipping()
        got = (clipped.max_norm, clipped.relation, clipped.unit, clipped.groups)
        if not _same(got, want):
            raise ValueError(f"Plan.private_gradient: the clipped sum has {clipped.describe()}, but the plan's is "
                             f"{self._describe_clipping(want)}: clip with plan.clipped_grad or plan.clipped_sum")
        return noise_mod.private_gradient(clipped, noise_multiplier=self.noise_multiplier, noise=noise, rng=rng,
                                          expected_batch_size=self.expected_batch_size, axis_name=axis_name)

    def _expected_clipping(self):
        if self.groups is None:
            return (float(self.max_norm), self.relation, self.unit, None)
        if isinstance(self.max_norm, dict):
            bounds = tuple((label, float(c)) for label, c in self.max_norm.items())
            return (math.sqrt(sum(c * c for _, c in bounds)), self.relation, self.unit, ("dict", bounds))
        return (float(self.max_norm), self.relation, self.unit, ("groups", self.groups))

    @staticmethod
    def _describe_clipping(want):
        bound, relation, unit, groups = want
        how = "" if groups is None else " by group"
        return f"each {unit} clipped{how} to a total bound {bound:g}, {relation}"

    # -- accounting ------------------------------------------------------------------------

    def accountant(self, steps=None, name=None):
        """A fresh accountant (``name``, the plan's by default) that has composed ``steps``
        steps (the plan's ``T`` by default) of the subsampled Gaussian with ``(q, σ)``; for
        BandMF a :class:`~cuvmap.dp.bandmf.BandMFAccountant` over it (``⌈T/b⌉`` steps)."""
        name = self.accountant_name if name is None else name
        if name not in ACCOUNTANTS:
            raise ValueError(f"Plan.accountant: accountant must be one of {sorted(ACCOUNTANTS)}, got {name!r}")
        acct = ACCOUNTANTS[name]() if self.bandmf is None else self.bandmf.accountant(ACCOUNTANTS[name],
                                                                                       self.dataset_size)
        steps = self.steps if steps is None else steps
        if steps:
            acct.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate, num_steps=steps)
        return acct

    def epsilon(self, delta, steps=None, accountant=None):
        """The ε of ``(ε, δ)``-DP after ``steps`` steps (the plan's ``T`` by default), by the
        plan's accountant (or ``accountant``): the accountant of the plan's own sampler.
        Warns when ``δ ≥ 1/N`` (NOTE [what a plan warns about])."""
        if delta >= 1.0 / self.dataset_size:
            warnings.warn(
                f"Plan.epsilon: delta={delta:g} is at least 1/N = 1/{self.dataset_size} "
                f"(NOTE [what a plan warns about]): a mechanism that publishes one {self.unit} at random in the clear "
                f"is (0, δ)-DP for "
                f"δ = 1/N, so such a δ guarantees little whatever ε says; choose δ well below 1/N (1/N^1.1, or "
                f"1/(10·N))", UserWarning, stacklevel=2)
        return self.accountant(steps, accountant).get_epsilon(delta)

    def calibrated(self, target_epsilon, delta, accountant=None, *, rtol=1e-3):
        """A copy of the plan whose ``noise_multiplier`` is the smallest σ meeting
        ``(target_epsilon, delta)`` over its ``steps`` by ``accountant`` (``"pld"`` or
        ``"rdp"``; the plan's by default): :func:`cuvmap.dp.calibrate_noise` for DP-SGD,
        over ``⌈T/b⌉`` steps for BandMF (:func:`cuvmap.dp.bandmf.calibrate_noise`)."""
        name = self.accountant_name if accountant is None else accountant
        if name not in ("rdp", "pld"):
            raise ValueError(f"Plan.calibrated: the noise is calibrated by 'pld' or 'rdp', got {name!r}")
        if self.bandmf is None:
            sigma = accounting.calibrate_noise(target_epsilon, delta, self.sample_rate, self.steps, name, rtol=rtol)
        else:
            sigma = self.bandmf.calibrate_noise(target_epsilon, delta, self.sample_rate, self.dataset_size, name,
                                                rtol=rtol)
        plan = copy.copy(self)
        plan.noise_multiplier = sigma
        return plan

    def epsilons(self, delta, steps=None):
        """``{accountant name: ε}`` for every accountant of :data:`ACCOUNTANTS` (warning once
        as :meth:`epsilon` does)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = {name: self.epsilon(delta, steps, name) for name in ACCOUNTANTS}
        for message in {str(w.message): w for w in caught}.values():
            warnings.warn_explicit(message.message, message.category, message.filename, message.lineno)
        return out


def _is_int(value):
    """An int of Python or NumPy (the accountants take both), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _same(got, want):
    bound, relation, unit, groups = got
    w_bound, w_relation, w_unit, w_groups = want
    if (relation, unit) != (w_relation, w_unit) or not math.isclose(bound, w_bound, rel_tol=1e-12):
        return False
    if w_groups is None:
        return groups is None
    if groups is None:
        return False
    kind, spec = w_groups
    if kind == "dict":
        return dict(groups) == dict(spec)
    return True   # a style or a prefix: the labels are the parameters', the total bound is checked above
