"""``jax.scipy.stats``'s distributions: :mod:`cuvmap.scipy.stats.norm`."""
from cuvmap.scipy.stats import norm  # noqa: F401
