"""The Renyi DP of private hyperparameter tuning (Papernot & Steinke, "Hyperparameter Tuning
with Renyi Differential Privacy", ICLR 2022; arXiv:2110.03620v2).

The tuned mechanism A runs a base mechanism Q (one training run with a candidate drawn from a
public prior) K times, K random, and releases only the best run (its candidate and result).
If Q is (lambda, eps(lambda))-RDP for every order in a grid, A's RDP is:

* K truncated negative binomial ``D_{eta, gamma}`` (their Definition 1: ``P[K = k] =
  (1-gamma)^k / (gamma^-eta - 1) prod_{l=0}^{k-1} (l + eta)/(l + 1)`` for k >= 1, eta > -1,
  gamma in (0, 1); eta = 0 the logarithmic distribution ``(1-gamma)^k / (k log(1/gamma))``,
  eta = 1 the geometric) - their **Theorem 2**::

      eps'(lambda) = eps(lambda) + (1 + eta) (1 - 1/lambda_hat) eps(lambda_hat)
                     + (1 + eta) log(1/gamma) / lambda_hat + log(E[K]) / (lambda - 1)

  for every lambda > 1 and lambda_hat >= 1; fedsim takes the best lambda_hat of the grid
  (orders > 1) and ``E[K] = eta (1 - gamma) / (gamma (1 - gamma^eta))`` (``(1/gamma - 1) /
  log(1/gamma)`` at eta = 0).
* K ~ Poisson(mu) - their **Theorem 6**: if Q is also (eps_hat, delta_hat)-DP with
  ``e^{eps_hat} <= 1 + 1/(lambda - 1)``, then ``eps'(lambda) = eps(lambda) + mu delta_hat +
  log(mu) / (lambda - 1)``; fedsim uses ``eps_hat = log(1 + 1/(lambda - 1))`` and delta_hat from
  Q's own RDP curve by the optimal conversion (:mod:`fedsim.privacy.rdp_conversion`).

Finally RDP is monotone in the order, so each order gets the smallest bound among the orders
at or above it. The neighbouring relation is the base mechanism's (add/remove for Poisson
sampling, replace-one for fixed-size batches): the theorems hold per ordered pair. A run with
K = 0 (Poisson) releases nothing; the truncated negative binomial never draws 0.

Base mechanism: when every trial draws its candidate from a fixed public list, Q is a mixture
of the candidates' runs, and Renyi divergence is jointly quasi-convex (van Erven & Harremoes
2014, Thm 13), so ``eps(lambda) = max_c eps_c(lambda)`` over the candidates is a valid curve
for Q (:func:`base_rdp`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from fedsim.errors import ConfigError
from fedsim.privacy.rdp_conversion import epsilon_optimal, optimal_deltas_at


@dataclass(frozen=True, slots=True)
class TruncatedNegativeBinomial:
    """``D_{eta, gamma}`` of Papernot & Steinke, Definition 1 (support k = 1, 2, ...)."""

    eta: float
    gamma: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.eta) and self.eta > -1):
            raise ConfigError(f"eta must be a finite number > -1, got {self.eta!r}")
        if not (0 < self.gamma < 1):
            raise ConfigError(f"gamma must be in (0, 1), got {self.gamma!r}")

    @property
    def mean(self) -> float:
        g, eta = self.gamma, self.eta
        if eta == 0:
            return (1 / g - 1) / math.log(1 / g)
        return eta * (1 - g) / (g * (1 - g ** eta))

    def pmf(self, k: np.ndarray) -> np.ndarray:
        """``P[K = k]`` for integers k >= 1 (computed in log space)."""
        k = np.asarray(k, dtype=float)
        g, eta = self.gamma, self.eta
        if eta == 0:
            log_p = k * math.log1p(-g) - np.log(k) - math.log(math.log(1 / g))
        else:
            # prod_{l<k} (l + eta)/(l + 1) = eta Gamma(k + eta) / (Gamma(1 + eta) k!); its sign
            # (negative for eta < 0) cancels that of gamma^-eta - 1
            log_ratio = (math.log(abs(eta)) + special.gammaln(k + eta)
                         - special.gammaln(1 + eta) - special.gammaln(k + 1))
            log_p = k * math.log1p(-g) + log_ratio - math.log(abs(g ** -eta - 1))
        return np.asarray(np.exp(log_p), dtype=float)

    @classmethod
    def with_mean(cls, eta: float, mean: float) -> TruncatedNegativeBinomial:
        """The ``D_{eta, gamma}`` with ``E[K] = mean`` (> 1); gamma by root finding."""
        if not (math.isfinite(mean) and mean > 1):
            raise ConfigError(f"the mean number of trials must be > 1, got {mean!r}")

        def gap(log_gamma: float) -> float:
            return math.log(cls(eta, math.exp(log_gamma)).mean) - math.log(mean)

        low = -1.0
        while gap(low) < 0:
            low *= 2
            if low < -700:
                raise ConfigError(f"no gamma gives mean {mean!r} for eta {eta!r}")
        high = math.log(1 - 1e-12)
        return cls(eta, math.exp(optimize.brentq(gap, low, high, xtol=1e-15, rtol=1e-14)))


@dataclass(frozen=True, slots=True)
class PoissonTrials:
    """K ~ Poisson(mu) (Papernot & Steinke, Theorem 6)."""

    mu: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mu) and self.mu >= 1):
            # below 1 most tunings release nothing, and log(mu) < 0 would report less than one
            # trial's own eps
            raise ConfigError(f"mu (the mean number of trials) must be >= 1, got {self.mu!r}")

    @property
    def mean(self) -> float:
        return self.mu


TrialDistribution = TruncatedNegativeBinomial | PoissonTrials


def _orders_and_curve(orders: Sequence[float] | np.ndarray,
                      rdp: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    alpha = np.asarray(orders, dtype=float)
    curve = np.asarray(rdp, dtype=float)
    if alpha.ndim != 1 or alpha.shape != curve.shape or alpha.size == 0:
        raise ConfigError("orders and rdp must be 1-d arrays of the same, non-zero length")
    if np.any(alpha <= 1) or np.any(np.diff(alpha) <= 0):
        raise ConfigError("orders must be increasing and > 1")
    if np.any(np.isnan(curve)) or np.any(curve < 0):
        raise ConfigError("rdp values must be >= 0 (inf allowed)")
    return alpha, curve


def base_rdp(curves: Sequence[Sequence[float] | np.ndarray]) -> np.ndarray:
    """RDP of one trial whose candidate is drawn from a public list: the pointwise maximum of
    the candidates' curves (joint quasi-convexity of Renyi divergence)."""
    if not curves:
        raise ConfigError("no candidate curves")
    return np.asarray(np.max(np.vstack([np.asarray(c, dtype=float) for c in curves]), axis=0),
                      dtype=float)


def tuned_rdp(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
              trials: TrialDistribution) -> np.ndarray:
    """RDP of releasing the best of K runs of a mechanism with curve ``rdp`` at ``orders``
    (Papernot & Steinke Thm 2 for the truncated negative binomial, Thm 6 for Poisson; see the
    module docstring). Neighbouring relation: the base mechanism's."""
    alpha, curve = _orders_and_curve(orders, rdp)
    if isinstance(trials, TruncatedNegativeBinomial):
        eta, gamma = trials.eta, trials.gamma
        with np.errstate(invalid="ignore"):
            hat = (1 + eta) * ((1 - 1 / alpha) * curve + math.log(1 / gamma) / alpha)
        constant = float(np.nanmin(hat))
        out = curve + constant + math.log(trials.mean) / (alpha - 1)
    elif isinstance(trials, PoissonTrials):
        # Theorem 6 at order lam: the base curve's delta at eps_hat = log(1 + 1/(lam - 1)),
        # one eps per order, all solved at once (optimal_deltas_at).
        # (Rounded down: a smaller eps_hat only raises delta_hat, as the theorem allows.)
        eps_hat = np.nextafter(np.log1p(1 / (alpha - 1)), 0.0)
        finite = np.isfinite(curve)
        delta_hat = optimal_deltas_at(alpha[finite], curve[finite], eps_hat) \
            if np.any(finite) else np.ones_like(alpha)
        out = curve + trials.mu * delta_hat + math.log(trials.mu) / (alpha - 1)
    else:
        raise ConfigError(f"unknown trial distribution {trials!r}")
    # monotone in the order: an order inherits the best bound of any larger order
    return np.asarray(np.minimum.accumulate(out[::-1])[::-1], dtype=float)


def tuned_epsilon(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
                  trials: TrialDistribution, delta: float) -> float:
    """eps(delta) of the tuned mechanism: :func:`tuned_rdp` converted by the optimal
    RDP -> DP conversion (Asoodeh et al. 2021, :func:`fedsim.privacy.rdp_conversion.
    epsilon_optimal`)."""
    alpha = np.asarray(orders, dtype=float)
    curve = tuned_rdp(alpha, rdp, trials)
    finite = np.isfinite(curve)
    if not np.any(finite):
        return math.inf
    return epsilon_optimal(alpha[finite], curve[finite], delta)[0]


def trials_of(distribution: str, parameters: Sequence[float]) -> TrialDistribution:
    """The distribution of K named by a :class:`fedsim.privacy.events.TunedSelection`:
    ``"negative_binomial"`` with (eta, gamma), ``"poisson"`` with (mu,)."""
    values = tuple(float(p) for p in parameters)
    if distribution == "negative_binomial" and len(values) == 2:
        return TruncatedNegativeBinomial(*values)
    if distribution == "poisson" and len(values) == 1:
        return PoissonTrials(*values)
    raise ConfigError(f"unknown trial distribution {distribution!r} with parameters {values!r}")
