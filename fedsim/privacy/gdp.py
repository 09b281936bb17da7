"""Gaussian differential privacy (Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022).

Pure mu-GDP facts (exact):

* trade-off ``G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)`` (their Def. 2.5);
* mu-GDP holds iff (eps, delta(eps))-DP holds for every eps >= 0 with
  ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` (Cor. 2.13);
* composition ``G_mu1 (x) G_mu2 = G_sqrt(mu1^2 + mu2^2)`` (Cor. 3.3);
* a group of g records: ``G_{g mu}`` (Thm 2.14).

The ``gdp-clt`` accountant is an *approximation* (``is_guarantee = False``): the central limit
theorems below become exact only as T -> infinity with q sqrt(T) fixed, and can under-report
(Opacus' Poisson CLT gives 0.835 / 2.324 / 5.066 for the Dong-Roth-Su MNIST runs where the
tight value is 0.865 / 2.382 / 5.640). It never enforces a budget on its own.

* fixed-size batches, replace-one neighbours, noise ``2 C sigma`` (Dong-Roth-Su Cor. 5.4):
  ``mu = sqrt(2) q sqrt(T) sqrt(e^{sigma^-2} Phi(1.5/sigma) + 3 Phi(-0.5/sigma) - 2)``;
* Poisson batches, add/remove neighbours, noise ``C sigma`` (Bu, Dong, Long & Su, "Deep
  learning with Gaussian differential privacy", HDSR 2020, Thm 2):
  ``mu = q sqrt(T (e^{sigma^-2} - 1))``;
* steps whose noise changes (Du et al., "Dynamic differential-privacy preserving SGD", 2021,
  Thm 1): ``mu = q sqrt(sum_t (e^{mu_t^2} - 1))`` with ``mu_t = 1 / sigma_t``. fedsim applies
  the per-step term of the matching scheme to every step and adds them, which is the same
  formula when q and the scheme are fixed (and lets q vary too: ``q_t^2`` inside the sum).
* an unsampled release (``q = 1``, e.g. a DP data normalisation) is the Gaussian mechanism
  itself, exactly ``G_{1/sigma}`` under either relation (Thm 2.7): its term is ``1/sigma^2``
  (composition, Cor. 3.3), not a CLT term.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy import optimize, special
from scipy.stats import norm

from fedsim.errors import ConfigError, PrivacyError
from fedsim.privacy.accountant import Accountant
from fedsim.privacy.events import GaussianStep

# Largest mu for which eps(delta) is computed: beyond it eps > 5e5 and e^eps is far outside
# double precision (delta(eps) cancels catastrophically).
MAX_MU = 1000.0


def _check_mu(mu: float) -> None:
    if not (isinstance(mu, int | float) and math.isfinite(mu) and mu >= 0):
        raise ConfigError(f"mu must be a finite number >= 0, got {mu!r}")


def gdp_delta(epsilon: float, mu: float) -> float:
    """delta(eps) of mu-GDP (Dong-Roth-Su Cor. 2.13); for eps < 0 the same formula holds."""
    _check_mu(mu)
    if mu == 0:
        return max(0.0, -math.expm1(epsilon))
    a = -epsilon / mu
    value = special.ndtr(a + mu / 2) - math.exp(epsilon + special.log_ndtr(a - mu / 2))
    return float(min(1.0, max(0.0, value)))


def gdp_log_delta(epsilons: np.ndarray, mu: float) -> np.ndarray:
    """``log delta(eps)`` of mu-GDP at many eps >= 0 at once (Dong-Roth-Su Cor. 2.13,
    ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``), in log space so that
    it keeps its relative accuracy where both terms underflow (eps of 10 and more):
    ``log delta = log A + log(1 - e^{log B - log A})`` with ``log A``, ``log B`` from
    ``log_ndtr``. ``-inf`` where delta is 0 (``mu = 0``, eps > 0). The neighbouring relation
    is whatever the mu-GDP statement is made for."""
    _check_mu(mu)
    eps = np.asarray(epsilons, dtype=float)
    if mu == 0:
        with np.errstate(divide="ignore"):
            return np.asarray(np.log(np.maximum(0.0, -np.expm1(eps))), dtype=float)
    log_a = special.log_ndtr(-eps / mu + mu / 2)
    log_b = eps + special.log_ndtr(-eps / mu - mu / 2)
    gap = np.minimum(log_b - log_a, 0.0)  # < 0 in exact arithmetic (delta > 0)
    with np.errstate(divide="ignore"):
        log1mexp = np.where(gap > -math.log(2.0), np.log(-np.expm1(gap)),
                            np.log1p(-np.exp(gap)))
    return np.asarray(log_a + log1mexp, dtype=float)


def gdp_epsilon(delta: float, mu: float) -> float:
    """Smallest eps >= 0 with delta(eps) <= delta under mu-GDP (solved to 1e-12 relative)."""
    _check_mu(mu)
    if not 0 < delta < 1:
        raise ConfigError(f"delta must be in (0, 1), got {delta!r}")
    if mu > MAX_MU:
        raise PrivacyError(
            f"mu = {mu:.3g} is beyond {MAX_MU:g}: eps would exceed mu^2/2 = {mu * mu / 2:.3g} "
            f"(no meaningful privacy); such a release cannot be answered in double precision")
    if gdp_delta(0.0, mu) <= delta:
        return 0.0
    high = max(1.0, mu * mu)
    while gdp_delta(high, mu) > delta:
        high *= 2.0
    return float(optimize.brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, high,
                                 xtol=1e-14, rtol=1e-12))


def gdp_tradeoff(alpha: np.ndarray | float, mu: float) -> np.ndarray:
    """``G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)``."""
    _check_mu(mu)
    alpha = np.clip(np.asarray(alpha, dtype=float), 0.0, 1.0)
    return np.asarray(norm.cdf(norm.ppf(1.0 - alpha) - mu), dtype=float)


def compose_mu(mus: Iterable[float]) -> float:
    """mu of the composition of mu_i-GDP mechanisms: ``sqrt(sum mu_i^2)`` (Cor. 3.3)."""
    values = list(mus)
    for mu in values:
        _check_mu(mu)
    return math.sqrt(sum(mu * mu for mu in values))


def group_mu(mu: float, group_size: int) -> float:
    """mu-GDP for single records gives ``g mu``-GDP for groups of g records (Thm 2.14)."""
    _check_mu(mu)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ConfigError(f"group size must be an integer >= 1, got {group_size!r}")
    return group_size * mu


def clt_mu_squared_term(step: GaussianStep) -> float:
    """One step's contribution to mu^2 under the CLT of its sampling scheme (times count)."""
    inv = 1.0 / (step.sigma * step.sigma)
    if step.q == 1.0:  # the Gaussian mechanism itself: exactly G_{1/sigma}
        return step.count * inv
    if inv > 700:
        return math.inf
    if step.sampling == "poisson":
        per_step = step.q * step.q * math.expm1(inv)
    else:
        s = 1.0 / step.sigma
        per_step = 2.0 * step.q * step.q * (
            math.exp(inv) * norm.cdf(1.5 * s) + 3.0 * norm.cdf(-0.5 * s) - 2.0)
    return step.count * per_step


def clt_mu(steps: Iterable[GaussianStep]) -> float:
    """CLT mu of a history (see the module docstring for the three formulas)."""
    return math.sqrt(sum(clt_mu_squared_term(s) for s in steps))


class GDPCLTAccountant(Accountant):
    """Gaussian-DP by the central limit theorem: an approximation, never a guarantee."""

    name = "gdp-clt"
    is_guarantee = False

    @property
    def mu(self) -> float:
        return clt_mu(self.steps)

    def epsilon(self, delta: float) -> float:
        if not self.steps:
            return 0.0
        return gdp_epsilon(delta, self.mu)

    def delta(self, epsilon: float) -> float:
        return gdp_delta(epsilon, self.mu)

    def tradeoff(self, alpha: np.ndarray) -> np.ndarray:
        return gdp_tradeoff(alpha, self.mu)
