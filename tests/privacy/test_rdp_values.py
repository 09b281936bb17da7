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
    (0.001, 5.0, [100.5]),
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


def _mp_symmetrised_tradeoff_rdp(q: float, sigma: float, alpha: float) -> float:
    """Renyi divergence of the canonical pair of f = C_q(G_mu), (1/(a-1)) log int_0^1 |f'|^a,
    with mpmath, piece by piece: f = f_q on [0, x*] (x* = Phi(-mu/2), where f_q' = -1), a
    segment of slope -1 from x* to f_q(x*), then f_q^{-1}, whose |f'|^a integrates to
    int_0^{x*} |f_q'|^{1-a} (substitute y = f_q(x)). The two curved pieces are integrated in
    z = Phi^{-1}(1 - x), where -f_q'(x) = 1 - q + q exp(mu z - mu^2/2) and dx = phi(z) dz."""
    mp.mp.dps = 25
    q_, mu, a_ = mp.mpf(q), 1 / mp.mpf(sigma), mp.mpf(alpha)

    def curved(power):
        return mp.quad(lambda z: (1 - q_ + q_ * mp.exp(mu * z - mu * mu / 2)) ** power
                       * mp.npdf(z), [mu / 2, mu, 3 * mu, a_ * mu, a_ * mu + 10, mp.inf])

    x_star = mp.ncdf(-mu / 2)
    # G_mu(x) = Phi(Phi^{-1}(1 - x) - mu), Id(x) = 1 - x, f_q = q G_mu + (1 - q) Id
    gauss_at_x_star = mp.ncdf(mp.sqrt(2) * mp.erfinv(1 - 2 * x_star) - mu)
    f_q_star = q_ * gauss_at_x_star + (1 - q_) * (1 - x_star)
    return float(mp.log(curved(a_) + (f_q_star - x_star) + curved(1 - a_)) / (a_ - 1))


@pytest.mark.parametrize(("q", "sigma", "alpha"), [(0.01, 1.0, 2.0), (256 / 60000, 1.1, 3.5),
                                                   (0.2, 2.0, 1.5), (0.05, 0.8, 6.0),
                                                   (0.001, 20.0, 1024.0), (0.001, 5.0, 100.5)])
def test_fixed_size_rdp_matches_the_tradeoff_integral(q: float, sigma: float, alpha: float) -> None:
    assert fixed_size_rdp(q, sigma, [alpha])[0] == pytest.approx(
        _mp_symmetrised_tradeoff_rdp(q, sigma, alpha), rel=1e-8)


def test_fixed_size_is_tighter_than_wang_balle_kasiviswanathan() -> None:
    """Both bound the same quantity; the exact divergence of the tight f-DP curve may not
    exceed dp_accounting's implementation of the WBK bound (sigma ~ 1, where it is stable)."""
    orders = [1.5, 2.0, 2.5, 3.0, 10.0, 33.0, 64.0]
    for q, sigma in [(0.01, 1.0), (256 / 60000, 1.1), (0.1, 0.8)]:
        ours = fixed_size_rdp(q, sigma, orders)
        theirs = dp_rdp._compute_rdp_sample_wor_gaussian(q, sigma, orders)
        assert np.all(ours <= theirs * (1 + 1e-12))


def test_fixed_size_bound_is_above_a_realisable_pair() -> None:
    """Replace-one with sensitivity 2C can swap a zero gradient for one of norm 2C, which
    realises the pair N(0,1) vs (1-q) N(0,1) + q N(1/sigma, 1) in both directions, so any
    valid bound lies above both of its Renyi divergences."""
    for q, sigma, alpha in [(0.05, 0.6, 1.5), (0.2, 5.0, 12.0)]:
        bound = fixed_size_rdp(q, sigma, [alpha])[0]
        assert bound >= _mp_mixture_rdp(q, sigma, alpha, "remove")
        assert bound >= _mp_mixture_rdp(q, sigma, alpha, "add")
        assert bound <= alpha / (2 * sigma**2)


def test_bad_inputs_raise_config_errors() -> None:
    with pytest.raises(ConfigError):
        poisson_rdp(0.0, 1.0, [2.0])
    with pytest.raises(ConfigError):
        poisson_rdp(0.1, -1.0, [2.0])
    with pytest.raises(ConfigError):
        fixed_size_rdp(0.1, 1.0, [1.0])
    with pytest.raises(ConfigError):
        history_rdp([], [])
