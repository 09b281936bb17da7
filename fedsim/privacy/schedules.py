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
  as training converges). (``rho_mu < 1`` arises only from the clip-tied allocation below.)
* clip-tied (Du et al., Sec. 3 "Remark on term D_1" and App. A.7): for a given clip sequence
  the noise term of their utility bound is smallest with noise std ``sigma~_t = sqrt(C_t)``
  (up to one common factor), i.e. ``mu_t = C_t / sigma~_t`` proportional to ``sqrt(C_t)``:
  :func:`clip_tied` gives ``mu_t = mu_0 sqrt(C_t / C_0) = mu_0 rho_c^{t/(2T)}``. :func:`solve_growing_mu` picks ``mu_0`` so that the composed budget
  meets a target (eps, delta) under a chosen accountant. :func:`clt_growing_mu` instead
  meets a target GDP mu under the heterogeneous CLT (Du et al. Thm 1) - the paper's own
  calibration, an approximation that can under-report eps, never a guarantee.

One schedule index may stand for several identical steps (``steps_per_index``): the runtime
indexes by round, and a round of ``local_steps`` DP-SGD steps uses one (C_t, sigma_t).

Usage::

    schedule = solve_growing_mu(epsilon=2.0, delta=1e-5, total_steps=1000, rho_mu=2.0,
                                sampling="poisson", q=0.01, clip_0=1.0, rho_c=0.5)
    for t in range(schedule.total_steps):
        C, sigma = schedule.clip(t), schedule.sigma(t)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from fedsim.errors import ConfigError, PrivacyError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep, Sampling, group_steps
from fedsim.privacy.gdp import clt_mu_squared_term, gdp_delta


@dataclass(frozen=True, slots=True)
class Schedule:
    """``C_t = clip_0 rho_c^{t/T}``, ``1/sigma_t = (1/sigma_0) rho_mu^{t/T}``, t = 0..T-1.

    ``rho_c = rho_mu = 1`` is the constant schedule; only a constant schedule may have no
    horizon (``total_steps=None``: valid for every t >= 0). Asking for a step outside the
    horizon raises :class:`ConfigError`: the caller must stop at the horizon, not extrapolate.
    """

    total_steps: int | None
    sigma_0: float
    clip_0: float = 1.0
    rho_mu: float = 1.0
    rho_c: float = 1.0

    def __post_init__(self) -> None:
        if self.total_steps is not None and (
                isinstance(self.total_steps, bool) or not isinstance(self.total_steps, int)
                or self.total_steps < 1):
            raise ConfigError(f"total_steps must be an integer >= 1, got {self.total_steps!r}")
        for name in ("sigma_0", "clip_0", "rho_mu", "rho_c"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
        if self.rho_c > 1:
            raise ConfigError(f"rho_c must be in (0, 1] (sensitivity decay), got {self.rho_c!r}")
        if self.total_steps is None and not self.is_constant:
            raise ConfigError("a decaying clip or growing mu needs a horizon (total_steps)")

    @property
    def is_constant(self) -> bool:
        return self.rho_mu == 1.0 and self.rho_c == 1.0

    def _fraction(self, t: int) -> float:
        """``t / T`` after checking that t is inside the horizon."""
        total = self.total_steps
        # A plain int (asked every round) costs one type test before the range check.
        if (type(t) is not int and (isinstance(t, bool) or not isinstance(t, int | np.integer))) \
                or t < 0 or (total is not None and t >= total):
            horizon = "0.." + str(total - 1) if total else ">= 0"
            raise ConfigError(f"step {t!r} outside the schedule's horizon {horizon}")
        return 0.0 if total is None else t / total

    def sigma(self, t: int) -> float:
        """Noise multiplier of step t."""
        return float(self.sigma_0 * self.rho_mu ** (-self._fraction(t)))

    def mu(self, t: int) -> float:
        """``1 / sigma(t)``, the GDP parameter of the unsampled step."""
        return 1.0 / self.sigma(t)

    def clip(self, t: int) -> float:
        """Clipping norm of step t."""
        return float(self.clip_0 * self.rho_c ** self._fraction(t))

    def _horizon(self) -> int:
        if self.total_steps is None:
            raise ConfigError("a schedule without a horizon has no finite list of steps")
        return self.total_steps

    def sigmas(self) -> list[float]:
        return [self.sigma(t) for t in range(self._horizon())]

    def clips(self) -> list[float]:
        return [self.clip(t) for t in range(self._horizon())]

    def steps(self, sampling: Sampling, q: float, steps_per_index: int = 1
              ) -> tuple[GaussianStep, ...]:
        """The privacy events of the whole schedule (each index releasing ``steps_per_index``
        identical steps), identical steps merged."""
        total = self._horizon()
        if self.rho_mu == 1.0:
            return (GaussianStep(sampling, q, self.sigma_0, total * steps_per_index),)
        return group_steps(GaussianStep(sampling, q, s, steps_per_index) for s in self.sigmas())


def constant(total_steps: int | None, sigma: float, clip: float = 1.0) -> Schedule:
    return Schedule(total_steps, sigma, clip)


def sensitivity_decay(total_steps: int, sigma: float, clip_0: float, rho_c: float) -> Schedule:
    return Schedule(total_steps, sigma, clip_0, 1.0, rho_c)


def _clt_mu_of_growing(total_steps: int, rho_mu: float, sampling: Sampling, q: float,
                       steps_per_index: int) -> Callable[[float], float]:
    """mu_0 -> CLT mu of the growing-mu schedule (Du et al. Thm 1 for Poisson; Dong-Roth-Su
    Cor. 5.4's per-step term for fixed-size batches, :func:`clt_mu_squared_term`)."""
    decay = rho_mu ** (np.arange(total_steps) / total_steps)

    def clt_mu(mu_0: float) -> float:
        return math.sqrt(math.fsum(
            clt_mu_squared_term(GaussianStep(sampling, q, float(1.0 / (mu_0 * g)),
                                             steps_per_index)) for g in decay))

    return clt_mu


def _clt_mu_0(mu_total: float, clt_mu: Callable[[float], float]) -> float:
    """The mu_0 at which the (increasing) ``clt_mu`` reaches ``mu_total``, to 1e-10 relative."""
    low, high = 1e-4, 1.0
    while clt_mu(high) < mu_total:
        low, high = high, high * 2
        if high > 1e3:
            raise PrivacyError(f"mu_total={mu_total:g} is met even with almost no noise")
    while high / low > 1 + 1e-10:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if clt_mu(middle) < mu_total else (low, middle)
    return low


def clt_growing_mu(mu_total: float, total_steps: int, rho_mu: float, sampling: Sampling,
                   q: float, *, clip_0: float = 1.0, rho_c: float = 1.0,
                   steps_per_index: int = 1) -> Schedule:
    """The growing-mu schedule whose heterogeneous-CLT GDP parameter is ``mu_total``.

    CLT APPROXIMATION (Du et al. 2021, Thm 1: mu = q sqrt(sum_t (e^{mu_t^2} - 1)) for Poisson
    sampling, add/remove neighbours; Dong-Roth-Su Cor. 5.4's term per step for fixed-size
    batches, replace-one neighbours). It is the paper's calibration and may under-report the
    true eps; use :func:`solve_growing_mu` for a schedule that meets (eps, delta) for sure.
    """
    if not (math.isfinite(mu_total) and mu_total > 0):
        raise ConfigError(f"mu_total must be a finite number > 0, got {mu_total!r}")
    Schedule(total_steps, 1.0, clip_0, rho_mu, rho_c)  # validate before solving
    clt_mu = _clt_mu_of_growing(total_steps, rho_mu, sampling, q, steps_per_index)
    return Schedule(total_steps, 1.0 / _clt_mu_0(mu_total, clt_mu), clip_0, rho_mu, rho_c)


def solve_growing_mu(epsilon: float, delta: float, total_steps: int, rho_mu: float,  # noqa: C901 - validation and bracketing in one place
                     sampling: Sampling, q: float, *, accountant: str = "pld",
                     clip_0: float = 1.0, rho_c: float = 1.0, rel_tol: float = 1e-3,
                     steps_per_index: int = 1) -> Schedule:
    """The growing-mu schedule whose composed budget meets (eps, delta) under ``accountant``.

    eps grows with mu_0 (the privacy loss of each step grows with its mu_t = mu_0 rho^{t/T},
    under the sampling scheme's neighbouring relation), so mu_0 is found to relative tolerance
    ``rel_tol``: the returned schedule's eps is <= the target, and one ``rel_tol`` larger a
    mu_0 exceeds it. The search starts from the CLT answer (Du et al. Thm 1, with mu the GDP
    parameter of (eps, delta), Dong-Roth-Su Cor. 2.13) and brackets it; then it interpolates
    log eps against log mu_0 between the bracket's ends (eps is smooth in mu_0) and probes
    just either side of the estimate, a tolerance apart, so that a good estimate closes the
    bracket in two evaluations (a 300-step schedule took eleven PLD evaluations of 1.3 s
    each by bisection, four this way); a step that does not halve the bracket (in log) is
    followed by one centred on its geometric middle, as bisection would. ``accountant=
    "gdp-clt"`` returns that CLT answer.
    """
    if not (math.isfinite(epsilon) and epsilon > 0) or not 0 < delta < 1:
        raise ConfigError(f"need eps > 0 and delta in (0, 1), got {epsilon!r}, {delta!r}")
    if not 1e-12 <= rel_tol < 1:  # (NaN too; 0 or a negative one never ended)
        raise ConfigError(f"rel_tol must be in [1e-12, 1), got {rel_tol!r}")
    Schedule(total_steps, 1.0, clip_0, rho_mu, rho_c)  # validate before solving

    def make(mu_0: float) -> Schedule:
        return Schedule(total_steps, 1.0 / mu_0, clip_0, rho_mu, rho_c)

    evaluated: dict[float, float] = {}

    def eps_of(mu_0: float) -> float:
        if mu_0 not in evaluated:
            steps = make(mu_0).steps(sampling, q, steps_per_index)
            evaluated[mu_0] = make_accountant(accountant, steps).epsilon(delta)
        return evaluated[mu_0]

    # mu-GDP is (eps, delta(eps))-DP with delta(eps) increasing in mu (Dong-Roth-Su Cor. 2.13).
    mu_low, mu_high = 1e-6, 1.0
    while gdp_delta(epsilon, mu_high) < delta:
        mu_low, mu_high = mu_high, mu_high * 2
    target_mu = float(brentq(lambda mu: gdp_delta(epsilon, mu) - delta, mu_low, mu_high,
                             xtol=1e-12))
    guess = _clt_mu_0(target_mu, _clt_mu_of_growing(total_steps, rho_mu, sampling, q,
                                                   steps_per_index))
    if accountant == "gdp-clt":
        return make(guess)
    low = high = guess
    while eps_of(low) > epsilon:
        low /= 1.25
        if low < 1e-6:
            raise PrivacyError("no mu_0 meets the target")
    while eps_of(high) <= epsilon:
        high *= 1.25
        if high > 1e3:
            raise PrivacyError("the target is met even with almost no noise")
    if low == high:
        low = high / 1.25
    low = _narrowed(eps_of, epsilon, low, high, rel_tol)
    return make(low)


def _narrowed(eps_of: Callable[[float], float], epsilon: float, low: float, high: float,
              rel_tol: float) -> float:
    """The largest mu_0 found with ``eps_of(mu_0) <= epsilon``, narrowing the bracket
    ``eps_of(low) <= epsilon < eps_of(high)`` to ``high / low <= 1 + rel_tol``
    (:func:`solve_growing_mu`: interpolated probe pairs, a geometric middle when a step did not
    halve the bracket in log)."""
    half_gap = math.sqrt(1.0 + rel_tol) ** 0.999  # the probes' ratio to their centre
    interpolate = True
    while high / low > 1 + rel_tol:
        span = math.log(high / low)
        below, above = eps_of(low) / epsilon, eps_of(high) / epsilon
        if interpolate and 0 < below and math.isfinite(above):  # (a subnormal eps: 0 here)
            # log eps is near linear in log mu_0 over a narrow bracket
            lower, upper = math.log(below), math.log(above)  # <= 0 < upper
            centre = low * math.exp(span * lower / (lower - upper))
        else:
            centre = math.sqrt(low * high)
        for probe in (centre / half_gap, centre * half_gap):
            if low < probe < high:
                low, high = (probe, high) if eps_of(probe) <= epsilon else (low, probe)
        interpolate = math.log(high / low) <= span / 2  # else bisect next
    return low


def clip_tied(total_steps: int, sampling: Sampling, q: float, *, clip_0: float = 1.0,
              rho_c: float = 1.0, epsilon: float | None = None, delta: float | None = None,
              mu_total: float | None = None, accountant: str = "pld",
              steps_per_index: int = 1) -> Schedule:
    """Du et al.'s noise allocation from the clip schedule: ``mu_t`` proportional to
    ``sqrt(C_t)`` (their Sec. 3, "Remark on term D_1": ``sigma~_t = sqrt(C_t)`` minimises the
    noise term of the utility bound of their Thm 2 for a given ``C_t``; proof in App. A.7).

    With ``C_t = clip_0 rho_c^{t/T}`` this is the schedule ``mu_t = mu_0 rho_c^{t/(2T)}``, so the
    noise std ``C_t sigma_t = C_t / mu_t`` (Poisson; twice that for fixed-size batches) is
    proportional to ``sqrt(C_t)``. The common factor ``mu_0`` is solved exactly like growing mu:
    with ``epsilon`` and ``delta``, so that the T steps meet (eps, delta) under ``accountant`` (a
    guarantee, :func:`solve_growing_mu`); with ``mu_total`` instead, so that the heterogeneous
    GDP CLT (Du et al. Thm 1) gives ``mu_total`` (an approximation, :func:`clt_growing_mu`).
    Neighbouring relation: the sampling scheme's (add/remove for Poisson, replace-one for
    fixed-size batches).
    """
    if not (isinstance(rho_c, int | float) and math.isfinite(rho_c) and 0 < rho_c <= 1):
        raise ConfigError(f"rho_c must be in (0, 1], got {rho_c!r}")
    rho_mu = math.sqrt(rho_c)
    if mu_total is not None:
        if epsilon is not None or delta is not None:
            raise ConfigError("clip_tied: give either epsilon + delta or mu_total, not both")
        return clt_growing_mu(mu_total, total_steps, rho_mu, sampling, q, clip_0=clip_0,
                              rho_c=rho_c, steps_per_index=steps_per_index)
    if epsilon is None or delta is None:
        raise ConfigError("clip_tied: give epsilon and delta (or mu_total)")
    return solve_growing_mu(epsilon, delta, total_steps, rho_mu, sampling, q,
                            accountant=accountant, clip_0=clip_0, rho_c=rho_c,
                            steps_per_index=steps_per_index)
