"""Du et al.'s clip-tied noise allocation (mu_t proportional to sqrt(C_t)) as a schedule kind.

The allocation is checked against the paper's rule computed here from scratch (noise std
sigma~_t = sqrt(C_t) up to one factor, mu_t = C_t / sigma~_t), its calibration against the
accountant and Du et al.'s Thm 1 recomputed by hand, and the ledger's accounting of it against
the same releases written out as an explicit list of steps.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedsim.config import parse_scenario
from fedsim.errors import ConfigError
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.group_schedules import make_schedule
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.schedules import clip_tied

T, Q, CLIP_0, RHO_C = 100, 0.01, 2.0, 0.3


def _paper_allocation(kappa: float) -> tuple[np.ndarray, np.ndarray]:
    """C_t and the noise multiplier of Du et al.'s rule: noise std sigma_t = sqrt(C_t) / kappa,
    so mu_t = C_t / sigma_t = kappa sqrt(C_t) and the multiplier is std / C_t."""
    clips = np.array([CLIP_0 * RHO_C ** (t / T) for t in range(T)])
    noise_std = np.sqrt(clips) / kappa
    return clips, noise_std / clips


def test_allocation_follows_the_papers_rule_and_meets_the_budget() -> None:
    schedule = clip_tied(T, "poisson", Q, clip_0=CLIP_0, rho_c=RHO_C, epsilon=2.0, delta=1e-5)
    clips = np.array(schedule.clips())
    sigmas = np.array(schedule.sigmas())
    kappa = 1.0 / (sigmas[0] * math.sqrt(clips[0]))  # the one common factor
    paper_clips, paper_sigmas = _paper_allocation(kappa)
    np.testing.assert_allclose(clips, paper_clips, rtol=1e-12)
    np.testing.assert_allclose(sigmas, paper_sigmas, rtol=1e-12)
    # the absolute noise std C_t sigma_t is proportional to sqrt(C_t): the paper's sigma~_t
    ratio = clips * sigmas / np.sqrt(clips)
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-12)
    # calibrated: the T steps meet (2, 1e-5) under pld, and 1% less noise would not
    steps = [GaussianStep("poisson", Q, float(s)) for s in paper_sigmas]
    assert make_accountant("pld", steps).epsilon(1e-5) <= 2.0
    louder = [GaussianStep("poisson", Q, float(s) / 1.01) for s in paper_sigmas]
    assert make_accountant("pld", louder).epsilon(1e-5) > 2.0


def test_clt_form_meets_du_theorem_1_recomputed() -> None:
    """mu_total = q sqrt(sum_t (e^{mu_t^2} - 1)) (Du et al. Thm 1, Poisson)."""
    schedule = clip_tied(T, "poisson", Q, clip_0=CLIP_0, rho_c=RHO_C, mu_total=0.5)
    mus = 1.0 / np.array(schedule.sigmas())
    assert Q * math.sqrt(math.fsum(math.expm1(m * m) for m in mus)) == pytest.approx(0.5, rel=1e-8)
    np.testing.assert_allclose(mus / np.sqrt(schedule.clips()),
                               mus[0] / math.sqrt(CLIP_0), rtol=1e-12)


def test_constant_clip_gives_a_constant_sigma_equal_to_target_calibration() -> None:
    schedule = clip_tied(T, "poisson", Q, clip_0=1.0, rho_c=1.0, epsilon=2.0, delta=1e-5)
    assert len(set(schedule.sigmas())) == 1


def test_ledger_accounts_it_like_the_explicit_schedule(tmp_path: Path) -> None:
    schedule = clip_tied(T, "poisson", Q, clip_0=CLIP_0, rho_c=RHO_C, epsilon=2.0, delta=1e-5)
    kappa = 1.0 / (schedule.sigma(0) * math.sqrt(CLIP_0))
    _, paper_sigmas = _paper_allocation(kappa)
    budget = Budget(2.0, 1e-5)
    eps = []
    for name, sigmas in (("tied", schedule.sigmas()), ("explicit", list(paper_sigmas))):
        with PrivacyLedger.open(tmp_path / f"{name}.jsonl", client_id=name, sampling="poisson",
                                budget=budget) as ledger:
            ledger.plan([[GaussianStep("poisson", Q, float(s))] for s in sigmas])
            for t, sigma in enumerate(sigmas):
                ledger.spend(GaussianStep("poisson", Q, float(sigma)), time=float(t), round=t)
            eps.append(ledger.epsilon())
            assert len(ledger.rounds) == T
    assert eps[0] == pytest.approx(eps[1], rel=1e-9)
    assert eps[0] <= 2.0


def test_scenario_kind_builds_the_schedule_and_is_refused_without_rounds() -> None:
    group = {"name": "g", "count": 1, "data_share": 1.0, "batch_size": 8,
             "clip": {"kind": "decay", "initial": CLIP_0, "final_ratio": RHO_C},
             "noise": {"kind": "clip_tied", "epsilon": 2.0, "delta": 1e-5}, "rounds": T}
    scenario = {"name": "t", "dataset": {"name": "synthetic", "num_samples": 800},
                "model": {"name": "logreg"}, "clients": {"groups": [group]},
                "stop": {"windows": 2}, "server": {"window": 1.0}}
    parsed = parse_scenario(scenario)
    built = make_schedule(parsed.clients.groups[0], q=Q, where="g")
    direct = clip_tied(T, "poisson", Q, clip_0=CLIP_0, rho_c=RHO_C, epsilon=2.0, delta=1e-5)
    assert built.sigmas() == direct.sigmas() and built.clips() == direct.clips()
    for bad in ({**group, "rounds": None},
                {**group, "noise": {"kind": "clip_tied", "epsilon": 2.0}},
                {**group, "noise": {"kind": "clip_tied", "epsilon": 2.0, "delta": 1e-5,
                                    "mu_total": 1.0}}):
        with pytest.raises(ConfigError):
            parse_scenario({**scenario, "clients": {"groups": [bad]}})


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConfigError):
        clip_tied(T, "poisson", Q, rho_c=1.5, epsilon=2.0, delta=1e-5)
    with pytest.raises(ConfigError):
        clip_tied(T, "poisson", Q, rho_c=0.5)
    with pytest.raises(ConfigError):
        clip_tied(T, "poisson", Q, rho_c=0.5, epsilon=2.0, delta=1e-5, mu_total=1.0)
