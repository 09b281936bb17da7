"""Group schedules: target-eps calibration and the growing-mu / sensitivity-decay shapes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fedsim.config.schema import ClientGroup
from fedsim.errors import ConfigError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.gdp import clt_mu
from fedsim.privacy.group_schedules import make_schedule


def group(**changes) -> ClientGroup:
    base = {"name": "g", "count": 1, "data_share": 1.0, "batch_size": 64, "clip": 1.0,
            "noise": 1.0, "rounds": 200, "speed": 0.01}
    return ClientGroup.model_validate({**base, **changes})


def test_target_noise_is_the_smallest_sigma_meeting_the_budget() -> None:
    q = 64 / 6000
    schedule = make_schedule(group(noise={"kind": "target", "epsilon": 3.0, "delta": 1e-5}),
                             q=q, where="g")
    sigma = schedule.sigma(0)
    assert schedule.sigma(150) == sigma

    def eps(s: float) -> float:
        return make_accountant("pld", [GaussianStep("poisson", q, s, 200)]).epsilon(1e-5)

    assert eps(sigma) <= 3.0 < eps(sigma * (1 - 2e-3))


def test_growing_mu_clt_form_meets_the_heterogeneous_clt_budget_and_clip_decays() -> None:
    q, rounds = 0.02, 300
    schedule = make_schedule(group(rounds=rounds, clip={"kind": "decay", "initial": 2.0,
                                                         "final_ratio": 0.3},
                                    noise={"kind": "growing_mu", "mu_total": 1.0, "growth": 3.0}),
                             q=q, where="g")
    sigmas = [schedule.sigma(t) for t in range(rounds)]
    # mu_t = 1/sigma_t grows geometrically to (almost) 3x its start over the horizon.
    assert sigmas[0] / sigmas[-1] == pytest.approx(3.0 ** ((rounds - 1) / rounds))
    # Paper 002's CLT over the schedule's steps (computed by fedsim.privacy.gdp) is mu_total.
    assert clt_mu([GaussianStep("poisson", q, s) for s in sigmas]) == pytest.approx(1.0, rel=1e-6)
    assert schedule.clip(0) == 2.0
    assert schedule.clip(rounds - 1) == pytest.approx(2.0 * 0.3 ** ((rounds - 1) / rounds))
    assert schedule.clip(rounds // 2) == pytest.approx(2.0 * 0.3**0.5)
    # Past the horizon the schedule refuses rather than extrapolating.
    with pytest.raises(ConfigError, match="horizon"):
        schedule.sigma(rounds)


def test_growing_mu_budget_form_meets_eps_delta_under_the_groups_accountant() -> None:
    q, rounds, local_steps, target = 0.02, 120, 3, 2.0
    schedule = make_schedule(group(rounds=rounds, local_steps=local_steps,
                                    noise={"kind": "growing_mu", "epsilon": target,
                                           "delta": 1e-5, "growth": 2.0}),
                             q=q, where="g")
    sigmas = [schedule.sigma(t) for t in range(rounds)]
    assert sigmas[0] / sigmas[-1] == pytest.approx(2.0 ** ((rounds - 1) / rounds))

    def eps(scale: float) -> float:  # every round releases local_steps steps at sigma_t
        steps = [GaussianStep("poisson", q, s * scale, local_steps) for s in sigmas]
        return make_accountant("pld", steps).epsilon(1e-5)

    # Met, and tight: 0.2 % less noise everywhere would overshoot (rel_tol 1e-3 in mu_0).
    assert eps(1.0) <= target < eps(1 - 2e-3)


@pytest.mark.parametrize("noise", [
    {"kind": "growing_mu", "growth": 2.0},
    {"kind": "growing_mu", "growth": 2.0, "epsilon": 1.0},
    {"kind": "growing_mu", "growth": 2.0, "epsilon": 1.0, "delta": 1e-5, "mu_total": 0.5},
])
def test_growing_mu_needs_exactly_one_target(noise: dict) -> None:
    with pytest.raises(ValidationError, match="growing_mu"):
        group(noise=noise)


def test_constant_schedule_without_rounds_has_no_horizon() -> None:
    schedule = make_schedule(group(rounds=None, noise=0.8, clip=1.5), q=0.01, where="g")
    assert schedule.sigma(10**6) == 0.8 and schedule.clip(10**6) == 1.5
