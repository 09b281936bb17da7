"""A client group's clipping and noise schedules, built from its scenario section.

The trainer reads ``clip(t)`` and ``sigma(t)`` at ``t = round index``. Kinds:

* clip ``constant``: C_t = C. ``decay`` (sensitivity decay, Du et al., paper 002):
  C_t = C_0 rho_c^{t/T} over the group's T rounds.
* noise ``constant``: sigma_t = sigma. ``target``: the smallest constant sigma such that the
  group's T rounds (each ``local_steps`` DP-SGD steps at q = m/N) are (eps, delta)-DP under the
  group's accountant - found by bisection on the accountant's own eps, so it uses the same
  numerical guarantee the ledger enforces. ``growing_mu`` (paper 002): mu_t = mu_0 g^{t/T},
  sigma_t = 1/mu_t, with mu_0 solved from the heterogeneous GDP CLT
  mu_total = q sqrt(sum_t (e^{mu_t^2} - 1)) (Du et al., Thm 1; Bu et al. 2020 for the
  Poisson CLT this extends). The CLT is the paper's approximation; the ledger still enforces
  the budget with a numerical accountant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from scipy.optimize import brentq

from fedsim.config.schema import (
    ClientGroup,
    ConstantClip,
    ConstantNoise,
    DecayClip,
    GrowingMuNoise,
    TargetNoise,
)
from fedsim.errors import ConfigError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep

__all__ = ["ClipSchedule", "GroupSchedules", "NoiseSchedule", "calibrate_sigma", "make_schedules"]


@dataclass(frozen=True)
class ClipSchedule:
    """C_t = initial * final_ratio^(t / horizon) (constant when final_ratio == 1)."""

    initial: float
    final_ratio: float = 1.0
    horizon: int = 1

    def clip(self, t: int) -> float:
        if self.final_ratio == 1.0:
            return self.initial
        return self.initial * self.final_ratio ** (min(t, self.horizon) / self.horizon)


@dataclass(frozen=True)
class NoiseSchedule:
    """sigma_t = 1 / (mu_0 growth^(t / horizon)); constant sigma when growth == 1."""

    sigma0: float
    growth: float = 1.0
    horizon: int = 1

    def sigma(self, t: int) -> float:
        if self.growth == 1.0:
            return self.sigma0
        return self.sigma0 / self.growth ** (min(t, self.horizon) / self.horizon)


@dataclass(frozen=True)
class GroupSchedules:
    clip: ClipSchedule
    noise: NoiseSchedule


@lru_cache(maxsize=256)
def calibrate_sigma(sampling: str, q: float, steps: int, epsilon: float, delta: float,
                    accountant: str = "pld") -> float:
    """Smallest sigma (to 1e-4 relative) with eps(delta) <= epsilon for ``steps`` identical
    subsampled Gaussian steps under ``accountant``."""

    def eps_at(sigma: float) -> float:
        return make_accountant(accountant, [GaussianStep(sampling, q, sigma, steps)]).epsilon(delta)

    low, high = 0.3, 1.0
    while eps_at(high) > epsilon:
        low, high = high, high * 2.0
        if high > 1e4:
            raise ConfigError(f"no noise multiplier up to 1e4 reaches eps={epsilon} at delta={delta} "
                              f"for {steps} steps at q={q:.4g}")
    while high - low > 1e-4 * high:
        middle = 0.5 * (low + high)
        low, high = (middle, high) if eps_at(middle) > epsilon else (low, middle)
    return high


def growing_mu0(mu_total: float, q: float, rounds: int, steps_per_round: int, growth: float) -> float:
    """mu_0 with q sqrt(sum_t k (e^{mu_t^2} - 1)) = mu_total, mu_t = mu_0 growth^(t/T)."""

    def excess(mu0: float) -> float:
        total = sum(math.expm1((mu0 * growth ** (t / rounds)) ** 2) for t in range(rounds))
        return q * math.sqrt(steps_per_round * total) - mu_total

    high = 1.0
    while excess(high) < 0:
        high *= 2.0
        if high > 64:
            raise ConfigError(f"mu_total={mu_total} is too large to calibrate at q={q:.4g}")
    return brentq(excess, 1e-12, high, xtol=1e-12)


def make_schedules(group: ClientGroup, *, q: float, where: str) -> GroupSchedules:
    """The clip and noise schedules of one client of ``group`` whose batch fraction is ``q``."""
    horizon = group.rounds or 1
    clip_config = group.clip
    if isinstance(clip_config, ConstantClip):
        clip = ClipSchedule(clip_config.value)
    elif isinstance(clip_config, DecayClip):
        clip = ClipSchedule(clip_config.initial, clip_config.final_ratio, horizon)
    else:
        raise ConfigError(f"{where}.clip: unsupported clip kind {clip_config!r}")
    noise_config = group.noise
    if isinstance(noise_config, ConstantNoise):
        noise = NoiseSchedule(noise_config.sigma)
    elif isinstance(noise_config, TargetNoise):
        sigma = calibrate_sigma(group.sampling, round(q, 12), horizon * group.local_steps,
                                noise_config.epsilon, noise_config.delta, group.accountant)
        noise = NoiseSchedule(sigma)
    elif isinstance(noise_config, GrowingMuNoise):
        mu0 = growing_mu0(noise_config.mu_total, q, horizon, group.local_steps, noise_config.growth)
        noise = NoiseSchedule(1.0 / mu0, noise_config.growth, horizon)
    else:
        raise ConfigError(f"{where}.noise: unsupported noise kind {noise_config!r}")
    return GroupSchedules(clip, noise)
