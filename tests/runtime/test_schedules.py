"""Group schedules: target-eps calibration and the growing-mu / sensitivity-decay shapes."""

from __future__ import annotations

import pytest

from fedsim.config.schema import ClientGroup
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.gdp import clt_mu
from fedsim.runtime.schedules import make_schedules


def group(**changes) -> ClientGroup:
    base = {"name": "g", "count": 1, "data_share": 1.0, "batch_size": 64, "clip": 1.0,
            "noise": 1.0, "rounds": 200}
    return ClientGroup.model_validate({**base, **changes})


def test_target_noise_is_the_smallest_sigma_meeting_the_budget() -> None:
    q = 64 / 6000
    schedules = make_schedules(group(noise={"kind": "target", "epsilon": 3.0, "delta": 1e-5}),
                               q=q, where="g")
    sigma = schedules.noise.sigma(0)
    assert schedules.noise.sigma(150) == sigma

    def eps(s: float) -> float:
        return make_accountant("pld", [GaussianStep("poisson", q, s, 200)]).epsilon(1e-5)

    assert eps(sigma) <= 3.0 < eps(sigma * (1 - 2e-3))


def test_growing_mu_meets_the_heterogeneous_clt_budget_and_clip_decays() -> None:
    q, rounds = 0.02, 300
    schedules = make_schedules(group(rounds=rounds, clip={"kind": "decay", "initial": 2.0,
                                                          "final_ratio": 0.3},
                                     noise={"kind": "growing_mu", "mu_total": 1.0, "growth": 3.0}),
                               q=q, where="g")
    sigmas = [schedules.noise.sigma(t) for t in range(rounds)]
    # mu_t = 1/sigma_t grows geometrically to (almost) 3x its start over the horizon.
    assert sigmas[0] / sigmas[-1] == pytest.approx(3.0 ** ((rounds - 1) / rounds))
    # Paper 002's CLT over the schedule's steps (computed by fedsim.privacy.gdp) is mu_total.
    assert clt_mu([GaussianStep("poisson", q, s) for s in sigmas]) == pytest.approx(1.0, rel=1e-6)
    assert schedules.clip.clip(0) == 2.0
    assert schedules.clip.clip(rounds) == pytest.approx(0.6)
    assert schedules.clip.clip(rounds // 2) == pytest.approx(2.0 * 0.3**0.5)
