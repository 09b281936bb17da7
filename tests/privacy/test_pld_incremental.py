"""Incremental PLD composition (issue 18 item 1) and overflow-free eps/delta (the warnings of
a 10-client 200-window MNIST run).

Composing a history step by step, with dry runs (previews) in between, gives *the same
numbers* as composing it in one go (the state is an exact integer sum, see
:mod:`fedsim.privacy.pld_state`), so it is never below the one-shot composition: compared with
``==``, not a tolerance.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dp_pld
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.privacy.events import GaussianStep
from fedsim.privacy.pld import PLDAccountant
from fedsim.privacy.pld_step import LossPmf
from fedsim.privacy.rdp import RDPAccountant

DELTA = 1e-5

steps_strategy = st.lists(
    st.builds(GaussianStep, st.just("poisson"), st.sampled_from([0.004, 0.01, 0.05, 0.2]),
              st.floats(0.6, 3.0), st.integers(1, 40)),
    min_size=1, max_size=50)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(steps=steps_strategy, data=st.data())
def test_step_by_step_with_dry_runs_equals_one_shot(steps: list[GaussianStep],
                                                    data: st.DataObject) -> None:
    one_shot = PLDAccountant(steps)
    incremental = PLDAccountant()
    for step in steps:
        if data.draw(st.booleans()):  # a dry run first (ledgers do this before a release)
            probe = data.draw(st.sampled_from(steps))
            before = incremental.epsilon(DELTA) if incremental.kinds else 0.0
            incremental.preview([probe, step]).epsilon(DELTA)
            assert (incremental.epsilon(DELTA) if incremental.kinds else 0.0) == before
        incremental.compose([step])
        if data.draw(st.booleans()):
            incremental.epsilon(DELTA)  # answers in between extend the kept state
    for ours, theirs in zip(incremental.pmfs(), one_shot.pmfs(), strict=True):
        assert ours.lower == theirs.lower and ours.infinity_mass == theirs.infinity_mass
        assert np.array_equal(ours.probs, theirs.probs)
    # answered from the state itself, not from a shared cache of answers
    assert max(p.epsilon(DELTA) for p in incremental.pmfs()) == \
        max(p.epsilon(DELTA) for p in one_shot.pmfs())


def test_dry_runs_do_not_mutate_and_bucketed_histories_match() -> None:
    rng = np.random.default_rng(3)
    sigmas = rng.uniform(0.7, 2.0, 300)  # > 32 kinds: the bucketed regime, with regrids
    history = [GaussianStep("poisson", 0.01, float(s)) for s in sigmas]
    incremental = PLDAccountant()
    for i, step in enumerate(history):
        incremental.compose([step])
        if i % 25 == 0:
            incremental.preview(history[:50]).pmfs()
            incremental.pmfs()
    for ours, theirs in zip(incremental.pmfs(), PLDAccountant(history).pmfs(), strict=True):
        assert np.array_equal(ours.probs, theirs.probs)


def test_heterogeneous_history_against_dp_accounting() -> None:
    """An independent check of the composition itself: dp_accounting composing the same
    distinct steps one by one on a 4x finer grid; ours is an upper bound within 0.5%."""
    history = [GaussianStep("poisson", 0.02, s, 20) for s in (0.8, 1.0, 1.3, 1.7, 2.2)]
    ours = PLDAccountant(history)
    h = ours.discretisation() / 4
    composed = None
    for step in history:
        one = dp_pld.from_gaussian_mechanism(step.sigma, sampling_prob=step.q,
                                             value_discretization_interval=h)
        one = one.self_compose(step.count)
        composed = one if composed is None else composed.compose(one)
    assert composed is not None
    reference = composed.get_epsilon_for_delta(DELTA)
    assert reference * (1 - 1e-9) <= ours.epsilon(DELTA) <= reference * 1.005


# -- numerical safety -------------------------------------------------------------------------------
@pytest.mark.parametrize(("sampling", "q", "sigma", "count"), [
    ("poisson", 0.5, 0.5, 2000),  # supports wider than 700 nats: e^(l_max - l) overflowed
    ("poisson", 1.0, 0.3, 200),
    ("fixed", 0.1, 0.3, 2000),
])
def test_wide_supports_compute_without_overflow(sampling: str, q: float, sigma: float,
                                                 count: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "overflow encountered in exp" is now an error
        accountant = PLDAccountant([GaussianStep(sampling, q, sigma, count)])  # type: ignore[arg-type]
        eps = accountant.epsilon(DELTA)
        delta = accountant.delta(eps)
        beta = accountant.tradeoff(np.linspace(0.0, 1.0, 11))
    assert math.isfinite(eps) and eps > 0 and delta <= DELTA * (1 + 1e-9)
    assert np.all(np.isfinite(beta))
    # a tight accountant is below the RDP bound of the same mechanism
    assert eps <= RDPAccountant([GaussianStep(sampling, q, sigma, count)]).epsilon(DELTA)  # type: ignore[arg-type]


def test_suffix_sums_in_log_space_match_the_definition() -> None:
    """A PMF whose support spans 1,000 nats against delta(eps) summed atom by atom."""
    h = 0.5
    probs = np.zeros(2001)
    probs[[0, 1, 1000, 1990, 2000]] = [0.5, 0.2, 0.2, 0.0999, 1e-4]
    pmf = LossPmf(h, -1000, probs, 1e-12)
    losses = (-1000 + np.arange(probs.size)) * h

    def direct(eps: float) -> float:
        above = losses > eps
        return min(1.0, float(np.sum(probs[above] * -np.expm1(eps - losses[above]))) + 1e-12)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grid = np.array([-600.0, -3.0, 0.0, 1.7, 400.0, 499.0])
        assert np.allclose(pmf.deltas(grid), [direct(e) for e in grid], rtol=1e-12, atol=0)
        eps = pmf.epsilon(1e-3)
    assert direct(eps) == pytest.approx(1e-3, rel=1e-9)
