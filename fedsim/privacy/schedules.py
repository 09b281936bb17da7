"""Noise and clipping schedules for DP-SGD (pure; the training code reads them).

A schedule fixes, for every step t = 0 .. T-1, the clipping norm ``clip(t) = C_t`` and the
noise multiplier ``sigma(t) = sigma_t`` (noise std divided by the sensitivity: ``C_t sigma_t``
for Poisson batches, ``2 C_t sigma_t`` for fixed-size batches; see
:mod:`fedsim.privacy.events`). Privacy depends on the multipliers only: clipping changes what
is released, not how private it is. ``steps(sampling, q)`` gives the
:class:`~fedsim.privacy.events.GaussianStep` s the whole schedule consumes.

Shapes (Du et al., "Dynamic differential-privacy preserving SGD", 2021, Alg. 2):

* constant: ``C_t = C_0``, ``sigma_t = sigma_0``;
* sensitivity decay: ``C_t = C_0 rho_c^{t/T}`` with ``0 < rho_c <= 1``;
* growing mu: ``mu_t = 1/sigma_t = mu_0 rho_mu^{t/T}`` with ``rho_mu >= 1`` (noise shrinks
  as training converges). :func:`solve_growing_mu` picks ``mu_0`` so that the composed budget
  meets a target (eps, delta) under a chosen accountant.

Usage::

    schedule = solve_growing_mu(epsilon=2.0, delta=1e-5, total_steps=1000, rho_mu=2.0,
                                sampling="poisson", q=0.01, clip_0=1.0, rho_c=0.5)
    for t in range(schedule.total_steps):
        C, sigma = schedule.clip(t), schedule.sigma(t)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsim.errors import ConfigError, PrivacyError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep, Sampling, group_steps
from fedsim.privacy.gdp import clt_mu_squared_term, gdp_epsilon


@dataclass(frozen=True, slots=True)
class Schedule:
    """``C_t = clip_0 rho_c^{t/T}``, ``1/sigma_t = (1/sigma_0) rho_mu^{t/T}``, t = 0..T-1.

    ``rho_c = rho_mu = 1`` is the constant schedule.
    """

    total_steps: int
    sigma_0: float
    clip_0: float = 1.0
    rho_mu: float = 1.0
    rho_c: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.total_steps, bool) or not isinstance(self.total_steps, int) \
                or self.total_steps < 1:
            raise ConfigError(f"total_steps must be an integer >= 1, got {self.total_steps!r}")
        for name in ("sigma_0", "clip_0", "rho_mu", "rho_c"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
        if self.rho_c > 1:
            raise ConfigError(f"rho_c must be in (0, 1] (sensitivity decay), got {self.rho_c!r}")
        if self.rho_mu < 1:
            raise ConfigError(f"rho_mu must be >= 1 (growing mu), got {self.rho_mu!r}")

    def _check(self, t: int) -> None:
        if not 0 <= t < self.total_steps:
            raise ConfigError(f"step {t} outside 0..{self.total_steps - 1}")

    def sigma(self, t: int) -> float:
        """Noise multiplier of step t."""
        self._check(t)
        return self.sigma_0 * self.rho_mu ** (-t / self.total_steps)

    def mu(self, t: int) -> float:
        """``1 / sigma(t)``, the GDP parameter of the unsampled step."""
        return 1.0 / self.sigma(t)

    def clip(self, t: int) -> float:
        """Clipping norm of step t."""
        self._check(t)
        return self.clip_0 * self.rho_c ** (t / self.total_steps)

    def sigmas(self) -> list[float]:
        return [self.sigma(t) for t in range(self.total_steps)]

    def clips(self) -> list[float]:
        return [self.clip(t) for t in range(self.total_steps)]

    def steps(self, sampling: Sampling, q: float) -> tuple[GaussianStep, ...]:
        """The privacy events of the whole schedule, identical steps merged."""
        if self.rho_mu == 1.0:
            return (GaussianStep(sampling, q, self.sigma_0, self.total_steps),)
        return group_steps(GaussianStep(sampling, q, s) for s in self.sigmas())


def constant(total_steps: int, sigma: float, clip: float = 1.0) -> Schedule:
    return Schedule(total_steps, sigma, clip)


def sensitivity_decay(total_steps: int, sigma: float, clip_0: float, rho_c: float) -> Schedule:
    return Schedule(total_steps, sigma, clip_0, 1.0, rho_c)


def solve_growing_mu(epsilon: float, delta: float, total_steps: int, rho_mu: float,
                     sampling: Sampling, q: float, *, accountant: str = "pld",
                     clip_0: float = 1.0, rho_c: float = 1.0, rel_tol: float = 1e-3) -> Schedule:
    """The growing-mu schedule whose composed budget meets (eps, delta) under ``accountant``.

    eps grows with mu_0, so mu_0 is found by bisection to relative tolerance ``rel_tol``
    (the returned schedule's eps is <= the target and within that tolerance in mu_0 of it),
    starting from the closed-form CLT answer (Du et al. Thm 1) to bracket it.
    """
    if not (math.isfinite(epsilon) and epsilon > 0) or not 0 < delta < 1:
        raise ConfigError(f"need eps > 0 and delta in (0, 1), got {epsilon!r}, {delta!r}")

    def make(mu_0: float) -> Schedule:
        return Schedule(total_steps, 1.0 / mu_0, clip_0, rho_mu, rho_c)

    def eps_of(mu_0: float, name: str) -> float:
        return make_accountant(name, make(mu_0).steps(sampling, q)).epsilon(delta)

    # CLT guess (Du et al. Thm 1, closed form, vectorised): eps grows with mu_0.
    decay = rho_mu ** (np.arange(total_steps) / total_steps)

    def clt_eps(mu_0: float) -> float:
        sigmas = 1.0 / (mu_0 * decay)
        terms = [clt_mu_squared_term(GaussianStep(sampling, q, float(s))) for s in
                 (sigmas if rho_mu != 1.0 else sigmas[:1])]
        total = math.fsum(terms) * (total_steps if rho_mu == 1.0 else 1)
        return gdp_epsilon(delta, math.sqrt(total))

    low, high = 1e-4, 1.0
    while clt_eps(high) < epsilon:
        low, high = high, high * 2
        if high > 1e3:
            raise PrivacyError("the target is met even with almost no noise")
    while high / low > 1 + 1e-6:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if clt_eps(middle) < epsilon else (low, middle)
    guess = low
    if accountant == "gdp-clt":
        return make(guess)
    low = high = guess
    while eps_of(low, accountant) > epsilon:
        low /= 1.25
        if low < 1e-6:
            raise PrivacyError("no mu_0 meets the target")
    while eps_of(high, accountant) <= epsilon:
        high *= 1.25
        if high > 1e3:
            raise PrivacyError("the target is met even with almost no noise")
    if low == high:
        low = high / 1.25
    while high / low > 1 + rel_tol:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if eps_of(middle, accountant) <= epsilon else (low, middle)
    return make(low)
