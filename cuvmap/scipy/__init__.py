"""``jax.scipy``'s functions on cuvmap's primitives: :mod:`cuvmap.scipy.special` and
:mod:`cuvmap.scipy.stats` (``norm``)."""
from cuvmap.scipy import special, stats  # noqa: F401
