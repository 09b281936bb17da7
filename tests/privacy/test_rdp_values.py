"""RDP curves of single steps against independent high-precision computations (mpmath)."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp

from fedsim.errors import ConfigError
from fedsim.privacy import rdp_conversion
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.rdp import (
    DEFAULT_ORDERS,
    fixed_size_rdp,
    gaussian_rdp,
    history_rdp,
    poisson_rdp,
    step_rdp,
)


def _mp_mixture_rdp(q: float, sigma: float, alpha: float, direction: str) -> float:
    """D_alpha between P = (1-q) N(0, s^2) + q N(1, s^2) and Q = N(0, s^2) by mpmath
    quadrature of the Renyi integral in the original variable z (sensitivity 1, std sigma):
    "remove" is D_alpha(P || Q), "add" is D_alpha(Q || P)."""
    mp.mp.dps = 20
    q_, s_, a_ = mp.mpf(q), mp.mpf(sigma), mp.mpf(alpha)

    def log_mu0(z):
        return -z * z / (2 * s_ * s_) - mp.log(mp.sqrt(2 * mp.pi) * s_)

    def log_mix(z):
        return mp.log((1 - q_) * mp.exp(log_mu0(z)) + q_ * mp.exp(-(z - 1) ** 2 / (2 * s_ * s_))
                      / (mp.sqrt(2 * mp.pi) * s_))

    if direction == "remove":
        def integrand(z):
            return mp.exp(a_ * log_mix(z) + (1 - a_) * log_mu0(z))
    else:
        def integrand(z):
            return mp.exp(a_ * log_mu0(z) + (1 - a_) * log_mix(z))

    z0 = s_ * s_ * mp.log((1 - q_) / q_) + mp.mpf(1) / 2
    breaks = sorted({mp.mpf(0), mp.mpf(1), z0, a_, -40 * s_, a_ + 40 * s_})
    value = mp.quad(integrand, [-mp.inf, *breaks, mp.inf])
    return float(mp.log(value) / (a_ - 1))


POISSON_CASES = [
    (0.05, 0.6, [1.3, 1.5, 7.5]),
    (0.01, 1.0, [1.01, 3.0, 11.5]),
    (0.001, 4.0, [1.4, 32.0]),
    (0.5, 0.8, [2.5]),
]


@pytest.mark.parametrize(("q", "sigma", "orders"), POISSON_CASES)
def test_poisson_rdp_matches_mpmath_quadrature(q: float, sigma: float, orders: list[float]) -> None:
    ours = poisson_rdp(q, sigma, orders)
    for alpha, value in zip(orders, ours, strict=True):
        reference = _mp_mixture_rdp(q, sigma, alpha, "remove")
        assert value == pytest.approx(reference, rel=1e-9), (q, sigma, alpha)


def test_issue_case_q005_sigma06_t10000_eps_is_186() -> None:
    """The issue's "exact 186": eps(delta=1e-5) of q=0.05, sigma=0.6, T=10^4 from the exact
    RDP curve with dp_accounting's conversion (Canonne-Kamath-Steinke Prop. 12), best order
    1.3 - recomputed here from the mpmath Renyi integral at that order."""
    steps, delta, best = 10_000, 1e-5, 1.3
    exact_rdp = steps * _mp_mixture_rdp(0.05, 0.6, best, "remove")
    independent = (exact_rdp + math.log1p(-1 / best)
                   - (math.log(delta) + math.log(best)) / (best - 1))
    curve = history_rdp([GaussianStep("poisson", 0.05, 0.6, steps)], dp_rdp.DEFAULT_RDP_ORDERS)
    eps, order = rdp_conversion.epsilon_improved(dp_rdp.DEFAULT_RDP_ORDERS, curve, delta)
    assert order == best
    assert eps == pytest.approx(independent, rel=1e-9)
    assert round(eps) == 186
    # every order of 1.3 ... 1.5 is present and finite (dp_accounting 0.6.0 drops them)
    low = [1.3, 1.4, 1.5]
    assert np.all(np.isfinite(history_rdp([GaussianStep("poisson", 0.05, 0.6, steps)], low)))


@pytest.mark.parametrize(("q", "sigma", "alpha"), [(0.05, 0.6, 1.5), (0.01, 1.0, 8.5),
                                                   (0.3, 2.0, 3.0)])
def test_remove_direction_dominates_add_direction(q: float, sigma: float, alpha: float) -> None:
    """Mironov-Talwar-Zhang 2019: A_alpha >= B_alpha, so the remove direction is the RDP."""
    ours = poisson_rdp(q, sigma, [alpha])[0]
    assert _mp_mixture_rdp(q, sigma, alpha, "add") <= ours * (1 + 1e-9)


def test_unsampled_gaussian_is_alpha_over_two_sigma_squared() -> None:
    orders = [1.5, 2.0, 10.0, 1024.0]
    for sampling in ("poisson", "fixed"):
        got = step_rdp(GaussianStep(sampling, 1.0, 2.0), orders)
        np.testing.assert_allclose(got, np.array(orders) / 8.0, rtol=1e-15)
    np.testing.assert_allclose(gaussian_rdp(2.0, orders), np.array(orders) / 8.0)


def test_poisson_curve_is_monotone_in_order_and_below_gaussian() -> None:
    """Renyi divergences do not decrease with the order; sampling only helps."""
    for q, sigma in [(0.05, 0.6), (0.004, 1.1), (0.2, 3.0)]:
        curve = poisson_rdp(q, sigma, DEFAULT_ORDERS)
        order = np.argsort(DEFAULT_ORDERS)
        assert np.all(np.diff(curve[order]) >= -1e-12 * curve[order][1:])
        assert np.all(curve <= gaussian_rdp(sigma, DEFAULT_ORDERS))


def test_fixed_size_matches_dp_accounting_where_its_sums_are_stable() -> None:
    """At sigma ~ 1 dp_accounting's Wang-Balle-Kasiviswanathan bound has no cancellation
    problem; ours must agree there (same theorem, different numerics)."""
    orders = [1.5, 2.0, 2.5, 3.0, 10.0, 33.0, 64.0]
    for q, sigma in [(0.01, 1.0), (256 / 60000, 1.1), (0.1, 0.8)]:
        ours = fixed_size_rdp(q, sigma, orders)
        theirs = dp_rdp._compute_rdp_sample_wor_gaussian(q, sigma, orders)
        np.testing.assert_allclose(ours, theirs, rtol=1e-9)


def test_fixed_size_bound_is_above_a_realisable_pair() -> None:
    """Replace-one with sensitivity 2C can swap a zero gradient for one of norm 2C, which
    realises the pair N(0,1) vs (1-q) N(0,1) + q N(1/sigma, 1) in both directions, so any
    valid bound lies above both of its Renyi divergences."""
    for q, sigma, alpha in [(0.05, 0.6, 1.5), (0.2, 5.0, 12.0)]:
        bound = fixed_size_rdp(q, sigma, [alpha])[0]
        assert bound >= _mp_mixture_rdp(q, sigma, alpha, "remove")
        assert bound >= _mp_mixture_rdp(q, sigma, alpha, "add")
        assert bound <= alpha / (2 * sigma**2)


def test_fixed_size_moments_are_exact_for_large_sigma() -> None:
    """E[(L-1)^k] for the Gaussian likelihood ratio, from an exact binomial sum in 400-digit
    arithmetic (where float sums cancel catastrophically), against our quadrature."""
    from fedsim.privacy.rdp import _gaussian_log_even_moments

    sigma = 20.0
    ours = _gaussian_log_even_moments(sigma, 40)
    mp.mp.dps = 400
    mu2 = mp.mpf(1) / sigma**2
    for k in (2, 10, 24, 40):
        exact = sum(mp.binomial(k, i) * (-1) ** (k - i) * mp.exp(i * (i - 1) * mu2 / 2)
                    for i in range(k + 1))
        assert ours[k // 2] == pytest.approx(float(mp.log(exact)), rel=1e-10, abs=1e-10)


def test_bad_inputs_raise_config_errors() -> None:
    with pytest.raises(ConfigError):
        poisson_rdp(0.0, 1.0, [2.0])
    with pytest.raises(ConfigError):
        poisson_rdp(0.1, -1.0, [2.0])
    with pytest.raises(ConfigError):
        fixed_size_rdp(0.1, 1.0, [1.0])
    with pytest.raises(ConfigError):
        history_rdp([], [])
