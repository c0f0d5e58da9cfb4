"""The accountants and the DP plan at their edges (issue 34, items 5-10): fractional step
counts never under-counted, the calibration where ε reaches 0 or the PLD grid cannot
follow, infinite noise, counts that are not numbers, NumPy integers, infinite batch sizes;
clipped sums that were transformed or reduced over an axis; the plan's warnings.

References: the accountants' own compositions (T·ε_α for RDP; whole steps for PLD), and
closed forms (infinite noise loses nothing: ε = 0, as Opacus reports)."""
import math
import warnings

import numpy as np
import pytest

from cuvmap import dp

SIGMA, Q, DELTA = 1.1, 0.01, 1e-5


# ---------------------------------------------------------------------------------------
# 5. fractional steps
# ---------------------------------------------------------------------------------------


def test_the_rdp_accountant_composes_fractional_steps_exactly():
    acct = dp.RDPAccountant()
    acct.step(SIGMA, Q, num_steps=2.5)
    want = dp.rdp_sampled_gaussian(Q, SIGMA, acct.orders, steps=2.5)
    np.testing.assert_allclose(acct.get_rdp(), want, rtol=1e-14)
    two = dp.RDPAccountant()
    two.step(SIGMA, Q, num_steps=2)
    assert acct.get_epsilon(DELTA) > two.get_epsilon(DELTA)
    assert acct.num_steps == 2.5 and len(acct) == 3      # (len: whole steps, rounded up)
    acct.step(SIGMA, Q, num_steps=0.5)                    # merged: 3 steps exactly
    three = dp.RDPAccountant()
    three.step(SIGMA, Q, num_steps=3)
    assert acct.num_steps == 3 and acct.get_epsilon(DELTA) == pytest.approx(three.get_epsilon(DELTA), rel=1e-12)


def test_the_pld_accountant_rounds_fractional_steps_up_and_says_so():
    acct = dp.PLDAccountant(discretization=1e-3)
    with pytest.warns(RuntimeWarning, match=r"composes whole steps: num_steps=2.5 is counted as 3"):
        acct.step(SIGMA, Q, num_steps=2.5)
    three = dp.PLDAccountant(discretization=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        three.step(SIGMA, Q, num_steps=3.0)               # a whole float: no warning
    assert len(acct) == 3 and acct.get_epsilon(DELTA) == three.get_epsilon(DELTA)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_calibrate_noise_meets_the_target_for_fractional_steps(accountant):
    """σ for 10.5 steps meets the target at 10.5 steps (RDP, exactly) or 11 (PLD), and is
    the smallest that does, to rtol; truncating to 10 steps (5% fewer) would not meet it."""
    target, h = 1.0, 1e-3
    if accountant == "pld":
        with pytest.warns(RuntimeWarning, match="counted as 11"):
            sigma = dp.calibrate_noise(target, DELTA, 0.05, 10.5, accountant, discretization=h)
        assert sigma == dp.calibrate_noise(target, DELTA, 0.05, 11, accountant, discretization=h)

        def eps(s):
            acct = dp.PLDAccountant(discretization=h)
            acct.step(s, 0.05, 11)
            return acct.get_epsilon(DELTA)
    else:
        sigma = dp.calibrate_noise(target, DELTA, 0.05, 10.5, accountant)

        def eps(s):  # (the composition itself, not the accountant under test)
            orders = dp.DEFAULT_ORDERS
            return dp.rdp_to_epsilon(orders, dp.rdp_sampled_gaussian(0.05, s, orders, steps=10.5), DELTA)[0]
    assert eps(sigma) <= target < eps(sigma / (1 + 1e-3))
