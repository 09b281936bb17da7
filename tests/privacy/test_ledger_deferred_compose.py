"""A spend composes its steps into the ledger's accountant lazily (when the accountant is next
read, or after a bounded batch): every answer (eps, decisions, steps) is bit for bit the one
of an accountant that composed each spend as it happened, and the steps waiting are bounded."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from fedsim.privacy import budget as budget_module
from fedsim.privacy import ledger as ledger_module
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import GaussianStep, Sampling, TunedSelection
from fedsim.privacy.ledger import Budget, PrivacyLedger

DELTA = 1e-5


@pytest.mark.parametrize(("sampling", "accountant"),
                         [("poisson", "pld"), ("fixed", "pld"), ("poisson", "rdp")])
def test_answers_equal_an_accountant_composed_spend_by_spend(
        tmp_path: Path, sampling: Sampling, accountant: str) -> None:
    rng = random.Random(f"{sampling}-{accountant}")
    eager = make_accountant(accountant)  # composed at every spend, as the ledger did
    qs, sigmas = (0.01, 0.02, 0.05), (0.8, 1.1, 1.5)
    posture = (rng.choice(qs), rng.choice(sigmas))
    with PrivacyLedger.open(tmp_path / "l.jsonl", client_id="c", sampling=sampling,
                            budget=Budget(50.0, DELTA), accountant=accountant) as ledger:
        for index in range(160):
            if rng.random() < 0.1:
                posture = (rng.choice(qs), rng.choice(sigmas))
            steps = [GaussianStep(sampling, *posture, count=rng.choice((1, 1, 2)))]
            assert ledger.can_spend(steps)
            ledger.spend(steps, time=float(index), round=index)
            eager.compose(steps)
            if rng.random() < 0.05:  # read at random points, between batches
                assert ledger.epsilon().hex() == eager.epsilon(DELTA).hex()
                assert ledger.steps == eager.steps
        assert ledger.epsilon().hex() == eager.epsilon(DELTA).hex()
        assert ledger.steps == eager.steps
        assert ledger.accountant.total_steps == eager.total_steps == sum(
            r.step.count for r in ledger.records if isinstance(r.step, GaussianStep))
    reopened = PrivacyLedger.open(tmp_path / "l.jsonl", client_id="c", sampling=sampling,
                                  budget=Budget(50.0, DELTA), accountant=accountant,
                                  read_only=True)
    assert reopened.epsilon().hex() == eager.epsilon(DELTA).hex()


def test_the_steps_waiting_are_bounded(tmp_path: Path) -> None:
    step = GaussianStep("poisson", 0.001, 5.0)
    with PrivacyLedger.open(tmp_path / "l.jsonl", client_id="c", sampling="poisson",
                            budget=Budget(100.0, DELTA)) as ledger:
        for index in range(2 * ledger_module._COMPOSE_BATCH + 5):
            ledger.spend(step, time=float(index), round=index)
            assert len(ledger._uncomposed) < ledger_module._COMPOSE_BATCH
        assert ledger._composed.total_steps + len(ledger._uncomposed) == len(ledger.records)


def test_a_budget_is_enforced_across_the_waiting_steps(tmp_path: Path) -> None:
    """The last round that fits and the first that does not are those of an eager
    accountant, though no eps was read since the first spend."""
    step = GaussianStep("poisson", 0.05, 1.0)
    eager = make_accountant("pld")
    with PrivacyLedger.open(tmp_path / "l.jsonl", client_id="c", sampling="poisson",
                            budget=Budget(2.0, DELTA)) as ledger:
        spent = 0
        while ledger.can_spend(step):
            ledger.spend(step, time=float(spent), round=spent)
            spent += 1
        eager.compose([step.times(spent)])
        assert eager.epsilon(DELTA) <= 2.0 < eager.preview([step]).epsilon(DELTA)


@pytest.mark.slow  # an rdp bound of a tuned selection: tens of seconds on a loaded machine
def test_a_tuned_selection_composes_the_waiting_steps_first(tmp_path: Path) -> None:
    step = GaussianStep("poisson", 0.02, 1.2)
    trial = GaussianStep("poisson", 0.02, 1.2, count=3)
    selection = TunedSelection("poisson", (2.0,), ((trial,), ()))
    with PrivacyLedger.open(tmp_path / "l.jsonl", client_id="c", sampling="poisson",
                            budget=Budget(100.0, DELTA), accountant="rdp") as ledger:
        for index in range(5):
            ledger.spend(step, time=float(index), round=index)
        ledger.spend_selection(selection, time=5.0, round=5)
        ledger.spend(step, time=6.0, round=6)
        expected = make_accountant("rdp", [step.times(6), selection])
        assert ledger.epsilon().hex() == expected.epsilon(DELTA).hex()


class _Evaluations:
    """Counts eps evaluations of the pld accountant (the ledger's enforcing one)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from fedsim.privacy.pld import PLDAccountant

        self.count = 0
        real = PLDAccountant.epsilon

        def counted(accountant: PLDAccountant, delta: float) -> float:
            self.count += 1
            return real(accountant, delta)

        monkeypatch.setattr(PLDAccountant, "epsilon", counted)


def test_ledgers_of_one_posture_share_their_first_allowance(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group's clients open ledgers alike: the second one's first check evaluates no eps,
    and both decide what a fresh accountant decides."""
    monkeypatch.setattr(budget_module, "_fits_answers", type(budget_module._fits_answers)())
    evaluations = _Evaluations(monkeypatch)
    step = GaussianStep("poisson", 2 / 60, 0.9)
    budget = Budget(3.0, DELTA)
    ledgers = [PrivacyLedger.open(tmp_path / f"c{k}.jsonl", client_id=f"c{k}",
                                  sampling="poisson", budget=budget) for k in range(3)]
    try:
        assert ledgers[0].can_spend(step)
        first = evaluations.count
        assert first > 0
        for ledger in ledgers[1:]:
            assert ledger.can_spend(step)
        assert evaluations.count == first
        # Spend each to the budget: the same rounds fit as for a fresh accountant.
        fitting = []
        for ledger in ledgers:
            spent = 0
            while ledger.can_spend(step):
                ledger.spend(step, time=float(spent), round=spent)
                spent += 1
            fitting.append(spent)
        fresh = make_accountant("pld", [step.times(fitting[0])])
        assert fresh.epsilon(DELTA) <= 3.0 < fresh.preview([step]).epsilon(DELTA)
        assert fitting == [fitting[0]] * 3
    finally:
        for ledger in ledgers:
            ledger.close()


@pytest.mark.parametrize("other", [Budget(3.0, 1e-6), Budget(2.0, DELTA)])
def test_a_remembered_answer_is_never_another_budgets(tmp_path: Path, other: Budget) -> None:
    step = GaussianStep("poisson", 2 / 60, 0.9)
    counts = []
    for k, budget in enumerate((Budget(3.0, DELTA), other)):
        with PrivacyLedger.open(tmp_path / f"c{k}.jsonl", client_id=f"c{k}",
                                sampling="poisson", budget=budget) as ledger:
            spent = 0
            while ledger.can_spend(step):
                ledger.spend(step, time=float(spent), round=spent)
                spent += 1
            counts.append(spent)
            fresh = make_accountant("pld", [step.times(spent)])
            assert fresh.epsilon(budget.delta) <= budget.epsilon
            assert fresh.preview([step]).epsilon(budget.delta) > budget.epsilon
    assert counts[0] > counts[1]


def test_a_ctrl_c_after_the_durable_write_leaves_the_accountant_with_the_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The steps waiting to be composed are noted with the records, in the same block that
    Ctrl-C waits for: an interrupted run's eps is that of its ledger file."""
    import os
    import signal

    from fedsim.privacy.ledger import read_ledger_steps

    original = ledger_module.append_durably

    def append_then_interrupt(handle: object, payload: bytes, *, fsync: bool = True) -> None:
        original(handle, payload, fsync=fsync)  # type: ignore[arg-type]
        os.kill(os.getpid(), signal.SIGINT)

    step = GaussianStep("poisson", 0.02, 1.1)
    path = tmp_path / "c.jsonl"
    with PrivacyLedger.open(path, client_id="c", sampling="poisson",
                            budget=Budget(10.0, DELTA)) as ledger:
        ledger.spend(step, time=0.0, round=0)
        monkeypatch.setattr(ledger_module, "append_durably", append_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            ledger.spend(step, time=1.0, round=1)
        monkeypatch.setattr(ledger_module, "append_durably", original)
        on_disk = make_accountant("pld", read_ledger_steps(path))
        assert ledger.epsilon().hex() == on_disk.epsilon(DELTA).hex()
        assert on_disk.total_steps == 2
