r"""Cyclic Poisson sampling, the sampler amplified BandMF is accounted for: the units
(examples, or users) split once into ``b`` groups, step ``t`` Poisson-samples group
``t mod b`` with rate ``q``; optionally truncated to a largest batch.

**Groups.** Each unit is put in one of the ``b`` groups uniformly at random and
independently of the others, once, before training (jax_privacy's ``INDEPENDENT``
partition): the groups then do not depend on the other units, which is what add/remove-one
neighbouring needs (an equal split would move units between groups when one is added).
A unit of group ``g`` can be sampled only at the steps ``g, g + b, g + 2b, …``: at most
``⌈T/b⌉`` times in ``T`` steps, every two participations exactly a multiple of ``b`` apart,
so ``b``-min-separated — what a ``b``-banded strategy needs for its columns to be disjoint
(:mod:`~cuvmap.dp.bandmf.strategy`).

**A step.** Every unit of the step's group is in the batch with probability ``q``,
independently; the expected batch is ``q · N / b``. With ``b = 1`` this is
:func:`cuvmap.dp.poisson_sample` draw for draw (the same generator gives the same
batches).

**Truncation** (``max_batch_size=B``): a batch of more than ``B`` units keeps ``B`` of
them, uniformly without replacement; the accountant adds the probability that any step
truncates (:func:`~cuvmap.dp.bandmf.accounting.truncation_probability`).
"""
import numpy as np

from cuvmap.dp import sampling as poisson_sampling
from cuvmap.core.bfloat16 import kind_of


class CyclicPoissonSampler:
    """Cyclic Poisson sampling over ``num_units`` units in ``bands`` groups (the module's
    docstring), drawing from ``rng`` (jax_privacy: ``batch_selection.CyclicPoissonSampling``
    with ``partition_type=INDEPENDENT``).

    Args:
      num_units: ``N``, the number of examples (or users).
      sample_rate: ``q`` in ``(0, 1]``, the probability that a unit of the step's group is
        in its batch.
      bands: ``b``, the number of groups (the strategy's bands).
      rng: a ``numpy.random.Generator``; the groups are drawn from it first (nothing is
        drawn for ``b = 1``), then each step's batch.
      max_batch_size: the largest batch kept, in units (``None``: no truncation).
      user_of_example: with users as the units, the ``(num_examples,)`` integer user id of
        every example (``N`` distinct ids; user ``k`` of ``np.unique(user_of_example)`` is
        unit ``k``): :meth:`sample` then returns ``(indices, slots)`` as
        :func:`cuvmap.dp.sample_users` does.

    Attributes:
      groups: ``(N,)`` int64, the group of each unit.

    Example::

        sampler = CyclicPoissonSampler(len(ys), q, 4, np.random.default_rng(0))
        for t in range(steps):
            idx = sampler.sample(t)          # units of group t mod 4, each with probability q
    """

    def __init__(self, num_units, sample_rate, bands, rng, *, max_batch_size=None, user_of_example=None):
        where = "CyclicPoissonSampler"
        poisson_sampling._check_rate(sample_rate, where)
        if isinstance(num_units, (bool, np.bool_)) or not isinstance(num_units, (int, np.integer)) or num_units < 0:
            raise ValueError(f"{where}: num_units must be an int >= 0, got {num_units!r}")
        if isinstance(bands, (bool, np.bool_)) or not isinstance(bands, (int, np.integer)) or bands < 1:
            raise ValueError(f"{where}: bands must be a positive int, got {bands!r}")
        if max_batch_size is not None and (isinstance(max_batch_size, (bool, np.bool_))
                                           or not isinstance(max_batch_size, (int, np.integer)) or max_batch_size < 1):
            raise ValueError(f"{where}: max_batch_size must be a positive int or None, got {max_batch_size!r}")
        self.num_units, self.sample_rate, self.bands = int(num_units), float(sample_rate), int(bands)
        self.max_batch_size = None if max_batch_size is None else int(max_batch_size)
        self.rng = rng
        self._inverse = None
        if user_of_example is not None:
            ids = np.asarray(user_of_example)
            if ids.ndim != 1 or kind_of(ids.dtype) not in "iu":
                raise ValueError(f"{where}: user_of_example must be a 1-d integer array, got {ids.dtype} of shape "
                                 f"{ids.shape}")
            users, self._inverse = np.unique(ids, return_inverse=True)
            if len(users) != self.num_units:
                raise ValueError(f"{where}: user_of_example has {len(users)} distinct users, but num_units is "
                                 f"{self.num_units}")
        if self.bands == 1:
            self.groups = np.zeros(self.num_units, dtype=np.int64)
            self._members = [np.arange(self.num_units, dtype=np.int64)]
        else:
            self.groups = rng.integers(0, self.bands, size=self.num_units, dtype=np.int64)
            order = np.argsort(self.groups, kind="stable")
            bounds = np.searchsorted(self.groups[order], np.arange(self.bands + 1))
            self._members = [order[bounds[g]:bounds[g + 1]] for g in range(self.bands)]

    def __repr__(self):
        cut = "" if self.max_batch_size is None else f", truncated at {self.max_batch_size}"
        return f"CyclicPoissonSampler(N={self.num_units}, q={self.sample_rate:g}, bands={self.bands}{cut})"

    def members(self, group):
        """The units of ``group`` (ascending)."""
        return self._members[group]

    def chosen(self, step):
        """A boolean mask over the units of group ``step mod b``: the step's Poisson draw
        (before truncation)."""
        if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"CyclicPoissonSampler: step must be an int >= 0, got {step!r}")
        members = self._members[int(step) % self.bands]
        return self.rng.random(len(members)) < self.sample_rate

    def sample_units(self, step):
        """The units of step ``step``'s batch (ascending int64 indices): each unit of group
        ``step mod b`` in with probability ``q``, truncated to ``max_batch_size``."""
        mask = self.chosen(step)
        return self._truncated(self._members[int(step) % self.bands][mask])

    def sample(self, step):
        """Step ``step``'s batch: the indices of its examples (ascending); with users as
        the units, ``(indices, slots)``: the examples of the sampled users and each one's
        user numbered ``0 .. k−1`` in the batch (as :func:`cuvmap.dp.sample_users`)."""
        units = self.sample_units(step)
        if self._inverse is None:
            return units
        chosen = np.zeros(self.num_units, dtype=bool)
        chosen[units] = True
        slot_of_user = np.cumsum(chosen) - 1
        indices = np.flatnonzero(chosen[self._inverse])
        return indices, slot_of_user[self._inverse[indices]].astype(np.int64)

    def _truncated(self, picked):
        if self.max_batch_size is None or len(picked) <= self.max_batch_size:
            return picked
        return np.sort(self.rng.choice(picked, size=self.max_batch_size, replace=False))
