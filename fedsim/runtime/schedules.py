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
  Poisson CLT this extends; for fixed-size batches each step contributes Dong-Roth-Su
  Cor. 5.4's term instead, see :func:`fedsim.privacy.gdp.clt_mu_squared_term`). The CLT is the paper's approximation; the ledger still enforces
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
from fedsim.privacy import calibration as privacy_calibration
from fedsim.privacy.events import GaussianStep, Sampling
from fedsim.privacy.gdp import clt_mu_squared_term

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
    subsampled Gaussian steps under ``accountant`` (:func:`fedsim.privacy.calibration.
    calibrate_sigma`, cached: every client of a group asks the same question)."""
    return privacy_calibration.calibrate_sigma(accountant, sampling, q, steps, epsilon, delta)


def growing_mu0(mu_total: float, q: float, rounds: int, steps_per_round: int, growth: float,
                sampling: Sampling = "poisson") -> float:
    """mu_0 such that the heterogeneous GDP CLT of the schedule mu_t = mu_0 growth^(t/T),
    ``steps_per_round`` steps per round at rate q (:func:`fedsim.privacy.gdp.clt_mu`, Du et al.
    Thm 1 for Poisson; Dong-Roth-Su Cor. 5.4 per step for fixed-size batches) equals mu_total."""

    def excess(mu0: float) -> float:
        steps = [GaussianStep(sampling, q, 1.0 / (mu0 * growth ** (t / rounds)), steps_per_round)
                 for t in range(rounds)]
        return math.sqrt(math.fsum(clt_mu_squared_term(s) for s in steps)) - mu_total

    high = 1.0
    while excess(high) < 0:
        high *= 2.0
        if high > 20:
            raise ConfigError(f"mu_total={mu_total} is too large to calibrate at q={q:.4g}")
    return brentq(excess, 1e-6, high, xtol=1e-12)


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
        mu0 = growing_mu0(noise_config.mu_total, q, horizon, group.local_steps,
                          noise_config.growth, group.sampling)
        noise = NoiseSchedule(1.0 / mu0, noise_config.growth, horizon)
    else:
        raise ConfigError(f"{where}.noise: unsupported noise kind {noise_config!r}")
    return GroupSchedules(clip, noise)
