"""Calibration for any accountant: the smallest noise for a budget, the most steps for a noise.

Both searches rely on monotonicity: eps is non-increasing in sigma and non-decreasing in the
number of steps T (true for every registered accountant; tested as properties). Each search
brackets the answer by exponential search and then bisects:

* :func:`calibrate_sigma`: in log sigma until ``hi / lo <= 1 + rel_tol`` (default 1e-4); the
  returned sigma is the upper end of the final bracket, so it *meets* the budget;
* :func:`max_steps`: on integers, exact: ``eps(T) <= target < eps(T + 1)``.

:func:`calibrate_sigma_smooth` answers as :func:`calibrate_sigma` does by interpolation in
log sigma instead of bisection (5-7 probes instead of 12-16), for measures that cost a second
a probe (a group's mixture bound, :mod:`fedsim.privacy.group_answers`).

T identical steps are one self-composed :class:`GaussianStep` (``count = T``), so the PLD
accountant answers each probe with one FFT power. ``measure`` selects which eps to use, e.g.
``lambda acc, d: acc.epsilon_classic(d)`` for the RDP accountant's classic conversion.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from fedsim.errors import ConfigError, PrivacyError
from fedsim.privacy.accountant import Accountant, make_accountant
from fedsim.privacy.events import GaussianStep, Sampling

Measure = Callable[[Accountant, float], float]
SIGMA_RANGE = (1e-3, 1e4)
MAX_STEPS_LIMIT = 10**9


def _default_measure(accountant: Accountant, delta: float) -> float:
    return accountant.epsilon(delta)


def _check_target(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"target epsilon must be a finite number > 0, got {epsilon!r}")
    if not 0 < delta < 1:
        raise ConfigError(f"delta must be in (0, 1), got {delta!r}")


def epsilon_for(accountant: str, sampling: Sampling, q: float, sigma: float, steps: int,
                delta: float, measure: Measure = _default_measure, *,
                prior: Sequence[GaussianStep] = (), **settings: Any) -> float:
    """eps of ``steps`` identical steps under the named accountant, composed with the releases
    ``prior`` (e.g. a DP data normalisation before the first round)."""
    acc = make_accountant(accountant, [*prior, GaussianStep(sampling, q, sigma, steps)],
                          **settings)
    return measure(acc, delta)


def calibrate_sigma(accountant: str, sampling: Sampling, q: float, steps: int,  # noqa: C901 - bracketing and bisection with their failure cases
                    epsilon: float, delta: float, *, rel_tol: float = 1e-4,
                    measure: Measure = _default_measure, prior: Sequence[GaussianStep] = (),
                    **settings: Any) -> float:
    """Smallest sigma (to relative tolerance ``rel_tol``, rounded up) with eps <= ``epsilon``
    for the ``steps`` composed with the fixed releases ``prior``."""
    _check_target(epsilon, delta)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps must be an integer >= 1, got {steps!r}")

    def fits(sigma: float) -> bool:
        try:
            return epsilon_for(accountant, sampling, q, sigma, steps, delta, measure,
                               prior=prior, **settings) <= epsilon
        except PrivacyError:  # a noise level too small to account cannot meet a budget
            return False

    low, high = 1.0, 1.0
    if fits(high):
        while low > SIGMA_RANGE[0] and fits(low / 2):
            low /= 2
        low, high = low / 2, low
        if high <= SIGMA_RANGE[0]:
            return high
    else:
        while not fits(high * 2):
            high *= 2
            if high > SIGMA_RANGE[1]:
                raise PrivacyError(f"no sigma below {SIGMA_RANGE[1]:g} meets eps={epsilon:g}")
        low, high = high, high * 2
    while high / low > 1.0 + rel_tol:
        middle = math.sqrt(low * high)
        if fits(middle):
            high = middle
        else:
            low = middle
    return high


def calibrate_sigma_smooth(excess: Callable[[float], float], *, rel_tol: float = 1e-4,
                           start: float = 1.0) -> float:
    """Smallest sigma in :data:`SIGMA_RANGE` (to relative ``rel_tol``, the upper end of the
    final bracket, so it *meets* the target) with ``excess(sigma) <= 0``, for an ``excess``
    that decreases in sigma and is smooth in log sigma (``log eps - log target``; ``inf``
    where there is no finite eps): the same answer as :func:`calibrate_sigma` in fewer probes,
    for measures of a second each. The bracket is found by steps from ``start`` extrapolated
    from the last two probes (:func:`_log_step`), then closed by the Illinois variant of
    regula falsi in log sigma (Dowell & Jarratt 1971), every probe at least ``rel_tol`` inside
    the bracket, so that it closes."""
    tol = math.log1p(rel_tol)
    fail, fit = _smooth_bracket(excess, math.log(start), tol)
    if fit is None:
        raise PrivacyError(f"no sigma below {SIGMA_RANGE[1]:g} meets the target")
    if fail is None:  # even the smallest sigma meets it
        return math.exp(fit[0])
    (a, g_a), (b, g_b) = fail, fit
    side = 0
    while b - a > tol:
        if b - a <= 2.0 * tol or not (math.isfinite(g_a) and math.isfinite(g_b)) or g_a == g_b:
            x = 0.5 * (a + b)
        else:
            x = min(max(b - g_b * (b - a) / (g_b - g_a), a + tol), b - tol)
        g = excess(math.exp(x))
        if g <= 0:
            b, g_b, g_a = x, g, g_a / 2.0 if side == 1 else g_a
            side = 1
        else:
            a, g_a, g_b = x, g, g_b / 2.0 if side == -1 else g_b
            side = -1
    return math.exp(b)


def _smooth_bracket(excess: Callable[[float], float], x: float, tol: float
                    ) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """(a failing and a fitting probe, each ``(log sigma, excess)``; None where the range's end
    was reached without one), by :func:`_log_step` s from ``x``."""
    low, high = math.log(SIGMA_RANGE[0]), math.log(SIGMA_RANGE[1])
    fail: tuple[float, float] | None = None
    fit: tuple[float, float] | None = None
    last: tuple[float, float] | None = None
    while True:
        g = excess(math.exp(x))
        if g <= 0:
            fit = (x, g)
        else:
            fail = (x, g)
        if fail is not None and fit is not None:
            return fail, fit
        step = _log_step(last, (x, g), tol)
        last, edge = (x, g), (high if step > 0 else low)
        if x == edge:
            return fail, fit
        x = min(x + step, high) if step > 0 else max(x + step, low)


def _log_step(last: tuple[float, float] | None, here: tuple[float, float], tol: float) -> float:
    """The next probe's move in log sigma towards ``excess = 0`` from ``here``: along the
    secant through ``last`` where it slopes down, else as if eps were proportional to 1/sigma,
    overshot by a fifth so that one step usually brackets; a doubling where the excess is
    infinite; at least ``2 tol`` and at most a factor e^3."""
    x, g = here
    if math.isinf(g):
        return math.log(2.0) if g > 0 else -math.log(2.0)
    slope = -1.0
    if last is not None and math.isfinite(last[1]) and last[1] != g:
        slope = min((g - last[1]) / (x - last[0]), -1e-3)
    step = -1.2 * g / slope
    return math.copysign(min(max(abs(step), 2.0 * tol), 3.0), -g / slope)


def max_steps(accountant: str, sampling: Sampling, q: float, sigma: float, epsilon: float,
              delta: float, *, measure: Measure = _default_measure,
              limit: int = MAX_STEPS_LIMIT, **settings: Any) -> int:
    """Largest T with eps(T steps) <= ``epsilon`` (0 if one step already exceeds it; ``limit``
    if even ``limit`` steps fit). The "how many rounds" question of Asoodeh et al."""
    _check_target(epsilon, delta)

    def fits(count: int) -> bool:
        return epsilon_for(accountant, sampling, q, sigma, count, delta, measure,
                           **settings) <= epsilon

    return largest_fitting(fits, limit=limit)


def doubling_bracket(fits: Callable[[int], bool], *, start: int = 1,
                     limit: int = MAX_STEPS_LIMIT) -> tuple[int, int]:
    """``(low, high)`` for a monotone predicate: ``fits(low)`` (``low = 0`` is taken as
    fitting) and not ``fits(high)``, found by doubling from ``start``; ``high = limit + 1``
    when even ``limit`` fits. The largest fitting n lies in ``[low, high)``."""
    start = max(1, min(start, limit))
    if not fits(start):
        return 0, start
    low, high = start, start * 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    if high > limit:
        if fits(limit):
            return limit, limit + 1
        high = limit
    return low, high


def bisect_fitting(fits: Callable[[int], bool], low: int, high: int) -> int:
    """Largest n in ``[low, high)`` with ``fits(n)``, given ``fits(low)`` and not ``fits(high)``."""
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def largest_fitting(fits: Callable[[int], bool], *, start: int = 1,
                    limit: int = MAX_STEPS_LIMIT) -> int:
    """Largest n in [0, limit] with ``fits(n)`` for a monotone predicate (``fits(0)`` is taken
    as true): doubling from ``start`` to bracket, then integer bisection."""
    return bisect_fitting(fits, *doubling_bracket(fits, start=start, limit=limit))
