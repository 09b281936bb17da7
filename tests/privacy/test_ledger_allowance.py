"""The ledger's allowance: can_spend by counting, the same decisions as a fresh accountant
(issue 24, item 1), near-linear unplanned spending and finite eps where pld has none
(issue 23, part 3)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedsim.privacy.accountant import make_accountant, smallest_epsilon
from fedsim.privacy.events import GaussianStep, Sampling
from fedsim.privacy.ledger import Budget, PrivacyLedger
from fedsim.privacy.pld import PLDAccountant

DELTA = 1e-5


def open_ledger(path: Path, sampling: Sampling, epsilon: float) -> PrivacyLedger:
    return PrivacyLedger.open(path, client_id="c", sampling=sampling,
                              budget=Budget(epsilon, DELTA))


def fresh_decision(history: tuple[GaussianStep, ...], round_steps: list[GaussianStep],
                   epsilon: float, delta: float = DELTA) -> bool:
    """The decision of a fresh accountant for the history plus the round, through the
    accountant interface (no ledger state)."""
    fresh = make_accountant("pld", [*history, *round_steps])
    return smallest_epsilon(fresh, delta, only_if_infinite=True)[0] <= epsilon


def decided_as_a_fresh_accountant(ledger: PrivacyLedger, budget: float,
                                  next_round: Callable[[], list[GaussianStep]], rounds: int, *,
                                  refusals: int) -> list[bool]:
    """Ask ``ledger`` about ``rounds`` rounds from ``next_round`` (spending those that fit),
    each answer checked against :func:`fresh_decision`, until ``refusals`` refusals; the
    answers."""
    answers: list[bool] = []
    for index in range(rounds):
        round_steps = next_round()
        expected = fresh_decision(ledger.steps, round_steps, budget)
        assert ledger.can_spend(round_steps) == expected, (index, round_steps)
        answers.append(expected)
        if expected:
            ledger.spend(round_steps, time=float(index), round=index)
        elif answers.count(False) >= refusals:
            break
    return answers


def spend_while_it_fits(ledger: PrivacyLedger, round_steps: list[GaussianStep]) -> int:
    """Spend ``round_steps`` round after round until the ledger refuses one; how many it took."""
    released = 0
    while ledger.can_spend(round_steps):
        ledger.spend(round_steps, time=float(released), round=released)
        released += 1
    return released


class Evaluations:
    """Counts eps evaluations of the pld accountant (the ledger's enforcing one)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = PLDAccountant.epsilon

        def counted(accountant: PLDAccountant, delta: float) -> float:
            self.count += 1
            return real(accountant, delta)

        monkeypatch.setattr(PLDAccountant, "epsilon", counted)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_decisions_equal_a_fresh_accountant_on_random_schedules(tmp_path: Path,
                                                                sampling: Sampling) -> None:
    rng = random.Random(24 if sampling == "poisson" else 25)
    qs, sigmas = (0.01, 0.02, 0.03), (0.9, 1.1, 1.3, 1.6)
    posture = (rng.choice(qs), rng.choice(sigmas))
    budget = 1.2 if sampling == "poisson" else 3.0  # replace-one costs more per step

    def next_round() -> list[GaussianStep]:
        nonlocal posture
        if rng.random() < 0.15:  # a schedule step: new q and/or sigma
            posture = (rng.choice(qs), rng.choice(sigmas))
        return [GaussianStep(sampling, posture[0], posture[1], rng.choice([1, 1, 2, 3]))]

    with open_ledger(tmp_path / "l.jsonl", sampling, budget) as ledger:
        answers = decided_as_a_fresh_accountant(ledger, budget, next_round, 400, refusals=25)
    # the schedules reached the budget's edge: refusals, and acceptances after the first one
    # (a more private posture, or a smaller round, still fitting)
    first_refusal = answers.index(False)
    assert first_refusal > 20 and True in answers[first_refusal:]


def test_unchanged_posture_is_answered_by_counting(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    step = GaussianStep("poisson", 0.01, 1.5, 2)
    evaluations = Evaluations(monkeypatch)
    with open_ledger(tmp_path / "l.jsonl", "poisson", 0.6) as ledger:
        released = spend_while_it_fits(ledger, [step])
        checks = released + 1
        # O(log T) evaluations for the whole run, not one (or more) per check
        assert released > 100 and evaluations.count <= 3 * math.log2(2 * released) + 6, \
            (released, evaluations.count)
        # the boundary is the fresh accountant's
        assert ledger.steps == (step.times(step.count * released),)
        assert fresh_decision(ledger.steps, [], 0.6)
        assert not fresh_decision(ledger.steps, [step], 0.6)
        assert checks > 10 * evaluations.count


def drifting_steps(count: int) -> list[GaussianStep]:
    """Growing mu_t: a different sigma every round (the benchmark's schedule)."""
    return [GaussianStep("poisson", 256 / 60000, 1.5 * (0.8 / 1.5) ** (t / count))
            for t in range(count)]


@pytest.mark.slow
def test_unplanned_drifting_schedule_is_near_linear(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """No plan, sigma changing every round: the number of accountant evaluations grows far
    slower than the rounds (it was one or more per round), and the boundary round is decided
    as a fresh accountant decides it."""
    counts: dict[int, int] = {}
    for count in (150, 600):
        evaluations = Evaluations(monkeypatch)
        with open_ledger(tmp_path / f"far-{count}.jsonl", "poisson", 1000.0) as ledger:
            for index, step in enumerate(drifting_steps(count)):
                assert ledger.can_spend(step)
                ledger.spend(step, time=float(index), round=index)
        counts[count] = evaluations.count
    assert counts[600] <= 40 and counts[600] < counts[150] * 2, counts
    # a budget that binds part-way: every decision near the edge is the fresh accountant's
    steps = drifting_steps(600)
    with open_ledger(tmp_path / "edge.jsonl", "poisson", 0.5) as ledger:
        index = 0
        while ledger.can_spend(steps[index]):
            ledger.spend(steps[index], time=float(index), round=index)
            index += 1
        assert 0 < index < len(steps)
        assert fresh_decision(ledger.steps, [], 0.5)
        assert not fresh_decision(ledger.steps, [steps[index]], 0.5)
        for later in steps[index: index + 5]:  # less private still: refused, like the fresh
            assert not ledger.can_spend(later) and not fresh_decision(ledger.steps, [later], 0.5)


def test_ledger_eps_is_finite_where_pld_is_not(tmp_path: Path) -> None:
    """A budget at delta 1e-100, which pld does not resolve (it answers inf: its tail is
    truncated near 1e-15): the ledger keeps spending under rdp's finite bound and reports it."""
    tiny = 1e-100
    block = GaussianStep("poisson", 1e-4, 100.0, 60_000)
    with PrivacyLedger.open(tmp_path / "l.jsonl", client_id="c", sampling="poisson",
                            budget=Budget(1.0, tiny)) as ledger:
        for index in range(4):
            assert ledger.can_spend(block)
            ledger.spend(block, time=float(index), round=index)
        assert math.isinf(ledger.accountant.epsilon(tiny))
        eps, source = ledger.epsilon_bound()
        rdp: Any = make_accountant("rdp", ledger.steps)
        assert source == "rdp" and eps == ledger.epsilon() == rdp.epsilon(tiny) < 1.0


# -- a ledger's first allowance (issue 24: each client's first check searches once) ------------
def _forget_shared_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedsim.privacy import budget as budget_module

    monkeypatch.setattr(budget_module, "_fits_answers", type(budget_module._fits_answers)())


def test_a_first_allowance_far_from_the_budget_costs_one_evaluation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit (128 steps from an empty history) is tried first: one eps evaluation grants
    it (the doubling evaluated 64, then 128); the rounds it covers are answered by counting."""
    _forget_shared_answers(monkeypatch)
    evaluations = Evaluations(monkeypatch)
    step = GaussianStep("poisson", 0.02, 1.1, 2)
    with open_ledger(tmp_path / "l.jsonl", "poisson", 8.0) as ledger:
        for index in range(64):
            assert ledger.can_spend(step)
            ledger.spend(step, time=float(index), round=index)
        assert evaluations.count == 1
    assert fresh_decision((), [step.times(64)], 8.0)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_first_allowances_decide_as_a_fresh_accountant(tmp_path: Path, sampling: Sampling,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty ledgers of random postures and budgets, each spent round by round to its budget:
    budgets where the limit fits (the probe grants it) and where it does not (the doubling
    and bisection as before), every decision the fresh accountant's. One process-wide memory
    of answers serves them all (never another budget's or posture's)."""
    _forget_shared_answers(monkeypatch)
    rng = random.Random(2401 if sampling == "poisson" else 2402)
    for trial in range(6):
        q, sigma = rng.choice((0.01, 0.02, 0.05)), rng.choice((0.9, 1.1, 1.6))
        budget = rng.choice((0.4, 0.8, 1.3, 2.0, 4.0))
        local = rng.choice((1, 2, 3))
        step = GaussianStep(sampling, q, sigma, local)
        with open_ledger(tmp_path / f"l{trial}.jsonl", sampling, budget) as ledger:
            spent = 0
            while spent < 150:
                fits = ledger.can_spend(step)
                assert fits == fresh_decision(ledger.steps, [step], budget), (trial, spent)
                if not fits:
                    break
                ledger.spend(step, time=float(spent), round=spent)
                spent += 1


def test_a_shared_answer_is_never_another_historys(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers are shared between ledgers of the same history (the multiset of its steps),
    posture and budget only: a ledger with one more step searches its own, and decides to the
    step what a fresh accountant decides; one with an equal history evaluates nothing."""
    _forget_shared_answers(monkeypatch)
    step = GaussianStep("poisson", 0.05, 0.9)
    earlier = GaussianStep("poisson", 0.02, 1.1, 40)
    counts = []
    with open_ledger(tmp_path / "a.jsonl", "poisson", 2.0) as empty, \
            open_ledger(tmp_path / "b.jsonl", "poisson", 2.0) as used:
        used.spend(earlier, time=0.0, round=0)
        for ledger in (empty, used):
            spent = 0
            while ledger.can_spend(step):
                ledger.spend(step, time=float(spent + 1), round=spent + 1)
                spent += 1
            assert fresh_decision(ledger.steps, [], 2.0)
            assert not fresh_decision(ledger.steps, [step], 2.0)
            counts.append(spent)
    assert counts[0] > counts[1] > 0
    evaluations = Evaluations(monkeypatch)
    with open_ledger(tmp_path / "c.jsonl", "poisson", 2.0) as same:
        same.spend(earlier, time=0.0, round=0)
        assert same.can_spend(step)
    assert evaluations.count == 0


def test_the_shared_answers_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedsim.privacy import budget as budget_module

    _forget_shared_answers(monkeypatch)
    monkeypatch.setattr(budget_module, "_FITS_KEPT", 4)
    for k in range(10):
        with open_ledger(tmp_path / f"l{k}.jsonl", "poisson", 4.0) as ledger:
            assert ledger.can_spend(GaussianStep("poisson", 0.01 + 0.001 * k, 1.1))
        assert len(budget_module._fits_answers) <= 4


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_the_shared_first_probe_dominates_as_the_accountant_computes(sampling: Sampling) -> None:
    """A first allowance may be granted on the answer for the rate rounded up to the grid
    (shared by ledgers whose rates round alike). That proves the client's own steps fit only
    if the accountant's eps of the rounded steps is at least that of the client's own: checked
    here as computed (grids, truncation and all) on random rates, sigmas and counts."""
    from fedsim.privacy.budget import SHARED_MIN_GAP, SHARED_RATE_GRID, shared_unit

    rng = random.Random(2403 if sampling == "poisson" else 2404)
    step_up = 2 ** (1 / SHARED_RATE_GRID)
    for trial in range(16):
        q = math.exp(rng.uniform(math.log(0.002), math.log(0.3)))
        if trial % 4 == 0:  # just below a grid point: the accountant's rounding is the gap
            q = 2 ** (math.ceil(SHARED_RATE_GRID * math.log2(q)) / SHARED_RATE_GRID) * (1 - 3e-8)
        sigma, count = rng.uniform(0.7, 3.0), rng.choice((1, 17, 128, 256))
        own = GaussianStep(sampling, q, sigma)
        shared = shared_unit(own)
        assert own.q * (1 + SHARED_MIN_GAP) <= shared.q <= own.q * step_up * (1 + 2 * SHARED_MIN_GAP)
        assert shared.sigma == sigma and shared.count == 1
        eps_own = make_accountant("pld", [own.times(count)]).epsilon(DELTA)
        eps_shared = make_accountant("pld", [shared.times(count)]).epsilon(DELTA)
        assert eps_own < eps_shared * (1 - 1e-4), (q, sigma, count)  # by a margin
    for k in (-40, -3):  # on the grid: the next point
        q = 2 ** (k / SHARED_RATE_GRID)
        assert shared_unit(GaussianStep(sampling, q, 1.0)).q == 2 ** ((k + 1) / SHARED_RATE_GRID)
    for q in (1.0, 0.9995):  # no point of the grid far enough above: the step itself
        assert shared_unit(GaussianStep(sampling, q, 1.0)) == GaussianStep(sampling, q, 1.0)


def test_a_first_allowance_near_the_shared_answer_decides_as_a_fresh_accountant(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Budgets just above the rounded rate's eps at the limit (the shared answer grants it,
    one evaluation, none for the next ledger of a nearby rate) and between the two eps (the
    shared answer does not fit, the client's own does): every decision the fresh accountant's."""
    from fedsim.privacy.budget import shared_unit

    _forget_shared_answers(monkeypatch)
    own, nearby = GaussianStep("poisson", 0.0301, 1.2), GaussianStep("poisson", 0.0295, 1.2)
    shared = shared_unit(own)
    assert shared_unit(nearby) == shared != own
    limit = 128
    eps_own = make_accountant("pld", [own.times(limit)]).epsilon(DELTA)
    eps_shared = make_accountant("pld", [shared.times(limit)]).epsilon(DELTA)
    assert eps_own < eps_shared
    evaluations = Evaluations(monkeypatch)
    above = eps_shared * 1.001
    with open_ledger(tmp_path / "a.jsonl", "poisson", above) as first, \
            open_ledger(tmp_path / "b.jsonl", "poisson", above) as second:
        assert first.can_spend(own)
        assert evaluations.count == 1
        assert second.can_spend(nearby)
        assert evaluations.count == 1  # the shared answer
        assert fresh_decision((), [own.times(limit)], above)
        assert fresh_decision((), [nearby.times(limit)], above)
    between = (eps_own + eps_shared) / 2
    with open_ledger(tmp_path / "c.jsonl", "poisson", between) as ledger:
        for index in range(limit + 8):
            fits = ledger.can_spend(own)
            if index in (0, limit - 1, limit, limit + 1) or not fits:
                assert fits == fresh_decision(ledger.steps, [own], between), index
            if not fits:
                break
            ledger.spend(own, time=float(index), round=index)
        assert ledger.rounds and len(ledger.rounds) >= limit


def test_a_rate_just_below_a_grid_point_is_decided_as_a_fresh_accountant_decides(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attacker's review's case: q = 5383/751386 lies 1e-8 below the grid point 2^(-57/8),
    whose eps at 128 steps the accountant computes *below* q's own (its rounding). With the
    budget between the two, the 128th step must be refused, as a fresh accountant refuses it
    (the shared question is asked one grid point further up, with room to spare)."""
    _forget_shared_answers(monkeypatch)
    own = GaussianStep("poisson", 5383 / 751386, 1.0)
    point = GaussianStep("poisson", 2 ** (-57 / 8), 1.0)
    assert 0 < point.q / own.q - 1 < 1e-7
    limit = 128
    budget = make_accountant("pld", [point.times(limit)]).epsilon(DELTA)
    assert make_accountant("pld", [own.times(limit)]).epsilon(DELTA) > budget
    with open_ledger(tmp_path / "l.jsonl", "poisson", budget) as ledger:
        for index in range(limit):
            fits = ledger.can_spend(own)
            if index in (0, limit - 2, limit - 1) or not fits:
                assert fits == fresh_decision(ledger.steps, [own], budget), index
            if not fits:
                break
            ledger.spend(own, time=float(index), round=index)
        assert len(ledger.rounds) == limit - 1
        assert ledger.epsilon() <= budget


def test_an_allowance_covers_a_nearly_equal_kind_only_by_a_margin(tmp_path: Path) -> None:
    """An allowance counted for kind A covered any kind with q <= A.q and sigma >= A.sigma.
    Exactly true, but the accountant's eps is monotone in q only up to its rounding: with
    B.q 1e-11 (relative) below A.q, 1 A + 127 B read a larger eps than 128 A, so with the
    budget between the two the ledger granted a 128th step a fresh accountant refuses (its
    own report then above the budget). A kind not equal to the allowance's is now covered
    only if it is below it by SHARED_MIN_GAP; the decisions are a fresh accountant's."""
    from fedsim.privacy.budget import SHARED_MIN_GAP, Allowance

    a = GaussianStep("poisson", 2 ** (-57 / 8), 1.0)
    b = GaussianStep("poisson", 5383 / 751386, 1.0)
    limit = 128
    eps_a = make_accountant("pld", [a.times(limit)]).epsilon(DELTA)
    eps_mixed = make_accountant("pld", [a, b.times(limit - 1)]).epsilon(DELTA)
    assert b.q < a.q and eps_a < eps_mixed  # the accountant's rounding, as found
    between = (eps_a + eps_mixed) / 2
    with open_ledger(tmp_path / "l.jsonl", "poisson", between) as ledger:
        assert ledger.can_spend(a)
        ledger.spend(a, time=0.0, round=0)
        for index in range(1, limit + 2):
            fits = ledger.can_spend(b)
            assert fits == fresh_decision(ledger.steps, [b], between), index
            if not fits:
                break
            ledger.spend(b, time=float(index), round=index)
        assert len(ledger.rounds) == limit - 1
        eps, _ = smallest_epsilon(ledger._accountant, DELTA, only_if_infinite=True)
        assert eps <= between
    allowance = Allowance(a, 10, None, False, 10)
    assert allowance.covers([a]) and not allowance.covers([b])
    farther = GaussianStep("poisson", a.q / (1 + SHARED_MIN_GAP), a.sigma * (1 + SHARED_MIN_GAP))
    assert allowance.covers([farther, a])
    assert not allowance.covers([GaussianStep("poisson", a.q, a.sigma * (1 + 1e-9))])


def test_a_round_of_several_nearly_equal_kinds_is_decided_as_a_fresh_accountant(
        tmp_path: Path) -> None:
    """A round of two kinds (A, and 127 of B with q 1e-11 below A's) gets a fresh allowance
    of their envelope, A, which dominates B by less than the margin: it may not answer for
    the round (an attacker's review: the ledger granted it with the budget between the two
    eps, a fresh accountant refuses). Rates within the margin of 1, where the envelope's
    widening is capped at q = 1, alike."""
    a = GaussianStep("poisson", 2 ** (-57 / 8), 1.0)
    b = GaussianStep("poisson", 5383 / 751386, 1.0)
    round_steps = [a] + [b] * 127
    eps_a = make_accountant("pld", [a.times(128)]).epsilon(DELTA)
    eps_mixed = make_accountant("pld", round_steps).epsilon(DELTA)
    assert eps_a < eps_mixed
    between = (eps_a + eps_mixed) / 2
    with open_ledger(tmp_path / "l.jsonl", "poisson", between) as ledger:
        assert not ledger.can_spend(round_steps)
        assert not fresh_decision((), round_steps, between)
    near_one = [GaussianStep("fixed", 0.9996, 3.0), GaussianStep("fixed", 0.9999, 3.0)]
    with open_ledger(tmp_path / "m.jsonl", "fixed", 1000.0) as ledger:
        for index in range(40):
            steps = [near_one[index % 2], near_one[(index + 1) % 2]]
            assert ledger.can_spend(steps) == fresh_decision(ledger.steps, steps, 1000.0)
            ledger.spend(steps, time=float(index), round=index)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_rounds_of_several_kinds_are_decided_as_a_fresh_accountant(tmp_path: Path,
                                                                   sampling: Sampling) -> None:
    """Rounds of two or three kinds (a posture kept for a while, then changed; sometimes a
    round of one kind between), each decision against a fresh accountant: the round
    allowance's counting and its refresh when a capped grant is spent decide as it does."""
    rng = random.Random(55 if sampling == "poisson" else 56)
    kinds = [GaussianStep(sampling, 0.01, 1.0), GaussianStep(sampling, 1.0, 20.0),
             GaussianStep(sampling, 0.02, 1.4), GaussianStep(sampling, 0.5, 12.0)]
    cheap = GaussianStep(sampling, 0.001, 4.0)  # a round of one kind that fits after a refusal
    budget = 1.6 if sampling == "poisson" else 2.5
    posture = [kinds[0], kinds[1]]

    def next_round() -> list[GaussianStep]:
        nonlocal posture
        if rng.random() < 0.04:
            posture = rng.sample(kinds, rng.choice([2, 2, 3]))
        return [cheap] if rng.random() < 0.1 else list(posture)

    with open_ledger(tmp_path / "l.jsonl", sampling, budget) as ledger:
        answers = decided_as_a_fresh_accountant(ledger, budget, next_round, 300, refusals=15)
    first_refusal = answers.index(False)
    assert first_refusal > 20 and True in answers[first_refusal:]


def test_an_unchanged_round_of_several_kinds_is_answered_by_counting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attacker's review: a round of a subsampled step and a q = 1 step, kept unchanged,
    cost an allowance search of its envelope (q = 1, sigma = 1) and a dry run every round:
    1,036 rounds took 150 s. Now one search for the round itself, refreshed when spent."""
    round_steps = [GaussianStep("poisson", 0.01, 1.0), GaussianStep("poisson", 1.0, 20.0)]
    evaluations = Evaluations(monkeypatch)
    with open_ledger(tmp_path / "l.jsonl", "poisson", 8.0) as ledger:
        released = spend_while_it_fits(ledger, round_steps)
        assert released == 1036  # the fresh accountant's boundary, below and above
        assert fresh_decision(ledger.steps, [], 8.0)
        assert not fresh_decision(ledger.steps, round_steps, 8.0)
        assert evaluations.count <= 6 * math.log2(2 * released) + 10, evaluations.count


def test_below_the_pld_s_smallest_delta_budgets_are_decided_by_rdp(tmp_path: Path) -> None:
    """An attacker's review: at delta 1e-14 the PLD's eps of 1 to 6 of these rounds reads 11.4,
    12.9, 14.0, 17.1, 17.1, 14.7 (its grid's noise in the far tail), so the allowance's count
    granted rounds a fresh accountant refused (the ledger read 17.1 against a budget of 16).
    Below config.limits.MIN_DELTA (scenarios bound a budget's delta there already) the PLD
    answers nothing and RDP, whose eps grows with every round, decides: as a fresh accountant
    does, round by round, and an empty ledger reads 0."""
    round_steps = [GaussianStep("fixed", 0.01, 0.5, 1), GaussianStep("fixed", 0.3, 100.0, 5),
                   GaussianStep("fixed", 0.05, 5.0, 1)]
    with PrivacyLedger.open(tmp_path / "l.jsonl", client_id="c", sampling="fixed",
                            budget=Budget(16.0, 1e-14)) as ledger:
        assert ledger.epsilon() == 0.0
        spent = []
        for index in range(14):
            eps = make_accountant("rdp", [*ledger.steps, *round_steps]).epsilon(1e-14)
            assert ledger.can_spend(round_steps) == (eps <= 16.0), index
            assert fresh_decision(ledger.steps, round_steps, 16.0, 1e-14) == (eps <= 16.0)
            if eps <= 16.0:
                ledger.spend(round_steps, time=float(index), round=index)
                spent.append(ledger.epsilon())
        assert 0 < len(spent) < 14 and spent == sorted(spent) and spent[-1] <= 16.0
        assert ledger.epsilon_bound()[1] == "rdp"
