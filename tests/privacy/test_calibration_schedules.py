"""Calibration (sigma for a budget, steps for a sigma) and schedules."""

from __future__ import annotations

import math

import pytest

from fedsim.errors import ConfigError
from fedsim.privacy import calibration, schedules
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.gdp import gdp_epsilon

DELTA = 1e-5


@pytest.mark.parametrize("name", ["pld", "gdp-clt"])
@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_calibrated_sigma_is_the_smallest_that_meets_the_budget(name: str, sampling: str) -> None:
    sigma = calibration.calibrate_sigma(name, sampling, 0.01, 1000, 1.5, DELTA, rel_tol=1e-4)
    assert calibration.epsilon_for(name, sampling, 0.01, sigma, 1000, DELTA) <= 1.5
    assert calibration.epsilon_for(name, sampling, 0.01, sigma / 1.0002, 1000, DELTA) > 1.5


@pytest.mark.parametrize("name", ["pld", "gdp-clt"])
def test_max_steps_is_exact(name: str) -> None:
    steps = calibration.max_steps(name, "poisson", 0.01, 1.0, 1.0, DELTA)
    assert calibration.epsilon_for(name, "poisson", 0.01, 1.0, steps, DELTA) <= 1.0
    assert calibration.epsilon_for(name, "poisson", 0.01, 1.0, steps + 1, DELTA) > 1.0


def test_max_steps_for_gdp_clt_matches_the_closed_form() -> None:
    # mu = q sqrt(T (e^{1/sigma^2} - 1)) <= mu* (Bu et al.) gives T in closed form
    q, sigma = 0.01, 1.0
    mu_star = 0.7
    target = gdp_epsilon(DELTA, mu_star)
    closed = math.floor((mu_star / q) ** 2 / math.expm1(sigma**-2))
    assert abs(calibration.max_steps("gdp-clt", "poisson", q, sigma, target, DELTA) - closed) <= 1


def test_max_steps_zero_when_one_step_is_too_much() -> None:
    assert calibration.max_steps("pld", "poisson", 1.0, 0.3, 0.1, DELTA) == 0


def test_bad_targets_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        calibration.calibrate_sigma("pld", "poisson", 0.01, 0, 1.0, DELTA)
    with pytest.raises(ConfigError):
        calibration.max_steps("pld", "poisson", 0.01, 1.0, -1.0, DELTA)


def test_schedule_shapes() -> None:
    schedule = schedules.Schedule(100, sigma_0=2.0, clip_0=1.0, rho_mu=4.0, rho_c=0.25)
    assert schedule.sigma(0) == 2.0 and schedule.clip(0) == 1.0
    assert schedule.sigma(50) == pytest.approx(2.0 / 4.0**0.5)
    assert schedule.clip(50) == pytest.approx(0.25**0.5)
    assert schedule.mu(99) == pytest.approx(0.5 * 4.0**0.99)
    assert sum(s.count for s in schedule.steps("poisson", 0.01)) == 100
    constant = schedules.constant(10, 1.5)
    assert constant.steps("fixed", 0.1) == (GaussianStep("fixed", 0.1, 1.5, 10),)
    with pytest.raises(ConfigError):
        schedule.sigma(100)
    with pytest.raises(ConfigError):
        schedules.Schedule(10, sigma_0=1.0, rho_c=2.0)


def test_a_schedules_steps_are_checked_and_computed_alike_for_any_integer() -> None:
    """Step indices as a plain int (the per-round path) and as numpy integers give the same
    values, bit for bit; anything outside the horizon, negative or not an integer is refused."""
    import numpy as np

    for schedule in (schedules.Schedule(100, sigma_0=2.0, clip_0=1.0, rho_mu=4.0, rho_c=0.25),
                     schedules.constant(None, 1.5)):
        for t in (0, 1, 37, 99):
            for index in (np.int64(t), np.int32(t)):
                assert schedule.sigma(t) == schedule.sigma(index)  # type: ignore[arg-type]
                assert schedule.clip(t) == schedule.clip(index)  # type: ignore[arg-type]
            assert schedule.sigma(t) == float(schedule.sigma_0 * schedule.rho_mu ** (
                -(t / schedule.total_steps if schedule.total_steps else 0.0)))
        for bad in (-1, True, 2.0, "3", np.int64(-2)):
            with pytest.raises(ConfigError):
                schedule.sigma(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        schedules.Schedule(100, sigma_0=2.0, rho_mu=4.0).clip(100)


@pytest.mark.parametrize("name", ["pld", "gdp-clt"])
def test_growing_mu_meets_the_budget(name: str) -> None:
    schedule = schedules.solve_growing_mu(1.0, DELTA, 50, 2.0, "poisson", 0.05, accountant=name,
                                          rel_tol=1e-3)
    eps = make_accountant(name, schedule.steps("poisson", 0.05)).epsilon(DELTA)
    assert 0.99 <= eps <= 1.0
    assert schedule.sigma(49) < schedule.sigma(0)


@pytest.mark.parametrize(("epsilon", "steps", "growth", "sampling", "q", "rel_tol"), [
    (2.0, 300, 2.0, "poisson", 0.05, 1e-3),  # dynamic-dpsgd's shape
    (0.5, 120, 4.0, "poisson", 0.02, 1e-3),
    (4.0, 150, 3.0, "fixed", 0.02, 1e-3),
    (2.0, 100, 0.5, "poisson", 0.1, 1e-4),
])
def test_growing_mu_is_the_largest_mu_0_within_its_tolerance_in_few_evaluations(
        epsilon: float, steps: int, growth: float, sampling: str, q: float, rel_tol: float,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's contract, checked by fresh accountants: eps at the returned mu_0 is within
    the budget and one ``rel_tol`` more mu_0 exceeds it. Bisection took eleven evaluations of
    a 300-step schedule (1.3 s each: 14 of the 17 s dynamic-dpsgd took to start); the
    interpolating search takes at most seven here."""
    evaluations = []
    real = schedules.make_accountant

    def counted(name: str, steps_: list[GaussianStep]) -> object:
        evaluations.append(name)
        return real(name, steps_)

    monkeypatch.setattr(schedules, "make_accountant", counted)
    schedule = schedules.solve_growing_mu(epsilon, DELTA, steps, growth, sampling, q,
                                          rel_tol=rel_tol)
    monkeypatch.undo()
    assert len(evaluations) <= 7, len(evaluations)
    mu_0 = 1.0 / schedule.sigma_0
    assert make_accountant("pld", schedule.steps(sampling, q)).epsilon(DELTA) <= epsilon
    larger = schedules.Schedule(steps, 1.0 / (mu_0 * (1 + rel_tol)), 1.0, growth, 1.0)
    assert make_accountant("pld", larger.steps(sampling, q)).epsilon(DELTA) > epsilon


@pytest.mark.parametrize("rel_tol", [0.0, -0.5, math.nan, 1.0])
def test_growing_mu_refuses_a_tolerance_it_could_never_meet(rel_tol: float) -> None:
    """A review: 0 or a negative tolerance looped for ever, NaN returned at once."""
    with pytest.raises(ConfigError, match="rel_tol"):
        schedules.solve_growing_mu(2.0, DELTA, 10, 2.0, "poisson", 0.05, rel_tol=rel_tol)


def test_the_search_survives_an_eps_that_rounds_to_zero_at_the_bracket_low() -> None:
    """A subnormal eps at the low end (5e-324 against 4) failed in log(); the step then
    bisects. The answer is the bracket's largest point known within the budget."""
    found = schedules._narrowed(lambda mu: 5e-324 if mu < 1 else 10.0, 4.0, 0.5, 2.0, 1e-3)
    assert 1 / 1.001 < found < 1.0
