"""Google's ``dp_accounting``, the reference of the accounting suite: ε of the
Poisson-subsampled Gaussian by its PLD accountant."""


def pld_epsilon():
    """``eps(sigma, q, steps, delta)`` by ``dp_accounting``'s PLD accountant at the
    discretization 1e-4, or None when it is not installed."""
    try:
        import dp_accounting  # optional: the reference, when installed
        from dp_accounting.pld import pld_privacy_accountant
    except ImportError:
        return None

    def eps(sigma, q, steps, delta):
        acct = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        acct.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
        return acct.get_epsilon(delta)

    return eps
