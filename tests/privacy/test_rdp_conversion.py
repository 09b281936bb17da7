"""The optimal RDP -> (eps, delta) conversion (paper 001) against brute force, closed forms
and the exact Gaussian answer."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from fedsim.errors import ConfigError
from fedsim.privacy import rdp_conversion as conv
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.rdp import DEFAULT_ORDERS, history_rdp, max_steps

ORDERS = np.asarray(DEFAULT_ORDERS)


def _brute_force_delta(alpha: float, r: float, eps: float) -> float:
    """max of p - e^eps w over a dense grid of two-point pairs P = (p, 1-p), Q = (w, 1-w)
    with D_alpha(P || Q) <= r: feasible pairs, so a lower bound on the optimal delta."""
    p = np.linspace(1e-6, 1.0, 1500)[:, None]
    w = np.geomspace(1e-9, 1.0, 3000)[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_moment = np.logaddexp(alpha * np.log(p) + (1 - alpha) * np.log(w),
                                  alpha * np.log1p(-p) + (1 - alpha) * np.log1p(-w))
    feasible = log_moment <= (alpha - 1) * r
    return float(np.max(np.where(feasible, p - math.exp(eps) * w, 0.0)))


@pytest.mark.parametrize(("alpha", "r", "eps"), [
    (4.0, 0.5, 1.0),     # interior of the boundary (a > 0)
    (2.0, 1.0, 0.1),     # the a = 0 corner: delta = 1 - e^(eps - r)
    (1.5, 0.05, 0.2),
    (12.0, 0.3, 2.0),
])
def test_optimal_delta_is_tight_against_brute_force(alpha: float, r: float, eps: float) -> None:
    ours = conv.optimal_deltas([alpha], [r], eps)[0]
    brute = _brute_force_delta(alpha, r, eps)
    assert ours >= brute * (1 - 1e-12)
    assert ours <= brute * 1.01 + 1e-6


def _gdp_delta(eps: float, mu: float) -> float:
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


CURVES = {
    "gaussian sigma=1 T=1": ORDERS / 2.0,
    "gaussian sigma=10 T=6": 6 * ORDERS / 200.0,
    "gaussian sigma=5 T=100": 100 * ORDERS / 50.0,
    "poisson q=256/60000 sigma=1.1 T=14063": history_rdp(
        [GaussianStep("poisson", 256 / 60000, 1.1, 14063)], ORDERS),
    "poisson q=0.05 sigma=0.6 T=10^4": history_rdp(
        [GaussianStep("poisson", 0.05, 0.6, 10_000)], ORDERS),
    "fixed q=0.01 sigma=2 T=1000": history_rdp([GaussianStep("fixed", 0.01, 2.0, 1000)], ORDERS),
}


@pytest.mark.parametrize("name", sorted(CURVES))
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-10])
def test_optimal_never_worse_than_closed_forms(name: str, delta: float) -> None:
    curve = CURVES[name]
    optimal, _ = conv.epsilon_optimal(ORDERS, curve, delta)
    improved, _ = conv.epsilon_improved(ORDERS, curve, delta)
    classic, _ = conv.epsilon_classic(ORDERS, curve, delta)
    assert optimal <= improved * (1 + 1e-10) + 1e-12
    assert improved <= classic
    eps = 0.5 * classic
    assert conv.delta_optimal(ORDERS, curve, eps)[0] <= conv.delta_classic(ORDERS, curve, eps)[0]


@pytest.mark.parametrize(("sigma", "steps"), [(1.0, 1), (10.0, 6), (5.0, 100), (2.0, 30)])
def test_optimal_conversion_stays_above_the_exact_gaussian(sigma: float, steps: int) -> None:
    """The Gaussian pair itself has these Renyi divergences at every order, so no valid
    conversion may promise less than its exact delta(eps) (mu-GDP with mu = sqrt(T)/sigma)."""
    curve = steps * ORDERS / (2 * sigma**2)
    mu = math.sqrt(steps) / sigma
    for eps in (0.25, 1.0, 3.0):
        ours = conv.delta_optimal(ORDERS, curve, eps)[0]
        assert ours >= _gdp_delta(eps, mu)
        assert ours <= conv.delta_classic(ORDERS, curve, eps)[0]


def test_epsilon_and_delta_are_inverse() -> None:
    curve = CURVES["poisson q=256/60000 sigma=1.1 T=14063"]
    eps, _ = conv.epsilon_optimal(ORDERS, curve, 1e-5)
    assert conv.delta_optimal(ORDERS, curve, eps)[0] == pytest.approx(1e-5, rel=1e-6)
    assert conv.delta_optimal(ORDERS, curve, eps * 1.01)[0] < 1e-5


def test_theorem3_budget_agrees_with_the_kkt_boundary() -> None:
    """Paper 001's variational formula (Thm 3) and our parametrisation of the boundary are
    two derivations of the same curve."""
    alpha = np.array([1.5, 2.0, 8.0, 32.0, 256.0])
    for eps, delta in [(1.0, 1e-5), (3.0, 1e-8), (0.3, 1e-3)]:
        budget = conv.optimal_rdp_budget(alpha, eps, delta)
        np.testing.assert_allclose(conv.optimal_deltas(alpha, budget, eps), delta, rtol=1e-6)


def _largest_t_exact_gdp(sigma: float, eps: float, delta: float) -> int:
    lo, hi = 0, 1
    while _gdp_delta(eps, math.sqrt(hi) / sigma) <= delta:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _gdp_delta(eps, math.sqrt(mid) / sigma) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


@pytest.mark.parametrize("sigma", [10.0, 20.0, 50.0, 100.0])
def test_optimal_allows_more_rounds_than_classic_but_not_more_than_exact(sigma: float) -> None:
    step = GaussianStep("poisson", 1.0, sigma)
    classic = max_steps(step, 1.0, 1e-5, conversion="classic")
    optimal = max_steps(step, 1.0, 1e-5, conversion="optimal")
    exact = _largest_t_exact_gdp(sigma, 1.0, 1e-5)
    assert classic < optimal <= exact
    # the answers are the largest certified T under each conversion
    curve = ORDERS / (2 * sigma**2)
    assert conv.epsilon_classic(ORDERS, classic * curve, 1e-5)[0] <= 1.0
    assert conv.epsilon_classic(ORDERS, (classic + 1) * curve, 1e-5)[0] > 1.0
    assert conv.delta_optimal(ORDERS, optimal * curve, 1.0)[0] <= 1e-5
    assert conv.delta_optimal(ORDERS, (optimal + 1) * curve, 1.0)[0] > 1e-5


def test_max_steps_for_subsampled_steps_and_hopeless_budgets() -> None:
    step = GaussianStep("poisson", 256 / 60000, 1.1)
    classic = max_steps(step, 2.0, 1e-5, "classic")
    optimal = max_steps(step, 2.0, 1e-5, "optimal")
    assert 0 < classic <= optimal
    assert max_steps(GaussianStep("poisson", 1.0, 0.1), 0.01, 1e-10) == 0
    with pytest.raises(ConfigError):
        max_steps(step, 1.0, 1e-5, conversion="magic")  # type: ignore[arg-type]


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError):
        conv.epsilon_optimal(ORDERS, ORDERS, 0.0)
    with pytest.raises(ConfigError):
        conv.epsilon_optimal(ORDERS, ORDERS, 1.5)
    with pytest.raises(ConfigError):
        conv.delta_optimal(ORDERS, ORDERS, -1.0)
    with pytest.raises(ConfigError):
        conv.epsilon_classic(ORDERS, -ORDERS, 1e-5)
    with pytest.raises(ConfigError):
        conv.epsilon_classic([0.5], [1.0], 1e-5)
    with pytest.raises(ConfigError):
        conv.epsilon_classic([2.0, 3.0], [1.0], 1e-5)


def test_infinite_and_zero_rdp_values() -> None:
    assert conv.epsilon_optimal([2.0, 3.0], [np.inf, np.inf], 1e-5)[0] == math.inf
    assert conv.delta_optimal([2.0, 3.0], [np.inf, 0.0], 0.5)[0] == 0.0
    assert conv.epsilon_optimal([2.0, 3.0], [np.inf, 0.2], 1e-5)[0] < math.inf


@pytest.mark.parametrize(("sampling", "q", "sigma", "steps"), [
    ("poisson", 0.01, 1.0, 2_000), ("fixed", 0.3, 2.5, 40), ("poisson", 1.0, 0.7, 3),
    ("fixed", 1e-3, 4.0, 500)])
def test_deltas_at_many_eps_equal_one_conversion_per_eps(sampling: str, q: float, sigma: float,
                                                         steps: int) -> None:
    """One vectorised solve over every (eps, order) pair gives, to the bit, what
    delta_optimal gives one eps at a time: the Poisson tuning's eps per order, and a spread
    of eps from 0 to far past the curve's, with an infinite and a zero order mixed in."""
    curve = np.asarray(history_rdp([GaussianStep(sampling, q, sigma).times(steps)], ORDERS))
    epsilons = np.concatenate([np.log1p(1 / (ORDERS[::9] - 1)), [0.0, 0.05, 1.0, 7.5, 60.0]])
    each = [conv.delta_optimal(ORDERS, curve, float(e))[0] for e in epsilons]
    assert conv.optimal_deltas_at(ORDERS, curve, epsilons).tolist() == each
    mixed = curve.copy()
    mixed[3] = np.inf
    each = [conv.delta_optimal(ORDERS, mixed, float(e))[0] for e in epsilons]
    assert conv.optimal_deltas_at(ORDERS, mixed, epsilons).tolist() == each
    mixed[7] = 0.0
    assert conv.optimal_deltas_at(ORDERS, mixed, epsilons).tolist() == [0.0] * len(epsilons)
    with pytest.raises(ConfigError):
        conv.optimal_deltas_at(ORDERS, curve, [0.5, -1.0])
