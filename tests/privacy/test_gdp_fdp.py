"""GDP closed forms, the CLT accountant and the f-DP views."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import gaussian_mechanism

from fedsim.errors import ConfigError
from fedsim.privacy import fdp, gdp
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.gdp import GDPCLTAccountant
from fedsim.privacy.pld import PLDAccountant

N, M, DELTA = 60_000, 256, 1e-5
RUNS = {"A": (15, 1.3), "B": (60, 1.1), "C": (45, 0.7)}
PAPER_MU = {"A": 0.285, "B": 0.737, "C": 1.554}  # Dong-Roth-Su Fig. 7 (Cor. 5.4)
PAPER_EPS = {"A": 1.07, "B": 3.09, "C": 7.35}
OPACUS_POISSON_CLT = {"A": 0.835, "B": 2.324, "C": 5.066}  # issue 2


@pytest.mark.parametrize("run", sorted(RUNS))
def test_cor_5_4_reproduces_the_paper(run: str) -> None:
    epochs, sigma = RUNS[run]
    accountant = GDPCLTAccountant([GaussianStep("fixed", M / N, sigma, math.ceil(epochs * N / M))])
    assert round(accountant.mu, 3) == PAPER_MU[run]
    assert round(accountant.epsilon(DELTA), 2) == PAPER_EPS[run]
    assert not accountant.is_guarantee


@pytest.mark.parametrize("run", sorted(RUNS))
def test_poisson_clt_matches_opacus_and_under_reports(run: str) -> None:
    epochs, sigma = RUNS[run]
    step = GaussianStep("poisson", M / N, sigma, math.ceil(epochs * N / M))
    clt = GDPCLTAccountant([step]).epsilon(DELTA)
    assert round(clt, 3) == pytest.approx(OPACUS_POISSON_CLT[run], abs=1.5e-3)
    assert clt < PLDAccountant([step]).epsilon(DELTA)  # why it never enforces a budget


def test_heterogeneous_clt_is_du_et_al() -> None:
    sigmas = [1.0, 1.5, 2.0, 0.9]
    steps = [GaussianStep("poisson", 0.02, s) for s in sigmas]
    expected = 0.02 * math.sqrt(sum(math.expm1(s**-2) for s in sigmas))
    assert gdp.clt_mu(steps) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("mu", [0.1, 0.5, 1.0, 3.0])
def test_gdp_epsilon_agrees_with_the_analytic_gaussian_mechanism(mu: float) -> None:
    # mu-GDP is the Gaussian mechanism with sigma = 1/mu (Balle & Wang 2018 in dp_accounting)
    assert gdp.gdp_epsilon(DELTA, mu) == pytest.approx(
        gaussian_mechanism.get_epsilon_gaussian(1.0 / mu, DELTA), rel=1e-8)
    eps = gdp.gdp_epsilon(DELTA, mu)
    assert gdp.gdp_delta(eps, mu) == pytest.approx(DELTA, rel=1e-8)


def test_composition_and_group() -> None:
    assert gdp.compose_mu([0.3, 0.4]) == pytest.approx(0.5)
    assert gdp.group_mu(0.5, 3) == 1.5
    with pytest.raises(ConfigError):
        gdp.group_mu(0.5, 0)
    with pytest.raises(ConfigError):
        gdp.gdp_epsilon(1.5, 0.5)


def test_fit_lies_below_the_pld_curve_and_dominates_the_point_estimate() -> None:
    accountant = PLDAccountant([GaussianStep("poisson", 0.01, 1.0, 1000)])
    alphas, betas = fdp.tradeoff_curve(accountant)
    mu = fdp.fit_gdp_mu_accountant(accountant, 1e-12)
    # below the trade-off curve wherever the grid's alphas reach (deltas above the floor)
    assert np.all(gdp.gdp_tradeoff(alphas[alphas >= 1e-9], mu)
                  <= betas[alphas >= 1e-9] + 1e-9)
    assert fdp.gdp_mu_at_point(accountant.epsilon(DELTA), DELTA) <= mu


def test_group_privacy_of_a_gaussian_curve_is_g_mu() -> None:
    alphas = fdp.default_alphas(20001)
    grouped = fdp.group_tradeoff(alphas, gdp.gdp_tradeoff(alphas, 0.5), 3)
    exact = gdp.gdp_tradeoff(alphas, 1.5)
    assert np.all(grouped <= exact + 1e-12)  # a lower bound (rounding up between grid points)
    eps = fdp.epsilon_from_tradeoff(alphas, grouped, DELTA)
    assert gdp.gdp_epsilon(DELTA, 1.5) <= eps <= gdp.gdp_epsilon(DELTA, 1.5) * 1.02


def test_conversion_from_a_curve_is_conservative() -> None:
    accountant = PLDAccountant([GaussianStep("fixed", 0.01, 1.2, 2000)])
    alphas, betas = fdp.tradeoff_curve(accountant, fdp.default_alphas(20001))
    eps = fdp.epsilon_from_tradeoff(alphas, betas, DELTA)
    assert accountant.epsilon(DELTA) <= eps <= accountant.epsilon(DELTA) * 1.02
