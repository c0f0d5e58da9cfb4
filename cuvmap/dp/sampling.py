r"""Poisson sampling of examples, and of users for user-level DP.

The accountants of :mod:`cuvmap.dp.accounting` bound the privacy loss of the *Poisson
subsampled* Gaussian mechanism: every unit of the dataset is in a step's batch
independently with probability ``q``. The unit is what the sensitivity is stated for
(NOTE [sensitivity as data] in :mod:`cuvmap.dp.clipping`): an example, or under
user-level clipping a user, all of whose examples come in together. Fixed-size batches
(shuffling, sampling without replacement) are another mechanism, which these accountants
do not cover (opacus#80, tensorflow/privacy#19).
"""
import numpy as np
from cuvmap.core.bfloat16 import kind_of


def poisson_sample(num_examples, sample_rate, rng):
    """The indices of one Poisson batch: each of ``num_examples`` in independently with
    probability ``sample_rate`` (ascending; possibly none).

    Args:
      num_examples: ``N``.
      sample_rate: ``q`` in ``(0, 1]``.
      rng: a ``numpy.random.Generator`` (the batch is drawn on the host, as the indices
        that gather it are host values).

    Returns:
      an int64 array of indices.

    Example::

        idx = poisson_sample(len(ys), 256 / len(ys), np.random.default_rng(0))
    """
    _check_rate(sample_rate, "poisson_sample")
    return np.flatnonzero(rng.random(int(num_examples)) < sample_rate)


def sample_users(user_of_example, sample_rate, rng):
    """One Poisson batch of users: each distinct user of ``user_of_example`` is in
    independently with probability ``sample_rate``, with every one of their examples.

    Returns the examples' indices (ascending) and, for each, its user's *slot* in the
    batch: the sampled users numbered ``0 .. k−1`` in the order of their ids, so that the
    ids are below the batch size (and below any padded size), as
    :func:`cuvmap.dp.clipped_grad` and :func:`cuvmap.dp.clipped_sum` take them
    (``users=``). Pad the slots with the examples (:func:`cuvmap.dp.pad_batch` repeats the
    first example's slot, which the mask then gives weight 0).

    Args:
      user_of_example: ``(N,)`` integer user ids (any values), one per example.
      sample_rate: ``q`` in ``(0, 1]``, per user.
      rng: a ``numpy.random.Generator``.

    Returns:
      ``(indices, slots)``, two int64 arrays of one length.

    Example::

        idx, slots = sample_users(user_ids, q, rng)
        (x, y, u), mask = pad_batch((xs[idx], ys[idx], slots), bucket_for(len(idx), buckets))
        clipped = clipped_grad(loss, C)(params, x, y, mask=mask, users=u)
    """
    _check_rate(sample_rate, "sample_users")
    ids = np.asarray(user_of_example)
    if ids.ndim != 1 or kind_of(ids.dtype) not in "iu":
        raise ValueError(f"sample_users: user_of_example must be a 1-d integer array, got {ids.dtype} of shape "
                         f"{ids.shape}")
    users, inverse = np.unique(ids, return_inverse=True)
    chosen = rng.random(len(users)) < sample_rate
    slot_of_user = np.cumsum(chosen) - 1
    indices = np.flatnonzero(chosen[inverse])
    return indices, slot_of_user[inverse[indices]].astype(np.int64)


def _check_rate(q, where):
    if isinstance(q, bool) or not 0 < q <= 1:
        raise ValueError(f"{where}: sample_rate must be in (0, 1], got {q!r}")
