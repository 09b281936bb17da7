"""The PLD accountant's answers never fall when a step is composed (fedsim.privacy.pld_floor).

A step that changes the grid (a near-free step has a tiny loss std: the grid gets finer) used
to shed the discretisation pessimism of every step before it: 272 steps at sigma 1.2 read
eps 2.4981, the same plus one step at sigma 1000 read 2.4965. The finished stretch's answers
now floor every later answer; these tests hold them to it, and to dp_accounting (an
independent PLD) from below.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dp_pld
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.privacy.pld import PLDAccountant
from fedsim.privacy.pld_floor import DELTAS, Floor

DELTAS_ASKED = (1e-5, 1e-10)
Q = 128 / 3890  # the quickstart phone's rate (batch 128 of 3,890 records)
# Within a stretch (a fixed grid) eps is monotone in the steps up to the FFT noise allowance
# (fedsim.privacy.pld_state.NOISE_FACTOR), which varies from one composition to the next:
# relative falls measured over ~3,300 random appends: none at 1e-5, 9e-5 at 1e-10 (the
# fedsim.privacy.pld docstring). A grid change shed ~1e-3: far above these.
FFT_RESIDUAL = {1e-5: 1e-7, 1e-10: 2e-4}


def test_a_near_free_step_does_not_lower_eps() -> None:
    # the user's report: a quickstart phone's ledger (272 Poisson steps at q = 128/3890,
    # sigma 1.2, eps 2.4981), then one step at sigma 1000 (it read 2.4965)
    accountant = PLDAccountant([GaussianStep("poisson", Q, 1.2, 272)])
    before, grid = accountant.epsilon(1e-5), accountant.discretisation()
    accountant.compose([GaussianStep("poisson", Q, 1000.0, 1)])
    assert accountant.discretisation() < grid / 50  # the grid did change (the cause)
    assert accountant.epsilon(1e-5) >= before
    # the floor keeps the stretch's own answer at the budget's delta, no more
    assert accountant.epsilon(1e-5) == before
    assert accountant.delta(before) >= PLDAccountant(
        [GaussianStep("poisson", Q, 1.2, 272)]).delta(before)
    assert round(before, 4) == 2.4981


def test_a_single_kind_has_no_floor_and_answers_as_before() -> None:
    accountant = PLDAccountant([GaussianStep("poisson", 0.01, 1.1, 500)])
    accountant.compose([GaussianStep("poisson", 0.01, 1.1, 300)])
    assert accountant.floor is None and accountant.order_key is None
    assert accountant.epsilon(1e-5) == max(0.0, max(p.epsilon(1e-5) for p in accountant.pmfs()))


def test_the_floor_keeps_the_stretch_answers_exactly_at_its_points_and_above_between() -> None:
    stretch = PLDAccountant([GaussianStep("poisson", 0.02, 0.9, 400)])
    floor = Floor.of_pmfs(stretch.pmfs())
    for j in (0, 31, 159, 319, 383):
        # (the accountant answers no eps below 0)
        assert max(0.0, floor.epsilon(float(DELTAS[j]))) == stretch.epsilon(float(DELTAS[j]))
    rng = np.random.default_rng(5)
    for delta in 10.0 ** rng.uniform(-15.9, -0.2, 200):
        assert max(0.0, floor.epsilon(float(delta))) >= stretch.epsilon(float(delta))
    for delta in 10.0 ** rng.uniform(-12.0, -3.0, 200):  # the chords' looseness
        assert floor.epsilon(float(delta)) <= stretch.epsilon(float(delta)) * (1 + 2e-4)
    eps = np.linspace(-0.5, stretch.epsilon(1e-12) + 1.0, 400)
    assert np.all(floor.deltas(eps) >= stretch.delta_curve(eps) * (1 - 1e-9))
    alpha = np.linspace(0.0, 1.0, 101)
    # both are lower bounds, from different supporting lines (the stretch's atoms, the floor's
    # points, which are the chords' breakpoints): they agree closely
    assert np.all(floor.tradeoff(alpha) <= stretch.tradeoff(alpha) + 1e-6)
    assert np.all(floor.tradeoff(alpha) >= stretch.tradeoff(alpha) - 5e-4)


def test_epsilons_is_epsilon_bit_for_bit() -> None:
    for pmf in PLDAccountant([GaussianStep("poisson", 0.05, 1.3, 200),
                              GaussianStep("poisson", 0.01, 3.0, 50)]).pmfs():
        asked = np.concatenate([DELTAS, [0.3, 1e-5, 2.5e-7, 1e-300]])
        assert [float(e) for e in pmf.epsilons(asked)] == [pmf.epsilon(float(d)) for d in asked]


def test_batching_does_not_change_the_floor() -> None:
    # the ledger composes its spends in batches when it is read; a reopened ledger composes
    # its records in one go: the state a new kind meets is the same history either way
    rng = np.random.default_rng(11)
    kinds = [GaussianStep("poisson", 0.03, 1.2), GaussianStep("poisson", 0.03, 1000.0),
             GaussianStep("poisson", 0.01, 2.0), GaussianStep("poisson", 0.05, 300.0)]
    history = [kinds[int(i)] for i in rng.choice(4, 120, p=[0.7, 0.1, 0.15, 0.05])]
    stepwise = PLDAccountant()
    for step in history:
        stepwise.compose([step])
    batched = PLDAccountant()
    cut = 0
    while cut < len(history):
        size = int(rng.integers(1, 20))
        batched.compose(history[cut:cut + size])
        cut += size
    one_go = PLDAccountant(history)
    assert stepwise.floor is not None
    assert stepwise.order_key == batched.order_key == one_go.order_key
    for delta in DELTAS_ASKED:
        assert stepwise.epsilon(delta) == batched.epsilon(delta) == one_go.epsilon(delta)


def test_a_reopened_ledger_reads_what_the_live_one_read(tmp_path: Path) -> None:
    path = tmp_path / "c.ledger"
    ledger = PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None,
                                fsync=False)
    steps = ([GaussianStep("poisson", Q, 1.2)] * 150
             + [GaussianStep("poisson", Q, 1000.0)]
             + [GaussianStep("poisson", Q, 1.2)] * 30)
    for index, step in enumerate(steps):
        ledger.spend(step, time=float(index), round=index)
        if index % 37 == 0:
            ledger.epsilon(1e-5)
    live = ledger.epsilon(1e-5)
    assert ledger.accountant.order_key is not None  # the sigma-1000 step made a floor
    ledger.close()
    reopened = PrivacyLedger.open(path, client_id="c", sampling="poisson", budget=None,
                                  read_only=True)
    assert reopened.epsilon(1e-5) == live
    reopened.close()


def test_the_floor_stays_one_array_over_a_drifting_schedule() -> None:
    # a noise multiplier that changes every round: many kinds, regrids, one floor (growing
    # noise refines the grid at every quarter octave of the smallest loss std)
    accountant = PLDAccountant()
    changes = 0
    grid = None
    for t in range(30):
        accountant.compose([GaussianStep("poisson", 0.01, 1.1 ** t)])
        if accountant.discretisation() != grid:
            changes, grid = changes + 1, accountant.discretisation()
    assert changes > 10
    floor = accountant.floor
    assert floor is not None and floor.eps.shape == DELTAS.shape
    assert floor.eps.nbytes == 8 * DELTAS.size  # 4 KB, whatever the history


def _dp_epsilon(history: list[GaussianStep], delta: float) -> float:
    """dp_accounting's optimistic PLD (a lower estimate) of a Poisson history."""
    composed = None
    for step in history:
        one = dp_pld.from_gaussian_mechanism(
            step.sigma, sampling_prob=step.q, value_discretization_interval=2e-4,
            pessimistic_estimate=False).self_compose(step.count)
        composed = one if composed is None else composed.compose(one)
    assert composed is not None
    return float(composed.get_epsilon_for_delta(delta))


kinds_strategy = st.builds(
    GaussianStep, st.sampled_from(["poisson", "fixed"]), st.sampled_from([0.003, 0.02, 0.1]),
    st.one_of(st.floats(0.8, 4.0), st.floats(100.0, 10000.0)), st.integers(1, 200))


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sampling=st.sampled_from(["poisson", "fixed"]),
       kinds=st.lists(kinds_strategy, min_size=2, max_size=4),
       order=st.lists(st.integers(0, 3), min_size=2, max_size=10))
def test_eps_never_falls_as_steps_are_appended(sampling: str, kinds: list[GaussianStep],
                                               order: list[int]) -> None:
    kinds = [GaussianStep(sampling, k.q, k.sigma, k.count) for k in kinds]
    history = [kinds[i % len(kinds)] for i in order]
    accountant = PLDAccountant()
    previous = dict.fromkeys(DELTAS_ASKED, 0.0)
    for step in history:
        accountant.compose([step])
        for delta in DELTAS_ASKED:
            now = accountant.epsilon(delta)
            assert now >= previous[delta] * (1 - FFT_RESIDUAL[delta]), (delta, now)
            previous[delta] = max(now, previous[delta])
    if sampling == "poisson" and all(math.isfinite(v) for v in previous.values()):
        grouped: dict[tuple[float, float], int] = {}
        for step in history:
            grouped[(step.q, step.sigma)] = grouped.get((step.q, step.sigma), 0) + step.count
        merged = [GaussianStep("poisson", q, s, n) for (q, s), n in grouped.items()]
        assert previous[1e-5] >= _dp_epsilon(merged, 1e-5) - 2e-3


def test_reports_compose_in_the_order_released() -> None:
    # the run's eps history and summary read what the ledger read: the same sequence
    from fedsim.reporting.epsilon_history import EpsilonCache

    released = ([GaussianStep("poisson", Q, 1.2, 272)]
                + [GaussianStep("poisson", Q, 1000.0)]
                + [GaussianStep("poisson", Q, 1.2)] * 3)
    live = PLDAccountant()
    for step in released:
        live.compose([step])
    assert EpsilonCache(1e-5).epsilon(PLDAccountant(), released) == live.epsilon(1e-5)


def test_a_schedule_lists_its_steps_in_release_order() -> None:
    from fedsim.privacy.schedules import Schedule

    steps = Schedule(20, 2.0, 1.0, 3.0, 1.0).steps("poisson", 0.01, 2)  # growing mu
    sigmas = [s.sigma for s in steps]
    assert sigmas == sorted(sigmas, reverse=True) and len(set(sigmas)) > 1
    assert sum(s.count for s in steps) == 40
