"""Group privacy answers stay guarantees and are finite where the truth is.

A group's curve 1 - (1 - f)^{o g} (Dong, Roth & Su, Thm 2.14) reaches type I errors far below
1e-15, where a curve's 1 - f computed from f near 1 keeps no digits: the PLD's 1 - f(0) is its
truncated tail (about 1e-15) and RDP's curve was floored at 1e-12, and a group of 8 amplified
either past delta = 1e-5 (eps = inf for q = 0.01, sigma = 1, 1,000 steps: an attacker's review).
The group is now also composed on 1 - f itself from the RDP curve (exact at small alpha).

Independent reference: T steps of the Gaussian mechanism (q = 1, noise sigma) are exactly
sqrt(T)/sigma-GDP, and a group of g is exactly g sqrt(T)/sigma-GDP (sensitivity g), whose eps
and delta are closed forms (Dong, Roth & Su, Cor. 2.13).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from fedsim.privacy import fdp, gdp
from fedsim.privacy.answers import account
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.rdp import RDPAccountant, history_rdp

GROUP_ALPHAS = np.unique(np.concatenate([fdp.default_alphas(20001),
                                         np.logspace(-300.0, -9.0, 6000)]))


@pytest.mark.parametrize(("sigma", "steps"), [(0.8, 1), (2.0, 10), (8.0, 100)])
def test_the_rdp_complement_bounds_the_gaussian_curve_down_to_the_smallest_alphas(
        sigma: float, steps: int) -> None:
    mu = math.sqrt(steps) / sigma
    complement = RDPAccountant([GaussianStep("poisson", 1.0, sigma, steps)]).tradeoff_complement(
        GROUP_ALPHAS)
    exact = norm.cdf(mu + norm.ppf(GROUP_ALPHAS))  # 1 - G_mu(alpha), accurate at tiny alpha
    assert np.all(complement >= exact * (1 - 1e-9))  # an upper bound everywhere
    assert complement[0] == 0.0  # alpha = 0: f(0) = 1 exactly
    tiny = GROUP_ALPHAS < 1e-200
    assert np.all(complement[tiny] < 1e-150)  # not floored: the old curve's 1 - f was >= 1e-12
    no_release = RDPAccountant().tradeoff_complement(GROUP_ALPHAS)
    np.testing.assert_array_equal(no_release, GROUP_ALPHAS)


def test_the_group_rule_on_the_complement_is_the_group_rule_on_the_curve() -> None:
    betas = gdp.gdp_tradeoff(GROUP_ALPHAS, 0.7)
    for g in (1, 2, 5):
        np.testing.assert_array_equal(
            fdp.group_tradeoff(GROUP_ALPHAS, betas, g),
            np.clip(1.0 - fdp.group_complement(GROUP_ALPHAS, 1.0 - betas, g), 0.0, 1.0))
    assert fdp.delta_from_tradeoff(GROUP_ALPHAS, betas, 1.0) == fdp.delta_from_complement(
        GROUP_ALPHAS, 1.0 - betas, 1.0)


CASES = [(0.8, 1, 3), (1.0, 1, 8), (1.0, 10, 2), (2.0, 1, 5), (2.0, 10, 3), (4.0, 10, 8),
         (8.0, 100, 2), (8.0, 1, 8)]


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
@pytest.mark.parametrize(("sigma", "steps", "group"), CASES)
def test_a_groups_eps_is_never_below_the_exact_gaussian_and_finite_where_it_is(
        accountant: str, sigma: float, steps: int, group: int) -> None:
    mu = group * math.sqrt(steps) / sigma
    for delta in (1e-5, 1e-9):
        exact = gdp.gdp_epsilon(delta, mu)
        answer = account(q=1.0, sigma=sigma, steps=steps, delta=delta, accountant=accountant,
                         group_size=group)
        # before: inf in 12 of these 32 (each exact eps below 80)
        assert exact <= answer.epsilon <= 1.15 * exact + 1e-3, (delta, exact, answer.epsilon)
        # q = 1: the mixture is N(g, sigma^2) against N(0, sigma^2), exact up to its grid
        assert answer.bound in (("pld", "rdp", "pld+rdp", "mixture") if accountant == "pld"
                                else ("rdp",))
        if answer.bound == "mixture":
            assert answer.epsilon <= 1.01 * exact + 1e-3
    # delta at an eps: never below the exact
    eps = gdp.gdp_epsilon(1e-6, mu)
    delta_answer = account(q=1.0, sigma=sigma, steps=steps, epsilon=eps, accountant=accountant,
                           group_size=group)
    assert gdp.gdp_delta(eps, mu) * (1 - 1e-6) <= delta_answer.delta < 1e-3


def test_the_attackers_group_of_eight_is_answered() -> None:
    answers = [account(q=0.01, sigma=1.0, steps=1000, group_size=g) for g in (1, 2, 4, 8)]
    epsilons = [a.epsilon for a in answers]
    assert all(math.isfinite(e) for e in epsilons)
    assert epsilons == sorted(epsilons) and epsilons[-1] < 40  # inf before
    # every group's answer is the tight mixture bound's (tests/privacy/test_group_mixture.py):
    # 3.98 at g = 2 where the PLD curve's generic group bound was 4.09, 20.9 at g = 8 where
    # the best generic one (pld+rdp) was 31.6 and the PLD's curve alone inf
    assert [a.bound for a in answers[1:]] == ["mixture"] * 3
    assert answers[1].epsilon == pytest.approx(3.98, abs=0.01)
    assert answers[-1].epsilon == pytest.approx(20.90, abs=0.03)
    # and far below RDP's own group property (Mironov 2017, Prop. 2: a group of 2^c is
    # (a / 2^c, 3^c r(a))-RDP), the generic finite answer: 26,429 here
    orders = np.linspace(1.5, 64.0, 400)
    steps = [GaussianStep("poisson", 0.01, 1.0, 1000)]
    mironov = np.min(27 * history_rdp(steps, 8 * orders) + math.log(1e5) / (orders - 1))
    assert epsilons[-1] < mironov / 100


def test_a_target_eps_for_a_group_is_met_by_the_group() -> None:
    """Before, --target-epsilon 8 --group-size 4 answered the sigma that gives one record
    eps 8 (0.586), whose group of 4 has eps 86."""
    found = account(q=0.01, steps=1000, target_epsilon=8.0, group_size=4)
    assert found.sigma is not None and found.sigma > 1.0  # one record's: 0.586
    at = account(q=0.01, steps=1000, sigma=found.sigma, group_size=4)
    assert at.epsilon <= 8.0
    below = account(q=0.01, steps=1000, sigma=found.sigma * (1 - 3e-3), group_size=4)
    assert below.epsilon > 8.0  # the smallest such sigma, to the group tolerance


@pytest.mark.slow
def test_a_groups_calibrated_gaussian_noise_is_never_below_the_exact() -> None:
    """q = 1: the exact group of g is g sqrt(T)/sigma-GDP, so the sigma that meets eps for it
    is g sqrt(T) / mu(eps, delta) with mu the GDP mu of (eps, delta)."""
    group, steps, target = 3, 10, 6.0
    low, high = 1e-3, 50.0  # mu with gdp_epsilon(1e-5, mu) = target, by bisection
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if gdp.gdp_epsilon(1e-5, middle) <= target else (low, middle)
    exact_sigma = group * math.sqrt(steps) / low
    for accountant in ("pld", "rdp"):
        found = account(q=1.0, steps=steps, target_epsilon=target, group_size=group,
                        accountant=accountant)
        assert found.sigma is not None
        assert exact_sigma * (1 - 1e-6) <= found.sigma <= 1.1 * exact_sigma, accountant


@pytest.mark.slow
def test_the_most_steps_for_a_group_are_the_groups() -> None:
    """Before, --max-steps --group-size 4 answered one record's 15,574 steps."""
    found = account(q=0.01, sigma=1.0, target_epsilon=8.0, max_steps=True, group_size=4)
    assert 100 < found.steps < 15_574
    assert account(q=0.01, sigma=1.0, steps=found.steps, group_size=4).epsilon <= 8.0
    assert account(q=0.01, sigma=1.0, steps=found.steps + 1, group_size=4).epsilon > 8.0
