"""PrivacyLedger.plan: planned rounds of a changing schedule answered by counting, exactly."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fedsim.errors import BudgetExhausted
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.schedules import Schedule

DELTA = 1e-5


def growing_mu_rounds(rounds: int, q: float, local_steps: int = 2) -> list[list[GaussianStep]]:
    schedule = Schedule(rounds, sigma_0=2.5, rho_mu=3.0)  # every round a new sigma_t
    return [[GaussianStep("poisson", q, schedule.sigma(t))] * local_steps for t in range(rounds)]


def open_ledger(path: Path, epsilon: float) -> PrivacyLedger:
    return PrivacyLedger.open(path, client_id="c", sampling="poisson",
                              budget=Budget(epsilon, DELTA))


def full_check(ledger: PrivacyLedger, steps: list[GaussianStep]) -> bool:
    """The slow path, written out: the whole history plus ``steps`` through the accountant."""
    budget = ledger.budget
    assert budget is not None
    return ledger.accountant.preview(steps).epsilon(budget.delta) <= budget.epsilon


def test_plan_of_300_growing_mu_rounds_is_exact_and_fast(tmp_path: Path) -> None:
    rounds = growing_mu_rounds(300, q=0.02)
    everything = [s for r in rounds for s in r]
    whole = make_accountant("pld", everything).epsilon(DELTA)
    # A budget that runs out part-way through the plan.
    epsilon = 0.8 * whole
    with open_ledger(tmp_path / "planned.jsonl", epsilon) as ledger:
        started = time.perf_counter()
        fit = ledger.plan(rounds)
        released = 0
        for index, steps in enumerate(rounds):
            if not ledger.can_spend(steps):
                break
            ledger.spend(steps, time=float(index), round=index)
            released += 1
        seconds = time.perf_counter() - started
        assert 0 < fit == released < len(rounds)
        # The boundary is the full check's: the last released round fitted, the next does not.
        assert ledger.epsilon() <= epsilon
        assert not full_check(ledger, rounds[released])
        assert not ledger.can_spend(rounds[released])
    # The released prefix, and one round more, accounted from scratch.
    prefix = [s for r in rounds[:released] for s in r]
    assert make_accountant("pld", prefix).epsilon(DELTA) <= epsilon
    assert make_accountant("pld", prefix + rounds[released]).epsilon(DELTA) > epsilon
    # O(log T) accountant evaluations in all, where the full check costs one or more per round.
    assert seconds < 60, seconds


def test_planned_answers_equal_the_full_check_round_by_round(tmp_path: Path) -> None:
    rounds = growing_mu_rounds(16, q=0.05, local_steps=1)
    epsilon = 0.7 * make_accountant("pld", [s for r in rounds for s in r]).epsilon(DELTA)
    with open_ledger(tmp_path / "planned.jsonl", epsilon) as planned, \
            open_ledger(tmp_path / "slow.jsonl", epsilon) as slow:
        planned.plan(rounds)
        for index, steps in enumerate(rounds):
            answer = planned.can_spend(steps)
            assert answer == slow.can_spend(steps) == full_check(slow, steps)
            if not answer:
                break
            planned.spend(steps, time=float(index), round=index)
            slow.spend(steps, time=float(index), round=index)
        assert planned.epsilon() == slow.epsilon()
        assert 0 < index < len(rounds) - 1


def test_off_plan_spend_falls_back_to_the_full_check(tmp_path: Path) -> None:
    rounds = growing_mu_rounds(12, q=0.05, local_steps=1)
    epsilon = make_accountant("pld", [s for r in rounds for s in r]).epsilon(DELTA)
    with open_ledger(tmp_path / "l.jsonl", epsilon) as ledger:
        assert ledger.plan(rounds) == len(rounds)  # exactly the whole plan fits
        ledger.spend(rounds[0], time=0.0, round=0)
        # An extra, unplanned release: the plan no longer describes the state.
        extra = [GaussianStep("poisson", 0.05, 0.9)]
        ledger.spend(extra, time=1.0, round=1)
        for steps in rounds[1:]:
            assert ledger.can_spend(steps) == full_check(ledger, steps)
            if not ledger.can_spend(steps):
                break
            ledger.spend(steps, time=2.0, round=2)
        assert ledger.epsilon() <= epsilon
        assert not ledger.can_spend(rounds[-1])  # the extra step pushed the last round out


def test_plan_without_budget_fits_everything(tmp_path: Path) -> None:
    rounds = growing_mu_rounds(5, q=0.05)
    with PrivacyLedger.open(tmp_path / "l.jsonl", client_id="c", sampling="poisson",
                            budget=None) as ledger:
        assert ledger.plan(rounds) == 5 and ledger.can_spend(rounds[0])
        assert ledger.plan([]) == 0


def test_a_plan_reaching_a_vanishing_sigma_counts_the_rounds_before_it(tmp_path: Path) -> None:
    """An attacker's plan ending in rounds of sigma 8.7e-6 (no step of it can be priced: no
    privacy) raised out of plan(), and the ledger, left holding the new plan with the old
    count, then refused every planned round, the affordable ones too. The plan now counts
    the rounds before it; those are spent, and the first unpriceable one is refused as over
    budget (the client stops as out of budget, not crashed)."""
    fine, none = GaussianStep("poisson", 0.01, 1.0), GaussianStep("poisson", 0.01, 8.7e-6)
    with PrivacyLedger.open(tmp_path / "c.jsonl", client_id="c", sampling="poisson",
                            budget=Budget(3.0, 1e-5)) as ledger:
        assert ledger.plan([[fine]] * 5 + [[none]] * 3) == 5
        for r in range(5):
            assert ledger.can_spend(fine)
            ledger.spend(fine, time=float(r), round=r)
        assert not ledger.can_spend(none)
        with pytest.raises(BudgetExhausted):
            ledger.spend(none, time=5.0, round=5)
        assert len(ledger.records) == 5
