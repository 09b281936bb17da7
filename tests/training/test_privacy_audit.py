"""Empirical privacy audit of the DP step (Jagielski et al. 2020; Nasr et al. 2021 style).

Canaries with crafted gradients: the model is ``w . x`` with per-example loss ``w . x``, so
an example's gradient is its feature vector. Canary ``j`` is ``10 e_j`` (clipped to ``C e_j``).
Coordinate ``j`` of the released update depends only on canary ``j`` and on independent
noise, so one release gives ``d`` independent observations of the test "canary j in or out"
(Poisson, add/remove) or "canary j is +c or -c" (fixed size, replace-one).

For a threshold test, (eps, delta)-DP implies ``FPR + e^eps FNR >= 1 - delta`` and the
symmetric inequality (Kairouz et al. 2015), so ``eps >= log((1 - delta - FPR) / FNR)``.
Clopper-Pearson upper bounds on FPR and FNR (Bonferroni over the thresholds, 95% overall)
give a lower bound on eps that holds with 95% confidence. It must stay below the PLD
accountant's eps with the correct noise, and exceed it when the noise is scaled down 4x.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.training import dpsgd
from fedsim.training.persample import PerSampleEngine

DELTA = 1e-5
SIGMA = 2.0
CLIP = 1.0
CANARIES = 500
RELEASES = 20  # 10,000 observations per hypothesis
CONFIDENCE = 0.95


def _linear_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return outputs[:, 0]


def _observations(
    sampling: str, sign: float, present: bool, generator: torch.Generator
) -> np.ndarray:
    """Per-coordinate observations (update * m) from RELEASES releases of the real DP step."""
    model = nn.Linear(CANARIES, 1, bias=False).double()
    engine = PerSampleEngine(model)
    records = [torch.zeros(1, CANARIES, dtype=torch.float64)]  # a record with zero gradient
    if present:
        records.append(sign * 10.0 * torch.eye(CANARIES, dtype=torch.float64))
    features = torch.cat(records)
    labels = torch.zeros(len(features), dtype=torch.long)
    out = []
    for _ in range(RELEASES):
        indices = dpsgd.sample_batch(sampling, len(features), len(features), generator)  # q = 1
        release = dpsgd.noisy_gradient(
            engine,
            features,
            labels,
            indices,
            sampling=sampling,
            clip=CLIP,
            noise_multiplier=SIGMA,
            expected_batch_size=1.0,
            generator=generator,
            loss_fn=_linear_loss,
        )
        out.append(release.gradient.numpy())
    return np.concatenate(out)


def _clopper_pearson_upper(failures: int, trials: int, alpha: float) -> float:
    return (
        1.0
        if failures >= trials
        else float(stats.beta.ppf(1 - alpha, failures + 1, trials - failures))
    )


def epsilon_lower_bound(null: np.ndarray, alternative: np.ndarray) -> float:
    """Largest eps certified by threshold tests "alternative if x > t" at 95% confidence."""
    thresholds = np.quantile(np.concatenate([null, alternative]), np.linspace(0.01, 0.99, 99))
    alpha = (1 - CONFIDENCE) / (2 * len(thresholds))
    best = 0.0
    for t in thresholds:
        fpr = _clopper_pearson_upper(int((null > t).sum()), len(null), alpha)
        fnr = _clopper_pearson_upper(int((alternative <= t).sum()), len(alternative), alpha)
        for a, b in ((fpr, fnr), (fnr, fpr)):
            if 1 - DELTA - a > 0 and b > 0:
                best = max(best, math.log((1 - DELTA - a) / b))
    return best


def _audit(sampling: str) -> float:
    generator = torch.Generator().manual_seed(2024)
    if sampling == "poisson":  # add/remove: canary absent vs present
        null = _observations(sampling, 1.0, False, generator)
        alternative = _observations(sampling, 1.0, True, generator)
    else:  # replace-one: canary -c vs +c
        null = _observations(sampling, -1.0, True, generator)
        alternative = _observations(sampling, 1.0, True, generator)
    return epsilon_lower_bound(null, alternative)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_audit_stays_below_the_accountant_with_correct_noise(sampling: str) -> None:
    accountant_eps = make_accountant("pld", [GaussianStep(sampling, 1.0, SIGMA)]).epsilon(DELTA)
    lower = _audit(sampling)
    assert 0.5 < lower < accountant_eps  # informative (not 0) and consistent


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_audit_catches_noise_scaled_down_4x(sampling: str, monkeypatch: pytest.MonkeyPatch) -> None:
    accountant_eps = make_accountant("pld", [GaussianStep(sampling, 1.0, SIGMA)]).epsilon(DELTA)
    correct = dpsgd.sensitivity
    monkeypatch.setattr(dpsgd, "sensitivity", lambda scheme, clip: correct(scheme, clip) / 4)
    assert _audit(sampling) > accountant_eps


def test_forgetting_the_factor_two_of_fixed_batches_is_caught() -> None:
    """The classic bug: Poisson noise C sigma for fixed-size (replace-one) batches. At sigma=2
    the true mu doubles from 0.5 to 1; the audit certifies more than the claimed eps."""
    accountant_eps = make_accountant("pld", [GaussianStep("fixed", 1.0, SIGMA)]).epsilon(DELTA)
    generator = torch.Generator().manual_seed(7)
    original = dpsgd.sensitivity
    try:
        dpsgd.sensitivity = lambda scheme, clip: clip  # type: ignore[assignment]
        null = np.concatenate([_observations("fixed", -1.0, True, generator) for _ in range(2)])
        alternative = np.concatenate(
            [_observations("fixed", 1.0, True, generator) for _ in range(2)]
        )
    finally:
        dpsgd.sensitivity = original  # type: ignore[assignment]
    assert epsilon_lower_bound(null, alternative) > accountant_eps
