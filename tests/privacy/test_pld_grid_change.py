"""What the PLD accountant's answers do when a step changes its grid (fedsim.privacy.pld,
"When the grid changes").

The grid h follows the kinds of step a history holds, so a step of a new kind can make it finer
(a near-free step: sigma 1000 has a tiny loss std) or coarser (a much less private one), and
the history before it is discretised anew. Every answer stays an upper bound (each is a
pessimistic composition of the whole history), but eps at a fixed delta can be a little
*below* the previous step's answer. These tests hold that wobble to the accountant's own
discretisation error (0.1% of eps) on the two cases found and on random histories, and hold
both answers above an independent optimistic (lower) estimate from dp_accounting.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dp_pld

from fedsim.privacy.events import GaussianStep, Sampling
from fedsim.privacy.pld import PLDAccountant

# The relative fall allowed when one step is appended: the grid's discretisation error.
# Measured worst over 300 random histories of 2-4 kinds (q 0.003-0.1, sigma 0.8-4 or
# 100-10000, both schemes, deltas 1e-5, 1e-8 and 1e-10): 8.7e-4.
GRID_WOBBLE = 1e-3
Q = 128 / 3890  # the quickstart phone's rate (batch 128 of 3,890 records)


def _optimistic_epsilon(history: list[GaussianStep], delta: float) -> float:
    """dp_accounting's optimistic PLD of a Poisson history: at or below the true eps."""
    composed = None
    for step in history:
        one = dp_pld.from_gaussian_mechanism(
            step.sigma, sampling_prob=step.q, value_discretization_interval=1e-4,
            pessimistic_estimate=False, use_connect_dots=False).self_compose(step.count)
        composed = one if composed is None else composed.compose(one)
    assert composed is not None
    return float(composed.get_epsilon_for_delta(delta))


def test_a_near_free_step_makes_the_grid_finer_and_eps_moves_within_its_error() -> None:
    # the user's report: a quickstart phone's ledger (272 steps at sigma 1.2), then one step at
    # sigma 1000: the grid got 100 times finer and eps read 2.4965 after 2.4981
    before_steps = [GaussianStep("poisson", Q, 1.2, 272)]
    after_steps = [*before_steps, GaussianStep("poisson", Q, 1000.0, 1)]
    before, after = PLDAccountant(before_steps), PLDAccountant(after_steps)
    assert after.discretisation() < before.discretisation() / 50  # the cause
    eps_before, eps_after = before.epsilon(1e-5), after.epsilon(1e-5)
    assert eps_after >= eps_before * (1 - GRID_WOBBLE)
    truth_below = _optimistic_epsilon(after_steps, 1e-5)  # 2.4829 (pessimistic: 2.4965)
    assert eps_after >= truth_below and eps_before >= _optimistic_epsilon(before_steps, 1e-5)
    assert round(eps_before, 4) == 2.4981


def test_a_much_less_private_step_makes_the_grid_coarser_within_its_error() -> None:
    # found by a property test: fixed-size steps at sigma 100, 1, 100 (q 0.003); the step at
    # sigma 1 coarsens the grid (the finest kind is held to 1/100 of the largest loss std)
    steps = [GaussianStep("fixed", 0.003, 100.0), GaussianStep("fixed", 0.003, 1.0),
             GaussianStep("fixed", 0.003, 100.0)]
    accountant = PLDAccountant()
    grids, answers = [], []
    for step in steps:
        accountant.compose([step])
        grids.append(accountant.discretisation())
        answers.append(accountant.epsilon(1e-10))
    assert grids[1] > grids[0]
    for earlier, later in zip(answers, answers[1:], strict=False):
        assert later >= earlier * (1 - GRID_WOBBLE)


@pytest.mark.parametrize("seed", range(4))
def test_appending_a_step_never_lowers_eps_by_more_than_the_grid_error(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sampling: Sampling = "poisson" if seed % 2 == 0 else "fixed"
    kinds = [GaussianStep(sampling, float(rng.choice([0.003, 0.02, 0.1, Q])),
                          float(rng.uniform(0.8, 4.0) if i % 2 == 0 else rng.uniform(100, 10000)),
                          int(rng.integers(1, 300)))
             for i in range(3)]
    accountant = PLDAccountant()
    previous = {1e-5: 0.0, 1e-10: 0.0}
    for index in rng.integers(0, 3, 8):
        accountant.compose([kinds[int(index)]])
        for delta, held in previous.items():
            now = accountant.epsilon(delta)
            assert math.isfinite(now) and now >= held * (1 - GRID_WOBBLE), (delta, now, held)
            previous[delta] = max(now, held)
